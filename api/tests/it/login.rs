//! Passwords and login: a session token for a name and password; the same 401 for a wrong
//! password, an unknown name and a user without a password; a password change needs the
//! current one and ends the sessions of the one before; a first one needs fresh proof;
//! attempts are limited per address, then backed off per name and address.

use reqwest::StatusCode;
use serde_json::json;

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

/// A login, once any back-off of earlier wrong tries from this address is over (a second
/// wrong password makes the next try of that name wait a second, doubling).
async fn login(node: &TestNode, name: &str, password: &str) -> (StatusCode, serde_json::Value) {
    let body = json!({ "name": name, "password": password }).to_string();
    in_time(node, "POST", "/v1/login", None, &body).await
}

/// A call that checks a password, once any back-off of this address on the name is over.
async fn in_time(
    node: &TestNode,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, headers, answer) = node.call(method, path, token, Some(body)).await;
        if status != StatusCode::TOO_MANY_REQUESTS || std::time::Instant::now() > deadline {
            return (status, answer);
        }
        let wait: u64 = headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
        assert!(wait <= 2, "a back-off after two or three failures is a second or two, not {wait} s");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
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
    let (status, body) = in_time(&node, "PUT", "/v1/me/password", Some(session_token), &change).await;
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

async fn login_from(node: &TestNode, from: &str, name: &str, password: &str) -> StatusCode {
    let body = json!({ "name": name, "password": password }).to_string();
    node.call_from(from.parse().expect("an address"), "POST", "/v1/login", None, Some(&body)).await.0
}

/// Item 7 of issue 34: per-name limits counted only failures, after the per-address limit,
/// and locked the name out for everyone: ten wrong guesses from anywhere stopped the user's
/// own right password for a minute.
#[tokio::test]
async fn a_guesser_backs_off_per_address_and_never_locks_the_user_out() {
    let node = TestNode::start().await;
    let user = node.create_user("target").await;
    let path = format!("/v1/admin/users/{}/password", user["userId"].as_str().expect("id"));
    let set = json!({ "password": "the right one" }).to_string();
    assert_eq!(node.call("PUT", &path, Some(ADMIN_TOKEN), Some(&set)).await.0, StatusCode::NO_CONTENT);

    // A wrong guess is a typo, tried again at once; after a second one, a third waits out a
    // back-off.
    assert_eq!(login_from(&node, "127.0.0.2", "target", "guess guess 1").await, StatusCode::UNAUTHORIZED);
    assert_eq!(login_from(&node, "127.0.0.2", "target", "guess guess 2").await, StatusCode::UNAUTHORIZED);
    let (status, headers, body) = node
        .call_from(
            "127.0.0.2".parse().expect("ip"),
            "POST",
            "/v1/login",
            None,
            Some(&json!({ "name": "target", "password": "guess guess 3" }).to_string()),
        )
        .await;
    assert_problem(status, &body, StatusCode::TOO_MANY_REQUESTS, "rate-limited");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    // Guessers from many addresses spend the name's failures.
    for i in 0..raftbox_api::routes::login::FAILURES_PER_NAME + 2 {
        let status = login_from(&node, &format!("127.0.1.{}", i + 1), "target", "guess guess guess").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guesser {i}");
    }
    // The user, from an address that never failed, logs in at once.
    assert_eq!(login_from(&node, "127.0.0.9", "target", "the right one").await, StatusCode::CREATED);
    // A guesser that failed, once its back-off is over, is still held back while the name's
    // failures this minute are past the bound.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let status = login_from(&node, "127.0.1.1", "target", "the right one").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "a failed address tried the name again within the minute");
        if std::time::Instant::now() > until {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// One address takes at most its attempts a minute, counted before the body is read.
#[tokio::test]
async fn one_address_takes_its_attempts_and_no_more() {
    let node = TestNode::start().await;
    let mut statuses = Vec::new();
    for i in 0..raftbox_api::routes::login::ATTEMPTS_PER_CLIENT + 2 {
        // Each a new name, so no back-off is met: only the address's count.
        statuses.push(login_from(&node, "127.0.0.3", &format!("nobody-{i}"), "guess guess guess").await);
    }
    let limited = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(limited, 2, "{statuses:?}");
    // Another address is not held back by it.
    assert_eq!(login_from(&node, "127.0.0.4", "nobody", "guess guess guess").await, StatusCode::UNAUTHORIZED);
}

/// Item 4 of issue 34: a token someone stole and kept planted a password, its sessions
/// outlived the token, and the user could neither see nor remove it. Now `GET /v1/me` shows
/// it, the user removes it, and every session made with it ends, on the spot.
#[tokio::test]
async fn a_planted_password_is_seen_removed_and_its_sessions_end() {
    let node = TestNode::start().await;
    let user = node.create_user("victim").await;
    let user_id = user["userId"].as_str().expect("id").to_string();
    let token = node.create_token(&user_id).await;
    // The stolen token, made a moment ago and short-lived: fresh proof, so it sets a first
    // password, and logs in with it.
    let (status, _, body) = node
        .call(
            "POST",
            &format!("/v1/admin/users/{user_id}/tokens"),
            Some(ADMIN_TOKEN),
            Some(r#"{"name":"stolen","expiresInS":60}"#),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let stolen = body["token"].as_str().expect("token").to_string();
    let plant = json!({ "password": "planted password" }).to_string();
    assert_eq!(node.call("PUT", "/v1/me/password", Some(&stolen), Some(&plant)).await.0, StatusCode::NO_CONTENT);
    let (status, session) = login(&node, "victim", "planted password").await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let session = session["token"].as_str().expect("token").to_string();
    // A session is not fresh proof: it cannot remove the password it came from.
    let (status, _, body) = node.call("DELETE", "/v1/me/password", Some(&session), None).await;
    assert_problem(status, &body, StatusCode::FORBIDDEN, "forbidden");
    // The user sees it, and removes it with a token made for them just now.
    let (_, _, me) = node.call("GET", "/v1/me", Some(&token), None).await;
    assert_eq!(me["passwordSet"], true, "{me}");
    // As Schemathesis sends it: a JSON null for the optional body is no body.
    let (status, _, body) = node.call("DELETE", "/v1/me/password", Some(&token), Some("null")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, _, me) = node.call("GET", "/v1/me", Some(&token), None).await;
    assert_eq!(me["passwordSet"], false, "{me}");
    // Every session made with it has ended; the password logs in no more.
    let (status, _, body) = node.call("GET", "/v1/me", Some(&session), None).await;
    assert_problem(status, &body, StatusCode::UNAUTHORIZED, "unauthenticated");
    assert_eq!(login(&node, "victim", "planted password").await.0, StatusCode::UNAUTHORIZED);

    // A change ends the sessions of the password before it too.
    let set = json!({ "password": "my own password" }).to_string();
    assert_eq!(node.call("PUT", "/v1/me/password", Some(&token), Some(&set)).await.0, StatusCode::NO_CONTENT);
    let (_, first) = login(&node, "victim", "my own password").await;
    let first = first["token"].as_str().expect("token").to_string();
    let change = json!({ "password": "another password", "currentPassword": "my own password" }).to_string();
    assert_eq!(node.call("PUT", "/v1/me/password", Some(&first), Some(&change)).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.call("GET", "/v1/me", Some(&first), None).await.0, StatusCode::UNAUTHORIZED);
    // The admin's removal ends them as well.
    let (_, second) = login(&node, "victim", "another password").await;
    let second = second["token"].as_str().expect("token").to_string();
    let path = format!("/v1/admin/users/{user_id}/password");
    assert_eq!(node.call("DELETE", &path, Some(ADMIN_TOKEN), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(node.call("GET", "/v1/me", Some(&second), None).await.0, StatusCode::UNAUTHORIZED);
    // A token of the user's that is not a session is not touched.
    assert_eq!(node.call("GET", "/v1/me", Some(&token), None).await.0, StatusCode::OK);
}
