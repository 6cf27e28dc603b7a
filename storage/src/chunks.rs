//! The chunk index: registration of durable blocks, reference counts kept in step with the
//! versions that name them, the orphan index, and the collection of orphans.
//!
//! A chunk enters the orphan index when registered and whenever its refcount drops to 0,
//! and leaves it on first use; collection removes index entries of chunks still unreferenced
//! after a grace period (each node then reclaims the block files on its own).

use std::collections::HashSet;

use crate::blocks::BlockHash;
use crate::command::{ConfigId, Outcome, Rejection};
use crate::records::Chunk;
use crate::state::{Reads, StateMachine, Txn};
use crate::{keys, sharing, StorageError};

pub(crate) fn register(
    txn: &mut Txn<'_>,
    hash: &BlockHash,
    size: u64,
    uploader: &str,
    quota_bytes: Option<u64>,
    placed_in: Option<ConfigId>,
) -> Result<Outcome, StorageError> {
    if placed_in.is_some() && placed_in != txn.config {
        return Ok(Outcome::Rejected(Rejection::MembersChanged));
    }
    let key = keys::chunk(&hash.0);
    let known = txn.get::<Chunk>("chunk", &key)?;
    // A known block keeps the size it was indexed with.
    let size = known.as_ref().map_or(size, |c| c.size);
    let mark = keys::chunk_uploader(&hash.0, uploader);
    let newly_theirs = !uploader.is_empty() && txn.get_raw(&mark)?.is_none();
    if newly_theirs {
        match quota_bytes {
            // Counted: the mark holds the size it added to the uploader's stored bytes, which
            // its collection gives back. Only a command with a quota counts, so entries from
            // before the count (and an admin's uploads) neither raise nor lower it.
            Some(quota_bytes) => {
                let stored_bytes = stored_bytes(txn, uploader)?;
                if stored_bytes.saturating_add(size) > quota_bytes {
                    return Ok(Outcome::Rejected(Rejection::QuotaExceeded { stored_bytes, quota_bytes, size }));
                }
                txn.put(keys::stored_bytes(uploader), &stored_bytes.saturating_add(size));
                txn.put_raw(mark, size.to_be_bytes().to_vec());
            }
            None => txn.put_raw(mark, Vec::new()),
        }
    }
    if known.is_none() {
        let now = txn.now_ms;
        txn.put(key, &Chunk { size, refcount: 0, created_ms: now, orphan_since_ms: now });
        txn.put_raw(keys::orphan(now, &hash.0), Vec::new());
    }
    Ok(Outcome::Done)
}

/// Charges `user_id` for each of `chunks` not charged to them yet (a commit naming blocks
/// another user uploaded: the referrer pays as the uploader did, with the same mark, given back
/// when the block is collected), each once; refused whole, charging nothing, if that would take
/// them past `quota_bytes`. Bounded by the commit's chunks (`FILE_CHUNKS_MAX`), judged with a set.
pub(crate) fn charge(
    txn: &mut Txn<'_>,
    user_id: &str,
    chunks: &[BlockHash],
    quota_bytes: u64,
) -> Result<Option<Outcome>, StorageError> {
    let mut seen = HashSet::with_capacity(chunks.len());
    let mut marks = Vec::new();
    let mut size = 0u64;
    for hash in chunks {
        if !seen.insert(*hash) || txn.get_raw(&keys::chunk_uploader(&hash.0, user_id))?.is_some() {
            continue;
        }
        let Some(chunk) = txn.get::<Chunk>("chunk", &keys::chunk(&hash.0))? else { continue };
        size = size.saturating_add(chunk.size);
        marks.push((*hash, chunk.size));
    }
    if marks.is_empty() {
        return Ok(None);
    }
    let stored_bytes = stored_bytes(txn, user_id)?;
    if stored_bytes.saturating_add(size) > quota_bytes {
        return Ok(Some(Outcome::Rejected(Rejection::QuotaExceeded { stored_bytes, quota_bytes, size })));
    }
    txn.put(keys::stored_bytes(user_id), &stored_bytes.saturating_add(size));
    for (hash, size) in marks {
        txn.put_raw(keys::chunk_uploader(&hash.0, user_id), size.to_be_bytes().to_vec());
    }
    Ok(None)
}

/// The bytes `user_id` stores: every block they uploaded or a commit of theirs named (their
/// mark on it), once each, until the block is collected. Marks from before the count existed
/// are not in it.
pub fn stored_bytes<R: Reads>(state: &R, user_id: &str) -> Result<u64, StorageError> {
    Ok(state.get_record::<u64>("stored bytes", &keys::stored_bytes(user_id))?.unwrap_or(0))
}

/// Namespaces referencing a block examined for one the reader can read, at most, before
/// the reader's own namespaces are asked instead (point reads): a block referenced by many
/// namespaces costs a check no more than a bounded scan either way.
const REFERENCING_NAMESPACES_SCANNED_MAX: usize = 64;
/// Namespaces of a reader examined by that fallback, at most (their personal one and the
/// folders shared with them, and with their groups).
pub const READER_NAMESPACES_SCANNED_MAX: usize = 1_000;

/// Whether `user_id` may read the block: they uploaded it, or a namespace they can read
/// references it. The rule behind block reads, `status` and the commit check.
pub fn readable<R: Reads>(state: &R, user_id: &str, hash: &BlockHash) -> Result<bool, StorageError> {
    if state.get_bytes(&keys::chunk_uploader(&hash.0, user_id))?.is_some() {
        return Ok(true);
    }
    let (start, end) = keys::chunk_namespace_range(&hash.0);
    let referencing = state.keys_between(&start, &end, REFERENCING_NAMESPACES_SCANNED_MAX + 1)?;
    for key in referencing.iter().take(REFERENCING_NAMESPACES_SCANNED_MAX) {
        let namespace_id = String::from_utf8_lossy(&key[start.len()..]);
        if sharing::role(state, user_id, &namespace_id)?.is_some() {
            return Ok(true);
        }
    }
    if referencing.len() <= REFERENCING_NAMESPACES_SCANNED_MAX {
        return Ok(false);
    }
    // Many namespaces reference it: ask the reader's own instead.
    for namespace_id in sharing::reader_namespaces(state, user_id, READER_NAMESPACES_SCANNED_MAX)? {
        if state.get_bytes(&keys::chunk_namespace(&hash.0, &namespace_id))?.is_some()
            && sharing::role(state, user_id, &namespace_id)?.is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first of `chunks` absent from the index or that `user_id` may not read, each once.
pub(crate) fn unusable(txn: &Txn<'_>, user_id: &str, chunks: &[BlockHash]) -> Result<Vec<BlockHash>, StorageError> {
    let mut out = missing(txn, chunks)?;
    let mut judged: HashSet<BlockHash> = out.iter().copied().collect();
    for hash in chunks {
        if judged.insert(*hash) && !readable(txn, user_id, hash)? {
            out.push(*hash);
        }
    }
    Ok(out)
}

/// The first of `chunks` absent from the index, each once, in order (a set, not a list
/// search: a commit names up to 100,000 chunks).
pub(crate) fn missing(txn: &Txn<'_>, chunks: &[BlockHash]) -> Result<Vec<BlockHash>, StorageError> {
    let mut missing = Vec::new();
    let mut seen = HashSet::with_capacity(chunks.len());
    for hash in chunks {
        if seen.insert(*hash) && txn.get_raw(&keys::chunk(&hash.0))?.is_none() {
            missing.push(*hash);
        }
    }
    Ok(missing)
}

/// Adds one reference (`Delta::Add`) or drops one (`Delta::Drop`) for each distinct chunk,
/// keeping the orphan index and the namespace's own count in step. The callers only name
/// indexed chunks: a commit checks them first, and an indexed chunk with references is
/// never collected.
pub(crate) fn reference(
    txn: &mut Txn<'_>,
    namespace_id: &str,
    chunks: &[BlockHash],
    delta: Delta,
) -> Result<(), StorageError> {
    let mut seen = HashSet::with_capacity(chunks.len());
    for hash in chunks {
        if !seen.insert(*hash) {
            continue;
        }
        count_in_namespace(txn, namespace_id, hash, delta)?;
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

/// Changes the count of a namespace's versions that name `hash` (the key goes at 0).
pub(crate) fn count_in_namespace(
    txn: &mut Txn<'_>,
    namespace_id: &str,
    hash: &BlockHash,
    delta: Delta,
) -> Result<(), StorageError> {
    let key = keys::chunk_namespace(&hash.0, namespace_id);
    let count = txn.get::<u64>("chunk namespace count", &key)?.unwrap_or(0);
    let count = match delta {
        Delta::Add => count.saturating_add(1),
        Delta::Drop => count.saturating_sub(1),
    };
    if count == 0 {
        txn.delete(key);
    } else {
        txn.put(key, &count);
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
    let mut more = due.len() == max;
    let (mut removed, mut budget) = (0, max);
    for index_key in due {
        let Some((_, hash)) = keys::parse_timed(&index_key) else {
            txn.delete(index_key);
            continue;
        };
        let Ok(hash) = <[u8; 32]>::try_from(hash) else {
            txn.delete(index_key);
            continue;
        };
        let key = keys::chunk(&hash);
        if txn.get::<Chunk>("chunk", &key)?.is_some_and(|c| c.refcount == 0) {
            // Its uploaders' marks go first, within the step's budget (each gives the block's
            // size back to its uploader's stored bytes); the chunk and its index entry only
            // once none is left (the next step goes on).
            let (start, end) = keys::chunk_uploader_range(&hash);
            let uploaders = txn.keys_in(&start, &end, budget.saturating_add(1))?;
            let all = uploaders.len() <= budget;
            for mark in uploaders.into_iter().take(budget) {
                // A counted mark holds the bytes it added (see `register`).
                let counted = txn.get_raw(&mark)?.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok());
                if let Some(size) = counted.map(u64::from_be_bytes) {
                    let user_id = String::from_utf8_lossy(&mark[start.len()..]).into_owned();
                    let left = stored_bytes(txn, &user_id)?.saturating_sub(size);
                    if left == 0 {
                        txn.delete(keys::stored_bytes(&user_id));
                    } else {
                        txn.put(keys::stored_bytes(&user_id), &left);
                    }
                }
                txn.delete(mark);
                budget -= 1;
            }
            if !all {
                more = true;
                break;
            }
            txn.delete(key);
            removed += 1;
        }
        txn.delete(index_key);
        budget = budget.saturating_sub(1);
        if budget == 0 {
            more = true;
            break;
        }
    }
    Ok(Outcome::Collected { removed, more })
}

impl StateMachine {
    /// Whether `user_id` may read the block (see [`readable`]).
    pub fn chunk_readable(&self, user_id: &str, hash: &BlockHash) -> Result<bool, StorageError> {
        readable(self, user_id, hash)
    }

    /// The bytes `user_id` stores (see [`stored_bytes`]).
    pub fn stored_bytes(&self, user_id: &str) -> Result<u64, StorageError> {
        stored_bytes(self, user_id)
    }

    /// Whether `user_id` uploaded the block.
    pub fn uploaded_by(&self, user_id: &str, hash: &BlockHash) -> Result<bool, StorageError> {
        Ok(self.get_bytes(&keys::chunk_uploader(&hash.0, user_id))?.is_some())
    }

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
