//! Invariant: a node whose disk fills up under load stops taking writes with a clear error
//! and a metric, leading it steps down, the others keep committing, and once space is freed
//! it recovers by itself and catches up with nothing lost (issue 23; etcd's NOSPACE alarm is
//! the model, `raft/src/disk.rs`). Each node's data directory is a small tmpfs of its own;
//! the leader's is filled to below the NOSPACE minimum while users are created, and a reader
//! reads through a follower all along (readers kept a full leader in place: issue 35).
//!
//! And a snapshot install never takes a node's disk below the minimum (issue 35, item 5):
//! a follower that must catch up by a snapshot, with room above the minimum for the image
//! once but not twice (an install writes it, then copies it into the state), refuses the
//! install and stays behind, its free space never below the minimum; once space is freed
//! it installs and catches up.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_users, send, within, Cluster, ClusterOptions, CreatedUser, Deadline, RaftTuning};

const TEST_DEADLINE: Duration = Duration::from_secs(180);
const LEADER_DEADLINE: Duration = Duration::from_secs(15);
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
const ALARM_DEADLINE: Duration = Duration::from_secs(10);
/// Each node's disk, and the free space below which it counts as full.
const DISK_MB: u64 = 256;
const MIN_FREE_MB: u64 = 32;
/// What the filler leaves free: below the minimum.
const LEFT_MB: u64 = 12;
const USERS_BEFORE: usize = 40;
const USERS_DURING: usize = 120;
/// How often the reader reads through a follower while the leader's disk is full.
const READ_EVERY: Duration = Duration::from_millis(100);
/// The install test: a snapshot every this many entries, this many kept behind it, and an
/// image at least this big (so that twice it is far more than the disk's own noise).
const SNAPSHOT_EVERY: u64 = 200;
const LOGS_KEPT: u64 = 10;
const IMAGE_MIN_BYTES: u64 = 3 << 20;
/// Users created to grow the image, at most.
const IMAGE_USERS_MAX: usize = 20_000;
/// How long the follower is watched refusing the install.
const REFUSING_FOR: Duration = Duration::from_secs(6);
const WATCH_EVERY: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_steps_down_and_recovers_with_nothing_lost() {
    let options = ClusterOptions {
        small_disks_mb: Some(DISK_MB),
        raft: RaftTuning { min_free_disk_mb: Some(MIN_FREE_MB), ..RaftTuning::default() },
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    // The alarm and the refused appends are logged as errors, as they should be.
    cluster.allow_log_error("NOSPACE");
    cluster.allow_log_error("disk is full");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let (http, token) = (cluster.client(), cluster.admin_token().to_owned());
    let full = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let names = |prefix: &str, count: usize| (0..count).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    let mut users: Vec<CreatedUser> =
        create_users(&http, &cluster.http_urls(&[full]), &token, names("before", USERS_BEFORE), 4).await?;

    // A reader through a follower all along (issue 35, item 4): each read passes a read
    // barrier, which the full leader confirmed with AppendEntries that reset the followers'
    // election timers, so one read every 100 ms kept it leading while it refused every write.
    let reader = {
        let follower = cluster.node_ids().into_iter().find(|id| *id != full).context("a follower")?;
        let (http, url, token) = (http.clone(), cluster.http_url(follower), token.clone());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        // One read every READ_EVERY whatever the answers take (each in its own task), as
        // many clients would; the count of 200s shows the reads were served again once the
        // others elected a leader.
        let task = tokio::spawn(async move {
            let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut sent = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let (http, url, token, served) = (http.clone(), url.clone(), token.clone(), served.clone());
                sent.push(tokio::spawn(async move {
                    let answer = http.get(format!("{url}/v1/me")).bearer_auth(&token).send().await;
                    if answer.is_ok_and(|a| a.status().is_success()) {
                        served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }));
                tokio::time::sleep(READ_EVERY).await;
            }
            let reads = sent.len();
            for read in sent {
                let _ = read.await;
            }
            (reads, served.load(std::sync::atomic::Ordering::Relaxed))
        });
        (stop, task)
    };
    cluster.fill_disk(full, LEFT_MB)?;
    // The alarm: not ready with the NOSPACE error, the metric raised, another node leads.
    let wait = Deadline::after(ALARM_DEADLINE, format!("node {full} to raise the NOSPACE alarm"));
    loop {
        let ready = send(http.get(format!("{}/readyz", cluster.http_url(full)))).await?;
        if format!("{ready:?}").contains("disk is full") {
            break;
        }
        wait.tick(&format!("{ready:?}")).await?;
    }
    let metrics = http.get(format!("{}/metrics", cluster.http_url(full))).send().await?.text().await?;
    let raised = format!("raftbox_disk_full{{node=\"{full}\"}} 1");
    ensure!(metrics.contains(&raised), "metrics lack {raised}");
    let others: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != full).collect();
    let wait = Deadline::after(LEADER_DEADLINE, format!("nodes {others:?} to elect a leader other than {full}"));
    let leader = loop {
        let mut named = Vec::new();
        for id in &others {
            named.push(cluster.view(*id).await.ok().and_then(|v| v.leader_id));
        }
        match named.as_slice() {
            [Some(a), Some(b)] if a == b && *a != full => break *a,
            _ => wait.tick(&format!("{named:?}")).await?,
        }
    };
    eprintln!("node {full}'s disk is full: not ready, metric raised; node {leader} leads");

    // The others keep committing meanwhile.
    users.extend(create_users(&http, &cluster.http_urls(&others), &token, names("during", USERS_DURING), 4).await?);
    ensure!(cluster.is_running(full), "node {full} exited with a full disk");
    reader.0.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, served) = reader.1.await?;
    ensure!(reads >= 10, "the reader sent only {reads} reads during the fault");
    ensure!(served >= 1, "none of the {reads} reads through a follower was served during the fault");

    // Space freed: the alarm clears by itself and the node catches up with every user.
    cluster.free_disk(full)?;
    let view = cluster.wait_caught_up(full, CATCH_UP_DEADLINE).await?;
    cluster.verify_users(full, &users).await.context("every user through the node whose disk was full")?;
    let ready = send(http.get(format!("{}/readyz", cluster.http_url(full)))).await?;
    ensure!(ready.is_ok(), "node {full} not ready after space was freed: {ready:?}");
    eprintln!("space freed: node {full} caught up ({view:?}) with all {} users", users.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_install_that_would_fill_a_disk_waits_for_room() {
    let options = ClusterOptions {
        small_disks_mb: Some(DISK_MB),
        raft: RaftTuning {
            min_free_disk_mb: Some(MIN_FREE_MB),
            snapshot_logs_since_last: SNAPSHOT_EVERY,
            logs_to_keep: LOGS_KEPT,
            ..RaftTuning::default()
        },
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    // The refused install is logged by the leader that keeps sending it.
    cluster.allow_log_error("installing this snapshot needs");
    let result = within(TEST_DEADLINE, install_scenario(&mut cluster)).await;
    cluster.conclude(result);
}

async fn install_scenario(cluster: &mut Cluster) -> Result<()> {
    let (http, token) = (cluster.client(), cluster.admin_token().to_owned());
    let leader = cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let url = cluster.http_url(leader);
    let follower = cluster.node_ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let mut users = create_users(&http, std::slice::from_ref(&url), &token, vec!["first".into()], 1).await?;
    cluster.wait_caught_up(follower, CATCH_UP_DEADLINE).await?;
    let behind = cluster.view(follower).await?.last_log_index;
    cluster.kill9(follower)?;

    // Writes until the leader's snapshot is past the follower's log and its image is big.
    let (image, image_index) = loop {
        let view = cluster.view(leader).await?;
        let image = last_image_bytes(cluster, leader)?;
        let past = view.snapshot_index.is_some_and(|index| index > behind + LOGS_KEPT);
        if let (true, Some(bytes), Some(index)) = (past, image, view.snapshot_index) {
            if bytes >= IMAGE_MIN_BYTES {
                break (bytes, index);
            }
        }
        ensure!(users.len() < IMAGE_USERS_MAX, "{} users made no {IMAGE_MIN_BYTES}-byte image: {view:?}", users.len());
        let names = (0..200).map(|i| format!("grow-{}-{i}", users.len())).collect();
        users.extend(create_users(&http, std::slice::from_ref(&url), &token, names, 4).await?);
    };

    // Room for the image once above the minimum, not twice.
    let min_free = MIN_FREE_MB << 20;
    let leave_mb = MIN_FREE_MB + image.div_ceil(1 << 20) + 1;
    ensure!((leave_mb << 20) < min_free + 2 * image, "the image ({image} bytes) is too small for the test");
    cluster.fill_disk(follower, leave_mb)?;
    cluster.start_node(follower)?;
    let wait = Deadline::after(CATCH_UP_DEADLINE, format!("node {leader} to try the install"));
    while !cluster.log_path(leader).exists()
        || !std::fs::read_to_string(cluster.log_path(leader))?.contains("installing this snapshot needs")
    {
        wait.tick("no refused install logged yet").await?;
    }
    let watched = std::time::Instant::now();
    let mut lowest = u64::MAX;
    while watched.elapsed() < REFUSING_FOR {
        let stat = rustix::fs::statvfs(cluster.data_dir(follower))?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        lowest = lowest.min(free);
        ensure!(free >= min_free, "node {follower}'s disk fell to {free} bytes free, below the {min_free} minimum");
        ensure!(cluster.is_running(follower), "node {follower} exited while refusing the install");
        // The watch's own pace, sampling the disk while the leader retries.
        tokio::time::sleep(WATCH_EVERY).await;
    }
    // An older, smaller image the leader was already sending may have fitted, and been
    // installed; the one at `image_index` did not.
    let view = cluster.view(follower).await?;
    ensure!(
        view.last_applied < image_index,
        "node {follower} installed the {image}-byte image at {image_index} without room: {view:?}"
    );
    eprintln!(
        "a {image}-byte image at {image_index} to node {follower} with {leave_mb} MiB free: refused for \
         {REFUSING_FOR:?}, at least {} MiB free throughout, applied {} (behind {behind})",
        lowest >> 20,
        view.last_applied
    );

    cluster.free_disk(follower)?;
    let view = cluster.wait_caught_up(follower, CATCH_UP_DEADLINE).await?;
    cluster.verify_users(follower, &users).await.context("every user through the node that waited for room")?;
    eprintln!("space freed: node {follower} installed and caught up ({view:?}) with all {} users", users.len());
    Ok(())
}

/// The image size of the last snapshot node `id` logged building (`built snapshot … bytes=N`).
fn last_image_bytes(cluster: &Cluster, id: u64) -> Result<Option<u64>> {
    let text = std::fs::read_to_string(cluster.log_path(id))?;
    Ok(text
        .lines()
        .filter(|line| line.contains("built snapshot"))
        .filter_map(|line| line.split("bytes=").nth(1)?.split_whitespace().next()?.parse().ok())
        .last())
}
