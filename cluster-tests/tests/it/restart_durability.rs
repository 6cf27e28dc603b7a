//! Invariant: a 201 survives the loss of every process at once. Users (and tokens) are
//! created, then all three nodes are SIGKILLed while writers are still busy; after a restart
//! every acknowledged user is present through every node and every token still
//! authenticates as its user. Writes cut off by the kill are unknown and not checked.

use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use raftbox_cluster_tests::{
    acknowledged_users, create_token, create_users, ensure_distinct_ids, ensure_none_rejected, me, within, Cluster,
    ClusterOptions, CreatedUser, Deadline, Outcome, Seed, Workload, WorkloadSpec, WriteSummary, STARTUP_DEADLINE_MS,
};
use rand::seq::SliceRandom as _;

/// Overall deadline of the test.
const TEST_DEADLINE: Duration = Duration::from_secs(180);
const LEADER_DEADLINE: Duration = Duration::from_secs(10);
/// Users created before the crash with every creation acknowledged.
const SETTLED_USERS: usize = 150;
const LANES: usize = 16;
/// Users given a token, checked with `GET /v1/me` after the restart.
const TOKEN_HOLDERS: usize = 10;
/// Writers busy when the nodes are killed, and the acknowledgements awaited first.
const WRITERS: usize = 8;
const ACKED_BEFORE_CRASH_MIN: usize = 50;
const IN_FLIGHT_DEADLINE: Duration = Duration::from_secs(20);
/// Deadline for each restarted node to apply everything the leader has applied.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(30);
/// Deadline of one token check while its outcome stays unknown.
const CHECK_DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_users_survive_kill_of_all_nodes() {
    let seed = Seed::new("restart_durability::acknowledged_users_survive_kill_of_all_nodes");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let http = cluster.client();
    let admin = cluster.admin_token().to_owned();
    let ids = cluster.node_ids();
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;

    let urls = cluster.http_urls(&ids);
    let mut users = create_users(&http, &urls, &admin, names("settled", SETTLED_USERS), LANES).await?;

    let mut tokens: Vec<(CreatedUser, String)> = Vec::new();
    let holders: Vec<CreatedUser> = users.choose_multiple(&mut rng, TOKEN_HOLDERS).cloned().collect();
    for (i, user) in holders.into_iter().enumerate() {
        let url = &urls[i % urls.len()];
        let token = match create_token(&http, url, &admin, &user.user_id, "laptop").await? {
            Outcome::Ok(body) => {
                body["token"].as_str().map(str::to_owned).with_context(|| format!("no \"token\" in {body}"))?
            }
            other => bail!("create a token for {user:?}: {other:?}"),
        };
        tokens.push((user, token));
    }

    let spec = WorkloadSpec {
        writers: WRITERS,
        targets: ids.iter().map(|&id| (id, cluster.http_url(id))).collect(),
        admin_token: admin.clone(),
        name_prefix: "inflight".to_owned(),
    };
    let workload = Workload::spawn(http.clone(), spec, &mut rng);
    let wait = Deadline::after(IN_FLIGHT_DEADLINE, "writes in flight before the crash");
    loop {
        let acked = workload.acked();
        if acked >= ACKED_BEFORE_CRASH_MIN {
            break;
        }
        wait.tick(&format!("{acked} writes acknowledged")).await?;
    }
    for &id in &ids {
        cluster.kill9(id)?;
    }
    let records = workload.stop().await?;
    eprintln!("killed every node; in-flight writes: {}", WriteSummary::of(&records));
    ensure_none_rejected(&records)?;
    users.extend(acknowledged_users(&records)?);
    ensure_distinct_ids(&users)?;

    for &id in &ids {
        cluster.start_node(id)?;
    }
    cluster.wait_ready(Duration::from_millis(STARTUP_DEADLINE_MS)).await?;
    // Tokens may be checked against a node's own state: let each node replay everything first.
    for &id in &ids {
        cluster.wait_caught_up(id, CATCH_UP_DEADLINE).await?;
    }
    eprintln!("restarted; checking {} users and {} tokens", users.len(), tokens.len());

    for &id in &ids {
        cluster.verify_users(id, &users).await.with_context(|| format!("acknowledged users through node {id}"))?;
        for (user, token) in &tokens {
            check_me(&http, &cluster.http_url(id), token, user)
                .await
                .with_context(|| format!("token of {} through node {id}", user.name))?;
        }
    }
    Ok(())
}

/// `GET /v1/me` with the user's token names that user. An unknown outcome is retried.
async fn check_me(http: &reqwest::Client, url: &str, token: &str, user: &CreatedUser) -> Result<()> {
    let wait = Deadline::after(CHECK_DEADLINE, "an answer to GET /v1/me");
    loop {
        match me(http, url, token).await? {
            Outcome::Ok(body) => {
                ensure!(
                    body["userId"].as_str() == Some(user.user_id.as_str())
                        && body["name"].as_str() == Some(user.name.as_str()),
                    "/v1/me answered {body} for {user:?}"
                );
                return Ok(());
            }
            Outcome::Rejected(status, body) => bail!("/v1/me: {status} {body}"),
            Outcome::Unknown(why) => wait.tick(&why).await?,
        }
    }
}
