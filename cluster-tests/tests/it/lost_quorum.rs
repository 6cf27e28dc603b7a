//! Every wait is bounded (issue 8): with both followers frozen (SIGSTOP), the leader — which
//! still believes it leads — answers a commit and a linearizable read with 503 within the
//! write timeout, instead of never; after SIGCONT the cluster commits again. A follower a
//! few ms behind answers a long poll with a fresh cursor instead of a spurious 410.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    commit_file, new_user, put_block, send, within, Cluster, ClusterOptions, Deadline, Outcome, RaftTuning, Seed,
};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
const WRITE_TIMEOUT_MS: u64 = 2_000;
/// What an answer may take beyond the write timeout (scheduling, HTTP).
const SLACK: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_quorum_answers_503_in_time_and_recovers() {
    let seed = Seed::new("lost_quorum::a_leader_without_quorum_answers_503_in_time_and_recovers");
    let raft = RaftTuning { write_timeout_ms: WRITE_TIMEOUT_MS, ..RaftTuning::default() };
    let options = ClusterOptions { raft, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn timed(what: &str, request: reqwest::RequestBuilder) -> Result<(Outcome, Duration)> {
    let started = Instant::now();
    let outcome = send(request).await.with_context(|| what.to_owned())?;
    Ok((outcome, started.elapsed()))
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let leader = cluster.wait_for_leader(None, Duration::from_secs(10)).await?;
    let followers: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != leader).collect();
    let url = cluster.http_url(leader);
    let (_, token) = new_user(cluster, leader, &format!("quorum-{}", seed.value()), "t").await?;
    let chunk = put_block(&http, &url, &token, b"quorum").await?;
    ensure!(commit_file(&http, &url, &token, "d", "/before", &[chunk.clone()], 0).await?.is_ok());

    for id in &followers {
        cluster.pause(*id)?;
    }
    // The config's write timeout, not the HTTP client's: the client waits far longer.
    let bound = Duration::from_millis(WRITE_TIMEOUT_MS) + SLACK;
    let body = serde_json::json!({ "path": "/during", "chunks": [chunk], "baseVersion": 0, "size": 1, "mtime": 0 });
    let commit = http.post(format!("{url}/v1/files/commit")).bearer_auth(&token).json(&body).timeout(bound * 4);
    let (outcome, took) = timed("commit without quorum", commit).await?;
    ensure!(matches!(&outcome, Outcome::Unknown(s) if s.starts_with("503")), "commit: {outcome:?}");
    ensure!(took <= bound, "the commit took {took:?}, more than the write timeout allows ({bound:?})");
    let read = http.get(format!("{url}/v1/files?path=/before")).bearer_auth(&token).timeout(bound * 4);
    let (outcome, took) = timed("read without quorum", read).await?;
    ensure!(matches!(&outcome, Outcome::Unknown(s) if s.starts_with("503")), "read: {outcome:?}");
    ensure!(took <= bound, "the read took {took:?} ({bound:?} allowed)");

    for id in &followers {
        cluster.resume(*id)?;
    }
    let wait = Deadline::after(Duration::from_secs(30), "a commit after the followers resumed");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let url = cluster.http_url(cluster.wait_for_leader(None, Duration::from_secs(15)).await?);
        let outcome = commit_file(&http, &url, &token, "d", &format!("/after-{attempt}"), &[chunk.clone()], 0).await?;
        if outcome.is_ok() {
            break;
        }
        wait.tick(&format!("{outcome:?}")).await?;
    }
    long_poll_after_catching_up(cluster, &token, &chunk).await
}

/// A follower that was frozen while the others committed serves a long poll with the
/// newest cursor (it catches up first) rather than answering 410 `cursor-reset`.
async fn long_poll_after_catching_up(cluster: &mut Cluster, token: &str, chunk: &str) -> Result<()> {
    let http = cluster.client();
    let leader = cluster.wait_for_leader(None, Duration::from_secs(10)).await?;
    let lagging = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let url = cluster.http_url(leader);
    cluster.pause(lagging)?;
    for i in 0..20 {
        let outcome = commit_file(&http, &url, token, "d", &format!("/lag-{i}"), &[chunk.to_owned()], 0).await?;
        ensure!(outcome.is_ok(), "commit while node {lagging} is frozen: {outcome:?}");
    }
    let sync = send(http.get(format!("{url}/v1/sync?cursor=0&limit=10000")).bearer_auth(token)).await?;
    let cursor = sync.body().and_then(|s| s["cursor"].as_str()).context("a cursor")?.to_owned();
    cluster.resume(lagging)?;
    let poll =
        http.get(format!("{}/v1/notify?cursor={cursor}&timeout=1", cluster.http_url(lagging))).bearer_auth(token);
    let outcome = send(poll).await?;
    ensure!(
        matches!(&outcome, Outcome::Ok(body) if body["changes"] == false),
        "a long poll on node {lagging} right after it resumed: {outcome:?}"
    );
    Ok(())
}
