//! Unit tests of the state machine: apply outcomes, atomicity, clock, snapshots.

use super::*;
use crate::Rejection;

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(dir.path()).expect("open");
    (dir, StateMachine::new(db))
}

fn create_user(id: &str, name: &str) -> Command {
    Command::CreateUser { user_id: id.into(), namespace_id: format!("ns-{id}"), name: name.into() }
}

fn batch(now_ms: u64, commands: Vec<Command>) -> Batch {
    Batch { now_ms, commands }
}

#[test]
fn create_user_then_token_in_one_batch() {
    let (_dir, sm) = open();
    let hash = *blake3::hash(b"secret").as_bytes();
    let outcomes = sm
        .apply(
            b"m1",
            Some(&batch(
                1_000,
                vec![
                    create_user("u1", "alice"),
                    Command::CreateToken {
                        token_id: "t1".into(),
                        user_id: "u1".into(),
                        name: "laptop".into(),
                        token_hash: hash,
                        expires_ms: None,
                    },
                ],
            )),
        )
        .expect("apply");
    assert_eq!(
        outcomes,
        vec![
            Outcome::UserCreated { user_id: "u1".into(), namespace_id: "ns-u1".into() },
            Outcome::TokenCreated { token_id: "t1".into() },
        ]
    );
    let (token, user) = sm.token(&hash).expect("read").expect("token exists");
    assert_eq!((token.id.as_str(), user.name.as_str(), user.created_ms), ("t1", "alice", 1_000));
    assert_eq!(sm.namespace("ns-u1").expect("read").expect("namespace").owner_user_id, "u1");
    assert_eq!(sm.applied_marker().expect("marker"), Some(b"m1".to_vec()));
}

#[test]
fn duplicate_name_and_unknown_user_are_rejected_without_effect() {
    let (_dir, sm) = open();
    sm.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice")]))).expect("apply");
    let outcomes = sm
        .apply(
            b"m2",
            Some(&batch(
                2,
                vec![
                    create_user("u2", "alice"),
                    Command::CreateToken {
                        token_id: "t".into(),
                        user_id: "nobody".into(),
                        name: "x".into(),
                        token_hash: [7; 32],
                        expires_ms: None,
                    },
                ],
            )),
        )
        .expect("apply");
    assert!(matches!(outcomes[0], Outcome::Rejected(Rejection::Conflict(_))));
    assert!(matches!(outcomes[1], Outcome::Rejected(Rejection::NotFound(_))));
    assert!(sm.user("u2").expect("read").is_none());
    assert!(sm.token(&[7; 32]).expect("read").is_none());
    assert_eq!(sm.user_count().expect("count"), 1);
    assert_eq!(sm.applied_marker().expect("marker"), Some(b"m2".to_vec()));
}

#[test]
fn clock_never_runs_backwards() {
    let (_dir, sm) = open();
    sm.apply(b"m1", Some(&batch(5_000, vec![]))).expect("apply");
    sm.apply(b"m2", Some(&batch(3_000, vec![create_user("u1", "bob")]))).expect("apply");
    assert_eq!(sm.clock_ms().expect("clock"), 5_000);
    assert_eq!(sm.user("u1").expect("read").expect("user").created_ms, 5_000);
}

#[test]
fn ensure_admin_is_idempotent() {
    let (_dir, sm) = open();
    let ensure = |user_id: &str, token_id: &str| Command::EnsureAdmin {
        user_id: user_id.into(),
        namespace_id: format!("ns-{user_id}"),
        token_id: token_id.into(),
        token_hash: [1; 32],
    };
    let first = sm.apply(b"m1", Some(&batch(1, vec![ensure("a1", "t1"), ensure("a2", "t2")]))).expect("apply");
    let second = sm.apply(b"m2", Some(&batch(2, vec![ensure("a3", "t3")]))).expect("apply");
    let ready = Outcome::AdminReady { user_id: "a1".into() };
    assert_eq!(first, vec![ready.clone(), ready.clone()]);
    assert_eq!(second, vec![ready]);
    assert_eq!(sm.user_count().expect("count"), 1);
    let (_, admin) = sm.token(&[1; 32]).expect("read").expect("admin token");
    assert!(admin.admin);
}

#[test]
fn snapshot_round_trip_replaces_state() {
    let (_dir, source) = open();
    source.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice"), create_user("u2", "bob")]))).expect("apply");
    let image = source.build_snapshot().expect("build");
    assert_eq!(image.marker, Some(b"m1".to_vec()));
    // Writes after the view are not in the image.
    source.apply(b"m2", Some(&batch(2, vec![create_user("u3", "carol")]))).expect("apply");

    let (_dir2, target) = open();
    target.apply(b"old", Some(&batch(9, vec![create_user("x", "stale")]))).expect("apply");
    let marker = target.restore_snapshot(&image.bytes).expect("restore");
    assert_eq!(marker, Some(b"m1".to_vec()));
    assert_eq!(target.user_count().expect("count"), 2);
    assert!(target.user("x").expect("read").is_none());
    assert!(target.user("u3").expect("read").is_none());
    assert_eq!(target.applied_marker().expect("marker"), Some(b"m1".to_vec()));
}

#[test]
fn corrupt_snapshot_is_refused_and_changes_nothing() {
    let (_dir, sm) = open();
    sm.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice")]))).expect("apply");
    let mut image = sm.build_snapshot().expect("build").bytes;
    let middle = image.len() / 2;
    image[middle] ^= 0xff;
    assert!(matches!(sm.restore_snapshot(&image), Err(StorageError::Corrupt(_))));
    assert!(matches!(sm.restore_snapshot(b"short"), Err(StorageError::Corrupt(_))));
    assert_eq!(sm.user_count().expect("count"), 1);
}

#[test]
fn chunks_register_once() {
    let (_dir, sm) = open();
    let hash = crate::blocks::BlockHash::of(b"x");
    assert!(sm.chunk(&hash).expect("read").is_none());
    sm.apply(b"m1", Some(&batch(7, vec![Command::RegisterChunk { hash, size: 1, uploader: String::new() }])))
        .expect("apply");
    sm.apply(b"m2", Some(&batch(9, vec![Command::RegisterChunk { hash, size: 1, uploader: String::new() }])))
        .expect("apply");
    let chunk = sm.chunk(&hash).expect("read").expect("registered");
    assert_eq!((chunk.size, chunk.refcount, chunk.created_ms), (1, 0, 7));
}

#[test]
fn tokens_are_listed_per_user_and_a_revoked_token_is_gone() {
    let (_dir, sm) = open();
    let create = |token_id: &str, user_id: &str, byte: u8, expires_ms: Option<u64>| Command::CreateToken {
        token_id: token_id.into(),
        user_id: user_id.into(),
        name: format!("{token_id}-device"),
        token_hash: [byte; 32],
        expires_ms,
    };
    let outcomes = sm
        .apply(
            b"m",
            Some(&batch(
                5,
                vec![
                    Command::CreateUser { user_id: "u1".into(), namespace_id: "n1".into(), name: "ann".into() },
                    Command::CreateUser { user_id: "u2".into(), namespace_id: "n2".into(), name: "bo".into() },
                    create("t1", "u1", 1, None),
                    create("t2", "u1", 2, Some(99)),
                    create("t3", "u2", 3, None),
                ],
            )),
        )
        .expect("apply");
    assert!(outcomes.iter().all(|o| !matches!(o, Outcome::Rejected(_))), "{outcomes:?}");
    let ids = |user: &str| sm.tokens(user).expect("tokens").into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids("u1"), vec!["t1", "t2"]);
    assert_eq!(sm.tokens("u1").expect("tokens")[1].expires_ms, Some(99));
    // Revoking u2's token through u1 is refused; u1's own goes, everywhere it was stored.
    let revoke = |user: &str, token: &str| Command::RevokeToken { user_id: user.into(), token_id: token.into() };
    let outcomes = sm.apply(b"m", Some(&batch(6, vec![revoke("u1", "t3"), revoke("u1", "t1")]))).expect("apply");
    assert!(matches!(outcomes[0], Outcome::Rejected(Rejection::NotFound(_))), "{outcomes:?}");
    assert_eq!(outcomes[1], Outcome::Done);
    assert!(sm.token(&[1; 32]).expect("read").is_none());
    assert!(sm.token(&[3; 32]).expect("read").is_some());
    assert_eq!(ids("u1"), vec!["t2"]);
    let again = sm.apply(b"m", Some(&batch(7, vec![revoke("u1", "t1")]))).expect("apply");
    assert!(matches!(again[0], Outcome::Rejected(Rejection::NotFound(_))));
}
