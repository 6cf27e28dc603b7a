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
    Batch::new(now_ms, commands.into())
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
                        session_epoch: None,
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
                        session_epoch: None,
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

fn image_of(sm: &StateMachine) -> (Option<Vec<u8>>, Vec<u8>) {
    let mut image = Vec::new();
    let written = sm.write_snapshot(&mut image).expect("build");
    assert_eq!(written.bytes, image.len() as u64);
    (written.marker, image)
}

fn restore(sm: &StateMachine, image: &[u8], meta: &[(&[u8], &[u8])]) -> Result<Option<Vec<u8>>, StorageError> {
    sm.restore_snapshot(std::io::Cursor::new(image), meta)
}

#[test]
fn snapshot_round_trip_replaces_state() {
    let (_dir, source) = open();
    source.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice"), create_user("u2", "bob")]))).expect("apply");
    let (marker, image) = image_of(&source);
    assert_eq!(marker, Some(b"m1".to_vec()));
    // Writes after the view are not in the image.
    source.apply(b"m2", Some(&batch(2, vec![create_user("u3", "carol")]))).expect("apply");

    let (dir2, target) = open();
    target.apply(b"old", Some(&batch(9, vec![create_user("x", "stale")]))).expect("apply");
    let marker = restore(&target, &image, &[(b"snap", b"record")]).expect("restore");
    assert_eq!(marker, Some(b"m1".to_vec()));
    assert_eq!(target.user_count().expect("count"), 2);
    assert!(target.user("x").expect("read").is_none());
    assert!(target.user("u3").expect("read").is_none());
    assert_eq!(target.applied_marker().expect("marker"), Some(b"m1".to_vec()));
    assert_eq!(target.db().meta_get(b"snap").expect("meta"), Some(b"record".to_vec()));

    // Applies go to the restored state, and a second restore switches back.
    target.apply(b"m3", Some(&batch(3, vec![create_user("u4", "dave")]))).expect("apply");
    assert_eq!(target.user_count().expect("count"), 3);
    let (_, image2) = image_of(&source);
    restore(&target, &image2, &[]).expect("restore again");
    assert_eq!(target.user_count().expect("count"), 3);
    assert!(target.user("u4").expect("read").is_none());
    assert!(target.user("u3").expect("read").is_some());

    // The live column family survives a reopen.
    drop(target);
    let reopened = StateMachine::new(Db::open(dir2.path()).expect("reopen"));
    assert_eq!(reopened.applied_marker().expect("marker"), Some(b"m2".to_vec()));
    assert!(reopened.user("u3").expect("read").is_some());
    assert!(reopened.user("x").expect("read").is_none());
}

#[test]
fn large_snapshot_restores_in_many_batches() {
    let (_dir, source) = open();
    // About 3 × RESTORE_BATCH_BYTES of state, in 12 entries of 1,000 users each.
    for entry in 0..12u64 {
        let commands = (0..1_000)
            .map(|i| create_user(&format!("u{entry}-{i}-{}", "p".repeat(900)), &format!("n{entry}-{i}")))
            .collect();
        source.apply(b"m", Some(&batch(entry + 1, commands))).expect("apply");
    }
    let (_, image) = image_of(&source);
    assert!(image.len() > 3 * crate::snapshot::RESTORE_BATCH_BYTES, "image of {} bytes", image.len());
    let (_dir2, target) = open();
    restore(&target, &image, &[]).expect("restore");
    assert_eq!(target.user_count().expect("count"), source.user_count().expect("count"));
    assert_eq!(image_of(&target).1, image);
}

#[test]
fn leftovers_of_an_interrupted_restore_stay_invisible_and_are_cleared() {
    let (dir, sm) = open();
    sm.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice")]))).expect("apply");
    let (_, image) = image_of(&sm);
    // A restore that died before its switch: part of an image in the spare column family.
    let stale = keys::user("ghost");
    sm.db().rocks().put_cf(sm.db().spare_state(), &stale, b"{}").expect("put");
    sm.db().rocks().put_cf(sm.db().spare_state(), keys::applied_marker(), b"half").expect("put");
    assert!(sm.user("ghost").expect("read").is_none());
    drop(sm);
    let sm = StateMachine::new(Db::open(dir.path()).expect("reopen"));
    assert_eq!(sm.applied_marker().expect("marker"), Some(b"m1".to_vec()));
    assert!(sm.user("ghost").expect("read").is_none());
    restore(&sm, &image, &[]).expect("restore");
    assert!(sm.db().rocks().get_cf(sm.db().state(), &stale).expect("get").is_none(), "the spare was cleared");
    assert_eq!(sm.applied_marker().expect("marker"), Some(b"m1".to_vec()));
    assert_eq!(sm.user_count().expect("count"), 1);
}

#[test]
fn corrupt_snapshot_is_refused_and_changes_nothing() {
    let (_dir, sm) = open();
    sm.apply(b"m1", Some(&batch(1, vec![create_user("u1", "alice")]))).expect("apply");
    let (_, mut image) = image_of(&sm);
    let middle = image.len() / 2;
    image[middle] ^= 0xff;
    assert!(matches!(restore(&sm, &image, &[(b"snap", b"x")]), Err(StorageError::Corrupt(_))));
    assert!(matches!(restore(&sm, b"short", &[]), Err(StorageError::Corrupt(_))));
    image[middle] ^= 0xff;
    image.truncate(image.len() - 1);
    assert!(matches!(restore(&sm, &image, &[]), Err(StorageError::Corrupt(_))));
    assert_eq!(sm.user_count().expect("count"), 1);
    assert_eq!(sm.applied_marker().expect("marker"), Some(b"m1".to_vec()));
    assert_eq!(sm.db().meta_get(b"snap").expect("meta"), None);
}

#[test]
fn chunks_register_once() {
    let (_dir, sm) = open();
    let hash = crate::blocks::BlockHash::of(b"x");
    assert!(sm.chunk(&hash).expect("read").is_none());
    sm.apply(
        b"m1",
        Some(&batch(
            7,
            vec![Command::RegisterChunk { hash, size: 1, uploader: String::new(), quota_bytes: None, placed_in: None }],
        )),
    )
    .expect("apply");
    sm.apply(
        b"m2",
        Some(&batch(
            9,
            vec![Command::RegisterChunk { hash, size: 1, uploader: String::new(), quota_bytes: None, placed_in: None }],
        )),
    )
    .expect("apply");
    let chunk = sm.chunk(&hash).expect("read").expect("registered");
    assert_eq!((chunk.size, chunk.refcount, chunk.created_ms), (1, 0, 7));
}

#[test]
fn a_block_registers_only_in_the_configuration_it_was_placed_in() {
    let (_dir, sm) = open();
    let (placed, moved) = (crate::ConfigId { term: 2, index: 10 }, crate::ConfigId { term: 3, index: 14 });
    let register = |content: &[u8], placed_in| Command::RegisterChunk {
        hash: crate::blocks::BlockHash::of(content),
        size: 1,
        uploader: "u1".into(),
        quota_bytes: Some(100),
        placed_in,
    };
    let apply = |command, config| sm.apply_in(b"m", Some(&batch(1, vec![command])), config).expect("apply").remove(0);
    // The members changed after the placement: refused, nothing indexed or counted.
    assert_eq!(apply(register(b"a", Some(placed)), Some(moved)), Outcome::Rejected(Rejection::MembersChanged));
    assert_eq!(apply(register(b"a", Some(placed)), None), Outcome::Rejected(Rejection::MembersChanged));
    assert!(sm.chunk(&crate::blocks::BlockHash::of(b"a")).expect("read").is_none());
    assert_eq!(sm.stored_bytes("u1").expect("bytes"), 0);
    // Placed in the configuration in effect, or not placed by this command: registered.
    assert_eq!(apply(register(b"a", Some(moved)), Some(moved)), Outcome::Done);
    assert_eq!(apply(register(b"b", None), Some(moved)), Outcome::Done);
    assert!(sm.chunk(&crate::blocks::BlockHash::of(b"a")).expect("read").is_some());
    assert_eq!(register(b"a", Some(placed)).format(), 4, "an older node would ignore the fence");
    assert_eq!(register(b"a", None).format(), 1);
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
        session_epoch: None,
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

#[test]
fn a_range_of_keys_merges_the_entrys_own_writes_and_stops_at_its_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(crate::Db::open(dir.path()).expect("open"));
    let key = |n: u8| vec![0xf0, n];
    let mut batch = rocksdb::WriteBatch::default();
    for n in [1, 3, 5, 7] {
        batch.put_cf(sm.db().state(), key(n), b"v");
    }
    sm.db().rocks().write(batch).expect("write");
    let mut txn = Txn {
        db: sm.db(),
        overlay: std::collections::BTreeMap::new(),
        index_inserts: std::collections::HashMap::new(),
        now_ms: 0,
        config: None,
    };
    txn.delete(key(3));
    txn.put_raw(key(4), b"w".to_vec());
    txn.delete(key(1));
    let (start, end) = (key(0), key(9));
    assert_eq!(txn.keys_in(&start, &end, usize::MAX).expect("keys"), vec![key(4), key(5), key(7)]);
    // At most `max`, even with deletions ahead of the live keys.
    assert_eq!(txn.keys_in(&start, &end, 2).expect("keys"), vec![key(4), key(5)]);
    assert_eq!(txn.keys_in(&start, &end, 0).expect("keys"), Vec::<Vec<u8>>::new());
}

fn apply_one(sm: &StateMachine, now_ms: u64, command: Command) -> Outcome {
    sm.apply(b"m", Some(&batch(now_ms, vec![command]))).expect("apply").pop().expect("an outcome")
}

fn token(token_id: &str, byte: u8, expires_ms: Option<u64>, session_epoch: Option<u64>) -> Command {
    Command::CreateToken {
        token_id: token_id.into(),
        user_id: "u1".into(),
        name: "t".into(),
        token_hash: [byte; 32],
        expires_ms,
        session_epoch,
    }
}

/// Issue 34, item 9: expired tokens were never purged; from format 5 they are, once due by
/// the replicated clock, index entry and all. Before it (a node of the previous release could
/// still apply the same entries) nothing is indexed, so nothing is purged.
#[test]
fn expiring_tokens_are_purged_once_due_from_format_5() {
    let (_dir, sm) = open();
    apply_one(&sm, 1, create_user("u1", "ann"));
    apply_one(&sm, 2, token("old", 1, Some(1_000), None));
    apply_one(&sm, 3, Command::Migrate { schema: 5 });
    apply_one(&sm, 4, token("new", 2, Some(2_000), None));
    apply_one(&sm, 5, token("forever", 3, None, None));
    let ids =
        |sm: &StateMachine| -> Vec<String> { sm.tokens("u1").expect("tokens").into_iter().map(|t| t.id).collect() };
    assert_eq!(ids(&sm), ["forever", "new", "old"]);
    apply_one(&sm, 1_999, Command::PurgeExpired { max_records: 10 });
    assert_eq!(ids(&sm), ["forever", "new", "old"], "nothing is due yet");
    apply_one(&sm, 2_000, Command::PurgeExpired { max_records: 10 });
    assert_eq!(ids(&sm), ["forever", "old"], "the expired token indexed at format 5 is gone, with its index");
    assert!(sm.token(&[2; 32]).expect("read").is_none());
}

/// Issue 34, item 4: a password change ends the login sessions made before it, and a login
/// checked under a password since changed is refused; other tokens are untouched.
#[test]
fn a_password_change_ends_the_sessions_made_before_it() {
    let (_dir, sm) = open();
    apply_one(&sm, 1, create_user("u1", "ann"));
    apply_one(&sm, 2, token("session", 1, Some(10_000), Some(0)));
    apply_one(&sm, 3, token("laptop", 2, None, None));
    let works =
        |sm: &StateMachine, byte: u8| sm.token(&[byte; 32]).expect("read").is_some_and(|(t, u)| t.current_for(&u));
    assert!(works(&sm, 1) && works(&sm, 2));
    let change =
        |ends_sessions| Command::SetPassword { user_id: "u1".into(), password_hash: Some("h".into()), ends_sessions };
    apply_one(&sm, 4, change(false));
    assert!(works(&sm, 1), "a change from before format 5 ends nothing");
    apply_one(&sm, 5, change(true));
    assert!(!works(&sm, 1) && works(&sm, 2), "the session ended, the laptop's token did not");
    assert!(!sm.token_active(&[1; 32], "u1", "session").expect("read"));
    let late = apply_one(&sm, 6, token("late", 3, Some(10_000), Some(0)));
    assert!(matches!(late, Outcome::Rejected(Rejection::Conflict(_))), "{late:?}");
    assert!(matches!(apply_one(&sm, 7, token("fresh", 4, Some(10_000), Some(1))), Outcome::TokenCreated { .. }));
    assert!(works(&sm, 4));
}
