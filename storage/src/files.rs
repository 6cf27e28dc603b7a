//! Files and versions: the commit apply (conflict rules, refcounts, change feed) and the read
//! queries behind the metadata and sync API.

use rocksdb::IteratorMode;

use crate::command::{ConflictedCopy, FileCommit, FileMove, Outcome, Rejection};
use crate::records::{Chunk, FileRecord, VersionRecord};
use crate::state::{StateMachine, Txn};
use crate::{keys, StorageError};

/// How many conflicted-copy names are tried before giving up.
const CONFLICT_COPIES_MAX: u32 = 1_000;

fn file_at(txn: &Txn<'_>, namespace_id: &str, path: &str) -> Result<Option<FileRecord>, StorageError> {
    let Some(id) = txn.get::<String>("file path", &keys::file_path(namespace_id, path))? else { return Ok(None) };
    txn.get("file", &keys::file(&id))
}

pub(crate) fn commit(txn: &mut Txn<'_>, c: &FileCommit) -> Result<Outcome, StorageError> {
    let mut missing = Vec::new();
    for hash in &c.chunks {
        if txn.get_raw(&keys::chunk(&hash.0))?.is_none() && !missing.contains(hash) {
            missing.push(*hash);
        }
    }
    if !missing.is_empty() {
        return Ok(Outcome::Rejected(Rejection::MissingChunks(missing)));
    }
    let file = file_at(txn, &c.namespace_id, c.path.as_str())?;
    let current = file.as_ref().map_or(0, |f| f.current_version);
    let gone = file.as_ref().is_none_or(|f| f.deleted);
    if c.base_version == current || (gone && c.base_version == 0 && !c.deleted) {
        if c.deleted && gone {
            return Ok(Outcome::Rejected(Rejection::NotFound(format!("no file at {}", c.path))));
        }
        let id = file.as_ref().map_or(c.new_file_id.clone(), |f| f.id.clone());
        let version = write_version(txn, c, &id, file.as_ref(), &c.path)?;
        return Ok(Outcome::FileCommitted { file_id: id, version, unchanged: false });
    }
    if let Some(f) = &file {
        // A retry of a commit that already made version base + 1.
        if c.base_version < current {
            if let Some(made) = txn.get::<VersionRecord>("version", &keys::version(&f.id, c.base_version + 1))? {
                if made.chunks == c.chunks && made.deleted == c.deleted && made.path == c.path {
                    return Ok(Outcome::FileCommitted {
                        file_id: f.id.clone(),
                        version: made.version,
                        unchanged: false,
                    });
                }
            }
        }
        let latest = txn.get::<VersionRecord>("version", &keys::version(&f.id, current))?;
        if latest.is_some_and(|v| v.chunks == c.chunks && v.deleted == c.deleted) {
            return Ok(Outcome::FileCommitted { file_id: f.id.clone(), version: current, unchanged: true });
        }
    }
    if c.deleted {
        return Ok(Outcome::FileConflict { current_version: current, copy: None });
    }
    let copy = conflicted_copy(txn, c)?;
    Ok(Outcome::FileConflict { current_version: current, copy: Some(copy) })
}

pub(crate) fn move_file(txn: &mut Txn<'_>, m: &FileMove) -> Result<Outcome, StorageError> {
    let source = match file_at(txn, &m.namespace_id, m.from.as_str())? {
        Some(f) if !f.deleted => f,
        _ => return Ok(Outcome::Rejected(Rejection::NotFound(format!("no file at {}", m.from)))),
    };
    if source.current_version != m.base_version {
        return Ok(Outcome::FileConflict { current_version: source.current_version, copy: None });
    }
    let target = file_at(txn, &m.namespace_id, m.to.as_str())?;
    if target.as_ref().is_some_and(|f| !f.deleted) || m.from == m.to {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("a file exists at {}", m.to))));
    }
    let content: VersionRecord = txn
        .get("version", &keys::version(&source.id, source.current_version))?
        .ok_or_else(|| StorageError::Corrupt(format!("file {} lacks its current version", source.id)))?;
    let mut commit = FileCommit {
        namespace_id: m.namespace_id.clone(),
        path: m.to.clone(),
        chunks: content.chunks,
        size: content.size,
        mtime_ms: content.mtime_ms,
        base_version: target.as_ref().map_or(0, |f| f.current_version),
        deleted: false,
        device: m.device.clone(),
        new_file_id: m.new_file_id.clone(),
        copy_file_id: String::new(),
    };
    let id = target.as_ref().map_or(m.new_file_id.clone(), |f| f.id.clone());
    let version = write_version(txn, &commit, &id, target.as_ref(), &m.to)?;
    commit.path = m.from.clone();
    commit.chunks = Vec::new();
    commit.size = 0;
    commit.deleted = true;
    write_version(txn, &commit, &source.id, Some(&source), &m.from)?;
    Ok(Outcome::FileCommitted { file_id: id, version, unchanged: false })
}

/// Stores the client's content as a new file under the first free conflicted-copy name.
fn conflicted_copy(txn: &mut Txn<'_>, c: &FileCommit) -> Result<ConflictedCopy, StorageError> {
    for n in 1..=CONFLICT_COPIES_MAX {
        let Ok(path) = c.path.conflicted_copy(&c.device, n) else { break };
        let existing = file_at(txn, &c.namespace_id, path.as_str())?;
        if existing.as_ref().is_some_and(|f| !f.deleted) {
            continue;
        }
        let id = existing.as_ref().map_or(c.copy_file_id.clone(), |f| f.id.clone());
        let version = write_version(txn, c, &id, existing.as_ref(), &path)?;
        return Ok(ConflictedCopy { path, file_id: id, version });
    }
    Err(StorageError::Corrupt(format!("no free conflicted-copy name for {}", c.path)))
}

/// Appends a version: version record, file record, path index, change feed, cursor and
/// refcounts, all in the caller's apply.
fn write_version(
    txn: &mut Txn<'_>,
    c: &FileCommit,
    file_id: &str,
    previous: Option<&FileRecord>,
    path: &crate::paths::FilePath,
) -> Result<u64, StorageError> {
    let cursor_key = keys::namespace_cursor(&c.namespace_id);
    let seq = txn.get::<u64>("namespace cursor", &cursor_key)?.unwrap_or(0) + 1;
    txn.put(cursor_key, &seq);
    let version = previous.map_or(1, |f| f.current_version + 1);
    if let Some(previous) = previous {
        txn.delete(keys::change(&c.namespace_id, previous.seq));
        let superseded: VersionRecord = txn
            .get("version", &keys::version(&previous.id, previous.current_version))?
            .ok_or_else(|| StorageError::Corrupt(format!("file {} lacks its current version", previous.id)))?;
        txn.put_raw(keys::superseded(superseded.created_ms, &previous.id, superseded.version), Vec::new());
    } else {
        txn.put(keys::file_path(&c.namespace_id, path.as_str()), &file_id.to_string());
    }
    txn.put(keys::change(&c.namespace_id, seq), &file_id.to_string());
    let record = VersionRecord {
        version,
        path: path.clone(),
        chunks: c.chunks.clone(),
        size: c.size,
        mtime_ms: c.mtime_ms,
        device: c.device.clone(),
        created_ms: txn.now_ms,
        deleted: c.deleted,
        seq,
    };
    txn.put(keys::version(file_id, version), &record);
    let file = FileRecord {
        id: file_id.to_string(),
        namespace_id: c.namespace_id.clone(),
        path: path.clone(),
        current_version: version,
        deleted: c.deleted,
        seq,
    };
    txn.put(keys::file(file_id), &file);
    add_references(txn, &c.chunks, 1)?;
    Ok(version)
}

/// Adds `delta` (+1 or −1) to the refcount of each distinct chunk, keeping the orphan index
/// in step (a chunk enters it when its refcount reaches 0, and leaves it on first use).
fn add_references(txn: &mut Txn<'_>, chunks: &[crate::blocks::BlockHash], delta: i64) -> Result<(), StorageError> {
    let mut seen = Vec::new();
    for hash in chunks {
        if seen.contains(hash) {
            continue;
        }
        seen.push(*hash);
        let key = keys::chunk(&hash.0);
        let mut chunk: Chunk = txn.get("chunk", &key)?.ok_or_else(|| StorageError::Corrupt(format!("chunk {hash}")))?;
        if chunk.refcount == 0 {
            txn.delete(keys::orphan(chunk.orphan_since_ms, &hash.0));
        }
        chunk.refcount = chunk
            .refcount
            .checked_add_signed(delta)
            .ok_or_else(|| StorageError::Corrupt(format!("refcount of {hash}")))?;
        if chunk.refcount == 0 {
            chunk.orphan_since_ms = txn.now_ms;
            txn.put_raw(keys::orphan(chunk.orphan_since_ms, &hash.0), Vec::new());
        }
        txn.put(key, &chunk);
    }
    Ok(())
}

pub(crate) fn expire_versions(txn: &mut Txn<'_>, created_before_ms: u64, max: usize) -> Result<Outcome, StorageError> {
    let (start, end) = keys::superseded_until(created_before_ms);
    let mut removed = 0;
    for index_key in txn.committed_keys(&start, &end, max)? {
        txn.delete(index_key.clone());
        let Some((_, rest)) = keys::parse_timed(&index_key) else { continue };
        let Some((file_id, version)) = rest.split_last_chunk::<8>() else { continue };
        let (file_id, version) = (String::from_utf8_lossy(file_id).into_owned(), u64::from_be_bytes(*version));
        let current = txn.get::<FileRecord>("file", &keys::file(&file_id))?.map(|f| f.current_version);
        if current == Some(version) {
            continue;
        }
        let version_key = keys::version(&file_id, version);
        if let Some(record) = txn.get::<VersionRecord>("version", &version_key)? {
            txn.delete(version_key);
            add_references(txn, &record.chunks, -1)?;
            removed += 1;
        }
    }
    Ok(Outcome::Collected { removed })
}

pub(crate) fn collect_orphans(txn: &mut Txn<'_>, orphaned_before_ms: u64, max: usize) -> Result<Outcome, StorageError> {
    let (start, end) = keys::orphans_until(orphaned_before_ms);
    let mut removed = 0;
    for index_key in txn.committed_keys(&start, &end, max)? {
        txn.delete(index_key.clone());
        let Some((_, hash)) = keys::parse_timed(&index_key) else { continue };
        let Ok(hash) = <[u8; 32]>::try_from(hash) else { continue };
        let key = keys::chunk(&hash);
        if txn.get::<Chunk>("chunk", &key)?.is_some_and(|c| c.refcount == 0) {
            txn.delete(key);
            removed += 1;
        }
    }
    Ok(Outcome::Collected { removed })
}

/// A change of the feed: the file and its latest version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub seq: u64,
    pub file: FileRecord,
    pub version: VersionRecord,
}

impl StateMachine {
    /// The file at `path` and its current version.
    pub fn file_at(&self, namespace_id: &str, path: &str) -> Result<Option<(FileRecord, VersionRecord)>, StorageError> {
        let Some(id) = self.read::<String>("file path", &keys::file_path(namespace_id, path))? else { return Ok(None) };
        self.file(&id)
    }

    pub fn file(&self, file_id: &str) -> Result<Option<(FileRecord, VersionRecord)>, StorageError> {
        let Some(file) = self.read::<FileRecord>("file", &keys::file(file_id))? else { return Ok(None) };
        let version = self
            .read::<VersionRecord>("version", &keys::version(file_id, file.current_version))?
            .ok_or_else(|| StorageError::Corrupt(format!("file {file_id} lacks its current version")))?;
        Ok(Some((file, version)))
    }

    /// Every kept version of a file, newest first.
    pub fn versions(&self, file_id: &str) -> Result<Vec<VersionRecord>, StorageError> {
        let (start, end) = keys::version_range(file_id);
        let mut out: Vec<VersionRecord> =
            self.scan("version", &start, &end, usize::MAX)?.into_iter().map(|(_, v)| v).collect();
        out.reverse();
        Ok(out)
    }

    /// The namespace's last change sequence (0: nothing committed yet).
    pub fn namespace_cursor(&self, namespace_id: &str) -> Result<u64, StorageError> {
        Ok(self.read::<u64>("namespace cursor", &keys::namespace_cursor(namespace_id))?.unwrap_or(0))
    }

    /// At most `limit` changes after `after`, in feed order; each file once, at its latest.
    pub fn changes(&self, namespace_id: &str, after: u64, limit: usize) -> Result<Vec<Change>, StorageError> {
        let start = keys::change(namespace_id, after.saturating_add(1));
        let end = keys::change(namespace_id, u64::MAX);
        let mut out = Vec::new();
        for (key, file_id) in self.scan::<String>("change", &start, &end, limit)? {
            let seq = keys::change_seq(&key).ok_or_else(|| StorageError::Corrupt("change key".into()))?;
            let (file, version) =
                self.file(&file_id)?.ok_or_else(|| StorageError::Corrupt(format!("change names file {file_id}")))?;
            out.push(Change { seq, file, version });
        }
        Ok(out)
    }

    /// Files whose path starts with `prefix` (a folder with its trailing slash), at most `limit`,
    /// from `start_after` (exclusive).
    pub fn files_under(
        &self,
        namespace_id: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(FileRecord, VersionRecord)>, StorageError> {
        let mut start = keys::file_path(namespace_id, start_after.unwrap_or(prefix));
        if start_after.is_some() {
            start.push(0);
        }
        let mut end = keys::file_path(namespace_id, prefix);
        end.push(0xff);
        let mut out = Vec::new();
        for (_, file_id) in self.scan::<String>("file path", &start, &end, limit)? {
            if let Some(found) = self.file(&file_id)? {
                out.push(found);
            }
        }
        Ok(out)
    }

    /// Up to `limit` chunk hashes of the index after `after` (for the block replicator).
    pub fn chunk_hashes(
        &self,
        after: Option<&crate::blocks::BlockHash>,
        limit: usize,
    ) -> Result<Vec<crate::blocks::BlockHash>, StorageError> {
        let (mut start, end) = keys::chunk_range();
        if let Some(after) = after {
            start = keys::chunk(&after.0);
            start.push(0);
        }
        let rows = self.scan::<Chunk>("chunk", &start, &end, limit)?;
        Ok(rows
            .into_iter()
            .filter_map(|(key, _)| key.get(1..).and_then(|h| h.try_into().ok()).map(crate::blocks::BlockHash))
            .collect())
    }

    /// Keys of `[start, end)`, at most `limit`.
    pub(crate) fn scan_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut out = Vec::new();
        let mode = IteratorMode::From(start, rocksdb::Direction::Forward);
        for item in self.db().rocks().iterator_cf(self.db().cf(crate::cf::STATE), mode) {
            let (key, _) = item?;
            if *key >= *end || out.len() >= limit {
                break;
            }
            out.push(key.into_vec());
        }
        Ok(out)
    }

    pub(crate) fn scan<T: serde::de::DeserializeOwned>(
        &self,
        what: &'static str,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, T)>, StorageError> {
        let mut out = Vec::new();
        let mode = IteratorMode::From(start, rocksdb::Direction::Forward);
        for item in self.db().rocks().iterator_cf(self.db().cf(crate::cf::STATE), mode) {
            let (key, value) = item?;
            if *key >= *end || out.len() >= limit {
                break;
            }
            out.push((key.into_vec(), serde_json::from_slice(&value).map_err(StorageError::decode(what))?));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
