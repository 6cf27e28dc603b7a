//! Moving content: a local file's chunks (FastCDC, as `raftbox files put`), uploading only
//! those the cluster lacks; and a remote version written locally, atomically (a temporary
//! file beside it, fsynced, renamed over it, the folder fsynced), each chunk read from a
//! local file that holds it when one does ([`ReuseIndex`]) and downloaded otherwise.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures::stream::{self, StreamExt as _, TryStreamExt as _};

use super::ignore_rules::TEMP_SUFFIX;
use super::remote::Remote;
use super::scan::{local_path, Meta};
use super::state::Entry;
use crate::files_client::{self, Chunk};

/// Chunks downloaded at once for one file.
const DOWNLOADS_IN_FLIGHT: usize = 8;

/// A local file's content: its chunks and lengths, and the size and mtime it had when read.
#[derive(Debug, Clone)]
pub struct Content {
    pub chunks: Vec<String>,
    pub lengths: Vec<u64>,
    pub meta: Meta,
}

impl Content {
    pub fn entry(&self, version: u64) -> Entry {
        Entry {
            version,
            chunks: self.chunks.clone(),
            lengths: self.lengths.clone(),
            size: self.meta.size,
            mtime_ns: self.meta.mtime_ns,
            stale: false,
        }
    }
}

/// The chunks of the file at `path`, with its size and mtime as they were before it was
/// read; `None` if it vanished or changed while it was read.
pub async fn read_content(path: &Path) -> anyhow::Result<Option<Content>> {
    let Some(before) = Meta::read(path)? else { return Ok(None) };
    let chunks = match files_client::chunk_file(path).await {
        Ok(chunks) => chunks,
        Err(_) if Meta::read(path)?.is_none() => return Ok(None),
        Err(e) => return Err(e),
    };
    if Meta::read(path)? != Some(before) {
        return Ok(None);
    }
    Ok(Some(Content {
        chunks: chunks.iter().map(|c| c.hash.clone()).collect(),
        lengths: chunks.iter().map(|c| c.length as u64).collect(),
        meta: before,
    }))
}

/// What an upload sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    pub chunks: u64,
    pub bytes: u64,
}

/// Uploads the chunks of `content` (read from `path`) the cluster lacks.
pub async fn upload(remote: &Remote, path: &Path, content: &Content) -> anyhow::Result<Sent> {
    let hashes = &content.chunks;
    let missing = remote.read(|api| async move { files_client::missing(&api, hashes).await }).await?;
    if missing.is_empty() {
        return Ok(Sent::default());
    }
    let bytes: u64 = content
        .chunks
        .iter()
        .zip(&content.lengths)
        .filter(|(hash, _)| missing.contains(*hash))
        .map(|(_, length)| length)
        .sum::<u64>();
    let missing = &missing;
    let uploaded = remote
        .read(|api| async move { files_client::upload(&api, path, missing, indicatif::ProgressBar::hidden()).await })
        .await?;
    Ok(Sent { chunks: uploaded as u64, bytes })
}

/// Where chunks already lie in local files: hash → (file, offset, length), from the sync
/// state's chunk lists. A hit is checked against its hash when read (the file may have
/// changed since).
#[derive(Default)]
pub struct ReuseIndex {
    at: HashMap<String, (PathBuf, u64, usize)>,
}

impl ReuseIndex {
    pub fn new(root: &Path, entries: &[(String, Entry)]) -> ReuseIndex {
        let mut at = HashMap::new();
        for (path, entry) in entries {
            let mut offset = 0u64;
            for (hash, length) in entry.chunks.iter().zip(&entry.lengths) {
                at.entry(hash.clone()).or_insert_with(|| (local_path(root, path), offset, *length as usize));
                offset += length;
            }
        }
        ReuseIndex { at }
    }

    /// The bytes of chunk `hash` from a local file, if one still holds them.
    fn read(&self, hash: &str) -> Option<Vec<u8>> {
        let (path, offset, length) = self.at.get(hash)?;
        let mut file = File::open(path).ok()?;
        let chunk = Chunk { hash: hash.to_string(), offset: *offset, length: *length };
        files_client::read_at(&mut file, &chunk).ok()
    }
}

/// What a download fetched and reused.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fetched {
    pub chunks: u64,
    pub bytes: u64,
    pub reused: u64,
}

/// Writes the content `chunks` to `target` atomically, provided the local file there still
/// is as `expected` says (`None`: absent) when the new content is complete; otherwise leaves
/// it alone and answers `None` (a local edit made meanwhile is never overwritten). Answers
/// the written file's content. `before_rename` is told that content (its size and mtime are
/// the file's once renamed) just before the rename, so the caller can record it first.
pub async fn write_file(
    remote: &Remote,
    reuse: &ReuseIndex,
    target: &Path,
    chunks: &[String],
    expected: Option<Meta>,
    before_rename: impl FnOnce(&Content) -> anyhow::Result<()>,
) -> anyhow::Result<Option<(Content, Fetched)>> {
    let dir = target.parent().context("a file without a folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let name = target.file_name().context("a file without a name")?.to_string_lossy();
    let temp = dir.join(format!(".{name}{TEMP_SUFFIX}"));
    let result = assemble(remote, reuse, &temp, chunks).await;
    let (lengths, fetched) = match result {
        Ok(done) => done,
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    if Meta::read(target)? != expected {
        let _ = std::fs::remove_file(&temp);
        return Ok(None);
    }
    // A rename keeps the file's size and mtime: the temporary file's are the target's to be.
    let meta = Meta::read(&temp)?.context("the file just written vanished")?;
    let content = Content { chunks: chunks.to_vec(), lengths, meta };
    if let Err(e) = before_rename(&content) {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    std::fs::rename(&temp, target).with_context(|| format!("move into {}", target.display()))?;
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("fsync {}", dir.display()))?;
    Ok(Some((content, fetched)))
}

/// The content `chunks` in the new file `temp`, fsynced; each chunk's length.
async fn assemble(
    remote: &Remote,
    reuse: &ReuseIndex,
    temp: &Path,
    chunks: &[String],
) -> anyhow::Result<(Vec<u64>, Fetched)> {
    let mut out = File::create(temp).with_context(|| format!("create {}", temp.display()))?;
    let mut fetched = Fetched::default();
    let mut lengths = Vec::with_capacity(chunks.len());
    let mut pieces = stream::iter(chunks.iter().map(|hash| async move {
        if let Some(bytes) = reuse.read(hash) {
            return anyhow::Ok((bytes::Bytes::from(bytes), true));
        }
        let bytes = remote.read(|api| async move { files_client::download(&api, hash).await }).await?;
        Ok((bytes, false))
    }))
    .buffered(DOWNLOADS_IN_FLIGHT);
    while let Some((bytes, local)) = pieces.try_next().await? {
        out.write_all(&bytes).with_context(|| format!("write {}", temp.display()))?;
        lengths.push(bytes.len() as u64);
        if local {
            fetched.reused += 1;
        } else {
            fetched.chunks += 1;
            fetched.bytes += bytes.len() as u64;
        }
    }
    out.sync_all().with_context(|| format!("fsync {}", temp.display()))?;
    Ok((lengths, fetched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_byte_overwrite_changes_one_chunk() {
        let mut data = vec![0u8; 16_000_000];
        blake3::Hasher::new().update(b"one byte").finalize_xof().fill(&mut data);
        let hashes = |data: &[u8]| -> Vec<String> {
            files_client::chunks_of(data, |_, _| Ok(())).expect("chunks").into_iter().map(|c| c.hash).collect()
        };
        let before = hashes(&data);
        data[8_000_000] ^= 0xff;
        let after = hashes(&data);
        assert_eq!(before.len(), after.len());
        let new: Vec<&String> = after.iter().filter(|h| !before.contains(h)).collect();
        assert_eq!(new.len(), 1, "{} of {} chunks changed", new.len(), after.len());
    }

    #[test]
    fn chunks_are_found_again_in_local_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut data = vec![0u8; 3_000_000];
        blake3::Hasher::new().update(b"reuse").finalize_xof().fill(&mut data);
        std::fs::write(dir.path().join("old.bin"), &data).expect("write");
        let chunks = files_client::chunks_of(data.as_slice(), |_, _| Ok(())).expect("chunks");
        assert!(chunks.len() >= 2, "{} chunks", chunks.len());
        let entry = Entry {
            version: 1,
            chunks: chunks.iter().map(|c| c.hash.clone()).collect(),
            lengths: chunks.iter().map(|c| c.length as u64).collect(),
            size: data.len() as u64,
            mtime_ns: 0,
            stale: false,
        };
        let index = ReuseIndex::new(dir.path(), &[("/old.bin".to_string(), entry)]);
        let last = chunks.last().expect("a chunk");
        let bytes = index.read(&last.hash).expect("reused");
        assert_eq!(bytes, &data[last.offset as usize..]);
        assert!(index.read(&"00".repeat(32)).is_none());
        // The file changed since: the stale hit is refused, not returned.
        data[last.offset as usize] ^= 1;
        std::fs::write(dir.path().join("old.bin"), &data).expect("rewrite");
        assert!(index.read(&last.hash).is_none());
    }
}
