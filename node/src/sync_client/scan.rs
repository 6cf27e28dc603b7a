//! The local side: a walk of the synced folder (size and modification time of each file not
//! ignored), the mapping between remote paths and local ones, and the file watcher that
//! wakes the sync loop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::Context;

use super::ignore_rules::{Rules, STATE_DIR, TEMP_SUFFIX};

/// What a walk sees of one file: enough to tell it unchanged since it was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub size: u64,
    pub mtime_ns: u64,
}

impl Meta {
    pub fn of(metadata: &std::fs::Metadata) -> Meta {
        let mtime_ns =
            metadata.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as u64);
        Meta { size: metadata.len(), mtime_ns }
    }

    /// The regular file at `path` (`None`: absent, or not a regular file).
    pub fn read(path: &Path) -> anyhow::Result<Option<Meta>> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() => Ok(Some(Meta::of(&m))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }
}

/// The local file of remote path `remote` (`/a/b.txt`) under `root`.
pub fn local_path(root: &Path, remote: &str) -> PathBuf {
    root.join(remote.trim_start_matches('/'))
}

/// Every regular file under `root` the rules do not ignore, by remote path. Symbolic links
/// and names that are not UTF-8 are skipped (told once on stderr); partial downloads left by
/// a killed client are removed.
pub fn walk(root: &Path, rules: &Rules) -> anyhow::Result<BTreeMap<String, Meta>> {
    let mut files = BTreeMap::new();
    let walker = walkdir::WalkDir::new(root).follow_links(false).into_iter().filter_entry(|entry| {
        let Ok(relative) = entry.path().strip_prefix(root) else { return true };
        let text = relative.to_string_lossy();
        text.is_empty() || !(text == STATE_DIR || entry.file_type().is_dir() && rules.ignored(&text, true))
    });
    for entry in walker {
        let entry = match entry {
            Ok(entry) => entry,
            // A file removed during the walk: the next walk sees the folder as it is then.
            Err(e) if e.io_error().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound) => continue,
            Err(e) => return Err(e).context("walk the synced folder"),
        };
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(root).context("a path outside the folder")?;
        let Some(text) = relative.to_str() else {
            eprintln!("sync: skipping {} (name is not UTF-8)", relative.display());
            continue;
        };
        if text.ends_with(TEMP_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        if rules.ignored(text, false) {
            continue;
        }
        let metadata = match entry.metadata() {
            Ok(m) => m,
            Err(_) => continue,
        };
        files.insert(format!("/{text}"), Meta::of(&metadata));
    }
    Ok(files)
}

/// Removes the empty folders between `file`'s folder and `root` (after a delete or a move).
pub fn prune_empty_parents(root: &Path, file: &Path) {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(root) || std::fs::remove_dir(d).is_err() {
            return;
        }
        dir = d.parent();
    }
}

/// Watches `root` recursively; each batch of changes (not in `.raftbox/`, not a partial
/// download) sends one wake-up on `wake`. The watcher runs as long as the value lives.
pub fn watch(root: &Path, wake: tokio::sync::mpsc::Sender<()>) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let state_dir = root.join(STATE_DIR);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(event) => {
                event.paths.iter().any(|p| !p.starts_with(&state_dir) && !p.to_string_lossy().ends_with(TEMP_SUFFIX))
            }
            Err(_) => true,
        };
        if relevant {
            // Full: a wake-up is already pending, which is all that is needed.
            let _ = wake.try_send(());
        }
    })
    .context("start the file watcher")?;
    watcher.watch(root, notify::RecursiveMode::Recursive).with_context(|| format!("watch {}", root.display()))?;
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_lists_files_skips_ignored_and_removes_partial_downloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
        std::fs::create_dir_all(root.join(".raftbox")).expect("mkdir");
        std::fs::create_dir_all(root.join("build")).expect("mkdir");
        for (path, text) in
            [("top.txt", "1"), ("a/b/deep.txt", "22"), ("a/x.log", "3"), ("build/o", "4"), (".raftbox/state.redb", "5")]
        {
            std::fs::write(root.join(path), text).expect("write");
        }
        std::fs::write(root.join("a/.deep.txt.raftbox-tmp"), "partial").expect("write");
        let rules = Rules::parse("*.log\nbuild/\n").expect("rules");
        let files = walk(root, &rules).expect("walk");
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(names, vec!["/a/b/deep.txt", "/top.txt"]);
        assert_eq!(files["/a/b/deep.txt"].size, 2);
        assert!(!root.join("a/.deep.txt.raftbox-tmp").exists(), "a partial download is removed");
        std::fs::remove_file(root.join("a/b/deep.txt")).expect("rm");
        prune_empty_parents(root, &root.join("a/b/deep.txt"));
        assert!(!root.join("a/b").exists());
        assert!(root.join("a").exists(), "a folder still holding a file stays");
    }
}
