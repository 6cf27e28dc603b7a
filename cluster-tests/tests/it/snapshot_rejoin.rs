//! Invariant: a node whose data directory is wiped rejoins through a snapshot. The leader
//! snapshots often and keeps little log, so once it has purged the head of its log the empty
//! node can only be rebuilt from a snapshot; it must then apply as far as the leader, report
//! a `snapshotIndex`, and hold every user — the early ones included.
//!
//! The second phase checks the rebuilt node can carry the cluster: the two other nodes are
//! stopped, one of them wiped and restarted, so the rebuilt node holds the only complete log
//! and must win the election; every user is then read through it while it leads, and the
//! other two nodes are rebuilt from it.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    create_users, ensure_distinct_ids, within, Cluster, ClusterOptions, CreatedUser, Deadline, RaftTuning, Seed,
};
use rand::seq::SliceRandom as _;

/// Overall deadline of the test.
const TEST_DEADLINE: Duration = Duration::from_secs(240);
/// The node wiped and rebuilt. Not node 1: node 1 carries `bootstrap = true`.
const REBUILT: u64 = 3;
/// The other node wiped in the second phase (also not the bootstrap node).
const WIPED_VOTER: u64 = 2;
/// The node stopped, not wiped, in the second phase.
const STOPPED: u64 = 1;
/// Snapshot policy under test.
const SNAPSHOT_LOGS_SINCE_LAST: u64 = 50;
const LOGS_TO_KEEP: u64 = 10;
/// Users created before the wipe, and while the wiped node is down.
const EARLY_USERS: usize = 300;
const LATE_USERS: usize = 100;
/// Concurrent creations.
const LANES: usize = 16;
/// The leader's snapshot must reach this index, so its log no longer starts at index 1.
/// Writes are batched into log entries, so the user counts alone do not guarantee it.
const LEADER_SNAPSHOT_INDEX_MIN: u64 = 2 * SNAPSHOT_LOGS_SINCE_LAST + LOGS_TO_KEEP;
/// Sequential creations allowed to reach [`LEADER_SNAPSHOT_INDEX_MIN`].
const TOP_UP_USERS_MAX: usize = 2_000;
/// Users read back through the rebuilt node in the first phase.
const SAMPLE_EARLIEST: usize = 20;
const SAMPLE_RANDOM: usize = 60;
/// Deadlines of the phases.
const LEADER_DEADLINE: Duration = Duration::from_secs(10);
const TOP_UP_DEADLINE: Duration = Duration::from_secs(60);
const REJOIN_DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_node_rejoins_from_snapshot() {
    let seed = Seed::new("snapshot_rejoin::wiped_node_rejoins_from_snapshot");
    let options = ClusterOptions {
        nodes: 3,
        raft: RaftTuning {
            snapshot_logs_since_last: SNAPSHOT_LOGS_SINCE_LAST,
            logs_to_keep: LOGS_TO_KEEP,
            ..RaftTuning::default()
        },
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let http = cluster.client();
    let token = cluster.admin_token().to_owned();
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;

    let all = cluster.http_urls(&cluster.node_ids());
    let early = create_users(&http, &all, &token, names("early", EARLY_USERS), LANES).await?;
    eprintln!("created {} early users", early.len());

    cluster.kill9(REBUILT)?;
    cluster.wipe(REBUILT)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let survivors = cluster.http_urls(&cluster.live_ids());
    let late = create_users(&http, &survivors, &token, names("late", LATE_USERS), LANES).await?;
    let top_up = top_up_until_snapshot(cluster, leader, &survivors).await?;
    eprintln!("created {} late and {} top-up users", late.len(), top_up.len());

    let mut users: Vec<CreatedUser> = early.clone();
    users.extend(late);
    users.extend(top_up);
    ensure_distinct_ids(&users)?;

    cluster.start_node(REBUILT)?;
    let target = cluster.view(leader).await?.last_applied;
    let view = cluster
        .wait_view(REBUILT, REJOIN_DEADLINE, "the wiped node to install a snapshot and catch up", |v| {
            v.last_applied >= target && v.snapshot_index.is_some()
        })
        .await?;
    eprintln!("node {REBUILT} rebuilt: {view:?}");

    let mut sample: Vec<CreatedUser> = early.iter().take(SAMPLE_EARLIEST).cloned().collect();
    sample.extend(users.choose_multiple(&mut rng, SAMPLE_RANDOM).cloned());
    cluster.verify_users(REBUILT, &sample).await.context("sampled users through the rebuilt node")?;

    lead_from_rebuilt_node(cluster).await?;
    cluster.verify_users(REBUILT, &users).await.context("every user through the rebuilt node while it leads")?;
    eprintln!("all {} users served by the rebuilt node as leader", users.len());

    for id in [WIPED_VOTER, STOPPED] {
        if !cluster.is_running(id) {
            cluster.start_node(id)?;
        }
        cluster.wait_caught_up(id, REJOIN_DEADLINE).await?;
    }
    Ok(())
}

/// Creates users one at a time until the leader's snapshot index reaches
/// [`LEADER_SNAPSHOT_INDEX_MIN`].
async fn top_up_until_snapshot(cluster: &Cluster, leader: u64, urls: &[String]) -> Result<Vec<CreatedUser>> {
    let http = cluster.client();
    let token = cluster.admin_token().to_owned();
    let wait = Deadline::after(TOP_UP_DEADLINE, "the leader's snapshot index to pass the minimum");
    let mut created = Vec::new();
    loop {
        let view = cluster.view(leader).await?;
        if view.snapshot_index.is_some_and(|index| index >= LEADER_SNAPSHOT_INDEX_MIN) {
            eprintln!("leader {leader}: {view:?}");
            return Ok(created);
        }
        ensure!(
            created.len() < TOP_UP_USERS_MAX,
            "{TOP_UP_USERS_MAX} extra users did not bring the leader's snapshot index to \
             {LEADER_SNAPSHOT_INDEX_MIN}: {view:?}"
        );
        ensure!(!wait.expired(), "deadline passed: {view:?}");
        let name = format!("topup-{}", created.len());
        let url = urls[created.len() % urls.len()].clone();
        created.extend(create_users(&http, &[url], &token, vec![name], 1).await?);
    }
}

/// Stops the other two nodes, wipes [`WIPED_VOTER`] and restarts it: the rebuilt node then
/// holds the only complete log, so it alone can be elected.
async fn lead_from_rebuilt_node(cluster: &mut Cluster) -> Result<()> {
    for id in [STOPPED, WIPED_VOTER] {
        if cluster.is_running(id) {
            cluster.kill9(id)?;
        }
    }
    cluster.wipe(WIPED_VOTER)?;
    cluster.start_node(WIPED_VOTER)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    ensure!(leader == REBUILT, "node {leader} leads, expected the rebuilt node {REBUILT}");
    eprintln!("the rebuilt node {REBUILT} leads");
    Ok(())
}
