//! Job transitions: create, claim (one winner), start, claim and start in one command, renew,
//! finish with retries, cron re-scheduling, stale fences after a lease expired, cancel,
//! patch, run expiry.

use crate::command::{Batch, Command, Outcome, Rejection};
use crate::jobs::{Job, JobPatch, JobSpec, JobStatus, RunReport, RunStatus, Schedule};
use crate::schedule::CronSchedule;
use crate::state::Reads;
use crate::{Db, StateMachine};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

fn at(sm: &StateMachine, now_ms: u64, command: Command) -> Outcome {
    let mut out = sm.apply(b"m", Some(&Batch::new(now_ms, vec![command].into()))).expect("apply");
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
    // What the API shows: the attempts of the fire that failed, not the record's reset count,
    // even once the run records are gone.
    assert_eq!((job.last_fire_attempts, sm.job_attempts(&job).expect("attempts")), (3, 3));
    assert_eq!(sm.job_runs("j", None, 10).expect("runs").len(), 3, "1 + maxRetries attempts");
    assert!(sm.job_runs("j", None, 10).expect("runs").iter().all(|r| r.scheduled_for_ms == 10));
    at(&sm, 10_000_000 + RUN_TTL_MS, Command::ExpireRuns { before_ms: 10_000_000 + RUN_TTL_MS, max_runs: 10 });
    assert!(sm.job_runs("j", None, 10).expect("runs").is_empty(), "the run records expired");
    assert_eq!(sm.job_attempts(&job).expect("attempts"), 3);
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
    assert!(!sm.claimable_at(4_999).expect("peek"));
    assert!(sm.claimable_at(5_000).expect("peek"));
    assert_eq!(sm.next_claimable_ms(4_999).expect("peek"), None, "nothing due by then");
    assert_eq!(sm.next_claimable_ms(5_049).expect("peek"), Some(5_000), "the executor wakes at the due time");
    let claimed = claim(&sm, 5_000, "w");
    assert!(!sm.claimable_at(5_499).expect("peek"), "claimed, its lease runs");
    assert!(sm.claimable_at(5_500).expect("peek"), "its lease expired");
    assert_eq!(sm.next_claimable_ms(6_000).expect("peek"), Some(5_500), "the lease's expiry");
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

fn claim_and_start(sm: &StateMachine, now: u64, worker: &str, run_ids: &[&str]) -> Vec<Job> {
    let run_ids = run_ids.iter().map(|r| r.to_string()).collect();
    let command = Command::ClaimAndStartJobs { worker: worker.into(), lease_ms: 500, run_ids, run_ttl_ms: RUN_TTL_MS };
    match at(sm, now, command) {
        Outcome::JobsClaimed { jobs } => jobs,
        other => panic!("claim and start: {other:?}"),
    }
}

#[test]
fn claim_and_start_runs_each_claimed_job_in_one_command() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 1_000 }, 0))));
    assert!(claim_and_start(&sm, 999, "w1", &["r0"]).is_empty(), "not due yet");
    assert!(sm.job_runs("j", None, 10).expect("runs").is_empty(), "nothing started");
    let claimed = claim_and_start(&sm, 1_000, "w1", &["r1", "r2"]);
    assert_eq!(claimed.len(), 1);
    let j = &claimed[0];
    assert_eq!((j.status, j.fence, j.attempts, j.runs), (JobStatus::Running, 1, 1, 1));
    assert_eq!(
        (j.lease_owner.as_deref(), j.lease_expires_ms, j.scheduled_for_ms),
        (Some("w1"), Some(1_500), Some(1_000))
    );
    assert_eq!(sm.job("j").expect("read").as_ref(), Some(j), "the outcome is the stored job");
    let runs = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!((run.run_id.as_str(), run.worker_id.as_str(), run.fence, run.attempt), ("r1", "w1", 1, 1));
    assert_eq!(
        (run.status, run.started_ms, run.scheduled_for_ms, run.ttl_ms),
        (RunStatus::Running, 1_000, 1_000, RUN_TTL_MS)
    );
    // Exactly one claimer wins; the attempt already runs, so a start under its fence changes
    // nothing (a second run record would be a second fire).
    assert!(claim_and_start(&sm, 1_001, "w2", &["x"]).is_empty());
    assert!(claim(&sm, 1_001, "w2").is_empty());
    assert!(matches!(start(&sm, 1_002, "j", 1, "w1"), Outcome::Rejected(Rejection::Conflict(_))));
    assert_eq!(sm.job_runs("j", None, 10).expect("runs").len(), 1);
    assert_eq!(at(&sm, 1_003, report("j", 1, RunStatus::Succeeded, 0)), Outcome::Done);
    let done = sm.job("j").expect("read").expect("job");
    assert_eq!((done.status, done.lease_owner, done.lease_expires_ms), (JobStatus::Succeeded, None, None));
    let runs = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!((runs[0].status, runs[0].finished_ms), (RunStatus::Succeeded, Some(1_003)));
}

#[test]
fn claim_and_start_takes_at_most_one_job_per_run_id_in_due_order() {
    let (_dir, sm) = open();
    for (id, run_at_ms) in [("c", 30), ("a", 10), ("b", 20)] {
        at(&sm, 0, Command::CreateJob(Box::new(job(id, Schedule::Once { run_at_ms }, 0))));
    }
    assert!(claim_and_start(&sm, 100, "w", &[]).is_empty(), "no run ids: nothing claimed");
    assert_eq!(sm.job("a").expect("read").expect("job").status, JobStatus::Scheduled);
    let first = claim_and_start(&sm, 100, "w", &["r1", "r2"]);
    let taken: Vec<(&str, JobStatus)> = first.iter().map(|j| (j.id.as_str(), j.status)).collect();
    assert_eq!(taken, [("a", JobStatus::Running), ("b", JobStatus::Running)], "the earliest due first");
    assert_eq!(sm.job_runs("a", None, 1).expect("runs")[0].run_id, "r1");
    assert_eq!(sm.job_runs("b", None, 1).expect("runs")[0].run_id, "r2");
    let rest = claim_and_start(&sm, 100, "w", &["r3", "r4", "r5"]);
    assert_eq!((rest.len(), rest[0].id.as_str()), (1, "c"));
    assert_eq!(sm.job_runs("c", None, 1).expect("runs")[0].run_id, "r3");
    // Several claims in one entry: each sees the ones before it, so no job goes to two, and
    // each gets jobs of its own while some are due.
    let (_dir, sm) = open();
    for id in ["a", "b", "c"] {
        at(&sm, 0, Command::CreateJob(Box::new(job(id, Schedule::Once { run_at_ms: 10 }, 0))));
    }
    let claim_one = |w: &str| Command::ClaimAndStartJobs {
        worker: w.into(),
        lease_ms: 500,
        run_ids: vec![format!("{w}-r")],
        run_ttl_ms: RUN_TTL_MS,
    };
    let commands = vec![claim_one("w1"), claim_one("w2"), claim_one("w3"), claim_one("w4")];
    let outcomes = sm.apply(b"m", Some(&Batch::new(100, commands.into()))).expect("apply");
    let taken: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::JobsClaimed { jobs } => jobs.iter().map(|j| j.id.clone()).collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(taken, [vec!["a"], vec!["b"], vec!["c"], vec![]]);
    for (id, worker) in [("a", "w1"), ("b", "w2"), ("c", "w3")] {
        let run = &sm.job_runs(id, None, 10).expect("runs")[0];
        assert_eq!((run.worker_id.as_str(), run.run_id.clone()), (worker, format!("{worker}-r")));
    }
}

#[test]
fn an_expired_started_claim_times_out_and_its_stale_fence_changes_nothing() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job_with("j", 1))));
    let first = claim_and_start(&sm, 10, "w1", &["r1"]);
    assert_eq!(first[0].fence, 1);
    // w1 stalls past its lease (500 ms); w2 takes the second and last attempt with fence 2.
    assert!(claim_and_start(&sm, 509, "w2", &["r2"]).is_empty(), "lease still held");
    let second = claim_and_start(&sm, 510, "w2", &["r2"]);
    assert_eq!((second[0].fence, second[0].attempts, second[0].runs, second[0].status), (2, 2, 2, JobStatus::Running));
    let runs = sm.job_runs("j", None, 10).expect("runs");
    let seen: Vec<(&str, RunStatus, u64)> = runs.iter().map(|r| (r.run_id.as_str(), r.status, r.fence)).collect();
    assert_eq!(seen, [("r2", RunStatus::Running, 2), ("r1", RunStatus::TimedOut, 1)]);
    let stale = Outcome::Rejected(Rejection::StaleFence { current: 2 });
    assert_eq!(at(&sm, 520, report("j", 1, RunStatus::Succeeded, 0)), stale);
    assert_eq!(at(&sm, 520, Command::RenewLease { job_id: "j".into(), fence: 1, lease_ms: 500 }), stale);
    let held = sm.job("j").expect("read").expect("job");
    assert_eq!((held.status, held.fence, held.lease_owner.as_deref()), (JobStatus::Running, 2, Some("w2")));
    // The last attempt's lease expires too: the job ends FAILED and is not started again (it
    // takes no run id; a due job in the same claim does).
    at(&sm, 0, Command::CreateJob(Box::new(job("k", Schedule::Once { run_at_ms: 1_000 }, 0))));
    let third = claim_and_start(&sm, 1_010, "w3", &["r3", "r4"]);
    assert_eq!((third.len(), third[0].id.as_str()), (1, "k"));
    assert_eq!(sm.job_runs("k", None, 1).expect("runs")[0].run_id, "r3");
    let ended = sm.job("j").expect("read").expect("job");
    assert_eq!((ended.status, ended.runs, ended.lease_owner), (JobStatus::Failed, 2, None));
    assert_eq!(sm.job_runs("j", None, 1).expect("runs")[0].status, RunStatus::TimedOut);
}

#[test]
fn claims_start_at_the_floor_and_no_due_job_is_ever_left_below_it() {
    let (_dir, sm) = open();
    for i in 0..25 {
        at(&sm, 0, Command::CreateJob(Box::new(job(&format!("j{i:02}"), Schedule::Once { run_at_ms: 1_000 }, 0))));
    }
    // Three claims of at most 10 walk the index front to back, each from where the last stopped.
    let mut taken: Vec<String> = (0..3).flat_map(|_| claim(&sm, 1_000, "w")).map(|j| j.id).collect();
    taken.sort();
    let all: Vec<String> = (0..25).map(|i| format!("j{i:02}")).collect();
    assert_eq!(taken, all, "each due job claimed exactly once");
    let floor = sm.get_bytes(&crate::keys::queue_floor(&crate::keys::job_due(0, ""))).expect("read");
    assert!(floor.is_some_and(|f| f > crate::keys::job_due(1_000, "j24")), "the floor passed every claimed job");

    // A job due before the floor brings it down.
    at(&sm, 1_001, Command::CreateJob(Box::new(job("early", Schedule::Once { run_at_ms: 10 }, 0))));
    assert!(sm.claimable_at(1_001).expect("peek"));
    assert_eq!(claim(&sm, 1_001, "w").iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["early"]);

    // A job written in the same entry as a claim is not in that claim's scan, and the claim's
    // raise of the floor stops below it, so the next claim finds it.
    let both = sm
        .apply(
            b"m",
            Some(&Batch::new(
                2_000,
                vec![
                    Command::CreateJob(Box::new(job("same", Schedule::Once { run_at_ms: 1_500 }, 0))),
                    Command::ClaimJobs { worker: "w".into(), lease_ms: 500, max_jobs: 10 },
                ]
                .into(),
            )),
        )
        .expect("apply");
    assert_eq!(both[1], Outcome::JobsClaimed { jobs: Vec::new() });
    assert!(sm.claimable_at(2_000).expect("peek"));
    assert_eq!(claim(&sm, 2_001, "w").iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["same"]);
}

#[test]
fn an_expired_lease_is_found_past_the_lease_index_floor() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("a", Schedule::Once { run_at_ms: 100 }, 1))));
    at(&sm, 0, Command::CreateJob(Box::new(job("b", Schedule::Once { run_at_ms: 2_000 }, 1))));
    assert_eq!(claim(&sm, 100, "w").len(), 1);
    assert!(claim(&sm, 599, "w").is_empty(), "a's lease runs until 600; the lease floor moves to 600");
    let again = claim(&sm, 600, "w2");
    assert_eq!(again.iter().map(|j| (j.id.as_str(), j.attempts)).collect::<Vec<_>>(), [("a", 2)]);
    assert_eq!(claim(&sm, 2_000, "w").iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(claim(&sm, 2_500, "w").iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["b"], "b's lease expired");
}

#[test]
fn the_active_job_quota_is_checked_in_apply_and_follows_every_status() {
    let (_dir, sm) = open();
    let once = |id: &str| job(id, Schedule::Once { run_at_ms: 1_000 }, 0);
    let within = |j: Job| Command::CreateJobWithin { job: Box::new(j), active_jobs_max: 2 };
    // Three creations in one entry (as parallel requests batched together): two pass.
    let batch = Batch::new(1, vec![within(once("a")), within(once("b")), within(once("c"))].into());
    let outcomes = sm.apply(b"m", Some(&batch)).expect("apply");
    assert_eq!(outcomes[..2], [Outcome::Done, Outcome::Done]);
    assert!(matches!(&outcomes[2], Outcome::Rejected(Rejection::LimitReached(_))), "{outcomes:?}");
    assert_eq!(sm.active_jobs_of("u").expect("count"), 2);
    // Claimed and running still count; a finished one does not, and makes room.
    let claimed = claim(&sm, 1_000, "w");
    assert_eq!(claimed.len(), 2);
    assert_eq!(sm.active_jobs_of("u").expect("count"), 2);
    assert_eq!(at(&sm, 1_001, report("a", claimed[0].fence, RunStatus::Succeeded, 0)), Outcome::Done);
    assert_eq!(sm.active_jobs_of("u").expect("count"), 1);
    assert_eq!(at(&sm, 1_002, within(once("c"))), Outcome::Done);
    assert_eq!(at(&sm, 1_003, Command::CancelJob { job_id: "c".into() }), Outcome::Done);
    assert_eq!(sm.active_jobs_of("u").expect("count"), 1);
}

#[test]
fn a_page_of_runs_reads_the_page_whatever_the_job_has() {
    let (_dir, sm) = open();
    assert_eq!(
        at(&sm, 1, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 500)))),
        Outcome::Done
    );
    let mut now = 10;
    for _ in 0..300 {
        let claimed = claim(&sm, now, "w");
        assert_eq!(claimed.len(), 1);
        assert_eq!(start(&sm, now, "j", claimed[0].fence, "w"), Outcome::Done);
        assert_eq!(at(&sm, now, report("j", claimed[0].fence, RunStatus::Failed, now + 1)), Outcome::Done);
        now += 1;
    }
    let newest = sm.job_runs("j", None, 10).expect("runs");
    assert_eq!(newest.len(), 10);
    assert!(newest.windows(2).all(|w| w[0].seq > w[1].seq), "newest first");
    let next = sm.job_runs("j", Some(newest[9].seq), 10).expect("runs");
    assert_eq!(next[0].seq, newest[9].seq - 1);
}

#[test]
fn a_paused_job_is_never_claimed_and_resumes_without_making_up_missed_fires() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Interval { every_ms: 1_000 }, 0))));
    let pause = || Command::PauseJob { job_id: "j".into() };
    assert_eq!(at(&sm, 500, pause()), Outcome::Done);
    assert_eq!(at(&sm, 600, pause()), Outcome::Done, "pausing a paused job changes nothing");
    assert!(claim(&sm, 5_500, "w").is_empty(), "a paused job is not due");
    assert!(!sm.claimable_at(5_500).expect("read"), "nor in the due index");
    let refused = at(&sm, 5_600, Command::RunJobNow { job_id: "j".into(), min_interval_ms: None });
    assert!(
        matches!(refused, Outcome::Rejected(Rejection::Conflict(ref why)) if why.contains("paused")),
        "{refused:?}"
    );
    // Resumed at 5,600: the fires of 1,000 to 5,000 are not made up; the next is 6,000.
    assert_eq!(at(&sm, 5_600, Command::ResumeJob { job_id: "j".into() }), Outcome::Done);
    let resumed = sm.job("j").expect("read").expect("job");
    assert_eq!((resumed.paused, resumed.next_run_at_ms), (false, Some(6_000)));
    assert!(claim(&sm, 5_999, "w").is_empty());
    assert_eq!(claim(&sm, 6_000, "w")[0].scheduled_for_ms, Some(6_000));
}

#[test]
fn a_one_off_job_missed_while_paused_runs_at_the_resume() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 1_000 }, 0))));
    at(&sm, 10, Command::PauseJob { job_id: "j".into() });
    assert!(claim(&sm, 2_000, "w").is_empty());
    at(&sm, 3_000, Command::ResumeJob { job_id: "j".into() });
    let claimed = claim(&sm, 3_000, "w");
    // Its one fire, with its own time: once it ends, the job is done (not due again).
    assert_eq!((claimed.len(), claimed[0].scheduled_for_ms), (1, Some(1_000)));
    start(&sm, 3_001, "j", 1, "w");
    at(&sm, 3_002, report("j", 1, RunStatus::Succeeded, 0));
    let done = sm.job("j").expect("read").expect("job");
    assert_eq!((done.status, done.next_run_at_ms, done.paused), (JobStatus::Succeeded, None, false));
    assert!(claim(&sm, 10_000, "w").is_empty(), "a one-off job fired twice");
    assert_eq!(sm.job_runs("j", None, 10).expect("runs").len(), 1);
}

#[test]
fn run_now_of_an_overdue_one_off_job_fires_it_once() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 1_000 }, 0))));
    assert_eq!(at(&sm, 2_000, Command::RunJobNow { job_id: "j".into(), min_interval_ms: None }), Outcome::Done);
    let claimed = claim(&sm, 2_000, "w");
    assert_eq!(claimed[0].scheduled_for_ms, Some(1_000));
    start(&sm, 2_001, "j", 1, "w");
    at(&sm, 2_002, report("j", 1, RunStatus::Succeeded, 0));
    assert_eq!(sm.job("j").expect("read").expect("job").status, JobStatus::Succeeded);
    assert!(claim(&sm, 10_000, "w").is_empty(), "a one-off job fired twice");
}

#[test]
fn a_job_paused_between_its_claim_and_its_start_does_not_start() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 1))));
    claim(&sm, 10, "w");
    at(&sm, 11, Command::PauseJob { job_id: "j".into() });
    assert!(matches!(start(&sm, 12, "j", 1, "w"), Outcome::Rejected(Rejection::Conflict(_))));
    assert!(claim(&sm, 5_000, "w2").is_empty(), "the expired lease of a paused job is held");
    at(&sm, 6_000, Command::ResumeJob { job_id: "j".into() });
    assert_eq!(claim(&sm, 6_000, "w2").len(), 1);
}

#[test]
fn a_pause_during_a_run_lets_it_end_and_holds_its_retry() {
    let (_dir, sm) = open();
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Once { run_at_ms: 10 }, 2))));
    claim(&sm, 10, "w1");
    start(&sm, 11, "j", 1, "w1");
    at(&sm, 12, Command::PauseJob { job_id: "j".into() });
    // The run goes on and reports; its retry waits for the resume.
    assert_eq!(at(&sm, 20, report("j", 1, RunStatus::Failed, 100)), Outcome::Done);
    assert!(claim(&sm, 10_000, "w2").is_empty(), "the retry of a paused job waits");
    at(&sm, 10_000, Command::ResumeJob { job_id: "j".into() });
    let retried = claim(&sm, 10_000, "w2");
    assert_eq!((retried[0].attempts, retried[0].fence, retried[0].scheduled_for_ms), (2, 2, Some(10)));
    // A lease that expires while paused ends the attempt and holds the next one too.
    start(&sm, 10_001, "j", 2, "w2");
    at(&sm, 10_002, Command::PauseJob { job_id: "j".into() });
    assert!(claim(&sm, 20_000, "w3").is_empty(), "an expired lease of a paused job is not retried");
    let held = sm.job("j").expect("read").expect("job");
    assert_eq!((held.status, held.attempts, held.lease_owner.as_deref()), (JobStatus::Scheduled, 2, None));
    assert_eq!(sm.job_runs("j", None, 10).expect("runs")[0].status, RunStatus::TimedOut);
}

#[test]
fn run_now_fires_once_fenced_and_the_schedule_goes_on() {
    let (_dir, sm) = open();
    let cron = CronSchedule::parse("0 * * * *", "UTC").expect("cron");
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Cron(cron), 0))));
    let now = |job_id: &str| Command::RunJobNow { job_id: job_id.into(), min_interval_ms: None };
    assert_eq!(at(&sm, 500, now("j")), Outcome::Done);
    let claimed = claim(&sm, 500, "w");
    assert_eq!((claimed.len(), claimed[0].fence, claimed[0].scheduled_for_ms), (1, 1, Some(500)));
    let busy = at(&sm, 501, now("j"));
    assert!(matches!(busy, Outcome::Rejected(Rejection::Conflict(ref why)) if why.contains("running")), "{busy:?}");
    start(&sm, 502, "j", 1, "w");
    at(&sm, 503, report("j", 1, RunStatus::Succeeded, 0));
    let after = sm.job("j").expect("read").expect("job");
    assert_eq!((after.status, after.next_run_at_ms), (JobStatus::Scheduled, Some(3_600_000)));
    assert_eq!(sm.job_runs("j", None, 10).expect("runs").len(), 1, "the fire is recorded");
    at(&sm, 504, Command::CancelJob { job_id: "j".into() });
    assert!(matches!(at(&sm, 505, now("j")), Outcome::Rejected(Rejection::Conflict(_))));
    assert!(matches!(at(&sm, 505, now("nope")), Outcome::Rejected(Rejection::NotFound(_))));
}

/// Issue 34, item 9: a run now made again within the owner's shortest interval is refused,
/// judged on the replicated clock; one after it, or one without a bound (an admin), passes.
#[test]
fn run_now_is_bounded_by_the_least_interval_it_carries() {
    let (_dir, sm) = open();
    let cron = CronSchedule::parse("0 * * * *", "UTC").expect("cron");
    at(&sm, 0, Command::CreateJob(Box::new(job("j", Schedule::Cron(cron), 0))));
    let bounded = || Command::RunJobNow { job_id: "j".into(), min_interval_ms: Some(60_000) };
    let fire = |t: u64, fence: u64| {
        let claimed = claim(&sm, t, "w");
        assert_eq!(claimed.len(), 1, "the run now is due at {t}");
        start(&sm, t + 1, "j", fence, "w");
        at(&sm, t + 2, report("j", fence, RunStatus::Succeeded, 0));
    };
    // (The job is first due at 1,000.)
    assert_eq!(at(&sm, 500, bounded()), Outcome::Done);
    fire(500, 1);
    let early = at(&sm, 30_000, bounded());
    assert!(matches!(early, Outcome::Rejected(Rejection::LimitReached(ref why)) if why.contains("60 s")), "{early:?}");
    assert_eq!(
        sm.job("j").expect("read").expect("job").next_run_at_ms,
        Some(3_600_000),
        "a refused run changes nothing"
    );
    assert_eq!(at(&sm, 30_001, Command::RunJobNow { job_id: "j".into(), min_interval_ms: None }), Outcome::Done);
    fire(30_001, 2);
    assert_eq!(at(&sm, 61_000, bounded()), Outcome::Done, "a minute after the last bounded run");
}
