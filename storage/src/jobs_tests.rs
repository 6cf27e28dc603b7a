//! Job transitions: create, claim (one winner), start, renew, finish with retries, cron
//! re-scheduling, stale fences after a lease expired, cancel, patch, run expiry.

use crate::command::{Batch, Command, Outcome, Rejection};
use crate::jobs::{Job, JobPatch, JobSpec, JobStatus, RunReport, RunStatus, Schedule};
use crate::schedule::CronSchedule;
use crate::{Db, StateMachine};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

fn at(sm: &StateMachine, now_ms: u64, command: Command) -> Outcome {
    let mut out = sm.apply(b"m", Some(&Batch { now_ms, commands: vec![command] })).expect("apply");
    out.pop().expect("one outcome")
}

fn job(id: &str, schedule: Schedule, max_retries: u32) -> Job {
    let next = match &schedule {
        Schedule::Once { run_at_ms } => *run_at_ms,
        Schedule::Cron(_) | Schedule::Interval { .. } => 1_000,
    };
    let spec = JobSpec {
        id: id.into(),
        owner_user_id: "u".into(),
        job_type: "noop".into(),
        target: String::new(),
        payload: serde_json::json!({}),
        schedule,
        max_retries,
        retry_backoff_ms: 1_000,
        timeout_s: 30,
    };
    Job::scheduled(spec, Some(next))
}

fn expire_runs(sm: &StateMachine, now: u64) -> Outcome {
    at(sm, now, Command::ExpireRuns { before_ms: now, max_runs: 10 })
}

fn claim(sm: &StateMachine, now: u64, worker: &str) -> Vec<Job> {
    match at(sm, now, Command::ClaimJobs { worker: worker.into(), lease_ms: 500, max_jobs: 10 }) {
        Outcome::JobsClaimed { jobs } => jobs,
        other => panic!("claim: {other:?}"),
    }
}

fn report(job_id: &str, fence: u64, status: RunStatus, retry_at_ms: u64) -> Command {
    Command::FinishRun(Box::new(RunReport {
        job_id: job_id.into(),
        fence,
        status,
        error: (status != RunStatus::Succeeded).then(|| "boom".into()),
        result: None,
        retry_at_ms,
    }))
}

/// Runs are kept this long after they end.
const RUN_TTL_MS: u64 = 10_000;

fn start(sm: &StateMachine, now: u64, job_id: &str, fence: u64, worker: &str) -> Outcome {
    let run_id = format!("run-{now}");
    at(
        sm,
        now,
        Command::StartRun { job_id: job_id.into(), fence, run_id, worker: worker.into(), run_ttl_ms: RUN_TTL_MS },
    )
}

#[test]
fn one_off_job_is_claimed_once_runs_and_succeeds() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 1_000 }, 0))));
    assert!(claim(&sm, 999, "w1").is_empty(), "not due yet");
    let claimed = claim(&sm, 1_000, "w1");
    assert_eq!((claimed.len(), claimed[0].fence, claimed[0].status), (1, 1, JobStatus::Claimed));
    assert!(claim(&sm, 1_001, "w2").is_empty(), "exactly one claimer wins");
    assert_eq!(start(&sm, 1_002, "j", 1, "w1"), Outcome::Done);
    assert_eq!(at(&sm, 1_003, report("j", 1, RunStatus::Succeeded, 0)), Outcome::Done);
    let done = sm.job("j").expect("read").expect("job");
    assert_eq!((done.status, done.next_run_at_ms), (JobStatus::Succeeded, None));
    let runs = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!((runs.len(), runs[0].status, runs[0].scheduled_for_ms), (1, RunStatus::Succeeded, 1_000));
}

#[test]
fn a_stale_fence_after_lease_expiry_changes_nothing() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 3))));
    claim(&sm, 10, "w1");
    start(&sm, 11, "j", 1, "w1");
    // w1 stalls; its lease (500 ms) expires and w2 claims with fence 2.
    assert!(claim(&sm, 400, "w2").is_empty(), "lease still held");
    let taken = claim(&sm, 511, "w2");
    assert_eq!((taken[0].fence, taken[0].lease_owner.as_deref()), (2, Some("w2")));
    let stale = Outcome::Rejected(Rejection::StaleFence { current: 2 });
    assert_eq!(at(&sm, 512, report("j", 1, RunStatus::Succeeded, 0)), stale);
    assert_eq!(at(&sm, 512, Command::RenewLease { job_id: "j".into(), fence: 1, lease_ms: 500 }), stale);
    assert_eq!(start(&sm, 512, "j", 1, "w1"), stale);
    let job = sm.job("j").expect("read").expect("job");
    assert_eq!((job.status, job.fence, job.lease_owner.as_deref()), (JobStatus::Claimed, 2, Some("w2")));
    let runs = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!(runs[0].status, RunStatus::TimedOut, "the abandoned attempt is recorded as timed out");
}

#[test]
fn failures_retry_until_exhausted_then_fail() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 2))));
    let mut now = 10;
    for attempt in 1..=3u64 {
        let claimed = claim(&sm, now, "w");
        assert_eq!(claimed[0].attempts as u64, attempt);
        start(&sm, now, "j", claimed[0].fence, "w");
        at(&sm, now, report("j", claimed[0].fence, RunStatus::Failed, now + 100));
        now += 100;
    }
    let job = sm.job("j").expect("read").expect("job");
    assert_eq!((job.status, job.attempts), (JobStatus::Failed, 0));
    assert_eq!(sm.job_runs("j", None, 10).expect("runs").len(), 3, "1 + maxRetries attempts");
    assert!(sm.job_runs("j", None, 10).expect("runs").iter().all(|r| r.scheduled_for_ms == 10));
}

#[test]
fn cron_jobs_return_to_scheduled_and_cancel_stops_them() {
    let (_dir, sm) = open();
    let cron = CronSchedule::parse("* * * * *", "UTC").expect("cron");
    at(&sm, 0, Command::CreateJob(Box::new(job("c", Schedule::Cron(cron), 0))));
    let claimed = claim(&sm, 1_000, "w");
    start(&sm, 1_000, "c", claimed[0].fence, "w");
    at(&sm, 1_001, report("c", claimed[0].fence, RunStatus::Failed, 0));
    let job = sm.job("c").expect("read").expect("job");
    assert_eq!((job.status, job.next_run_at_ms), (JobStatus::Scheduled, Some(60_000)), "exhausted: next fire");
    assert_eq!(at(&sm, 2_000, Command::CancelJob { job_id: "c".into() }), Outcome::Done);
    assert!(claim(&sm, 60_000, "w").is_empty(), "a cancelled job is never claimed");
    assert!(matches!(
        at(&sm, 2_001, Command::CancelJob { job_id: "c".into() }),
        Outcome::Rejected(Rejection::Conflict(_))
    ));
    let patch = JobPatch { max_retries: Some(1), ..JobPatch::default() };
    let patched = at(&sm, 2_002, Command::PatchJob { job_id: "c".into(), patch: Box::new(patch) });
    assert!(matches!(patched, Outcome::Rejected(Rejection::Conflict(_))), "final jobs are not patched");
}

#[test]
fn patch_moves_the_next_run_and_runs_expire() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 100 }, 0))));
    let patch = JobPatch {
        schedule: Some(Schedule::Once { run_at_ms: 5_000 }),
        next_run_at_ms: Some(5_000),
        ..JobPatch::default()
    };
    at(&sm, 1, Command::PatchJob { job_id: "j".into(), patch: Box::new(patch) });
    assert!(claim(&sm, 100, "w").is_empty(), "moved to 5 s");
    assert_eq!(sm.next_claimable_ms().expect("peek"), Some(5_000));
    let claimed = claim(&sm, 5_000, "w");
    start(&sm, 5_000, "j", claimed[0].fence, "w");
    at(&sm, 5_001, report("j", claimed[0].fence, RunStatus::Succeeded, 0));
    assert_eq!(
        at(&sm, 15_000, Command::ExpireRuns { before_ms: 15_000, max_runs: 10 }),
        Outcome::Collected { removed: 0, more: false }
    );
    assert_eq!(
        at(&sm, 15_001, Command::ExpireRuns { before_ms: 15_001, max_runs: 10 }),
        Outcome::Collected { removed: 1, more: false }
    );
    assert!(sm.job_runs("j", None, 10).expect("runs").is_empty());
    assert_eq!(sm.jobs_of("u", None, 10).expect("list").len(), 1);
}

#[test]
fn a_lease_expiry_counts_as_an_attempt() {
    // maxRetries 0: the worker vanishes, its lease expires; the job is not run a second time.
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 0))));
    let first = claim(&sm, 10, "w1");
    start(&sm, 11, "j", first[0].fence, "w1");
    assert!(claim(&sm, 600, "w2").is_empty(), "no retries left: not claimed again");
    let job = sm.job("j").expect("read").expect("job");
    assert_eq!((job.status, job.lease_owner.as_deref()), (JobStatus::Failed, None));
    let runs = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!((runs.len(), runs[0].status), (1, RunStatus::TimedOut));
    // With a retry left, the expiry makes the second (and last) attempt.
    at(&sm, 0, Command::CreateJob(Box::new(job_with("k", 1))));
    claim(&sm, 1_000, "w1");
    let second = claim(&sm, 1_600, "w2");
    assert_eq!((second.len(), second[0].attempts), (1, 2));
    assert!(claim(&sm, 2_200, "w3").is_empty());
    assert_eq!(sm.job("k").expect("read").expect("job").status, JobStatus::Failed);
}

fn job_with(id: &str, max_retries: u32) -> Job {
    job(id, Schedule::Once { run_at_ms: 10 }, max_retries)
}

#[test]
fn an_exhausted_cron_fire_moves_to_the_next_fire_after_a_lease_expiry() {
    let (_dir, sm) = open();
    let cron = CronSchedule::parse("* * * * *", "UTC").expect("cron");
    at(&sm, 0, Command::CreateJob(Box::new(job("c", Schedule::Cron(cron), 0))));
    claim(&sm, 1_000, "w1");
    assert!(claim(&sm, 1_600, "w2").is_empty());
    let job = sm.job("c").expect("read").expect("job");
    assert_eq!((job.status, job.next_run_at_ms), (JobStatus::Scheduled, Some(60_000)));
}

#[test]
fn a_patch_during_a_run_governs_the_next_fire() {
    let (_dir, sm) = open();
    let every_minute = CronSchedule::parse("* * * * *", "UTC").expect("cron");
    at(&sm, 0, Command::CreateJob(Box::new(job("c", Schedule::Cron(every_minute), 0))));
    let claimed = claim(&sm, 1_000, "w");
    start(&sm, 1_000, "c", claimed[0].fence, "w");
    let hourly = CronSchedule::parse("0 * * * *", "UTC").expect("cron");
    let patch =
        JobPatch { schedule: Some(Schedule::Cron(hourly)), next_run_at_ms: Some(3_600_000), ..JobPatch::default() };
    at(&sm, 1_500, Command::PatchJob { job_id: "c".into(), patch: Box::new(patch) });
    at(&sm, 2_000, report("c", claimed[0].fence, RunStatus::Succeeded, 0));
    let job = sm.job("c").expect("read").expect("job");
    assert_eq!((job.status, job.next_run_at_ms), (JobStatus::Scheduled, Some(3_600_000)), "hourly, not 60 s");
    // A one-off job whose runAt moved while it ran runs again at the new time.
    at(&sm, 0, Command::CreateJob(Box::new(job_with("o", 0))));
    let claimed = claim(&sm, 10, "w");
    start(&sm, 10, "o", claimed[0].fence, "w");
    let patch = JobPatch {
        schedule: Some(Schedule::Once { run_at_ms: 9_000 }),
        next_run_at_ms: Some(9_000),
        ..JobPatch::default()
    };
    at(&sm, 20, Command::PatchJob { job_id: "o".into(), patch: Box::new(patch) });
    at(&sm, 30, report("o", claimed[0].fence, RunStatus::Succeeded, 0));
    let job = sm.job("o").expect("read").expect("job");
    assert_eq!((job.status, job.next_run_at_ms), (JobStatus::Scheduled, Some(9_000)));
}

#[test]
fn every_run_record_expires_however_it_ended() {
    let (_dir, sm) = open();
    // A run cut off by a lease expiry (TIMED_OUT) …
    at(&sm, 0, Command::CreateJob(Box::new(job_with("t", 0))));
    let claimed = claim(&sm, 10, "w1");
    start(&sm, 10, "t", claimed[0].fence, "w1");
    claim(&sm, 600, "w2");
    // … and a run cut off by a cancel.
    at(&sm, 0, Command::CreateJob(Box::new(job_with("c", 0))));
    let claimed = claim(&sm, 700, "w");
    start(&sm, 700, "c", claimed[0].fence, "w");
    at(&sm, 800, Command::CancelJob { job_id: "c".into() });
    let cancelled = sm.job_runs("c", None, 10).expect("runs");
    assert_eq!((cancelled[0].status, cancelled[0].finished_ms), (RunStatus::Failed, Some(800)));
    assert_eq!(expire_runs(&sm, 600 + RUN_TTL_MS - 1), Outcome::Collected { removed: 0, more: false });
    assert_eq!(expire_runs(&sm, 800 + RUN_TTL_MS), Outcome::Collected { removed: 2, more: false });
    assert!(sm.job_runs("t", None, 10).expect("runs").is_empty());
    assert!(sm.job_runs("c", None, 10).expect("runs").is_empty());
}

#[test]
fn interval_schedules_fire_every_period_and_coalesce() {
    let every = Schedule::Interval { every_ms: 45_000 };
    assert_eq!(every.next_after_fire(1_000, 1_500), Some(46_000));
    assert_eq!(every.next_after_fire(1_000, 200_000), Some(226_000), "missed fires coalesce");
    let hours = Schedule::Interval { every_ms: 7_200_000 };
    assert_eq!(hours.next_after_fire(0, 10), Some(7_200_000), "intervals above an hour stay exact");
    assert_eq!(Schedule::Once { run_at_ms: 5 }.next_after_fire(5, 10), None);
}
