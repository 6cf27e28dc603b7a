//! The on-disk block store of one node: immutable, content-addressed chunks, one file per
//! block under `blocks/ab/<hash>`.
//!
//! A block is written to a temporary file, fsynced, renamed into place and its directory
//! fsynced, so a block that `put` acknowledged survives `kill -9`. Its hash is checked before
//! writing and again on every read (pair assertions: a bit flipped on disk is never served):
//! the store writes only a [`VerifiedBlock`], which exists only once bytes were hashed and
//! matched — once per node on the way in ([`BlockReceiver`] hashes while the bytes arrive).

use std::fmt;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};

use crate::StorageError;

/// Largest block accepted, in bytes (8 MiB).
pub const BLOCK_BYTES_MAX: usize = 8 << 20;

/// Content-defined (FastCDC) chunk sizes every raftbox writer cuts files with — the CLI, the
/// sync client, WebDAV and the whole-file upload — so the same content makes the same blocks
/// whoever wrote it: small enough to dedupe edits, far below [`BLOCK_BYTES_MAX`].
pub const CHUNK_MIN_BYTES: usize = 256 * 1024;
pub const CHUNK_AVG_BYTES: usize = 1024 * 1024;
pub const CHUNK_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Shard directories of the store (`00` to `ff`: the hash's first byte).
const SHARDS: usize = 256;

/// A BLAKE3-256 block hash; displayed, parsed and serialized as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl serde::Serialize for BlockHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut hex = [0u8; 64];
        serializer.serialize_str(self.hex_into(&mut hex))
    }
}

impl<'de> serde::Deserialize<'de> for BlockHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<BlockHash, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl BlockHash {
    pub fn of(bytes: &[u8]) -> BlockHash {
        BlockHash(*blake3::hash(bytes).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        let mut hex = [0u8; 64];
        self.hex_into(&mut hex).to_string()
    }

    /// The hex form written into `out`, without allocating (sync pages print thousands).
    pub fn hex_into<'a>(&self, out: &'a mut [u8; 64]) -> &'a str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        std::str::from_utf8(out).expect("hex digits are ASCII")
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

/// A string that is not 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a block hash is 64 lowercase hex characters")]
pub struct BadHash;

impl FromStr for BlockHash {
    type Err = BadHash;

    fn from_str(s: &str) -> Result<BlockHash, BadHash> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(BadHash);
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(BadHash),
        };
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Ok(BlockHash(out))
    }
}

/// A block's bytes, checked against its hash: constructed only by hashing them, so whoever
/// holds one never hashes them again (the store writes these and nothing else).
#[derive(Clone, Debug)]
pub struct VerifiedBlock {
    hash: BlockHash,
    data: Bytes,
}

/// Bytes that do not hash to the hash they came with; `actual` is what they hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bytes hash to {actual}, not {expected}")]
pub struct HashMismatch {
    pub expected: BlockHash,
    pub actual: BlockHash,
}

impl VerifiedBlock {
    /// `data` as block `hash`, if it hashes to it.
    pub fn verify(hash: BlockHash, data: Bytes) -> Result<VerifiedBlock, HashMismatch> {
        let actual = BlockHash::of(&data);
        if actual != hash {
            return Err(HashMismatch { expected: hash, actual });
        }
        Ok(VerifiedBlock { hash, data })
    }

    /// `data` as the block it hashes to.
    pub fn of(data: Bytes) -> VerifiedBlock {
        VerifiedBlock { hash: BlockHash::of(&data), data }
    }

    pub fn hash(&self) -> BlockHash {
        self.hash
    }

    /// The bytes (a cheap, shared handle).
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A block arriving in pieces: each piece is hashed as it comes and appended to one buffer,
/// so the bytes are hashed once, with no second pass, and never exceed [`BLOCK_BYTES_MAX`].
pub struct BlockReceiver {
    hasher: blake3::Hasher,
    data: BytesMut,
}

/// A block that grew past [`BLOCK_BYTES_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a block is at most {BLOCK_BYTES_MAX} bytes")]
pub struct BlockTooLarge;

impl BlockReceiver {
    /// Room for `expected` bytes up front (a `Content-Length`), at most [`BLOCK_BYTES_MAX`].
    pub fn with_capacity(expected: usize) -> BlockReceiver {
        BlockReceiver { hasher: blake3::Hasher::new(), data: BytesMut::with_capacity(expected.min(BLOCK_BYTES_MAX)) }
    }

    /// Hashes and keeps the next piece.
    pub fn push(&mut self, piece: &[u8]) -> Result<(), BlockTooLarge> {
        if self.data.len().saturating_add(piece.len()) > BLOCK_BYTES_MAX {
            return Err(BlockTooLarge);
        }
        self.hasher.update(piece);
        self.data.extend_from_slice(piece);
        Ok(())
    }

    /// The whole block under the hash of what arrived (a caller that named no hash).
    pub fn hashed(self) -> VerifiedBlock {
        VerifiedBlock { hash: BlockHash(*self.hasher.finalize().as_bytes()), data: self.data.freeze() }
    }

    /// The whole block, if it hashes to `expected`.
    pub fn finish(self, expected: BlockHash) -> Result<VerifiedBlock, HashMismatch> {
        let actual = BlockHash(*self.hasher.finalize().as_bytes());
        if actual != expected {
            return Err(HashMismatch { expected, actual });
        }
        Ok(VerifiedBlock { hash: expected, data: self.data.freeze() })
    }
}

/// The block directory of a node.
#[derive(Debug)]
pub struct BlockStore {
    root: PathBuf,
    tmp_seq: AtomicU64,
}

impl BlockStore {
    /// Opens (creating) the store under `root` with its shard directories, removing temporary
    /// files a crash left.
    pub fn open(root: &Path) -> Result<BlockStore, StorageError> {
        fs::create_dir_all(root.join("tmp"))?;
        for entry in fs::read_dir(root.join("tmp"))? {
            let _ = fs::remove_file(entry?.path());
        }
        // Made once here rather than on the first put into each: a new directory costs an
        // inode allocation and a directory sync on the upload path.
        for shard in 0..SHARDS {
            let dir = root.join(format!("{shard:02x}"));
            if !dir.is_dir() {
                fs::create_dir(&dir)?;
            }
        }
        File::open(root)?.sync_all()?;
        Ok(BlockStore { root: root.to_path_buf(), tmp_seq: AtomicU64::new(0) })
    }

    fn path(&self, hash: &BlockHash) -> PathBuf {
        let hex = hash.to_hex();
        self.root.join(&hex[..2]).join(hex)
    }

    /// A directory on the block store's disk for temporary files (emptied at open).
    pub fn temp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn has(&self, hash: &BlockHash) -> bool {
        self.path(hash).is_file()
    }

    /// Stores a block durably (its hash was checked when it was made). Storing a block that
    /// is present is a no-op.
    pub fn put(&self, block: &VerifiedBlock) -> Result<(), StorageError> {
        let (hash, bytes) = (&block.hash, &block.data[..]);
        let path = self.path(hash);
        if path.is_file() {
            // Restart the reclaimer's grace period: this block is wanted again.
            File::options().write(true).open(&path)?.set_modified(std::time::SystemTime::now())?;
            return Ok(());
        }
        let dir = path.parent().expect("block paths have a parent");
        fs::create_dir_all(dir)?;
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.root.join("tmp").join(format!("{hash}.{}.{seq}", std::process::id()));
        write_synced(&tmp, bytes)?;
        fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()?;
        Ok(())
    }

    /// Reads a block and checks its hash; `None` if absent. A block whose bytes no longer
    /// hash to its name is removed and reported as corrupt.
    pub fn get(&self, hash: &BlockHash) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.path(hash);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if BlockHash::of(&bytes) != *hash {
            let _ = fs::remove_file(&path);
            return Err(StorageError::Corrupt(format!("block {hash} failed its hash check and was removed")));
        }
        Ok(Some(bytes))
    }

    /// Every block on disk with its modification time (for reclaiming and repair).
    pub fn list(&self) -> Result<Vec<(BlockHash, std::time::SystemTime)>, StorageError> {
        let mut out = Vec::new();
        self.each_block(|hash, metadata| {
            out.push((hash, metadata.modified()?));
            Ok(())
        })?;
        Ok(out)
    }

    /// Block files on disk and their total bytes (for the node's metrics).
    pub fn usage(&self) -> Result<(u64, u64), StorageError> {
        let (mut count, mut bytes) = (0u64, 0u64);
        self.each_block(|_, metadata| {
            count += 1;
            bytes += metadata.len();
            Ok(())
        })?;
        Ok((count, bytes))
    }

    /// Walks the shard directories: each block file (named by its hash) with its metadata.
    fn each_block(
        &self,
        mut each: impl FnMut(BlockHash, fs::Metadata) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        for shard in fs::read_dir(&self.root)? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(shard.path())? {
                let entry = entry?;
                let Some(hash) = entry.file_name().to_str().and_then(|n| n.parse::<BlockHash>().ok()) else { continue };
                each(hash, entry.metadata()?)?;
            }
        }
        Ok(())
    }

    /// When a block file was last written or re-put; `None` if absent. Compared only for
    /// equality (a re-put changes it), never against this node's wall clock.
    pub fn modified(&self, hash: &BlockHash) -> Result<Option<std::time::SystemTime>, StorageError> {
        match fs::metadata(self.path(hash)) {
            Ok(meta) => Ok(Some(meta.modified()?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a block (garbage collection). Absent is fine.
    pub fn remove(&self, hash: &BlockHash) -> Result<(), StorageError> {
        match fs::remove_file(self.path(hash)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// The alignment O_DIRECT asks of buffers, offsets and lengths (the largest logical block size
/// of the disks raftbox runs on).
const DIRECT_ALIGN: usize = 4096;

/// Writes `bytes` to a new file at `path` and fsyncs it.
///
/// Written with `O_DIRECT` where the filesystem allows it: a block is written once and read
/// rarely, and copying 4 MiB blocks into the page cache (and writing them back from it) was
/// more than half of a node's CPU under a 16-client upload. The bytes go through an aligned
/// buffer padded to [`DIRECT_ALIGN`], then the file is cut to its true length before the
/// fsync. Filesystems without `O_DIRECT` (tmpfs) get an ordinary buffered write.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match File::options().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(mut file) => {
                let padded = bytes.len().div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
                let mut buffer = AlignedBuffer::zeroed(padded);
                buffer.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
                match file.write_all(buffer.bytes()) {
                    Ok(()) => {
                        file.set_len(bytes.len() as u64)?;
                        return file.sync_all();
                    }
                    // Opened but refused at the first write: start again without O_DIRECT.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        drop(file);
                        fs::remove_file(path)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A zeroed heap buffer whose start is aligned to [`DIRECT_ALIGN`].
#[cfg(target_os = "linux")]
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

#[cfg(target_os = "linux")]
impl AlignedBuffer {
    fn zeroed(len: usize) -> AlignedBuffer {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuffer { storage, start, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_parse_and_print_as_lowercase_hex() {
        let hash = BlockHash::of(b"hello");
        let hex = hash.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex.parse::<BlockHash>(), Ok(hash));
        assert_eq!(hex.to_uppercase().parse::<BlockHash>(), Err(BadHash));
        assert_eq!(hex[..63].parse::<BlockHash>(), Err(BadHash));
        assert_eq!(format!("{}g", &hex[..63]).parse::<BlockHash>(), Err(BadHash));
        let json = serde_json::to_string(&hash).expect("serialize");
        assert_eq!(json, format!("\"{hex}\""));
        assert_eq!(serde_json::from_str::<BlockHash>(&json).expect("deserialize"), hash);
        assert!(serde_json::from_str::<BlockHash>("\"ab\"").is_err());
    }

    #[test]
    fn put_get_is_idempotent_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = BlockStore::open(dir.path()).expect("open");
        let hash = BlockHash::of(b"block");
        assert!(!store.has(&hash));
        assert_eq!(store.get(&hash).expect("get"), None);
        let block = VerifiedBlock::verify(hash, Bytes::from_static(b"block")).expect("verified");
        store.put(&block).expect("put");
        store.put(&block).expect("second put is a no-op");
        assert_eq!(store.get(&hash).expect("get"), Some(b"block".to_vec()));
        let other = VerifiedBlock::verify(hash, Bytes::from_static(b"other"));
        assert_eq!(other.map(|_| ()), Err(HashMismatch { expected: hash, actual: BlockHash::of(b"other") }));
        store.remove(&hash).expect("remove");
        store.remove(&hash).expect("remove absent");
        assert!(!store.has(&hash));
    }

    #[test]
    fn blocks_of_any_length_read_back_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = BlockStore::open(dir.path()).expect("open");
        for len in [0, 1, DIRECT_ALIGN - 1, DIRECT_ALIGN, DIRECT_ALIGN + 1, 3 * DIRECT_ALIGN + 17, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let hash = BlockHash::of(&data);
            store.put(&VerifiedBlock::verify(hash, Bytes::from(data.clone())).expect("verified")).expect("put");
            let on_disk = fs::metadata(store.path(&hash)).expect("metadata").len();
            assert_eq!(on_disk, len as u64, "file length of a {len}-byte block");
            assert_eq!(store.get(&hash).expect("get"), Some(data), "bytes of a {len}-byte block");
        }
    }

    #[test]
    fn a_received_block_is_hashed_piece_by_piece_and_bounded() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let hash = BlockHash::of(&data);
        let mut receiver = BlockReceiver::with_capacity(data.len());
        for piece in data.chunks(4_099) {
            receiver.push(piece).expect("under the limit");
        }
        let block = receiver.finish(hash).expect("the pieces hash to the whole");
        assert_eq!((block.hash(), &block.data()[..]), (hash, &data[..]));

        let mut receiver = BlockReceiver::with_capacity(0);
        receiver.push(&data[1..]).expect("under the limit");
        let wrong = receiver.finish(hash).map(|_| ());
        assert_eq!(wrong, Err(HashMismatch { expected: hash, actual: BlockHash::of(&data[1..]) }));

        let mut receiver = BlockReceiver::with_capacity(usize::MAX);
        receiver.push(&vec![0; BLOCK_BYTES_MAX]).expect("exactly the limit");
        assert_eq!(receiver.push(&[0]), Err(BlockTooLarge), "one byte past the limit");
    }

    #[test]
    fn opening_makes_every_shard_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        BlockStore::open(dir.path()).expect("open");
        BlockStore::open(dir.path()).expect("open again");
        for hash in [BlockHash([0; 32]), BlockHash([0xff; 32]), BlockHash::of(b"x")] {
            let hex = hash.to_hex();
            assert!(dir.path().join(&hex[..2]).is_dir(), "shard of {hex}");
        }
    }

    #[test]
    fn a_block_corrupted_on_disk_is_never_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = BlockStore::open(dir.path()).expect("open");
        let hash = BlockHash::of(b"precious");
        store.put(&VerifiedBlock::verify(hash, Bytes::from_static(b"precious")).expect("verified")).expect("put");
        fs::write(store.path(&hash), b"pr3cious").expect("corrupt");
        assert!(matches!(store.get(&hash), Err(StorageError::Corrupt(_))));
        assert!(!store.has(&hash), "the corrupt copy is removed so it can be fetched again");
    }
}
