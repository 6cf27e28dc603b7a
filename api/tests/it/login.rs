//! Passwords and login (issue 25, item 2): a session token for a name and password; the same
//! 401 for a wrong password, an unknown name and a user without a password; a password change
//! needs the current one; the admin sets and removes them; attempts per name are limited.

use reqwest::StatusCode;
use serde_json::json;

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

async fn login(node: &TestNode, name: &str, password: &str) -> (StatusCode, serde_json::Value) {
    let body = json!({ "name": name, "password": password }).to_string();
    let (status, _, body) = node.call("POST", "/v1/login", None, Some(&body)).await;
    (status, body)
}

#[tokio::test]
async fn a_password_logs_in_and_wrong_ones_are_told_apart_from_nothing() {
    let node = TestNode::start().await;
    let user = node.create_user("pat").await;
    let user_id = user["userId"].as_str().expect("id").to_string();
    let token = node.create_token(&user_id).await;

    // No password yet: the same 401 as a wrong one, and as an unknown name.
    let (status, body) = login(&node, "pat", "correct horse").await;
    assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");
    let (_, unknown) = login(&node, "nobody", "correct horse").await;
    assert_eq!(unknown["detail"], body["detail"]);

    // The user sets one; too short is refused.
    let short = json!({ "password": "short" }).to_string();
    let (status, _, body) = node.call("PUT", "/v1/me/password", Some(&token), Some(&short)).await;
    assert_problem(status, &body, StatusCode::BAD_REQUEST, "bad-request");
    let set = json!({ "password": "correct horse" }).to_string();
    let (status, _, body) = node.call("PUT", "/v1/me/password", Some(&token), Some(&set)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // It logs in: a bearer token that works, with an expiry.
    let (status, session) = login(&node, "pat", "correct horse").await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    assert!(session["expiresAt"].is_string(), "{session}");
    let session_token = session["token"].as_str().expect("token");
    let (status, _, me) = node.call("GET", "/v1/me", Some(session_token), None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["name"], "pat", "{me}");
    let (status, body) = login(&node, "pat", "wrong horse").await;
    assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");

    // A change needs the current password.
    let change = json!({ "password": "battery staple" }).to_string();
    let (status, _, body) = node.call("PUT", "/v1/me/password", Some(session_token), Some(&change)).await;
    assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let change = json!({ "password": "battery staple", "currentPassword": "correct horse" }).to_string();
    let (status, _, body) = node.call("PUT", "/v1/me/password", Some(session_token), Some(&change)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(login(&node, "pat", "correct horse").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(login(&node, "pat", "battery staple").await.0, StatusCode::CREATED);

    // The admin sets and removes it; only the admin may.
    let path = format!("/v1/admin/users/{user_id}/password");
    let reset = json!({ "password": "admin chose this" }).to_string();
    let (status, _, body) = node.call("PUT", &path, Some(&token), Some(&reset)).await;
    assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, _, body) = node.call("PUT", &path, Some(ADMIN_TOKEN), Some(&reset)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(login(&node, "pat", "admin chose this").await.0, StatusCode::CREATED);
    let (status, _, body) = node.call("DELETE", &path, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(login(&node, "pat", "admin chose this").await.0, StatusCode::UNAUTHORIZED);
    let (status, _, body) =
        node.call("PUT", "/v1/admin/users/no-such-user/password", Some(ADMIN_TOKEN), Some(&reset)).await;
    assert_problem(status, &body, StatusCode::NOT_FOUND, "not-found");
}

#[tokio::test]
async fn attempts_on_one_name_are_limited_before_any_hashing() {
    let node = TestNode::start().await;
    let mut statuses = Vec::new();
    for _ in 0..raftbox_api::routes::login::LOGINS_PER_NAME + 2 {
        statuses.push(login(&node, "target", "guess guess guess").await.0);
    }
    let limited = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(limited, 2, "{statuses:?}");
    // Another name is not held back by it.
    assert_eq!(login(&node, "someone", "guess guess guess").await.0, StatusCode::UNAUTHORIZED);
}
