//! Clock safety (issue 8): a node whose wall clock is off from the others' by more than the
//! bound (500 ms) refuses to lead and reports not ready. Every node runs under libfaketime
//! (Debian `faketime`) with an offset file. A node started 5 s ahead is not ready while the
//! other two are, and becomes ready once its clock agrees; a leader whose clock jumps 5 s
//! ahead steps down, another node leads, the cluster keeps committing through every node,
//! and the skewed node does not lead again until its clock is back.

use std::time::Duration;

use anyhow::{ensure, Result};
use raftbox_cluster_tests::{send, within, Cluster, ClusterOptions, Deadline, Outcome, Seed};

const TEST_DEADLINE: Duration = Duration::from_secs(150);
const SKEW: &str = "+5s";
const SETTLE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_wrong_clock_does_not_lead() {
    let seed = Seed::new("clock_skew::a_node_with_a_wrong_clock_does_not_lead");
    let clock_offsets = [(3, SKEW.to_owned())].into();
    let options = ClusterOptions { fake_clocks: true, clock_offsets, ..ClusterOptions::default() };
    let mut cluster = Cluster::launch(options).expect("launch the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn readyz(cluster: &Cluster, id: u64) -> Result<Outcome> {
    send(cluster.client().get(format!("{}/readyz", cluster.http_url(id))).timeout(Duration::from_secs(2))).await
}

async fn wait_readyz(cluster: &Cluster, id: u64, ready: bool) -> Result<()> {
    let wait = Deadline::after(SETTLE, format!("node {id} {}ready", if ready { "" } else { "not " }));
    loop {
        let outcome = readyz(cluster, id).await?;
        let is_ready = outcome.is_ok();
        if is_ready == ready && (ready || format!("{outcome:?}").contains("clock")) {
            return Ok(());
        }
        wait.tick(&format!("{outcome:?}")).await?;
    }
}

async fn write_through(cluster: &Cluster, id: u64, name: &str) -> Result<()> {
    let outcome =
        raftbox_cluster_tests::create_user(&cluster.client(), &cluster.http_url(id), cluster.admin_token(), name)
            .await?;
    ensure!(outcome.is_ok(), "create {name} through node {id}: {outcome:?}");
    Ok(())
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    // Node 3 starts 5 s ahead: nodes 1 and 2 form the cluster; node 3 is not ready.
    cluster.wait_ready_nodes(&[1, 2], SETTLE).await?;
    wait_readyz(cluster, 3, false).await?;
    ensure!(cluster.view(3).await?.role != "Leader", "node 3 leads with a wrong clock");
    cluster.set_clock_offset(3, "+0")?;
    wait_readyz(cluster, 3, true).await?;

    // The leader's clock jumps ahead: it steps down and another node leads.
    let skewed = cluster.wait_for_leader(None, SETTLE).await?;
    cluster.set_clock_offset(skewed, SKEW)?;
    let leader = cluster.wait_for_leader(Some(skewed), SETTLE).await?;
    wait_readyz(cluster, skewed, false).await?;
    for (i, id) in cluster.node_ids().into_iter().enumerate() {
        write_through(cluster, id, &format!("clock-{}-{i}", seed.value())).await?;
    }
    // Several election timeouts later it still does not lead.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        let view = cluster.view(skewed).await?;
        ensure!(view.role != "Leader", "node {skewed} leads again with its clock {SKEW} (leader was {leader})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.set_clock_offset(skewed, "+0")?;
    wait_readyz(cluster, skewed, true).await?;
    Ok(())
}

/// The skewed node's clock in the combined scenario: far beyond the bound.
const FAR_SKEW: &str = "+30s";
/// How long the partitioned side is watched for a leader.
const PARTITION_WATCH: Duration = Duration::from_secs(6);

/// Skew combined with a partition (issue 23): node S, 30 s ahead, is cut off with one peer P
/// whose clock it measures and which disagrees; the third node is out of reach. An unmeasured
/// member never counts as agreeing, so S never leads; P may lead only while its last
/// measurement of the third node is valid (`SAMPLE_VALID`), after which it too reports its
/// clock unconfirmed (not ready). Healed, a node with a good clock leads, every node takes
/// writes, and S still does not lead. (Before the fix S counted the unreachable node as
/// agreeing and stood for election with P.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_node_left_with_one_peer_does_not_lead() {
    let seed = Seed::new("clock_skew::a_skewed_node_left_with_one_peer_does_not_lead");
    let options = ClusterOptions { fake_clocks: true, network_namespaces: true, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, skew_and_partition(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn skew_and_partition(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let leader = cluster.wait_for_leader(None, SETTLE).await?;
    let others: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != leader).collect();
    let (skewed, peer) = if seed.value() % 2 == 0 { (others[0], others[1]) } else { (others[1], others[0]) };
    cluster.set_clock_offset(skewed, FAR_SKEW)?;
    // libfaketime reads the offset file again only now and then: the skew is in effect once
    // the node finds its clock off.
    wait_readyz(cluster, skewed, false).await?;
    cluster.network().expect("network namespaces").partition(&[vec![skewed, peer], vec![leader]])?;
    eprintln!("node {skewed} {FAR_SKEW}, cut off with node {peer}; node {leader} alone");
    let until = tokio::time::Instant::now() + PARTITION_WATCH;
    while tokio::time::Instant::now() < until {
        if let Ok(view) = cluster.view(skewed).await {
            ensure!(!view.is_leader(), "node {skewed} leads with its clock {FAR_SKEW}: {view:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_readyz(cluster, skewed, false).await?;
    wait_readyz(cluster, peer, false).await?;
    cluster.network().expect("network namespaces").heal()?;
    // Both good clocks confirm each other again within a check or two.
    wait_readyz(cluster, peer, true).await?;
    wait_readyz(cluster, leader, true).await?;
    let new_leader = cluster.wait_for_leader(Some(skewed), SETTLE).await?;
    for (i, id) in cluster.node_ids().into_iter().enumerate() {
        write_through(cluster, id, &format!("healed-{}-{i}", seed.value())).await?;
    }
    ensure!(!cluster.view(skewed).await?.is_leader(), "node {skewed} leads with its clock {FAR_SKEW}");
    eprintln!("healed: node {new_leader} leads, writes through every node, node {skewed} never led");
    Ok(())
}

/// A node whose clock is far off, started with no peer running (issue 23): restarted in
/// place, and then with its data directory wiped. Before openraft publishes a configuration
/// (or, wiped, before it ever holds one) the clock check saw an empty one, judged the node a
/// cluster of one and logged "may lead" with no peer measured (every fresh node of the
/// combined campaign did). Now a node that knows no configuration gets no verdict, and one
/// that knows it measures its peers: the node never finds its clock fine and never leads.
/// With its peers back, the cluster takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_alone_is_never_judged_a_cluster_of_one() {
    let seed = Seed::new("clock_skew::a_node_started_alone_is_never_judged_a_cluster_of_one");
    let options = ClusterOptions { fake_clocks: true, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, start_alone(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// Starts node `id` alone and checks over a few clock checks that it never finds its clock
/// fine, never reports ready and acknowledges nothing. (Restarted, a former leader is leader
/// again at once — openraft restores a leader from its own committed vote — but with its
/// clock unconfirmed it sends no heartbeats and proposes nothing.)
async fn never_fine_alone(cluster: &mut Cluster, id: u64, how: &str) -> Result<()> {
    let mark = usize::try_from(std::fs::metadata(cluster.log_path(id))?.len())?;
    cluster.start_node(id)?;
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        if let Ok(outcome) = readyz(cluster, id).await {
            ensure!(!outcome.is_ok(), "node {id}, {how} and alone with its clock {FAR_SKEW}, reports ready");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let name = format!("alone-{how}-{id}");
    let refused =
        raftbox_cluster_tests::create_user(&cluster.client(), &cluster.http_url(id), cluster.admin_token(), &name)
            .await?;
    ensure!(!refused.is_ok(), "node {id}, {how} and alone, acknowledged a write: {refused:?}");
    let log = std::fs::read(cluster.log_path(id))?;
    let since_start = String::from_utf8_lossy(&log[mark..]);
    let fine: Vec<&str> = since_start.lines().filter(|l| l.contains("this node may lead")).collect();
    ensure!(fine.is_empty(), "node {id}, {how}, {FAR_SKEW} and alone, found its clock fine: {fine:?}");
    Ok(())
}

async fn start_alone(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let leader = cluster.wait_for_leader(None, SETTLE).await?;
    let alone = 1 + seed.value() % 3;
    eprintln!("node {alone} starts alone, {FAR_SKEW} (node {leader} led)");
    for id in cluster.node_ids() {
        cluster.kill9(id)?;
    }
    cluster.set_clock_offset(alone, FAR_SKEW)?;
    never_fine_alone(cluster, alone, "restarted").await?;
    cluster.kill9(alone)?;
    cluster.wipe(alone)?;
    never_fine_alone(cluster, alone, "wiped").await?;
    // The others come back (the wiped node votes again only once removed and added).
    let others: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != alone).collect();
    for id in &others {
        cluster.start_node(*id)?;
    }
    cluster.wait_ready_nodes(&others, SETTLE).await?;
    for (i, id) in others.iter().enumerate() {
        write_through(cluster, *id, &format!("alone-{}-{i}", seed.value())).await?;
    }
    Ok(())
}

/// The fast follower's offset in the cutoff test: a month ahead, far past a day's retention.
const MONTH_AHEAD: &str = "+31d";
/// Retention and grace in the cutoff test: a day, so only a wrong clock could pass them.
const DAY_S: u64 = 24 * 3600;
/// Fires of each maintenance job watched while the follower is a month ahead.
const MAINTENANCE_FIRES: u64 = 10;
/// How long those fires may take (one a second, with elections and claims around them).
const FIRES_DEADLINE: Duration = Duration::from_secs(60);

/// One clock for every cutoff (issue 35, item 2): a follower whose wall clock jumps a month
/// ahead, for ten fires of every maintenance job (one a second), deletes no version within
/// the day's retention, collects no chunk within the day's grace and reclaims no block file
/// within it — a file it holds unindexed (as one whose `RegisterChunk` has not applied there
/// yet) and dated by a true clock included — while clients keep reading and writing through
/// it. Before the change the follower claimed maintenance with its clock ("everything is
/// due"), computed the cutoffs from it, and reclaimed by file age on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_a_month_ahead_deletes_nothing_within_retention() {
    let seed = Seed::new("clock_skew::a_follower_a_month_ahead_deletes_nothing_within_retention");
    let extra_toml =
        format!("[files]\nversion_retention_s = {DAY_S}\norphan_grace_s = {DAY_S}\nmaintenance_interval_s = 1\n");
    let options = ClusterOptions { fake_clocks: true, extra_toml, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, month_ahead(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// The fence of a system maintenance job and who holds its lease, read through `via`.
async fn system_job(cluster: &Cluster, via: u64, task: &str) -> Result<(u64, Option<String>)> {
    let url = format!("{}/v1/jobs/system-{task}", cluster.http_url(via));
    let job = send(cluster.client().get(url).bearer_auth(cluster.admin_token())).await?;
    let body = job.body().ok_or_else(|| anyhow::anyhow!("system-{task}: {job:?}"))?;
    let fence = body["fenceToken"].as_u64().ok_or_else(|| anyhow::anyhow!("system-{task}: {body}"))?;
    Ok((fence, body["leaseOwner"].as_str().map(str::to_owned)))
}

async fn month_ahead(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    use anyhow::Context as _;
    let http = cluster.client();
    let leader = cluster.wait_for_leader(None, SETTLE).await?;
    let fast = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let (lead_url, fast_url) = (cluster.http_url(leader), cluster.http_url(fast));
    let user =
        raftbox_cluster_tests::create_user(&http, &lead_url, cluster.admin_token(), &format!("month-{}", seed.value()))
            .await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("user")?.to_owned();
    let token = raftbox_cluster_tests::create_token(&http, &lead_url, cluster.admin_token(), &user_id, "t").await?;
    let token = token.body().and_then(|b| b["token"].as_str()).context("token")?.to_owned();
    let put = |url: String, data: String| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let hash = blake3::hash(data.as_bytes()).to_hex().to_string();
            let response = http.put(format!("{url}/v1/blocks/{hash}")).bearer_auth(&token).body(data).send().await?;
            ensure!(response.status().as_u16() == 201, "PUT through {url}: {}", response.status());
            anyhow::Ok(hash)
        }
    };
    let commit = |url: String, chunk: String, base: u64| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let body =
                serde_json::json!({ "path": "/v.txt", "chunks": [chunk], "baseVersion": base, "size": 1, "mtime": 0 });
            let response = http.post(format!("{url}/v1/files/commit")).bearer_auth(&token).json(&body).send().await?;
            ensure!(response.status().as_u16() == 201, "commit through {url}: {}", response.status());
            anyhow::Ok(())
        }
    };
    // Three versions (two superseded, within the day's retention) and a block in flight.
    for version in 0..3 {
        let chunk = put(lead_url.clone(), format!("version {version}")).await?;
        commit(lead_url.clone(), chunk, version).await?;
    }
    let in_flight = put(lead_url.clone(), "uploaded, not committed yet".to_owned()).await?;
    // A block file the fast node holds unindexed, dated by a true clock (its registration has
    // not applied there yet): its grace starts when the reclaimer first sees it.
    let unindexed = blake3::hash(b"registration still on its way").to_hex().to_string();
    let shard = cluster.data_dir(fast).join("blocks").join(&unindexed[..2]);
    std::fs::create_dir_all(&shard)?;
    std::fs::write(shard.join(&unindexed), b"registration still on its way")?;

    let started: Vec<u64> = {
        let mut fences = Vec::new();
        for task in ["expire_versions", "collect_orphans"] {
            fences.push(system_job(cluster, leader, task).await?.0);
        }
        fences
    };
    cluster.set_clock_offset(fast, MONTH_AHEAD)?;
    wait_readyz(cluster, fast, false).await?;
    eprintln!("node {fast} is {MONTH_AHEAD}; watching {MAINTENANCE_FIRES} fires of each maintenance job");
    let wait = Deadline::after(FIRES_DEADLINE, format!("{MAINTENANCE_FIRES} fires of each maintenance job"));
    let mut owners = std::collections::BTreeSet::new();
    let mut round = 0u64;
    loop {
        // Clients read and write through the fast node all along.
        let history = send(http.get(format!("{fast_url}/v1/files/history?path=/v.txt")).bearer_auth(&token)).await?;
        ensure!(history.is_ok(), "history through node {fast}: {history:?}");
        let created = raftbox_cluster_tests::create_user(
            &http,
            &fast_url,
            cluster.admin_token(),
            &format!("month-{}-{round}", seed.value()),
        )
        .await?;
        ensure!(created.is_ok(), "a write through node {fast}: {created:?}");
        round += 1;
        let mut fired = Vec::new();
        for (task, start) in ["expire_versions", "collect_orphans"].into_iter().zip(&started) {
            let (fence, owner) = system_job(cluster, leader, task).await?;
            owners.extend(owner);
            fired.push(fence.saturating_sub(*start));
        }
        if fired.iter().all(|n| *n >= MAINTENANCE_FIRES) {
            break;
        }
        wait.tick(&format!("fires so far {fired:?}")).await?;
    }
    eprintln!("lease owners seen: {owners:?}");

    for id in cluster.node_ids() {
        let url = cluster.http_url(id);
        let history = send(http.get(format!("{url}/v1/files/history?path=/v.txt")).bearer_auth(&token)).await?;
        let versions = history.body().and_then(|b| b["versions"].as_array().map(Vec::len));
        ensure!(versions == Some(3), "node {id}: versions within retention were deleted: {history:?}");
        let block = http.get(format!("{url}/v1/blocks/{in_flight}")).bearer_auth(&token).send().await?;
        ensure!(block.status().as_u16() == 200, "node {id}: the block in flight is gone: {}", block.status());
        let file = cluster.data_dir(id).join("blocks").join(&in_flight[..2]).join(&in_flight);
        ensure!(file.exists(), "node {id} reclaimed the block in flight");
    }
    ensure!(shard.join(&unindexed).exists(), "node {fast} reclaimed an unindexed block within its grace");
    // The block in flight commits, through the fast node.
    commit(fast_url.clone(), in_flight, 3).await?;
    cluster.set_clock_offset(fast, "+0")?;
    wait_readyz(cluster, fast, true).await?;
    Ok(())
}
