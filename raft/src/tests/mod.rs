//! Tests of the raft crate against its internals: openraft's storage conformance suite against the
//! real RocksDB-backed log store and state machine, and streamed snapshots.

mod format_fixture;
mod openraft_pins;
mod snapshot_stream;

use std::sync::{Mutex, MutexGuard};

use crate::log_store::LogStore;
use crate::state_machine::StateMachineStore;
use crate::types::TypeConfig;
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use raftbox_storage::{Db, StateMachine};

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("open db");
        let sm = StateMachineStore::new(StateMachine::new(db.clone()))?;
        Ok((dir, LogStore::new(db, crate::NodeMetrics::new(1)), sm))
    }
}

/// One test at a time: `snapshot_stream` measures the whole process's memory.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn openraft_storage_suite() -> Result<(), StorageError<u64>> {
    let _serial = serial();
    Suite::test_all(RocksBuilder)
}
