//! The chunk index: registration of durable blocks, reference counts kept in step with the
//! versions that name them, the orphan index, and the collection of orphans.
//!
//! A chunk enters the orphan index when registered and whenever its refcount drops to 0,
//! and leaves it on first use; collection removes index entries of chunks still unreferenced
//! after a grace period (each node then reclaims the block files on its own).

use crate::blocks::BlockHash;
use crate::command::Outcome;
use crate::records::Chunk;
use crate::state::{StateMachine, Txn};
use crate::{keys, StorageError};

pub(crate) fn register(txn: &mut Txn<'_>, hash: &BlockHash, size: u64) -> Result<Outcome, StorageError> {
    let key = keys::chunk(&hash.0);
    if txn.get_raw(&key)?.is_none() {
        let now = txn.now_ms;
        txn.put(key, &Chunk { size, refcount: 0, created_ms: now, orphan_since_ms: now });
        txn.put_raw(keys::orphan(now, &hash.0), Vec::new());
    }
    Ok(Outcome::Done)
}

/// The first of `chunks` absent from the index, each once, in order.
pub(crate) fn missing(txn: &Txn<'_>, chunks: &[BlockHash]) -> Result<Vec<BlockHash>, StorageError> {
    let mut missing = Vec::new();
    for hash in chunks {
        if !missing.contains(hash) && txn.get_raw(&keys::chunk(&hash.0))?.is_none() {
            missing.push(*hash);
        }
    }
    Ok(missing)
}

/// Adds one reference (`Delta::Add`) or drops one (`Delta::Drop`) for each distinct chunk,
/// keeping the orphan index in step. The callers only name indexed chunks: a commit checks
/// them first, and an indexed chunk with references is never collected.
pub(crate) fn reference(txn: &mut Txn<'_>, chunks: &[BlockHash], delta: Delta) -> Result<(), StorageError> {
    let mut seen = Vec::new();
    for hash in chunks {
        if seen.contains(hash) {
            continue;
        }
        seen.push(*hash);
        let key = keys::chunk(&hash.0);
        let Some(mut chunk) = txn.get::<Chunk>("chunk", &key)? else {
            return Err(StorageError::Corrupt(format!("a version names chunk {hash}, which the index lacks")));
        };
        if chunk.refcount == 0 {
            txn.delete(keys::orphan(chunk.orphan_since_ms, &hash.0));
        }
        chunk.refcount = match delta {
            Delta::Add => chunk.refcount.saturating_add(1),
            Delta::Drop => {
                debug_assert!(chunk.refcount > 0, "refcount of {hash} would drop below zero");
                chunk.refcount.saturating_sub(1)
            }
        };
        if chunk.refcount == 0 {
            chunk.orphan_since_ms = txn.now_ms;
            txn.put_raw(keys::orphan(chunk.orphan_since_ms, &hash.0), Vec::new());
        }
        txn.put(key, &chunk);
    }
    Ok(())
}

/// A reference count change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delta {
    Add,
    Drop,
}

/// Removes up to `max` index entries of chunks unreferenced since `orphaned_before_ms`.
pub(crate) fn collect_orphans(txn: &mut Txn<'_>, orphaned_before_ms: u64, max: usize) -> Result<Outcome, StorageError> {
    let (start, end) = keys::orphans_until(orphaned_before_ms);
    let due = txn.committed_keys(&start, &end, max)?;
    let more = due.len() == max;
    let mut removed = 0;
    for index_key in due {
        txn.delete(index_key.clone());
        let Some((_, hash)) = keys::parse_timed(&index_key) else { continue };
        let Ok(hash) = <[u8; 32]>::try_from(hash) else { continue };
        let key = keys::chunk(&hash);
        if txn.get::<Chunk>("chunk", &key)?.is_some_and(|c| c.refcount == 0) {
            txn.delete(key);
            removed += 1;
        }
    }
    Ok(Outcome::Collected { removed, more })
}

impl StateMachine {
    /// The chunk index entry of a block, if the cluster holds it.
    pub fn chunk(&self, hash: &BlockHash) -> Result<Option<Chunk>, StorageError> {
        self.read("chunk", &keys::chunk(&hash.0))
    }

    /// Up to `limit` chunk hashes of the index after `after`, in hash order (the block
    /// replicator walks the whole index with this, a round at a time).
    pub fn chunk_hashes(&self, after: Option<&BlockHash>, limit: usize) -> Result<Vec<BlockHash>, StorageError> {
        let (mut start, end) = keys::chunk_range();
        if let Some(after) = after {
            start = keys::chunk(&after.0);
            start.push(0);
        }
        let keys = self.scan_keys(&start, &end, limit)?;
        Ok(keys.iter().filter_map(|key| key.get(1..).and_then(|h| h.try_into().ok()).map(BlockHash)).collect())
    }
}
