//! Column-family names, once. A node's RocksDB holds exactly these.

/// Raft log entries, keyed by big-endian index.
pub const LOG: &str = "raft_log";
/// Raft metadata: vote, committed id, purged id, the current snapshot's record, which state
/// column family is live.
pub const RAFT_META: &str = "raft_meta";
/// The state machine's data: every table, plus the applied marker. A snapshot is this CF.
///
/// There are two of them, [`STATE`] and [`STATE_B`]; one is live (named by
/// [`crate::keys::meta::STATE_CF`], [`STATE`] when absent), the other is empty or being
/// filled by a snapshot install, which then makes it live in one synced write
/// (`crate::db::Db::state`).
pub const STATE: &str = "state";
/// The second state column family (see [`STATE`]).
pub const STATE_B: &str = "state_b";

/// The two state column families, in the order [`crate::db::Db`] numbers them.
pub const STATES: [&str; 2] = [STATE, STATE_B];

/// Every column family, in creation order.
pub const ALL: [&str; 4] = [LOG, RAFT_META, STATE, STATE_B];
