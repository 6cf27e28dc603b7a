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
//! whom it voted for in each term, and the entries it acknowledged; a node started on an
//! empty data directory has forgotten both. So every data directory takes an *incarnation*
//! (a random id, written durably before the node first answers anyone), and the membership
//! records, for each member, the incarnation it joined with: the bootstrapping node reads
//! each member's before initializing, and the leader reads a node's before adding it. A
//! node votes and stands for election only while the configuration it holds counts its id
//! as a voter *with its own incarnation* ([`vote_right`]). So:
//! - a fresh member of a new cluster votes as soon as it holds the initial configuration,
//!   which the bootstrapping node hands every member before initializing itself
//!   (`Initialize`); nothing depends on which node answers first;
//! - a wiped node takes a new incarnation and never matches its record: it takes
//!   replication but stays silent until the operator removes it and adds it again (the new
//!   record names the new incarnation, written above every entry it must hold);
//! - a fresh node that reaches no one holds no configuration and does not vote.
//! A data directory from a version without incarnations takes one at its first start and
//! is trusted for records that name none (unless the earlier guard had found it wiped).
//! ARCHITECTURE.md ("Membership identity") gives the argument.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use raftbox_storage::{keys, Db};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::format::ClusterFormat;
use crate::network::Peers;
use crate::pb::{FillBlocksRequest, StatusRequest};
use crate::types::{NodeId, NodeInfo, Raft, RaftMetrics};

/// How long a node asked for its incarnation (to be added) may take to answer.
const IDENTITY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between checks of a learner's progress while it catches up.
const CATCH_UP_POLL: Duration = Duration::from_millis(50);
/// How long one `FillBlocks` call may fill before it reports where it got.
const FILL_STEP: Duration = Duration::from_secs(5);
/// What a fill call's answer may take beyond its budget (the blocks in flight, the reply);
/// at most half of what is left of the request's deadline.
const FILL_REPLY_MARGIN: Duration = Duration::from_secs(2);
/// How long the leader keeps where a member's fill got, for the next request to go on from.
/// Bounded so a position outlives no lost block file by long; the argument for keeping it
/// at all is in [`FillProgress`].
const FILL_PROGRESS_KEPT: Duration = Duration::from_secs(600);

/// Where each member's fill of blocks got, kept by the leader across membership requests,
/// so a removal or promotion needing a fill longer than one request's deadline is reached
/// by repeating the request (each answers 202 meanwhile), never stuck starting over. A
/// position is keyed by the member, its incarnation and the configuration's log id, and
/// kept [`FILL_PROGRESS_KEPT`]. Why skipping what a position passed is safe: every block
/// registered since it was passed was placed on a majority of that same configuration's
/// voters (`RegisterChunk` is fenced on it), which is what the removal's argument needs of a
/// block registered after its fill (ARCHITECTURE.md, "Blocks across member changes"); a
/// new configuration starts every position over.
#[derive(Debug, Default)]
pub(crate) struct FillProgress {
    at: std::sync::Mutex<std::collections::BTreeMap<FillKey, (Position, Instant)>>,
}

type FillKey = (NodeId, Option<String>, Option<crate::types::LogId>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Every entry after this hash is still to be filled.
    After(raftbox_storage::blocks::BlockHash),
    Done,
}

impl FillProgress {
    fn get(&self, key: &FillKey) -> Option<Position> {
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        at.retain(|_, (_, saved)| saved.elapsed() < FILL_PROGRESS_KEPT);
        at.get(key).map(|(position, _)| *position)
    }

    fn set(&self, key: FillKey, position: Position) {
        self.at.lock().unwrap_or_else(|e| e.into_inner()).insert(key, (position, Instant::now()));
    }
}

/// Whether the node at `info`'s address still runs the data directory its record names.
async fn still_the_directory(peers: &Peers, info: &NodeInfo) -> bool {
    let status = peer_status(peers, &info.grpc_addr, IDENTITY_PROBE_TIMEOUT).await;
    status.is_some_and(|status| info.incarnation.as_deref() == Some(status.incarnation.as_str()))
}

/// Why a member's fill is not done.
#[derive(Debug)]
enum FillStop {
    /// It is progressing and the deadline came first: a repeat goes on from where it got.
    Unfinished(String),
    /// It failed (down, refused, a block it could not fetch, an older version).
    Failed(String),
}

impl std::fmt::Display for FillStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FillStop::Unfinished(why) | FillStop::Failed(why) => f.write_str(why),
        }
    }
}

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
pub(crate) fn members_of(metrics: &RaftMetrics) -> Vec<Member> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership.nodes().map(|(id, info)| Member { id: *id, info: info.clone(), voter: voters.contains(id) }).collect()
}

/// Carries out `change` on this node, which must be the leader, by `deadline`.
///
/// An addition refuses a node of another cluster (`cluster_id` is this one's), and holds
/// `format_gate` throughout, as the raising of the cluster's format does
/// (`crate::format`), so the format never rises past what a node being added reads.
pub(crate) async fn change_on_leader(
    raft: &Raft,
    peers: &Peers,
    progress: &FillProgress,
    (cluster_format, cluster_id): (&ClusterFormat, Option<&str>),
    change: &MembershipChange,
    deadline: Instant,
) -> Result<MembershipAnswer, MembershipError> {
    match change {
        MembershipChange::Add { id, info } => {
            let _gate = tokio::time::timeout_at(deadline, cluster_format.gate.lock())
                .await
                .map_err(|_| MembershipError::Unavailable("the cluster's format is being raised; try again".into()))?;
            // A raise proposed here and not yet answered (its write timed out) is in this
            // leader's log: applied first, so the format read below includes it.
            if !applied_own_log(raft, deadline).await {
                return Err(MembershipError::Unavailable(
                    "the leader has entries it has not applied yet; try again".into(),
                ));
            }
            add(raft, peers, progress, cluster_format, cluster_id, *id, info, deadline).await
        }
        MembershipChange::Remove { id } => {
            // Serialized with additions (and other removals): the fill below is judged on
            // the voters of one configuration, which must still be the one the removal
            // changes.
            let _gate = tokio::time::timeout_at(deadline, cluster_format.gate.lock())
                .await
                .map_err(|_| MembershipError::Unavailable("another membership change is running; try again".into()))?;
            remove(raft, peers, progress, *id, deadline).await
        }
    }
}

/// Why a node whose status is `status` may not join cluster `ours`, if it may not: it has
/// another cluster's id, or holds data (a log, a configuration) under another id or none —
/// a machine restarted on its directory from before a recovery or restore, or a member of
/// another cluster. Only an empty directory, or one of this cluster rejoining, is added.
fn another_cluster(ours: Option<&str>, status: &PeerStatus) -> Option<String> {
    if ours.is_some() && !status.knows_cluster_ids {
        // Its calls would carry no id, and every member would refuse them.
        return Some("runs a release without cluster ids: upgrade it before adding it".to_owned());
    }
    let ours = ours.unwrap_or_default();
    if status.cluster_id == ours {
        return None;
    }
    let holds_data = status.initialized || status.last_log_index > 0;
    let named = |id: &str| if id.is_empty() { "no cluster id".to_owned() } else { format!("cluster id {id}") };
    if !status.cluster_id.is_empty() {
        return Some(format!(
            "belongs to another cluster ({}; this one has {}): wipe its data directory to add it",
            named(&status.cluster_id),
            named(ours)
        ));
    }
    holds_data.then(|| {
        format!(
            "holds the data of another cluster (a log, and {}; this one has {}): a machine restarted on its \
             directory from before a recovery or restore; wipe its data directory to add it",
            named(&status.cluster_id),
            named(ours)
        )
    })
}

/// What adding member `m` again comes to, its node now running `status`.
#[derive(Debug, PartialEq, Eq)]
enum Rejoin {
    /// A voter rejoining with its own data: nothing to do.
    AlreadyVoter,
    /// A learner: caught up and filled, then promoted.
    Promote,
}

/// Judges an addition of existing member `m` whose node now runs `status`: refused when the
/// node lost the data its record names (another incarnation; or, for a voter recorded before
/// incarnations, an empty directory, which would never vote again: `vote_right`).
fn rejoining(m: &Member, status: &PeerStatus) -> Result<Rejoin, MembershipError> {
    let id = m.id;
    match &m.info.incarnation {
        Some(recorded) if *recorded != status.incarnation => Err(MembershipError::Invalid(format!(
            "node {id} is a member with another data directory (incarnation {recorded}; it now runs {}): it lost \
             its data; remove it first, then add it again",
            status.incarnation
        ))),
        None if m.voter && !(status.initialized || status.last_log_index > 0) => {
            Err(MembershipError::Invalid(format!(
                "node {id} is a voter whose record names no data directory (it joined before incarnations), and \
                 it now runs an empty one ({}): it lost its data; remove it first, then add it again",
                status.incarnation
            )))
        }
        _ if m.voter => Ok(Rejoin::AlreadyVoter),
        _ => Ok(Rejoin::Promote),
    }
}

#[allow(clippy::too_many_arguments)]
async fn add(
    raft: &Raft,
    peers: &Peers,
    progress: &FillProgress,
    cluster_format: &ClusterFormat,
    cluster_id: Option<&str>,
    id: NodeId,
    info: &NodeInfo,
    deadline: Instant,
) -> Result<MembershipAnswer, MembershipError> {
    let members = members_of(&raft.metrics().borrow());
    let existing = members.iter().find(|m| m.id == id);
    match existing {
        Some(m) if !m.info.same_addresses(info) => {
            return Err(MembershipError::Invalid(format!(
                "node {id} is already a member with other addresses ({}); remove it first",
                m.info
            )));
        }
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
        }
    }
    // The incarnation the node's record names: its data directory's, read from it now.
    let Some(status) = peer_status(peers, &info.grpc_addr, IDENTITY_PROBE_TIMEOUT).await else {
        return Err(MembershipError::Unavailable(format!(
            "node {id} did not answer at {} (it must be running to be added)",
            info.grpc_addr
        )));
    };
    if status.incarnation.is_empty() {
        return Err(MembershipError::Invalid(format!(
            "node {id} runs a version without incarnations: upgrade it before adding it"
        )));
    }
    if let Some(why) = another_cluster(cluster_id, &status) {
        return Err(MembershipError::Invalid(format!("node {id} {why}")));
    }
    let format = cluster_format.current();
    if status.format < format {
        return Err(MembershipError::Invalid(format!(
            "node {id} reads data formats up to {}, but the cluster is at format {format}: run the same raftbox \
             on it as on the other nodes (docs/operations.md, \"Upgrading\")",
            status.format
        )));
    }
    let info = &NodeInfo { incarnation: Some(status.incarnation.clone()), ..info.clone() };
    match existing {
        Some(m) => match rejoining(m, &status)? {
            Rejoin::AlreadyVoter => return Ok(MembershipAnswer { members, complete: true }),
            Rejoin::Promote => {}
        },
        None => {
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
    if let Err(why) = blocks_filled(raft, peers, progress, id, info, deadline).await {
        let members = members_of(&raft.metrics().borrow());
        tracing::info!(node = id, %why, "learner still filling in blocks; not promoted yet");
        return Ok(MembershipAnswer { members, complete: false });
    }
    // Checked again: a leader before this one may have raised the format meanwhile.
    let format = cluster_format.current();
    match peer_status(peers, &info.grpc_addr, IDENTITY_PROBE_TIMEOUT).await {
        Some(status) if status.format >= format => {}
        _ => {
            // Not left in the configuration, where it would be sent entries it cannot read.
            let removed = tokio::time::timeout_at(
                deadline,
                raft.change_membership(ChangeMembers::RemoveNodes([id].into()), false),
            )
            .await;
            let outcome = match finished(removed, "removing the learner") {
                Ok(()) => "it was removed again".to_owned(),
                Err(e) => format!("removing it again failed ({e}): remove it with `raftbox cluster remove {id}`"),
            };
            return Err(MembershipError::Invalid(format!(
                "node {id} did not confirm that it reads the cluster's data format {format}; {outcome}; upgrade it \
                 and add it again"
            )));
        }
    }
    let promoted =
        tokio::time::timeout_at(deadline, raft.change_membership(ChangeMembers::AddVoterIds([id].into()), true)).await;
    finished(promoted, "promoting the learner")?;
    tracing::info!(node = id, "node is a voter");
    Ok(MembershipAnswer { members: members_of(&raft.metrics().borrow()), complete: true })
}

async fn remove(
    raft: &Raft,
    peers: &Peers,
    progress: &FillProgress,
    id: NodeId,
    deadline: Instant,
) -> Result<MembershipAnswer, MembershipError> {
    let members = members_of(&raft.metrics().borrow());
    let Some(member) = members.iter().find(|m| m.id == id) else {
        return Err(MembershipError::NotFound(format!("node {id} is not a member")));
    };
    let change = if member.voter {
        if members.iter().filter(|m| m.voter).count() == 1 {
            return Err(MembershipError::Invalid(format!("node {id} is the last voter; a cluster needs one")));
        }
        let config = raft.metrics().borrow().membership_config.log_id().clone();
        match blocks_on_remaining_majority(raft, peers, progress, &members, id, deadline).await {
            Ok(()) => {}
            // Progressing: the caller repeats the request, which goes on from here.
            Err(FillStop::Unfinished(why)) => {
                tracing::info!(node = id, %why, "blocks still being filled in before the removal");
                return Ok(MembershipAnswer { members, complete: false });
            }
            Err(FillStop::Failed(why)) => {
                return Err(MembershipError::Unavailable(format!("node {id} not removed yet: {why}")));
            }
        }
        // The voters filled must be the ones the removal leaves (a change by a leader before
        // this one may have landed meanwhile).
        if raft.metrics().borrow().membership_config.log_id() != &config {
            return Err(MembershipError::Unavailable(format!(
                "node {id} not removed yet: the members changed while blocks were filled in; try again"
            )));
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
        // Possibly appended (see `proposer::propose`): the caller repeats the change through
        // the new leader, which is safe because an addition or removal already made answers
        // as done.
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

/// Waits until this node has applied every entry its log held when the wait began; `false`
/// at the deadline.
async fn applied_own_log(raft: &Raft, deadline: Instant) -> bool {
    let mut metrics = raft.metrics();
    let target = metrics.borrow().last_log_index.unwrap_or(0);
    loop {
        if metrics.borrow().last_applied.map_or(0, |id| id.index) >= target {
            return true;
        }
        if !matches!(tokio::time::timeout_at(deadline, metrics.changed()).await, Ok(Ok(()))) {
            return false;
        }
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
    progress: &FillProgress,
    id: NodeId,
    info: &NodeInfo,
    deadline: Instant,
) -> Result<(), FillStop> {
    let (applied_index, config) = {
        let metrics = raft.metrics().borrow().clone();
        (metrics.last_applied.map_or(0, |l| l.index), *metrics.membership_config.log_id())
    };
    fill_on(peers, progress, (id, info, config), applied_index, deadline, Older::CountsAsFilled).await
}

/// How [`fill_on`] counts a node of a version without `FillBlocks`.
#[derive(Clone, Copy)]
enum Older {
    /// As before the call existed (a learner is promoted).
    CountsAsFilled,
    /// As not filled (a removal must know the blocks are there): upgrade it first.
    NotFilled,
}

/// Before voter `removed` goes: has a majority of the voters that remain fetch every indexed
/// block they lack (this node included, through its own address). A block is durable on a
/// majority of the voters when it registers (`RegisterChunk` is fenced on the configuration
/// it was placed in); without this, removing one of its holders could leave it on fewer than
/// every majority of the rest meets. `Err` says which voters did not finish.
async fn blocks_on_remaining_majority(
    raft: &Raft,
    peers: &Peers,
    progress: &FillProgress,
    members: &[Member],
    removed: NodeId,
    deadline: Instant,
) -> Result<(), FillStop> {
    let (applied_index, config) = {
        let metrics = raft.metrics().borrow().clone();
        (metrics.last_applied.map_or(0, |l| l.index), *metrics.membership_config.log_id())
    };
    let remaining: Vec<&Member> = members.iter().filter(|m| m.voter && m.id != removed).collect();
    let fills = remaining.iter().map(|m| async move {
        (m.id, fill_on(peers, progress, (m.id, &m.info, config), applied_index, deadline, Older::NotFilled).await)
    });
    let results = futures::future::join_all(fills).await;
    let filled = results.iter().filter(|(_, result)| result.is_ok()).count();
    if filled > remaining.len() / 2 {
        return Ok(());
    }
    let unfinished = results.iter().filter(|(_, result)| matches!(result, Err(FillStop::Unfinished(_)))).count();
    let why: Vec<String> =
        results.into_iter().filter_map(|(id, result)| result.err().map(|e| format!("node {id}: {e}"))).collect();
    let why = format!(
        "only {filled} of the {} remaining voters hold every block, and a majority must ({})",
        remaining.len(),
        why.join("; ")
    );
    // Still reachable by repeating only while those progressing could make the majority.
    if filled + unfinished > remaining.len() / 2 {
        Err(FillStop::Unfinished(why))
    } else {
        Err(FillStop::Failed(why))
    }
}

/// Has member `id` fetch every block the chunk index names as of `applied_index` that it
/// lacks (`FillBlocks`), in calls of at most [`FILL_STEP`], going on from where an earlier
/// request got ([`FillProgress`]); `Err` says why it is not done yet.
async fn fill_on(
    peers: &Peers,
    progress: &FillProgress,
    (id, info, config): (NodeId, &NodeInfo, Option<crate::types::LogId>),
    applied_index: u64,
    deadline: Instant,
    older: Older,
) -> Result<(), FillStop> {
    let key = (id, info.incarnation.clone(), config);
    let mut after = match progress.get(&key) {
        // Trusted only while the directory answering is the one the position was made on
        // (a node wiped and restarted since holds none of what it fetched).
        Some(position) if still_the_directory(peers, info).await => match position {
            Position::Done => return Ok(()),
            Position::After(hash) => Some(hash),
        },
        _ => None,
    };
    let mut client = peers.client(&info.grpc_addr).map_err(|e| FillStop::Failed(e.to_string()))?;
    let mut total = crate::blocks::FillReport::default();
    let mut answered = false;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let left = remaining.saturating_sub(FILL_REPLY_MARGIN.min(remaining / 2));
        if left.is_zero() {
            return Err(if answered {
                FillStop::Unfinished(format!(
                    "still filling in blocks ({} fetched so far this request); repeat to go on",
                    total.fetched
                ))
            } else {
                FillStop::Failed("no time was left to ask for a fill".into())
            });
        }
        let budget = FILL_STEP.min(left);
        let mut request = tonic::Request::new(FillBlocksRequest {
            applied_index,
            after: after.map(|hash| hash.0.to_vec()).unwrap_or_default(),
            budget_ms: budget.as_millis() as u64,
        });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let answer = tokio::time::timeout_at(deadline, client.fill_blocks(request)).await;
        let timed_out =
            |status: &tonic::Status| matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled);
        let answer = match answer {
            Ok(Err(status)) if timed_out(&status) => Err(status),
            Ok(other) => Ok(other),
            Err(elapsed) => Err(tonic::Status::deadline_exceeded(elapsed.to_string())),
        };
        let reply = match answer {
            // Unfinished only if it answered this request before: a node that never answers
            // is not progressing.
            Err(_) if answered => {
                return Err(FillStop::Unfinished("no answer before the deadline; repeat to go on".into()))
            }
            Err(_) => return Err(FillStop::Failed("no answer before the deadline".into())),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                return match older {
                    Older::CountsAsFilled => {
                        tracing::warn!(
                            node = id,
                            "the node cannot fill in blocks (an older version); counted as filled"
                        );
                        Ok(())
                    }
                    Older::NotFilled => {
                        Err(FillStop::Failed("it runs a version that cannot fill in blocks: upgrade it first".into()))
                    }
                };
            }
            Ok(Err(status)) => return Err(FillStop::Failed(status.message().to_owned())),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        answered = true;
        total.add(crate::blocks::FillReport {
            fetched: reply.fetched,
            unavailable: reply.unavailable,
            failed: reply.failed,
        });
        if reply.failed > 0 {
            // Not kept past a block it could not fetch: the next request tries it again.
            return Err(FillStop::Failed(format!("{} blocks could not be fetched yet", reply.failed)));
        }
        if !reply.more {
            tracing::info!(node = id, ?total, "node filled in blocks");
            progress.set(key, Position::Done);
            return Ok(());
        }
        if reply.next.is_empty() {
            // The budget ran out before any entry was handled (the node was still applying):
            // ask again from the same place.
            continue;
        }
        let next: [u8; 32] = reply
            .next
            .as_slice()
            .try_into()
            .map_err(|_| FillStop::Failed("the node's fill named no valid position to go on from".into()))?;
        after = Some(raftbox_storage::blocks::BlockHash(next));
        progress.set(key.clone(), Position::After(raftbox_storage::blocks::BlockHash(next)));
    }
}

/// Whether this node may vote (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteRight {
    /// The configuration counts this node, with this data directory's incarnation, as a
    /// voter: it votes and stands for election.
    Votes,
    /// No configuration this node holds counts it as a voter (a fresh node that has not
    /// received one yet, a learner, a removed node): it does not vote.
    NotVoter,
    /// The configuration counts this node id as a voter with another incarnation: the data
    /// directory that voted is gone. Silent until removed and added again.
    LostData,
}

impl VoteRight {
    pub fn may_vote(self) -> bool {
        self == VoteRight::Votes
    }
}

/// This data directory's identity (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub incarnation: String,
    /// The directory held Raft state from a version without incarnations when it took this
    /// one: a membership record naming no incarnation is taken as its own.
    pub legacy: bool,
}

/// Reads this data directory's incarnation, or takes one (durably, before the node speaks
/// to anyone) on its first start.
pub(crate) fn load_identity(db: &Db) -> Result<Identity, raftbox_storage::StorageError> {
    let legacy = db.meta_get(keys::meta::INCARNATION_LEGACY)?.is_some();
    if let Some(raw) = db.meta_get(keys::meta::INCARNATION)? {
        return Ok(Identity { incarnation: String::from_utf8_lossy(&raw).into_owned(), legacy });
    }
    let has_state = crate::cluster_id::holds_state(db)?;
    // A floor set by the earlier guard: the directory was found wiped, so it is not trusted.
    let floored = db.meta_get(keys::meta::REJOIN_FLOOR)?.is_some_and(|raw| !raw.is_empty());
    let legacy = has_state && !floored;
    let incarnation = uuid::Uuid::new_v4().simple().to_string();
    if legacy {
        db.meta_put(keys::meta::INCARNATION_LEGACY, b"1", false)?;
    }
    db.meta_put(keys::meta::INCARNATION, incarnation.as_bytes(), true)?;
    tracing::info!(%incarnation, legacy, "this data directory took its incarnation");
    Ok(Identity { incarnation, legacy })
}

/// The vote right of node `id` with `identity` under `membership`.
pub fn vote_right(membership: &openraft::Membership<NodeId, NodeInfo>, id: NodeId, identity: &Identity) -> VoteRight {
    if !membership.voter_ids().any(|v| v == id) {
        return VoteRight::NotVoter;
    }
    let recorded = membership.get_node(&id).and_then(|info| info.incarnation.as_deref());
    match recorded {
        Some(incarnation) if incarnation == identity.incarnation => VoteRight::Votes,
        None if identity.legacy => VoteRight::Votes,
        _ => VoteRight::LostData,
    }
}

/// Keeps this node's vote right in step with the configuration it holds (openraft's
/// effective membership, appended or installed), for as long as the node runs.
pub(crate) async fn watch_vote_right(id: NodeId, identity: Identity, raft: Raft, right: watch::Sender<VoteRight>) {
    let mut metrics = raft.metrics();
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            vote_right(m.membership_config.membership(), id, &identity)
        };
        let was = right.send_replace(now);
        if was != now {
            match now {
                VoteRight::Votes => {
                    tracing::info!(node = id, "the configuration counts this node as a voter; it votes")
                }
                VoteRight::NotVoter => tracing::info!(node = id, "this node is not a voter of its configuration"),
                VoteRight::LostData => tracing::warn!(
                    node = id,
                    incarnation = %identity.incarnation,
                    "the cluster counts node {id} as a voter with another data directory: this one lost \
                     the votes that one cast, so it will not vote until it is removed and added again \
                     (raftbox cluster remove {id}; raftbox cluster add {id} HTTP_ADDR GRPC_ADDR)"
                ),
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// What a peer said about itself.
#[derive(Debug, Clone)]
pub(crate) struct PeerStatus {
    pub initialized: bool,
    pub last_log_index: u64,
    pub incarnation: String,
    /// The newest data format it reads (2 for a node too old to say).
    pub format: u32,
    /// The cluster it belongs to; empty if none ([`crate::cluster_id`]).
    pub cluster_id: String,
    /// It runs a release that carries and checks cluster ids.
    pub knows_cluster_ids: bool,
}

/// The format of a node that does not report one: the last before reports began.
const FORMAT_BEFORE_REPORTS: u32 = 2;

/// Asks the node at `addr` for its status, within `timeout`; `None` if it did not answer.
pub(crate) async fn peer_status(peers: &Peers, addr: &str, timeout: Duration) -> Option<PeerStatus> {
    let mut client = peers.client(addr).ok()?;
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(timeout);
    let reply = tokio::time::timeout(timeout, client.status(request)).await.ok()?.ok()?.into_inner();
    Some(PeerStatus {
        initialized: reply.initialized,
        last_log_index: reply.last_log_index,
        incarnation: reply.incarnation,
        format: if reply.format == 0 { FORMAT_BEFORE_REPORTS } else { reply.format },
        cluster_id: reply.cluster_id,
        knows_cluster_ids: reply.knows_cluster_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(voter: bool, incarnation: Option<&str>) -> Member {
        let mut info = NodeInfo::new("127.0.0.1:1", "127.0.0.1:2");
        info.incarnation = incarnation.map(str::to_owned);
        Member { id: 2, info, voter }
    }

    fn running(incarnation: &str, holds_data: bool) -> PeerStatus {
        PeerStatus {
            initialized: holds_data,
            last_log_index: if holds_data { 40 } else { 0 },
            incarnation: incarnation.to_owned(),
            format: FORMAT_BEFORE_REPORTS,
            cluster_id: String::new(),
            knows_cluster_ids: true,
        }
    }

    fn refused(verdict: Result<Rejoin, MembershipError>) -> bool {
        matches!(verdict, Err(MembershipError::Invalid(why)) if why.contains("lost its data"))
    }

    /// Issue 35 item 7: re-adding a voter recorded before incarnations whose machine now runs
    /// an empty directory answered "complete" and changed nothing; the node never voted again.
    #[test]
    fn a_voter_recorded_before_incarnations_that_lost_its_data_is_refused() {
        assert!(refused(rejoining(&member(true, None), &running("fresh", false))));
        // Holding data, it is the member it was.
        assert_eq!(rejoining(&member(true, None), &running("old", true)).ok(), Some(Rejoin::AlreadyVoter));
        // A learner is caught up and promoted either way.
        assert_eq!(rejoining(&member(false, None), &running("fresh", false)).ok(), Some(Rejoin::Promote));
    }

    #[test]
    fn a_member_running_another_directory_than_its_record_names_is_refused() {
        assert!(refused(rejoining(&member(true, Some("a")), &running("b", true))));
        assert!(refused(rejoining(&member(false, Some("a")), &running("b", false))));
        assert_eq!(rejoining(&member(true, Some("a")), &running("a", true)).ok(), Some(Rejoin::AlreadyVoter));
        assert_eq!(rejoining(&member(false, Some("a")), &running("a", true)).ok(), Some(Rejoin::Promote));
    }
}
