//! raftbox-raft: consensus for a raftbox node.
//!
//! - [`types`]: the openraft type configuration.
//! - [`log_store`], [`state_machine`]: openraft's storage traits over `raftbox-storage`;
//!   [`log_cache`]: the newest entries in memory, so an entry is encoded and decoded once.
//! - [`snapshot`]: snapshot files (openraft's snapshot data is an open file, streamed).
//! - [`network`], [`service`]: the tonic/prost node-to-node protocol (client and server).
//! - [`proposer`]: client-write batching and leader forwarding.
//! - [`limiter`], [`lease`]: rate-limit decisions in memory on the leader, under a lease.
//! - [`blocks`]: block transfer between nodes (majority-durable puts, fetch from peers).
//! - [`node`]: a running node: write, linearizable read barrier, bootstrap.
//! - [`metrics`]: the node's Prometheus series (write path, Raft state), one registry.
//! - [`membership`]: online membership change; a node that lost its data does not vote.
//! - [`secret`]: the cluster secret every node-to-node call carries.
//! - [`tls`]: TLS of the node (HTTPS, gRPC between nodes, mutual TLS), one crypto provider.
//! - [`clock`]: the clock-offset check that keeps a node with a wrong clock from leading.

pub mod blocks;
pub mod boot_clock;
pub mod clock;
pub mod disk;
pub mod error;
pub mod lease;
pub mod limiter;
pub mod log_cache;
pub mod log_store;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod node;
pub mod proposer;
mod read_rounds;
pub mod secret;
pub mod service;
pub mod snapshot;
pub mod state_machine;
pub mod tls;
pub mod types;

/// Generated protobuf types; used only inside this crate's modules and by the server wiring.
pub mod pb {
    tonic::include_proto!("raftbox.raft");
}

pub use clock::ClockHealth;
pub use error::{StartError, WriteError};
pub use membership::{Member, MembershipAnswer, MembershipChange, MembershipError, VoteRight};
pub use metrics::NodeMetrics;
pub use node::{RaftNode, RaftSettings};
pub use secret::ClusterSecret;
pub use service::{serve, RaftGrpc};
pub use state_machine::Applied;
pub use tls::NodeTls;
pub use types::{NodeId, NodeInfo, RaftMetrics};
