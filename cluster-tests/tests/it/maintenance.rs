//! Invariants of background maintenance (short periods configured): an uploaded block no
//! commit references is reclaimed after the grace period on every node; a superseded version
//! expires after the retention period while the current one stays; a node that was down
//! during uploads gets the blocks from its peers without being asked.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_token, create_user, within, Cluster, ClusterOptions, Deadline, Seed};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
const CONVERGE_DEADLINE: Duration = Duration::from_secs(30);

fn files_toml() -> String {
    "[files]\nversion_retention_s = 1\norphan_grace_s = 1\nmaintenance_interval_s = 1\n".to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reclaimed_versions_expire_and_blocks_spread() {
    let seed = Seed::new("maintenance::orphans_are_reclaimed_versions_expire_and_blocks_spread");
    let options = ClusterOptions { extra_toml: files_toml(), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

fn block_file(cluster: &Cluster, id: u64, hash: &str) -> std::path::PathBuf {
    cluster.data_dir(id).join("blocks").join(&hash[..2]).join(hash)
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let n1 = cluster.http_url(1);
    let user = create_user(&http, &n1, cluster.admin_token(), &format!("gc-{}", seed.value())).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("user")?.to_owned();
    let token = create_token(&http, &n1, cluster.admin_token(), &user_id, "t").await?;
    let token = token.body().and_then(|b| b["token"].as_str()).context("token")?.to_owned();
    let put = |url: String, data: &'static str| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let hash = blake3::hash(data.as_bytes()).to_hex().to_string();
            let response = http.put(format!("{url}/v1/blocks/{hash}")).bearer_auth(&token).body(data).send().await?;
            ensure!(response.status().as_u16() == 201, "PUT: {}", response.status());
            anyhow::Ok(hash)
        }
    };
    let commit = |chunks: Vec<String>, base: u64| {
        let (http, token, url) = (http.clone(), token.clone(), n1.clone());
        async move {
            let body = json!({ "path": "/v.txt", "chunks": chunks, "baseVersion": base, "size": 1, "mtime": 0 });
            let response = http.post(format!("{url}/v1/files/commit")).bearer_auth(&token).json(&body).send().await?;
            ensure!(response.status().as_u16() == 201, "commit: {}", response.status());
            anyhow::Ok(())
        }
    };

    // An orphan: uploaded, never committed.
    let orphan = put(n1.clone(), "never committed").await?;
    // Two versions: the first becomes superseded, its chunk unreferenced once it expires.
    let old = put(n1.clone(), "old content").await?;
    let new = put(n1.clone(), "new content").await?;
    commit(vec![old.clone()], 0).await?;
    commit(vec![new.clone()], 1).await?;

    let wait = Deadline::after(CONVERGE_DEADLINE, "orphans reclaimed and old versions expired");
    loop {
        let history: Value =
            http.get(format!("{n1}/v1/files/history?path=/v.txt")).bearer_auth(&token).send().await?.json().await?;
        let versions = history["versions"].as_array().map_or(0, Vec::len);
        let files_left = cluster
            .node_ids()
            .iter()
            .filter(|id| block_file(cluster, **id, &orphan).exists() || block_file(cluster, **id, &old).exists())
            .count();
        if versions == 1 && files_left == 0 {
            ensure!(history["versions"][0]["version"] == 2, "the current version stays: {history}");
            break;
        }
        wait.tick(&format!("{versions} versions, orphan files on {files_left} nodes")).await?;
    }
    for id in cluster.node_ids() {
        ensure!(block_file(cluster, id, &new).exists(), "node {id} lost the referenced block");
    }
    eprintln!("orphan and expired-version blocks reclaimed on every node; the current version kept");

    // A follower is down while blocks are uploaded; the replicator fills it afterwards. (A
    // follower, not the leader: with a 1 s orphan grace, the election a killed leader costs
    // could let the collector take the block between its upload and its commit.)
    let leader = cluster.wait_for_leader(None, CONVERGE_DEADLINE).await?;
    let down = cluster.node_ids().into_iter().filter(|id| *id != leader && *id != 1).max().context("a follower")?;
    cluster.kill9(down)?;
    let spread = put(cluster.http_url(1), "uploaded while a node was down").await?;
    commit(vec![spread.clone()], 2).await?;
    ensure!(!block_file(cluster, down, &spread).exists(), "node {down} was down");
    cluster.start_node(down)?;
    let wait = Deadline::after(CONVERGE_DEADLINE, format!("node {down} receives the block it missed"));
    while !block_file(cluster, down, &spread).exists() {
        wait.tick("block not there yet").await?;
    }
    eprintln!("the replicator gave node {down} the block uploaded while it was down");
    Ok(())
}
