//! Runtime limits: rate limits, job limits and quotas are the cluster's replicated
//! configuration. The bootstrap node seeds them from its TOML; `raftbox limits set` changes
//! them through any node and every node enforces the change within a second, no restart; a
//! change with one bad limit is refused whole and changes nothing.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_folder, new_user, run_cli, within, Cluster, ClusterOptions, Deadline, Outcome};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
const SEED_DEADLINE: Duration = Duration::from_secs(20);
/// What the issue promises: a change acts on every node within this.
const EFFECTIVE_WITHIN: Duration = Duration::from_secs(1);

const ROOMY: &str = "[[rate_limits]]\nname = \"me\"\nscope = \"user\"\nroutes = [\"/v1/me\"]\n\
                     capacity = 1000\nrefill_per_s = 1000\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_change_acts_on_every_node_within_a_second_and_a_bad_one_changes_nothing() {
    let options = ClusterOptions { extra_toml: ROOMY.to_owned(), ..ClusterOptions::default() };
    let cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

async fn view(cluster: &Cluster, id: u64) -> Result<Value> {
    let response = cluster
        .client()
        .get(format!("{}/v1/admin/limits", cluster.http_url(id)))
        .bearer_auth(cluster.admin_token())
        .send()
        .await?;
    ensure!(response.status() == 200, "GET /v1/admin/limits: {}", response.status());
    Ok(response.json().await?)
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let ids = cluster.node_ids();
    let admin_file = cluster.root().join("cli-admin.token");
    std::fs::write(&admin_file, cluster.admin_token())?;
    let admin = admin_file.to_str().context("path")?;
    let url = cluster.http_url(ids[1]);

    // Seeded from the bootstrap node's TOML.
    let wait = Deadline::after(SEED_DEADLINE, "the limits seeded");
    loop {
        let seen = view(cluster, ids[2]).await?;
        if seen["source"] == "cluster" {
            ensure!(seen["revision"] == 1 && seen["clusterFormat"] == raftbox_cluster_tests::DATA_FORMAT, "{seen}");
            ensure!(seen["limits"]["rate_limits"][0]["name"] == "me", "the TOML's limits: {seen}");
            break;
        }
        wait.tick(&seen.to_string()).await?;
    }
    let shown = run_cli(&["limits", "show", "--url", &url, "--token-file", admin]).await?;
    let shown_text = String::from_utf8_lossy(&shown.stdout).into_owned();
    ensure!(
        shown.status.success() && shown_text.contains("revision 1") && shown_text.contains("[[rate_limits]]"),
        "{shown_text}"
    );

    // A file with one bad limit: refused whole, by the CLI and by the server.
    let bad = cluster.root().join("bad-limits.toml");
    std::fs::write(&bad, format!("{ROOMY}\n[quotas]\nfolders_per_user = 0\n"))?;
    let refused =
        run_cli(&["limits", "set", bad.to_str().context("path")?, "--url", &url, "--token-file", admin]).await?;
    let why = String::from_utf8_lossy(&refused.stderr).into_owned();
    ensure!(!refused.status.success() && why.contains("quotas.folders_per_user"), "refused with a reason: {why}");
    let twice = json!({ "rate_limits": [
        { "name": "a", "scope": "user", "routes": ["/v1/me"], "capacity": 1, "refill_per_s": 1 },
        { "name": "a", "scope": "ip", "routes": ["/v1/me"], "capacity": 1, "refill_per_s": 1 } ] });
    let response = cluster
        .client()
        .put(format!("{url}/v1/admin/limits"))
        .bearer_auth(cluster.admin_token())
        .json(&twice)
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    ensure!(status == 400 && body["detail"].as_str().is_some_and(|d| d.contains("appears twice")), "{status} {body}");
    for &id in &ids {
        let seen = view(cluster, id).await?;
        ensure!(seen["revision"] == 1, "a refused change changed nothing on node {id}: {seen}");
    }

    // A user per node, each making requests through its node only.
    let http = cluster.client();
    let mut users = Vec::new();
    for &id in &ids {
        let (_, token) = new_user(cluster, id, &format!("limited-{id}"), "laptop").await?;
        users.push((id, token));
    }

    // A tight limit and a one-folder quota, set through the CLI.
    let tight = cluster.root().join("tight-limits.toml");
    std::fs::write(
        &tight,
        "[[rate_limits]]\nname = \"me\"\nscope = \"user\"\nroutes = [\"/v1/me\"]\nalgorithm = \"fixed_window\"\n\
         limit = 2\nwindow_ms = 600000\n\n[quotas]\nfolders_per_user = 1\n",
    )?;
    let set =
        run_cli(&["limits", "set", tight.to_str().context("path")?, "--url", &url, "--token-file", admin]).await?;
    ensure!(set.status.success(), "limits set: {}", String::from_utf8_lossy(&set.stderr));
    let acknowledged = Instant::now();

    // Each node: requests until its first 429 (the old limit would admit a thousand).
    let mut took = Vec::new();
    for (id, token) in &users {
        let node_url = cluster.http_url(*id);
        let mut sent = 0;
        loop {
            let status = http.get(format!("{node_url}/v1/me")).bearer_auth(token).send().await?.status();
            sent += 1;
            if status == 429 {
                break;
            }
            ensure!(status == 200, "GET /v1/me through node {id}: {status}");
            ensure!(sent < 500, "node {id} admitted {sent} requests after the change");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // At most 2 admitted under the new limit; any more were admitted before the node
        // applied the change, which the time below bounds.
        eprintln!("node {id}: 429 at request {sent}");
        took.push((*id, acknowledged.elapsed()));
    }
    let slowest = took.iter().map(|(_, t)| *t).max().unwrap_or_default();
    eprintln!("limits change in force: {took:?} after `raftbox limits set` returned (checked in turn)");
    ensure!(slowest < EFFECTIVE_WITHIN + Duration::from_millis(500), "in force within a second: {took:?}");

    // The quota: a second shared folder is refused.
    let (_, token) = &users[0];
    let node_url = cluster.http_url(users[0].0);
    ensure!(matches!(create_folder(&http, &node_url, token, "one").await?, Outcome::Ok(_)), "the first folder");
    match create_folder(&http, &node_url, token, "two").await? {
        Outcome::Rejected(status, body) => ensure!(status == 507 || status == 409, "{status} {body}"),
        other => anyhow::bail!("a second folder beyond the quota of one: {other:?}"),
    }
    Ok(())
}
