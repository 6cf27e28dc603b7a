//! No request stops the cluster (issue 8): the requests that once made `apply` fail on every
//! node — a conflicted copy of a 236-character name, a token named `a//b` naming a copy, a
//! TAB in `X-Device-Id`, a thousand conflicted copies of one path — go through the HTTP API;
//! then every node is restarted (each applies the same entries again): all come back, agree,
//! and keep committing, with every copy kept.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    commit_file, create_token, in_lanes, new_user, put_block, send, within, Cluster, ClusterOptions, Outcome, Seed,
};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(180);
const RESTART_DEADLINE: Duration = Duration::from_secs(30);
/// Conflicting commits of one path: more than the numbered copy names.
const COPIES: usize = 1_005;
const LANES: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_pills_are_applied_everywhere_and_survive_a_restart() {
    let seed = Seed::new("poison_pill::poison_pills_are_applied_everywhere_and_survive_a_restart");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

fn conflicted_copy(outcome: &Outcome) -> Result<String> {
    match outcome {
        Outcome::Rejected(409, body) => {
            let body: Value = serde_json::from_str(body)?;
            Ok(body["conflictedCopy"]["path"].as_str().context("a conflicted copy")?.to_owned())
        }
        other => anyhow::bail!("expected a 409 with a conflicted copy, got {other:?}"),
    }
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let (n1, n2, n3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));
    let (user_id, token) = new_user(cluster, 1, &format!("pill-{}", seed.value()), "laptop").await?;
    let a = put_block(&http, &n1, &token, b"first content").await?;
    let b = put_block(&http, &n1, &token, b"second content").await?;

    // 1. A conflicted copy of a long, legal name (through two nodes).
    let long = format!("/{}.txt", "x".repeat(232));
    ensure!(commit_file(&http, &n1, &token, "laptop", &long, &[a.clone()], 0).await?.is_ok());
    let copy = conflicted_copy(&commit_file(&http, &n2, &token, "phone", &long, &[b.clone()], 0).await?)?;
    ensure!(copy.ends_with("(conflicted copy, phone).txt") && copy.len() <= 256, "copy name {copy}");

    // 2. A token named `a//b` names the device of a copy.
    let odd = create_token(&http, &n1, cluster.admin_token(), &user_id, "a//b").await?;
    let odd = odd.body().and_then(|t| t["token"].as_str()).context("token a//b")?.to_owned();
    let request = http
        .post(format!("{n3}/v1/files/commit"))
        .bearer_auth(&odd)
        .json(&json!({ "path": "/odd.txt", "chunks": [a], "baseVersion": 0, "size": 1, "mtime": 0 }));
    ensure!(send(request).await?.is_ok());
    let request = http
        .post(format!("{n3}/v1/files/commit"))
        .bearer_auth(&odd)
        .json(&json!({ "path": "/odd.txt", "chunks": [b], "baseVersion": 0, "size": 1, "mtime": 0 }));
    ensure!(conflicted_copy(&send(request).await?)? == "/odd (conflicted copy, a__b).txt");

    // 3. A TAB in X-Device-Id is a clear 400, not a crash.
    let tab = commit_file(&http, &n1, &token, "tab\there", "/tab.txt", &[a.clone()], 0).await?;
    ensure!(matches!(tab, Outcome::Rejected(400, _)), "TAB device: {tab:?}");

    // 4. A thousand and more conflicted copies of one path, from one device.
    ensure!(commit_file(&http, &n1, &token, "d", "/many.txt", &[a.clone()], 0).await?.is_ok());
    let chunks: Vec<String> = in_lanes((0..COPIES).collect(), LANES, {
        let (http, n1, token) = (http.clone(), n1.clone(), token.clone());
        move |i: usize| {
            let (http, n1, token) = (http.clone(), n1.clone(), token.clone());
            async move { put_block(&http, &n1, &token, format!("copy {i}").as_bytes()).await }
        }
    })
    .await?;
    let copies: Vec<String> = in_lanes(chunks, LANES, {
        let (http, urls, token) = (http.clone(), [n1.clone(), n2.clone(), n3.clone()], token.clone());
        move |chunk: String| {
            let (http, url, token) = (http.clone(), urls[chunk.as_bytes()[0] as usize % 3].clone(), token.clone());
            async move { conflicted_copy(&commit_file(&http, &url, &token, "phone", "/many.txt", &[chunk], 0).await?) }
        }
    })
    .await?;
    let distinct: std::collections::BTreeSet<&String> = copies.iter().collect();
    ensure!(distinct.len() == COPIES, "{} distinct copy names of {COPIES}", distinct.len());

    // Every node restarts, re-applying whatever it had not snapshotted: all come back.
    let applied = cluster.view(1).await?.last_applied;
    for id in cluster.node_ids() {
        cluster.terminate(id, RESTART_DEADLINE).await?;
    }
    for id in cluster.node_ids() {
        cluster.start_node(id)?;
    }
    cluster.wait_ready(RESTART_DEADLINE).await?;
    for id in cluster.node_ids() {
        let view = cluster.wait_caught_up(id, RESTART_DEADLINE).await?;
        ensure!(view.last_applied >= applied, "node {id} lost entries: {} < {applied}", view.last_applied);
    }
    // And they keep committing, through every node; the copies are all there.
    for (id, url) in [(1, &n1), (2, &n2), (3, &n3)] {
        let after = commit_file(&http, url, &token, "laptop", &format!("/after-{id}"), &[a.clone()], 0).await?;
        ensure!(after.is_ok(), "commit through node {id} after the restart: {after:?}");
    }
    let listing = send(http.get(format!("{n2}/v1/files/list?path=/&limit=1000")).bearer_auth(&token)).await?;
    let entries = listing.body().and_then(|l| l["entries"].as_array()).map_or(0, Vec::len);
    ensure!(entries >= 1_000, "the root lists {entries} entries, expected the copies");
    Ok(())
}
