//! The node-local background work, never on a request path: the block replicator (fetch
//! indexed blocks this node lacks from peers) and the block reclaimer (delete block files the
//! index no longer names, once older than the grace period, so an upload awaiting its commit
//! is never touched). The cluster-wide maintenance (purge of expired guard records, version
//! expiry, orphan collection, run expiry) runs as built-in recurring jobs of the scheduler
//! (see `executor`), so it is claimed once and visible in run history.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use raftbox_raft::RaftNode;
use raftbox_storage::blocks::BlockHash;
use serde::Deserialize;

/// File-service maintenance settings (node TOML `[files]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// How long a version that is no longer current is kept, in seconds (30 days).
    pub version_retention_s: u64,
    /// How long an unreferenced block is kept before it is reclaimed, in seconds (24 h).
    pub orphan_grace_s: u64,
    /// How often maintenance runs, in seconds.
    pub maintenance_interval_s: u64,
    /// Chunk-index entries the block replicator checks per round.
    pub replicator_round_chunks: usize,
}

impl Default for FilesConfig {
    fn default() -> FilesConfig {
        FilesConfig {
            version_retention_s: 30 * 24 * 3600,
            orphan_grace_s: 24 * 3600,
            maintenance_interval_s: 60,
            replicator_round_chunks: 10_000,
        }
    }
}

/// Runs every `maintenance_interval_s` until `stopped` resolves.
pub async fn run(node: RaftNode, config: FilesConfig, stopped: impl std::future::Future<Output = ()>) {
    let mut ticks = tokio::time::interval(Duration::from_secs(config.maintenance_interval_s.max(1)));
    let mut replicator = Replicator { cursor: None, round: config.replicator_round_chunks.max(1) };
    let mut reclaimer = Reclaimer { unindexed_since: HashMap::new() };
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = ticks.tick() => {}
        }
        replicator.round(&node).await;
        reclaimer.round(&node, &config).await;
        measure_blocks(&node).await;
    }
}

/// Sets `raftbox_blocks_stored` and `raftbox_blocks_stored_bytes` from the block directory.
async fn measure_blocks(node: &RaftNode) {
    let store = node.blocks().store().clone();
    match tokio::task::spawn_blocking(move || store.usage()).await {
        Ok(Ok((count, bytes))) => {
            let metrics = node.node_metrics();
            metrics.blocks_stored.set(i64::try_from(count).unwrap_or(i64::MAX));
            metrics.blocks_stored_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "measure the block store"),
        Err(e) => tracing::warn!(error = %e, "measure the block store"),
    }
}

/// Walks the chunk index a round at a time, fetching the blocks this node lacks (it was down,
/// its disk was replaced, or a PUT reached only a majority); the cursor survives rounds, so
/// every entry is visited however large the index.
struct Replicator {
    cursor: Option<BlockHash>,
    round: usize,
}

impl Replicator {
    async fn round(&mut self, node: &RaftNode) {
        let hashes = match node.state().chunk_hashes(self.cursor.as_ref(), self.round) {
            Ok(hashes) => hashes,
            Err(e) => return tracing::warn!(error = %e, "replicator: read the chunk index"),
        };
        // A short round reached the end of the index: the next starts over.
        self.cursor = if hashes.len() < self.round { None } else { hashes.last().copied() };
        let report = node.blocks().fill(hashes).await;
        let repaired = &node.node_metrics().blocks_repaired;
        repaired.with_label_values(&["fetched"]).inc_by(report.fetched);
        repaired.with_label_values(&["failed"]).inc_by(report.failed);
        repaired.with_label_values(&["unavailable"]).inc_by(report.unavailable);
        if report.fetched > 0 || report.failed > 0 {
            tracing::info!(?report, "replicator: fetched blocks this node lacked");
        }
    }
}

/// Deletes block files the chunk index no longer names once they have stayed unindexed and
/// untouched for the grace period. The grace is measured on this node's monotonic clock from
/// the round that first found the file unindexed (a file's modification time is compared only
/// for equality: a re-put renews it and starts the grace again), so no wall clock — this
/// node's jumping forward, or a file's time set by another machine — can shorten it. A
/// restart forgets what was seen and starts every grace again. Each round follows a read
/// barrier, so the index consulted is at least as new as the cluster's when the round began
/// (a restarted node still catching up would otherwise see registered blocks as unindexed).
struct Reclaimer {
    /// Each block file seen unindexed: when (monotonic) and its modification time then.
    unindexed_since: HashMap<BlockHash, (Instant, SystemTime)>,
}

impl Reclaimer {
    async fn round(&mut self, node: &RaftNode, config: &FilesConfig) {
        if let Err(e) = node.read_barrier().await {
            return tracing::debug!(error = %e, "reclaimer: state not confirmed current; skipping this round");
        }
        let store = node.blocks().store().clone();
        let state = node.state().clone();
        let grace = Duration::from_secs(config.orphan_grace_s);
        let mut seen = std::mem::take(&mut self.unindexed_since);
        let result = tokio::task::spawn_blocking(move || {
            let mut removed = 0;
            let now = Instant::now();
            let mut still = HashMap::new();
            let walked = (|| -> Result<(), raftbox_storage::StorageError> {
                for (hash, modified) in store.list()? {
                    if state.chunk(&hash)?.is_some() {
                        continue;
                    }
                    let since = match seen.remove(&hash) {
                        Some((since, was)) if was == modified => since,
                        _ => now,
                    };
                    // Unindexed and untouched for the whole grace; checked again just before
                    // removal (a re-put between the walk and here changes the time).
                    if now.saturating_duration_since(since) >= grace && store.modified(&hash)? == Some(modified) {
                        store.remove(&hash)?;
                        removed += 1;
                    } else {
                        still.insert(hash, (since, modified));
                    }
                }
                Ok(())
            })();
            (walked.map(|()| removed), still)
        })
        .await;
        let result = match result {
            Ok((walked, still)) => {
                self.unindexed_since = still;
                Ok(walked)
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(removed, "reclaimed unreferenced blocks"),
            Ok(Err(e)) => tracing::warn!(error = %e, "block reclaimer"),
            Err(e) => tracing::warn!(error = %e, "block reclaimer task"),
        }
    }
}
