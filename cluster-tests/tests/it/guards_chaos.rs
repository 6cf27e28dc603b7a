//! Chaos for the guards and the scheduler: while nodes are killed, paused and partitioned
//! (each node in its own network namespace; the leader isolated, a minority cut off, one-way
//! loss, a lossy and slow link), their clocks moved by seconds and their disks filled,
//!
//! - **rate limits**: a user hammers a token-bucket limit (failing closed) through every
//!   node; the admissions never exceed the bucket's size plus what refilled meanwhile;
//! - **idempotency**: clients create users with an `Idempotency-Key`, and after an unknown
//!   outcome retry with the same key until they get an answer: every key ends with one
//!   effect and every answer for it is the same;
//! - **jobs**: a job fires every second at a local receiver: a fence is never handed to two
//!   fires and fences grow with the fires' times (they are not reused across leader
//!   changes), no fire arrives before its time (a skewed clock never fires early) and a fire
//!   runs again only once its lease lapsed, every fire due once a lease stranded by the
//!   faults has lapsed arrives, and no fire's effect is applied twice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::guard_checks::{
    check_admissions, check_due_fires, check_fire_times, check_fires, check_keyed_answers, Admission, Bucket, FireCall,
};
use raftbox_cluster_tests::nemesis::{self, FaultKind, NemesisSpec};
use raftbox_cluster_tests::receiver::Receiver;
use raftbox_cluster_tests::{
    get_user, new_user, send, within, Cluster, ClusterOptions, Deadline, Outcome, RaftTuning, Seed, RETRY_BACKOFF_MS,
};
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;

const TEST_DEADLINE: Duration = Duration::from_secs(300);
const FAULT_PHASE: Duration = Duration::from_secs(20);
const FAULT_MS: (u64, u64) = (1_000, 3_000);
const CALM_MS: (u64, u64) = (500, 1_500);
/// The token bucket on `/v1/me`, per user: size and refill per second.
const BUCKET_SIZE: u64 = 10;
const BUCKET_REFILL_PER_S: u64 = 5;
const HAMMER_CLIENTS: usize = 4;
const KEYED_CLIENTS: usize = 3;
/// How long a keyed creation is retried while its outcome stays unknown.
const KEYED_RETRY_DEADLINE: Duration = Duration::from_secs(60);
/// The executors' lease: a claim stranded by a fault (its holder cut off or frozen) lapses
/// after it, and the job is claimed again.
const LEASE_S: u64 = 3;
/// After the faults: how long the job must keep firing, every fire due once a stranded
/// lease has lapsed arriving.
const JOB_CALM: Duration = Duration::from_secs(12);
/// Fires that may still be in flight when the check starts, at the end of the calm.
const JOB_IN_FLIGHT_S: u64 = 2;
const RECOVERY_DEADLINE: Duration = Duration::from_secs(30);
/// How far the cluster's time may be from the receiver's (the nodes' default
/// `raft.max_clock_offset_ms`).
const CLOCK_BOUND_MS: u64 = 500;

fn limits_toml() -> String {
    format!(
        "[[rate_limits]]\nname = \"me-bucket\"\nscope = \"user\"\nroutes = [\"/v1/me\"]\n\
         algorithm = \"token_bucket\"\ncapacity = {BUCKET_SIZE}\nrefill_per_s = {BUCKET_REFILL_PER_S}\n\
         failure = \"closed\"\n\n[jobs]\nlease_ms = {}\n",
        LEASE_S * 1_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_keys_and_jobs_under_faults() {
    let seed = Seed::new("guards_chaos::limits_keys_and_jobs_under_faults");
    let kinds = nemesis::selected(&[
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::IsolateLeader,
        FaultKind::Minority,
        FaultKind::OneWay,
        FaultKind::LossyLink,
        FaultKind::ClockSkew,
        FaultKind::DiskFull,
    ])
    .expect("RAFTBOX_NEMESES");
    let mut options = ClusterOptions {
        extra_toml: limits_toml(),
        // The receiver listens on the namespaces' bridge, whatever the faults.
        network_namespaces: true,
        raft: RaftTuning { write_timeout_ms: 2_000, ..RaftTuning::default() },
        ..ClusterOptions::default()
    };
    nemesis::prepare(&mut options, &kinds);
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    nemesis::allow_log_errors(&mut cluster, &kinds);
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed, kinds)).await;
    cluster.conclude(result);
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn scenario(cluster: &mut Cluster, seed: &Seed, kinds: Vec<FaultKind>) -> Result<()> {
    let mut rng = seed.rng();
    let epoch = Instant::now();
    let urls = cluster.http_urls(&cluster.node_ids());
    let http = cluster.client();
    let admin = cluster.admin_token().to_owned();
    let (_, hammer_token) = new_user(cluster, 1, "hammer", "hammer").await?;

    // The job: every second, to the receiver.
    // The nodes live in namespaces: the receiver listens on the bridge, which they reach.
    let bridge = cluster.network().context("network namespaces")?.bridge_ip();
    let receiver = Receiver::start_on(bridge).await?;
    let job = json!({
        "type": "webhook", "target": receiver.url("fire"), "payload": {},
        "schedule": { "cron": "* * * * * *", "timezone": "UTC" }, "maxRetries": 3,
    });
    let created = send(http.post(format!("{}/v1/jobs", urls[0])).bearer_auth(&admin).json(&job)).await?;
    let job_id = created.body().and_then(|b| b["jobId"].as_str()).context(format!("create the job: {created:?}"))?;
    let job_id = job_id.to_owned();

    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMER_CLIENTS)
        .map(|i| {
            let (http, url, token, stop) =
                (http.clone(), urls[i % urls.len()].clone(), hammer_token.clone(), stop.clone());
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let call_ms = now_ms();
                    if let Ok(Outcome::Ok(_)) = send(http.get(format!("{url}/v1/me")).bearer_auth(&token)).await {
                        admitted.push(Admission { call_ms, ret_ms: now_ms() });
                    }
                }
                admitted
            })
        })
        .collect();
    let keyed: Vec<_> = (0..KEYED_CLIENTS)
        .map(|c| {
            let (http, urls, admin, stop) = (http.clone(), urls.clone(), admin.clone(), stop.clone());
            let mut rng = rand::rngs::StdRng::seed_from_u64(rng.gen());
            tokio::spawn(async move { keyed_creations(http, urls, admin, c, stop, &mut rng).await })
        })
        .collect();

    let skewed = kinds.contains(&FaultKind::ClockSkew);
    let spec =
        NemesisSpec { kinds, fault_ms: FAULT_MS, calm_ms: CALM_MS, duration: FAULT_PHASE, at_once: nemesis::at_once() };
    let events = nemesis::run(cluster, &spec, &mut rng, epoch).await?;
    cluster.wait_for_leader(None, RECOVERY_DEADLINE).await?;
    let healed_ms = now_ms();
    // The calm: the job fires on; the workloads go on too.
    let wait = Deadline::after(JOB_CALM + RECOVERY_DEADLINE, "the calm after the faults");
    while now_ms() < healed_ms + JOB_CALM.as_millis() as u64 {
        wait.tick("calm").await?;
    }
    stop.store(true, Ordering::Relaxed);
    let mut admitted = Vec::new();
    for hammer in hammers {
        admitted.extend(hammer.await?);
    }
    let mut answers: BTreeMap<String, Vec<(u16, String)>> = BTreeMap::new();
    for client in keyed {
        answers.extend(client.await??);
    }
    let check_ms = now_ms();

    // Rate limit: in no window of the run more than the bucket allows.
    // Where clocks are skewed, the limiter's time may be off real time by the clock bound
    // (ARCHITECTURE.md, "Time").
    let clock_slack_ms = if skewed { 3 * CLOCK_BOUND_MS } else { 0 };
    let bucket = Bucket { capacity: BUCKET_SIZE, refill_per_s: BUCKET_REFILL_PER_S, clock_slack_ms };
    check_admissions(&admitted, bucket)?;
    ensure!(!admitted.is_empty(), "nothing admitted: the limiter never decided");
    eprintln!("rate limit: {} admitted, none over the bucket in any window", admitted.len());

    // Idempotency: one answer per key, and its user exists.
    check_keyed_answers(&answers)?;
    for (key, seen) in &answers {
        let first = &seen[0];
        ensure!(first.0 == 201, "key {key}: answered {first:?}");
        let user = get_user(&http, &urls[1], &admin, &first.1).await?;
        ensure!(user.is_ok(), "key {key}: user {} missing: {user:?}", first.1);
    }
    eprintln!("idempotency: {} keys, each one effect and one answer", answers.len());

    // Jobs.
    let calls = receiver.calls("fire").iter().map(fire_call).collect::<Result<Vec<_>>>()?;
    let fires = check_fires(&calls)?;
    // A stamp is within 1.5 clock bounds of real time (ARCHITECTURE.md, "Time").
    check_fire_times(&calls, LEASE_S * 1_000, CLOCK_BOUND_MS * 3 / 2)?;
    let first_due = healed_ms / 1_000 + LEASE_S + 2;
    let due =
        match check_due_fires(&fires.fires, &job_id, first_due, (check_ms / 1_000).saturating_sub(JOB_IN_FLIGHT_S)) {
            Ok(due) => due,
            Err(missing) => {
                // What the job did meanwhile, for the diagnosis: its runs as the cluster recorded
                // them (worker, fence, times, errors) and the calls the receiver saw.
                let runs =
                    send(http.get(format!("{}/v1/jobs/{job_id}/runs?limit=40", urls[0])).bearer_auth(&admin)).await;
                eprintln!("the job's newest runs: {runs:?}");
                let seen: Vec<(u64, u64, u64)> =
                    calls.iter().map(|c| (c.scheduled_s, c.fence, c.received_ms)).collect();
                eprintln!("calls received (scheduled s, fence, received ms): {seen:?}");
                return Err(missing);
            }
        };
    eprintln!(
        "jobs: {} calls, {} fires, {} distinct fences, none early, one run per lease; {due} fires due after \
         the faults, all arrived",
        fires.calls,
        fires.fires.len(),
        fires.fences
    );
    nemesis::report(
        "guards_chaos::limits_keys_and_jobs_under_faults",
        seed.value(),
        &events,
        &format!(
            "{} admitted; {} keys; {} fires, {} fences",
            admitted.len(),
            answers.len(),
            fires.fires.len(),
            fires.fences
        ),
    )?;
    Ok(())
}

/// A receiver's call as the fire checker reads it.
fn fire_call(call: &raftbox_cluster_tests::receiver::Call) -> Result<FireCall> {
    let header = |name: &str| call.headers.get(name).cloned().with_context(|| format!("{name} in {call:?}"));
    let scheduled = call.body["scheduledFor"].as_str().context("scheduledFor")?;
    let at = chrono::DateTime::parse_from_rfc3339(scheduled).context("parse scheduledFor")?;
    Ok(FireCall {
        job_id: header("x-raftbox-job-id")?,
        scheduled_s: u64::try_from(at.timestamp()).context("scheduledFor before 1970")?,
        fence: header("x-raftbox-fence-token")?.parse().context("fence")?,
        key: header("idempotency-key")?,
        received_ms: call.received_ms,
    })
}

/// Creates users with an `Idempotency-Key` until stopped; after an unknown outcome the same
/// request is sent again (to any node) until an answer comes. Returns every answer by key.
async fn keyed_creations(
    http: reqwest::Client,
    urls: Vec<String>,
    admin: String,
    client: usize,
    stop: Arc<AtomicBool>,
    rng: &mut rand::rngs::StdRng,
) -> Result<BTreeMap<String, Vec<(u16, String)>>> {
    let mut answers: BTreeMap<String, Vec<(u16, String)>> = BTreeMap::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("chaos-key-{client}-{n}");
        let body = json!({ "name": format!("keyed-{client}-{n}") });
        let wait = Deadline::after(KEYED_RETRY_DEADLINE, format!("an answer for key {key}"));
        // One keyed creation through a random node.
        let create = |rng: &mut rand::rngs::StdRng| {
            let url = &urls[rng.gen_range(0..urls.len())];
            send(
                http.post(format!("{url}/v1/admin/users"))
                    .bearer_auth(&admin)
                    .header("idempotency-key", &key)
                    .json(&body),
            )
        };
        loop {
            match create(rng).await? {
                Outcome::Ok(body) => {
                    let user = body["userId"].as_str().context("userId")?.to_owned();
                    answers.entry(key.clone()).or_default().push((201, user));
                    break;
                }
                // Still running under another request of the same key: ask again.
                Outcome::Rejected(409, text) if text.contains("in progress") => {}
                Outcome::Rejected(status, text) => {
                    answers.entry(key.clone()).or_default().push((status, text));
                    break;
                }
                Outcome::Unknown(why) => {
                    answers.entry(key.clone()).or_default();
                    wait.tick(&why).await?;
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
        }
        // Sometimes repeat a request whose answer is known: it must answer the same.
        if rng.gen_bool(0.3) {
            if let Outcome::Ok(body) = create(rng).await? {
                let user = body["userId"].as_str().context("userId")?.to_owned();
                answers.entry(key.clone()).or_default().push((201, user));
            }
        }
    }
    answers.retain(|_, seen| !seen.is_empty());
    Ok(answers)
}
