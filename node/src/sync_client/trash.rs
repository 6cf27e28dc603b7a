//! The local trash, `DIR/.raftbox/trash/`: every local file the client replaces or deletes
//! is moved here (a rename, on the folder's own file system), never unlinked, and kept for
//! `--trash-days` days. Each item is the file itself, named by its id (`<ms>-<random>`, so
//! they sort by age), beside `<id>.json` saying where it was and why it was moved.
//! `raftbox sync trash ls|restore` reads and restores them whether or not a client runs.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use super::folder::{now_ns, Meta};
use super::names::Rel;

/// Items removed per purge, at most (a purge runs every pass).
const PURGE_ITEMS_MAX: usize = 1_000;

/// What `<id>.json` says of an item.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Label {
    /// Where the file was, relative to the synced folder.
    pub path: String,
    pub reason: String,
    /// When it was moved here, ms since the epoch.
    pub trashed_ms: u64,
}

/// An item of the trash.
#[derive(Debug, Clone)]
pub struct Item {
    pub id: String,
    pub label: Label,
    pub size: u64,
}

pub struct Trash {
    dir: OwnedFd,
    days: u64,
}

fn io(errno: Errno, what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::from(errno)).context(what.to_string())
}

impl Trash {
    pub fn open(dir: OwnedFd, days: u64) -> Trash {
        Trash { dir, days }
    }

    /// The trash of the synced folder at `folder`, for the `trash` commands.
    pub fn at(folder: &Path) -> anyhow::Result<Trash> {
        let path = folder.join(super::names::STATE_DIR).join("trash");
        let dir = rfs::open(&path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(std::io::Error::from)
            .with_context(|| format!("open the trash {}", path.display()))?;
        Ok(Trash { dir, days: 0 })
    }

    fn new_id() -> String {
        format!("{:013}-{:08x}", now_ns() / 1_000_000, rand::random::<u32>())
    }

    fn label(&self, id: &str, rel: &Rel, why: &str) -> anyhow::Result<()> {
        let label = Label { path: rel.as_str().to_string(), reason: why.to_string(), trashed_ms: now_ns() / 1_000_000 };
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(&self.dir, format!("{id}.json").as_str(), flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io(e, "label a trash item"))?;
        std::io::Write::write_all(&mut std::fs::File::from(fd), &serde_json::to_vec(&label)?)
            .context("label a trash item")?;
        Ok(())
    }

    /// Moves `name` (in `dir`, the file of `rel`) here; its id.
    pub fn put(&self, dir: &impl AsFd, name: &str, rel: &Rel, why: &str) -> anyhow::Result<String> {
        let id = Trash::new_id();
        self.label(&id, rel, why)?;
        match rfs::renameat(dir, name, &self.dir, id.as_str()) {
            Ok(()) => Ok(id),
            Err(e) => {
                let _ = rfs::unlinkat(&self.dir, format!("{id}.json").as_str(), AtFlags::empty());
                if e == Errno::XDEV {
                    bail!("{rel} is on another file system than the folder's trash: left in place");
                }
                Err(io(e, &format!("move {rel} to the trash")))
            }
        }
    }

    /// Keeps the file `name` (in `dir`) here too, as a second name of the same file.
    pub fn link(&self, dir: &impl AsFd, name: &str, rel: &Rel, why: &str) -> anyhow::Result<String> {
        let id = Trash::new_id();
        self.label(&id, rel, why)?;
        rfs::linkat(dir, name, &self.dir, id.as_str(), AtFlags::empty())
            .map_err(|e| io(e, &format!("keep {rel} in the trash")))?;
        Ok(id)
    }

    /// Keeps a copy of the file `name` (in `dir`) here (where hard links are not supported).
    pub fn copy(&self, dir: &impl AsFd, name: &str, rel: &Rel, why: &str) -> anyhow::Result<String> {
        let id = Trash::new_id();
        self.label(&id, rel, why)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let from = rfs::openat(dir, name, flags, Mode::empty()).map_err(|e| io(e, &format!("read {rel}")))?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let to = rfs::openat(&self.dir, id.as_str(), flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io(e, "create a trash item"))?;
        let mut to = std::fs::File::from(to);
        std::io::copy(&mut std::fs::File::from(from), &mut to).with_context(|| format!("keep {rel} in the trash"))?;
        to.sync_all()?;
        Ok(id)
    }

    /// Forgets item `id` (a copy not needed after all).
    pub fn discard(&self, id: &str) {
        let _ = rfs::unlinkat(&self.dir, id, AtFlags::empty());
        let _ = rfs::unlinkat(&self.dir, format!("{id}.json").as_str(), AtFlags::empty());
    }

    /// The metadata of item `id`'s file.
    pub fn meta(&self, id: &str) -> anyhow::Result<Option<Meta>> {
        match rfs::statat(&self.dir, id, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Meta::of(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io(e, "stat a trash item")),
        }
    }

    /// Moves item `id` back to `name` in `dir`, unless something is there now (then it
    /// stays here and the caller is told).
    pub fn put_back(&self, id: &str, dir: &impl AsFd, name: &str) -> anyhow::Result<bool> {
        match rfs::renameat_with(&self.dir, id, dir, name, RenameFlags::NOREPLACE) {
            Ok(()) => {
                let _ = rfs::unlinkat(&self.dir, format!("{id}.json").as_str(), AtFlags::empty());
                Ok(true)
            }
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(io(e, "move a file back from the trash")),
        }
    }

    /// Every item, oldest first (an item whose label was lost in a crash is listed too,
    /// with its place unknown).
    pub fn list(&self) -> anyhow::Result<Vec<Item>> {
        let mut items = Vec::new();
        for entry in rfs::Dir::read_from(&self.dir).map_err(|e| io(e, "read the trash"))? {
            let entry = entry.map_err(|e| io(e, "read the trash"))?;
            let Ok(name) = entry.file_name().to_str() else { continue };
            if name == "." || name == ".." || name.ends_with(".json") {
                continue;
            }
            let Some(meta) = self.meta(name)? else { continue };
            let label = self.read_label(name).unwrap_or_else(|| Label {
                path: "(unknown: its label was lost)".into(),
                reason: "unknown".into(),
                trashed_ms: meta.ctime_ns / 1_000_000,
            });
            items.push(Item { id: name.to_string(), label, size: meta.size });
        }
        items.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(items)
    }

    fn read_label(&self, id: &str) -> Option<Label> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(&self.dir, format!("{id}.json").as_str(), flags, Mode::empty()).ok()?;
        serde_json::from_reader::<_, Label>(std::fs::File::from(fd)).ok()
    }

    /// Deletes what has been here longer than the kept days (at most [`PURGE_ITEMS_MAX`] a
    /// call), labels without a file included; how many went.
    pub fn purge(&self) -> anyhow::Result<usize> {
        let cutoff_ms = (now_ns() / 1_000_000).saturating_sub(self.days.saturating_mul(86_400_000));
        let mut removed = 0;
        for entry in rfs::Dir::read_from(&self.dir).map_err(|e| io(e, "read the trash"))? {
            let entry = entry.map_err(|e| io(e, "read the trash"))?;
            let Ok(name) = entry.file_name().to_str() else { continue };
            let Some(ms) = name.split('-').next().and_then(|ms| ms.parse::<u64>().ok()) else { continue };
            if ms >= cutoff_ms || removed >= PURGE_ITEMS_MAX {
                continue;
            }
            if rfs::unlinkat(&self.dir, name, AtFlags::empty()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Restores item `id` into the folder whose top is `root` at `to` (its own path by
    /// default), never over an existing file; where it went.
    pub fn restore(&self, root: &Path, id: &str, to: Option<&str>) -> anyhow::Result<String> {
        let item = self.list()?.into_iter().find(|i| i.id == id).with_context(|| format!("no trash item {id}"))?;
        if to.is_none() && self.read_label(id).is_none() {
            bail!("where {id} was is not known (its label was lost): give a place with --to");
        }
        let target = Rel::parse(to.unwrap_or(&item.label.path).trim_start_matches('/'))
            .map_err(|e| anyhow::anyhow!("cannot restore there: {e}"))?;
        let folder = super::folder::Folder::open(root, self.days)?;
        let dir = folder.open_dir(target.parent(), true)?;
        if !self.put_back(id, &dir, target.name())? {
            bail!("{target} exists; give another place with --to");
        }
        Ok(target.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync_client::folder::{ensure_dir, Folder};

    #[test]
    fn a_trashed_file_is_listed_restored_and_purged_after_its_days() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("docs")).expect("mkdir");
        std::fs::write(root.join("docs/a.txt"), "keep me").expect("write");
        let folder = Folder::open(root, 30).expect("open");
        let rel = Rel::parse("docs/a.txt").expect("rel");
        let docs = folder.open_dir("docs", false).expect("docs");
        let id = folder.trash.put(&docs, "a.txt", &rel, "deleted on the server").expect("trash");
        assert!(!root.join("docs/a.txt").exists());
        let items = Trash::at(root).expect("trash").list().expect("list");
        assert_eq!(items.len(), 1);
        assert_eq!((items[0].label.path.as_str(), items[0].size), ("docs/a.txt", 7));
        // Something is at the old place now: restoring there is refused, elsewhere it works.
        std::fs::write(root.join("docs/a.txt"), "new").expect("write");
        assert!(folder.trash.restore(root, &id, None).is_err());
        let went = folder.trash.restore(root, &id, Some("docs/a (restored).txt")).expect("restore");
        assert_eq!(went, "docs/a (restored).txt");
        assert_eq!(std::fs::read_to_string(root.join("docs/a (restored).txt")).expect("read"), "keep me");
        assert!(folder.trash.list().expect("list").is_empty());
        // Purge: an item older than the kept days goes, a new one stays.
        let trash = Trash::open(ensure_dir(&folder.open_dir(".raftbox", false).expect("s"), "trash").expect("t"), 1);
        std::fs::write(root.join(".raftbox/trash/0000000000001-00000000"), "ancient").expect("write");
        std::fs::write(root.join("docs/b.txt"), "b").expect("write");
        trash.put(&docs, "b.txt", &Rel::parse("docs/b.txt").expect("rel"), "replaced").expect("trash");
        assert_eq!(trash.purge().expect("purge"), 1);
        assert_eq!(trash.list().expect("list").len(), 1);
    }
}
