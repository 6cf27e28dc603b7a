//! The job executor: every node runs one. It watches its own replicated state for due jobs
//! (or expired leases), claims them through one Raft command (exactly one claimer wins),
//! runs each attempt under a renewed lease and reports the outcome with its fence; a report
//! with a stale fence changes nothing.
//!
//! Webhooks: `POST <target>` with `{jobId, runId, scheduledFor, attempt, payload}` and the
//! headers `Idempotency-Key: <jobId>:<scheduledFor>`, `X-Raftbox-Fence-Token`,
//! `X-Raftbox-Job-Id`, `X-Raftbox-Run-Id`; a 2xx answer is success. Built-in types: `noop`,
//! `fail`, `sleep` (`payload.ms`) and the node's `maintenance.*` tasks.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raftbox_raft::RaftNode;
use raftbox_storage::jobs::{Job, JobSpec, RunReport, RunStatus, Schedule, RETRY_BACKOFF_MS_MAX};
use raftbox_storage::schedule::{format_utc, CronSchedule};
use raftbox_storage::{Command, Outcome};
use rand::Rng as _;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::maintenance::FilesConfig;

/// How often the executor looks at its local state for due work.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Executor settings (node TOML `[jobs]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Lease of a claimed job; renewed every third of it while the attempt runs.
    pub lease_ms: u64,
    /// Attempts this node runs at once.
    pub concurrency: u32,
    /// How long run records are kept, in seconds (7 days).
    pub run_retention_s: u64,
}

impl Default for JobsConfig {
    fn default() -> JobsConfig {
        JobsConfig { lease_ms: 30_000, concurrency: 256, run_retention_s: 7 * 24 * 3600 }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Context {
    node: RaftNode,
    worker: String,
    config: JobsConfig,
    files: FilesConfig,
    http: reqwest::Client,
    slots: Arc<Semaphore>,
}

/// Runs until `stopped` resolves.
pub async fn run(
    node: RaftNode,
    config: JobsConfig,
    files: FilesConfig,
    stopped: impl std::future::Future<Output = ()>,
) {
    let worker = format!("node{}-{}", node.id(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1) as usize));
    let http = reqwest::Client::builder().build().unwrap_or_default();
    let ctx = Arc::new(Context { node, worker, config, files, http, slots });
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = ticks.tick() => {}
        }
        let due = ctx.node.state().next_claimable_ms().ok().flatten().is_some_and(|t| t <= now_ms());
        let free = ctx.slots.available_permits();
        if due && free > 0 {
            claim(&ctx, free).await;
        }
    }
}

async fn claim(ctx: &Arc<Context>, free: usize) {
    let command =
        Command::ClaimJobs { worker: ctx.worker.clone(), lease_ms: ctx.config.lease_ms, max_jobs: free as u32 };
    let jobs = match ctx.node.write(command).await {
        Ok(Outcome::JobsClaimed { jobs }) => jobs,
        Ok(other) => return tracing::warn!(outcome = ?other, "unexpected claim outcome"),
        Err(e) => return tracing::debug!(error = %e, "claim failed"),
    };
    for job in jobs {
        let Ok(permit) = ctx.slots.clone().try_acquire_owned() else {
            // More claimed than slots (cannot happen with max_jobs = free); the lease expires.
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            attempt(&ctx, job).await;
            drop(permit);
        });
    }
}

/// One attempt: start (fenced), execute with lease renewal, report (fenced).
async fn attempt(ctx: &Context, job: Job) {
    let run_id = uuid::Uuid::new_v4().to_string();
    let start = Command::StartRun {
        job_id: job.id.clone(),
        fence: job.fence,
        run_id: run_id.clone(),
        worker: ctx.worker.clone(),
    };
    match ctx.node.write(start).await {
        Ok(Outcome::Done) => {}
        Ok(other) => return tracing::info!(job = %job.id, outcome = ?other, "attempt not started"),
        Err(e) => return tracing::warn!(job = %job.id, error = %e, "attempt not started; the lease will expire"),
    }
    let renewer = tokio::spawn(renew(ctx.node.clone(), job.id.clone(), job.fence, ctx.config.lease_ms));
    let (status, error) = execute(ctx, &job, &run_id).await;
    renewer.abort();
    let report = RunReport {
        job_id: job.id.clone(),
        fence: job.fence,
        status,
        error,
        retry_at_ms: now_ms() + backoff_ms(job.retry_backoff_ms, job.attempts),
        next_fire_ms: next_fire(&job.schedule, job.scheduled_for_ms, now_ms()),
        run_ttl_ms: ctx.config.run_retention_s * 1_000,
    };
    match ctx.node.write(Command::FinishRun(Box::new(report))).await {
        Ok(Outcome::Done) => tracing::debug!(job = %job.id, ?status, "attempt finished"),
        Ok(other) => tracing::info!(job = %job.id, outcome = ?other, "attempt report refused"),
        Err(e) => tracing::warn!(job = %job.id, error = %e, "attempt report lost; the lease will expire"),
    }
}

/// A cron job's next fire after this one: the first after both the fire and now, so fires
/// missed while the cluster was down coalesce into the one that just ran.
fn next_fire(schedule: &Schedule, scheduled_for_ms: Option<u64>, now_ms: u64) -> Option<u64> {
    match schedule {
        Schedule::Cron(cron) => cron.next_after(now_ms.max(scheduled_for_ms.unwrap_or(0))),
        Schedule::Once { .. } => None,
    }
}

/// Exponential backoff (doubling from `base_ms`, at most 1 h) with equal jitter.
fn backoff_ms(base_ms: u64, attempts: u32) -> u64 {
    let delay = base_ms.saturating_mul(1u64 << attempts.saturating_sub(1).min(31)).min(RETRY_BACKOFF_MS_MAX);
    delay / 2 + rand::thread_rng().gen_range(0..=delay / 2)
}

async fn renew(node: RaftNode, job_id: String, fence: u64, lease_ms: u64) {
    let mut ticks = tokio::time::interval(Duration::from_millis((lease_ms / 3).max(1)));
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match node.write(Command::RenewLease { job_id: job_id.clone(), fence, lease_ms }).await {
            Ok(Outcome::Done) => {}
            Ok(other) => return tracing::info!(job = %job_id, outcome = ?other, "lease lost"),
            Err(e) => tracing::debug!(job = %job_id, error = %e, "lease renewal failed; retrying"),
        }
    }
}

async fn execute(ctx: &Context, job: &Job, run_id: &str) -> (RunStatus, Option<String>) {
    let timeout = Duration::from_secs(job.timeout_s.max(1));
    let work = async {
        match job.job_type.as_str() {
            "webhook" => webhook(ctx, job, run_id).await,
            "noop" => Ok(()),
            "fail" => Err("the fail task always fails".to_string()),
            "sleep" => {
                let ms = job.payload.get("ms").and_then(|v| v.as_u64()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
            kind if kind.starts_with("maintenance.") => maintain(ctx, kind).await,
            other => Err(format!("unknown job type {other:?}")),
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(())) => (RunStatus::Succeeded, None),
        Ok(Err(error)) => (RunStatus::Failed, Some(error)),
        Err(_) => (RunStatus::TimedOut, Some(format!("timed out after {} s", job.timeout_s))),
    }
}

async fn webhook(ctx: &Context, job: &Job, run_id: &str) -> Result<(), String> {
    let scheduled_for = format_utc(job.scheduled_for_ms.unwrap_or(0));
    let body = json!({
        "jobId": job.id, "runId": run_id, "scheduledFor": scheduled_for, "attempt": job.attempts, "payload": job.payload,
    });
    let response = ctx
        .http
        .post(&job.target)
        .header("Idempotency-Key", format!("{}:{scheduled_for}", job.id))
        .header("X-Raftbox-Fence-Token", job.fence.to_string())
        .header("X-Raftbox-Job-Id", &job.id)
        .header("X-Raftbox-Run-Id", run_id)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("call {}: {e}", job.target))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{} answered {status}", job.target))
    }
}

/// The node's own periodic work, run as built-in jobs so it is claimed once cluster-wide.
async fn maintain(ctx: &Context, kind: &str) -> Result<(), String> {
    let now = now_ms();
    let command = match kind {
        "maintenance.purge_expired" => Command::PurgeExpired { max_records: 1_000 },
        "maintenance.expire_versions" => Command::ExpireVersions {
            created_before_ms: now.saturating_sub(ctx.files.version_retention_s * 1_000),
            max_versions: 1_000,
        },
        "maintenance.collect_orphans" => Command::CollectOrphans {
            orphaned_before_ms: now.saturating_sub(ctx.files.orphan_grace_s * 1_000),
            max_chunks: 1_000,
        },
        "maintenance.expire_runs" => Command::ExpireRuns { before_ms: now, max_runs: 1_000 },
        other => return Err(format!("unknown maintenance task {other:?}")),
    };
    match ctx.node.write(command).await.map_err(|e| e.to_string())? {
        Outcome::Purged { records: n } | Outcome::Collected { removed: n } if n > 0 => {
            tracing::info!(removed = n, "maintenance: {kind}");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The built-in recurring maintenance jobs, firing every `interval_s`.
pub fn system_jobs(interval_s: u64) -> Vec<Job> {
    let expr = if interval_s < 60 {
        format!("*/{} * * * * *", interval_s.max(1))
    } else {
        format!("0 */{} * * * *", (interval_s / 60).clamp(1, 59))
    };
    let cron = CronSchedule::parse(&expr, "UTC")
        .unwrap_or_else(|_| CronSchedule { expr: "0 * * * * *".into(), timezone: "UTC".into() });
    let first = cron.next_after(now_ms());
    ["purge_expired", "expire_versions", "collect_orphans", "expire_runs"]
        .into_iter()
        .map(|task| {
            let spec = JobSpec {
                id: format!("system-{task}"),
                owner_user_id: "system".into(),
                job_type: format!("maintenance.{task}"),
                target: String::new(),
                payload: json!({}),
                schedule: Schedule::Cron(cron.clone()),
                max_retries: 0,
                retry_backoff_ms: 1_000,
                timeout_s: 300,
            };
            Job::scheduled(spec, first)
        })
        .collect()
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
    fn missed_fires_coalesce_into_one() {
        let hourly = Schedule::Cron(CronSchedule::parse("0 * * * *", "UTC").expect("cron"));
        let hour = 3_600_000;
        // The 01:00 fire ran at 05:30 (the cluster was down): 02:00–05:00 are not replayed.
        assert_eq!(next_fire(&hourly, Some(hour), 5 * hour + hour / 2), Some(6 * hour));
        // On time: the next hour.
        assert_eq!(next_fire(&hourly, Some(hour), hour + 10), Some(2 * hour));
        assert_eq!(next_fire(&Schedule::Once { run_at_ms: hour }, Some(hour), hour), None);
    }

    #[test]
    fn system_jobs_follow_the_interval() {
        let jobs = system_jobs(60);
        assert_eq!(jobs.len(), 4);
        assert!(jobs.iter().all(|j| j.owner_user_id == "system" && j.next_run_at_ms.is_some()));
        let Schedule::Cron(cron) = &system_jobs(1)[0].schedule else { panic!("cron") };
        assert_eq!(cron.expr, "*/1 * * * * *");
    }
}
