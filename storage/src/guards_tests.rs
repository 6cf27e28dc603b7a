//! Transitions of idempotency and processed-message records, atomic rate checks, purge.

use crate::command::{Batch, Command, IdempotencyOutcome, Outcome, RateCheck, Rejection};
use crate::ratelimit::Algorithm;
use crate::records::{IdempotencyResult, SavedResponse};
use crate::{Db, StateMachine};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

fn apply(sm: &StateMachine, now_ms: u64, command: Command) -> Outcome {
    let mut outcomes = sm.apply(b"m", Some(&Batch::new(now_ms, vec![command].into()))).expect("apply");
    outcomes.pop().expect("one outcome")
}

/// A commit of `/f` in namespace `ns` holding one chunk.
fn file_commit(chunk: crate::blocks::BlockHash, base: u64, device: &str, ids: &str) -> Command {
    Command::CommitFile(Box::new(crate::command::FileCommit {
        namespace_id: "ns".into(),
        path: crate::paths::FilePath::parse("/f").expect("path"),
        chunks: vec![chunk],
        size: 1,
        mtime_ms: 0,
        executable: false,
        base_version: base,
        deleted: false,
        device: device.into(),
        new_file_id: format!("file-{ids}"),
        copy_file_id: format!("copy-{ids}"),
        actor_user_id: String::new(),
        quota_bytes: None,
    }))
}

fn response(body: &str) -> SavedResponse {
    SavedResponse { status: 201, headers: vec![("content-type".into(), "application/json".into())], body: body.into() }
}

fn create_user(id: &str, name: &str) -> Command {
    Command::CreateUser { user_id: id.into(), namespace_id: format!("ns-{id}"), name: name.into() }
}

fn keyed(scope: u8, body: u8, inner: Command) -> Command {
    Command::Idempotent {
        scope: [scope; 32],
        fingerprint: [body; 32],
        ttl_ms: 1_000,
        on_success: Some(response(&format!("created {body}"))),
        command: Box::new(inner),
    }
}

#[test]
fn first_request_applies_and_saves_then_replays() {
    let (_dir, sm) = open();
    let first = apply(&sm, 10, keyed(1, 1, create_user("u1", "alice")));
    let created = Outcome::UserCreated { user_id: "u1".into(), namespace_id: "ns-u1".into() };
    assert_eq!(first, Outcome::Idempotency(IdempotencyOutcome::Applied { outcome: Box::new(created) }));
    // The retry carries new ids (generated per request) but must not create a second user.
    let retry = apply(&sm, 20, keyed(1, 1, create_user("u2", "alice-again")));
    let replay = IdempotencyResult::Response(response("created 1"));
    assert_eq!(retry, Outcome::Idempotency(IdempotencyOutcome::Replay { result: replay }));
    assert!(sm.user("u2").expect("read").is_none());
}

#[test]
fn rejections_are_saved_too() {
    let (_dir, sm) = open();
    apply(&sm, 1, create_user("u1", "taken"));
    let first = apply(&sm, 2, keyed(2, 1, create_user("u2", "taken")));
    assert!(matches!(first, Outcome::Idempotency(IdempotencyOutcome::Applied { .. })));
    let retry = apply(&sm, 3, keyed(2, 1, create_user("u3", "taken")));
    let Outcome::Idempotency(IdempotencyOutcome::Replay {
        result: IdempotencyResult::Rejected(Rejection::Conflict(_)),
    }) = retry
    else {
        panic!("expected a replayed conflict, got {retry:?}");
    };
}

#[test]
fn same_key_other_body_is_refused_unchanged() {
    let (_dir, sm) = open();
    apply(&sm, 1, keyed(3, 1, create_user("u1", "a")));
    let other = apply(&sm, 2, keyed(3, 2, create_user("u2", "b")));
    assert_eq!(other, Outcome::Idempotency(IdempotencyOutcome::KeyReused));
    assert!(sm.user("u2").expect("read").is_none());
    // The original record is untouched: the original body still replays.
    assert!(matches!(
        apply(&sm, 3, keyed(3, 1, create_user("u3", "c"))),
        Outcome::Idempotency(IdempotencyOutcome::Replay { .. })
    ));
}

#[test]
fn in_progress_then_done_then_replay() {
    let (_dir, sm) = open();
    let begin = |now: u64| {
        apply(
            &sm,
            now,
            Command::IdempotencyBegin { scope: [4; 32], fingerprint: [1; 32], ttl_ms: 10_000, lease_ms: 500 },
        )
    };
    assert_eq!(begin(100), Outcome::Idempotency(IdempotencyOutcome::Begun));
    assert_eq!(begin(150), Outcome::Idempotency(IdempotencyOutcome::InProgress { retry_after_ms: 450 }));
    apply(&sm, 200, Command::IdempotencyComplete { scope: [4; 32], response: response("done") });
    let replay = IdempotencyResult::Response(response("done"));
    assert_eq!(begin(300), Outcome::Idempotency(IdempotencyOutcome::Replay { result: replay }));
}

#[test]
fn abandoned_lease_is_taken_over_and_release_forgets() {
    let (_dir, sm) = open();
    let begin = |now: u64| {
        apply(
            &sm,
            now,
            Command::IdempotencyBegin { scope: [5; 32], fingerprint: [1; 32], ttl_ms: 10_000, lease_ms: 500 },
        )
    };
    assert_eq!(begin(0), Outcome::Idempotency(IdempotencyOutcome::Begun));
    assert_eq!(begin(600), Outcome::Idempotency(IdempotencyOutcome::Begun), "lease expired: retry runs the work");
    apply(&sm, 700, Command::IdempotencyRelease { scope: [5; 32] });
    assert_eq!(begin(701), Outcome::Idempotency(IdempotencyOutcome::Begun), "released: the key is free");
}

#[test]
fn expired_records_are_purged_and_the_key_runs_again() {
    let (_dir, sm) = open();
    apply(&sm, 0, keyed(6, 1, create_user("u1", "a")));
    assert_eq!(
        apply(&sm, 999, Command::PurgeExpired { max_records: 100 }),
        Outcome::Purged { records: 0, more: false }
    );
    assert_eq!(
        apply(&sm, 1_000, Command::PurgeExpired { max_records: 100 }),
        Outcome::Purged { records: 1, more: false }
    );
    let again = apply(&sm, 1_001, keyed(6, 1, create_user("u2", "b")));
    assert!(matches!(again, Outcome::Idempotency(IdempotencyOutcome::Applied { .. })));
}

#[test]
fn processed_messages_skip_duplicates_until_expiry() {
    let (_dir, sm) = open();
    let once = |id: &str, name: &str| Command::Once {
        consumer: "replicator".into(),
        message_id: "m-1".into(),
        ttl_ms: 100,
        command: Box::new(create_user(id, name)),
    };
    assert!(matches!(apply(&sm, 0, once("u1", "a")), Outcome::UserCreated { .. }));
    assert_eq!(apply(&sm, 50, once("u2", "b")), Outcome::Duplicate);
    assert!(sm.user("u2").expect("read").is_none());
    assert_eq!(apply(&sm, 100, Command::PurgeExpired { max_records: 10 }), Outcome::Purged { records: 1, more: false });
    assert!(matches!(apply(&sm, 101, once("u3", "c")), Outcome::UserCreated { .. }));
}

#[test]
fn rate_checks_are_all_or_nothing() {
    let (_dir, sm) = open();
    let roomy = RateCheck { key: "roomy".into(), algorithm: Algorithm::FixedWindow { limit: 10, window_ms: 1_000 } };
    let tight = RateCheck { key: "tight".into(), algorithm: Algorithm::FixedWindow { limit: 1, window_ms: 1_000 } };
    let both = Command::RateCheck { checks: vec![roomy.clone(), tight] };
    let Outcome::Rate { allowed: true, decisions } = apply(&sm, 0, both.clone()) else { panic!("first admitted") };
    assert_eq!(decisions.iter().map(|d| d.remaining).collect::<Vec<_>>(), vec![9, 0]);
    let Outcome::Rate { allowed: false, .. } = apply(&sm, 1, both) else { panic!("second rejected") };
    // The rejected request did not consume from the roomy limit.
    let Outcome::Rate { allowed: true, decisions } = apply(&sm, 2, Command::RateCheck { checks: vec![roomy] }) else {
        panic!("roomy alone admitted")
    };
    assert_eq!(decisions[0].remaining, 8);
}

#[test]
fn idle_rate_state_is_purged() {
    let (_dir, sm) = open();
    let check = RateCheck { key: "k".into(), algorithm: Algorithm::TokenBucket { capacity: 2, refill_per_s: 1 } };
    apply(&sm, 0, Command::RateCheck { checks: vec![check.clone()] });
    apply(&sm, 500, Command::RateCheck { checks: vec![check] });
    // Idle (bucket full again) 2 s after the last check, at 2500.
    assert_eq!(
        apply(&sm, 2_499, Command::PurgeExpired { max_records: 10 }),
        Outcome::Purged { records: 0, more: false }
    );
    assert_eq!(
        apply(&sm, 2_500, Command::PurgeExpired { max_records: 10 }),
        Outcome::Purged { records: 1, more: false }
    );
}

#[test]
fn a_rate_set_replaces_the_state_and_its_expiry() {
    use crate::command::RateEntry;
    use crate::ratelimit::LimitState;
    let (_dir, sm) = open();
    let bucket = Algorithm::TokenBucket { capacity: 2, refill_per_s: 1 };
    apply(&sm, 0, Command::RateCheck { checks: vec![RateCheck { key: "k".into(), algorithm: bucket }] });
    let state = bucket.charge(None, 100, 5);
    let idle_at_ms = bucket.idle_at_ms(&state, 100);
    let entry = RateEntry { key: "k".into(), state: state.clone(), idle_at_ms, charged_term: 7 };
    assert_eq!(apply(&sm, 100, Command::RateSet { entries: vec![entry] }), Outcome::Done);
    let record = sm.rate_record("k").expect("read").expect("record");
    assert!(matches!(record.state, LimitState::Bucket { milli_tokens: 0, at_ms: 3_100 }));
    assert_eq!((record.state, record.idle_at_ms, record.charged_term), (state, idle_at_ms, 7));
    // The old expiry (2 s after the check at 0) no longer purges it; the new one does.
    assert_eq!(
        apply(&sm, 2_500, Command::PurgeExpired { max_records: 10 }),
        Outcome::Purged { records: 0, more: false }
    );
    assert_eq!(
        apply(&sm, idle_at_ms, Command::PurgeExpired { max_records: 10 }),
        Outcome::Purged { records: 1, more: false }
    );
    assert_eq!(sm.rate_record("k").expect("read"), None);
}

#[test]
fn a_rate_set_from_an_earlier_term_does_not_undo_a_later_take_over() {
    use crate::command::RateEntry;
    let (_dir, sm) = open();
    let bucket = Algorithm::TokenBucket { capacity: 10, refill_per_s: 1 };
    let entry = |n: u64, term: u64| RateEntry {
        key: "k".into(),
        state: bucket.charge(None, 0, n),
        idle_at_ms: 60_000,
        charged_term: term,
    };
    apply(&sm, 0, Command::RateSet { entries: vec![entry(8, 5)] });
    // A write of term 4's leader, forwarded late, arrives after term 5 took the key over.
    apply(&sm, 1, Command::RateSet { entries: vec![entry(1, 4)] });
    assert_eq!(sm.rate_record("k").expect("read").expect("record").state, bucket.charge(None, 0, 8));
    // The same term, or a later one, replaces it.
    apply(&sm, 2, Command::RateSet { entries: vec![entry(9, 5)] });
    assert_eq!(sm.rate_record("k").expect("read").expect("record").state, bucket.charge(None, 0, 9));
}

#[test]
fn a_curable_rejection_is_not_saved_under_the_key() {
    use crate::blocks::BlockHash;
    let (_dir, sm) = open();
    let chunk = BlockHash::of(b"late chunk");
    let commit = |ids: &str| file_commit(chunk, 0, "d", ids);
    let keyed_commit = |ids: &str| Command::Idempotent {
        scope: [9; 32],
        fingerprint: [1; 32],
        ttl_ms: 10_000,
        on_success: None,
        command: Box::new(commit(ids)),
    };
    let Outcome::Idempotency(IdempotencyOutcome::Applied { outcome }) = apply(&sm, 1, keyed_commit("1")) else {
        panic!("applied expected")
    };
    assert_eq!(*outcome, Outcome::Rejected(Rejection::MissingChunks(vec![chunk])));
    // The client uploads the chunk and retries with the same key: now it commits.
    apply(
        &sm,
        2,
        Command::RegisterChunk { hash: chunk, size: 1, uploader: String::new(), quota_bytes: None, placed_in: None },
    );
    let Outcome::Idempotency(IdempotencyOutcome::Applied { outcome }) = apply(&sm, 3, keyed_commit("2")) else {
        panic!("the retry runs")
    };
    assert_eq!(*outcome, Outcome::FileCommitted { file_id: "file-2".into(), version: 1, unchanged: false });
    // And that success is saved: a third try replays it.
    assert!(matches!(
        apply(&sm, 4, keyed_commit("3")),
        Outcome::Idempotency(IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(_) })
    ));
}

#[test]
fn a_key_guard_inside_another_is_rejected_and_saves_nothing() {
    // Found by the apply property test: a replay answer nested in a saved record collided
    // with the record's own tag, and the record could no longer be read.
    let (_dir, sm) = open();
    let begin = Command::IdempotencyBegin { scope: [7; 32], fingerprint: [1; 32], ttl_ms: 1_000, lease_ms: 1_000 };
    let nested = Command::Idempotent {
        scope: [7; 32],
        fingerprint: [1; 32],
        ttl_ms: 1_000,
        on_success: None,
        command: Box::new(begin.clone()),
    };
    assert!(matches!(apply(&sm, 1, nested.clone()), Outcome::Rejected(Rejection::Conflict(_))));
    assert!(matches!(apply(&sm, 2, nested), Outcome::Rejected(Rejection::Conflict(_))));
    // The key is untouched: a plain begin under it starts afresh.
    assert!(matches!(apply(&sm, 3, begin), Outcome::Idempotency(IdempotencyOutcome::Begun)));
}

#[test]
fn a_replayed_version_conflict_reports_the_version_current_now() {
    use crate::blocks::BlockHash;
    let (_dir, sm) = open();
    let (a, b) = (BlockHash::of(b"a"), BlockHash::of(b"b"));
    for hash in [a, b] {
        let register =
            Command::RegisterChunk { hash, size: 1, uploader: String::new(), quota_bytes: None, placed_in: None };
        apply(&sm, 1, register);
    }
    let commit =
        |base: u64, device: &str, ids: &str| file_commit(if device == "phone" { b } else { a }, base, device, ids);
    let keyed = |command: Command| Command::Idempotent {
        scope: [8; 32],
        fingerprint: [2; 32],
        ttl_ms: 10_000,
        on_success: None,
        command: Box::new(command),
    };
    apply(&sm, 2, commit(0, "laptop", "1"));
    apply(&sm, 3, commit(1, "laptop", "2"));
    // A keyed commit on base 1 conflicts at version 2 and is saved under its key.
    let Outcome::Idempotency(IdempotencyOutcome::Applied { outcome }) = apply(&sm, 4, keyed(commit(1, "phone", "3")))
    else {
        panic!("applied expected")
    };
    let Outcome::FileConflict { current_version: 2, copy } = *outcome else { panic!("a conflict at 2: {outcome:?}") };
    // The file moves on; the replay reports version 3, with the same copy.
    let mut laptop = commit(2, "laptop", "4");
    if let Command::CommitFile(c) = &mut laptop {
        c.chunks = vec![b, a];
    }
    apply(&sm, 5, laptop);
    let replay = apply(&sm, 6, keyed(commit(1, "phone", "5")));
    let Outcome::Idempotency(IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(outcome) }) = replay
    else {
        panic!("a replay expected, got {replay:?}")
    };
    assert_eq!(*outcome, Outcome::FileConflict { current_version: 3, copy });
}
