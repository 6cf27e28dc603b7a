//! Invariant: when the leader is killed (SIGKILL) under write load, the survivors elect a new
//! leader within [`ELECTION_DEADLINE`], writes through them succeed again, and every write
//! acknowledged with 201 — before, during or after the failover — is present on every node
//! once the old leader has rejoined. Writes whose outcome is unknown are not checked.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    acknowledged_users, ensure_distinct_ids, ensure_none_rejected, within, Cluster, ClusterOptions, Deadline, Seed,
    Workload, WorkloadSpec, WriteSummary,
};
use rand::Rng as _;

/// Overall deadline of the test.
const TEST_DEADLINE: Duration = Duration::from_secs(180);
/// Deadline for the first leader of the fresh cluster.
const LEADER_DEADLINE: Duration = Duration::from_secs(10);
/// Longest acceptable time from the SIGKILL to an agreed new leader.
const ELECTION_DEADLINE: Duration = Duration::from_secs(5);
/// Concurrent writers.
const WRITERS: usize = 8;
/// Writing time before the kill; the seed adds up to [`WARMUP_JITTER_MS`].
const WARMUP: Duration = Duration::from_secs(1);
const WARMUP_JITTER_MS: u64 = 500;
/// Acknowledged writes required before the kill, so the kill lands on a busy leader.
const ACKED_BEFORE_KILL_MIN: usize = 20;
/// Deadline for reaching both warm-up conditions.
const WARMUP_DEADLINE: Duration = Duration::from_secs(20);
/// Acknowledged writes started after the kill that show writes have resumed.
const ACKED_AFTER_KILL_MIN: usize = 50;
/// Deadline, counted from the new leader's election, for writes to resume.
const RESUME_DEADLINE: Duration = Duration::from_secs(15);
/// Deadline for the restarted old leader to apply everything.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_write_load() {
    let seed = Seed::new("failover::leader_killed_under_write_load");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let old_leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let followers: Vec<u64> = cluster.node_ids().into_iter().filter(|&id| id != old_leader).collect();
    eprintln!("leader is node {old_leader}; writing through nodes {followers:?}");

    let spec = WorkloadSpec {
        writers: WRITERS,
        targets: followers.iter().map(|&id| (id, cluster.http_url(id))).collect(),
        admin_token: cluster.admin_token().to_owned(),
        name_prefix: "failover".to_owned(),
    };
    let workload = Workload::spawn(cluster.client(), spec, &mut rng);
    let writing_since = Instant::now();
    let warmup = WARMUP + Duration::from_millis(rng.gen_range(0..=WARMUP_JITTER_MS));

    let wait = Deadline::after(WARMUP_DEADLINE, "warm-up writes before the kill");
    loop {
        let acked = workload.acked();
        if acked >= ACKED_BEFORE_KILL_MIN && writing_since.elapsed() >= warmup {
            break;
        }
        wait.tick(&format!("{acked} writes acknowledged")).await?;
    }

    let killed_at = Instant::now();
    cluster.kill9(old_leader)?;
    eprintln!("killed leader {old_leader} after {} acknowledged writes", workload.acked());

    let new_leader = cluster
        .wait_for_leader(Some(old_leader), ELECTION_DEADLINE)
        .await
        .context("elect a new leader after the leader was killed")?;
    let election = killed_at.elapsed();
    eprintln!("node {new_leader} leads {} ms after the kill", election.as_millis());
    ensure!(election <= ELECTION_DEADLINE, "the new leader took {election:?}, more than {ELECTION_DEADLINE:?}");

    let wait = Deadline::after(RESUME_DEADLINE, "writes acknowledged after the kill");
    loop {
        let resumed = workload.count(|r| r.started >= killed_at && r.outcome.is_ok());
        if resumed >= ACKED_AFTER_KILL_MIN {
            break;
        }
        wait.tick(&format!("{resumed} writes started after the kill acknowledged")).await?;
    }
    let records = workload.stop().await?;
    eprintln!("writes: {}", WriteSummary::of(&records));
    if let Some(first) =
        records.iter().filter(|r| r.started >= killed_at && r.outcome.is_ok()).map(|r| r.finished).min()
    {
        let gap = first.saturating_duration_since(killed_at);
        eprintln!("first write acknowledged {} ms after the kill", gap.as_millis());
    }
    ensure_none_rejected(&records)?;
    let users = acknowledged_users(&records)?;
    ensure_distinct_ids(&users)?;

    cluster.start_node(old_leader)?;
    let view =
        cluster.wait_caught_up(old_leader, CATCH_UP_DEADLINE).await.context("restarted old leader catches up")?;
    eprintln!("node {old_leader} rejoined: {view:?}");

    for id in cluster.node_ids() {
        cluster.verify_users(id, &users).await.with_context(|| format!("acknowledged users through node {id}"))?;
    }
    eprintln!("all {} acknowledged users present through every node", users.len());
    Ok(())
}
