//! raftbox-raft: consensus for a raftbox node.
//!
//! The boundary is plain data: [`RaftNode`] and the types re-exported here ([`Status`],
//! [`AppliedIndex`], [`Member`], the errors). openraft, tonic and the protobuf types stay
//! inside this crate.
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
//! - [`status`]: this node's view of the cluster as plain data, and its applied index.
//! - [`metrics`]: the node's Prometheus series (write path, Raft state), one registry.
//! - [`membership`]: online membership change; a node that lost its data does not vote.
//! - [`secret`]: the cluster secret every node-to-node call carries; [`cluster_id`]: the
//!   cluster's identity, which every call carries too, so no node joins another cluster.
//! - [`tls`]: TLS of the node (HTTPS, gRPC between nodes, mutual TLS), one crypto provider.
//! - [`clock`]: the clock-offset check that keeps a node with a wrong clock from leading.
//! - [`recover`]: offline: a one-member cluster from a survivor, or from a backup.

mod blocks;
mod boot_clock;
mod clock;
mod cluster_id;
mod disk;
mod error;
mod format;
mod lease;
mod limiter;
mod log_cache;
mod log_store;
mod membership;
mod metrics;
mod network;
mod node;
mod proposer;
mod read_rounds;
mod recover;
mod secret;
mod service;
mod snapshot;
mod state_machine;
mod status;
mod tls;
mod types;

#[cfg(test)]
mod tests;

/// Generated protobuf types, private to this crate (the wire between nodes).
mod pb {
    tonic::include_proto!("raftbox.raft");
}

pub use blocks::{BlockError, Blocks, FillReport};
pub use clock::ClockHealth;
pub use disk::DiskHealth;
pub use error::{StartError, WriteError};
pub use limiter::{Limiter, RateAnswer};
pub use membership::{Member, MembershipAnswer, MembershipChange, MembershipError, VoteRight};
pub use metrics::NodeMetrics;
pub use node::{BackupImage, Initialize, RaftNode, RaftSettings};
pub use recover::{force_new_cluster, restore_backup, RecoverError, Recovered, Restored};
pub use secret::ClusterSecret;
pub use service::{serve, ServeError};
pub use state_machine::Applied;
pub use status::{AppliedIndex, Role, Status};
pub use tls::{install_default_provider, NodeTls};
pub use types::{NodeId, NodeInfo};
