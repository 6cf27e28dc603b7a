//! Sharing through the real HTTP API: the permission matrix (every role × every route, one
//! table), and the life of a shared folder (grant, sync from 0, revoke, leave, delete, the
//! last owner, groups).

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use raftbox_storage::blocks::BlockHash;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

use crate::{TestNode, ADMIN_TOKEN};

/// The roles of the matrix, in the order of its columns.
const ROLES: [&str; 6] = ["none", "viewer", "editor", "owner", "member", "admin"];

/// What each role gets from each route: one row per route, one column per role. A cell is
/// the status, and for answers whose body matters, a word about it.
const EXPECTED: &[(&str, [&str; 6])] = &[
    ("GET file", ["404", "200", "200", "200", "200", "404"]),
    ("GET history", ["404", "200", "200", "200", "200", "404"]),
    ("GET list", ["404", "200", "200", "200", "200", "404"]),
    ("GET block", ["404", "200", "200", "200", "200", "404"]),
    ("POST blocks/status", ["200 missing", "200 present", "200 present", "200 present", "200 present", "200 missing"]),
    ("GET sync", ["200 -", "200 team", "200 team", "200 team", "200 team", "200 -"]),
    ("GET notify", ["200 quiet", "200 changes", "200 changes", "200 changes", "200 changes", "200 quiet"]),
    ("WS notify", ["quiet", "team", "team", "team", "team", "quiet"]),
    ("GET namespaces", ["200 -", "200 viewer", "200 editor", "200 owner", "200 editor", "200 -"]),
    ("GET acl", ["404", "200", "200", "200", "200", "404"]),
    ("POST commit", ["404", "403", "201", "201", "201", "404"]),
    ("POST restore", ["404", "403", "201", "201", "201", "404"]),
    ("POST move", ["404", "403", "201", "201", "201", "404"]),
    ("POST delete", ["404", "403", "201", "201", "201", "404"]),
    ("PUT acl", ["404", "403", "403", "204", "403", "404"]),
    ("DELETE acl user", ["404", "403", "403", "204", "403", "404"]),
    ("DELETE acl group", ["404", "403", "403", "204", "403", "404"]),
    ("POST leave", ["404", "204", "204", "409", "404", "404"]),
    ("DELETE folder", ["404", "403", "403", "204", "403", "404"]),
    ("POST namespaces", ["201", "201", "201", "201", "201", "201"]),
    ("GET job", ["404", "404", "404", "200", "404", "200"]),
    ("GET job runs", ["404", "404", "404", "200", "404", "200"]),
    ("POST admin/groups", ["403", "403", "403", "403", "403", "201"]),
    ("GET admin/groups", ["403", "403", "403", "403", "403", "200"]),
    ("GET admin/group", ["403", "403", "403", "403", "403", "200"]),
    ("PUT group member", ["403", "403", "403", "403", "403", "204"]),
    ("DELETE group member", ["403", "403", "403", "403", "403", "204"]),
];

struct Caller<'a> {
    node: &'a TestNode,
    token: String,
    user_id: String,
}

impl Caller<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|b| b.to_string());
        let headers = [("x-device-id", "phone")];
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

    async fn commit(&self, namespace: &str, path: &str, chunks: &[&str], base: u64) -> (StatusCode, Value) {
        let body = json!({ "namespaceId": namespace, "path": path, "chunks": chunks, "baseVersion": base, "size": 1, "mtime": 0 });
        self.call("POST", "/v1/files/commit", Some(body)).await
    }

    async fn sync(&self, cursor: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/v1/sync?cursor={cursor}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// `PUT …/acl`: an invitation for a new grantee, a role change for an existing one.
    async fn invite(&self, namespace: &str, grantee: Value, role: &str) -> StatusCode {
        let mut body = grantee;
        body["role"] = json!(role);
        self.call("PUT", &format!("/v1/namespaces/{namespace}/acl"), Some(body)).await.0
    }

    /// Invites and has the grantee accept (a user with their own token, a group by the
    /// admin): a share in effect.
    async fn grant(&self, namespace: &str, grantee: Value, role: &str) -> StatusCode {
        let status = self.invite(namespace, grantee.clone(), role).await;
        if status != StatusCode::NO_CONTENT {
            return status;
        }
        let path = format!("/v1/namespaces/{namespace}/accept");
        let (token, body) = if grantee.get("groupId").is_some() || grantee.get("groupName").is_some() {
            (ADMIN_TOKEN.to_string(), Some(grantee.to_string()))
        } else {
            let who = grantee["userId"].as_str().or(grantee["userName"].as_str()).expect("a grantee");
            (token_of_known(self.node, who), None)
        };
        let (accepted, _, answer) = self.node.call("POST", &path, Some(&token), body.as_deref()).await;
        assert_eq!(accepted, StatusCode::NO_CONTENT, "accept: {answer}");
        status
    }

    async fn create_folder(&self, name: &str) -> String {
        let (status, body) = self.call("POST", "/v1/namespaces", Some(json!({ "name": name }))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["namespaceId"].as_str().expect("namespaceId").to_string()
    }

    async fn websocket(
        &self,
    ) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
        let url = format!("{}/v1/notify/ws", self.node.url.replacen("http", "ws", 1));
        let mut request = url.into_client_request().expect("request");
        request.headers_mut().insert("authorization", format!("Bearer {}", self.token).parse().expect("header"));
        tokio_tungstenite::connect_async(request).await.expect("connect").0
    }
}

/// The tokens of the users these tests made, by (node, user id or name): who accepts an
/// invitation in [`Caller::grant`].
static KNOWN: std::sync::Mutex<BTreeMap<(String, String), String>> = std::sync::Mutex::new(BTreeMap::new());

fn remember(node: &TestNode, names: [&str; 2], token: &str) {
    let mut known = KNOWN.lock().expect("known tokens");
    for name in names {
        known.insert((node.url.clone(), name.to_string()), token.to_string());
    }
}

fn token_of_known(node: &TestNode, who: &str) -> String {
    KNOWN.lock().expect("known tokens").get(&(node.url.clone(), who.to_string())).cloned().expect("a known user")
}

async fn caller<'a>(node: &'a TestNode, name: &str) -> Caller<'a> {
    let user = node.create_user(name).await;
    let user_id = user["userId"].as_str().expect("id").to_string();
    let token = node.create_token(&user_id).await;
    remember(node, [name, &user_id], &token);
    Caller { node, token, user_id }
}

async fn admin(node: &TestNode) -> Caller<'_> {
    let (_, _, me) = node.call("GET", "/v1/me", Some(ADMIN_TOKEN), None).await;
    let (user_id, name) = (me["userId"].as_str().expect("id"), me["name"].as_str().unwrap_or("admin"));
    remember(node, [name, user_id], ADMIN_TOKEN);
    Caller { node, token: ADMIN_TOKEN.into(), user_id: user_id.into() }
}

async fn create_group(node: &TestNode, name: &str, members: &[&str]) -> String {
    let body = json!({ "name": name }).to_string();
    let (status, _, group) = node.call("POST", "/v1/admin/groups", Some(ADMIN_TOKEN), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{group}");
    let id = group["groupId"].as_str().expect("groupId").to_string();
    for member in members {
        let path = format!("/v1/admin/groups/{id}/members/{member}");
        assert_eq!(node.call("PUT", &path, Some(ADMIN_TOKEN), None).await.0, StatusCode::NO_CONTENT);
    }
    id
}

fn sync_word(sync: &Value, team: &str) -> &'static str {
    let changes = sync["changes"].as_array().expect("changes");
    if changes.iter().any(|c| c["namespaceId"] == team) {
        "team"
    } else {
        "-"
    }
}

/// The next message on a socket within `wait`, as "team" (the folder changed), "other" or
/// "quiet".
async fn heard(
    socket: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    team: &str,
    wait: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, socket.next()).await {
            Err(_) => return "quiet".into(),
            Ok(Some(Ok(Message::Text(text)))) => {
                let value: Value = serde_json::from_str(&text).expect("json");
                if value["namespaceId"] == team {
                    return "team".into();
                }
            }
            Ok(Some(Ok(_))) => continue,
            Ok(other) => return format!("closed {other:?}"),
        }
    }
}

#[tokio::test]
async fn permission_matrix() {
    let node = TestNode::start().await;
    let mut callers = BTreeMap::new();
    for role in ["none", "viewer", "editor", "owner", "member"] {
        callers.insert(role, caller(&node, role).await);
    }
    callers.insert("admin", admin(&node).await);
    let owner = &callers["owner"];
    let spare = caller(&node, "spare").await;
    let design = create_group(&node, "design", &[&callers["member"].user_id]).await;
    let readers = create_group(&node, "readers", &[]).await;
    // The folder of the matrix, and a second one for the deletion row.
    let team = owner.create_folder("team").await;
    let other = owner.create_folder("other").await;
    for folder in [&team, &other] {
        assert_eq!(
            owner.grant(folder, json!({ "userId": callers["viewer"].user_id }), "viewer").await,
            StatusCode::NO_CONTENT
        );
        assert_eq!(owner.grant(folder, json!({ "userName": "editor" }), "editor").await, StatusCode::NO_CONTENT);
        assert_eq!(owner.grant(folder, json!({ "groupId": design }), "editor").await, StatusCode::NO_CONTENT);
    }
    assert_eq!(owner.grant(&team, json!({ "userId": spare.user_id }), "viewer").await, StatusCode::NO_CONTENT);
    assert_eq!(owner.grant(&team, json!({ "groupName": "readers" }), "viewer").await, StatusCode::NO_CONTENT);
    let block = owner.upload("the team's plan").await;
    assert_eq!(owner.commit(&team, "/doc.txt", &[&block], 0).await.0, StatusCode::CREATED);
    for role in ROLES {
        for prefix in ["m", "d"] {
            let (status, body) = owner.commit(&team, &format!("/{prefix}-{role}.txt"), &[&block], 0).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
    }
    let job =
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 0 });
    let (status, created) = owner.call("POST", "/v1/jobs", Some(job)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let job_id = created["jobId"].as_str().expect("jobId").to_string();

    // WebSockets open before a change to the folder: who hears it.
    let mut sockets = Vec::new();
    for role in ROLES {
        sockets.push((role, callers[role].websocket().await));
    }
    let mut ws_row = BTreeMap::new();
    assert_eq!(owner.commit(&team, "/ws.txt", &[&block], 0).await.0, StatusCode::CREATED);
    for (role, socket) in sockets.iter_mut() {
        let wait = if matches!(*role, "none" | "admin") { Duration::from_millis(500) } else { Duration::from_secs(5) };
        ws_row.insert(*role, heard(socket, &team, wait).await);
    }
    drop(sockets);

    let ns = |path: &str| format!("{path}{}namespaceId={team}", if path.contains('?') { "&" } else { "?" });
    let mut actual: Vec<(String, BTreeMap<&str, String>)> = Vec::new();
    for (route, _) in EXPECTED {
        let mut row = BTreeMap::new();
        // The owner acts last: its changes (revoking, deleting) must not decide other cells.
        for role in ["none", "viewer", "editor", "member", "admin", "owner"] {
            let c = &callers[role];
            let status_only = |(status, _): (StatusCode, Value)| status.as_u16().to_string();
            let cell = match *route {
                "GET file" => status_only(c.call("GET", &ns("/v1/files?path=/doc.txt"), None).await),
                "GET history" => status_only(c.call("GET", &ns("/v1/files/history?path=/doc.txt"), None).await),
                "GET list" => status_only(c.call("GET", &ns("/v1/files/list?path=/"), None).await),
                "GET block" => status_only(c.call("GET", &format!("/v1/blocks/{block}"), None).await),
                "POST blocks/status" => {
                    let (status, body) = c.call("POST", "/v1/blocks/status", Some(json!({ "hashes": [block] }))).await;
                    let word =
                        if body["missing"].as_array().is_some_and(|m| m.is_empty()) { "present" } else { "missing" };
                    format!("{} {word}", status.as_u16())
                }
                "GET sync" => {
                    let (status, body) = c.call("GET", "/v1/sync?cursor=0", None).await;
                    format!("{} {}", status.as_u16(), sync_word(&body, &team))
                }
                "GET notify" => {
                    let (status, body) = c.call("GET", "/v1/notify?cursor=0&timeout=1", None).await;
                    let word = if body["changes"] == true { "changes" } else { "quiet" };
                    format!("{} {word}", status.as_u16())
                }
                "WS notify" => ws_row[role].clone(),
                "GET namespaces" => {
                    let (status, body) = c.call("GET", "/v1/namespaces", None).await;
                    let found =
                        body["namespaces"].as_array().and_then(|list| list.iter().find(|n| n["namespaceId"] == team));
                    format!("{} {}", status.as_u16(), found.and_then(|n| n["role"].as_str()).unwrap_or("-"))
                }
                "GET acl" => status_only(c.call("GET", &format!("/v1/namespaces/{team}/acl"), None).await),
                "POST commit" => status_only(c.commit(&team, &format!("/by-{role}.txt"), &[&block], 0).await),
                "POST restore" => status_only(
                    c.call(
                        "POST",
                        "/v1/files/restore",
                        Some(json!({ "namespaceId": team, "path": "/doc.txt", "version": 1 })),
                    )
                    .await,
                ),
                "POST move" => {
                    let body = json!({ "namespaceId": team, "from": format!("/m-{role}.txt"), "to": format!("/moved-{role}.txt"), "baseVersion": 1 });
                    status_only(c.call("POST", "/v1/files/move", Some(body)).await)
                }
                "POST delete" => {
                    let body = json!({ "namespaceId": team, "path": format!("/d-{role}.txt"), "baseVersion": 1 });
                    status_only(c.call("POST", "/v1/files/delete", Some(body)).await)
                }
                "PUT acl" => {
                    let status = c.grant(&team, json!({ "userName": "none" }), "viewer").await;
                    if status == StatusCode::NO_CONTENT {
                        // Taken back at once, so that later rows still see "none" as a stranger.
                        let path = format!("/v1/namespaces/{team}/acl/users/{}", callers["none"].user_id);
                        assert_eq!(c.call("DELETE", &path, None).await.0, StatusCode::NO_CONTENT);
                    }
                    status.as_u16().to_string()
                }
                "DELETE acl user" => status_only(
                    c.call("DELETE", &format!("/v1/namespaces/{team}/acl/users/{}", spare.user_id), None).await,
                ),
                "DELETE acl group" => {
                    status_only(c.call("DELETE", &format!("/v1/namespaces/{team}/acl/groups/{readers}"), None).await)
                }
                "POST leave" => status_only(c.call("POST", &format!("/v1/namespaces/{team}/leave"), None).await),
                "DELETE folder" => status_only(c.call("DELETE", &format!("/v1/namespaces/{other}"), None).await),
                "POST namespaces" => {
                    status_only(c.call("POST", "/v1/namespaces", Some(json!({ "name": format!("{role}'s") }))).await)
                }
                "GET job" => status_only(c.call("GET", &format!("/v1/jobs/{job_id}"), None).await),
                "GET job runs" => status_only(c.call("GET", &format!("/v1/jobs/{job_id}/runs"), None).await),
                "POST admin/groups" => {
                    status_only(c.call("POST", "/v1/admin/groups", Some(json!({ "name": format!("g-{role}") }))).await)
                }
                "GET admin/groups" => status_only(c.call("GET", "/v1/admin/groups", None).await),
                "GET admin/group" => status_only(c.call("GET", &format!("/v1/admin/groups/{design}"), None).await),
                "PUT group member" => status_only(
                    c.call("PUT", &format!("/v1/admin/groups/{readers}/members/{}", spare.user_id), None).await,
                ),
                "DELETE group member" => status_only(
                    c.call("DELETE", &format!("/v1/admin/groups/{readers}/members/{}", spare.user_id), None).await,
                ),
                other => panic!("no request for row {other}"),
            };
            row.insert(role, cell);
        }
        actual.push((route.to_string(), row));
    }

    let table = render(&actual);
    eprintln!("{table}");
    let mismatches: Vec<String> = EXPECTED
        .iter()
        .zip(&actual)
        .flat_map(|((route, expected), (_, row))| {
            ROLES
                .iter()
                .zip(expected)
                .filter(|(role, want)| row[**role] != **want)
                .map(move |(role, want)| format!("{route} as {role}: expected {want}, got {}", row[*role]))
        })
        .collect();
    assert!(mismatches.is_empty(), "the permission matrix differs:\n{}\nactual:\n{table}", mismatches.join("\n"));
}

fn render(rows: &[(String, BTreeMap<&str, String>)]) -> String {
    let mut out = format!("{:<20}", "route");
    for role in ROLES {
        out.push_str(&format!(" | {role:<13}"));
    }
    for (route, row) in rows {
        out.push_str(&format!("\n{route:<20}"));
        for role in ROLES {
            out.push_str(&format!(" | {:<13}", row[role]));
        }
    }
    out
}

fn changes_in<'a>(sync: &'a Value, namespace: &str) -> Vec<&'a Value> {
    sync["changes"].as_array().expect("changes").iter().filter(|c| c["namespaceId"] == namespace).collect()
}

#[tokio::test]
async fn a_grant_brings_the_whole_folder_and_a_revoke_removes_it_once() {
    let node = TestNode::start().await;
    let ann = caller(&node, "ann").await;
    let bob = caller(&node, "bob").await;
    let team = ann.create_folder("team").await;
    let block = ann.upload("hello").await;
    for path in ["/a.txt", "/b/c.txt"] {
        assert_eq!(ann.commit(&team, path, &[&block], 0).await.0, StatusCode::CREATED);
    }
    // bob syncs before the grant: nothing of the folder.
    let before = bob.sync("0").await;
    assert!(changes_in(&before, &team).is_empty());
    let cursor = before["cursor"].as_str().expect("cursor").to_string();
    // A long poll on bob's cursor wakes when the grant lands.
    let poll = {
        let (node_url, token, cursor) = (node.url.clone(), bob.token.clone(), cursor.clone());
        tokio::spawn(async move {
            let url = format!("{node_url}/v1/notify?cursor={cursor}&timeout=30");
            let answer: Value = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("poll")
                .json()
                .await
                .expect("json");
            answer
        })
    };
    assert_eq!(ann.grant(&team, json!({ "userId": bob.user_id }), "viewer").await, StatusCode::NO_CONTENT);
    let woke = tokio::time::timeout(Duration::from_secs(10), poll).await.expect("the poll woke").expect("join");
    assert_eq!(woke, json!({ "changes": true }));
    // The next sync from bob's old cursor brings the whole tree of the folder.
    let after = bob.sync(&cursor).await;
    let mut paths: Vec<&str> = changes_in(&after, &team).iter().map(|c| c["path"].as_str().expect("path")).collect();
    paths.sort();
    assert_eq!(paths, vec!["/a.txt", "/b/c.txt"]);
    // bob may now read the folder's blocks, and not write.
    assert_eq!(bob.call("GET", &format!("/v1/blocks/{block}"), None).await.0, StatusCode::OK);
    assert_eq!(bob.commit(&team, "/x.txt", &[&block], 0).await.0, StatusCode::FORBIDDEN);
    let cursor = after["cursor"].as_str().expect("cursor").to_string();
    // Revoked: reported once, then gone; files and blocks are 404 to him.
    let path = format!("/v1/namespaces/{team}/acl/users/{}", bob.user_id);
    assert_eq!(ann.call("DELETE", &path, None).await.0, StatusCode::NO_CONTENT);
    let removed = bob.sync(&cursor).await;
    assert_eq!(removed["changes"], json!([{ "namespaceId": team, "namespaceRemoved": true }]));
    let again = bob.sync(removed["cursor"].as_str().expect("cursor")).await;
    assert_eq!(again["changes"], json!([]));
    assert_eq!(
        bob.call("GET", &format!("/v1/files?path=/a.txt&namespaceId={team}"), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(bob.call("GET", &format!("/v1/blocks/{block}"), None).await.0, StatusCode::NOT_FOUND);
    let status = bob.call("POST", "/v1/blocks/status", Some(json!({ "hashes": [block] }))).await.1;
    assert_eq!(status["missing"], json!([block]));
}

#[tokio::test]
async fn leaving_deleting_and_the_last_owner() {
    let node = TestNode::start().await;
    let ann = caller(&node, "ann").await;
    let bob = caller(&node, "bob").await;
    let team = ann.create_folder("team").await;
    assert_eq!(ann.grant(&team, json!({ "userName": "bob" }), "editor").await, StatusCode::NO_CONTENT);
    // The last owner can neither leave nor be demoted.
    let (status, body) = ann.call("POST", &format!("/v1/namespaces/{team}/leave"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(ann.grant(&team, json!({ "userId": ann.user_id }), "editor").await, StatusCode::CONFLICT);
    // An editor cannot promote himself; bob leaves.
    assert_eq!(bob.grant(&team, json!({ "userId": bob.user_id }), "owner").await, StatusCode::FORBIDDEN);
    assert_eq!(bob.call("POST", &format!("/v1/namespaces/{team}/leave"), None).await.0, StatusCode::NO_CONTENT);
    let (_, listed) = bob.call("GET", "/v1/namespaces", None).await;
    assert_eq!(listed["namespaces"].as_array().map(Vec::len), Some(1), "{listed}");
    // With bob an owner again, ann may go; then bob deletes the folder.
    assert_eq!(ann.grant(&team, json!({ "userId": bob.user_id }), "owner").await, StatusCode::NO_CONTENT);
    assert_eq!(ann.call("POST", &format!("/v1/namespaces/{team}/leave"), None).await.0, StatusCode::NO_CONTENT);
    let block = bob.upload("bye").await;
    assert_eq!(bob.commit(&team, "/f.txt", &[&block], 0).await.0, StatusCode::CREATED);
    let cursor = bob.sync("0").await["cursor"].as_str().expect("cursor").to_string();
    assert_eq!(bob.call("DELETE", &format!("/v1/namespaces/{team}"), None).await.0, StatusCode::NO_CONTENT);
    let after = bob.sync(&cursor).await;
    assert_eq!(after["changes"], json!([{ "namespaceId": team, "namespaceRemoved": true }]));
    assert_eq!(bob.call("GET", &format!("/v1/namespaces/{team}/acl"), None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(bob.call("DELETE", &format!("/v1/namespaces/{team}"), None).await.0, StatusCode::NOT_FOUND);
    // A personal namespace cannot be shared or deleted.
    let home = bob.sync("0").await["changes"].clone();
    assert!(home.as_array().is_some_and(Vec::is_empty));
    let (_, me) = bob.call("GET", "/v1/me", None).await;
    let personal = me["namespaceId"].as_str().expect("ns");
    assert_eq!(bob.grant(personal, json!({ "userId": ann.user_id }), "viewer").await, StatusCode::CONFLICT);
    assert_eq!(bob.call("DELETE", &format!("/v1/namespaces/{personal}"), None).await.0, StatusCode::CONFLICT);
}

#[tokio::test]
async fn group_membership_changes_take_effect_at_once() {
    let node = TestNode::start().await;
    let ann = caller(&node, "ann").await;
    let cat = caller(&node, "cat").await;
    let team = ann.create_folder("team").await;
    let group = create_group(&node, "design", &[]).await;
    assert_eq!(ann.grant(&team, json!({ "groupName": "design" }), "editor").await, StatusCode::NO_CONTENT);
    let block = cat.upload("cat's work").await;
    assert_eq!(cat.commit(&team, "/c.txt", &[&block], 0).await.0, StatusCode::NOT_FOUND);
    // A WebSocket open before cat joins the group hears of the folder when she does.
    let mut socket = cat.websocket().await;
    let member = format!("/v1/admin/groups/{group}/members/{}", cat.user_id);
    assert_eq!(node.call("PUT", &member, Some(ADMIN_TOKEN), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(heard(&mut socket, &team, Duration::from_secs(10)).await, "team");
    assert_eq!(cat.commit(&team, "/c.txt", &[&block], 0).await.0, StatusCode::CREATED);
    let (_, _, detail) = node.call("GET", &format!("/v1/admin/groups/{group}"), Some(ADMIN_TOKEN), None).await;
    assert_eq!(detail["members"], json!([{ "userId": cat.user_id, "name": "cat" }]));
    let (_, acl) = ann.call("GET", &format!("/v1/namespaces/{team}/acl"), None).await;
    assert!(acl["entries"].as_array().expect("entries").iter().any(|e| e["groupName"] == "design"), "{acl}");
    // Removed from the group: the folder is gone for her.
    assert_eq!(node.call("DELETE", &member, Some(ADMIN_TOKEN), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.call("DELETE", &member, Some(ADMIN_TOKEN), None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(cat.commit(&team, "/d.txt", &[&block], 0).await.0, StatusCode::NOT_FOUND);
    assert!(changes_in(&cat.sync("0").await, &team).is_empty());
    // Unknown grantees and roles are refused without a change.
    assert_eq!(ann.grant(&team, json!({ "groupName": "nobody" }), "viewer").await, StatusCode::NOT_FOUND);
    assert_eq!(ann.grant(&team, json!({ "groupId": group }), "superuser").await, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn sharing_posts_are_keyed() {
    let node = TestNode::start().await;
    let ann = caller(&node, "ann").await;
    let key = [("idempotency-key", "folder-1")];
    let body = r#"{"name":"plans"}"#;
    let (first, _, created) = node.call_with("POST", "/v1/namespaces", Some(&ann.token), Some(body), &key).await;
    let (again, headers, replayed) = node.call_with("POST", "/v1/namespaces", Some(&ann.token), Some(body), &key).await;
    assert_eq!((first, again), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(created, replayed);
    assert_eq!(headers.get("idempotent-replayed").map(|v| v.to_str().expect("ascii")), Some("true"));
    let (_, listed) = ann.call("GET", "/v1/namespaces", None).await;
    assert_eq!(listed["namespaces"].as_array().map(Vec::len), Some(2), "one folder and the personal namespace");
    let other = r#"{"name":"other"}"#;
    let (reused, _, _) = node.call_with("POST", "/v1/namespaces", Some(&ann.token), Some(other), &key).await;
    assert_eq!(reused, StatusCode::UNPROCESSABLE_ENTITY);
    let group = [("idempotency-key", "group-1")];
    let (a, _, g1) = node.call_with("POST", "/v1/admin/groups", Some(ADMIN_TOKEN), Some(body), &group).await;
    let (b, _, g2) = node.call_with("POST", "/v1/admin/groups", Some(ADMIN_TOKEN), Some(body), &group).await;
    assert_eq!((a, b, g1.clone()), (StatusCode::CREATED, StatusCode::CREATED, g2));
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A token of `user_id` (admin-made, expiring after `expires_in_s` if given): the token and
/// its id.
async fn token_of(node: &TestNode, user_id: &str, expires_in_s: Option<u64>) -> (String, String) {
    let body = json!({ "name": "channel", "expiresInS": expires_in_s }).to_string();
    let path = format!("/v1/admin/users/{user_id}/tokens");
    let (status, _, created) = node.call("POST", &path, Some(ADMIN_TOKEN), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    (created["token"].as_str().expect("token").into(), created["tokenId"].as_str().expect("tokenId").into())
}

/// How a socket ended within `wait`: the close code, or "open" if it did not.
async fn close_code(socket: &mut Socket, wait: Duration) -> String {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, socket.next()).await {
            Err(_) => return "open".into(),
            Ok(Some(Ok(Message::Close(Some(frame))))) => return format!("{} {}", u16::from(frame.code), frame.reason),
            Ok(Some(Ok(Message::Close(None)))) | Ok(None) | Ok(Some(Err(_))) => return "closed without a code".into(),
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// A channel hears a folder granted to its caller (directly, or through a group they join
/// later), its changes and its removal, from the sharing commands' summaries; a revoked or
/// expired token ends its WebSockets (close 1008) and long polls (401) within a second.
#[tokio::test]
async fn channels_follow_access_and_end_with_their_token() {
    // One channel a user: a second is refused while the first is open (how the test knows
    // the long poll below is waiting).
    let limits = raftbox_api::NotifyLimits { per_principal_max: 1, per_node_max: 16 };
    let config = raftbox_api::ApiConfig { notify_limits: limits, ..raftbox_api::ApiConfig::default() };
    let node = TestNode::start_with(config, axum::Router::new()).await;
    let owner = caller(&node, "owner").await;
    let reader = caller(&node, "reader").await;
    let mut socket = reader.websocket().await;
    let team = owner.create_folder("team").await;
    assert_eq!(heard(&mut socket, &team, Duration::from_millis(500)).await, "quiet", "not shared yet");
    assert_eq!(owner.grant(&team, json!({ "userId": reader.user_id }), "viewer").await, StatusCode::NO_CONTENT);
    assert_eq!(heard(&mut socket, &team, Duration::from_secs(5)).await, "team", "granted");
    let block = owner.upload("plan");
    let block = block.await;
    assert_eq!(owner.commit(&team, "/plan.txt", &[&block], 0).await.0, StatusCode::CREATED);
    assert_eq!(heard(&mut socket, &team, Duration::from_secs(5)).await, "team", "changed");
    let via_group = owner.create_folder("via group").await;
    let group = create_group(&node, "crew", &[]).await;
    assert_eq!(owner.grant(&via_group, json!({ "groupId": group }), "viewer").await, StatusCode::NO_CONTENT);
    assert_eq!(heard(&mut socket, &via_group, Duration::from_millis(500)).await, "quiet", "not a member yet");
    let path = format!("/v1/admin/groups/{group}/members/{}", reader.user_id);
    assert_eq!(node.call("PUT", &path, Some(ADMIN_TOKEN), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(heard(&mut socket, &via_group, Duration::from_secs(5)).await, "team", "joined the group");
    let path = format!("/v1/namespaces/{team}/acl/users/{}", reader.user_id);
    assert_eq!(owner.call("DELETE", &path, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(heard(&mut socket, &team, Duration::from_secs(5)).await, "team", "revoked");
    drop(socket);

    // Revoked: the socket and a long poll of that token end within a second.
    let holder = caller(&node, "holder").await;
    let (token, token_id) = token_of(&node, &holder.user_id, None).await;
    let revocable = Caller { node: &node, token: token.clone(), user_id: holder.user_id.clone() };
    let mut socket = revocable.websocket().await;
    let poller = caller(&node, "poller").await;
    let (token, poll_token_id) = token_of(&node, &poller.user_id, None).await;
    let polling = Caller { node: &node, token: token.clone(), user_id: poller.user_id.clone() };
    let end = polling.sync("0").await["cursor"].as_str().expect("cursor").to_string();
    let poll = {
        let (node_url, client) = (node.url.clone(), node.client.clone());
        tokio::spawn(async move {
            loop {
                let answer = client
                    .get(format!("{node_url}/v1/notify?cursor={end}&timeout=30"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .expect("poll");
                // 429: the probe below held the user's one channel for an instant.
                if answer.status() != StatusCode::TOO_MANY_REQUESTS {
                    return (tokio::time::Instant::now(), answer.status());
                }
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while poller.call("GET", "/v1/notify?cursor=0&timeout=1", None).await.0 != StatusCode::TOO_MANY_REQUESTS {
        assert!(tokio::time::Instant::now() < deadline && !poll.is_finished(), "the long poll never opened");
    }
    let revoked_at = tokio::time::Instant::now();
    for (who, id) in [(&holder, &token_id), (&poller, &poll_token_id)] {
        assert_eq!(who.call("DELETE", &format!("/v1/me/tokens/{id}"), None).await.0, StatusCode::OK);
    }
    assert_eq!(close_code(&mut socket, Duration::from_secs(1)).await, "1008 token revoked");
    let (answered_at, status) = poll.await.expect("poll task");
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(answered_at - revoked_at < Duration::from_secs(1), "{:?}", answered_at - revoked_at);

    // Expired: the socket ends when the token does.
    let (token, _) = token_of(&node, &holder.user_id, Some(2)).await;
    let expiring = Caller { node: &node, token, user_id: holder.user_id.clone() };
    let mut socket = expiring.websocket().await;
    assert_eq!(close_code(&mut socket, Duration::from_secs(4)).await, "1008 token expired");
}

/// A share is an invitation until its grantee accepts it: not in their namespaces, sync or
/// notifications before; listed in `GET /v1/me/invitations` and as `pending` in the ACL;
/// declined, it is gone.
#[tokio::test]
async fn a_share_is_an_invitation_until_accepted() {
    let node = TestNode::start().await;
    let ann = caller(&node, "ann").await;
    let bob = caller(&node, "bob").await;
    let team = ann.create_folder("team").await;
    let block = ann.upload("the plan").await;
    assert_eq!(ann.commit(&team, "/plan.txt", &[&block], 0).await.0, StatusCode::CREATED);
    let end = bob.sync("0").await["cursor"].as_str().expect("cursor").to_string();
    assert_eq!(ann.invite(&team, json!({ "userName": "bob" }), "editor").await, StatusCode::NO_CONTENT);
    let (_, listed) = bob.call("GET", "/v1/namespaces", None).await;
    assert!(listed["namespaces"].as_array().expect("list").iter().all(|n| n["namespaceId"] != team), "{listed}");
    assert_eq!(bob.call("GET", &format!("/v1/namespaces/{team}"), None).await.0, StatusCode::NOT_FOUND);
    let (status, _) = bob.call("GET", &format!("/v1/notify?cursor={end}&timeout=1"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, quiet) = bob.call("GET", &format!("/v1/notify?cursor={end}&timeout=1"), None).await;
    assert_eq!(quiet["changes"], false, "an invitation is no change to bob's namespaces");
    let (status, invitations) = bob.call("GET", "/v1/me/invitations", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(invitations["invitations"], json!([{ "namespaceId": team, "name": "team", "role": "editor" }]));
    let (_, acl) = ann.call("GET", &format!("/v1/namespaces/{team}/acl"), None).await;
    let entry = acl["entries"].as_array().expect("entries").iter().find(|e| e["userName"] == "bob").cloned();
    assert_eq!(entry.expect("bob's entry")["pending"], true, "{acl}");
    // Nobody else answers for bob; bob accepts, and the folder is his.
    let accept = format!("/v1/namespaces/{team}/accept");
    let eve = caller(&node, "eve").await;
    assert_eq!(eve.call("POST", &accept, None).await.0, StatusCode::NOT_FOUND, "eve has no invitation");
    assert_eq!(bob.call("POST", &accept, Some(json!({ "groupName": "nobody" }))).await.0, StatusCode::NOT_FOUND);
    assert_eq!(bob.call("POST", &accept, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(bob.call("POST", &accept, None).await.0, StatusCode::NO_CONTENT, "accepting again changes nothing");
    assert_eq!(sync_word(&bob.sync(&end).await, &team), "team");
    let (_, invitations) = bob.call("GET", "/v1/me/invitations", None).await;
    assert_eq!(invitations["invitations"], json!([]));
    // Declined: gone from the ACL; declining again is 404.
    let cat = caller(&node, "cat").await;
    assert_eq!(ann.invite(&team, json!({ "userId": cat.user_id }), "viewer").await, StatusCode::NO_CONTENT);
    let decline = format!("/v1/namespaces/{team}/decline");
    assert_eq!(cat.call("POST", &decline, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(cat.call("POST", &decline, None).await.0, StatusCode::NOT_FOUND);
    let (_, acl) = ann.call("GET", &format!("/v1/namespaces/{team}/acl"), None).await;
    assert!(acl["entries"].as_array().expect("entries").iter().all(|e| e["userName"] != "cat"), "{acl}");
}

/// A user reading 1,300 folders has a cursor too long for a URL: `POST /v1/sync` and
/// `POST /v1/notify` take it in the body.
#[tokio::test]
async fn a_cursor_of_many_folders_travels_in_the_body() {
    let quotas = raftbox_api::Quotas { folders_per_user: 2_000, ..raftbox_api::Quotas::default() };
    let config = raftbox_api::ApiConfig { quotas, ..raftbox_api::ApiConfig::default() };
    let node = TestNode::start_with(config, axum::Router::new()).await;
    let ann = caller(&node, "ann").await;
    for i in 0..1_300 {
        ann.create_folder(&format!("folder {i}")).await;
    }
    let (status, first) = ann.call("POST", "/v1/sync", Some(json!({ "cursor": "0" }))).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let cursor = first["cursor"].as_str().expect("cursor").to_string();
    assert!(cursor.len() > 64 * 1024, "the cursor is {} bytes", cursor.len());
    let (status, next) = ann.call("POST", "/v1/sync", Some(json!({ "cursor": cursor, "limit": 10 }))).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(next["changes"], json!([]));
    let (status, poll) = ann.call("POST", "/v1/notify", Some(json!({ "cursor": cursor, "timeout": 1 }))).await;
    assert_eq!((status, &poll["changes"]), (StatusCode::OK, &json!(false)), "{poll}");
    let (status, problem) = ann.call("POST", "/v1/sync", Some(json!({ "limit": 1 }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no cursor: {problem}");
}
