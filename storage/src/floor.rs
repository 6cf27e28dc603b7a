//! Where the live keys of a queue-like index begin.
//!
//! A queue-like index (due jobs, leases: keys in time order, consumed from the front) leaves a
//! deleted key for every entry it consumed, and RocksDB keeps those until a compaction reaches
//! them. A scan from the front of the index steps over all of them: with thousands of jobs
//! due in the same second, every claim walked the deleted keys of every job claimed before it.
//! The index's *floor* is a stored key (replicated like any state, so every node scans the same
//! keys) with one invariant: **no live key of the index is below it**. An insert lowers it
//! ([`note_insert`]); a scan that consumed everything up to a point raises it ([`raise`]);
//! scans start at it ([`start`]). A state without a floor starts at the front.

use crate::state::{Reads, Txn};
use crate::{keys, StorageError};

/// Where a scan of the index whose range starts at `range_start` begins: the stored floor,
/// or the start of the range if that is later (or no floor is stored).
pub(crate) fn start(reads: &impl Reads, range_start: &[u8]) -> Result<Vec<u8>, StorageError> {
    let floor = reads.get_bytes(&keys::queue_floor(range_start))?;
    Ok(match floor {
        Some(floor) if floor.as_slice() > range_start => floor,
        _ => range_start.to_vec(),
    })
}

/// Records that `key` of a queue-like index was written: the floor comes down to it if it
/// was above, and no [`raise`] later in this entry passes it (the entry's own writes are not
/// in the scans that decide a raise).
pub(crate) fn note_insert(txn: &mut Txn<'_>, key: &[u8]) -> Result<(), StorageError> {
    let floor_key = keys::queue_floor(key);
    if let Some(floor) = txn.get_raw(&floor_key)? {
        if key < floor.as_slice() {
            txn.put_raw(floor_key, key.to_vec());
        }
    }
    txn.note_index_insert(key);
    Ok(())
}

/// Raises the floor of the index whose range starts at `range_start` to `to`: the caller
/// consumed (or found dead) every key it scanned below `to`. Never lowers it, and never
/// passes a key written earlier in this entry.
pub(crate) fn raise(txn: &mut Txn<'_>, range_start: &[u8], to: Vec<u8>) -> Result<(), StorageError> {
    let floor_key = keys::queue_floor(range_start);
    let current = txn.get_raw(&floor_key)?;
    let mut next = match current.as_deref() {
        Some(current) if current >= to.as_slice() => return Ok(()),
        _ => to,
    };
    if let Some(inserted) = txn.lowest_index_insert(range_start[0]) {
        if inserted < next.as_slice() {
            next = inserted.to_vec();
        }
    }
    if current.as_deref() != Some(next.as_slice()) {
        txn.put_raw(floor_key, next);
    }
    Ok(())
}
