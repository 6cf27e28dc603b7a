//! Opening a node's RocksDB and raw access to the Raft log and Raft metadata.
//!
//! Durability rule: every write that openraft must see durable (log append, vote, truncate)
//! goes through a synced write. All column families share one WAL, so a synced write also
//! makes every earlier unsynced write (state-machine applies) durable.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch,
    WriteOptions, DB,
};

use crate::{cf, keys, StorageError};

/// A cheap, cloneable handle to the node's database.
#[derive(Clone)]
pub struct Db {
    inner: Arc<DB>,
    /// Index into [`cf::STATES`] of the live state column family.
    live_state: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.inner.path()).finish()
    }
}

/// Memtables of every column family together: beyond this RocksDB's write buffer manager
/// flushes the largest, so a node's memory does not grow with its column families or load.
pub const MEMTABLES_BYTES_MAX: usize = 128 << 20;
/// The one block cache every column family shares (RocksDB's default is one per column
/// family).
pub const BLOCK_CACHE_BYTES: usize = 32 << 20;

/// Bloom filter bits per key in every table file (about 1 % false positives): a point read
/// of an absent key (most of a new file's lookups) skips the file instead of reading its
/// index and data blocks.
const BLOOM_BITS_PER_KEY: f64 = 10.0;
/// Share of a memtable's size given to a whole-key bloom filter, so a point read skips a
/// memtable that does not hold the key instead of searching its skip list.
const MEMTABLE_BLOOM_RATIO: f64 = 0.05;

/// Bounds of every state key (each starts with a table tag, far below 0xff).
pub(crate) const STATE_KEYS_FROM: &[u8] = &[0x00];
pub(crate) const STATE_KEYS_TO: &[u8] = &[0xff; 8];

pub(crate) fn write_options(sync: bool) -> WriteOptions {
    let mut options = WriteOptions::default();
    options.set_sync(sync);
    options
}

/// RocksDB's memory, in bytes (for the node's metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Active and immutable memtables (bounded together by [`MEMTABLES_BYTES_MAX`]).
    pub memtables: u64,
    /// Index and filter blocks of open table files, held outside the block cache.
    pub table_readers: u64,
    /// The shared block cache (bounded by [`BLOCK_CACHE_BYTES`]).
    pub block_cache: u64,
}

impl Db {
    /// Opens (creating if needed) the database at `path` with every column family of [`cf::ALL`].
    pub fn open(path: &Path) -> Result<Db, StorageError> {
        std::fs::create_dir_all(path)?;
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_keep_log_file_num(4);
        options.set_db_write_buffer_size(MEMTABLES_BYTES_MAX);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(BLOCK_CACHE_BYTES));
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
        options.set_block_based_table_factory(&table);
        let descriptors = cf::ALL.iter().map(|name| {
            let mut cf_options = Options::default();
            cf_options.set_block_based_table_factory(&table);
            cf_options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
            cf_options.set_memtable_whole_key_filtering(true);
            ColumnFamilyDescriptor::new(*name, cf_options)
        });
        let inner = DB::open_cf_descriptors(&options, path, descriptors)?;
        let db = Db { inner: Arc::new(inner), live_state: Arc::new(AtomicUsize::new(0)) };
        let live = match db.meta_get(keys::meta::STATE_CF)? {
            None => 0,
            Some(name) => cf::STATES
                .iter()
                .position(|state| state.as_bytes() == name.as_slice())
                .ok_or_else(|| StorageError::Corrupt("unknown live state column family".into()))?,
        };
        db.live_state.store(live, Ordering::SeqCst);
        db.check_format()?;
        // A restore that failed (out of space, a crash) left its unlogged writes flushed into
        // the spare column family, where they would take that space again at every start.
        db.clear_spare_state()?;
        Ok(db)
    }

    /// Refuses a data directory last opened by code of a newer format ([`crate::format`]);
    /// records this code's format otherwise (synced, before anything else is written).
    fn check_format(&self) -> Result<(), StorageError> {
        let current = crate::format::FORMAT;
        let stored = match self.meta_get(keys::meta::FORMAT)? {
            None => None,
            Some(raw) => Some(
                std::str::from_utf8(&raw)
                    .ok()
                    .and_then(|text| text.parse::<u32>().ok())
                    .ok_or_else(|| StorageError::Corrupt("the data directory's format record is unreadable".into()))?,
            ),
        };
        match stored {
            Some(format) if format > current => Err(StorageError::TooNew(crate::format::too_new(
                &format!("the data directory {}", self.inner.path().display()),
                format,
            ))),
            Some(format) if format == current => Ok(()),
            _ => self.meta_put(keys::meta::FORMAT, current.to_string().as_bytes(), true),
        }
    }

    pub(crate) fn rocks(&self) -> &DB {
        &self.inner
    }

    /// The database's directory.
    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    /// The live state column family: what `apply` writes and every query reads.
    pub(crate) fn state(&self) -> &ColumnFamily {
        self.cf(cf::STATES[self.live_state.load(Ordering::SeqCst)])
    }

    /// The other state column family: empty, or filled by a snapshot install before
    /// [`Db::make_spare_state_live`] switches to it.
    pub(crate) fn spare_state(&self) -> &ColumnFamily {
        self.cf(cf::STATES[1 - self.live_state.load(Ordering::SeqCst)])
    }

    /// Empties the spare state column family and gives its space back: a range delete over
    /// every state key, then a compaction of the whole range, which drops the covered files
    /// of every level (level 0 included, which `delete_file_in_range_cf` skips). Cheap when
    /// the column family is empty already.
    pub(crate) fn clear_spare_state(&self) -> Result<(), StorageError> {
        let spare = self.spare_state();
        self.inner.delete_range_cf_opt(spare, STATE_KEYS_FROM, STATE_KEYS_TO, &write_options(false))?;
        self.inner.delete_file_in_range_cf(spare, STATE_KEYS_FROM, STATE_KEYS_TO)?;
        self.inner.compact_range_cf(spare, Some(STATE_KEYS_FROM), Some(STATE_KEYS_TO));
        Ok(())
    }

    /// Makes the spare state column family the live one, durably, in one synced write that
    /// also carries `meta` (Raft metadata written with the switch, or not at all).
    pub(crate) fn make_spare_state_live(&self, meta: &[(&[u8], &[u8])]) -> Result<(), StorageError> {
        let spare = 1 - self.live_state.load(Ordering::SeqCst);
        let mut batch = WriteBatch::default();
        let raft_meta = self.cf(cf::RAFT_META);
        batch.put_cf(raft_meta, keys::meta::STATE_CF, cf::STATES[spare].as_bytes());
        for (key, value) in meta {
            batch.put_cf(raft_meta, key, value);
        }
        self.inner.write_opt(batch, &write_options(true))?;
        self.live_state.store(spare, Ordering::SeqCst);
        Ok(())
    }

    /// RocksDB's estimate of the live state's size in bytes (its files' live data and its
    /// memtables): about what a snapshot image of it takes.
    pub fn state_size_estimate(&self) -> u64 {
        let property = |p: &str| self.inner.property_int_value_cf(self.state(), p).ok().flatten().unwrap_or(0);
        property("rocksdb.estimate-live-data-size").saturating_add(property("rocksdb.cur-size-all-mem-tables"))
    }

    /// What RocksDB holds in memory now, over every column family.
    pub fn memory_usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage::default();
        for name in cf::ALL {
            let cf = self.cf(name);
            let property = |p: &str| self.inner.property_int_value_cf(cf, p).ok().flatten().unwrap_or(0);
            usage.memtables += property("rocksdb.cur-size-all-mem-tables");
            usage.table_readers += property("rocksdb.estimate-table-readers-mem");
            // One cache serves every column family: each reports the same usage.
            usage.block_cache = usage.block_cache.max(property("rocksdb.block-cache-usage"));
        }
        usage
    }

    pub(crate) fn cf(&self, name: &'static str) -> &ColumnFamily {
        // The database was opened with every name of cf::ALL; a miss is a programming error.
        self.inner.cf_handle(name).unwrap_or_else(|| panic!("column family {name} missing"))
    }

    /// Appends encoded log entries and syncs the WAL before returning.
    pub fn log_append<I, V>(&self, entries: I) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = (u64, V)>,
        V: AsRef<[u8]>,
    {
        let mut batch = WriteBatch::default();
        let log = self.cf(cf::LOG);
        for (index, bytes) in entries {
            batch.put_cf(log, keys::log(index), bytes);
        }
        self.inner.write_opt(batch, &write_options(true))?;
        Ok(())
    }

    /// Entries with `start <= index < end`, in order.
    pub fn log_range(&self, start: u64, end: u64) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut out = Vec::new();
        if start >= end {
            return Ok(out);
        }
        let from = keys::log(start);
        let iter = self.inner.iterator_cf(self.cf(cf::LOG), IteratorMode::From(&from, Direction::Forward));
        for item in iter {
            let (key, value) = item?;
            let index = keys::log_index(&key).ok_or_else(|| StorageError::Corrupt("log key".into()))?;
            if index >= end {
                break;
            }
            out.push((index, value.into_vec()));
        }
        Ok(out)
    }

    /// The entry with the highest index, if any.
    pub fn log_last(&self) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let mut iter = self.inner.iterator_cf(self.cf(cf::LOG), IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (key, value) = item?;
                let index = keys::log_index(&key).ok_or_else(|| StorageError::Corrupt("log key".into()))?;
                Ok(Some((index, value.into_vec())))
            }
        }
    }

    /// Deletes every entry with index >= `from` (conflicting entries), synced.
    pub fn log_truncate(&self, from: u64) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(cf::LOG), keys::log(from), keys::log(u64::MAX));
        batch.delete_cf(self.cf(cf::LOG), keys::log(u64::MAX));
        self.inner.write_opt(batch, &write_options(true))?;
        Ok(())
    }

    /// Records `purged` under `purged_key` and deletes every entry with index <= `upto`, in one
    /// write.
    pub fn log_purge(&self, upto: u64, purged_value: Vec<u8>) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(cf::RAFT_META), keys::meta::PURGED, purged_value);
        batch.delete_range_cf(self.cf(cf::LOG), keys::log(0), keys::log(upto.saturating_add(1)));
        self.inner.write_opt(batch, &write_options(true))?;
        Ok(())
    }

    /// Writes one Raft metadata value; `sync` for values openraft must find after a crash.
    pub fn meta_put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), StorageError> {
        self.inner.put_cf_opt(self.cf(cf::RAFT_META), key, value, &write_options(sync))?;
        Ok(())
    }

    /// Removes one Raft metadata value, durably.
    pub fn meta_delete(&self, key: &[u8]) -> Result<(), StorageError> {
        self.inner.delete_cf_opt(self.cf(cf::RAFT_META), key, &write_options(true))?;
        Ok(())
    }

    pub fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.inner.get_cf(self.cf(cf::RAFT_META), key)?)
    }

    /// Syncs the shared WAL, making every earlier write durable.
    pub fn sync_wal(&self) -> Result<(), StorageError> {
        self.inner.flush_wal(true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_left_in_the_spare_state_is_cleared_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = Db::open(dir.path()).expect("open");
            let mut unlogged = WriteOptions::default();
            unlogged.disable_wal(true);
            let value = vec![7u8; 1 << 20];
            for i in 0..8u8 {
                db.rocks().put_cf_opt(db.spare_state(), [1, i], &value, &unlogged).expect("put");
            }
            db.rocks().flush_cf(db.spare_state()).expect("flush");
            let left = db.rocks().property_int_value_cf(db.spare_state(), "rocksdb.total-sst-files-size");
            assert!(left.expect("property").unwrap_or(0) >= 8 << 20, "a half restore's files stay");
        }
        let db = Db::open(dir.path()).expect("open again");
        assert!(db.rocks().iterator_cf(db.spare_state(), rocksdb::IteratorMode::Start).next().is_none(), "emptied");
        let size = db.rocks().property_int_value_cf(db.spare_state(), "rocksdb.total-sst-files-size");
        let size = size.expect("property").unwrap_or(0);
        assert!(size < 1 << 20, "its space given back: {size} bytes left");
    }

    fn open() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("open");
        (dir, db)
    }

    #[test]
    fn log_append_range_truncate_purge() {
        let (_dir, db) = open();
        db.log_append((1..=10).map(|i| (i, vec![i as u8]))).expect("append");
        assert_eq!(db.log_range(3, 6).expect("range").iter().map(|e| e.0).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(db.log_last().expect("last").map(|e| e.0), Some(10));
        db.log_truncate(8).expect("truncate");
        assert_eq!(db.log_last().expect("last").map(|e| e.0), Some(7));
        db.log_purge(4, b"p".to_vec()).expect("purge");
        assert_eq!(db.log_range(0, 100).expect("range").first().map(|e| e.0), Some(5));
        assert_eq!(db.meta_get(keys::meta::PURGED).expect("meta"), Some(b"p".to_vec()));
    }

    /// Reads `key` in `[section]` of the newest OPTIONS file RocksDB wrote for this database.
    fn option(dir: &Path, section: &str, key: &str) -> Option<String> {
        let newest = std::fs::read_dir(dir)
            .expect("read_dir")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|name| name.starts_with("OPTIONS-"))
            .max()
            .expect("an OPTIONS file");
        let text = std::fs::read_to_string(dir.join(newest)).expect("read OPTIONS");
        let header = format!("[{section}]");
        let body = text.split(&header).nth(1)?.split("\n[").next()?;
        body.lines().find_map(|line| line.trim().strip_prefix(&format!("{key}=")).map(str::to_string))
    }

    #[test]
    fn every_column_family_has_bloom_filters_on_disk_and_in_memory() {
        let (dir, _db) = open();
        for name in cf::ALL {
            let filter = option(dir.path(), &format!("TableOptions/BlockBasedTable \"{name}\""), "filter_policy");
            assert_eq!(filter.as_deref(), Some("bloomfilter"), "table filter of {name}");
            let memtable = option(dir.path(), &format!("CFOptions \"{name}\""), "memtable_whole_key_filtering");
            assert_eq!(memtable.as_deref(), Some("true"), "memtable filter of {name}");
        }
    }

    #[test]
    fn reopen_keeps_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = Db::open(dir.path()).expect("open");
            db.log_append([(1, b"a".to_vec())]).expect("append");
            db.meta_put(keys::meta::VOTE, b"v", true).expect("vote");
        }
        let db = Db::open(dir.path()).expect("reopen");
        assert_eq!(db.log_range(1, 2).expect("range"), vec![(1, b"a".to_vec())]);
        assert_eq!(db.meta_get(keys::meta::VOTE).expect("vote"), Some(b"v".to_vec()));
    }

    #[test]
    fn a_data_directory_of_a_newer_format_is_refused_and_an_older_one_is_marked() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = Db::open(dir.path()).expect("open");
            let current = crate::format::FORMAT.to_string().into_bytes();
            assert_eq!(db.meta_get(keys::meta::FORMAT).expect("format"), Some(current));
            let newer = (crate::format::FORMAT + 1).to_string();
            db.meta_put(keys::meta::FORMAT, newer.as_bytes(), true).expect("put");
        }
        let error = Db::open(dir.path()).expect_err("a newer format is refused");
        assert!(matches!(error, StorageError::TooNew(_)), "{error}");
        assert!(error.to_string().contains(&format!("data format {}", crate::format::FORMAT + 1)), "{error}");
        {
            // Opened by a raftbox of format 2 (which records nothing and leaves it as it is).
            let raw = rocksdb::DB::open_cf(&Options::default(), dir.path(), cf::ALL).expect("open as is");
            raw.put_cf(raw.cf_handle(cf::RAFT_META).expect("meta"), keys::meta::FORMAT, b"2").expect("put");
        }
        let db = Db::open(dir.path()).expect("an older format opens");
        assert_eq!(
            db.meta_get(keys::meta::FORMAT).expect("format"),
            Some(crate::format::FORMAT.to_string().into_bytes())
        );
    }
}
