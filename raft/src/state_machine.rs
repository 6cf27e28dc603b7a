//! openraft's `RaftStateMachine` over `raftbox_storage::StateMachine`.
//!
//! The applied marker (last applied log id and membership) is written by the storage crate in
//! the same write batch as each entry's data; this adapter only encodes it.
//!
//! Snapshots are files (`crate::snapshot`), streamed both ways: a build writes the image to a
//! file while iterating a RocksDB snapshot view; an install restores from the received file
//! in bounded write batches (`raftbox_storage::snapshot`), the state and the snapshot's record
//! switching in one synced write. Neither holds the state in memory.

use std::io::{Seek, SeekFrom};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use raftbox_storage::{keys, ConfigId, Outcome, StateMachine, StorageError};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::snapshot::{self, SnapshotDir, SnapshotFile, SnapshotRecord, Stored};
use crate::types::{Entry, LogId, NodeId, RaftStorageError, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// Name of the snapshot directory inside the database's directory.
pub const SNAPSHOT_DIR: &str = "snapshots";

/// What the storage crate keeps, opaquely, as the applied marker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct AppliedMarker {
    pub(crate) last_applied: Option<LogId>,
    pub(crate) membership: StoredMembership,
}

/// The state-machine store handed to openraft; clones share the cached marker.
#[derive(Debug, Clone)]
pub struct StateMachineStore {
    sm: StateMachine,
    marker: Arc<Mutex<AppliedMarker>>,
    snapshots: SnapshotDir,
    /// Held while the current snapshot's record changes and old files are removed, so a
    /// build finishing during an install cannot replace a newer snapshot.
    record: Arc<std::sync::Mutex<()>>,
    /// What each applied entry did, for the node's listeners (the API's notifications).
    events: tokio::sync::broadcast::Sender<Applied>,
    /// Set from the first chunk of a received snapshot until its install ends: the log store
    /// then purges no further than the durable snapshot ([`crate::log_store::purge_bound`]).
    installing: Arc<std::sync::atomic::AtomicBool>,
    /// The free space a build must leave (the disk alarm's minimum; 0: never skip a build).
    min_free_bytes: u64,
    /// The last build was skipped for want of space (so the warning is logged once).
    skipping: Arc<std::sync::atomic::AtomicBool>,
}

/// The image size a snapshot id carries (`…-b<bytes>`, as [`StateMachineStore`] builds them),
/// so a receiver can refuse an install it has no room for; `None` for ids without it.
pub(crate) fn image_bytes(snapshot_id: &str) -> Option<u64> {
    snapshot_id.rsplit('-').next()?.strip_prefix('b')?.parse().ok()
}

/// Applied entries waiting for a slow listener, at most (it then hears [`Applied::Reset`]).
const APPLIED_EVENTS_QUEUED_MAX: usize = 1_024;

/// What one applied entry did, as the node's listeners hear it.
#[derive(Debug, Clone)]
pub enum Applied {
    /// A batch of commands (applied; some may have been rejected, and changed nothing).
    Commands(Arc<[raftbox_storage::Command]>),
    /// A snapshot replaced the state: anything may have changed.
    Reset,
}

impl StateMachineStore {
    /// Opens the store; snapshot files live in `<database dir>/snapshots`. Removes snapshot
    /// files no record names (left by a crash) and moves a snapshot stored inline by an older
    /// version into a file.
    pub fn new(sm: StateMachine) -> Result<StateMachineStore, RaftStorageError> {
        let marker = load_marker(&sm)?;
        let snapshots = SnapshotDir::open(sm.db().path().join(SNAPSHOT_DIR))
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let current = match snapshot::stored(sm.db()).map_err(|e| StorageIOError::read_snapshot(None, &e))? {
            None => None,
            Some(Stored::Record(record)) => Some(record.file),
            Some(Stored::Inline { meta, image }) => {
                let file = snapshots.write(&meta, &image).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
                let record = SnapshotRecord { meta, file: file.clone() };
                sm.db()
                    .meta_put(keys::meta::SNAPSHOT, &record.encode(), true)
                    .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
                Some(file)
            }
        };
        snapshots.remove_all_but(current.as_deref());
        Ok(StateMachineStore {
            sm,
            marker: Arc::new(Mutex::new(marker)),
            snapshots,
            record: Arc::new(std::sync::Mutex::new(())),
            events: tokio::sync::broadcast::channel(APPLIED_EVENTS_QUEUED_MAX).0,
            installing: Arc::default(),
            min_free_bytes: 0,
            skipping: Arc::default(),
        })
    }

    /// Skips a build that could leave less than `bytes` free (see [`Self::build_blocking`]).
    pub fn with_min_free_bytes(self, bytes: u64) -> StateMachineStore {
        StateMachineStore { min_free_bytes: bytes, ..self }
    }

    /// The current snapshot instead of a new one when a new image, estimated as the larger
    /// of the current one and the live state's size, would not fit above the minimum free
    /// space: the build is skipped, openraft keeps the snapshot it has (it ignores one that is
    /// not newer) and asks again at a later entry. With no current snapshot, `None`: build.
    fn skipped_build(&self) -> Option<(SnapshotMeta, SnapshotFile)> {
        use std::sync::atomic::Ordering;
        if self.min_free_bytes == 0 {
            return None;
        }
        let _record = self.record.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let record = self.current_record().ok()??;
        let path = self.snapshots.file(&record.file);
        let current = std::fs::metadata(&path).map_or(0, |m| m.len());
        let estimate = current.max(self.sm.db().state_size_estimate());
        let free = crate::disk::free_bytes(self.sm.db().path()).ok()?;
        let fits = free >= estimate.saturating_add(self.min_free_bytes);
        let was_skipping = self.skipping.swap(!fits, Ordering::SeqCst);
        if fits {
            if was_skipping {
                tracing::info!(free_mib = free >> 20, "room for a snapshot again; building");
            }
            return None;
        }
        if !was_skipping {
            tracing::warn!(
                free_mib = free >> 20,
                estimate_mib = estimate >> 20,
                min_free_mib = self.min_free_bytes >> 20,
                "no room for a snapshot above the minimum free space; keeping the current one"
            );
        }
        let file = SnapshotFile::open(path).ok()?;
        Some((record.meta, file))
    }

    /// The storage-level state machine, for the tests' reads.
    #[cfg(test)]
    pub fn state(&self) -> &StateMachine {
        &self.sm
    }

    /// The flag a log store reads to hold purges back while a snapshot is being installed.
    pub fn installing(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.installing.clone()
    }

    /// Hears what every entry applied from now on did.
    pub fn applied_events(&self) -> tokio::sync::broadcast::Receiver<Applied> {
        self.events.subscribe()
    }

    fn current_record(&self) -> Result<Option<SnapshotRecord>, StorageError> {
        match snapshot::stored(self.sm.db())? {
            Some(Stored::Record(record)) => Ok(Some(record)),
            // `new` moved any inline snapshot into a file.
            Some(Stored::Inline { .. }) => Err(StorageError::Corrupt("inline snapshot record after start".into())),
            None => Ok(None),
        }
    }

    /// Writes a snapshot file from the current state and makes it current (unless a newer
    /// one became current meanwhile). Blocking.
    fn build_blocking(&self) -> Result<(SnapshotMeta, SnapshotFile), RaftStorageError> {
        if let Some(current) = self.skipped_build() {
            return Ok(current);
        }
        let write_error =
            |e: &dyn std::error::Error| StorageIOError::<NodeId>::write_snapshot(None, &Message(e.to_string()));
        let path = self.snapshots.building();
        let built = (|| {
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
            let written = self.sm.write_snapshot(&file)?;
            Ok::<_, StorageError>((file, written))
        })();
        let (file, written) = match built {
            Ok(built) => built,
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                return Err(write_error(&error).into());
            }
        };
        let marker: AppliedMarker = match &written.marker {
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| StorageIOError::read_state_machine(&e))?,
            None => AppliedMarker::default(),
        };
        let snapshot_id = match marker.last_applied {
            Some(id) => format!("{}-{}-{}-b{}", id.leader_id.term, id.leader_id.node_id, id.index, written.bytes),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta { last_log_id: marker.last_applied, last_membership: marker.membership, snapshot_id };
        // Under the record lock from the file's completion on: an install removing the
        // complete files it does not keep cannot remove this one before it is open (nor
        // this build the file an install has just completed).
        let _record = self.record.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let name = self.snapshots.complete(&path, &file, &meta).map_err(|e| write_error(&e))?;
        drop(file);
        let opened = SnapshotFile::open(self.snapshots.file(&name)).map_err(|e| write_error(&e))?;
        let current = self.current_record().map_err(|e| write_error(&e))?;
        if current.as_ref().is_some_and(|c| c.meta.last_log_id > meta.last_log_id) {
            // An install made a newer snapshot current while this one was built: keep that one
            // (this file stays readable through `opened` until it is dropped).
            self.snapshots.remove_old(current.as_ref().map(|c| c.file.as_str()));
        } else {
            let record = SnapshotRecord { meta: meta.clone(), file: name.clone() };
            self.sm.db().meta_put(keys::meta::SNAPSHOT, &record.encode(), true).map_err(|e| write_error(&e))?;
            self.snapshots.remove_old(Some(&name));
        }
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes = written.bytes, "built snapshot");
        Ok((meta, opened))
    }

    /// Installs a received snapshot file: moves it into place (or copies it, when it is not a
    /// reception of this store), restores the state from it and makes it current, in one
    /// synced switch. Blocking.
    pub(crate) fn install_blocking(
        &self,
        meta: &SnapshotMeta,
        mut file: std::fs::File,
        path: std::path::PathBuf,
    ) -> Result<(), RaftStorageError> {
        let signature = meta.signature();
        let write_error = |e: &dyn std::error::Error| {
            StorageIOError::<NodeId>::write_snapshot(Some(signature.clone()), &Message(e.to_string()))
        };
        let (file, path) = if self.snapshots.is_receiving(&path) {
            (file, path)
        } else {
            let copy_path = self.snapshots.receiving();
            let mut copy = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&copy_path)
                .map_err(|e| write_error(&e))?;
            file.seek(SeekFrom::Start(0)).map_err(|e| write_error(&e))?;
            std::io::copy(&mut file, &mut copy).map_err(|e| write_error(&e))?;
            (copy, copy_path)
        };
        // Under the record lock from the file's completion on (see `build_blocking`).
        let _record = self.record.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let name = self.snapshots.complete(&path, &file, meta).map_err(|e| write_error(&e))?;
        drop(file);
        let record = SnapshotRecord { meta: meta.clone(), file: name.clone() }.encode();
        let restored = std::fs::File::open(self.snapshots.file(&name))
            .map_err(StorageError::from)
            .and_then(|image| self.sm.restore_snapshot(image, &[(keys::meta::SNAPSHOT, record.as_slice())]));
        match restored {
            Ok(_) => {
                self.snapshots.remove_old(Some(&name));
                // The state is durable at the snapshot now: purge what the log store held
                // back while it was not (openraft purged up to it before installing).
                if let Some(last) = meta.last_log_id {
                    let bound = crate::log_store::purge_bound(self.sm.db(), last).map_err(|e| write_error(&e))?;
                    if let Some(upto) = bound {
                        crate::log_store::purge_upto(self.sm.db(), upto).map_err(|e| write_error(&e))?;
                    }
                }
                Ok(())
            }
            Err(error) => {
                // Nothing changed: the old state and snapshot are still current.
                let _ = std::fs::remove_file(self.snapshots.file(&name));
                Err(write_error(&error).into())
            }
        }
    }
}

/// An error message as an error (openraft's storage errors take `&dyn Error`).
#[derive(Debug)]
struct Message(String);

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

pub(crate) fn load_marker(sm: &StateMachine) -> Result<AppliedMarker, RaftStorageError> {
    let raw = sm.applied_marker().map_err(|e| StorageIOError::read_state_machine(&e))?;
    match raw {
        None => Ok(AppliedMarker::default()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_state_machine(&e).into()),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let store = self.clone();
        let (meta, file) = tokio::task::spawn_blocking(move || store.build_blocking())
            .await
            .map_err(|e| StorageIOError::read_state_machine(&e))??;
        Ok(Snapshot { meta, snapshot: Box::new(file) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        let marker = self.marker.lock().await;
        Ok((marker.last_applied, marker.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut marker = self.marker.lock().await;
        let mut replies = Vec::new();
        for entry in entries {
            let mut next = marker.clone();
            next.last_applied = Some(entry.log_id);
            let batch = match &entry.payload {
                EntryPayload::Blank => None,
                EntryPayload::Normal(batch) => Some(batch),
                EntryPayload::Membership(membership) => {
                    next.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                    None
                }
            };
            let encoded = serde_json::to_vec(&next).map_err(|e| StorageIOError::apply(entry.log_id, &e))?;
            let config = next.membership.log_id().map(|l| ConfigId { term: l.leader_id.term, index: l.index });
            let outcomes =
                self.sm.apply_in(&encoded, batch, config).map_err(|e| StorageIOError::apply(entry.log_id, &e))?;
            *marker = next;
            replies.push(outcomes);
            if let (Some(batch), true) = (batch, self.events.receiver_count() > 0) {
                let _ = self.events.send(Applied::Commands(batch.commands.clone()));
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, RaftStorageError> {
        self.installing.store(true, std::sync::atomic::Ordering::SeqCst);
        let snapshots = self.snapshots.clone();
        let file = tokio::task::spawn_blocking(move || {
            // openraft receives one snapshot at a time: an earlier reception was abandoned.
            snapshots.remove_receptions();
            SnapshotFile::create(snapshots.receiving())
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), RaftStorageError> {
        self.installing.store(true, std::sync::atomic::Ordering::SeqCst);
        let installed = self.install(meta, snapshot).await;
        self.installing.store(false, std::sync::atomic::Ordering::SeqCst);
        installed
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        self.current_snapshot().await
    }
}

impl StateMachineStore {
    async fn install(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), RaftStorageError> {
        let mut marker = self.marker.lock().await;
        let mut snapshot = *snapshot;
        snapshot.flush().await.map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let (file, path) = snapshot.into_std().await;
        let store = self.clone();
        let owned_meta = meta.clone();
        tokio::task::spawn_blocking(move || store.install_blocking(&owned_meta, file, path))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))??;
        *marker = AppliedMarker { last_applied: meta.last_log_id, membership: meta.last_membership.clone() };
        let _ = self.events.send(Applied::Reset);
        tracing::info!(snapshot_id = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    async fn current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let store = self.clone();
        let current = tokio::task::spawn_blocking(move || -> Result<Option<Snapshot>, RaftStorageError> {
            // Under the lock, so the recorded file is not removed before it is open.
            let _record = store.record.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let Some(record) = store.current_record().map_err(|e| StorageIOError::read_snapshot(None, &e))? else {
                return Ok(None);
            };
            let file = SnapshotFile::open(store.snapshots.file(&record.file))
                .map_err(|e| StorageIOError::read_snapshot(Some(record.meta.signature()), &e))?;
            Ok(Some(Snapshot { meta: record.meta, snapshot: Box::new(file) }))
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, &e))??;
        Ok(current)
    }
}
