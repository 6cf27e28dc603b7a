//! Unit tests of dead properties: bounds, a move takes them, a delete and a folder's purge
//! remove them and give their bytes back to the owner.

use super::*;
use crate::command::{FileCommit, FileMove};
use crate::{Batch, Command, Db};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("db")).expect("open");
    (dir, StateMachine::new(db))
}

fn apply(sm: &StateMachine, command: Command) -> Outcome {
    sm.apply(b"m", Some(&Batch::new(1, vec![command].into()))).expect("apply").pop().expect("an outcome")
}

fn path(text: &str) -> FilePath {
    FilePath::parse(text).expect("a path")
}

fn commit(file: &str, deleted: bool, base: u64) -> Command {
    Command::CommitFile(Box::new(FileCommit {
        namespace_id: "ns-ann".into(),
        path: path(file),
        chunks: Vec::new(),
        size: 0,
        mtime_ms: 0,
        executable: false,
        base_version: base,
        deleted,
        device: "d".into(),
        new_file_id: format!("id{file}"),
        copy_file_id: "copy".into(),
        actor_user_id: "ann".into(),
        quota_bytes: None,
    }))
}

fn patch(file: &str, changes: Vec<PropChange>) -> Command {
    Command::PatchProps(Box::new(PropPatch {
        namespace_id: "ns-ann".into(),
        path: path(file),
        actor_user_id: "ann".into(),
        changes,
    }))
}

fn set(name: &str, xml: &str) -> PropChange {
    PropChange { namespace: "urn:x".into(), name: name.into(), xml: Some(xml.into()) }
}

#[test]
fn properties_are_bounded_move_with_their_file_and_go_with_it() {
    let (_dir, sm) = open();
    apply(&sm, Command::CreateUser { user_id: "ann".into(), namespace_id: "ns-ann".into(), name: "ann".into() });
    apply(&sm, commit("/a", false, 0));
    assert_eq!(apply(&sm, patch("/a", vec![set("p", "<x:p xmlns:x=\"urn:x\">1</x:p>")])), Outcome::Done);
    let file_id = |sm: &StateMachine, p: &str| sm.file_at("ns-ann", p).expect("read").expect("file").0.id;
    let id = file_id(&sm, "/a");
    assert_eq!(sm.dead_props(&id).expect("props").props.len(), 1);
    let used = sm.prop_bytes("ann").expect("bytes");
    assert!(used > 0);
    // Too big a property, or too many: refused whole.
    let big = "x".repeat(PROP_BYTES_MAX);
    assert!(matches!(apply(&sm, patch("/a", vec![set("q", &big)])), Outcome::Rejected(Rejection::LimitReached(_))));
    let many = (0..=PROPS_PER_FILE_MAX).map(|i| set(&format!("p{i}"), "<v/>")).collect();
    assert!(matches!(apply(&sm, patch("/a", many)), Outcome::Rejected(Rejection::LimitReached(_))));
    assert_eq!(sm.dead_props(&id).expect("props").props.len(), 1, "a refused patch changes nothing");
    // No live file: 404; a viewer's or a stranger's patch: refused.
    assert!(matches!(apply(&sm, patch("/nowhere", vec![set("p", "<v/>")])), Outcome::Rejected(Rejection::NotFound(_))));
    // A move takes them along; a delete removes them and gives the bytes back.
    let moved = Command::MoveFile(Box::new(FileMove {
        namespace_id: "ns-ann".into(),
        from: path("/a"),
        to: path("/b"),
        base_version: 1,
        device: "d".into(),
        new_file_id: "idb".into(),
        actor_user_id: "ann".into(),
    }));
    assert!(matches!(apply(&sm, moved), Outcome::FileCommitted { .. }));
    assert!(sm.dead_props(&id).expect("props").props.is_empty(), "the old file keeps none");
    let moved_id = file_id(&sm, "/b");
    assert_eq!(sm.dead_props(&moved_id).expect("props").props.len(), 1);
    assert_eq!(sm.prop_bytes("ann").expect("bytes"), used);
    apply(&sm, commit("/b", true, 1));
    assert!(sm.dead_props(&moved_id).expect("props").props.is_empty());
    assert_eq!(sm.prop_bytes("ann").expect("bytes"), 0);
}

/// What an editor sets on a shared folder's file is charged to the editor, never the owner,
/// and given back to the editor when it goes.
#[test]
fn properties_are_charged_to_who_sets_them() {
    use crate::records::{Grantee, Role};
    let (_dir, sm) = open();
    for user in ["ann", "bob"] {
        apply(&sm, Command::CreateUser { user_id: user.into(), namespace_id: format!("ns-{user}"), name: user.into() });
    }
    let team = |c: &mut FileCommit| c.namespace_id = "team".into();
    apply(
        &sm,
        Command::CreateSharedFolder {
            namespace_id: "team".into(),
            name: "T".into(),
            owner_user_id: "ann".into(),
            folders_max: None,
        },
    );
    let grant = Command::SetAccess {
        actor_user_id: "ann".into(),
        namespace_id: "team".into(),
        grantee: Grantee::User("bob".into()),
        role: Some(Role::Editor),
        invite: true,
    };
    apply(&sm, grant);
    let accept = Command::RespondInvitation {
        actor_user_id: "bob".into(),
        namespace_id: "team".into(),
        grantee: Grantee::User("bob".into()),
        accept: true,
    };
    apply(&sm, accept);
    let Command::CommitFile(mut c) = commit("/a", false, 0) else { unreachable!("a commit") };
    team(&mut c);
    assert!(matches!(apply(&sm, Command::CommitFile(c)), Outcome::FileCommitted { .. }));
    let by = |actor: &str, xml: Option<&str>| {
        Command::PatchProps(Box::new(PropPatch {
            namespace_id: "team".into(),
            path: path("/a"),
            actor_user_id: actor.into(),
            changes: vec![PropChange { namespace: "urn:x".into(), name: "p".into(), xml: xml.map(str::to_owned) }],
        }))
    };
    assert_eq!(apply(&sm, by("bob", Some("<x:p xmlns:x=\"urn:x\">bob's</x:p>"))), Outcome::Done);
    assert!(sm.prop_bytes("bob").expect("bytes") > 0);
    assert_eq!(sm.prop_bytes("ann").expect("bytes"), 0, "the owner pays nothing for an editor's property");
    // The owner replaces it: bob gets his bytes back, ann is charged hers.
    assert_eq!(apply(&sm, by("ann", Some("<x:p xmlns:x=\"urn:x\">ann's</x:p>"))), Outcome::Done);
    assert_eq!(sm.prop_bytes("bob").expect("bytes"), 0);
    assert!(sm.prop_bytes("ann").expect("bytes") > 0);
    // A stranger may set none.
    assert!(matches!(apply(&sm, by("eve", Some("<v/>"))), Outcome::Rejected(_)));
    assert_eq!(sm.prop_bytes("eve").expect("bytes"), 0);
}
