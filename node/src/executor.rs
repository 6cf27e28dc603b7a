//! The job executor: every node runs one. It watches its own replicated state for due jobs
//! (or expired leases), claims them and starts their attempts through one Raft command
//! (exactly one claimer wins), runs each attempt under a renewed lease and reports the
//! outcome with its fence; a report with a stale fence changes nothing. An attempt's slot is
//! given back as soon as its work is done, so the next due jobs are claimed while the report
//! is still being written.
//!
//! Webhooks: `POST <target>` with `{jobId, runId, scheduledFor, attempt, payload}` and the
//! headers `Idempotency-Key: <jobId>:<scheduledFor>`, `X-Raftbox-Fence-Token`,
//! `X-Raftbox-Job-Id`, `X-Raftbox-Run-Id`; a 2xx answer is success. Built-in types: `noop`,
//! `fail`, `sleep` (`payload.ms`) and the node's `maintenance.*` tasks.

use std::sync::Arc;
use std::time::Duration;

use raftbox_raft::RaftNode;
use raftbox_storage::command::IdempotencyOutcome;
use raftbox_storage::jobs::{
    Job, JobSpec, RunReport, RunResult, RunStatus, Schedule, RESULT_EXCERPT_BYTES_MAX, RETRY_BACKOFF_MS_MAX,
};
use raftbox_storage::paths::cut;
use raftbox_storage::records::IdempotencyResult;
use raftbox_storage::schedule::format_utc;
use raftbox_storage::{Command, Outcome, Rejection};
use rand::Rng as _;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::maintenance::FilesConfig;
use raftbox_api::webhooks::WebhookPolicy;

/// How often the executor looks at its local state for due work.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Pause between two tries of a fenced job write whose outcome is unknown.
const FENCED_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Records one maintenance command handles, at most (each is one bounded Raft command).
const MAINTENANCE_BATCH_RECORDS: u32 = 1_000;
/// Commands one maintenance run issues, at most, before it leaves the rest to the next run.
const MAINTENANCE_ROUNDS_MAX: u32 = 1_000;
/// Reports being written, at most, per attempt slot (an attempt whose work is done waits for
/// one of these before it gives its slot back).
const REPORTS_PER_SLOT: usize = 4;
/// Claims in flight at once on this node during a burst: while one waits for its log entry,
/// the next takes the places freed meanwhile.
const CLAIMS_IN_FLIGHT_MAX: usize = 2;
/// In a burst, a finished job starts a claim once this share of the places to hold claimed
/// jobs is free (1/N), so claims stay large; the next tick claims whatever is free.
const CLAIM_SHARE_MIN: usize = 4;
/// Jobs one claim takes, at most: a claim's entry is applied on every node, and a large one
/// holds up the claims of the other nodes queued behind it.
const CLAIM_JOBS_MAX: usize = 256;
/// One owner's attempts run in at most 1/N of this node's slots at once; the owner's other
/// claimed jobs wait (their leases renewed) while other owners' jobs take the free slots.
const OWNER_SLOTS_SHARE: usize = 4;
/// Slots of the node's own `maintenance.*` jobs, apart from the users' slots: they never wait
/// behind users' attempts (a `sleep` job may hold a slot for its whole timeout).
const MAINTENANCE_SLOTS: usize = 2;
/// Jobs a node holds claimed, per attempt slot. In a burst every slot runs a job while as many
/// more wait on this node for the next free slot (their leases renewed from the claim on), so
/// a freed slot starts its next job at once instead of waiting out a claim's commit.
const HELD_PER_SLOT: usize = 4;

/// Executor settings (node TOML `[jobs]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Lease of a claimed job; renewed every third of it while the attempt runs.
    pub lease_ms: u64,
    /// Attempts this node runs at once (webhook calls in flight, for webhook jobs).
    pub concurrency: u32,
    /// How long run records are kept, in seconds (7 days).
    pub run_retention_s: u64,
}

impl Default for JobsConfig {
    fn default() -> JobsConfig {
        JobsConfig { lease_ms: 30_000, concurrency: 256, run_retention_s: 7 * 24 * 3600 }
    }
}

struct Context {
    node: RaftNode,
    worker: String,
    config: JobsConfig,
    files: FilesConfig,
    http: reqwest::Client,
    webhooks: WebhookPolicy,
    /// One per users' attempt running its work.
    slots: Arc<Semaphore>,
    /// Places for one owner's attempts (`1/OWNER_SLOTS_SHARE` of the slots), by owner, while
    /// any of theirs runs or waits.
    owners: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
    /// One per `maintenance.*` attempt running its work.
    maintenance_slots: Arc<Semaphore>,
    /// One per job claimed by this node whose work is not done yet (running or waiting for a
    /// slot): `HELD_PER_SLOT` per slot.
    held: Arc<Semaphore>,
    /// One per attempt writing its report (the work done, its slot given back).
    reports: Arc<Semaphore>,
    /// Woken when a job's place is given back, so due jobs are claimed without waiting for a tick.
    freed: Notify,
    /// One per claim in flight.
    claims: Arc<Semaphore>,
    /// True while the last claim took all it asked for: more may be due.
    burst: watch::Sender<bool>,
}

impl Context {
    /// The places of `owner`'s share of the slots (made when their first job waits).
    fn owner_share(&self, owner: &str) -> Arc<Semaphore> {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let share = (self.config.concurrency.max(1) as usize).div_ceil(OWNER_SLOTS_SHARE);
        owners.entry(owner.to_string()).or_insert_with(|| Arc::new(Semaphore::new(share))).clone()
    }

    /// Drops `owner`'s share once none of their attempts holds or waits for it (the map holds
    /// only owners with work on this node).
    fn forget_idle_owner(&self, owner: &str) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.get(owner).is_some_and(|share| Arc::strong_count(share) == 1) {
            owners.remove(owner);
        }
    }
}

/// Runs until `stopped` resolves.
pub async fn run(
    node: RaftNode,
    config: JobsConfig,
    files: FilesConfig,
    webhooks: WebhookPolicy,
    stopped: impl std::future::Future<Output = ()>,
) {
    let worker = format!("node{}-{}", node.id(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let concurrency = config.concurrency.max(1) as usize;
    let slots = Arc::new(Semaphore::new(concurrency));
    let held = Arc::new(Semaphore::new(concurrency.saturating_mul(HELD_PER_SLOT)));
    let reports = Arc::new(Semaphore::new(concurrency.saturating_mul(REPORTS_PER_SLOT)));
    // Never a default client in its place: it would honour proxies and skip the resolver's rule.
    let http = match webhook_client(webhooks.clone()) {
        Ok(http) => http,
        Err(e) => {
            tracing::error!(error = %e, "the webhook client cannot be built; this node runs no jobs");
            return;
        }
    };
    let freed = Notify::new();
    let burst = watch::Sender::new(false);
    let claims = Arc::new(Semaphore::new(CLAIMS_IN_FLIGHT_MAX));
    let ctx = Arc::new(Context {
        node,
        worker,
        config,
        files,
        http,
        webhooks,
        slots,
        owners: Default::default(),
        maintenance_slots: Arc::new(Semaphore::new(MAINTENANCE_SLOTS)),
        held,
        reports,
        freed,
        claims,
        burst,
    });
    let mut wake = tokio::time::Instant::now();
    tokio::pin!(stopped);
    loop {
        let freed = tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep_until(wake) => false,
            _ = ctx.freed.notified() => true,
        };
        if !freed {
            wake = next_wake(&ctx.node);
        }
        // In a burst (the last claim took all it asked for, so more may be due) claim again as
        // soon as a share of the places to hold jobs is free, up to CLAIMS_IN_FLIGHT_MAX at
        // once, without looking at the due index first; otherwise one claim at a time, on a
        // tick, when something is due.
        let burst = *ctx.burst.borrow();
        if freed && !burst {
            continue;
        }
        if !burst && ctx.claims.available_permits() < CLAIMS_IN_FLIGHT_MAX {
            continue;
        }
        let Ok(place) = ctx.claims.clone().try_acquire_owned() else { continue };
        let free = ctx.held.available_permits().min(CLAIM_JOBS_MAX);
        let enough = if freed {
            (ctx.config.concurrency.max(1) as usize).saturating_mul(HELD_PER_SLOT).div_ceil(CLAIM_SHARE_MIN)
        } else {
            1
        };
        if free < enough {
            continue;
        }
        if !burst && !ctx.node.state().claimable_at(ctx.node.cluster_now_ms()).unwrap_or(false) {
            continue;
        }
        // A node whose clock the cluster does not agree with claims nothing: it would judge
        // what is due, and when, by a wrong clock.
        if !ctx.node.clock().may_lead() {
            continue;
        }
        let Ok(held) = ctx.held.clone().try_acquire_many_owned(free as u32) else { continue };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let all = claim(&ctx, held, free).await;
            ctx.burst.send_if_modified(|burst| std::mem::replace(burst, all) != all);
            drop(place);
            // The loop may have skipped a freed slot while this claim held the last place.
            ctx.freed.notify_one();
        });
    }
}

/// When to look for due work next: after `POLL_INTERVAL`, or sooner, at the moment the next
/// job falls due (or a lease expires) if that is within it, so a job due at a given instant is
/// claimed then, not up to one interval late.
fn next_wake(node: &RaftNode) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    let now_ms = node.cluster_now_ms();
    let next = node.state().next_claimable_ms(now_ms + POLL_INTERVAL.as_millis() as u64).ok().flatten();
    match next {
        Some(at_ms) if at_ms > now_ms => now + Duration::from_millis(at_ms - now_ms + 1),
        _ => now + POLL_INTERVAL,
    }
}

/// Claims and starts up to `free` jobs, one place of `held` each; whether it got all it asked
/// for (the places it did not use are given back).
async fn claim(ctx: &Arc<Context>, mut held: OwnedSemaphorePermit, free: usize) -> bool {
    // The claim runs under a key of its own, so that a claim whose outcome is unknown can be
    // repeated: the repeat replays the jobs the first one claimed (instead of leaving them
    // claimed by no one who knows, until their lease runs out) or claims them now. It also
    // starts each claimed job's attempt (one command, not a claim and then a start per job):
    // the i-th job claimed runs as `run_ids[i]`.
    let key = *blake3::hash(format!("claim/{}/{}", ctx.worker, uuid::Uuid::new_v4()).as_bytes()).as_bytes();
    let run_ids: Vec<String> = (0..free).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let command = Command::Idempotent {
        scope: key,
        fingerprint: key,
        ttl_ms: ctx.config.lease_ms,
        on_success: None,
        command: Box::new(Command::ClaimAndStartJobs {
            worker: ctx.worker.clone(),
            lease_ms: ctx.config.lease_ms,
            run_ids: run_ids.clone(),
            run_ttl_ms: ctx.config.run_retention_s.saturating_mul(1_000),
        }),
    };
    let asked = tokio::time::Instant::now();
    let lease_end = asked + Duration::from_millis(ctx.config.lease_ms);
    let claimed = match repeat_while_unknown(&ctx.node, command, lease_end).await.map(|(outcome, _)| outcome) {
        Ok(Outcome::Idempotency(IdempotencyOutcome::Applied { outcome })) => *outcome,
        Ok(Outcome::Idempotency(IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(outcome) })) => {
            *outcome
        }
        Ok(other) => {
            tracing::warn!(outcome = ?other, "unexpected claim outcome");
            return false;
        }
        Err(e) => {
            tracing::debug!(error = %e, "claim failed");
            return false;
        }
    };
    let Outcome::JobsClaimed { jobs } = claimed else {
        tracing::warn!(outcome = ?claimed, "unexpected claim outcome");
        return false;
    };
    let all = jobs.len() == free;
    tracing::debug!(asked = free, claimed = jobs.len(), ms = asked.elapsed().as_millis() as u64, "claimed");
    for (job, run_id) in jobs.into_iter().zip(run_ids) {
        // One run id per place, so there is a place for every job claimed.
        let Some(place) = held.split(1) else { break };
        let ctx = ctx.clone();
        tokio::spawn(async move { attempt(&ctx, job, run_id, place, asked).await });
    }
    all
}

/// One attempt, started by its claim: wait for a slot (in claim order: the semaphore is fair),
/// execute, give the slot and the place back, report (fenced). The lease is renewed from the
/// claim until the work is done. The state machine decides what follows (a retry, the next
/// fire by the job's current schedule, or the end), so a PATCH made meanwhile governs.
///
/// A lease stops work ([`Lease`]): the attempt starts only with half its lease left, and is
/// dropped (its HTTP request with it) once a renewal is refused, or when only a quarter of
/// the lease is left unrenewed. The lease is counted on this node's monotonic clock from when
/// the claim or renewal was *asked*, so this node's view of it ends before the cluster's
/// does: a later claimer's call (a higher fence) never meets this one's still under way. An
/// attempt stopped unrenewed reports itself failed (fenced: refused if someone claimed it).
async fn attempt(ctx: &Context, job: Job, run_id: String, place: OwnedSemaphorePermit, asked: tokio::time::Instant) {
    let lease_ms = ctx.config.lease_ms;
    let (held_tx, mut held) = watch::channel(Lease::claimed(asked, lease_ms));
    let renewer = tokio::spawn(renew(ctx.node.clone(), job.id.clone(), job.fence, lease_ms, held_tx, asked));
    // Never closed: the error arm is unreachable, and running without a slot would only
    // exceed the concurrency, never lose the job. A user's attempt first takes a place of its
    // owner's share, so one owner never holds more than that share of the slots.
    let slot = if job.job_type.starts_with("maintenance.") {
        (None, ctx.maintenance_slots.clone().acquire_owned().await.ok())
    } else {
        let share = ctx.owner_share(&job.owner_user_id);
        let owner_place = share.acquire_owned().await.ok();
        (owner_place, ctx.slots.clone().acquire_owned().await.ok())
    };
    if let Some(scheduled_ms) = job.scheduled_for_ms {
        let late_s = ctx.node.cluster_now_ms().saturating_sub(scheduled_ms) as f64 / 1_000.0;
        ctx.node.node_metrics().job_start_lateness_seconds.observe(late_s);
    }
    let ran = if !held.borrow().may_start(tokio::time::Instant::now()) {
        tracing::info!(job = %job.id, fence = job.fence, "lease too short to start the attempt; left to expire");
        None
    } else {
        run_while_held(execute(ctx, &job, &run_id), &mut held).await
    };
    renewer.abort();
    // The work is done: its slot and place go to the next jobs while the report is written.
    // Reports in flight are bounded (a place is free once a report ends, each within its
    // lease), and the semaphore is never closed.
    let report_place = ctx.reports.clone().acquire_owned().await.ok();
    drop(slot);
    ctx.forget_idle_owner(&job.owner_user_id);
    drop(place);
    ctx.freed.notify_one();
    let ran = match ran {
        Some(ran) => ran,
        // Claimed by another: nothing more of this attempt may reach the target, and its
        // report would meet a stale fence.
        None if held.borrow().is_lost() => {
            return tracing::warn!(job = %job.id, fence = job.fence, "lease refused: the attempt is dropped");
        }
        None => {
            tracing::warn!(job = %job.id, fence = job.fence, "lease not renewed in time: the attempt is stopped");
            Ran {
                status: RunStatus::Failed,
                error: Some("stopped: this node could not renew the job's lease in time".into()),
                result: None,
            }
        }
    };
    let report = RunReport {
        job_id: job.id.clone(),
        fence: job.fence,
        status: ran.status,
        error: ran.error,
        result: ran.result,
        retry_at_ms: ctx.node.cluster_now_ms() + backoff_ms(job.retry_backoff_ms, job.attempts),
    };
    // The lease was renewed until now: the report may be repeated until it would lapse.
    let lease_end = tokio::time::Instant::now() + Duration::from_millis(ctx.config.lease_ms);
    match repeat_while_unknown(&ctx.node, Command::FinishRun(Box::new(report)), lease_end).await {
        Ok((Outcome::Done, _)) => tracing::debug!(job = %job.id, status = ?ran.status, "attempt finished"),
        // A repeat of a report that took effect finds the fence no longer holding.
        Ok((Outcome::Rejected(Rejection::StaleFence { .. }), true)) => {
            tracing::debug!(job = %job.id, "attempt report applied by an earlier try")
        }
        Ok((other, _)) => tracing::info!(job = %job.id, outcome = ?other, "attempt report refused"),
        Err(e) => tracing::warn!(job = %job.id, error = %e, "attempt report lost; the lease will expire"),
    }
    drop(report_place);
}

/// Writes a job command, repeating it while its outcome is unknown, until `deadline`.
/// Only for commands whose repeat is safe, never blind: a report carries the fence of this
/// worker's claim, so a repeat of one that took effect is refused by the fence check and
/// changes nothing; a claim (which also starts the runs) runs under its own idempotency key
/// and a repeat replays it. Returns the outcome and whether it answers a repeat (so a refusal
/// may mean "done before").
async fn repeat_while_unknown(
    node: &RaftNode,
    command: Command,
    deadline: tokio::time::Instant,
) -> Result<(Outcome, bool), raftbox_raft::WriteError> {
    let mut repeated = false;
    loop {
        match node.write(command.clone()).await {
            Ok(outcome) => return Ok((outcome, repeated)),
            Err(
                e @ (raftbox_raft::WriteError::ShuttingDown
                | raftbox_raft::WriteError::Invalid(_)
                | raftbox_raft::WriteError::TooLarge { .. }),
            ) => return Err(e),
            Err(e) if tokio::time::Instant::now() + FENCED_RETRY_PAUSE >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "fenced job write without an answer; repeating it");
                repeated = true;
                tokio::time::sleep(FENCED_RETRY_PAUSE).await;
            }
        }
    }
}

/// Exponential backoff (doubling from `base_ms`, at most 1 h) with equal jitter.
fn backoff_ms(base_ms: u64, attempts: u32) -> u64 {
    let delay = base_ms.saturating_mul(1u64 << attempts.saturating_sub(1).min(31)).min(RETRY_BACKOFF_MS_MAX);
    delay / 2 + rand::thread_rng().gen_range(0..=delay / 2)
}

/// Runs `work` while the lease holds (see [`Lease`]); `None` if it was dropped first.
async fn run_while_held<T>(work: impl std::future::Future<Output = T>, held: &mut watch::Receiver<Lease>) -> Option<T> {
    tokio::pin!(work);
    loop {
        let until = held.borrow().ends_at();
        tokio::select! {
            done = &mut work => return Some(done),
            changed = held.changed() => {
                if changed.is_err() || held.borrow().is_lost() {
                    return None;
                }
            }
            _ = tokio::time::sleep_until(until) => return None,
        }
    }
}

/// Renews the lease every quarter of it, counted from when the claim (`claimed`) or the last
/// renewal was asked (a slow claim renews at once), a failed renewal again after a short
/// pause; tells the attempt how long it holds the lease.
async fn renew(
    node: RaftNode,
    job_id: String,
    fence: u64,
    lease_ms: u64,
    held: watch::Sender<Lease>,
    claimed: tokio::time::Instant,
) {
    let period = Duration::from_millis((lease_ms / 4).max(1));
    let mut next = claimed + period;
    loop {
        tokio::time::sleep_until(next).await;
        let asked = tokio::time::Instant::now();
        match node.write(Command::RenewLease { job_id: job_id.clone(), fence, lease_ms }).await {
            Ok(Outcome::Done) => {
                held.send_modify(|lease| lease.renewed(asked));
                next = asked + period;
            }
            Ok(other) => {
                held.send_modify(Lease::refused);
                return tracing::info!(job = %job_id, outcome = ?other, "lease lost");
            }
            Err(e) => {
                tracing::debug!(job = %job_id, error = %e, "lease renewal failed; retrying");
                next = tokio::time::Instant::now() + FENCED_RETRY_PAUSE;
            }
        }
    }
}

/// This node's view of a claimed job's lease: held until `until` (counted from when the claim
/// or the last renewal was asked), unless refused.
#[derive(Debug, Clone, Copy)]
struct Lease {
    until: tokio::time::Instant,
    lease: Duration,
    refused: bool,
}

impl Lease {
    fn claimed(asked: tokio::time::Instant, lease_ms: u64) -> Lease {
        let lease = Duration::from_millis(lease_ms);
        Lease { until: asked + lease, lease, refused: false }
    }

    /// What must be left of the lease for work to go on: a quarter of it (one renewal
    /// period), so renewals that fail (each tried again shortly) for half the lease stop it.
    fn margin(&self) -> Duration {
        self.lease / 4
    }

    fn renewed(&mut self, asked: tokio::time::Instant) {
        self.until = self.until.max(asked + self.lease);
    }

    fn refused(&mut self) {
        self.refused = true;
    }

    /// When the work must stop unless renewed meanwhile.
    fn ends_at(&self) -> tokio::time::Instant {
        self.until.checked_sub(self.margin()).unwrap_or(self.until)
    }

    /// Work starts only with a renewal period to spare before [`Lease::ends_at`] (half the
    /// lease left), so it is never started only to be stopped.
    fn may_start(&self, now: tokio::time::Instant) -> bool {
        !self.refused && now + self.margin() <= self.ends_at()
    }

    fn is_lost(&self) -> bool {
        self.refused
    }
}

/// What an attempt came to.
struct Ran {
    status: RunStatus,
    error: Option<String>,
    result: Option<RunResult>,
}

async fn execute(ctx: &Context, job: &Job, run_id: &str) -> Ran {
    let timeout = Duration::from_secs(job.timeout_s.max(1));
    let work = async {
        match job.job_type.as_str() {
            "webhook" => webhook(ctx, job, run_id).await,
            "noop" => Ok(summary("ok")),
            "fail" => Err(("the fail task always fails".to_string(), None)),
            "sleep" => {
                let ms = job.payload.get("ms").and_then(|v| v.as_u64()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(summary(&format!("slept {ms} ms")))
            }
            kind if kind.starts_with("maintenance.") => maintain(ctx, kind).await.map_err(|e| (e, None)),
            other => Err((format!("unknown job type {other:?}"), None)),
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(result)) => Ran { status: RunStatus::Succeeded, error: None, result: Some(result) },
        Ok(Err((error, result))) => Ran { status: RunStatus::Failed, error: Some(error), result },
        Err(_) => Ran {
            status: RunStatus::TimedOut,
            error: Some(format!("timed out after {} s", job.timeout_s)),
            result: None,
        },
    }
}

fn summary(text: &str) -> RunResult {
    RunResult { http_status: None, excerpt: text.to_string() }
}

/// The call a webhook job makes. Its result keeps the HTTP status and the first
/// [`RESULT_EXCERPT_BYTES_MAX`] bytes of the answer (read no further).
async fn webhook(ctx: &Context, job: &Job, run_id: &str) -> Result<RunResult, (String, Option<RunResult>)> {
    // An address literal does not pass the resolver: check it here (the rule may also have
    // changed since the job was created).
    ctx.webhooks.check_form(&job.target).map_err(|e| (e, None))?;
    let scheduled_for = format_utc(job.scheduled_for_ms.unwrap_or(0));
    let body = json!({
        "jobId": job.id, "runId": run_id, "scheduledFor": scheduled_for, "attempt": job.attempts, "payload": job.payload,
    });
    let body = serde_json::to_vec(&body).map_err(|e| (format!("encode the call's body: {e}"), None))?;
    // The fire's id: the same on every retry, as the idempotency key.
    let message_id = format!("{}:{scheduled_for}", job.id);
    let mut request = ctx
        .http
        .post(&job.target)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", &message_id)
        .header("X-Raftbox-Fence-Token", job.fence.to_string())
        .header("X-Raftbox-Job-Id", &job.id)
        .header("X-Raftbox-Run-Id", run_id);
    // Signed with the owner's secret (Standard Webhooks); a cluster below the format that
    // keeps secrets sends the call unsigned, as before.
    let secret = raftbox_api::webhooks::ensure_secret(&ctx.node, &job.owner_user_id)
        .await
        .map_err(|e| (format!("the owner's webhook secret: {e}"), None))?;
    if let Some(secret) = secret {
        let now_ms = ctx.node.cluster_now_ms();
        let timestamp = now_ms / 1_000;
        let signature = raftbox_api::webhooks::signature(&secret.signing(now_ms), &message_id, timestamp, &body);
        request = request
            .header("webhook-id", &message_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature);
    }
    let mut response =
        request.body(body).send().await.map_err(|e| (format!("call {}: {}", job.target, error_chain(&e)), None))?;
    let status = response.status();
    let mut head = Vec::new();
    while head.len() < RESULT_EXCERPT_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let result =
        RunResult { http_status: Some(status.as_u16()), excerpt: cut(&text, RESULT_EXCERPT_BYTES_MAX).to_string() };
    if status.is_success() {
        Ok(result)
    } else {
        Err((format!("{} answered {status}", job.target), Some(result)))
    }
}

/// An error and its causes, one line (a refused address is in a cause).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The webhook client: no redirects, and a resolver that drops every address the webhook
/// rule refuses (so a name that resolves to the node's own network is refused at call time,
/// whatever it resolved to when the job was created).
fn webhook_client(policy: WebhookPolicy) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // Never through a proxy named in the environment: the proxy, not the filtering
        // resolver below, would then resolve (and reach) the target.
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver { policy }))
        .build()
}

struct CheckedResolver {
    policy: WebhookPolicy,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let by_name = policy.allows_name(&host);
            let (allowed, refused): (Vec<_>, Vec<_>) = found.partition(|addr| by_name || policy.allows_ip(addr.ip()));
            if allowed.is_empty() {
                let refused: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
                let message = format!(
                    "{host} resolves only to addresses webhooks may not call ({}); allow them in [webhooks] allow",
                    refused.join(", ")
                );
                return Err(message.into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// The node's own periodic work, run as built-in jobs so it is claimed once cluster-wide.
/// Each command is bounded; the task repeats it while the state machine reports more due, so
/// maintenance keeps up with any load.
async fn maintain(ctx: &Context, kind: &str) -> Result<RunResult, String> {
    let mut total = 0;
    for _ in 0..MAINTENANCE_ROUNDS_MAX {
        // Every cutoff from the replicated clock (the newest leader stamp applied here, after
        // a read barrier), never this node's wall clock: a node whose clock runs ahead would
        // expire history and collect chunks that are still within their retention. It may lag
        // real time, which only keeps more.
        ctx.node.read_barrier().await.map_err(|e| e.to_string())?;
        let now = ctx.node.state().clock_ms().map_err(|e| e.to_string())?;
        let command = match kind {
            "maintenance.purge_expired" => Command::PurgeExpired { max_records: MAINTENANCE_BATCH_RECORDS },
            "maintenance.expire_versions" => Command::ExpireVersions {
                superseded_before_ms: now.saturating_sub(ctx.files.version_retention_s.saturating_mul(1_000)),
                max_versions: MAINTENANCE_BATCH_RECORDS,
            },
            "maintenance.collect_orphans" => Command::CollectOrphans {
                orphaned_before_ms: now.saturating_sub(ctx.files.orphan_grace_s.saturating_mul(1_000)),
                max_chunks: MAINTENANCE_BATCH_RECORDS,
            },
            "maintenance.expire_runs" => Command::ExpireRuns { before_ms: now, max_runs: MAINTENANCE_BATCH_RECORDS },
            other => return Err(format!("unknown maintenance task {other:?}")),
        };
        let (n, more) = match ctx.node.write(command).await.map_err(|e| e.to_string())? {
            Outcome::Purged { records, more } => (records, more),
            Outcome::Collected { removed, more } => (removed, more),
            other => return Err(format!("unexpected outcome {other:?}")),
        };
        total += n;
        if !more {
            break;
        }
    }
    if total > 0 {
        tracing::info!(removed = total, "maintenance: {kind}");
    }
    Ok(summary(&format!("removed {total}")))
}

/// The built-in recurring maintenance jobs, firing every `interval_s` (any interval: they
/// use an interval schedule, not cron).
pub fn system_jobs(interval_s: u64, now_ms: u64) -> Vec<Job> {
    let every_ms = interval_s.max(1).saturating_mul(1_000);
    let first = now_ms.saturating_add(every_ms);
    ["purge_expired", "expire_versions", "collect_orphans", "expire_runs"]
        .into_iter()
        .map(|task| {
            let spec = JobSpec {
                id: format!("system-{task}"),
                owner_user_id: "system".into(),
                job_type: format!("maintenance.{task}"),
                target: String::new(),
                payload: json!({}),
                schedule: Schedule::Interval { every_ms },
                max_retries: 0,
                retry_backoff_ms: 1_000,
                timeout_s: 300,
            };
            Job::scheduled(spec, Some(first))
        })
        .collect()
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[test]
    fn work_starts_with_half_the_lease_left_and_stops_with_a_quarter() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut lease = Lease::claimed(t0, 30_000);
        assert!(lease.may_start(t0 + ms(15_000)));
        assert!(!lease.may_start(t0 + ms(15_001)), "less than half left: too short to start");
        assert_eq!(lease.ends_at(), t0 + ms(22_500), "work stops with a quarter left");
        // A renewal counts from when it was asked, never from when it was answered.
        lease.renewed(t0 + ms(7_500));
        assert_eq!(lease.ends_at(), t0 + ms(30_000));
        // A renewal asked earlier than the last one never shortens the lease.
        lease.renewed(t0 + ms(5_000));
        assert_eq!(lease.ends_at(), t0 + ms(30_000));
        lease.refused();
        assert!(lease.is_lost() && !lease.may_start(t0), "a refused lease stops the work at once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        for (attempts, low, high) in [(1, 500, 1_000), (2, 1_000, 2_000), (3, 2_000, 4_000), (40, 1_800_000, 3_600_000)]
        {
            for _ in 0..50 {
                let delay = backoff_ms(1_000, attempts);
                assert!((low..=high).contains(&delay), "attempt {attempts}: {delay}");
            }
        }
    }

    #[test]
    fn system_jobs_follow_the_interval() {
        let jobs = system_jobs(60, 1_000);
        assert_eq!(jobs.len(), 4);
        assert!(jobs.iter().all(|j| j.owner_user_id == "system" && j.next_run_at_ms.is_some()));
        for interval_s in [1, 45, 60, 7_200] {
            assert_eq!(system_jobs(interval_s, 1_000)[0].schedule, Schedule::Interval { every_ms: interval_s * 1_000 });
        }
    }

    /// A one-shot HTTP server on loopback answering every request with `response`; the
    /// number of requests it got.
    async fn serve(response: &'static str) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        (port, hits)
    }

    fn policy(allow: &[&str]) -> WebhookPolicy {
        let config = raftbox_api::webhooks::WebhooksConfig { allow: allow.iter().map(|s| s.to_string()).collect() };
        WebhookPolicy::new(&config).expect("policy")
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_call_time() {
        let (port, hits) = serve("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        let refused =
            webhook_client(policy(&[])).expect("client").post(format!("http://localhost:{port}/")).send().await;
        let error = refused.expect_err("localhost resolves to loopback");
        assert!(error_chain(&error).contains("may not call"), "{}", error_chain(&error));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the target was called");
        let allowed = webhook_client(policy(&["127.0.0.0/8", "::1/128"]))
            .expect("client")
            .post(format!("http://localhost:{port}/"))
            .send()
            .await;
        assert_eq!(allowed.expect("allowed").status(), 200);
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (port, hits) = serve(
            "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data/\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        let answer = webhook_client(policy(&["127.0.0.0/8"]))
            .expect("client")
            .post(format!("http://127.0.0.1:{port}/"))
            .send()
            .await;
        assert_eq!(answer.expect("answered").status(), 302);
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
