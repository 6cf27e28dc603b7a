//! Sharing: roles through users and groups, who may manage access, the last owner, writes
//! judged in apply, block readability, folder deletion, the migration and copy naming.

use crate::blocks::BlockHash;
use crate::command::{Batch, Command, FileCommit, FileMove, Outcome, Rejection};
use crate::paths::FilePath;
use crate::records::{Grantee, Role};
use crate::{keys, Db, StateMachine};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

fn apply_raw(sm: &StateMachine, command: Command) -> Outcome {
    let mut out = sm.apply(b"m", Some(&Batch::new(1, vec![command].into()))).expect("apply");
    out.pop().expect("one outcome")
}

/// Applies `command`; a grant that made an invitation is accepted at once (by the user it
/// names, or for a group by the admin `root`), as these tests are about roles once shared.
/// The invitation tests use [`apply_raw`].
fn apply(sm: &StateMachine, command: Command) -> Outcome {
    let outcome = apply_raw(sm, command.clone());
    if let (Outcome::Done, Command::SetAccess { namespace_id, grantee, role: Some(_), .. }) = (&outcome, &command) {
        accept(sm, namespace_id, grantee);
    }
    outcome
}

/// Accepts the invitation of `grantee` to `namespace_id` (accepting an accepted entry
/// changes nothing).
fn accept(sm: &StateMachine, namespace_id: &str, grantee: &Grantee) {
    let actor = match grantee {
        Grantee::User(id) => id.clone(),
        Grantee::Group(_) => {
            let admin = Command::EnsureAdmin {
                user_id: "root".into(),
                namespace_id: "home-root".into(),
                token_id: "root-token".into(),
                token_hash: [7; 32],
            };
            assert!(matches!(apply_raw(sm, admin), Outcome::AdminReady { .. }));
            "root".into()
        }
    };
    let respond = Command::RespondInvitation {
        actor_user_id: actor,
        namespace_id: namespace_id.into(),
        grantee: grantee.clone(),
        accept: true,
    };
    assert_eq!(apply_raw(sm, respond), Outcome::Done);
}

fn h(name: &str) -> BlockHash {
    BlockHash::of(name.as_bytes())
}

/// Users ann, bob, cat (ids = names, personal namespaces `home-<name>`), and a folder
/// `team` owned by ann.
fn world() -> (tempfile::TempDir, StateMachine) {
    let (dir, sm) = open();
    for name in ["ann", "bob", "cat"] {
        let create =
            Command::CreateUser { user_id: name.into(), namespace_id: format!("home-{name}"), name: name.into() };
        assert!(matches!(apply(&sm, create), Outcome::UserCreated { .. }));
    }
    let folder = Command::CreateSharedFolder {
        namespace_id: "team".into(),
        name: "Team".into(),
        owner_user_id: "ann".into(),
        folders_max: None,
    };
    assert_eq!(apply(&sm, folder), Outcome::NamespaceCreated { namespace_id: "team".into() });
    (dir, sm)
}

fn set(actor: &str, grantee: Grantee, role: Option<Role>) -> Command {
    Command::SetAccess { actor_user_id: actor.into(), namespace_id: "team".into(), grantee, role, invite: true }
}

fn user(id: &str) -> Grantee {
    Grantee::User(id.into())
}

fn upload(sm: &StateMachine, content: &str, uploader: &str) {
    apply(
        sm,
        Command::RegisterChunk {
            hash: h(content),
            size: 1,
            uploader: uploader.into(),
            quota_bytes: None,
            placed_in: None,
        },
    );
}

fn commit(actor: &str, namespace: &str, path: &str, chunks: &[&str], base: u64, device: &str) -> Command {
    Command::CommitFile(Box::new(FileCommit {
        namespace_id: namespace.into(),
        path: FilePath::parse(path).expect("path"),
        chunks: chunks.iter().map(|c| h(c)).collect(),
        size: 1,
        mtime_ms: 1,
        executable: false,
        base_version: base,
        deleted: false,
        device: device.into(),
        new_file_id: format!("f-{actor}-{path}-{base}"),
        copy_file_id: format!("c-{actor}-{path}-{base}"),
        actor_user_id: actor.into(),
        quota_bytes: None,
    }))
}

#[test]
fn roles_come_from_own_entries_and_groups() {
    let (_dir, sm) = world();
    assert_eq!(sm.role("ann", "team").expect("role"), Some(Role::Owner));
    assert_eq!(sm.role("bob", "team").expect("role"), None);
    assert_eq!(sm.role("ann", "home-ann").expect("role"), Some(Role::Owner));
    assert_eq!(sm.role("bob", "home-ann").expect("role"), None);
    assert_eq!(sm.role("ann", "nowhere").expect("role"), None);
    assert_eq!(apply(&sm, set("ann", user("bob"), Some(Role::Viewer))), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), Some(Role::Viewer));
    // cat through a group: editor; bob in the group too gets the higher of the two roles.
    assert_eq!(
        apply(&sm, Command::CreateGroup { group_id: "g1".into(), name: "design".into() }),
        Outcome::GroupCreated { group_id: "g1".into() }
    );
    let join = |u: &str, member: bool| Command::SetGroupMember { group_id: "g1".into(), user_id: u.into(), member };
    assert_eq!(apply(&sm, join("cat", true)), Outcome::Done);
    assert_eq!(apply(&sm, join("bob", true)), Outcome::Done);
    assert_eq!(apply(&sm, set("ann", Grantee::Group("g1".into()), Some(Role::Editor))), Outcome::Done);
    assert_eq!(sm.role("cat", "team").expect("role"), Some(Role::Editor));
    assert_eq!(sm.role("bob", "team").expect("role"), Some(Role::Editor));
    let listed: Vec<(String, Role)> =
        sm.namespaces_of("cat").expect("list").into_iter().map(|a| (a.namespace.id, a.role)).collect();
    assert_eq!(listed, vec![("home-cat".to_string(), Role::Owner), ("team".to_string(), Role::Editor)]);
    // Leaving the group takes the group's access away at once.
    assert_eq!(apply(&sm, join("cat", false)), Outcome::Done);
    assert_eq!(sm.role("cat", "team").expect("role"), None);
    assert!(matches!(apply(&sm, join("cat", false)), Outcome::Rejected(Rejection::NotFound(_))));
    assert_eq!(sm.group_members("g1").expect("members"), vec!["bob".to_string()]);
    // Unknown ids are outcomes.
    let ghost = Command::SetGroupMember { group_id: "nope".into(), user_id: "bob".into(), member: true };
    assert!(matches!(apply(&sm, ghost), Outcome::Rejected(Rejection::NotFound(_))));
    assert!(matches!(
        apply(&sm, Command::CreateGroup { group_id: "g2".into(), name: "design".into() }),
        Outcome::Rejected(Rejection::Conflict(_))
    ));
}

#[test]
fn only_owners_manage_access_and_anyone_may_leave() {
    let (_dir, sm) = world();
    apply(&sm, set("ann", user("bob"), Some(Role::Editor)));
    // An editor cannot grant, a stranger cannot even see the folder.
    assert!(matches!(
        apply(&sm, set("bob", user("cat"), Some(Role::Viewer))),
        Outcome::Rejected(Rejection::Forbidden(_))
    ));
    assert!(matches!(
        apply(&sm, set("cat", user("cat"), Some(Role::Owner))),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    assert!(matches!(
        apply(&sm, set("ann", user("ghost"), Some(Role::Viewer))),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    // A personal namespace cannot be shared.
    let personal = Command::SetAccess {
        actor_user_id: "ann".into(),
        namespace_id: "home-ann".into(),
        grantee: user("bob"),
        role: Some(Role::Viewer),
        invite: true,
    };
    assert!(matches!(apply(&sm, personal), Outcome::Rejected(Rejection::Invalid(_))));
    // bob leaves.
    assert_eq!(apply(&sm, set("bob", user("bob"), None)), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), None);
    assert_eq!(sm.acl("team").expect("acl").len(), 1);
}

#[test]
fn the_last_owner_stays() {
    let (_dir, sm) = world();
    assert!(matches!(apply(&sm, set("ann", user("ann"), None)), Outcome::Rejected(Rejection::Conflict(_))));
    assert!(matches!(
        apply(&sm, set("ann", user("ann"), Some(Role::Editor))),
        Outcome::Rejected(Rejection::Conflict(_))
    ));
    apply(&sm, set("ann", user("bob"), Some(Role::Owner)));
    // Two owners demoting each other in one entry: the second finds the last owner.
    let both = Batch::new(
        2,
        vec![set("ann", user("bob"), Some(Role::Editor)), set("bob", user("ann"), Some(Role::Editor))].into(),
    );
    let outcomes = sm.apply(b"m", Some(&both)).expect("apply");
    assert_eq!(outcomes[0], Outcome::Done);
    assert!(matches!(outcomes[1], Outcome::Rejected(Rejection::Forbidden(_))), "{outcomes:?}");
    assert_eq!(sm.role("ann", "team").expect("role"), Some(Role::Owner));
    // With a second owner, the first may leave.
    apply(&sm, set("ann", user("cat"), Some(Role::Owner)));
    assert_eq!(apply(&sm, set("ann", user("ann"), None)), Outcome::Done);
    assert_eq!(sm.role("cat", "team").expect("role"), Some(Role::Owner));
}

#[test]
fn writes_are_judged_in_apply_with_their_actor() {
    let (_dir, sm) = world();
    upload(&sm, "a", "ann");
    upload(&sm, "b", "bob");
    apply(&sm, set("ann", user("bob"), Some(Role::Viewer)));
    assert!(matches!(apply(&sm, commit("ann", "team", "/x", &["a"], 0, "laptop")), Outcome::FileCommitted { .. }));
    assert!(matches!(
        apply(&sm, commit("bob", "team", "/y", &["b"], 0, "phone")),
        Outcome::Rejected(Rejection::Forbidden(_))
    ));
    assert!(matches!(
        apply(&sm, commit("cat", "team", "/y", &[], 0, "phone")),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    let moved = Command::MoveFile(Box::new(FileMove {
        namespace_id: "team".into(),
        from: FilePath::parse("/x").expect("path"),
        to: FilePath::parse("/z").expect("path"),
        base_version: 1,
        device: "phone".into(),
        new_file_id: "moved".into(),
        actor_user_id: "bob".into(),
    }));
    assert!(matches!(apply(&sm, moved), Outcome::Rejected(Rejection::Forbidden(_))));
    // Promoted in the log before the commit: the commit is allowed.
    let batch = Batch::new(
        3,
        vec![set("ann", user("bob"), Some(Role::Editor)), commit("bob", "team", "/y", &["b"], 0, "phone")].into(),
    );
    let outcomes = sm.apply(b"m", Some(&batch)).expect("apply");
    assert!(matches!(outcomes[1], Outcome::FileCommitted { .. }), "{outcomes:?}");
    // A commit without an actor (an entry from before sharing) keeps its old meaning.
    assert!(matches!(apply(&sm, commit("", "home-ann", "/old", &["b"], 0, "d")), Outcome::FileCommitted { .. }));
}

#[test]
fn a_block_is_readable_by_its_uploaders_and_the_readers_of_namespaces_naming_it() {
    let (_dir, sm) = world();
    upload(&sm, "secret", "ann");
    assert!(sm.chunk_readable("ann", &h("secret")).expect("readable"));
    assert!(!sm.chunk_readable("bob", &h("secret")).expect("readable"));
    // bob cannot commit ann's hash into his own namespace: it counts as missing.
    assert_eq!(
        apply(&sm, commit("bob", "home-bob", "/stolen", &["secret"], 0, "d")),
        Outcome::Rejected(Rejection::MissingChunks(vec![h("secret")]))
    );
    // Once ann commits it into the folder, its readers may read it.
    apply(&sm, commit("ann", "team", "/s", &["secret"], 0, "d"));
    assert!(!sm.chunk_readable("bob", &h("secret")).expect("readable"));
    apply(&sm, set("ann", user("bob"), Some(Role::Viewer)));
    assert!(sm.chunk_readable("bob", &h("secret")).expect("readable"));
    apply(&sm, set("ann", user("bob"), None));
    assert!(!sm.chunk_readable("bob", &h("secret")).expect("readable"));
    // Uploading the same content makes bob an uploader too.
    upload(&sm, "secret", "bob");
    assert!(sm.chunk_readable("bob", &h("secret")).expect("readable"));
    assert!(matches!(
        apply(&sm, commit("bob", "home-bob", "/mine", &["secret"], 0, "d")),
        Outcome::FileCommitted { .. }
    ));
}

/// Runs the maintenance purge, `max` records a step, until nothing is left; the steps.
fn purge_all(sm: &StateMachine, max: usize) -> usize {
    let mut steps = 0;
    loop {
        steps += 1;
        match apply(sm, Command::PurgeExpired { max_records: max as u32 }) {
            Outcome::Purged { records, more } => {
                assert!(records as usize <= max + 1, "a step removed {records} records, more than {max}");
                if !more {
                    return steps;
                }
            }
            other => panic!("purge: {other:?}"),
        }
        assert!(steps < 100_000, "the purge never ends");
    }
}

#[test]
fn deleting_a_folder_hides_it_at_once_and_drops_everything_in_bounded_steps() {
    let (_dir, sm) = world();
    upload(&sm, "a", "ann");
    apply(&sm, set("ann", user("bob"), Some(Role::Editor)));
    apply(&sm, commit("ann", "team", "/x", &["a"], 0, "d"));
    apply(&sm, commit("ann", "team", "/x", &["a", "a"], 1, "d"));
    assert_eq!(sm.chunk(&h("a")).expect("chunk").expect("indexed").refcount, 2);
    let delete = |actor: &str| Command::DeleteSharedFolder { actor_user_id: actor.into(), namespace_id: "team".into() };
    assert!(matches!(apply(&sm, delete("bob")), Outcome::Rejected(Rejection::Forbidden(_))));
    assert!(matches!(apply(&sm, delete("cat")), Outcome::Rejected(Rejection::NotFound(_))));
    // A commit and the deletion in one entry: the new file goes too.
    let batch = Batch::new(5, vec![commit("bob", "team", "/late", &["a"], 0, "d"), delete("ann")].into());
    let outcomes = sm.apply(b"m", Some(&batch)).expect("apply");
    assert_eq!(outcomes[1], Outcome::Done, "{outcomes:?}");
    // Gone for everyone at once: no role, no listing, no write, no second deletion.
    assert_eq!(sm.role("ann", "team").expect("role"), None);
    assert_eq!(sm.role("bob", "team").expect("role"), None);
    assert!(sm.namespaces_of("bob").expect("list").iter().all(|a| a.namespace.id != "team"));
    assert!(matches!(
        apply(&sm, commit("ann", "team", "/after", &["a"], 0, "d")),
        Outcome::Rejected(Rejection::NotFound(_))
    ));
    assert!(matches!(apply(&sm, delete("ann")), Outcome::Rejected(Rejection::NotFound(_))));
    // The records go with the maintenance purge.
    purge_all(&sm, 2);
    assert_eq!(sm.namespace("team").expect("ns"), None);
    assert_eq!(sm.chunk(&h("a")).expect("chunk").expect("indexed").refcount, 0);
    assert_eq!(sm.namespace_cursor("team").expect("cursor"), 0);
    assert!(sm.changes("team", 0, 10).expect("changes").is_empty());
    let (start, end) = keys::chunk_namespace_all();
    assert!(sm.scan_keys(&start, &end, 10).expect("scan").is_empty());
    // Only the uploader can still read the block.
    assert!(sm.chunk_readable("ann", &h("a")).expect("readable"));
    assert!(!sm.chunk_readable("bob", &h("a")).expect("readable"));
    // A personal namespace is not deleted this way.
    let personal = Command::DeleteSharedFolder { actor_user_id: "ann".into(), namespace_id: "home-ann".into() };
    assert!(matches!(apply(&sm, personal), Outcome::Rejected(Rejection::Invalid(_))));
}

#[test]
fn a_folder_of_thousands_of_files_is_deleted_by_steps_of_bounded_work() {
    let (_dir, sm) = world();
    upload(&sm, "a", "ann");
    let files = 3_000;
    let commits: Vec<Command> = (0..files).map(|i| commit("ann", "team", &format!("/f{i}"), &["a"], 0, "d")).collect();
    for batch in commits.chunks(500) {
        sm.apply(b"m", Some(&Batch::new(2, batch.to_vec().into()))).expect("apply");
    }
    apply(&sm, commit("ann", "team", "/f0", &["a", "a"], 1, "d"));
    let delete = Command::DeleteSharedFolder { actor_user_id: "ann".into(), namespace_id: "team".into() };
    // The deletion itself: one apply of a handful of writes, whatever the folder holds.
    let started = std::time::Instant::now();
    assert_eq!(apply(&sm, delete), Outcome::Done);
    assert!(started.elapsed() < std::time::Duration::from_millis(200), "{:?}", started.elapsed());
    let steps = purge_all(&sm, 256);
    // paths + files + versions + feed entries + the ACL entry, 256 a step.
    assert!(steps >= (3 * files) / 256, "{steps} steps");
    assert_eq!(sm.namespace("team").expect("ns"), None);
    assert_eq!(sm.chunk(&h("a")).expect("chunk").expect("indexed").refcount, 0);
    let (start, end) = keys::file_path_range("team");
    assert!(sm.scan_keys(&start, &end, 1).expect("scan").is_empty());
}

#[test]
fn an_acl_and_a_users_groups_are_bounded() {
    let (_dir, sm) = world();
    for i in 0..crate::sharing::ACL_ENTRIES_MAX + 1 {
        let id = format!("u{i}");
        apply(&sm, Command::CreateUser { user_id: id.clone(), namespace_id: format!("home-{id}"), name: id.clone() });
    }
    // ann's own entry counts: 999 more fit.
    for i in 0..crate::sharing::ACL_ENTRIES_MAX - 1 {
        assert_eq!(apply(&sm, set("ann", user(&format!("u{i}")), Some(Role::Viewer))), Outcome::Done);
    }
    let last = format!("u{}", crate::sharing::ACL_ENTRIES_MAX);
    assert!(matches!(
        apply(&sm, set("ann", user(&last), Some(Role::Viewer))),
        Outcome::Rejected(Rejection::Conflict(_))
    ));
    // Changing an existing entry still works at the cap.
    assert_eq!(apply(&sm, set("ann", user("u0"), Some(Role::Editor))), Outcome::Done);
    for i in 0..crate::sharing::GROUPS_PER_USER_MAX + 1 {
        let group = format!("g{i}");
        apply(&sm, Command::CreateGroup { group_id: group.clone(), name: group.clone() });
        let join = Command::SetGroupMember { group_id: group, user_id: "bob".into(), member: true };
        let outcome = apply(&sm, join);
        if i < crate::sharing::GROUPS_PER_USER_MAX {
            assert_eq!(outcome, Outcome::Done);
        } else {
            assert!(matches!(outcome, Outcome::Rejected(Rejection::Conflict(_))), "{outcome:?}");
        }
    }
}

#[test]
fn a_block_many_namespaces_reference_is_judged_by_bounded_reads() {
    let (_dir, sm) = world();
    upload(&sm, "popular", "ann");
    // ann puts the block in 200 folders of her own; bob can read none of them but the last.
    for i in 0..200 {
        let ns = format!("f{i}");
        apply(
            &sm,
            Command::CreateSharedFolder {
                namespace_id: ns.clone(),
                name: ns.clone(),
                owner_user_id: "ann".into(),
                folders_max: None,
            },
        );
        apply(&sm, commit("ann", &ns, "/p", &["popular"], 0, "d"));
    }
    assert!(!sm.chunk_readable("bob", &h("popular")).expect("readable"));
    let grant = Command::SetAccess {
        actor_user_id: "ann".into(),
        namespace_id: "f199".into(),
        grantee: user("bob"),
        role: Some(Role::Viewer),
        invite: true,
    };
    assert_eq!(apply(&sm, grant), Outcome::Done);
    assert!(sm.chunk_readable("bob", &h("popular")).expect("readable"), "found through bob's own namespaces");
}

#[test]
fn the_migration_rebuilds_namespace_references_once() {
    let (_dir, sm) = world();
    upload(&sm, "a", "");
    // An old-style commit (no actor), then the per-namespace index is lost, as in data
    // written before block scoping.
    apply(&sm, commit("", "team", "/x", &["a"], 0, "d"));
    apply(&sm, set("ann", user("bob"), Some(Role::Viewer)));
    assert!(sm.chunk_readable("bob", &h("a")).expect("readable"));
    let key = keys::chunk_namespace(&h("a").0, "team");
    sm.db().rocks().delete_cf(sm.db().state(), &key).expect("delete");
    assert!(!sm.chunk_readable("bob", &h("a")).expect("readable"));
    assert_eq!(sm.schema().expect("schema"), 1);
    assert_eq!(apply(&sm, Command::Migrate { schema: 2 }), Outcome::Done);
    assert_eq!(sm.schema().expect("schema"), 2);
    assert!(sm.chunk_readable("bob", &h("a")).expect("readable"));
    // Once done it changes nothing: the index is not rebuilt again.
    sm.db().rocks().delete_cf(sm.db().state(), &key).expect("delete");
    assert_eq!(apply(&sm, Command::Migrate { schema: 2 }), Outcome::Done);
    assert!(!sm.chunk_readable("bob", &h("a")).expect("readable"));
    // An entry of a newer format stops apply (the node cannot read it); one written before
    // entries carried a format is judged by `Migrate` itself.
    let newer = Batch::new(3, vec![Command::Migrate { schema: 9 }].into());
    assert!(matches!(sm.apply(b"m", Some(&newer)), Err(crate::StorageError::TooNew(_))));
    let legacy = Batch { format: 1, ..newer };
    let outcomes = sm.apply(b"m", Some(&legacy)).expect("apply");
    assert!(matches!(outcomes.as_slice(), [Outcome::Rejected(Rejection::Invalid(_))]), "{outcomes:?}");
}

#[test]
fn conflicted_copies_in_a_shared_folder_name_user_and_device() {
    let (_dir, sm) = world();
    upload(&sm, "v1", "ann");
    upload(&sm, "bob edit", "bob");
    upload(&sm, "ann edit", "ann");
    apply(&sm, set("ann", user("bob"), Some(Role::Editor)));
    apply(&sm, commit("ann", "team", "/plan.txt", &["v1"], 0, "laptop"));
    apply(&sm, commit("ann", "team", "/plan.txt", &["ann edit"], 1, "laptop"));
    match apply(&sm, commit("bob", "team", "/plan.txt", &["bob edit"], 1, "phone")) {
        Outcome::FileConflict { copy: Some(copy), .. } => {
            assert_eq!(copy.path.as_str(), "/plan (conflicted copy, bob's phone).txt")
        }
        other => panic!("{other:?}"),
    }
    // In a personal namespace the device alone, as before.
    apply(&sm, commit("ann", "home-ann", "/plan.txt", &["v1"], 0, "laptop"));
    apply(&sm, commit("ann", "home-ann", "/plan.txt", &["ann edit"], 1, "laptop"));
    match apply(&sm, commit("ann", "home-ann", "/plan.txt", &["v1", "ann edit"], 1, "phone")) {
        Outcome::FileConflict { copy: Some(copy), .. } => {
            assert_eq!(copy.path.as_str(), "/plan (conflicted copy, phone).txt")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn namespaces_and_acl_entries_come_in_pages() {
    let (_dir, sm) = world();
    for i in 0..5 {
        let ns = format!("s{i}");
        apply(
            &sm,
            Command::CreateSharedFolder {
                namespace_id: ns.clone(),
                name: ns.clone(),
                owner_user_id: "ann".into(),
                folders_max: None,
            },
        );
        let grant = Command::SetAccess {
            actor_user_id: "ann".into(),
            namespace_id: ns,
            grantee: user("bob"),
            role: Some(Role::Viewer),
            invite: true,
        };
        apply(&sm, grant);
    }
    let ids = |page: Vec<crate::sharing::Access>| page.into_iter().map(|a| a.namespace.id).collect::<Vec<_>>();
    assert_eq!(ids(sm.namespaces_page("bob", None, 3).expect("page")), vec!["home-bob", "s0", "s1"]);
    assert_eq!(ids(sm.namespaces_page("bob", Some("s1"), 3).expect("page")), vec!["s2", "s3", "s4"]);
    assert!(ids(sm.namespaces_page("bob", Some("s4"), 3).expect("page")).is_empty());
    for name in ["bob", "cat"] {
        apply(&sm, set("ann", user(name), Some(Role::Editor)));
    }
    let acl: Vec<String> = sm.acl_page("team", None, 2).expect("acl").into_iter().map(|e| e.grantee.key()).collect();
    assert_eq!(acl.len(), 2);
    let rest = sm.acl_page("team", Some(&acl[1]), 10).expect("acl");
    assert_eq!(rest.len(), 1);
    assert!(!acl.contains(&rest[0].grantee.key()));
}

#[test]
fn a_share_is_an_invitation_until_accepted_and_invitations_are_capped() {
    let (_dir, sm) = world();
    let invitations = |grantee: &Grantee| -> Vec<String> {
        let (page, next) = sm.invitations_page(grantee, None, 1_000).expect("invitations");
        assert_eq!(next, None);
        page.into_iter().map(|(_, namespace)| namespace.id).collect()
    };
    let respond = |actor: &str, grantee: Grantee, accept: bool| Command::RespondInvitation {
        actor_user_id: actor.into(),
        namespace_id: "team".into(),
        grantee,
        accept,
    };
    // Invited: no role, not listed, no leaving; only bob answers for bob.
    assert_eq!(apply_raw(&sm, set("ann", user("bob"), Some(Role::Viewer))), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), None);
    assert!(sm.namespaces_of("bob").expect("list").iter().all(|a| a.namespace.id != "team"));
    assert_eq!(invitations(&user("bob")), ["team"]);
    assert!(matches!(apply_raw(&sm, set("bob", user("bob"), None)), Outcome::Rejected(Rejection::NotFound(_))));
    assert!(matches!(apply_raw(&sm, respond("cat", user("bob"), true)), Outcome::Rejected(Rejection::Forbidden(_))));
    // A role change keeps it an invitation; accepted, it is a share; a later change keeps that.
    assert_eq!(apply_raw(&sm, set("ann", user("bob"), Some(Role::Editor))), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), None);
    assert_eq!(apply_raw(&sm, respond("bob", user("bob"), true)), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), Some(Role::Editor));
    assert!(invitations(&user("bob")).is_empty());
    assert!(sm.namespaces_of("bob").expect("list").iter().any(|a| a.namespace.id == "team"));
    assert_eq!(apply_raw(&sm, set("ann", user("bob"), Some(Role::Viewer))), Outcome::Done);
    assert_eq!(sm.role("bob", "team").expect("role"), Some(Role::Viewer));
    assert_eq!(apply_raw(&sm, respond("bob", user("bob"), true)), Outcome::Done, "accepting again changes nothing");
    // Declined: the entry is gone; a pending owner is no owner (ann stays the last one).
    assert_eq!(apply_raw(&sm, set("ann", user("cat"), Some(Role::Owner))), Outcome::Done);
    assert!(matches!(apply_raw(&sm, set("ann", user("ann"), None)), Outcome::Rejected(Rejection::Conflict(_))));
    assert_eq!(apply_raw(&sm, respond("cat", user("cat"), false)), Outcome::Done);
    assert!(sm.acl("team").expect("acl").iter().all(|e| e.grantee != user("cat")));
    assert!(invitations(&user("cat")).is_empty());
    // A group's invitation is answered by an admin, not by a member.
    apply(&sm, Command::CreateGroup { group_id: "g1".into(), name: "crew".into() });
    apply(&sm, Command::SetGroupMember { group_id: "g1".into(), user_id: "cat".into(), member: true });
    let crew = Grantee::Group("g1".into());
    assert_eq!(apply_raw(&sm, set("ann", crew.clone(), Some(Role::Viewer))), Outcome::Done);
    assert_eq!(sm.role("cat", "team").expect("role"), None);
    assert!(matches!(apply_raw(&sm, respond("cat", crew.clone(), true)), Outcome::Rejected(Rejection::Forbidden(_))));
    accept(&sm, "team", &crew);
    assert_eq!(sm.role("cat", "team").expect("role"), Some(Role::Viewer));

    // At most INVITATIONS_PENDING_MAX pending for one grantee, whoever sends them; one
    // answered makes room.
    apply(&sm, Command::CreateUser { user_id: "dan".into(), namespace_id: "home-dan".into(), name: "dan".into() });
    for i in 0..=crate::sharing::INVITATIONS_PENDING_MAX {
        let folder = format!("f{i}");
        let create = Command::CreateSharedFolder {
            namespace_id: folder.clone(),
            name: folder.clone(),
            owner_user_id: "bob".into(),
            folders_max: None,
        };
        assert!(matches!(apply(&sm, create), Outcome::NamespaceCreated { .. }));
        let invite = Command::SetAccess {
            actor_user_id: "bob".into(),
            namespace_id: folder,
            grantee: user("dan"),
            role: Some(Role::Viewer),
            invite: true,
        };
        let outcome = apply_raw(&sm, invite);
        if i < crate::sharing::INVITATIONS_PENDING_MAX {
            assert_eq!(outcome, Outcome::Done, "invitation {i}");
        } else {
            assert!(matches!(outcome, Outcome::Rejected(Rejection::LimitReached(_))), "{outcome:?}");
        }
    }
    assert_eq!(invitations(&user("dan")).len(), crate::sharing::INVITATIONS_PENDING_MAX);
    let decline = Command::RespondInvitation {
        actor_user_id: "dan".into(),
        namespace_id: "f0".into(),
        grantee: user("dan"),
        accept: false,
    };
    assert_eq!(apply_raw(&sm, decline), Outcome::Done);
    let last = format!("f{}", crate::sharing::INVITATIONS_PENDING_MAX);
    let invite = Command::SetAccess {
        actor_user_id: "bob".into(),
        namespace_id: last,
        grantee: user("dan"),
        role: Some(Role::Viewer),
        invite: true,
    };
    assert_eq!(apply_raw(&sm, invite), Outcome::Done);
    // A folder deleted: its invitations go with it.
    let delete = Command::DeleteSharedFolder { actor_user_id: "bob".into(), namespace_id: "f1".into() };
    assert_eq!(apply(&sm, delete), Outcome::Done);
    assert!(!invitations(&user("dan")).contains(&"f1".to_string()));
    purge_all(&sm, 10);
    let (start, end) = keys::invitation_range(&user("dan").key());
    assert_eq!(sm.scan_keys(&start, &end, 1_000).expect("keys").len(), crate::sharing::INVITATIONS_PENDING_MAX - 1);
}

#[test]
fn stored_bytes_count_each_block_once_per_uploader_and_the_quota_is_kept_in_apply() {
    let (_dir, sm) = world();
    let register = |content: &str, uploader: &str, size: u64| Command::RegisterChunk {
        hash: h(content),
        size,
        uploader: uploader.into(),
        quota_bytes: Some(25),
        placed_in: None,
    };
    assert_eq!(apply(&sm, register("a", "ann", 10)), Outcome::Done);
    assert_eq!(apply(&sm, register("a", "ann", 10)), Outcome::Done, "known to ann: counted once");
    assert_eq!(apply(&sm, register("b", "ann", 10)), Outcome::Done);
    assert_eq!(sm.stored_bytes("ann").expect("bytes"), 20);
    let refused = apply(&sm, register("c", "ann", 10));
    assert_eq!(refused, Outcome::Rejected(Rejection::QuotaExceeded { stored_bytes: 20, quota_bytes: 25, size: 10 }));
    assert!(sm.chunk(&h("c")).expect("chunk").is_none(), "a refused block is not indexed");
    // bob's upload of the same content counts for bob, at the size it was indexed with.
    assert_eq!(apply(&sm, register("a", "bob", 999)), Outcome::Done);
    assert_eq!(sm.stored_bytes("bob").expect("bytes"), 10);
    // Collected blocks give their bytes back to every uploader.
    let collect = Command::CollectOrphans { orphaned_before_ms: u64::MAX, max_chunks: 100 };
    assert!(matches!(apply(&sm, collect), Outcome::Collected { .. }));
    assert_eq!(sm.stored_bytes("ann").expect("bytes"), 0);
    assert_eq!(sm.stored_bytes("bob").expect("bytes"), 0);
    assert_eq!(apply(&sm, register("c", "ann", 10)), Outcome::Done);
}

#[test]
fn the_folder_quota_counts_folders_created_and_not_deleted() {
    let (_dir, sm) = world();
    let create = |id: &str| Command::CreateSharedFolder {
        namespace_id: id.into(),
        name: id.into(),
        owner_user_id: "ann".into(),
        folders_max: Some(2),
    };
    // `team` came from a command without a quota: not counted, either way.
    assert!(matches!(apply(&sm, create("f1")), Outcome::NamespaceCreated { .. }));
    assert!(matches!(apply(&sm, create("f2")), Outcome::NamespaceCreated { .. }));
    assert!(matches!(apply(&sm, create("f3")), Outcome::Rejected(Rejection::LimitReached(_))));
    let delete = |id: &str| Command::DeleteSharedFolder { actor_user_id: "ann".into(), namespace_id: id.into() };
    assert_eq!(apply(&sm, delete("team")), Outcome::Done);
    assert!(matches!(apply(&sm, create("f3")), Outcome::Rejected(Rejection::LimitReached(_))), "team was not counted");
    assert_eq!(apply(&sm, delete("f1")), Outcome::Done);
    assert!(matches!(apply(&sm, create("f3")), Outcome::NamespaceCreated { .. }), "f1's place");
}
