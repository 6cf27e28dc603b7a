//! Invariant: when no limiter decision can be had (two of three nodes killed, no quorum, any
//! lease the survivor held run out), a fail-open limit admits within its deadline and a
//! fail-closed limit rejects with 503. Both sit on routes that read no user's data: a route
//! that does (`/v1/me`) passes a read barrier, which without a quorum answers 503 whatever
//! the limiter said.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use raftbox_cluster_tests::{within, Cluster, ClusterOptions, Seed};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
const DECISION_TIMEOUT_MS: u64 = 300;
/// Longer than any leader's rate-limit lease in these clusters (half their 400 ms election
/// timeout): a leader without a quorum decides for at most that long.
const LEASE_AT_MOST: Duration = Duration::from_secs(1);
/// The route of the fail-open limit (per user: the admin's token names the caller).
const OPEN_ROUTE: &str = "/v1/openapi.json";

fn limits_toml() -> String {
    format!(
        "[rate_limiting]\ndecision_timeout_ms = {DECISION_TIMEOUT_MS}\n\n\
         [[rate_limits]]\nname = \"open\"\nscope = \"user\"\nroutes = [\"/v1/openapi.json\"]\n\
         algorithm = \"token_bucket\"\ncapacity = 100\nrefill_per_s = 100\nfailure = \"open\"\n\n\
         [[rate_limits]]\nname = \"closed\"\nscope = \"global\"\nroutes = [\"/v1/cluster\"]\n\
         algorithm = \"token_bucket\"\ncapacity = 100\nrefill_per_s = 100\nfailure = \"closed\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_open_admits_and_closed_rejects() {
    let seed = Seed::new("limiter_failure_modes::without_quorum_open_admits_and_closed_rejects");
    let options = ClusterOptions { extra_toml: limits_toml(), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

async fn get(cluster: &Cluster, id: u64, path: &str) -> Result<(u16, bool, Duration)> {
    let started = Instant::now();
    let response = cluster
        .client()
        .get(format!("{}{path}", cluster.http_url(id)))
        .bearer_auth(cluster.admin_token())
        .send()
        .await?;
    let limited = response.headers().contains_key("x-ratelimit-limit");
    Ok((response.status().as_u16(), limited, started.elapsed()))
}

async fn scenario(cluster: &mut Cluster, _seed: &Seed) -> Result<()> {
    // With a quorum both limits decide: 200 with rate-limit headers.
    for path in [OPEN_ROUTE, "/v1/cluster"] {
        let (status, limited, _) = get(cluster, 3, path).await?;
        ensure!(status == 200 && limited, "{path} with quorum: {status}, headers {limited}");
    }
    cluster.kill9(1)?;
    cluster.kill9(2)?;
    // Were node 3 the leader, it may decide for the rest of its lease (half the election
    // timeout) and no longer: then the fail-open limit admits undecided.
    let lost = Instant::now();
    loop {
        let (status, limited, took) = get(cluster, 3, OPEN_ROUTE).await?;
        ensure!(status == 200, "fail-open limit without quorum: {status}");
        ensure!(took < Duration::from_millis(DECISION_TIMEOUT_MS + 1_500), "fail-open took {took:?}");
        if !limited {
            eprintln!("fail-open without quorum: {status} in {took:?}, {:?} after the quorum was lost", lost.elapsed());
            break;
        }
        ensure!(lost.elapsed() < LEASE_AT_MOST, "node 3 still decided {:?} after losing its quorum", lost.elapsed());
    }
    let (status, _, took) = get(cluster, 3, "/v1/cluster").await?;
    eprintln!("fail-closed without quorum: {status} in {took:?}");
    ensure!(status == 503, "fail-closed limit: {status}");
    ensure!(took < Duration::from_millis(DECISION_TIMEOUT_MS + 1_500), "fail-closed took {took:?}");
    Ok(())
}
