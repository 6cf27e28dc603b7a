//! Harness for raftbox's process-level cluster tests.
//!
//! The tests drive real `raftbox serve` processes through their HTTP API only; they know
//! nothing of the other crates' internals (DESIGN.md §1, STYLE.md item 12). This crate offers:
//!
//! - [`Cluster`]: a temporary directory, one `config.toml` per node, one child process per
//!   node, fault injection by process handle ([`Cluster::kill9`], [`Cluster::terminate`],
//!   [`Cluster::wipe`], [`Cluster::start_node`]) and probes that poll with a deadline
//!   ([`Cluster::wait_ready`], [`Cluster::wait_for_leader`], [`Cluster::wait_caught_up`]).
//! - [`Outcome`] and the request helpers ([`create_user`], [`get_user`], [`create_token`],
//!   [`me`]): an operation is acknowledged, rejected, or *unknown* — a timeout or a lost
//!   connection is unknown, never "failed".
//! - [`Workload`]: concurrent writers creating uniquely named users, recording every outcome.
//! - [`Seed`]: the single source of a test's random choices, printed with the command that
//!   replays it.
//! - [`checker`] (linearizability) and [`guard_checks`] (rate limits, fires, keys): checkers
//!   as pure functions over recorded histories.
//! - [`bystander`]: a user committing while another attacks, and the verdict the
//!   hostile-tenant tests judge (term, failures, p99 within 3x).
//! - [`sync_device`]: a device running `raftbox sync`, and the trees (local, server) the
//!   sync tests judge.
//! - [`Cluster::check_logs`] and [`Cluster::conclude`]: a panic or an ERROR line in any node
//!   log fails the test; on failure the log tails and the cluster directory are printed
//!   (`RAFTBOX_KEEP=1` keeps the directory).

pub mod bystander;
pub mod checker;
mod client;
mod cluster;
pub mod guard_checks;
pub mod nemesis;
pub mod net;
pub mod receiver;
pub mod register;
mod support;
pub mod sync_device;
pub mod webdriver;
mod workload;

pub use client::*;
pub use cluster::*;
pub use support::*;
pub use workload::*;

use std::time::Duration;

/// What openraft logs (at ERROR) when a peer cannot be reached.
const PEER_DOWN_LOG_FRAGMENT: &str = "Unreachable node";
/// What openraft logs at ERROR when an RPC to a peer fails or times out: a peer stopped,
/// frozen or cut off, or — on a loaded two-core machine — a 100 ms heartbeat that took
/// longer. These are events the tests judge by their own deadlines, so such lines are always
/// allowed; a panic, and any other ERROR line, fails a test.
const PEER_FAULT_LOG_FRAGMENTS: [&str; 6] = [
    PEER_DOWN_LOG_FRAGMENT,
    "RPCError err=timeout",
    // A call that failed after it was sent (timed out, reset): raftbox's network reports it
    // as a network error, not "unreachable", so openraft retries without resting the peer.
    "NetworkError: tonic::status::Status",
    "timeout while confirming leadership",
    "ms when Vote ",
    "InstallSnapshot RPC timed out",
];

/// What openraft logs at ERROR for a request that was waiting on the Raft core when the
/// core stopped for a graceful shutdown.
const SHUTDOWN_LOG_FRAGMENTS: [&str; 2] = ["core_result=Err(Stopped)", "recv_msg error=Stopped"];

/// Interval between two probes of a condition awaited with a deadline.
pub const POLL_INTERVAL_MS: u64 = 25;
/// The data format the binary under test reads and raises a cluster to
/// (`raftbox_storage::format::FORMAT`; the harness drives the binary only, so it is stated
/// here, and a test of upgrades fails when the two part).
pub const DATA_FORMAT: u64 = 5;
/// Deadline of one client request made by the harness; a request that exceeds it is unknown.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Deadline of one probe (`/readyz`, `/v1/cluster`) made while polling.
pub const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Deadline for establishing a TCP connection to a node.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Deadline for a freshly started cluster to elect a leader and accept the admin token.
pub const STARTUP_DEADLINE_MS: u64 = 30_000;
/// How long a node may take to exit after SIGTERM before it is killed.
pub const TERMINATE_DEADLINE_MS: u64 = 10_000;
/// Lines of each node log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 60;
/// Pause after an operation that was not acknowledged, so a dead endpoint is not spun on.
pub const RETRY_BACKOFF_MS: u64 = 100;
/// Attempts of one user creation in [`create_users`] while the outcome stays unknown.
pub const CREATE_ATTEMPTS_MAX: u32 = 50;
/// Attempts of one read in [`Cluster::verify_users`] while the outcome stays unknown.
pub const VERIFY_ATTEMPTS_MAX: u32 = 50;
/// Concurrent requests of [`Cluster::verify_users`].
pub const VERIFY_LANES: usize = 8;
/// Records a [`Workload`] keeps; its writers stop when it is reached.
pub const WORKLOAD_RECORDS_MAX: usize = 1_000_000;
/// Directories above the test executable searched for the `raftbox` binary.
pub const BIN_SEARCH_DEPTH: usize = 4;

/// Environment variable naming the `raftbox` binary explicitly.
pub const BIN_ENV: &str = "RAFTBOX_BIN";
/// Environment variable holding the seed of a run to replay.
pub const SEED_ENV: &str = "RAFTBOX_SEED";
/// Environment variable that keeps the cluster directory when set to `1`.
pub const KEEP_ENV: &str = "RAFTBOX_KEEP";

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}
