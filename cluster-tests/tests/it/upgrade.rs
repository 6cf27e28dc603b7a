//! Upgrades. A rolling upgrade under write load: three nodes of the previous release (the
//! binary named by `RAFTBOX_PREVIOUS_BIN`, else this build telling its peers it reads data
//! format 2 only) are each stopped, replaced by this build and started, while writers
//! create users through every node. Nothing acknowledged is lost; while any node is of the
//! previous release, a runtime-limits change (a format-3 command) is refused with 409 and the
//! cluster stays at format 2; once all are upgraded the leader raises it to the current format and the change
//! works. A node of the previous release is refused at `cluster add` once the cluster is at
//! a newer format. And a data directory written by the previous release (the committed fixture) is
//! served by this build: its files byte for byte, its users, folder and job.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use raftbox_cluster_tests::{
    acknowledged_users, add_member, cluster_members, ensure_distinct_ids, ensure_none_rejected, within, Cluster,
    ClusterOptions, Deadline, Outcome, Seed, Workload, WorkloadSpec, WriteSummary, DATA_FORMAT, STARTUP_DEADLINE_MS,
};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(240);
const LEADER_DEADLINE: Duration = Duration::from_secs(15);
const WRITERS: usize = 6;
/// Acknowledged writes awaited before the first node is stopped, and after each restart.
const ACKED_BETWEEN_STEPS: usize = 100;
const STEP_DEADLINE: Duration = Duration::from_secs(30);
const STOP_DEADLINE: Duration = Duration::from_secs(20);
/// How long the leader may take to raise the format once every node reads it (it asks every
/// second).
const RAISE_DEADLINE: Duration = Duration::from_secs(15);
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing_and_new_commands_wait_for_every_node() {
    let seed = Seed::new("upgrade::a_rolling_upgrade_under_load_loses_nothing_and_new_commands_wait_for_every_node");
    let options = ClusterOptions { previous_release: true, ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, rolling(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// `GET` or `PUT /v1/admin/limits` on node `id`: status and body.
async fn limits(cluster: &Cluster, id: u64, put: Option<&Value>) -> Result<(u16, Value)> {
    let url = format!("{}/v1/admin/limits", cluster.http_url(id));
    let http = cluster.client();
    let request = match put {
        Some(body) => http.put(url).json(body),
        None => http.get(url),
    };
    let response = request.bearer_auth(cluster.admin_token()).send().await.context("limits request")?;
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    Ok((status, body))
}

fn tighter_quota() -> Value {
    json!({ "quotas": { "folders_per_user": 7 } })
}

async fn await_acks(workload: &Workload, target: usize, what: &str) -> Result<()> {
    let wait = Deadline::after(STEP_DEADLINE, what);
    loop {
        let acked = workload.acked();
        if acked >= target {
            return Ok(());
        }
        wait.tick(&format!("{acked} of {target} writes acknowledged")).await?;
    }
}

async fn rolling(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let http = cluster.client();
    let ids = cluster.node_ids();
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let real_previous = std::env::var_os(raftbox_cluster_tests::PREVIOUS_BIN_ENV).is_some();
    eprintln!(
        "previous release: {}",
        if real_previous { "RAFTBOX_PREVIOUS_BIN" } else { "this build, reporting format 2" }
    );
    if !real_previous {
        // The stand-in raises the cluster to format 2 itself, as the previous release's
        // nodes migrate to it at start.
        let wait = Deadline::after(RAISE_DEADLINE, "the stand-in cluster at format 2");
        loop {
            let (status, view) = limits(cluster, ids[0], None).await?;
            if status == 200 && view["clusterFormat"] == 2 {
                break;
            }
            wait.tick(&format!("{status} {view}")).await?;
        }
    }

    let spec = WorkloadSpec {
        writers: WRITERS,
        targets: ids.iter().map(|&id| (id, cluster.http_url(id))).collect(),
        admin_token: cluster.admin_token().to_owned(),
        name_prefix: "upgrade".to_owned(),
    };
    let workload = Workload::spawn(http.clone(), spec, &mut rng);
    await_acks(&workload, ACKED_BETWEEN_STEPS, "writes before the upgrade").await?;

    let started = Instant::now();
    let mut step_ms = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let step = Instant::now();
        let status = cluster.terminate(id, STOP_DEADLINE).await?;
        ensure!(status.success(), "node {id} did not stop cleanly: {status}");
        cluster.upgrade(id);
        cluster.start_node(id)?;
        cluster.wait_ready_nodes(&[id], Duration::from_millis(STARTUP_DEADLINE_MS)).await?;
        cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
        step_ms.push(step.elapsed().as_millis());
        await_acks(&workload, workload.acked() + ACKED_BETWEEN_STEPS, "writes after a node's upgrade").await?;
        if i + 1 < ids.len() {
            // An upgraded node refuses a format-3 command while another still runs the
            // previous release, and the cluster stays at format 2.
            let (status, body) = limits(cluster, id, Some(&tighter_quota())).await?;
            ensure!(status == 409, "a limits change with node(s) not upgraded: {status} {body}");
            ensure!(
                body["detail"].as_str().is_some_and(|d| d.contains("data format 3")),
                "the refusal says why: {body}"
            );
            let (_, view) = limits(cluster, id, None).await?;
            ensure!(view["clusterFormat"] == 2, "the cluster stays at format 2 with a node not upgraded: {view}");
        }
    }
    let upgraded_after = started.elapsed();

    // Every node reads the current format now: the leader raises the cluster's format.
    let wait = Deadline::after(RAISE_DEADLINE, "the cluster's format raised to the current one");
    let raise_started = Instant::now();
    loop {
        let (status, view) = limits(cluster, ids[0], None).await?;
        if status == 200 && view["clusterFormat"] == DATA_FORMAT {
            break;
        }
        wait.tick(&format!("{status} {view}")).await?;
    }
    let raised_after = raise_started.elapsed();
    let (status, body) = limits(cluster, ids[1], Some(&tighter_quota())).await?;
    ensure!(status == 200, "a limits change once every node is upgraded: {status} {body}");
    ensure!(body["limits"]["quotas"]["folders_per_user"] == 7, "the change is in force: {body}");

    let records = workload.stop().await?;
    let summary = WriteSummary::of(&records);
    ensure_none_rejected(&records)?;
    let users = acknowledged_users(&records)?;
    ensure_distinct_ids(&users)?;
    for &id in &ids {
        cluster.wait_caught_up(id, CATCH_UP_DEADLINE).await?;
        cluster.verify_users(id, &users).await.with_context(|| format!("acknowledged users through node {id}"))?;
    }
    eprintln!(
        "rolling upgrade: {summary}; lost 0 of {} acknowledged (checked through every node); nodes replaced in \
         {} s ({:?} ms each, stop to ready); format raised {} ms after the last node was ready",
        users.len(),
        upgraded_after.as_secs(),
        step_ms,
        raised_after.as_millis()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_older_than_the_cluster_is_refused_at_cluster_add() {
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, older_node(&mut cluster)).await;
    cluster.conclude(result);
}

async fn older_node(cluster: &mut Cluster) -> Result<()> {
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let wait = Deadline::after(RAISE_DEADLINE, "the cluster at the current format");
    loop {
        let (status, view) = limits(cluster, 1, None).await?;
        if status == 200 && view["clusterFormat"] == DATA_FORMAT {
            break;
        }
        wait.tick(&format!("{status} {view}")).await?;
    }
    cluster.add_node(4)?;
    cluster.as_previous_release(4);
    cluster.start_node(4)?;
    let (http_addr, grpc_addr) = cluster.addresses(4);
    let http = cluster.client();
    let wait = Deadline::after(STEP_DEADLINE, "cluster add of the older node answered");
    let refusal = loop {
        match add_member(&http, &cluster.http_url(2), cluster.admin_token(), 4, &http_addr, &grpc_addr).await? {
            Outcome::Rejected(409, body) => break body,
            // Node 4 not listening yet.
            Outcome::Rejected(503, why) | Outcome::Unknown(why) => wait.tick(&why).await?,
            other => bail!("cluster add of a node of format 2 into a cluster at format {DATA_FORMAT}: {other:?}"),
        }
    };
    ensure!(
        refusal.contains("reads data formats up to 2") && refusal.contains(&format!("format {DATA_FORMAT}")),
        "the refusal names both: {refusal}"
    );
    match cluster_members(&http, &cluster.http_url(1), cluster.admin_token()).await? {
        Outcome::Ok(body) => {
            let ids: Vec<u64> =
                body["members"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_u64()).collect();
            ensure!(ids == [1, 2, 3], "nothing changed in the membership: {body}");
        }
        other => bail!("members: {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_the_previous_release_is_served() {
    let options = ClusterOptions { nodes: 1, ..ClusterOptions::default() };
    let mut cluster = Cluster::launch_stopped(options).expect("prepare the node");
    let result = within(TEST_DEADLINE, fixture(&mut cluster)).await;
    cluster.conclude(result);
}

/// The committed fixture: the previous release's data directory and what it holds.
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../raft/tests/data/format2-node.tar.gz");

async fn fixture(cluster: &mut Cluster) -> Result<()> {
    let unpacked = cluster.root().join("fixture");
    std::fs::create_dir_all(&unpacked)?;
    let status = std::process::Command::new("tar").arg("-xzf").arg(FIXTURE).arg("-C").arg(&unpacked).status()?;
    ensure!(status.success(), "unpack {FIXTURE}");
    let data_dir = cluster.data_dir(1).to_path_buf();
    copy_tree(&unpacked.join("data"), &data_dir)?;
    let expected: Value = serde_json::from_slice(&std::fs::read(unpacked.join("expected.json"))?)?;
    let alice_token = std::fs::read_to_string(unpacked.join("alice.token"))?.trim().to_owned();
    cluster.start_node(1)?;
    cluster.wait_ready(Duration::from_millis(STARTUP_DEADLINE_MS)).await?;
    cluster.wait_for_leader(None, LEADER_DEADLINE).await?;
    let url = cluster.http_url(1);
    let http = cluster.client();

    // Its files, byte for byte (the previous release's blocks and chunk index), and the
    // deleted one still deleted.
    for (group, namespace) in [("files", None), ("folder_files", expected["folder"].as_str())] {
        for (path, sha256) in expected[group].as_object().context("expected files")? {
            let body = download(&http, &url, &alice_token, path, namespace).await?;
            let got = sha256_hex(&body);
            ensure!(got == sha256.as_str().unwrap_or(""), "{path}: sha-256 {got}, the previous release wrote {sha256}");
        }
    }
    for path in expected["deleted"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let response =
            http.get(format!("{url}/v1/files")).query(&[("path", path)]).bearer_auth(&alice_token).send().await?;
        ensure!(response.status() == 404, "{path} was deleted; now {}", response.status());
    }
    // Its job, through the API.
    let job = expected["job"].as_str().context("job id")?;
    let response = http.get(format!("{url}/v1/jobs/{job}")).bearer_auth(&alice_token).send().await?;
    ensure!(response.status() == 200, "the job: {}", response.status());

    // A one-node cluster reads the current format throughout: the leader raises the format, and the
    // bootstrap node seeds the limits from its TOML.
    let wait = Deadline::after(RAISE_DEADLINE, "the current format and seeded limits");
    loop {
        let (status, view) = limits(cluster, 1, None).await?;
        if status == 200 && view["clusterFormat"] == DATA_FORMAT && view["source"] == "cluster" {
            break;
        }
        wait.tick(&format!("{status} {view}")).await?;
    }
    Ok(())
}

/// The content of `path` (in `namespace`, or the personal one), block by block.
async fn download(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    path: &str,
    namespace: Option<&str>,
) -> Result<Vec<u8>> {
    let mut query = vec![("path", path)];
    if let Some(namespace) = namespace {
        query.push(("namespaceId", namespace));
    }
    let response = http.get(format!("{url}/v1/files")).query(&query).bearer_auth(token).send().await?;
    ensure!(response.status() == 200, "GET {path}: {}", response.status());
    let file: Value = response.json().await?;
    let mut content = Vec::new();
    for chunk in file["chunks"].as_array().context("chunks")? {
        let hash = chunk.as_str().or_else(|| chunk["hash"].as_str()).context("chunk hash")?;
        let mut request = http.get(format!("{url}/v1/blocks/{hash}")).bearer_auth(token);
        if let Some(namespace) = namespace {
            request = request.query(&[("namespaceId", namespace)]);
        }
        let block = request.send().await?;
        if block.status() != 200 {
            bail!("block {hash} of {path}: {}", block.status());
        }
        content.extend_from_slice(&block.bytes().await?);
    }
    Ok(content)
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
