//! One sync pass: check the folder is still the one set up, pull (the change feed from the
//! saved cursor), retry the files that failed and are due, push (local files that changed
//! since, renames, deletes), then pull again when anything went up.
//!
//! The rules that keep every byte:
//! - a remote version replaces a local file only if it is still exactly what was last synced
//!   (checked before, and after, an atomic swap; what it replaces goes to the trash);
//! - a local edit is committed on the version it was based on, so an edit made on the
//!   server meanwhile makes the server keep it as a conflicted copy;
//! - a file is deleted on the server only when the walk saw the folder and not the file:
//!   never while the folder is missing or replaced, never beneath a link or an unreadable
//!   folder, and never more than the mass-delete guard allows without a confirmation;
//! - one file that fails (a name too long, a folder in the way, a refusal) is recorded with
//!   why, tried again later, and never stops the rest: the cursor moves on;
//! - after a cursor reset the server's whole tree is compared by content, never by version
//!   number, so local content the server lacks goes up.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use futures::stream::{self, StreamExt as _};

use super::folder::{now_ns, Folder, Meta, Node, Swap, Walk};
use super::ignore_rules::Rules;
use super::local_names::LocalNames;
use super::names::Rel;
use super::remote::{self, Access, Change, Remote};
use super::state::{Direction, Entry, Failure, StateDb};
use super::transfer::{self, Content, ReuseIndex};

/// Files transferred at once.
pub const FILES_IN_FLIGHT: usize = 8;
/// The chunk list of an entry whose content is not known (see [`Act::SendOver`]): no local
/// file's chunks are ever equal to it.
const UNKNOWN_CONTENT: &str = "-";
/// Cursor resets (410) taken in one pass before it gives up.
const RESETS_PER_PASS_MAX: usize = 2;
/// Local files remembered as read and changed (not yet sent: receive-only, held, failed),
/// so they are not read again while their metadata stays the same.
const EXAMINED_FILES_MAX: usize = 100_000;

/// What a pass did, for the progress line and the status.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// Files being written as the pass looked: looked at again shortly.
    pub busy: u64,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Tally) {
        self.up_files += other.up_files;
        self.up_chunks += other.up_chunks;
        self.up_bytes += other.up_bytes;
        self.down_files += other.down_files;
        self.down_chunks += other.down_chunks;
        self.down_bytes += other.down_bytes;
        self.reused_chunks += other.reused_chunks;
        self.moved += other.moved;
        self.deleted_here += other.deleted_here;
        self.deleted_there += other.deleted_there;
        self.conflicts += other.conflicts;
        self.failed += other.failed;
        self.busy += other.busy;
    }

    pub fn any(&self) -> bool {
        self.up_files + self.down_files + self.moved + self.deleted_here + self.deleted_there + self.conflicts > 0
    }

    fn sent_anything(&self) -> bool {
        self.up_files + self.moved + self.deleted_there + self.conflicts > 0
    }
}

/// What the status shows beside the failures: what a pass could not or would not do.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Paths the walk could not see into, with why (nothing beneath them synced either way).
    pub blind: Vec<(String, String)>,
    /// Local names not synced, with why.
    pub skipped: Vec<(String, String)>,
    /// Deletions held by the mass-delete guard: a count line, then the first paths.
    pub held_deletes: Vec<String>,
    /// Names the held set, for `raftbox sync confirm-deletes` to confirm exactly it.
    #[serde(default)]
    pub held_fingerprint: String,
    /// Local changes not sent because the folder is read-only here.
    pub not_sent: Vec<String>,
}

/// How a pass ended.
#[derive(Debug)]
pub enum PassEnd {
    Synced(Tally),
    /// Nothing was done, and why (the folder is missing or replaced, the ignore file is
    /// invalid): the client checks again and goes on by itself once it is put right.
    Paused(String),
    /// The namespace can no longer be read: the client stops, keeping the local files.
    Removed(String),
}

/// The user's choices for the pass.
#[derive(Debug, Clone)]
pub struct Options {
    /// Send nothing (`--receive-only`, or a viewer's folder).
    pub receive_only: bool,
    /// In a receive-only folder, put the server's versions back over local changes.
    pub revert: bool,
    /// The mass-delete guard: a pass deleting more than this many files on the server…
    pub max_deletes: usize,
    /// …or more than this share (percent) of the synced files, once above
    /// [`DELETE_SHARE_FILES_MIN`], stops and asks.
    pub max_delete_percent: u64,
}

/// What the user confirmed of the deletions the guard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// Any deletions (`--confirm-deletes`, for the first pass).
    Any,
    /// Exactly the held set with this fingerprint (`raftbox sync confirm-deletes`).
    Held(String),
}

/// The guard's share rule applies from this many deletions on.
pub const DELETE_SHARE_FILES_MIN: usize = 10;

/// The local file as compared with what was last synced.
#[derive(Debug)]
pub(crate) enum Local {
    Missing,
    /// Exactly as synced (its metadata now).
    Unchanged(Meta),
    /// Different from what was synced (or never synced): its content.
    Edited(Content),
    /// Being written right now: looked at again on the next pass.
    Busy,
    /// Not a regular file, or behind a link or a folder that cannot be entered: why.
    Other(String),
}

/// What a remote change does to the local file.
#[derive(Debug, PartialEq)]
pub(crate) enum Act {
    /// The local file already holds the change: record it.
    Record,
    /// Not synced any more (deleted on both sides, or a local edit of a file deleted on the
    /// server, which goes up as a new file).
    Forget,
    /// Put the change's version in place of the local file as it is now (`None`: absent).
    Download(Option<Meta>),
    /// Delete the local file (to the trash) if it is still as it is now.
    Remove(Meta),
    /// Keep the local edit; the push commits it on its base version (a conflict there).
    Stale,
    /// Keep the local content and send it on top of version `base` (the server lacks it).
    SendOver(u64),
    /// Cannot be applied here: why.
    Fail(String),
}

/// What `change` does to the local file in state `local`, last synced as `entry`. Pure.
/// `server_had_local` matters after a cursor reset only: whether the server's history of the
/// file holds the content this device last synced (if not, the server never had it, or lost
/// it, and it must go up rather than be replaced).
pub(crate) fn decide(
    entry: Option<&Entry>,
    local: &Local,
    c: &Change,
    receive_only: bool,
    server_had_local: bool,
) -> Act {
    // A version this device would send as a conflict: on a base just below the server's,
    // which the server refuses as stale and keeps as a conflicted copy.
    let as_conflict = Act::SendOver(c.version.saturating_sub(1));
    match local {
        Local::Other(_) if c.deleted => Act::Forget,
        Local::Other(why) => Act::Fail(why.clone()),
        Local::Missing if c.deleted => Act::Forget,
        Local::Missing => Act::Download(None),
        Local::Busy => Act::Stale,
        Local::Unchanged(meta) => match entry {
            // Judged by content after a cursor reset: the version numbers may not compare.
            Some(e) if e.unverified => {
                let same = !c.deleted && e.chunks == c.chunks && e.executable == c.executable;
                match () {
                    _ if same => Act::Record,
                    // The server had this content and moved on from it.
                    _ if server_had_local && c.deleted => Act::Remove(*meta),
                    _ if server_had_local => Act::Download(Some(*meta)),
                    // The server never had it, or lost it: it goes up.
                    _ if c.deleted => Act::SendOver(c.version),
                    _ if receive_only => Act::Download(Some(*meta)),
                    _ => as_conflict,
                }
            }
            _ if c.deleted => Act::Remove(*meta),
            _ => Act::Download(Some(*meta)),
        },
        Local::Edited(content) => {
            let same_chunks = !c.deleted && content.chunks == c.chunks;
            if same_chunks && content.meta.executable == c.executable {
                Act::Record
            } else if same_chunks && !receive_only {
                // Only the execute bit differs: sent on the current version.
                Act::SendOver(c.version)
            } else if c.deleted {
                Act::Forget
            } else if receive_only {
                Act::Download(Some(content.meta))
            } else if entry.is_some_and(|e| !e.unverified) {
                Act::Stale
            } else {
                // Never synced here (or not since a reset): sent as a conflict, so the
                // server keeps it as a conflicted copy and its own version stays current.
                as_conflict
            }
        }
    }
}

pub struct Engine {
    pub folder: Folder,
    pub db: StateDb,
    remote: Arc<Remote>,
    namespace: String,
    /// The personal namespace (always writable) or a shared folder.
    personal: bool,
    pub options: Options,
    rules: Rules,
    pub access: Access,
    names: Mutex<LocalNames>,
    reuse: tokio::sync::RwLock<Option<ReuseIndex>>,
    tally: Mutex<Tally>,
    report: Mutex<Report>,
    /// Deletions the user confirmed, for the next pass only.
    pub confirmed: Mutex<Option<Confirmation>>,
    /// `--revert`, still to do (on the first pass).
    revert: AtomicBool,
    /// Deletions sent lately, for the mass-delete guard: when, how many.
    recent_deletes: Mutex<VecDeque<(std::time::Instant, usize)>>,
    /// Local files read and found changed, by server path (see [`EXAMINED_FILES_MAX`]).
    examined: Mutex<HashMap<String, Content>>,
    /// The namespace went away during the pass (a commit answered 404).
    removed: Mutex<Option<String>>,
}

impl Engine {
    pub fn new(
        folder: Folder,
        db: StateDb,
        remote: Arc<Remote>,
        namespace: String,
        personal: bool,
        options: Options,
    ) -> anyhow::Result<Engine> {
        Ok(Engine {
            folder,
            db,
            remote,
            namespace,
            personal,
            options: options.clone(),
            rules: Rules::parse("")?,
            access: Access::ReadWrite,
            names: Mutex::new(LocalNames::default()),
            reuse: tokio::sync::RwLock::new(None),
            tally: Mutex::new(Tally::default()),
            report: Mutex::new(Report::default()),
            confirmed: Mutex::new(None),
            revert: AtomicBool::new(options.revert),
            recent_deletes: Mutex::new(VecDeque::new()),
            examined: Mutex::new(HashMap::new()),
            removed: Mutex::new(None),
        })
    }

    pub fn cursor(&self) -> anyhow::Result<String> {
        self.db.cursor()
    }

    pub fn report(&self) -> Report {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn count(&self, add: impl FnOnce(&mut Tally)) {
        add(&mut self.tally.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn tally(&self) -> Tally {
        *self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn receive_only(&self) -> bool {
        self.options.receive_only || self.access == Access::ReadOnly
    }

    /// One pass. An error when the cluster could not be reached (what did sync is kept, and
    /// the next pass carries on from there); a file's own failure is recorded, not an error.
    pub async fn pass(&mut self) -> anyhow::Result<PassEnd> {
        *self.tally.lock().unwrap_or_else(|e| e.into_inner()) = Tally::default();
        *self.report.lock().unwrap_or_else(|e| e.into_inner()) = Report::default();
        *self.removed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.reuse.write().await = None;
        self.folder.forget_listings();
        if let Some(why) = super::identity::check(&self.folder, &self.db)? {
            return Ok(PassEnd::Paused(why));
        }
        self.rules = match Rules::load(self.folder.path()) {
            Ok(rules) => rules,
            Err(e) => return Ok(PassEnd::Paused(format!("{e:#}; fix it and syncing goes on"))),
        };
        self.follow_rules()?;
        self.access = if self.personal { Access::ReadWrite } else { self.remote.access(&self.namespace).await? };
        if self.access == Access::Gone {
            return Ok(PassEnd::Removed(self.removed_message()));
        }
        let entries = self.db.all()?;
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) =
            LocalNames::new(self.folder.caps, entries.iter().map(|(s, e)| (s, e)));
        drop(entries);
        if !self.pull().await? {
            return Ok(PassEnd::Removed(self.removed_message()));
        }
        self.retry_downloads().await?;
        let walk = self.folder.walk(|rel, is_dir| self.rules.ignored(rel, is_dir))?;
        self.note_walk(&walk)?;
        if self.receive_only() {
            self.keep_receive_only(&walk).await?;
        } else {
            self.push(&walk).await?;
        }
        if self.removed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return Ok(PassEnd::Removed(self.removed_message()));
        }
        if self.tally().sent_anything() && !self.pull().await? {
            return Ok(PassEnd::Removed(self.removed_message()));
        }
        // A confirmation is for the pass it was given to, used or not.
        *self.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if self.tally().any() {
            super::identity::advance(&self.folder, &self.db)?;
        }
        let purged = self.folder.trash.purge()?;
        if purged > 0 {
            eprintln!("sync: {purged} file(s) older than the kept days removed from the trash");
        }
        self.db.flush()?;
        Ok(PassEnd::Synced(self.tally()))
    }

    fn removed_message(&self) -> String {
        format!(
            "namespace {} can no longer be read with this token (access revoked, left or deleted); the local \
             files stay as they are",
            self.namespace
        )
    }

    /// A changed `.raftboxignore` lists the server's tree again: files it no longer ignores
    /// come down (or go up), compared by content.
    fn follow_rules(&self) -> anyhow::Result<()> {
        let stored = self.db.meta("rules")?;
        if stored.as_deref() == Some(self.rules.fingerprint.as_str()) {
            return Ok(());
        }
        if stored.is_some() || !self.rules.fingerprint.is_empty() && self.db.cursor()? != "0" {
            eprintln!("sync: .raftboxignore changed; comparing the whole tree with the server again");
            self.db.begin_reconcile()?;
        }
        self.db.set_meta("rules", Some(&self.rules.fingerprint))
    }

    /// Records what the walk could not see, and moves stray temporary files (of downloads
    /// cut short and not to be resumed) to the trash.
    fn note_walk(&self, walk: &Walk) -> anyhow::Result<()> {
        {
            let mut report = self.report.lock().unwrap_or_else(|e| e.into_inner());
            report.blind = walk.blind.clone();
            report.skipped = walk.skipped.clone();
        }
        let resumable: HashMap<(String, String), u64> =
            self.db.partials()?.into_iter().map(|(_, p)| ((p.dir, p.temp), p.ino)).collect();
        for stray in &walk.strays {
            let key = (stray.parent().to_string(), stray.name().to_string());
            let ours = resumable.get(&key).is_some_and(
                |ino| matches!(self.folder.node(stray), Ok(Node::File(meta)) if meta.ino == *ino && *ino != 0),
            );
            if !ours {
                if let Err(e) = self.folder.trash_stray(stray) {
                    eprintln!("sync: {stray}: {e:#}");
                }
            }
        }
        Ok(())
    }

    /// Reads the change feed to its end, applying each change. `false`: the namespace is
    /// gone.
    async fn pull(&self) -> anyhow::Result<bool> {
        let mut resets = 0;
        loop {
            let cursor = self.db.cursor()?;
            let Some(page) = self.remote.changes(&cursor).await? else {
                resets += 1;
                if resets > RESETS_PER_PASS_MAX {
                    bail!("the server keeps refusing the cursor (410), even from the start");
                }
                eprintln!(
                    "sync: the server cannot continue from the saved cursor; comparing the whole tree by content"
                );
                self.db.begin_reconcile()?;
                continue;
            };
            let mine: Vec<&Change> = page.changes.iter().filter(|c| c.namespace_id == self.namespace).collect();
            if mine.iter().any(|c| c.namespace_removed) {
                return Ok(false);
            }
            self.apply_page(&mine).await?;
            self.db.set_cursor(&page.cursor)?;
            if !page.has_more {
                if self.db.reconciling()? {
                    let dropped = self.db.end_reconcile()?;
                    if dropped > 0 {
                        eprintln!("sync: {dropped} file(s) the server does not have will go up as new files");
                    }
                }
                return Ok(true);
            }
        }
    }

    /// A page of changes: moves first (a rename here, no download), then deletions (so a
    /// name they free is free), then the rest, several files at once.
    async fn apply_page(&self, changes: &[&Change]) -> anyhow::Result<()> {
        let consumed = self.apply_moves(changes).await?;
        let (deletions, rest): (Vec<&Change>, Vec<&Change>) =
            changes.iter().copied().filter(|c| !consumed.contains(&c.path)).partition(|c| c.deleted);
        for change in deletions {
            self.apply_guarded(change).await?;
        }
        let results: Vec<anyhow::Result<()>> =
            stream::iter(rest).map(|c| self.apply_guarded(c)).buffer_unordered(FILES_IN_FLIGHT).collect().await;
        results.into_iter().collect()
    }

    /// Applies a change; a failure of the file is recorded (an unreachable cluster is the
    /// caller's error).
    async fn apply_guarded(&self, change: &Change) -> anyhow::Result<()> {
        match self.apply_change(change).await {
            Ok(()) => Ok(()),
            Err(e) if remote::unreachable(&e) => Err(e),
            Err(e) => self.fail(&change.path, Direction::Down, &e, Some(change.clone())),
        }
    }

    /// Records that `path` failed (and when to try it again).
    fn fail(
        &self,
        path: &str,
        direction: Direction,
        error: &anyhow::Error,
        change: Option<Change>,
    ) -> anyhow::Result<()> {
        let previous = self.db.failure(path)?;
        let failure = Failure::next(previous.as_ref(), direction, format!("{error:#}"), change, now_ns() / 1_000_000);
        if previous.as_ref().is_none_or(|p| p.reason != failure.reason) {
            eprintln!("sync: {path}: {error:#} (tried again later)");
        }
        self.db.set_failure(path, &failure)?;
        self.count(|t| t.failed += 1);
        Ok(())
    }

    /// Tries again the downloads that failed and are due.
    async fn retry_downloads(&self) -> anyhow::Result<()> {
        let now_ms = now_ns() / 1_000_000;
        for (path, failure) in self.db.failures()? {
            let Some(change) = failure.change.filter(|_| failure.direction == Direction::Down) else { continue };
            if failure.retry_at_ms <= now_ms {
                self.apply_guarded(&change).await?;
            }
            let _ = path;
        }
        Ok(())
    }

    /// Where the file of `server` lives (or is to live) here.
    fn local_of(&self, server: &str, entry: Option<&Entry>) -> anyhow::Result<Rel> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let rel = match entry {
            Some(_) => names.local_of(server),
            None => names.place(&self.folder, server),
        };
        rel.map_err(|e| anyhow::anyhow!("cannot be a file here: {e}"))
    }

    /// How the local file `rel` stands against `entry`, reading (and hashing) it only when
    /// its metadata does not show it unchanged.
    pub(crate) async fn examine(&self, server: &str, rel: &Rel, entry: Option<&Entry>) -> anyhow::Result<Local> {
        let meta = match self.folder.node(rel)? {
            Node::Missing => return Ok(Local::Missing),
            Node::File(meta) => meta,
            Node::Dir => return Ok(Local::Other(format!("a folder is in the way at {rel}"))),
            Node::Other(what) => return Ok(Local::Other(format!("{rel} is {what}"))),
            Node::Blocked(why) => return Ok(Local::Other(why)),
        };
        self.examine_file(server, rel, entry, meta).await
    }

    /// As [`Engine::examine`], for a regular file whose metadata is `meta`.
    pub(crate) async fn examine_file(
        &self,
        server: &str,
        rel: &Rel,
        entry: Option<&Entry>,
        meta: Meta,
    ) -> anyhow::Result<Local> {
        let window = self.folder.caps.racy_window_ns;
        if entry.is_some_and(|e| e.unchanged(&meta, window)) {
            return Ok(Local::Unchanged(meta));
        }
        // Read before and not changed since (a change not sent yet): not read again.
        let known = self.examined.lock().unwrap_or_else(|e| e.into_inner()).get(server).cloned();
        if let Some(content) = known.filter(|k| k.meta == meta && k.read_ns.abs_diff(meta.mtime_ns) >= window) {
            return Ok(Local::Edited(content));
        }
        let Some(content) = transfer::read_content(&self.folder, rel, window).await? else {
            self.count(|t| t.busy += 1);
            return Ok(Local::Busy);
        };
        {
            let mut examined = self.examined.lock().unwrap_or_else(|e| e.into_inner());
            if examined.len() >= EXAMINED_FILES_MAX {
                examined.clear();
            }
            examined.insert(server.to_string(), content.clone());
        }
        match entry {
            // Touched, not changed: the new metadata is remembered (after a reset too: the
            // content is what was last synced here, whatever the server has now).
            Some(e) if e.chunks == content.chunks && e.executable == content.meta.executable => {
                let updated = Entry { meta: content.meta, recorded_ns: content.read_ns, ..e.clone() };
                self.db.put(server, &updated)?;
                Ok(Local::Unchanged(content.meta))
            }
            _ => Ok(Local::Edited(content)),
        }
    }

    async fn apply_change(&self, c: &Change) -> anyhow::Result<()> {
        let entry = self.db.get(&c.path)?;
        if entry.as_ref().is_some_and(|e| !e.unverified && e.version >= c.version) {
            return self.db.clear_failure(&c.path);
        }
        let rel = self.local_of(&c.path, entry.as_ref())?;
        if self.rules.ignored(rel.as_str(), false) || rel.is_ignore_file() {
            return Ok(());
        }
        if let Some(why) = self.folder.blind_at(&rel)? {
            bail!("{why}");
        }
        let local = self.examine(&c.path, &rel, entry.as_ref()).await?;
        let server_had_local = match (&entry, &local) {
            (Some(e), Local::Unchanged(_)) if e.unverified && e.chunks != c.chunks => {
                self.remote.history_holds(&c.path, &e.chunks).await?
            }
            _ => false,
        };
        let act = decide(entry.as_ref(), &local, c, self.receive_only(), server_had_local);
        self.act(c, &rel, entry, local, act).await
    }

    async fn act(&self, c: &Change, rel: &Rel, entry: Option<Entry>, local: Local, act: Act) -> anyhow::Result<()> {
        let path = c.path.as_str();
        match act {
            Act::Record => {
                let meta = match &local {
                    Local::Unchanged(meta) => *meta,
                    Local::Edited(content) => content.meta,
                    _ => bail!("nothing to record"),
                };
                let (chunks, lengths) = match (&local, &entry) {
                    (Local::Edited(content), _) => (content.chunks.clone(), content.lengths.clone()),
                    (_, Some(e)) => (e.chunks.clone(), e.lengths.clone()),
                    _ => (c.chunks.clone(), Vec::new()),
                };
                let recorded = Entry {
                    version: c.version,
                    chunks,
                    lengths,
                    executable: c.executable,
                    meta,
                    recorded_ns: now_ns(),
                    stale: false,
                    local: self.alias_of(path, rel),
                    unverified: false,
                };
                self.note_name(path, rel);
                self.db.settle(path, &recorded)
            }
            Act::Forget => {
                self.names.lock().unwrap_or_else(|e| e.into_inner()).forget(path);
                self.db.remove(path)
            }
            Act::Download(expected) => {
                let why = match &local {
                    Local::Edited(_) => "a local change in a read-only folder, replaced by the server's version",
                    _ => "replaced by a newer version from the server",
                };
                self.download(c, rel, expected, why).await.map(|_| ())
            }
            Act::Remove(meta) => self.remove_local(path, rel, meta),
            Act::Stale => match entry {
                Some(e) => self.db.put(path, &Entry { stale: true, ..e }),
                // Never synced here: the change is kept with a failure and applied again
                // (the cursor moves on without it), and the push sends the local file
                // against it.
                None => self.postpone(c),
            },
            Act::SendOver(base) => {
                // Metadata and content that no file shows: the push reads the file and sends
                // it on `base` (a reverted file too, which the server then answers as the
                // retry of its own version).
                let over = Entry {
                    version: base,
                    chunks: vec![UNKNOWN_CONTENT.to_string()],
                    lengths: Vec::new(),
                    executable: c.executable,
                    meta: Meta::default(),
                    recorded_ns: 0,
                    stale: false,
                    local: self.alias_of(path, rel),
                    unverified: false,
                };
                self.db.put(path, &over)
            }
            Act::Fail(why) => Err(anyhow::anyhow!(why)),
        }
    }

    /// Keeps change `c` (of a file not synced here) to apply again later, as a download that
    /// failed for now: nothing the cursor moves past is ever lost.
    fn postpone(&self, c: &Change) -> anyhow::Result<()> {
        let previous = self.db.failure(&c.path)?;
        let why = "the local file was being written, or appeared, as this version came".to_string();
        let failure = Failure::next(previous.as_ref(), Direction::Down, why, Some(c.clone()), now_ns() / 1_000_000);
        self.db.set_failure(&c.path, &failure)
    }

    /// The entry's `local` for `server` at `rel`.
    fn alias_of(&self, server: &str, rel: &Rel) -> Option<String> {
        (rel.server() != server).then(|| rel.as_str().to_string())
    }

    fn note_name(&self, server: &str, rel: &Rel) {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).note(server, rel);
    }

    /// The index of chunks in local files, made at the first download of a pass.
    async fn reuse_index(&self) -> anyhow::Result<tokio::sync::RwLockReadGuard<'_, Option<ReuseIndex>>> {
        if self.reuse.read().await.is_none() {
            let mut slot = self.reuse.write().await;
            if slot.is_none() {
                let entries = self.db.all()?;
                let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
                let located: Vec<(Rel, &Entry)> =
                    entries.iter().filter_map(|(s, e)| names.local_of(s).ok().map(|r| (r, e))).collect();
                *slot = Some(ReuseIndex::new(located.into_iter()));
            }
        }
        Ok(self.reuse.read().await)
    }

    /// Puts `c`'s version at `rel` if the local file is still as `expected`; whether it did.
    pub(crate) async fn download(
        &self,
        c: &Change,
        rel: &Rel,
        expected: Option<Meta>,
        why: &str,
    ) -> anyhow::Result<bool> {
        let path = c.path.as_str();
        let assembled = {
            let reuse = self.reuse_index().await?;
            let reuse = reuse.as_ref().context("the reuse index")?;
            let partial = self.db.partial(path)?;
            let record = |p: &super::state::Partial| self.db.set_partial(path, Some(p));
            // A modification time in the future is taken as now (a skewed clock elsewhere
            // must not make the file look as if it were being written for years).
            let mtime_ms = c.mtime_ms().min(now_ns() / 1_000_000);
            let (chunks, executable) = (&c.chunks, c.executable);
            transfer::assemble(&self.folder, &self.remote, reuse, rel, chunks, mtime_ms, executable, partial, record)
                .await?
        };
        // From the swap on, the temporary name may hold something else: not resumable.
        self.db.set_partial(path, None)?;
        let swapped = self.folder.swap_in(&assembled.dir, &assembled.temp, assembled.meta, rel, expected, why);
        self.db.add_dirs(&self.folder.take_made())?;
        match swapped? {
            Swap::Done(meta) => {
                let entry = Entry {
                    version: c.version,
                    chunks: c.chunks.clone(),
                    lengths: assembled.lengths,
                    executable: c.executable,
                    meta,
                    recorded_ns: now_ns(),
                    stale: false,
                    local: self.alias_of(path, rel),
                    unverified: false,
                };
                self.db.settle(path, &entry)?;
                self.note_name(path, rel);
                if let Some(index) = self.reuse.write().await.as_mut() {
                    index.add(rel, &entry);
                }
                let f = assembled.fetched;
                eprintln!(
                    "sync: ↓ {path} v{} ({} of {} chunks fetched, {} bytes{})",
                    c.version,
                    f.chunks,
                    c.chunks.len(),
                    f.bytes,
                    if f.resumed > 0 { format!(", {} resumed", f.resumed) } else { String::new() }
                );
                self.count(|t| {
                    t.down_files += 1;
                    t.down_chunks += f.chunks;
                    t.down_bytes += f.bytes;
                    t.reused_chunks += f.reused;
                });
                Ok(true)
            }
            Swap::Changed => {
                match self.folder.node(rel)? {
                    Node::Dir => bail!("a folder is in the way at {rel}"),
                    Node::Other(what) => bail!("{rel} is {what}"),
                    Node::Blocked(why) => bail!("{why}"),
                    // Another server path's file has this name here: this one is placed apart
                    // when tried again.
                    Node::File(_) if self.names().taken_by_other(path, rel) => {
                        bail!("{rel} is taken here by another file of a name the file system sees as the same")
                    }
                    // A file the user wrote meanwhile: theirs stays, and goes up.
                    Node::File(_) | Node::Missing => {}
                }
                match self.db.get(path)? {
                    Some(e) => self.db.put(path, &Entry { stale: true, ..e })?,
                    None => self.postpone(c)?,
                }
                Ok(false)
            }
        }
    }

    /// Deletes (to the trash) the local file of `path` if it still is as `meta`.
    fn remove_local(&self, path: &str, rel: &Rel, meta: Meta) -> anyhow::Result<()> {
        if !self.folder.remove(rel, meta, "deleted on the server")? {
            if let Some(e) = self.db.get(path)? {
                self.db.put(path, &Entry { stale: true, ..e })?;
            }
            return Ok(());
        }
        let pruned = self.folder.prune_empty(rel, |dir| self.db.made_dir(dir));
        self.db.forget_dirs(&pruned)?;
        self.names.lock().unwrap_or_else(|e| e.into_inner()).forget(path);
        self.db.remove(path)?;
        eprintln!("sync: ✗ {path} (deleted on the server; kept in the trash)");
        self.count(|t| t.deleted_here += 1);
        Ok(())
    }

    /// Moves made on the server, found in one page as a deletion of X and a new file Y with
    /// X's content: renamed here, no download. The server paths taken care of.
    async fn apply_moves(&self, changes: &[&Change]) -> anyhow::Result<HashSet<String>> {
        let mut consumed = HashSet::new();
        let mut by_content: HashMap<Vec<String>, Vec<(&Change, Entry)>> = HashMap::new();
        for c in changes.iter().filter(|c| c.deleted) {
            if let Some(e) =
                self.db.get(&c.path)?.filter(|e| !e.unverified && e.version < c.version && !e.chunks.is_empty())
            {
                by_content.entry(e.chunks.clone()).or_default().push((c, e));
            }
        }
        if by_content.is_empty() {
            return Ok(consumed);
        }
        for to in changes.iter().filter(|c| !c.deleted) {
            let Some(candidates) = by_content.get_mut(&to.chunks) else { continue };
            if self.db.get(&to.path)?.is_some() {
                continue;
            }
            let Some((from, entry)) = candidates.pop() else { continue };
            match self.rename_local(from, &entry, to).await {
                Ok(true) => {
                    consumed.insert(from.path.clone());
                    consumed.insert(to.path.clone());
                }
                Ok(false) => {}
                Err(e) if remote::unreachable(&e) => return Err(e),
                Err(e) => eprintln!("sync: {} → {}: {e:#}; applied as a delete and a new file", from.path, to.path),
            }
        }
        Ok(consumed)
    }

    /// Renames the local file of `from` (synced as `entry`) to `to`'s place, if it is
    /// unchanged; whether it did.
    async fn rename_local(&self, from: &Change, entry: &Entry, to: &Change) -> anyhow::Result<bool> {
        let from_rel = self.local_of(&from.path, Some(entry))?;
        let Local::Unchanged(meta) = self.examine(&from.path, &from_rel, Some(entry)).await? else { return Ok(false) };
        // The name `from` frees is free for `to` (a case-only rename on a folding system).
        self.names.lock().unwrap_or_else(|e| e.into_inner()).forget(&from.path);
        let to_rel = match self.local_of(&to.path, None) {
            Ok(rel) => rel,
            Err(e) => {
                self.note_name(&from.path, &from_rel);
                return Err(e);
            }
        };
        if self.rules.ignored(to_rel.as_str(), false) {
            self.note_name(&from.path, &from_rel);
            return Ok(false);
        }
        let Some(moved) = self.folder.rename(&from_rel, &to_rel, meta)? else {
            self.note_name(&from.path, &from_rel);
            return Ok(false);
        };
        self.db.add_dirs(&self.folder.take_made())?;
        let renamed = Entry {
            version: to.version,
            executable: to.executable,
            meta: moved,
            recorded_ns: now_ns(),
            stale: false,
            local: self.alias_of(&to.path, &to_rel),
            unverified: false,
            ..entry.clone()
        };
        self.db.remove(&from.path)?;
        self.db.settle(&to.path, &renamed)?;
        self.note_name(&to.path, &to_rel);
        let pruned = self.folder.prune_empty(&from_rel, |dir| self.db.made_dir(dir));
        self.db.forget_dirs(&pruned)?;
        eprintln!("sync: → {} → {} (moved on the server)", from.path, to.path);
        self.count(|t| t.moved += 1);
        Ok(true)
    }

    fn names(&self) -> std::sync::MutexGuard<'_, LocalNames> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_report(&self, change: impl FnOnce(&mut Report)) {
        change(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn mark_removed(&self) {
        *self.removed.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.removed_message());
    }
}

#[path = "push.rs"]
mod push;

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
