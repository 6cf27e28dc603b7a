//! The sync client's local state database (redb, one file, default `DIR/.raftbox/state.redb`):
//! the namespace and folder it belongs to, the `/v1/sync` cursor, per file what was last
//! synced (server version and chunks, and the local file's size, mtime, ctime, inode and
//! device then), the files that failed with why and when to try again, and the downloads cut
//! short (to resume them).
//!
//! Durability: the cursor and the folder's identity are written durably (fsynced); file
//! entries are not, and reach the disk with the next durable write (at the end of each page
//! and pass). Losing the newest entries in a crash is safe by construction: a file whose entry
//! is older than its content is read again, and its content sent on the base version the
//! entry names, which the server answers as the retry it is (or as "unchanged": identical
//! content is no conflict). No entry ever claims more than what happened.

use std::path::Path;

use anyhow::{bail, Context};
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use super::folder::Meta;
use super::remote::Change;

/// Server path (`/a/b.txt`) → [`Entry`] as JSON.
const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");
/// Server path → [`Failure`] as JSON.
const FAILURES: TableDefinition<&str, &[u8]> = TableDefinition::new("failures");
/// Server path → [`Partial`] as JSON.
const PARTIALS: TableDefinition<&str, &[u8]> = TableDefinition::new("partials");
/// Folder (relative) → nothing: the folders the client made, the only ones it removes again
/// when they fall empty.
const DIRS: TableDefinition<&str, &[u8]> = TableDefinition::new("dirs");
/// `namespace`, `cursor`, `folder_id`, `folder_ino`, `reconcile`, `rules`, `removed`.
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
/// Tables of an older client, no longer used (dropped at open).
const OLD_PENDING: TableDefinition<&str, &[u8]> = TableDefinition::new("pending");

/// What the client last synced of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The server's version the local file holds.
    pub version: u64,
    /// Its chunk hashes and their lengths, in order (for reuse when downloading).
    pub chunks: Vec<String>,
    pub lengths: Vec<u64>,
    /// Whether that version is executable.
    #[serde(default)]
    pub executable: bool,
    /// The local file as it was when synced: a file that still shows this is unchanged
    /// (unless its mtime lies within the racy window of `recorded_ns`).
    #[serde(default)]
    pub meta: Meta,
    /// When `meta` was read, ns since the epoch.
    #[serde(default)]
    pub recorded_ns: u64,
    /// A newer remote version was seen while the local file had an unsynced edit: the edit
    /// goes up (as a conflict) and the current version then comes down.
    #[serde(default)]
    pub stale: bool,
    /// Where the file is locally, when that differs from its server path (a name another
    /// server path already holds on this case-insensitive file system).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// Not yet matched against the server's tree after a cursor reset: judged by content.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unverified: bool,
}

impl Entry {
    /// Whether a file showing `meta` is still what this entry recorded, without reading
    /// it: the same size, mtime, ctime, inode and execute bit (not the device number, which
    /// some file systems change at every mount), and recorded at least `window_ns` away from
    /// its mtime — a write in the same timestamp tick as the recording would show the very
    /// same metadata (git's "racily clean" entries), so such an entry is read again.
    pub fn unchanged(&self, meta: &Meta, window_ns: u64) -> bool {
        let (a, b) = (&self.meta, meta);
        let same = (a.size, a.mtime_ns, a.ctime_ns, a.ino, a.executable)
            == (b.size, b.mtime_ns, b.ctime_ns, b.ino, b.executable);
        same && self.recorded_ns.abs_diff(meta.mtime_ns) >= window_ns
    }
}

/// Which way a file failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
}

/// A file that did not sync, why, and when it is tried again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub direction: Direction,
    pub reason: String,
    pub attempts: u32,
    pub retry_at_ms: u64,
    /// For a download: the change to apply when it is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// Longest wait before a failed file is tried again.
const RETRY_WAIT_MAX_MS: u64 = 3_600_000;
/// The first wait.
const RETRY_WAIT_FIRST_MS: u64 = 2_000;

impl Failure {
    /// The next failure after `previous` (if any), at `now_ms`.
    pub fn next(
        previous: Option<&Failure>,
        direction: Direction,
        reason: String,
        change: Option<Change>,
        now_ms: u64,
    ) -> Failure {
        let attempts = previous.map_or(1, |f| f.attempts.saturating_add(1));
        let wait = RETRY_WAIT_FIRST_MS.saturating_mul(1u64 << (attempts - 1).min(20)).min(RETRY_WAIT_MAX_MS);
        Failure { direction, reason, attempts, retry_at_ms: now_ms.saturating_add(wait), change }
    }
}

/// A download cut short: its temporary file and the chunks it was assembling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The folder (relative) and the temporary file's name in it.
    pub dir: String,
    pub temp: String,
    /// The temporary file's inode: a file of that name with another inode (say, what an
    /// exchange put there before a crash) is not this download's, and is never reused.
    #[serde(default)]
    pub ino: u64,
    pub chunks: Vec<String>,
}

pub struct StateDb {
    db: Database,
    /// Writes since the last durable one.
    unflushed: std::sync::atomic::AtomicUsize,
}

/// Downloads of at least this many chunks (about 4 MiB) are recorded durably when they
/// start, to be resumed after a crash.
const PARTIAL_DURABLE_CHUNKS_MIN: usize = 4;
/// Writes that are not durable by themselves, at most, before one that is: redb keeps the
/// pages of non-durable commits until a durable one, so memory and file stay bounded.
const UNFLUSHED_WRITES_MAX: usize = 1_000;

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> anyhow::Result<T> {
    serde_json::from_slice(bytes).context("a corrupt sync state record")
}

impl StateDb {
    /// Opens (or creates) the database at `path`; fails clearly when another `raftbox sync`
    /// holds it.
    pub fn open(path: &Path) -> anyhow::Result<StateDb> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        let db = match Database::create(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                bail!("{} is in use: another `raftbox sync` runs on this folder", path.display())
            }
            Err(e) => return Err(e).with_context(|| format!("open the sync state {}", path.display())),
        };
        let txn = db.begin_write()?;
        txn.open_table(FILES)?;
        txn.open_table(FAILURES)?;
        txn.open_table(PARTIALS)?;
        txn.open_table(DIRS)?;
        txn.open_table(META)?;
        let _ = txn.delete_table(OLD_PENDING)?;
        txn.commit()?;
        Ok(StateDb { db, unflushed: std::sync::atomic::AtomicUsize::new(0) })
    }

    /// A write transaction that reaches the disk with the next durable one (every
    /// [`UNFLUSHED_WRITES_MAX`]-th is that durable one).
    fn write(&self) -> anyhow::Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write()?;
        let n = self.unflushed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n + 1 < UNFLUSHED_WRITES_MAX {
            txn.set_durability(Durability::None);
        } else {
            self.unflushed.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(txn)
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        txn.commit()?;
        self.unflushed.store(0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    pub fn meta(&self, key: &str) -> anyhow::Result<Option<String>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        Ok(table.get(key)?.map(|v| v.value().to_string()))
    }

    /// Sets (or, with `None`, clears) `key`, durably.
    pub fn set_meta(&self, key: &str, value: Option<&str>) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(META)?;
            match value {
                Some(value) => table.insert(key, value)?,
                None => table.remove(key)?,
            };
        }
        txn.commit()?;
        Ok(())
    }

    /// Ties the state to `namespace` on first use; refuses a state made for another one.
    pub fn bind_namespace(&self, namespace: &str) -> anyhow::Result<()> {
        match self.meta("namespace")? {
            Some(bound) if bound != namespace => {
                bail!("this folder syncs namespace {bound}, not {namespace}; use another folder or --state file")
            }
            Some(_) => Ok(()),
            None => self.set_meta("namespace", Some(namespace)),
        }
    }

    /// The `/v1/sync` cursor; `"0"` before the first sync.
    pub fn cursor(&self) -> anyhow::Result<String> {
        Ok(self.meta("cursor")?.unwrap_or_else(|| "0".to_string()))
    }

    /// Saves the cursor, and with it (durably) every entry written before.
    pub fn set_cursor(&self, cursor: &str) -> anyhow::Result<()> {
        self.set_meta("cursor", Some(cursor))
    }

    /// Starts a reconciliation by content: every entry unverified, the cursor back to 0,
    /// in one durable transaction.
    pub fn begin_reconcile(&self) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut files = txn.open_table(FILES)?;
            let all: Vec<(String, Entry)> = files
                .iter()?
                .map(|row| {
                    let (key, value) = row?;
                    Ok((key.value().to_string(), decode::<Entry>(value.value())?))
                })
                .collect::<anyhow::Result<_>>()?;
            for (path, entry) in all {
                let bytes = serde_json::to_vec(&Entry { unverified: true, ..entry })?;
                files.insert(path.as_str(), bytes.as_slice())?;
            }
            let mut meta = txn.open_table(META)?;
            meta.insert("cursor", "0")?;
            meta.insert("reconcile", "1")?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Ends a reconciliation: entries the server's whole tree did not name are dropped (their
    /// local files are new files now), durably. Answers how many.
    pub fn end_reconcile(&self) -> anyhow::Result<usize> {
        let txn = self.db.begin_write()?;
        let dropped;
        {
            let mut files = txn.open_table(FILES)?;
            let unverified: Vec<String> = files
                .iter()?
                .filter_map(|row| {
                    let (key, value) = row.ok()?;
                    let entry: Entry = decode(value.value()).ok()?;
                    entry.unverified.then(|| key.value().to_string())
                })
                .collect();
            for path in &unverified {
                files.remove(path.as_str())?;
            }
            dropped = unverified.len();
            txn.open_table(META)?.remove("reconcile")?;
        }
        txn.commit()?;
        Ok(dropped)
    }

    pub fn reconciling(&self) -> anyhow::Result<bool> {
        Ok(self.meta("reconcile")?.is_some())
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Option<Entry>> {
        self.get_in(FILES, path)
    }

    fn get_in<T: for<'de> Deserialize<'de>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        path: &str,
    ) -> anyhow::Result<Option<T>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(table)?;
        match table.get(path)? {
            Some(bytes) => Ok(Some(decode(bytes.value())?)),
            None => Ok(None),
        }
    }

    /// Every entry, by server path.
    pub fn all(&self) -> anyhow::Result<Vec<(String, Entry)>> {
        self.all_in(FILES)
    }

    /// How many files are synced.
    pub fn count(&self) -> anyhow::Result<usize> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(FILES)?.len()? as usize)
    }

    fn all_in<T: for<'de> Deserialize<'de>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> anyhow::Result<Vec<(String, T)>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(table)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            out.push((key.value().to_string(), decode(value.value())?));
        }
        Ok(out)
    }

    pub fn put(&self, path: &str, entry: &Entry) -> anyhow::Result<()> {
        self.insert_in(FILES, path, entry)
    }

    /// `path` holds `entry` now; any failure of it, and any download of it cut short, is
    /// over.
    pub fn settle(&self, path: &str, entry: &Entry) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(entry)?;
        let txn = self.write()?;
        txn.open_table(FILES)?.insert(path, bytes.as_slice())?;
        txn.open_table(FAILURES)?.remove(path)?;
        txn.open_table(PARTIALS)?.remove(path)?;
        txn.commit()?;
        Ok(())
    }

    /// `path` is no longer synced (deleted both sides, or a new file locally); any failure
    /// of it, and any download of it cut short, is over.
    pub fn remove(&self, path: &str) -> anyhow::Result<()> {
        let txn = self.write()?;
        txn.open_table(FILES)?.remove(path)?;
        txn.open_table(FAILURES)?.remove(path)?;
        txn.open_table(PARTIALS)?.remove(path)?;
        txn.commit()?;
        Ok(())
    }

    /// A rename in one transaction: `from` gone, `to` holding `entry`.
    pub fn rename(&self, from: &str, to: &str, entry: &Entry) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(entry)?;
        let txn = self.write()?;
        {
            let mut table = txn.open_table(FILES)?;
            table.remove(from)?;
            table.insert(to, bytes.as_slice())?;
            let mut failures = txn.open_table(FAILURES)?;
            failures.remove(from)?;
            failures.remove(to)?;
        }
        txn.commit()?;
        Ok(())
    }

    pub fn failure(&self, path: &str) -> anyhow::Result<Option<Failure>> {
        self.get_in(FAILURES, path)
    }

    pub fn failures(&self) -> anyhow::Result<Vec<(String, Failure)>> {
        self.all_in(FAILURES)
    }

    pub fn set_failure(&self, path: &str, failure: &Failure) -> anyhow::Result<()> {
        self.insert_in(FAILURES, path, failure)
    }

    pub fn clear_failure(&self, path: &str) -> anyhow::Result<()> {
        let txn = self.write()?;
        txn.open_table(FAILURES)?.remove(path)?;
        txn.commit()?;
        Ok(())
    }

    pub fn partial(&self, path: &str) -> anyhow::Result<Option<Partial>> {
        self.get_in(PARTIALS, path)
    }

    pub fn partials(&self) -> anyhow::Result<Vec<(String, Partial)>> {
        self.all_in(PARTIALS)
    }

    /// Records (or forgets) a download of `path` under way. A large one's record is made
    /// durable at once, so a download cut short by a crash resumes after it; a small one's
    /// waits for the next durable write (redoing it costs little).
    pub fn set_partial(&self, path: &str, partial: Option<&Partial>) -> anyhow::Result<()> {
        match partial {
            Some(partial) if partial.chunks.len() >= PARTIAL_DURABLE_CHUNKS_MIN => {
                let bytes = serde_json::to_vec(partial)?;
                let txn = self.db.begin_write()?;
                txn.open_table(PARTIALS)?.insert(path, bytes.as_slice())?;
                txn.commit()?;
                Ok(())
            }
            Some(partial) => self.insert_in(PARTIALS, path, partial),
            None => {
                let txn = self.write()?;
                txn.open_table(PARTIALS)?.remove(path)?;
                txn.commit()?;
                Ok(())
            }
        }
    }

    /// Records folders the client made.
    pub fn add_dirs(&self, dirs: &[String]) -> anyhow::Result<()> {
        if dirs.is_empty() {
            return Ok(());
        }
        let txn = self.write()?;
        {
            let mut table = txn.open_table(DIRS)?;
            for dir in dirs {
                table.insert(dir.as_str(), [].as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Whether the client made folder `dir`.
    pub fn made_dir(&self, dir: &str) -> bool {
        let Ok(txn) = self.db.begin_read() else { return false };
        let Ok(table) = txn.open_table(DIRS) else { return false };
        table.get(dir).ok().flatten().is_some()
    }

    /// Forgets folders removed.
    pub fn forget_dirs(&self, dirs: &[String]) -> anyhow::Result<()> {
        if dirs.is_empty() {
            return Ok(());
        }
        let txn = self.write()?;
        {
            let mut table = txn.open_table(DIRS)?;
            for dir in dirs {
                table.remove(dir.as_str())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn insert_in<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        path: &str,
        value: &T,
    ) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(value)?;
        let txn = self.write()?;
        txn.open_table(table)?.insert(path, bytes.as_slice())?;
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: u64) -> Entry {
        Entry {
            version,
            chunks: vec!["ab".repeat(32)],
            lengths: vec![5],
            executable: false,
            meta: Meta { size: 5, mtime_ns: 42, ..Meta::default() },
            recorded_ns: 43,
            stale: false,
            local: None,
            unverified: false,
        }
    }

    #[test]
    fn state_survives_reopening_and_refuses_a_second_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".raftbox/state.redb");
        {
            let db = StateDb::open(&path).expect("open");
            assert!(StateDb::open(&path).is_err(), "a second open of a held state must fail");
            db.bind_namespace("ns-1").expect("bind");
            assert_eq!(db.cursor().expect("cursor"), "0");
            db.put("/a.txt", &entry(3)).expect("put");
            db.put("/b.txt", &entry(1)).expect("put");
            db.rename("/b.txt", "/c.txt", &entry(2)).expect("rename");
            db.remove("/a.txt").expect("remove");
            // The cursor's durable write carries the entries written before it.
            db.set_cursor("abc").expect("cursor");
        }
        let db = StateDb::open(&path).expect("reopen");
        assert_eq!(db.cursor().expect("cursor"), "abc");
        assert!(db.bind_namespace("ns-2").is_err(), "a state bound to one namespace must refuse another");
        db.bind_namespace("ns-1").expect("same namespace");
        assert_eq!(db.get("/a.txt").expect("get"), None);
        assert_eq!(db.all().expect("all"), vec![("/c.txt".to_string(), entry(2))]);
    }

    #[test]
    fn a_reconciliation_drops_what_the_server_did_not_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = StateDb::open(&dir.path().join("state.redb")).expect("open");
        db.put("/named.txt", &entry(4)).expect("put");
        db.put("/unnamed.txt", &entry(2)).expect("put");
        db.set_cursor("xyz").expect("cursor");
        db.begin_reconcile().expect("begin");
        assert!(db.reconciling().expect("flag"));
        assert_eq!(db.cursor().expect("cursor"), "0");
        assert!(db.all().expect("all").iter().all(|(_, e)| e.unverified));
        db.settle("/named.txt", &entry(5)).expect("settle");
        assert_eq!(db.end_reconcile().expect("end"), 1);
        assert!(!db.reconciling().expect("flag"));
        assert_eq!(db.all().expect("all"), vec![("/named.txt".to_string(), entry(5))]);
    }

    #[test]
    fn failures_back_off_and_end_when_the_file_settles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = StateDb::open(&dir.path().join("state.redb")).expect("open");
        let first = Failure::next(None, Direction::Down, "name too long".into(), None, 1_000);
        assert_eq!((first.attempts, first.retry_at_ms), (1, 3_000));
        let third = Failure::next(
            Some(&Failure::next(Some(&first), Direction::Down, "x".into(), None, 0)),
            Direction::Down,
            "x".into(),
            None,
            0,
        );
        assert_eq!((third.attempts, third.retry_at_ms), (3, 8_000));
        let many = Failure { attempts: 60, ..third.clone() };
        assert_eq!(Failure::next(Some(&many), Direction::Up, "x".into(), None, 0).retry_at_ms, RETRY_WAIT_MAX_MS);
        db.set_failure("/x", &first).expect("fail");
        assert_eq!(db.failures().expect("failures").len(), 1);
        db.settle("/x", &entry(1)).expect("settle");
        assert!(db.failures().expect("failures").is_empty());
    }
}
