//! Invariant: a cluster made by `raftbox recover --force-new-cluster` is a new cluster. When
//! the members it replaced come back (the "lost" majority was only cut off), neither side
//! joins the other: each keeps serving every write it acknowledged, no node names the other
//! side's node as its leader, and `cluster add` refuses a machine holding the old cluster's
//! data.
//!
//! Issue 35, item 1: before cluster ids, the recovered node took the old leader's entries
//! once the cut healed (its incarnation was unchanged, and votes were not checked at all):
//! it named the majority's leader while listing only itself, answered 503, and the write it
//! had acknowledged was readable on no node.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{add_member, new_user, raftbox_bin, send, within, Cluster, ClusterOptions, Outcome};
use serde_json::Value;

const TEST_DEADLINE: Duration = Duration::from_secs(180);
const LEADER_DEADLINE: Duration = Duration::from_secs(20);
/// How long after the cut heals both sides are watched.
const WATCHED_AFTER_HEAL: Duration = Duration::from_secs(8);
/// Pause between two looks at both sides.
const POLL: Duration = Duration::from_millis(200);
/// Writes the old majority acknowledges while the recovered node leads alone.
const MAJORITY_WRITES: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_node_and_the_majority_it_replaced_never_merge() {
    let options = ClusterOptions { network_namespaces: true, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    // Each side refuses the other's calls (and openraft logs the refused ones as errors).
    cluster.allow_log_error("never joined");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let cut = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let majority: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != cut).collect();
    let (before, _) = new_user(cluster, leader, "before-the-cut", "t").await?;
    cluster.wait_caught_up(cut, Duration::from_secs(20)).await?;
    let old_id = cluster_id(cluster, cut).await?;

    // The operator takes node `cut`, cut off, for the last one alive and recovers it.
    cluster.network().context("network namespaces")?.isolate(cut)?;
    // Dead, as the operator believes (cut off, a graceful stop may wait on its peers).
    cluster.kill9(cut)?;
    let report = raftbox(&[
        "recover",
        "--force-new-cluster",
        "--config",
        cluster.config_path(cut).to_str().context("a UTF-8 config path")?,
    ])
    .await?;
    ensure!(report.contains("only voter"), "recover's report: {report}");
    cluster.start_node(cut)?;
    cluster.wait_view(cut, LEADER_DEADLINE, "the recovered node to lead alone", |v| v.leader_id == Some(cut)).await?;
    let new_id = cluster_id(cluster, cut).await?;
    ensure!(new_id != old_id, "the recovered cluster kept the old cluster id {old_id}");
    let (recovered_write, _) = new_user(cluster, cut, "acknowledged-by-the-recovered-node", "t").await?;

    // Meanwhile the old majority goes on.
    let majority_leader = cluster.wait_for_leader_among(&majority, LEADER_DEADLINE).await?;
    let mut majority_writes = Vec::new();
    for i in 0..MAJORITY_WRITES {
        majority_writes.push(new_user(cluster, majority_leader, &format!("majority-{i}"), "t").await?.0);
    }

    cluster.network().context("network namespaces")?.heal()?;
    let healed = Instant::now();
    while healed.elapsed() < WATCHED_AFTER_HEAL {
        let recovered = cluster.view(cut).await?;
        ensure!(
            recovered.leader_id == Some(cut) && recovered.voters == vec![cut],
            "{:?} after the heal, the recovered node names leader {:?} and voters {:?}",
            healed.elapsed(),
            recovered.leader_id,
            recovered.voters
        );
        for id in &majority {
            let view = cluster.view(*id).await?;
            ensure!(
                view.leader_id != Some(cut),
                "{:?} after the heal, node {id} follows the recovered node {cut} (voters {:?})",
                healed.elapsed(),
                view.voters
            );
        }
        ensure!(user_exists(cluster, cut, &recovered_write).await?, "the recovered node lost its acknowledged write");
        ensure!(user_exists(cluster, cut, &before).await?, "the recovered node lost what it held");
        tokio::time::sleep(POLL).await;
    }
    // Each side still has what it acknowledged, and only that.
    let majority_leader = cluster.wait_for_leader_among(&majority, LEADER_DEADLINE).await?;
    for user in &majority_writes {
        ensure!(user_exists(cluster, majority_leader, user).await?, "the majority lost its acknowledged write {user}");
        ensure!(!user_exists(cluster, cut, user).await?, "the majority's write {user} reached the recovered cluster");
    }
    ensure!(
        !user_exists(cluster, majority_leader, &recovered_write).await?,
        "the recovered node's write reached the old cluster"
    );
    ensure!(cluster_id(cluster, majority_leader).await? == old_id, "the old majority changed its cluster id");

    // The recovered cluster refuses a machine holding the old cluster's data.
    let (http_addr, grpc_addr) = cluster.addresses(majority_leader);
    let http = cluster.client();
    let added =
        add_member(&http, &cluster.http_url(cut), cluster.admin_token(), majority_leader, &http_addr, &grpc_addr)
            .await?;
    ensure!(
        matches!(&added, Outcome::Rejected(409, body) if body.contains("another cluster")),
        "cluster add of a node of the old cluster: {added:?}"
    );
    eprintln!(
        "recovered node {cut} (cluster {new_id}) and the majority {majority:?} (cluster {old_id}) stayed apart \
         for {WATCHED_AFTER_HEAL:?} after the heal, each with its own writes; cluster add refused the old data"
    );
    Ok(())
}

async fn cluster_id(cluster: &Cluster, id: u64) -> Result<String> {
    let info: Value = cluster.cluster_info(id).await?;
    info["clusterId"].as_str().map(str::to_owned).with_context(|| format!("node {id} has no cluster id: {info}"))
}

async fn user_exists(cluster: &Cluster, id: u64, user_id: &str) -> Result<bool> {
    let url = format!("{}/v1/admin/users/{user_id}", cluster.http_url(id));
    match send(cluster.client().get(url).bearer_auth(cluster.admin_token())).await? {
        Outcome::Ok(_) => Ok(true),
        Outcome::Rejected(404, _) => Ok(false),
        other => anyhow::bail!("node {id} on user {user_id}: {other:?}"),
    }
}

/// Runs the `raftbox` command line; its stderr, or an error with both outputs.
async fn raftbox(args: &[&str]) -> Result<String> {
    let output = tokio::process::Command::new(raftbox_bin()?).args(args).kill_on_drop(true).output().await?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(output.status.success(), "raftbox {}: {}\n{stderr}", args.join(" "), output.status);
    Ok(stderr)
}
