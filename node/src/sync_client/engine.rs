//! One sync pass: pull (the change feed from the saved cursor, applied where the local file
//! is unchanged since it was synced), push (local files that changed since, renames, deletes),
//! then pull again when anything went up (conflicted copies, the cursor past our commits).
//!
//! The rule that keeps edits: a remote version replaces a local file only if the local file
//! is still exactly what was last synced (size and mtime, else its chunks), checked again
//! just before the rename. A local edit is always committed on the version it was based on;
//! if the file changed on the server meanwhile, the server keeps the edit as a conflicted copy
//! (which then syncs down) and only then does the current version replace the local file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use futures::stream::{self, StreamExt as _};

use super::ignore_rules::Rules;
use super::remote::{Change, Remote, Written};
use super::scan::{self, local_path, Meta};
use super::state::{Entry, StateDb};
use super::transfer::{self, Content, ReuseIndex};

/// Files uploaded and committed at once.
const FILES_IN_FLIGHT: usize = 4;

/// What a pass did, for the progress line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub up_files: u64,
    pub up_chunks: u64,
    pub up_bytes: u64,
    pub down_files: u64,
    pub down_chunks: u64,
    pub down_bytes: u64,
    pub reused_chunks: u64,
    pub moved: u64,
    pub deleted_here: u64,
    pub deleted_there: u64,
    pub conflicts: u64,
    pub failed: u64,
}

impl Tally {
    pub fn any(&self) -> bool {
        self.up_files + self.down_files + self.moved + self.deleted_here + self.deleted_there + self.conflicts > 0
    }
}

/// The local file as compared with what was last synced.
enum Local {
    Missing,
    /// Exactly as synced (its size and mtime now).
    Unchanged(Meta),
    /// Different from what was synced (or never synced): its content.
    Edited(Content),
    /// Being written right now: looked at again on the next pass.
    Busy,
}

pub struct Engine {
    root: PathBuf,
    db: StateDb,
    remote: Arc<Remote>,
    namespace: String,
    rules: Rules,
    tally: Mutex<Tally>,
}

impl Engine {
    pub fn new(root: PathBuf, db: StateDb, remote: Arc<Remote>, namespace: String) -> anyhow::Result<Engine> {
        let rules = Rules::load(&root)?;
        Ok(Engine { root, db, remote, namespace, rules, tally: Mutex::new(Tally::default()) })
    }

    pub fn cursor(&self) -> anyhow::Result<String> {
        self.db.cursor()
    }

    fn count(&self, add: impl FnOnce(&mut Tally)) {
        add(&mut self.tally.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// One pass; an error when the cluster could not be reached or some file did not sync
    /// (what did sync is kept, and the next pass carries on from there).
    pub async fn pass(&mut self) -> anyhow::Result<Tally> {
        self.rules = Rules::load(&self.root)?;
        *self.tally.lock().unwrap_or_else(|e| e.into_inner()) = Tally::default();
        self.pull().await?;
        self.push().await?;
        let tally = *self.tally.lock().unwrap_or_else(|e| e.into_inner());
        if tally.up_files + tally.moved + tally.deleted_there + tally.conflicts > 0 {
            self.pull().await?;
        }
        let tally = *self.tally.lock().unwrap_or_else(|e| e.into_inner());
        if tally.failed > 0 {
            bail!("{} file(s) did not sync this pass (see above)", tally.failed);
        }
        Ok(tally)
    }

    async fn pull(&self) -> anyhow::Result<()> {
        loop {
            let cursor = self.db.cursor()?;
            let Some(page) = self.remote.changes(&cursor).await? else {
                eprintln!("sync: the server cannot continue from the saved cursor; reading the whole tree again");
                self.db.set_cursor("0")?;
                continue;
            };
            let reuse = ReuseIndex::new(&self.root, &self.db.all()?);
            for change in page.changes.iter().filter(|c| c.namespace_id == self.namespace) {
                if change.namespace_removed {
                    bail!("namespace {} can no longer be read with this token", self.namespace);
                }
                if self.rules.ignored(&change.path, false) {
                    continue;
                }
                self.apply_remote(change, &reuse).await.with_context(|| format!("bring down {}", change.path))?;
            }
            self.db.set_cursor(&page.cursor)?;
            if !page.has_more {
                return Ok(());
            }
        }
    }

    /// How the local file at `path` stands against `entry` (what was last synced).
    async fn local_state(&self, path: &str, entry: Option<&Entry>) -> anyhow::Result<Local> {
        let target = local_path(&self.root, path);
        let Some(meta) = Meta::read(&target)? else { return Ok(Local::Missing) };
        if entry.is_some_and(|e| e.size == meta.size && e.mtime_ns == meta.mtime_ns) {
            return Ok(Local::Unchanged(meta));
        }
        let Some(content) = transfer::read_content(&target).await? else { return Ok(Local::Busy) };
        match entry {
            // Touched, not changed: remember the new mtime.
            Some(e) if e.chunks == content.chunks => {
                self.db.put(path, &Entry { stale: e.stale, ..content.entry(e.version) })?;
                Ok(Local::Unchanged(content.meta))
            }
            _ => Ok(Local::Edited(content)),
        }
    }

    async fn apply_remote(&self, change: &Change, reuse: &ReuseIndex) -> anyhow::Result<()> {
        let path = change.path.as_str();
        let entry = self.db.get(path)?;
        if entry.as_ref().is_some_and(|e| e.version >= change.version) {
            return Ok(());
        }
        match self.local_state(path, entry.as_ref()).await? {
            Local::Missing if change.deleted => self.db.remove(path),
            // Gone here, changed there: the newer content wins over the delete.
            Local::Missing => self.download(path, &change.chunks, change.version, None, reuse).await,
            Local::Unchanged(meta) if change.deleted => self.remove_local(path, meta),
            Local::Unchanged(meta) => self.download(path, &change.chunks, change.version, Some(meta), reuse).await,
            Local::Edited(content) if !change.deleted && content.chunks == change.chunks => {
                self.db.put(path, &content.entry(change.version))
            }
            // Edited here, deleted there: the edit survives, as a new file.
            Local::Edited(_) if change.deleted => self.db.remove(path),
            // Edited on both sides: the push sends this edit on its base version, the server
            // keeps it as a conflicted copy, then the current version comes down.
            Local::Edited(_) | Local::Busy => match entry {
                Some(e) => self.db.put(path, &Entry { stale: true, ..e }),
                None => Ok(()),
            },
        }
    }

    /// Writes version `version` (`chunks`) of `path` if the local file is still as
    /// `expected`; if it changed meanwhile, it is left alone and marked stale.
    async fn download(
        &self,
        path: &str,
        chunks: &[String],
        version: u64,
        expected: Option<Meta>,
        reuse: &ReuseIndex,
    ) -> anyhow::Result<()> {
        let target = local_path(&self.root, path);
        let pending = |content: &Content| self.db.put_pending(path, &content.entry(version));
        let written = transfer::write_file(&self.remote, reuse, &target, chunks, expected, pending).await;
        let written = match written {
            Ok(written) => written,
            Err(e) => {
                // Not renamed into place (or not known to be): a pending entry the file does
                // not show is dropped when the client starts again, and the file re-examined.
                let _ = self.db.drop_pending(path).map_err(|_| ());
                return Err(e);
            }
        };
        match written {
            Some((content, fetched)) => {
                self.db.settle(path, &content.entry(version))?;
                eprintln!(
                    "sync: ↓ {path} v{version} ({} of {} chunks fetched, {} bytes)",
                    fetched.chunks,
                    chunks.len(),
                    fetched.bytes
                );
                self.count(|t| {
                    t.down_files += 1;
                    t.down_chunks += fetched.chunks;
                    t.down_bytes += fetched.bytes;
                    t.reused_chunks += fetched.reused;
                });
                Ok(())
            }
            None => match self.db.get(path)? {
                Some(e) => self.db.put(path, &Entry { stale: true, ..e }),
                None => Ok(()),
            },
        }
    }

    /// Deletes the local file of `path` (deleted on the server) if it still is as `meta`.
    fn remove_local(&self, path: &str, meta: Meta) -> anyhow::Result<()> {
        let target = local_path(&self.root, path);
        if Meta::read(&target)? != Some(meta) {
            return Ok(());
        }
        std::fs::remove_file(&target).with_context(|| format!("delete {}", target.display()))?;
        scan::prune_empty_parents(&self.root, &target);
        self.db.remove(path)?;
        eprintln!("sync: ✗ {path} (deleted on the server)");
        self.count(|t| t.deleted_here += 1);
        Ok(())
    }

    /// Brings the server's current version of `path` here (after a conflict, or when a newer
    /// version was seen while the local file was being edited), if the local file is still
    /// as `expected`.
    async fn refresh(&self, path: &str, expected: Option<Meta>, reuse: &ReuseIndex) -> anyhow::Result<()> {
        match self.remote.current_file(path).await? {
            Some(current) => self.download(path, &current.chunks, current.version, expected, reuse).await,
            None => match expected {
                Some(meta) => self.remove_local(path, meta),
                None => self.db.remove(path),
            },
        }
    }

    async fn push(&self) -> anyhow::Result<()> {
        let files = scan::walk(&self.root, &self.rules)?;
        let all = self.db.all()?;
        let reuse = ReuseIndex::new(&self.root, &all);
        let entries: BTreeMap<String, Entry> = all.into_iter().collect();
        let mut edited: Vec<(String, Option<Entry>, Content)> = Vec::new();
        for (path, meta) in &files {
            let entry = entries.get(path);
            let state = match entry {
                Some(e) if e.size == meta.size && e.mtime_ns == meta.mtime_ns => Local::Unchanged(*meta),
                _ => self.local_state(path, entry).await?,
            };
            match state {
                Local::Unchanged(meta) if entry.is_some_and(|e| e.stale) => {
                    self.refresh(path, Some(meta), &reuse).await?;
                }
                Local::Edited(content) => edited.push((path.clone(), entry.cloned(), content)),
                Local::Unchanged(_) | Local::Missing | Local::Busy => {}
            }
        }
        // Synced files no longer here were deleted (or renamed) here.
        let mut gone: Vec<(String, Entry)> = entries
            .into_iter()
            .filter(|(path, _)| !files.contains_key(path) && !self.rules.ignored(path, false))
            .collect();
        // A new file with the very content of a gone one is that file renamed.
        let mut renames = Vec::new();
        edited.retain(|(path, entry, content)| {
            if entry.is_some() || content.chunks.is_empty() {
                return true;
            }
            match gone.iter().position(|(_, e)| e.chunks == content.chunks) {
                Some(i) => {
                    renames.push((gone.remove(i), path.clone(), content.clone()));
                    false
                }
                None => true,
            }
        });
        for ((from, entry), to, content) in renames {
            self.report(&to, self.push_rename(&from, &entry, &to, content, &reuse).await);
        }
        let results: Vec<(String, anyhow::Result<()>)> = stream::iter(edited)
            .map(|(path, entry, content)| {
                let reuse = &reuse;
                async move {
                    let result = self.push_commit(&path, entry.as_ref(), content, reuse).await;
                    (path, result)
                }
            })
            .buffer_unordered(FILES_IN_FLIGHT)
            .collect()
            .await;
        for (path, result) in results {
            self.report(&path, result);
        }
        for (path, entry) in gone {
            self.report(&path, self.push_delete(&path, &entry, &reuse).await);
        }
        Ok(())
    }

    /// Counts and tells a file that did not sync this pass.
    fn report(&self, path: &str, result: anyhow::Result<()>) {
        if let Err(error) = result {
            eprintln!("sync: {path}: {error:#}");
            self.count(|t| t.failed += 1);
        }
    }

    async fn push_commit(
        &self,
        path: &str,
        entry: Option<&Entry>,
        content: Content,
        reuse: &ReuseIndex,
    ) -> anyhow::Result<()> {
        let target = local_path(&self.root, path);
        let sent = transfer::upload(&self.remote, &target, &content).await?;
        let base = entry.map_or(0, |e| e.version);
        let mtime_ms = content.meta.mtime_ns / 1_000_000;
        match self.remote.commit(path, &content.chunks, content.meta.size, mtime_ms, base).await? {
            Written::Done(version) => {
                self.db.put(path, &content.entry(version))?;
                eprintln!(
                    "sync: ↑ {path} v{version} ({} of {} chunks sent, {} bytes)",
                    sent.chunks,
                    content.chunks.len(),
                    sent.bytes
                );
                self.count(|t| {
                    t.up_files += 1;
                    t.up_chunks += sent.chunks;
                    t.up_bytes += sent.bytes;
                });
                Ok(())
            }
            Written::Conflict { copy } => {
                eprintln!(
                    "sync: ! {path} changed on the server too; this device's version is kept as {}",
                    copy.as_deref().unwrap_or("a conflicted copy")
                );
                self.count(|t| t.conflicts += 1);
                self.refresh(path, Some(content.meta), reuse).await
            }
            Written::Gone => bail!("the server refused the commit as not found"),
        }
    }

    async fn push_rename(
        &self,
        from: &str,
        entry: &Entry,
        to: &str,
        content: Content,
        reuse: &ReuseIndex,
    ) -> anyhow::Result<()> {
        match self.remote.rename(from, to, entry.version, &content.chunks).await? {
            Written::Done(version) => {
                self.db.rename(from, to, &content.entry(version))?;
                eprintln!("sync: → {from} → {to} v{version}");
                self.count(|t| t.moved += 1);
                Ok(())
            }
            // `from` changed there, or `to` exists there: a new file and a delete instead.
            Written::Conflict { .. } | Written::Gone => {
                self.push_commit(to, None, content, reuse).await?;
                self.push_delete(from, entry, reuse).await
            }
        }
    }

    async fn push_delete(&self, path: &str, entry: &Entry, reuse: &ReuseIndex) -> anyhow::Result<()> {
        match self.remote.delete(path, entry.version).await? {
            Written::Done(_) | Written::Gone => {
                self.db.remove(path)?;
                eprintln!("sync: ✗ {path} (deleted here)");
                self.count(|t| t.deleted_there += 1);
                Ok(())
            }
            // Changed there since: the newer content comes back rather than being deleted.
            Written::Conflict { .. } => self.refresh(path, None, reuse).await,
        }
    }
}
