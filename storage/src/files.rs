//! Files and versions: the commit apply (conflict rules, conflicted copies, the change feed),
//! moves, version expiry, and the read queries behind the metadata and sync API.

use crate::chunks::{self, Delta};
use crate::command::{ConflictedCopy, FileCommit, FileMove, Outcome, Rejection};
use crate::keys::Expiring;
use crate::paths::{device_label, FilePath};
use crate::records::{ChangeRecord, ConflictRecord, FileRecord, Namespace, NamespaceKind, User, VersionRecord};
use crate::state::{StateMachine, Txn};
use crate::{keys, sharing, StorageError};

/// Numbered conflicted-copy names tried (`<device>`, `<device> 2`, …) before the copy is
/// named by its (random, fresh) file id instead, so naming never runs out.
const CONFLICT_COPIES_NUMBERED: u64 = 1_000;
/// Suffixed variants (`<id>.1`, `<id>.2`, …) of a proposed file id tried when it is taken.
const FILE_ID_VARIANTS: u64 = 1_000;
/// Changes a feed read reserves room for up front, at most (a page may ask for more).
const CHANGES_RESERVE_MAX: usize = 10_000;
/// Records a folder listing reads at a time.
const FOLDER_SCAN_BATCH: usize = 256;
/// How long a conflicting commit's answer is kept for its retries, in ms (24 h).
pub const CONFLICT_RECORD_TTL_MS: u64 = 24 * 3600 * 1000;

pub(crate) fn file_at(txn: &Txn<'_>, namespace_id: &str, path: &str) -> Result<Option<FileRecord>, StorageError> {
    let Some(id) = txn.get::<String>("file path", &keys::file_path(namespace_id, path))? else { return Ok(None) };
    txn.get("file", &keys::file(&id))
}

/// The id a new file gets: `proposed` (a fresh uuid from the API), or — should a command
/// carry an id that some file already has — a variant of it that no file has, so that one
/// file's versions never land on another's. Total: the last resort is the namespace cursor's
/// next value, which no earlier variant can hold.
fn unused_file_id(txn: &Txn<'_>, proposed: &str) -> Result<String, StorageError> {
    if txn.get_raw(&keys::file(proposed))?.is_none() {
        return Ok(proposed.to_string());
    }
    for n in 1..=FILE_ID_VARIANTS {
        let candidate = format!("{proposed}.{n}");
        if txn.get_raw(&keys::file(&candidate))?.is_none() {
            return Ok(candidate);
        }
    }
    let mut n = FILE_ID_VARIANTS;
    loop {
        n = n.saturating_add(1);
        let candidate = format!("{proposed}.{}", blake3::hash(format!("{proposed}/{n}").as_bytes()).to_hex());
        if txn.get_raw(&keys::file(&candidate))?.is_none() || n == u64::MAX {
            return Ok(candidate);
        }
    }
}

/// The actor's permission to change files in `namespace_id`, judged here in log order: a
/// rejection if they may not. An entry without an actor (from before sharing) is allowed.
pub(crate) fn may_write(
    txn: &Txn<'_>,
    actor_user_id: &str,
    namespace_id: &str,
) -> Result<Option<Outcome>, StorageError> {
    if actor_user_id.is_empty() {
        return Ok(None);
    }
    Ok(match sharing::role(txn, actor_user_id, namespace_id)? {
        None => Some(Outcome::Rejected(Rejection::NotFound(format!("namespace {namespace_id}")))),
        Some(role) if !role.can_write() => {
            Some(Outcome::Rejected(Rejection::Forbidden(format!("a {} cannot change files", role.as_str()))))
        }
        Some(_) => None,
    })
}

/// An entry of a folder listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FolderEntry {
    File { name: String, file: FileRecord, version: VersionRecord },
    Folder { name: String },
}

/// One page of a folder listing; `next` is where the next page starts, if one may follow.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FolderPage {
    pub entries: Vec<FolderEntry>,
    pub next: Option<String>,
}

pub(crate) fn commit(txn: &mut Txn<'_>, c: &FileCommit) -> Result<Outcome, StorageError> {
    if let Some(refused) = may_write(txn, &c.actor_user_id, &c.namespace_id)? {
        return Ok(refused);
    }
    // A block the author may not read is treated as missing: nobody commits content they
    // only know the hash of.
    let missing = match c.actor_user_id.as_str() {
        "" => chunks::missing(txn, &c.chunks)?,
        actor => chunks::unusable(txn, actor, &c.chunks)?,
    };
    if !missing.is_empty() {
        return Ok(Outcome::Rejected(Rejection::MissingChunks(missing)));
    }
    if let Some(quota_bytes) = c.quota_bytes.filter(|_| !c.deleted && !c.actor_user_id.is_empty()) {
        if let Some(refused) = chunks::charge(txn, &c.actor_user_id, &c.chunks, quota_bytes)? {
            return Ok(refused);
        }
    }
    let file = file_at(txn, &c.namespace_id, c.path.as_str())?;
    let current = file.as_ref().map_or(0, |f| f.current_version);
    let gone = file.as_ref().is_none_or(|f| f.deleted);
    if c.base_version == current || (gone && c.base_version == 0 && !c.deleted) {
        if c.deleted && gone {
            return Ok(Outcome::Rejected(Rejection::NotFound(format!("no file at {}", c.path))));
        }
        let id = match &file {
            Some(f) => f.id.clone(),
            None => unused_file_id(txn, &c.new_file_id)?,
        };
        let version = write_version(txn, c, &id, file.as_ref(), &c.path)?;
        return Ok(Outcome::FileCommitted { file_id: id, version, unchanged: false });
    }
    if let Some(f) = &file {
        if let Some(earlier) = earlier_answer(txn, c, f)? {
            return Ok(earlier);
        }
    }
    if c.deleted {
        return Ok(Outcome::FileConflict { current_version: current, copy: None });
    }
    let record_id = conflict_id(c);
    if let Some(record) = txn.get::<ConflictRecord>("conflict", &Expiring::Conflict.record(&record_id))? {
        if record.expires_ms > txn.now_ms {
            // The retry of a conflict already answered: the same one conflicted copy, and
            // the version current now (the file may have moved on since the first answer;
            // replaying that one's would report a version no read could still see).
            return Ok(Outcome::FileConflict { current_version: current, copy: Some(record.copy) });
        }
        txn.delete(Expiring::Conflict.index(record.expires_ms, &record_id));
    }
    let copy = conflicted_copy(txn, c)?;
    let expires_ms = txn.now_ms.saturating_add(CONFLICT_RECORD_TTL_MS);
    let record = ConflictRecord { current_version: current, copy: copy.clone(), expires_ms };
    txn.put(Expiring::Conflict.record(&record_id), &record);
    txn.put_raw(Expiring::Conflict.index(expires_ms, &record_id), Vec::new());
    Ok(Outcome::FileConflict { current_version: current, copy: Some(copy) })
}

/// A stale commit that needs no new version: the retry of a commit that already made
/// version `base + 1`, or content identical to the current version's.
fn earlier_answer(txn: &Txn<'_>, c: &FileCommit, f: &FileRecord) -> Result<Option<Outcome>, StorageError> {
    if c.base_version < f.current_version {
        if let Some(made) = txn.get::<VersionRecord>("version", &keys::version(&f.id, c.base_version + 1))? {
            if made.chunks == c.chunks && made.deleted == c.deleted && made.path == c.path {
                let outcome = Outcome::FileCommitted { file_id: f.id.clone(), version: made.version, unchanged: false };
                return Ok(Some(outcome));
            }
        }
    }
    let latest = txn.get::<VersionRecord>("version", &keys::version(&f.id, f.current_version))?;
    if latest.is_some_and(|v| v.chunks == c.chunks && v.deleted == c.deleted) {
        return Ok(Some(Outcome::FileCommitted { file_id: f.id.clone(), version: f.current_version, unchanged: true }));
    }
    Ok(None)
}

/// Identifies a conflicting commit by what a retry repeats: namespace, path, base version,
/// device and chunks.
fn conflict_id(c: &FileCommit) -> Vec<u8> {
    let mut hasher = blake3::Hasher::new();
    for part in [c.namespace_id.as_bytes(), c.path.as_str().as_bytes(), c.device.as_bytes()] {
        hasher.update(&(part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(&c.base_version.to_be_bytes());
    for hash in &c.chunks {
        hasher.update(&hash.0);
    }
    hasher.finalize().as_bytes().to_vec()
}

pub(crate) fn move_file(txn: &mut Txn<'_>, m: &FileMove) -> Result<Outcome, StorageError> {
    if let Some(refused) = may_write(txn, &m.actor_user_id, &m.namespace_id)? {
        return Ok(refused);
    }
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
    // A file's current version is never expired (`expire_versions` skips it), so its absence
    // is corruption, not input.
    let content: VersionRecord = txn
        .get("version", &keys::version(&source.id, source.current_version))?
        .ok_or_else(|| StorageError::Corrupt(format!("file {} lacks its current version", source.id)))?;
    let mut commit = FileCommit {
        namespace_id: m.namespace_id.clone(),
        path: m.to.clone(),
        chunks: content.chunks,
        size: content.size,
        mtime_ms: content.mtime_ms,
        executable: content.executable,
        base_version: target.as_ref().map_or(0, |f| f.current_version),
        deleted: false,
        device: m.device.clone(),
        new_file_id: m.new_file_id.clone(),
        copy_file_id: String::new(),
        actor_user_id: m.actor_user_id.clone(),
        // A move within one namespace names nothing new.
        quota_bytes: None,
    };
    let id = match &target {
        Some(f) => f.id.clone(),
        None => unused_file_id(txn, &m.new_file_id)?,
    };
    let version = write_version(txn, &commit, &id, target.as_ref(), &m.to)?;
    crate::props::carry(txn, &source.id, &id)?;
    commit.path = m.from.clone();
    commit.chunks = Vec::new();
    commit.size = 0;
    commit.deleted = true;
    write_version(txn, &commit, &source.id, Some(&source), &m.from)?;
    Ok(Outcome::FileCommitted { file_id: id, version, unchanged: false })
}

/// Stores the client's content as a new file under the first free conflicted-copy name:
/// `<device>`, `<device> 2`, … and past those `<device> <copy file id>` (a fresh random id,
/// so free). Should even that name be live, the content becomes its new version: whatever
/// the names in the namespace, the client's content is kept.
fn conflicted_copy(txn: &mut Txn<'_>, c: &FileCommit) -> Result<ConflictedCopy, StorageError> {
    let device = copy_label(txn, c)?;
    for n in 1..=CONFLICT_COPIES_NUMBERED {
        let path = c.path.conflicted_copy(&if n == 1 { device.clone() } else { format!("{device} {n}") });
        let existing = file_at(txn, &c.namespace_id, path.as_str())?;
        if existing.as_ref().is_none_or(|f| f.deleted) {
            return keep_copy(txn, c, path, existing);
        }
    }
    let path = c.path.conflicted_copy(&format!("{device} {}", c.copy_file_id));
    let existing = file_at(txn, &c.namespace_id, path.as_str())?;
    keep_copy(txn, c, path, existing)
}

/// Who a conflicted copy names: the device, and in a shared folder also the user
/// (`bob's phone`), since several people's devices meet there.
fn copy_label(txn: &Txn<'_>, c: &FileCommit) -> Result<String, StorageError> {
    let device = device_label(&c.device);
    if c.actor_user_id.is_empty() {
        return Ok(device);
    }
    let shared = txn
        .get::<Namespace>("namespace", &keys::namespace(&c.namespace_id))?
        .is_some_and(|ns| ns.kind == NamespaceKind::SharedFolder);
    match txn.get::<User>("user", &keys::user(&c.actor_user_id))? {
        Some(user) if shared => Ok(format!("{}'s {device}", device_label(&user.name))),
        _ => Ok(device),
    }
}

fn keep_copy(
    txn: &mut Txn<'_>,
    c: &FileCommit,
    path: FilePath,
    existing: Option<FileRecord>,
) -> Result<ConflictedCopy, StorageError> {
    let id = match &existing {
        Some(f) => f.id.clone(),
        None => unused_file_id(txn, &c.copy_file_id)?,
    };
    let version = write_version(txn, c, &id, existing.as_ref(), &path)?;
    Ok(ConflictedCopy { path, file_id: id, version })
}

/// Appends a version: version record, file record, path index, change feed, cursor and
/// refcounts, all in the caller's apply.
fn write_version(
    txn: &mut Txn<'_>,
    c: &FileCommit,
    file_id: &str,
    previous: Option<&FileRecord>,
    path: &FilePath,
) -> Result<u64, StorageError> {
    let cursor_key = keys::namespace_cursor(&c.namespace_id);
    let seq = txn.get::<u64>("namespace cursor", &cursor_key)?.unwrap_or(0).saturating_add(1);
    txn.put(cursor_key, &seq);
    let version = previous.map_or(1, |f| f.current_version.saturating_add(1));
    if let Some(previous) = previous {
        txn.delete(keys::change(&c.namespace_id, previous.seq));
        txn.put_raw(keys::superseded(txn.now_ms, &previous.id, previous.current_version), Vec::new());
    } else {
        txn.put(keys::file_path(&c.namespace_id, path.as_str()), &file_id.to_string());
    }
    debug_assert!(
        txn.get_raw(&keys::version(file_id, version))?.is_none(),
        "version {version} of {file_id} is written once (version = previous + 1)"
    );
    let record = VersionRecord {
        version,
        path: path.clone(),
        chunks: c.chunks.clone(),
        size: c.size,
        mtime_ms: c.mtime_ms,
        executable: c.executable && !c.deleted,
        device: c.device.clone(),
        created_ms: txn.now_ms,
        deleted: c.deleted,
        seq,
    };
    txn.put(keys::version(file_id, version), &record);
    txn.put(keys::change(&c.namespace_id, seq), &ChangeRecord { file_id: file_id.to_string(), version: record });
    let file = FileRecord {
        id: file_id.to_string(),
        namespace_id: c.namespace_id.clone(),
        path: path.clone(),
        current_version: version,
        deleted: c.deleted,
        seq,
    };
    if c.deleted {
        crate::props::remove(txn, &file)?;
    }
    txn.put(keys::file(file_id), &file);
    chunks::reference(txn, &c.namespace_id, &c.chunks, Delta::Add)?;
    Ok(version)
}

/// Deletes up to `max` versions that stopped being current at or before
/// `superseded_before_ms` (never a current version), dropping their chunk references.
pub(crate) fn expire_versions(
    txn: &mut Txn<'_>,
    superseded_before_ms: u64,
    max: usize,
) -> Result<Outcome, StorageError> {
    let (start, end) = keys::superseded_until(superseded_before_ms);
    let due = txn.committed_keys(&start, &end, max)?;
    let more = due.len() == max;
    let mut removed = 0;
    for index_key in due {
        txn.delete(index_key.clone());
        let Some((_, rest)) = keys::parse_timed(&index_key) else { continue };
        let Some((file_id, version)) = rest.split_last_chunk::<8>() else { continue };
        let (file_id, version) = (String::from_utf8_lossy(file_id).into_owned(), u64::from_be_bytes(*version));
        let file = txn.get::<FileRecord>("file", &keys::file(&file_id))?;
        if file.as_ref().is_some_and(|f| f.current_version == version) {
            continue;
        }
        let namespace_id = file.map(|f| f.namespace_id).unwrap_or_default();
        let version_key = keys::version(&file_id, version);
        if let Some(record) = txn.get::<VersionRecord>("version", &version_key)? {
            txn.delete(version_key);
            chunks::reference(txn, &namespace_id, &record.chunks, Delta::Drop)?;
            removed += 1;
        }
    }
    Ok(Outcome::Collected { removed, more })
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

    /// Every kept version of a file, newest first (tests; requests page through
    /// [`StateMachine::versions_page`]).
    pub fn versions(&self, file_id: &str) -> Result<Vec<VersionRecord>, StorageError> {
        self.versions_page(file_id, u64::MAX, usize::MAX)
    }

    /// The kept versions of a file below version `below`, newest first, at most `limit`:
    /// one reverse range scan of `limit` records.
    pub fn versions_page(&self, file_id: &str, below: u64, limit: usize) -> Result<Vec<VersionRecord>, StorageError> {
        let (start, _) = keys::version_range(file_id);
        let end = keys::version(file_id, below);
        Ok(self.scan_rev("version", &start, &end, limit)?.into_iter().map(|(_, v)| v).collect())
    }

    /// Version `version` of a file, if kept.
    pub fn version(&self, file_id: &str, version: u64) -> Result<Option<VersionRecord>, StorageError> {
        self.read("version", &keys::version(file_id, version))
    }

    /// One page of a folder's listing: its files and subfolders in name order after
    /// `start_after` (a page token: a path), at most `limit` entries, reading at most
    /// `work_max` records (a page may come short, with a token, when the folder holds many
    /// deleted files). A subfolder is one entry, found with one read: the scan then seeks
    /// past its whole subtree.
    pub fn list_folder(
        &self,
        namespace_id: &str,
        folder: &str,
        start_after: Option<&str>,
        limit: usize,
        work_max: usize,
    ) -> Result<FolderPage, StorageError> {
        let mut page = FolderPage::default();
        let mut cursor = start_after.map(str::to_string);
        let mut work = 0;
        'scan: loop {
            if page.entries.len() >= limit || work >= work_max {
                page.next = cursor;
                return Ok(page);
            }
            let want = (work_max - work).min(FOLDER_SCAN_BATCH);
            let batch = self.files_under(namespace_id, folder, cursor.as_deref(), want)?;
            if batch.is_empty() {
                return Ok(page);
            }
            for (file, version) in batch {
                work += 1;
                let rest = &file.path.as_str()[folder.len().min(file.path.as_str().len())..];
                if let Some(slash) = rest.find('/') {
                    let name = rest[..slash].to_string();
                    // Past the whole subtree (a place ending in `/`, which no file's path does:
                    // see `files_under`).
                    cursor = Some(format!("{folder}{name}/"));
                    page.entries.push(FolderEntry::Folder { name });
                    continue 'scan;
                }
                cursor = Some(file.path.as_str().to_string());
                if !file.deleted {
                    page.entries.push(FolderEntry::File { name: rest.to_string(), file, version });
                }
                if page.entries.len() >= limit || work >= work_max {
                    continue 'scan;
                }
            }
        }
    }

    /// The namespace's last change sequence (0: nothing committed yet).
    pub fn namespace_cursor(&self, namespace_id: &str) -> Result<u64, StorageError> {
        Ok(self.read::<u64>("namespace cursor", &keys::namespace_cursor(namespace_id))?.unwrap_or(0))
    }

    /// At most `limit` changes after `after`, in feed order; each file once, at its latest.
    /// One range scan: an entry carries its version ([`ChangeRecord`]); only an entry from
    /// before that (a bare file id) costs point reads.
    pub fn changes(&self, namespace_id: &str, after: u64, limit: usize) -> Result<Vec<Change>, StorageError> {
        let start = keys::change(namespace_id, after.saturating_add(1));
        let end = keys::change(namespace_id, u64::MAX);
        let mut out = Vec::with_capacity(limit.min(CHANGES_RESERVE_MAX));
        for (key, value) in self.scan_raw(&start, &end, limit)? {
            let seq = keys::change_seq(&key).ok_or_else(|| StorageError::Corrupt("change key".into()))?;
            out.push(self.change(namespace_id, seq, &value)?);
        }
        Ok(out)
    }

    /// One decoded feed entry.
    fn change(&self, namespace_id: &str, seq: u64, value: &[u8]) -> Result<Change, StorageError> {
        if value.first() == Some(&b'"') {
            let file_id: String = crate::state::decode("change", value)?;
            let (file, version) =
                self.file(&file_id)?.ok_or_else(|| StorageError::Corrupt(format!("change names file {file_id}")))?;
            return Ok(Change { seq, file, version });
        }
        let ChangeRecord { file_id, version } = crate::state::decode("change", value)?;
        let file = FileRecord {
            id: file_id,
            namespace_id: namespace_id.to_string(),
            path: version.path.clone(),
            current_version: version.version,
            deleted: version.deleted,
            seq,
        };
        Ok(Change { seq, file, version })
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
        match start_after {
            // After a whole folder `…/name/`: from `…/name0` on (`0` is the byte after `/`),
            // past every path under it, however it sorts.
            Some(after) if after.ends_with('/') => {
                start.pop();
                start.push(b'/' + 1);
            }
            Some(_) => start.push(0),
            None => {}
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
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
