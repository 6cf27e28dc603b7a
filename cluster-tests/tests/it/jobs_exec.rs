//! Invariants of job execution against a real local webhook receiver: a one-off webhook
//! fires once, on time, with the documented headers; a failing target is retried
//! `maxRetries` times, then the job is FAILED; a cron job fires repeatedly and stops when
//! cancelled; `kill -9` of the node running a webhook leads to a re-claim after the lease,
//! and the receiver applies the fire's effect once. Every call is signed as Standard Webhooks
//! says, checked with that specification's reference library (`standardwebhooks`, PyPI):
//! the signature verifies with the owner's secret, not once the body is changed, and after
//! a rotation with the new secret and the old one alike. A paused job fires no more until
//! resumed; run now fires once, fenced and recorded.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::receiver::Receiver;
use raftbox_cluster_tests::{create_token, create_user, within, Cluster, ClusterOptions, Deadline, Seed};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(150);
const LEASE_MS: u64 = 2_000;
/// On an idle cluster a one-off job fires within this long after `runAt`.
const ON_TIME_MS: u64 = 1_000;

/// A short lease, and per-second cron for the test's (non-admin) user.
fn jobs_toml() -> String {
    format!("[jobs]\nlease_ms = {LEASE_MS}\n\n[job_limits]\nmin_cron_interval_s = 1\n")
}

/// Whether the Standard Webhooks reference library (Python `standardwebhooks`) verifies
/// `call` as signed with `secret`.
fn reference_verifies(secret: &str, call: &raftbox_cluster_tests::receiver::Call) -> Result<bool> {
    let dir = tempfile::tempdir()?;
    let (headers, body) = (dir.path().join("headers.json"), dir.path().join("body"));
    std::fs::write(&headers, serde_json::to_vec(&call.headers)?)?;
    std::fs::write(&body, &call.raw)?;
    let script = "import json, sys\n\
                  from standardwebhooks.webhooks import Webhook, WebhookVerificationError\n\
                  headers = json.load(open(sys.argv[2]))\n\
                  try:\n    Webhook(sys.argv[1]).verify(open(sys.argv[3], 'rb').read(), headers)\n\
                  except WebhookVerificationError as e:\n    print(e); sys.exit(3)\n";
    let output = std::process::Command::new("python3")
        .args(["-c", script, secret])
        .arg(&headers)
        .arg(&body)
        .output()
        .context("run python3 (scripts/test installs standardwebhooks)")?;
    match output.status.code() {
        Some(0) => Ok(true),
        Some(3) => Ok(false),
        _ => anyhow::bail!("the reference library failed: {}", String::from_utf8_lossy(&output.stderr)),
    }
}

/// A secret nobody signs with.
fn stranger_secret() -> String {
    "whsec_c3RyYW5nZXItc2VjcmV0LW9mLTMyLWJ5dGVzLWxvbmc=".to_owned()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn rfc3339(ms: u64) -> String {
    let secs = ms / 1_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        ms % 1_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_fire_once_retry_recur_cancel_and_survive_a_killed_worker() {
    let seed = Seed::new("jobs_exec::webhooks_fire_once_retry_recur_cancel_and_survive_a_killed_worker");
    let options = ClusterOptions { extra_toml: jobs_toml(), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// One attempt slot per node, and a webhook that takes longer than the lease: every job is
/// called once (a job a node holds claimed while its slot is busy keeps its lease, so no other
/// node re-claims it), and no node runs more attempts at once than it has slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_jobs_keep_their_lease_and_attempts_stay_within_the_slots() {
    let seed = Seed::new("jobs_exec::held_jobs_keep_their_lease_and_attempts_stay_within_the_slots");
    let extra_toml = format!("[jobs]\nlease_ms = {LEASE_MS}\nconcurrency = 1\n");
    let cluster =
        Cluster::start(ClusterOptions { extra_toml, ..ClusterOptions::default() }).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, held_jobs(&cluster, &seed)).await;
    cluster.conclude(result);
}

async fn held_jobs(cluster: &Cluster, seed: &Seed) -> Result<()> {
    const JOBS: usize = 6;
    const WEBHOOK_MS: u64 = LEASE_MS + 500;
    let receiver = Receiver::start().await?;
    receiver.delay("held", WEBHOOK_MS);
    let http = cluster.client();
    let n1 = cluster.http_url(1);
    let user = create_user(&http, &n1, cluster.admin_token(), &format!("held-{}", seed.value())).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("user")?.to_owned();
    let token = create_token(&http, &n1, cluster.admin_token(), &user_id, "t").await?;
    let token = token.body().and_then(|b| b["token"].as_str()).context("token")?.to_owned();
    let api = Api { http: http.clone(), url: cluster.http_url(3), token };
    // Due together, a little ahead, so that each node's claim finds several due at once.
    let run_at = rfc3339(now_ms() + 1_000);
    let mut ids = Vec::new();
    for _ in 0..JOBS {
        ids.push(
            api.create(json!({ "type": "webhook", "target": receiver.url("held"), "payload": {},
                               "schedule": { "runAt": run_at }, "maxRetries": 3, "timeoutSeconds": 10 }))
                .await?,
        );
    }
    for id in &ids {
        api.wait_status(id, "SUCCEEDED").await?;
    }
    let calls = receiver.calls("held");
    for id in &ids {
        let fences: Vec<&String> = calls
            .iter()
            .filter(|c| c.headers.get("x-raftbox-job-id") == Some(id))
            .filter_map(|c| c.headers.get("x-raftbox-fence-token"))
            .collect();
        ensure!(fences.len() == 1, "job {id} called {} times (fences {fences:?})", fences.len());
    }
    let most = receiver.max_in_flight("held");
    ensure!(most <= 3, "{most} webhooks at once from 3 nodes with one slot each");
    eprintln!("{JOBS} jobs of {WEBHOOK_MS} ms on 3 one-slot nodes: each called once, at most {most} at once");
    Ok(())
}

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn create(&self, body: Value) -> Result<String> {
        let response =
            self.http.post(format!("{}/v1/jobs", self.url)).bearer_auth(&self.token).json(&body).send().await?;
        ensure!(response.status().as_u16() == 201, "create job: {}", response.status());
        let body: Value = response.json().await?;
        Ok(body["jobId"].as_str().context("jobId")?.to_owned())
    }

    /// `POST /v1/jobs/{id}:{verb}`: the status and the answer's body.
    async fn method(&self, id: &str, verb: &str) -> Result<(u16, Value)> {
        let response =
            self.http.post(format!("{}/v1/jobs/{id}:{verb}", self.url)).bearer_auth(&self.token).send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    async fn secret(&self, rotate: bool) -> Result<String> {
        let url = format!("{}/v1/me/webhook-secret", self.url);
        let request = match rotate {
            true => self.http.post(url).json(&json!({ "keepPreviousHours": 1 })),
            false => self.http.get(url),
        };
        let response = request.bearer_auth(&self.token).send().await?;
        ensure!(response.status().is_success(), "webhook secret: {}", response.status());
        Ok(response.json::<Value>().await?["secret"].as_str().context("secret")?.to_owned())
    }

    async fn job(&self, id: &str) -> Result<Value> {
        Ok(self.http.get(format!("{}/v1/jobs/{id}", self.url)).bearer_auth(&self.token).send().await?.json().await?)
    }

    async fn wait_status(&self, id: &str, status: &str) -> Result<Value> {
        let wait = Deadline::after(Duration::from_secs(30), format!("job {id} {status}"));
        loop {
            let job = self.job(id).await?;
            if job["status"] == status {
                return Ok(job);
            }
            wait.tick(&format!("status {}", job["status"])).await?;
        }
    }

    async fn runs(&self, id: &str) -> Result<Vec<Value>> {
        let body: Value = self
            .http
            .get(format!("{}/v1/jobs/{id}/runs", self.url))
            .bearer_auth(&self.token)
            .send()
            .await?
            .json()
            .await?;
        Ok(body["runs"].as_array().cloned().unwrap_or_default())
    }
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let receiver = Receiver::start().await?;
    let http = cluster.client();
    let n1 = cluster.http_url(1);
    let user = create_user(&http, &n1, cluster.admin_token(), &format!("jobs-{}", seed.value())).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("user")?.to_owned();
    let token = create_token(&http, &n1, cluster.admin_token(), &user_id, "t").await?;
    let api = Api {
        http: http.clone(),
        url: cluster.http_url(2),
        token: token.body().and_then(|b| b["token"].as_str()).context("token")?.to_owned(),
    };

    // One-off: fires once, on time, with the documented headers.
    let run_at = now_ms() + 1_500;
    let once = api
        .create(json!({ "type": "webhook", "target": receiver.url("once"), "payload": { "n": 1 },
                        "schedule": { "runAt": rfc3339(run_at) }, "maxRetries": 0 }))
        .await?;
    api.wait_status(&once, "SUCCEEDED").await?;
    let calls = receiver.calls("once");
    ensure!(calls.len() == 1, "one-off webhook called {} times", calls.len());
    let call = &calls[0];
    let late = call.received_ms.saturating_sub(run_at);
    eprintln!("one-off webhook received {late} ms after runAt");
    ensure!(call.received_ms + 50 >= run_at && late <= ON_TIME_MS, "received {late} ms after runAt");
    let scheduled_for = call.body["scheduledFor"].as_str().context("scheduledFor")?;
    ensure!(call.headers.get("idempotency-key") == Some(&format!("{once}:{scheduled_for}")), "{:?}", call.headers);
    ensure!(call.headers.get("x-raftbox-job-id") == Some(&once), "job id header");
    ensure!(
        call.headers.contains_key("x-raftbox-fence-token") && call.headers.contains_key("x-raftbox-run-id"),
        "headers"
    );
    ensure!(call.body["payload"] == json!({ "n": 1 }) && call.body["attempt"] == 1, "body {}", call.body);
    // Signed: the reference library verifies it with the owner's secret, and not a changed body.
    let secret = api.secret(false).await?;
    ensure!(call.headers.get("webhook-id") == Some(&format!("{once}:{scheduled_for}")), "{:?}", call.headers);
    ensure!(reference_verifies(&secret, call)?, "the reference library refused the signature: {:?}", call.headers);
    let mut forged = call.clone();
    forged.raw.extend_from_slice(b" ");
    ensure!(!reference_verifies(&secret, &forged)?, "a changed body verified");
    eprintln!("the one-off webhook's signature verifies with the standardwebhooks library");
    let runs = api.runs(&once).await?;
    ensure!(runs[0]["result"] == json!({ "httpStatus": 200, "excerpt": "effect applied" }), "run {}", runs[0]);
    for field in ["ownerId", "scheduleKind", "createdAt", "updatedAt"] {
        ensure!(!api.job(&once).await?[field].is_null(), "job field {field}");
    }

    // Failing target: 1 + maxRetries attempts, then FAILED.
    receiver.fail("broken");
    let failing = api
        .create(json!({ "type": "webhook", "target": receiver.url("broken"), "payload": {},
                        "schedule": { "runAt": rfc3339(now_ms()) }, "maxRetries": 2, "retryBackoffMs": 100 }))
        .await?;
    api.wait_status(&failing, "FAILED").await?;
    ensure!(receiver.calls("broken").len() == 3, "{} calls to the failing target", receiver.calls("broken").len());
    let runs = api.runs(&failing).await?;
    ensure!(runs.len() == 3, "three runs recorded");
    let failed = json!({ "httpStatus": 500, "excerpt": "receiver: failing on purpose" });
    ensure!(runs.iter().all(|r| r["result"] == failed && r["status"] == "FAILED"), "runs {runs:?}");
    eprintln!("failing target: 3 attempts, then FAILED");

    // Cron: fires every second; cancelled, it stops.
    let cron = api
        .create(json!({ "type": "webhook", "target": receiver.url("cron"), "payload": {},
                        "schedule": { "cron": "* * * * * *", "timezone": "Europe/Berlin" }, "maxRetries": 0 }))
        .await?;
    let wait = Deadline::after(Duration::from_secs(20), "three cron fires");
    while receiver.calls("cron").len() < 3 {
        wait.tick(&format!("{} fires", receiver.calls("cron").len())).await?;
    }
    let response = http.delete(format!("{}/v1/jobs/{cron}", api.url)).bearer_auth(&api.token).send().await?;
    ensure!(response.status().as_u16() == 200, "cancel: {}", response.status());
    let at_cancel = receiver.calls("cron").len();
    // At most an attempt already claimed may still call; then nothing for a few periods.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let after = receiver.calls("cron").len();
    ensure!(after <= at_cancel + 1, "cancelled cron job fired {} more times", after - at_cancel);
    ensure!(api.job(&cron).await?["status"] == "CANCELLED", "cancelled");
    eprintln!("cron job fired {at_cancel} times, then stopped when cancelled");

    // Paused, a cron job fires no more (at most an attempt already claimed); `:run` is
    // refused while paused; resumed, it fires again.
    let paused = api
        .create(json!({ "type": "webhook", "target": receiver.url("paused"), "payload": {},
                        "schedule": { "cron": "* * * * * *", "timezone": "UTC" }, "maxRetries": 0 }))
        .await?;
    let wait = Deadline::after(Duration::from_secs(20), "two fires before the pause");
    while receiver.calls("paused").len() < 2 {
        wait.tick(&format!("{} fires", receiver.calls("paused").len())).await?;
    }
    let (status, job) = api.method(&paused, "pause").await?;
    ensure!(status == 200 && job["paused"] == true, "pause: {status} {job}");
    let at_pause = receiver.calls("paused").len();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let after = receiver.calls("paused").len();
    ensure!(after <= at_pause + 1, "a paused cron job fired {} more times", after - at_pause);
    let (status, refused) = api.method(&paused, "run").await?;
    ensure!(
        status == 409 && refused["detail"].as_str().is_some_and(|d| d.contains("paused")),
        "run while paused: {status} {refused}"
    );
    let (status, job) = api.method(&paused, "resume").await?;
    ensure!(status == 200 && job["paused"] == false, "resume: {status} {job}");
    let wait = Deadline::after(Duration::from_secs(20), "fires after the resume");
    while receiver.calls("paused").len() < after + 2 {
        wait.tick(&format!("{} fires", receiver.calls("paused").len())).await?;
    }
    let (status, _) = api.method(&paused, "stop").await?;
    ensure!(status == 404, "an unknown job method: {status}");
    eprintln!("paused cron job: {at_pause} fires, {} while paused, fired again once resumed", after - at_pause);

    // Rotated: the calls carry a signature by each secret until the old one's time is up.
    let rotated = api.secret(true).await?;
    ensure!(rotated != secret, "the rotation kept the secret");

    // Run now: a one-off job due in an hour fires once now, fenced and recorded, and is
    // still due at its time.
    let run_at = rfc3339(now_ms() + 3_600_000);
    let later = api
        .create(json!({ "type": "webhook", "target": receiver.url("now"), "payload": {},
                        "schedule": { "runAt": run_at }, "maxRetries": 0 }))
        .await?;
    let (status, job) = api.method(&later, "run").await?;
    ensure!(status == 200, "run now: {status} {job}");
    let wait = Deadline::after(Duration::from_secs(20), "the fire run now, recorded");
    loop {
        let runs = api.runs(&later).await?;
        if runs.first().is_some_and(|r| r["status"] == "SUCCEEDED") {
            ensure!(runs.len() == 1 && runs[0]["fenceToken"] == 1, "runs {runs:?}");
            break;
        }
        wait.tick(&format!("{runs:?}")).await?;
    }
    let calls = receiver.calls("now");
    ensure!(calls.len() == 1, "{} calls for one run now", calls.len());
    for key in [&rotated, &secret] {
        ensure!(
            reference_verifies(key, &calls[0])?,
            "after the rotation, a secret does not verify: {:?}",
            calls[0].headers
        );
    }
    ensure!(!reference_verifies(&stranger_secret(), &calls[0])?, "a stranger's secret verified");
    let job = api.job(&later).await?;
    ensure!(job["status"] == "SCHEDULED" && job["nextRunAt"] == json!(run_at), "after the run now: {job}");

    // kill -9 of the worker mid-webhook: re-claimed after the lease, the effect applied once.
    receiver.delay("slow", 4_000);
    let slow = api
        .create(json!({ "type": "webhook", "target": receiver.url("slow"), "payload": {},
                        "schedule": { "runAt": rfc3339(now_ms()) }, "maxRetries": 3, "timeoutSeconds": 10 }))
        .await?;
    let wait = Deadline::after(Duration::from_secs(20), "the slow webhook is called");
    while receiver.calls("slow").is_empty() {
        wait.tick("not called yet").await?;
    }
    let holder = api.job(&slow).await?["leaseOwner"].as_str().context("lease owner")?.to_owned();
    let victim: u64 = holder.trim_start_matches("node").split('-').next().context("node id")?.parse()?;
    cluster.kill9(victim)?;
    let survivor = cluster.live_ids()[0];
    let api = Api { url: cluster.http_url(survivor), ..api };
    api.wait_status(&slow, "SUCCEEDED").await?;
    let calls = receiver.calls("slow");
    let keys: Vec<&String> = calls.iter().filter_map(|c| c.headers.get("idempotency-key")).collect();
    ensure!(calls.len() >= 2 && keys.iter().all(|k| *k == keys[0]), "calls {}, keys {keys:?}", calls.len());
    let fences: Vec<&String> = calls.iter().filter_map(|c| c.headers.get("x-raftbox-fence-token")).collect();
    ensure!(fences.first() < fences.last(), "the re-claim carries a higher fence: {fences:?}");
    ensure!(receiver.effects().get(keys[0]) == Some(&1), "the effect is applied once");
    eprintln!("worker node {victim} killed mid-webhook: re-claimed, {} calls, one effect", calls.len());

    // With maxRetries 0 the killed attempt was the only one: the job is never run twice.
    cluster.start_node(victim)?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    receiver.delay("once-only", 4_000);
    let once_only = api
        .create(json!({ "type": "webhook", "target": receiver.url("once-only"), "payload": {},
                        "schedule": { "runAt": rfc3339(now_ms()) }, "maxRetries": 0, "timeoutSeconds": 10 }))
        .await?;
    let wait = Deadline::after(Duration::from_secs(20), "the once-only webhook is called");
    while receiver.calls("once-only").is_empty() {
        wait.tick("not called yet").await?;
    }
    let holder = api.job(&once_only).await?["leaseOwner"].as_str().context("lease owner")?.to_owned();
    let victim: u64 = holder.trim_start_matches("node").split('-').next().context("node id")?.parse()?;
    cluster.kill9(victim)?;
    let survivor = cluster.live_ids()[0];
    let api = Api { url: cluster.http_url(survivor), ..api };
    let job = api.wait_status(&once_only, "FAILED").await?;
    ensure!(
        receiver.calls("once-only").len() == 1,
        "a maxRetries 0 job ran {} times",
        receiver.calls("once-only").len()
    );
    let runs = api.runs(&once_only).await?;
    ensure!(runs.len() == 1 && runs[0]["status"] == "TIMED_OUT", "runs {runs:?}, job {job}");
    eprintln!("maxRetries 0, worker killed: one call, the run TIMED_OUT, the job FAILED");
    Ok(())
}
