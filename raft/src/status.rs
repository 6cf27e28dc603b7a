//! This node's view of the cluster as plain data — what the API, the CLI and the metrics
//! read — and a watch on its applied index, so that nothing outside this crate reads
//! openraft's types.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::membership::{members_of, Member};
use crate::types::{NodeId, RaftMetrics};

/// What this node is doing in the cluster now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Candidate,
    Follower,
    /// A non-voting member catching up (or a node no configuration names yet).
    Learner,
    /// The node is stopping.
    Shutdown,
}

/// This node's view of the cluster at one moment.
#[derive(Debug, Clone)]
pub struct Status {
    pub id: NodeId,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub role: Role,
    /// Whether the configuration this node holds names it (voter or learner).
    pub member: bool,
    pub members: Vec<Member>,
    /// The last log index applied here, written here, and covered by the snapshot.
    pub last_applied: u64,
    pub last_log_index: u64,
    pub snapshot_index: Option<u64>,
    /// On the leader: how far each member's log is known to match (`None` before its
    /// first reply); `None` elsewhere, since only the leader knows.
    pub replication: Option<Vec<(NodeId, Option<u64>)>>,
}

impl Status {
    pub(crate) fn of(metrics: &RaftMetrics) -> Status {
        use openraft::ServerState;
        let role = match metrics.state {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Follower => Role::Follower,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        };
        Status {
            id: metrics.id,
            leader_id: metrics.current_leader,
            term: metrics.current_term,
            role,
            member: metrics.membership_config.membership().get_node(&metrics.id).is_some(),
            members: members_of(metrics),
            last_applied: metrics.last_applied.map_or(0, |id| id.index),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            snapshot_index: metrics.snapshot.map(|id| id.index),
            replication: metrics
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(id, matched)| (*id, matched.map(|log_id| log_id.index))).collect()),
        }
    }
}

/// A watch on this node's applied index: read it, or wait until it reaches an index.
#[derive(Clone)]
pub struct AppliedIndex(pub(crate) watch::Receiver<RaftMetrics>);

impl AppliedIndex {
    /// The last log index applied here now.
    pub fn get(&self) -> u64 {
        self.0.borrow().last_applied.map_or(0, |id| id.index)
    }

    /// Waits until the applied index is at least `index`, for at most `timeout`; whether it
    /// got there (`false` also when the node stops).
    pub async fn reach(&mut self, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let reached = |m: &RaftMetrics| m.last_applied.is_some_and(|id| id.index >= index);
        matches!(tokio::time::timeout_at(deadline, self.0.wait_for(reached)).await, Ok(Ok(_)))
    }
}
