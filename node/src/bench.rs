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
use raftbox_api::routes::files::CommitRequest;
use raftbox_api::routes::sync::SyncPage;
use serde_json::json;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Workload {
    /// `POST /v1/admin/users`, a new name each time (201 counts).
    CreateUser,
    /// `GET /v1/me` (200 and 429 count; 429 = rejected by a rate limit).
    Me,
    /// `POST /v1/files/commit` of a new file each time (one shared, pre-uploaded chunk).
    Commit,
    /// `PUT /v1/blocks/{hash}` of a new random block of `--block-bytes` each time (reports
    /// MB/s).
    Upload,
    /// Seeds `--files` files, then times a full `GET /v1/sync` from cursor 0.
    Sync,
    /// Creates `--jobs` webhook jobs due at the same second and measures claims/s and the
    /// lateness from due time to webhook receipt (a receiver runs in this process).
    Jobs,
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
    /// CA certificate (PEM) to trust for `https://` endpoints (README "TLS").
    #[arg(long, env = "RAFTBOX_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// What each client does in a loop.
    #[arg(long, value_enum, default_value = "create-user")]
    workload: Workload,
    /// Concurrency levels to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    concurrency: Vec<usize>,
    /// Seconds per concurrency level.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// For `sync`: files to create before syncing.
    #[arg(long, default_value_t = 100_000)]
    files: usize,
    /// For `jobs`: jobs due at the same second.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// For `upload`: bytes of each block (1 to 8 MiB; default 1 MiB, the client's average
    /// chunk).
    #[arg(long, default_value_t = UPLOAD_BLOCK_BYTES_DEFAULT)]
    block_bytes: usize,
}

/// Bytes of one `upload` block unless `--block-bytes` says otherwise.
const UPLOAD_BLOCK_BYTES_DEFAULT: usize = 1 << 20;

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
    if !(1..=raftbox_storage::blocks::BLOCK_BYTES_MAX).contains(&args.block_bytes) {
        bail!("--block-bytes is 1 to {}", raftbox_storage::blocks::BLOCK_BYTES_MAX);
    }
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("read admin token {}", args.token_file.display()))?;
    let token = Arc::new(token.trim().to_string());
    let client = crate::client::http_client(
        reqwest::Client::builder().timeout(Duration::from_secs(10)),
        args.ca_file.as_deref(),
    )?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    if let Workload::Sync = args.workload {
        return sync_bench(&client, &args, &token, &run_id).await;
    }
    if let Workload::Jobs = args.workload {
        return jobs_bench(&client, &args, &token).await;
    }
    let shared_chunk = Arc::new(upload_one(&client, &args.endpoints[0], &token, run_id.as_bytes()).await?);
    println!("workload {:?}, {}s per level, endpoints {}", args.workload, args.seconds, args.endpoints.join(" "));
    if let Workload::Upload = args.workload {
        println!("blocks of {} bytes", args.block_bytes);
    }
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
                let shared = shared_chunk.clone();
                tokio::spawn(client_loop(
                    client.clone(),
                    args.workload,
                    endpoint,
                    token.clone(),
                    prefix,
                    shared,
                    args.block_bytes,
                    deadline,
                ))
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
        if let Workload::Upload = args.workload {
            println!("{:>11} {:>10.1} MB/s", "", decided * args.block_bytes as f64 / elapsed / 1e6);
        }
    }
    Ok(())
}

async fn client_loop(
    client: reqwest::Client,
    workload: Workload,
    endpoint: String,
    token: Arc<String>,
    prefix: String,
    shared_chunk: Arc<String>,
    block_bytes: usize,
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
            Workload::Me | Workload::Sync | Workload::Jobs => client.get(format!("{endpoint}/v1/me")),
            Workload::Commit => {
                client.post(format!("{endpoint}/v1/files/commit")).json(&commit_body(&prefix, seq, &shared_chunk))
            }
            Workload::Upload => {
                let block = random_block(&prefix, seq, block_bytes);
                let hash = blake3::hash(&block).to_hex().to_string();
                client.put(format!("{endpoint}/v1/blocks/{hash}")).body(block)
            }
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

fn commit_body(prefix: &str, seq: u64, chunk: &str) -> CommitRequest {
    CommitRequest {
        path: format!("/bench/{prefix}/{seq}"),
        chunks: chunk.parse().into_iter().collect(),
        base_version: 0,
        size: 1,
        mtime: serde_json::Value::from(0),
        namespace_id: None,
        deleted: false,
        executable: false,
    }
}

/// A block no other client sends: pseudo-random bytes seeded by the client and sequence.
fn random_block(prefix: &str, seq: u64, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    let mut hasher = blake3::Hasher::new();
    hasher.update(prefix.as_bytes());
    hasher.update(&seq.to_be_bytes());
    let mut reader = hasher.finalize_xof();
    out.resize(bytes, 0);
    reader.fill(&mut out);
    out
}

async fn upload_one(client: &reqwest::Client, endpoint: &str, token: &str, data: &[u8]) -> anyhow::Result<String> {
    let hash = blake3::hash(data).to_hex().to_string();
    let response = client
        .put(format!("{}/v1/blocks/{hash}", endpoint.trim_end_matches('/')))
        .bearer_auth(token)
        .body(data.to_vec())
        .send()
        .await?;
    if response.status().as_u16() != 201 {
        bail!("upload the shared chunk: {}", response.status());
    }
    Ok(hash)
}

/// Seeds `--files` files with 64 concurrent committers, then pages through
/// `GET /v1/sync?cursor=0` to the end (page sizes 1,000 and 10,000).
async fn sync_bench(
    client: &reqwest::Client,
    args: &BenchArgs,
    token: &Arc<String>,
    run_id: &str,
) -> anyhow::Result<()> {
    let endpoint = args.endpoints[0].trim_end_matches('/').to_string();
    let chunk = upload_one(client, &endpoint, token, run_id.as_bytes()).await?;
    let before = sync_all(client, &endpoint, token, 10_000).await?.0;
    let seeding = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seeders: Vec<_> = (0..64)
        .map(|i| {
            let (client, token, next, chunk) = (client.clone(), token.clone(), next.clone(), chunk.clone());
            let endpoint = args.endpoints[i % args.endpoints.len()].trim_end_matches('/').to_string();
            let (files, prefix) = (args.files, format!("sync-{run_id}"));
            tokio::spawn(async move {
                loop {
                    let seq = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seq >= files {
                        return anyhow::Ok(());
                    }
                    let body = commit_body(&prefix, seq as u64, &chunk);
                    let response = client
                        .post(format!("{endpoint}/v1/files/commit"))
                        .bearer_auth(token.as_str())
                        .json(&body)
                        .send()
                        .await?;
                    if response.status().as_u16() != 201 {
                        bail!("seed commit: {}", response.status());
                    }
                }
            })
        })
        .collect();
    for seeder in seeders {
        seeder.await??;
    }
    println!("seeded {} files in {:.1} s", args.files, seeding.elapsed().as_secs_f64());
    for page in [1_000usize, 10_000] {
        let started = Instant::now();
        let (changes, pages) = sync_all(client, &endpoint, token, page).await?;
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "sync from cursor 0, pages of {page}: {changes} changes ({} new) in {pages} pages, {elapsed:.2} s, {:.0} changes/s",
            changes - before,
            changes as f64 / elapsed
        );
    }
    Ok(())
}

async fn sync_all(
    client: &reqwest::Client,
    endpoint: &str,
    token: &str,
    page: usize,
) -> anyhow::Result<(usize, usize)> {
    let (mut cursor, mut changes, mut pages) = ("0".to_string(), 0, 0);
    loop {
        let response = client
            .get(format!("{endpoint}/v1/sync"))
            .query(&[("cursor", cursor.as_str()), ("limit", &page.to_string())])
            .bearer_auth(token)
            .send()
            .await?;
        if response.status().as_u16() != 200 {
            bail!("sync: {}", response.status());
        }
        // Decoded into the API's own type, as the sync client decodes it (not a generic tree).
        let page: SyncPage<'static> = serde_json::from_slice(&response.bytes().await?)?;
        changes += page.changes.len();
        pages += 1;
        cursor = page.cursor;
        if !page.has_more {
            return Ok((changes, pages));
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Creates `--jobs` webhook jobs due at one instant (far enough ahead for all creates to
/// land), then waits for every webhook and reports claims/s and lateness percentiles.
async fn jobs_bench(client: &reqwest::Client, args: &BenchArgs, token: &Arc<String>) -> anyhow::Result<()> {
    use std::sync::Mutex;
    let receipts: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::with_capacity(args.jobs)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let target = format!("http://{}/hook", listener.local_addr()?);
    let recorded = receipts.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let recorded = recorded.clone();
            async move {
                recorded.lock().unwrap_or_else(|e| e.into_inner()).push(now_ms());
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    // Creates run at a few thousand per second; leave time for all of them.
    let lead_ms = 5_000 + (args.jobs as u64) / 2;
    let due_ms = (now_ms() + lead_ms) / 1_000 * 1_000 + 1_000;
    let run_at = raftbox_storage::schedule::format_utc(due_ms);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let creating = Instant::now();
    let creators: Vec<_> = (0..64)
        .map(|i| {
            let (client, token, next, target, run_at) = (client.clone(), token.clone(), next.clone(), target.clone(), run_at.clone());
            let endpoint = args.endpoints[i % args.endpoints.len()].trim_end_matches('/').to_string();
            let total = args.jobs;
            tokio::spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                    let body = json!({ "type": "webhook", "target": target, "payload": {}, "schedule": { "runAt": run_at }, "maxRetries": 0 });
                    let response = client.post(format!("{endpoint}/v1/jobs")).bearer_auth(token.as_str()).json(&body).send().await?;
                    if response.status().as_u16() != 201 {
                        bail!("create job: {}", response.status());
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for creator in creators {
        creator.await??;
    }
    let created_s = creating.elapsed().as_secs_f64();
    if now_ms() >= due_ms {
        bail!("creating {} jobs took {created_s:.1} s, past their due time; use fewer --jobs", args.jobs);
    }
    println!("created {} webhook jobs due at {run_at} in {created_s:.1} s", args.jobs);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let received = receipts.lock().unwrap_or_else(|e| e.into_inner()).len();
        if received >= args.jobs {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {received} of {} webhooks arrived within 10 minutes", args.jobs);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lateness: Vec<u64> =
        receipts.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|t| t.saturating_sub(due_ms)).collect();
    lateness.sort_unstable();
    let mut per_quarter = vec![0usize; (lateness.last().copied().unwrap_or(0) / 250 + 1) as usize];
    for late in &lateness {
        per_quarter[(late / 250) as usize] += 1;
    }
    let per_quarter: Vec<String> = per_quarter.iter().map(usize::to_string).collect();
    println!("webhooks received per 250 ms after the due time: {}", per_quarter.join(" "));
    let pct = |p: f64| lateness[((lateness.len() - 1) as f64 * p).round() as usize];
    let span_ms = lateness.last().copied().unwrap_or(0).max(1);
    println!(
        "{} webhooks received: {:.0} claims/s (all fired within {span_ms} ms of due); lateness p50 {} ms, p99 {} ms, max {} ms",
        lateness.len(),
        lateness.len() as f64 * 1_000.0 / span_ms as f64,
        pct(0.50),
        pct(0.99),
        span_ms
    );
    Ok(())
}
