//! Invariant: a node whose data directory is wiped is rebuilt through a snapshot, and votes
//! again only after it was removed and added back. The leader snapshots often and keeps
//! little log, so once it has purged the head of its log the empty node can only be rebuilt
//! from a snapshot; it must apply as far as the leader, report a `snapshotIndex`, refuse to
//! vote (it forgot its votes), and hold every user — the early ones included. Removed and
//! added again through the membership API, it votes.
//!
//! The second phase checks the rebuilt node can carry the cluster: another node is frozen
//! while writes go on, then the leader is killed: the frozen node's log is behind, so only
//! the rebuilt node can win, with the frozen node's vote; every user is read through it
//! while it leads. The third phase wipes a second node: it too refuses to vote, and the
//! operator replaces it with a fresh node under a new id (remove, stop, start node 4, add):
//! node 4 catches up through a snapshot (the leader's log no longer starts at 1), holds
//! every block uploaded before it existed the moment it becomes a voter (blocks travel
//! outside the log; the leader has a learner fill them in before promoting it), and serves
//! every user.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    add_member, create_users, ensure_distinct_ids, new_user, put_block, remove_member, within, Cluster, ClusterOptions,
    CreatedUser, Deadline, Outcome, Seed,
};
use rand::seq::SliceRandom as _;
use rand::RngCore as _;

/// Overall deadline of the test.
const TEST_DEADLINE: Duration = Duration::from_secs(240);
/// The node wiped and rebuilt. Not node 1: node 1 carries `bootstrap = true`.
const REBUILT: u64 = 3;
/// The node the re-add goes through (any node forwards it to the leader).
const VIA: u64 = 1;
/// The fresh node that replaces the frozen node in the third phase.
const REPLACEMENT: u64 = 4;
/// Blocks uploaded before the replacement exists, and their size.
const BLOCKS: usize = 40;
const BLOCK_BYTES: usize = 64 * 1024;
/// Users created while a node is frozen, so its log falls behind.
const FROZEN_USERS: usize = 50;
/// Deadline of a membership change (a learner's catch-up included).
const MEMBERSHIP_DEADLINE: Duration = Duration::from_secs(60);
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
    let options = ClusterOptions::snapshotting(SNAPSHOT_LOGS_SINCE_LAST, LOGS_TO_KEEP);
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    // Leaders log the calls the wiped nodes refuse until they are added again.
    cluster.allow_log_error("lost its data");
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
    let view = cluster.wait_view(REBUILT, REJOIN_DEADLINE, "the wiped node to not vote", |v| !v.votes).await?;
    ensure!(view.last_applied < target, "the wiped node took entries before it was added again: {view:?}");
    eprintln!("node {REBUILT} wiped, not voting, taking no entries: {view:?}");
    readd(cluster, REBUILT, VIA).await?;
    let view = cluster
        .wait_view(REBUILT, REJOIN_DEADLINE, "the re-added node to install a snapshot and catch up", |v| {
            v.last_applied >= target && v.snapshot_index.is_some()
        })
        .await?;
    eprintln!("node {REBUILT} rebuilt from a snapshot: {view:?}");

    let mut sample: Vec<CreatedUser> = early.iter().take(SAMPLE_EARLIEST).cloned().collect();
    sample.extend(users.choose_multiple(&mut rng, SAMPLE_RANDOM).cloned());
    cluster.verify_users(REBUILT, &sample).await.context("sampled users through the rebuilt node")?;

    let (created, stopped, frozen) = lead_from_rebuilt_node(cluster).await?;
    users.extend(created);
    cluster.verify_users(REBUILT, &users).await.context("every user through the rebuilt node while it leads")?;
    eprintln!("all {} users served by the rebuilt node as leader", users.len());

    // A second wiped voter: silent, and replaced by a fresh node under a new id.
    cluster.kill9(frozen)?;
    cluster.wipe(frozen)?;
    cluster.start_node(frozen)?;
    cluster.wait_view(frozen, REJOIN_DEADLINE, "the wiped voter to refuse to vote", |v| !v.votes).await?;
    cluster.start_node(stopped)?;
    cluster.wait_caught_up(stopped, REJOIN_DEADLINE).await?;
    let hashes = upload_blocks(cluster, &mut rng).await?;
    replace(cluster, frozen, REPLACEMENT, REBUILT).await?;
    let held = cluster.block_files(REPLACEMENT)?;
    let lacking = hashes.iter().filter(|h| !held.contains(*h)).count();
    ensure!(lacking == 0, "node {REPLACEMENT} became a voter without {lacking} of {BLOCKS} blocks");
    let view = cluster.wait_caught_up(REPLACEMENT, REJOIN_DEADLINE).await?;
    ensure!(view.snapshot_index.is_some(), "node {REPLACEMENT} caught up without a snapshot: {view:?}");
    cluster.verify_users(REPLACEMENT, &users).await.context("every user through the replacement node")?;
    eprintln!("node {REPLACEMENT} replaced node {frozen}: {view:?}; all {BLOCKS} blocks, all {} users", users.len());
    Ok(())
}

/// Uploads [`BLOCKS`] random blocks through [`REBUILT`]; their hashes.
async fn upload_blocks(cluster: &Cluster, rng: &mut rand::rngs::StdRng) -> Result<Vec<String>> {
    let (_, token) = new_user(cluster, REBUILT, "uploader", "uploader").await?;
    let (http, url) = (cluster.client(), cluster.http_url(REBUILT));
    let mut hashes = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        let mut data = vec![0u8; BLOCK_BYTES];
        rng.fill_bytes(&mut data);
        hashes.push(put_block(&http, &url, &token, &data).await?);
    }
    Ok(hashes)
}

/// Replaces the lost node `old` as an operator would: removes it through `via` and stops it,
/// then starts the fresh node `new` and adds it until it is a voter.
async fn replace(cluster: &mut Cluster, old: u64, new: u64, via: u64) -> Result<()> {
    let (http, url, token) = (cluster.client(), cluster.http_url(via), cluster.admin_token().to_owned());
    let removed = remove_member(&http, &url, &token, old).await?;
    ensure!(removed.is_ok(), "remove node {old} through node {via}: {removed:?}");
    cluster.kill9(old)?;
    cluster.add_node(new)?;
    cluster.start_node(new)?;
    add_until_voter(cluster, new, via).await?;
    eprintln!("node {old} removed and replaced by node {new}");
    Ok(())
}

/// Adds node `id` through node `via`, repeating while it catches up, until it is a voter.
async fn add_until_voter(cluster: &Cluster, id: u64, via: u64) -> Result<()> {
    let (http, url, token) = (cluster.client(), cluster.http_url(via), cluster.admin_token().to_owned());
    let (http_addr, grpc_addr) = cluster.addresses(id);
    let wait = Deadline::after(MEMBERSHIP_DEADLINE, format!("node {id} to be added as a voter"));
    loop {
        match add_member(&http, &url, &token, id, &http_addr, &grpc_addr).await? {
            Outcome::Ok(body) if body["complete"] == true => return Ok(()),
            other => wait.tick(&format!("{other:?}")).await?,
        }
    }
}

/// Removes node `id` and adds it again (same addresses) through node `via`; then it votes.
async fn readd(cluster: &Cluster, id: u64, via: u64) -> Result<()> {
    let (http, url, token) = (cluster.client(), cluster.http_url(via), cluster.admin_token().to_owned());
    let removed = remove_member(&http, &url, &token, id).await?;
    ensure!(removed.is_ok(), "remove node {id} through node {via}: {removed:?}");
    add_until_voter(cluster, id, via).await?;
    let view = cluster.wait_view(id, REJOIN_DEADLINE, "the re-added node to vote", |v| v.votes).await?;
    eprintln!("node {id} removed and added again: {view:?}");
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

/// Freezes the follower other than [`REBUILT`] while users are created, kills the leader
/// and lets the frozen node run again: its log is behind the rebuilt node's, so only the
/// rebuilt node can be elected — with the frozen node's vote. Returns the users created
/// meanwhile, the node killed and the node frozen.
async fn lead_from_rebuilt_node(cluster: &mut Cluster) -> Result<(Vec<CreatedUser>, u64, u64)> {
    let stopped = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    ensure!(stopped != REBUILT, "the rebuilt node {REBUILT} leads already");
    let frozen = cluster.node_ids().into_iter().find(|id| *id != stopped && *id != REBUILT).context("a third node")?;
    cluster.pause(frozen)?;
    let (http, token) = (cluster.client(), cluster.admin_token().to_owned());
    let urls = cluster.http_urls(&[stopped, REBUILT]);
    let created = create_users(&http, &urls, &token, names("frozen", FROZEN_USERS), LANES).await?;
    cluster.kill9(stopped)?;
    cluster.resume(frozen)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    ensure!(leader == REBUILT, "node {leader} leads, expected the rebuilt node {REBUILT}");
    eprintln!("the rebuilt node {REBUILT} leads");
    Ok((created, stopped, frozen))
}
