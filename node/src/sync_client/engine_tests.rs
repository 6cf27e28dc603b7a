//! The decision table of a remote change against the local file.

use super::*;

fn change(version: u64, chunks: &[&str], deleted: bool) -> Change {
    Change {
        path: "/f".into(),
        version,
        chunks: chunks.iter().map(|c| c.to_string()).collect(),
        deleted,
        ..Change::default()
    }
}

fn entry(version: u64, chunks: &[&str]) -> Entry {
    Entry {
        version,
        chunks: chunks.iter().map(|c| c.to_string()).collect(),
        lengths: vec![1; chunks.len()],
        executable: false,
        meta: Meta { size: 1, ..Meta::default() },
        recorded_ns: 0,
        stale: false,
        local: None,
        unverified: false,
    }
}

fn content(chunks: &[&str]) -> Content {
    Content {
        chunks: chunks.iter().map(|c| c.to_string()).collect(),
        lengths: vec![1; chunks.len()],
        meta: Meta { size: 7, ..Meta::default() },
        read_ns: 0,
    }
}

fn check(entry: Option<Entry>, local: Local, c: Change, receive_only: bool, expected: Act) {
    check_known(entry, local, c, receive_only, false, expected);
}

fn check_known(entry: Option<Entry>, local: Local, c: Change, receive_only: bool, had: bool, expected: Act) {
    let act = decide(entry.as_ref(), &local, &c, receive_only, had);
    assert_eq!(act, expected, "{entry:?} / {local:?} / {c:?} / server had it: {had}");
}

#[test]
fn a_remote_change_never_overwrites_an_unsynced_local_edit() {
    let meta = Meta { size: 1, ..Meta::default() };
    // Unchanged since synced: the new version comes down, a deletion deletes (to the trash).
    check(Some(entry(1, &["a"])), Local::Unchanged(meta), change(2, &["b"], false), false, Act::Download(Some(meta)));
    check(Some(entry(1, &["a"])), Local::Unchanged(meta), change(2, &[], true), false, Act::Remove(meta));
    // Missing here: the newer content wins over the local delete; a deletion is agreed.
    check(Some(entry(1, &["a"])), Local::Missing, change(2, &["b"], false), false, Act::Download(None));
    check(Some(entry(1, &["a"])), Local::Missing, change(2, &[], true), false, Act::Forget);
    // Edited here: kept (sent as a conflict); the same content is simply recorded; deleted
    // there, the edit survives as a new file.
    check(Some(entry(1, &["a"])), Local::Edited(content(&["c"])), change(2, &["b"], false), false, Act::Stale);
    check(Some(entry(1, &["a"])), Local::Edited(content(&["b"])), change(2, &["b"], false), false, Act::Record);
    check(Some(entry(1, &["a"])), Local::Edited(content(&["c"])), change(2, &[], true), false, Act::Forget);
    // Never synced, content differs: it goes up as a conflict (a conflicted copy there), on
    // a base just below the server's, so the server never takes it for a retry of its v1.
    check(None, Local::Edited(content(&["c"])), change(2, &["b"], false), false, Act::SendOver(1));
    check(None, Local::Edited(content(&["c"])), change(1, &["b"], false), false, Act::SendOver(0));
    // Only the execute bit changed here: sent on the server's current version.
    let mut chmodded = content(&["b"]);
    chmodded.meta.executable = true;
    check(Some(entry(1, &["a"])), Local::Edited(chmodded), change(2, &["b"], false), false, Act::SendOver(2));
    // Being written: left for later.
    check(Some(entry(1, &["a"])), Local::Busy, change(2, &["b"], false), false, Act::Stale);
    // A folder or link in the way: this file fails, nothing else.
    check(None, Local::Other("a folder".into()), change(1, &["b"], false), false, Act::Fail("a folder".into()));
    // Receive-only: the server's version replaces a local edit (which goes to the trash).
    let edited = content(&["c"]);
    let m = edited.meta;
    check(Some(entry(1, &["a"])), Local::Edited(edited), change(2, &["b"], false), true, Act::Download(Some(m)));
}

#[test]
fn after_a_cursor_reset_content_decides_not_version_numbers() {
    let meta = Meta { size: 1, ..Meta::default() };
    let unverified = |version, chunks: &[&str]| Entry { unverified: true, ..entry(version, chunks) };
    // Same content: recorded at the server's version, whatever the numbers.
    check(Some(unverified(9, &["a"])), Local::Unchanged(meta), change(3, &["a"], false), false, Act::Record);
    // The server's history holds what was synced here: it moved on, its version comes down
    // (or its deletion applies), whatever the version numbers say.
    let down = Act::Download(Some(meta));
    check_known(Some(unverified(9, &["a"])), Local::Unchanged(meta), change(3, &["x"], false), false, true, down);
    let gone = Act::Remove(meta);
    check_known(Some(unverified(2, &["a"])), Local::Unchanged(meta), change(5, &[], true), false, true, gone);
    // The server never had it (restored from a backup taken before): it goes up — as a
    // conflicted copy beside the server's version, or over a deletion — even where the
    // server's version number is the larger one.
    check(Some(unverified(2, &["a"])), Local::Unchanged(meta), change(5, &["x"], false), false, Act::SendOver(4));
    check(Some(unverified(9, &["a"])), Local::Unchanged(meta), change(3, &["x"], false), false, Act::SendOver(2));
    check(Some(unverified(9, &["a"])), Local::Unchanged(meta), change(3, &[], true), false, Act::SendOver(3));
    // Edited locally since: sent as a conflict, never skipped.
    let edited = Local::Edited(content(&["c"]));
    check(Some(unverified(2, &["a"])), edited, change(5, &["x"], false), false, Act::SendOver(4));
}
