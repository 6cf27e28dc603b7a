//! `raftbox bench`: N concurrent writers create users through every node of a running
//! cluster for a fixed time; prints writes/s and latency percentiles per N.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Comma-separated node URLs; writer i talks to endpoint i mod count.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7081,http://127.0.0.1:7082,http://127.0.0.1:7083"
    )]
    endpoints: Vec<String>,
    /// File holding the admin token.
    #[arg(long, default_value = ".raftbox/admin.token")]
    token_file: PathBuf,
    /// Concurrency levels to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    concurrency: Vec<usize>,
    /// Seconds per concurrency level.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

/// Per-level tally.
struct Tally {
    latencies_us: Vec<u64>,
    errors: u64,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.endpoints.is_empty() || args.concurrency.iter().any(|c| *c == 0) {
        bail!("need at least one endpoint and positive concurrency levels");
    }
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("read admin token {}", args.token_file.display()))?;
    let token = Arc::new(token.trim().to_string());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    println!(
        "workload: POST /v1/admin/users (one Raft command each), {}s per level, endpoints {}",
        args.seconds,
        args.endpoints.join(" ")
    );
    println!("{:>11} {:>10} {:>9} {:>9} {:>8}", "concurrency", "writes/s", "p50 ms", "p99 ms", "errors");
    for &n in &args.concurrency {
        let deadline = Instant::now() + Duration::from_secs(args.seconds);
        let started = Instant::now();
        let writers = (0..n).map(|i| {
            let client = client.clone();
            let token = token.clone();
            let url = format!("{}/v1/admin/users", args.endpoints[i % args.endpoints.len()].trim_end_matches('/'));
            let prefix = format!("bench-{run_id}-{n}-{i}");
            tokio::spawn(writer(client, url, token, prefix, deadline))
        });
        let mut all = Tally { latencies_us: Vec::new(), errors: 0 };
        for handle in writers.collect::<Vec<_>>() {
            let tally = handle.await?;
            all.latencies_us.extend(tally.latencies_us);
            all.errors += tally.errors;
        }
        let elapsed = started.elapsed().as_secs_f64();
        all.latencies_us.sort_unstable();
        let pct = |p: f64| -> f64 {
            if all.latencies_us.is_empty() {
                return f64::NAN;
            }
            let i = ((all.latencies_us.len() as f64 - 1.0) * p).round() as usize;
            all.latencies_us[i] as f64 / 1000.0
        };
        let rate = all.latencies_us.len() as f64 / elapsed;
        println!("{n:>11} {rate:>10.0} {:>9.2} {:>9.2} {:>8}", pct(0.50), pct(0.99), all.errors);
    }
    Ok(())
}

async fn writer(client: reqwest::Client, url: String, token: Arc<String>, prefix: String, deadline: Instant) -> Tally {
    let mut tally = Tally { latencies_us: Vec::new(), errors: 0 };
    let mut seq = 0u64;
    while Instant::now() < deadline {
        seq += 1;
        let body = json!({ "name": format!("{prefix}-{seq}") });
        let start = Instant::now();
        let response = client.post(&url).bearer_auth(token.as_str()).json(&body).send().await;
        match response {
            Ok(r) if r.status().as_u16() == 201 => tally.latencies_us.push(start.elapsed().as_micros() as u64),
            _ => tally.errors += 1,
        }
    }
    tally
}
