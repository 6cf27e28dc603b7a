//! Invariant: a revoked token stops working on every node within a second of the answer to
//! its revocation.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{me, new_user, send, within, Cluster, ClusterOptions, Outcome, RaftTuning};

const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// How soon after the revocation's answer every node must refuse the token.
const EVERYWHERE_WITHIN: Duration = Duration::from_secs(1);
/// Pause between two probes of a node.
const POLL: Duration = Duration::from_millis(10);
/// The write timeout (so the bound on a read barrier) of the cluster with a node behind.
const BEHIND_WRITE_TIMEOUT_MS: u64 = 2_000;
/// Within this a node behind a revocation answers: two barrier bounds and slack.
const BEHIND_ANSWER_WITHIN: Duration = Duration::from_millis(3 * BEHIND_WRITE_TIMEOUT_MS);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_on_every_node_within_a_second() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let http = cluster.client();
    let (user_id, token) = new_user(cluster, 1, "revokee", "laptop").await?;
    for url in cluster.http_urls(&cluster.node_ids()) {
        let answer = me(&http, &url, &token).await?;
        ensure!(answer.is_ok(), "the token before revocation, through {url}: {answer:?}");
    }
    let url = cluster.http_url(2);
    let listed =
        send(http.get(format!("{url}/v1/admin/users/{user_id}/tokens")).bearer_auth(cluster.admin_token())).await?;
    let token_id = listed
        .body()
        .and_then(|b| b["tokens"][0]["tokenId"].as_str())
        .with_context(|| format!("list the tokens: {listed:?}"))?
        .to_owned();
    let revoked = send(
        http.delete(format!("{url}/v1/admin/users/{user_id}/tokens/{token_id}")).bearer_auth(cluster.admin_token()),
    )
    .await?;
    ensure!(revoked.is_ok(), "revoke: {revoked:?}");
    let answered = Instant::now();
    for id in cluster.node_ids() {
        let url = cluster.http_url(id);
        loop {
            match me(&http, &url, &token).await? {
                Outcome::Rejected(401, _) => break,
                other => ensure!(
                    answered.elapsed() < EVERYWHERE_WITHIN,
                    "node {id} still accepts the revoked token {:?} after the answer: {other:?}",
                    answered.elapsed()
                ),
            }
            tokio::time::sleep(POLL).await;
        }
    }
    eprintln!("refused on every node {:?} after the revocation's answer", answered.elapsed());
    Ok(())
}

/// Issue 34, item 9: a node cut off from the leader, so behind a revocation, served the revoked
/// token every route without a read barrier (`GET /v1/me` among them). Now every route that
/// reads a user's data passes a barrier and asks again about the token after it: the node
/// behind answers 503 (its barrier cannot complete), never 200, and once it has caught up, 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_revocation_serves_the_revoked_token_nothing() {
    // A node that cannot pass its barrier answers 503 once the write timeout is out: kept
    // short here so the reads behind the revocation answer well within the test's deadline.
    let raft = RaftTuning { write_timeout_ms: BEHIND_WRITE_TIMEOUT_MS, ..RaftTuning::default() };
    let options = ClusterOptions { network_namespaces: true, raft, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, behind(&mut cluster)).await;
    cluster.conclude(result);
}

async fn behind(cluster: &mut Cluster) -> Result<()> {
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await?;
    let lagging = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let http = cluster.client();
    let (user_id, token) = new_user(cluster, leader, "revoked-behind", "laptop").await?;
    let reads = |url: String| {
        [
            format!("{url}/v1/me"),
            format!("{url}/v1/me/tokens"),
            format!("{url}/v1/files/list?path=/"),
            format!("{url}/v1/jobs"),
        ]
    };
    let lagging_url = cluster.http_url(lagging);
    let caught_up = Instant::now() + Duration::from_secs(10);
    for read in reads(lagging_url.clone()) {
        loop {
            let answer = http.get(&read).bearer_auth(&token).send().await?.status().as_u16();
            if answer == 200 {
                break;
            }
            ensure!(Instant::now() < caught_up, "{read} before the revocation: {answer}");
            tokio::time::sleep(POLL).await;
        }
    }
    cluster.network().context("network namespaces")?.isolate(lagging)?;
    let url = cluster.http_url(leader);
    let listed =
        send(http.get(format!("{url}/v1/admin/users/{user_id}/tokens")).bearer_auth(cluster.admin_token())).await?;
    let token_id = listed.body().and_then(|b| b["tokens"][0]["tokenId"].as_str()).context("the token")?.to_owned();
    let revoked = send(
        http.delete(format!("{url}/v1/admin/users/{user_id}/tokens/{token_id}")).bearer_auth(cluster.admin_token()),
    )
    .await?;
    ensure!(matches!(revoked, Outcome::Ok(_)), "revoke: {revoked:?}");
    // Behind the revocation, the node serves the token nothing.
    for read in reads(lagging_url.clone()) {
        // The request outlasts the server's bound (a barrier and the token's own lookup).
        let request = http.get(&read).bearer_auth(&token).timeout(BEHIND_ANSWER_WITHIN);
        let status = request.send().await?.status().as_u16();
        ensure!(status == 503 || status == 401, "{read} on the node behind the revocation: {status}, not 503");
    }
    cluster.network().context("network namespaces")?.heal()?;
    let wait = Instant::now() + Duration::from_secs(20);
    for read in reads(lagging_url) {
        loop {
            let status = http.get(&read).bearer_auth(&token).send().await?.status().as_u16();
            if status == 401 {
                break;
            }
            ensure!(status == 503 && Instant::now() < wait, "{read} once healed: {status}");
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}
