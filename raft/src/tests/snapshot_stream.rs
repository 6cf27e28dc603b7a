//! Snapshots stream: building and installing a snapshot of a few hundred MB of state grows the
//! process's memory by far less than the state; a corrupt one changes nothing; a snapshot
//! stored inline by an older version moves into a file at start.

use std::io::SeekFrom;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::state_machine::{StateMachineStore, SNAPSHOT_DIR};
use crate::types::{Entry, SnapshotMeta};
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use raftbox_storage::jobs::{Job, JobSpec, Schedule};
use raftbox_storage::{keys, Batch, Command, Db, StateMachine};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// State written: jobs with a payload of `PAYLOAD_BYTES` each, 256 of them (256 MiB) unless
/// `RAFTBOX_SNAPSHOT_TEST_MIB` asks for more.
const JOBS_DEFAULT: u64 = 256;
const PAYLOAD_BYTES: usize = 1 << 20;

fn jobs() -> u64 {
    std::env::var("RAFTBOX_SNAPSHOT_TEST_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(JOBS_DEFAULT)
}
/// The chunk size openraft sends a snapshot in (its default `snapshot_max_chunk_size`).
const CHUNK_BYTES: usize = 3 << 20;

fn store(dir: &Path) -> StateMachineStore {
    let db = Db::open(dir).expect("open db");
    StateMachineStore::new(StateMachine::new(db)).expect("open store")
}

fn job(id: u64) -> Command {
    // Different in every job, so no layer could share them.
    let payload: String = (0..PAYLOAD_BYTES).map(|i| char::from(b'a' + ((i as u64 * 7 + id) % 26) as u8)).collect();
    let spec = JobSpec {
        id: format!("job-{id}"),
        owner_user_id: "u".into(),
        job_type: "noop".into(),
        target: String::new(),
        payload: serde_json::Value::String(payload),
        schedule: Schedule::Once { run_at_ms: u64::MAX / 2 },
        max_retries: 0,
        retry_backoff_ms: 1_000,
        timeout_s: 30,
    };
    Command::CreateJob(Box::new(Job::scheduled(spec, Some(u64::MAX / 2))))
}

async fn fill(store: &mut StateMachineStore, jobs: u64) {
    for index in 1..=jobs {
        let batch = Batch::new(1_000 + index, vec![job(index)].into());
        let entry = Entry { log_id: log_id(1, 1, index), payload: EntryPayload::Normal(batch) };
        store.apply([entry]).await.expect("apply");
    }
}

/// A field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in status"));
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB");
    kib * 1024
}

/// Measures the process's peak resident memory while `work` runs: the kernel's high-water
/// mark, reset first (`clear_refs` 5), and a sampler every millisecond as well.
async fn peak_rss_during<F: std::future::Future<Output = ()>>(work: F) -> (u64, u64) {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let start = status_bytes("VmRSS:");
    let stop = Arc::new(AtomicBool::new(false));
    let sampled = Arc::new(AtomicU64::new(start));
    let sampler = {
        let (stop, sampled) = (stop.clone(), sampled.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                sampled.fetch_max(status_bytes("VmRSS:"), Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    work.await;
    stop.store(true, Ordering::SeqCst);
    sampler.join().expect("sampler");
    let mut peak = sampled.load(Ordering::SeqCst);
    if reset {
        peak = peak.max(status_bytes("VmHWM:"));
    }
    (start, peak)
}

fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(SNAPSHOT_DIR))
        .expect("snapshot dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Sends a snapshot from `from` to `to` the way openraft does: chunk by chunk into the data
/// `to` hands out, then install.
async fn transfer(from: &mut StateMachineStore, to: &mut StateMachineStore) -> SnapshotMeta {
    let current = from.get_current_snapshot().await.expect("current").expect("a snapshot");
    let mut source = current.snapshot;
    let end = source.seek(SeekFrom::End(0)).await.expect("seek");
    source.seek(SeekFrom::Start(0)).await.expect("seek");
    let mut target = to.begin_receiving_snapshot().await.expect("begin receiving");
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut sent = 0;
    while sent < end {
        let n = source.read(&mut chunk).await.expect("read chunk");
        assert!(n > 0, "snapshot ended early");
        target.write_all(&chunk[..n]).await.expect("write chunk");
        sent += n as u64;
    }
    target.shutdown().await.expect("shutdown");
    to.install_snapshot(&current.meta, target).await.expect("install");
    current.meta
}

#[test]
fn snapshot_build_and_install_stream_without_growing_memory() {
    let _serial = super::serial();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    runtime.block_on(async {
        let (dir_a, dir_b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let mut a = store(dir_a.path());
        let jobs = jobs();
        fill(&mut a, jobs).await;
        let state_bytes = jobs * PAYLOAD_BYTES as u64;
        let mut b = store(dir_b.path());

        let mut meta = None;
        let (start, peak) = peak_rss_during(async {
            let built = a.get_snapshot_builder().await.build_snapshot().await.expect("build");
            let mut data = built.snapshot;
            let image_bytes = data.seek(SeekFrom::End(0)).await.expect("seek");
            assert!(image_bytes > state_bytes, "image of {image_bytes} bytes holds the state");
            meta = Some(transfer(&mut a, &mut b).await);
        })
        .await;
        let growth = peak.saturating_sub(start);
        println!(
            "state {} MiB: RSS {} MiB before, peak {} MiB during build + transfer + install (+{} MiB)",
            state_bytes >> 20,
            start >> 20,
            peak >> 20,
            growth >> 20
        );
        // A copy of the state in memory (the image, or one write batch of it) would grow RSS
        // by the state's size; streaming stays within buffers, batches and memtables.
        assert!(growth < state_bytes / 4, "RSS grew by {} MiB for {} MiB of state", growth >> 20, state_bytes >> 20);

        let meta = meta.expect("installed");
        assert_eq!(b.applied_state().await.expect("applied"), a.applied_state().await.expect("applied"));
        assert_eq!(meta.last_log_id, Some(log_id(1, 1, jobs)));
        for id in [1, jobs / 2, jobs] {
            let job = b.state().job(&format!("job-{id}")).expect("read").expect("restored job");
            assert_eq!(job.payload.as_str().map(str::len), Some(PAYLOAD_BYTES));
        }
        let current = b.get_current_snapshot().await.expect("current").expect("installed snapshot is current");
        assert_eq!(current.meta, meta);
        // One file each: the current snapshot; the reception was moved into place.
        assert_eq!(snapshot_files(dir_a.path()).len(), 1, "{:?}", snapshot_files(dir_a.path()));
        assert_eq!(snapshot_files(dir_b.path()).len(), 1, "{:?}", snapshot_files(dir_b.path()));

        // The installed state and snapshot survive a restart.
        drop((a, b));
        let mut b = store(dir_b.path());
        assert_eq!(b.applied_state().await.expect("applied").0, Some(log_id(1, 1, jobs)));
        assert_eq!(b.get_current_snapshot().await.expect("current").expect("snapshot").meta, meta);
        assert!(b.state().job(&format!("job-{jobs}")).expect("read").is_some());
    });
}

#[test]
fn corrupt_snapshot_install_changes_nothing() {
    let _serial = super::serial();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    runtime.block_on(async {
        let (dir_a, dir_b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let (mut a, mut b) = (store(dir_a.path()), store(dir_b.path()));
        let entry = |index, id| Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Normal(Batch::new(1, vec![job(id)].into())),
        };
        a.apply([entry(1, 1), entry(2, 2)]).await.expect("apply");
        b.apply([entry(1, 7)]).await.expect("apply");
        b.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let before = b.get_current_snapshot().await.expect("current").expect("snapshot").meta;

        let built = a.get_snapshot_builder().await.build_snapshot().await.expect("build");
        let mut source = built.snapshot;
        let mut image = Vec::new();
        source.seek(SeekFrom::Start(0)).await.expect("seek");
        source.read_to_end(&mut image).await.expect("read");
        let middle = image.len() / 2;
        image[middle] ^= 0x01;
        let mut target = b.begin_receiving_snapshot().await.expect("begin");
        target.write_all(&image).await.expect("write");
        target.shutdown().await.expect("shutdown");
        assert!(b.install_snapshot(&built.meta, target).await.is_err(), "a corrupt image is refused");

        assert_eq!(b.applied_state().await.expect("applied").0, Some(log_id(1, 1, 1)));
        assert!(b.state().job("job-7").expect("read").is_some());
        assert!(b.state().job("job-2").expect("read").is_none());
        assert_eq!(b.get_current_snapshot().await.expect("current").expect("snapshot").meta, before);
        assert_eq!(snapshot_files(dir_b.path()).len(), 1, "{:?}", snapshot_files(dir_b.path()));
    });
}

#[test]
fn inline_snapshot_of_an_older_version_moves_to_a_file() {
    let _serial = super::serial();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(2, 1, 5)),
            last_membership: Default::default(),
            snapshot_id: "2-1-5".into(),
        };
        {
            let db = Db::open(dir.path()).expect("open");
            let sm = StateMachine::new(db.clone());
            let mut image = Vec::new();
            sm.write_snapshot(&mut image).expect("image");
            let meta_json = serde_json::to_vec(&meta).expect("meta");
            let mut legacy = (meta_json.len() as u32).to_be_bytes().to_vec();
            legacy.extend_from_slice(&meta_json);
            legacy.extend_from_slice(&image);
            db.meta_put(keys::meta::SNAPSHOT, &legacy, true).expect("put");
        }
        let mut s = store(dir.path());
        let current = s.get_current_snapshot().await.expect("current").expect("snapshot");
        assert_eq!(current.meta, meta);
        assert_eq!(snapshot_files(dir.path()).len(), 1);
    });
}

/// A build that would not leave the minimum free keeps the current snapshot (openraft
/// ignores a snapshot that is not newer) instead of writing a new image; with room it builds
/// again, and the id carries the image's size for a receiver's check.
#[tokio::test]
async fn a_build_without_room_keeps_the_current_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = store(dir.path());
    fill(&mut store, 2).await;
    let first = store.build_snapshot().await.expect("build").meta;
    let bytes = crate::state_machine::image_bytes(&first.snapshot_id).expect("the id carries the size");
    let on_disk = std::fs::read_dir(dir.path().join(SNAPSHOT_DIR)).expect("dir").count();
    assert!(bytes > 2 * PAYLOAD_BYTES as u64, "{bytes} bytes for two 1 MiB payloads");

    let batch = Batch::new(2_000, vec![job(3)].into());
    store.apply([Entry { log_id: log_id(1, 1, 3), payload: EntryPayload::Normal(batch) }]).await.expect("apply");
    let mut cramped = store.clone().with_min_free_bytes(u64::MAX / 4);
    let kept = cramped.build_snapshot().await.expect("a skipped build is no error").meta;
    assert_eq!(kept, first, "no room: the current snapshot stays");
    assert_eq!(std::fs::read_dir(dir.path().join(SNAPSHOT_DIR)).expect("dir").count(), on_disk, "no image written");

    let mut roomy = store.clone().with_min_free_bytes(1);
    let built = roomy.build_snapshot().await.expect("build").meta;
    assert_eq!(built.last_log_id, Some(log_id(1, 1, 3)), "room again: a new snapshot");
}
