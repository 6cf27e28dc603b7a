//! Invariant: the same `Idempotency-Key` sent concurrently to different nodes runs the work
//! once: every answer is the same 201 (one user id), and the user exists once.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{within, Cluster, ClusterOptions, Seed};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// Distinct keys tried, each sent to every node at once.
const ROUNDS: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sent_to_every_node_at_once_runs_once() {
    let seed = Seed::new("idempotency_across_nodes::a_key_sent_to_every_node_at_once_runs_once");
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster, &seed)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let urls = cluster.http_urls(&cluster.node_ids());
    for round in 0..ROUNDS {
        let key = format!("key-{}-{round}", seed.value());
        let body = json!({ "name": format!("idem-{}-{round}", seed.value()) });
        let sends = urls.iter().map(|url| {
            http.post(format!("{url}/v1/admin/users"))
                .bearer_auth(cluster.admin_token())
                .header("idempotency-key", &key)
                .json(&body)
                .send()
        });
        let mut answers = Vec::new();
        for response in futures_join(sends).await {
            let response = response.context("send")?;
            let status = response.status().as_u16();
            let value: Value = response.json().await.context("body")?;
            answers.push((status, value));
        }
        ensure!(answers.iter().all(|(s, _)| *s == 201), "round {round}: {answers:?}");
        let first = &answers[0].1;
        ensure!(answers.iter().all(|(_, v)| v == first), "round {round}: different results {answers:?}");
        let user_id = first["userId"].as_str().context("userId")?;
        let check = http
            .get(format!("{}/v1/admin/users/{user_id}", urls[round % urls.len()]))
            .bearer_auth(cluster.admin_token())
            .send()
            .await?;
        ensure!(check.status().as_u16() == 200, "round {round}: user {user_id} missing");
    }
    eprintln!("{ROUNDS} keys, each sent to {} nodes at once: one result each", urls.len());
    Ok(())
}

/// Runs the requests concurrently and returns their results in order.
async fn futures_join<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("request task"));
    }
    out
}
