//! Invariant: a rate limit holds across the whole cluster. Clients hammer all three nodes at
//! once; together they are admitted no more than the limit allows (a sliding log of N per
//! window admits at most N; a token bucket at most its size plus what refilled meanwhile).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{create_token, create_user, within, Cluster, ClusterOptions, Seed};
use rand::Rng as _;

const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// Concurrent clients, spread over the three nodes.
const CLIENTS: usize = 12;
/// How long the clients hammer.
const HAMMER: Duration = Duration::from_secs(3);
/// The sliding-log limit: requests per minute for one user.
const LOG_LIMIT: u64 = 40;
/// The token bucket: size and refill per second.
const BUCKET_SIZE: u64 = 10;
const BUCKET_REFILL_PER_S: u64 = 5;

fn limits_toml() -> String {
    format!(
        "[[rate_limits]]\nname = \"me-per-minute\"\nscope = \"user\"\nroutes = [\"/v1/me\"]\n\
         algorithm = \"sliding_log\"\nlimit = {LOG_LIMIT}\nwindow_ms = 60000\nfailure = \"closed\"\n\n\
         [[rate_limits]]\nname = \"cluster-bucket\"\nscope = \"global\"\nroutes = [\"/v1/cluster\"]\n\
         algorithm = \"token_bucket\"\ncapacity = {BUCKET_SIZE}\nrefill_per_s = {BUCKET_REFILL_PER_S}\n\
         failure = \"closed\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_holds_across_all_nodes() {
    let seed = Seed::new("shared_rate_limit::a_limit_holds_across_all_nodes");
    let options = ClusterOptions { extra_toml: limits_toml(), ..ClusterOptions::default() };
    let cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster, &seed)).await;
    cluster.conclude(result);
}

/// Counts of answers by kind.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    admitted: u64,
    limited: u64,
    other: u64,
}

async fn hammer(cluster: &Cluster, path: &str, token: &str, seed: &Seed) -> Result<(Tally, Duration)> {
    let http = cluster.client();
    let token = Arc::new(token.to_owned());
    let urls = cluster.http_urls(&cluster.node_ids());
    let mut rng = seed.rng();
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (http, token) = (http.clone(), token.clone());
            let url = format!("{}{path}", urls[(i + rng.gen_range(0..urls.len())) % urls.len()]);
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while started.elapsed() < HAMMER {
                    match http.get(&url).bearer_auth(token.as_str()).send().await.map(|r| r.status().as_u16()) {
                        Ok(200) => tally.admitted += 1,
                        Ok(429) => tally.limited += 1,
                        _ => tally.other += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for client in clients {
        let t = client.await?;
        total.admitted += t.admitted;
        total.limited += t.limited;
        total.other += t.other;
    }
    Ok((total, started.elapsed()))
}

/// A fresh user's token, so no earlier request (the harness probes `/v1/me` with the admin
/// token) counts against the per-user limit.
async fn fresh_user_token(cluster: &Cluster, seed: &Seed) -> Result<String> {
    let http = cluster.client();
    let url = cluster.http_url(1);
    let user = create_user(&http, &url, cluster.admin_token(), &format!("hammer-{}", seed.value())).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("create the user")?.to_owned();
    let token = create_token(&http, &url, cluster.admin_token(), &user_id, "hammer").await?;
    Ok(token.body().and_then(|b| b["token"].as_str()).context("create the token")?.to_owned())
}

async fn scenario(cluster: &Cluster, seed: &Seed) -> Result<()> {
    let token = fresh_user_token(cluster, seed).await?;
    let (log, _) = hammer(cluster, "/v1/me", &token, seed).await?;
    eprintln!("sliding log {LOG_LIMIT}/min through 3 nodes: {log:?}");
    ensure!(log.admitted <= LOG_LIMIT, "{} admitted, limit {LOG_LIMIT}", log.admitted);
    ensure!(log.limited > 0, "the clients never hit the limit: {log:?}");
    // Fewer than the limit only if some requests had no decision in time (503, fail-closed).
    ensure!(log.admitted == LOG_LIMIT || log.other > 0, "the limit was not reached: {log:?}");

    let (bucket, elapsed) = hammer(cluster, "/v1/cluster", &token, seed).await?;
    let refilled = (elapsed.as_millis() as u64 * BUCKET_REFILL_PER_S).div_ceil(1_000);
    let allowed = BUCKET_SIZE + refilled;
    eprintln!("token bucket {BUCKET_SIZE}+{BUCKET_REFILL_PER_S}/s over {elapsed:?}: {bucket:?}, at most {allowed}");
    ensure!(bucket.admitted <= allowed, "{} admitted, at most {allowed} allowed", bucket.admitted);
    ensure!(bucket.limited > 0, "the clients never hit the bucket: {bucket:?}");
    Ok(())
}
