//! Invariant: webhooks cannot be pointed at the cluster's own network. On a cluster whose
//! `[webhooks] allow` lacks loopback, a webhook to `127.0.0.1` — or to `localhost`, a name
//! that resolves there — is refused when the job is created (400) and, for a job created
//! while loopback was allowed, when it runs: the run fails saying why, and the target is
//! never called.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::receiver::Receiver;
use raftbox_cluster_tests::{send, within, Cluster, ClusterOptions, Deadline, Outcome};
use serde_json::json;

const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// How far ahead the job runs: time to restart the cluster with the stricter rule first.
const RUN_DELAY_S: i64 = 15;
const RUN_DEADLINE: Duration = Duration::from_secs(60);
const STOP_DEADLINE: Duration = Duration::from_secs(10);
const READY_DEADLINE: Duration = Duration::from_secs(30);
const LOOPBACK_ALLOW: &str = "allow = [\"127.0.0.0/8\", \"::1/128\"]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_to_loopback_are_refused_at_creation_and_at_run_time() {
    let options =
        ClusterOptions { webhook_allow: vec!["127.0.0.0/8".into(), "::1/128".into()], ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

fn job(target: &str, run_at: &str) -> serde_json::Value {
    json!({ "type": "webhook", "target": target, "payload": {}, "schedule": { "runAt": run_at }, "maxRetries": 0 })
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let receiver = Receiver::start().await?;
    let (http, url, admin) = (cluster.client(), cluster.http_url(1), cluster.admin_token().to_owned());
    let run_at = (chrono::Utc::now() + chrono::Duration::seconds(RUN_DELAY_S))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);

    // Allowed now: created.
    let created =
        send(http.post(format!("{url}/v1/jobs")).bearer_auth(&admin).json(&job(&receiver.url("hook"), &run_at)))
            .await?;
    let job_id = created.body().and_then(|b| b["jobId"].as_str()).with_context(|| format!("{created:?}"))?.to_owned();

    // The cluster restarts with a rule that lacks loopback.
    for id in cluster.node_ids() {
        cluster.terminate(id, STOP_DEADLINE).await?;
        cluster.edit_config(id, |text| text.replace(LOOPBACK_ALLOW, "allow = []"))?;
    }
    for id in cluster.node_ids() {
        cluster.start_node(id)?;
    }
    cluster.wait_ready(READY_DEADLINE).await?;

    // Refused at creation (422: the node's rule, not the request's shape): an address, and a
    // name that resolves to it.
    let port = receiver.addr.port();
    for target in [
        format!("http://127.0.0.1:{port}/hook"),
        format!("http://localhost:{port}/hook"),
        format!("http://[::1]:{port}/"),
    ] {
        let answer = send(http.post(format!("{url}/v1/jobs")).bearer_auth(&admin).json(&job(&target, &run_at))).await?;
        ensure!(matches!(&answer, Outcome::Rejected(422, _)), "creating a webhook to {target}: {answer:?}");
    }

    // Refused at run time: the run fails with the reason, the receiver hears nothing.
    let wait = Deadline::after(RUN_DEADLINE, "the job's run to fail");
    let run = loop {
        let runs = send(http.get(format!("{url}/v1/jobs/{job_id}/runs")).bearer_auth(&admin)).await?;
        if let Some(run) = runs.body().and_then(|b| b["runs"].as_array()).and_then(|r| r.first()).cloned() {
            if run["status"] != "RUNNING" {
                break run;
            }
        }
        wait.tick(&format!("{runs:?}")).await?;
    };
    let error = run["error"].as_str().unwrap_or_default();
    ensure!(run["status"] == "FAILED", "the run: {run}");
    ensure!(error.contains("may not call"), "the run's error does not say why: {run}");
    ensure!(receiver.calls("hook").is_empty(), "the receiver was called: {:?}", receiver.calls("hook"));
    eprintln!("refused at creation and at run time: {error}");
    Ok(())
}
