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

use std::path::PathBuf;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::watch;

/// How often the free space is read.
pub const DISK_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// What the last check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskHealth {
    /// The alarm is raised: below the minimum (and not yet back above twice the minimum).
    pub full: bool,
    /// Free bytes at the last check (`None` before the first, or if it could not be read).
    pub free_bytes: Option<u64>,
    /// The configured minimum.
    pub min_free_bytes: u64,
}

impl DiskHealth {
    pub fn new(min_free_bytes: u64) -> DiskHealth {
        DiskHealth { full: false, free_bytes: None, min_free_bytes }
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
fn free_bytes(path: &std::path::Path) -> std::io::Result<u64> {
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

/// Checks the free space of `path` forever, publishing the verdict and the gauges.
pub(crate) async fn watch_disk(
    path: PathBuf,
    min_free_bytes: u64,
    health: watch::Sender<DiskHealth>,
    full_gauge: IntGauge,
    free_gauge: IntGauge,
) {
    let mut ticks = tokio::time::interval(DISK_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let at = path.clone();
        let free = match tokio::task::spawn_blocking(move || free_bytes(&at)).await {
            Ok(Ok(free)) => free,
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "could not read the data directory's free space");
                continue;
            }
            Err(_) => continue,
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
        full_gauge.set(i64::from(full));
        free_gauge.set(i64::try_from(free).unwrap_or(i64::MAX));
        health.send_replace(DiskHealth { full, free_bytes: Some(free), min_free_bytes });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alarm_rises_below_the_minimum_and_clears_at_twice_it() {
        assert!(!raised(false, 100, 64));
        assert!(raised(false, 63, 64));
        assert!(raised(true, 100, 64), "still raised between the minimum and twice it");
        assert!(!raised(true, 128, 64));
    }

    #[test]
    fn free_space_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(free_bytes(dir.path()).expect("statvfs") > 0);
    }
}
