//! Rate-limit decisions taken in memory on the leader, replicated in batches.
//!
//! A check is decided by the leader alone, from the states it holds in memory, and answered
//! at once while the leader holds a lease (`lease.rs`: the voters of a confirmation round
//! promised to elect no other leader for a while, and rounds renew it while checks come in),
//! otherwise once a quorum has confirmed (one round, shared by every check waiting for one)
//! that it was still the leader after the decision. The new states reach the log afterwards,
//! many keys per `RateSet` command. Followers forward their checks to the leader (`RateCheck`
//! RPC), every request that arrived while the previous call was in flight in one call. The safety argument — why no more than a limit's own allowance is ever admitted,
//! across leader changes and partitions — is in ARCHITECTURE.md ("Rate limiting on the
//! leader"). In short:
//!
//! - the leader holds at most [`Algorithm::credit`] admissions per key that no log entry
//!   records yet; beyond that a check waits for replication (bounded by its deadline);
//! - before it decides anything for a key, a new leader has applied everything earlier
//!   leaders committed and commits a `RateSet` that charges the key that credit if an
//!   earlier term decided it in memory, as admissions that leader may have given that no log
//!   holds; a key's record outlives any such admission's effect, so a key without one owes
//!   nothing;
//! - an admission is answered only if it was decided under a lease, or after a quorum
//!   confirmed the leadership of its term in a round that began after the decision; either
//!   way it precedes the election of any later leader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use raftbox_storage::command::{RateCheck, RateEntry};
use raftbox_storage::ratelimit::{Algorithm, Decision, LimitState};
use raftbox_storage::{Command, Outcome, StateMachine};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

use crate::boot_clock::BootInstant;
use crate::clock::ClockHealth;
use crate::error::WriteError;
use crate::lease::{usable, Promises};
use crate::network::Peers;
use crate::pb::rate_check_reply::Result as RateCheckResult;
use crate::pb::RateCheckRequest;
use crate::proposer::{call_leader, wait_for_leader, Proposer};
use crate::types::{NodeId, Raft};

/// Leadership confirmations waiting for the next heartbeat round, or checks waiting to be
/// forwarded, at most.
const CONFIRM_QUEUE_MAX: usize = 16_384;
/// Requests in one forward to the leader, at most.
const FORWARD_BATCH_MAX: usize = 1_024;
/// How long past its idle time a key's record in the log stays live for decisions (then it
/// is purged one `idle_after` later): keeps a key in steady use from ever waiting for its
/// record to move on.
const LIVE_EXTRA_MS: u64 = 60_000;
/// How often idle keys are dropped from memory.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);
/// After a failed replication, wait this long before trying again.
const FLUSH_RETRY_DELAY: Duration = Duration::from_millis(20);
/// After the leader refused or could not be reached, wait this long (or until the node's
/// view of the cluster changes) before trying again.
const LEADER_RETRY_DELAY: Duration = Duration::from_millis(50);

/// The answer to one request's checks: admitted only if every check admits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateAnswer {
    pub allowed: bool,
    pub decisions: Vec<Decision>,
}

/// Why the leader did not decide.
#[derive(Debug)]
pub enum Undecided {
    /// This node is not (or no longer) the leader: nothing was decided; ask the leader.
    NotLeader,
    /// The leader could not decide in time (no quorum, replication behind).
    Failed(WriteError),
}

/// One key's state on the leader.
struct Slot {
    algorithm: Algorithm,
    state: LimitState,
    /// When `state` is idle.
    idle_at_ms: u64,
    /// When the state in the log is idle: admissions are decided only before then, so a
    /// record is never purged while a lost admission could still matter (it is purged a
    /// further `idle_after` later).
    live_until_ms: u64,
    /// Admissions decided on this key that no applied log entry records yet.
    unreplicated: u64,
    /// Changed since the last `RateSet` was sent.
    dirty: bool,
}

/// The leader's states for one term.
#[derive(Default)]
struct Table {
    /// The term these states belong to (0: none).
    term: u64,
    /// The latest time a decision used: decisions never go back in time.
    floor_ms: u64,
    keys: HashMap<String, Slot>,
}

struct Confirm {
    term: u64,
    reply: oneshot::Sender<bool>,
}

/// What the limiter needs of the node.
pub(crate) struct LimiterContext {
    pub node_id: NodeId,
    pub db: raftbox_storage::Db,
    pub raft: Raft,
    pub state: StateMachine,
    pub proposer: Proposer,
    pub peers: Peers,
    pub clock: watch::Receiver<ClockHealth>,
    /// The NOSPACE alarm: a leader whose disk is full decides nothing (it is stepping down).
    pub disk: watch::Receiver<crate::disk::DiskHealth>,
    pub write_timeout: Duration,
    /// This node's promises as a voter; a round's leader promises itself too.
    pub promises: Arc<Promises>,
}

struct Inner {
    ctx: LimiterContext,
    table: Mutex<Table>,
    /// Wakes the replication task.
    dirty: Notify,
    /// Woken after every replication attempt (keys at their credit may go on).
    flushed: Notify,
    /// One take-over at a time (each commits a `RateSet`).
    takeover: tokio::sync::Mutex<()>,
    confirm: mpsc::Sender<Confirm>,
    outgoing: mpsc::Sender<Outgoing>,
    /// Until when this node may answer admissions of a term without a round of their own:
    /// the start of the last round that confirmed the term, plus the usable lease.
    lease: Mutex<Option<(u64, BootInstant)>>,
    /// A round to renew the lease is queued or running.
    renewing: AtomicBool,
}

/// Handle to the node's limiter.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl Limiter {
    pub(crate) fn spawn(ctx: LimiterContext) -> Limiter {
        let (confirm, confirms) = mpsc::channel(CONFIRM_QUEUE_MAX);
        let (outgoing, outgoings) = mpsc::channel(CONFIRM_QUEUE_MAX);
        let inner = Arc::new(Inner {
            ctx,
            table: Mutex::new(Table::default()),
            dirty: Notify::new(),
            flushed: Notify::new(),
            takeover: tokio::sync::Mutex::new(()),
            confirm,
            outgoing,
            lease: Mutex::new(None),
            renewing: AtomicBool::new(false),
        });
        tokio::spawn(forward_batches(inner.ctx.peers.clone(), outgoings));
        tokio::spawn(replicate(Arc::downgrade(&inner)));
        tokio::spawn(confirm_rounds(Arc::downgrade(&inner), confirms));
        Limiter { inner }
    }

    /// Decides `checks` (atomically: all admit or none consumes) on the leader, forwarding
    /// them there from a follower, by `deadline`.
    pub async fn check(&self, checks: Vec<RateCheck>, deadline: Instant) -> Result<RateAnswer, WriteError> {
        let ctx = &self.inner.ctx;
        loop {
            let (leader, addr) = wait_for_leader(&ctx.raft, deadline).await?;
            let decided = if leader == ctx.node_id {
                match self.decide(&checks, deadline).await {
                    Ok(answer) => Some(answer),
                    Err(Undecided::NotLeader) => None,
                    Err(Undecided::Failed(e)) => return Err(e),
                }
            } else {
                let (reply, answer) = oneshot::channel();
                let outgoing = Outgoing { addr, checks: checks.clone(), deadline, reply };
                let queued = tokio::time::timeout_at(deadline, self.inner.outgoing.send(outgoing)).await;
                if !matches!(queued, Ok(Ok(()))) {
                    return Err(WriteError::Unavailable("the forward queue stayed full".into()));
                }
                match tokio::time::timeout_at(deadline, answer).await {
                    Ok(Ok(answer)) => answer?,
                    Ok(Err(_)) => return Err(WriteError::ShuttingDown),
                    Err(_) => return Err(WriteError::Unknown("the leader did not decide before the deadline".into())),
                }
            };
            if let Some(answer) = decided {
                return Ok(answer);
            }
            // Nothing was decided: let the node learn of the new leader, then try again.
            let mut metrics = ctx.raft.metrics();
            let _ = tokio::time::timeout(LEADER_RETRY_DELAY, metrics.changed()).await;
            if Instant::now() >= deadline {
                return Err(WriteError::Unavailable(format!("leader {leader} could not decide in time")));
            }
        }
    }

    /// Decides on this node, which must be the leader (a forwarded check arrives here).
    pub async fn decide(&self, checks: &[RateCheck], deadline: Instant) -> Result<RateAnswer, Undecided> {
        let term = self.leader_term().ok_or(Undecided::NotLeader)?;
        loop {
            self.take_over(term, checks, deadline).await?;
            let flushed = self.inner.flushed.notified();
            tokio::pin!(flushed);
            let decided = {
                let mut table = self.table();
                if table.term != term {
                    return Err(Undecided::NotLeader);
                }
                let now_ms = self.inner.ctx.clock.borrow().stamp().max(table.floor_ms);
                let idle = |s: &Slot| !s.dirty && s.unreplicated == 0 && s.live_until_ms <= now_ms;
                if checks.iter().any(|c| table.keys.get(&c.key).is_none_or(idle)) {
                    // New, or idle in the log: take it over (again), which also moves the
                    // log's record past now.
                    table.keys.retain(|_, s| !idle(s));
                    continue;
                }
                let wait = |c: &RateCheck| {
                    let slot = &table.keys[&c.key];
                    slot.unreplicated >= c.algorithm.credit() || slot.live_until_ms <= now_ms
                };
                if checks.iter().any(wait) {
                    // Wait for the replication in flight; registered before the lock is let go.
                    flushed.as_mut().enable();
                    None
                } else {
                    Some(decide_in(&mut table, checks, now_ms))
                }
            };
            match decided {
                // A rejection consumed nothing: no confirmation is needed for safety.
                Some(answer) if !answer.allowed => return Ok(answer),
                Some(answer) => {
                    self.inner.dirty.notify_one();
                    // Decided above, before this look at the clock: under a running lease no
                    // other leader can have taken over yet.
                    if self.under_lease(term) {
                        return Ok(answer);
                    }
                    return match self.confirm(term, deadline).await {
                        true => Ok(answer),
                        false => Err(Undecided::Failed(WriteError::Unavailable(
                            "the leader could not confirm its leadership with a quorum".into(),
                        ))),
                    };
                }
                None => {
                    if tokio::time::timeout_at(deadline, flushed).await.is_err() {
                        return Err(Undecided::Failed(WriteError::Unavailable(
                            "admissions the leader has not replicated yet are at the limit's credit".into(),
                        )));
                    }
                }
            }
        }
    }

    /// This node's term if it is the leader with a clock fit to lead.
    fn leader_term(&self) -> Option<u64> {
        let ctx = &self.inner.ctx;
        if !ctx.clock.borrow().may_lead() || ctx.disk.borrow().full {
            return None;
        }
        let metrics = ctx.raft.metrics();
        let m = metrics.borrow();
        (m.current_leader == Some(ctx.node_id)).then_some(m.current_term)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure this term's table holds every key of `checks`: a key new to the term is
    /// read from the applied state (everything earlier leaders committed applied first) and
    /// charged its credit unless this term already did, in a committed `RateSet`.
    async fn take_over(&self, term: u64, checks: &[RateCheck], deadline: Instant) -> Result<(), Undecided> {
        let missing = |table: &mut Table| -> Vec<RateCheck> {
            if table.term != term {
                *table = Table { term, ..Table::default() };
            }
            let mut seen = std::collections::HashSet::new();
            checks.iter().filter(|c| !table.keys.contains_key(&c.key) && seen.insert(&c.key)).cloned().collect()
        };
        if missing(&mut self.table()).is_empty() {
            return Ok(());
        }
        let _one = tokio::time::timeout_at(deadline, self.inner.takeover.lock()).await.map_err(|_| late())?;
        let missing = missing(&mut self.table());
        if missing.is_empty() {
            return Ok(());
        }
        let ctx = &self.inner.ctx;
        // Everything committed before this term's first entry is applied here.
        let read = tokio::time::timeout_at(deadline, ctx.raft.get_read_log_id()).await.map_err(|_| late())?;
        let Ok((Some(read_log_id), _)) = read else { return Err(Undecided::NotLeader) };
        if read_log_id.leader_id.term != term {
            return Err(Undecided::NotLeader);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        ctx.raft
            .wait(Some(remaining))
            .applied_index_at_least(Some(read_log_id.index), "rate limiter take-over")
            .await
            .map_err(|_| late())?;
        let storage = |e: raftbox_storage::StorageError| Undecided::Failed(WriteError::Unavailable(e.to_string()));
        let now_ms = {
            let floor = self.table().floor_ms;
            ctx.clock.borrow().stamp().max(floor).max(ctx.state.clock_ms().map_err(storage)?)
        };
        let mut entries = Vec::with_capacity(missing.len());
        let mut algorithms = Vec::with_capacity(missing.len());
        for check in &missing {
            let record = ctx.state.rate_record(&check.key).map_err(storage)?;
            // A key an earlier term decided in memory may lack up to a credit of admissions
            // in the log. A key without a record had none that could still matter (see
            // `Slot::live_until_ms`); one written by `RateCheck` (term 0) lacks nothing.
            let owed = match &record {
                Some(r) if r.charged_term > term => return Err(Undecided::NotLeader),
                Some(r) if r.charged_term != 0 && r.charged_term < term => check.algorithm.credit(),
                _ => 0,
            };
            let state = match record {
                Some(record) if owed == 0 => record.state,
                record => check.algorithm.charge(record.as_ref().map(|r| &r.state), now_ms, owed),
            };
            let idle_at_ms = check.algorithm.idle_at_ms(&state, now_ms);
            let entry = RateEntry {
                key: check.key.clone(),
                state,
                idle_at_ms: purge_at(check.algorithm, idle_at_ms),
                charged_term: term,
            };
            entries.push(entry);
            algorithms.push((check.algorithm, idle_at_ms));
        }
        let written =
            tokio::time::timeout_at(deadline, ctx.proposer.submit(vec![Command::RateSet { entries: entries.clone() }]))
                .await
                .map_err(|_| late())?;
        match written {
            Ok(outcomes) if outcomes == [Outcome::Done] => {}
            Ok(outcomes) => {
                return Err(Undecided::Failed(WriteError::Unknown(format!("unexpected outcome {outcomes:?}"))))
            }
            Err(e) => return Err(Undecided::Failed(e)),
        }
        let mut table = self.table();
        if table.term != term {
            return Err(Undecided::NotLeader);
        }
        table.floor_ms = table.floor_ms.max(now_ms);
        for (entry, (algorithm, idle_at_ms)) in entries.into_iter().zip(algorithms) {
            let slot = Slot {
                algorithm,
                state: entry.state,
                idle_at_ms,
                live_until_ms: idle_at_ms.saturating_add(LIVE_EXTRA_MS),
                unreplicated: 0,
                dirty: false,
            };
            table.keys.insert(entry.key, slot);
        }
        Ok(())
    }

    /// Whether this node holds a lease on `term` now; queues a round to renew it once half of
    /// it is used, so a steady stream of admissions never waits for one.
    fn under_lease(&self, term: u64) -> bool {
        let now = BootInstant::now();
        let lease = *self.inner.lease.lock().unwrap_or_else(|e| e.into_inner());
        let Some((leased, until)) = lease else { return false };
        if leased != term || now >= until {
            return false;
        }
        if until.saturating_duration_since(now) < usable(self.inner.ctx.promises.lease()) / 2
            && !self.inner.renewing.swap(true, Ordering::AcqRel)
        {
            // Nobody waits for this round's answer; it only moves the lease on.
            let (reply, _) = oneshot::channel();
            if self.inner.confirm.try_send(Confirm { term, reply }).is_err() {
                self.inner.renewing.store(false, Ordering::Release);
            }
        }
        true
    }

    /// Waits for a quorum to confirm, after this call, that this node leads `term`.
    async fn confirm(&self, term: u64, deadline: Instant) -> bool {
        let (reply, confirmed) = oneshot::channel();
        let sent = tokio::time::timeout_at(deadline, self.inner.confirm.send(Confirm { term, reply })).await;
        matches!(sent, Ok(Ok(()))) && matches!(tokio::time::timeout_at(deadline, confirmed).await, Ok(Ok(true)))
    }
}

fn late() -> Undecided {
    Undecided::Failed(WriteError::Unavailable("the leader could not decide before the deadline".into()))
}

/// When the record of a state idle at `idle_at_ms` may be purged: after it stopped being
/// live, once any admission decided before then has stopped mattering.
fn purge_at(algorithm: Algorithm, idle_at_ms: u64) -> u64 {
    idle_at_ms.saturating_add(LIVE_EXTRA_MS).saturating_add(algorithm.idle_after_ms())
}

/// Decides every check at `stamp` (or the table's floor, if later); an admission advances
/// every key's state.
fn decide_in(table: &mut Table, checks: &[RateCheck], now_ms: u64) -> RateAnswer {
    let now_ms = now_ms.max(table.floor_ms);
    table.floor_ms = now_ms;
    let decided: Vec<(Decision, LimitState)> =
        checks.iter().map(|c| c.algorithm.check(Some(&table.keys[&c.key].state), now_ms)).collect();
    let allowed = decided.iter().all(|(d, _)| d.allowed);
    if allowed {
        for (check, (_, state)) in checks.iter().zip(&decided) {
            let slot = table.keys.get_mut(&check.key).expect("every key was taken over");
            slot.idle_at_ms = check.algorithm.idle_at_ms(state, now_ms);
            slot.algorithm = check.algorithm;
            slot.state = state.clone();
            slot.unreplicated += 1;
            slot.dirty = true;
        }
    }
    RateAnswer { allowed, decisions: decided.into_iter().map(|(d, _)| d).collect() }
}

/// Replicates changed states, many keys per `RateSet`, one at a time (so they apply in
/// the order they were decided); drops idle keys; empties the table when the node no
/// longer leads its term.
async fn replicate(inner: std::sync::Weak<Inner>) {
    let mut last_prune = Instant::now();
    loop {
        let Some(limiter) = inner.upgrade().map(|inner| Limiter { inner }) else { return };
        let _ = tokio::time::timeout(PRUNE_INTERVAL, limiter.inner.dirty.notified()).await;
        let term = limiter.table().term;
        if term != 0 && limiter.inner.ctx.raft.metrics().borrow().current_term != term {
            // A later term began: what was not replicated is the next leader's to charge.
            // Within the term the table stays, whatever the clock check says meanwhile: a
            // later take-over in this term charges nothing (its record says this term
            // charged already), so forgetting would forget admissions no log holds.
            *limiter.table() = Table::default();
            limiter.inner.flushed.notify_waiters();
            continue;
        }
        if last_prune.elapsed() >= PRUNE_INTERVAL {
            last_prune = Instant::now();
            let now_ms = limiter.inner.ctx.clock.borrow().stamp();
            limiter.table().keys.retain(|_, s| s.dirty || s.unreplicated > 0 || s.idle_at_ms > now_ms);
        }
        let (entries, flushed): (Vec<RateEntry>, Vec<(u64, u64)>) = {
            let mut table = limiter.table();
            table
                .keys
                .iter_mut()
                .filter(|(_, slot)| slot.dirty)
                .map(|(key, slot)| {
                    slot.dirty = false;
                    let entry = RateEntry {
                        key: key.clone(),
                        state: slot.state.clone(),
                        idle_at_ms: purge_at(slot.algorithm, slot.idle_at_ms),
                        charged_term: term,
                    };
                    (entry, (slot.unreplicated, slot.idle_at_ms))
                })
                .unzip()
        };
        if entries.is_empty() {
            continue;
        }
        let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
        let written = limiter.inner.ctx.proposer.submit(vec![Command::RateSet { entries }]).await;
        let ok = matches!(&written, Ok(outcomes) if outcomes == &[Outcome::Done]);
        {
            let mut table = limiter.table();
            if table.term == term {
                for (key, (count, idle_at_ms)) in keys.iter().zip(flushed) {
                    if let Some(slot) = table.keys.get_mut(key) {
                        if ok {
                            slot.unreplicated = slot.unreplicated.saturating_sub(count);
                            slot.live_until_ms = slot.live_until_ms.max(idle_at_ms.saturating_add(LIVE_EXTRA_MS));
                        } else {
                            slot.dirty = true;
                        }
                    }
                }
            }
        }
        limiter.inner.flushed.notify_waiters();
        if let Err(e) = written {
            tracing::debug!(error = %e, "replicating rate-limit states; trying again");
            tokio::time::sleep(FLUSH_RETRY_DELAY).await;
            limiter.inner.dirty.notify_one();
        }
    }
}

/// Confirms leadership for every waiting check with one round each time: a check is
/// confirmed only by a round that started after it was queued, in its own term.
///
/// A round asks every voter whether the vote it saved is still for this node in that term
/// (`ConfirmLeader`; answered from storage, outside the Raft core, so it never queues behind
/// log writes). openraft saves a vote before it grants it, so a voter that says yes had not
/// yet helped elect a later leader when it read its vote; a quorum saying yes means no later
/// leader was elected before this round began (quorums intersect).
async fn confirm_rounds(inner: std::sync::Weak<Inner>, mut confirms: mpsc::Receiver<Confirm>) {
    while let Some(first) = confirms.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = confirms.try_recv() {
            waiting.push(more);
        }
        let Some(inner) = inner.upgrade() else { return };
        let mut terms: Vec<u64> = waiting.iter().map(|c| c.term).collect();
        terms.sort_unstable();
        terms.dedup();
        let mut confirmed = Vec::new();
        for term in terms {
            let started = BootInstant::now();
            if quorum_holds(&inner.ctx, term).await {
                confirmed.push(term);
                let until = started.plus(usable(inner.ctx.promises.lease()));
                let mut lease = inner.lease.lock().unwrap_or_else(|e| e.into_inner());
                if lease.is_none_or(|(leased, before)| leased < term || (leased == term && before < until)) {
                    *lease = Some((term, until));
                }
            }
        }
        inner.renewing.store(false, Ordering::Release);
        for confirm in waiting {
            let _ = confirm.reply.send(confirmed.contains(&confirm.term));
        }
    }
}

/// Whether a quorum of every voter configuration still holds its vote for this node in
/// `term`, each answer within the write timeout.
async fn quorum_holds(ctx: &LimiterContext, term: u64) -> bool {
    let membership = ctx.raft.metrics().borrow().membership_config.membership().clone();
    let me = ctx.node_id;
    let mine = crate::log_store::stored_vote(&ctx.db)
        .is_some_and(|vote| vote.leader_id.term == term && vote.leader_id.node_id == me);
    if !mine {
        return false;
    }
    // This node's own vote counts in the quorum: it refuses other candidates for the lease too.
    ctx.promises.promise(term, me, BootInstant::now(), || {});
    let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let asks = voters.iter().filter(|id| **id != me).filter_map(|id| {
        let addr = membership.get_node(id)?.grpc_addr.clone();
        let peers = ctx.peers.clone();
        let timeout = ctx.write_timeout;
        let id = *id;
        Some(async move {
            let Ok(mut client) = peers.client(&addr) else { return (id, false) };
            let mut request = tonic::Request::new(crate::pb::ConfirmLeaderRequest { term, leader_id: me });
            request.set_timeout(timeout);
            let reply = tokio::time::timeout(timeout, client.confirm_leader(request)).await;
            (id, matches!(reply, Ok(Ok(r)) if r.get_ref().holds))
        })
    });
    let mut granted: std::collections::BTreeSet<NodeId> = [me].into();
    let is_quorum = |granted: &std::collections::BTreeSet<NodeId>| {
        membership.get_joint_config().iter().all(|config| config.intersection(granted).count() * 2 > config.len())
    };
    let mut pending: futures::stream::FuturesUnordered<_> = asks.collect();
    while !is_quorum(&granted) {
        use futures::StreamExt as _;
        match pending.next().await {
            Some((id, true)) => {
                granted.insert(id);
            }
            Some((_, false)) => {}
            None => return false,
        }
    }
    true
}

/// What the leader answers for one forwarded request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Forwarded {
    Answer(RateAnswer),
    /// Nothing was decided: the node does not lead.
    NotLeader,
    Unavailable {
        message: String,
    },
}

impl From<Result<RateAnswer, Undecided>> for Forwarded {
    fn from(decided: Result<RateAnswer, Undecided>) -> Forwarded {
        match decided {
            Ok(answer) => Forwarded::Answer(answer),
            Err(Undecided::NotLeader) => Forwarded::NotLeader,
            Err(Undecided::Failed(e)) => Forwarded::Unavailable { message: e.to_string() },
        }
    }
}

/// A follower's request waiting for the next forward. `Ok(None)` answers: nothing was
/// decided (not the leader, or the call never left this node).
struct Outgoing {
    addr: String,
    checks: Vec<RateCheck>,
    deadline: Instant,
    reply: oneshot::Sender<Result<Option<RateAnswer>, WriteError>>,
}

/// Forwards this node's checks to the leader, every request that arrived while the
/// previous call was in flight in one call (one at a time, like the proposer's batches).
async fn forward_batches(peers: Peers, mut outgoing: mpsc::Receiver<Outgoing>) {
    while let Some(first) = outgoing.recv().await {
        let mut batch = vec![first];
        while batch.len() < FORWARD_BATCH_MAX {
            match outgoing.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        // Normally all for one leader; otherwise one call per address, in turn.
        while !batch.is_empty() {
            let addr = batch[0].addr.clone();
            let (these, rest): (Vec<Outgoing>, Vec<Outgoing>) = batch.into_iter().partition(|o| o.addr == addr);
            batch = rest;
            forward(&peers, &addr, these).await;
        }
    }
}

async fn forward(peers: &Peers, addr: &str, batch: Vec<Outgoing>) {
    let now = Instant::now();
    let (batch, late): (Vec<Outgoing>, Vec<Outgoing>) = batch.into_iter().partition(|o| o.deadline > now);
    for o in late {
        let _ = o.reply.send(Err(WriteError::Unavailable("no decision before the deadline".into())));
    }
    let Some(deadline) = batch.iter().map(|o| o.deadline).max() else { return };
    let answers = rate_check_at(peers, addr, batch.iter().map(|o| &o.checks).collect(), deadline).await;
    match answers {
        Ok(Some(answers)) if answers.len() == batch.len() => {
            for (o, answer) in batch.into_iter().zip(answers) {
                let _ = o.reply.send(match answer {
                    Forwarded::Answer(answer) => Ok(Some(answer)),
                    Forwarded::NotLeader => Ok(None),
                    Forwarded::Unavailable { message } => Err(WriteError::Unavailable(message)),
                });
            }
        }
        Ok(Some(answers)) => {
            let e = WriteError::Unknown(format!("{} answers for {} requests", answers.len(), batch.len()));
            batch.into_iter().for_each(|o| drop(o.reply.send(Err(e.clone()))));
        }
        Ok(None) => batch.into_iter().for_each(|o| drop(o.reply.send(Ok(None)))),
        Err(e) => batch.into_iter().for_each(|o| drop(o.reply.send(Err(e.clone())))),
    }
}

/// One `RateCheck` call. `Ok(None)`: nothing was decided — the peer is not the leader, or
/// the request never left this node.
async fn rate_check_at(
    peers: &Peers,
    addr: &str,
    requests: Vec<&Vec<RateCheck>>,
    deadline: Instant,
) -> Result<Option<Vec<Forwarded>>, WriteError> {
    let Ok(mut client) = peers.client(addr) else { return Ok(None) };
    let encoded = serde_json::to_vec(&requests).map_err(|e| WriteError::Invalid(format!("encode: {e}")))?;
    let mut request = tonic::Request::new(RateCheckRequest { checks: encoded });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let Some(reply) = call_leader(deadline, "rate check at the leader", client.rate_check(request)).await? else {
        return Ok(None);
    };
    match reply.result {
        Some(RateCheckResult::Answers(bytes)) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| WriteError::Unknown(e.to_string()))
        }
        Some(RateCheckResult::NotLeader(_)) => Ok(None),
        None => Err(WriteError::Unknown("empty rate check reply".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(keys: &[(&str, LimitState)]) -> Table {
        let slot = |state: &LimitState| Slot {
            algorithm: Algorithm::FixedWindow { limit: 1, window_ms: 1 },
            state: state.clone(),
            idle_at_ms: 0,
            live_until_ms: 0,
            unreplicated: 0,
            dirty: false,
        };
        Table { term: 3, floor_ms: 0, keys: keys.iter().map(|(k, s)| (k.to_string(), slot(s))).collect() }
    }

    #[test]
    fn a_decision_is_all_or_nothing_and_never_goes_back_in_time() {
        let roomy = Algorithm::FixedWindow { limit: 10, window_ms: 1_000 };
        let tight = Algorithm::FixedWindow { limit: 1, window_ms: 1_000 };
        let mut table = table_with(&[("roomy", roomy.charge(None, 0, 0)), ("tight", tight.charge(None, 0, 0))]);
        let both =
            [RateCheck { key: "roomy".into(), algorithm: roomy }, RateCheck { key: "tight".into(), algorithm: tight }];
        let first = decide_in(&mut table, &both, 100);
        assert!(first.allowed);
        assert_eq!(first.decisions.iter().map(|d| d.remaining).collect::<Vec<_>>(), vec![9, 0]);
        assert!(table.keys.values().all(|s| s.unreplicated == 1 && s.dirty));
        // Rejected by the tight limit: the roomy one keeps its state.
        let second = decide_in(&mut table, &both, 200);
        assert!(!second.allowed);
        assert_eq!(table.keys["roomy"].unreplicated, 1);
        assert_eq!(table.keys["roomy"].state, LimitState::Window { window_start_ms: 0, count: 1 });
        // A clock that went back is held at the latest time used.
        let roomy_only = [RateCheck { key: "roomy".into(), algorithm: roomy }];
        assert!(decide_in(&mut table, &roomy_only, 50).allowed);
        assert_eq!(table.floor_ms, 200);
    }
}
