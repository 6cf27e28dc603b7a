//! The newest log entries in memory, decoded and encoded, so a log entry is encoded once on
//! the node that proposes it and decoded once on each node that receives it.
//!
//! openraft 0.9 reads an entry back from the log store once to replicate it to each follower
//! and once more to apply it, inside its core task; from RocksDB each of those reads was a
//! JSON decode of the whole batch. Served from here it is a reference count (a `Batch`'s
//! commands are shared). The network sends the cached encoding of each entry
//! (`AppendEntriesFramed`), and a follower keeps what it received, so its own append
//! writes those bytes instead of encoding the entry again.
//!
//! The cache mirrors the tail of the log: every append, truncation and purge of the log
//! store goes through it, so a cached entry is exactly the log's entry at that index. A
//! range it does not wholly hold is read from RocksDB. It holds at most [`ENTRIES_MAX`]
//! entries and [`BYTES_MAX`] encoded bytes; what a follower received but has not appended
//! yet, at most [`RECEIVED_MAX`] entries and [`RECEIVED_BYTES_MAX`] bytes, each copied out of
//! the request that carried it (a slice would keep the whole request buffer alive).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::types::{Entry, LogId};

/// Entries kept, at most: about a second of entries at the highest commit rates measured
/// (a follower further behind reads from RocksDB). Each is kept twice, decoded and encoded,
/// and a decoded batch of a few dozen commands takes tens of KiB: 4,096 entries held 150 MiB
/// or more of a leader's memory under 256 writers.
pub const ENTRIES_MAX: usize = 1_024;
/// Encoded bytes kept, at most (entries are up to `ENTRY_BYTES_MAX` each; the decoded copies
/// take about as much again).
pub const BYTES_MAX: usize = 16 << 20;
/// Received encodings kept until their append, at most (more arrive only when a follower's
/// appends fail; the oldest are dropped).
pub const RECEIVED_MAX: usize = 1_024;
/// Received encodings' bytes kept until their append, at most.
pub const RECEIVED_BYTES_MAX: usize = 16 << 20;

struct Cached {
    entry: Entry,
    encoded: Bytes,
}

#[derive(Default)]
struct Inner {
    /// Consecutive entries, oldest first, ending at the log's last entry.
    entries: VecDeque<Cached>,
    bytes: usize,
    /// Encodings a follower received, by log id, for its append to reuse.
    received: BTreeMap<LogId, Bytes>,
    received_bytes: usize,
}

/// Shared by the log store, its readers and the node's network and gRPC service.
#[derive(Clone, Default)]
pub struct LogCache {
    inner: Arc<Mutex<Inner>>,
}

impl LogCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries just appended to the log (durably), in order, with their encodings.
    pub fn appended(&self, appended: Vec<(Entry, Bytes)>) {
        let mut inner = self.lock();
        for (entry, encoded) in appended {
            let index = entry.log_id.index;
            // An append at or below the tail replaces the entries from there on.
            inner.truncate_from(index);
            if inner.entries.back().is_some_and(|last| last.entry.log_id.index + 1 != index) {
                inner.clear_entries();
            }
            inner.forget_received(&entry.log_id);
            inner.bytes += encoded.len();
            inner.entries.push_back(Cached { entry, encoded });
        }
        while inner.entries.len() > ENTRIES_MAX || (inner.bytes > BYTES_MAX && inner.entries.len() > 1) {
            inner.pop_front();
        }
    }

    /// The log lost every entry from `index` on.
    pub fn truncated(&self, index: u64) {
        self.lock().truncate_from(index);
    }

    /// The log lost every entry up to `index`, inclusive.
    pub fn purged(&self, index: u64) {
        let mut inner = self.lock();
        while inner.entries.front().is_some_and(|c| c.entry.log_id.index <= index) {
            inner.pop_front();
        }
        let gone: Vec<LogId> =
            inner.received.range(..).filter(|(id, _)| id.index <= index).map(|(id, _)| *id).collect();
        for id in gone {
            inner.forget_received(&id);
        }
    }

    /// Entries `start..end`, if every one of them is cached.
    pub fn range(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let inner = self.lock();
        let first = inner.entries.front()?.entry.log_id.index;
        let last = inner.entries.back()?.entry.log_id.index;
        if start >= end || start < first || end - 1 > last {
            return None;
        }
        let from = usize::try_from(start - first).ok()?;
        let count = usize::try_from(end - start).ok()?;
        Some(inner.entries.range(from..from + count).map(|c| c.entry.clone()).collect())
    }

    /// The encoding of the entry with `log_id`, if it is cached: what this node appended, or
    /// what it received for its append.
    pub fn encoded(&self, log_id: &LogId) -> Option<Bytes> {
        let inner = self.lock();
        if let Some(bytes) = inner.received.get(log_id) {
            return Some(bytes.clone());
        }
        let first = inner.entries.front()?.entry.log_id.index;
        let at = usize::try_from(log_id.index.checked_sub(first)?).ok()?;
        let cached = inner.entries.get(at)?;
        (cached.entry.log_id == *log_id).then(|| cached.encoded.clone())
    }

    /// Keeps the encoding `bytes` of the entry `log_id` that arrived from the leader, for this
    /// node's append of it. A log id names one entry, so the bytes are that entry's encoding.
    pub fn received(&self, log_id: LogId, bytes: Bytes) {
        if bytes.len() > RECEIVED_BYTES_MAX {
            return;
        }
        // A copy of its own: the slice would keep the whole request's buffer alive.
        let bytes = Bytes::copy_from_slice(&bytes);
        let mut inner = self.lock();
        inner.forget_received(&log_id);
        while inner.received.len() >= RECEIVED_MAX || inner.received_bytes + bytes.len() > RECEIVED_BYTES_MAX {
            // Log ids order by term, then index: the first is the oldest.
            let Some((oldest, dropped)) = inner.received.pop_first() else { break };
            inner.received_bytes -= dropped.len();
            debug_assert!(oldest != log_id);
        }
        inner.received_bytes += bytes.len();
        inner.received.insert(log_id, bytes);
        debug_assert_eq!(inner.received_bytes, inner.received.values().map(Bytes::len).sum::<usize>());
    }
}

impl Inner {
    fn forget_received(&mut self, log_id: &LogId) {
        if let Some(bytes) = self.received.remove(log_id) {
            self.received_bytes -= bytes.len();
        }
    }

    fn pop_front(&mut self) {
        if let Some(cached) = self.entries.pop_front() {
            self.bytes -= cached.encoded.len();
        }
    }

    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|c| c.entry.log_id.index >= index) {
            if let Some(cached) = self.entries.pop_back() {
                self.bytes -= cached.encoded.len();
            }
        }
    }

    fn clear_entries(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(term: u64, index: u64) -> (Entry, Bytes) {
        let entry = Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank };
        let encoded = Bytes::from(format!("{term}-{index}"));
        (entry, encoded)
    }

    fn indexes(cache: &LogCache, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        cache.range(start, end).map(|es| es.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect())
    }

    #[test]
    fn serves_only_whole_ranges_of_the_log_tail() {
        let cache = LogCache::default();
        assert_eq!(indexes(&cache, 1, 2), None);
        cache.appended(vec![entry(1, 5), entry(1, 6), entry(1, 7)]);
        assert_eq!(indexes(&cache, 5, 8), Some(vec![(1, 5), (1, 6), (1, 7)]));
        assert_eq!(indexes(&cache, 6, 7), Some(vec![(1, 6)]));
        assert_eq!(indexes(&cache, 4, 6), None, "index 4 is only in RocksDB");
        assert_eq!(indexes(&cache, 7, 9), None, "index 8 is not in the log");
        assert_eq!(cache.encoded(&entry(1, 6).0.log_id), Some(Bytes::from("1-6")));
        assert_eq!(cache.encoded(&entry(2, 6).0.log_id), None, "another term's entry 6 is not this one");
    }

    #[test]
    fn follows_truncation_overwrite_gaps_and_purge() {
        let cache = LogCache::default();
        cache.appended(vec![entry(1, 5), entry(1, 6), entry(1, 7)]);
        // A new leader's entry 6 replaces 6 and 7.
        cache.appended(vec![entry(2, 6)]);
        assert_eq!(indexes(&cache, 5, 7), Some(vec![(1, 5), (2, 6)]));
        assert_eq!(indexes(&cache, 5, 8), None);
        cache.truncated(6);
        assert_eq!(indexes(&cache, 5, 6), Some(vec![(1, 5)]));
        // A gap (a snapshot installed meanwhile) starts the cache afresh.
        cache.appended(vec![entry(2, 9)]);
        assert_eq!(indexes(&cache, 5, 6), None);
        assert_eq!(indexes(&cache, 9, 10), Some(vec![(2, 9)]));
        cache.purged(9);
        assert_eq!(indexes(&cache, 9, 10), None);
    }

    #[test]
    fn received_encodings_are_served_until_appended_and_bounded() {
        let cache = LogCache::default();
        let (e, _) = entry(3, 10);
        cache.received(e.log_id, Bytes::from("wire"));
        assert_eq!(cache.encoded(&e.log_id), Some(Bytes::from("wire")));
        cache.appended(vec![(e.clone(), Bytes::from("wire"))]);
        assert_eq!(cache.inner.lock().expect("lock").received.len(), 0);
        for index in 0..(RECEIVED_MAX as u64 + 10) {
            cache.received(entry(4, 100 + index).0.log_id, Bytes::new());
        }
        assert_eq!(cache.inner.lock().expect("lock").received.len(), RECEIVED_MAX);
        assert_eq!(cache.encoded(&entry(4, 100).0.log_id), None, "the oldest went first");
    }

    #[test]
    fn received_encodings_are_bounded_by_bytes_and_own_their_memory() {
        let cache = LogCache::default();
        let request = Bytes::from(vec![7u8; 1 << 20]);
        let entries = RECEIVED_BYTES_MAX / (1 << 19) + 4;
        for index in 0..entries as u64 {
            // Each entry a half of one big request, as a slice of it.
            let half = request.slice(0..(1 << 19));
            cache.received(entry(5, index).0.log_id, half);
        }
        let inner = cache.inner.lock().expect("lock");
        assert!(inner.received_bytes <= RECEIVED_BYTES_MAX, "{} bytes kept", inner.received_bytes);
        assert_eq!(inner.received_bytes, inner.received.values().map(Bytes::len).sum::<usize>());
        assert!(inner.received.values().all(|b| b.as_ptr() != request.as_ptr()), "copied out of the request");
        drop(inner);
        cache.purged(u64::MAX - 1);
        assert_eq!(cache.inner.lock().expect("lock").received_bytes, 0);
    }

    #[test]
    fn stays_within_its_bounds() {
        let cache = LogCache::default();
        cache.appended((1..=(ENTRIES_MAX as u64 + 5)).map(|i| entry(1, i)).collect());
        let inner = cache.inner.lock().expect("lock");
        assert_eq!(inner.entries.len(), ENTRIES_MAX);
        assert_eq!(inner.entries.front().map(|c| c.entry.log_id.index), Some(6));
    }
}
