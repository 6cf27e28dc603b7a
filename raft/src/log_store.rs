//! The Raft log store: openraft's `RaftLogStorage` over the node's RocksDB.
//!
//! Appends are acknowledged to openraft only after the WAL is synced; votes are synced before
//! `save_vote` returns.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, StorageIOError};
use raftbox_storage::{keys, Db};

use bytes::Bytes;

use crate::disk::SyncTimer;
use crate::log_cache::LogCache;
use crate::metrics::NodeMetrics;

use crate::types::{Entry, LogId, RaftStorageError, TypeConfig, Vote};

/// The log store; cloning it yields a reader over the same database (and cache).
#[derive(Clone)]
pub struct LogStore {
    db: Db,
    metrics: NodeMetrics,
    /// The newest entries, decoded and encoded; every change to the log goes through it.
    cache: LogCache,
    /// The state machine's flag: set while a snapshot is received or installed.
    installing: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Times every append (one fsync) for the slow-disk check ([`crate::disk`]).
    syncs: std::sync::Arc<SyncTimer>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("db", &self.db).finish_non_exhaustive()
    }
}

impl LogStore {
    pub fn new(db: Db, metrics: NodeMetrics) -> LogStore {
        LogStore { db, metrics, cache: LogCache::default(), installing: None, syncs: Default::default() }
    }

    /// The timer of the log's writes, for the slow-disk check.
    pub(crate) fn syncs(&self) -> std::sync::Arc<SyncTimer> {
        self.syncs.clone()
    }

    /// Holds purges back to the durable snapshot while `installing` is set (see
    /// [`LogStore::purge`]).
    pub fn guarded_by(self, installing: std::sync::Arc<std::sync::atomic::AtomicBool>) -> LogStore {
        LogStore { installing: Some(installing), ..self }
    }

    /// The cache of the newest entries, for the network and the gRPC service.
    pub fn cache(&self) -> LogCache {
        self.cache.clone()
    }

    /// Runs blocking RocksDB work off the async workers.
    async fn blocking<T, F>(&self, work: F) -> Result<T, RaftStorageError>
    where
        T: Send + 'static,
        F: FnOnce(Db) -> Result<T, RaftStorageError> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || work(db))
            .await
            .map_err(|e| RaftStorageError::from(StorageIOError::write_logs(&e)))?
    }

    fn meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, RaftStorageError> {
        let raw = self.db.meta_get(key).map_err(|e| StorageIOError::read(&e))?;
        raw.map(|bytes| serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read(&e).into())).transpose()
    }
}

/// How far a purge asked up to `asked` may go: `asked` itself if the durable snapshot covers
/// it, else the durable snapshot's last entry if that is beyond what is purged already;
/// `None` when nothing may be purged.
pub(crate) fn purge_bound(db: &Db, asked: LogId) -> Result<Option<LogId>, raftbox_storage::StorageError> {
    let durable = match crate::snapshot::stored(db)? {
        Some(crate::snapshot::Stored::Record(record)) => record.meta.last_log_id,
        Some(crate::snapshot::Stored::Inline { meta, .. }) => meta.last_log_id,
        None => None,
    };
    let Some(durable) = durable else { return Ok(None) };
    if asked.index <= durable.index {
        return Ok(Some(asked));
    }
    let purged: Option<LogId> = db.meta_get(keys::meta::PURGED)?.and_then(|raw| serde_json::from_slice(&raw).ok());
    Ok(purged.is_none_or(|p| p.index < durable.index).then_some(durable))
}

/// Purges the log up to `upto` unless it is purged that far already: the purged mark only
/// rises. The log store's purge and an install's run on different tasks; one lock (per
/// process) orders them.
pub(crate) fn purge_upto(db: &Db, upto: LogId) -> Result<(), raftbox_storage::StorageError> {
    static PURGING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = PURGING.lock().unwrap_or_else(|e| e.into_inner());
    let purged: Option<LogId> = db.meta_get(keys::meta::PURGED)?.and_then(|raw| serde_json::from_slice(&raw).ok());
    if purged.is_some_and(|p| p.index >= upto.index) {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&upto).map_err(|e| raftbox_storage::StorageError::Corrupt(e.to_string()))?;
    db.log_purge(upto.index, bytes)
}

/// The vote this node last saved (openraft saves a vote before it acts on it or answers).
pub(crate) fn stored_vote(db: &Db) -> Option<Vote> {
    let raw = db.meta_get(keys::meta::VOTE).ok()??;
    serde_json::from_slice(&raw).ok()
}

fn range_to_indexes<RB: RangeBounds<u64>>(range: &RB) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i.saturating_add(1),
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

pub(crate) fn decode_entry(bytes: &[u8]) -> Result<Entry, RaftStorageError> {
    serde_json::from_slice(bytes).map_err(|e| {
        // An entry of a newer format (a node downgraded past what the cluster writes) says
        // so, instead of reading as damage.
        match raftbox_storage::format::declared_entry_format(bytes) {
            Some(format) if format > raftbox_storage::format::FORMAT => {
                let why = raftbox_storage::format::too_new("a log entry", format);
                tracing::error!("{why}");
                StorageIOError::read_logs(&std::io::Error::other(why)).into()
            }
            _ => StorageIOError::read_logs(&e).into(),
        }
    })
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        let (start, end) = range_to_indexes(&range);
        if let Some(entries) = self.cache.range(start, end) {
            return Ok(entries);
        }
        let raw = self.db.log_range(start, end).map_err(|e| StorageIOError::read_logs(&e))?;
        raw.iter().map(|(_, bytes)| decode_entry(bytes)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let last_purged_log_id: Option<LogId> = self.meta(keys::meta::PURGED)?;
        let last = self.db.log_last().map_err(|e| StorageIOError::read_logs(&e))?;
        let last_log_id = match last {
            Some((_, bytes)) => Some(decode_entry(&bytes)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        let bytes = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.blocking(move |db| {
            db.meta_put(keys::meta::VOTE, &bytes, true).map_err(|e| StorageIOError::write_vote(&e).into())
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        self.meta(keys::meta::VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        let bytes = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        if let Some(id) = committed {
            self.metrics.commit_index.set(i64::try_from(id.index).unwrap_or(i64::MAX));
        }
        // Not synced: a lost committed id only means re-applying less on restart.
        self.db.meta_put(keys::meta::COMMITTED, &bytes, false).map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        Ok(self.meta::<Option<LogId>>(keys::meta::COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded: Vec<(Entry, Bytes)> = Vec::new();
        for entry in entries {
            // A follower writes the bytes the leader sent (the same encoding).
            let bytes = match self.cache.encoded(&entry.log_id) {
                Some(bytes) => bytes,
                None => serde_json::to_vec(&entry).map_err(|e| StorageIOError::write_logs(&e))?.into(),
            };
            encoded.push((entry, bytes));
        }
        self.metrics.log_append_entries.observe(encoded.len() as f64);
        let fsync = self.metrics.log_fsync_seconds.clone();
        let in_flight = self.syncs.begin();
        let result = self
            .blocking(move |db| {
                let _timer = fsync.start_timer();
                let writes = encoded.iter().map(|(entry, bytes)| (entry.log_id.index, bytes.as_ref()));
                db.log_append(writes).map_err(|e| StorageIOError::write_logs(&e).into()).map(|()| encoded)
            })
            .await;
        drop(in_flight);
        match result {
            Ok(encoded) => {
                self.cache.appended(encoded);
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        // The cache first: while the two differ it lacks entries the log has, never the reverse.
        self.cache.truncated(log_id.index);
        self.blocking(move |db| db.log_truncate(log_id.index).map_err(|e| StorageIOError::write_logs(&e).into())).await
    }

    /// Purges the log up to `log_id` — while a snapshot is received or installed, never past
    /// the durable snapshot: openraft purges up to a snapshot it is installing before the
    /// install is durable, and a crash between the two would leave a state machine behind a
    /// log that no longer holds what it needs (a node that crash-loops once elections
    /// resume). What is held back is purged by the install once it is durable
    /// ([`crate::state_machine`]), or by the next purge.
    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        self.cache.purged(log_id.index);
        let installing = self.installing.as_ref().is_some_and(|flag| flag.load(std::sync::atomic::Ordering::SeqCst));
        self.blocking(move |db| {
            let bound = if installing { purge_bound(&db, log_id) } else { Ok(Some(log_id)) };
            let Some(upto) = bound.map_err(|e| StorageIOError::write_logs(&e))? else {
                return Ok(());
            };
            if upto != log_id {
                tracing::info!(asked = %log_id, purged = %upto, "log purge held back to the durable snapshot");
            }
            purge_upto(&db, upto).map_err(|e| StorageIOError::write_logs(&e).into())
        })
        .await
    }
}
