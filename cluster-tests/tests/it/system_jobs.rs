//! Invariant: the built-in maintenance jobs follow `[files] maintenance_interval_s`, also
//! when the setting changes on an existing cluster (they are rescheduled at start).

use std::time::Duration;

use anyhow::Result;
use raftbox_cluster_tests::{send, within, Cluster, ClusterOptions, Deadline};

const TEST_DEADLINE: Duration = Duration::from_secs(90);
const STOP_DEADLINE: Duration = Duration::from_secs(10);
const READY_DEADLINE: Duration = Duration::from_secs(30);
const SCHEDULE_DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_jobs_follow_a_changed_interval() {
    let options =
        ClusterOptions { extra_toml: "[files]\nmaintenance_interval_s = 60\n".into(), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

/// Waits until `system-purge_expired`, read through node 1, runs every `every_ms`.
async fn wait_for_interval(cluster: &Cluster, every_ms: u64) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(1));
    let wait = Deadline::after(SCHEDULE_DEADLINE, format!("the purge job to run every {every_ms} ms"));
    loop {
        let job =
            send(http.get(format!("{url}/v1/jobs/system-purge_expired")).bearer_auth(cluster.admin_token())).await?;
        if job.body().is_some_and(|b| b["schedule"]["everyMs"] == every_ms) {
            return Ok(());
        }
        wait.tick(&format!("{job:?}")).await?;
    }
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    wait_for_interval(cluster, 60_000).await?;
    for id in cluster.node_ids() {
        cluster.terminate(id, STOP_DEADLINE).await?;
        cluster.edit_config(id, |text| text.replace("maintenance_interval_s = 60", "maintenance_interval_s = 5"))?;
    }
    for id in cluster.node_ids() {
        cluster.start_node(id)?;
    }
    cluster.wait_ready(READY_DEADLINE).await?;
    wait_for_interval(cluster, 5_000).await?;
    eprintln!("the maintenance jobs follow the new interval");
    Ok(())
}
