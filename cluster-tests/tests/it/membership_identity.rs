//! Invariant: a node votes only with the data directory the configuration recorded for it
//! (raft/src/membership.rs, ARCHITECTURE.md "Membership identity"), decided from durable
//! state rather than from whichever peer answers first.
//!
//! - A fresh cluster whose members come up late or whose bootstrapping node is killed
//!   part-way forms with every member voting: it then survives losing any one node.
//! - A wiped node that reaches no peer at start, or only a peer whose log lags, never
//!   votes: with the one other survivor it cannot elect a leader, so nothing is
//!   acknowledged that a majority of the data directories that voted does not hold. Removed
//!   and added again, it votes, and every user acknowledged before the wipe is there.
//! - A machine started on the old directory of a member the cluster replaced lends no vote:
//!   with the leader down, the other survivor cannot be elected with it (its own stale
//!   configuration still says it votes; the candidate's names its replacement).

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    add_member, copy_dir, create_user, create_users, remove_member, within, Cluster, ClusterOptions, CreatedUser,
    Deadline, Outcome, Seed,
};
use rand::Rng as _;

const TEST_DEADLINE: Duration = Duration::from_secs(240);
const FORM_DEADLINE: Duration = Duration::from_secs(40);
const LEADER_DEADLINE: Duration = Duration::from_secs(15);
const MEMBERSHIP_DEADLINE: Duration = Duration::from_secs(60);
/// How long a member stays frozen while the others start (the fault, not a wait).
const LATE_START: Duration = Duration::from_secs(3);
/// How long the wiped node is watched for a vote while it cannot be re-added.
const SILENCE_WATCH: Duration = Duration::from_secs(4);
const USERS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cluster_forms_with_every_member_voting() {
    let seed = Seed::new("membership_identity::a_fresh_cluster_forms_with_every_member_voting");
    let mut rng = seed.rng();
    // Round 1: a member other than the bootstrapping node is frozen while the others start.
    let late = rng.gen_range(2..=3u64);
    let mut cluster = Cluster::launch(ClusterOptions::default()).expect("launch the cluster");
    let result = within(TEST_DEADLINE, async {
        cluster.pause(late)?;
        tokio::time::sleep(LATE_START).await;
        cluster.resume(late)?;
        eprintln!("node {late} frozen for {LATE_START:?} at start");
        every_member_votes_and_one_may_fail(&mut cluster).await
    })
    .await;
    cluster.conclude(result);

    // Round 2: the bootstrapping node is killed part-way through forming, then restarted.
    let kill_after = Duration::from_millis(rng.gen_range(50..1_500));
    let mut cluster = Cluster::launch(ClusterOptions::default()).expect("launch the cluster");
    let result = within(TEST_DEADLINE, async {
        tokio::time::sleep(kill_after).await;
        cluster.kill9(1)?;
        cluster.start_node(1)?;
        eprintln!("node 1 (bootstrapping) killed {kill_after:?} after launch and restarted");
        every_member_votes_and_one_may_fail(&mut cluster).await
    })
    .await;
    cluster.conclude(result);
}

/// Every node reports it votes; the leader is killed and the two others elect a new one
/// and take a write.
async fn every_member_votes_and_one_may_fail(cluster: &mut Cluster) -> Result<()> {
    cluster.wait_ready(FORM_DEADLINE).await?;
    for id in cluster.node_ids() {
        let view = cluster.wait_view(id, FORM_DEADLINE, "every member to vote", |v| v.votes).await?;
        ensure!(view.voters == vec![1, 2, 3], "node {id} holds voters {:?}", view.voters);
    }
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    cluster.kill9(leader)?;
    let next = cluster.wait_for_leader(Some(leader), LEADER_DEADLINE).await?;
    let (http, url) = (cluster.client(), cluster.http_url(next));
    let created = create_user(&http, &url, cluster.admin_token(), "after-the-leader-died").await?;
    ensure!(matches!(created, Outcome::Ok(_)), "a write after losing node {leader}: {created:?}");
    eprintln!("all three voted; node {leader} killed, node {next} leads and writes");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_never_votes_until_added_again() {
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    // Leaders log the calls the wiped node refuses until it is added again.
    cluster.allow_log_error("lost its data");
    let result = within(TEST_DEADLINE, wiped_scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn wiped_scenario(cluster: &mut Cluster) -> Result<()> {
    const LAGGING: u64 = 2;
    const WIPED: u64 = 3;
    let http = cluster.client();
    let token = cluster.admin_token().to_owned();
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    // Node 2 lags: frozen while users are written through node 1 (acknowledged by 1 and 3).
    cluster.pause(LAGGING)?;
    let names: Vec<String> = (0..USERS).map(|i| format!("before-wipe-{i}")).collect();
    let users = create_users(&http, &cluster.http_urls(&[1]), &token, names, 4).await?;
    // Every node stops; node 3 loses its disk and starts first, reaching no one.
    for id in [1, LAGGING, WIPED] {
        cluster.kill9(id)?;
    }
    cluster.wipe(WIPED)?;
    cluster.start_node(WIPED)?;
    never_votes(cluster, WIPED, "reaching no peer").await?;
    // Only the lagging peer comes back: with the wiped node it is two of three, but the
    // wiped node must neither vote nor take entries (the lagging node may even resume as the
    // stale leader of an old term: openraft restores a leader from its own committed vote),
    // so nothing is acknowledged.
    cluster.start_node(LAGGING)?;
    never_votes(cluster, WIPED, "with only the lagging peer up").await?;
    let refused = create_user(&http, &cluster.http_url(LAGGING), &token, "must-not-commit").await?;
    ensure!(!matches!(refused, Outcome::Ok(_)), "a write was acknowledged by the lagging node and the wiped one");
    // Node 1 returns: a real majority. The wiped node still does not vote.
    cluster.start_node(1)?;
    let leader = cluster.wait_for_leader(Some(WIPED), LEADER_DEADLINE).await?;
    never_votes(cluster, WIPED, "once the cluster has a leader again").await?;
    // Removed and added again, it votes and serves every user.
    let url = cluster.http_url(leader);
    let removed = remove_member(&http, &url, &token, WIPED).await?;
    ensure!(removed.is_ok(), "remove node {WIPED}: {removed:?}");
    let (http_addr, grpc_addr) = cluster.addresses(WIPED);
    let wait = Deadline::after(MEMBERSHIP_DEADLINE, format!("node {WIPED} to be added again"));
    loop {
        match add_member(&http, &url, &token, WIPED, &http_addr, &grpc_addr).await? {
            Outcome::Ok(body) if body["complete"] == true => break,
            other => wait.tick(&format!("{other:?}")).await?,
        }
    }
    cluster.wait_view(WIPED, MEMBERSHIP_DEADLINE, "the re-added node to vote", |v| v.votes).await?;
    let users: Vec<CreatedUser> = users;
    cluster.verify_users(WIPED, &users).await.context("every user through the re-added node")?;
    eprintln!("node {WIPED} silent while wiped (alone, with the lagging node, with a leader); votes once re-added");
    Ok(())
}

/// Watches node `id` for [`SILENCE_WATCH`]: it must answer and never say it votes or leads.
async fn never_votes(cluster: &Cluster, id: u64, when: &str) -> Result<()> {
    let until = tokio::time::Instant::now() + SILENCE_WATCH;
    let mut answered = 0;
    while tokio::time::Instant::now() < until {
        if let Ok(view) = cluster.view(id).await {
            answered += 1;
            ensure!(!view.votes, "the wiped node {id} votes {when}: {view:?}");
            ensure!(!view.is_leader(), "the wiped node {id} leads {when}: {view:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(answered > 0, "node {id} never answered {when}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_members_old_directory_lends_no_vote() {
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    // Leaders and candidates log the calls the old directory refuses.
    cluster.allow_log_error("lost its data");
    let result = within(TEST_DEADLINE, old_directory_scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn old_directory_scenario(cluster: &mut Cluster) -> Result<()> {
    let http = cluster.client();
    let token = cluster.admin_token().to_owned();
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let mut others = cluster.node_ids().into_iter().filter(|id| *id != leader);
    let (stale, survivor) = (others.next().context("a follower")?, others.next().context("another follower")?);
    let names = |prefix: &str| (0..USERS).map(|i| format!("{prefix}-{i}")).collect::<Vec<String>>();
    let mut users = create_users(&http, &cluster.http_urls(&[leader]), &token, names("before-copy"), 4).await?;
    cluster.wait_caught_up(stale, MEMBERSHIP_DEADLINE).await?;

    // A copy of the follower's disk, taken stopped.
    cluster.kill9(stale)?;
    let copy = cluster.root().join("old-directory");
    copy_dir(cluster.data_dir(stale), &copy)?;
    cluster.start_node(stale)?;
    // The machine is replaced: removed, wiped, started empty and added back.
    let url = cluster.http_url(leader);
    let removed = remove_member(&http, &url, &token, stale).await?;
    ensure!(removed.is_ok(), "remove node {stale}: {removed:?}");
    cluster.kill9(stale)?;
    cluster.wipe(stale)?;
    cluster.start_node(stale)?;
    add_back(cluster, &url, stale).await?;
    users.extend(create_users(&http, &cluster.http_urls(&[leader]), &token, names("after-replace"), 4).await?);

    // Then started on its old disk, and the leader is lost.
    cluster.kill9(stale)?;
    cluster.wipe(stale)?;
    copy_dir(&copy, cluster.data_dir(stale))?;
    cluster.start_node(stale)?;
    cluster.kill9(leader)?;
    let until = tokio::time::Instant::now() + SILENCE_WATCH + SILENCE_WATCH;
    while tokio::time::Instant::now() < until {
        for id in [stale, survivor] {
            if let Ok(view) = cluster.view(id).await {
                ensure!(
                    !view.is_leader(),
                    "node {id} leads with the vote of a replaced member's old directory: {view:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = create_user(&http, &cluster.http_url(survivor), &token, "must-not-commit").await?;
    ensure!(!matches!(refused, Outcome::Ok(_)), "a write was acknowledged by the survivor and the old directory");

    // The leader returns: a real majority. The old directory is wiped and added back.
    cluster.start_node(leader)?;
    let leader = cluster.wait_for_leader_among(&[leader, survivor], LEADER_DEADLINE).await?;
    let url = cluster.http_url(leader);
    cluster.kill9(stale)?;
    cluster.wipe(stale)?;
    cluster.start_node(stale)?;
    let removed = remove_member(&http, &url, &token, stale).await?;
    ensure!(removed.is_ok(), "remove node {stale} again: {removed:?}");
    add_back(cluster, &url, stale).await?;
    cluster.wait_view(stale, MEMBERSHIP_DEADLINE, "the re-added node to vote", |v| v.votes).await?;
    cluster.verify_users(stale, &users).await.context("every user through the re-added node")?;
    eprintln!(
        "node {stale} on a replaced member's directory: node {survivor} was not elected with it for {:?}; \
         wiped and added back, it votes and serves all {} users",
        SILENCE_WATCH + SILENCE_WATCH,
        users.len()
    );
    Ok(())
}

/// Adds node `id` back through `url`, repeating while it catches up.
async fn add_back(cluster: &Cluster, url: &str, id: u64) -> Result<()> {
    let (http_addr, grpc_addr) = cluster.addresses(id);
    let wait = Deadline::after(MEMBERSHIP_DEADLINE, format!("node {id} to be added again"));
    loop {
        match add_member(&cluster.client(), url, cluster.admin_token(), id, &http_addr, &grpc_addr).await? {
            Outcome::Ok(body) if body["complete"] == true => return Ok(()),
            other => wait.tick(&format!("{other:?}")).await?,
        }
    }
}
