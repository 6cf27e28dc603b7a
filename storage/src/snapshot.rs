//! Snapshots of the state, streamed: build writes the image while iterating a RocksDB
//! snapshot view, restore reads it back into the spare state column family in bounded write
//! batches and makes that column family live in one synced write. Neither holds the state
//! in memory.
//!
//! Image format: [`SNAPSHOT_MAGIC`], then key/value pairs in key order, each a big-endian
//! `u32` length and the bytes, then the blake3 checksum of everything before it.
//!
//! Crash safety of restore: until the final synced write the live state column family is
//! untouched and the spare one is invisible (no query reads it); a crash or a failed check
//! before that write leaves the old state live, and the next restore clears the spare first.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use rocksdb::{ColumnFamily, IteratorMode, WriteBatch, WriteOptions};

use crate::db::{STATE_KEYS_FROM, STATE_KEYS_TO};
use crate::{keys, StateMachine, StorageError};

/// Magic prefix of a snapshot image; the version is the last byte.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"RBXSNAP1";
/// Length of the blake3 checksum that ends a snapshot image.
pub const SNAPSHOT_CHECKSUM_BYTES: usize = 32;
/// A restore writes the spare state column family in write batches of about this size.
pub const RESTORE_BATCH_BYTES: usize = 4 << 20;
/// A restore flushes the spare state column family's memtable after about this many bytes,
/// so memory stays bounded whatever the column family's write buffer size.
pub const RESTORE_FLUSH_BYTES: usize = 16 << 20;
/// Buffer size of the image reader and writer.
const IO_BUFFER_BYTES: usize = 1 << 20;

/// What [`StateMachine::write_snapshot`] wrote.
#[derive(Debug, Clone)]
pub struct SnapshotWritten {
    /// The applied marker as of the image.
    pub marker: Option<Vec<u8>>,
    /// Length of the image in bytes, checksum included.
    pub bytes: u64,
    /// The blake3 checksum that ends the image.
    pub checksum: [u8; SNAPSHOT_CHECKSUM_BYTES],
}

/// What [`read_image`] found in an image.
#[derive(Debug, Clone)]
pub struct ImageSummary {
    /// The applied marker as of the image.
    pub marker: Option<Vec<u8>>,
    /// Length of the image in bytes, checksum included.
    pub bytes: u64,
    /// The blake3 checksum that ends the image.
    pub checksum: [u8; SNAPSHOT_CHECKSUM_BYTES],
    /// State records in the image.
    pub records: u64,
}

/// Checks an image (length, magic, checksum) and reads it through without restoring it:
/// its applied marker, and every chunk hash of its index, handed to `on_chunk` in order (a
/// backup lists the blocks its state names this way). Streams: memory stays bounded
/// whatever the image's size.
pub fn read_image(
    image: impl Read + Seek,
    mut on_chunk: impl FnMut(crate::blocks::BlockHash) -> Result<(), StorageError>,
) -> Result<ImageSummary, StorageError> {
    let mut image = BufReader::with_capacity(IO_BUFFER_BYTES, image);
    let body_len = verify_image(&mut image)?;
    let mut checksum = [0u8; SNAPSHOT_CHECKSUM_BYTES];
    image.seek(SeekFrom::Start(body_len))?;
    image.read_exact(&mut checksum)?;
    let mut body = pairs(&mut image, body_len)?;
    let marker_key = keys::applied_marker();
    let (chunks_from, chunks_to) = keys::chunk_range();
    let (mut key, mut value) = (Vec::new(), Vec::new());
    let (mut marker, mut records) = (None, 0);
    while body.limit() > 0 {
        read_framed(&mut body, &mut key)?;
        read_framed(&mut body, &mut value)?;
        records += 1;
        if key == marker_key {
            marker = Some(value.clone());
        } else if key >= chunks_from && key < chunks_to {
            if let Some(hash) = key.get(1..).and_then(|h| <[u8; 32]>::try_from(h).ok()) {
                on_chunk(crate::blocks::BlockHash(hash))?;
            }
        }
    }
    Ok(ImageSummary { marker, bytes: body_len + SNAPSHOT_CHECKSUM_BYTES as u64, checksum, records })
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    fn put_framed(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        let len = u32::try_from(bytes.len()).map_err(|_| StorageError::Corrupt("state value over 4 GiB".into()))?;
        self.put(&len.to_be_bytes())?;
        self.put(bytes)?;
        Ok(())
    }
}

fn corrupt_image(what: &str) -> StorageError {
    StorageError::Corrupt(format!("snapshot image: {what}"))
}

impl StateMachine {
    /// Writes a consistent image of the whole state, from one RocksDB snapshot view, to
    /// `out`, a buffer's worth at a time. The caller makes `out` durable.
    pub fn write_snapshot(&self, out: impl Write) -> Result<SnapshotWritten, StorageError> {
        self.write_snapshot_with(out, |_| {})
    }

    /// [`StateMachine::write_snapshot`], telling `on_marker` the image's applied marker before
    /// its first byte is written (a backup names the index it reflects before streaming it).
    pub fn write_snapshot_with(
        &self,
        out: impl Write,
        on_marker: impl FnOnce(Option<&[u8]>),
    ) -> Result<SnapshotWritten, StorageError> {
        self.db().sync_wal()?;
        let rocks = self.db().rocks();
        let state = self.db().state();
        let view = rocks.snapshot();
        let marker = view.get_cf(state, keys::applied_marker())?;
        on_marker(marker.as_deref());
        let mut out =
            Hashing { inner: BufWriter::with_capacity(IO_BUFFER_BYTES, out), hasher: blake3::Hasher::new(), bytes: 0 };
        out.put(SNAPSHOT_MAGIC)?;
        for item in view.iterator_cf(state, IteratorMode::Start) {
            let (key, value) = item?;
            out.put_framed(&key)?;
            out.put_framed(&value)?;
        }
        let checksum = out.hasher.finalize();
        out.inner.write_all(checksum.as_bytes())?;
        out.inner.flush()?;
        Ok(SnapshotWritten {
            marker,
            bytes: out.bytes + SNAPSHOT_CHECKSUM_BYTES as u64,
            checksum: *checksum.as_bytes(),
        })
    }

    /// Replaces the whole state with the image in `image` (read from its start). First
    /// checks the image's magic and checksum in one streaming pass (a bad image changes
    /// nothing); then fills the spare state column family in write batches of about
    /// [`RESTORE_BATCH_BYTES`], flushes it, and makes it live in one synced write together
    /// with `meta` (Raft metadata that must change with the state). Returns the image's
    /// applied marker.
    pub fn restore_snapshot(
        &self,
        image: impl Read + Seek,
        meta: &[(&[u8], &[u8])],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let mut image = BufReader::with_capacity(IO_BUFFER_BYTES, image);
        let body_len = verify_image(&mut image)?;
        let mut body = pairs(&mut image, body_len)?;

        let db = self.db();
        let spare = db.spare_state();
        // The spare column family is invisible until the switch; a crash before it loses
        // these writes harmlessly, so they skip the WAL and are flushed before the switch.
        let mut unlogged = WriteOptions::default();
        unlogged.disable_wal(true);
        let mut batch = WriteBatch::default();
        clear(&mut batch, spare);
        let marker_key = keys::applied_marker();
        let mut marker = None;
        let (mut key, mut value) = (Vec::new(), Vec::new());
        let mut unflushed = 0;
        while body.limit() > 0 {
            read_framed(&mut body, &mut key)?;
            read_framed(&mut body, &mut value)?;
            if key == marker_key {
                marker = Some(value.clone());
            }
            batch.put_cf(spare, &key, &value);
            if batch.size_in_bytes() >= RESTORE_BATCH_BYTES {
                unflushed += batch.size_in_bytes();
                db.rocks().write_opt(std::mem::take(&mut batch), &unlogged)?;
                if unflushed >= RESTORE_FLUSH_BYTES {
                    db.rocks().flush_cf(spare)?;
                    unflushed = 0;
                }
            }
        }
        db.rocks().write_opt(batch, &unlogged)?;
        db.rocks().flush_cf(spare)?;
        db.make_spare_state_live(meta)?;

        // The old state is the spare now: empty it (not synced: a start or a restore clears
        // it again).
        db.clear_spare_state()?;
        Ok(marker)
    }
}

/// The key/value pairs of a checked image of `body_len` bytes: read from its start, past
/// the magic (which must be there).
fn pairs<R: Read + Seek>(image: &mut R, body_len: u64) -> Result<std::io::Take<&mut R>, StorageError> {
    image.seek(SeekFrom::Start(0))?;
    let mut body = image.take(body_len);
    let mut magic = [0u8; SNAPSHOT_MAGIC.len()];
    body.read_exact(&mut magic)?;
    if &magic != SNAPSHOT_MAGIC {
        return Err(corrupt_image("bad header"));
    }
    Ok(body)
}

/// Deletes every state key of `cf`.
fn clear(batch: &mut WriteBatch, cf: &ColumnFamily) {
    batch.delete_range_cf(cf, STATE_KEYS_FROM, STATE_KEYS_TO);
}

/// Checks an image's length and checksum, reading it once from its start. Returns the length
/// of the checksummed body (magic and pairs).
fn verify_image(image: &mut (impl Read + Seek)) -> Result<u64, StorageError> {
    let len = image.seek(SeekFrom::End(0))?;
    let min = (SNAPSHOT_MAGIC.len() + SNAPSHOT_CHECKSUM_BYTES) as u64;
    if len < min {
        return Err(corrupt_image("too short"));
    }
    let body_len = len - SNAPSHOT_CHECKSUM_BYTES as u64;
    image.seek(SeekFrom::Start(0))?;
    let mut hasher = blake3::Hasher::new();
    let hashed = std::io::copy(&mut image.by_ref().take(body_len), &mut hasher)?;
    if hashed != body_len {
        return Err(corrupt_image("truncated"));
    }
    let mut checksum = [0u8; SNAPSHOT_CHECKSUM_BYTES];
    image.read_exact(&mut checksum)?;
    if hasher.finalize().as_bytes() != &checksum {
        return Err(corrupt_image("checksum mismatch"));
    }
    Ok(body_len)
}

/// Reads one length-prefixed field into `out`; the length must fit what is left of the body.
fn read_framed(body: &mut std::io::Take<impl Read>, out: &mut Vec<u8>) -> Result<(), StorageError> {
    let mut len = [0u8; 4];
    if body.limit() < 4 {
        return Err(corrupt_image("truncated length"));
    }
    body.read_exact(&mut len)?;
    let len = u64::from(u32::from_be_bytes(len));
    if body.limit() < len {
        return Err(corrupt_image("truncated value"));
    }
    out.clear();
    let read = body.by_ref().take(len).read_to_end(out)?;
    if read as u64 != len {
        return Err(corrupt_image("truncated value"));
    }
    Ok(())
}
