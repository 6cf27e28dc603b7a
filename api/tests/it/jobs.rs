//! API tests of the job service: create (keyed), get, list, patch, cancel, runs, validation.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

fn job(schedule: Value) -> Value {
    json!({ "type": "noop", "payload": {}, "schedule": schedule, "maxRetries": 1 })
}

async fn token(node: &TestNode, name: &str) -> String {
    let user = node.create_user(name).await;
    node.create_token(user["userId"].as_str().expect("id")).await
}

#[tokio::test]
async fn create_get_list_patch_cancel() {
    let node = TestNode::start().await;
    let me = token(&node, "jo").await;
    let body = job(json!({ "runAt": "2099-01-01T00:00:00Z" })).to_string();
    let (status, _, created) =
        node.call_with("POST", "/v1/jobs", Some(&me), Some(&body), &[("idempotency-key", "j1")]).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (created["status"].as_str(), created["nextRunAt"].as_str()),
        (Some("SCHEDULED"), Some("2099-01-01T00:00:00.000Z"))
    );
    let (_, _, again) = node.call_with("POST", "/v1/jobs", Some(&me), Some(&body), &[("idempotency-key", "j1")]).await;
    assert_eq!(again["jobId"], created["jobId"], "a retried create schedules no second job");
    let id = created["jobId"].as_str().expect("id");
    let (_, _, listed) = node.call("GET", "/v1/jobs", Some(&me), None).await;
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1));
    let patch =
        json!({ "schedule": { "cron": "0 9 * * 1", "timezone": "Asia/Tokyo" }, "payload": { "k": 1 } }).to_string();
    let (status, _, patched) = node.call("PATCH", &format!("/v1/jobs/{id}"), Some(&me), Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["schedule"], json!({ "cron": "0 9 * * 1", "timezone": "Asia/Tokyo" }));
    assert_eq!(patched["payload"], json!({ "k": 1 }));
    assert!(patched["nextRunAt"].as_str().expect("next").ends_with(":00:00.000Z"));
    // Another user cannot see it; an admin can.
    let other = token(&node, "ki").await;
    let (status, _, problem) = node.call("GET", &format!("/v1/jobs/{id}"), Some(&other), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
    assert_eq!(node.call("GET", &format!("/v1/jobs/{id}"), Some(ADMIN_TOKEN), None).await.0, StatusCode::OK);
    let (status, _, cancelled) = node.call("DELETE", &format!("/v1/jobs/{id}"), Some(&me), None).await;
    assert_eq!((status, cancelled["status"].as_str()), (StatusCode::OK, Some("CANCELLED")));
    let (status, _, problem) = node.call("DELETE", &format!("/v1/jobs/{id}"), Some(&me), None).await;
    assert_problem(status, &problem, StatusCode::CONFLICT, "conflict");
    let (status, _, problem) = node.call("PATCH", &format!("/v1/jobs/{id}"), Some(&me), Some(&patch)).await;
    assert_problem(status, &problem, StatusCode::CONFLICT, "conflict");
    let (status, _, runs) = node.call("GET", &format!("/v1/jobs/{id}/runs"), Some(&me), None).await;
    assert_eq!((status, runs["runs"].clone()), (StatusCode::OK, json!([])));
}

fn webhook(target: &str) -> serde_json::Value {
    json!({ "type": "webhook", "target": target, "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 })
}

#[tokio::test]
async fn invalid_jobs_are_400_and_jobs_the_server_cannot_take_422() {
    let node = TestNode::start().await;
    let me = token(&node, "lu").await;
    // Against the description: 400.
    let malformed = [
        json!({ "type": "teleport", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 }),
        job(json!({ "cron": "* * * * *" })),
        job(json!({ "runAt": "2099-01-01T00:00:00+02:00" })),
        job(json!({ "runAt": "tomorrow" })),
        job(json!({})),
        json!({ "type": "noop", "payload": [], "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 }),
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 101 }),
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": -1 }),
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" } }),
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0, "timeoutSeconds": 901 }),
        json!({ "type": "maintenance.purge_expired", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 }),
    ];
    for case in malformed {
        let (status, _, problem) = node.call("POST", "/v1/jobs", Some(&me), Some(&case.to_string())).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
    // As described, but not to be done: a target the node may not call, a cron expression or
    // time zone it does not know: 422.
    let unprocessable = [
        json!({ "type": "webhook", "target": "ftp://x", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 }),
        // The node's own network and cloud metadata are out of reach (no allow-list here).
        webhook("http://127.0.0.1:7081/v1/admin/users"),
        webhook("http://localhost:7081/"),
        webhook("http://169.254.169.254/latest/meta-data/"),
        webhook("http://[::1]:7081/"),
        webhook("http://10.0.0.1/"),
        webhook("http://user:secret@example.com/"),
        job(json!({ "cron": "not a cron", "timezone": "UTC" })),
        job(json!({ "cron": "* * * * *", "timezone": "Atlantis/Capital" })),
    ];
    for case in unprocessable {
        let (status, _, problem) = node.call("POST", "/v1/jobs", Some(&me), Some(&case.to_string())).await;
        assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "unprocessable");
    }
    let (_, _, listed) = node.call("GET", "/v1/jobs", Some(&me), None).await;
    assert_eq!(listed["jobs"], json!([]), "no invalid request created a job");
    let (status, _, problem) = node.call("GET", "/v1/jobs/nope", Some(&me), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
}

#[tokio::test]
async fn a_user_may_not_schedule_more_often_than_the_shortest_interval_nor_too_many_jobs() {
    let config = raftbox_api::ApiConfig {
        job_limits: raftbox_api::JobLimits { min_cron_interval_s: 60, active_jobs_per_owner_max: 2 },
        ..raftbox_api::ApiConfig::default()
    };
    let node = TestNode::start_with(config, axum::Router::new()).await;
    let me = token(&node, "quick").await;
    let cron = |expr: &str| {
        json!({ "type": "noop", "payload": {}, "schedule": { "cron": expr, "timezone": "UTC" }, "maxRetries": 0 })
            .to_string()
    };
    // Every second, every 30 s, and one minute with a second fire 10 s later: too often.
    for expr in ["* * * * * *", "*/30 * * * * *", "0,10 * * * * *"] {
        let (status, _, problem) = node.call("POST", "/v1/jobs", Some(&me), Some(&cron(expr))).await;
        assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "unprocessable");
    }
    // The admin is exempt.
    let (status, _, created) = node.call("POST", "/v1/jobs", Some(ADMIN_TOKEN), Some(&cron("* * * * * *"))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // Two active jobs, then the third is refused; cancelling one makes room.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, _, created) = node.call("POST", "/v1/jobs", Some(&me), Some(&cron("* * * * *"))).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        ids.push(created["jobId"].as_str().expect("jobId").to_owned());
    }
    let (status, _, problem) = node.call("POST", "/v1/jobs", Some(&me), Some(&cron("0 * * * *"))).await;
    assert_problem(status, &problem, StatusCode::CONFLICT, "conflict");
    node.call("DELETE", &format!("/v1/jobs/{}", ids[0]), Some(&me), None).await;
    let (status, _, created) = node.call("POST", "/v1/jobs", Some(&me), Some(&cron("0 * * * *"))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
}
