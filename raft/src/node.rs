//! A running Raft node: openraft over the node's stores, its proposer, and the calls the
//! rest of the node makes (write, linearizable read barrier, bootstrap, status).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};
use raftbox_storage::blocks::{BlockHash, BlockStore};
use raftbox_storage::{Command, Db, Outcome, StateMachine};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::blocks::Blocks;
use crate::boot_clock::BootInstant;
use crate::clock::{watch_clock, ClockHealth};
use crate::cluster_id::ClusterId;
use crate::disk::DiskHealth;
use crate::error::{StartError, WriteError};
use crate::format::ClusterFormat;
use crate::lease::{lease_for, Promises};
use crate::limiter::{Limiter, LimiterContext};
use crate::log_cache::LogCache;
use crate::log_store::LogStore;
use crate::membership::{self, Member, MembershipAnswer, MembershipChange, MembershipError, VoteRight};
use crate::metrics::NodeMetrics;
use crate::network::{NetworkFactory, Peers};
use crate::pb::read_index_reply::Result as ReadIndexResult;
use crate::pb::ReadIndexRequest;
use crate::proposer::{wait_for_leader, Proposer, ProposerContext};
use crate::read_rounds::{self, ReadRounds, Waiting};
use crate::secret::ClusterSecret;
use crate::state_machine::{Applied, StateMachineStore};
use crate::status::{AppliedIndex, Status};
use crate::tls::NodeTls;
use crate::types::{NodeId, NodeInfo, Raft, RaftMetrics};

/// How long a learner asked to fill its blocks waits to apply as far as the leader had.
const FILL_APPLY_WAIT: Duration = Duration::from_secs(10);
/// Chunk-index entries read at a time while filling blocks.
const FILL_ROUND_CHUNKS: usize = 10_000;

/// Raft timing and log-compaction settings of a node.
#[derive(Debug, Clone)]
pub struct RaftSettings {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries were applied since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log behind a snapshot (for followers that are a little behind).
    pub logs_to_keep: u64,
    /// How long a write or read barrier may wait for a leader and a quorum.
    pub write_timeout_ms: u64,
    /// How long a bootstrapping node waits for its peers to come up before initializing
    /// anyway.
    pub bootstrap_wait_ms: u64,
    /// Largest tolerated offset of this node's clock from the other members', in ms; beyond
    /// it the node does not lead (see [`crate::clock`]).
    pub max_clock_offset_ms: u64,
    /// How long a membership change may take, a learner's catch-up included.
    pub membership_timeout_ms: u64,
    /// Free space below which the data directory's disk counts as full (see
    /// [`crate::disk`]).
    pub min_free_disk_bytes: u64,
    /// The newest data format this node says it reads ([`raftbox_storage::format::FORMAT`];
    /// lower only where a test stands in for a node of an older release).
    pub reads_format: u32,
}

impl Default for RaftSettings {
    fn default() -> RaftSettings {
        RaftSettings {
            heartbeat_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            snapshot_logs_since_last: 10_000,
            logs_to_keep: 1_000,
            write_timeout_ms: 5_000,
            bootstrap_wait_ms: 10_000,
            max_clock_offset_ms: 500,
            membership_timeout_ms: 30_000,
            min_free_disk_bytes: 64 << 20,
            reads_format: raftbox_storage::format::FORMAT,
        }
    }
}

/// How long a member handed the initial configuration waits for a clock check counting
/// those members to confirm its clock before answering "not yet".
const INITIALIZE_CLOCK_WAIT: Duration = Duration::from_secs(3);

/// Why a member did not take the initial configuration.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Initialize {
    /// It holds another configuration, or another incarnation: the bootstrap stops.
    Refused(String),
    /// Not now (no answer, clock not confirmed yet): ask again.
    NotYet(String),
}

impl std::fmt::Display for Initialize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Initialize::Refused(why) => write!(f, "refused: {why}"),
            Initialize::NotYet(why) => write!(f, "not yet: {why}"),
        }
    }
}

/// How long a bootstrapping node waits for each peer's status answer.
const BOOTSTRAP_PROBE_TIMEOUT_MS: u64 = 1_000;
/// Pause between rounds of peer probes while bootstrapping.
const BOOTSTRAP_POLL: Duration = Duration::from_millis(100);

struct Inner {
    id: NodeId,
    db: Db,
    vote_right: watch::Sender<VoteRight>,
    identity: membership::Identity,
    /// The cluster this node belongs to ([`crate::cluster_id`]).
    cluster_id: ClusterId,
    /// The initial configuration handed to this node, for its clock check until it holds one.
    initial_members: watch::Sender<Vec<(NodeId, String)>>,
    blocks: Blocks,
    raft: Raft,
    state: StateMachine,
    proposer: Proposer,
    limiter: Limiter,
    /// The cluster's data format and the gate of its raising ([`crate::format`]).
    cluster_format: ClusterFormat,
    peers: Peers,
    secret: ClusterSecret,
    tls: Option<NodeTls>,
    clock: watch::Receiver<ClockHealth>,
    disk: watch::Receiver<DiskHealth>,
    settings: RaftSettings,
    node_metrics: NodeMetrics,
    log_cache: LogCache,
    /// What this node promised leaders as a voter (leases for the rate limiter).
    promises: Arc<Promises>,
    /// Held while a vote request is checked and granted, and while a promise is made.
    vote_gate: tokio::sync::Mutex<()>,
    /// Written while the node initializes, read by every append and snapshot install.
    init_gate: tokio::sync::RwLock<()>,
    /// Read barriers share read-index rounds ([`crate::read_rounds`]).
    barrier_rounds: ReadRounds,
    /// So do the read indexes this node, as leader, hands followers.
    leader_rounds: ReadRounds,
    /// The paced lane of the read barriers anyone may cause (see [`RaftNode::read_barrier_paced`]).
    paced_rounds: ReadRounds,
    /// The state machine's adapter, for its applied-entry events.
    applied: StateMachineStore,
    /// The replicated clock's last value this node saw, and when (monotonic): the anchor of
    /// [`RaftNode::cluster_now_ms`] while this node's own clock is not trusted.
    applied_clock: std::sync::Mutex<(u64, crate::boot_clock::BootInstant)>,
    /// Where each member's fill of blocks got, for membership requests that go on from it.
    fill_progress: membership::FillProgress,
}

/// Runs read-index rounds for as long as the node lives (the task holds it weakly).
fn spawn_rounds<F, Fut>(inner: &Arc<Inner>, waiting: Waiting, round: F, pace: Duration)
where
    F: Fn(RaftNode) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<u64>> + Send + 'static,
{
    let node = Arc::downgrade(inner);
    tokio::spawn(read_rounds::run(
        waiting,
        move || {
            let node = node.upgrade().map(|inner| RaftNode { inner });
            let round = node.map(&round);
            async move {
                match round {
                    Some(round) => round.await,
                    None => None,
                }
            }
        },
        pace,
    ));
}

/// How often the paced lane of read barriers starts a round, at most: what a flood of
/// unauthenticated requests costs the cluster, and what a token used for the first time on
/// another node than the one that created it may wait, at most, on top of a round.
const PACED_ROUND_INTERVAL: Duration = Duration::from_millis(10);

/// How often the election switch is set again (a promise's end, a clock verdict or a vote
/// right switches elections back on within this).
const ELECTION_SWITCH_INTERVAL: Duration = Duration::from_millis(25);

/// Keeps openraft's elections switched as [`RaftNode::switch_elections`] says (on only while
/// the clock agrees and the disk is neither full nor slow), and its leader heartbeats on only
/// while the clock agrees and the disk is not full (a leader that stops them steps down: the
/// others elect another), for as long as the node lives. A slow disk only keeps the node from
/// standing: a leader whose fsync is stuck is silent anyway, and the others elect.
async fn switch_elections_forever(
    id: NodeId,
    raft: Raft,
    promises: std::sync::Weak<Promises>,
    clock: watch::Receiver<ClockHealth>,
    disk: watch::Receiver<DiskHealth>,
    vote_right: watch::Receiver<VoteRight>,
) {
    let mut ticks = tokio::time::interval(ELECTION_SWITCH_INTERVAL);
    loop {
        ticks.tick().await;
        let Some(promises) = promises.upgrade() else { return };
        let clock_ok = clock.borrow().may_lead();
        let disk = *disk.borrow();
        let votes = vote_right.borrow().may_vote();
        raft.runtime_config().heartbeat(keeps_leading(&clock.borrow(), &disk));
        RaftNode::switch_elections(&promises, &raft, id, clock_ok && disk.may_stand(), votes);
    }
}

/// Whether a leader with this clock verdict and disk keeps its leadership: its heartbeats
/// stay on, and it confirms read indexes. Otherwise it steps down (the others elect), and
/// nothing it does may reset their election timers meanwhile.
fn keeps_leading(clock: &ClockHealth, disk: &DiskHealth) -> bool {
    clock.may_lead() && !disk.full
}

/// A cheap, cloneable handle to the node.
#[derive(Clone)]
pub struct RaftNode {
    inner: Arc<Inner>,
}

impl RaftNode {
    /// Opens the stores in `db` and starts openraft, without TLS. Serving gRPC is the
    /// caller's job (see [`crate::serve`]).
    pub async fn start(
        id: NodeId,
        db: Db,
        blocks: Arc<BlockStore>,
        settings: RaftSettings,
        secret: ClusterSecret,
    ) -> Result<RaftNode, StartError> {
        RaftNode::start_with_tls(id, db, blocks, settings, secret, None).await
    }

    /// [`RaftNode::start`] with the node's TLS: peers are dialled over TLS (presenting this
    /// node's certificate when mutual), and [`crate::serve`] and the HTTP API serve TLS.
    pub async fn start_with_tls(
        id: NodeId,
        db: Db,
        blocks: Arc<BlockStore>,
        settings: RaftSettings,
        secret: ClusterSecret,
        tls: Option<NodeTls>,
    ) -> Result<RaftNode, StartError> {
        let config = Config {
            cluster_name: "raftbox".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_timeout_min_ms,
            election_timeout_max: settings.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(settings.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: settings.logs_to_keep,
            // Elections are enabled once the clock check finds this node's clock agreeing.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(StartError::raft)?;
        let identity = membership::load_identity(&db)?;
        let vote_right = watch::Sender::new(VoteRight::NotVoter);
        let state = StateMachine::new(db.clone()).reading_up_to(settings.reads_format);
        let stored_format = state.schema()?;
        if stored_format > raftbox_storage::format::FORMAT {
            return Err(StartError::Storage(raftbox_storage::StorageError::TooNew(raftbox_storage::format::too_new(
                "the replicated state of this data directory",
                stored_format,
            ))));
        }
        let sm_store = StateMachineStore::new(state.clone())
            .map_err(StartError::raft)?
            .with_min_free_bytes(settings.min_free_disk_bytes);
        let applied = sm_store.clone();
        let cluster_id = ClusterId::load(&db)?;
        let peers = Peers::with_tls(secret.clone(), cluster_id.clone(), tls.clone());
        let node_metrics = NodeMetrics::new(id);
        node_metrics.set_db(db.clone());
        let log_store = LogStore::new(db.clone(), node_metrics.clone()).guarded_by(sm_store.installing());
        let log_cache = log_store.cache();
        let syncs = log_store.syncs();
        let network = NetworkFactory { peers: peers.clone(), cache: log_cache.clone() };
        let raft = Raft::new(id, Arc::new(config), network, log_store, sm_store).await.map_err(StartError::raft)?;
        let (clock_tx, clock) = watch::channel(ClockHealth {
            ok: None,
            offsets_ms: Default::default(),
            agreed_at: None,
            max_offset_ms: settings.max_clock_offset_ms,
            cluster_size: 1,
            leading_refusing_writes: Default::default(),
        });
        let (initial_members, initial_members_rx) = watch::channel(Vec::new());
        tokio::spawn(watch_clock(
            id,
            raft.clone(),
            peers.clone(),
            settings.max_clock_offset_ms,
            clock_tx,
            initial_members_rx,
        ));
        tokio::spawn(membership::watch_vote_right(id, identity.clone(), raft.clone(), vote_right.clone()));
        let lease = lease_for(Duration::from_millis(settings.election_timeout_min_ms));
        let promises = Arc::new(Promises::new(lease, BootInstant::now()));
        let (disk_tx, disk) = watch::channel(DiskHealth::new(settings.min_free_disk_bytes));
        tokio::spawn(crate::disk::watch_disk(
            db.path().to_path_buf(),
            settings.min_free_disk_bytes,
            syncs,
            disk_tx,
            crate::disk::DiskGauges {
                full: node_metrics.disk_full.clone(),
                free_bytes: node_metrics.disk_free_bytes.clone(),
                slow: node_metrics.disk_slow.clone(),
            },
        ));
        tokio::spawn(switch_elections_forever(
            id,
            raft.clone(),
            Arc::downgrade(&promises),
            clock.clone(),
            disk.clone(),
            vote_right.subscribe(),
        ));
        let proposer = Proposer::spawn(ProposerContext {
            node_id: id,
            raft: raft.clone(),
            peers: peers.clone(),
            write_timeout: Duration::from_millis(settings.write_timeout_ms),
            clock: clock.clone(),
            disk: disk.clone(),
            metrics: node_metrics.clone(),
        });
        let limiter = Limiter::spawn(LimiterContext {
            node_id: id,
            db: db.clone(),
            raft: raft.clone(),
            state: state.clone(),
            proposer: proposer.clone(),
            peers: peers.clone(),
            clock: clock.clone(),
            disk: disk.clone(),
            write_timeout: Duration::from_millis(settings.write_timeout_ms),
            promises: promises.clone(),
        });
        let cluster_format = ClusterFormat::new(state.clone(), settings.reads_format);
        tokio::spawn(crate::format::raise(id, raft.clone(), peers.clone(), proposer.clone(), cluster_format.clone()));
        let blocks = Blocks::new(id, blocks, raft.clone(), peers.clone());
        let (barrier_rounds, barrier_waiting) = ReadRounds::new();
        let (leader_rounds, leader_waiting) = ReadRounds::new();
        let (paced_rounds, paced_waiting) = ReadRounds::new();
        let inner = Inner {
            id,
            db,
            vote_right,
            identity,
            cluster_id,
            initial_members,
            blocks,
            raft,
            state,
            proposer,
            limiter,
            cluster_format,
            peers,
            secret,
            tls,
            clock,
            disk,
            settings,
            node_metrics,
            log_cache,
            promises,
            vote_gate: tokio::sync::Mutex::new(()),
            init_gate: tokio::sync::RwLock::new(()),
            barrier_rounds,
            leader_rounds,
            paced_rounds,
            applied,
            applied_clock: std::sync::Mutex::new((0, crate::boot_clock::BootInstant::now())),
            fill_progress: membership::FillProgress::default(),
        };
        let inner = Arc::new(inner);
        spawn_rounds(&inner, barrier_waiting, RaftNode::barrier_round, Duration::ZERO);
        spawn_rounds(&inner, leader_waiting, RaftNode::leader_round, Duration::ZERO);
        spawn_rounds(&inner, paced_waiting, RaftNode::barrier_round, PACED_ROUND_INTERVAL);
        Ok(RaftNode { inner })
    }

    /// The node's TLS, if it has any (its gRPC and HTTP listeners serve TLS then).
    pub fn tls(&self) -> Option<&NodeTls> {
        self.inner.tls.as_ref()
    }

    /// The cluster secret this node's calls carry and its server demands.
    pub fn secret(&self) -> &ClusterSecret {
        &self.inner.secret
    }

    /// What the last disk check found (see [`crate::disk`]).
    pub fn disk(&self) -> DiskHealth {
        *self.inner.disk.borrow()
    }

    /// Whether this node, as leader, would keep its leadership and take writes now: its
    /// clock agrees with the cluster's and its disk is not full.
    pub fn keeps_leading(&self) -> bool {
        keeps_leading(&self.clock(), &self.disk())
    }

    /// What the last clock check found.
    pub fn clock(&self) -> ClockHealth {
        self.inner.clock.borrow().clone()
    }

    /// The cluster's time now, Unix ms: what every cutoff, expiry, retry time and first fire
    /// a node computes outside apply is measured on (ARCHITECTURE.md, "Time"). While the
    /// cluster agrees with this node's clock it is the stamp this node would put in a batch
    /// as leader (its wall clock, kept within half the bound of the cluster's). Otherwise
    /// (the clock is off, or not checked yet) this node's wall clock counts for nothing: it
    /// is the last stamp this node applied, advanced by the boot-time clock since it saw it
    /// — never ahead of the cluster's time by more than the bound, behind it by as long as
    /// this node applies nothing.
    pub fn cluster_now_ms(&self) -> u64 {
        {
            // On every authenticated request: no clone, no read of the state.
            let clock = self.inner.clock.borrow();
            if clock.may_lead() {
                return clock.stamp();
            }
        }
        let applied = self.inner.state.clock_ms().unwrap_or(0);
        let now = crate::boot_clock::BootInstant::now();
        let mut anchor = self.inner.applied_clock.lock().unwrap_or_else(|e| e.into_inner());
        if applied > anchor.0 {
            *anchor = (applied, now);
        }
        anchor.0.saturating_add(now.saturating_duration_since(anchor.1).as_millis() as u64)
    }

    /// The time an expiry is *checked* against (a token's, a session's, a link's, a fresh
    /// proof's): [`RaftNode::cluster_now_ms`], or, while the cluster does not agree with this
    /// node's clock, the later of it and this node's wall clock. It fails closed: a node
    /// restarted after a long outage (its last applied stamp old) or with a clock behind never
    /// takes what expired for current; one with a clock ahead only refuses early, and says it
    /// is not ready meanwhile.
    pub fn expiry_now_ms(&self) -> u64 {
        if self.inner.clock.borrow().may_lead() {
            return self.cluster_now_ms();
        }
        self.cluster_now_ms().max(crate::clock::now_ms())
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// The newest data format this node reads (what it tells peers; see [`crate::format`]).
    pub fn reads_format(&self) -> u32 {
        self.inner.cluster_format.reads
    }

    /// The cluster's data format as applied on this node (see [`crate::format`]).
    pub fn cluster_format(&self) -> u32 {
        self.inner.cluster_format.current()
    }

    /// Whether this node may vote (a node that lost its data may not; see
    /// [`crate::membership`]).
    pub fn vote_right(&self) -> VoteRight {
        *self.inner.vote_right.borrow()
    }

    /// The cluster this node belongs to, once it has an id (see [`crate::cluster_id`]).
    pub fn cluster_id(&self) -> Option<std::sync::Arc<str>> {
        self.inner.cluster_id.get()
    }

    /// Whether this node takes a call (see [`crate::cluster_id`]); `writes`: the call would
    /// write Raft state and names this data directory, so a fresh node takes the caller's id
    /// with it.
    pub(crate) fn same_cluster<T>(&self, request: &tonic::Request<T>, writes: bool) -> Result<(), tonic::Status> {
        self.inner.cluster_id.check(&self.inner.db, request, writes)
    }

    /// This data directory's incarnation (see [`crate::membership`]).
    pub fn incarnation(&self) -> &str {
        &self.inner.identity.incarnation
    }

    /// Whether this data directory held Raft state before incarnations (see
    /// [`crate::membership::Identity`]).
    pub fn legacy_directory(&self) -> bool {
        self.inner.identity.legacy
    }

    /// Streams a consistent image of the replicated state, as this node has applied it (a
    /// backup: a snapshot image, its blake3 checksum at its end), and says first which log
    /// entry it reflects. The caller first makes sure everything acknowledged before is
    /// applied here ([`RaftNode::read_barrier`]). The image is read from one RocksDB snapshot
    /// view straight into the stream, a buffer at a time, as the receiver takes it: memory
    /// stays bounded, nothing is written to disk, and the node goes on applying meanwhile.
    /// Dropping the receiver ends the writing; `guard` is held until the writing ends.
    pub async fn backup(
        &self,
        guard: impl Send + 'static,
    ) -> Result<(BackupImage, tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>), WriteError> {
        let state = self.inner.state.clone();
        let (marker_tx, marker_rx) = tokio::sync::oneshot::channel::<Option<Vec<u8>>>();
        let (tx, rx) = tokio::sync::mpsc::channel(BACKUP_CHUNKS_QUEUED);
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let out = ChannelWriter { tx: tx.clone(), buffer: Vec::with_capacity(BACKUP_CHUNK_BYTES) };
            let written = state.write_snapshot_with(out, |marker| {
                let _ = marker_tx.send(marker.map(<[u8]>::to_vec));
            });
            if let Err(e) = written {
                tracing::warn!(error = %e, "backup stopped");
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        });
        let marker =
            marker_rx.await.map_err(|_| WriteError::Unavailable("backup: the state could not be read".into()))?;
        let marker: crate::state_machine::AppliedMarker = match &marker {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| WriteError::Unavailable(format!("backup: the applied marker does not decode: {e}")))?,
            None => crate::state_machine::AppliedMarker::default(),
        };
        let last = marker.last_applied;
        let image = BackupImage { index: last.map_or(0, |l| l.index), term: last.map_or(0, |l| l.leader_id.term) };
        Ok((image, rx))
    }

    /// The members of the cluster as this node sees them.
    pub fn members(&self) -> Vec<Member> {
        membership::members_of(&self.metrics())
    }

    /// Changes the cluster's membership through the leader (forwarded from a follower),
    /// within the membership timeout.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<MembershipAnswer, MembershipError> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.membership_timeout_ms);
        loop {
            let (leader, addr) = wait_for_leader(&self.inner.raft, deadline)
                .await
                .map_err(|e| MembershipError::Unavailable(e.to_string()))?;
            let result = if leader == self.inner.id {
                let cluster_id = self.inner.cluster_id.get();
                membership::change_on_leader(
                    &self.inner.raft,
                    &self.inner.peers,
                    &self.inner.fill_progress,
                    (&self.inner.cluster_format, cluster_id.as_deref()),
                    &change,
                    deadline,
                )
                .await
            } else {
                self.forward_membership(&addr, &change, deadline).await
            };
            match result {
                Err(MembershipError::NotLeader) if Instant::now() < deadline => {
                    let mut metrics = self.inner.raft.metrics();
                    let _ = tokio::time::timeout(Duration::from_millis(50), metrics.changed()).await;
                }
                Err(MembershipError::NotLeader) => {
                    return Err(MembershipError::Unavailable(
                        "no leader accepted the change before the deadline".into(),
                    ))
                }
                other => return other,
            }
        }
    }

    /// Carries out a change forwarded to this node if it leads; `NotLeader` otherwise.
    pub(crate) async fn change_membership_here(
        &self,
        change: &MembershipChange,
    ) -> Result<MembershipAnswer, MembershipError> {
        if self.metrics().current_leader != Some(self.inner.id) {
            return Err(MembershipError::NotLeader);
        }
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.membership_timeout_ms);
        let cluster_id = self.inner.cluster_id.get();
        let cluster = (&self.inner.cluster_format, cluster_id.as_deref());
        membership::change_on_leader(
            &self.inner.raft,
            &self.inner.peers,
            &self.inner.fill_progress,
            cluster,
            change,
            deadline,
        )
        .await
    }

    /// Fetches every block the chunk index names after `after` and this node lacks, once
    /// this node has applied up to `applied_index` (waiting at most [`FILL_APPLY_WAIT`]);
    /// asked by the leader of a learner before promoting it and of the remaining voters
    /// before a removal. With a `budget` it stops after the round that passes it and returns
    /// where to go on from (`None`: done), so a fill of any size proceeds in bounded calls.
    pub async fn fill_blocks(
        &self,
        applied_index: u64,
        after: Option<BlockHash>,
        budget: Option<Duration>,
    ) -> Result<(crate::blocks::FillReport, crate::blocks::FillEnd), String> {
        // The budget counts from the call's arrival: waiting to apply spends it too.
        let until = budget.map(|budget| tokio::time::Instant::now() + budget);
        let disk = self.disk();
        if disk.full {
            return Err(disk.refusal());
        }
        self.inner
            .raft
            .wait(Some(FILL_APPLY_WAIT))
            .applied_index_at_least(Some(applied_index), "fill blocks")
            .await
            .map_err(|e| format!("not applied up to {applied_index} yet: {e}"))?;
        let (report, next) = self
            .inner
            .blocks
            .fill_from(&self.inner.state, after, FILL_ROUND_CHUNKS, until)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(?report, ?next, "filled in the blocks this node lacked");
        Ok((report, next))
    }

    async fn forward_membership(
        &self,
        addr: &str,
        change: &MembershipChange,
        deadline: Instant,
    ) -> Result<MembershipAnswer, MembershipError> {
        let json = serde_json::to_vec(change).map_err(|e| MembershipError::Invalid(e.to_string()))?;
        let mut client = self.inner.peers.client(addr).map_err(|e| MembershipError::Unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(crate::pb::RaftMessage { json });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let reply = match tokio::time::timeout_at(deadline, client.change_membership(request)).await {
            Err(_) => return Err(MembershipError::Unknown("the leader did not answer before the deadline".into())),
            Ok(Err(status)) if crate::proposer::never_sent(&status) => return Err(MembershipError::NotLeader),
            Ok(Err(status)) => return Err(MembershipError::Unknown(format!("forwarding to the leader: {status}"))),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        serde_json::from_slice(&reply.json)
            .map_err(|e| MembershipError::Unknown(format!("undecodable answer from the leader: {e}")))?
    }

    /// The newest log entries, shared with the log store (the gRPC service keeps the
    /// encodings it receives there).
    pub(crate) fn log_cache(&self) -> &LogCache {
        &self.inner.log_cache
    }

    /// This node's blocks and their transfer to and from peers.
    pub fn blocks(&self) -> &Blocks {
        &self.inner.blocks
    }

    pub fn proposer(&self) -> &Proposer {
        &self.inner.proposer
    }

    /// Rate-limit checks, decided in memory on the leader (see [`crate::limiter`]).
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Whether this node's vote is for `leader_id` in `term`; if so, this node promises that
    /// leader not to help elect another, nor to stand itself, for a lease (see
    /// [`crate::lease`]). Under the vote gate, so no vote is granted between a refusal check
    /// and this promise.
    pub(crate) async fn confirm_leader(&self, term: u64, leader_id: NodeId) -> bool {
        let _gate = self.inner.vote_gate.lock().await;
        let saved = crate::log_store::stored_vote(&self.inner.db)
            .is_some_and(|vote| vote.leader_id.term == term && vote.leader_id.node_id == leader_id);
        if !saved {
            return false;
        }
        let me = self.inner.id;
        let raft = &self.inner.raft;
        self.inner.promises.promise(term, leader_id, BootInstant::now(), || {
            if leader_id != me {
                raft.runtime_config().elect(false);
            }
        });
        // An election openraft began before the switch shows in its in-memory vote, read in
        // its core after the switch (which any later election tick sees).
        // In a task of its own: a caller giving up must not drop the answer openraft sends.
        let raft = raft.clone();
        let held = tokio::spawn(async move {
            raft.with_raft_state(move |st| {
                let vote = st.vote_ref();
                vote.leader_id.term == term && vote.leader_id.node_id == leader_id
            })
            .await
        });
        matches!(held.await, Ok(Ok(true)))
    }

    /// Hands a candidate's vote request to openraft unless this node may not vote (it lost
    /// its data, or is no voter of its configuration) or a promise forbids it: checked and
    /// granted under the vote gate, which [`RaftNode::confirm_leader`] holds too.
    pub(crate) async fn vote(
        &self,
        rpc: openraft::raft::VoteRequest<NodeId>,
    ) -> Result<Result<openraft::raft::VoteResponse<NodeId>, openraft::error::RaftError<NodeId>>, String> {
        let right = self.vote_right();
        if !right.may_vote() {
            return Err(format!("node {} does not vote ({right:?}; see raft/src/membership.rs)", self.inner.id));
        }
        let _gate = self.inner.vote_gate.lock().await;
        if let Some(why) = self.inner.promises.refusal(rpc.vote.leader_id.node_id, BootInstant::now()) {
            return Err(why);
        }
        Ok(self.inner.raft.vote(rpc).await)
    }

    /// Switches openraft's elections: on only when the clock agrees (`clock_ok`), the node
    /// votes, and no promise to another leader runs (see [`crate::lease`]).
    pub(crate) fn switch_elections(promises: &Promises, raft: &Raft, me: NodeId, clock_ok: bool, votes: bool) {
        promises.may_stand(me, BootInstant::now(), |free| raft.runtime_config().elect(clock_ok && votes && free));
    }

    /// How long a write, read barrier or forwarded call may take.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.settings.write_timeout_ms)
    }

    /// The local state machine, for reads (call [`RaftNode::read_barrier`] first for a
    /// linearizable read).
    pub fn state(&self) -> &StateMachine {
        &self.inner.state
    }

    /// Hears what every entry this node applies from now on did (the notification channels).
    pub fn applied_events(&self) -> tokio::sync::broadcast::Receiver<Applied> {
        self.inner.applied.applied_events()
    }

    pub(crate) fn metrics(&self) -> RaftMetrics {
        self.inner.raft.metrics().borrow().clone()
    }

    /// This node's view of the cluster now.
    pub fn status(&self) -> Status {
        Status::of(&self.inner.raft.metrics().borrow())
    }

    /// A watch on this node's applied index.
    pub fn applied_index(&self) -> AppliedIndex {
        AppliedIndex(self.inner.raft.metrics())
    }

    /// The Prometheus text exposition of this node's series, its Raft state included.
    pub fn render_metrics(&self) -> String {
        self.inner.node_metrics.render(&self.metrics())
    }

    /// This node's Prometheus series (see [`crate::metrics`]).
    pub fn node_metrics(&self) -> &NodeMetrics {
        &self.inner.node_metrics
    }

    /// Applies one command through the leader (batched with concurrent ones), within the
    /// write timeout.
    pub async fn write(&self, command: Command) -> Result<Outcome, WriteError> {
        self.inner.cluster_format.admits(&command)?;
        let mut outcomes = self.inner.proposer.submit(vec![command]).await?;
        outcomes.pop().ok_or_else(|| WriteError::Unknown("no outcome for the command".into()))
    }

    /// Returns once this node has applied everything committed before the call: a read of
    /// the local state after it is linearizable. Bounded by the write timeout.
    pub async fn read_barrier(&self) -> Result<(), WriteError> {
        self.barrier_through(&self.inner.barrier_rounds).await
    }

    /// [`RaftNode::read_barrier`] for what anyone may ask without credentials (a token this
    /// node does not know): its rounds start at most every [`PACED_ROUND_INTERVAL`], so a
    /// flood of such requests costs the cluster a bounded number of rounds, and the writes
    /// and reads of authenticated users keep theirs.
    pub async fn read_barrier_paced(&self) -> Result<(), WriteError> {
        self.barrier_through(&self.inner.paced_rounds).await
    }

    async fn barrier_through(&self, rounds: &ReadRounds) -> Result<(), WriteError> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.write_timeout_ms);
        loop {
            // The next round to begin, shared with every reader waiting now.
            if let Some(index) = rounds.next_index(deadline).await {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if self.applied_index().reach(index, remaining).await {
                    return Ok(());
                }
                return Err(WriteError::Unavailable(format!(
                    "not caught up to read index {index} within the write timeout"
                )));
            }
            if Instant::now() >= deadline {
                return Err(WriteError::Unavailable("no leader confirmed a read index".into()));
            }
            let mut metrics = self.inner.raft.metrics();
            let _ = tokio::time::timeout(Duration::from_millis(50), metrics.changed()).await;
        }
    }

    /// One read-index round of the read barriers: the leader's index, confirmed with a
    /// quorum here (when leading) or asked of the leader; `None` if none by the write timeout.
    async fn barrier_round(self) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.write_timeout_ms);
        let (leader, addr) = wait_for_leader(&self.inner.raft, deadline).await.ok()?;
        if leader == self.inner.id {
            self.read_index_until(deadline).await
        } else {
            self.remote_read_index(&addr, deadline).await
        }
    }

    /// One round of the read indexes handed to followers: confirmed here, as leader.
    async fn leader_round(self) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.write_timeout_ms);
        self.read_index_until(deadline).await
    }

    /// On the leader: confirms leadership with a quorum and returns the index a linearizable
    /// read must see applied; `None` if it cannot by `deadline` (e.g. it lost its quorum).
    async fn read_index_until(&self, deadline: Instant) -> Option<u64> {
        // A leader stepping down (its clock disagrees, its disk is full) confirms no read:
        // openraft's read index sends AppendEntries whether heartbeats are on or not, and each
        // resets the followers' election timers, so readers alone (one a second through a
        // follower, or a stranger's forged tokens) would keep a leader that refuses writes.
        // A single voter steps down to no one: it keeps answering reads (writes are refused
        // on their own while the disk is full).
        if !keeps_leading(&self.clock(), &self.disk()) && !self.only_voter() {
            return None;
        }
        let confirmed = tokio::time::timeout_at(deadline, self.inner.raft.get_read_log_id()).await;
        match confirmed {
            Ok(Ok((read_log_id, _applied))) => Some(read_log_id.map_or(0, |id| id.index)),
            _ => None,
        }
    }

    /// Whether this node is its configuration's only voter.
    fn only_voter(&self) -> bool {
        let metrics = self.metrics();
        let mut voters = metrics.membership_config.membership().voter_ids();
        voters.next() == Some(self.inner.id) && voters.next().is_none()
    }

    /// The read index this node hands a follower, if it is the leader and can confirm it
    /// within the write timeout (sharing rounds with the other followers asking).
    pub(crate) async fn confirmed_read_index(&self) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.write_timeout_ms);
        self.inner.leader_rounds.next_index(deadline).await
    }

    async fn remote_read_index(&self, addr: &str, deadline: Instant) -> Option<u64> {
        let mut client = self.inner.peers.client(addr).ok()?;
        let mut request = tonic::Request::new(ReadIndexRequest {});
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let reply = tokio::time::timeout_at(deadline, client.read_index(request)).await.ok()?.ok()?;
        match reply.into_inner().result? {
            ReadIndexResult::Index(index) => Some(index),
            ReadIndexResult::NotLeader(_) => None,
        }
    }

    /// On a fresh node chosen to bootstrap: reads every member's incarnation (waiting for all
    /// of them: a member the initial configuration cannot name would never vote), hands each
    /// the initial configuration, then initializes itself with it — unless this node or a
    /// peer already belongs to a cluster with a log beyond its first entry, or a peer holds
    /// another initial configuration. Repeating it after a crash part-way changes nothing.
    pub async fn bootstrap(&self, members: BTreeMap<NodeId, NodeInfo>) -> Result<(), StartError> {
        if self.inner.raft.is_initialized().await.map_err(StartError::raft)?
            && self.metrics().last_log_index.unwrap_or(0) > 0
        {
            tracing::info!("cluster already initialized; no bootstrap");
            return Ok(());
        }
        let mut named = members.clone();
        let mut waited_since = Instant::now();
        loop {
            let mut silent = Vec::new();
            for (id, info) in members.iter() {
                if *id == self.inner.id {
                    named.insert(*id, NodeInfo { incarnation: Some(self.incarnation().to_owned()), ..info.clone() });
                    continue;
                }
                let timeout = Duration::from_millis(BOOTSTRAP_PROBE_TIMEOUT_MS);
                match membership::peer_status(&self.inner.peers, &info.grpc_addr, timeout).await {
                    Some(status) if status.initialized && status.last_log_index > 0 => {
                        tracing::info!(peer = id, "peer belongs to a cluster that has a log; joining it instead");
                        return Ok(());
                    }
                    Some(status) => {
                        named.insert(*id, NodeInfo { incarnation: Some(status.incarnation), ..info.clone() });
                    }
                    None => silent.push(*id),
                }
            }
            if silent.is_empty() {
                break;
            }
            if waited_since.elapsed() >= Duration::from_millis(self.inner.settings.bootstrap_wait_ms.max(1_000)) {
                tracing::warn!(
                    ?silent,
                    "waiting for every member to answer before initializing: the initial configuration \
                     must name each member's data directory, or that member would never vote"
                );
                waited_since = Instant::now();
            }
            tokio::time::sleep(BOOTSTRAP_POLL).await;
        }
        // The new cluster's identity, durable before any member is told it (the Initialize
        // calls carry it, and each fresh member takes it). A directory holding Raft state
        // without one (a bootstrap from before identities, repeated) stays without.
        if self.inner.cluster_id.get().is_some() || !crate::cluster_id::holds_state(&self.inner.db)? {
            let id = self.inner.cluster_id.mint(&self.inner.db)?;
            tracing::info!(cluster_id = %id, "bootstrapping cluster {id}");
        }
        let json = serde_json::to_vec(&named).map_err(|e| StartError::Bootstrap(e.to_string()))?;
        let wait = Duration::from_millis(self.inner.settings.bootstrap_wait_ms.max(1_000));
        let started = Instant::now();
        // This node last: initialized, it stands for election at once, and a crash before the
        // others hold the configuration would leave them refusing its votes (a restart then
        // hands it out again: this node's log holds no entry beyond the configuration yet).
        let mut pending: Vec<NodeId> = named.keys().copied().filter(|id| *id != self.inner.id).collect();
        pending.push(self.inner.id);
        let mut last_warning = Instant::now();
        loop {
            let mut still = Vec::new();
            for id in pending {
                let answer = if id == self.inner.id {
                    self.initialize_here(named.clone()).await
                } else {
                    self.initialize_peer(&named[&id].grpc_addr, &json).await
                };
                match answer {
                    Ok(()) => tracing::info!(member = id, "member initialized"),
                    Err(Initialize::Refused(why)) => {
                        tracing::warn!(member = id, %why, "a member holds another configuration; not bootstrapping");
                        return Ok(());
                    }
                    Err(Initialize::NotYet(why)) => {
                        tracing::debug!(member = id, %why, "member not initialized yet");
                        still.push(id);
                    }
                }
            }
            pending = still;
            let initialized = named.len() - pending.len();
            if pending.is_empty() {
                tracing::info!(members = ?named.keys().collect::<Vec<_>>(), "cluster initialized");
                return Ok(());
            }
            if initialized * 2 > named.len() && started.elapsed() >= wait {
                tracing::warn!(
                    ?pending,
                    "a majority is initialized; the others receive the configuration from the leader"
                );
                return Ok(());
            }
            if last_warning.elapsed() >= wait {
                tracing::warn!(?pending, "members not initialized yet (unreachable, or clock not confirmed)");
                last_warning = Instant::now();
            }
            tokio::time::sleep(BOOTSTRAP_POLL).await;
        }
    }

    /// Hands the peer at `addr` the initial configuration (`json`), once.
    async fn initialize_peer(&self, addr: &str, json: &[u8]) -> Result<(), Initialize> {
        let not_yet = |e: String| Initialize::NotYet(e);
        let mut client = self.inner.peers.client(addr).map_err(|e| not_yet(e.to_string()))?;
        let mut request = tonic::Request::new(crate::pb::RaftMessage { json: json.to_vec() });
        request.set_timeout(INITIALIZE_CLOCK_WAIT + Duration::from_millis(BOOTSTRAP_PROBE_TIMEOUT_MS));
        let reply = match client.initialize(request).await {
            Ok(reply) => reply.into_inner(),
            // Another cluster's node (or this one's, recovered since): asking again cannot help.
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                return Err(Initialize::Refused(status.message().to_string()))
            }
            Err(status) => return Err(not_yet(status.to_string())),
        };
        serde_json::from_slice::<Result<(), Initialize>>(&reply.json).map_err(|e| not_yet(e.to_string()))?
    }

    /// The configuration this node holds, member by member (empty before it holds one).
    fn held_configuration(&self) -> BTreeMap<NodeId, NodeInfo> {
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        membership.nodes().map(|(id, info)| (*id, info.clone())).collect()
    }

    /// Initializes this node with the initial configuration `members` (from the bootstrapping
    /// node, or this one): only if it names this node's incarnation, only once (a node
    /// already holding exactly this configuration answers `Ok`, any other refuses), and only
    /// once a clock check counting these members confirms this node's clock (openraft stands
    /// for election at once on `initialize`), waiting for that at most
    /// [`INITIALIZE_CLOCK_WAIT`]; `NotYet` otherwise, and the bootstrapping node asks again.
    pub async fn initialize_here(&self, members: BTreeMap<NodeId, NodeInfo>) -> Result<(), Initialize> {
        let mine = members.get(&self.inner.id).and_then(|info| info.incarnation.as_deref());
        if mine != Some(self.incarnation()) {
            return Err(Initialize::Refused(format!(
                "the configuration names node {} with incarnation {mine:?}, but this data directory is {}",
                self.inner.id,
                self.incarnation()
            )));
        }
        let held = self.held_configuration();
        if !held.is_empty() {
            return if held == members {
                Ok(())
            } else {
                Err(Initialize::Refused(format!("this node already holds another configuration: {held:?}")))
            };
        }
        let addrs: Vec<(NodeId, String)> = members.iter().map(|(id, info)| (*id, info.grpc_addr.clone())).collect();
        self.inner.initial_members.send_replace(addrs);
        let size = members.len();
        let mut clock = self.inner.clock.clone();
        let confirmed = tokio::time::timeout(
            INITIALIZE_CLOCK_WAIT,
            clock.wait_for(|health| health.may_lead() && health.cluster_size == size),
        )
        .await
        .is_ok_and(|checked| checked.is_ok());
        if !confirmed {
            return Err(Initialize::NotYet("this node's clock is not confirmed by these members yet".into()));
        }
        // Under the initialization gate, which every append and snapshot install holds: none
        // reaches openraft between the look at its state and the initialize.
        let _gate = self.inner.init_gate.write().await;
        let raft = self.inner.raft.clone();
        let fresh = tokio::spawn(async move {
            raft.with_raft_state(|st| {
                st.vote_ref().leader_id.term == 0
                    && st.committed.is_none()
                    && st.membership_state.effective().membership().nodes().next().is_none()
            })
            .await
        });
        if !matches!(fresh.await, Ok(Ok(true))) {
            // A leader the others elected reached this node first: its configuration arrives
            // by replication.
            return Ok(());
        }
        match self.inner.raft.initialize(members.clone()).await {
            Ok(()) => Ok(()),
            Err(_) if self.held_configuration() == members => Ok(()),
            Err(e) => Err(Initialize::Refused(format!("initialize refused: {e}"))),
        }
    }

    /// Hands an appended-entries request to openraft under the initialization gate.
    pub(crate) async fn append_entries(
        &self,
        rpc: openraft::raft::AppendEntriesRequest<crate::types::TypeConfig>,
    ) -> Result<openraft::raft::AppendEntriesResponse<NodeId>, openraft::error::RaftError<NodeId>> {
        let _gate = self.inner.init_gate.read().await;
        self.inner.raft.append_entries(rpc).await
    }

    /// Hands a snapshot chunk to openraft under the initialization gate.
    pub(crate) async fn install_snapshot(
        &self,
        rpc: openraft::raft::InstallSnapshotRequest<crate::types::TypeConfig>,
    ) -> Result<
        openraft::raft::InstallSnapshotResponse<NodeId>,
        openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>,
    > {
        // In a task of its own, holding the gate: a leader giving up on the chunk (its call
        // timed out) must not drop the answer openraft's core sends back mid-call.
        let node = self.clone();
        let installed = tokio::spawn(async move {
            let _gate = node.inner.init_gate.read().await;
            node.inner.raft.install_snapshot(rpc).await
        });
        match installed.await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "the task installing a snapshot chunk failed");
                Err(openraft::error::RaftError::Fatal(openraft::error::Fatal::Panicked))
            }
        }
    }

    /// Stops openraft (the caller stops serving first).
    pub async fn shutdown(&self) {
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

/// What [`RaftNode::backup`] streams: the last log entry the image reflects, and its term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupImage {
    pub index: u64,
    pub term: u64,
}

/// Bytes of one chunk of a backup's stream, and chunks queued ahead of the receiver: the
/// memory a backup holds.
const BACKUP_CHUNK_BYTES: usize = 1 << 20;
const BACKUP_CHUNKS_QUEUED: usize = 4;

/// A blocking writer into a channel, a chunk at a time; fails once the receiver is gone.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(BACKUP_CHUNK_BYTES));
        self.tx
            .blocking_send(Ok(bytes::Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the backup's receiver is gone"))
    }
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= BACKUP_CHUNK_BYTES {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
