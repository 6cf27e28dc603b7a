//! Who may do what: every file, history, list, restore, move, delete, block, sync,
//! notification, ACL and job route asks here, and here asks [`raftbox_storage::sharing::role`]
//! — the one permission rule, which apply also uses to judge writes in log order.
//!
//! - A namespace the caller cannot read answers 404 (its existence is not revealed).
//! - `viewer` reads; `editor` also changes files; `owner` also manages the ACL and deletes
//!   the folder. A viewer's change is 403 (judged in apply, with the actor in the command).
//! - A block is readable by its uploaders and by the readers of a namespace that
//!   references it; to anyone else it does not exist.
//! - A job is visible and changeable by its owner and admins.
//!
//! A refusal is re-checked after a read barrier (the grant may have been applied an instant
//! ago elsewhere), so this node never refuses what the cluster allows.

use raftbox_storage::blocks::BlockHash;
use raftbox_storage::jobs::Job;
use raftbox_storage::records::Role;
use raftbox_storage::sharing::Access;

use crate::auth::Principal;
use crate::{ApiError, AppState};

/// The namespace a call names: the given one, or the caller's personal namespace.
pub fn resolve(principal: &Principal, requested: Option<&str>) -> String {
    requested.map_or_else(|| principal.user.namespace_id.clone(), str::to_string)
}

fn not_found(namespace_id: &str) -> ApiError {
    ApiError::NotFound(format!("namespace {namespace_id}"))
}

/// A read barrier for `principal`'s request: what follows reads the state as of now, and
/// only while the caller's token is still theirs as of now (not revoked, its password not
/// changed since a login): a node behind a revocation learns of it here, before it serves
/// the revoked token anything. Every route that reads a user's data passes one.
pub async fn barrier(state: &AppState, principal: &Principal) -> Result<(), ApiError> {
    state.node.read_barrier().await?;
    // A password's caller (WebDAV): its password still the one it was checked against.
    if principal.token_id.is_empty() {
        let stored = state.node.state().password_hash(&principal.user.id)?;
        if stored.is_none_or(|hash| crate::routes::login::password_fingerprint(&hash) != principal.token_hash) {
            return Err(ApiError::Unauthenticated("this password was changed or removed".into()));
        }
        return Ok(());
    }
    let active = state.node.state().token_active(&principal.token_hash, &principal.user.id, &principal.token_id)?;
    if !active {
        return Err(ApiError::Unauthenticated("this token was revoked, or its login session ended".into()));
    }
    Ok(())
}

/// The caller's role on a namespace after a read barrier (so what follows reads the
/// state as of now), or 404 if they cannot read it.
pub async fn read(state: &AppState, principal: &Principal, namespace_id: &str) -> Result<Role, ApiError> {
    barrier(state, principal).await?;
    state.node.state().role(&principal.user.id, namespace_id)?.ok_or_else(|| not_found(namespace_id))
}

/// Like [`read`], and 403 unless the caller is an owner.
pub async fn own(state: &AppState, principal: &Principal, namespace_id: &str) -> Result<(), ApiError> {
    match read(state, principal, namespace_id).await? {
        Role::Owner => Ok(()),
        role => Err(ApiError::Forbidden(format!("a {} cannot do this; an owner can", role.as_str()))),
    }
}

/// Whether the caller may read a block. An allowed read answers from the local state; a
/// refusal is checked again after a read barrier.
pub async fn block(state: &AppState, principal: &Principal, hash: &BlockHash) -> Result<bool, ApiError> {
    if state.node.state().chunk_readable(&principal.user.id, hash)? {
        return Ok(true);
    }
    barrier(state, principal).await?;
    Ok(state.node.state().chunk_readable(&principal.user.id, hash)?)
}

/// Whether the caller may read a block, judged on the state as it is (the caller has just
/// passed a read barrier).
pub fn block_now(state: &AppState, principal: &Principal, hash: &BlockHash) -> Result<bool, ApiError> {
    Ok(state.node.state().chunk_readable(&principal.user.id, hash)?)
}

/// Every namespace the caller can read, with their role, on the local state (sync and the
/// notification channels pass a read barrier first or re-read on every apply).
pub fn namespaces(state: &AppState, user_id: &str) -> Result<Vec<Access>, ApiError> {
    Ok(state.node.state().namespaces_of(user_id)?)
}

/// Whether the caller may see and change a job: its owner or an admin.
pub fn job(principal: &Principal, job: &Job) -> bool {
    job.owner_user_id == principal.user.id || principal.user.admin
}
