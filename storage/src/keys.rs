//! Key encodings, once. Integers are big-endian so keys sort numerically; every state key
//! starts with a one-byte table tag so a table is a contiguous key range.

/// Key of log entry `index` in [`crate::cf::LOG`].
pub fn log(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Decodes a [`log`] key.
pub fn log_index(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Keys in [`crate::cf::RAFT_META`].
pub mod meta {
    pub const VOTE: &[u8] = b"vote";
    pub const COMMITTED: &[u8] = b"committed";
    pub const PURGED: &[u8] = b"purged";
    /// The current snapshot's record (its meta and file name; raft crate).
    pub const SNAPSHOT: &[u8] = b"snapshot";
    /// Which state column family is live (`crate::cf::STATES`); absent: `state`.
    pub const STATE_CF: &[u8] = b"state_cf";
    /// Set by versions before incarnations while a node that lost its data awaited being
    /// added again; read once, when such a node takes its incarnation (raft::membership).
    pub const REJOIN_FLOOR: &[u8] = b"rejoin_floor";
    /// This data directory's incarnation: a random id written (durably) before the node
    /// first speaks to anyone; the membership records it (raft::membership).
    pub const INCARNATION: &[u8] = b"incarnation";
    /// The data format of the code that last opened the data directory (a decimal number;
    /// absent before format 3; see [`crate::format`]).
    pub const FORMAT: &[u8] = b"format";
    /// Present when the incarnation was taken by a data directory that already held Raft
    /// state from a version without incarnations (its membership record names none).
    pub const INCARNATION_LEGACY: &[u8] = b"incarnation_legacy";
    /// The identity of the cluster this data directory belongs to (raft::cluster_id): minted
    /// at bootstrap, by `recover --force-new-cluster` and by `restore`, taken by a fresh
    /// node from the first leader that writes to it; absent for a cluster formed before
    /// identities, until its next recovery.
    pub const CLUSTER_ID: &[u8] = b"cluster_id";
}

/// Table tags of [`crate::cf::STATE`].
mod tag {
    pub const SYSTEM: u8 = 0x00;
    pub const USER: u8 = 0x01;
    pub const USER_NAME: u8 = 0x02;
    pub const TOKEN: u8 = 0x03;
    pub const NAMESPACE: u8 = 0x04;
    pub const IDEMPOTENCY: u8 = 0x05;
    pub const IDEMPOTENCY_EXPIRY: u8 = 0x06;
    pub const PROCESSED: u8 = 0x07;
    pub const PROCESSED_EXPIRY: u8 = 0x08;
    pub const RATE: u8 = 0x09;
    pub const RATE_EXPIRY: u8 = 0x0a;
    pub const CHUNK: u8 = 0x0b;
    pub const FILE_PATH: u8 = 0x0c;
    pub const FILE: u8 = 0x0d;
    pub const VERSION: u8 = 0x0e;
    pub const CHANGE: u8 = 0x0f;
    pub const NAMESPACE_CURSOR: u8 = 0x10;
    pub const SUPERSEDED: u8 = 0x11;
    pub const ORPHAN: u8 = 0x12;
    pub const JOB: u8 = 0x13;
    pub const JOB_DUE: u8 = 0x14;
    pub const JOB_LEASE: u8 = 0x15;
    pub const JOB_OWNER: u8 = 0x16;
    pub const JOB_RUN: u8 = 0x17;
    pub const JOB_RUN_EXPIRY: u8 = 0x18;
    pub const CONFLICT: u8 = 0x19;
    pub const CONFLICT_EXPIRY: u8 = 0x1a;
    pub const USER_TOKEN: u8 = 0x1b;
    pub const ACL: u8 = 0x1c;
    pub const ACL_GRANTEE: u8 = 0x1d;
    pub const GROUP: u8 = 0x1e;
    pub const GROUP_NAME: u8 = 0x1f;
    pub const GROUP_MEMBER: u8 = 0x20;
    pub const CHUNK_UPLOADER: u8 = 0x21;
    pub const CHUNK_NAMESPACE: u8 = 0x22;
    pub const NAMESPACE_PURGE: u8 = 0x23;
    pub const INVITATION: u8 = 0x24;
    pub const JOBS_ACTIVE: u8 = 0x25;
    pub const STORED_BYTES: u8 = 0x26;
    pub const FOLDERS_CREATED: u8 = 0x27;
    pub const PASSWORD: u8 = 0x28;
    pub const WEBHOOK_SECRET: u8 = 0x29;
    pub const LINK: u8 = 0x2a;
    pub const USER_LINK: u8 = 0x2b;
    pub const LINKS_COUNT: u8 = 0x2c;
    pub const TOKEN_EXPIRY: u8 = 0x2d;
    pub const NAMESPACE_LINK: u8 = 0x2e;
    pub const FILE_PROPS: u8 = 0x2f;
    pub const PROP_BYTES: u8 = 0x30;
}

pub fn job(job_id: &str) -> Vec<u8> {
    tagged(tag::JOB, job_id.as_bytes())
}

/// Scheduled jobs by next run time.
pub fn job_due(next_run_ms: u64, job_id: &str) -> Vec<u8> {
    timed(tag::JOB_DUE, next_run_ms, job_id.as_bytes())
}

/// Claimed or running jobs by lease expiry.
pub fn job_lease(expires_ms: u64, job_id: &str) -> Vec<u8> {
    timed(tag::JOB_LEASE, expires_ms, job_id.as_bytes())
}

/// The range of [`job_due`] (or [`job_lease`]) keys up to and including `time_ms`.
pub fn job_due_until(time_ms: u64) -> (Vec<u8>, Vec<u8>) {
    (vec![tag::JOB_DUE], timed(tag::JOB_DUE, time_ms.saturating_add(1), &[]))
}

pub fn job_lease_until(time_ms: u64) -> (Vec<u8>, Vec<u8>) {
    (vec![tag::JOB_LEASE], timed(tag::JOB_LEASE, time_ms.saturating_add(1), &[]))
}

/// A user's jobs, by creation time.
pub fn job_owner(owner: &str, created_ms: u64, job_id: &str) -> Vec<u8> {
    let mut rest = created_ms.to_be_bytes().to_vec();
    rest.extend_from_slice(job_id.as_bytes());
    joined(tag::JOB_OWNER, owner, &rest)
}

pub fn job_owner_range(owner: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::JOB_OWNER, owner, &[]), joined(tag::JOB_OWNER, owner, &[0xff; 9]))
}

/// The bytes a user stores (u64): the size of every block they uploaded, once each.
pub fn stored_bytes(user_id: &str) -> Vec<u8> {
    tagged(tag::STORED_BYTES, user_id.as_bytes())
}

/// A user's count of shared folders created and not deleted (u64).
pub fn folders_created(user_id: &str) -> Vec<u8> {
    tagged(tag::FOLDERS_CREATED, user_id.as_bytes())
}

/// A user's count of jobs that may still run (u64).
pub fn jobs_active(owner: &str) -> Vec<u8> {
    tagged(tag::JOBS_ACTIVE, owner.as_bytes())
}

/// Runs of a job by sequence.
pub fn job_run(job_id: &str, seq: u64) -> Vec<u8> {
    joined(tag::JOB_RUN, job_id, &seq.to_be_bytes())
}

pub fn job_run_range(job_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::JOB_RUN, job_id, &[]), joined(tag::JOB_RUN, job_id, &[0xff; 9]))
}

/// Finished runs by expiry time; the rest of the key is the run's [`job_run`] key.
pub fn job_run_expiry(expires_ms: u64, run_key: &[u8]) -> Vec<u8> {
    timed(tag::JOB_RUN_EXPIRY, expires_ms, run_key)
}

pub fn job_run_expiry_until(time_ms: u64) -> (Vec<u8>, Vec<u8>) {
    (vec![tag::JOB_RUN_EXPIRY], timed(tag::JOB_RUN_EXPIRY, time_ms.saturating_add(1), &[]))
}

fn timed(tag: u8, time_ms: u64, rest: &[u8]) -> Vec<u8> {
    let mut key = vec![tag];
    key.extend_from_slice(&time_ms.to_be_bytes());
    key.extend_from_slice(rest);
    key
}

/// Splits a timed key ([`superseded`], [`orphan`], [`job_due`], [`job_lease`]) into (time, rest).
pub fn parse_timed(key: &[u8]) -> Option<(u64, &[u8])> {
    let (time, rest) = key.get(1..)?.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*time), rest))
}

/// Versions no longer current, by the time they stopped being current: candidates for
/// expiry (retention counts from then, not from the version's creation).
pub fn superseded(superseded_ms: u64, file_id: &str, version: u64) -> Vec<u8> {
    let mut rest = file_id.as_bytes().to_vec();
    rest.extend_from_slice(&version.to_be_bytes());
    timed(tag::SUPERSEDED, superseded_ms, &rest)
}

/// Chunks no version references, by the time they became unreferenced.
pub fn orphan(since_ms: u64, hash: &[u8; 32]) -> Vec<u8> {
    timed(tag::ORPHAN, since_ms, hash)
}

/// The key range of the [`superseded`] index up to and including `time_ms`.
pub fn superseded_until(time_ms: u64) -> (Vec<u8>, Vec<u8>) {
    (vec![tag::SUPERSEDED], timed(tag::SUPERSEDED, time_ms.saturating_add(1), &[]))
}

/// The key range of the [`orphan`] index up to and including `time_ms`.
pub fn orphans_until(time_ms: u64) -> (Vec<u8>, Vec<u8>) {
    (vec![tag::ORPHAN], timed(tag::ORPHAN, time_ms.saturating_add(1), &[]))
}

/// The whole chunk index.
pub fn chunk_range() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::CHUNK], vec![tag::CHUNK + 1])
}

fn joined(tag: u8, first: &str, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + first.len() + rest.len());
    key.push(tag);
    key.extend_from_slice(first.as_bytes());
    key.push(0);
    key.extend_from_slice(rest);
    key
}

/// Path index: (namespace, path) → file id. Paths sort, so a folder is a key range.
pub fn file_path(namespace_id: &str, path: &str) -> Vec<u8> {
    joined(tag::FILE_PATH, namespace_id, path.as_bytes())
}

pub fn file(file_id: &str) -> Vec<u8> {
    tagged(tag::FILE, file_id.as_bytes())
}

/// Versions of a file, oldest first.
pub fn version(file_id: &str, version: u64) -> Vec<u8> {
    joined(tag::VERSION, file_id, &version.to_be_bytes())
}

/// The first key of a file's versions and the first key past them.
pub fn version_range(file_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::VERSION, file_id, &[]), joined(tag::VERSION, file_id, &[0xff; 9]))
}

/// Change feed of a namespace: sequence → file id; each file appears once, at its latest
/// change.
pub fn change(namespace_id: &str, seq: u64) -> Vec<u8> {
    joined(tag::CHANGE, namespace_id, &seq.to_be_bytes())
}

/// The sequence encoded in a [`change`] key.
pub fn change_seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(key.len().checked_sub(8)?..)?.try_into().ok()?))
}

/// The namespace's current cursor (its last change sequence).
pub fn namespace_cursor(namespace_id: &str) -> Vec<u8> {
    tagged(tag::NAMESPACE_CURSOR, namespace_id.as_bytes())
}

/// An expiry index: records of one table ordered by the time they expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiring {
    Idempotency,
    Processed,
    Rate,
    /// The conflicts commits ran into, so a retried conflicting commit gets the same answer.
    Conflict,
    /// Tokens with an expiry, by the hash of their secret (indexed from format 5 on).
    Token,
}

impl Expiring {
    /// Every kind, in the order a purge visits them.
    pub const ALL: [Expiring; 5] =
        [Expiring::Idempotency, Expiring::Processed, Expiring::Rate, Expiring::Conflict, Expiring::Token];

    fn tags(self) -> (u8, u8) {
        match self {
            Expiring::Idempotency => (tag::IDEMPOTENCY, tag::IDEMPOTENCY_EXPIRY),
            Expiring::Processed => (tag::PROCESSED, tag::PROCESSED_EXPIRY),
            Expiring::Rate => (tag::RATE, tag::RATE_EXPIRY),
            Expiring::Conflict => (tag::CONFLICT, tag::CONFLICT_EXPIRY),
            Expiring::Token => (tag::TOKEN, tag::TOKEN_EXPIRY),
        }
    }

    /// Key of the record `id` in its table.
    pub fn record(self, id: &[u8]) -> Vec<u8> {
        tagged(self.tags().0, id)
    }

    /// Key of the index entry: the expiry time, then the record id.
    pub fn index(self, expires_ms: u64, id: &[u8]) -> Vec<u8> {
        let mut rest = expires_ms.to_be_bytes().to_vec();
        rest.extend_from_slice(id);
        tagged(self.tags().1, &rest)
    }

    /// The first index key and the first key past the index.
    pub fn index_range(self) -> (Vec<u8>, Vec<u8>) {
        let tag = self.tags().1;
        (vec![tag], vec![tag + 1])
    }

    /// Splits an index key into (expires_ms, record id).
    pub fn parse_index(key: &[u8]) -> Option<(u64, &[u8])> {
        let rest = key.get(1..)?;
        let (time, id) = rest.split_first_chunk::<8>()?;
        Some((u64::from_be_bytes(*time), id))
    }
}

fn tagged(tag: u8, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + rest.len());
    key.push(tag);
    key.extend_from_slice(rest);
    key
}

/// The opaque applied marker (last applied log id and membership, owned by the raft crate).
pub fn applied_marker() -> Vec<u8> {
    tagged(tag::SYSTEM, b"applied")
}

/// The state machine's clock: the largest leader time applied so far.
pub fn clock() -> Vec<u8> {
    tagged(tag::SYSTEM, b"clock")
}

pub fn user(user_id: &str) -> Vec<u8> {
    tagged(tag::USER, user_id.as_bytes())
}

/// A user's password hash (a PHC string; absent: no password).
pub fn password(user_id: &str) -> Vec<u8> {
    tagged(tag::PASSWORD, user_id.as_bytes())
}

/// A user's webhook signing secret ([`crate::records::WebhookSecret`]).
pub fn webhook_secret(user_id: &str) -> Vec<u8> {
    tagged(tag::WEBHOOK_SECRET, user_id.as_bytes())
}

/// A share link by the hash of its token ([`crate::links::Link`]).
pub fn link(token_hash: &[u8; 32]) -> Vec<u8> {
    tagged(tag::LINK, token_hash)
}

/// A user's links: (creator, link id) → the token's hash (for listing and revoking).
pub fn user_link(user_id: &str, link_id: &str) -> Vec<u8> {
    joined(tag::USER_LINK, user_id, link_id.as_bytes())
}

/// Every [`user_link`] key of a user.
pub fn user_link_range(user_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::USER_LINK, user_id, &[]), joined(tag::USER_LINK, user_id, &[0xff]))
}

/// A namespace's links: (namespace, link id) → the token's hash (its owner lists and revokes
/// them; written from format 5, and for older links by the migration to it).
pub fn namespace_link(namespace_id: &str, link_id: &str) -> Vec<u8> {
    joined(tag::NAMESPACE_LINK, namespace_id, link_id.as_bytes())
}

/// Every [`namespace_link`] key of a namespace.
pub fn namespace_link_range(namespace_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::NAMESPACE_LINK, namespace_id, &[]), joined(tag::NAMESPACE_LINK, namespace_id, &[0xff]))
}

/// Every link record.
pub fn link_all() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::LINK], vec![tag::LINK + 1])
}

/// A file's dead properties ([`crate::props`]).
pub fn file_props(file_id: &str) -> Vec<u8> {
    tagged(tag::FILE_PROPS, file_id.as_bytes())
}

/// Bytes of dead properties a user set (u64).
pub fn prop_bytes(user_id: &str) -> Vec<u8> {
    tagged(tag::PROP_BYTES, user_id.as_bytes())
}

/// How many links a user has (u64).
pub fn links_count(user_id: &str) -> Vec<u8> {
    tagged(tag::LINKS_COUNT, user_id.as_bytes())
}

/// Unique index: user name → user id.
pub fn user_name(name: &str) -> Vec<u8> {
    tagged(tag::USER_NAME, name.as_bytes())
}

/// Tokens are keyed by the blake3 hash of the secret; the secret itself is never stored.
pub fn token(token_hash: &[u8; 32]) -> Vec<u8> {
    tagged(tag::TOKEN, token_hash)
}

/// A user's tokens: (user, token id) → the token's secret hash (for listing and revoking).
pub fn user_token(user_id: &str, token_id: &str) -> Vec<u8> {
    joined(tag::USER_TOKEN, user_id, token_id.as_bytes())
}

/// Every [`user_token`] key of a user.
pub fn user_token_range(user_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::USER_TOKEN, user_id, &[]), joined(tag::USER_TOKEN, user_id, &[0xff]))
}

/// ACL entry: (namespace, grantee key) → [`crate::records::AclEntry`].
pub fn acl(namespace_id: &str, grantee_key: &str) -> Vec<u8> {
    joined(tag::ACL, namespace_id, grantee_key.as_bytes())
}

/// Every [`acl`] key of a namespace.
pub fn acl_range(namespace_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::ACL, namespace_id, &[]), joined(tag::ACL, namespace_id, &[0xff]))
}

/// Reverse ACL index: (grantee key, namespace) → nothing, for listing a principal's folders.
pub fn acl_grantee(grantee_key: &str, namespace_id: &str) -> Vec<u8> {
    joined(tag::ACL_GRANTEE, grantee_key, namespace_id.as_bytes())
}

/// Every [`acl_grantee`] key of a grantee; the namespace id is the key past the prefix.
pub fn acl_grantee_range(grantee_key: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::ACL_GRANTEE, grantee_key, &[]), joined(tag::ACL_GRANTEE, grantee_key, &[0xff]))
}

/// A grantee's pending invitations: (grantee key, namespace) → nothing (the entry itself is
/// the [`acl`] record, `pending`).
pub fn invitation(grantee_key: &str, namespace_id: &str) -> Vec<u8> {
    joined(tag::INVITATION, grantee_key, namespace_id.as_bytes())
}

/// Every [`invitation`] key of a grantee; the namespace id is the key past the prefix.
pub fn invitation_range(grantee_key: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::INVITATION, grantee_key, &[]), joined(tag::INVITATION, grantee_key, &[0xff]))
}

pub fn group(group_id: &str) -> Vec<u8> {
    tagged(tag::GROUP, group_id.as_bytes())
}

/// Every group.
pub fn group_range() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::GROUP], vec![tag::GROUP + 1])
}

/// Unique index: group name → group id.
pub fn group_name(name: &str) -> Vec<u8> {
    tagged(tag::GROUP_NAME, name.as_bytes())
}

/// Members of a group: (group, user) → nothing.
pub fn group_member(group_id: &str, user_id: &str) -> Vec<u8> {
    joined(tag::GROUP_MEMBER, group_id, user_id.as_bytes())
}

pub fn group_member_range(group_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::GROUP_MEMBER, group_id, &[]), joined(tag::GROUP_MEMBER, group_id, &[0xff]))
}

/// Who uploaded a block: (hash, user) → nothing. The hash has a fixed length.
pub fn chunk_uploader(hash: &[u8; 32], user_id: &str) -> Vec<u8> {
    let mut rest = hash.to_vec();
    rest.extend_from_slice(user_id.as_bytes());
    tagged(tag::CHUNK_UPLOADER, &rest)
}

/// Every [`chunk_uploader`] key of a block.
pub fn chunk_uploader_range(hash: &[u8; 32]) -> (Vec<u8>, Vec<u8>) {
    let start = tagged(tag::CHUNK_UPLOADER, hash);
    let end = next_prefix(start.clone());
    (start, end)
}

/// References of a block per namespace: (hash, namespace) → count of versions in that
/// namespace naming it.
pub fn chunk_namespace(hash: &[u8; 32], namespace_id: &str) -> Vec<u8> {
    let mut rest = hash.to_vec();
    rest.extend_from_slice(namespace_id.as_bytes());
    tagged(tag::CHUNK_NAMESPACE, &rest)
}

/// Every [`chunk_namespace`] key of a block (the namespace id follows the 33-byte prefix).
pub fn chunk_namespace_range(hash: &[u8; 32]) -> (Vec<u8>, Vec<u8>) {
    let start = tagged(tag::CHUNK_NAMESPACE, hash);
    let end = next_prefix(start.clone());
    (start, end)
}

/// Every [`chunk_namespace`] key.
pub fn chunk_namespace_all() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::CHUNK_NAMESPACE], vec![tag::CHUNK_NAMESPACE + 1])
}

/// Every [`version`] key.
pub fn version_all() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::VERSION], vec![tag::VERSION + 1])
}

/// Every [`file_path`] key of a namespace.
pub fn file_path_range(namespace_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::FILE_PATH, namespace_id, &[]), joined(tag::FILE_PATH, namespace_id, &[0xff]))
}

/// Every [`change`] key of a namespace.
pub fn change_range(namespace_id: &str) -> (Vec<u8>, Vec<u8>) {
    (joined(tag::CHANGE, namespace_id, &[]), joined(tag::CHANGE, namespace_id, &[0xff; 9]))
}

/// The first key past every key that starts with `prefix`.
fn next_prefix(mut prefix: Vec<u8>) -> Vec<u8> {
    while let Some(last) = prefix.pop() {
        if last < 0xff {
            prefix.push(last + 1);
            return prefix;
        }
    }
    vec![0xff; 9]
}

/// The floor of the queue-like index whose keys (or range) start with `index_key`'s tag
/// (`floor.rs`): no live key of the index is below it.
pub fn queue_floor(index_key: &[u8]) -> Vec<u8> {
    let mut rest = b"floor/".to_vec();
    rest.push(index_key.first().copied().unwrap_or(0));
    tagged(tag::SYSTEM, &rest)
}

/// The cluster's data format (see [`crate::format`] and `sharing::migrate`).
pub fn schema() -> Vec<u8> {
    tagged(tag::SYSTEM, b"schema")
}

/// The cluster's runtime limits ([`crate::limits`]).
pub fn limits() -> Vec<u8> {
    tagged(tag::SYSTEM, b"limits")
}

/// Chunk index entry of a block.
pub fn chunk(hash: &[u8; 32]) -> Vec<u8> {
    tagged(tag::CHUNK, hash)
}

pub fn namespace(namespace_id: &str) -> Vec<u8> {
    tagged(tag::NAMESPACE, namespace_id.as_bytes())
}

/// Deleted namespaces whose records are still being removed, a bounded step at a time.
pub fn namespace_purge(namespace_id: &str) -> Vec<u8> {
    tagged(tag::NAMESPACE_PURGE, namespace_id.as_bytes())
}

/// Every [`namespace_purge`] key.
pub fn namespace_purge_range() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::NAMESPACE_PURGE], vec![tag::NAMESPACE_PURGE + 1])
}

/// The first key of the user table and the first key past it.
pub fn user_range() -> (Vec<u8>, Vec<u8>) {
    (vec![tag::USER], vec![tag::USER + 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_numerically() {
        assert!(log(2) < log(10));
        assert!(log(255) < log(256));
        assert_eq!(log_index(&log(12345)), Some(12345));
        assert_eq!(log_index(b"short"), None);
    }

    #[test]
    fn tables_do_not_overlap() {
        let (start, end) = user_range();
        let u = user("abc");
        assert!(start <= u && u < end);
        assert!(!(start <= user_name("abc") && user_name("abc") < end));
        assert!(!(start <= namespace("abc") && namespace("abc") < end));
    }
}
