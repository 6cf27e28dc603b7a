//! Invariant: a node whose fsync stalls for seconds does not hold the cluster hostage
//! (issue 23, `raft/src/disk.rs`): the leader's disk is slowed to 3 s per fsync while users
//! are created through the other nodes; the others elect a leader of their own and keep
//! committing, and the slow node raises `raftbox_disk_slow`. Its disk fast again, it still
//! does not stand for the cool-down: with the new leader killed right then, the third node
//! is elected, never the node that was slow. Then it catches up with every user. The slow
//! disk is an LD_PRELOAD layer delaying `fsync` and `fdatasync` (`tests/data/slow_fsync.c`):
//! this machine's kernel has no device-mapper for a dm-delay device.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_users, within, Cluster, ClusterOptions, CreatedUser, Deadline};

const TEST_DEADLINE: Duration = Duration::from_secs(240);
const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(90);
/// Each fsync of the slowed node waits this long.
const FSYNC_DELAY_MS: u64 = 3_000;
const USERS_BEFORE: usize = 40;
const USERS_DURING: usize = 120;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_fsync_stalls_is_replaced_and_catches_up() {
    let options = ClusterOptions { slow_disks: true, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let (http, token) = (cluster.client(), cluster.admin_token().to_owned());
    let slow = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let others: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != slow).collect();
    let names = |prefix: &str, count: usize| (0..count).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    let mut users: Vec<CreatedUser> =
        create_users(&http, &cluster.http_urls(&[slow]), &token, names("before", USERS_BEFORE), 4).await?;

    // The leader's disk turns slow while users are created through the other nodes.
    cluster.set_fsync_delay(slow, FSYNC_DELAY_MS)?;
    let slowed = Instant::now();
    let during = tokio::spawn({
        let (http, urls, token) = (http.clone(), cluster.http_urls(&others), token.clone());
        async move { create_users(&http, &urls, &token, names("during", USERS_DURING), 4).await }
    });
    let wait = Deadline::after(LEADER_DEADLINE, format!("nodes {others:?} to elect a leader other than {slow}"));
    let leader = loop {
        let mut named = Vec::new();
        for id in &others {
            named.push(cluster.view(*id).await.ok().and_then(|v| v.leader_id));
        }
        match named.as_slice() {
            [Some(a), Some(b)] if a == b && *a != slow => break *a,
            _ => wait.tick(&format!("{named:?}")).await?,
        }
    };
    let elected_after = slowed.elapsed();
    let raised = format!("raftbox_disk_slow{{node=\"{slow}\"}} 1");
    let wait = Deadline::after(LEADER_DEADLINE, format!("node {slow} to raise {raised}"));
    loop {
        let metrics = http.get(format!("{}/metrics", cluster.http_url(slow))).send().await?.text().await?;
        if metrics.contains(&raised) {
            break;
        }
        wait.tick("not raised yet").await?;
    }
    users.extend(during.await.context("the creations during the slow disk")??);
    let committed_after = slowed.elapsed();
    eprintln!(
        "node {slow}'s fsync takes {FSYNC_DELAY_MS} ms: node {leader} led after {elected_after:?}; {USERS_DURING} \
         users created through nodes {others:?} within {committed_after:?}"
    );

    // Fast again, but within the cool-down: the new leader dies, and the third node leads.
    cluster.set_fsync_delay(slow, 0)?;
    cluster.kill9(leader)?;
    let third = *others.iter().find(|id| **id != leader).context("a third node")?;
    let wait = Deadline::after(LEADER_DEADLINE, format!("nodes {slow} and {third} to agree on a leader"));
    let next = loop {
        let named = (
            cluster.view(slow).await.ok().and_then(|v| v.leader_id),
            cluster.view(third).await.ok().and_then(|v| v.leader_id),
        );
        match named {
            (Some(a), Some(b)) if a == b && a != leader => break a,
            _ => wait.tick(&format!("{named:?}")).await?,
        }
    };
    ensure!(next == third, "node {slow} stood for election within its slow disk's cool-down and leads");
    eprintln!("node {leader} killed: node {third} leads, node {slow} did not stand");
    cluster.start_node(leader)?;

    // The node catches up with every user, and its alarm clears.
    let view = cluster.wait_caught_up(slow, CATCH_UP_DEADLINE).await?;
    cluster.verify_users(slow, &users).await.context("every user through the node whose disk was slow")?;
    let cleared = format!("raftbox_disk_slow{{node=\"{slow}\"}} 0");
    let wait = Deadline::after(CATCH_UP_DEADLINE, format!("node {slow} to clear its slow-disk alarm"));
    loop {
        let metrics = http.get(format!("{}/metrics", cluster.http_url(slow))).send().await?.text().await?;
        if metrics.contains(&cleared) {
            break;
        }
        wait.tick("still raised").await?;
    }
    eprintln!("disk fast again: node {slow} caught up ({view:?}) with all {} users, alarm cleared", users.len());
    Ok(())
}
