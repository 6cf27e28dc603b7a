//! Invariant: a follower killed (-9) at any point while it installs a snapshot comes back by
//! itself: its log is never purged past the state it has made durable, so after a restart
//! and an election it catches up and serves every user (issue 23). Each round stops a
//! follower, writes until the leader's snapshot has moved past the follower's log (so only a
//! snapshot can bring it back), starts it, kills it a seeded moment later (often mid-install),
//! starts it again, kills the leader (an election), and checks the follower catches up and
//! holds every user created so far.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_users, within, Cluster, ClusterOptions, CreatedUser, Deadline, Seed};
use rand::Rng as _;

const TEST_DEADLINE: Duration = Duration::from_secs(300);
const ROUNDS: usize = 3;
const LEADER_DEADLINE: Duration = Duration::from_secs(15);
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
const SNAPSHOT_LOGS_SINCE_LAST: u64 = 40;
const LOGS_TO_KEEP: u64 = 5;
/// How far past the follower's last entry the leader's snapshot must be.
const SNAPSHOT_LEAD_MIN: u64 = 2 * SNAPSHOT_LOGS_SINCE_LAST;
/// Users created to move the leader's snapshot, at most, per round.
const USERS_PER_ROUND_MAX: usize = 1_000;
/// The kill comes this long after the follower starts, at most (seeded).
const KILL_AFTER_MAX_MS: u64 = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_while_installing_a_snapshot_catches_up() {
    let seed = Seed::new("snapshot_install_crash::a_follower_killed_while_installing_a_snapshot_catches_up");
    let options = ClusterOptions::snapshotting(SNAPSHOT_LOGS_SINCE_LAST, LOGS_TO_KEEP);
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let mut users: Vec<CreatedUser> = Vec::new();
    for round in 0..ROUNDS {
        let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
        let followers: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != leader).collect();
        let follower = followers[rng.gen_range(0..followers.len())];
        let behind = cluster.view(follower).await?.last_log_index;
        cluster.kill9(follower)?;
        users.extend(write_past(cluster, leader, behind + SNAPSHOT_LEAD_MIN, round).await?);
        let kill_after = Duration::from_millis(rng.gen_range(0..KILL_AFTER_MAX_MS));
        cluster.start_node(follower)?;
        tokio::time::sleep(kill_after).await; // the fault's timing, not a wait for anything
        cluster.kill9(follower)?;
        cluster.start_node(follower)?;
        // An election with the follower up again.
        cluster.kill9(leader)?;
        let next = cluster.wait_for_leader(Some(leader), LEADER_DEADLINE).await?;
        cluster.start_node(leader)?;
        let view = cluster.wait_caught_up(follower, CATCH_UP_DEADLINE).await?;
        cluster.wait_caught_up(leader, CATCH_UP_DEADLINE).await?;
        cluster.verify_users(follower, &users).await.with_context(|| format!("round {round}: users on {follower}"))?;
        eprintln!(
            "round {round}: node {follower} killed {kill_after:?} into its catch-up, restarted; node {leader} \
             killed, node {next} leads; node {follower} caught up ({view:?}) with all {} users",
            users.len()
        );
    }
    Ok(())
}

/// Creates users through `leader` until its snapshot index reaches `target`.
async fn write_past(cluster: &Cluster, leader: u64, target: u64, round: usize) -> Result<Vec<CreatedUser>> {
    let (http, token) = (cluster.client(), cluster.admin_token().to_owned());
    let url = cluster.http_url(leader);
    let wait = Deadline::after(CATCH_UP_DEADLINE, format!("the leader's snapshot index to reach {target}"));
    let mut created = Vec::new();
    loop {
        let view = cluster.view(leader).await?;
        if view.snapshot_index.is_some_and(|index| index >= target) {
            return Ok(created);
        }
        ensure!(created.len() < USERS_PER_ROUND_MAX, "{USERS_PER_ROUND_MAX} users did not move the snapshot: {view:?}");
        ensure!(!wait.expired(), "deadline passed: {view:?}");
        let names: Vec<String> = (0..10).map(|i| format!("r{round}-{}-{i}", created.len())).collect();
        created.extend(create_users(&http, std::slice::from_ref(&url), &token, names, 1).await?);
    }
}
