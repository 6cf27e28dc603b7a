//! Which folder the client syncs, so a moved, deleted, replaced or unmounted folder is never
//! read as "every file was deleted" (Syncthing's `.stfolder`). At first setup the client
//! writes a marker, `DIR/.raftbox/folder-id`, holding a random id that the state database
//! keeps too, and records the folder's inode. Before every pass it checks that the path still
//! names the very folder it holds open, that its inode is the one recorded, and that the
//! marker holds the id: if not, the pass does nothing and the client waits, saying why, until
//! the folder is back (a drive mounted again, a folder moved back).
//!
//! The marker also holds a generation, raised (marker first, then state, both durably) by
//! every pass that changed anything: a copy of the folder restored from a snapshot or an old
//! drive — same inode on some file systems, same id — carries an older generation than the
//! state, and pauses too.
//!
//! A folder restored from a backup or copied to a new disk has the marker but another inode
//! or an older generation: `raftbox sync DIR --accept-folder` adopts it, and its files are
//! then compared with the server's by content (nothing older overwrites anything newer).

use std::os::unix::fs::MetadataExt as _;

use super::folder::Folder;
use super::names::STATE_DIR;
use super::state::StateDb;

/// The marker's name in `DIR/.raftbox/`.
pub const MARKER: &str = "folder-id";
/// Folders remembered as set up on this machine, at most (the oldest are forgotten).
const REMEMBERED_FOLDERS_MAX: usize = 1_000;

/// The list of folders set up on this machine, kept outside them so that a folder whose
/// state went with it (moved, deleted, on a drive not mounted) is never taken for a new one:
/// `$XDG_STATE_HOME/raftbox/folders` (default `~/.local/state/raftbox/folders`), a line per
/// folder. `None` without a home.
fn registry() -> Option<std::path::PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".local/state"),
    };
    Some(base.join("raftbox").join("folders"))
}

/// Whether the folder at `path` (absolute) was set up on this machine before. Folders are
/// remembered by their canonical path; a missing one is resolved through its parent.
pub fn was_set_up(path: &std::path::Path) -> bool {
    let Some(registry) = registry() else { return false };
    let text = std::fs::read_to_string(registry).unwrap_or_default();
    let mut forms = vec![path.to_path_buf()];
    forms.extend(path.canonicalize().ok());
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
        forms.extend(parent.canonicalize().ok().map(|p| p.join(name)));
    }
    text.lines().any(|line| forms.iter().any(|form| std::path::Path::new(line) == form))
}

/// Remembers the folder at `path` as set up (best effort: without a home, not remembered).
pub fn remember(path: &std::path::Path) {
    let Some(registry) = registry() else { return };
    if was_set_up(path) {
        return;
    }
    let text = std::fs::read_to_string(&registry).unwrap_or_default();
    let mut lines: Vec<&str> = text.lines().collect();
    let shown = path.display().to_string();
    lines.push(&shown);
    let keep = &lines[lines.len().saturating_sub(REMEMBERED_FOLDERS_MAX)..];
    if let Some(parent) = registry.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let temp = registry.with_extension("tmp");
    if std::fs::write(&temp, keep.join("\n") + "\n").and_then(|()| std::fs::rename(&temp, &registry)).is_err() {
        eprintln!("sync: could not remember {shown} in {}", registry.display());
    }
}

/// Records the folder's identity at first setup (or, with `accept`, adopts the folder as it
/// is now). Answers whether this is the first setup.
pub fn setup(folder: &Folder, db: &StateDb, accept: bool) -> anyhow::Result<bool> {
    let (_, ino) = folder.identity()?;
    let first = db.meta("folder_id")?.is_none();
    if !first && !accept {
        return Ok(false);
    }
    // Adopted on purpose, or a state that synced before without a recorded identity (an
    // older client): nothing is assumed of the folder, its files are compared by content.
    // The comparison is set up before the new identity is recorded, so a crash between the
    // two never leaves an adopted folder trusted without it.
    let synced_before = db.cursor()? != "0" || db.count()? > 0;
    if (accept && !first) || (first && synced_before) {
        eprintln!("sync: {} adopted as this folder; comparing it with the server by content", folder.path().display());
        db.begin_reconcile()?;
    }
    let id = match db.meta("folder_id")? {
        Some(id) => id,
        None => uuid::Uuid::new_v4().to_string(),
    };
    let generation = generation_of(db)?;
    folder.write_marker(MARKER, &format!("{id} {generation}"))?;
    db.set_meta("folder_id", Some(&id))?;
    db.set_meta("folder_ino", Some(&ino.to_string()))?;
    db.set_meta("generation", Some(&generation.to_string()))?;
    remember(folder.path());
    Ok(first && !synced_before)
}

fn generation_of(db: &StateDb) -> anyhow::Result<u64> {
    Ok(db.meta("generation")?.and_then(|g| g.parse().ok()).unwrap_or(0))
}

/// Raises the folder's generation after a pass that changed something: the marker first,
/// then the state, so the marker is never behind the state but after a restore.
pub fn advance(folder: &Folder, db: &StateDb) -> anyhow::Result<()> {
    let Some(id) = db.meta("folder_id")? else { return Ok(()) };
    let next = generation_of(db)? + 1;
    folder.write_marker(MARKER, &format!("{id} {next}"))?;
    db.set_meta("generation", Some(&next.to_string()))
}

/// Why the folder cannot be synced now, if it cannot.
pub fn check(folder: &Folder, db: &StateDb) -> anyhow::Result<Option<String>> {
    let path = folder.path();
    let shown = path.display();
    let at_path = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Some(format!(
                "{shown} is missing (moved, deleted, or its drive is not mounted); syncing is paused until it is back"
            )))
        }
        Err(e) => return Ok(Some(format!("{shown} cannot be read ({e}); syncing is paused"))),
    };
    let held = folder.identity()?;
    let recorded: Option<u64> = db.meta("folder_ino")?.and_then(|ino| ino.parse().ok());
    if (at_path.dev(), at_path.ino()) != held || recorded.is_some_and(|ino| ino != held.1) {
        return Ok(Some(format!(
            "{shown} is no longer the folder this client set up (it was replaced or moved, or a drive was mounted \
             over it); syncing is paused. If this folder is the right one (restored from a backup, say), start \
             the client with --accept-folder"
        )));
    }
    let marker = path.join(STATE_DIR).join(MARKER);
    let Some(expected) = db.meta("folder_id")? else { return Ok(None) };
    let found = std::fs::read_to_string(&marker).ok();
    let mut parts = found.as_deref().unwrap_or("").split_whitespace();
    let (id, generation) = (parts.next(), parts.next().and_then(|g| g.parse::<u64>().ok()).unwrap_or(0));
    if id != Some(expected.as_str()) {
        return Ok(Some(format!(
            "the folder marker {} is missing or names another folder; syncing is paused. If this folder is the \
             right one, start the client with --accept-folder",
            marker.display()
        )));
    }
    if generation < generation_of(db)? {
        return Ok(Some(format!(
            "{shown} is an earlier copy of the folder (its marker is older than this client's state: restored \
             from a snapshot or an old drive?); syncing is paused. If this copy is the one to keep, start the \
             client with --accept-folder: its files are then compared with the server's by content"
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_replaced_or_unmarked_folder_is_refused() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("box");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let db = StateDb::open(&base.path().join("state.redb")).expect("state");
        let folder = Folder::open(&dir, 30).expect("folder");
        assert!(setup(&folder, &db, false).expect("setup"), "the first setup");
        assert!(!setup(&folder, &db, false).expect("setup"), "then not");
        assert_eq!(check(&folder, &db).expect("check"), None);
        // The marker removed: paused; put back: fine.
        let marker = dir.join(".raftbox/folder-id");
        let id = std::fs::read_to_string(&marker).expect("marker");
        assert!(id.starts_with(&db.meta("folder_id").expect("meta").expect("an id")));
        std::fs::remove_file(&marker).expect("rm");
        assert!(check(&folder, &db).expect("check").expect("paused").contains("marker"));
        std::fs::write(&marker, &id).expect("write");
        assert_eq!(check(&folder, &db).expect("check"), None);
        // Moved away: missing.
        std::fs::rename(&dir, base.path().join("old")).expect("mv");
        assert!(check(&folder, &db).expect("check").expect("paused").contains("missing"));
        // Another folder (a copy with the marker) in its place: not this folder.
        std::fs::create_dir_all(dir.join(".raftbox")).expect("mkdir");
        std::fs::write(dir.join(".raftbox/folder-id"), &id).expect("write");
        assert!(check(&folder, &db).expect("check").expect("paused").contains("no longer the folder"));
        // Moved back: fine again.
        std::fs::remove_dir_all(&dir).expect("rm");
        std::fs::rename(base.path().join("old"), &dir).expect("mv back");
        assert_eq!(check(&folder, &db).expect("check"), None);
        // A snapshot of the marker taken now, then passes that changed things: the snapshot
        // put back (same inode, same id) is an earlier copy.
        let snapshot = std::fs::read_to_string(&marker).expect("marker");
        advance(&folder, &db).expect("advance");
        advance(&folder, &db).expect("advance");
        assert_eq!(check(&folder, &db).expect("check"), None);
        std::fs::write(&marker, &snapshot).expect("restore");
        assert!(check(&folder, &db).expect("check").expect("paused").contains("earlier copy"));
        // Adopted: fine, and compared by content.
        setup(&folder, &db, true).expect("accept");
        assert_eq!(check(&folder, &db).expect("check"), None);
        assert!(db.reconciling().expect("flag"));
    }
}
