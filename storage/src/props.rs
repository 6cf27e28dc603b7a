//! Dead properties: what a WebDAV client stores on a file beside its content (PROPPATCH of a
//! property WebDAV does not define; Finder and Windows write some), replicated like every
//! other change (`Command::PatchProps`, format 5).
//!
//! - **Where:** one record per file, by file id ([`keys::file_props`]): a property's namespace
//!   and name, and its whole element as the client sent it (XML text, from a body the API
//!   read with a bounded depth). A new version keeps them; a move takes them along; a delete
//!   (a tombstone version) removes them, and so does the purge of a deleted folder.
//! - **Bounded:** at most [`PROPS_PER_FILE_MAX`] properties of at most [`PROP_BYTES_MAX`]
//!   bytes each, [`PROP_BYTES_PER_FILE_MAX`] on one file, and [`PROP_BYTES_PER_USER_MAX`] set
//!   by one user (each property charged to who set it, given back when it goes: an editor of
//!   a shared folder spends their own budget, never the owner's). A patch past a bound is
//!   refused whole.

use serde::{Deserialize, Serialize};

use crate::command::{Outcome, Rejection};
use crate::paths::FilePath;
use crate::records::FileRecord;
use crate::state::{StateMachine, Txn};
use crate::{keys, StorageError};

/// Properties one file holds, at most.
pub const PROPS_PER_FILE_MAX: usize = 64;
/// Bytes of one property (namespace, name and element), at most.
pub const PROP_BYTES_MAX: usize = 4 * 1024;
/// Bytes of one file's properties, at most.
pub const PROP_BYTES_PER_FILE_MAX: u64 = 64 * 1024;
/// Bytes of properties on the files of one user's namespaces, at most.
pub const PROP_BYTES_PER_USER_MAX: u64 = 16 << 20;
/// Changes one patch carries, at most.
pub const CHANGES_PER_PATCH_MAX: usize = 2 * PROPS_PER_FILE_MAX;

/// One dead property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadProp {
    /// Its XML namespace (empty: none).
    pub namespace: String,
    pub name: String,
    /// The whole property element, as XML text.
    pub xml: String,
    /// Who set it: whose budget it is charged to.
    #[serde(default)]
    pub set_by: String,
}

impl DeadProp {
    fn bytes(&self) -> u64 {
        (self.namespace.len() + self.name.len() + self.xml.len()) as u64
    }
}

/// A file's dead properties.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadProps {
    pub props: Vec<DeadProp>,
}

impl DeadProps {
    /// What the properties weigh against the bounds.
    pub fn bytes(&self) -> u64 {
        self.props.iter().map(DeadProp::bytes).sum()
    }
}

/// One change of a patch: a property set (`xml`: its element) or removed (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PropChange {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xml: Option<String>,
}

/// A PROPPATCH: its changes, in order, to the live file at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PropPatch {
    pub namespace_id: String,
    pub path: FilePath,
    /// Who patches: apply judges their permission (an editor or owner) in log order.
    pub actor_user_id: String,
    pub changes: Vec<PropChange>,
}

fn limit(why: String) -> Outcome {
    Outcome::Rejected(Rejection::LimitReached(why))
}

/// Applies a patch whole, or refuses it whole (a viewer, no live file, a bound passed).
pub(crate) fn patch(txn: &mut Txn<'_>, p: &PropPatch) -> Result<Outcome, StorageError> {
    if let Some(refused) = crate::files::may_write(txn, &p.actor_user_id, &p.namespace_id)? {
        return Ok(refused);
    }
    if p.changes.len() > CHANGES_PER_PATCH_MAX {
        return Ok(limit(format!("a patch changes at most {CHANGES_PER_PATCH_MAX} properties")));
    }
    let file = match crate::files::file_at(txn, &p.namespace_id, p.path.as_str())? {
        Some(file) if !file.deleted => file,
        _ => return Ok(Outcome::Rejected(Rejection::NotFound(format!("no file at {}", p.path)))),
    };
    let key = keys::file_props(&file.id);
    let mut props = txn.get::<DeadProps>("dead properties", &key)?.unwrap_or_default();
    // What each user's budget gains (the actor's sets) or gets back (what is replaced or
    // removed, to whoever set it), in one deterministic order.
    let mut deltas: std::collections::BTreeMap<String, i128> = std::collections::BTreeMap::new();
    for change in &p.changes {
        props.props.retain(|prop| {
            let gone = prop.namespace == change.namespace && prop.name == change.name;
            if gone {
                *deltas.entry(prop.set_by.clone()).or_default() -= i128::from(prop.bytes());
            }
            !gone
        });
        if let Some(xml) = &change.xml {
            let prop = DeadProp {
                namespace: change.namespace.clone(),
                name: change.name.clone(),
                xml: xml.clone(),
                set_by: p.actor_user_id.clone(),
            };
            if prop.bytes() > PROP_BYTES_MAX as u64 {
                return Ok(limit(format!("a property is at most {PROP_BYTES_MAX} bytes")));
            }
            *deltas.entry(p.actor_user_id.clone()).or_default() += i128::from(prop.bytes());
            props.props.push(prop);
        }
    }
    if props.props.len() > PROPS_PER_FILE_MAX || props.bytes() > PROP_BYTES_PER_FILE_MAX {
        return Ok(limit(format!(
            "a file holds at most {PROPS_PER_FILE_MAX} properties, {PROP_BYTES_PER_FILE_MAX} bytes in all"
        )));
    }
    let grows = deltas.get(&p.actor_user_id).copied().unwrap_or(0);
    if grows > 0 && i128::from(used(txn, &p.actor_user_id)?) + grows > i128::from(PROP_BYTES_PER_USER_MAX) {
        return Ok(limit(format!("one user sets at most {PROP_BYTES_PER_USER_MAX} bytes of properties")));
    }
    store(txn, &file.id, &props)?;
    for (user, delta) in deltas {
        let now = (i128::from(used(txn, &user)?) + delta).clamp(0, i128::from(u64::MAX));
        set_used(txn, &user, now as u64);
    }
    Ok(Outcome::Done)
}

/// Moves the properties of file `from` to file `to` (a move in one namespace).
pub(crate) fn carry(txn: &mut Txn<'_>, from: &str, to: &str) -> Result<(), StorageError> {
    let Some(props) = txn.get::<DeadProps>("dead properties", &keys::file_props(from))? else {
        return Ok(());
    };
    if from == to {
        return Ok(());
    }
    txn.delete(keys::file_props(from));
    store(txn, to, &props)
}

/// Removes a file's properties (its delete, or its folder's purge), giving their bytes back
/// to whoever set each.
pub(crate) fn remove(txn: &mut Txn<'_>, file: &FileRecord) -> Result<(), StorageError> {
    let key = keys::file_props(&file.id);
    let Some(props) = txn.get::<DeadProps>("dead properties", &key)? else {
        return Ok(());
    };
    txn.delete(key);
    for prop in &props.props {
        let left = used(txn, &prop.set_by)?.saturating_sub(prop.bytes());
        set_used(txn, &prop.set_by, left);
    }
    Ok(())
}

fn store(txn: &mut Txn<'_>, file_id: &str, props: &DeadProps) -> Result<(), StorageError> {
    let key = keys::file_props(file_id);
    if props.props.is_empty() {
        txn.delete(key);
    } else {
        txn.put(key, props);
    }
    Ok(())
}

fn used(txn: &Txn<'_>, user_id: &str) -> Result<u64, StorageError> {
    Ok(txn.get::<u64>("property bytes", &keys::prop_bytes(user_id))?.unwrap_or(0))
}

fn set_used(txn: &mut Txn<'_>, user_id: &str, bytes: u64) {
    if bytes == 0 {
        txn.delete(keys::prop_bytes(user_id));
    } else {
        txn.put(keys::prop_bytes(user_id), &bytes);
    }
}

impl StateMachine {
    /// A file's dead properties (none: empty).
    pub fn dead_props(&self, file_id: &str) -> Result<DeadProps, StorageError> {
        Ok(self.read::<DeadProps>("dead properties", &keys::file_props(file_id))?.unwrap_or_default())
    }

    /// Bytes of dead properties `user_id` set.
    pub fn prop_bytes(&self, user_id: &str) -> Result<u64, StorageError> {
        Ok(self.read::<u64>("property bytes", &keys::prop_bytes(user_id))?.unwrap_or(0))
    }
}

#[cfg(test)]
#[path = "props_tests.rs"]
mod tests;
