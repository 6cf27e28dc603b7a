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

// ---------------------------------------------------------------------------------------
// 64 notification sockets of a user who owns 2,000 folders, while that user commits into
// them: what an applied entry costs a socket does not grow with its caller's folders. Then
// the user's token is revoked: every socket, on every node, closes within a second.

cluster_test!(sockets_over_thousands_of_folders_cost_no_bystander_and_close_on_revocation, many_folder_sockets);

/// Folders the attacker makes, and sockets it opens (the default per-user channel limit).
const ATTACKER_FOLDERS: usize = 2_000;
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
    // is measured (reading 2,000 folders per socket per entry would be 13 million reads a
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
