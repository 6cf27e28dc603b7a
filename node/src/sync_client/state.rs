//! The sync client's local state database (redb, one file, default `DIR/.raftbox/state.redb`):
//! the namespace it syncs, the `/v1/sync` cursor, and per file the version and chunk list it
//! last synced with the local size and modification time seen then. Every change is one redb
//! write transaction (fsynced at commit), so a crash or `kill -9` leaves either the state
//! before or after it: a file is re-examined, never re-uploaded blindly nor overwritten.
//!
//! A download is recorded twice: as *pending* (the entry the file will have) before its
//! temporary file is renamed into place, and as synced after. A client killed between the
//! rename and the second record finds, when it opens the state again, the file showing the
//! pending entry's size and modification time (a rename keeps both): that version is then
//! what it holds, not a local edit to send back (which would become a conflicted copy of a
//! file nobody edited). A pending entry the file does not match was never renamed in; it is
//! dropped.

use std::path::Path;

use anyhow::{bail, Context};
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::scan::Meta;

/// Remote path (`/a/b.txt`) → [`Entry`] as JSON.
const FILES: TableDefinition<&str, &[u8]> = TableDefinition::new("files");
/// Remote path → the [`Entry`] a download is about to rename into place, as JSON.
const PENDING: TableDefinition<&str, &[u8]> = TableDefinition::new("pending");
/// `namespace`, `cursor`.
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// What the client last synced of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The server's version the local file holds.
    pub version: u64,
    /// Its chunk hashes and their lengths, in order (for reuse when downloading).
    pub chunks: Vec<String>,
    pub lengths: Vec<u64>,
    /// The local file's size and modification time (ns since the epoch) when it was synced:
    /// a file that still shows both is unchanged.
    pub size: u64,
    pub mtime_ns: u64,
    /// A newer remote version was seen while the local file had an unsynced edit: the edit
    /// goes up (as a conflict) and the current version then comes down.
    #[serde(default)]
    pub stale: bool,
}

pub struct StateDb {
    db: Database,
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
        txn.open_table(PENDING)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(StateDb { db })
    }

    /// Settles the downloads a killed client left pending: a file under `root` that shows its
    /// pending entry's size and mtime holds that entry's version; any other pending entry is
    /// dropped. Answers the paths that were settled as downloaded.
    pub fn resolve_pending(
        &self,
        local_meta: impl Fn(&str) -> anyhow::Result<Option<Meta>>,
    ) -> anyhow::Result<Vec<String>> {
        let mut settled = Vec::new();
        for (path, entry) in self.entries(PENDING)? {
            if local_meta(&path)? == Some(Meta { size: entry.size, mtime_ns: entry.mtime_ns }) {
                self.settle(&path, &entry)?;
                settled.push(path);
            } else {
                self.drop_pending(&path)?;
            }
        }
        Ok(settled)
    }

    /// Records that a download of `path` is about to be renamed into place as `entry`.
    pub fn put_pending(&self, path: &str, entry: &Entry) -> anyhow::Result<()> {
        self.insert(PENDING, path, entry)
    }

    /// `path` holds `entry` (and no download of it is pending), in one transaction.
    pub fn settle(&self, path: &str, entry: &Entry) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(entry)?;
        let txn = self.db.begin_write()?;
        txn.open_table(FILES)?.insert(path, bytes.as_slice())?;
        txn.open_table(PENDING)?.remove(path)?;
        txn.commit()?;
        Ok(())
    }

    /// Forgets a pending download of `path` (it was not renamed into place).
    pub fn drop_pending(&self, path: &str) -> anyhow::Result<()> {
        self.delete(PENDING, path)
    }

    fn meta(&self, key: &str) -> anyhow::Result<Option<String>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        Ok(table.get(key)?.map(|v| v.value().to_string()))
    }

    fn set_meta(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        txn.open_table(META)?.insert(key, value)?;
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
            None => self.set_meta("namespace", namespace),
        }
    }

    /// The `/v1/sync` cursor; `"0"` before the first sync.
    pub fn cursor(&self) -> anyhow::Result<String> {
        Ok(self.meta("cursor")?.unwrap_or_else(|| "0".to_string()))
    }

    pub fn set_cursor(&self, cursor: &str) -> anyhow::Result<()> {
        self.set_meta("cursor", cursor)
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Option<Entry>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(FILES)?;
        match table.get(path)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(bytes.value()).context("a corrupt sync state entry")?)),
            None => Ok(None),
        }
    }

    /// Every entry, by path.
    pub fn all(&self) -> anyhow::Result<Vec<(String, Entry)>> {
        self.entries(FILES)
    }

    /// Every entry of `table` ([`FILES`] or [`PENDING`]), by path.
    fn entries(&self, definition: TableDefinition<&str, &[u8]>) -> anyhow::Result<Vec<(String, Entry)>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(definition)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            out.push((key.value().to_string(), serde_json::from_slice(value.value())?));
        }
        Ok(out)
    }

    pub fn put(&self, path: &str, entry: &Entry) -> anyhow::Result<()> {
        self.insert(FILES, path, entry)
    }

    pub fn remove(&self, path: &str) -> anyhow::Result<()> {
        self.delete(FILES, path)
    }

    /// `path` → `entry` in `table`, in a transaction of its own.
    fn insert(&self, table: TableDefinition<&str, &[u8]>, path: &str, entry: &Entry) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(entry)?;
        let txn = self.db.begin_write()?;
        txn.open_table(table)?.insert(path, bytes.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// `path` gone from `table`, in a transaction of its own.
    fn delete(&self, table: TableDefinition<&str, &[u8]>, path: &str) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        txn.open_table(table)?.remove(path)?;
        txn.commit()?;
        Ok(())
    }

    /// A rename in one transaction: `from` gone, `to` holding `entry`.
    pub fn rename(&self, from: &str, to: &str, entry: &Entry) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(entry)?;
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(FILES)?;
            table.remove(from)?;
            table.insert(to, bytes.as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: u64) -> Entry {
        Entry { version, chunks: vec!["ab".repeat(32)], lengths: vec![5], size: 5, mtime_ns: 42, stale: false }
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
            db.set_cursor("abc").expect("cursor");
            db.put("/a.txt", &entry(3)).expect("put");
            db.put("/b.txt", &entry(1)).expect("put");
            db.rename("/b.txt", "/c.txt", &entry(2)).expect("rename");
            db.remove("/a.txt").expect("remove");
        }
        let db = StateDb::open(&path).expect("reopen");
        assert_eq!(db.cursor().expect("cursor"), "abc");
        assert!(db.bind_namespace("ns-2").is_err(), "a state bound to one namespace must refuse another");
        db.bind_namespace("ns-1").expect("same namespace");
        assert_eq!(db.get("/a.txt").expect("get"), None);
        assert_eq!(db.all().expect("all"), vec![("/c.txt".to_string(), entry(2))]);
    }

    #[test]
    fn a_pending_download_settles_only_where_the_file_shows_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = StateDb::open(&dir.path().join("state.redb")).expect("open");
        db.put("/renamed.txt", &entry(1)).expect("put");
        db.put("/not-renamed.txt", &entry(1)).expect("put");
        let newer = Entry { version: 2, size: 7, mtime_ns: 99, ..entry(2) };
        db.put_pending("/renamed.txt", &newer).expect("pending");
        db.put_pending("/not-renamed.txt", &newer).expect("pending");
        // Killed here: one file was renamed into place (it shows the new size and mtime), the
        // other still is the old one.
        let settled = db
            .resolve_pending(|path| {
                Ok(Some(match path {
                    "/renamed.txt" => Meta { size: 7, mtime_ns: 99 },
                    _ => Meta { size: 5, mtime_ns: 42 },
                }))
            })
            .expect("resolve");
        assert_eq!(settled, vec!["/renamed.txt".to_string()]);
        assert_eq!(db.get("/renamed.txt").expect("get"), Some(newer));
        assert_eq!(db.get("/not-renamed.txt").expect("get"), Some(entry(1)));
        // Nothing stays pending.
        assert!(db.resolve_pending(|_| Ok(None)).expect("resolve").is_empty());
    }
}
