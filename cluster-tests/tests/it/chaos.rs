//! Chaos: the files workload (compare-and-set commits and reads on a few paths, through
//! random nodes) runs while a nemesis injects a fault every few seconds and heals it; then
//! a recovery window, final reads, and the checks a Jepsen analysis makes:
//!
//! - every path's history is linearizable (the Wing–Gong/Porcupine checker, per path);
//! - every acknowledged commit is in the final history, at its version, with its content;
//!   versions are gapless;
//! - every conflicted copy holds the losing commit's content;
//! - every acknowledged block reads back byte-identical through every node;
//! - the cluster recovers: writes are acknowledged again after the faults stop;
//! - no node panicked (the harness fails a test on any panic line in a node log).
//!
//! `partitions`: each node in its own network namespace, links cut by `nft` rules — the
//! leader isolated, a minority cut off, one-way loss, a bridge node, a lossy and slow link —
//! plus pauses and kills, and an operator's mistake: a follower cut off recovered with
//! `recover --force-new-cluster` and written to (the two clusters must stay apart after the
//! cut heals; the workload does not call the forked node).
//! A machine that cannot create namespaces fails this test; it never skips it.
//! `crashes_pauses_and_clocks`: `kill -9` and restart, SIGSTOP longer than an election
//! timeout, a node's clock moved by seconds (libfaketime), a follower replaced as an
//! operator replaces a machine (removed, wiped, started empty, added back), a follower wiped
//! in place under its id (it takes no part until removed and added back), a node killed again
//! while it catches up by a snapshot install, a node's disk filled past the NOSPACE
//! minimum, a replaced machine started again on its old directory (it must not lead), and a
//! backup restored into a follower while the old members live (a new cluster: both sides
//! must stay apart).
//!
//! The history (one JSON line per operation) and the nemesis log are written to the cluster
//! directory, which a failed run keeps; the seed replays the schedule.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::checker::{check_by_key, RegisterInput, RegisterOutput, VersionedRegister};
use raftbox_cluster_tests::guard_checks::{check_acked_writes, AckedWrite};
use raftbox_cluster_tests::nemesis::{self, FaultKind, NemesisSpec};
use raftbox_cluster_tests::register::{content_bytes, RegisterRecord, RegisterSpec, RegisterWorkload, FOREIGN_CONTENT};
use raftbox_cluster_tests::{
    get_block, in_lanes, new_user, send, within, Cluster, ClusterOptions, Deadline, Outcome, RaftTuning, Seed,
};

/// Beyond the fault phase: start-up, recovery, final reads and checks.
const TEST_OVERHEAD: Duration = Duration::from_secs(240);
/// How long faults are injected, unless `RAFTBOX_CHAOS_S` says otherwise (scripts/chaos).
const FAULT_PHASE_S: u64 = 25;
const FAULT_PHASE_ENV: &str = "RAFTBOX_CHAOS_S";

fn fault_phase() -> Duration {
    let seconds = std::env::var(FAULT_PHASE_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(FAULT_PHASE_S);
    Duration::from_secs(seconds)
}
const FAULT_MS: (u64, u64) = (1_000, 4_000);
const CALM_MS: (u64, u64) = (500, 2_000);
const CLIENTS: usize = 6;
const PATHS: [&str; 3] = ["/chaos/a.txt", "/chaos/b.txt", "/chaos/c.txt"];
const READ_RATIO: f64 = 0.4;
/// After the faults: a leader within this, and this many more acknowledged operations.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(30);
const ACKED_AFTER_RECOVERY_MIN: usize = 30;
/// Acknowledged operations the whole run must reach, or it proved little.
const ACKED_MIN: usize = 100;
/// Time the checker may spend on one path.
const CHECK_BUDGET: Duration = Duration::from_secs(60);
/// Concurrent block reads of the final check, per node.
const BLOCK_READ_LANES: usize = 16;
/// A write times out quickly, so that unknown outcomes are many and clients move on.
const WRITE_TIMEOUT_MS: u64 = 2_000;

fn options(kinds: &[FaultKind]) -> ClusterOptions {
    let mut options = ClusterOptions {
        raft: RaftTuning { write_timeout_ms: WRITE_TIMEOUT_MS, ..RaftTuning::default() },
        ..ClusterOptions::default()
    };
    nemesis::prepare(&mut options, kinds);
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions() {
    let seed = Seed::new("chaos::partitions");
    let kinds = nemesis::selected(&[
        FaultKind::IsolateLeader,
        FaultKind::Minority,
        FaultKind::OneWay,
        FaultKind::Bridge,
        FaultKind::LossyLink,
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::RecoverMinority,
    ])
    .expect("RAFTBOX_NEMESES");
    let mut cluster = Cluster::start(options(&kinds)).await.expect("start the cluster in network namespaces");
    nemesis::allow_log_errors(&mut cluster, &kinds);
    let result = within(fault_phase() + TEST_OVERHEAD, files_under_faults(&mut cluster, &seed, kinds)).await;
    cluster.conclude(result);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_pauses_and_clocks() {
    let seed = Seed::new("chaos::crashes_pauses_and_clocks");
    let kinds = nemesis::selected(&[
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::ClockSkew,
        FaultKind::Replace,
        FaultKind::KillCatchingUp,
        FaultKind::WipeInPlace,
        FaultKind::OldDirectory,
        FaultKind::RestoreBeside,
        FaultKind::DiskFull,
    ])
    .expect("RAFTBOX_NEMESES");
    let mut cluster = Cluster::start(options(&kinds)).await.expect("start the cluster");
    nemesis::allow_log_errors(&mut cluster, &kinds);
    let result = within(fault_phase() + TEST_OVERHEAD, files_under_faults(&mut cluster, &seed, kinds)).await;
    cluster.conclude(result);
}

async fn files_under_faults(cluster: &mut Cluster, seed: &Seed, kinds: Vec<FaultKind>) -> Result<()> {
    let mut rng = seed.rng();
    let epoch = Instant::now();
    let (_, token) = new_user(cluster, 1, "chaos", "chaos-clients").await?;
    let spec = RegisterSpec {
        clients: CLIENTS,
        paths: PATHS.iter().map(|p| p.to_string()).collect(),
        targets: cluster.http_urls(&cluster.node_ids()),
        forked: cluster.forked_nodes(),
        token: token.clone(),
        read_ratio: READ_RATIO,
    };
    let workload = RegisterWorkload::spawn(cluster.client(), spec, &mut rng, epoch);

    let nemesis_spec = NemesisSpec {
        kinds,
        fault_ms: FAULT_MS,
        calm_ms: CALM_MS,
        duration: fault_phase(),
        at_once: nemesis::at_once(),
    };
    let events = nemesis::run(cluster, &nemesis_spec, &mut rng, epoch).await?;

    // Recovery: a leader, and the workload acknowledged again.
    cluster.wait_for_leader(None, RECOVERY_DEADLINE).await.context("a leader after the faults")?;
    let target = workload.acked() + ACKED_AFTER_RECOVERY_MIN;
    let wait = Deadline::after(RECOVERY_DEADLINE, "operations acknowledged again after the faults");
    while workload.acked() < target {
        wait.tick(&format!("{} acknowledged", workload.acked())).await?;
    }
    let stored = workload.stored_blocks();
    let (mut records, contents) = workload.stop().await?;

    // Final reads through every node, after everything else.
    for node in cluster.node_ids() {
        cluster.wait_caught_up(node, RECOVERY_DEADLINE).await?;
        for path in PATHS {
            records.push(final_read(cluster, node, path, &token, &contents, epoch).await?);
        }
    }
    let history_path = cluster.root().join("history.jsonl");
    let mut text = String::new();
    for record in &records {
        let _ = writeln!(text, "{}", record.to_json());
    }
    for event in &events {
        let _ =
            writeln!(text, "{}", serde_json::json!({ "nemesisAtUs": event.at.as_micros() as u64, "what": event.what }));
    }
    std::fs::write(&history_path, text).with_context(|| format!("write {}", history_path.display()))?;

    let summary = summarize(&records);
    eprintln!("history: {summary} ({})", history_path.display());
    let acked = records.iter().filter(|r| r.op.ret.is_some()).count();
    ensure!(acked >= ACKED_MIN, "only {acked} acknowledged operations: {summary}");

    let history = records.iter().map(|r| (r.path.clone(), r.op.clone())).collect();
    check_by_key(&VersionedRegister, history, CHECK_BUDGET)
        .map_err(|e| anyhow::anyhow!("{e}\nhistory: {}", history_path.display()))?;
    eprintln!("every path's history is linearizable");

    check_versions(cluster, &records, &token).await?;
    check_conflicted_copies(cluster, &records, &token).await?;
    let blocks = stored.len();
    check_blocks(cluster, stored, &token).await?;
    nemesis::report(
        seed.test(),
        seed.value(),
        &events,
        &format!("{summary}; linearizable; versions gapless; copies checked; {blocks} blocks identical"),
    )
}

/// Every acknowledged block reads back byte-identical through every node.
async fn check_blocks(cluster: &Cluster, stored: BTreeMap<String, u64>, token: &str) -> Result<()> {
    let count = stored.len();
    for node in cluster.node_ids() {
        let (http, url, token) = (cluster.client(), cluster.http_url(node), token.to_owned());
        let items: Vec<(String, u64)> = stored.clone().into_iter().collect();
        in_lanes(items, BLOCK_READ_LANES, move |(hash, content)| {
            let (http, url, token) = (http.clone(), url.clone(), token.clone());
            async move {
                let bytes = get_block(&http, &url, &token, &hash).await?;
                ensure!(bytes == content_bytes(content), "block {hash} through {url} differs");
                Ok(())
            }
        })
        .await?;
    }
    eprintln!("{count} acknowledged blocks byte-identical through every node");
    Ok(())
}

/// Counts of each outcome, for the log.
fn summarize(records: &[RegisterRecord]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for record in records {
        let kind = match (&record.op.input, &record.op.ret) {
            (RegisterInput::Read, _) => "read",
            (_, Some((_, RegisterOutput::Committed { .. }))) => "committed",
            (_, Some((_, RegisterOutput::Conflict { .. }))) => "conflict",
            (_, None) => "unknown",
            _ => "other",
        };
        *counts.entry(kind).or_default() += 1;
    }
    format!("{counts:?}")
}

/// A read of `path` through `node` once the cluster has recovered (retried while unknown).
async fn final_read(
    cluster: &Cluster,
    node: u64,
    path: &str,
    token: &str,
    contents: &std::collections::HashMap<String, u64>,
    epoch: Instant,
) -> Result<RegisterRecord> {
    let url = cluster.http_url(node);
    let wait = Deadline::after(RECOVERY_DEADLINE, format!("a final read of {path} through node {node}"));
    loop {
        let call = epoch.elapsed().as_micros() as u64;
        let request = cluster.client().get(format!("{url}/v1/files")).query(&[("path", path)]).bearer_auth(token);
        let output = match send(request).await? {
            Outcome::Ok(body) => {
                let version = body["version"].as_u64().context("version")?;
                let hash = body["chunks"][0].as_str().unwrap_or_default();
                RegisterOutput::Read { version, content: Some(contents.get(hash).copied().unwrap_or(FOREIGN_CONTENT)) }
            }
            Outcome::Rejected(404, _) => RegisterOutput::Read { version: 0, content: None },
            other => {
                wait.tick(&format!("{other:?}")).await?;
                continue;
            }
        };
        let ret = Some((epoch.elapsed().as_micros() as u64, output));
        return Ok(RegisterRecord {
            path: path.to_owned(),
            op: raftbox_cluster_tests::checker::Operation { client: u64::MAX, input: RegisterInput::Read, call, ret },
            node: url,
            conflicted_copy: None,
            note: "final read".into(),
        });
    }
}

/// Every path's versions are 1..=N without a gap, and each acknowledged commit is there at
/// its version with its content (`check_acked_writes`), read through node 1.
async fn check_versions(cluster: &Cluster, records: &[RegisterRecord], token: &str) -> Result<()> {
    let url = cluster.http_url(1);
    let mut histories: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    for path in PATHS {
        let versions = histories.entry(path.to_string()).or_default();
        let mut page_token: Option<String> = None;
        loop {
            let mut query = vec![("path", path.to_string()), ("limit", "1000".to_string())];
            if let Some(t) = &page_token {
                query.push(("pageToken", t.clone()));
            }
            let request = cluster.client().get(format!("{url}/v1/files/history")).query(&query).bearer_auth(token);
            let body = match send(request).await? {
                Outcome::Ok(body) => body,
                Outcome::Rejected(404, _) => break,
                other => anyhow::bail!("history of {path}: {other:?}"),
            };
            for v in body["versions"].as_array().into_iter().flatten() {
                let version = v["version"].as_u64().context("version")?;
                versions.insert(version, v["chunks"][0].as_str().unwrap_or_default().to_owned());
            }
            match body["nextPageToken"].as_str() {
                Some(t) => page_token = Some(t.to_owned()),
                None => break,
            }
        }
    }
    let acked: Vec<AckedWrite> = records
        .iter()
        .filter_map(|record| match (&record.op.input, &record.op.ret) {
            (RegisterInput::Commit { content, .. }, Some((_, RegisterOutput::Committed { version }))) => {
                Some(AckedWrite {
                    path: record.path.clone(),
                    version: *version,
                    content: blake3::hash(&content_bytes(*content)).to_hex().to_string(),
                })
            }
            _ => None,
        })
        .collect();
    let versions = check_acked_writes(&histories, &acked)?;
    eprintln!("{versions} versions, gapless; all {} acknowledged commits readable", acked.len());
    Ok(())
}

/// Each conflicted copy holds its commit's content.
async fn check_conflicted_copies(cluster: &Cluster, records: &[RegisterRecord], token: &str) -> Result<()> {
    let url = cluster.http_url(2);
    let mut checked = 0;
    for record in records {
        let (Some(copy), RegisterInput::Commit { content, .. }) = (&record.conflicted_copy, &record.op.input) else {
            continue;
        };
        let request = cluster.client().get(format!("{url}/v1/files")).query(&[("path", copy)]).bearer_auth(token);
        let body = match send(request).await? {
            Outcome::Ok(body) => body,
            other => anyhow::bail!("conflicted copy {copy:?}: {other:?}"),
        };
        let want = blake3::hash(&content_bytes(*content)).to_hex().to_string();
        ensure!(
            body["chunks"][0].as_str() == Some(want.as_str()),
            "conflicted copy {copy:?} lacks content {content}: {body}"
        );
        checked += 1;
    }
    eprintln!("{checked} conflicted copies hold the losing content");
    Ok(())
}
