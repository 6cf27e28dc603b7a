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
    Ok(Outcome::Done)
}

/// Removes one of `actor_user_id`'s links.
pub(crate) fn revoke(txn: &mut Txn<'_>, actor_user_id: &str, link_id: &str) -> Result<Outcome, StorageError> {
    let index = keys::user_link(actor_user_id, link_id);
    let Some(raw) = txn.get_raw(&index)? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("link {link_id}"))));
    };
    let hash: [u8; 32] =
        raw.try_into().map_err(|_| StorageError::Corrupt(format!("link index of {link_id} is not a hash")))?;
    txn.delete(index);
    txn.delete(keys::link(&hash));
    let count_key = keys::links_count(actor_user_id);
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
