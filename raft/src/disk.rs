//! The NOSPACE alarm (etcd's model): a node whose data directory's file system runs low on
//! space stops taking writes before the disk is actually full, so no RocksDB write ever
//! fails half-way and no storage error stops the Raft core.
//!
//! Every [`DISK_CHECK_INTERVAL`] the node reads the free space of its data directory's file
//! system (`statvfs`). Below `min_free_bytes` the alarm is raised: the node proposes nothing,
//! does not stand for election and stops its leader heartbeats (so, leading, it steps down:
//! the others elect a leader), refuses appended entries and snapshots from a leader
//! (`RESOURCE_EXHAUSTED`; the leader retries), refuses new blocks (503, from the API and from
//! peers), reports not ready
//! and sets `raftbox_disk_full`. Once twice the minimum is free again the alarm clears by
//! itself and the node catches up from the leader: nothing is lost, since the node
//! acknowledged nothing it did not store.
//!
//! A slow disk: a log write (one fsync) in flight for more than [`SLOW_SYNC`], or one that
//! took that long in the last [`SLOW_COOL_DOWN`], marks the disk slow ([`SyncTimer`]). A slow
//! node does not stand for election and sets `raftbox_disk_slow` (a warning, as etcd's "slow
//! fdatasync"); it stays ready, keeps storing what leaders send (a follower's slow fsync only
//! delays its own acknowledgements; a majority commits without them) and, leading, keeps its
//! heartbeats: a leader whose fsync is stuck is stuck in openraft's core, silent, and the
//! others elect within an election timeout; once it is back it does not stand again for the
//! cool-down. Only standing is refused, so a hiccup of a disk every node shares (a false
//! alarm on all of them at once) costs no leader, only elections for 10 s.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::watch;

use crate::boot_clock::BootInstant;

/// How often the free space and the log's writes are checked.
pub const DISK_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// A log write that takes longer marks the disk slow.
pub const SLOW_SYNC: Duration = Duration::from_secs(1);
/// How long one free-space read may take before the check goes on without it.
const STATVFS_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the disk stays slow after the last slow log write ended.
pub const SLOW_COOL_DOWN: Duration = Duration::from_secs(10);

/// The log's writes, timed for the slow-disk check: the log store marks each write's
/// beginning and end (one at a time: openraft appends serially).
#[derive(Debug, Default)]
pub(crate) struct SyncTimer {
    /// When the write in flight began (ms since boot, plus one), 0 when none is.
    in_flight_since: AtomicU64,
    /// Until when the disk counts as slow (ms since boot), after a slow write ended.
    slow_until: AtomicU64,
}

impl SyncTimer {
    fn now_ms(&self) -> u64 {
        BootInstant::now().since_boot().as_millis() as u64
    }

    /// A write begins; it ends when the guard is dropped (even if the write is abandoned).
    pub(crate) fn begin(&self) -> SyncGuard<'_> {
        self.in_flight_since.store(self.now_ms() + 1, Ordering::SeqCst);
        SyncGuard(self)
    }

    /// The write that began last ended.
    fn end(&self) {
        let began = self.in_flight_since.swap(0, Ordering::SeqCst);
        let now = self.now_ms();
        if began > 0 && now.saturating_sub(began - 1) > SLOW_SYNC.as_millis() as u64 {
            self.slow_until.fetch_max(now + SLOW_COOL_DOWN.as_millis() as u64, Ordering::SeqCst);
        }
    }

    /// Whether a write has been in flight too long, or one ended slow within the cool-down.
    pub(crate) fn slow(&self) -> bool {
        let now = self.now_ms();
        let began = self.in_flight_since.load(Ordering::SeqCst);
        let stuck = began > 0 && now.saturating_sub(began - 1) > SLOW_SYNC.as_millis() as u64;
        stuck || now < self.slow_until.load(Ordering::SeqCst)
    }
}

/// A log write in flight ([`SyncTimer::begin`]); dropping it ends the write.
pub(crate) struct SyncGuard<'a>(&'a SyncTimer);

impl Drop for SyncGuard<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// What the last check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskHealth {
    /// The alarm is raised: below the minimum (and not yet back above twice the minimum).
    pub full: bool,
    /// Free bytes at the last check (`None` before the first, or if it could not be read).
    pub free_bytes: Option<u64>,
    /// The configured minimum.
    pub min_free_bytes: u64,
    /// A log write is taking, or took within the cool-down, longer than [`SLOW_SYNC`].
    pub slow: bool,
}

impl DiskHealth {
    pub fn new(min_free_bytes: u64) -> DiskHealth {
        DiskHealth { full: false, free_bytes: None, min_free_bytes, slow: false }
    }

    /// Whether the disk lets this node stand for election: neither full nor slow.
    pub fn may_stand(&self) -> bool {
        !self.full && !self.slow
    }

    /// Whether `bytes` more may be written and still leave the minimum free (judged on the
    /// last check; a disk never read says yes, as before there was a check). The refusal
    /// says how much is missing.
    pub fn room_for(&self, bytes: u64, what: &str) -> Result<(), String> {
        match self.free_bytes {
            Some(free) if free < bytes.saturating_add(self.min_free_bytes) => Err(format!(
                "{what} needs {} MiB and the {} MiB minimum left free, but this node's disk has {} MiB free",
                bytes.div_ceil(1 << 20),
                self.min_free_bytes >> 20,
                free >> 20
            )),
            _ => Ok(()),
        }
    }

    /// The error a refused write or append carries.
    pub fn refusal(&self) -> String {
        format!(
            "this node's disk is full: {} MiB free, below the {} MiB minimum (NOSPACE); it takes no writes \
             until space is freed",
            self.free_bytes.unwrap_or(0) >> 20,
            self.min_free_bytes >> 20
        )
    }
}

/// Free bytes of the file system holding `path`, for an unprivileged writer.
pub(crate) fn free_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(path)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The alarm after a check that found `free` bytes, given whether it was raised before.
fn raised(was: bool, free: u64, min_free: u64) -> bool {
    if was {
        free < min_free.saturating_mul(2)
    } else {
        free < min_free
    }
}

/// The gauges the disk check sets.
pub(crate) struct DiskGauges {
    pub full: IntGauge,
    pub free_bytes: IntGauge,
    pub slow: IntGauge,
}

/// Checks the free space of `path` and the log's writes forever, publishing the verdict and
/// the gauges.
pub(crate) async fn watch_disk(
    path: PathBuf,
    min_free_bytes: u64,
    syncs: std::sync::Arc<SyncTimer>,
    health: watch::Sender<DiskHealth>,
    gauges: DiskGauges,
) {
    let mut ticks = tokio::time::interval(DISK_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // The log's writes first, whatever the free-space read below does.
        let (was_slow, slow) = (health.borrow().slow, syncs.slow());
        if slow != was_slow {
            if slow {
                // A warning, as etcd's "slow fdatasync": the node serves on, it only does not
                // stand (a node stopped for a second mid-write, a SIGSTOP say, counts too).
                tracing::warn!(
                    slow_sync_ms = SLOW_SYNC.as_millis() as u64,
                    "slow disk: a log write (fsync) is taking longer than the limit; this node does not stand \
                     for election"
                );
            } else {
                tracing::warn!("the disk's writes are fast again: this node may stand for election");
            }
        }
        gauges.slow.set(i64::from(slow));
        health.send_modify(|h| h.slow = slow);
        // A file system that hangs leaves one blocking thread behind, not this check.
        let at = path.clone();
        let read = tokio::time::timeout(STATVFS_TIMEOUT, tokio::task::spawn_blocking(move || free_bytes(&at)));
        let free = match read.await {
            Ok(Ok(Ok(free))) => free,
            Ok(Ok(Err(e))) => {
                tracing::warn!(path = %path.display(), error = %e, "could not read the data directory's free space");
                continue;
            }
            _ => continue,
        };
        let was = health.borrow().full;
        let full = raised(was, free, min_free_bytes);
        if full != was {
            if full {
                tracing::error!(
                    free_mib = free >> 20,
                    min_free_mib = min_free_bytes >> 20,
                    "NOSPACE: the data directory's disk is almost full; this node takes no writes, does not \
                     lead and refuses entries until space is freed"
                );
            } else {
                tracing::warn!(free_mib = free >> 20, "space freed: the NOSPACE alarm is cleared; catching up");
            }
        }
        gauges.full.set(i64::from(full));
        gauges.free_bytes.set(i64::try_from(free).unwrap_or(i64::MAX));
        health.send_modify(|h| {
            h.full = full;
            h.free_bytes = Some(free);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_what_leaves_the_minimum_free() {
        let mut disk = DiskHealth::new(64 << 20);
        assert!(disk.room_for(u64::MAX, "anything").is_ok(), "never read: as before there was a check");
        disk.free_bytes = Some(200 << 20);
        assert!(disk.room_for(136 << 20, "an install").is_ok());
        let refused = disk.room_for((136 << 20) + 1, "an install").expect_err("one byte too many");
        assert!(refused.contains("an install needs 137 MiB and the 64 MiB minimum"), "{refused}");
    }

    #[test]
    fn the_alarm_rises_below_the_minimum_and_clears_at_twice_it() {
        assert!(!raised(false, 100, 64));
        assert!(raised(false, 63, 64));
        assert!(raised(true, 100, 64), "still raised between the minimum and twice it");
        assert!(!raised(true, 128, 64));
    }

    #[test]
    fn a_write_in_flight_too_long_or_ended_slow_marks_the_disk_slow() {
        let syncs = SyncTimer::default();
        assert!(!syncs.slow());
        drop(syncs.begin());
        assert!(!syncs.slow(), "a fast write");
        // A write that began 1.5 s ago and has not ended; then ends.
        let long_ago = syncs.now_ms().saturating_sub(1_500);
        syncs.in_flight_since.store(long_ago + 1, Ordering::SeqCst);
        assert!(syncs.slow(), "stuck in flight");
        syncs.end();
        assert!(syncs.slow(), "ended slow: within the cool-down");
        syncs.slow_until.store(syncs.now_ms(), Ordering::SeqCst);
        assert!(!syncs.slow(), "the cool-down over");
    }

    #[test]
    fn free_space_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(free_bytes(dir.path()).expect("statvfs") > 0);
    }
}
