//! Column-family names, once. A node's RocksDB holds exactly these.

/// Raft log entries, keyed by big-endian index.
pub const LOG: &str = "raft_log";
/// Raft metadata: vote, committed id, purged id, the current snapshot.
pub const RAFT_META: &str = "raft_meta";
/// The state machine's data: every table, plus the applied marker. A snapshot is this CF.
pub const STATE: &str = "state";

/// Every column family, in creation order.
pub const ALL: [&str; 3] = [LOG, RAFT_META, STATE];
