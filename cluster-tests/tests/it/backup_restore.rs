//! Backups, restores and the way back from losing a majority, through the `raftbox` command
//! line as an operator runs it (issue 24):
//!
//! - a backup taken through a follower while a writer commits restores into a new cluster
//!   (every node destroyed first) with every user and token, every file byte for byte,
//!   every job, and every write acknowledged before the backup was asked for;
//! - with two of three nodes destroyed, `raftbox recover --force-new-cluster` makes the
//!   survivor a one-member cluster that commits, keeps what it held, and grows back to three.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    add_member, commit_file, get_block, me, new_user, put_block, raftbox_bin, send, within, Cluster, ClusterOptions,
    Deadline, Outcome, Seed,
};
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;

const TEST_DEADLINE: Duration = Duration::from_secs(240);
const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const MEMBERSHIP_DEADLINE: Duration = Duration::from_secs(60);
const USERS: usize = 4;
const FILES_PER_USER: usize = 3;
const BLOCK_BYTES: usize = 96 * 1024;
/// Writes the writer has had acknowledged before the backup is asked for.
const WRITES_BEFORE_BACKUP: usize = 50;

/// A file a user committed, with the bytes of each chunk.
struct StoredFile {
    token: String,
    path: String,
    version: u64,
    chunks: Vec<(String, Vec<u8>)>,
}

/// Users with tokens, a few files each, one job: what a restore must bring back.
struct DataSet {
    tokens: Vec<(String, String)>,
    files: Vec<StoredFile>,
    job: (String, String),
}

async fn make_data(cluster: &Cluster, seed: &Seed, through: u64) -> Result<DataSet> {
    let (http, url) = (cluster.client(), cluster.http_url(through));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.value());
    let (mut tokens, mut files) = (Vec::new(), Vec::new());
    for u in 0..USERS {
        let (user_id, token) = new_user(cluster, through, &format!("backup-user-{u}"), "laptop").await?;
        for f in 0..FILES_PER_USER {
            let mut chunks = Vec::new();
            for _ in 0..2 {
                let mut data = vec![0u8; BLOCK_BYTES];
                rng.fill(&mut data[..]);
                chunks.push((put_block(&http, &url, &token, &data).await?, data));
            }
            let path = format!("/docs/file-{f}.bin");
            let hashes: Vec<String> = chunks.iter().map(|(h, _)| h.clone()).collect();
            let committed = commit_file(&http, &url, &token, "laptop", &path, &hashes, 0).await?;
            let version =
                committed.body().and_then(|b| b["version"].as_u64()).with_context(|| format!("{committed:?}"))?;
            files.push(StoredFile { token: token.clone(), path, version, chunks });
        }
        tokens.push((user_id, token));
    }
    let body =
        json!({ "type": "noop", "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 1, "payload": {} });
    let job = send(http.post(format!("{url}/v1/jobs")).bearer_auth(&tokens[0].1).json(&body)).await?;
    let job_id = job.body().and_then(|b| b["jobId"].as_str()).with_context(|| format!("create a job: {job:?}"))?;
    Ok(DataSet { tokens: tokens.clone(), files, job: (tokens[0].1.clone(), job_id.to_string()) })
}

/// Every user, token, file (byte for byte) and the job, read through node `id`.
async fn verify_data(cluster: &Cluster, id: u64, data: &DataSet) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(id));
    for (user_id, token) in &data.tokens {
        let answer = me(&http, &url, token).await?;
        ensure!(answer.body().is_some_and(|b| b["userId"] == user_id.as_str()), "token of {user_id}: {answer:?}");
    }
    for file in &data.files {
        let got = send(http.get(format!("{url}/v1/files?path={}", file.path)).bearer_auth(&file.token)).await?;
        let body = got.body().with_context(|| format!("{}: {got:?}", file.path))?;
        ensure!(
            body["version"] == file.version,
            "{}: version {} instead of {}",
            file.path,
            body["version"],
            file.version
        );
        for (hash, bytes) in &file.chunks {
            let read = get_block(&http, &url, &file.token, hash).await?;
            ensure!(&read == bytes, "{}: block {hash} differs", file.path);
        }
    }
    let (token, job_id) = &data.job;
    let job = send(http.get(format!("{url}/v1/jobs/{job_id}")).bearer_auth(token)).await?;
    ensure!(job.body().is_some_and(|b| b["status"] == "SCHEDULED"), "job {job_id}: {job:?}");
    Ok(())
}

/// Runs the `raftbox` command line; its stderr, or an error with both outputs.
async fn raftbox(args: &[&str]) -> Result<String> {
    let output = tokio::process::Command::new(raftbox_bin()?).args(args).kill_on_drop(true).output().await?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(
        output.status.success(),
        "raftbox {}: {}\n{stderr}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(stderr)
}

fn config_of(cluster: &Cluster, id: u64) -> PathBuf {
    cluster.data_dir(id).parent().expect("a node directory").join("config.toml")
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// Adds node `id` (started, empty) through `via` until it is a voter.
async fn add_back(cluster: &Cluster, via: u64, id: u64) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(via));
    let (http_addr, grpc_addr) = cluster.addresses(id);
    let wait = Deadline::after(MEMBERSHIP_DEADLINE, format!("node {id} to be added"));
    loop {
        match add_member(&http, &url, cluster.admin_token(), id, &http_addr, &grpc_addr).await? {
            Outcome::Ok(body) if body["complete"] == true => return Ok(()),
            other => wait.tick(&format!("{other:?}")).await?,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_cluster() {
    let seed = Seed::new("backup_restore::a_backup_under_load_restores_into_a_new_cluster");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, backup_and_restore(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn backup_and_restore(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let follower = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let data = make_data(cluster, seed, leader).await?;

    // A writer commits through the leader all along; each acknowledgement is timed.
    let (http, url) = (cluster.client(), cluster.http_url(leader));
    let writer_token = data.tokens[1].1.clone();
    let chunk = put_block(&http, &url, &writer_token, b"under load").await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Arc<std::sync::Mutex<Vec<(String, Instant)>>> = Arc::default();
    let writer = {
        let (http, url, token) = (http.clone(), url.clone(), writer_token.clone());
        let (stop, acked) = (stop.clone(), acked.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let path = format!("/load/{n}");
                if let Ok(Outcome::Ok(_)) = commit_file(&http, &url, &token, "w", &path, &[chunk.clone()], 0).await {
                    acked.lock().expect("acked").push((path, Instant::now()));
                }
                n += 1;
            }
        })
    };
    let wait = Deadline::after(Duration::from_secs(20), "the writer's first acknowledgements");
    while acked.lock().expect("acked").len() < WRITES_BEFORE_BACKUP {
        wait.tick("few writes acknowledged yet").await?;
    }

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("cluster.backup");
    let asked = Instant::now();
    let applied_when_asked = cluster.view(leader).await?.last_applied;
    let report = raftbox(&[
        "backup",
        &text(&file),
        "--with-blocks",
        "--url",
        &cluster.http_url(follower),
        "--token",
        cluster.admin_token(),
    ])
    .await?;
    let took = asked.elapsed();
    // It holds password hashes and webhook secrets: its owner's only (issue 34).
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file)?.permissions()) & 0o777;
    ensure!(mode == 0o600, "the backup file's mode is {mode:o}, not 600");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await?;
    let acked = std::mem::take(&mut *acked.lock().expect("acked"));
    let index: u64 = report
        .split("log index ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no index in the backup's report: {report}"))?;
    ensure!(
        index >= applied_when_asked,
        "the backup reflects index {index}, the leader had applied {applied_when_asked}"
    );
    let bytes = std::fs::metadata(&file)?.len();
    let before: Vec<&String> = acked.iter().filter(|(_, at)| *at < asked).map(|(path, _)| path).collect();
    ensure!(before.len() >= WRITES_BEFORE_BACKUP, "only {} writes acknowledged before the backup", before.len());
    eprintln!(
        "backup: index {index} ({applied_when_asked} applied when asked), {bytes} bytes, {took:.2?} with its blocks; \
         {} writes acknowledged before it was asked, {} in all",
        before.len(),
        acked.len()
    );

    // The cluster is lost: every node killed and wiped.
    for id in cluster.node_ids() {
        cluster.kill9(id)?;
        cluster.wipe(id)?;
    }
    let restoring = Instant::now();
    let blocks = dir.path().join("cluster.backup.blocks.d");
    raftbox(&["restore", &text(&file), "--config", &text(&config_of(cluster, 1)), "--blocks", &text(&blocks)]).await?;
    let restore_took = restoring.elapsed();
    cluster.start_node(1)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    ensure!(leader == 1, "node {leader} leads a cluster only node 1 was restored into");
    for id in [2, 3] {
        cluster.start_node(id)?;
        add_back(cluster, 1, id).await?;
    }
    eprintln!("restore: {restore_took:.2?} into node 1; nodes 2 and 3 added back");

    // Everything, read through a node that was added back empty.
    verify_data(cluster, 2, &data).await.context("after the restore, through node 2")?;
    let (http, url) = (cluster.client(), cluster.http_url(3));
    for path in &before {
        let got = send(http.get(format!("{url}/v1/files?path={path}")).bearer_auth(&writer_token)).await?;
        ensure!(got.is_ok(), "{path}, acknowledged before the backup was asked for, is missing: {got:?}");
    }
    // And the restored cluster takes writes.
    let (_, token) = new_user(cluster, 3, "after-restore", "t").await?;
    let answer = me(&http, &url, &token).await?;
    ensure!(answer.is_ok(), "a user made after the restore: {answer:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_two_of_three_nodes_recovers_with_force_new_cluster() {
    let seed = Seed::new("backup_restore::losing_two_of_three_nodes_recovers_with_force_new_cluster");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, force_new_cluster(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn force_new_cluster(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    const SURVIVOR: u64 = 2;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let data = make_data(cluster, seed, leader).await?;
    cluster.wait_caught_up(SURVIVOR, Duration::from_secs(20)).await?;

    // Two of three machines are lost for good.
    for id in [1, 3] {
        cluster.kill9(id)?;
        cluster.wipe(id)?;
    }
    let (http, url) = (cluster.client(), cluster.http_url(SURVIVOR));
    let alone = send(
        http.post(format!("{url}/v1/admin/users"))
            .bearer_auth(cluster.admin_token())
            .json(&json!({"name": "alone"}))
            .timeout(Duration::from_secs(15)),
    )
    .await?;
    ensure!(!alone.is_ok(), "a minority acknowledged a write: {alone:?}");
    cluster.terminate(SURVIVOR, Duration::from_secs(10)).await?;

    let report = raftbox(&["recover", "--force-new-cluster", "--config", &text(&config_of(cluster, SURVIVOR))]).await?;
    ensure!(report.contains("only voter"), "recover's report: {report}");
    cluster.start_node(SURVIVOR)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    ensure!(leader == SURVIVOR, "node {leader} leads; only node {SURVIVOR} runs");
    verify_data(cluster, SURVIVOR, &data).await.context("on the recovered node")?;
    let (_, token) = new_user(cluster, SURVIVOR, "after-recovery", "t").await?;

    // Grown back to three with empty machines, it survives losing the recovered node.
    for id in [1, 3] {
        cluster.start_node(id)?;
        add_back(cluster, SURVIVOR, id).await?;
    }
    cluster.kill9(SURVIVOR)?;
    let leader = cluster.wait_for_leader(Some(SURVIVOR), LEADER_DEADLINE).await?;
    verify_data(cluster, leader, &data).await.context("without the recovered node")?;
    let answer = me(&cluster.client(), &cluster.http_url(leader), &token).await?;
    ensure!(answer.is_ok(), "the user made after the recovery: {answer:?}");
    eprintln!("force-new-cluster: node {SURVIVOR} alone, then three nodes again; node {leader} leads without it");
    Ok(())
}
