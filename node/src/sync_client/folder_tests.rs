//! The folder's file system access: nothing through a link, swaps that keep a concurrent
//! edit, the walk's blind spots.

use super::*;

fn setup() -> (tempfile::TempDir, Folder) {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = Folder::open(dir.path(), 30).expect("open");
    (dir, folder)
}

fn rel(path: &str) -> Rel {
    Rel::parse(path).expect("rel")
}

fn new_file(folder: &Folder, at: &str, text: &str) -> anyhow::Result<Swap> {
    let rel = rel(at);
    let (dir, mut file, temp) = folder.create_temp(rel.parent())?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    let temp_meta = Folder::finish_temp(&file, 1_700_000_000_123, false)?;
    let expected = match folder.node(&rel)? {
        Node::File(meta) => Some(meta),
        _ => None,
    };
    folder.swap_in(&dir, &temp, temp_meta, &rel, expected, "test")
}

#[test]
fn writes_never_follow_a_link_out_of_the_folder() {
    let (dir, folder) = setup();
    let outside = tempfile::tempdir().expect("outside");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).expect("symlink");
    let error = new_file(&folder, "link/planted.txt", "x").expect_err("through a link");
    assert!(format!("{error:#}").contains("symbolic link"), "{error:#}");
    assert_eq!(std::fs::read_dir(outside.path()).expect("ls").count(), 0, "nothing written outside");
    assert!(matches!(folder.node(&rel("link/planted.txt")).expect("node"), Node::Blocked(_)));
    assert_eq!(folder.node(&rel("link")).expect("node"), Node::Other("a symbolic link"));
    // A link to a file is never read either.
    std::fs::write(outside.path().join("secret"), "secret").expect("write");
    std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("file-link")).expect("symlink");
    assert!(folder.open_file(&rel("file-link")).is_err());
}

#[test]
fn a_swap_puts_the_new_version_in_and_the_old_one_in_the_trash() {
    let (dir, folder) = setup();
    assert!(matches!(new_file(&folder, "a/b.txt", "one").expect("new"), Swap::Done(_)));
    assert_eq!(std::fs::read_to_string(dir.path().join("a/b.txt")).expect("read"), "one");
    assert_eq!(folder.take_made(), vec!["a".to_string()]);
    let Swap::Done(meta) = new_file(&folder, "a/b.txt", "two").expect("replace") else { panic!("not swapped") };
    assert_eq!(std::fs::read_to_string(dir.path().join("a/b.txt")).expect("read"), "two");
    assert_eq!(meta.mtime_ns, 1_700_000_000_123_000_000, "the server's mtime");
    let items = folder.trash.list().expect("trash");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].label.path, "a/b.txt");
    assert_eq!(std::fs::read_to_string(dir.path().join(".raftbox/trash").join(&items[0].id)).expect("read"), "one");
}

#[test]
fn a_file_that_changed_before_the_swap_is_kept_and_the_new_version_dropped() {
    let (dir, folder) = setup();
    std::fs::write(dir.path().join("f.txt"), "synced").expect("write");
    let r = rel("f.txt");
    let Node::File(expected) = folder.node(&r).expect("node") else { panic!("a file") };
    let (dir_fd, mut file, temp) = folder.create_temp("").expect("temp");
    std::io::Write::write_all(&mut file, b"remote").expect("write");
    let temp_meta = Folder::finish_temp(&file, 1, false).expect("finish");
    // The user saves meanwhile.
    std::fs::write(dir.path().join("f.txt"), "user's edit").expect("edit");
    assert_eq!(folder.swap_in(&dir_fd, &temp, temp_meta, &r, Some(expected), "test").expect("swap"), Swap::Changed);
    assert_eq!(std::fs::read_to_string(dir.path().join("f.txt")).expect("read"), "user's edit");
    assert!(!dir.path().join(&temp).exists(), "the temporary file is gone");
    // A new file where the user just made one: theirs stays.
    let (dir_fd, file, temp) = folder.create_temp("").expect("temp");
    let temp_meta = Folder::finish_temp(&file, 1, false).expect("finish");
    std::fs::write(dir.path().join("new.txt"), "user's").expect("write");
    assert_eq!(folder.swap_in(&dir_fd, &temp, temp_meta, &rel("new.txt"), None, "test").expect("swap"), Swap::Changed);
    assert_eq!(std::fs::read_to_string(dir.path().join("new.txt")).expect("read"), "user's");
}

#[test]
fn a_remove_goes_to_the_trash_and_only_if_unchanged() {
    let (dir, folder) = setup();
    std::fs::create_dir_all(dir.path().join("mine/sub")).expect("mkdir");
    std::fs::write(dir.path().join("mine/sub/x.txt"), "x").expect("write");
    let r = rel("mine/sub/x.txt");
    let Node::File(meta) = folder.node(&r).expect("node") else { panic!("a file") };
    std::fs::write(dir.path().join("mine/sub/x.txt"), "edited").expect("edit");
    assert!(!folder.remove(&r, meta, "deleted on the server").expect("remove"), "an edit is not removed");
    let Node::File(meta) = folder.node(&r).expect("node") else { panic!("a file") };
    assert!(folder.remove(&r, meta, "deleted on the server").expect("remove"));
    assert_eq!(folder.trash.list().expect("trash").len(), 1);
    // The user's own folders stay, even empty; a folder the client made goes.
    assert!(folder.prune_empty(&r, |_| false).is_empty());
    assert!(dir.path().join("mine/sub").exists());
    assert_eq!(folder.prune_empty(&r, |d| d == "mine/sub"), vec!["mine/sub".to_string()]);
    assert!(dir.path().join("mine").exists() && !dir.path().join("mine/sub").exists());
}

#[test]
fn the_walk_reports_links_and_strays_and_skips_the_clients_folder() {
    let (dir, folder) = setup();
    std::fs::create_dir_all(dir.path().join("docs")).expect("mkdir");
    std::fs::write(dir.path().join("docs/a.txt"), "a").expect("write");
    std::fs::write(dir.path().join("top.txt"), "t").expect("write");
    std::os::unix::fs::symlink("/etc", dir.path().join("docs/etc")).expect("symlink");
    std::fs::write(dir.path().join("docs/.raftbox-0123456789abcdef.tmp"), "partial").expect("write");
    std::fs::write(dir.path().join("docs/report.raftbox-tmp"), "a user's file").expect("write");
    let walk = folder.walk(|_, _| false).expect("walk");
    let mut files: Vec<&str> = walk.files.keys().map(Rel::as_str).collect();
    files.sort();
    assert_eq!(files, vec!["docs/a.txt", "docs/report.raftbox-tmp", "top.txt"]);
    assert_eq!(walk.blind.len(), 1);
    assert!(walk.is_blind("docs/etc") && walk.is_blind("docs/etc/passwd") && !walk.is_blind("docs/etcetera"));
    assert_eq!(walk.strays, vec![Rel::temp("docs/.raftbox-0123456789abcdef.tmp").expect("temp")]);
}

#[test]
fn a_rename_here_keeps_the_file_and_refuses_to_replace_one() {
    let (dir, folder) = setup();
    std::fs::write(dir.path().join("a.txt"), "a").expect("write");
    std::fs::write(dir.path().join("taken.txt"), "t").expect("write");
    let Node::File(meta) = folder.node(&rel("a.txt")).expect("node") else { panic!("a file") };
    assert_eq!(folder.rename(&rel("a.txt"), &rel("taken.txt"), meta).expect("rename"), None);
    let moved = folder.rename(&rel("a.txt"), &rel("new/b.txt"), meta).expect("rename").expect("moved");
    assert!(moved.same_file(&meta));
    assert_eq!(std::fs::read_to_string(dir.path().join("new/b.txt")).expect("read"), "a");
}

#[test]
fn the_probe_finds_a_case_sensitive_file_system_with_fine_timestamps() {
    let (_dir, folder) = setup();
    // The test machine's temporary directory is ext4 or tmpfs: case-sensitive, nanoseconds.
    assert!(!folder.caps.folds_case && !folder.caps.normalizes && !folder.caps.folds_names());
    assert_eq!(folder.caps.racy_window_ns, RACY_WINDOW_FINE.as_nanos() as u64);
}
