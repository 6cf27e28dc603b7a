//! Online membership change, and the guard that keeps a node whose disk was lost from voting.
//!
//! **Adding a node** ([`MembershipChange::Add`]) is three steps on the leader: the node joins
//! as a learner (openraft's `AddNodes`), the leader waits — bounded — until the learner has
//! replicated the log up to where it stood when the wait began, then it becomes a voter
//! (`AddVoterIds`, a joint configuration then the uniform one). When the learner is still
//! catching up at the deadline, the answer says so (`complete: false`) and the same request,
//! repeated, picks up where it stopped. Before the promotion the learner fetches every
//! indexed block it lacks (`FillBlocks`), since blocks travel outside the log. Adding a node that is already a voter with the same
//! addresses changes nothing. **Removing** a node takes it out of the configuration
//! altogether (its voter role and its replication); the last voter cannot be removed. A
//! change asked of a follower is forwarded to the leader (`ChangeMembership` RPC).
//!
//! **A node that lost its disk must not vote.** Raft's safety rests on a voter remembering
//! whom it voted for in each term; a node started on an empty data directory has forgotten
//! that. So a node that starts with no Raft state asks its configured peers whether they
//! belong to an initialized cluster that names it as a voter. If one does, the node was
//! wiped (or started for the first time after the cluster formed without it, which it cannot
//! tell apart): it records the highest log index its peers reported (the *floor*), refuses
//! every vote request and does not stand for election, while still taking replication. It
//! votes again once it sees a membership entry above the floor that makes it a voter — the
//! operator removed it and added it again. The floor is kept in `raft_meta`, so a restart
//! keeps the node silent. Until its start-up probe has answered, a fresh node does not vote
//! either.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use raftbox_storage::{keys, Db};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::network::Peers;
use crate::pb::{FillBlocksRequest, StatusRequest};
use crate::types::{NodeId, NodeInfo, Raft, RaftMetrics};

/// How long one peer's answer to the start-up probe may take.
const REJOIN_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between checks of a learner's progress while it catches up.
const CATCH_UP_POLL: Duration = Duration::from_millis(50);

/// A change of the cluster's membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Join node `id` with these addresses: as a learner, then, caught up, as a voter.
    Add { id: NodeId, info: NodeInfo },
    /// Take node `id` out of the cluster.
    Remove { id: NodeId },
}

/// One member as the cluster's configuration holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub info: NodeInfo,
    /// A voter counts in elections and quorums; a learner only receives the log.
    pub voter: bool,
}

/// What a membership change left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipAnswer {
    /// The configuration after the change (as the leader sees it).
    pub members: Vec<Member>,
    /// `false` when an added node is still a learner catching up: repeat the request to
    /// finish.
    pub complete: bool,
}

/// Why a membership change did not (or not surely) happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MembershipError {
    /// The request contradicts the configuration; nothing changed.
    #[error("{0}")]
    Invalid(String),
    /// No such member; nothing changed.
    #[error("{0}")]
    NotFound(String),
    /// Nothing changed (no leader, another change in progress); the request may be repeated.
    #[error("{0}")]
    Unavailable(String),
    /// The change may or may not have happened; read the members before repeating it.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The node asked is not the leader (forwarding only).
    #[error("not the leader")]
    NotLeader,
}

/// The members of the configuration in `metrics` (a joint configuration counts every voter
/// of either half as a voter).
pub fn members_of(metrics: &RaftMetrics) -> Vec<Member> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership.nodes().map(|(id, info)| Member { id: *id, info: info.clone(), voter: voters.contains(id) }).collect()
}

/// Carries out `change` on this node, which must be the leader, by `deadline`.
pub(crate) async fn change_on_leader(
    raft: &Raft,
    peers: &Peers,
    change: &MembershipChange,
    deadline: Instant,
) -> Result<MembershipAnswer, MembershipError> {
    match change {
        MembershipChange::Add { id, info } => add(raft, peers, *id, info, deadline).await,
        MembershipChange::Remove { id } => remove(raft, *id, deadline).await,
    }
}

async fn add(
    raft: &Raft,
    peers: &Peers,
    id: NodeId,
    info: &NodeInfo,
    deadline: Instant,
) -> Result<MembershipAnswer, MembershipError> {
    let members = members_of(&raft.metrics().borrow());
    match members.iter().find(|m| m.id == id) {
        Some(m) if m.info != *info => {
            return Err(MembershipError::Invalid(format!(
                "node {id} is already a member with other addresses ({}); remove it first",
                m.info
            )));
        }
        Some(m) if m.voter => return Ok(MembershipAnswer { members, complete: true }),
        Some(_) => {}
        None => {
            if let Some(other) =
                members.iter().find(|m| m.info.grpc_addr == info.grpc_addr || m.info.http_addr == info.http_addr)
            {
                return Err(MembershipError::Invalid(format!(
                    "node {} already uses an address of node {id} ({})",
                    other.id, other.info
                )));
            }
            let joined = tokio::time::timeout_at(deadline, raft.add_learner(id, info.clone(), false)).await;
            finished(joined, "adding the learner")?;
            tracing::info!(node = id, %info, "node joined as a learner");
        }
    }
    if !caught_up(raft, id, deadline).await {
        let members = members_of(&raft.metrics().borrow());
        tracing::info!(node = id, "learner still catching up at the deadline; not promoted yet");
        return Ok(MembershipAnswer { members, complete: false });
    }
    if let Err(why) = blocks_filled(raft, peers, id, info, deadline).await {
        let members = members_of(&raft.metrics().borrow());
        tracing::info!(node = id, %why, "learner still filling in blocks; not promoted yet");
        return Ok(MembershipAnswer { members, complete: false });
    }
    let promoted =
        tokio::time::timeout_at(deadline, raft.change_membership(ChangeMembers::AddVoterIds([id].into()), true)).await;
    finished(promoted, "promoting the learner")?;
    tracing::info!(node = id, "node is a voter");
    Ok(MembershipAnswer { members: members_of(&raft.metrics().borrow()), complete: true })
}

async fn remove(raft: &Raft, id: NodeId, deadline: Instant) -> Result<MembershipAnswer, MembershipError> {
    let members = members_of(&raft.metrics().borrow());
    let Some(member) = members.iter().find(|m| m.id == id) else {
        return Err(MembershipError::NotFound(format!("node {id} is not a member")));
    };
    let change = if member.voter {
        if members.iter().filter(|m| m.voter).count() == 1 {
            return Err(MembershipError::Invalid(format!("node {id} is the last voter; a cluster needs one")));
        }
        ChangeMembers::RemoveVoters([id].into())
    } else {
        ChangeMembers::RemoveNodes([id].into())
    };
    let removed = tokio::time::timeout_at(deadline, raft.change_membership(change, false)).await;
    finished(removed, "removing the node")?;
    tracing::info!(node = id, "node removed from the cluster");
    Ok(MembershipAnswer { members: members_of(&raft.metrics().borrow()), complete: true })
}

type ChangeResult<T> = Result<T, RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>>;

/// Maps the result of one openraft membership call: refusals before anything was proposed
/// are `Unavailable`/`Invalid`; a deadline or a lost leadership after proposing is `Unknown`.
fn finished<T>(
    result: Result<ChangeResult<T>, tokio::time::error::Elapsed>,
    step: &str,
) -> Result<(), MembershipError> {
    match result {
        Ok(Ok(_)) => Ok(()),
        Err(_) => Err(MembershipError::Unknown(format!("{step}: no answer before the deadline"))),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => Err(MembershipError::NotLeader),
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => match e {
            ChangeMembershipError::InProgress(e) => {
                Err(MembershipError::Unavailable(format!("{step}: another membership change is in progress: {e}")))
            }
            ChangeMembershipError::EmptyMembership(e) => Err(MembershipError::Invalid(format!("{step}: {e}"))),
            ChangeMembershipError::LearnerNotFound(e) => Err(MembershipError::Invalid(format!("{step}: {e}"))),
        },
        Ok(Err(RaftError::Fatal(e))) => Err(MembershipError::Unknown(format!("{step}: {e}"))),
    }
}

/// Waits until the leader has replicated to learner `id` everything it had when the wait
/// began; `false` at the deadline or when this node stops leading.
async fn caught_up(raft: &Raft, id: NodeId, deadline: Instant) -> bool {
    let target = raft.metrics().borrow().last_log_index.unwrap_or(0);
    loop {
        let matched = {
            let metrics = raft.metrics().borrow().clone();
            match &metrics.replication {
                None => return false,
                Some(replication) => replication.get(&id).and_then(|log_id| log_id.map(|l| l.index)),
            }
        };
        if matched.is_some_and(|index| index >= target) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(CATCH_UP_POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// Has learner `id` fetch every indexed block it lacks before it is promoted: blocks travel
/// outside the log, and a voter that lacks them would count toward a majority that may no
/// longer hold them (two replacements in a row could lose the last copy). Blocks no member
/// holds are logged by the learner and do not hold the promotion back; a learner of an older
/// version, without the call, is promoted as before. `Err` says why it is not done yet.
async fn blocks_filled(
    raft: &Raft,
    peers: &Peers,
    id: NodeId,
    info: &NodeInfo,
    deadline: Instant,
) -> Result<(), String> {
    let applied_index = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
    let mut client = peers.client(&info.grpc_addr).map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(FillBlocksRequest { applied_index });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let report = match tokio::time::timeout_at(deadline, client.fill_blocks(request)).await {
        Err(_) => return Err("no answer before the deadline".into()),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            tracing::warn!(node = id, "the learner cannot fill in blocks (an older version); promoting it anyway");
            return Ok(());
        }
        Ok(Err(status)) => return Err(status.to_string()),
        Ok(Ok(reply)) => reply.into_inner(),
    };
    tracing::info!(
        node = id,
        fetched = report.fetched,
        unavailable = report.unavailable,
        failed = report.failed,
        "learner filled in blocks"
    );
    if report.failed > 0 {
        return Err(format!("{} blocks could not be fetched yet", report.failed));
    }
    Ok(())
}

/// Whether this node may vote (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteRight {
    /// An ordinary member: votes and stands for election.
    Votes,
    /// Started on an empty data directory; the start-up probe has not answered yet.
    Checking,
    /// Lost its data: silent until a membership entry above `floor` makes it a voter.
    AwaitingReadd { floor: u64 },
}

impl VoteRight {
    pub fn may_vote(self) -> bool {
        self == VoteRight::Votes
    }
}

/// Reads the persisted vote right at start-up: `AwaitingReadd` if a floor is recorded,
/// `Checking` if the node has no Raft state at all, `Votes` otherwise.
pub(crate) fn initial_vote_right(db: &Db) -> Result<VoteRight, raftbox_storage::StorageError> {
    if let Some(floor) = db.meta_get(keys::meta::REJOIN_FLOOR)?.and_then(|raw| <[u8; 8]>::try_from(raw).ok()) {
        return Ok(VoteRight::AwaitingReadd { floor: u64::from_be_bytes(floor) });
    }
    let fresh = db.meta_get(keys::meta::VOTE)?.is_none()
        && db.log_last()?.is_none()
        && db.meta_get(keys::meta::SNAPSHOT)?.is_none();
    Ok(if fresh { VoteRight::Checking } else { VoteRight::Votes })
}

/// What one peer said about its cluster at start-up.
struct PeerView {
    initialized: bool,
    voters: Vec<NodeId>,
    last_log_index: u64,
}

async fn probe(peers: &Peers, addr: &str) -> Option<PeerView> {
    let mut client = peers.client(addr).ok()?;
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(REJOIN_PROBE_TIMEOUT);
    let reply = tokio::time::timeout(REJOIN_PROBE_TIMEOUT, client.status(request)).await.ok()?.ok()?.into_inner();
    Some(PeerView { initialized: reply.initialized, voters: reply.voter_ids, last_log_index: reply.last_log_index })
}

/// Settles a fresh node's vote right by asking its configured peers (once, bounded), and
/// records a floor when the cluster already counts this node as a voter.
pub(crate) async fn settle_fresh_node(
    id: NodeId,
    db: &Db,
    peers: &Peers,
    addrs: Vec<String>,
    right: &watch::Sender<VoteRight>,
) -> Result<(), raftbox_storage::StorageError> {
    let views = futures::future::join_all(addrs.iter().map(|addr| probe(peers, addr))).await;
    let naming_us: Vec<&PeerView> =
        views.iter().flatten().filter(|v| v.initialized && v.voters.contains(&id)).collect();
    if naming_us.is_empty() {
        right.send_replace(VoteRight::Votes);
        return Ok(());
    }
    let floor = naming_us.iter().map(|v| v.last_log_index).max().unwrap_or(0);
    db.meta_put(keys::meta::REJOIN_FLOOR, &floor.to_be_bytes(), true)?;
    tracing::warn!(
        node = id,
        floor,
        "this node's data directory is empty but the cluster counts it as a voter: it has lost its \
         votes, so it will not vote until it is removed and added again \
         (raftbox cluster remove {id}; raftbox cluster add {id} HTTP_ADDR GRPC_ADDR)"
    );
    right.send_replace(VoteRight::AwaitingReadd { floor });
    Ok(())
}

/// While the node awaits being added again, watches the membership: a configuration above
/// the floor that makes this node a voter restores its vote (and clears the stored floor).
pub(crate) async fn watch_readd(id: NodeId, raft: Raft, db: Db, right: watch::Sender<VoteRight>) {
    let mut metrics = raft.metrics();
    loop {
        let VoteRight::AwaitingReadd { floor } = *right.borrow() else {
            return;
        };
        let readded = {
            let m = metrics.borrow_and_update();
            let index = m.membership_config.log_id().map_or(0, |l| l.index);
            index > floor && m.membership_config.membership().voter_ids().any(|v| v == id)
        };
        if readded {
            match db.meta_put(keys::meta::REJOIN_FLOOR, &[], true) {
                Ok(()) => {
                    tracing::info!(node = id, "added to the cluster again; this node votes again");
                    right.send_replace(VoteRight::Votes);
                }
                Err(e) => tracing::error!(error = %e, "could not clear the rejoin floor; still not voting"),
            }
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
