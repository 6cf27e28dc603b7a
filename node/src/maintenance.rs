//! The node-local background work, never on a request path: the block replicator (fetch
//! indexed blocks this node lacks from peers) and the block reclaimer (delete block files the
//! index no longer names, once older than the grace period, so an upload awaiting its commit
//! is never touched). The cluster-wide maintenance (purge of expired guard records, version
//! expiry, orphan collection, run expiry) runs as built-in recurring jobs of the scheduler
//! (see `executor`), so it is claimed once and visible in run history.

use std::time::Duration;

use raftbox_raft::RaftNode;
use raftbox_storage::blocks::BlockHash;
use serde::Deserialize;

/// Index entries the replicator checks per round, at most.
const REPLICATOR_SCAN_MAX: usize = 10_000;

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
}

impl Default for FilesConfig {
    fn default() -> FilesConfig {
        FilesConfig { version_retention_s: 30 * 24 * 3600, orphan_grace_s: 24 * 3600, maintenance_interval_s: 60 }
    }
}

/// Runs every `maintenance_interval_s` until `stopped` resolves.
pub async fn run(node: RaftNode, config: FilesConfig, stopped: impl std::future::Future<Output = ()>) {
    let mut ticks = tokio::time::interval(Duration::from_secs(config.maintenance_interval_s.max(1)));
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = ticks.tick() => {}
        }
        replicate(&node).await;
        reclaim(&node, &config).await;
    }
}

/// Fetches indexed blocks this node lacks (it was down, or a PUT reached only a majority).
async fn replicate(node: &RaftNode) {
    let hashes = match node.state().chunk_hashes(None, REPLICATOR_SCAN_MAX) {
        Ok(hashes) => hashes,
        Err(e) => return tracing::warn!(error = %e, "replicator: read the chunk index"),
    };
    let store = node.blocks().store().clone();
    let lacking: Vec<BlockHash> = hashes.into_iter().filter(|h| !store.has(h)).collect();
    for hash in lacking {
        match node.blocks().get(hash).await {
            Ok(Some(_)) => tracing::debug!(%hash, "replicator: fetched block"),
            Ok(None) => tracing::warn!(%hash, "replicator: no peer holds an indexed block"),
            Err(e) => tracing::warn!(%hash, error = %e, "replicator: fetch failed"),
        }
    }
}

/// Deletes block files the chunk index no longer names, once older than the grace period.
async fn reclaim(node: &RaftNode, config: &FilesConfig) {
    let store = node.blocks().store().clone();
    let state = node.state().clone();
    let grace = Duration::from_secs(config.orphan_grace_s);
    let result = tokio::task::spawn_blocking(move || -> Result<usize, raftbox_storage::StorageError> {
        let mut removed = 0;
        for (hash, modified) in store.list()? {
            let old = |age: Option<Duration>| age.is_some_and(|age| age >= grace);
            // Unindexed and old, checked again just before removal (a re-put renews the age).
            if old(modified.elapsed().ok()) && state.chunk(&hash)?.is_none() && old(store.age(&hash)?) {
                store.remove(&hash)?;
                removed += 1;
            }
        }
        Ok(removed)
    })
    .await;
    match result {
        Ok(Ok(0)) => {}
        Ok(Ok(removed)) => tracing::info!(removed, "reclaimed unreferenced blocks"),
        Ok(Err(e)) => tracing::warn!(error = %e, "block reclaimer"),
        Err(e) => tracing::warn!(error = %e, "block reclaimer task"),
    }
}
