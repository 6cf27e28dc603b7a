//! Share links through the HTTP API: a file and a folder read without an account; a
//! password asked with Basic authentication; a download limit, an expiry and a revocation
//! that stop a link (410, 404); a link stops when its creator loses access; nothing outside
//! the shared folder is reachable through it.

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::TestNode;

async fn user(node: &TestNode, name: &str) -> (String, String) {
    let user = node.create_user(name).await;
    let id = user["userId"].as_str().expect("id").to_owned();
    let token = node.create_token(&id).await;
    (id, token)
}

async fn put(node: &TestNode, token: &str, query: &str, data: &[u8]) {
    let path = format!("/v1/files/content?{query}");
    let (status, _, body) = node.call_raw("PUT", &path, Some(token), "application/octet-stream", data.to_vec()).await;
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
}

async fn link(node: &TestNode, token: &str, body: Value) -> (StatusCode, Value) {
    let (status, _, answer) = node.call("POST", "/v1/links", Some(token), Some(&body.to_string())).await;
    (status, answer)
}

fn basic(password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("anyone:{password}")))
}

#[tokio::test]
async fn links_share_files_and_folders_without_an_account_until_they_stop() {
    let node = TestNode::start().await;
    let (_, alice) = user(&node, "alice-links").await;
    put(&node, &alice, "path=/docs/a.txt", b"file a").await;
    put(&node, &alice, "path=/docs/sub/%3Cb%3E.txt", b"file <b>").await;
    put(&node, &alice, "path=/private.txt", b"not shared").await;

    // A file: read by anyone with the URL, named in Content-Disposition.
    let (status, made) = link(&node, &alice, json!({ "path": "/docs/a.txt" })).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let url = made["url"].as_str().expect("url").to_owned();
    assert!(made["token"].as_str().is_some_and(|t| url.ends_with(t)), "{made}");
    let (status, headers, body) = node.get_raw(&url, &[]).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"file a"[..]));
    assert!(headers["content-disposition"].to_str().expect("ascii").contains("a.txt"));
    let (status, _, _) = node.get_raw(&format!("{url}/more"), &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a file link has nothing under it");

    // A folder: its listing (JSON or a page), its files, its subfolders; nothing outside.
    let (_, folder) = link(&node, &alice, json!({ "folder": "/docs/" })).await;
    let folder_url = folder["url"].as_str().expect("url").to_owned();
    let (status, _, listing) = node.get_raw(&folder_url, &[("accept", "application/json")]).await;
    assert_eq!(status, StatusCode::OK);
    let listing: Value = serde_json::from_slice(&listing).expect("json");
    let names: Vec<&str> =
        listing["entries"].as_array().expect("entries").iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["a.txt", "sub"], "{listing}");
    let (status, headers, page) = node.get_raw(&format!("{folder_url}/sub/"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().expect("ascii").starts_with("text/html"));
    // The node's own page: shown, sandboxed, not sent as a download like a user's file.
    assert_eq!(headers["content-disposition"], "inline");
    assert!(headers["content-security-policy"].to_str().expect("ascii").starts_with("sandbox"));
    let page = String::from_utf8(page).expect("utf-8");
    assert!(page.contains("&lt;b&gt;.txt") && !page.contains("<b>.txt"), "names are text on the page: {page}");
    let (status, _, body) = node.get_raw(&format!("{folder_url}/sub/%3Cb%3E.txt"), &[]).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"file <b>"[..]));
    for outside in ["/../private.txt", "/%2E%2E/private.txt", "/sub/../../private.txt"] {
        let (status, _, body) = node.get_raw(&format!("{folder_url}{outside}"), &[]).await;
        assert!(status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST, "{outside}: {status}");
        assert_ne!(body, b"not shared");
    }

    // A password, asked the HTTP way.
    let (_, guarded) = link(&node, &alice, json!({ "path": "/docs/a.txt", "password": "open sesame" })).await;
    let guarded_url = guarded["url"].as_str().expect("url").to_owned();
    let (status, headers, _) = node.get_raw(&guarded_url, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers["www-authenticate"].to_str().expect("ascii").starts_with("Basic"));
    for guess in ["wrong guess", "another wrong guess"] {
        let (status, _, _) = node.get_raw(&guarded_url, &[("authorization", &basic(guess))]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{guess}");
    }
    // A second wrong try makes this address wait a second before the next (a back-off per
    // link and address; the first costs no wait): at once, 429; once it is over, the right
    // password opens the link.
    let (status, headers, _) = node.get_raw(&guarded_url, &[("authorization", &basic("open sesame"))]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (status, body) = loop {
        let (status, _, body) = node.get_raw(&guarded_url, &[("authorization", &basic("open sesame"))]).await;
        if status != StatusCode::TOO_MANY_REQUESTS || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"file a"[..]));

    // Downloads used up: 410 from then on.
    let (_, once) = link(&node, &alice, json!({ "path": "/docs/a.txt", "maxDownloads": 1 })).await;
    let once_url = once["url"].as_str().expect("url").to_owned();
    assert_eq!(node.get_raw(&once_url, &[]).await.0, StatusCode::OK);
    assert_eq!(node.get_raw(&once_url, &[]).await.0, StatusCode::GONE);

    // Expired: 410.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let soon = raftbox_storage::schedule::format_utc(now + 1_500);
    let (status, expiring) = link(&node, &alice, json!({ "path": "/docs/a.txt", "expiresAt": soon })).await;
    assert_eq!(status, StatusCode::CREATED, "{expiring}");
    let expiring_url = expiring["url"].as_str().expect("url").to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = node.get_raw(&expiring_url, &[]).await.0;
        if status == StatusCode::GONE {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(std::time::Instant::now() < deadline, "the link did not expire");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Listed for the creator, without tokens; revoked, gone at once.
    let (status, _, listed) = node.call("GET", "/v1/links", Some(&alice), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["links"].as_array().expect("links").len(), 5, "{listed}");
    assert!(!listed.to_string().contains("rbxl_"), "a listing shows a token: {listed}");
    let id = made["link"]["linkId"].as_str().expect("id");
    assert_eq!(node.call("DELETE", &format!("/v1/links/{id}"), Some(&alice), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::NOT_FOUND);
    assert_eq!(node.call("DELETE", &format!("/v1/links/{id}"), Some(&alice), None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(node.get_raw("/s/rbxl_nothing", &[]).await.0, StatusCode::NOT_FOUND);

    // Refused: neither or both of path and folder, a missing file, a past expiry, another's namespace.
    for (body, expected) in [
        (json!({}), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "path": "/docs/a.txt", "folder": "/" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "path": "/docs/none.txt" }), StatusCode::NOT_FOUND),
        (json!({ "path": "/docs/a.txt", "expiresAt": "2020-01-01T00:00:00Z" }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "path": "/docs/a.txt", "maxDownloads": 0 }), StatusCode::BAD_REQUEST),
        (json!({ "folder": "/", "namespaceId": "someone-else" }), StatusCode::NOT_FOUND),
    ] {
        let (status, answer) = link(&node, &alice, body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
    }
}

#[tokio::test]
async fn a_link_stops_when_its_creator_loses_access() {
    let node = TestNode::start().await;
    let (_, owner) = user(&node, "owner-links").await;
    let (bob_id, bob) = user(&node, "bob-links").await;
    let (_, _, team) = node.call("POST", "/v1/namespaces", Some(&owner), Some(r#"{"name":"team-links"}"#)).await;
    let team = team["namespaceId"].as_str().expect("namespace").to_owned();
    put(&node, &owner, &format!("path=/plan.txt&namespaceId={team}"), b"the plan").await;
    let grant = json!({ "userId": bob_id, "role": "viewer" }).to_string();
    assert_eq!(
        node.call("PUT", &format!("/v1/namespaces/{team}/acl"), Some(&owner), Some(&grant)).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        node.call("POST", &format!("/v1/namespaces/{team}/accept"), Some(&bob), Some("{}")).await.0,
        StatusCode::NO_CONTENT
    );
    // A viewer may not open the folder to everyone; an editor may.
    let (status, refused) = link(&node, &bob, json!({ "path": "/plan.txt", "namespaceId": team })).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let editor = json!({ "userId": bob_id, "role": "editor" }).to_string();
    assert_eq!(
        node.call("PUT", &format!("/v1/namespaces/{team}/acl"), Some(&owner), Some(&editor)).await.0,
        StatusCode::NO_CONTENT
    );
    let (status, made) = link(&node, &bob, json!({ "path": "/plan.txt", "namespaceId": team })).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let url = made["url"].as_str().expect("url").to_owned();
    assert_eq!(node.get_raw(&url, &[]).await.2, b"the plan");
    let revoke = format!("/v1/namespaces/{team}/acl/users/{bob_id}");
    assert_eq!(node.call("DELETE", &revoke, Some(&owner), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.get_raw(&url, &[]).await.0, StatusCode::NOT_FOUND, "bob's link outlived his access");
}
