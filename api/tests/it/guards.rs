//! API tests of the request guards: every row of the idempotency transition and error
//! tables, and rate limiting (headers, 429, most restrictive wins, failure modes).

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use raftbox_api::auth::Principal;
use raftbox_api::idempotency::Keyed;
use raftbox_api::ratelimit::{Failure, RateLimit, Scope};
use raftbox_api::{ApiConfig, AppState};
use raftbox_storage::ratelimit::Algorithm;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

fn key(k: &str) -> [(&'static str, &str); 1] {
    [("idempotency-key", k)]
}

#[tokio::test]
async fn first_request_runs_and_a_retry_replays_without_running_again() {
    let node = TestNode::start().await;
    let body = r#"{"name":"dora"}"#;
    let (s1, h1, first) = node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(body), &key("k-1")).await;
    assert_eq!(s1, StatusCode::CREATED, "{first}");
    assert!(h1.get("idempotent-replayed").is_none());
    // Had the retry run again, the duplicate name would have made it a 409.
    let (s2, h2, second) = node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(body), &key("k-1")).await;
    assert_eq!(s2, StatusCode::CREATED, "{second}");
    assert_eq!(second, first);
    assert_eq!(h2.get("idempotent-replayed").map(|v| v.to_str().expect("ascii")), Some("true"));
    assert_eq!(h2.get("content-type").map(|v| v.to_str().expect("ascii")), Some("application/json"));
}

#[tokio::test]
async fn a_replayed_token_creation_names_the_same_token_without_its_secret() {
    let node = TestNode::start().await;
    let user = node.create_user("erin").await;
    let path = format!("/v1/admin/users/{}/tokens", user["userId"].as_str().expect("id"));
    let body = Some(r#"{"name":"phone"}"#);
    let (_, _, first) = node.call_with("POST", &path, Some(ADMIN_TOKEN), body, &key("tok-1")).await;
    let (_, _, again) = node.call_with("POST", &path, Some(ADMIN_TOKEN), body, &key("tok-1")).await;
    assert_eq!(first["tokenId"], again["tokenId"]);
    assert!(again.get("token").is_none(), "the secret is shown once: {again}");
    let (status, _, _) = node.call("GET", "/v1/me", first["token"].as_str(), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_saved_rejection_replays_as_the_same_problem() {
    let node = TestNode::start().await;
    node.create_user("frank").await;
    let body = Some(r#"{"name":"frank"}"#);
    let (s1, _, p1) = node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), body, &key("k-2")).await;
    assert_problem(s1, &p1, StatusCode::CONFLICT, "conflict");
    let (s2, h2, p2) = node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), body, &key("k-2")).await;
    assert_problem(s2, &p2, StatusCode::CONFLICT, "conflict");
    assert!(h2.get("idempotent-replayed").is_some());
}

#[tokio::test]
async fn same_key_with_another_body_is_422_and_changes_nothing() {
    let node = TestNode::start().await;
    node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"gina"}"#), &key("k-3")).await;
    let (status, _, problem) =
        node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"hank"}"#), &key("k-3")).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
    // hank was not created: creating him now succeeds.
    node.create_user("hank").await;
}

#[tokio::test]
async fn keys_are_scoped_by_route_and_principal() {
    let node = TestNode::start().await;
    let (s1, _, u1) =
        node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"ivy"}"#), &key("shared")).await;
    assert_eq!(s1, StatusCode::CREATED);
    // The same key on another route is another operation.
    let path = format!("/v1/admin/users/{}/tokens", u1["userId"].as_str().expect("id"));
    let (s2, _, _) = node.call_with("POST", &path, Some(ADMIN_TOKEN), Some(r#"{"name":"t"}"#), &key("shared")).await;
    assert_eq!(s2, StatusCode::CREATED);
}

#[tokio::test]
async fn malformed_keys_are_400() {
    let node = TestNode::start().await;
    let long = "k".repeat(256);
    for bad in ["", long.as_str()] {
        let (status, _, problem) =
            node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"jo"}"#), &key(bad)).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
    let longest = "k".repeat(255);
    let (status, _, _) =
        node.call_with("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"jo"}"#), &key(&longest)).await;
    assert_eq!(status, StatusCode::CREATED);
}

/// A multi-step keyed route for the `IN_PROGRESS` rows: its work waits for a permit.
fn slow_route(gate: Arc<Semaphore>) -> axum::Router<AppState> {
    axum::Router::new().route(
        "/v1/test/slow",
        post(move |State(state): State<AppState>, principal: Principal, keyed: Keyed| {
            let gate = gate.clone();
            async move {
                keyed
                    .run(&state, &principal, |body| async move {
                        let _permit = gate.acquire().await.expect("gate");
                        (StatusCode::CREATED, body).into_response()
                    })
                    .await
            }
        }),
    )
}

#[tokio::test]
async fn concurrent_duplicate_is_409_in_progress_then_done_replays() {
    let gate = Arc::new(Semaphore::new(0));
    let node = Arc::new(TestNode::start_with(ApiConfig::default(), slow_route(gate.clone())).await);
    let first = {
        let node = node.clone();
        tokio::spawn(async move {
            node.call_with("POST", "/v1/test/slow", Some(ADMIN_TOKEN), Some(r#"{"n":1}"#), &key("slow")).await
        })
    };
    // Poll until the first request holds the key (its duplicate answers 409).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let (status, headers, problem) = loop {
        let answer = node.call_with("POST", "/v1/test/slow", Some(ADMIN_TOKEN), Some(r#"{"n":1}"#), &key("slow")).await;
        if answer.0 == StatusCode::CONFLICT || tokio::time::Instant::now() > deadline {
            break answer;
        }
        tokio::task::yield_now().await;
    };
    assert_problem(status, &problem, StatusCode::CONFLICT, "idempotency-in-progress");
    let retry_after: u64 = headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    // A different body is refused even while in progress.
    let (status, _, problem) =
        node.call_with("POST", "/v1/test/slow", Some(ADMIN_TOKEN), Some(r#"{"n":2}"#), &key("slow")).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
    gate.add_permits(1);
    let (status, _, body) = first.await.expect("first request");
    assert_eq!((status, body), (StatusCode::CREATED, json!({ "n": 1 })));
    // DONE: the retry replays and does not run the work (no permit is left for it).
    let (status, headers, body) =
        node.call_with("POST", "/v1/test/slow", Some(ADMIN_TOKEN), Some(r#"{"n":1}"#), &key("slow")).await;
    assert_eq!((status, body), (StatusCode::CREATED, json!({ "n": 1 })));
    assert!(headers.get("idempotent-replayed").is_some());
}

fn limit(name: &str, scope: Scope, routes: &[&str], algorithm: Algorithm, failure: Failure) -> RateLimit {
    RateLimit {
        name: name.into(),
        scope,
        routes: routes.iter().map(|r| r.to_string()).collect(),
        exclude: Vec::new(),
        algorithm,
        failure,
    }
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> String {
    headers.get(name).map(|v| v.to_str().expect("ascii").to_string()).unwrap_or_default()
}

#[tokio::test]
async fn token_bucket_per_user_sets_headers_and_answers_429() {
    let per_user = limit(
        "per-user",
        Scope::User,
        &["/v1/*"],
        Algorithm::TokenBucket { capacity: 3, refill_per_s: 1 },
        Failure::Open,
    );
    let config = ApiConfig { rate_limits: vec![per_user], ..ApiConfig::default() };
    let node = TestNode::start_with(config, axum::Router::new()).await;
    for remaining in ["2", "1", "0"] {
        let (status, headers, _) = node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "x-ratelimit-limit"), "3");
        assert_eq!(header(&headers, "x-ratelimit-remaining"), remaining);
        assert!(header(&headers, "x-ratelimit-reset").parse::<u64>().expect("seconds") <= 3);
        assert_eq!(header(&headers, "ratelimit-policy"), "\"per-user\";q=3;w=3");
        assert!(header(&headers, "ratelimit").starts_with(&format!("\"per-user\";r={remaining};t=")));
    }
    let (status, headers, problem) = node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
    assert_problem(status, &problem, StatusCode::TOO_MANY_REQUESTS, "rate-limited");
    assert_eq!(header(&headers, "retry-after"), "1");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), "0");
    // Routes outside the pattern are not limited and carry no headers.
    let (status, headers, _) = node.call("GET", "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("x-ratelimit-limit").is_none());
    // Every decision is counted: three admitted, one rejected.
    let (_, _, metrics) = node.call("GET", "/metrics", None, None).await;
    let metrics = metrics.as_str().expect("text");
    let decisions = |d: &str| crate::series(metrics, "raftbox_ratelimit_decisions_total", &[("decision", d)]);
    assert_eq!((decisions("admitted"), decisions("rejected")), (Some(3.0), Some(1.0)), "{metrics}");
}

#[tokio::test]
async fn the_most_restrictive_limit_wins_and_scopes_are_separate() {
    let loose = limit(
        "loose",
        Scope::Global,
        &["/v1/*"],
        Algorithm::FixedWindow { limit: 100, window_ms: 60_000 },
        Failure::Open,
    );
    let tight =
        limit("tight", Scope::Ip, &["/v1/me"], Algorithm::SlidingLog { limit: 2, window_ms: 60_000 }, Failure::Open);
    let config = ApiConfig { rate_limits: vec![loose, tight], ..ApiConfig::default() };
    let node = TestNode::start_with(config, axum::Router::new()).await;
    let (_, headers, _) = node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
    assert_eq!(header(&headers, "x-ratelimit-limit"), "2");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), "1");
    assert!(header(&headers, "ratelimit-policy").contains("\"loose\";q=100;w=60"));
    node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
    let (status, _, _) = node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Another route under only the loose limit still passes; the rejected request consumed
    // nothing of the loose limit (2 admitted /v1/me + this one = 97 left).
    let (status, headers, _) = node.call("GET", "/v1/admin/users/nobody", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), "97");
}

#[tokio::test]
async fn without_a_decision_fail_open_admits_and_fail_closed_rejects() {
    for (failure, expected) in [(Failure::Open, StatusCode::OK), (Failure::Closed, StatusCode::SERVICE_UNAVAILABLE)] {
        let global =
            limit("g", Scope::Global, &["/healthz"], Algorithm::TokenBucket { capacity: 5, refill_per_s: 5 }, failure);
        let mut config = ApiConfig { rate_limits: vec![global], ..ApiConfig::default() };
        config.rate_limiting.decision_timeout_ms = 200;
        let node = TestNode::start_without_quorum(config).await;
        let started = std::time::Instant::now();
        let (status, headers, body) = node.call("GET", "/healthz", None, None).await;
        assert_eq!(status, expected, "{failure:?}: {body}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "the deadline bounds the wait");
        if failure == Failure::Closed {
            assert_problem(status, &body, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            assert!(headers.get("retry-after").is_some());
        }
        let (_, _, metrics) = node.call("GET", "/metrics", None, None).await;
        let decision = if failure == Failure::Closed { "undecided_closed" } else { "undecided_open" };
        let counted = crate::series(
            metrics.as_str().expect("text"),
            "raftbox_ratelimit_decisions_total",
            &[("decision", decision)],
        );
        assert_eq!(counted, Some(1.0), "{failure:?}: {metrics}");
    }
}
