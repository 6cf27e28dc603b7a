//! Moving content. Up: a local file's chunks (FastCDC, as `raftbox files put`), read through
//! the folder's descriptors and never while the file is being written, uploading only those
//! the cluster lacks. Down: a remote version assembled in a temporary file beside its target,
//! each chunk read from a local file that holds it when one does ([`ReuseIndex`]) and
//! downloaded otherwise; a download cut short is resumed from the chunks its temporary file
//! already holds.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::os::fd::OwnedFd;

use anyhow::Context;
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use rustix::fs::{self as rfs, Mode, OFlags};

use super::folder::{now_ns, Folder, Meta, Node};
use super::names::Rel;
use super::remote::Remote;
use super::state::{Entry, Partial};
use crate::files_client::{self, Chunk};

/// Chunks downloaded at once for one file.
const DOWNLOADS_IN_FLIGHT: usize = 8;

/// A local file's content: its chunks and lengths, its metadata before it was read, and when
/// the read ended.
#[derive(Debug, Clone)]
pub struct Content {
    pub chunks: Vec<String>,
    pub lengths: Vec<u64>,
    pub meta: Meta,
    pub read_ns: u64,
}

impl Content {
    /// The entry recording that the local file holds `version` with this content.
    pub fn entry(&self, version: u64) -> Entry {
        Entry {
            version,
            chunks: self.chunks.clone(),
            lengths: self.lengths.clone(),
            executable: self.meta.executable,
            meta: self.meta,
            recorded_ns: self.read_ns,
            stale: false,
            local: None,
            unverified: false,
        }
    }
}

/// The chunks of the file `rel`, or `None` if it is not ready to be read: it changed while
/// it was read (or was replaced), or changed so recently that a write may still be under way
/// within the file system's timestamp granularity (`window_ns`). What is answered is never a
/// torn read.
pub async fn read_content(folder: &Folder, rel: &Rel, window_ns: u64) -> anyhow::Result<Option<Content>> {
    let (file, before) = match folder.open_file(rel) {
        Ok(opened) => opened,
        Err(_) if !matches!(folder.node(rel)?, Node::File(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    // Changed within the window around now: a write may still be under way. (A timestamp
    // far in the future is not "now": such a file is read, and the stat taken after the read
    // tells whether it changed meanwhile.)
    let now = now_ns();
    if now.abs_diff(before.mtime_ns) < window_ns || now.abs_diff(before.ctime_ns) < window_ns {
        return Ok(None);
    }
    let probe = file.try_clone().context("duplicate a descriptor")?;
    let chunks =
        tokio::task::spawn_blocking(move || files_client::chunks_of(std::io::BufReader::new(file), |_, _| Ok(())))
            .await??;
    let after = Meta::of(&rfs::fstat(&probe).map_err(std::io::Error::from)?);
    let read_ns = now_ns();
    if after != before || folder.node(rel)? != Node::File(before) {
        return Ok(None);
    }
    Ok(Some(Content {
        chunks: chunks.iter().map(|c| c.hash.clone()).collect(),
        lengths: chunks.iter().map(|c| c.length as u64).collect(),
        meta: before,
        read_ns,
    }))
}

/// What an upload sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    pub chunks: u64,
    pub bytes: u64,
}

/// Uploads the chunks of `content` (the file `rel`) the cluster lacks.
pub async fn upload(remote: &Remote, folder: &Folder, rel: &Rel, content: &Content) -> anyhow::Result<Sent> {
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
    let label = rel.to_string();
    let label = &label;
    let uploaded = remote
        .read(|api| async move {
            let (file, _) = folder.open_file(rel)?;
            let bar = indicatif::ProgressBar::hidden();
            files_client::upload(&api, file, label, missing, bar, remote.up.as_ref()).await
        })
        .await?;
    Ok(Sent { chunks: uploaded as u64, bytes })
}

/// Where chunks already lie in local files: hash → (file, offset, length), from the sync
/// state's entries. A hit is checked against its hash when read (the file may have changed
/// since).
#[derive(Default)]
pub struct ReuseIndex {
    at: HashMap<String, (Rel, u64, usize)>,
}

impl ReuseIndex {
    pub fn new<'a>(entries: impl Iterator<Item = (Rel, &'a Entry)>) -> ReuseIndex {
        let mut index = ReuseIndex::default();
        for (rel, entry) in entries {
            index.add(&rel, entry);
        }
        index
    }

    /// The chunks of `entry` (the file `rel`) can be read from it.
    pub fn add(&mut self, rel: &Rel, entry: &Entry) {
        let mut offset = 0u64;
        for (hash, length) in entry.chunks.iter().zip(&entry.lengths) {
            self.at.entry(hash.clone()).or_insert_with(|| (rel.clone(), offset, *length as usize));
            offset += length;
        }
    }

    /// The bytes of chunk `hash` from a local file, if one still holds them.
    fn read(&self, folder: &Folder, hash: &str) -> Option<Vec<u8>> {
        let (rel, offset, length) = self.at.get(hash)?;
        let (mut file, _) = folder.open_file(rel).ok()?;
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
    /// Chunks found already written by a download cut short.
    pub resumed: u64,
}

/// A version assembled in a temporary file beside its target, durable and with the server's
/// mtime and execute bit, ready to be swapped in.
pub struct Assembled {
    pub dir: OwnedFd,
    pub temp: String,
    pub lengths: Vec<u64>,
    /// The temporary file as finished (its inode tells it from anything else later).
    pub meta: Meta,
    pub fetched: Fetched,
}

/// Assembles `chunks` for the file `rel` in a temporary file: `partial`'s, resumed, when it
/// was cutting the same chunks short, else a new one (recorded through `record` first, so a
/// download cut short now is resumed later). On an error the temporary file stays, for the
/// next attempt.
pub async fn assemble(
    folder: &Folder,
    remote: &Remote,
    reuse: &ReuseIndex,
    rel: &Rel,
    chunks: &[String],
    mtime_ms: u64,
    executable: bool,
    partial: Option<Partial>,
    record: impl FnOnce(&Partial) -> anyhow::Result<()>,
) -> anyhow::Result<Assembled> {
    let resumable = partial.filter(|p| p.dir == rel.parent() && p.chunks == chunks);
    let (dir, mut out, temp, mut lengths) = match resumable.and_then(|p| reopen(folder, &p, chunks).ok()) {
        Some(found) => found,
        None => {
            let (dir, file, temp) = folder.create_temp(rel.parent())?;
            let ino = rfs::fstat(&file).map_err(std::io::Error::from)?.st_ino as u64;
            record(&Partial { dir: rel.parent().to_string(), temp: temp.clone(), ino, chunks: chunks.to_vec() })?;
            (dir, file, temp, Vec::new())
        }
    };
    let mut fetched = Fetched { resumed: lengths.len() as u64, ..Fetched::default() };
    let rest = &chunks[lengths.len()..];
    let mut pieces = stream::iter(rest.iter().map(|hash| async move {
        if let Some(bytes) = reuse.read(folder, hash) {
            return anyhow::Ok((bytes::Bytes::from(bytes), true));
        }
        let bytes =
            remote.read(|api| async move { files_client::download(&api, hash, remote.down.as_ref()).await }).await?;
        Ok((bytes, false))
    }))
    .buffered(DOWNLOADS_IN_FLIGHT);
    while let Some((bytes, local)) = pieces.try_next().await? {
        out.write_all(&bytes).with_context(|| format!("write the download of {rel}"))?;
        lengths.push(bytes.len() as u64);
        if local {
            fetched.reused += 1;
        } else {
            fetched.chunks += 1;
            fetched.bytes += bytes.len() as u64;
        }
    }
    let meta =
        Folder::finish_temp(&out, mtime_ms, executable).with_context(|| format!("finish the download of {rel}"))?;
    Ok(Assembled { dir, temp, lengths, meta, fetched })
}

/// The temporary file of a download cut short, cut back to the longest run of `chunks` it
/// holds intact from its start (content-defined chunk boundaries of a prefix are those of
/// the whole), positioned to go on from there.
fn reopen(folder: &Folder, partial: &Partial, chunks: &[String]) -> anyhow::Result<(OwnedFd, File, String, Vec<u64>)> {
    let dir = folder.open_dir(&partial.dir, false)?;
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rfs::openat(&dir, partial.temp.as_str(), flags, Mode::empty()).map_err(std::io::Error::from)?;
    let st = rfs::fstat(&fd).map_err(std::io::Error::from)?;
    if partial.ino == 0 || st.st_ino as u64 != partial.ino {
        anyhow::bail!("{} is no longer the download cut short", partial.temp);
    }
    let mut file = File::from(fd);
    let found = files_client::chunks_of(std::io::BufReader::new(file.try_clone()?), |_, _| Ok(()))?;
    let intact: Vec<u64> = found
        .iter()
        .zip(chunks)
        .take_while(|(got, want)| &got.hash == *want)
        .map(|(got, _)| got.length as u64)
        .collect();
    let keep: u64 = intact.iter().sum();
    file.set_len(keep)?;
    file.seek(SeekFrom::Start(keep))?;
    Ok((dir, file, partial.temp.clone(), intact))
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

    fn random(bytes: usize, seed: &[u8]) -> Vec<u8> {
        let mut data = vec![0u8; bytes];
        blake3::Hasher::new().update(seed).finalize_xof().fill(&mut data);
        data
    }

    #[test]
    fn chunks_are_found_again_in_local_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut data = random(3_000_000, b"reuse");
        std::fs::write(dir.path().join("old.bin"), &data).expect("write");
        let folder = Folder::open(dir.path(), 30).expect("folder");
        let chunks = files_client::chunks_of(data.as_slice(), |_, _| Ok(())).expect("chunks");
        assert!(chunks.len() >= 2, "{} chunks", chunks.len());
        let content = Content {
            chunks: chunks.iter().map(|c| c.hash.clone()).collect(),
            lengths: chunks.iter().map(|c| c.length as u64).collect(),
            meta: Meta::default(),
            read_ns: 0,
        };
        let rel = Rel::parse("old.bin").expect("rel");
        let index = ReuseIndex::new(std::iter::once((rel, &content.entry(1))));
        let last = chunks.last().expect("a chunk");
        let bytes = index.read(&folder, &last.hash).expect("reused");
        assert_eq!(bytes, &data[last.offset as usize..]);
        assert!(index.read(&folder, &"00".repeat(32)).is_none());
        // The file changed since: the stale hit is refused, not returned.
        data[last.offset as usize] ^= 1;
        std::fs::write(dir.path().join("old.bin"), &data).expect("rewrite");
        assert!(index.read(&folder, &last.hash).is_none());
    }

    #[test]
    fn a_download_cut_short_resumes_from_its_intact_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = random(6_000_000, b"resume");
        let chunks = files_client::chunks_of(data.as_slice(), |_, _| Ok(())).expect("chunks");
        assert!(chunks.len() >= 3, "{} chunks", chunks.len());
        let hashes: Vec<String> = chunks.iter().map(|c| c.hash.clone()).collect();
        std::fs::create_dir_all(dir.path().join("d")).expect("mkdir");
        let folder = Folder::open(dir.path(), 30).expect("folder");
        // Two whole chunks and half of the third were written before the cut.
        let cut = chunks[2].offset as usize + chunks[2].length / 2;
        let temp = crate::sync_client::names::temp_name();
        std::fs::write(dir.path().join("d").join(&temp), &data[..cut]).expect("write");
        let ino =
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.path().join("d").join(&temp)).expect("stat"));
        // Another file under that name (what an exchange may leave there) is never reused.
        let other = Partial { dir: "d".into(), temp: temp.clone(), ino: ino + 1, chunks: hashes.clone() };
        assert!(reopen(&folder, &other, &hashes).is_err());
        let partial = Partial { dir: "d".into(), temp: temp.clone(), ino, chunks: hashes.clone() };
        let (_, _, name, intact) = reopen(&folder, &partial, &hashes).expect("reopen");
        assert_eq!(name, temp);
        assert_eq!(intact, vec![chunks[0].length as u64, chunks[1].length as u64]);
        let kept = std::fs::metadata(dir.path().join("d").join(&temp)).expect("stat").len();
        assert_eq!(kept, (chunks[0].length + chunks[1].length) as u64);
    }
}
