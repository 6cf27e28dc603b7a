//! Raising the cluster's data format ([`raftbox_storage::format`]): the leader moves the
//! replicated format up to the one this code reads once every member reports (in its
//! `Status` answer) that it reads it too, and a command of a newer format is proposed only
//! once the cluster is there. So during a rolling upgrade every entry stays readable by
//! every member, and after it the new commands work.
//!
//! The argument, with the paired checks:
//! - The format never decreases (`Migrate` of a lower one changes nothing), so a node that
//!   sees format F applied knows a quorum committed it; [`ClusterFormat::admits`] may judge
//!   by the local state, stale or not: staleness only refuses.
//! - The leader raises it only after every member of the current configuration answered
//!   with a format at least as new, holding the gate that every addition holds, and
//!   proposes it on itself only (`Forward` refuses it: [`forwardable`]). An addition
//!   (`membership::change_on_leader`) first applies everything in the leader's log (a raise
//!   whose write timed out included), then refuses a node older than the cluster, and checks
//!   again before promoting the learner (for a raise by a leader before this one), removing
//!   it if that fails.
//! - A node never starts on state of a newer format than it reads (`RaftNode::start`), and
//!   never applies an entry that says it is newer (`StateMachine::apply`).

use std::sync::Arc;
use std::time::Duration;

use raftbox_storage::{Command, StateMachine};

use crate::membership::{members_of, peer_status};
use crate::network::Peers;
use crate::proposer::Proposer;
use crate::types::{NodeId, Raft};
use crate::WriteError;

/// How often a leader whose cluster is behind its own format asks the members theirs.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a member has to answer that question.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The cluster's format as this node knows it, and the gate that keeps an addition and a
/// raise of the format apart.
#[derive(Clone)]
pub(crate) struct ClusterFormat {
    state: StateMachine,
    /// The newest format this node reads (the storage crate's, or a test's stand-in for an
    /// older node: [`crate::RaftSettings::reads_format`]).
    pub reads: u32,
    pub gate: Arc<tokio::sync::Mutex<()>>,
}

impl ClusterFormat {
    pub fn new(state: StateMachine, reads: u32) -> ClusterFormat {
        ClusterFormat { state, reads, gate: Arc::default() }
    }

    /// The cluster's format as applied here (a read error counts as the oldest, refusing).
    pub fn current(&self) -> u32 {
        self.state.schema().unwrap_or(raftbox_storage::format::unrecorded())
    }

    /// `Ok` if the cluster reads `command`; the refusal otherwise. A `Migrate` beyond the
    /// baseline is proposed only by [`raise`], after its own check, on the leader itself.
    pub fn admits(&self, command: &Command) -> Result<(), WriteError> {
        let needs = command.format();
        if needs <= raftbox_storage::format::BASELINE {
            return Ok(());
        }
        let current = self.current();
        if needs <= current {
            return Ok(());
        }
        Err(WriteError::FormatNotReached { needs, current })
    }
}

/// Whether a command may arrive at the leader through `Forward`: not a `Migrate` beyond the
/// baseline, which only the leader's own [`raise`] proposes.
pub(crate) fn forwardable(command: &Command) -> bool {
    !matches!(command, Command::Migrate { schema } if *schema > raftbox_storage::format::BASELINE)
}

/// Until the cluster is at this node's format: while this node leads, asks every member
/// for its format each [`CHECK_INTERVAL`] and, once all read it, proposes `Migrate` to it.
pub(crate) async fn raise(id: NodeId, raft: Raft, peers: Peers, proposer: Proposer, format: ClusterFormat) {
    let mut last_wait: Option<Vec<(NodeId, Option<u32>)>> = None;
    loop {
        let current = format.current();
        if current >= format.reads {
            tracing::info!(format = current, "the cluster is at this node's data format");
            return;
        }
        tokio::time::sleep(CHECK_INTERVAL).await;
        let metrics = raft.metrics().borrow().clone();
        if metrics.current_leader != Some(id) {
            continue;
        }
        let gate = format.gate.lock().await;
        let mut behind = Vec::new();
        for member in members_of(&metrics).into_iter().filter(|m| m.id != id) {
            let answer = peer_status(&peers, &member.info.grpc_addr, PROBE_TIMEOUT).await.map(|s| s.format);
            if answer.is_none_or(|reads| reads < format.reads) {
                behind.push((member.id, answer));
            }
        }
        if !behind.is_empty() {
            if last_wait.as_ref() != Some(&behind) {
                let nodes: Vec<String> = behind
                    .iter()
                    .map(|(id, reads)| match reads {
                        Some(reads) => format!("node {id} reads up to format {reads}"),
                        None => format!("node {id} did not answer"),
                    })
                    .collect();
                tracing::info!(
                    cluster = current,
                    this_node = format.reads,
                    waiting_for = %nodes.join(", "),
                    "the cluster stays at its data format until every member reads the new one"
                );
                last_wait = Some(behind);
            }
            continue;
        }
        // Proposed here only: a follower's `Forward` refuses it (`forwardable`), so a raise
        // decided by a leader that lost its place never reaches another leader's log past
        // that leader's gate.
        match proposer.submit(vec![Command::Migrate { schema: format.reads }]).await {
            Ok(_) => tracing::info!(from = current, to = format.reads, "raised the cluster's data format"),
            Err(e) => tracing::debug!(error = %e, "raising the cluster's data format failed; trying again"),
        }
        drop(gate);
    }
}
