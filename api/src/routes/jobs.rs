//! The job API: `POST /v1/jobs` (keyed), `GET /v1/jobs`, `GET|PATCH|DELETE /v1/jobs/{id}`,
//! `POST /v1/jobs/{id}:pause`, `:resume` and `:run` (keyed; Cloud Scheduler's custom
//! methods), `GET /v1/jobs/{id}/runs`. A job is visible and changeable only by its owner and
//! admins.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use raftbox_storage::jobs::{Job, JobPatch, JobRun, JobSpec, Schedule};
use raftbox_storage::jobs::{JobStatus, RunStatus};
use raftbox_storage::schedule::{format_utc, parse_utc_signed, CronSchedule};
use raftbox_storage::Command;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{new_id, page_limit, PAGE_DEFAULT, PAGE_MAX};
use crate::auth::Principal;
use crate::idempotency::{Keyed, Success};
use crate::{json, ApiError, AppState};

/// Job types a user may create; `maintenance.*` types are the node's own.
pub const USER_JOB_TYPES: [&str; 4] = ["webhook", "noop", "fail", "sleep"];
/// Bounds of the job fields.
pub const MAX_RETRIES_MAX: u32 = 100;
pub const TIMEOUT_S_DEFAULT: u64 = 30;
pub const TIMEOUT_S_MAX: u64 = 900;
pub const RETRY_BACKOFF_MS_DEFAULT: u64 = 1_000;
pub const TARGET_CHARS_MAX: usize = 2_048;
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;

/// A schedule as a client writes it: `{runAt}` (once) or `{cron, timezone}`. A cron
/// expression or time zone the server does not know, or a schedule that never fires, is 422.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ScheduleRequest {
    run_at: Option<String>,
    cron: Option<String>,
    timezone: Option<String>,
}

/// Fires of a cron schedule examined for its shortest interval.
const CRON_INTERVAL_SAMPLE_FIRES: usize = 60;

/// The shortest gap between the next [`CRON_INTERVAL_SAMPLE_FIRES`] fires after `first`, ms.
fn shortest_interval_ms(cron: &CronSchedule, first: u64) -> Option<u64> {
    let mut previous = first;
    let mut shortest = None;
    for _ in 0..CRON_INTERVAL_SAMPLE_FIRES {
        let Some(next) = cron.next_after(previous) else { break };
        let gap = next.saturating_sub(previous);
        shortest = Some(shortest.map_or(gap, |s: u64| s.min(gap)));
        previous = next;
    }
    shortest
}

/// The limit a non-admin's schedule keeps (admins are exempt): a recurring schedule fires at
/// most once per `[job_limits] min_cron_interval_s`. (The other, at most
/// `[job_limits] active_jobs_per_owner_max` jobs that may still run, is checked in apply:
/// `Command::CreateJobWithin`.)
fn check_limits(state: &AppState, principal: &Principal, schedule: &Schedule, first: u64) -> Result<(), ApiError> {
    if principal.user.admin {
        return Ok(());
    }
    let in_force = state.limits.get();
    let limits = &in_force.job_limits;
    if let Schedule::Cron(cron) = schedule {
        let min_ms = limits.min_cron_interval_s.saturating_mul(1_000);
        if shortest_interval_ms(cron, first).is_some_and(|gap| gap < min_ms) {
            return Err(ApiError::Unprocessable(format!(
                "schedule {:?} fires more often than once every {} s, the shortest interval allowed",
                cron.expr, limits.min_cron_interval_s
            )));
        }
    }
    Ok(())
}

/// A schedule and its first run time (after `now`).
fn parse_schedule(request: &ScheduleRequest, now: u64) -> Result<(Schedule, u64), ApiError> {
    match (&request.run_at, &request.cron, &request.timezone) {
        (Some(run_at), None, None) => {
            let at = parse_utc_signed(run_at).map_err(|e| ApiError::BadRequest(format!("schedule.runAt: {e}")))?;
            let at = u64::try_from(at)
                .map_err(|_| ApiError::Unprocessable(format!("schedule.runAt {run_at:?} is before 1970")))?;
            Ok((Schedule::Once { run_at_ms: at }, at))
        }
        (None, Some(expr), Some(tz)) => {
            let cron = CronSchedule::parse(expr, tz).map_err(|e| ApiError::Unprocessable(format!("schedule: {e}")))?;
            let next =
                cron.next_after(now).ok_or_else(|| ApiError::Unprocessable("the cron schedule never fires".into()))?;
            Ok((Schedule::Cron(cron), next))
        }
        (None, Some(_), None) => Err(ApiError::BadRequest("schedule.timezone is required with cron".into())),
        _ => Err(ApiError::BadRequest("schedule is {runAt} or {cron, timezone}".into())),
    }
}

/// A job's target: bounded, and for a webhook a URL the node's webhook rule lets it call
/// (see [`crate::webhooks`]; its host's addresses are resolved and checked).
async fn check_target(state: &AppState, job_type: &str, target: &str) -> Result<(), ApiError> {
    if target.chars().count() > TARGET_CHARS_MAX {
        return Err(ApiError::BadRequest(format!("target is at most {TARGET_CHARS_MAX} characters")));
    }
    if job_type == "webhook" {
        // Whether the node may call it depends on its configuration and on DNS: 422.
        state.config.webhooks.check(target).await.map_err(ApiError::Unprocessable)?;
    }
    Ok(())
}

fn check_payload(payload: &Value) -> Result<(), ApiError> {
    if !payload.is_object() {
        return Err(ApiError::BadRequest("payload is a JSON object".into()));
    }
    if payload.to_string().len() > PAYLOAD_BYTES_MAX {
        return Err(ApiError::PayloadTooLarge(format!("payload is at most {PAYLOAD_BYTES_MAX} bytes")));
    }
    Ok(())
}

fn check_retries(max_retries: i64) -> Result<u32, ApiError> {
    u32::try_from(max_retries)
        .ok()
        .filter(|n| *n <= MAX_RETRIES_MAX)
        .ok_or_else(|| ApiError::BadRequest(format!("maxRetries is 0 to {MAX_RETRIES_MAX}")))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(as = JobCreateRequest)]
pub(crate) struct CreateRequest {
    #[serde(rename = "type")]
    #[schema(value_type = crate::schema::JobType)]
    job_type: String,
    /// A webhook's URL (`http://` or `https://`, to a host the node's `[webhooks]` rule
    /// allows, else 422); unused by the built-in types.
    #[schema(max_length = 2048)]
    target: Option<String>,
    /// Given to the job (a webhook's body); at most 64 KiB as JSON (else 413).
    #[schema(value_type = Object)]
    payload: Value,
    #[schema(value_type = crate::schema::Schedule)]
    schedule: ScheduleRequest,
    /// Retries after a failed attempt.
    #[schema(minimum = 0, maximum = 100)]
    #[serde(deserialize_with = "crate::json::integer")]
    max_retries: i64,
    /// Seconds an attempt may take: default 30.
    #[schema(minimum = 1, maximum = 900)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    timeout_seconds: Option<u64>,
    /// The first retry's delay, doubling each retry: default 1,000.
    #[schema(minimum = 1, maximum = 3_600_000)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    retry_backoff_ms: Option<u64>,
}

pub async fn create(State(state): State<AppState>, principal: Principal, keyed: Keyed) -> Result<Response, ApiError> {
    let request: CreateRequest = json::parse(&keyed.body)?;
    if !USER_JOB_TYPES.contains(&request.job_type.as_str()) {
        return Err(ApiError::BadRequest(format!(
            "unknown job type {:?}; known: {USER_JOB_TYPES:?}",
            request.job_type
        )));
    }
    let target = request.target.unwrap_or_default();
    check_target(&state, &request.job_type, &target).await?;
    check_payload(&request.payload)?;
    let max_retries = check_retries(request.max_retries)?;
    let timeout_s = request.timeout_seconds.unwrap_or(TIMEOUT_S_DEFAULT);
    if !(1..=TIMEOUT_S_MAX).contains(&timeout_s) {
        return Err(ApiError::BadRequest(format!("timeoutSeconds is 1 to {TIMEOUT_S_MAX}")));
    }
    let retry_backoff_ms = request.retry_backoff_ms.unwrap_or(RETRY_BACKOFF_MS_DEFAULT);
    if !(1..=raftbox_storage::jobs::RETRY_BACKOFF_MS_MAX).contains(&retry_backoff_ms) {
        return Err(ApiError::BadRequest("retryBackoffMs is 1 to 3600000".into()));
    }
    let (schedule, next_run_at) = parse_schedule(&request.schedule, state.node.cluster_now_ms())?;
    check_limits(&state, &principal, &schedule, next_run_at)?;
    let spec = JobSpec {
        id: new_id(),
        owner_user_id: principal.user.id.clone(),
        job_type: request.job_type,
        target,
        payload: request.payload,
        schedule,
        max_retries,
        retry_backoff_ms,
        timeout_s,
    };
    if spec.job_type == "webhook" {
        // Its calls are signed from the first: the owner's secret exists before the job.
        crate::webhooks::ensure_secret(&state.node, &principal.user.id).await?;
    }
    let job = Job::scheduled(spec, Some(next_run_at));
    let success = Success::created(JobCreated {
        job_id: job.id.clone(),
        next_run_at: format_utc(next_run_at),
        status: JobStatus::Scheduled,
    });
    // A non-admin's quota of jobs that may still run is checked in apply, in log order.
    let command = if principal.user.admin {
        Command::CreateJob(Box::new(job))
    } else {
        let active_jobs_max =
            u32::try_from(state.limits.get().job_limits.active_jobs_per_owner_max).unwrap_or(u32::MAX);
        Command::CreateJobWithin { job: Box::new(job), active_jobs_max }
    };
    keyed.write(&state, &principal, command, success).await
}

/// A new job.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobCreated {
    pub job_id: String,
    pub next_run_at: String,
    pub status: JobStatus,
}

/// A schedule as a client writes it: `{runAt}`, `{cron, timezone}` or `{everyMs}`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ScheduleView {
    #[serde(rename_all = "camelCase")]
    Once {
        run_at: String,
    },
    Cron {
        cron: String,
        timezone: String,
    },
    #[serde(rename_all = "camelCase")]
    Interval {
        every_ms: u64,
    },
}

impl From<&Schedule> for ScheduleView {
    fn from(schedule: &Schedule) -> ScheduleView {
        match schedule {
            Schedule::Once { run_at_ms } => ScheduleView::Once { run_at: format_utc(*run_at_ms) },
            Schedule::Cron(cron) => ScheduleView::Cron { cron: cron.expr.clone(), timezone: cron.timezone.clone() },
            Schedule::Interval { every_ms } => ScheduleView::Interval { every_ms: *every_ms },
        }
    }
}

/// How a job is scheduled.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScheduleKind {
    Once,
    Cron,
    Interval,
}

/// A job as the API shows it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub job_id: String,
    pub owner_id: String,
    pub tenant_id: String,
    #[serde(rename = "type")]
    pub job_type: String,
    pub target: String,
    pub payload: Value,
    pub schedule: ScheduleView,
    pub schedule_kind: ScheduleKind,
    /// The cron expression; empty unless `CRON`.
    pub cron_expr: String,
    /// The cron schedule's time zone; `UTC` for `INTERVAL`, empty for `ONCE`.
    pub timezone: String,
    pub max_retries: u32,
    pub timeout_seconds: u64,
    pub retry_backoff_ms: u64,
    pub status: JobStatus,
    /// Paused (`:pause`): no fire or retry starts until `:resume`.
    pub paused: bool,
    pub next_run_at: Option<String>,
    /// Attempts of the current fire or, between fires, of the last one.
    pub attempts: u32,
    pub fence_token: u64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub last_error: Option<String>,
}

super::page! {
    /// A page of the caller's jobs, oldest first.
    JobList { jobs: JobView }
}

/// What an attempt produced: `{httpStatus, excerpt}` for a webhook (the first
/// `RESULT_EXCERPT_BYTES_MAX` bytes of the response body), `{excerpt}` for a built-in task.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResultView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub http_status: Option<u16>,
    pub excerpt: String,
}

/// One attempt of a job.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub run_id: String,
    pub job_id: String,
    pub scheduled_for: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RunStatus,
    pub attempt: u32,
    pub worker_id: String,
    pub fence_token: u64,
    /// `null` while running or when the attempt produced nothing.
    pub result: Option<RunResultView>,
    pub error: Option<String>,
}

super::page! {
    /// A page of a job's runs, newest first.
    RunList { runs: RunView }
}

/// The job if the caller may see it (owner or admin), after a read barrier; else 404.
async fn visible_job(state: &AppState, principal: &Principal, job_id: &str) -> Result<Job, ApiError> {
    crate::access::barrier(state, principal).await?;
    match state.node.state().job(job_id)? {
        Some(job) if crate::access::job(principal, &job) => Ok(job),
        _ => Err(ApiError::NotFound(format!("job {job_id}"))),
    }
}

/// A job as the API shows it; `attempts` as the state machine's `job_attempts` counts them.
fn view(state: &AppState, job: &Job) -> Result<JobView, ApiError> {
    let attempts = state.node.state().job_attempts(job)?;
    let (kind, cron_expr, timezone) = match &job.schedule {
        Schedule::Once { .. } => (ScheduleKind::Once, "", ""),
        Schedule::Cron(cron) => (ScheduleKind::Cron, cron.expr.as_str(), cron.timezone.as_str()),
        Schedule::Interval { .. } => (ScheduleKind::Interval, "", "UTC"),
    };
    Ok(JobView {
        job_id: job.id.clone(),
        owner_id: job.owner_user_id.clone(),
        tenant_id: job.owner_user_id.clone(),
        job_type: job.job_type.clone(),
        target: job.target.clone(),
        payload: job.payload.clone(),
        schedule: ScheduleView::from(&job.schedule),
        schedule_kind: kind,
        cron_expr: cron_expr.to_string(),
        timezone: timezone.to_string(),
        max_retries: job.max_retries,
        timeout_seconds: job.timeout_s,
        retry_backoff_ms: job.retry_backoff_ms,
        status: job.status,
        paused: job.paused,
        next_run_at: job.next_run_at_ms.map(format_utc),
        attempts,
        fence_token: job.fence,
        lease_owner: job.lease_owner.clone(),
        lease_expires_at: job.lease_expires_ms.map(format_utc),
        created_at: format_utc(job.created_ms),
        updated_at: format_utc(job.updated_ms),
        last_error: job.last_error.clone(),
    })
}

pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(view(&state, &visible_job(&state, &principal, &job_id).await?)?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(as = JobPatchRequest)]
pub(crate) struct PatchRequest {
    /// Merged into the current schedule (RFC 7396): `{"timezone": "…"}` keeps the cron
    /// expression and `{"cron": "…"}` the timezone. A patch naming the other kind's key
    /// (`runAt` for a cron job, `cron` for a one-off job) replaces the schedule instead.
    #[schema(value_type = Option<crate::schema::SchedulePatch>)]
    schedule: Option<Value>,
    /// Merged into the payload (RFC 7396).
    #[schema(value_type = Option<Object>)]
    payload: Option<Value>,
    #[schema(max_length = 2048)]
    target: Option<String>,
    #[schema(minimum = 0, maximum = 100)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    max_retries: Option<i64>,
}

/// RFC 7396 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

pub async fn patch(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<JobView>, ApiError> {
    let request: PatchRequest = json::parse(&body)?;
    let job = visible_job(&state, &principal, &job_id).await?;
    if job.status.is_final() {
        return Err(ApiError::Conflict(format!("job {job_id} is {:?}", job.status)));
    }
    let mut patch = JobPatch::default();
    if let Some(payload) = &request.payload {
        let mut merged = job.payload.clone();
        merge(&mut merged, payload);
        check_payload(&merged)?;
        patch.payload = Some(merged);
    }
    if let Some(target) = request.target {
        check_target(&state, &job.job_type, &target).await?;
        patch.target = Some(target);
    }
    if let Some(max_retries) = request.max_retries {
        patch.max_retries = Some(check_retries(max_retries)?);
    }
    if let Some(changes) = &request.schedule {
        let switches_kind = match job.schedule {
            Schedule::Once { .. } => changes.get("cron").is_some_and(|v| !v.is_null()),
            _ => changes.get("runAt").is_some_and(|v| !v.is_null()),
        };
        let mut merged = if switches_kind {
            Value::Object(serde_json::Map::new())
        } else {
            serde_json::to_value(ScheduleView::from(&job.schedule)).unwrap_or_default()
        };
        merge(&mut merged, changes);
        // What the merge makes of the job's schedule depends on the job: 422 when it is no
        // schedule (the patch itself is as described).
        let unprocessable = |e: ApiError| match e {
            ApiError::BadRequest(detail) => ApiError::Unprocessable(detail),
            other => other,
        };
        let merged: ScheduleRequest = serde_json::from_value(merged)
            .map_err(|e| ApiError::Unprocessable(format!("schedule after the merge: {e}")))?;
        let (schedule, next) = parse_schedule(&merged, state.node.cluster_now_ms()).map_err(unprocessable)?;
        check_limits(&state, &principal, &schedule, next)?;
        patch.schedule = Some(schedule);
        patch.next_run_at_ms = Some(next);
    }
    match state.node.write(Command::PatchJob { job_id: job_id.clone(), patch: Box::new(patch) }).await? {
        raftbox_storage::Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(Json(view(&state, &visible_job(&state, &principal, &job_id).await?)?)),
    }
}

pub async fn cancel(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    visible_job(&state, &principal, &job_id).await?;
    match state.node.write(Command::CancelJob { job_id: job_id.clone() }).await? {
        raftbox_storage::Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(Json(view(&state, &visible_job(&state, &principal, &job_id).await?)?)),
    }
}

/// The cluster format from which `:run` is bounded by the owner's shortest cron interval.
pub const RUN_NOW_BOUND_FORMAT: u32 = 5;

/// `POST /v1/jobs/{id}:pause`, `:resume` or `:run`: the job as it is after. Pause stops new
/// fires and retries (a run in progress ends as it would); resume makes no fire a recurring
/// job missed meanwhile; run fires a scheduled, unpaused job now, fenced and recorded like
/// any fire, at most once per `[job_limits] min_cron_interval_s` for a non-admin (409
/// sooner). 409 for a job that ended (or, for `:run`, is paused or running).
pub async fn action(
    State(state): State<AppState>,
    principal: Principal,
    Path(target): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    let Some((job_id, verb)) = target.rsplit_once(':') else {
        return Err(ApiError::NotFound(format!("no such route: POST /v1/jobs/{target} (add :pause, :resume or :run)")));
    };
    let job_id = job_id.to_owned();
    let command = match verb {
        "pause" => Command::PauseJob { job_id: job_id.clone() },
        "resume" => Command::ResumeJob { job_id: job_id.clone() },
        "run" => {
            // A non-admin runs a job now at most as often as a cron job of theirs may fire.
            let bounded = !principal.user.admin && state.node.cluster_format() >= RUN_NOW_BOUND_FORMAT;
            let min_interval_ms =
                bounded.then(|| state.limits.get().job_limits.min_cron_interval_s.saturating_mul(1_000));
            Command::RunJobNow { job_id: job_id.clone(), min_interval_ms }
        }
        other => return Err(ApiError::NotFound(format!("no job method :{other}; :pause, :resume or :run"))),
    };
    visible_job(&state, &principal, &job_id).await?;
    let done = keyed
        .write_with(&state, &principal, command, |outcome| match outcome {
            raftbox_storage::Outcome::Rejected(rejection) => Err(rejection.into()),
            _ => Ok(axum::http::StatusCode::OK.into_response()),
        })
        .await?;
    let mut response = Json(view(&state, &visible_job(&state, &principal, &job_id).await?)?).into_response();
    if let Some(replayed) = done.headers().get(crate::idempotency::REPLAYED_HEADER) {
        response.headers_mut().insert(crate::idempotency::REPLAYED_HEADER, replayed.clone());
    }
    Ok(response)
}

fn run_view(run: &JobRun) -> RunView {
    RunView {
        run_id: run.run_id.clone(),
        job_id: run.job_id.clone(),
        scheduled_for: format_utc(run.scheduled_for_ms),
        started_at: format_utc(run.started_ms),
        finished_at: run.finished_ms.map(format_utc),
        status: run.status,
        attempt: run.attempt,
        worker_id: run.worker_id.clone(),
        fence_token: run.fence,
        result: run.result.as_ref().map(|r| RunResultView { http_status: r.http_status, excerpt: r.excerpt.clone() }),
        error: run.error.clone(),
    }
}

/// A page of the caller's jobs: `GET /v1/jobs`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct JobsQuery {
    /// Jobs per page: default 100, at most 1,000 (a larger one is cut to 1,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    limit: Option<u32>,
    #[param(value_type = Option<crate::schema::JobPageToken>)]
    page_token: Option<String>,
}

/// A page of a job's runs: `GET /v1/jobs/{id}/runs`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Runs per page: default 100, at most 1,000 (a larger one is cut to 1,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    limit: Option<u32>,
    #[param(value_type = Option<crate::schema::SeqPageToken>)]
    page_token: Option<String>,
}

/// Runs of a job, newest first.
pub async fn runs(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
    Query(query): Query<RunsQuery>,
) -> Result<Json<RunList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    let before = query.page_token.as_deref().map(super::seq_token).transpose()?;
    visible_job(&state, &principal, &job_id).await?;
    let runs = state.node.state().job_runs(&job_id, before, limit + 1)?;
    Ok(Json(RunList {
        runs: runs.iter().take(limit).map(run_view).collect(),
        next_page_token: (runs.len() > limit).then(|| runs[limit - 1].seq.to_string()),
    }))
}

/// A job listing's page token: `{createdMs}:{jobId}`.
pub(crate) fn parse_page_token(token: &str) -> Result<(u64, &str), ApiError> {
    let bad = || ApiError::BadRequest("pageToken is {createdMs}:{jobId}".into());
    let (created_ms, job_id) = token.split_once(':').ok_or_else(bad)?;
    Ok((super::seq_token(created_ms).map_err(|_| bad())?, job_id))
}

/// The caller's jobs, oldest first.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<JobsQuery>,
) -> Result<Json<JobList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    let after = query.page_token.as_deref().map(parse_page_token).transpose()?;
    crate::access::barrier(&state, &principal).await?;
    let jobs = state.node.state().jobs_of(&principal.user.id, after, limit + 1)?;
    let views = jobs.iter().take(limit).map(|job| view(&state, job)).collect::<Result<Vec<_>, _>>()?;
    let next_page_token =
        (jobs.len() > limit).then(|| format!("{}:{}", jobs[limit - 1].created_ms, jobs[limit - 1].id));
    Ok(Json(JobList { jobs: views, next_page_token }))
}
