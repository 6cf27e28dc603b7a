//! The replicated state machine: deterministic apply and read queries (snapshots: `snapshot.rs`).
//!
//! `apply` reads no clock, randomness, environment or node-local file: time (`Batch::now_ms`)
//! and ids travel inside the commands. Each applied log entry is one RocksDB write batch
//! holding its data changes together with the applied marker (the last applied log id and
//! membership, opaque bytes owned by the raft crate).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use rocksdb::{IteratorMode, ReadOptions, WriteBatch};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::command::{Batch, Command, ConfigId, Outcome};
use crate::db::write_options;
use crate::{accounts, chunks, files, guards, jobs, keys, sharing, Db, StorageError};

/// The state machine over the node's database.
#[derive(Debug, Clone)]
pub struct StateMachine {
    db: Db,
    /// The newest data format this node applies ([`crate::format::FORMAT`], lower only where
    /// a test stands in for an older release: [`StateMachine::reading_up_to`]).
    reads: u32,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data structs to JSON cannot fail.
    serde_json::to_vec(value).expect("records serialize")
}

pub(crate) fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StorageError> {
    serde_json::from_slice(bytes).map_err(StorageError::decode(what))
}

/// The pending writes of one applied entry: reads see earlier writes of the same entry.
/// Only each key's last write reaches RocksDB, in key order (see [`Txn::into_batch`]).
pub(crate) struct Txn<'a> {
    db: &'a Db,
    /// Each key written by this entry and its final value (`None`: deleted), in key order
    /// (a range of it is read without walking the rest).
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The lowest key written to each queue-like index (by its tag) in this entry
    /// (`floor::note_insert`).
    index_inserts: HashMap<u8, Vec<u8>>,
    pub(crate) now_ms: u64,
    /// The configuration in effect where the entry sits in the log (`None`: not known, as in
    /// tests of the storage alone).
    pub(crate) config: Option<ConfigId>,
}

impl Txn<'_> {
    pub(crate) fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(value) = self.overlay.get(key) {
            return Ok(value.clone());
        }
        Ok(self.db.rocks().get_cf(self.db.state(), key)?)
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, what: &'static str, key: &[u8]) -> Result<Option<T>, StorageError> {
        self.get_raw(key)?.map(|bytes| decode(what, &bytes)).transpose()
    }

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.overlay.insert(key, Some(value));
    }

    pub(crate) fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) {
        self.put_raw(key, encode(value));
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.overlay.insert(key, None);
    }

    /// The entry's writes as one RocksDB write batch: each key once, with its final value,
    /// in key order. The same state as every write in command order, with fewer memtable
    /// inserts (a key written by every command of an entry, such as a namespace's cursor,
    /// goes in once), and sorted keys let the memtable's skip list insert each next to the
    /// one before instead of searching from its top.
    fn into_batch(self) -> WriteBatch {
        let state = self.db.state();
        let mut batch = WriteBatch::default();
        for (key, value) in self.overlay {
            match value {
                Some(value) => batch.put_cf(state, key, value),
                None => batch.delete_cf(state, key),
            }
        }
        batch
    }

    /// Whether an earlier command of this entry deleted `key` (and none wrote it since).
    pub(crate) fn deleted(&self, key: &[u8]) -> bool {
        matches!(self.overlay.get(key), Some(None))
    }

    pub(crate) fn note_index_insert(&mut self, key: &[u8]) {
        let Some(&tag) = key.first() else { return };
        let lowest = self.index_inserts.entry(tag).or_insert_with(|| key.to_vec());
        if key < lowest.as_slice() {
            *lowest = key.to_vec();
        }
    }

    pub(crate) fn lowest_index_insert(&self, tag: u8) -> Option<&[u8]> {
        self.index_inserts.get(&tag).map(Vec::as_slice)
    }

    /// Keys of `[start, end)` as of the previous entry (this entry's writes not included),
    /// at most `max`.
    pub(crate) fn committed_keys(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        range(self.db, start, end, max, |key, _| Ok(key.into_vec()))
    }

    /// The first `max` keys of `[start, end)` including this entry's writes so far, in key
    /// order: reads at most `max` committed keys more than the entry deleted in the range.
    pub(crate) fn keys_in(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        let written = self.overlay.range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        let deleted = written.clone().filter(|(_, value)| value.is_none()).count();
        let mut keys: std::collections::BTreeSet<Vec<u8>> =
            range(self.db, start, end, max.saturating_add(deleted), |key, _| Ok(key.into_vec()))?.into_iter().collect();
        for (key, value) in written {
            match value {
                Some(_) => keys.insert(key.clone()),
                None => keys.remove(key),
            };
        }
        Ok(keys.into_iter().take(max).collect())
    }
}

/// Point reads of the state, as apply sees it (with the entry's own writes) or as a query
/// does: what the permission rule (`sharing::role`) needs, so one rule serves both.
pub trait Reads {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;

    /// The first `max` keys of `[start, end)`.
    fn keys_between(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError>;

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

    fn keys_between(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        self.keys_in(start, end, max)
    }
}

impl Reads for StateMachine {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.db.rocks().get_cf(self.db.state(), key)?)
    }

    fn keys_between(&self, start: &[u8], end: &[u8], max: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        self.scan_keys(start, end, max)
    }
}

/// Up to `max` entries of `[start, end)` of the state, in key order, each through `each`:
/// the one range scan of the crate (see [`range_dir`]).
fn range<T>(
    db: &Db,
    start: &[u8],
    end: &[u8],
    max: usize,
    each: impl FnMut(Box<[u8]>, Box<[u8]>) -> Result<T, StorageError>,
) -> Result<Vec<T>, StorageError> {
    range_dir(db, start, end, max, false, each)
}

/// Up to `max` entries of `[start, end)`, in key order or (`rev`) from the last down.
fn range_dir<T>(
    db: &Db,
    start: &[u8],
    end: &[u8],
    max: usize,
    rev: bool,
    mut each: impl FnMut(Box<[u8]>, Box<[u8]>) -> Result<T, StorageError>,
) -> Result<Vec<T>, StorageError> {
    let mut out = Vec::new();
    if max == 0 || start >= end {
        return Ok(out);
    }
    // The bounds stop RocksDB itself at the range's ends: without them, an iterator whose
    // range ends in deleted keys (a queue-like index: due jobs, leases) steps over every
    // tombstone past the end until it finds a live key.
    let mut options = ReadOptions::default();
    options.set_iterate_upper_bound(end.to_vec());
    options.set_iterate_lower_bound(start.to_vec());
    let mode = if rev { IteratorMode::End } else { IteratorMode::From(start, rocksdb::Direction::Forward) };
    for item in db.rocks().iterator_cf_opt(db.state(), options, mode) {
        let (key, value) = item?;
        if *key >= *end || *key < *start || out.len() >= max {
            break;
        }
        out.push(each(key, value)?);
    }
    Ok(out)
}

impl StateMachine {
    pub fn new(db: Db) -> StateMachine {
        StateMachine { db, reads: crate::format::FORMAT }
    }

    /// This state machine, applying entries of formats up to `format` only (at most this
    /// code's): a node standing in for an older release stops on a newer entry as that
    /// release would.
    pub fn reading_up_to(self, format: u32) -> StateMachine {
        StateMachine { reads: format.min(crate::format::FORMAT), ..self }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The applied marker of the last applied entry, if any entry was applied.
    pub fn applied_marker(&self) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.db.rocks().get_cf(self.db.state(), keys::applied_marker())?)
    }

    /// The state machine's clock: the largest leader time applied so far (0 before any).
    pub fn clock_ms(&self) -> Result<u64, StorageError> {
        let raw = self.db.rocks().get_cf(self.db.state(), keys::clock())?;
        raw.map(|bytes| decode("clock", &bytes)).transpose().map(|c| c.unwrap_or(0))
    }

    /// Applies one log entry: its batch (none for blank and membership entries) and the new
    /// applied marker, as one write batch. Returns one outcome per command, in order.
    pub fn apply(&self, marker: &[u8], batch: Option<&Batch>) -> Result<Vec<Outcome>, StorageError> {
        self.apply_in(marker, batch, None)
    }

    /// [`StateMachine::apply`] of an entry at a place in the log where `config` is the
    /// configuration in effect (what fences `RegisterChunk`).
    pub fn apply_in(
        &self,
        marker: &[u8],
        batch: Option<&Batch>,
        config: Option<ConfigId>,
    ) -> Result<Vec<Outcome>, StorageError> {
        let now_ms = match batch {
            Some(batch) => self.clock_ms()?.max(batch.now_ms),
            None => self.clock_ms()?,
        };
        let mut txn = Txn { db: &self.db, overlay: BTreeMap::new(), index_inserts: HashMap::new(), now_ms, config };
        let mut outcomes = Vec::new();
        if let Some(batch) = batch {
            // An entry this code cannot read stops the node before anything of it is applied:
            // applying what it understands of it would make its state differ from the others'.
            if batch.format > self.reads {
                return Err(StorageError::TooNew(crate::format::too_new("a log entry", batch.format)));
            }
            outcomes.reserve(batch.commands.len());
            for command in batch.commands.iter() {
                outcomes.push(apply_command(&mut txn, command)?);
            }
            debug_assert_eq!(outcomes.len(), batch.commands.len(), "one outcome per command");
            txn.put(keys::clock(), &now_ms);
        }
        txn.put_raw(keys::applied_marker(), marker.to_vec());
        // Not synced: the log entry being applied is already durable in the same WAL, and the
        // next synced write (or `build_snapshot`) makes this one durable too.
        self.db.rocks().write_opt(txn.into_batch(), &write_options(false))?;
        Ok(outcomes)
    }

    /// The record at `key` of the state, decoded (`what` names it in errors).
    pub(crate) fn read<T: DeserializeOwned>(&self, what: &'static str, key: &[u8]) -> Result<Option<T>, StorageError> {
        let raw = self.db.rocks().get_cf(self.db.state(), key)?;
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

    /// Entries of `[start, end)`, decoded, at most `limit`, from the last down.
    pub(crate) fn scan_rev<T: DeserializeOwned>(
        &self,
        what: &'static str,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, T)>, StorageError> {
        range_dir(&self.db, start, end, limit, true, |key, value| Ok((key.into_vec(), decode(what, &value)?)))
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
}

/// Applies one command: a dispatcher only, one line per command to the module that owns it.
pub(crate) fn apply_command(txn: &mut Txn<'_>, command: &Command) -> Result<Outcome, StorageError> {
    match command {
        Command::CreateUser { user_id, namespace_id, name } => {
            accounts::create_user(txn, user_id, namespace_id, name, false)
        }
        Command::CreateToken { token_id, user_id, name, token_hash, expires_ms, session_epoch } => {
            accounts::create_token(txn, token_id, user_id, name, token_hash, (*expires_ms, *session_epoch))
        }
        Command::RevokeToken { user_id, token_id } => accounts::revoke_token(txn, user_id, token_id),
        Command::SetPassword { user_id, password_hash, ends_sessions } => {
            accounts::set_password(txn, user_id, password_hash.as_deref(), *ends_sessions)
        }
        Command::CreateLink { link, links_max } => crate::links::create(txn, link, *links_max),
        Command::PatchProps(patch) => crate::props::patch(txn, patch),
        Command::RevokeLink { actor_user_id, link_id, namespace_id } => {
            crate::links::revoke(txn, actor_user_id, link_id, namespace_id.as_deref())
        }
        Command::CountLinkDownload { token_hash } => crate::links::count_download(txn, token_hash),
        Command::SetWebhookSecret { user_id, secret, keep_previous_ms } => {
            accounts::set_webhook_secret(txn, user_id, &secret.0, *keep_previous_ms)
        }
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
        Command::RateSet { entries } => guards::rate_set(txn, entries),
        Command::PurgeExpired { max_records } => guards::purge_expired(txn, *max_records as usize),
        Command::RegisterChunk { hash, size, uploader, quota_bytes, placed_in } => {
            chunks::register(txn, hash, *size, uploader, *quota_bytes, *placed_in)
        }
        Command::CollectOrphans { orphaned_before_ms, max_chunks } => {
            chunks::collect_orphans(txn, *orphaned_before_ms, *max_chunks as usize)
        }
        Command::CommitFile(commit) => files::commit(txn, commit),
        Command::MoveFile(request) => files::move_file(txn, request),
        Command::ExpireVersions { superseded_before_ms, max_versions } => {
            files::expire_versions(txn, *superseded_before_ms, *max_versions as usize)
        }
        Command::CreateJob(job) => jobs::create(txn, job, None),
        Command::CreateJobWithin { job, active_jobs_max } => jobs::create(txn, job, Some(*active_jobs_max)),
        Command::PatchJob { job_id, patch } => jobs::patch(txn, job_id, patch),
        Command::CancelJob { job_id } => jobs::cancel(txn, job_id),
        Command::PauseJob { job_id } => jobs::pause(txn, job_id),
        Command::ResumeJob { job_id } => jobs::resume(txn, job_id),
        Command::RunJobNow { job_id, min_interval_ms } => jobs::run_now(txn, job_id, *min_interval_ms),
        Command::ClaimJobs { worker, lease_ms, max_jobs } => {
            jobs::claim(txn, worker, *lease_ms, *max_jobs as usize, None)
        }
        Command::StartRun { job_id, fence, run_id, worker, run_ttl_ms } => {
            jobs::start(txn, job_id, *fence, run_id, worker, *run_ttl_ms)
        }
        Command::RenewLease { job_id, fence, lease_ms } => jobs::renew(txn, job_id, *fence, *lease_ms),
        Command::FinishRun(report) => jobs::finish(txn, report),
        Command::ExpireRuns { before_ms, max_runs } => jobs::expire_runs(txn, *before_ms, *max_runs as usize),
        Command::CreateSharedFolder { namespace_id, name, owner_user_id, folders_max } => {
            sharing::create_folder(txn, namespace_id, name, owner_user_id, *folders_max)
        }
        Command::SetAccess { actor_user_id, namespace_id, grantee, role, invite } => {
            sharing::set_access(txn, actor_user_id, namespace_id, grantee, *role, *invite)
        }
        Command::RespondInvitation { actor_user_id, namespace_id, grantee, accept } => {
            sharing::respond_invitation(txn, actor_user_id, namespace_id, grantee, *accept)
        }
        Command::DeleteSharedFolder { actor_user_id, namespace_id } => {
            sharing::delete_folder(txn, actor_user_id, namespace_id)
        }
        Command::CreateGroup { group_id, name } => sharing::create_group(txn, group_id, name),
        Command::SetGroupMember { group_id, user_id, member } => {
            sharing::set_group_member(txn, group_id, user_id, *member)
        }
        Command::Migrate { schema } => sharing::migrate(txn, *schema),
        Command::SetLimits { limits, seed } => crate::limits::set(txn, limits, *seed),
        Command::ClaimAndStartJobs { worker, lease_ms, run_ids, run_ttl_ms } => {
            let starts = jobs::RunStarts { run_ids, run_ttl_ms: *run_ttl_ms };
            jobs::claim(txn, worker, *lease_ms, run_ids.len(), Some(starts))
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
