//! Prometheus metrics of a node, in one registry per node (every series carries `node`).
//!
//! The write path's series are recorded where the work happens: log appends and their fsync
//! in [`crate::log_store`], batches and write latency in [`crate::proposer`], the commit index
//! when openraft saves it. openraft's own state (term, role, indexes, apply lag) is read from
//! its metrics when the registry is rendered. The API registers its HTTP series in the same
//! registry ([`NodeMetrics::registry`]) and serves [`NodeMetrics::render`] on `/metrics`.

use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::types::{NodeId, RaftMetrics};

/// Roles a node can be in (`raftbox_raft_role{role}`), as openraft names them.
const ROLES: [&str; 5] = ["Leader", "Follower", "Candidate", "Learner", "Shutdown"];

/// The node's series; cloning shares them (each is reference-counted).
#[derive(Clone)]
pub struct NodeMetrics {
    registry: Registry,
    /// One synced log append: the write and its WAL fsync.
    pub log_fsync_seconds: Histogram,
    /// Entries per synced log append.
    pub log_append_entries: Histogram,
    /// Commands per batch (one log entry) the proposer proposed or forwarded.
    pub batch_commands: Histogram,
    /// Batches proposed or forwarded and not yet answered.
    pub batches_in_flight: IntGauge,
    /// From a submission to its answer (applied, rejected or failed).
    pub write_seconds: Histogram,
    /// The last committed log index openraft saved.
    pub commit_index: IntGauge,
    term: IntGauge,
    is_leader: IntGauge,
    role: IntGaugeVec,
    last_log_index: IntGauge,
    applied_index: IntGauge,
    apply_lag: IntGauge,
    snapshot_index: IntGauge,
    snapshot_bytes: IntGauge,
    /// The NOSPACE alarm (1 while raised) and the data directory's free bytes.
    pub(crate) disk_full: IntGauge,
    pub(crate) disk_free_bytes: IntGauge,
    pub(crate) disk_slow: IntGauge,
    /// Leader only: per follower, entries of the leader's log not yet replicated to it.
    replication_lag: IntGaugeVec,
    /// RocksDB's memory by `kind` (memtables, table_readers, block_cache), read at each scrape.
    rocksdb_memory: IntGaugeVec,
    /// The node's database: its memory and, in its directory, the snapshot files.
    db: Arc<std::sync::Mutex<Option<raftbox_storage::Db>>>,
    /// Block files on this node and their bytes (set by the node's maintenance rounds).
    pub blocks_stored: IntGauge,
    pub blocks_stored_bytes: IntGauge,
    /// Blocks this node lacked and its replicator fetched, or could not, by `outcome`.
    pub blocks_repaired: IntCounterVec,
    /// From a job's scheduled time to its start by an executor of this node.
    pub job_start_lateness_seconds: Histogram,
}

fn seconds_buckets() -> Vec<f64> {
    vec![
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
    ]
}

fn count_buckets() -> Vec<f64> {
    (0..=12).map(|exp| f64::from(1u32 << exp)).collect()
}

impl NodeMetrics {
    pub fn new(node: NodeId) -> NodeMetrics {
        let labels = [("node".to_string(), node.to_string())].into_iter().collect();
        let registry = Registry::new_custom(None, Some(labels)).expect("a valid constant label");
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid histogram");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let counter_vec = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let replication_lag = IntGaugeVec::new(
            Opts::new(
                "raftbox_raft_replication_lag",
                "Leader only: entries of its log not yet replicated to each follower (peer).",
            ),
            &["peer"],
        )
        .expect("valid gauge");
        registry.register(Box::new(replication_lag.clone())).expect("registered once");
        let rocksdb_memory = IntGaugeVec::new(
            Opts::new(
                "raftbox_rocksdb_memory_bytes",
                "RocksDB's memory by kind: memtables, table_readers (index and filter blocks outside the cache), block_cache.",
            ),
            &["kind"],
        )
        .expect("valid gauge");
        registry.register(Box::new(rocksdb_memory.clone())).expect("registered once");
        let role = IntGaugeVec::new(Opts::new("raftbox_raft_role", "1 for the role this node is in."), &["role"])
            .expect("valid gauge");
        registry.register(Box::new(role.clone())).expect("registered once");
        NodeMetrics {
            log_fsync_seconds: histogram(
                "raftbox_raft_log_fsync_seconds",
                "Time of one synced Raft log append (write and WAL fsync).",
                seconds_buckets(),
            ),
            log_append_entries: histogram(
                "raftbox_raft_log_append_entries",
                "Entries per synced Raft log append.",
                count_buckets(),
            ),
            batch_commands: histogram(
                "raftbox_raft_batch_commands",
                "Commands per batch (one log entry) proposed or forwarded by this node.",
                count_buckets(),
            ),
            batches_in_flight: gauge(
                "raftbox_raft_batches_in_flight",
                "Batches proposed or forwarded, not yet answered.",
            ),
            write_seconds: histogram(
                "raftbox_raft_write_seconds",
                "Time from a write's submission on this node to its answer.",
                seconds_buckets(),
            ),
            commit_index: gauge("raftbox_raft_commit_index", "Index of the last committed log entry."),
            term: gauge("raftbox_raft_term", "Current Raft term."),
            is_leader: gauge("raftbox_raft_is_leader", "1 if this node leads."),
            role,
            last_log_index: gauge("raftbox_raft_last_log_index", "Index of the last log entry."),
            applied_index: gauge("raftbox_raft_last_applied_index", "Index of the last applied entry."),
            apply_lag: gauge("raftbox_raft_apply_lag", "Log entries not applied yet: last log index - last applied."),
            snapshot_index: gauge("raftbox_raft_snapshot_index", "Last index in the current snapshot."),
            snapshot_bytes: gauge(
                "raftbox_raft_snapshot_bytes",
                "Bytes of snapshot files on disk: the current snapshot (and one being received).",
            ),
            disk_full: gauge(
                "raftbox_disk_full",
                "1 while the NOSPACE alarm is raised: the data directory's free space fell below the minimum.",
            ),
            disk_free_bytes: gauge("raftbox_disk_free_bytes", "Free bytes of the data directory's file system."),
            disk_slow: gauge(
                "raftbox_disk_slow",
                "1 while a log write (its fsync) has taken longer than a second, and for 10 s after: the node \
                 does not stand for election.",
            ),
            replication_lag,
            rocksdb_memory,
            db: Arc::default(),
            blocks_stored: gauge("raftbox_blocks_stored", "Block files on this node's disk."),
            blocks_stored_bytes: gauge("raftbox_blocks_stored_bytes", "Bytes of block files on this node's disk."),
            blocks_repaired: counter_vec(
                "raftbox_blocks_repaired_total",
                "Blocks this node lacked, by outcome: fetched from a peer, failed (retried next round), unavailable.",
                "outcome",
            ),
            job_start_lateness_seconds: histogram(
                "raftbox_jobs_start_lateness_seconds",
                "From a job's scheduled time to its start by an executor on this node.",
                vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0],
            ),
            registry,
        }
    }

    /// The database this node's storage series describe.
    pub fn set_db(&self, db: raftbox_storage::Db) {
        *self.db.lock().unwrap_or_else(|p| p.into_inner()) = Some(db);
    }

    /// Bytes of the files in the snapshot directory.
    fn snapshot_bytes(db: &raftbox_storage::Db) -> u64 {
        let Ok(entries) = std::fs::read_dir(db.path().join(crate::state_machine::SNAPSHOT_DIR)) else { return 0 };
        entries.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
    }

    /// Where the node's other layers register their series.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every series, openraft's state read from `raft`.
    pub(crate) fn render(&self, raft: &RaftMetrics) -> String {
        let index = |i: Option<u64>| i64::try_from(i.unwrap_or(0)).unwrap_or(i64::MAX);
        let last_log = index(raft.last_log_index);
        let applied = index(raft.last_applied.map(|id| id.index));
        self.term.set(i64::try_from(raft.current_term).unwrap_or(i64::MAX));
        self.is_leader.set(i64::from(raft.current_leader == Some(raft.id)));
        let current = format!("{:?}", raft.state);
        for role in ROLES {
            self.role.with_label_values(&[role]).set(i64::from(current == role));
        }
        self.last_log_index.set(last_log);
        self.applied_index.set(applied);
        self.apply_lag.set(last_log.saturating_sub(applied).max(0));
        self.snapshot_index.set(index(raft.snapshot.map(|id| id.index)));
        if let Some(db) = self.db.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            self.snapshot_bytes.set(i64::try_from(Self::snapshot_bytes(db)).unwrap_or(i64::MAX));
            let usage = db.memory_usage();
            for (kind, bytes) in [
                ("memtables", usage.memtables),
                ("table_readers", usage.table_readers),
                ("block_cache", usage.block_cache),
            ] {
                self.rocksdb_memory.with_label_values(&[kind]).set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        self.replication_lag.reset();
        for (peer, matched) in raft.replication.iter().flatten() {
            if *peer != raft.id {
                let lag = last_log.saturating_sub(index(matched.map(|id| id.index))).max(0);
                self.replication_lag.with_label_values(&[&peer.to_string()]).set(lag);
            }
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}
