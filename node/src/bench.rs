//! `raftbox bench`: N concurrent clients drive a running cluster through every node for a
//! fixed time; prints requests/s and latency percentiles per N.
//!
//! Workloads: `create-user` (one Raft write each: the batching benchmark) and `me`
//! (`GET /v1/me`: on a rate-limited cluster, one limiter check each; 429 answers count as
//! decided requests, reported separately).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Workload {
    /// `POST /v1/admin/users`, a new name each time (201 counts).
    CreateUser,
    /// `GET /v1/me` (200 and 429 count; 429 = rejected by a rate limit).
    Me,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Comma-separated node URLs; client i talks to endpoint i mod count.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7081,http://127.0.0.1:7082,http://127.0.0.1:7083"
    )]
    endpoints: Vec<String>,
    /// File holding the admin token.
    #[arg(long, default_value = ".raftbox/admin.token")]
    token_file: PathBuf,
    /// What each client does in a loop.
    #[arg(long, value_enum, default_value = "create-user")]
    workload: Workload,
    /// Concurrency levels to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    concurrency: Vec<usize>,
    /// Seconds per concurrency level.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

/// Per-client (then per-level) tally.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    limited: u64,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.limited += other.limited;
        self.errors += other.errors;
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.endpoints.is_empty() || args.concurrency.contains(&0) {
        bail!("need at least one endpoint and positive concurrency levels");
    }
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("read admin token {}", args.token_file.display()))?;
    let token = Arc::new(token.trim().to_string());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    println!("workload {:?}, {}s per level, endpoints {}", args.workload, args.seconds, args.endpoints.join(" "));
    println!(
        "{:>11} {:>10} {:>9} {:>9} {:>10} {:>8}",
        "concurrency", "req/s", "p50 ms", "p99 ms", "429 share", "errors"
    );
    for &n in &args.concurrency {
        let deadline = Instant::now() + Duration::from_secs(args.seconds);
        let started = Instant::now();
        let clients: Vec<_> = (0..n)
            .map(|i| {
                let endpoint = args.endpoints[i % args.endpoints.len()].trim_end_matches('/').to_string();
                let prefix = format!("bench-{run_id}-{n}-{i}");
                tokio::spawn(client_loop(client.clone(), args.workload, endpoint, token.clone(), prefix, deadline))
            })
            .collect();
        let mut all = Tally::default();
        for handle in clients {
            all.merge(handle.await?);
        }
        let elapsed = started.elapsed().as_secs_f64();
        all.latencies_us.sort_unstable();
        let decided = all.latencies_us.len() as f64;
        let limited_share = if decided > 0.0 { all.limited as f64 / decided } else { 0.0 };
        println!(
            "{n:>11} {:>10.0} {:>9.2} {:>9.2} {:>9.1}% {:>8}",
            decided / elapsed,
            all.percentile_ms(0.50),
            all.percentile_ms(0.99),
            limited_share * 100.0,
            all.errors
        );
    }
    Ok(())
}

async fn client_loop(
    client: reqwest::Client,
    workload: Workload,
    endpoint: String,
    token: Arc<String>,
    prefix: String,
    deadline: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut seq = 0u64;
    while Instant::now() < deadline {
        seq += 1;
        let request = match workload {
            Workload::CreateUser => {
                client.post(format!("{endpoint}/v1/admin/users")).json(&json!({ "name": format!("{prefix}-{seq}") }))
            }
            Workload::Me => client.get(format!("{endpoint}/v1/me")),
        };
        let start = Instant::now();
        let status = request.bearer_auth(token.as_str()).send().await.map(|r| r.status().as_u16());
        let elapsed_us = start.elapsed().as_micros() as u64;
        match status {
            Ok(200 | 201) => tally.latencies_us.push(elapsed_us),
            Ok(429) => {
                tally.latencies_us.push(elapsed_us);
                tally.limited += 1;
            }
            _ => tally.errors += 1,
        }
    }
    tally
}
