//! Bad input across every route: malformed JSON, wrong types, deep nesting, huge bodies,
//! bytes that are not UTF-8, control characters, path traversal, bad hashes, absurd numbers
//! and unknown enum values. Each is answered 4xx problem+json; nothing changes; the node
//! stays healthy. On failure the whole table of surprises is printed.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{TestNode, ADMIN_TOKEN};

/// A body that nests `depth` arrays.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Bodies every JSON route must refuse, whatever it expects.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("malformed JSON", b"{\"name\":".to_vec()),
        ("not an object", b"[1,2,3]".to_vec()),
        ("wrong types", br#"{"name":5,"path":[],"chunks":"x","baseVersion":"one","schedule":7}"#.to_vec()),
        ("deep nesting", format!("{{\"name\":{}}}", nested(10_000)).into_bytes()),
        ("not UTF-8", b"{\"name\":\"\xff\xfe\"}".to_vec()),
        ("huge body", format!("{{\"name\":\"{}\"}}", "x".repeat(3 << 20)).into_bytes()),
        ("unknown fields", br#"{"name":"a","isAdmin":true}"#.to_vec()),
        ("empty", Vec::new()),
    ]
}

/// Every route that takes a JSON body, with `{user}`, `{job}`, `{ns}` filled in.
const JSON_ROUTES: [(&str, &str); 13] = [
    ("POST", "/v1/admin/users"),
    ("POST", "/v1/admin/users/{user}/tokens"),
    ("POST", "/v1/admin/cluster/members"),
    ("POST", "/v1/blocks/status"),
    ("POST", "/v1/files/commit"),
    ("POST", "/v1/files/restore"),
    ("POST", "/v1/files/delete"),
    ("POST", "/v1/files/move"),
    ("POST", "/v1/jobs"),
    ("PATCH", "/v1/jobs/{job}"),
    ("POST", "/v1/namespaces"),
    ("PUT", "/v1/namespaces/{ns}/acl"),
    ("POST", "/v1/admin/groups"),
];

/// Specific bad values for specific routes: (method, path, body).
fn targeted(user: &str, ns: &str) -> Vec<(&'static str, String, String)> {
    let commit = |path: &str, chunks: Value, base: Value| {
        json!({ "path": path, "chunks": chunks, "baseVersion": base, "size": 1, "mtime": 0 }).to_string()
    };
    let hash = "a".repeat(64);
    vec![
        ("POST", "/v1/files/commit".into(), commit("/../etc/passwd", json!([hash]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("/a//b", json!([hash]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("/a/./b", json!([hash]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("relative", json!([hash]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("/tab\there", json!([hash]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("/ok.txt", json!(["not-a-hash"]), json!(0))),
        ("POST", "/v1/files/commit".into(), commit("/ok.txt", json!([hash]), json!(-1))),
        ("POST", "/v1/files/commit".into(), commit("/ok.txt", json!([hash]), json!(1e30))),
        ("POST", "/v1/files/commit".into(), commit(&format!("/{}", "n".repeat(5_000)), json!([hash]), json!(0))),
        ("POST", "/v1/blocks/status".into(), json!({ "hashes": ["zz"] }).to_string()),
        ("POST", "/v1/blocks/status".into(), json!({ "hashes": vec![hash.clone(); 20_000] }).to_string()),
        ("POST", "/v1/files/move".into(), json!({ "from": "/a", "to": "/../b", "baseVersion": 1 }).to_string()),
        ("POST", "/v1/files/restore".into(), json!({ "path": "/a", "version": -3 }).to_string()),
        ("POST", "/v1/admin/users".into(), json!({ "name": "bell\u{7}" }).to_string()),
        ("POST", "/v1/admin/users".into(), json!({ "name": "n".repeat(1_000) }).to_string()),
        ("POST", format!("/v1/admin/users/{user}/tokens"), json!({ "name": "t", "expiresInS": -5 }).to_string()),
        (
            "POST",
            "/v1/jobs".into(),
            json!({ "type": "teleport", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 })
                .to_string(),
        ),
        (
            "POST",
            "/v1/jobs".into(),
            json!({ "type": "noop", "payload": {}, "schedule": { "cron": "99 * * * *", "timezone": "UTC" }, "maxRetries": 0 })
                .to_string(),
        ),
        (
            "POST",
            "/v1/jobs".into(),
            json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 1e30 })
                .to_string(),
        ),
        ("POST", "/v1/admin/cluster/members".into(), json!({ "id": -1, "httpAddr": "x", "grpcAddr": "y" }).to_string()),
        ("POST", "/v1/namespaces".into(), json!({ "name": "tab\there" }).to_string()),
        ("POST", "/v1/namespaces".into(), json!({ "name": "n".repeat(1_000) }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "userId": user, "role": "superuser" }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "userId": user, "groupId": "g", "role": "viewer" }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "role": "viewer" }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "userId": "ghost", "role": "viewer" }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "userName": "ghost", "role": "viewer" }).to_string()),
        ("PUT", format!("/v1/namespaces/{ns}/acl"), json!({ "userId": user, "role": "editor" }).to_string()),
        ("PUT", "/v1/namespaces/not-there/acl".into(), json!({ "userId": user, "role": "viewer" }).to_string()),
        ("PUT", "/v1/namespaces/..%2F..%2Fadmin/acl".into(), json!({ "userId": user, "role": "viewer" }).to_string()),
        ("POST", "/v1/admin/groups".into(), json!({ "name": "" }).to_string()),
        ("POST", "/v1/admin/groups".into(), json!({ "name": "bell\u{7}" }).to_string()),
    ]
}

/// Query and path values every GET must refuse.
fn bad_gets() -> Vec<String> {
    let hash = "a".repeat(64);
    vec![
        "/v1/files?path=..%2F..%2Fetc%2Fpasswd".into(),
        "/v1/files?path=%2Fa%2F%2Fb".into(),
        "/v1/files?path=%2Fa%01b".into(),
        "/v1/files?path=%FF%FE".into(),
        "/v1/files/history?path=%2Fa&limit=-1".into(),
        "/v1/files/history?path=%2Fa&limit=99999999999999999999999".into(),
        "/v1/files/list?path=%2F&limit=0".into(),
        "/v1/sync?cursor=%00%00".into(),
        "/v1/sync?cursor=not-a-cursor".into(),
        "/v1/notify?cursor=0&timeout=100000".into(),
        "/v1/blocks/not-a-hash".into(),
        format!("/v1/blocks/{}", &hash[..63]),
        format!("/v1/blocks/{}G", &hash[..63]),
        "/v1/jobs?limit=abc".into(),
        "/v1/jobs/..%2F..%2Fadmin".into(),
        "/v1/admin/users/%00".into(),
        "/v1/admin/cluster/members/-1".into(),
        "/v1/namespaces/%00/acl".into(),
        "/v1/namespaces/not-there/acl".into(),
        "/v1/admin/groups/%00".into(),
    ]
}

#[tokio::test]
async fn every_route_refuses_bad_input_with_a_problem_and_changes_nothing() {
    let node = TestNode::start().await;
    let user = node.create_user("mallory").await;
    let user_id = user["userId"].as_str().expect("userId").to_owned();
    let me = node.create_token(&user_id).await;
    let job =
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 });
    let (_, _, created) = node.call("POST", "/v1/jobs", Some(&me), Some(&job.to_string())).await;
    let job_id = created["jobId"].as_str().expect("jobId").to_owned();
    let (_, _, folder) = node.call("POST", "/v1/namespaces", Some(&me), Some(r#"{"name":"team"}"#)).await;
    let ns = folder["namespaceId"].as_str().expect("namespaceId").to_owned();
    let before = snapshot(&node, &me).await;

    let mut surprises = Vec::new();
    let mut judge = |what: String, status: StatusCode, headers: &reqwest::header::HeaderMap, body: &Value| {
        let problem = headers.get("content-type").and_then(|v| v.to_str().ok()) == Some("application/problem+json");
        if !status.is_client_error() || !problem || !body["detail"].is_string() {
            surprises.push(format!("{what}: {status} {}", cut(body)));
        }
    };
    for (method, template) in JSON_ROUTES {
        let path = template.replace("{user}", &user_id).replace("{job}", &job_id).replace("{ns}", &ns);
        for (kind, body) in hostile_bodies() {
            // Admin routes with the admin token, the rest with a user's, so the body is judged.
            let token = if path.starts_with("/v1/admin") { ADMIN_TOKEN } else { me.as_str() };
            let (status, headers, answer) = node.call_bytes(method, &path, Some(token), body).await;
            judge(format!("{method} {path} with {kind}"), status, &headers, &answer);
        }
    }
    for (method, path, body) in targeted(&user_id, &ns) {
        let token = if path.starts_with("/v1/admin") { ADMIN_TOKEN } else { me.as_str() };
        let (status, headers, answer) = node.call(method, &path, Some(token), Some(&body)).await;
        judge(format!("{method} {path} with {}", cut(&Value::String(body))), status, &headers, &answer);
    }
    for path in bad_gets() {
        let token = if path.starts_with("/v1/admin") { ADMIN_TOKEN } else { me.as_str() };
        let (status, headers, answer) = node.call("GET", &path, Some(token), None).await;
        judge(format!("GET {path}"), status, &headers, &answer);
    }
    assert!(surprises.is_empty(), "{} answers were not 4xx problem+json:\n{}", surprises.len(), surprises.join("\n"));

    // Nothing changed, and the node still works.
    assert_eq!(snapshot(&node, &me).await, before, "bad input changed the state");
    assert_eq!(node.call("GET", "/healthz", None, None).await.0, StatusCode::OK);
    let (status, _, _) = node.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"after"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "the node no longer writes");
}

/// What the caller can see: their files, jobs, namespaces and ACLs, and the groups.
async fn snapshot(node: &TestNode, token: &str) -> Value {
    let files = node.call("GET", "/v1/sync?cursor=0", Some(token), None).await.2["changes"].clone();
    let jobs = node.call("GET", "/v1/jobs", Some(token), None).await.2["jobs"].clone();
    let job = jobs[0]["jobId"].as_str().map(str::to_owned);
    let detail = match job {
        Some(id) => node.call("GET", &format!("/v1/jobs/{id}"), Some(token), None).await.2,
        None => Value::Null,
    };
    let namespaces = node.call("GET", "/v1/namespaces", Some(token), None).await.2;
    let mut acls = Vec::new();
    for ns in namespaces["namespaces"].as_array().into_iter().flatten() {
        let id = ns["namespaceId"].as_str().unwrap_or_default();
        acls.push(node.call("GET", &format!("/v1/namespaces/{id}/acl"), Some(token), None).await.2);
    }
    let groups = node.call("GET", "/v1/admin/groups", Some(ADMIN_TOKEN), None).await.2;
    json!({ "files": files, "jobs": jobs, "job": detail, "namespaces": namespaces, "acls": acls, "groups": groups })
}

fn cut(value: &Value) -> String {
    let text = value.to_string();
    text.chars().take(160).collect()
}
