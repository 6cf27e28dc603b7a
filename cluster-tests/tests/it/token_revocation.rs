//! Invariant: a revoked token stops working on every node within a second of the answer to
//! its revocation.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{me, new_user, send, within, Cluster, ClusterOptions, Outcome};

const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// How soon after the revocation's answer every node must refuse the token.
const EVERYWHERE_WITHIN: Duration = Duration::from_secs(1);
/// Pause between two probes of a node.
const POLL: Duration = Duration::from_millis(10);

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
