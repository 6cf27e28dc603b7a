//! Share links: a token that lets whoever holds it, without an account, read one file or one
//! folder of a namespace while the link lives (not revoked, not expired, downloads left) and
//! its creator may still read there. Only the token's hash is stored; the API checks the
//! password (argon2id, hashed before proposing) and counts each download through
//! `CountLinkDownload`, so a download limit holds across nodes.

use serde::{Deserialize, Serialize};

use crate::command::{Outcome, Rejection};
use crate::state::{StateMachine, Txn};
use crate::{keys, sharing, StorageError};

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub id: String,
    pub token_hash: [u8; 32],
    pub creator_user_id: String,
    pub namespace_id: String,
    /// The file, or the folder (`folder`), the link shares.
    pub path: String,
    pub folder: bool,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    /// argon2id PHC string: the link asks for this password.
    pub password_hash: Option<String>,
    pub max_downloads: Option<u64>,
    pub downloads: u64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("namespace_id", &self.namespace_id)
            .field("path", &self.path)
            .field("folder", &self.folder)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Whether every download the link allows was made.
    pub fn used_up(&self) -> bool {
        self.max_downloads.is_some_and(|max| self.downloads >= max)
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|at| now_ms >= at)
    }
}

/// Records `link` for its creator, if they may change its namespace (a viewer may not open
/// it to everyone) and have fewer than `links_max` links.
pub(crate) fn create(txn: &mut Txn<'_>, link: &Link, links_max: u32) -> Result<Outcome, StorageError> {
    match sharing::role(txn, &link.creator_user_id, &link.namespace_id)? {
        None => return Ok(Outcome::Rejected(Rejection::NotFound(format!("namespace {}", link.namespace_id)))),
        Some(crate::records::Role::Viewer) => {
            return Ok(Outcome::Rejected(Rejection::Forbidden("a viewer cannot share by link".into())))
        }
        Some(_) => {}
    }
    if txn.get_raw(&keys::link(&link.token_hash))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict("a link with this token exists".into())));
    }
    let count_key = keys::links_count(&link.creator_user_id);
    let count = txn.get::<u64>("links count", &count_key)?.unwrap_or(0);
    if count >= u64::from(links_max) {
        return Ok(Outcome::Rejected(Rejection::LimitReached(format!(
            "you have {count} share links, the most allowed; revoke some first"
        ))));
    }
    let mut link = link.clone();
    link.created_ms = txn.now_ms;
    link.downloads = 0;
    txn.put(count_key, &(count + 1));
    txn.put_raw(keys::user_link(&link.creator_user_id, &link.id), link.token_hash.to_vec());
    txn.put(keys::link(&link.token_hash), &link);
    if crate::sharing::schema_in(txn)? >= NAMESPACE_INDEX_FORMAT {
        txn.put_raw(keys::namespace_link(&link.namespace_id, &link.id), link.token_hash.to_vec());
    }
    Ok(Outcome::Done)
}

/// The cluster format from which links are indexed by namespace (the migration to it indexes
/// the older ones).
pub const NAMESPACE_INDEX_FORMAT: u32 = 5;

/// Indexes every link by its namespace: the migration to [`NAMESPACE_INDEX_FORMAT`] (a
/// one-time upgrade, proposed by a node itself; at most 1,000 links per user exist).
pub(crate) fn index_by_namespace(txn: &mut Txn<'_>) -> Result<(), StorageError> {
    let (start, end) = keys::link_all();
    for key in txn.keys_in(&start, &end, usize::MAX)? {
        let Some(link) = txn.get::<Link>("link", &key)? else { continue };
        txn.put_raw(keys::namespace_link(&link.namespace_id, &link.id), link.token_hash.to_vec());
    }
    Ok(())
}

/// Removes a link: one of `actor_user_id`'s own, or, with `namespace_id`, one in that
/// namespace if the actor owns it (whoever made the link).
pub(crate) fn revoke(
    txn: &mut Txn<'_>,
    actor_user_id: &str,
    link_id: &str,
    namespace_id: Option<&str>,
) -> Result<Outcome, StorageError> {
    let not_found = || Ok(Outcome::Rejected(Rejection::NotFound(format!("link {link_id}"))));
    let index = match namespace_id {
        None => keys::user_link(actor_user_id, link_id),
        Some(namespace_id) => {
            if sharing::role(txn, actor_user_id, namespace_id)? != Some(crate::records::Role::Owner) {
                return not_found();
            }
            keys::namespace_link(namespace_id, link_id)
        }
    };
    let Some(raw) = txn.get_raw(&index)? else {
        return not_found();
    };
    let hash: [u8; 32] =
        raw.try_into().map_err(|_| StorageError::Corrupt(format!("link index of {link_id} is not a hash")))?;
    let Some(link) = txn.get::<Link>("link", &keys::link(&hash))? else {
        return not_found();
    };
    // The index named this link: the same id, and for the creator's index the same creator.
    if link.id != link_id || (namespace_id.is_none() && link.creator_user_id != actor_user_id) {
        return not_found();
    }
    txn.delete(keys::user_link(&link.creator_user_id, link_id));
    txn.delete(keys::namespace_link(&link.namespace_id, link_id));
    txn.delete(keys::link(&hash));
    let count_key = keys::links_count(&link.creator_user_id);
    let count = txn.get::<u64>("links count", &count_key)?.unwrap_or(0).saturating_sub(1);
    if count == 0 {
        txn.delete(count_key);
    } else {
        txn.put(count_key, &count);
    }
    Ok(Outcome::Done)
}

/// Counts one download through the link; refused once its downloads are used up.
pub(crate) fn count_download(txn: &mut Txn<'_>, token_hash: &[u8; 32]) -> Result<Outcome, StorageError> {
    let key = keys::link(token_hash);
    let Some(mut link) = txn.get::<Link>("link", &key)? else {
        return Ok(Outcome::Rejected(Rejection::NotFound("link".into())));
    };
    if link.used_up() {
        return Ok(Outcome::Rejected(Rejection::LimitReached("this link's downloads are used up".into())));
    }
    link.downloads += 1;
    txn.put(key, &link);
    Ok(Outcome::Done)
}

impl StateMachine {
    /// The link whose token hashes to `token_hash`.
    pub fn link(&self, token_hash: &[u8; 32]) -> Result<Option<Link>, StorageError> {
        self.read("link", &keys::link(token_hash))
    }

    /// The links in a namespace by id, after `after`, at most `limit` (indexed from format 5).
    pub fn namespace_links_page(
        &self,
        namespace_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Link>, StorageError> {
        let (mut start, end) = keys::namespace_link_range(namespace_id);
        if let Some(after) = after {
            start = keys::namespace_link(namespace_id, after);
            start.push(0);
        }
        let mut links = Vec::new();
        for (key, hash) in self.scan_raw(&start, &end, limit)? {
            let hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| StorageError::Corrupt(format!("namespace link index {key:?} does not hold a hash")))?;
            if let Some(link) = self.link(&hash)? {
                links.push(link);
            }
        }
        Ok(links)
    }

    /// How many links a user has.
    pub fn links_count(&self, user_id: &str) -> Result<u64, StorageError> {
        Ok(self.read::<u64>("links count", &keys::links_count(user_id))?.unwrap_or(0))
    }

    /// A user's links by id, after `after`, at most `limit`.
    pub fn links_page(&self, user_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<Link>, StorageError> {
        let (mut start, end) = keys::user_link_range(user_id);
        if let Some(after) = after {
            start = keys::user_link(user_id, after);
            start.push(0);
        }
        let mut links = Vec::new();
        for (key, hash) in self.scan_raw(&start, &end, limit)? {
            let hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| StorageError::Corrupt(format!("link index {key:?} does not hold a hash")))?;
            if let Some(link) = self.link(&hash)? {
                links.push(link);
            }
        }
        Ok(links)
    }
}
