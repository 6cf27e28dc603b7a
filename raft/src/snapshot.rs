//! The node's snapshot files. The current snapshot is one file in the node's snapshot
//! directory (`<data_dir>/snapshots`), named by its record in Raft metadata
//! (`keys::meta::SNAPSHOT`: the snapshot's meta and the file name); openraft reads it to send
//! it and writes a received one through [`SnapshotFile`], a chunk at a time.
//!
//! File names: `build-*.tmp` (being built), `recv-*.tmp` (being received), `snapshot-*.bin`
//! (complete, fsynced, renamed into place). A record names only a complete file, written
//! after the file is durable; whatever no record names is removed at start, after a new
//! snapshot becomes current, and (for abandoned receptions) when a new reception begins.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use raftbox_storage::{keys, Db, StorageError};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::types::SnapshotMeta;

/// openraft's `SnapshotData`: an open snapshot file and its path.
#[derive(Debug)]
pub struct SnapshotFile {
    file: tokio::fs::File,
    path: PathBuf,
}

impl SnapshotFile {
    /// Opens a complete snapshot file for reading.
    pub(crate) fn open(path: PathBuf) -> io::Result<SnapshotFile> {
        let file = std::fs::File::open(&path)?;
        Ok(SnapshotFile { file: tokio::fs::File::from_std(file), path })
    }

    /// Creates a new, empty file for writing and reading.
    pub(crate) fn create(path: PathBuf) -> io::Result<SnapshotFile> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok(SnapshotFile { file: tokio::fs::File::from_std(file), path })
    }

    /// The synchronous file (every buffered write flushed) and its path.
    pub(crate) async fn into_std(self) -> (std::fs::File, PathBuf) {
        (self.file.into_std().await, self.path)
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().file).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.get_mut().file).start_seek(position)
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.get_mut().file).poll_complete(cx)
    }
}

/// The current snapshot as recorded in Raft metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotRecord {
    pub(crate) meta: SnapshotMeta,
    /// File name in the snapshot directory.
    pub(crate) file: String,
}

impl SnapshotRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        // A struct of plain data serializes.
        serde_json::to_vec(self).expect("snapshot record serializes")
    }
}

/// What `keys::meta::SNAPSHOT` holds.
pub(crate) enum Stored {
    Record(SnapshotRecord),
    /// Written by versions before snapshot files: `[u32 meta length][meta JSON][image]`.
    Inline {
        meta: SnapshotMeta,
        image: Vec<u8>,
    },
}

/// Reads and decodes the current snapshot's record, if any.
pub(crate) fn stored(db: &Db) -> Result<Option<Stored>, StorageError> {
    let Some(raw) = db.meta_get(keys::meta::SNAPSHOT)? else { return Ok(None) };
    let corrupt = |what: &str| StorageError::Corrupt(format!("stored snapshot record: {what}"));
    if raw.first() == Some(&b'{') {
        let record = serde_json::from_slice(&raw).map_err(|e| corrupt(e.to_string().as_str()))?;
        return Ok(Some(Stored::Record(record)));
    }
    let (len, rest) = raw.split_first_chunk::<4>().ok_or_else(|| corrupt("truncated"))?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err(corrupt("truncated"));
    }
    let (meta, image) = rest.split_at(len);
    let meta = serde_json::from_slice(meta).map_err(|e| corrupt(e.to_string().as_str()))?;
    Ok(Some(Stored::Inline { meta, image: image.to_vec() }))
}

/// The directory holding a node's snapshot files.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotDir {
    path: PathBuf,
}

const BUILDING: &str = "build-";
const RECEIVING: &str = "recv-";
const COMPLETE: &str = "snapshot-";

impl SnapshotDir {
    pub(crate) fn open(path: PathBuf) -> io::Result<SnapshotDir> {
        std::fs::create_dir_all(&path)?;
        Ok(SnapshotDir { path })
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A new path for a snapshot being built.
    pub(crate) fn building(&self) -> PathBuf {
        self.path.join(format!("{BUILDING}{}.tmp", uuid::Uuid::new_v4()))
    }

    /// A new path for a snapshot being received.
    pub(crate) fn receiving(&self) -> PathBuf {
        self.path.join(format!("{RECEIVING}{}.tmp", uuid::Uuid::new_v4()))
    }

    /// Whether `path` is a reception file of this directory.
    pub(crate) fn is_receiving(&self, path: &Path) -> bool {
        path.parent() == Some(self.path.as_path())
            && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(RECEIVING))
    }

    /// Makes the file at `from` durable and renames it to a complete snapshot's name, durably.
    /// Returns the new name.
    pub(crate) fn complete(&self, from: &Path, file: &std::fs::File, meta: &SnapshotMeta) -> io::Result<String> {
        file.sync_all()?;
        let id: String = meta.snapshot_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        let name = format!("{COMPLETE}{id}-{}.bin", uuid::Uuid::new_v4());
        std::fs::rename(from, self.path.join(&name))?;
        self.sync()?;
        Ok(name)
    }

    /// Writes `image` as a complete snapshot file; returns its name.
    pub(crate) fn write(&self, meta: &SnapshotMeta, image: &[u8]) -> io::Result<String> {
        let path = self.building();
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        file.write_all(image)?;
        self.complete(&path, &file, meta)
    }

    /// Removes every file but `keep` (the current snapshot's) whose name starts with one of
    /// `prefixes`. Best effort: a file that cannot be removed is left for the next time.
    pub(crate) fn remove_except(&self, keep: Option<&str>, prefixes: &[&str]) {
        let Ok(entries) = std::fs::read_dir(&self.path) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if Some(name) == keep || !prefixes.iter().any(|p| name.starts_with(p)) {
                continue;
            }
            if let Err(error) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = name, %error, "could not remove an old snapshot file");
            }
        }
    }

    /// Removes complete snapshot files other than `keep`.
    pub(crate) fn remove_old(&self, keep: Option<&str>) {
        self.remove_except(keep, &[COMPLETE]);
    }

    /// Removes abandoned receptions.
    pub(crate) fn remove_receptions(&self) {
        self.remove_except(None, &[RECEIVING]);
    }

    /// At start: removes every file but `keep`.
    pub(crate) fn remove_all_but(&self, keep: Option<&str>) {
        self.remove_except(keep, &[COMPLETE, BUILDING, RECEIVING]);
    }

    fn sync(&self) -> io::Result<()> {
        std::fs::File::open(&self.path)?.sync_all()
    }
}
