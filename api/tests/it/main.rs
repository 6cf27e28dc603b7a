//! API tests: a single-node cluster in-process on port 0, driven over real HTTP.

use std::collections::BTreeMap;

mod bad_input;
mod blocks;
mod files;
mod fuzz;
mod fuzz_targets;
mod guards;
mod hostile;
mod jobs;
mod links;
mod login;
mod openapi;
mod regressions;
mod sharing;

use std::sync::Arc;

use raftbox_api::auth::hash_token;
use raftbox_api::{ApiConfig, AppState};
use raftbox_raft::{ClusterSecret, NodeInfo, RaftNode, RaftSettings};
use raftbox_storage::blocks::BlockStore;
use raftbox_storage::{Command, Db, Outcome};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;

pub const ADMIN_TOKEN: &str = "rbx_api_test_admin";

pub struct TestNode {
    url: String,
    client: reqwest::Client,
    /// Every exchange with the node, checked against the OpenAPI description as it happens;
    /// a mismatch fails the test when the node is dropped.
    recorder: openapi::Recorder,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl TestNode {
    /// The node's data directory (RocksDB and blocks).
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    async fn start() -> TestNode {
        TestNode::start_with(ApiConfig::default(), axum::Router::new()).await
    }

    /// A node with this API configuration and extra routes (for mechanisms no real route
    /// exercises yet).
    pub async fn start_with(config: ApiConfig, extra: axum::Router<AppState>) -> TestNode {
        TestNode::start_inner(config, extra, true).await
    }

    /// A node of a three-member cluster whose two peers never answer: it never has a
    /// quorum, so no write (and no limiter decision) can succeed.
    pub async fn start_without_quorum(config: ApiConfig) -> TestNode {
        TestNode::start_inner(config, axum::Router::new(), false).await
    }

    async fn raft(db: Db, blocks: Arc<BlockStore>, url: &str, quorum: bool) -> RaftNode {
        let settings = RaftSettings { write_timeout_ms: 2_000, bootstrap_wait_ms: 0, ..RaftSettings::default() };
        let secret = ClusterSecret::parse("api-tests-cluster-secret").expect("secret");
        let node = RaftNode::start(1, db, blocks, settings, secret).await.expect("start");
        let info = |http: &str, grpc: &str| NodeInfo::new(http, grpc);
        let mut members = BTreeMap::from([(1, info(url, "127.0.0.1:1"))]);
        if quorum {
            node.bootstrap(members).await.expect("bootstrap");
        } else {
            // Port 1 refuses connections: these peers are down for good. The node is handed
            // the three-member configuration but, reaching no member to confirm its clock,
            // does not initialize: it never has a leader.
            let named =
                |http, grpc, incarnation: &str| NodeInfo { incarnation: Some(incarnation.into()), ..info(http, grpc) };
            let own = node.incarnation().to_owned();
            members.insert(1, named(url, "127.0.0.1:1", &own));
            members.insert(2, named("127.0.0.1:1", "127.0.0.1:1", "down-for-good"));
            members.insert(3, named("127.0.0.1:1", "127.0.0.1:1", "down-for-good"));
            let answer = node.initialize_here(members).await;
            assert!(matches!(answer, Err(raftbox_raft::Initialize::NotYet(_))), "{answer:?}");
        }
        if quorum {
            let admin = Command::EnsureAdmin {
                user_id: "admin-id".into(),
                namespace_id: "admin-ns".into(),
                token_id: "admin-token".into(),
                token_hash: hash_token(ADMIN_TOKEN),
            };
            assert!(matches!(node.write(admin).await.expect("ensure admin"), Outcome::AdminReady { .. }));
            // As a node does at start: the baseline format, then the leader raises it to the
            // current one (the node reads it, and is the only member).
            let baseline = Command::Migrate { schema: raftbox_storage::format::BASELINE };
            assert!(matches!(node.write(baseline).await.expect("migrate"), Outcome::Done));
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while node.cluster_format() < raftbox_storage::format::FORMAT {
                assert!(std::time::Instant::now() < until, "the format was not raised within 10 s");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        node
    }

    async fn start_inner(config: ApiConfig, extra: axum::Router<AppState>, quorum: bool) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", http.local_addr().expect("addr"));
        let db = Db::open(&dir.path().join("db")).expect("open db");
        let blocks = Arc::new(BlockStore::open(&dir.path().join("blocks")).expect("open blocks"));
        let node = TestNode::raft(db, blocks, &url, quorum).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = AppState::new(node, config);
        let recorder = openapi::Recorder::new(!extra.has_routes());
        let app = raftbox_api::router_with(extra, state)
            .layer(axum::middleware::from_fn_with_state(recorder.clone(), openapi::record));
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        tokio::spawn(async move {
            let _ = axum::serve(http, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        TestNode { url, client: reqwest::Client::new(), recorder, _dir: dir, _stop: stop }
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.call_with(method, path, token, body, &[]).await
    }

    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.client.request(method, format!("{}{}", self.url, path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        let response = request.send().await.expect("send");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, value)
    }

    /// [`TestNode::call`] from another client address (`127.0.0.N`, all loopback), as the
    /// node's per-address limits see it.
    pub async fn call_from(
        &self,
        from: std::net::IpAddr,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let client = reqwest::Client::builder().local_address(from).build().expect("a client");
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = client.request(method, format!("{}{}", self.url, path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        let response = request.send().await.expect("send");
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.expect("body");
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// A request with a raw body (any bytes, e.g. not UTF-8), as `application/json`.
    pub async fn call_bytes(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.call_typed(method, path, token, "application/json", body).await
    }

    /// A GET with these headers and no token; the answer's body raw.
    pub async fn get_raw(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        self.send_raw("GET", path, None, headers, None).await
    }

    /// A request with a raw body of `content_type`; the answer's body raw.
    pub async fn call_raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        self.send_raw(method, path, token, &[("content-type", content_type)], Some(body)).await
    }

    async fn call_typed(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let (status, headers, raw) = self.call_raw(method, path, token, content_type, body).await;
        let text = String::from_utf8_lossy(&raw).into_owned();
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// One request as given; the answer's body raw.
    async fn send_raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.client.request(method, format!("{}{}", self.url, path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.expect("send");
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, response.bytes().await.expect("body").to_vec())
    }

    pub async fn create_user(&self, name: &str) -> Value {
        let (status, _, body) =
            self.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(&json!({ "name": name }).to_string())).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    pub async fn create_token(&self, user_id: &str) -> String {
        let path = format!("/v1/admin/users/{user_id}/tokens");
        let (status, _, body) = self.call("POST", &path, Some(ADMIN_TOKEN), Some(r#"{"name":"laptop"}"#)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["token"].as_str().expect("token").to_string()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.recorder.assert_clean();
        }
    }
}

pub fn assert_problem(status: StatusCode, body: &Value, expected: StatusCode, slug: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["type"], slug, "{body}");
    assert_eq!(body["status"], expected.as_u16(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
}

#[tokio::test]
async fn user_token_and_me_round_trip() {
    let node = TestNode::start().await;
    let user = node.create_user("alice").await;
    let user_id = user["userId"].as_str().expect("userId");
    assert!(user["namespaceId"].is_string());
    let token = node.create_token(user_id).await;
    assert!(token.starts_with("rbx_"));
    let (status, _, me) = node.call("GET", "/v1/me", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    let quota = raftbox_api::Quotas::default().stored_bytes_per_user;
    let expected = json!({
        "userId": user_id, "name": "alice", "namespaceId": user["namespaceId"], "storedBytes": 0, "quotaBytes": quota,
        "passwordSet": false,
    });
    assert_eq!(me, expected);
    // An upload counts once, however often it is sent.
    for _ in 0..2 {
        let hash = blake3::hash(b"alice's bytes").to_hex().to_string();
        let response = node
            .client
            .put(format!("{}/v1/blocks/{hash}", node.url))
            .bearer_auth(&token)
            .body(&b"alice's bytes"[..])
            .send()
            .await
            .expect("put");
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let (_, _, me) = node.call("GET", "/v1/me", Some(&token), None).await;
    assert_eq!(me["storedBytes"], 13);
    let (status, _, fetched) = node.call("GET", &format!("/v1/admin/users/{user_id}"), Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fetched, json!({ "userId": user_id, "name": "alice", "namespaceId": user["namespaceId"] }));
}

#[tokio::test]
async fn authentication_errors_are_401_with_challenge() {
    let node = TestNode::start().await;
    for token in [None, Some("rbx_not_a_token"), Some("")] {
        let (status, headers, body) = node.call("GET", "/v1/me", token, None).await;
        assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");
        assert_eq!(headers.get("www-authenticate").map(|v| v.to_str().expect("ascii")), Some("Bearer"));
        assert_eq!(headers.get("content-type").map(|v| v.to_str().expect("ascii")), Some("application/problem+json"));
    }
}

#[tokio::test]
async fn admin_calls_need_the_admin_token() {
    let node = TestNode::start().await;
    let user = node.create_user("bob").await;
    let token = node.create_token(user["userId"].as_str().expect("id")).await;
    let (status, _, body) = node.call("POST", "/v1/admin/users", Some(&token), Some(r#"{"name":"eve"}"#)).await;
    assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, _, body) = node.call("POST", "/v1/admin/users", None, Some(r#"{"name":"eve"}"#)).await;
    assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");
}

#[tokio::test]
async fn bad_requests_change_nothing() {
    let node = TestNode::start().await;
    let long = "x".repeat(65);
    let cases = [
        ("not json", StatusCode::BAD_REQUEST, "bad-request"),
        (r#"{"name": 5}"#, StatusCode::BAD_REQUEST, "bad-request"),
        (r#"{"name": ""}"#, StatusCode::BAD_REQUEST, "bad-request"),
        (r#"{"name": "a\u0001b"}"#, StatusCode::BAD_REQUEST, "bad-request"),
        (r#"{"name": "ok", "extra": 1}"#, StatusCode::BAD_REQUEST, "bad-request"),
    ];
    for (body, expected, slug) in cases {
        let (status, _, problem) = node.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(body)).await;
        assert_problem(status, &problem, expected, slug);
    }
    let (status, _, problem) =
        node.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(&json!({ "name": long }).to_string())).await;
    assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    // Nothing was created: the name "ok" is still free.
    node.create_user("ok").await;
}

#[tokio::test]
async fn conflicts_and_unknown_resources() {
    let node = TestNode::start().await;
    node.create_user("carol").await;
    let (status, _, body) = node.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"carol"}"#)).await;
    assert_problem(status, &body, StatusCode::CONFLICT, "conflict");
    let (status, _, body) =
        node.call("POST", "/v1/admin/users/no-such-user/tokens", Some(ADMIN_TOKEN), Some(r#"{"name":"t"}"#)).await;
    assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
    let (status, _, body) = node.call("GET", "/v1/admin/users/no-such-user", Some(ADMIN_TOKEN), None).await;
    assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
    let (status, _, body) = node.call("GET", "/v1/nothing-here", None, None).await;
    assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
}

#[tokio::test]
async fn console_is_served_without_a_token_under_a_strict_policy() {
    let node = TestNode::start().await;
    for (path, content_type, marker) in [
        ("/", "text/html; charset=utf-8", "<title>raftbox console</title>"),
        ("/console/app.js", "text/javascript; charset=utf-8", "sessionStorage"),
        ("/console/style.css", "text/css; charset=utf-8", "font-family"),
    ] {
        let (status, headers, body) = node.call("GET", path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["content-security-policy"], raftbox_api::headers::CONSOLE_POLICY, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert!(body.as_str().expect("text").contains(marker), "{path}");
    }
    let policy = raftbox_api::headers::CONSOLE_POLICY;
    assert!(policy.contains("default-src 'none'") && policy.contains("script-src 'self'"));
    assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"));
    for path in ["/console/nope.js", "/console/", "/console/../Cargo.toml"] {
        let (status, _, body) = node.call("GET", path, None, None).await;
        assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
    }
    // The page is public; what it calls is not.
    let (status, _, body) = node.call("GET", "/v1/me", None, None).await;
    assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");
}

#[tokio::test]
async fn probes_and_cluster_view() {
    let node = TestNode::start().await;
    let (status, _, body) = node.call("GET", "/healthz", None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "status": "ok" })));
    let (status, _, body) = node.call("GET", "/readyz", None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "ready": true, "leaderId": 1 })));
    let (status, _, cluster) = node.call("GET", "/v1/cluster", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cluster["nodeId"], 1);
    assert_eq!(cluster["leaderId"], 1);
    assert_eq!(cluster["role"], "Leader");
    assert_eq!(cluster["members"].as_array().map(Vec::len), Some(1));
    assert!(cluster["lastApplied"].as_u64().expect("lastApplied") >= 2);
    // The leader reports each member's replication, itself included (the console's lag).
    let replication = cluster["replication"].as_array().expect("the leader reports replication");
    assert_eq!(replication.len(), 1, "{replication:?}");
    let (last, matched) = (cluster["lastLogIndex"].as_u64(), replication[0]["matchedIndex"].as_u64());
    assert_eq!(replication[0]["nodeId"], 1);
    assert!(matched.is_some_and(|m| m >= 2), "{replication:?}");
    assert_eq!(replication[0]["lag"].as_u64(), last.zip(matched).map(|(l, m)| l - m));
    let (status, _, metrics) = node.call("GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let before = metrics.as_str().expect("text").to_owned();
    assert!(before.contains("raftbox_raft_is_leader{node=\"1\"} 1"));
    assert_eq!(series(&before, "raftbox_raft_role", &[("role", "Leader")]), Some(1.0));
    assert_eq!(series(&before, "raftbox_raft_role", &[("role", "Follower")]), Some(0.0));
    assert!(series(&before, "raftbox_raft_term", &[]).expect("term") >= 1.0);
    // Per route: the template, the method and the status of each answered request.
    let healthz = [("route", "/healthz"), ("method", "GET"), ("status", "200")];
    assert_eq!(series(&before, "raftbox_http_requests_total", &healthz), Some(1.0));
    assert_eq!(series(&before, "raftbox_http_request_duration_seconds_count", &healthz[..2]), Some(1.0));

    // A write, a request with a path parameter and one no route matches move the series.
    node.create_user("metrics-user").await;
    let (status, _, _) = node.call("GET", "/v1/admin/users/no-such-user", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    node.call("GET", "/v1/nothing-here", None, None).await;
    let (_, _, metrics) = node.call("GET", "/metrics", None, None).await;
    let after = metrics.as_str().expect("text").to_owned();
    let created = [("route", "/v1/admin/users"), ("method", "POST"), ("status", "201")];
    assert_eq!(series(&after, "raftbox_http_requests_total", &created), Some(1.0));
    let user = [("route", "/v1/admin/users/{user_id}"), ("method", "GET"), ("status", "404")];
    assert_eq!(series(&after, "raftbox_http_requests_total", &user), Some(1.0));
    let unmatched = [("route", "unmatched"), ("method", "GET"), ("status", "404")];
    assert_eq!(series(&after, "raftbox_http_requests_total", &unmatched), Some(1.0));
    assert!(!after.contains("no-such-user") && !after.contains("nothing-here"), "raw paths leaked into labels");
    for name in [
        "raftbox_raft_log_fsync_seconds_count",
        "raftbox_raft_log_append_entries_count",
        "raftbox_raft_batch_commands_count",
        "raftbox_raft_write_seconds_count",
        "raftbox_raft_commit_index",
        "raftbox_raft_last_log_index",
        "raftbox_raft_last_applied_index",
    ] {
        let (was, is) = (series(&before, name, &[]).expect(name), series(&after, name, &[]).expect(name));
        assert!(is > was, "{name} did not move with a write: {was} -> {is}");
    }
    assert_eq!(series(&after, "raftbox_raft_batches_in_flight", &[]), Some(0.0));
    let lag = series(&after, "raftbox_raft_apply_lag", &[]).expect("apply lag");
    let (last, applied) = (
        series(&after, "raftbox_raft_last_log_index", &[]).expect("last log index"),
        series(&after, "raftbox_raft_last_applied_index", &[]).expect("applied"),
    );
    assert_eq!(lag, last - applied);
    // The series the operations section of the README lists are all exported (the block
    // store is measured by the node's maintenance rounds, which API tests do not run).
    for name in [
        "raftbox_raft_snapshot_bytes",
        "raftbox_raft_snapshot_index",
        "raftbox_blocks_stored",
        "raftbox_blocks_stored_bytes",
        "raftbox_jobs_start_lateness_seconds_count",
    ] {
        assert!(series(&after, name, &[]).is_some(), "{name} is not exported");
    }
    // A single node replicates to no one.
    assert_eq!(series(&after, "raftbox_raft_replication_lag", &[]), None);
}

/// The sum of the samples of `name` (exactly) whose labels include every pair of `labels`,
/// from a Prometheus text exposition; `None` if there is no such sample.
pub fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (head, value) = line.rsplit_once(' ')?;
        let (metric, label_text) = match head.split_once('{') {
            Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        if metric != name || !labels.iter().all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\""))) {
            continue;
        }
        *found.get_or_insert(0.0) += value.parse::<f64>().expect("a numeric sample");
    }
    found
}

#[tokio::test]
async fn concurrent_writes_are_batched_and_all_applied() {
    let node = std::sync::Arc::new(TestNode::start().await);
    let before: u64 = node.call("GET", "/v1/cluster", None, None).await.2["lastLogIndex"].as_u64().expect("index");
    let writers: Vec<_> = (0..64)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move { node.create_user(&format!("user-{i}")).await })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    let after: u64 = node.call("GET", "/v1/cluster", None, None).await.2["lastLogIndex"].as_u64().expect("index");
    // 64 creations took fewer log entries than creations: they were batched.
    assert!(after - before < 64, "64 writes used {} log entries", after - before);
}
