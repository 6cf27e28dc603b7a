//! Which folder the client syncs, so a moved, deleted, replaced or unmounted folder is never
//! read as "every file was deleted" (Syncthing's `.stfolder`). At first setup the client
//! writes a marker, `DIR/.raftbox/folder-id`, holding a random id that the state database
//! keeps too, and records the folder's inode. Before every pass it checks that the path still
//! names the very folder it holds open, that its inode is the one recorded, and that the
//! marker holds the id: if not, the pass does nothing and the client waits, saying why, until
//! the folder is back (a drive mounted again, a folder moved back).
//!
//! A folder restored from a backup or copied to a new disk has the marker but another inode:
//! `raftbox sync DIR --accept-folder` adopts it, and its files are then compared with the
//! server's by content (nothing older overwrites anything newer).

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;

use anyhow::Context;

use super::folder::Folder;
use super::names::STATE_DIR;
use super::state::StateDb;

/// The marker's name in `DIR/.raftbox/`.
pub const MARKER: &str = "folder-id";

/// Records the folder's identity at first setup (or, with `accept`, adopts the folder as it
/// is now). Answers whether this is the first setup.
pub fn setup(folder: &Folder, db: &StateDb, accept: bool) -> anyhow::Result<bool> {
    let (_, ino) = folder.identity()?;
    let first = db.meta("folder_id")?.is_none();
    if !first && !accept {
        return Ok(false);
    }
    let id = match db.meta("folder_id")? {
        Some(id) => id,
        None => uuid::Uuid::new_v4().to_string(),
    };
    let marker = folder.path().join(STATE_DIR).join(MARKER);
    let mut file = std::fs::File::create(&marker).with_context(|| format!("write {}", marker.display()))?;
    file.write_all(id.as_bytes())?;
    file.sync_all()?;
    db.set_meta("folder_id", Some(&id))?;
    db.set_meta("folder_ino", Some(&ino.to_string()))?;
    // Adopted on purpose, or a state that synced before without a recorded identity (an
    // older client): nothing is assumed of the folder, its files are compared by content.
    let synced_before = db.cursor()? != "0" || db.count()? > 0;
    if (accept && !first) || (first && synced_before) {
        eprintln!("sync: {} adopted as this folder; comparing it with the server by content", folder.path().display());
        db.begin_reconcile()?;
    }
    Ok(first && !synced_before)
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
    let expected = db.meta("folder_id")?;
    let found = std::fs::read_to_string(&marker).ok();
    if expected.is_some() && found.as_deref().map(str::trim) != expected.as_deref() {
        return Ok(Some(format!(
            "the folder marker {} is missing or names another folder; syncing is paused. If this folder is the \
             right one, start the client with --accept-folder",
            marker.display()
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
    }
}
