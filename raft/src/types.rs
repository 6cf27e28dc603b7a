//! openraft type configuration and the small types shared by the raft crate.

use std::fmt;

use raftbox_storage::{Batch, Outcome};
use serde::{Deserialize, Serialize};

/// Addresses of a cluster member, stored in the replicated membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Host:port of the node's HTTP API.
    pub http_addr: String,
    /// Host:port of the node's gRPC (Raft) endpoint.
    pub grpc_addr: String,
    /// The incarnation of the node's data directory when it joined (or bootstrapped) the
    /// cluster: a node votes only while its own matches (see [`crate::membership`]). Absent
    /// in configurations written before incarnations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

impl NodeInfo {
    /// A member's addresses, its incarnation unknown yet.
    pub fn new(http_addr: impl Into<String>, grpc_addr: impl Into<String>) -> NodeInfo {
        NodeInfo { http_addr: http_addr.into(), grpc_addr: grpc_addr.into(), incarnation: None }
    }

    /// Whether both name the same addresses (whatever the incarnations).
    pub fn same_addresses(&self, other: &NodeInfo) -> bool {
        self.http_addr == other.http_addr && self.grpc_addr == other.grpc_addr
    }
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http={} grpc={}", self.http_addr, self.grpc_addr)?;
        match &self.incarnation {
            Some(incarnation) => write!(f, " incarnation={incarnation}"),
            None => Ok(()),
        }
    }
}

pub type NodeId = u64;

openraft::declare_raft_types!(
    /// raftbox's openraft types: a log entry carries one [`Batch`], and answers one
    /// [`Outcome`] per command.
    pub TypeConfig:
        D = Batch,
        R = Vec<Outcome>,
        NodeId = NodeId,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::snapshot::SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeInfo>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeInfo>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type RaftStorageError = openraft::StorageError<NodeId>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, NodeInfo>;
