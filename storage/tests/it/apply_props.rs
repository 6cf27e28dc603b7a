//! Property: `apply` never fails on input and is deterministic.
//!
//! Random sequences of commands — hostile strings (empty, long, control characters, `//`,
//! non-ASCII), extreme numbers, unknown ids, repeated and conflicting commits, bogus cron
//! schedules — are applied in random batches to two fresh state machines. Every apply must
//! return `Ok` (an input problem is an `Outcome`, never an error that would stop the node),
//! nothing may panic (debug assertions included), and both machines must end with
//! byte-identical snapshots.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::command::{FileCommit, FileMove, RateCheck, RateEntry};
use raftbox_storage::jobs::{Job, JobPatch, JobSpec, RunReport, RunResult, RunStatus, Schedule};
use raftbox_storage::links::Link;
use raftbox_storage::paths::FilePath;
use raftbox_storage::props::{PropChange, PropPatch};
use raftbox_storage::ratelimit::Algorithm;
use raftbox_storage::records::{Grantee, Role, SavedResponse};
use raftbox_storage::schedule::CronSchedule;
use raftbox_storage::{Batch, Command, Db, StateMachine};

/// Strings a client or a hostile peer might send.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-c]{1,3}",
        "[a-z0-9 ]{1,12}",
        "\\PC{0,40}",
        "[\t\n\r\u{0}\u{1b}\u{7f}/ .]{1,6}",
        "(//|/\\.\\./|\\.\\.|\t){1,4}",
        Just("x".repeat(300)),
        Just("é".repeat(200)),
        Just("🙂".repeat(100)),
    ]
}

/// Numbers at and around the edges.
fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(u64::MAX / 2),
        Just(u64::MAX / 1_000),
        0..5_000u64,
        any::<u64>(),
    ]
}

/// A small pool of ids so that commands meet each other, plus hostile ones.
fn id() -> impl Strategy<Value = String> {
    prop_oneof![4 => "(u|ns|j|f|g)[0-2]", 1 => Just(String::new()), 1 => hostile()]
}

fn path() -> impl Strategy<Value = FilePath> {
    let long = format!("/{}.txt", "x".repeat(236 - 5));
    let deep = format!("{}/f.txt", "/abcdefghi".repeat(408));
    prop_oneof![
        4 => prop::sample::select(vec!["/a.txt", "/a", "/d/b.txt", "/.hidden", "/a.tar.gz"]).prop_map(String::from),
        1 => Just(long),
        1 => Just(deep),
        1 => "/[a-zé🙂 .]{1,30}",
    ]
    .prop_filter_map("valid path", |p| FilePath::parse(&p).ok())
}

fn hash() -> impl Strategy<Value = BlockHash> {
    (0u8..6).prop_map(|n| BlockHash::of(&[n]))
}

fn schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        extreme().prop_map(|run_at_ms| Schedule::Once { run_at_ms }),
        extreme().prop_map(|every_ms| Schedule::Interval { every_ms }),
        prop::sample::select(vec!["* * * * *", "0 9 * * 1-5", "30 2 * * *", "0 0 1,15 * 1", "*/5 * * * * *"])
            .prop_map(|e| Schedule::Cron(CronSchedule::parse(e, "America/New_York").expect("valid"))),
        // A hostile peer can send a schedule that never went through the parser.
        (hostile(), hostile()).prop_map(|(expr, timezone)| Schedule::Cron(CronSchedule { expr, timezone })),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (extreme(), extreme()).prop_map(|(capacity, refill_per_s)| Algorithm::TokenBucket { capacity, refill_per_s }),
        (extreme(), extreme()).prop_map(|(limit, window_ms)| Algorithm::FixedWindow { limit, window_ms }),
        (0..50u64, extreme()).prop_map(|(limit, window_ms)| Algorithm::SlidingLog { limit, window_ms }),
        (extreme(), extreme()).prop_map(|(limit, window_ms)| Algorithm::SlidingWindow { limit, window_ms }),
        (extreme(), extreme()).prop_map(|(capacity, drain_per_s)| Algorithm::LeakyBucket { capacity, drain_per_s }),
    ]
}

fn file_commit() -> impl Strategy<Value = FileCommit> {
    (
        (id(), path(), prop::collection::vec(hash(), 0..4), extreme(), 0..4u64, any::<bool>(), hostile(), id(), id()),
        id(),
        proptest::option::of(extreme()),
    )
        .prop_map(
            |(
                (namespace_id, path, chunks, size, base_version, deleted, device, new_file_id, copy_file_id),
                actor_user_id,
                quota_bytes,
            )| {
                FileCommit {
                    namespace_id,
                    path,
                    chunks,
                    size,
                    mtime_ms: size,
                    executable: size % 2 == 0,
                    base_version,
                    deleted,
                    device,
                    new_file_id,
                    copy_file_id,
                    actor_user_id,
                    quota_bytes,
                }
            },
        )
}

fn job() -> impl Strategy<Value = Job> {
    (id(), id(), hostile(), schedule(), 0..3u32, extreme(), prop::option::of(extreme())).prop_map(
        |(id, owner_user_id, job_type, schedule, max_retries, retry_backoff_ms, next)| {
            let spec = JobSpec {
                id,
                owner_user_id,
                job_type,
                target: String::new(),
                payload: serde_json::json!({ "k": "v" }),
                schedule,
                max_retries,
                retry_backoff_ms,
                timeout_s: 30,
            };
            Job::scheduled(spec, next)
        },
    )
}

fn scope() -> impl Strategy<Value = [u8; 32]> {
    (0u8..3).prop_map(|n| [n; 32])
}

fn leaf_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        1 => file_commit().prop_map(|c| Command::CommitFile(Box::new(c))),
        1 => sharing_command(),
        3 => other_command(),
        1 => format_5_command(),
    ]
}

/// Passwords that end sessions, dead properties, links an owner revokes, bounded runs now.
fn format_5_command() -> impl Strategy<Value = Command> {
    let change = (hostile(), hostile(), proptest::option::of(hostile()))
        .prop_map(|(namespace, name, xml)| PropChange { namespace, name, xml });
    prop_oneof![
        (id(), proptest::option::of(hostile()), any::<bool>()).prop_map(|(user_id, password_hash, ends_sessions)| {
            Command::SetPassword { user_id, password_hash, ends_sessions }
        }),
        (id(), path(), id(), prop::collection::vec(change, 0..5)).prop_map(
            |(namespace_id, path, actor_user_id, changes)| {
                Command::PatchProps(Box::new(PropPatch { namespace_id, path, actor_user_id, changes }))
            }
        ),
        (id(), id(), id(), path(), any::<bool>(), scope()).prop_map(
            |(id, creator_user_id, namespace_id, path, folder, token_hash)| {
                let link = Link {
                    id,
                    token_hash,
                    creator_user_id,
                    namespace_id,
                    path: path.as_str().to_owned(),
                    folder,
                    created_ms: 0,
                    expires_ms: None,
                    password_hash: None,
                    max_downloads: Some(2),
                    downloads: 0,
                };
                Command::CreateLink { link: Box::new(link), links_max: 3 }
            }
        ),
        (id(), id(), proptest::option::of(id())).prop_map(|(actor_user_id, link_id, namespace_id)| {
            Command::RevokeLink { actor_user_id, link_id, namespace_id }
        }),
        (id(), proptest::option::of(extreme()))
            .prop_map(|(job_id, min_interval_ms)| Command::RunJobNow { job_id, min_interval_ms }),
    ]
}

fn other_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (id(), id(), hostile()).prop_map(|(user_id, namespace_id, name)| Command::CreateUser {
            user_id,
            namespace_id,
            name
        }),
        (id(), id(), hostile(), scope(), proptest::option::of(extreme()), proptest::option::of(0u64..3)).prop_map(
            |(token_id, user_id, name, token_hash, expires_ms, session_epoch)| Command::CreateToken {
                token_id,
                user_id,
                name,
                token_hash,
                expires_ms,
                session_epoch,
            }
        ),
        (id(), id()).prop_map(|(user_id, token_id)| Command::RevokeToken { user_id, token_id }),
        (id(), id(), id(), scope()).prop_map(|(user_id, namespace_id, token_id, token_hash)| Command::EnsureAdmin {
            user_id,
            namespace_id,
            token_id,
            token_hash
        }),
        (hash(), extreme(), id(), proptest::option::of(extreme()), proptest::option::of((extreme(), extreme())))
            .prop_map(|(hash, size, uploader, quota_bytes, placed_in)| Command::RegisterChunk {
                hash,
                size,
                uploader,
                quota_bytes,
                placed_in: placed_in.map(|(term, index)| raftbox_storage::ConfigId { term, index }),
            }),
        (id(), path(), path(), 0..4u64, hostile(), (id(), id())).prop_map(
            |(namespace_id, from, to, base_version, device, (new_file_id, actor_user_id))| {
                Command::MoveFile(Box::new(FileMove {
                    namespace_id,
                    from,
                    to,
                    base_version,
                    device,
                    new_file_id,
                    actor_user_id,
                }))
            }
        ),
        (extreme(), 0..4u32).prop_map(|(superseded_before_ms, max_versions)| Command::ExpireVersions {
            superseded_before_ms,
            max_versions
        }),
        (extreme(), 0..4u32)
            .prop_map(|(orphaned_before_ms, max_chunks)| Command::CollectOrphans { orphaned_before_ms, max_chunks }),
        prop::collection::vec((hostile(), algorithm()), 0..3).prop_map(|checks| Command::RateCheck {
            checks: checks.into_iter().map(|(key, algorithm)| RateCheck { key, algorithm }).collect()
        }),
        prop::collection::vec((hostile(), algorithm(), extreme(), extreme(), extreme(), extreme()), 0..3).prop_map(
            |entries| Command::RateSet {
                entries: entries
                    .into_iter()
                    .map(|(key, algorithm, now, n, idle_at_ms, charged_term)| RateEntry {
                        key,
                        state: algorithm.charge(None, now, n),
                        idle_at_ms,
                        charged_term,
                    })
                    .collect()
            }
        ),
        (0..5u32).prop_map(|max_records| Command::PurgeExpired { max_records }),
        job().prop_map(|j| Command::CreateJob(Box::new(j))),
        (job(), 0u32..3)
            .prop_map(|(j, active_jobs_max)| Command::CreateJobWithin { job: Box::new(j), active_jobs_max }),
        (id(), prop::option::of(schedule()), prop::option::of(extreme())).prop_map(|(job_id, schedule, next)| {
            let patch = JobPatch { schedule, next_run_at_ms: next, max_retries: Some(1), ..JobPatch::default() };
            Command::PatchJob { job_id, patch: Box::new(patch) }
        }),
        id().prop_map(|job_id| Command::CancelJob { job_id }),
        (hostile(), extreme(), 0..4u32).prop_map(|(worker, lease_ms, max_jobs)| Command::ClaimJobs {
            worker,
            lease_ms,
            max_jobs
        }),
        (id(), 0..4u64, id(), hostile(), extreme()).prop_map(|(job_id, fence, run_id, worker, run_ttl_ms)| {
            Command::StartRun { job_id, fence, run_id, worker, run_ttl_ms }
        }),
        (hostile(), extreme(), prop::collection::vec(id(), 0..4), extreme()).prop_map(
            |(worker, lease_ms, run_ids, run_ttl_ms)| Command::ClaimAndStartJobs {
                worker,
                lease_ms,
                run_ids,
                run_ttl_ms
            }
        ),
        (id(), 0..4u64, extreme()).prop_map(|(job_id, fence, lease_ms)| Command::RenewLease {
            job_id,
            fence,
            lease_ms
        }),
        (id(), 0..4u64, any::<bool>(), extreme(), hostile()).prop_map(|(job_id, fence, ok, retry_at_ms, error)| {
            let status = if ok { RunStatus::Succeeded } else { RunStatus::Failed };
            let result = Some(RunResult { http_status: Some(500), excerpt: error.clone() });
            Command::FinishRun(Box::new(RunReport { job_id, fence, status, error: Some(error), result, retry_at_ms }))
        }),
        (extreme(), 0..4u32).prop_map(|(before_ms, max_runs)| Command::ExpireRuns { before_ms, max_runs }),
        (scope(), scope(), extreme(), extreme()).prop_map(|(scope, fingerprint, ttl_ms, lease_ms)| {
            Command::IdempotencyBegin { scope, fingerprint, ttl_ms, lease_ms }
        }),
        (scope(), hostile()).prop_map(|(scope, body)| Command::IdempotencyComplete {
            scope,
            response: SavedResponse { status: 201, headers: vec![("content-type".into(), body.clone())], body }
        }),
        scope().prop_map(|scope| Command::IdempotencyRelease { scope }),
    ]
}

fn role() -> impl Strategy<Value = Option<Role>> {
    prop::option::of(prop::sample::select(vec![Role::Viewer, Role::Editor, Role::Owner]))
}

fn grantee() -> impl Strategy<Value = Grantee> {
    prop_oneof![id().prop_map(Grantee::User), id().prop_map(Grantee::Group)]
}

/// Shared folders, ACL changes, groups and migrations, with ids that may or may not exist.
fn sharing_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (id(), hostile(), id(), proptest::option::of(0u32..3)).prop_map(
            |(namespace_id, name, owner_user_id, folders_max)| Command::CreateSharedFolder {
                namespace_id,
                name,
                owner_user_id,
                folders_max,
            }
        ),
        (id(), id(), grantee(), any::<bool>()).prop_map(|(actor_user_id, namespace_id, grantee, accept)| {
            Command::RespondInvitation { actor_user_id, namespace_id, grantee, accept }
        }),
        (id(), id(), grantee(), role(), any::<bool>()).prop_map(
            |(actor_user_id, namespace_id, grantee, role, invite)| {
                Command::SetAccess { actor_user_id, namespace_id, grantee, role, invite }
            }
        ),
        (id(), id())
            .prop_map(|(actor_user_id, namespace_id)| Command::DeleteSharedFolder { actor_user_id, namespace_id }),
        (id(), hostile()).prop_map(|(group_id, name)| Command::CreateGroup { group_id, name }),
        (id(), id(), any::<bool>()).prop_map(|(group_id, user_id, member)| Command::SetGroupMember {
            group_id,
            user_id,
            member
        }),
        (0u32..=raftbox_storage::format::FORMAT).prop_map(|schema| Command::Migrate { schema }),
    ]
}

/// Commands, some wrapped in the guards that apply a command inside them.
fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        6 => leaf_command(),
        1 => (scope(), scope(), extreme(), leaf_command()).prop_map(|(scope, fingerprint, ttl_ms, inner)| {
            Command::Idempotent { scope, fingerprint, ttl_ms, on_success: None, command: Box::new(inner) }
        }),
        1 => (hostile(), id(), extreme(), leaf_command()).prop_map(|(consumer, message_id, ttl_ms, inner)| {
            Command::Once { consumer, message_id, ttl_ms, command: Box::new(inner) }
        }),
    ]
}

fn batches() -> impl Strategy<Value = Vec<Batch>> {
    prop::collection::vec(
        (extreme(), prop::collection::vec(command(), 0..6))
            .prop_map(|(now_ms, commands)| Batch::new(now_ms, commands.into())),
        1..12,
    )
}

fn fresh() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

/// One case: apply `batches` to two fresh machines; both succeed alike and end identical.
fn check_case(batches: &[Batch]) -> Result<(), TestCaseError> {
    let (_a_dir, a) = fresh();
    let (_b_dir, b) = fresh();
    for (i, batch) in batches.iter().enumerate() {
        let marker = i.to_be_bytes();
        let outcomes_a = a.apply(&marker, Some(batch));
        prop_assert!(outcomes_a.is_ok(), "apply failed on input: {:?}", outcomes_a);
        let outcomes_b = b.apply(&marker, Some(batch)).expect("the second machine applies too");
        prop_assert_eq!(outcomes_a.expect("checked"), outcomes_b);
    }
    let (mut image_a, mut image_b) = (Vec::new(), Vec::new());
    a.write_snapshot(&mut image_a).expect("snapshot a");
    b.write_snapshot(&mut image_b).expect("snapshot b");
    prop_assert!(image_a == image_b, "the two state machines diverged");
    Ok(())
}

/// Cases run, and the stack of the thread that runs them (deep strategies in debug builds).
const CASES: u32 = 192;
const STACK_BYTES: usize = 256 << 20;

#[test]
fn apply_never_fails_and_is_deterministic() {
    let runner = std::thread::Builder::new()
        .stack_size(STACK_BYTES)
        .spawn(|| {
            let config = ProptestConfig { cases: CASES, ..ProptestConfig::default() };
            let mut runner = proptest::test_runner::TestRunner::new(config);
            runner.run(&batches(), |batches| check_case(&batches))
        })
        .expect("spawn the property thread");
    if let Err(failure) = runner.join().expect("the property thread") {
        panic!("{failure}");
    }
}
