//! Jobs: records, the state-machine transitions of the scheduler and its read queries.
//!
//! Status: `SCHEDULED → CLAIMED → RUNNING → SUCCEEDED | FAILED`, `CANCELLED` from any
//! non-final state. A claim takes due jobs (and jobs whose lease expired) in one command,
//! sets the lease and increments the fence; every later worker write carries its fence and a
//! stale one changes nothing. Times a worker computes (cron's next fire, retry backoff with
//! jitter) travel inside its commands, so apply stays deterministic.

use serde::{Deserialize, Serialize};

use crate::command::{Outcome, Rejection};
use crate::schedule::CronSchedule;
use crate::state::{StateMachine, Txn};
use crate::{floor, keys, StorageError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    Once {
        run_at_ms: u64,
    },
    Cron(CronSchedule),
    /// Every `every_ms`, counted from the first fire (the node's own maintenance jobs).
    Interval {
        every_ms: u64,
    },
}

impl Schedule {
    /// The fire after the fire of `fired_ms`, decided at `now_ms` (when it finished or was
    /// given up): the first fire after both, so fires missed meanwhile coalesce into one.
    /// `None`: no further fire. A one-off job fires again only if its `runAt` was changed
    /// (a PATCH while the fire ran governs the next fire).
    pub fn next_after_fire(&self, fired_ms: u64, now_ms: u64) -> Option<u64> {
        let after = fired_ms.max(now_ms);
        match self {
            Schedule::Once { run_at_ms } => (*run_at_ms != fired_ms).then_some(*run_at_ms),
            Schedule::Cron(cron) => cron.next_after(after),
            Schedule::Interval { every_ms } => {
                let every = (*every_ms).max(1);
                let periods = (after - fired_ms) / every + 1;
                Some(fired_ms.saturating_add(periods.saturating_mul(every)))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    Scheduled,
    Claimed,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub owner_user_id: String,
    /// `webhook` or a built-in task type.
    pub job_type: String,
    pub target: String,
    pub payload: serde_json::Value,
    pub schedule: Schedule,
    pub max_retries: u32,
    /// First retry delay; doubles per attempt up to [`RETRY_BACKOFF_MS_MAX`].
    pub retry_backoff_ms: u64,
    pub timeout_s: u64,
    pub status: JobStatus,
    /// When the job is next due (SCHEDULED), for a fire or a retry.
    pub next_run_at_ms: Option<u64>,
    /// The fire being attempted: its scheduled time (stays the same across retries).
    pub scheduled_for_ms: Option<u64>,
    /// Attempts made for the current fire (0 between fires).
    pub attempts: u32,
    /// Attempts the last fire that ended took (what the API shows between fires).
    #[serde(default)]
    pub last_fire_attempts: u32,
    pub lease_owner: Option<String>,
    pub lease_expires_ms: Option<u64>,
    pub fence: u64,
    /// Runs recorded so far (the last run's sequence).
    pub runs: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub last_error: Option<String>,
    /// In its owner's count of jobs that may still run (`keys::jobs_active`): created by
    /// `CreateJobWithin`, the only command that counts, so entries from before the count
    /// and an admin's jobs neither raise it nor lower it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Paused (`PauseJob`): not due while paused, whatever its status; a run in progress
    /// goes on to its end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// When a run now was last asked with a least interval (`RunJobNow`, format 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_now_ms: Option<u64>,
}

impl Eq for Job {}

/// What a client (or the node) decides about a new job; the rest starts empty.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub id: String,
    pub owner_user_id: String,
    pub job_type: String,
    pub target: String,
    pub payload: serde_json::Value,
    pub schedule: Schedule,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    pub timeout_s: u64,
}

impl Job {
    /// A new SCHEDULED job, first due at `next_run_at_ms`.
    pub fn scheduled(spec: JobSpec, next_run_at_ms: Option<u64>) -> Job {
        Job {
            id: spec.id,
            owner_user_id: spec.owner_user_id,
            job_type: spec.job_type,
            target: spec.target,
            payload: spec.payload,
            schedule: spec.schedule,
            max_retries: spec.max_retries,
            retry_backoff_ms: spec.retry_backoff_ms,
            timeout_s: spec.timeout_s,
            status: JobStatus::Scheduled,
            next_run_at_ms,
            scheduled_for_ms: None,
            attempts: 0,
            last_fire_attempts: 0,
            lease_owner: None,
            lease_expires_ms: None,
            fence: 0,
            runs: 0,
            created_ms: 0,
            updated_ms: 0,
            last_error: None,
            counted: false,
            paused: false,
            run_now_ms: None,
        }
    }
}

/// Largest retry delay, in ms (1 h).
pub const RETRY_BACKOFF_MS_MAX: u64 = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    TimedOut,
}

/// What an attempt produced, beside its status: for a webhook the HTTP status and the start
/// of the response body (at most [`RESULT_EXCERPT_BYTES_MAX`] bytes, lossy UTF-8); for a
/// built-in task a short summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    pub http_status: Option<u16>,
    pub excerpt: String,
}

/// Longest excerpt of a webhook's response kept in a run record, in bytes.
pub const RESULT_EXCERPT_BYTES_MAX: usize = 256;

/// One attempt (append-only; the ledger of what ran).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRun {
    pub run_id: String,
    pub seq: u64,
    pub job_id: String,
    pub scheduled_for_ms: u64,
    pub attempt: u32,
    pub worker_id: String,
    pub fence: u64,
    pub started_ms: u64,
    pub finished_ms: Option<u64>,
    pub status: RunStatus,
    pub error: Option<String>,
    pub result: Option<RunResult>,
    /// How long the record is kept once the run ended (however it ended).
    pub ttl_ms: u64,
}

/// A worker's report of an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    pub job_id: String,
    pub fence: u64,
    pub status: RunStatus,
    pub error: Option<String>,
    pub result: Option<RunResult>,
    /// When to retry if attempts remain (backoff with jitter, computed by the worker).
    pub retry_at_ms: u64,
}

/// Changes a PATCH makes (already validated; `next_run_at_ms` recomputed by the caller).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct JobPatch {
    pub payload: Option<serde_json::Value>,
    pub target: Option<String>,
    pub max_retries: Option<u32>,
    pub schedule: Option<Schedule>,
    pub next_run_at_ms: Option<u64>,
}

impl Eq for JobPatch {}

fn load(txn: &Txn<'_>, job_id: &str) -> Result<Option<Job>, StorageError> {
    txn.get("job", &keys::job(job_id))
}

/// Writes `job`, moving its due and lease index entries from `before` to the new values.
fn store(txn: &mut Txn<'_>, before: Option<&Job>, job: &Job) -> Result<(), StorageError> {
    if let Some(old) = before {
        if let (JobStatus::Scheduled, Some(at), false) = (old.status, old.next_run_at_ms, old.paused) {
            txn.delete(keys::job_due(at, &old.id));
        }
        if let Some(expires) = old.lease_expires_ms {
            txn.delete(keys::job_lease(expires, &old.id));
        }
    }
    if let (JobStatus::Scheduled, Some(at), false) = (job.status, job.next_run_at_ms, job.paused) {
        let key = keys::job_due(at, &job.id);
        floor::note_insert(txn, &key)?;
        txn.put_raw(key, Vec::new());
    }
    if let (JobStatus::Claimed | JobStatus::Running, Some(expires)) = (job.status, job.lease_expires_ms) {
        let key = keys::job_lease(expires, &job.id);
        floor::note_insert(txn, &key)?;
        txn.put_raw(key, Vec::new());
    }
    txn.put(keys::job(&job.id), job);
    // The owner's count of jobs that may still run follows every change of status of the
    // jobs it counts.
    let was_active = before.is_some_and(|b| b.counted && !b.status.is_final());
    let is_active = job.counted && !job.status.is_final();
    if was_active != is_active {
        let key = keys::jobs_active(&job.owner_user_id);
        let count = txn.get::<u64>("active jobs", &key)?.unwrap_or(0);
        let count = if is_active { count.saturating_add(1) } else { count.saturating_sub(1) };
        if count == 0 {
            txn.delete(key);
        } else {
            txn.put(key, &count);
        }
    }
    Ok(())
}

/// Schedules `job`; with `active_max`, only if its owner has fewer jobs that may still run
/// (checked here, in log order, so parallel creations cannot all pass).
pub(crate) fn create(txn: &mut Txn<'_>, job: &Job, active_max: Option<u32>) -> Result<Outcome, StorageError> {
    if load(txn, &job.id)?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("job {} exists", job.id))));
    }
    if let Some(max) = active_max {
        let active = txn.get::<u64>("active jobs", &keys::jobs_active(&job.owner_user_id))?.unwrap_or(0);
        if active >= u64::from(max) {
            return Ok(Outcome::Rejected(Rejection::LimitReached(format!(
                "you have {active} jobs that may still run, the most allowed; cancel some first"
            ))));
        }
    }
    let mut job = job.clone();
    job.counted = active_max.is_some();
    job.created_ms = txn.now_ms;
    job.updated_ms = txn.now_ms;
    txn.put(keys::job_owner(&job.owner_user_id, job.created_ms, &job.id), &job.id);
    store(txn, None, &job)?;
    Ok(Outcome::Done)
}

pub(crate) fn patch(txn: &mut Txn<'_>, job_id: &str, patch: &JobPatch) -> Result<Outcome, StorageError> {
    let Some(before) = load(txn, job_id)? else { return Ok(not_found(job_id)) };
    if before.status.is_final() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("job {job_id} is {:?}", before.status))));
    }
    let mut job = before.clone();
    if let Some(payload) = &patch.payload {
        job.payload = payload.clone();
    }
    if let Some(target) = &patch.target {
        job.target = target.clone();
    }
    if let Some(max_retries) = patch.max_retries {
        job.max_retries = max_retries;
    }
    if let Some(schedule) = &patch.schedule {
        // While a fire runs, the new schedule governs the fire after it (see `end_fire`).
        job.schedule = schedule.clone();
        if job.status == JobStatus::Scheduled {
            job.next_run_at_ms = patch.next_run_at_ms;
            job.attempts = 0;
            job.scheduled_for_ms = None;
        }
    }
    job.updated_ms = txn.now_ms;
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

pub(crate) fn cancel(txn: &mut Txn<'_>, job_id: &str) -> Result<Outcome, StorageError> {
    let Some(before) = load(txn, job_id)? else { return Ok(not_found(job_id)) };
    if before.status.is_final() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("job {job_id} is {:?}", before.status))));
    }
    end_run(txn, &before, RunStatus::Failed, "the job was cancelled during the run")?;
    let mut job = before.clone();
    job.status = JobStatus::Cancelled;
    job.paused = false;
    job.next_run_at_ms = None;
    job.lease_owner = None;
    job.lease_expires_ms = None;
    job.updated_ms = txn.now_ms;
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

/// A job that may be paused, resumed or run now: not final (409 otherwise).
fn changeable(txn: &Txn<'_>, job_id: &str) -> Result<Result<Job, Outcome>, StorageError> {
    Ok(match load(txn, job_id)? {
        None => Err(not_found(job_id)),
        Some(job) if job.status.is_final() => {
            Err(Outcome::Rejected(Rejection::Conflict(format!("job {job_id} is {:?}", job.status))))
        }
        Some(job) => Ok(job),
    })
}

pub(crate) fn pause(txn: &mut Txn<'_>, job_id: &str) -> Result<Outcome, StorageError> {
    let before = match changeable(txn, job_id)? {
        Ok(job) => job,
        Err(refused) => return Ok(refused),
    };
    if !before.paused {
        let mut job = before.clone();
        job.paused = true;
        job.updated_ms = txn.now_ms;
        store(txn, Some(&before), &job)?;
    }
    Ok(Outcome::Done)
}

pub(crate) fn resume(txn: &mut Txn<'_>, job_id: &str) -> Result<Outcome, StorageError> {
    let before = match changeable(txn, job_id)? {
        Ok(job) => job,
        Err(refused) => return Ok(refused),
    };
    if !before.paused {
        return Ok(Outcome::Done);
    }
    let now = txn.now_ms;
    let mut job = before.clone();
    job.paused = false;
    job.updated_ms = now;
    // A retry of a fire begun before the pause, or a one-off job's only fire, stays due at
    // its time (due now if that passed; its fire keeps its identity). A recurring job's next
    // fire is its first scheduled time from now on: the fires missed while paused are skipped.
    if let (JobStatus::Scheduled, Some(at), 0) = (job.status, job.next_run_at_ms, job.attempts) {
        if at < now {
            match &job.schedule {
                Schedule::Once { .. } => {}
                Schedule::Cron(cron) => match cron.next_after(now.saturating_sub(1)) {
                    Some(next) => job.next_run_at_ms = Some(next),
                    // No fire left: the job ends, as after its last fire.
                    None => {
                        job.status = JobStatus::Succeeded;
                        job.next_run_at_ms = None;
                    }
                },
                Schedule::Interval { every_ms } => {
                    let every = (*every_ms).max(1);
                    job.next_run_at_ms = Some(at.saturating_add((now - at).div_ceil(every).saturating_mul(every)));
                }
            }
        }
    }
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

pub(crate) fn run_now(txn: &mut Txn<'_>, job_id: &str, min_interval_ms: Option<u64>) -> Result<Outcome, StorageError> {
    let before = match changeable(txn, job_id)? {
        Ok(job) => job,
        Err(refused) => return Ok(refused),
    };
    let refused = |why: String| Ok(Outcome::Rejected(Rejection::Conflict(why)));
    if before.paused {
        return refused(format!("job {job_id} is paused; resume it first"));
    }
    if before.status != JobStatus::Scheduled {
        return refused(format!("job {job_id} is running now"));
    }
    if before.next_run_at_ms.is_some_and(|at| at <= txn.now_ms) {
        // Due already: it fires as it is (a one-off job's fire keeps its time, so it is not
        // made twice).
        return Ok(Outcome::Done);
    }
    if let (Some(min), Some(last)) = (min_interval_ms, before.run_now_ms) {
        if txn.now_ms < last.saturating_add(min) {
            return Ok(Outcome::Rejected(Rejection::LimitReached(format!(
                "job {job_id} was run now {} s ago; it runs now at most once every {} s",
                txn.now_ms.saturating_sub(last) / 1_000,
                min / 1_000
            ))));
        }
    }
    let mut job = before.clone();
    job.next_run_at_ms = Some(txn.now_ms);
    job.updated_ms = txn.now_ms;
    if min_interval_ms.is_some() {
        job.run_now_ms = Some(txn.now_ms);
    }
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

fn not_found(job_id: &str) -> Outcome {
    Outcome::Rejected(Rejection::NotFound(format!("job {job_id}")))
}

/// Runs to start in the same apply as a claim (the claim and the start of a run in one
/// command): the i-th job claimed runs as `run_ids[i]`, its record kept `run_ttl_ms` after it
/// ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunStarts<'a> {
    pub run_ids: &'a [String],
    pub run_ttl_ms: u64,
}

/// Claims up to `max` jobs: due SCHEDULED jobs, then jobs whose lease expired. The attempt
/// whose lease expired counts: a job without retries left is not run again but ends its fire
/// (FAILED, or the next fire of a recurring job). With `starts`, each claimed job is also
/// started (RUNNING, its run record written), and at most `starts.run_ids.len()` are claimed.
pub(crate) fn claim(
    txn: &mut Txn<'_>,
    worker: &str,
    lease_ms: u64,
    max: usize,
    starts: Option<RunStarts<'_>>,
) -> Result<Outcome, StorageError> {
    let now = txn.now_ms;
    let max = starts.map_or(max, |s| max.min(s.run_ids.len()));
    if max == 0 {
        return Ok(Outcome::JobsClaimed { jobs: Vec::new() });
    }
    // Each scan starts at its index's floor; the floor is raised past what the scan consumed
    // (every key it returns is claimed or ended below, or names no job) once this claim is done.
    let mut raises = Vec::new();
    let (start, end) = keys::job_due_until(now);
    let (mut index_keys, reached) = untaken_keys(txn, &floor::start(txn, &start)?, &end, max)?;
    raises.push((start, reached));
    if index_keys.len() < max {
        let (start, end) = keys::job_lease_until(now);
        let (more, reached) = untaken_keys(txn, &floor::start(txn, &start)?, &end, max - index_keys.len())?;
        index_keys.extend(more);
        raises.push((start, reached));
    }
    let ids =
        index_keys.iter().filter_map(|k| keys::parse_timed(k).map(|(_, id)| String::from_utf8_lossy(id).into_owned()));
    let mut claimed = Vec::new();
    for id in ids {
        let Some(before) = load(txn, &id)? else { continue };
        let due =
            before.status == JobStatus::Scheduled && before.next_run_at_ms.is_some_and(|t| t <= now) && !before.paused;
        let expired = matches!(before.status, JobStatus::Claimed | JobStatus::Running)
            && before.lease_expires_ms.is_some_and(|t| t <= now);
        if !due && !expired {
            continue;
        }
        let mut job = before.clone();
        if expired {
            end_run(txn, &job, RunStatus::TimedOut, "lease expired: the worker stopped reporting")?;
            if job.paused && job.attempts <= job.max_retries {
                // Paused: the retry waits for the resume (it is due at once then).
                job.status = JobStatus::Scheduled;
                job.next_run_at_ms = Some(now);
                job.lease_owner = None;
                job.lease_expires_ms = None;
                job.updated_ms = now;
                store(txn, Some(&before), &job)?;
                continue;
            }
            if job.attempts > job.max_retries {
                job.lease_owner = None;
                job.lease_expires_ms = None;
                job.updated_ms = now;
                job.last_error = Some("lease expired after the last attempt".into());
                end_fire(&mut job, now, false);
                store(txn, Some(&before), &job)?;
                continue;
            }
        }
        if job.scheduled_for_ms.is_none() {
            job.scheduled_for_ms = job.next_run_at_ms;
        }
        job.status = JobStatus::Claimed;
        job.attempts = job.attempts.saturating_add(1);
        job.fence = job.fence.saturating_add(1);
        job.lease_owner = Some(worker.to_string());
        job.lease_expires_ms = Some(now.saturating_add(lease_ms));
        job.updated_ms = now;
        if let Some(starts) = starts {
            begin_run(txn, &mut job, &starts.run_ids[claimed.len()], worker, starts.run_ttl_ms);
        }
        store(txn, Some(&before), &job)?;
        claimed.push(job);
    }
    for (start, reached) in raises {
        floor::raise(txn, &start, reached)?;
    }
    Ok(Outcome::JobsClaimed { jobs: claimed })
}

/// Up to `max` index keys of `[start, end)` as of the previous entry, leaving out those an
/// earlier command of this entry deleted (jobs another claim in the same entry took), so that
/// several claims in one entry each get their own jobs.
/// Up to `max` committed keys of `[start, end)` that no earlier command of this entry
/// deleted, and how far the scan got: `end` if it saw every key of the range, else just past
/// the last key it saw.
fn untaken_keys(txn: &Txn<'_>, start: &[u8], end: &[u8], max: usize) -> Result<(Vec<Vec<u8>>, Vec<u8>), StorageError> {
    let mut out = Vec::new();
    let mut from = start.to_vec();
    while out.len() < max {
        let want = max - out.len();
        let chunk = txn.committed_keys(&from, end, want)?;
        let exhausted = chunk.len() < want;
        if let Some(last) = chunk.last() {
            from = last.clone();
            from.push(0);
        }
        out.extend(chunk.into_iter().filter(|key| !txn.deleted(key)));
        if exhausted {
            return Ok((out, end.to_vec()));
        }
    }
    Ok((out, from))
}

/// Ends the job's current run, if one is still RUNNING under the job's fence, with `status`
/// and `error`; its record then expires like any finished run.
fn end_run(txn: &mut Txn<'_>, job: &Job, status: RunStatus, error: &str) -> Result<(), StorageError> {
    let key = keys::job_run(&job.id, job.runs);
    if let Some(mut run) = txn.get::<JobRun>("job run", &key)? {
        if run.status == RunStatus::Running && run.fence == job.fence {
            run.status = status;
            run.error = Some(error.to_string());
            close_run(txn, key, run);
        }
    }
    Ok(())
}

/// Writes a run that just ended, with its finish time and its expiry index entry.
fn close_run(txn: &mut Txn<'_>, key: Vec<u8>, mut run: JobRun) {
    let now = txn.now_ms;
    run.finished_ms = Some(now);
    txn.put_raw(keys::job_run_expiry(now.saturating_add(run.ttl_ms), &key), Vec::new());
    txn.put(key, &run);
}

/// Ends the current fire: the job goes back to SCHEDULED at its next fire (by its current
/// schedule, so a PATCH made while the fire ran governs), or ends SUCCEEDED / FAILED.
fn end_fire(job: &mut Job, now: u64, succeeded: bool) {
    let fired = job.scheduled_for_ms.or(job.next_run_at_ms).unwrap_or(now);
    let next = job.schedule.next_after_fire(fired, now);
    job.status = match next {
        Some(_) => JobStatus::Scheduled,
        None if succeeded => JobStatus::Succeeded,
        None => JobStatus::Failed,
    };
    job.next_run_at_ms = next;
    job.scheduled_for_ms = None;
    job.last_fire_attempts = job.attempts;
    job.attempts = 0;
    // An ended job is not paused: nothing of it waits for a resume.
    job.paused &= !job.status.is_final();
}

fn stale(job: &Job, fence: u64) -> Option<Outcome> {
    let holding = matches!(job.status, JobStatus::Claimed | JobStatus::Running) && job.fence == fence;
    (!holding).then(|| Outcome::Rejected(Rejection::StaleFence { current: job.fence }))
}

pub(crate) fn start(
    txn: &mut Txn<'_>,
    job_id: &str,
    fence: u64,
    run_id: &str,
    worker: &str,
    run_ttl_ms: u64,
) -> Result<Outcome, StorageError> {
    let Some(before) = load(txn, job_id)? else { return Ok(not_found(job_id)) };
    if let Some(rejected) = stale(&before, fence) {
        return Ok(rejected);
    }
    if before.paused && before.status == JobStatus::Claimed {
        // Paused between its claim and its start: it starts once resumed (the lease runs out).
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("job {job_id} is paused"))));
    }
    if before.status == JobStatus::Running {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("job {job_id} already runs under fence {fence}"))));
    }
    let mut job = before.clone();
    begin_run(txn, &mut job, run_id, worker, run_ttl_ms);
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

/// Starts the attempt of a job its fence holder claimed: the job becomes RUNNING and the run
/// record (sequence `runs + 1`) is written; the caller stores the job.
fn begin_run(txn: &mut Txn<'_>, job: &mut Job, run_id: &str, worker: &str, run_ttl_ms: u64) {
    job.status = JobStatus::Running;
    job.runs = job.runs.saturating_add(1);
    job.updated_ms = txn.now_ms;
    let run = JobRun {
        run_id: run_id.to_string(),
        seq: job.runs,
        job_id: job.id.clone(),
        scheduled_for_ms: job.scheduled_for_ms.unwrap_or(txn.now_ms),
        attempt: job.attempts,
        worker_id: worker.to_string(),
        fence: job.fence,
        started_ms: txn.now_ms,
        finished_ms: None,
        status: RunStatus::Running,
        error: None,
        result: None,
        ttl_ms: run_ttl_ms,
    };
    txn.put(keys::job_run(&job.id, run.seq), &run);
}

pub(crate) fn renew(txn: &mut Txn<'_>, job_id: &str, fence: u64, lease_ms: u64) -> Result<Outcome, StorageError> {
    let Some(before) = load(txn, job_id)? else { return Ok(not_found(job_id)) };
    if let Some(rejected) = stale(&before, fence) {
        return Ok(rejected);
    }
    let mut job = before.clone();
    job.lease_expires_ms = Some(txn.now_ms.saturating_add(lease_ms));
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

pub(crate) fn finish(txn: &mut Txn<'_>, report: &RunReport) -> Result<Outcome, StorageError> {
    let Some(before) = load(txn, &report.job_id)? else { return Ok(not_found(&report.job_id)) };
    if let Some(rejected) = stale(&before, report.fence) {
        return Ok(rejected);
    }
    let now = txn.now_ms;
    let run_key = keys::job_run(&before.id, before.runs);
    if let Some(mut run) = txn.get::<JobRun>("job run", &run_key)? {
        if run.fence == report.fence && run.status == RunStatus::Running {
            run.status = if report.status == RunStatus::Running { RunStatus::Failed } else { report.status };
            run.error = report.error.clone();
            run.result = report.result.clone();
            close_run(txn, run_key, run);
        }
    }
    let mut job = before.clone();
    job.lease_owner = None;
    job.lease_expires_ms = None;
    job.updated_ms = now;
    job.last_error = report.error.clone();
    let succeeded = report.status == RunStatus::Succeeded;
    if !succeeded && job.attempts <= job.max_retries {
        job.status = JobStatus::Scheduled;
        job.next_run_at_ms = Some(report.retry_at_ms);
    } else {
        end_fire(&mut job, now, succeeded);
    }
    store(txn, Some(&before), &job)?;
    Ok(Outcome::Done)
}

pub(crate) fn expire_runs(txn: &mut Txn<'_>, before_ms: u64, max: usize) -> Result<Outcome, StorageError> {
    let (start, end) = keys::job_run_expiry_until(before_ms);
    let due = txn.committed_keys(&start, &end, max)?;
    let more = due.len() == max;
    let mut removed = 0;
    for key in due {
        txn.delete(key.clone());
        if let Some((_, run_key)) = keys::parse_timed(&key) {
            txn.delete(run_key.to_vec());
            removed += 1;
        }
    }
    Ok(Outcome::Collected { removed, more })
}

impl StateMachine {
    pub fn job(&self, job_id: &str) -> Result<Option<Job>, StorageError> {
        self.read("job", &keys::job(job_id))
    }

    /// Runs of a job, newest first, with sequence below `before` (exclusive), at most `limit`.
    pub fn job_runs(&self, job_id: &str, before: Option<u64>, limit: usize) -> Result<Vec<JobRun>, StorageError> {
        let (start, mut end) = keys::job_run_range(job_id);
        if let Some(before) = before {
            end = keys::job_run(job_id, before);
        }
        // From the newest down: reads the page, whatever the job's run count.
        Ok(self.scan_rev("job run", &start, &end, limit)?.into_iter().map(|(_, r)| r).collect())
    }

    /// The attempts of the job's current fire or, between fires, of its last one (a one-off
    /// job that failed twice shows 2). A record from before `last_fire_attempts` existed
    /// counts from its newest run record, while that is kept.
    pub fn job_attempts(&self, job: &Job) -> Result<u32, StorageError> {
        if job.scheduled_for_ms.is_some() || job.runs == 0 {
            return Ok(job.attempts);
        }
        if job.last_fire_attempts > 0 {
            return Ok(job.last_fire_attempts);
        }
        Ok(self.job_runs(&job.id, None, 1)?.first().map_or(0, |run| run.attempt))
    }

    /// How many of `owner`'s jobs may still run (scheduled, claimed or running): one read of
    /// the count every job write keeps (jobs created before the count existed are not in it).
    pub fn active_jobs_of(&self, owner: &str) -> Result<u64, StorageError> {
        Ok(self.read::<u64>("active jobs", &keys::jobs_active(owner))?.unwrap_or(0))
    }

    /// A user's jobs by creation, after `after` (a key from a previous page), at most `limit`.

    pub fn jobs_of(&self, owner: &str, after: Option<(u64, &str)>, limit: usize) -> Result<Vec<Job>, StorageError> {
        let (mut start, end) = keys::job_owner_range(owner);
        if let Some((created_ms, job_id)) = after {
            start = keys::job_owner(owner, created_ms, job_id);
            start.push(0);
        }
        let mut out = Vec::new();
        for (_, id) in self.scan::<String>("job owner", &start, &end, limit)? {
            if let Some(job) = self.job(&id)? {
                out.push(job);
            }
        }
        Ok(out)
    }

    /// Whether a claim at `now_ms` could take something: a job due or a lease expired by then.
    /// Both scans end at `now_ms`, so they never step over the index entries of jobs claimed
    /// or finished since (deleted, but in RocksDB until compacted) beyond it.
    pub fn claimable_at(&self, now_ms: u64) -> Result<bool, StorageError> {
        Ok(self.next_claimable_ms(now_ms)?.is_some())
    }

    /// The earliest time up to `until_ms` at which a claim could take something (a job due or
    /// a lease expiring then), if any; bounded scans like [`StateMachine::claimable_at`].
    pub fn next_claimable_ms(&self, until_ms: u64) -> Result<Option<u64>, StorageError> {
        let mut earliest = None;
        for (start, end) in [keys::job_due_until(until_ms), keys::job_lease_until(until_ms)] {
            if let Some(key) = self.scan_keys(&floor::start(self, &start)?, &end, 1)?.first() {
                let at = keys::parse_timed(key).map_or(0, |(at, _)| at);
                earliest = Some(earliest.map_or(at, |e: u64| e.min(at)));
            }
        }
        Ok(earliest)
    }
}

#[cfg(test)]
#[path = "jobs_tests.rs"]
mod tests;
