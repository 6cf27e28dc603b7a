//! API tests of the metadata and sync API (spec 000 with DESIGN.md §4) on one node.

use std::sync::Arc;

use base64::Engine;
use raftbox_storage::blocks::BlockHash;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

/// A user with a token, and helpers speaking as that user from a named device.
struct Device<'a> {
    node: &'a TestNode,
    token: String,
    name: &'static str,
}

async fn user(node: &TestNode, name: &str) -> String {
    let user = node.create_user(name).await;
    node.create_token(user["userId"].as_str().expect("id")).await
}

impl Device<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|b| b.to_string());
        let headers = [("x-device-id", self.name)];
        let (status, _, value) = self.node.call_with(method, path, Some(&self.token), body.as_deref(), &headers).await;
        (status, value)
    }

    async fn upload(&self, content: &str) -> String {
        let hash = BlockHash::of(content.as_bytes()).to_hex();
        let response = self
            .node
            .client
            .put(format!("{}/v1/blocks/{hash}", self.node.url))
            .bearer_auth(&self.token)
            .body(content.to_string())
            .send()
            .await
            .expect("put");
        assert_eq!(response.status(), StatusCode::CREATED);
        hash
    }

    async fn commit(&self, path: &str, chunks: &[String], base: u64) -> (StatusCode, Value) {
        let body = json!({ "path": path, "chunks": chunks, "baseVersion": base, "size": chunks.len(), "mtime": 1_700_000_000_000u64 });
        self.call("POST", "/v1/files/commit", Some(body)).await
    }

    async fn sync(&self, cursor: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/v1/sync?cursor={cursor}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

fn paths(sync: &Value) -> Vec<(String, u64)> {
    sync["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| (c["path"].as_str().expect("path").to_string(), c["version"].as_u64().expect("version")))
        .collect()
}

#[tokio::test]
async fn two_devices_on_one_base_conflict_and_both_versions_reach_a_third() {
    let node = TestNode::start().await;
    let token = user(&node, "ann").await;
    let laptop = Device { node: &node, token: token.clone(), name: "laptop" };
    let phone = Device { node: &node, token: token.clone(), name: "phone" };
    let tablet = Device { node: &node, token, name: "tablet" };
    let base = laptop.upload("v1").await;
    assert_eq!(laptop.commit("/notes/plan.txt", &[base], 0).await.0, StatusCode::CREATED);
    let mine = laptop.upload("laptop edit").await;
    let theirs = phone.upload("phone edit").await;
    let (status, first) = laptop.commit("/notes/plan.txt", &[mine.clone()], 1).await;
    assert_eq!((status, first["version"].as_u64()), (StatusCode::CREATED, Some(2)));
    let (status, conflict) = phone.commit("/notes/plan.txt", &[theirs.clone()], 1).await;
    assert_problem(status, &conflict, StatusCode::CONFLICT, "conflict");
    assert_eq!(conflict["currentVersion"], 2);
    assert_eq!(conflict["conflictedCopy"]["path"], "/notes/plan (conflicted copy, phone).txt");
    assert_eq!(conflict["conflictedCopy"]["version"], 1);
    let synced = tablet.sync("0").await;
    let mut seen = paths(&synced);
    seen.sort();
    assert_eq!(
        seen,
        vec![("/notes/plan (conflicted copy, phone).txt".to_string(), 1), ("/notes/plan.txt".to_string(), 2)]
    );
    let copy = synced["changes"].as_array().expect("changes").iter().find(|c| c["version"] == 1).expect("copy");
    assert_eq!(copy["chunks"], json!([theirs]));
}

#[tokio::test]
async fn retries_identical_content_missing_chunks_and_invisible_uploads() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "bo").await, name: "pc" };
    let a = device.upload("a").await;
    // Uploaded but not committed: invisible.
    assert_eq!(device.call("GET", "/v1/files?path=/a", None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(paths(&device.sync("0").await), vec![]);
    let (_, first) = device.commit("/a", &[a.clone()], 0).await;
    let (status, retry) = device.commit("/a", &[a.clone()], 0).await;
    assert_eq!((status, &retry), (StatusCode::CREATED, &first), "a retry gives the same result");
    let (_, history) = device.call("GET", "/v1/files/history?path=/a", None).await;
    assert_eq!(history["versions"].as_array().map(Vec::len), Some(1), "no second version");
    // Another device, stale base, identical content: 200 unchanged, no conflict.
    let (status, same) = device.commit("/a", &[a.clone()], 0).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(same["version"], 1);
    let b = device.upload("b").await;
    device.commit("/a", &[b.clone()], 1).await;
    let (status, unchanged) = device.commit("/a", &[b], 0).await;
    assert_eq!((status, unchanged["unchanged"].as_bool()), (StatusCode::OK, Some(true)));
    let ghost = BlockHash::of(b"never uploaded").to_hex();
    let (status, problem) = device.commit("/c", &[a, ghost.clone()], 0).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "missing-chunks");
    assert_eq!(problem["missing"], json!([ghost]));
}

#[tokio::test]
async fn get_history_restore_delete_list() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "cy").await, name: "pc" };
    let one = device.upload("one").await;
    let two = device.upload("two").await;
    device.commit("/d/f.txt", &[one.clone()], 0).await;
    device.commit("/d/f.txt", &[two.clone()], 1).await;
    device.commit("/d/sub/g.txt", &[one.clone()], 0).await;
    let (status, file) = device.call("GET", "/v1/files?path=/d/f.txt", None).await;
    assert_eq!((status, file["version"].as_u64(), file["chunks"].clone()), (StatusCode::OK, Some(2), json!([two])));
    let (_, page) = device.call("GET", "/v1/files/history?path=/d/f.txt&limit=1", None).await;
    assert_eq!(page["versions"][0]["version"], 2);
    let token = page["nextPageToken"].as_str().expect("more");
    let (_, rest) = device.call("GET", &format!("/v1/files/history?path=/d/f.txt&pageToken={token}"), None).await;
    assert_eq!(rest["versions"][0]["version"], 1);
    let (status, restored) =
        device.call("POST", "/v1/files/restore", Some(json!({ "path": "/d/f.txt", "version": 1 }))).await;
    assert_eq!((status, restored["version"].as_u64()), (StatusCode::CREATED, Some(3)));
    let (_, file) = device.call("GET", "/v1/files?path=/d/f.txt", None).await;
    assert_eq!(file["chunks"], json!([one]));
    let (_, listing) = device.call("GET", "/v1/files/list?path=/d/", None).await;
    let names: Vec<(&str, &str)> = listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["name"].as_str().expect("name"), e["type"].as_str().expect("type")))
        .collect();
    assert_eq!(names, vec![("f.txt", "file"), ("sub", "folder")]);
    let (_, first) = device.call("GET", "/v1/files/list?path=/d/&limit=1", None).await;
    let next = first["nextPageToken"].as_str().expect("next page").to_string();
    let (_, second) =
        device.call("GET", &format!("/v1/files/list?path=/d/&limit=1&pageToken={}", urlencode(&next)), None).await;
    assert_eq!(second["entries"][0]["name"], "sub");
    let (status, stale) =
        device.call("POST", "/v1/files/delete", Some(json!({ "path": "/d/f.txt", "baseVersion": 1 }))).await;
    assert_problem(status, &stale, StatusCode::CONFLICT, "conflict");
    let (status, _) =
        device.call("POST", "/v1/files/delete", Some(json!({ "path": "/d/f.txt", "baseVersion": 3 }))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(device.call("GET", "/v1/files?path=/d/f.txt", None).await.0, StatusCode::NOT_FOUND);
    let synced = device.sync("0").await;
    let tombstone = synced["changes"].as_array().expect("changes").iter().find(|c| c["path"] == "/d/f.txt").expect("f");
    assert_eq!((tombstone["deleted"].as_bool(), tombstone["version"].as_u64()), (Some(true), Some(4)));
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test]
async fn sync_pages_cursors_and_resets() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "di").await, name: "pc" };
    let a = device.upload("a").await;
    for i in 0..5 {
        device.commit(&format!("/f{i}"), &[a.clone()], 0).await;
    }
    let first = device.call("GET", "/v1/sync?cursor=0&limit=2", None).await.1;
    assert_eq!((paths(&first).len(), first["hasMore"].as_bool()), (2, Some(true)));
    let cursor = first["cursor"].as_str().expect("cursor").to_string();
    let rest = device.call("GET", &format!("/v1/sync?cursor={cursor}&limit=10"), None).await.1;
    assert_eq!((paths(&rest).len(), rest["hasMore"].as_bool()), (3, Some(false)));
    let end = rest["cursor"].as_str().expect("cursor").to_string();
    assert_eq!(paths(&device.sync(&end).await), vec![]);
    // A namespace the caller cannot read (never could, or no longer can) is reported as
    // removed and dropped from the cursor; a position past the end of one it reads: 410.
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    for (ns, seq) in [("someone-else", 0), ("not-mine", 1)] {
        let cursor = engine.encode(json!({ ns: seq }).to_string());
        let (status, body) = device.call("GET", &format!("/v1/sync?cursor={cursor}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["changes"][0], json!({ "namespaceId": ns, "namespaceRemoved": true }));
        let next: Value =
            serde_json::from_slice(&engine.decode(body["cursor"].as_str().expect("cursor")).expect("b64"))
                .expect("json");
        assert!(next.get(ns).is_none(), "{next}");
    }
    let mine: Value = serde_json::from_slice(&engine.decode(&end).expect("b64")).expect("json");
    let (ns, _) = mine.as_object().and_then(|m| m.iter().next()).expect("my namespace");
    let cursor = engine.encode(json!({ ns: 1_000_000 }).to_string());
    let (status, problem) = device.call("GET", &format!("/v1/sync?cursor={cursor}"), None).await;
    assert_problem(status, &problem, StatusCode::GONE, "cursor-reset");
    let (status, problem) = device.call("GET", "/v1/sync?cursor=%%%", None).await;
    assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
}

#[tokio::test]
async fn long_poll_wakes_on_a_commit_and_times_out_otherwise() {
    let node = Arc::new(TestNode::start().await);
    let token = user(&node, "ed").await;
    let device = Device { node: &node, token: token.clone(), name: "pc" };
    let end = device.sync("0").await["cursor"].as_str().expect("cursor").to_string();
    let (status, idle) = device.call("GET", &format!("/v1/notify?cursor={end}&timeout=1"), None).await;
    assert_eq!((status, idle), (StatusCode::OK, json!({ "changes": false })));
    let waiter = {
        let (node, token, end) = (node.clone(), token.clone(), end.clone());
        tokio::spawn(async move {
            node.call("GET", &format!("/v1/notify?cursor={end}&timeout=30"), Some(&token), None).await
        })
    };
    let a = device.upload("a").await;
    device.commit("/x", &[a], 0).await;
    let (status, _, woke) = waiter.await.expect("waiter");
    assert_eq!((status, woke), (StatusCode::OK, json!({ "changes": true })));
    let (status, problem) = device.call("GET", &format!("/v1/notify?cursor={end}&timeout=500"), None).await;
    assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
}

#[tokio::test]
async fn bad_commits_are_400_and_other_namespaces_404() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "fu").await, name: "pc" };
    for body in [
        json!({ "path": "relative", "chunks": [], "baseVersion": 0, "size": 0, "mtime": 0 }),
        json!({ "path": "/a/../b", "chunks": [], "baseVersion": 0, "size": 0, "mtime": 0 }),
        json!({ "path": "/a", "chunks": ["xyz"], "baseVersion": 0, "size": 0, "mtime": 0 }),
        json!({ "path": "/a", "chunks": [], "baseVersion": -1, "size": 0, "mtime": 0 }),
        json!({ "path": "/a", "chunks": [] }),
    ] {
        let (status, problem) = device.call("POST", "/v1/files/commit", Some(body)).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
    let body =
        json!({ "path": "/a", "chunks": [], "baseVersion": 0, "size": 0, "mtime": 0, "namespaceId": "not-mine" });
    let (status, problem) = device.call("POST", "/v1/files/commit", Some(body)).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
    let (status, _, problem) = node.call("GET", "/v1/files?path=/a", Some(ADMIN_TOKEN), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
}

#[tokio::test]
async fn a_keyed_commit_replays_its_outcome() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "gi").await, name: "pc" };
    let a = device.upload("a").await;
    let body = json!({ "path": "/k", "chunks": [a], "baseVersion": 0, "size": 1, "mtime": 0 }).to_string();
    let key = [("idempotency-key", "commit-1")];
    let (s1, h1, first) = node.call_with("POST", "/v1/files/commit", Some(&device.token), Some(&body), &key).await;
    let (s2, h2, second) = node.call_with("POST", "/v1/files/commit", Some(&device.token), Some(&body), &key).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(first, second);
    assert!(h1.get("idempotent-replayed").is_none() && h2.get("idempotent-replayed").is_some());
}

#[tokio::test]
async fn move_renames_and_both_paths_sync() {
    let node = TestNode::start().await;
    let device = Device { node: &node, token: user(&node, "hu").await, name: "pc" };
    let a = device.upload("a").await;
    device.commit("/from.txt", &[a.clone()], 0).await;
    let (status, moved) = device
        .call("POST", "/v1/files/move", Some(json!({ "from": "/from.txt", "to": "/to.txt", "baseVersion": 1 })))
        .await;
    assert_eq!((status, moved["version"].as_u64()), (StatusCode::CREATED, Some(1)));
    assert_eq!(device.call("GET", "/v1/files?path=/from.txt", None).await.0, StatusCode::NOT_FOUND);
    let (_, to) = device.call("GET", "/v1/files?path=/to.txt", None).await;
    assert_eq!(to["chunks"], json!([a]));
    let synced = device.sync("0").await;
    let from = synced["changes"].as_array().expect("changes").iter().find(|c| c["path"] == "/from.txt").expect("from");
    assert_eq!(from["deleted"], true);
    let (status, problem) = device
        .call("POST", "/v1/files/move", Some(json!({ "from": "/to.txt", "to": "/to.txt", "baseVersion": 1 })))
        .await;
    assert_problem(status, &problem, StatusCode::CONFLICT, "conflict");
}

/// A commit naming 15,000 blocks nobody uploaded is refused by the node that receives it,
/// before it is proposed, listing at most `MISSING_REPORTED_MAX` of them.
#[tokio::test]
async fn a_hopeless_commit_is_refused_before_it_reaches_the_log() {
    let node = TestNode::start().await;
    let token = node.create_token(node.create_user("namer").await["userId"].as_str().expect("id")).await;
    let chunks: Vec<String> = (0..15_000u32).map(|i| blake3::hash(&i.to_le_bytes()).to_hex().to_string()).collect();
    let body = json!({ "path": "/x", "chunks": chunks, "baseVersion": 0, "size": 1, "mtime": 0 }).to_string();
    let started = std::time::Instant::now();
    let (status, _, problem) = node.call("POST", "/v1/files/commit", Some(&token), Some(&body)).await;
    eprintln!("refused in {:?}", started.elapsed());
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["type"], "missing-chunks");
    let missing = problem["missing"].as_array().expect("missing");
    assert_eq!(missing.len(), 1_000, "MISSING_REPORTED_MAX");
    assert_eq!(missing[0], chunks[0].as_str());
}

#[tokio::test]
async fn a_whole_file_goes_up_and_comes_back_in_one_request_and_a_block_is_hashed_by_the_server() {
    let node = TestNode::start().await;
    let token = user(&node, "curl").await;
    // 3 MiB of varied bytes: cut into more than one block.
    let mut data = vec![0u8; 3 << 20];
    blake3::Hasher::new().update(b"whole file").finalize_xof().fill(&mut data);
    let put = |data: Vec<u8>| {
        node.call_raw("PUT", "/v1/files/content?path=/up/big.bin", Some(&token), "application/octet-stream", data)
    };
    let (status, _, body) = put(data.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
    let created: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(created["version"], 1);
    let (status, headers, back) = node
        .call_raw("GET", "/v1/files/content?path=/up/big.bin", Some(&token), "application/octet-stream", Vec::new())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-length"], (3 << 20).to_string().as_str());
    assert!(back == data, "the bytes came back changed");
    let (_, _, meta) = node.call("GET", "/v1/files?path=/up/big.bin", Some(&token), None).await;
    assert!(meta["chunks"].as_array().expect("chunks").len() > 1, "one block for 3 MiB: {meta}");
    // The same bytes again change nothing; other bytes are version 2.
    let (status, _, body) = put(data.clone()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, _, _) = put(b"short now".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    // A stale baseVersion keeps the upload as a conflicted copy (409), as a commit would.
    let (status, _, _) = node
        .call_raw(
            "PUT",
            "/v1/files/content?path=/up/big.bin&baseVersion=1",
            Some(&token),
            "application/octet-stream",
            b"late".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Refused before a byte is taken: a bad path, and another user's namespace.
    let (status, _, _) = node
        .call_raw("PUT", "/v1/files/content?path=up", Some(&token), "application/octet-stream", b"x".to_vec())
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = node
        .call_raw(
            "PUT",
            "/v1/files/content?path=/x&namespaceId=nope",
            Some(&token),
            "application/octet-stream",
            b"x".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = node
        .call_raw("GET", "/v1/files/content?path=/up/none", Some(&token), "application/octet-stream", Vec::new())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // POST /v1/blocks: the server names the block by its hash; it is then the caller's.
    let (status, _, body) =
        node.call_raw("POST", "/v1/blocks", Some(&token), "application/octet-stream", b"a piece".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    let stored: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(stored["hash"], BlockHash::of(b"a piece").to_hex());
    let (status, _, _) = node
        .call("POST", "/v1/blocks/status", Some(&token), Some(&json!({ "hashes": [stored["hash"]] }).to_string()))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = node
        .call_raw(
            "POST",
            "/v1/blocks",
            Some(&token),
            "application/octet-stream",
            vec![0; raftbox_storage::blocks::BLOCK_BYTES_MAX + 1],
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}
