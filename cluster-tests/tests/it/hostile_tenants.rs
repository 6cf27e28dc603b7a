//! Invariant: no tenant can hurt another. Each test is one attack by an ordinary
//! authenticated user while a bystander user commits files through another node: the
//! cluster's term does not move, no bystander commit fails, and the bystander's p99 during
//! the attack stays within three times its p99 before (`bystander::judge`, which prints the
//! row for the closing note's table).

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::bystander::{judge, term, Bystander};
use raftbox_cluster_tests::{new_user, within, Cluster, ClusterOptions};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(240);
/// Bystander commits measured before the attack begins.
const BASELINE_COMMITS: usize = 300;

macro_rules! cluster_test {
    ($name:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
            let result = within(TEST_DEADLINE, $scenario(&cluster)).await;
            cluster.conclude(result);
        }
    };
}

/// A JSON value nesting `levels` arrays deep around a number (`levels` 0: the number).
fn nested(levels: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..levels {
        value = json!([value]);
    }
    value
}

// ---------------------------------------------------------------------------------------
// JSON nested 1 to 200 levels deep to every route that takes a JSON body.

cluster_test!(json_nested_1_to_200_deep_to_every_route_moves_no_term, deep_json);

async fn deep_json(cluster: &Cluster) -> Result<()> {
    let (_, token) = new_user(cluster, 1, "attacker", "attacker-token").await?;
    let (http, url) = (cluster.client(), cluster.http_url(2));
    let job: Value = http
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(&token)
        .json(&json!({ "type": "noop", "payload": {}, "schedule": { "cron": "0 0 1 1 *", "timezone": "UTC" }, "maxRetries": 0 }))
        .send()
        .await?
        .json()
        .await?;
    let job_id = job["jobId"].as_str().with_context(|| format!("a job: {job}"))?.to_string();
    let bystander = Bystander::start(cluster, 3).await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let (mut accepted, mut refused) = (0, 0);
    for depth in 1..=200usize {
        // Every body nests exactly `depth` levels: the object itself, then the value.
        let value = nested(depth - 1);
        let payload = json!({ "deep": nested(depth.saturating_sub(2)) });
        let requests: Vec<(reqwest::Method, String, Value)> = vec![
            (
                reqwest::Method::POST,
                "/v1/jobs".into(),
                if depth >= 2 {
                    json!({ "type": "noop", "payload": payload, "schedule": { "cron": "0 0 1 1 *", "timezone": "UTC" }, "maxRetries": 0 })
                } else {
                    json!({})
                },
            ),
            (
                reqwest::Method::PATCH,
                format!("/v1/jobs/{job_id}"),
                if depth >= 2 { json!({ "payload": payload }) } else { json!({}) },
            ),
            (
                reqwest::Method::POST,
                "/v1/files/commit".into(),
                json!({ "path": "/x", "chunks": [], "baseVersion": 0, "size": 0, "mtime": value }),
            ),
            (reqwest::Method::POST, "/v1/files/restore".into(), json!({ "path": value })),
            (reqwest::Method::POST, "/v1/files/delete".into(), json!({ "path": value })),
            (reqwest::Method::POST, "/v1/files/move".into(), json!({ "from": value })),
            (reqwest::Method::POST, "/v1/blocks/status".into(), json!({ "hashes": value })),
            (reqwest::Method::POST, "/v1/namespaces".into(), json!({ "name": value })),
            (reqwest::Method::PUT, "/v1/namespaces/x/acl".into(), json!({ "userName": value })),
            (reqwest::Method::POST, "/v1/namespaces/x/leave".into(), json!({ "x": value })),
            (reqwest::Method::POST, "/v1/admin/users".into(), json!({ "name": value })),
            (reqwest::Method::POST, "/v1/admin/users/x/tokens".into(), json!({ "name": value })),
            (reqwest::Method::POST, "/v1/admin/groups".into(), json!({ "name": value })),
            (reqwest::Method::POST, "/v1/admin/cluster/members".into(), json!({ "id": value })),
        ];
        for (method, path, body) in requests {
            let answer =
                http.request(method.clone(), format!("{url}{path}")).bearer_auth(&token).json(&body).send().await?;
            let status = answer.status();
            ensure!(
                status.is_success() || status.is_client_error(),
                "{method} {path} with JSON {depth} deep: {status} {}",
                answer.text().await.unwrap_or_default()
            );
            if status.is_success() {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    ensure!(accepted > 0, "nothing was accepted: the valid job bodies must be");
    let attacker =
        format!("{} requests: {accepted} accepted (payloads up to 32 deep), {refused} refused", accepted + refused);
    judge("JSON nested 1-200 deep to every JSON route", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// A flood of requests with forged tokens: each costs the cluster no more than a share of
// one read-index round.

cluster_test!(a_flood_of_forged_tokens_moves_no_term, forged_tokens);

async fn forged_tokens(cluster: &Cluster) -> Result<()> {
    let bystander = Bystander::start(cluster, 3).await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let http = cluster.client();
    let urls = cluster.http_urls(&[1, 2]);
    let started = std::time::Instant::now();
    let mut sent = 0usize;
    let mut unauthenticated = 0usize;
    // 64 at a time, through the leader and a follower, for a few seconds.
    while started.elapsed() < Duration::from_secs(6) {
        let batch: Vec<_> = (0..64)
            .map(|i| {
                let url = urls[i % urls.len()].clone();
                let http = http.clone();
                let token = format!("rbx_forged{}", rand::random::<u64>());
                tokio::spawn(async move { http.get(format!("{url}/v1/me")).bearer_auth(token).send().await })
            })
            .collect();
        for request in batch {
            sent += 1;
            if matches!(request.await?, Ok(answer) if answer.status().as_u16() == 401) {
                unauthenticated += 1;
            }
        }
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    ensure!(unauthenticated == sent, "{unauthenticated} of {sent} forged tokens were refused 401");
    let attacker = format!("{sent} requests with forged tokens in 6 s, all 401");
    judge("a flood of forged tokens", &attacker, baseline, during, (before, after))
}
