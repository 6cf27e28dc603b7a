//! The push half of a pass: what changed locally since it was synced goes up — edits and new
//! files (only the chunks the cluster lacks), renames (a new file with the content of a
//! vanished one), deletions (within the mass-delete guard). In a receive-only folder nothing
//! goes up: the changes are reported, and `--revert` puts the server's versions back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use futures::stream::{self, StreamExt as _};

use super::{Confirmation, Engine, Local, FILES_IN_FLIGHT};
use crate::sync_client::folder::{now_ns, Meta, Node, Walk};
use crate::sync_client::names::Rel;
use crate::sync_client::remote::{self, Access, Written};
use crate::sync_client::state::{Direction, Entry};
use crate::sync_client::transfer::{self, Content};

/// Files hashed at once while looking for what changed.
const HASHES_IN_FLIGHT: usize = 4;
/// Paths named in the log and the status for held deletions and unsent changes, at most.
const REPORTED_PATHS_MAX: usize = 50;
/// The deletions sent this long ago still count towards the mass-delete guard.
const DELETE_WINDOW: Duration = Duration::from_secs(60);

/// A local file to send: new, or changed since `entry`.
struct Edit {
    server: String,
    rel: Rel,
    entry: Option<Entry>,
    content: Content,
}

/// A synced file the walk no longer found.
struct Gone {
    server: String,
    rel: Rel,
    entry: Entry,
}

/// What changed locally.
#[derive(Default)]
struct Plan {
    edits: Vec<Edit>,
    renames: Vec<(Gone, Edit)>,
    gone: Vec<Gone>,
    /// Unchanged here, newer on the server (seen while the file was being edited).
    stale: Vec<(String, Rel, Meta)>,
}

impl Engine {
    /// What changed locally since the last sync, judged from `walk`.
    async fn plan(&self, walk: &Walk) -> anyhow::Result<Plan> {
        let entries: HashMap<String, Entry> = self.db.all()?.into_iter().collect();
        let now_ms = now_ns() / 1_000_000;
        let held: HashSet<String> = self
            .db
            .failures()?
            .into_iter()
            .filter(|(_, f)| f.direction == Direction::Up && f.retry_at_ms > now_ms)
            .map(|(path, _)| path)
            .collect();
        let window = self.folder.caps.racy_window_ns;
        let mut plan = Plan::default();
        let mut seen = HashSet::with_capacity(walk.files.len());
        let mut to_read = Vec::new();
        {
            let names = self.names();
            for (rel, meta) in &walk.files {
                let server = names.server_of(rel);
                seen.insert(server.clone());
                let entry = entries.get(&server);
                if held.contains(&server) || entry.is_some_and(|e| e.unverified) {
                    continue;
                }
                match entry {
                    Some(e) if e.unchanged(meta, window) => {
                        if e.stale {
                            plan.stale.push((server, rel.clone(), *meta));
                        }
                    }
                    _ => to_read.push((server, rel.clone(), entry.cloned(), *meta)),
                }
            }
        }
        let examined: Vec<anyhow::Result<(String, Rel, Option<Entry>, Local)>> = stream::iter(to_read)
            .map(|(server, rel, entry, meta)| async move {
                let local = self.examine_file(&server, &rel, entry.as_ref(), meta).await?;
                Ok((server, rel, entry, local))
            })
            .buffer_unordered(HASHES_IN_FLIGHT)
            .collect()
            .await;
        for examined in examined {
            match examined? {
                (server, rel, Some(e), Local::Unchanged(meta)) if e.stale => plan.stale.push((server, rel, meta)),
                (server, rel, entry, Local::Edited(content)) => plan.edits.push(Edit { server, rel, entry, content }),
                _ => {}
            }
        }
        // A file that failed to go up and is gone now (no entry, not here): over.
        for (path, failure) in self.db.failures()? {
            if failure.direction == Direction::Up && !seen.contains(&path) && !entries.contains_key(&path) {
                self.db.clear_failure(&path)?;
            }
        }
        let names = self.names();
        for (server, entry) in entries {
            if seen.contains(&server) || entry.unverified || held.contains(&server) {
                continue;
            }
            let Ok(rel) = names.local_of(&server) else { continue };
            if self.rules.ignored(rel.as_str(), false) || walk.is_blind(rel.as_str()) {
                continue;
            }
            plan.gone.push(Gone { server, rel, entry });
        }
        drop(names);
        match_renames(&mut plan);
        Ok(plan)
    }

    pub(super) async fn push(&self, walk: &Walk) -> anyhow::Result<()> {
        let mut plan = self.plan(walk).await?;
        for (server, rel, meta) in std::mem::take(&mut plan.stale) {
            let result = self.refresh(&server, &rel, Some(meta)).await;
            self.judge(&server, result)?;
        }
        for (from, to) in std::mem::take(&mut plan.renames) {
            let path = to.server.clone();
            let result = self.push_rename(from, to).await;
            self.judge(&path, result)?;
        }
        let results: Vec<(String, anyhow::Result<()>)> = stream::iter(std::mem::take(&mut plan.edits))
            .map(|edit| async move {
                let path = edit.server.clone();
                (path, self.push_commit(edit).await)
            })
            .buffer_unordered(FILES_IN_FLIGHT)
            .collect()
            .await;
        for (path, result) in results {
            self.judge(&path, result)?;
        }
        let total = self.db.count()?;
        let gone = self.guard(std::mem::take(&mut plan.gone), total);
        for g in gone {
            // Back since the walk (a save by rename, a file restored): not deleted.
            if !matches!(self.folder.node(&g.rel)?, Node::Missing) {
                continue;
            }
            let path = g.server.clone();
            let result = self.push_delete(&g.server, &g.rel, &g.entry).await;
            self.judge(&path, result)?;
        }
        Ok(())
    }

    /// A file's result: an unreachable cluster stops the pass, anything else is the file's
    /// own failure.
    fn judge(&self, path: &str, result: anyhow::Result<()>) -> anyhow::Result<()> {
        match result {
            Ok(()) => Ok(()),
            Err(e) if remote::unreachable(&e) => Err(e),
            Err(e) => self.fail(path, Direction::Up, &e, None),
        }
    }

    /// The mass-delete guard: `gone` if it is within the limits (or the user confirmed as
    /// many), else nothing, the deletions held and reported. The deletions sent in the last
    /// [`DELETE_WINDOW`] count too, so a folder emptied a little at a time (a slow `rm -r`, a
    /// folder moved away file by file) trips it as surely as one emptied at once.
    fn guard(&self, gone: Vec<Gone>, total: usize) -> Vec<Gone> {
        let n = gone.len();
        if n == 0 {
            return gone;
        }
        let now = Instant::now();
        let mut recent = self.recent_deletes.lock().unwrap_or_else(|e| e.into_inner());
        while recent.front().is_some_and(|(at, _)| now.duration_since(*at) > DELETE_WINDOW) {
            recent.pop_front();
        }
        let before: usize = recent.iter().map(|(_, count)| count).sum();
        let (deleting, out_of) = (before + n, total + before);
        let o = &self.options;
        let too_many = deleting > o.max_deletes
            || (deleting > super::DELETE_SHARE_FILES_MIN
                && (deleting as u64) * 100 > o.max_delete_percent * out_of as u64);
        let mut paths: Vec<String> = gone.iter().map(|g| g.server.clone()).collect();
        paths.sort();
        let fingerprint = held_fingerprint(&paths);
        let confirmed = match &*self.confirmed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Confirmation::Any) => true,
            Some(Confirmation::Held(f)) => *f == fingerprint,
            None => false,
        };
        if !too_many || confirmed {
            if too_many {
                eprintln!("sync: deleting {n} files on the server, as confirmed");
            }
            recent.push_back((now, n));
            return gone;
        }
        eprintln!(
            "sync: {n} of {total} synced files are gone from this folder{}; their deletion on the server is held \
             (more than the guard allows: --max-deletes {}, --max-delete-percent {}). If you meant it: `raftbox \
             sync confirm-deletes {}`; if not, put them back (`raftbox sync trash ls` lists what the client moved \
             there). First ones: {}",
            if before > 0 { format!(" ({before} more deleted in the last minute)") } else { String::new() },
            o.max_deletes,
            o.max_delete_percent,
            self.folder.path().display(),
            paths.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        );
        self.with_report(|r| {
            r.held_deletes = std::iter::once(format!("{n} deletions held"))
                .chain(paths.into_iter().take(REPORTED_PATHS_MAX))
                .collect();
            r.held_fingerprint = fingerprint;
        });
        Vec::new()
    }

    async fn push_commit(&self, edit: Edit) -> anyhow::Result<()> {
        let Edit { server, rel, entry, content } = edit;
        // A file never synced here, with a server version waiting to come down: the same
        // content is that version; other content goes up as a conflict against it (never on
        // base 0, which the server could take for a retry of its version 1).
        let waiting = match &entry {
            None => self.db.failure(&server)?.and_then(|f| f.change).filter(|c| !c.deleted),
            Some(_) => None,
        };
        if let Some(c) = &waiting {
            if c.chunks == content.chunks && c.executable == content.meta.executable {
                let recorded = Entry { local: self.alias_of(&server, &rel), ..content.entry(c.version) };
                self.db.settle(&server, &recorded)?;
                self.note_name(&server, &rel);
                return Ok(());
            }
        }
        let sent = transfer::upload(&self.remote, &self.folder, &rel, &content).await?;
        let base = match (&entry, &waiting) {
            (Some(e), _) => e.version,
            (None, Some(c)) => c.version.saturating_sub(1),
            (None, None) => 0,
        };
        let mtime_ms = content.meta.mtime_ns / 1_000_000;
        let (chunks, size, exec) = (&content.chunks, content.meta.size, content.meta.executable);
        match self.remote.commit(&server, chunks, size, mtime_ms, exec, base).await? {
            Written::Done(version) => {
                let recorded = Entry { local: self.alias_of(&server, &rel), ..content.entry(version) };
                self.db.settle(&server, &recorded)?;
                self.note_name(&server, &rel);
                eprintln!(
                    "sync: ↑ {server} v{version} ({} of {} chunks sent, {} bytes)",
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
                    "sync: ! {server} changed on the server too; this device's version is kept there as {}",
                    copy.as_deref().unwrap_or("a conflicted copy")
                );
                self.count(|t| t.conflicts += 1);
                self.refresh(&server, &rel, Some(content.meta)).await
            }
            Written::Gone => {
                self.mark_removed();
                Ok(())
            }
            Written::Forbidden => Err(anyhow!("refused: this folder is read-only for you now")),
            Written::Refused(why) => Err(anyhow!("refused by the server: {why}")),
        }
    }

    async fn push_rename(&self, from: Gone, to: Edit) -> anyhow::Result<()> {
        let written = self.remote.rename(&from.server, &to.server, from.entry.version, &to.content.chunks).await?;
        match written {
            Written::Done(version) => {
                let recorded = Entry { local: self.alias_of(&to.server, &to.rel), ..to.content.entry(version) };
                self.db.rename(&from.server, &to.server, &recorded)?;
                self.names().forget(&from.server);
                self.note_name(&to.server, &to.rel);
                eprintln!("sync: → {} → {} v{version}", from.server, to.server);
                self.count(|t| t.moved += 1);
                Ok(())
            }
            // `from` changed there, or `to` exists there: a new file and a delete instead.
            _ => {
                let (server, rel, entry) = (from.server, from.rel, from.entry);
                self.push_commit(to).await?;
                self.push_delete(&server, &rel, &entry).await
            }
        }
    }

    async fn push_delete(&self, server: &str, rel: &Rel, entry: &Entry) -> anyhow::Result<()> {
        match self.remote.delete(server, entry.version).await? {
            Written::Done(_) | Written::Gone => {
                self.db.remove(server)?;
                self.names().forget(server);
                eprintln!("sync: ✗ {server} (deleted here)");
                self.count(|t| t.deleted_there += 1);
                Ok(())
            }
            // Changed there since: the newer content comes back rather than being deleted.
            Written::Conflict { .. } => self.refresh(server, rel, None).await,
            Written::Forbidden => Err(anyhow!("refused: this folder is read-only for you now")),
            Written::Refused(why) => Err(anyhow!("refused by the server: {why}")),
        }
    }

    /// Brings the server's current version of `server` here (after a conflict, or when a
    /// newer version was seen while the local file was being edited), if the local file is
    /// still as `expected`.
    pub(super) async fn refresh(&self, server: &str, rel: &Rel, expected: Option<Meta>) -> anyhow::Result<()> {
        match self.remote.current_file(server).await? {
            Some(current) if !current.deleted => {
                self.download(&current, rel, expected, "replaced by the server's version").await.map(|_| ())
            }
            _ => match expected {
                Some(meta) => self.remove_local(server, rel, meta),
                None => self.db.remove(server),
            },
        }
    }

    /// A receive-only folder: local changes are reported, not sent; with `--revert` (on the
    /// first pass) the server's versions are put back, the local changes going to the trash.
    pub(super) async fn keep_receive_only(&self, walk: &Walk) -> anyhow::Result<()> {
        let plan = self.plan(walk).await?;
        for (server, rel, meta) in &plan.stale {
            let result = self.refresh(server, rel, Some(*meta)).await;
            self.judge(server, result)?;
        }
        let mut changed: Vec<(String, Rel, Option<Meta>, bool)> = Vec::new();
        for edit in plan.edits.iter().chain(plan.renames.iter().map(|(_, to)| to)) {
            changed.push((edit.server.clone(), edit.rel.clone(), Some(edit.content.meta), edit.entry.is_some()));
        }
        for gone in plan.gone.iter().chain(plan.renames.iter().map(|(from, _)| from)) {
            changed.push((gone.server.clone(), gone.rel.clone(), None, true));
        }
        if changed.is_empty() {
            return Ok(());
        }
        if self.revert.swap(false, Ordering::Relaxed) {
            for (server, rel, meta, synced) in changed {
                let result = match (meta, synced) {
                    (Some(meta), false) => {
                        self.folder.remove(&rel, meta, "reverted: a local file in a read-only folder").map(|_| ())
                    }
                    (expected, _) => self.refresh(&server, &rel, expected).await,
                };
                self.judge(&server, result)?;
            }
            eprintln!("sync: local changes reverted to the server's versions (the changed files are in the trash)");
            return Ok(());
        }
        let why = if self.access == Access::ReadOnly { "this folder is read-only for you" } else { "--receive-only" };
        eprintln!(
            "sync: {} local change(s) not sent ({why}); `raftbox sync {} --revert` puts the server's versions back",
            changed.len(),
            self.folder.path().display()
        );
        self.with_report(|r| {
            r.not_sent = changed.iter().take(REPORTED_PATHS_MAX).map(|(server, ..)| server.clone()).collect();
        });
        Ok(())
    }
}

/// Names a set of held deletions (sorted paths).
fn held_fingerprint(paths: &[String]) -> String {
    let mut hasher = blake3::Hasher::new();
    for path in paths {
        hasher.update(&(path.len() as u64).to_be_bytes());
        hasher.update(path.as_bytes());
    }
    hasher.finalize().to_hex()[..32].to_string()
}

/// Pairs each new local file with a vanished synced one of the very same content: a rename.
fn match_renames(plan: &mut Plan) {
    let mut by_content: HashMap<&[String], Vec<usize>> = HashMap::new();
    for (i, gone) in plan.gone.iter().enumerate() {
        if !gone.entry.chunks.is_empty() {
            by_content.entry(gone.entry.chunks.as_slice()).or_default().push(i);
        }
    }
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for (j, edit) in plan.edits.iter().enumerate() {
        if edit.entry.is_some() || edit.content.chunks.is_empty() {
            continue;
        }
        if let Some(i) = by_content.get_mut(edit.content.chunks.as_slice()).and_then(Vec::pop) {
            taken.push((i, j));
        }
    }
    if taken.is_empty() {
        return;
    }
    let mut gone: Vec<Option<Gone>> = std::mem::take(&mut plan.gone).into_iter().map(Some).collect();
    let mut edits: Vec<Option<Edit>> = std::mem::take(&mut plan.edits).into_iter().map(Some).collect();
    for (i, j) in taken {
        if let (Some(from), Some(to)) = (gone[i].take(), edits[j].take()) {
            plan.renames.push((from, to));
        }
    }
    plan.gone = gone.into_iter().flatten().collect();
    plan.edits = edits.into_iter().flatten().collect();
}
