//! The data-format fixture: a node's data directory written by the previous release (format
//! 2, commit 8b502ce; `scripts/format-fixture` made it) is read by this code: every log
//! entry decodes, the state reads, and the directory is marked with this code's format.

use std::path::Path;

use openraft::EntryPayload;
use raftbox_storage::{keys, Command, Db, StateMachine};

use crate::log_store::decode_entry;

/// The committed fixture (a .tar.gz of `data/`, the tokens and `expected.json`).
pub(crate) const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/format2-node.tar.gz");

/// Unpacks the fixture into `into` (with the system's `tar`).
pub(crate) fn unpack(into: &Path) {
    let status =
        std::process::Command::new("tar").arg("-xzf").arg(FIXTURE).arg("-C").arg(into).status().expect("run tar");
    assert!(status.success(), "tar -xzf {FIXTURE} failed");
}

#[test]
fn a_data_directory_of_the_previous_format_reads_entry_by_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    unpack(dir.path());
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("expected.json")).expect("expected.json")).expect("json");
    let db_path = dir.path().join("data/db");
    {
        let raw =
            rocksdb::DB::open_cf(&rocksdb::Options::default(), &db_path, raftbox_storage::cf::ALL).expect("open as is");
        let meta = raw.cf_handle(raftbox_storage::cf::RAFT_META).expect("meta");
        assert_eq!(raw.get_cf(meta, keys::meta::FORMAT).expect("read"), None, "format 2 recorded no format");
    }
    let db = Db::open(&db_path).expect("the current code opens a format-2 data directory");
    assert_eq!(
        db.meta_get(keys::meta::FORMAT).expect("format"),
        Some(raftbox_storage::format::FORMAT.to_string().into_bytes())
    );

    // Every entry of the log decodes, each batch of format 1 (nothing newer existed).
    let entries = db.log_range(0, u64::MAX).expect("log");
    assert!(entries.len() >= 20, "the fixture's log holds its writes ({} entries)", entries.len());
    let mut kinds = std::collections::BTreeSet::new();
    for (index, bytes) in &entries {
        let raw: serde_json::Value = serde_json::from_slice(bytes).expect("an entry is JSON");
        assert!(
            raw["payload"]["Normal"].get("format").is_none(),
            "entry {index}: the previous release wrote no format"
        );
        let entry = decode_entry(bytes).unwrap_or_else(|e| panic!("entry {index} does not decode: {e}"));
        assert_eq!(entry.log_id.index, *index);
        if let EntryPayload::Normal(batch) = entry.payload {
            assert_eq!(batch.format, 1, "entry {index}");
            for command in batch.commands.iter() {
                let mut command = command;
                // Requests keyed for idempotency wrap their command.
                while let Command::Idempotent { command: inner, .. } | Command::Once { command: inner, .. } = command {
                    command = inner;
                }
                let kind = serde_json::to_value(command).expect("encode")["type"].as_str().unwrap_or("").to_owned();
                kinds.insert(kind);
                if let Command::Migrate { schema } = command {
                    assert_eq!(*schema, 2);
                }
            }
        }
    }
    for kind in ["create_user", "create_token", "register_chunk", "commit_file", "create_shared_folder", "migrate"] {
        assert!(kinds.contains(kind), "the log holds a {kind} ({kinds:?})");
    }

    // The state reads: the cluster is at format 2, the users, folder and job are there.
    let state = StateMachine::new(db);
    assert_eq!(state.schema().expect("schema"), 2);
    let alice = state.user_by_name("alice").expect("read").expect("alice");
    assert_eq!(Some(alice.id.as_str()), expected["alice"].as_str());
    let job_id = expected["job"].as_str().expect("job id");
    assert!(state.job(job_id).expect("read").is_some(), "the job is there");
    assert_eq!(state.limits().expect("read"), None, "format 2 had no runtime limits");
}
