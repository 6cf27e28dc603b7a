//! The replicated state machine: deterministic apply, read queries, snapshot build/restore.
//!
//! `apply` reads no clock, randomness, environment or node-local file: time (`Batch::now_ms`)
//! and ids travel inside the commands. Each applied log entry is one RocksDB write batch
//! holding its data changes together with the applied marker (the last applied log id and
//! membership, opaque bytes owned by the raft crate).

use std::collections::HashMap;

use rocksdb::{IteratorMode, WriteBatch};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::command::{Batch, Command, Outcome};
use crate::db::write_options;
use crate::{accounts, cf, chunks, files, guards, jobs, keys, sharing, Db, StorageError};

/// Magic prefix of a snapshot image; the version is the last byte.
const SNAPSHOT_MAGIC: &[u8; 8] = b"RBXSNAP1";
/// Length of the blake3 checksum that ends a snapshot image.
const SNAPSHOT_CHECKSUM_BYTES: usize = 32;

/// A consistent image of the state column family.
#[derive(Debug, Clone)]
pub struct SnapshotImage {
    /// The applied marker as of the image.
    pub marker: Option<Vec<u8>>,
    /// Encoded image: magic, length-prefixed key/value pairs, blake3 checksum.
    pub bytes: Vec<u8>,
}

/// The state machine over the node's database.
#[derive(Debug, Clone)]
pub struct StateMachine {
    db: Db,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data structs to JSON cannot fail.
    serde_json::to_vec(value).expect("records serialize")
}

pub(crate) fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StorageError> {
    serde_json::from_slice(bytes).map_err(StorageError::decode(what))
}

/// The pending writes of one applied entry: reads see earlier writes of the same entry.
pub(crate) struct Txn<'a> {
    db: &'a Db,
    batch: WriteBatch,
    overlay: HashMap<Vec<u8>, Option<Vec<u8>>>,
    pub(crate) now_ms: u64,
}

impl Txn<'_> {
    pub(crate) fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(value) = self.overlay.get(key) {
            return Ok(value.clone());
        }
        Ok(self.db.rocks().get_cf(self.db.cf(cf::STATE), key)?)
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, what: &'static str, key: &[u8]) -> Result<Option<T>, StorageError> {
        self.get_raw(key)?.map(|bytes| decode(what, &bytes)).transpose()
    }

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.batch.put_cf(self.db.cf(cf::STATE), &key, &value);
        self.overlay.insert(key, Some(value));
    }

    pub(crate) fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) {
        self.put_raw(key, encode(value));
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.batch.delete_cf(self.db.cf(cf::STATE), &key);
        self.overlay.insert(key, None);
    }

    /// Keys of `[start, end)` as of the previous entry (this entry's writes not included),
    /// at most `max`.
    pub(crate) fn committed_keys(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        range(self.db, start, end, max, |key, _| Ok(key.into_vec()))
    }

    /// Every key of `[start, end)` including this entry's writes so far, in key order (for
    /// small ranges: a namespace's ACL, or a folder being deleted).
    pub(crate) fn keys_in(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut keys: std::collections::BTreeSet<Vec<u8>> =
            range(self.db, start, end, usize::MAX, |key, _| Ok(key.into_vec()))?.into_iter().collect();
        for (key, value) in &self.overlay {
            if key.as_slice() >= start && key.as_slice() < end {
                match value {
                    Some(_) => keys.insert(key.clone()),
                    None => keys.remove(key),
                };
            }
        }
        Ok(keys.into_iter().collect())
    }
}

/// Point reads of the state, as apply sees it (with the entry's own writes) or as a query
/// does: what the permission rule (`sharing::role`) needs, so one rule serves both.
pub trait Reads {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;

    /// Every key of `[start, end)` (small ranges only).
    fn keys_between(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>, StorageError>;

    fn get_record<T: DeserializeOwned>(&self, what: &'static str, key: &[u8]) -> Result<Option<T>, StorageError>
    where
        Self: Sized,
    {
        self.get_bytes(key)?.map(|bytes| decode(what, &bytes)).transpose()
    }
}

impl Reads for Txn<'_> {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.get_raw(key)
    }

    fn keys_between(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>, StorageError> {
        self.keys_in(start, end)
    }
}

impl Reads for StateMachine {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.db.rocks().get_cf(self.db.cf(cf::STATE), key)?)
    }

    fn keys_between(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>, StorageError> {
        self.scan_keys(start, end, usize::MAX)
    }
}

/// Up to `max` entries of `[start, end)` of the state, in key order, each through `each`:
/// the one range scan of the crate.
fn range<T>(
    db: &Db,
    start: &[u8],
    end: &[u8],
    max: usize,
    mut each: impl FnMut(Box<[u8]>, Box<[u8]>) -> Result<T, StorageError>,
) -> Result<Vec<T>, StorageError> {
    let mut out = Vec::new();
    let mode = IteratorMode::From(start, rocksdb::Direction::Forward);
    for item in db.rocks().iterator_cf(db.cf(cf::STATE), mode) {
        let (key, value) = item?;
        if *key >= *end || out.len() >= max {
            break;
        }
        out.push(each(key, value)?);
    }
    Ok(out)
}

impl StateMachine {
    pub fn new(db: Db) -> StateMachine {
        StateMachine { db }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The applied marker of the last applied entry, if any entry was applied.
    pub fn applied_marker(&self) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.db.rocks().get_cf(self.db.cf(cf::STATE), keys::applied_marker())?)
    }

    /// The state machine's clock: the largest leader time applied so far (0 before any).
    pub fn clock_ms(&self) -> Result<u64, StorageError> {
        let raw = self.db.rocks().get_cf(self.db.cf(cf::STATE), keys::clock())?;
        raw.map(|bytes| decode("clock", &bytes)).transpose().map(|c| c.unwrap_or(0))
    }

    /// Applies one log entry: its batch (none for blank and membership entries) and the new
    /// applied marker, as one write batch. Returns one outcome per command, in order.
    pub fn apply(&self, marker: &[u8], batch: Option<&Batch>) -> Result<Vec<Outcome>, StorageError> {
        let now_ms = match batch {
            Some(batch) => self.clock_ms()?.max(batch.now_ms),
            None => self.clock_ms()?,
        };
        let mut txn = Txn { db: &self.db, batch: WriteBatch::default(), overlay: HashMap::new(), now_ms };
        let mut outcomes = Vec::new();
        if let Some(batch) = batch {
            outcomes.reserve(batch.commands.len());
            for command in &batch.commands {
                outcomes.push(apply_command(&mut txn, command)?);
            }
            debug_assert_eq!(outcomes.len(), batch.commands.len(), "one outcome per command");
            txn.put(keys::clock(), &now_ms);
        }
        txn.put_raw(keys::applied_marker(), marker.to_vec());
        // Not synced: the log entry being applied is already durable in the same WAL, and the
        // next synced write (or `build_snapshot`) makes this one durable too.
        self.db.rocks().write_opt(txn.batch, &write_options(false))?;
        Ok(outcomes)
    }

    /// The record at `key` of the state, decoded (`what` names it in errors).
    pub(crate) fn read<T: DeserializeOwned>(&self, what: &'static str, key: &[u8]) -> Result<Option<T>, StorageError> {
        let raw = self.db.rocks().get_cf(self.db.cf(cf::STATE), key)?;
        raw.map(|bytes| decode(what, &bytes)).transpose()
    }

    /// Keys of `[start, end)`, at most `limit`.
    pub(crate) fn scan_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        range(&self.db, start, end, limit, |key, _| Ok(key.into_vec()))
    }

    /// Entries of `[start, end)` as raw bytes, at most `limit`.
    pub(crate) fn scan_raw(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        range(&self.db, start, end, limit, |key, value| Ok((key.into_vec(), value.into_vec())))
    }

    /// Entries of `[start, end)`, decoded, at most `limit`.
    pub(crate) fn scan<T: DeserializeOwned>(
        &self,
        what: &'static str,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, T)>, StorageError> {
        range(&self.db, start, end, limit, |key, value| Ok((key.into_vec(), decode(what, &value)?)))
    }

    /// Builds a consistent image of the whole state from one RocksDB snapshot view.
    pub fn build_snapshot(&self) -> Result<SnapshotImage, StorageError> {
        self.db.sync_wal()?;
        let view = self.db.rocks().snapshot();
        let marker = view.get_cf(self.db.cf(cf::STATE), keys::applied_marker())?;
        let mut bytes = SNAPSHOT_MAGIC.to_vec();
        for item in view.iterator_cf(self.db.cf(cf::STATE), IteratorMode::Start) {
            let (key, value) = item?;
            push_framed(&mut bytes, &key);
            push_framed(&mut bytes, &value);
        }
        let checksum = blake3::hash(&bytes);
        bytes.extend_from_slice(checksum.as_bytes());
        Ok(SnapshotImage { marker, bytes })
    }

    /// Replaces the whole state with a snapshot image, synced. Returns the image's marker.
    pub fn restore_snapshot(&self, image: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let pairs = parse_image(image)?;
        let state = self.db.cf(cf::STATE);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(state, [0x00u8].as_slice(), [0xffu8; 8].as_slice());
        let mut marker = None;
        let marker_key = keys::applied_marker();
        for (key, value) in pairs {
            if key == marker_key.as_slice() {
                marker = Some(value.to_vec());
            }
            batch.put_cf(state, key, value);
        }
        self.db.rocks().write_opt(batch, &write_options(true))?;
        Ok(marker)
    }
}

fn push_framed(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("state keys and values are under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Checks magic and checksum and splits an image into key/value pairs.
fn parse_image(image: &[u8]) -> Result<Vec<(&[u8], &[u8])>, StorageError> {
    if image.len() < SNAPSHOT_MAGIC.len() + SNAPSHOT_CHECKSUM_BYTES || !image.starts_with(SNAPSHOT_MAGIC) {
        return Err(corrupt_image("bad header"));
    }
    let (body, checksum) = image.split_at(image.len() - SNAPSHOT_CHECKSUM_BYTES);
    if blake3::hash(body).as_bytes() != checksum {
        return Err(corrupt_image("checksum mismatch"));
    }
    let mut rest = &body[SNAPSHOT_MAGIC.len()..];
    let mut pairs = Vec::new();
    while !rest.is_empty() {
        let key = take_framed(&mut rest)?;
        let value = take_framed(&mut rest)?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

fn corrupt_image(what: &str) -> StorageError {
    StorageError::Corrupt(format!("snapshot image: {what}"))
}

fn take_framed<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], StorageError> {
    let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| corrupt_image("truncated length"))?;
    let len = u32::from_be_bytes(*len) as usize;
    if tail.len() < len {
        return Err(corrupt_image("truncated value"));
    }
    let (value, tail) = tail.split_at(len);
    *rest = tail;
    Ok(value)
}

/// Applies one command: a dispatcher only, one line per command to the module that owns it.
pub(crate) fn apply_command(txn: &mut Txn<'_>, command: &Command) -> Result<Outcome, StorageError> {
    match command {
        Command::CreateUser { user_id, namespace_id, name } => {
            accounts::create_user(txn, user_id, namespace_id, name, false)
        }
        Command::CreateToken { token_id, user_id, name, token_hash, expires_ms } => {
            accounts::create_token(txn, token_id, user_id, name, token_hash, *expires_ms)
        }
        Command::RevokeToken { user_id, token_id } => accounts::revoke_token(txn, user_id, token_id),
        Command::EnsureAdmin { user_id, namespace_id, token_id, token_hash } => {
            accounts::ensure_admin(txn, user_id, namespace_id, token_id, token_hash)
        }
        Command::Idempotent { scope, fingerprint, ttl_ms, on_success, command } => {
            guards::idempotent(txn, scope, fingerprint, *ttl_ms, on_success, command)
        }
        Command::IdempotencyBegin { scope, fingerprint, ttl_ms, lease_ms } => {
            guards::begin(txn, scope, fingerprint, *ttl_ms, *lease_ms)
        }
        Command::IdempotencyComplete { scope, response } => guards::complete(txn, scope, response),
        Command::IdempotencyRelease { scope } => guards::release(txn, scope),
        Command::Once { consumer, message_id, ttl_ms, command } => {
            guards::once(txn, consumer, message_id, *ttl_ms, command)
        }
        Command::RateCheck { checks } => guards::rate_check(txn, checks),
        Command::PurgeExpired { max_records } => guards::purge_expired(txn, *max_records as usize),
        Command::RegisterChunk { hash, size, uploader } => chunks::register(txn, hash, *size, uploader),
        Command::CollectOrphans { orphaned_before_ms, max_chunks } => {
            chunks::collect_orphans(txn, *orphaned_before_ms, *max_chunks as usize)
        }
        Command::CommitFile(commit) => files::commit(txn, commit),
        Command::MoveFile(request) => files::move_file(txn, request),
        Command::ExpireVersions { superseded_before_ms, max_versions } => {
            files::expire_versions(txn, *superseded_before_ms, *max_versions as usize)
        }
        Command::CreateJob(job) => jobs::create(txn, job),
        Command::PatchJob { job_id, patch } => jobs::patch(txn, job_id, patch),
        Command::CancelJob { job_id } => jobs::cancel(txn, job_id),
        Command::ClaimJobs { worker, lease_ms, max_jobs } => jobs::claim(txn, worker, *lease_ms, *max_jobs as usize),
        Command::StartRun { job_id, fence, run_id, worker, run_ttl_ms } => {
            jobs::start(txn, job_id, *fence, run_id, worker, *run_ttl_ms)
        }
        Command::RenewLease { job_id, fence, lease_ms } => jobs::renew(txn, job_id, *fence, *lease_ms),
        Command::FinishRun(report) => jobs::finish(txn, report),
        Command::ExpireRuns { before_ms, max_runs } => jobs::expire_runs(txn, *before_ms, *max_runs as usize),
        Command::CreateSharedFolder { namespace_id, name, owner_user_id } => {
            sharing::create_folder(txn, namespace_id, name, owner_user_id)
        }
        Command::SetAccess { actor_user_id, namespace_id, grantee, role } => {
            sharing::set_access(txn, actor_user_id, namespace_id, grantee, *role)
        }
        Command::DeleteSharedFolder { actor_user_id, namespace_id } => {
            sharing::delete_folder(txn, actor_user_id, namespace_id)
        }
        Command::CreateGroup { group_id, name } => sharing::create_group(txn, group_id, name),
        Command::SetGroupMember { group_id, user_id, member } => {
            sharing::set_group_member(txn, group_id, user_id, *member)
        }
        Command::Migrate { schema } => sharing::migrate(txn, *schema),
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
