//! Regression tests of issue 8 at the HTTP API ("no request can hurt the cluster"), each
//! named after the defect it pins down.

use std::time::{Duration, Instant};

use axum::routing::get;
use raftbox_api::ratelimit::{Failure, RateLimit, Scope};
use raftbox_api::{ApiConfig, HttpConfig};
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::ratelimit::Algorithm;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

async fn user_token(node: &TestNode, name: &str) -> String {
    let user = node.create_user(name).await;
    node.create_token(user["userId"].as_str().expect("id")).await
}

async fn upload(node: &TestNode, token: &str, content: &str) -> String {
    let hash = BlockHash::of(content.as_bytes()).to_hex();
    let (status, _, body) = node.call("PUT", &format!("/v1/blocks/{hash}"), Some(token), Some(content)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    hash
}

fn commit(path: &str, chunks: &[&str], base: u64) -> String {
    json!({ "path": path, "chunks": chunks, "baseVersion": base, "size": 1, "mtime": 0 }).to_string()
}

async fn commit_as(node: &TestNode, token: &str, device: &str, body: &str) -> (StatusCode, Value) {
    let (status, _, value) =
        node.call_with("POST", "/v1/files/commit", Some(token), Some(body), &[("x-device-id", device)]).await;
    (status, value)
}

#[tokio::test]
async fn a_conflicted_copy_of_a_long_name_is_kept_and_the_node_keeps_committing() {
    let node = TestNode::start().await;
    let me = user_token(&node, "poison").await;
    let (a, b) = (upload(&node, &me, "one").await, upload(&node, &me, "two").await);
    let path = format!("/{}.txt", "x".repeat(232));
    assert_eq!(commit_as(&node, &me, "laptop", &commit(&path, &[&a], 0)).await.0, StatusCode::CREATED);
    let (status, conflict) = commit_as(&node, &me, "phone", &commit(&path, &[&b], 0)).await;
    assert_problem(status, &conflict, StatusCode::CONFLICT, "conflict");
    let copy = conflict["conflictedCopy"]["path"].as_str().expect("copy path");
    assert!(copy.ends_with("(conflicted copy, phone).txt") && copy.len() <= 256, "{copy}");
    // The retry of that conflicting commit gets the same answer, and makes no second copy.
    let (status, again) = commit_as(&node, &me, "phone", &commit(&path, &[&b], 0)).await;
    assert_eq!((status, &again["conflictedCopy"]), (StatusCode::CONFLICT, &conflict["conflictedCopy"]));
    let (_, _, listing) = node.call("GET", "/v1/files/list?path=/", Some(&me), None).await;
    assert_eq!(listing["entries"].as_array().map(Vec::len), Some(2), "{listing}");
    // And the node still commits.
    assert_eq!(commit_as(&node, &me, "laptop", &commit("/after", &[&a], 0)).await.0, StatusCode::CREATED);
}

#[tokio::test]
async fn a_token_name_with_slashes_names_a_valid_copy() {
    let node = TestNode::start().await;
    let user = node.create_user("slashes").await;
    let path = format!("/v1/admin/users/{}/tokens", user["userId"].as_str().expect("id"));
    let (status, _, created) = node.call("POST", &path, Some(ADMIN_TOKEN), Some(r#"{"name":"a//b"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let me = created["token"].as_str().expect("token").to_string();
    let (a, b) = (upload(&node, &me, "x1").await, upload(&node, &me, "x2").await);
    let body = commit("/f.txt", &[&a], 0);
    assert_eq!(node.call("POST", "/v1/files/commit", Some(&me), Some(&body)).await.0, StatusCode::CREATED);
    // No X-Device-Id: the token's name names the device.
    let (status, _, conflict) =
        node.call("POST", "/v1/files/commit", Some(&me), Some(&commit("/f.txt", &[&b], 0))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(conflict["conflictedCopy"]["path"], "/f (conflicted copy, a__b).txt");
}

#[tokio::test]
async fn an_idempotency_key_is_scoped_to_the_concrete_path() {
    let node = TestNode::start().await;
    let (alice, bob) = (node.create_user("ka").await, node.create_user("kb").await);
    let mut tokens = Vec::new();
    for user in [&alice, &bob] {
        let path = format!("/v1/admin/users/{}/tokens", user["userId"].as_str().expect("id"));
        let key = [("idempotency-key", "same-key")];
        let (status, _, created) =
            node.call_with("POST", &path, Some(ADMIN_TOKEN), Some(r#"{"name":"t"}"#), &key).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        tokens.push(created["token"].as_str().expect("token").to_string());
    }
    assert_ne!(tokens[0], tokens[1], "B's token request must not replay A's token");
    let (_, _, me) = node.call("GET", "/v1/me", Some(&tokens[1]), None).await;
    assert_eq!(me["userId"], bob["userId"]);
}

#[tokio::test]
async fn missing_chunks_are_not_saved_under_the_key() {
    let node = TestNode::start().await;
    let me = user_token(&node, "cure").await;
    let hash = BlockHash::of(b"late").to_hex();
    let body = commit("/late", &[&hash], 0);
    let key = [("idempotency-key", "commit-1")];
    let (status, _, problem) = node.call_with("POST", "/v1/files/commit", Some(&me), Some(&body), &key).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "missing-chunks");
    upload(&node, &me, "late").await;
    let (status, headers, created) = node.call_with("POST", "/v1/files/commit", Some(&me), Some(&body), &key).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(headers.get("idempotent-replayed").is_none(), "the retry ran");
}

#[tokio::test]
async fn mtime_is_an_rfc3339_timestamp_or_milliseconds_and_comes_back_in_one_form() {
    let node = TestNode::start().await;
    let me = user_token(&node, "times").await;
    let a = upload(&node, &me, "t").await;
    for (path, mtime) in [("/rfc", json!("2026-11-22T10:00:00.250+01:00")), ("/ms", json!(1_795_338_000_250u64))] {
        let body = json!({ "path": path, "chunks": [a], "baseVersion": 0, "size": 1, "mtime": mtime }).to_string();
        let (status, _, created) = node.call("POST", "/v1/files/commit", Some(&me), Some(&body)).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let (_, _, file) = node.call("GET", &format!("/v1/files?path={path}"), Some(&me), None).await;
        assert_eq!(file["mtime"], "2026-11-22T09:00:00.250Z", "{path}");
    }
    for bad in [json!("yesterday"), json!(-1), json!(true)] {
        let body = json!({ "path": "/bad", "chunks": [a], "baseVersion": 0, "size": 1, "mtime": bad }).to_string();
        let (status, _, problem) = node.call("POST", "/v1/files/commit", Some(&me), Some(&body)).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
}

#[tokio::test]
async fn a_job_shows_the_spec_fields_and_a_partial_schedule_patch_merges() {
    let node = TestNode::start().await;
    let me = user_token(&node, "jobs").await;
    // Standard numbering: 0 is Sunday (refused before), 1-5 Monday to Friday.
    let body = json!({ "type": "noop", "payload": {}, "maxRetries": 0,
        "schedule": { "cron": "0 9 * * 0", "timezone": "America/New_York" } })
    .to_string();
    let (status, _, created) = node.call("POST", "/v1/jobs", Some(&me), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["jobId"].as_str().expect("id");
    let (_, _, job) = node.call("GET", &format!("/v1/jobs/{id}"), Some(&me), None).await;
    for field in ["ownerId", "tenantId", "scheduleKind", "cronExpr", "timezone", "createdAt", "updatedAt", "nextRunAt"]
    {
        assert!(job.get(field).is_some_and(|v| !v.is_null()), "{field} missing: {job}");
    }
    assert_eq!((job["scheduleKind"].as_str(), job["cronExpr"].as_str()), (Some("CRON"), Some("0 9 * * 0")));
    let patch = json!({ "schedule": { "timezone": "Europe/Berlin" } }).to_string();
    let (status, _, patched) = node.call("PATCH", &format!("/v1/jobs/{id}"), Some(&me), Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["schedule"], json!({ "cron": "0 9 * * 0", "timezone": "Europe/Berlin" }));
    // Naming the other kind replaces the schedule.
    let patch = json!({ "schedule": { "runAt": "2099-01-01T00:00:00Z" } }).to_string();
    let (_, _, once) = node.call("PATCH", &format!("/v1/jobs/{id}"), Some(&me), Some(&patch)).await;
    assert_eq!((once["scheduleKind"].as_str(), once["cronExpr"].as_str()), (Some("ONCE"), Some("")));
}

#[tokio::test]
async fn a_leaky_bucket_queues_requests_and_lets_them_leave_at_the_drain_rate() {
    let limit = RateLimit {
        name: "queue".into(),
        scope: Scope::Global,
        routes: vec!["/v1/me".into()],
        exclude: Vec::new(),
        algorithm: Algorithm::LeakyBucket { capacity: 3, drain_per_s: 5 },
        failure: Failure::Closed,
    };
    let node =
        TestNode::start_with(ApiConfig { rate_limits: vec![limit], ..ApiConfig::default() }, Default::default()).await;
    let me = user_token(&node, "leaky").await;
    let started = Instant::now();
    let calls = (0..4).map(|_| async { (node.call("GET", "/v1/me", Some(&me), None).await.0, started.elapsed()) });
    let mut answers = futures_util::future::join_all(calls).await;
    answers.sort_by_key(|(_, at)| *at);
    let statuses: Vec<StatusCode> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 3, "{answers:?}");
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(), 1, "{answers:?}");
    // No burst: the third admitted request left two drain intervals (2 × 200 ms) after the first.
    let admitted: Vec<Duration> = answers.iter().filter(|(s, _)| *s == StatusCode::OK).map(|(_, at)| *at).collect();
    assert!(admitted[2] >= Duration::from_millis(380), "{answers:?}");
}

#[tokio::test]
async fn every_route_answers_within_the_request_timeout() {
    let hang = axum::Router::new().route(
        "/test/hang",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            "never"
        }),
    );
    let config =
        ApiConfig { http: HttpConfig { request_timeout_ms: 1_000, ..HttpConfig::default() }, ..ApiConfig::default() };
    let node = TestNode::start_with(config, hang).await;
    let started = Instant::now();
    let (status, headers, problem) = node.call("GET", "/test/hang", None, None).await;
    assert_problem(status, &problem, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert!(headers.get("retry-after").is_some());
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_request_beyond_the_in_flight_cap_is_answered_503_at_once() {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let entered = std::sync::Mutex::new(Some(entered_tx));
    let entered = std::sync::Arc::new(entered);
    let hang = axum::Router::new().route(
        "/test/hold",
        get(move || {
            let entered = entered.clone();
            async move {
                if let Some(tx) = entered.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                "never"
            }
        }),
    );
    let http = HttpConfig { requests_in_flight_max: 1, ..HttpConfig::default() };
    let config = ApiConfig { http, ..ApiConfig::default() };
    let node = std::sync::Arc::new(TestNode::start_with(config, hang).await);
    let holder = node.clone();
    let held = tokio::spawn(async move { holder.call("GET", "/test/hold", None, None).await });
    tokio::time::timeout(Duration::from_secs(10), entered_rx).await.expect("the first request runs").expect("sent");
    let started = Instant::now();
    let (status, headers, problem) = node.call("GET", "/v1/me", None, None).await;
    assert_problem(status, &problem, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert!(headers.get("retry-after").is_some());
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    // The probes stay outside the cap.
    assert_eq!(node.call("GET", "/healthz", None, None).await.0, StatusCode::OK);
    held.abort();
}

/// Every byte under `dir`, file by file.
fn contains_bytes(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).expect("read dir").map(|e| e.expect("entry").path()));
        } else if let Ok(bytes) = std::fs::read(&path) {
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_token_never_reaches_the_log_or_the_state_and_a_replay_does_not_show_it() {
    let node = TestNode::start().await;
    let user = node.create_user("tess").await;
    let path = format!("/v1/admin/users/{}/tokens", user["userId"].as_str().expect("userId"));
    let body = r#"{"name":"laptop"}"#;
    let key = [("idempotency-key", "token-once")];
    let (status, _, first) = node.call_with("POST", &path, Some(ADMIN_TOKEN), Some(body), &key).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let token = first["token"].as_str().expect("the first answer shows the token").to_owned();
    let (status, _, replay) = node.call_with("POST", &path, Some(ADMIN_TOKEN), Some(body), &key).await;
    assert_eq!(status, StatusCode::CREATED, "{replay}");
    assert_eq!(replay["tokenId"], first["tokenId"]);
    assert!(replay.get("token").is_none(), "a replay shows the token: {replay}");
    assert_eq!(replay["tokenShownOnce"], true);
    // The token works, and its plaintext is nowhere on disk (log, state, WAL).
    assert_eq!(node.call("GET", "/v1/me", Some(&token), None).await.0, StatusCode::OK);
    let found = contains_bytes(node.data_dir(), token.as_bytes());
    assert!(found.is_empty(), "the token's plaintext is stored in {found:?}");
}

#[tokio::test]
async fn tokens_are_listed_revoked_and_expire() {
    let node = TestNode::start().await;
    let user = node.create_user("tomo").await;
    let base = format!("/v1/admin/users/{}/tokens", user["userId"].as_str().expect("userId"));
    let (status, _, long) = node.call("POST", &base, Some(ADMIN_TOKEN), Some(r#"{"name":"laptop"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{long}");
    let (status, _, short) =
        node.call("POST", &base, Some(ADMIN_TOKEN), Some(r#"{"name":"phone","expiresInS":1}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{short}");
    for bad in [r#"{"name":"x","expiresInS":0}"#, r#"{"name":"x","expiresInS":999999999999}"#] {
        let (status, _, problem) = node.call("POST", &base, Some(ADMIN_TOKEN), Some(bad)).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
    let (status, _, listed) = node.call("GET", &base, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let names: Vec<&str> =
        listed["tokens"].as_array().expect("tokens").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{listed}");
    assert!(!listed.to_string().contains(long["token"].as_str().expect("token")), "a listing shows a secret");
    assert!(listed["tokens"].as_array().expect("tokens").iter().any(|t| t["expiresAt"].is_string()));
    // A user cannot list or revoke.
    let (status, _, _) = node.call("GET", &base, long["token"].as_str(), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Revoked: 401 at once; revoking again is 404.
    let long_path = format!("{base}/{}", long["tokenId"].as_str().expect("tokenId"));
    assert_eq!(node.call("GET", "/v1/me", long["token"].as_str(), None).await.0, StatusCode::OK);
    let (status, _, revoked) = node.call("DELETE", &long_path, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(node.call("GET", "/v1/me", long["token"].as_str(), None).await.0, StatusCode::UNAUTHORIZED);
    let (status, _, problem) = node.call("DELETE", &long_path, Some(ADMIN_TOKEN), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");

    // Expired: works, then 401 once its second is over.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = node.call("GET", "/v1/me", short["token"].as_str(), None).await.0;
    assert_eq!(last, StatusCode::OK, "a fresh token works");
    while last != StatusCode::UNAUTHORIZED && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = node.call("GET", "/v1/me", short["token"].as_str(), None).await.0;
    }
    assert_eq!(last, StatusCode::UNAUTHORIZED, "an expired token still works");
}

#[tokio::test]
async fn the_frameworks_own_rejections_are_problems_too() {
    let node = TestNode::start().await;
    let me = node.create_token(node.create_user("rita").await["userId"].as_str().expect("userId")).await;
    let cases = [
        ("PUT", "/v1/files/commit", StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
        ("DELETE", "/v1/me", StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
        ("GET", "/v1/files/list?limit=many", StatusCode::BAD_REQUEST, "bad-request"),
        ("GET", "/v1/sync?cursor=%2B1", StatusCode::BAD_REQUEST, "bad-request"),
        // In the cursor's alphabet, but no cursor the server made: sync again from 0.
        ("GET", "/v1/sync?cursor=-1", StatusCode::GONE, "cursor-reset"),
        ("GET", "/v1/no/such/route", StatusCode::NOT_FOUND, "not-found"),
    ];
    for (method, path, status, slug) in cases {
        let (got, headers, problem) = node.call(method, path, Some(&me), None).await;
        assert_problem(got, &problem, status, slug);
        let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert_eq!(content_type, "application/problem+json", "{method} {path}");
        if status == StatusCode::METHOD_NOT_ALLOWED {
            assert!(headers.get("allow").is_some(), "{method} {path}: no Allow header");
        }
    }
}

#[tokio::test]
async fn notification_channels_are_limited_per_user_and_per_node() {
    let limits = raftbox_api::NotifyLimits { per_principal_max: 1, per_node_max: 2 };
    let node = std::sync::Arc::new(
        TestNode::start_with(ApiConfig { notify_limits: limits, ..ApiConfig::default() }, axum::Router::new()).await,
    );
    let mut users = Vec::new();
    for name in ["nia", "noa", "nel"] {
        let token = node.create_token(node.create_user(name).await["userId"].as_str().expect("userId")).await;
        let cursor = node.call("GET", "/v1/sync?cursor=0", Some(&token), None).await.2["cursor"]
            .as_str()
            .expect("cursor")
            .to_owned();
        users.push((token, cursor));
    }
    let notify = |(token, cursor): &(String, String), timeout: u64| {
        let (node, token, path) =
            (node.clone(), token.clone(), format!("/v1/notify?cursor={cursor}&timeout={timeout}"));
        tokio::spawn(async move { node.call("GET", &path, Some(&token), None).await })
    };
    // One open poll for the first user, one for the second: the node is full.
    let first = notify(&users[0], 4);
    let second = notify(&users[1], 4);
    let deadline = Instant::now() + Duration::from_secs(3);
    let refused = loop {
        let mine = notify(&users[0], 1).await.expect("poll");
        let third = notify(&users[2], 1).await.expect("poll");
        if mine.0 == StatusCode::TOO_MANY_REQUESTS && third.0 == StatusCode::TOO_MANY_REQUESTS {
            break [mine.2, third.2];
        }
        // The two polls need a moment to open.
        assert!(Instant::now() < deadline, "not refused: {} {}, {} {}", mine.0, mine.2, third.0, third.2);
    };
    assert_eq!(refused[0]["type"], "too-many-channels", "{}", refused[0]);
    assert!(refused[0]["detail"].as_str().unwrap_or_default().contains("you have 1"), "{}", refused[0]);
    assert!(refused[1]["detail"].as_str().unwrap_or_default().contains("this node"), "{}", refused[1]);
    // Closed channels free their places.
    for open in [first, second] {
        assert_eq!(open.await.expect("poll").0, StatusCode::OK);
    }
    assert_eq!(notify(&users[2], 1).await.expect("poll").0, StatusCode::OK);
}

#[tokio::test]
async fn a_user_lists_and_revokes_their_own_tokens_only() {
    let node = TestNode::start().await;
    let ann = node.create_user("own-ann").await["userId"].as_str().expect("userId").to_owned();
    let bob = node.create_user("own-bob").await["userId"].as_str().expect("userId").to_owned();
    let (ann_laptop, ann_phone, bob_token) =
        (node.create_token(&ann).await, node.create_token(&ann).await, node.create_token(&bob).await);
    let (status, _, mine) = node.call("GET", "/v1/me/tokens", Some(&ann_laptop), None).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    let ids: Vec<String> = mine["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t["tokenId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 2, "{mine}");
    // Bob cannot revoke Ann's token: it is not his (404), and it keeps working.
    let (status, _, problem) = node.call("DELETE", &format!("/v1/me/tokens/{}", ids[0]), Some(&bob_token), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
    // Ann revokes both of hers, the one she calls with last.
    let (_, _, phone_me) = node.call("GET", "/v1/me", Some(&ann_phone), None).await;
    assert_eq!(phone_me["userId"], ann);
    for id in &ids {
        let (status, _, answer) = node.call("DELETE", &format!("/v1/me/tokens/{id}"), Some(&ann_laptop), None).await;
        if status == StatusCode::UNAUTHORIZED {
            // The laptop token itself went first: revoke the other with the phone's.
            let (status, _, answer) = node.call("DELETE", &format!("/v1/me/tokens/{id}"), Some(&ann_phone), None).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
        } else {
            assert_eq!(status, StatusCode::OK, "{answer}");
        }
    }
    for token in [&ann_laptop, &ann_phone] {
        assert_eq!(node.call("GET", "/v1/me", Some(token), None).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(node.call("GET", "/v1/me", Some(&bob_token), None).await.0, StatusCode::OK);
}
