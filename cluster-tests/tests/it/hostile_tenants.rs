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
            (reqwest::Method::POST, "/v1/namespaces/x/accept".into(), json!({ "groupName": value })),
            (reqwest::Method::POST, "/v1/namespaces/x/decline".into(), json!({ "groupName": value })),
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

// ---------------------------------------------------------------------------------------
// 64 notification sockets of a user who owns 1,000 folders, while that user commits into
// them: what an applied entry costs a socket does not grow with its caller's folders. Then
// the user's token is revoked: every socket, on every node, closes within a second.

cluster_test!(sockets_over_thousands_of_folders_cost_no_bystander_and_close_on_revocation, many_folder_sockets);

/// Folders the attacker makes (the most `[quotas] folders_per_user` allows by default), and
/// sockets it opens (the default per-user channel limit).
const ATTACKER_FOLDERS: usize = 1_000;
const ATTACKER_SOCKETS: usize = 64;

async fn many_folder_sockets(cluster: &Cluster) -> Result<()> {
    use futures_util::StreamExt as _;
    use raftbox_cluster_tests::{commit_in, create_folder, in_lanes, put_block};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    use tokio_tungstenite::tungstenite::Message;

    let (http, urls) = (cluster.client(), cluster.http_urls(&[1, 2, 3]));
    let (_, token) = new_user(cluster, 1, "folder-hoarder", "laptop").await?;
    let names: Vec<usize> = (0..ATTACKER_FOLDERS).collect();
    let folders = {
        let (http, url, token) = (http.clone(), urls[0].clone(), token.clone());
        in_lanes(names, 16, move |i| {
            let (http, url, token) = (http.clone(), url.clone(), token.clone());
            async move {
                let created = create_folder(&http, &url, &token, &format!("hoard {i}")).await?;
                let id = created.body().and_then(|b| b["namespaceId"].as_str()).map(str::to_owned);
                id.with_context(|| format!("folder {i}: {created:?}"))
            }
        })
        .await?
    };
    // The sockets, spread over the three nodes; each is read to its end, and reports how
    // (close code and when).
    let mut sockets = Vec::new();
    for i in 0..ATTACKER_SOCKETS {
        let url = format!("{}/v1/notify/ws", urls[i % urls.len()].replacen("http", "ws", 1));
        let mut request = url.into_client_request()?;
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse()?);
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.context("connect a socket")?;
        sockets.push(tokio::spawn(async move {
            let mut heard = 0usize;
            while let Some(message) = socket.next().await {
                match message {
                    Ok(Message::Close(frame)) => {
                        let code = frame.map(|f| u16::from(f.code));
                        return (heard, code, std::time::Instant::now());
                    }
                    Ok(_) => heard += 1,
                    Err(_) => break,
                }
            }
            (heard, None, std::time::Instant::now())
        }));
    }

    let bystander = Bystander::start(cluster, 3).await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let block = put_block(&http, &urls[0], &token, b"a hoarded file").await?;
    let started = std::time::Instant::now();
    let mut commits = 0usize;
    // 100 commits a second, each heard by 64 sockets: the cost of a socket per entry is what
    // is measured (reading 1,000 folders per socket per entry would be 6.4 million reads a
    // second), not the attacker's own commits.
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    while started.elapsed() < Duration::from_secs(6) {
        pace.tick().await;
        let folder = &folders[commits % folders.len()];
        let path = format!("/f{commits}.txt");
        let done = commit_in(&http, &urls[commits % 2], &token, "hoarder", folder, &path, &[block.clone()], 0).await?;
        ensure!(done.is_ok(), "the attacker's commit {commits}: {done:?}");
        commits += 1;
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;

    // Revoked: every socket closes with 1008 within a second (on the nodes that applied the
    // revocation; each applies it within a heartbeat).
    let listed = http.get(format!("{}/v1/me/tokens", urls[0])).bearer_auth(&token).send().await?;
    let listed: Value = listed.json().await?;
    let token_id = listed["tokens"][0]["tokenId"].as_str().context("the token's id")?.to_owned();
    let revoked_at = std::time::Instant::now();
    let answer = http.delete(format!("{}/v1/me/tokens/{token_id}", urls[1])).bearer_auth(&token).send().await?;
    ensure!(answer.status().is_success(), "revoke: {}", answer.status());
    let mut heard_total = 0;
    for socket in sockets {
        let (heard, code, at) =
            tokio::time::timeout(Duration::from_secs(5), socket).await.context("a socket stayed open")??;
        heard_total += heard;
        ensure!(code == Some(1008), "a socket closed with {code:?}, not 1008");
        ensure!(at.duration_since(revoked_at) < Duration::from_secs(1), "a socket closed {:?} after", at - revoked_at);
    }
    ensure!(heard_total >= commits, "the sockets heard {heard_total} changes of {commits} commits");
    let attacker = format!(
        "{ATTACKER_SOCKETS} sockets over {ATTACKER_FOLDERS} folders, {commits} commits into them in 6 s \
         ({heard_total} notifications); all closed 1008 on revocation"
    );
    judge("sockets over many folders", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// A stranger shares 1,300 folders with a user: they are invitations (at most 100 pending,
// 409 beyond), the user's namespaces, sync and notifications do not change, and the user's
// cursor does not grow. A user who accepted many folders syncs with the cursor in the body.

/// The stranger may create this many folders here (the default quota is 1,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_sharing_1300_folders_changes_nothing_for_the_victim() {
    let options =
        ClusterOptions { extra_toml: "[quotas]\nfolders_per_user = 2000\n".into(), ..ClusterOptions::default() };
    let cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, unwanted_shares(&cluster)).await;
    cluster.conclude(result);
}

const UNWANTED_FOLDERS: usize = 1_300;

async fn unwanted_shares(cluster: &Cluster) -> Result<()> {
    use raftbox_cluster_tests::{create_folder, grant, in_lanes};

    let (http, url) = (cluster.client(), cluster.http_url(1));
    let (_, attacker) = new_user(cluster, 1, "sharer", "laptop").await?;
    let (victim_id, victim) = new_user(cluster, 1, "victim", "laptop").await?;
    let first: Value = http
        .post(format!("{url}/v1/sync"))
        .bearer_auth(&victim)
        .json(&json!({ "cursor": "0" }))
        .send()
        .await?
        .json()
        .await?;
    let cursor = first["cursor"].as_str().context("a cursor")?.to_owned();
    let bystander = Bystander::start(cluster, 3).await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let outcomes = {
        let (http, url, attacker, victim_id) = (http.clone(), url.clone(), attacker.clone(), victim_id.clone());
        in_lanes((0..UNWANTED_FOLDERS).collect(), 2, move |i| {
            let (http, url, attacker, victim_id) = (http.clone(), url.clone(), attacker.clone(), victim_id.clone());
            async move {
                let created = create_folder(&http, &url, &attacker, &format!("spam {i}")).await?;
                let ns = created.body().and_then(|b| b["namespaceId"].as_str()).context("a folder")?.to_owned();
                let shared = grant(&http, &url, &attacker, &ns, json!({ "userId": victim_id }), "viewer").await?;
                Ok(if shared.is_ok() {
                    "invited"
                } else if shared.is_rejected() {
                    "refused"
                } else {
                    "unknown"
                })
            }
        })
        .await?
    };
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    let invited = outcomes.iter().filter(|o| **o == "invited").count();
    let refused = outcomes.iter().filter(|o| **o == "refused").count();
    ensure!(invited == 100 && refused == UNWANTED_FOLDERS - 100, "{invited} invited, {refused} refused");
    // The victim's view is what it was: one namespace, the same cursor, nothing to sync.
    let namespaces: Value = http.get(format!("{url}/v1/namespaces")).bearer_auth(&victim).send().await?.json().await?;
    ensure!(namespaces["namespaces"].as_array().map(Vec::len) == Some(1), "{namespaces}");
    let page = http.get(format!("{url}/v1/sync?cursor={cursor}")).bearer_auth(&victim).send().await?;
    ensure!(page.status().as_u16() == 200, "GET /v1/sync: {}", page.status());
    let page: Value = page.json().await?;
    ensure!(page["changes"] == json!([]) && page["cursor"] == cursor.as_str(), "{page}");
    let invitations: Value =
        http.get(format!("{url}/v1/me/invitations?limit=1000")).bearer_auth(&victim).send().await?.json().await?;
    ensure!(invitations["invitations"].as_array().map(Vec::len) == Some(100), "{invitations}");
    let attacker_row = format!("{UNWANTED_FOLDERS} folders shared with one user: {invited} invitations, {refused} 409");
    judge("shares nobody asked for", &attacker_row, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// Commits naming 15,000 random chunks each (422, so they can be repeated): the node that
// receives one refuses it from its index before proposing, and apply (had it come to that)
// judges with sets in one pass. Four a second: what is measured is the cluster's work per
// commit (quadratic in apply on every node before, about 100 ms each), not the reading of
// back-to-back 1 MB bodies on two cores shared by three nodes and the test.

cluster_test!(commits_naming_15000_missing_chunks_move_no_term, many_missing_chunks);

async fn many_missing_chunks(cluster: &Cluster) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(2));
    let (_, token) = new_user(cluster, 1, "chunk-namer", "laptop").await?;
    // The bodies are made before the attack: the attacker's own work is not the cluster's.
    let bodies: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            let chunks: Vec<String> =
                (0..15_000).map(|_| blake3::hash(&rand::random::<[u8; 16]>()).to_hex().to_string()).collect();
            let body =
                json!({ "path": format!("/many-{i}"), "chunks": chunks, "baseVersion": 0, "size": 1, "mtime": 0 });
            serde_json::to_vec(&body).expect("a body")
        })
        .collect();
    let bystander = Bystander::start(cluster, 3).await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let mut refused = 0;
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    for body in bodies {
        pace.tick().await;
        let answer = http
            .post(format!("{url}/v1/files/commit"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = answer.status().as_u16();
        let bytes = answer.bytes().await?;
        ensure!(status == 422, "a commit of 15,000 unknown chunks: {status}");
        ensure!(bytes.windows(14).any(|w| w == b"missing-chunks"), "not a missing-chunks problem");
        refused += 1;
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    let attacker = format!("{refused} commits naming 15,000 random chunks each in 5 s, all 422");
    judge("commits naming 15,000 missing chunks", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// One owner's long jobs fill what they may of an executor's slots: another owner's job
// still starts at once (each owner runs in at most a quarter of a node's slots). One node
// with 8 slots and room to hold 32 claimed jobs; the hog may have 24 jobs that may still run.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_long_jobs_leave_slots_for_another() {
    let options = ClusterOptions {
        nodes: 1,
        extra_toml: "[jobs]\nconcurrency = 8\n\n[job_limits]\nactive_jobs_per_owner_max = 24\n".into(),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, fair_slots(&cluster)).await;
    cluster.conclude(result);
}

async fn fair_slots(cluster: &Cluster) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(1));
    let (_, hog) = new_user(cluster, 1, "slot-hog", "laptop").await?;
    let (_, other) = new_user(cluster, 1, "other-owner", "laptop").await?;
    let now = chrono::Utc::now();
    let create = |token: &str, kind: &str, payload: Value| {
        let body = json!({
            "type": kind, "payload": payload, "maxRetries": 0, "timeoutSeconds": 60,
            "schedule": { "runAt": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true) },
        });
        http.post(format!("{url}/v1/jobs")).bearer_auth(token).json(&body).send()
    };
    // 24 jobs of 6 s: three times the node's 8 slots; a 25th is over the hog's quota.
    for _ in 0..24 {
        let answer = create(&hog, "sleep", json!({ "ms": 6_000 })).await?;
        ensure!(answer.status().as_u16() == 201, "a sleep job: {}", answer.status());
    }
    let over = create(&hog, "sleep", json!({ "ms": 6_000 })).await?;
    ensure!(over.status().as_u16() == 409, "a job over the quota: {}", over.status());
    // Give the executors time to claim the hog's jobs (they are due now).
    let running = raftbox_cluster_tests::Deadline::after(Duration::from_secs(10), "the hog's jobs running");
    loop {
        let jobs: Value = http.get(format!("{url}/v1/jobs?limit=100")).bearer_auth(&hog).send().await?.json().await?;
        let busy = jobs["jobs"].as_array().map_or(0, |j| j.iter().filter(|j| j["status"] == "RUNNING").count());
        if busy >= 2 {
            break;
        }
        running.tick(&format!("{busy} running")).await?;
    }
    let asked = std::time::Instant::now();
    let answer = create(&other, "noop", json!({})).await?;
    let job: Value = answer.json().await?;
    let job_id = job["jobId"].as_str().with_context(|| format!("a job: {job}"))?.to_owned();
    let done = raftbox_cluster_tests::Deadline::after(Duration::from_secs(20), "the other owner's job");
    loop {
        let job: Value = http.get(format!("{url}/v1/jobs/{job_id}")).bearer_auth(&other).send().await?.json().await?;
        if job["status"] == "SUCCEEDED" {
            break;
        }
        done.tick(&format!("{job}")).await?;
    }
    let waited = asked.elapsed();
    println!("fair slots: another owner's job done {waited:?} after it was created, 24 jobs of 6 s queued");
    ensure!(waited < Duration::from_secs(3), "the other owner's job waited {waited:?} behind the hog's");
    Ok(())
}
