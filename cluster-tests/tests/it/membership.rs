//! Invariant: membership changes online, under write load, through any node, lose no
//! acknowledged write. Two nodes join a three-node cluster (learners, then voters); the
//! five-node cluster survives two nodes killed at once; a node and then the leader are
//! removed while writes go on; a bad change is refused with the right status and changes
//! nothing.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    acknowledged_users, add_member, cluster_members, members_with_role, new_user, remove_member, send, within, Cluster,
    ClusterOptions, Deadline, Outcome, Seed, Workload, WorkloadSpec, WriteSummary,
};

const TEST_DEADLINE: Duration = Duration::from_secs(240);
const LEADER_DEADLINE: Duration = Duration::from_secs(15);
/// Deadline of one membership change, a learner's catch-up included.
const MEMBERSHIP_DEADLINE: Duration = Duration::from_secs(60);
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
/// Concurrent writers during the changes.
const WRITERS: usize = 4;
/// Writes acknowledged between two steps, at least, so every change happens under load.
const ACKED_PER_STEP_MIN: usize = 20;
const STEP_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_and_leave_under_load() {
    let seed = Seed::new("membership::members_join_and_leave_under_load");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// Voter ids as node `via` reports them through the membership API.
async fn voters(cluster: &Cluster, via: u64) -> Result<Vec<u64>> {
    match cluster_members(&cluster.client(), &cluster.http_url(via), cluster.admin_token()).await? {
        Outcome::Ok(body) => Ok(members_with_role(&body, "voter")),
        other => anyhow::bail!("members through node {via}: {other:?}"),
    }
}

/// Adds node `id` through node `via`, repeating the request while the learner catches up.
async fn join(cluster: &Cluster, id: u64, via: u64) -> Result<()> {
    let (http_addr, grpc_addr) = cluster.addresses(id);
    let (http, url) = (cluster.client(), cluster.http_url(via));
    let wait = Deadline::after(MEMBERSHIP_DEADLINE, format!("node {id} to join as a voter"));
    loop {
        match add_member(&http, &url, cluster.admin_token(), id, &http_addr, &grpc_addr).await? {
            Outcome::Ok(body) if body["complete"] == true => {
                ensure!(members_with_role(&body, "voter").contains(&id), "node {id} not a voter: {body}");
                return Ok(());
            }
            other => wait.tick(&format!("{other:?}")).await?,
        }
    }
}

/// Waits until the workload has `more` acknowledged writes than now.
async fn writes_go_on(workload: &Workload, more: usize, what: &str) -> Result<()> {
    let target = workload.acked() + more;
    let wait = Deadline::after(STEP_DEADLINE, format!("{more} acknowledged writes {what}"));
    while workload.acked() < target {
        wait.tick(&format!("{} acknowledged", workload.acked())).await?;
    }
    Ok(())
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let token = cluster.admin_token().to_owned();
    let http = cluster.client();
    let spec = WorkloadSpec {
        writers: WRITERS,
        targets: [1, 2, 3].iter().map(|&id| (id, cluster.http_url(id))).collect(),
        admin_token: token.clone(),
        name_prefix: "membership".to_owned(),
    };
    let workload = Workload::spawn(http.clone(), spec, &mut rng);
    writes_go_on(&workload, ACKED_PER_STEP_MIN, "before the first change").await?;

    // Two nodes join, through different nodes; then the five-node cluster is the one seen
    // from every node.
    for (id, via) in [(4, 2), (5, 3)] {
        cluster.add_node(id)?;
        cluster.start_node(id)?;
        join(cluster, id, via).await.with_context(|| format!("join node {id}"))?;
        writes_go_on(&workload, ACKED_PER_STEP_MIN, &format!("after node {id} joined")).await?;
    }
    for via in [1, 4, 5] {
        let found = voters(cluster, via).await?;
        ensure!(found == vec![1, 2, 3, 4, 5], "voters through node {via}: {found:?}");
    }
    eprintln!("five voters");

    // Changes that must be refused, changing nothing.
    let (_, user_token) = new_user(cluster, 1, "not-an-admin", "laptop").await?;
    let url = cluster.http_url(2);
    let (http4, grpc4) = cluster.addresses(4);
    let refusals = [
        (add_member(&http, &url, &token, 6, &http4, &grpc4).await?, 409, "node 6 on node 4's addresses"),
        (add_member(&http, &url, &token, 4, &http4, "127.0.0.1:1").await?, 409, "node 4 under other addresses"),
        (remove_member(&http, &url, &token, 99).await?, 404, "an unknown node"),
        (add_member(&http, &url, &user_token, 6, "127.0.0.1:2", "127.0.0.1:3").await?, 403, "a user's token"),
        (add_member(&http, &url, &token, 0, "127.0.0.1:2", "127.0.0.1:3").await?, 400, "node id 0"),
        (add_member(&http, &url, &token, 6, "nowhere", "127.0.0.1:3").await?, 400, "an address without a port"),
        (
            send(http.post(format!("{url}/v1/admin/cluster/members")).bearer_auth(&token).body("{\"id\":")).await?,
            400,
            "malformed JSON",
        ),
    ];
    for (outcome, status, what) in refusals {
        ensure!(
            matches!(&outcome, Outcome::Rejected(s, _) if *s == status),
            "{what}: expected {status}, got {outcome:?}"
        );
    }
    // Adding a voter again changes nothing.
    join(cluster, 4, 1).await?;
    ensure!(voters(cluster, 3).await? == vec![1, 2, 3, 4, 5], "the refused changes changed the membership");

    // Five nodes survive two killed at once.
    cluster.kill9(1)?;
    cluster.kill9(2)?;
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let (_, survivor_token) = new_user(cluster, 4, "written-with-two-down", "phone").await?;
    ensure!(!survivor_token.is_empty(), "no token");
    eprintln!("two of five down: node {leader} leads, writes go through");
    cluster.start_node(1)?;
    cluster.start_node(2)?;
    for id in [1, 2] {
        cluster.wait_caught_up(id, CATCH_UP_DEADLINE).await?;
    }

    // Remove a follower, then the leader, under load.
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let follower = [5, 4, 3].into_iter().find(|id| *id != leader).context("a follower")?;
    let via = [1, 2, 3].into_iter().find(|id| *id != leader && *id != follower).context("a third node")?;
    let removed = remove_member(&http, &cluster.http_url(via), &token, follower).await?;
    ensure!(removed.is_ok(), "remove follower {follower}: {removed:?}");
    cluster.terminate(follower, Duration::from_secs(10)).await?;
    writes_go_on(&workload, ACKED_PER_STEP_MIN, &format!("after removing node {follower}")).await?;
    let removed = remove_member(&http, &cluster.http_url(via), &token, leader).await?;
    ensure!(removed.is_ok(), "remove leader {leader}: {removed:?}");
    // A removed node hears from no one; stop it before asking the others for their leader.
    cluster.terminate(leader, Duration::from_secs(10)).await?;
    let new_leader = cluster.wait_for_leader(Some(leader), LEADER_DEADLINE).await?;
    writes_go_on(&workload, ACKED_PER_STEP_MIN, &format!("after removing the leader {leader}")).await?;
    let left = voters(cluster, new_leader).await?;
    ensure!(left.len() == 3 && !left.contains(&leader) && !left.contains(&follower), "voters now: {left:?}");
    eprintln!("removed node {follower} and the leader {leader}; node {new_leader} leads {left:?}");

    // No acknowledged write lost: every acknowledged user is read back through a voter.
    let records = workload.stop().await?;
    eprintln!("workload: {}", WriteSummary::of(&records));
    let users = acknowledged_users(&records)?;
    cluster.verify_users(new_leader, &users).await.context("acknowledged users after the changes")?;
    Ok(())
}
