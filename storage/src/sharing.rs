//! Sharing: shared folders, ACL entries (with a reverse index for listing), groups and their
//! members, and [`role`], the one permission rule every write (in apply) and every read (in
//! the API) asks.
//!
//! A personal namespace belongs to its user alone. A shared folder's ACL binds users and
//! groups to `viewer`, `editor` or `owner`; a user's role is the highest of their own entry
//! and those of their groups. A user's groups are kept on their record, so a check is a
//! handful of point reads. Admins have no implicit access to anyone's files.

use std::collections::BTreeMap;

use crate::blocks::BlockHash;
use crate::chunks::{self, Delta};
use crate::command::{Outcome, Rejection};
use crate::records::{AclEntry, FileRecord, Grantee, Group, Namespace, NamespaceKind, Role, User, VersionRecord};
use crate::state::{Reads, StateMachine, Txn};
use crate::{keys, StorageError};

/// ACL entries of one shared folder, at most (a grant beyond is refused): the owner count
/// a grant or revoke checks reads them all.
pub const ACL_ENTRIES_MAX: usize = 1_000;
/// Groups one user belongs to, at most: every permission check reads one entry per group.
pub const GROUPS_PER_USER_MAX: usize = 100;
/// Pending invitations one grantee (user or group) may have, at most (an invitation beyond
/// is refused until they accept or decline some): what a stranger can make them carry.
pub const INVITATIONS_PENDING_MAX: usize = 100;
/// Namespaces [`StateMachine::namespaces_of`] lists, at most.
pub const LISTED_NAMESPACES_MAX: usize = 10_000;

/// The caller's role on a namespace, or `None`: they may not even know it exists.
pub fn role<R: Reads>(state: &R, user_id: &str, namespace_id: &str) -> Result<Option<Role>, StorageError> {
    let Some(namespace) = state.get_record::<Namespace>("namespace", &keys::namespace(namespace_id))? else {
        return Ok(None);
    };
    if namespace.deleting {
        return Ok(None);
    }
    if namespace.kind == NamespaceKind::Personal {
        return Ok((namespace.owner_user_id == user_id).then_some(Role::Owner));
    }
    let Some(user) = state.get_record::<User>("user", &keys::user(user_id))? else {
        return Ok(None);
    };
    let accepted = |e: AclEntry| (!e.pending).then_some(e.role);
    let mut best = entry(state, namespace_id, &Grantee::User(user.id.clone()))?.and_then(accepted);
    for group in &user.groups {
        let via_group = entry(state, namespace_id, &Grantee::Group(group.clone()))?.and_then(accepted);
        best = best.max(via_group);
    }
    Ok(best)
}

/// The namespaces `user_id` may reach, as far as their keys tell (their personal one, then
/// those whose ACL names them or one of their groups), at most `max`; [`role`] still judges
/// each (a namespace being deleted, say).
pub fn reader_namespaces<R: Reads>(state: &R, user_id: &str, max: usize) -> Result<Vec<String>, StorageError> {
    let Some(user) = state.get_record::<User>("user", &keys::user(user_id))? else { return Ok(Vec::new()) };
    let mut out = vec![user.namespace_id.clone()];
    let grantees =
        std::iter::once(Grantee::User(user.id.clone())).chain(user.groups.iter().cloned().map(Grantee::Group));
    for grantee in grantees {
        if out.len() >= max {
            break;
        }
        let (start, end) = keys::acl_grantee_range(&grantee.key());
        for key in state.keys_between(&start, &end, max - out.len())? {
            out.push(String::from_utf8_lossy(&key[start.len()..]).into_owned());
        }
    }
    Ok(out)
}

/// The ACL entry naming `grantee` on `namespace_id`, if any. Ids are joined into one key,
/// so the entry's own fields are compared too.
fn entry<R: Reads>(state: &R, namespace_id: &str, grantee: &Grantee) -> Result<Option<AclEntry>, StorageError> {
    let found = state.get_record::<AclEntry>("acl entry", &keys::acl(namespace_id, &grantee.key()))?;
    Ok(found.filter(|e| e.namespace_id == namespace_id && &e.grantee == grantee))
}

pub(crate) fn create_folder(
    txn: &mut Txn<'_>,
    namespace_id: &str,
    name: &str,
    owner_user_id: &str,
    folders_max: Option<u32>,
) -> Result<Outcome, StorageError> {
    if txn.get::<User>("user", &keys::user(owner_user_id))?.is_none() {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {owner_user_id}"))));
    }
    let created = txn.get::<u64>("folders created", &keys::folders_created(owner_user_id))?.unwrap_or(0);
    if folders_max.is_some_and(|max| created >= u64::from(max)) {
        return Ok(Outcome::Rejected(Rejection::LimitReached(format!(
            "you have created {created} shared folders, the most allowed; delete some first"
        ))));
    }
    if txn.get_raw(&keys::namespace(namespace_id))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("namespace id {namespace_id} is taken"))));
    }
    let namespace = Namespace {
        id: namespace_id.into(),
        kind: NamespaceKind::SharedFolder,
        owner_user_id: owner_user_id.into(),
        created_ms: txn.now_ms,
        name: name.into(),
        counted: folders_max.is_some(),
        deleting: false,
    };
    txn.put(keys::namespace(namespace_id), &namespace);
    if namespace.counted {
        txn.put(keys::folders_created(owner_user_id), &created.saturating_add(1));
    }
    put_entry(txn, namespace_id, &Grantee::User(owner_user_id.into()), Role::Owner, false);
    Ok(Outcome::NamespaceCreated { namespace_id: namespace_id.into() })
}

/// Writes an entry and its reverse index (the grantee's folders, or their invitations while
/// `pending`); a caller changing `pending` removes the other index first.
fn put_entry(txn: &mut Txn<'_>, namespace_id: &str, grantee: &Grantee, role: Role, pending: bool) {
    let entry =
        AclEntry { namespace_id: namespace_id.into(), grantee: grantee.clone(), role, granted_ms: txn.now_ms, pending };
    txn.put(keys::acl(namespace_id, &grantee.key()), &entry);
    txn.put_raw(reverse_key(grantee, namespace_id, pending), Vec::new());
}

/// The reverse index key of an entry: the grantee's folders, or their invitations.
fn reverse_key(grantee: &Grantee, namespace_id: &str, pending: bool) -> Vec<u8> {
    if pending {
        keys::invitation(&grantee.key(), namespace_id)
    } else {
        keys::acl_grantee(&grantee.key(), namespace_id)
    }
}

/// Pending invitations of `grantee` to folders not being deleted, counting up to
/// [`INVITATIONS_PENDING_MAX`] (a point read each).
fn pending_invitations(txn: &Txn<'_>, grantee: &Grantee) -> Result<usize, StorageError> {
    let (start, end) = keys::invitation_range(&grantee.key());
    let mut pending = 0;
    // Keys of folders being deleted are skipped, so a few more than the limit are read.
    for key in txn.keys_in(&start, &end, INVITATIONS_PENDING_MAX.saturating_mul(2))? {
        let namespace_id = String::from_utf8_lossy(&key[start.len()..]).into_owned();
        let live = txn.get::<Namespace>("namespace", &keys::namespace(&namespace_id))?.is_some_and(|n| !n.deleting);
        if live {
            pending += 1;
            if pending >= INVITATIONS_PENDING_MAX {
                break;
            }
        }
    }
    Ok(pending)
}

/// Removes an entry and its reverse index.
fn delete_entry(txn: &mut Txn<'_>, entry: &AclEntry) {
    txn.delete(keys::acl(&entry.namespace_id, &entry.grantee.key()));
    txn.delete(reverse_key(&entry.grantee, &entry.namespace_id, entry.pending));
}

fn grantee_exists(txn: &Txn<'_>, grantee: &Grantee) -> Result<bool, StorageError> {
    Ok(match grantee {
        Grantee::User(id) => txn.get::<User>("user", &keys::user(id))?.is_some(),
        Grantee::Group(id) => txn.get::<Group>("group", &keys::group(id))?.is_some(),
    })
}

/// Direct (user) owners of a namespace, this entry's writes included.
fn direct_owners(txn: &Txn<'_>, namespace_id: &str) -> Result<usize, StorageError> {
    let (start, end) = keys::acl_range(namespace_id);
    let mut owners = 0;
    for key in txn.keys_in(&start, &end, ACL_ENTRIES_MAX)? {
        let found = txn.get::<AclEntry>("acl entry", &key)?;
        if found.is_some_and(|e| {
            e.namespace_id == namespace_id
                && matches!(e.grantee, Grantee::User(_))
                && e.role == Role::Owner
                && !e.pending
        }) {
            owners += 1;
        }
    }
    Ok(owners)
}

/// Advances a namespace's cursor without a change, so that notification channels wake.
fn touch(txn: &mut Txn<'_>, namespace_id: &str) -> Result<(), StorageError> {
    let key = keys::namespace_cursor(namespace_id);
    let seq = txn.get::<u64>("namespace cursor", &key)?.unwrap_or(0).saturating_add(1);
    txn.put(key, &seq);
    Ok(())
}

/// Grants, changes or revokes an entry, judged with the actor's role as of this point of
/// the log.
pub(crate) fn set_access(
    txn: &mut Txn<'_>,
    actor_user_id: &str,
    namespace_id: &str,
    grantee: &Grantee,
    role_wanted: Option<Role>,
    invite: bool,
) -> Result<Outcome, StorageError> {
    let actor_role = match folder_role(txn, actor_user_id, namespace_id, "shared")? {
        Ok(role) => role,
        Err(rejection) => return Ok(rejection),
    };
    let leaving = role_wanted.is_none() && *grantee == Grantee::User(actor_user_id.into());
    if actor_role != Role::Owner && !leaving {
        return Ok(Outcome::Rejected(Rejection::Forbidden("only an owner manages access".into())));
    }
    if !grantee_exists(txn, grantee)? {
        let what = match grantee {
            Grantee::User(id) => format!("user {id}"),
            Grantee::Group(id) => format!("group {id}"),
        };
        return Ok(Outcome::Rejected(Rejection::NotFound(what)));
    }
    let existing = entry(txn, namespace_id, grantee)?;
    if existing.is_none() && role_wanted.is_none() {
        return Ok(Outcome::Rejected(Rejection::NotFound("no such ACL entry".into())));
    }
    let was_owner = existing.as_ref().is_some_and(|e| e.role == Role::Owner && !e.pending);
    let demoted = matches!(grantee, Grantee::User(_)) && was_owner && role_wanted != Some(Role::Owner);
    if demoted && direct_owners(txn, namespace_id)? <= 1 {
        return Ok(Outcome::Rejected(Rejection::Conflict(
            "the last owner can neither leave nor be demoted; make someone else an owner first".into(),
        )));
    }
    // A new entry is an invitation, unless the actor names themself (they consent).
    let invited = invite && existing.is_none() && *grantee != Grantee::User(actor_user_id.into());
    if existing.is_none() && role_wanted.is_some() {
        let (start, end) = keys::acl_range(namespace_id);
        if txn.keys_in(&start, &end, ACL_ENTRIES_MAX)?.len() >= ACL_ENTRIES_MAX {
            return Ok(Outcome::Rejected(Rejection::Conflict(format!(
                "this folder has {ACL_ENTRIES_MAX} access entries, the most allowed; share with a group instead"
            ))));
        }
        if invited && pending_invitations(txn, grantee)? >= INVITATIONS_PENDING_MAX {
            return Ok(Outcome::Rejected(Rejection::LimitReached(format!(
                "they have {INVITATIONS_PENDING_MAX} pending invitations, the most allowed, until they accept or \
                 decline some"
            ))));
        }
    }
    match (role_wanted, existing) {
        // A role change keeps an invitation an invitation, an accepted entry accepted.
        (Some(role), Some(existing)) => put_entry(txn, namespace_id, grantee, role, existing.pending),
        (Some(role), None) => put_entry(txn, namespace_id, grantee, role, invited),
        (None, Some(existing)) => delete_entry(txn, &existing),
        (None, None) => unreachable!("refused above: no such ACL entry"),
    }
    touch(txn, namespace_id)?;
    Ok(Outcome::Done)
}

/// Accepts or declines the pending invitation of `grantee` to `namespace_id`: a user
/// answers their own, an admin a group's. Accepting moves the entry from the grantee's
/// invitations to their folders; declining removes it.
pub(crate) fn respond_invitation(
    txn: &mut Txn<'_>,
    actor_user_id: &str,
    namespace_id: &str,
    grantee: &Grantee,
    accept: bool,
) -> Result<Outcome, StorageError> {
    let allowed = match grantee {
        Grantee::User(id) => id == actor_user_id,
        Grantee::Group(_) => txn.get::<User>("user", &keys::user(actor_user_id))?.is_some_and(|u| u.admin),
    };
    if !allowed {
        return Ok(Outcome::Rejected(Rejection::Forbidden(
            "an invitation is answered by the user it names, or for a group by an admin".into(),
        )));
    }
    let live = txn.get::<Namespace>("namespace", &keys::namespace(namespace_id))?.is_some_and(|n| !n.deleting);
    let found = if live { entry(txn, namespace_id, grantee)? } else { None };
    let Some(found) = found else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("an invitation to namespace {namespace_id}"))));
    };
    match (found.pending, accept) {
        (false, true) => return Ok(Outcome::Done),
        (false, false) => {
            return Ok(Outcome::Rejected(Rejection::NotFound(format!(
                "a pending invitation to namespace {namespace_id} (to leave an accepted share, leave it)"
            ))))
        }
        (true, true) => {
            txn.delete(keys::invitation(&grantee.key(), namespace_id));
            put_entry(txn, namespace_id, grantee, found.role, false);
        }
        (true, false) => delete_entry(txn, &found),
    }
    touch(txn, namespace_id)?;
    Ok(Outcome::Done)
}

/// The actor's role in the shared folder `namespace_id`, or the rejection to answer: not
/// found when there is no such namespace or the actor has no role in it (as for a read), and
/// invalid for a personal namespace, which cannot be `done` (shared, deleted).
fn folder_role(
    txn: &Txn<'_>,
    actor_user_id: &str,
    namespace_id: &str,
    done: &str,
) -> Result<Result<Role, Outcome>, StorageError> {
    let not_found = || Outcome::Rejected(Rejection::NotFound(format!("namespace {namespace_id}")));
    let Some(namespace) = txn.get::<Namespace>("namespace", &keys::namespace(namespace_id))? else {
        return Ok(Err(not_found()));
    };
    let Some(actor_role) = role(txn, actor_user_id, namespace_id)? else {
        return Ok(Err(not_found()));
    };
    if namespace.kind == NamespaceKind::Personal {
        return Ok(Err(Outcome::Rejected(Rejection::Invalid(format!("a personal namespace cannot be {done}")))));
    }
    Ok(Ok(actor_role))
}

/// Deletes a shared folder: from this apply on it is gone for everyone (the namespace is
/// marked deleting, and [`role`] answers none), and [`purge_deleted`] removes its ACL,
/// files, versions and change feed a bounded step at a time, with the maintenance purge.
pub(crate) fn delete_folder(
    txn: &mut Txn<'_>,
    actor_user_id: &str,
    namespace_id: &str,
) -> Result<Outcome, StorageError> {
    let actor_role = match folder_role(txn, actor_user_id, namespace_id, "deleted")? {
        Ok(role) => role,
        Err(rejection) => return Ok(rejection),
    };
    if actor_role != Role::Owner {
        return Ok(Outcome::Rejected(Rejection::Forbidden("only an owner deletes a shared folder".into())));
    }
    let Some(namespace) = txn.get::<Namespace>("namespace", &keys::namespace(namespace_id))? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("namespace {namespace_id}"))));
    };
    // Its creator may make another in its place.
    if namespace.counted {
        let created_key = keys::folders_created(&namespace.owner_user_id);
        let created = txn.get::<u64>("folders created", &created_key)?.unwrap_or(0);
        txn.put(created_key, &created.saturating_sub(1));
    }
    txn.put(keys::namespace(namespace_id), &Namespace { deleting: true, ..namespace });
    txn.put_raw(keys::namespace_purge(namespace_id), Vec::new());
    touch(txn, namespace_id)?;
    Ok(Outcome::Done)
}

/// Removes up to `max` records of deleted namespaces (their ACL entries, files with their
/// versions, change feed, and at last the namespace itself): one bounded step, repeated by
/// the maintenance purge. Answers how many went and whether more remain.
pub(crate) fn purge_deleted(txn: &mut Txn<'_>, max: usize) -> Result<(usize, bool), StorageError> {
    let mut budget = max;
    let (start, end) = keys::namespace_purge_range();
    while budget > 0 {
        let Some(queued) = txn.keys_in(&start, &end, 1)?.pop() else { return Ok((max - budget, false)) };
        let namespace_id = String::from_utf8_lossy(&queued[1..]).into_owned();
        if !purge_namespace_step(txn, &namespace_id, &mut budget)? {
            return Ok((max - budget, true));
        }
        txn.delete(keys::namespace_cursor(&namespace_id));
        txn.delete(keys::namespace(&namespace_id));
        txn.delete(queued);
    }
    Ok((max, !txn.keys_in(&start, &end, 1)?.is_empty()))
}

/// Removes records of the deleted namespace `namespace_id` while `budget` lasts; whether
/// none is left.
fn purge_namespace_step(txn: &mut Txn<'_>, namespace_id: &str, budget: &mut usize) -> Result<bool, StorageError> {
    let (start, end) = keys::acl_range(namespace_id);
    for key in txn.keys_in(&start, &end, *budget)? {
        if let Some(entry) = txn.get::<AclEntry>("acl entry", &key)? {
            txn.delete(reverse_key(&entry.grantee, &entry.namespace_id, entry.pending));
        }
        txn.delete(key);
        *budget -= 1;
    }
    let (start, end) = keys::file_path_range(namespace_id);
    for path_key in txn.keys_in(&start, &end, *budget)? {
        if let Some(file_id) = txn.get::<String>("file path", &path_key)? {
            let file = txn.get::<FileRecord>("file", &keys::file(&file_id))?.filter(|f| f.namespace_id == namespace_id);
            if let Some(file) = file {
                let (first, past) = keys::version_range(&file_id);
                let versions = txn.keys_in(&first, &past, budget.saturating_add(1))?;
                let all = versions.len() <= *budget;
                for version_key in versions.into_iter().take(*budget) {
                    if let Some(version) = txn.get::<VersionRecord>("version", &version_key)? {
                        chunks::reference(txn, namespace_id, &version.chunks, Delta::Drop)?;
                    }
                    txn.delete(version_key);
                    *budget -= 1;
                }
                if !all || *budget == 0 {
                    return Ok(false);
                }
                crate::props::remove(txn, &file)?;
                txn.delete(keys::file(&file_id));
            }
        }
        txn.delete(path_key);
        *budget = budget.saturating_sub(1);
    }
    let (start, end) = keys::change_range(namespace_id);
    for key in txn.keys_in(&start, &end, *budget)? {
        txn.delete(key);
        *budget -= 1;
    }
    if *budget == 0 {
        // Spent exactly: look again next step (a last empty look costs nothing).
        let left =
            [keys::acl_range(namespace_id), keys::file_path_range(namespace_id), keys::change_range(namespace_id)];
        for (start, end) in left {
            if !txn.keys_in(&start, &end, 1)?.is_empty() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

pub(crate) fn create_group(txn: &mut Txn<'_>, group_id: &str, name: &str) -> Result<Outcome, StorageError> {
    if txn.get_raw(&keys::group_name(name))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("a group named {name:?} exists"))));
    }
    if txn.get_raw(&keys::group(group_id))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("group id {group_id} is taken"))));
    }
    txn.put(keys::group(group_id), &Group { id: group_id.into(), name: name.into(), created_ms: txn.now_ms });
    txn.put(keys::group_name(name), &group_id.to_string());
    Ok(Outcome::GroupCreated { group_id: group_id.into() })
}

/// Adds a user to a group (adding a member again changes nothing) or removes one.
pub(crate) fn set_group_member(
    txn: &mut Txn<'_>,
    group_id: &str,
    user_id: &str,
    member: bool,
) -> Result<Outcome, StorageError> {
    if txn.get::<Group>("group", &keys::group(group_id))?.is_none() {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("group {group_id}"))));
    }
    let Some(mut user) = txn.get::<User>("user", &keys::user(user_id))? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {user_id}"))));
    };
    let is_member = user.groups.iter().any(|g| g == group_id);
    match (member, is_member) {
        (true, true) => return Ok(Outcome::Done),
        (false, false) => {
            return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {user_id} is not in group {group_id}"))))
        }
        (true, false) if user.groups.len() >= GROUPS_PER_USER_MAX => {
            return Ok(Outcome::Rejected(Rejection::Conflict(format!(
                "user {user_id} is in {GROUPS_PER_USER_MAX} groups, the most allowed"
            ))))
        }
        (true, false) => {
            user.groups.push(group_id.into());
            txn.put_raw(keys::group_member(group_id, user_id), Vec::new());
        }
        (false, true) => {
            user.groups.retain(|g| g != group_id);
            txn.delete(keys::group_member(group_id, user_id));
        }
    }
    txn.put(keys::user(user_id), &user);
    Ok(Outcome::Done)
}

/// Brings the stored data up to format `schema` ([`crate::format`]) and records it as the
/// cluster's format. Format 2 (sharing) rebuilds the per-namespace chunk references from
/// every stored version, so blocks committed before block scoping stay readable by the
/// readers of their namespaces; formats 3 and 4 change no stored data; format 5 indexes the
/// share links by namespace. Done once; later proposals change nothing.
pub(crate) fn migrate(txn: &mut Txn<'_>, schema: u32) -> Result<Outcome, StorageError> {
    let stored = schema_in(txn)?;
    if schema <= stored {
        return Ok(Outcome::Done);
    }
    if schema > crate::format::FORMAT {
        return Ok(Outcome::Rejected(Rejection::Invalid(format!("schema {schema} is unknown to this node"))));
    }
    if stored < 2 {
        rebuild_chunk_references(txn)?;
    }
    if stored < crate::links::NAMESPACE_INDEX_FORMAT && schema >= crate::links::NAMESPACE_INDEX_FORMAT {
        crate::links::index_by_namespace(txn)?;
    }
    txn.put(keys::schema(), &schema);
    Ok(Outcome::Done)
}

/// The cluster's data format as of this point of the log (1 before any migration): what an
/// apply whose behaviour older code lacks asks before acting (every node at this point holds
/// the same, and none runs older code once it is raised).
pub(crate) fn schema_in(txn: &Txn<'_>) -> Result<u32, StorageError> {
    Ok(txn.get::<u32>("schema", &keys::schema())?.unwrap_or(1))
}

fn rebuild_chunk_references(txn: &mut Txn<'_>) -> Result<(), StorageError> {
    // The one apply not bounded by a named limit: a one-time upgrade of data written before
    // sharing, proposed by the node itself at start, never by a request.
    let (start, end) = keys::chunk_namespace_all();
    for key in txn.keys_in(&start, &end, usize::MAX)? {
        txn.delete(key);
    }
    let (start, end) = keys::version_all();
    let mut namespaces: BTreeMap<String, String> = BTreeMap::new();
    for key in txn.keys_in(&start, &end, usize::MAX)? {
        let Some(version) = txn.get::<VersionRecord>("version", &key)? else { continue };
        // The key is the tag, the file id, a 0 byte and the 8-byte version number.
        let Some(file_id) = key.get(1..key.len().saturating_sub(9)) else { continue };
        let file_id = String::from_utf8_lossy(file_id).into_owned();
        let namespace_id = match namespaces.get(&file_id) {
            Some(ns) => ns.clone(),
            None => {
                let Some(file) = txn.get::<FileRecord>("file", &keys::file(&file_id))? else { continue };
                namespaces.insert(file_id, file.namespace_id.clone());
                file.namespace_id
            }
        };
        let mut seen: std::collections::HashSet<BlockHash> = std::collections::HashSet::new();
        for hash in &version.chunks {
            if seen.insert(*hash) {
                chunks::count_in_namespace(txn, &namespace_id, hash, Delta::Add)?;
            }
        }
    }
    Ok(())
}

/// A namespace the caller can access, with their role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub namespace: Namespace,
    pub role: Role,
}

impl StateMachine {
    /// The caller's role on a namespace (see [`role`]).
    pub fn role(&self, user_id: &str, namespace_id: &str) -> Result<Option<Role>, StorageError> {
        role(self, user_id, namespace_id)
    }

    /// Every namespace the user can access (their personal one first, then by id): the
    /// first [`LISTED_NAMESPACES_MAX`] (tests, the notification channels).
    pub fn namespaces_of(&self, user_id: &str) -> Result<Vec<Access>, StorageError> {
        self.namespaces_page(user_id, None, LISTED_NAMESPACES_MAX)
    }

    /// The namespaces the user can access after `after` (a namespace id from a previous
    /// page; `None`: from the start, their personal one first), at most `limit`. Reads at most
    /// `limit + 1` index keys for the user and for each of their groups.
    pub fn namespaces_page(
        &self,
        user_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Access>, StorageError> {
        let Some(user) = self.user(user_id)? else { return Ok(Vec::new()) };
        let mut ids: Vec<String> = Vec::new();
        if after.is_none() {
            ids.push(user.namespace_id.clone());
        }
        let grantees =
            std::iter::once(Grantee::User(user.id.clone())).chain(user.groups.iter().cloned().map(Grantee::Group));
        let mut shared = std::collections::BTreeSet::new();
        for grantee in grantees {
            let (mut start, end) = keys::acl_grantee_range(&grantee.key());
            let prefix = start.len();
            if let Some(after) = after.filter(|a| *a != user.namespace_id) {
                start.extend_from_slice(after.as_bytes());
                start.push(0);
            }
            for key in self.scan_keys(&start, &end, limit.saturating_add(1))? {
                shared.insert(String::from_utf8_lossy(&key[prefix..]).into_owned());
            }
        }
        ids.extend(shared.into_iter().filter(|id| *id != user.namespace_id).take(limit.saturating_add(1)));
        let mut out = Vec::new();
        for id in ids {
            if out.len() >= limit {
                break;
            }
            if let (Some(namespace), Some(role)) = (self.namespace(&id)?, role(self, user_id, &id)?) {
                out.push(Access { namespace, role });
            }
        }
        Ok(out)
    }

    /// A namespace's ACL entries in key order after `after` (an entry's grantee key from a
    /// previous page), at most `limit`.
    pub fn acl_page(
        &self,
        namespace_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AclEntry>, StorageError> {
        let (mut start, end) = keys::acl_range(namespace_id);
        if let Some(after) = after {
            start = keys::acl(namespace_id, after);
            start.push(0);
        }
        Ok(self
            .scan::<AclEntry>("acl entry", &start, &end, limit)?
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| e.namespace_id == namespace_id)
            .collect())
    }

    /// The pending invitations of `grantee` after namespace `after`, by namespace id, with
    /// their folders: those among the next `limit` index keys, and the namespace id to go on
    /// after when more keys follow.
    pub fn invitations_page(
        &self,
        grantee: &Grantee,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<(AclEntry, Namespace)>, Option<String>), StorageError> {
        let (mut start, end) = keys::invitation_range(&grantee.key());
        let prefix = start.len();
        if let Some(after) = after {
            start.extend_from_slice(after.as_bytes());
            start.push(0);
        }
        let mut scanned = self.scan_keys(&start, &end, limit.saturating_add(1))?;
        let next = (scanned.len() > limit).then(|| {
            scanned.truncate(limit);
            scanned.last().map(|key| String::from_utf8_lossy(&key[prefix..]).into_owned())
        });
        let mut out = Vec::new();
        for key in scanned {
            let namespace_id = String::from_utf8_lossy(&key[prefix..]).into_owned();
            let found = self.read::<AclEntry>("acl entry", &keys::acl(&namespace_id, &grantee.key()))?;
            let Some(entry) = found.filter(|e| e.pending && e.namespace_id == namespace_id && e.grantee == *grantee)
            else {
                continue;
            };
            if let Some(namespace) = self.namespace(&namespace_id)?.filter(|n| !n.deleting) {
                out.push((entry, namespace));
            }
        }
        Ok((out, next.flatten()))
    }

    /// A namespace's ACL entries (at most [`ACL_ENTRIES_MAX`]).
    pub fn acl(&self, namespace_id: &str) -> Result<Vec<AclEntry>, StorageError> {
        self.acl_page(namespace_id, None, ACL_ENTRIES_MAX)
    }

    pub fn group(&self, group_id: &str) -> Result<Option<Group>, StorageError> {
        self.read("group", &keys::group(group_id))
    }

    /// The id of the group with this name.
    pub fn group_by_name(&self, name: &str) -> Result<Option<String>, StorageError> {
        self.read("group name", &keys::group_name(name))
    }

    /// The user with this name.
    pub fn user_by_name(&self, name: &str) -> Result<Option<User>, StorageError> {
        match self.read::<String>("user name", &keys::user_name(name))? {
            Some(id) => self.user(&id),
            None => Ok(None),
        }
    }

    /// Groups by id after `after`, at most `limit`.
    pub fn groups_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<Group>, StorageError> {
        let (mut start, end) = keys::group_range();
        if let Some(after) = after {
            start = keys::group(after);
            start.push(0);
        }
        Ok(self.scan::<Group>("group", &start, &end, limit)?.into_iter().map(|(_, g)| g).collect())
    }

    /// The user ids of a group's members after `after`, at most `limit`.
    pub fn group_members_page(
        &self,
        group_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StorageError> {
        let (mut start, end) = keys::group_member_range(group_id);
        let prefix = start.len();
        if let Some(after) = after {
            start = keys::group_member(group_id, after);
            start.push(0);
        }
        Ok(self
            .scan_keys(&start, &end, limit)?
            .into_iter()
            .map(|key| String::from_utf8_lossy(&key[prefix..]).into_owned())
            .collect())
    }

    /// The user ids of a group's members (tests).
    pub fn group_members(&self, group_id: &str) -> Result<Vec<String>, StorageError> {
        self.group_members_page(group_id, None, usize::MAX)
    }

    /// The cluster's data format, as replicated (1 before any migration; see
    /// [`crate::format`]).
    pub fn schema(&self) -> Result<u32, StorageError> {
        Ok(self.read::<u32>("schema", &keys::schema())?.unwrap_or(1))
    }
}

#[cfg(test)]
#[path = "sharing_tests.rs"]
mod tests;
