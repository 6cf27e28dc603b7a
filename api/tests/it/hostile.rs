//! Issue 34 through the HTTP API, each test failing on the code before it: what a hostile
//! user or stranger could do with headers, passwords, uploads, links, quotas and jobs, and
//! the worst input of every fuzz target sent to a running node, which must stay up.

use std::path::PathBuf;

use base64::Engine as _;
use raftbox_api::ratelimit::{Failure, RateLimit, Scope};
use raftbox_api::ApiConfig;
use raftbox_storage::ratelimit::Algorithm;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

async fn user(node: &TestNode, name: &str) -> (String, String) {
    let user = node.create_user(name).await;
    let id = user["userId"].as_str().expect("id").to_owned();
    let token = node.create_token(&id).await;
    (id, token)
}

async fn put(node: &TestNode, token: &str, query: &str, data: &[u8]) -> Value {
    let path = format!("/v1/files/content?{query}");
    let (status, _, body) = node.call_raw("PUT", &path, Some(token), "application/octet-stream", data.to_vec()).await;
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("json")
}

fn basic(name: &str, secret: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{name}:{secret}")))
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> String {
    headers.get(name).map(|v| v.to_str().expect("ascii").to_owned()).unwrap_or_default()
}

/// Item 3: a user's file is never active content on the console's origin; every answer
/// carries the headers a scanner asks for.
#[tokio::test]
async fn user_content_is_inert_and_every_answer_carries_the_security_headers() {
    let node = TestNode::start().await;
    let (_, alice) = user(&node, "headers-alice").await;
    let page = b"<html><script>parent.postMessage('ran', '*')</script></html>";
    put(&node, &alice, "path=/page.html", page).await;
    put(&node, &alice, "path=/photo.png", b"\x89PNG\r\n\x1a\n").await;
    let dav_auth = basic("headers-alice", &alice);
    let (status, headers, body) =
        node.send_raw("GET", "/dav/page.html", None, &[("authorization", &dav_auth)], None).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &page[..]));
    assert!(header(&headers, "content-security-policy").starts_with("sandbox"), "{headers:?}");
    assert!(header(&headers, "content-disposition").starts_with("attachment"), "{headers:?}");
    assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    // An image shows inline, sandboxed still.
    let (_, headers, _) = node.send_raw("GET", "/dav/photo.png", None, &[("authorization", &dav_auth)], None).await;
    assert!(header(&headers, "content-disposition").is_empty(), "{headers:?}");
    assert!(header(&headers, "content-security-policy").starts_with("sandbox"), "{headers:?}");
    // Through the API and a share link the same.
    let (_, headers, _) = node.send_raw("GET", "/v1/files/content?path=/page.html", Some(&alice), &[], None).await;
    assert!(header(&headers, "content-security-policy").starts_with("sandbox"), "{headers:?}");
    let (_, made) = {
        let (status, _, made) =
            node.call("POST", "/v1/links", Some(&alice), Some(&json!({ "path": "/page.html" }).to_string())).await;
        (status, made)
    };
    let (_, headers, _) = node.get_raw(made["url"].as_str().expect("url"), &[]).await;
    assert!(header(&headers, "content-security-policy").starts_with("sandbox"), "{headers:?}");
    assert!(header(&headers, "content-disposition").starts_with("attachment"), "{headers:?}");
    // An API answer, a probe, a 404: data only, never framed, never cached, never sniffed.
    for path in ["/v1/me", "/healthz", "/v1/nowhere"] {
        let (_, headers, _) = node.send_raw("GET", path, Some(&alice), &[], None).await;
        assert_eq!(header(&headers, "content-security-policy"), raftbox_api::headers::API_POLICY, "{path}");
        for (name, value) in [
            ("x-content-type-options", "nosniff"),
            ("x-frame-options", "DENY"),
            ("referrer-policy", "no-referrer"),
            ("cross-origin-resource-policy", "same-origin"),
            ("cache-control", "no-store, max-age=0"),
            ("x-permitted-cross-domain-policies", "none"),
        ] {
            assert_eq!(header(&headers, name), value, "{path}: {name}");
        }
    }
}

/// Item 8: a WebDAV client logged in with a password met no user limit (the limiter looked
/// the password up as a token and found none).
#[tokio::test]
async fn webdav_with_a_password_meets_the_users_limits() {
    let per_user = RateLimit {
        name: "per-user".into(),
        scope: Scope::User,
        routes: vec!["/dav*".into()],
        exclude: Vec::new(),
        algorithm: Algorithm::TokenBucket { capacity: 3, refill_per_s: 1 },
        failure: Failure::Open,
    };
    let node =
        TestNode::start_with(ApiConfig { rate_limits: vec![per_user], ..ApiConfig::default() }, axum::Router::new())
            .await;
    let (id, _) = user(&node, "dav-limited").await;
    let path = format!("/v1/admin/users/{id}/password");
    let set = json!({ "password": "dav password" }).to_string();
    assert_eq!(node.call("PUT", &path, Some(ADMIN_TOKEN), Some(&set)).await.0, StatusCode::NO_CONTENT);
    let auth = basic("dav-limited", "dav password");
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let (status, _, _) =
            node.send_raw("PROPFIND", "/dav/", None, &[("authorization", &auth), ("depth", "0")], None).await;
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [207, 207, 207, 429, 429], "the user's limit applies to WebDAV with a password");
}

/// Sends the head of a whole-file PUT of `length` bytes and `body` of it, over a raw
/// connection kept open (reqwest sends a streamed body chunked, without its length).
async fn start_upload(node: &TestNode, token: &str, path: &str, length: usize, body: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let host = node.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    let head = format!(
        "PUT /v1/files/content?path={path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(body).await.expect("body");
    stream
}

/// The status of the answer on `stream`, if one comes within `wait`.
async fn status_of(stream: &mut tokio::net::TcpStream, wait: std::time::Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 12];
    match tokio::time::timeout(wait, stream.read_exact(&mut buf)).await {
        Ok(Ok(_)) => std::str::from_utf8(&buf[9..12]).ok()?.parse().ok(),
        _ => None,
    }
}

/// Item 6: spools were capped at the whole quota, each, not at what it leaves.
#[tokio::test]
async fn open_uploads_together_hold_only_the_quota_left() {
    use tokio::io::AsyncWriteExt as _;
    const SIZE: usize = 600 << 10;
    let quotas = raftbox_api::Quotas { stored_bytes_per_user: 1 << 20, ..raftbox_api::Quotas::default() };
    let node = TestNode::start_with(ApiConfig { quotas, ..ApiConfig::default() }, axum::Router::new()).await;
    let (_, token) = user(&node, "spooler").await;
    // One upload declares 600 KiB, sends half, and stays open: its size is reserved.
    let mut first = start_upload(&node, &token, "/first.bin", SIZE, &vec![1u8; SIZE / 2]).await;
    // A second of 600 KiB, which would fit the 1 MiB quota alone, does not fit beside it:
    // 507 at once, before its body. (Asked until the first's reservation is in place; a
    // second still waiting for its body is dropped unsent, so it stores nothing.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut second = start_upload(&node, &token, "/second.bin", SIZE, b"").await;
        if let Some(status) = status_of(&mut second, std::time::Duration::from_millis(300)).await {
            assert_eq!(status, 507, "the second upload beside the first");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the second upload was never refused");
    }
    first.write_all(&vec![1u8; SIZE / 2]).await.expect("the rest");
    assert_eq!(status_of(&mut first, std::time::Duration::from_secs(10)).await, Some(201), "the first upload");
}

/// Item 9: a demoted editor's links kept serving; an owner could neither list nor revoke a
/// member's links into their folder.
#[tokio::test]
async fn links_stop_with_their_creators_write_access_and_owners_revoke_any() {
    let node = TestNode::start().await;
    let (_, alice) = user(&node, "links-owner").await;
    let (bob_id, bob) = user(&node, "links-editor").await;
    let (status, _, team) = node.call("POST", "/v1/namespaces", Some(&alice), Some(r#"{"name":"Team"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{team}");
    let team = team["namespaceId"].as_str().expect("id").to_owned();
    let grant = |role: &str| json!({ "userId": bob_id, "role": role }).to_string();
    let acl = format!("/v1/namespaces/{team}/acl");
    assert!(node.call("PUT", &acl, Some(&alice), Some(&grant("editor"))).await.0.is_success());
    assert!(node.call("POST", &format!("/v1/namespaces/{team}/accept"), Some(&bob), None).await.0.is_success());
    put(&node, &bob, &format!("path=/shared.txt&namespaceId={team}"), b"bob's").await;
    let body = json!({ "path": "/shared.txt", "namespaceId": team }).to_string();
    let (status, _, made) = node.call("POST", "/v1/links", Some(&bob), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let url = made["url"].as_str().expect("url").to_owned();
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::OK);
    // Made a viewer, bob's link stops; an editor again, it serves.
    assert!(node.call("PUT", &acl, Some(&alice), Some(&grant("viewer"))).await.0.is_success());
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::NOT_FOUND, "a demoted editor's link still serves");
    assert!(node.call("PUT", &acl, Some(&alice), Some(&grant("editor"))).await.0.is_success());
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::OK);
    // The owner sees it and revokes it; bob may not list the folder's links.
    let listed = format!("/v1/namespaces/{team}/links");
    let (status, _, links) = node.call("GET", &listed, Some(&alice), None).await;
    assert_eq!(status, StatusCode::OK, "{links}");
    assert_eq!(links["links"][0]["creatorUserId"], bob_id.as_str(), "{links}");
    let link_id = links["links"][0]["linkId"].as_str().expect("id").to_owned();
    let (status, _, body) = node.call("GET", &listed, Some(&bob), None).await;
    assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, _, body) = node.call("DELETE", &format!("{listed}/{link_id}"), Some(&bob), None).await;
    assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
    assert_eq!(node.call("DELETE", &format!("{listed}/{link_id}"), Some(&alice), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::NOT_FOUND);
    let (_, _, mine) = node.call("GET", "/v1/links", Some(&bob), None).await;
    assert_eq!(mine["links"], json!([]), "bob's own list no longer has it: {mine}");
}

/// Item 9: referencing another user's blocks cost the referrer nothing and pinned the
/// uploader's bytes; now whoever names a block in a commit is charged for it once.
#[tokio::test]
async fn a_commit_charges_the_blocks_it_names_to_its_author() {
    let quotas = raftbox_api::Quotas { stored_bytes_per_user: 100, ..raftbox_api::Quotas::default() };
    let node = TestNode::start_with(ApiConfig { quotas, ..ApiConfig::default() }, axum::Router::new()).await;
    let (_, alice) = user(&node, "charge-alice").await;
    let (bob_id, bob) = user(&node, "charge-bob").await;
    let (_, _, team) = node.call("POST", "/v1/namespaces", Some(&alice), Some(r#"{"name":"Shared"}"#)).await;
    let team = team["namespaceId"].as_str().expect("id").to_owned();
    let grant = json!({ "userId": bob_id, "role": "viewer" }).to_string();
    assert!(node.call("PUT", &format!("/v1/namespaces/{team}/acl"), Some(&alice), Some(&grant)).await.0.is_success());
    assert!(node.call("POST", &format!("/v1/namespaces/{team}/accept"), Some(&bob), None).await.0.is_success());
    let data = vec![9u8; 60];
    put(&node, &alice, &format!("path=/sixty.bin&namespaceId={team}"), &data).await;
    let hash = blake3::hash(&data).to_hex().to_string();
    let stored = |token: String| {
        let node = &node;
        async move { node.call("GET", "/v1/me", Some(&token), None).await.2["storedBytes"].as_u64().expect("bytes") }
    };
    assert_eq!(stored(bob.clone()).await, 0);
    // Bob names alice's block in files of his own: he is charged its 60 bytes, once.
    for n in 1..=2 {
        let commit =
            json!({ "path": format!("/copy-{n}.bin"), "chunks": [hash], "baseVersion": 0, "size": 60, "mtime": 0 });
        let (status, _, body) = node.call("POST", "/v1/files/commit", Some(&bob), Some(&commit.to_string())).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(stored(bob.clone()).await, 60);
    assert_eq!(stored(alice.clone()).await, 60, "the uploader's count is her own");
    // So what he uploads himself finds 40 bytes left of his 100.
    let (status, _, body) = node
        .call_raw("PUT", "/v1/files/content?path=/own.bin", Some(&bob), "application/octet-stream", vec![1u8; 50])
        .await;
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert_problem(status, &body, StatusCode::INSUFFICIENT_STORAGE, "quota-exceeded");
}

/// Item 6: `/metrics` told anyone the free bytes to aim at.
#[tokio::test]
async fn metrics_need_an_allowed_address_or_the_admin() {
    let http = raftbox_api::HttpConfig { metrics_allow: Vec::new(), ..raftbox_api::HttpConfig::default() };
    let node = TestNode::start_with(ApiConfig { http, ..ApiConfig::default() }, axum::Router::new()).await;
    let (_, token) = user(&node, "metrics-reader").await;
    for caller in [None, Some(token.as_str())] {
        let (status, _, body) = node.call("GET", "/metrics", caller, None).await;
        assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
    let (status, _, body) = node.call("GET", "/metrics", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.as_str().is_some_and(|text| text.contains("raftbox_disk_free_bytes")), "{body}");
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).expect("seeds").map(|e| e.expect("seed").path()).collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).expect("read")).collect()
}

/// Every fuzz target's seeds (its worst inputs among them: the crashes it found) sent where
/// the node reads them: nothing answers 5xx, and the node still answers and writes.
#[tokio::test]
async fn the_worst_inputs_of_every_fuzz_target_leave_the_node_up() {
    let node = TestNode::start().await;
    let (_, token) = user(&node, "worst-inputs").await;
    let auth = basic("worst-inputs", &token);
    put(&node, &token, "path=/x.txt", b"x").await;
    let mut sent = 0;
    let mut check = |what: String, status: StatusCode| {
        sent += 1;
        assert!(!status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE, "{what}: {status}");
    };
    for body in seeds("xml_body") {
        for method in ["PROPFIND", "PROPPATCH", "LOCK"] {
            let (status, _, _) =
                node.send_raw(method, "/dav/x.txt", None, &[("authorization", &auth)], Some(body.clone())).await;
            check(format!("{method} with an xml_body seed"), status);
        }
    }
    let header_text = |value: Vec<u8>| -> Option<String> {
        let text = String::from_utf8(value).ok()?;
        reqwest::header::HeaderValue::from_str(&text).ok().map(|_| text)
    };
    for value in seeds("destination") {
        let Some(text) = header_text(value) else { continue };
        let (status, _, _) = node
            .send_raw(
                "COPY",
                "/dav/x.txt",
                None,
                &[("authorization", &auth), ("destination", &text), ("overwrite", "F")],
                None,
            )
            .await;
        check(format!("COPY to {text:?}"), status);
    }
    for value in seeds("dav_request") {
        let text: String = String::from_utf8_lossy(&value).chars().filter(|c| (' '..='~').contains(c)).collect();
        for name in ["if", "if-match", "if-none-match", "if-range", "depth", "timeout", "lock-token", "range"] {
            let headers = [("authorization", auth.as_str()), (name, text.as_str())];
            let (status, _, _) = node.send_raw("LOCK", "/dav/x.txt", None, &headers, None).await;
            check(format!("LOCK with {name}: {text:?}"), status);
        }
    }
    for body in seeds("json_body") {
        for path in ["/v1/files/commit", "/v1/jobs", "/v1/sync", "/v1/links"] {
            let (status, _, _) = node.call_bytes("POST", path, Some(&token), body.clone()).await;
            check(format!("POST {path}"), status);
        }
    }
    for value in seeds("paths").into_iter().chain(seeds("cursor")).chain(seeds("share_link")) {
        let text: String = String::from_utf8_lossy(&value).bytes().map(|b| format!("%{b:02X}")).collect();
        for path in [format!("/v1/files?path={text}"), format!("/v1/sync?cursor={text}"), format!("/s/{text}/{text}")] {
            let (status, _, _) = node.send_raw("GET", &path, Some(&token), &[], None).await;
            check(format!("GET {path}"), status);
        }
    }
    for value in seeds("credentials") {
        let Some(text) = header_text(value) else { continue };
        for (path, name) in [("/v1/me", "authorization"), ("/dav/", "authorization"), ("/v1/me", "x-forwarded-for")] {
            let (status, _, _) = node.send_raw("GET", path, None, &[(name, &text)], None).await;
            check(format!("GET {path} with {name}"), status);
        }
    }
    for value in seeds("idempotency_key") {
        let Some(text) = header_text(value) else { continue };
        let commit = json!({ "path": "/keyed.txt", "chunks": [], "baseVersion": 0, "size": 0, "mtime": 0 }).to_string();
        let headers = [("idempotency-key", text.as_str()), ("content-type", "application/json")];
        let (status, _, _) =
            node.send_raw("POST", "/v1/files/commit", Some(&token), &headers, Some(commit.into_bytes())).await;
        check("a commit with an idempotency_key seed".into(), status);
    }
    for body in seeds("upload") {
        let (status, _, _) = node.send_raw("POST", "/v1/blocks", Some(&token), &[], Some(body.clone())).await;
        check("POST /v1/blocks".into(), status);
    }
    for value in seeds("schedule") {
        let text = String::from_utf8_lossy(&value);
        let (cron, zone) = text.split_once('\n').unwrap_or((&text, "UTC"));
        let job =
            json!({ "type": "noop", "payload": {}, "schedule": { "cron": cron, "timezone": zone }, "maxRetries": 0 });
        let (status, _, _) = node.call("POST", "/v1/jobs", Some(&token), Some(&job.to_string())).await;
        check(format!("a job with cron {cron:?} in {zone:?}"), status);
    }
    assert!(sent > 150, "only {sent} inputs were sent");
    assert_eq!(node.call("GET", "/healthz", None, None).await.0, StatusCode::OK);
    put(&node, &token, "path=/still-writes.txt", b"after every worst input").await;
}
