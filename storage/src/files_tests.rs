//! Commit rules (DESIGN.md §4), refcounts and the change feed.

use crate::blocks::BlockHash;
use crate::command::{Batch, Command, ConflictedCopy, FileCommit, FileMove, Outcome, Rejection};
use crate::paths::FilePath;
use crate::{Db, StateMachine};

fn open() -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
    (dir, sm)
}

fn apply(sm: &StateMachine, command: Command) -> Outcome {
    let mut out = sm.apply(b"m", Some(&Batch::new(1, vec![command].into()))).expect("apply");
    out.pop().expect("one outcome")
}

fn h(name: &str) -> BlockHash {
    BlockHash::of(name.as_bytes())
}

fn with_chunks(sm: &StateMachine, names: &[&str]) {
    for name in names {
        apply(
            sm,
            Command::RegisterChunk {
                hash: h(name),
                size: 1,
                uploader: String::new(),
                quota_bytes: None,
                placed_in: None,
            },
        );
    }
}

fn commit(path: &str, chunks: &[&str], base: u64, device: &str, ids: &str) -> Command {
    Command::CommitFile(Box::new(FileCommit {
        namespace_id: "ns".into(),
        path: FilePath::parse(path).expect("path"),
        chunks: chunks.iter().map(|c| h(c)).collect(),
        size: chunks.len() as u64,
        mtime_ms: 5,
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

fn committed(file_id: &str, version: u64) -> Outcome {
    Outcome::FileCommitted { file_id: file_id.into(), version, unchanged: false }
}

#[test]
fn create_then_update() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    assert_eq!(apply(&sm, commit("/f.txt", &["a"], 0, "laptop", "1")), committed("file-1", 1));
    assert_eq!(apply(&sm, commit("/f.txt", &["a", "b"], 1, "laptop", "2")), committed("file-1", 2));
    let (file, version) = sm.file_at("ns", "/f.txt").expect("read").expect("file");
    assert_eq!((file.current_version, version.chunks.len()), (2, 2));
    assert_eq!(sm.versions("file-1").expect("history").iter().map(|v| v.version).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(sm.chunk(&h("a")).expect("read").expect("chunk").refcount, 2);
    assert_eq!(sm.chunk(&h("b")).expect("read").expect("chunk").refcount, 1);
}

#[test]
fn two_devices_on_the_same_base_make_one_conflicted_copy() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b", "c"]);
    apply(&sm, commit("/docs/r.pdf", &["a"], 0, "laptop", "1"));
    assert_eq!(apply(&sm, commit("/docs/r.pdf", &["b"], 1, "laptop", "2")), committed("file-1", 2));
    let conflict = apply(&sm, commit("/docs/r.pdf", &["c"], 1, "phone", "3"));
    let copy_path = FilePath::parse("/docs/r (conflicted copy, phone).pdf").expect("path");
    assert_eq!(
        conflict,
        Outcome::FileConflict {
            current_version: 2,
            copy: Some(ConflictedCopy { path: copy_path, file_id: "copy-3".into(), version: 1 })
        }
    );
    assert_eq!(sm.file_at("ns", "/docs/r.pdf").expect("read").expect("file").1.chunks, vec![h("b")]);
    let (_, copy) = sm.file_at("ns", "/docs/r (conflicted copy, phone).pdf").expect("read").expect("copy");
    assert_eq!(copy.chunks, vec![h("c")]);
    // A second conflict from the same device takes the next name.
    let again = apply(&sm, commit("/docs/r.pdf", &["a", "c"], 1, "phone", "4"));
    let Outcome::FileConflict { copy: Some(second), .. } = again else { panic!("conflict expected") };
    assert_eq!(second.path.as_str(), "/docs/r (conflicted copy, phone 2).pdf");
}

#[test]
fn retry_identical_content_and_missing_chunks() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    apply(&sm, commit("/f", &["a"], 0, "d", "1"));
    apply(&sm, commit("/f", &["b"], 1, "d", "2"));
    // The retry of the commit that made version 2: same result, no version 3.
    assert_eq!(apply(&sm, commit("/f", &["b"], 1, "d", "3")), committed("file-1", 2));
    // A retry of the create (base 0) that made version 1.
    assert_eq!(apply(&sm, commit("/f", &["a"], 0, "d", "4")), committed("file-1", 1));
    assert_eq!(sm.file_at("ns", "/f").expect("read").expect("file").0.current_version, 2);
    // Another device with the current content on a stale base: no conflict.
    let same = apply(&sm, commit("/f", &["b"], 0, "other", "5"));
    assert_eq!(same, Outcome::FileCommitted { file_id: "file-1".into(), version: 2, unchanged: true });
    assert_eq!(sm.chunk(&h("b")).expect("read").expect("chunk").refcount, 1, "retries add no references");
    let missing = apply(&sm, commit("/g", &["a", "zz", "zz"], 0, "d", "6"));
    assert_eq!(missing, Outcome::Rejected(Rejection::MissingChunks(vec![h("zz")])));
    assert!(sm.file_at("ns", "/g").expect("read").is_none());
}

#[test]
fn delete_is_a_tombstone_version_and_the_path_can_be_reused() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    apply(&sm, commit("/f", &["a"], 0, "d", "1"));
    let Command::CommitFile(mut delete) = commit("/f", &[], 1, "d", "2") else { unreachable!() };
    delete.deleted = true;
    assert_eq!(apply(&sm, Command::CommitFile(delete.clone())), committed("file-1", 2));
    let (file, version) = sm.file_at("ns", "/f").expect("read").expect("file");
    assert!(file.deleted && version.deleted);
    delete.base_version = 2;
    assert!(matches!(apply(&sm, Command::CommitFile(delete)), Outcome::Rejected(Rejection::NotFound(_))));
    assert_eq!(apply(&sm, commit("/f", &["a"], 0, "d", "3")), committed("file-1", 3));
}

#[test]
fn the_feed_lists_each_file_once_at_its_latest_change() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    apply(&sm, commit("/x", &["a"], 0, "d", "x"));
    apply(&sm, commit("/y", &["a"], 0, "d", "y"));
    apply(&sm, commit("/x", &["b"], 1, "d", "x2"));
    let all = sm.changes("ns", 0, 100).expect("changes");
    assert_eq!(all.iter().map(|c| (c.file.path.as_str(), c.seq)).collect::<Vec<_>>(), vec![("/y", 2), ("/x", 3)]);
    assert_eq!(sm.changes("ns", 2, 100).expect("changes").len(), 1);
    assert_eq!(sm.changes("ns", 0, 1).expect("changes").len(), 1);
    assert_eq!(sm.namespace_cursor("ns").expect("cursor"), 3);
    assert_eq!(sm.files_under("ns", "/", None, 10).expect("list").len(), 2);
}

/// A feed entry carries its version, so it reads the same as the file and version records
/// (what an entry from before `ChangeRecord`, a bare file id, is looked up from).
#[test]
fn feed_entries_match_the_records_and_old_entries_still_read() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    apply(&sm, commit("/x", &["a"], 0, "d", "x"));
    apply(&sm, commit("/y", &["a", "b"], 0, "d", "y"));
    apply(&sm, commit("/x", &["b"], 1, "d", "x2"));
    let check = |changes: Vec<crate::files::Change>| {
        for change in &changes {
            let (file, version) = sm.file(&change.file.id).expect("read").expect("file");
            assert_eq!((&change.file, &change.version), (&file, &version));
        }
        changes.iter().map(|c| (c.file.id.clone(), c.version.version, c.seq)).collect::<Vec<_>>()
    };
    let new = check(sm.changes("ns", 0, 100).expect("changes"));
    assert_eq!(new, vec![("file-y".to_string(), 1, 2), ("file-x".to_string(), 2, 3)]);
    let state = sm.db().cf(crate::cf::STATE);
    for (file_id, seq) in [("file-y", 2), ("file-x", 3)] {
        let legacy = serde_json::to_vec(file_id).expect("encode");
        sm.db().rocks().put_cf(state, crate::keys::change("ns", seq), legacy).expect("write an old entry");
    }
    assert_eq!(check(sm.changes("ns", 0, 100).expect("old entries")), new);
}

#[test]
fn old_versions_expire_refcounts_drop_and_orphans_are_collected() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    // Both chunks are orphans from registration on; a commit takes "a" out of the index.
    apply(&sm, commit("/f", &["a"], 0, "d", "1"));
    apply(&sm, commit("/f", &["b"], 1, "d", "2"));
    assert_eq!(
        apply(&sm, Command::CollectOrphans { orphaned_before_ms: 0, max_chunks: 10 }),
        Outcome::Collected { removed: 0, more: false }
    );
    // Version 1 (created at 1) expires; version 2 is current and never does.
    assert_eq!(
        apply(&sm, Command::ExpireVersions { superseded_before_ms: 10, max_versions: 10 }),
        Outcome::Collected { removed: 1, more: false }
    );
    assert_eq!(sm.versions("file-1").expect("history").len(), 1);
    assert_eq!(sm.chunk(&h("a")).expect("read").expect("chunk").refcount, 0);
    assert_eq!(sm.chunk(&h("b")).expect("read").expect("chunk").refcount, 1);
    assert_eq!(
        apply(&sm, Command::ExpireVersions { superseded_before_ms: 10, max_versions: 10 }),
        Outcome::Collected { removed: 0, more: false }
    );
    assert_eq!(
        apply(&sm, Command::CollectOrphans { orphaned_before_ms: 10, max_chunks: 10 }),
        Outcome::Collected { removed: 1, more: false }
    );
    assert!(sm.chunk(&h("a")).expect("read").is_none());
    assert!(sm.chunk(&h("b")).expect("read").is_some(), "a referenced chunk is never collected");
    assert_eq!(sm.chunk_hashes(None, 10).expect("hashes"), vec![h("b")]);
}

#[test]
fn move_tombstones_the_source_and_creates_the_target() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    apply(&sm, commit("/old", &["a"], 0, "d", "1"));
    apply(&sm, commit("/busy", &["a"], 0, "d", "2"));
    let request = |to: &str, base: u64| {
        Command::MoveFile(Box::new(FileMove {
            namespace_id: "ns".into(),
            from: FilePath::parse("/old").expect("path"),
            to: FilePath::parse(to).expect("path"),
            base_version: base,
            device: "d".into(),
            new_file_id: "moved".into(),
            actor_user_id: String::new(),
        }))
    };
    assert!(matches!(apply(&sm, request("/busy", 1)), Outcome::Rejected(Rejection::Conflict(_))));
    assert_eq!(apply(&sm, request("/new", 7)), Outcome::FileConflict { current_version: 1, copy: None });
    assert_eq!(apply(&sm, request("/new", 1)), committed("moved", 1));
    assert!(sm.file_at("ns", "/old").expect("read").expect("old").0.deleted);
    assert_eq!(sm.file_at("ns", "/new").expect("read").expect("new").1.chunks, vec![h("a")]);
    assert_eq!(sm.chunk(&h("a")).expect("read").expect("chunk").refcount, 3);
    assert!(matches!(apply(&sm, request("/new2", 2)), Outcome::Rejected(Rejection::NotFound(_))));
}

fn copy_of(outcome: &Outcome) -> ConflictedCopy {
    match outcome {
        Outcome::FileConflict { copy: Some(copy), .. } => copy.clone(),
        other => panic!("a conflict with a copy expected, got {other:?}"),
    }
}

#[test]
fn a_conflict_on_a_long_name_keeps_both_versions() {
    // The request that stopped the cluster: a legal 236-character name, edited on one base
    // by two devices. The copy's stem is shortened to fit 255 bytes.
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    let path = format!("/{}.txt", "x".repeat(232));
    apply(&sm, commit(&path, &["a"], 0, "laptop", "1"));
    let copy = copy_of(&apply(&sm, commit(&path, &["b"], 0, "phone", "2")));
    assert!(copy.path.as_str().len() <= 256 && copy.path.as_str().ends_with("(conflicted copy, phone).txt"));
    assert_eq!(sm.file_at("ns", copy.path.as_str()).expect("read").expect("copy").1.chunks, vec![h("b")]);
}

#[test]
fn hostile_device_names_are_sanitised_in_copy_names() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b", "c", "d"]);
    apply(&sm, commit("/f.txt", &["a"], 0, "laptop", "1"));
    for (device, chunk, expected) in
        [("tab\there", "b", "tab_here"), ("a//b", "c", "a__b"), ("\u{1b}[31m", "d", "_[31m")]
    {
        let copy = copy_of(&apply(&sm, commit("/f.txt", &[chunk], 0, device, chunk)));
        assert_eq!(copy.path.as_str(), format!("/f (conflicted copy, {expected}).txt"));
    }
}

#[test]
fn conflicted_copy_numbering_never_runs_out() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["base"]);
    apply(&sm, commit("/f", &["base"], 0, "d", "0"));
    let mut paths = std::collections::BTreeSet::new();
    for i in 1..=1_002u32 {
        let name = format!("c{i}");
        apply(
            &sm,
            Command::RegisterChunk {
                hash: h(&name),
                size: 1,
                uploader: String::new(),
                quota_bytes: None,
                placed_in: None,
            },
        );
        let copy = copy_of(&apply(&sm, commit("/f", &[name.as_str()], 0, "phone", &i.to_string())));
        assert!(paths.insert(copy.path.clone()), "copy {i} reused {}", copy.path);
    }
    assert!(paths.contains(&FilePath::parse("/f (conflicted copy, phone 1000)").expect("path")));
    assert!(paths.contains(&FilePath::parse("/f (conflicted copy, phone copy-1002)").expect("path")));
}

#[test]
fn a_retried_conflicting_commit_keeps_its_one_copy_and_reports_the_current_version() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b", "c"]);
    apply(&sm, commit("/f.txt", &["a"], 0, "laptop", "1"));
    apply(&sm, commit("/f.txt", &["b"], 1, "laptop", "2"));
    let first = apply(&sm, commit("/f.txt", &["c"], 1, "phone", "3"));
    let Outcome::FileConflict { current_version: 2, copy: Some(copy) } = first.clone() else {
        panic!("a conflict at version 2 expected, got {first:?}")
    };
    // After the file moved on, the retry (fresh ids, as the API makes them) gets the same
    // one copy, and the version current now: replaying the first answer's version 2 would
    // report what no read can see any more (a linearizability checker flags it).
    apply(&sm, commit("/f.txt", &["a"], 2, "laptop", "4"));
    let retry = apply(&sm, commit("/f.txt", &["c"], 1, "phone", "5"));
    assert_eq!(retry, Outcome::FileConflict { current_version: 3, copy: Some(copy) });
    assert_eq!(sm.changes("ns", 0, 100).expect("feed").len(), 2, "the file and one copy");
    // Another device, or other content, is another conflict.
    assert_ne!(copy_of(&apply(&sm, commit("/f.txt", &["c"], 1, "tablet", "6"))), copy_of(&first));
}

#[test]
fn retention_counts_from_when_a_version_was_superseded() {
    // A version created at 1 and superseded at 5_000 is kept until 5_000 + retention.
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    apply(&sm, commit("/f", &["a"], 0, "d", "1"));
    sm.apply(b"m", Some(&Batch::new(5_000, vec![commit("/f", &["b"], 1, "d", "2")].into()))).expect("apply");
    let expire = |before| Command::ExpireVersions { superseded_before_ms: before, max_versions: 10 };
    assert_eq!(apply(&sm, expire(4_999)), Outcome::Collected { removed: 0, more: false });
    assert_eq!(apply(&sm, expire(5_000)), Outcome::Collected { removed: 1, more: false });
}

#[test]
fn expiry_reports_more_when_its_bound_is_reached() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    for version in 0..5 {
        apply(&sm, commit("/f", &["a"], version, "d", &version.to_string()));
    }
    let expire = Command::ExpireVersions { superseded_before_ms: 10, max_versions: 2 };
    assert_eq!(apply(&sm, expire.clone()), Outcome::Collected { removed: 2, more: true });
    assert_eq!(apply(&sm, expire.clone()), Outcome::Collected { removed: 2, more: true });
    assert_eq!(apply(&sm, expire), Outcome::Collected { removed: 0, more: false });
}

#[test]
fn a_new_file_never_takes_an_id_another_file_has() {
    // Found by the apply property test: a command proposing an id that is taken must not
    // write its versions over the other file's.
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    assert_eq!(apply(&sm, commit("/one.txt", &["a"], 0, "laptop", "1")), committed("file-1", 1));
    assert_eq!(apply(&sm, commit("/two.txt", &["b"], 0, "laptop", "1")), committed("file-1.1", 1));
    assert_eq!(sm.file_at("ns", "/one.txt").expect("read").expect("file").1.chunks, vec![h("a")]);
    assert_eq!(sm.file_at("ns", "/two.txt").expect("read").expect("file").1.chunks, vec![h("b")]);
    assert_eq!(sm.versions("file-1").expect("history").len(), 1);
}

#[test]
fn a_commit_naming_a_hundred_thousand_missing_chunks_is_judged_in_linear_time() {
    let (_dir, sm) = open();
    let chunks: Vec<BlockHash> = (0..100_000u32).map(|i| BlockHash::of(&i.to_be_bytes())).collect();
    let mut command = commit("/many", &[], 0, "d", "many");
    if let Command::CommitFile(c) = &mut command {
        c.chunks = chunks.clone();
    }
    let started = std::time::Instant::now();
    let outcome = apply(&sm, command);
    let took = started.elapsed();
    match outcome {
        Outcome::Rejected(Rejection::MissingChunks(missing)) => assert_eq!(missing.len(), chunks.len()),
        other => panic!("{other:?}"),
    }
    // A list search made this 5 * 10^9 comparisons (tens of seconds); a set makes it 100,000
    // point reads.
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

fn apply_all(sm: &StateMachine, commands: Vec<Command>) {
    for batch in commands.chunks(500) {
        sm.apply(b"m", Some(&Batch::new(1, batch.to_vec().into()))).expect("apply");
    }
}

fn names(page: &crate::files::FolderPage) -> Vec<String> {
    page.entries
        .iter()
        .map(|e| match e {
            crate::files::FolderEntry::File { name, .. } => name.clone(),
            crate::files::FolderEntry::Folder { name } => format!("{name}/"),
        })
        .collect()
}

#[test]
fn a_folder_listing_seeks_past_subfolders_and_stops_after_bounded_work() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    // 20,000 files in one subfolder, five beside it.
    let mut commands: Vec<Command> =
        (0..20_000).map(|i| commit(&format!("/big/{i:05}"), &["a"], 0, "d", &format!("b{i}"))).collect();
    commands.extend((0..5).map(|i| commit(&format!("/top{i}"), &["a"], 0, "d", &format!("t{i}"))));
    apply_all(&sm, commands);
    // One read finds the subfolder; the scan seeks past its 20,000 files.
    let page = sm.list_folder("ns", "/", None, 100, 10).expect("list");
    assert_eq!(names(&page), vec!["big/", "top0", "top1", "top2", "top3", "top4"]);
    assert_eq!(page.next, None);
    // Pages follow each other without a gap or a repeat.
    let first = sm.list_folder("ns", "/", None, 2, 1_000).expect("list");
    assert_eq!(names(&first), vec!["big/", "top0"]);
    let second = sm.list_folder("ns", "/", first.next.as_deref(), 10, 1_000).expect("list");
    assert_eq!(names(&second), vec!["top1", "top2", "top3", "top4"]);
}

#[test]
fn a_subfolder_is_passed_whatever_its_names_sort_like() {
    // Names of the highest code point sort after any fixed end mark a listing could put
    // after a subfolder: the next page must still start past all of it, and end.
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    let top = "\u{10FFFF}";
    apply_all(
        &sm,
        vec![
            commit(&format!("/x/{top}{top}"), &["a"], 0, "d", "deep"),
            commit(&format!("/x/{top}"), &["a"], 0, "d", "top"),
            commit("/x0", &["a"], 0, "d", "beside"),
            commit("/y", &["a"], 0, "d", "after"),
        ],
    );
    let (mut token, mut found) = (None, Vec::new());
    for _ in 0..10 {
        let page = sm.list_folder("ns", "/", token.as_deref(), 1, 1_000).expect("list");
        found.extend(names(&page));
        token = page.next;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(found, vec!["x/", "x0", "y"]);
    assert_eq!(token, None, "the listing ended");
}

#[test]
fn a_folder_of_deleted_files_answers_short_pages_with_a_token() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a"]);
    let mut commands: Vec<Command> =
        (0..300).map(|i| commit(&format!("/d{i:03}"), &["a"], 0, "d", &format!("d{i}"))).collect();
    commands.push(commit("/z-live", &["a"], 0, "d", "live"));
    apply_all(&sm, commands);
    let deletes: Vec<Command> = (0..300)
        .map(|i| {
            let mut c = commit(&format!("/d{i:03}"), &[], 1, "d", &format!("x{i}"));
            if let Command::CommitFile(f) = &mut c {
                f.deleted = true;
            }
            c
        })
        .collect();
    apply_all(&sm, deletes);
    let mut token = None;
    let mut found = Vec::new();
    let mut pages = 0;
    loop {
        let page = sm.list_folder("ns", "/", token.as_deref(), 100, 50).expect("list");
        pages += 1;
        found.extend(names(&page));
        match page.next {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages < 100, "no end");
    }
    assert_eq!(found, vec!["z-live"]);
    assert!(pages >= 6, "each page read at most 50 records: {pages} pages");
}

#[test]
fn history_pages_read_only_their_versions() {
    let (_dir, sm) = open();
    with_chunks(&sm, &["a", "b"]);
    let mut base = 0;
    for i in 0..10 {
        apply(&sm, commit("/h", &[if i % 2 == 0 { "a" } else { "b" }], base, "d", "h"));
        base += 1;
    }
    let newest: Vec<u64> = sm.versions_page("file-h", u64::MAX, 3).expect("page").iter().map(|v| v.version).collect();
    assert_eq!(newest, vec![10, 9, 8]);
    let next: Vec<u64> = sm.versions_page("file-h", 8, 3).expect("page").iter().map(|v| v.version).collect();
    assert_eq!(next, vec![7, 6, 5]);
    assert_eq!(sm.version("file-h", 4).expect("read").map(|v| v.version), Some(4));
}
