//! openraft's `RaftStateMachine` over `raftbox_storage::StateMachine`.
//!
//! The applied marker (last applied log id and membership) is written by the storage crate in
//! the same write batch as each entry's data; this adapter only encodes it.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use raftbox_storage::{keys, Outcome, StateMachine};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::types::{Entry, LogId, RaftStorageError, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// What the storage crate keeps, opaquely, as the applied marker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AppliedMarker {
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

/// The current snapshot as kept in Raft metadata: `[u32 meta length][meta JSON][image]`.
fn encode_snapshot(meta: &SnapshotMeta, image: &[u8]) -> Result<Vec<u8>, RaftStorageError> {
    let meta = serde_json::to_vec(meta).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
    let len = u32::try_from(meta.len()).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
    let mut out = Vec::with_capacity(4 + meta.len() + image.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(image);
    Ok(out)
}

fn decode_snapshot(bytes: &[u8]) -> Result<(SnapshotMeta, Vec<u8>), RaftStorageError> {
    let bad = || StorageIOError::read_snapshot(None, &std::io::Error::other("truncated stored snapshot"));
    let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(bad)?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err(bad().into());
    }
    let (meta, image) = rest.split_at(len);
    let meta = serde_json::from_slice(meta).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
    Ok((meta, image.to_vec()))
}

/// The state-machine store handed to openraft; clones share the cached marker.
#[derive(Debug, Clone)]
pub struct StateMachineStore {
    sm: StateMachine,
    marker: Arc<Mutex<AppliedMarker>>,
}

impl StateMachineStore {
    pub fn new(sm: StateMachine) -> Result<StateMachineStore, RaftStorageError> {
        let marker = load_marker(&sm)?;
        Ok(StateMachineStore { sm, marker: Arc::new(Mutex::new(marker)) })
    }

    /// The storage-level state machine, for reads.
    pub fn state(&self) -> &StateMachine {
        &self.sm
    }
}

fn load_marker(sm: &StateMachine) -> Result<AppliedMarker, RaftStorageError> {
    let raw = sm.applied_marker().map_err(|e| StorageIOError::read_state_machine(&e))?;
    match raw {
        None => Ok(AppliedMarker::default()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_state_machine(&e).into()),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let sm = self.sm.clone();
        let built = tokio::task::spawn_blocking(move || -> Result<_, RaftStorageError> {
            let image = sm.build_snapshot().map_err(|e| StorageIOError::read_state_machine(&e))?;
            let marker: AppliedMarker = match &image.marker {
                Some(bytes) => serde_json::from_slice(bytes).map_err(|e| StorageIOError::read_state_machine(&e))?,
                None => AppliedMarker::default(),
            };
            let snapshot_id = match marker.last_applied {
                Some(id) => format!("{}-{}-{}", id.leader_id.term, id.leader_id.node_id, id.index),
                None => "empty".to_string(),
            };
            let meta =
                SnapshotMeta { last_log_id: marker.last_applied, last_membership: marker.membership, snapshot_id };
            let stored = encode_snapshot(&meta, &image.bytes)?;
            sm.db()
                .meta_put(keys::meta::SNAPSHOT, &stored, true)
                .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
            Ok((meta, image.bytes))
        })
        .await
        .map_err(|e| StorageIOError::read_state_machine(&e))??;
        tracing::info!(snapshot_id = %built.0.snapshot_id, bytes = built.1.len(), "built snapshot");
        Ok(Snapshot { meta: built.0, snapshot: Box::new(Cursor::new(built.1)) })
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
            let outcomes = self.sm.apply(&encoded, batch).map_err(|e| StorageIOError::apply(entry.log_id, &e))?;
            *marker = next;
            replies.push(outcomes);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftStorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftStorageError> {
        let mut marker = self.marker.lock().await;
        let image = snapshot.into_inner();
        let sm = self.sm.clone();
        let stored = encode_snapshot(meta, &image)?;
        let signature = meta.signature();
        tokio::task::spawn_blocking(move || -> Result<(), RaftStorageError> {
            sm.restore_snapshot(&image).map_err(|e| StorageIOError::write_snapshot(Some(signature.clone()), &e))?;
            sm.db()
                .meta_put(keys::meta::SNAPSHOT, &stored, true)
                .map_err(|e| StorageIOError::write_snapshot(Some(signature), &e))?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))??;
        *marker = AppliedMarker { last_applied: meta.last_log_id, membership: meta.last_membership.clone() };
        tracing::info!(snapshot_id = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let raw = self.sm.db().meta_get(keys::meta::SNAPSHOT).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let Some(raw) = raw else { return Ok(None) };
        let (meta, image) = decode_snapshot(&raw)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(Cursor::new(image)) }))
    }
}
