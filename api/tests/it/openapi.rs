//! The OpenAPI description against reality.
//!
//! Every request the API tests send through [`TestNode`](super::TestNode) is checked here as
//! its answer arrives ([`check`]): the path and method are described (else the answer must be
//! the router's 404 or 405 problem), the status is documented for the operation, and the body
//! validates against the documented schema of that status and content type (objects held to
//! exactly the documented properties). A JSON body the server accepted (2xx) must validate
//! against the documented request schema too. Two tests below hold the description to the
//! route table (`api/src/routes/mod.rs`) both ways.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::TestNode;

/// The description, its objects made strict (no undocumented property in an answer).
fn description() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = raftbox_api::openapi::document();
        if let Some(schemas) = doc.pointer_mut("/components/schemas") {
            strict(schemas);
        }
        doc
    })
}

/// Every object schema with `properties` and no `additionalProperties` gets `false`.
fn strict(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(strict);
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

/// A described path template that matches `path`, the most specific (literal segments
/// before parameters, as the router matches).
fn template_of(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split('/').collect();
    let paths = description()["paths"].as_object()?;
    let mut best: Option<(Vec<bool>, &String)> = None;
    for template in paths.keys() {
        let parts: Vec<&str> = template.split('/').collect();
        // A last `{path}` parameter stands for the rest of the path, slashes and all (a
        // route's `{*path}`).
        let rest = parts.last() == Some(&"{path}") && segments.len() > parts.len();
        let segments: Vec<&str> = match rest {
            true => segments[..parts.len()].to_vec(),
            false => segments.clone(),
        };
        if parts.len() != segments.len() {
            continue;
        }
        let mut literal = Vec::new();
        let fits = parts.iter().zip(&segments).all(|(part, segment)| {
            let param = part.starts_with('{') && part.ends_with('}');
            literal.push(!param);
            param && !segment.is_empty() || part == segment
        });
        if fits && best.as_ref().is_none_or(|(b, _)| literal > *b) {
            best = Some((literal, template));
        }
    }
    best.map(|(_, template)| template.clone())
}

/// Compiled validators by schema pointer (compiling is most of the cost).
fn validator(key: &str, schema: &Value) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().expect("cache").get(key) {
        return v.clone();
    }
    // The schema with the description's components beside it, so `#/components/...` resolves.
    let mut root = schema.clone();
    if let Value::Object(map) = &mut root {
        map.insert("components".into(), description()["components"].clone());
    } else {
        root = json!({ "allOf": [schema], "components": description()["components"] });
    }
    let compiled = Arc::new(jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("schema {key}: {e}")));
    cache.lock().expect("cache").insert(key.to_string(), compiled.clone());
    compiled
}

fn validate(key: &str, schema: &Value, instance: &Value) -> Result<(), String> {
    let errors: Vec<String> =
        validator(key, schema).iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Answers checked so far, by every node of the suite.
static CHECKED: AtomicUsize = AtomicUsize::new(0);

/// Records and checks every exchange of one test node (a layer around its whole router).
#[derive(Clone)]
pub struct Recorder {
    /// `false` when the test added routes of its own: a path the description lacks is then
    /// not held to be a 404.
    all_routes_described: bool,
    failures: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    pub fn new(all_routes_described: bool) -> Recorder {
        Recorder { all_routes_described, failures: Arc::default() }
    }

    /// Fails the calling test with every mismatch seen.
    pub fn assert_clean(&self) {
        let failures = self.failures.lock().expect("failures");
        assert!(failures.is_empty(), "answers that break the OpenAPI description:\n{}", failures.join("\n"));
    }
}

/// JSON bodies larger than this are passed through unbuffered (and not checked).
const BUFFER_BYTES_MAX: usize = 8 << 20;

/// Middleware: buffers the request and the answer and checks them against the description.
pub async fn record(State(recorder): State<Recorder>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let uri = request.uri().path().to_owned();
    let upgrade = request.headers().contains_key(header::UPGRADE);
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    // Only JSON bodies are checked; others (blocks, streamed or not) pass untouched.
    let json =
        request.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let (parts, body) = request.into_parts();
    let (sent, request) = if upgrade || !json || declared.is_some_and(|n| n > BUFFER_BYTES_MAX) {
        (None, Request::from_parts(parts, body))
    } else {
        match axum::body::to_bytes(body, BUFFER_BYTES_MAX).await {
            Ok(bytes) => (Some(bytes.clone()), Request::from_parts(parts, Body::from(bytes))),
            // The client went away or sent too much: nothing to check.
            Err(_) => return StatusCode::BAD_REQUEST.into_response(),
        }
    };
    let response = next.run(request).await;
    if upgrade && response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let outcome = check(&method, &uri, None, response.status(), "", "", recorder.all_routes_described);
        if let Err(e) = outcome {
            recorder.failures.lock().expect("failures").push(e);
        }
        return response;
    }
    let (parts, body) = response.into_parts();
    let answer = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            recorder.failures.lock().expect("failures").push(format!("{method} {uri}: answer body: {e}"));
            return Response::from_parts(parts, Body::empty());
        }
    };
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let text = String::from_utf8_lossy(&answer);
    let text = if content_type.contains("json") { text } else { std::borrow::Cow::Borrowed("") };
    let outcome =
        check(&method, &uri, sent.as_deref(), parts.status, content_type, &text, recorder.all_routes_described);
    if let Err(e) = outcome {
        recorder.failures.lock().expect("failures").push(e);
    }
    Response::from_parts(parts, Body::from(answer))
}

/// Checks one exchange against the description.
pub fn check(
    method: &str,
    path: &str,
    request: Option<&[u8]>,
    status: StatusCode,
    content_type: &str,
    body: &str,
    all_routes_described: bool,
) -> Result<(), String> {
    CHECKED.fetch_add(1, Ordering::Relaxed);
    let what = format!("{method} {path} → {status}");
    let is_problem = content_type.starts_with("application/problem+json");
    let Some(template) = template_of(path) else {
        // WebDAV is RFC 4918's protocol, judged by litmus and rclone, not by this description.
        if !all_routes_described || path == "/dav" || path.starts_with("/dav/") {
            return Ok(());
        }
        if status != StatusCode::NOT_FOUND || !is_problem {
            return Err(format!("{what}: not described, so it must be a 404 problem; {body}"));
        }
        return Ok(());
    };
    let lower = method.to_ascii_lowercase();
    let Some(operation) = description()["paths"][&template].get(&lower) else {
        if status != StatusCode::METHOD_NOT_ALLOWED || !is_problem {
            return Err(format!("{what}: {method} not described for {template}, so it must be a 405 problem; {body}"));
        }
        return Ok(());
    };
    let Some(response) = operation["responses"].get(status.as_str()) else {
        return Err(format!("{what}: status {status} is not documented for {method} {template}; body {body}"));
    };
    match response.get("content").and_then(Value::as_object) {
        None if body.is_empty() => {}
        None => return Err(format!("{what}: documented without a body, answered {body:?}")),
        Some(content) => {
            let mime = content_type.split(';').next().unwrap_or("").trim();
            let Some(media) = content.get(mime) else {
                return Err(format!("{what}: content type {content_type:?} not documented: {:?}", content.keys()));
            };
            if mime.ends_with("json") {
                let value: Value =
                    serde_json::from_str(body).map_err(|e| format!("{what}: body is not JSON ({e}): {body}"))?;
                let key = format!("{lower} {template} {status} {mime}");
                validate(&key, &media["schema"], &value)
                    .map_err(|e| format!("{what}: body does not validate: {e}\n  body: {body}"))?;
            }
        }
    }
    // A body the server accepted must be one the description calls valid.
    let request_schema = operation.pointer("/requestBody/content/application~1json/schema");
    if let (true, Some(schema), Some(sent)) = (status.is_success(), request_schema, request) {
        let value: Value = serde_json::from_slice(sent).map_err(|e| format!("{what}: accepted non-JSON ({e})"))?;
        let key = format!("{lower} {template} request");
        validate(&key, schema, &value).map_err(|e| format!("{what}: accepted a body the description rejects: {e}"))?;
    }
    Ok(())
}

/// The routes of the route table, read from its source: `(METHOD, template)`.
fn routed() -> BTreeSet<(String, String)> {
    let source = include_str!("../../src/routes/mod.rs");
    let mut routes = BTreeSet::new();
    for chunk in source.split(".route(").skip(1) {
        let chunk = chunk.split(".fallback(").next().unwrap_or(chunk);
        // A wildcard (`{*path}`) is a plain parameter in the description.
        let path = chunk.split('"').nth(1).expect("a route's path").replace("{*", "{");
        for method in ["get", "post", "put", "patch", "delete"] {
            let call = format!("{method}(");
            let mut rest = chunk;
            while let Some(at) = rest.find(&call) {
                let before = rest[..at].chars().last();
                if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
                    routes.insert((method.to_uppercase(), path.clone()));
                }
                rest = &rest[at + call.len()..];
            }
        }
    }
    routes
}

fn described() -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in description()["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                ops.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

#[tokio::test]
async fn every_route_is_described_and_nothing_else() {
    let (routed, described) = (routed(), described());
    assert!(routed.len() > 40, "the route table parsed: {routed:?}");
    let undocumented: Vec<_> = routed.difference(&described).collect();
    let unrouted: Vec<_> = described.difference(&routed).collect();
    assert!(undocumented.is_empty(), "routes missing from the description: {undocumented:?}");
    assert!(unrouted.is_empty(), "described operations no route serves: {unrouted:?}");
    // And the router really serves each: never its fallback 404 or a 405 (each answer is
    // checked against the description on the way, as every test's is).
    let node = TestNode::start().await;
    for (method, template) in &described {
        let path: String = template
            .split('/')
            .map(|part| if part.starts_with('{') { "x" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        let (status, _, body) = node.call(method, &path, None, None).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {body}");
        assert!(body["detail"] != "no such route", "{method} {path} reached no route: {body}");
    }
}

#[tokio::test]
async fn the_description_is_served_as_openapi_3_1_without_a_token() {
    let node = TestNode::start().await;
    let (status, headers, body) = node.call("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers["content-type"].to_str().expect("ascii").starts_with("application/json"));
    assert_eq!(body, raftbox_api::openapi::document());
    assert!(body["openapi"].as_str().expect("version").starts_with("3.1"), "{}", body["openapi"]);
    // Every operation documents its statuses, with problem+json for every error.
    for (path, item) in body["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("item") {
            let responses = operation["responses"].as_object().expect("responses");
            assert!(responses.keys().any(|s| s.starts_with('2') || s == "101"), "{method} {path}: no success");
            for (code, response) in responses {
                if code.starts_with('4') || code.starts_with('5') {
                    assert!(
                        response["content"]["application/problem+json"]["schema"].is_object(),
                        "{method} {path} {code}: not problem+json"
                    );
                }
            }
        }
    }
}

#[test]
fn answers_that_break_the_description_are_caught() {
    // The checker itself: an undocumented status, a body of the wrong shape, an extra
    // property, an undescribed route and an undocumented content type each fail.
    let bad = [
        ("GET", "/v1/me", StatusCode::IM_A_TEAPOT, "application/json", "{}"),
        ("GET", "/v1/me", StatusCode::OK, "application/json", r#"{"userId":1}"#),
        ("GET", "/v1/me", StatusCode::OK, "application/json", r#"{"userId":"a","name":"b","namespaceId":"c","x":1}"#),
        ("GET", "/v1/nothing", StatusCode::OK, "application/json", "{}"),
        ("PATCH", "/v1/me", StatusCode::OK, "application/json", "{}"),
        ("GET", "/healthz", StatusCode::OK, "text/html", "ok"),
    ];
    for (method, path, status, content_type, body) in bad {
        let outcome = check(method, path, None, status, content_type, body, true);
        assert!(outcome.is_err(), "{method} {path} {status} {body} passed");
    }
    let me = r#"{"userId":"a","name":"b","namespaceId":"c","storedBytes":0}"#;
    check("GET", "/v1/me", None, StatusCode::OK, "application/json", me, true).expect("a valid answer");
    let problem = r#"{"type":"not-found","title":"Not found","status":404,"detail":"no such route"}"#;
    check("GET", "/v1/nothing", None, StatusCode::NOT_FOUND, "application/problem+json", problem, true).expect("404");
    assert!(CHECKED.load(Ordering::Relaxed) > 0);
}

#[test]
fn every_reference_in_the_description_resolves() {
    fn walk(value: &Value, components: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let name = target.strip_prefix("#/components/schemas/").unwrap_or(target);
                    if components["schemas"].get(name).is_none() {
                        found.push(target.clone());
                    }
                }
                map.values().for_each(|v| walk(v, components, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, components, found)),
            _ => {}
        }
    }
    let document = description();
    let mut unresolved = Vec::new();
    walk(&document, &document["components"], &mut unresolved);
    assert!(unresolved.is_empty(), "references to no schema: {unresolved:?}");
}

/// Whether `text` is valid by the description's component schema `name`.
fn described_valid(name: &str, text: &str) -> bool {
    let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
    validator(&format!("component {name}"), &schema).is_valid(&json!(text))
}

#[test]
fn the_described_constraints_are_the_ones_the_server_enforces() {
    // Paired: each pattern of `api/src/schema.rs` against the check that enforces it, on
    // the edge cases of each (ASCII, where characters and bytes agree).
    let long = "a".repeat(255);
    let paths = [
        "/", "", "a", "/a", "/a/b.txt", "//a", "/a/", "/.", "/..", "/...", "/.a", "/..a", "/a/./b", "/a/../b",
        "/a\u{7}b", "/a\u{85}", "/é/ü", "/ a ", "/a b/c",
    ];
    let too_long = format!("/{long}a");
    let long_path = format!("/{long}");
    for path in paths.iter().copied().chain([too_long.as_str(), long_path.as_str()]) {
        let server = raftbox_storage::paths::FilePath::parse(path).is_ok();
        assert_eq!(described_valid("FilePath", path), server, "FilePath {path:?}: the server says {server}");
    }
    let names = ["", " ", "a", " a ", "ann", "a\tb", "\u{7f}", "é", &"n".repeat(64), &"n".repeat(65)];
    for name in names {
        let server = raftbox_api::json::name("name", name).is_ok();
        assert_eq!(described_valid("DisplayName", name), server, "DisplayName {name:?}: the server says {server}");
    }
    let keys = ["a", "a b", "k-1:2", "~", &"k".repeat(255), &"k".repeat(256), "a\tb", "é"];
    for key in keys {
        let server = axum::http::HeaderValue::from_str(key)
            .ok()
            .is_some_and(|value| raftbox_api::idempotency::parse_key(&value).is_ok());
        assert_eq!(described_valid("IdempotencyKey", key), server, "IdempotencyKey {key:?}: the server says {server}");
    }
    for hash in ["0".repeat(64), "A".repeat(64), "0".repeat(63), "g".repeat(64)] {
        let server = hash.parse::<raftbox_storage::blocks::BlockHash>().is_ok();
        assert_eq!(described_valid("BlockHash", &hash), server, "BlockHash {hash:?}");
    }
    // The numbers the description states are the server's constants.
    let document = description();
    let token = &document["components"]["schemas"]["TokenRequest"]["properties"]["expiresInS"];
    let lifetime = raftbox_api::routes::accounts::TOKEN_LIFETIME_S_MAX;
    assert_eq!(token["maximum"].as_f64(), Some(lifetime as f64), "{token}");
    let job = &document["components"]["schemas"]["JobCreateRequest"]["properties"];
    assert_eq!(job["maxRetries"]["maximum"].as_f64(), Some(f64::from(raftbox_api::routes::jobs::MAX_RETRIES_MAX)));
    assert_eq!(job["timeoutSeconds"]["maximum"].as_f64(), Some(raftbox_api::routes::jobs::TIMEOUT_S_MAX as f64));
    let backoff = raftbox_storage::jobs::RETRY_BACKOFF_MS_MAX as f64;
    assert_eq!(job["retryBackoffMs"]["maximum"].as_f64(), Some(backoff));
    assert_eq!(job["target"]["maxLength"].as_u64(), Some(raftbox_api::routes::jobs::TARGET_CHARS_MAX as u64));
    let commit = &document["components"]["schemas"]["CommitRequest"]["properties"]["chunks"];
    assert_eq!(commit["maxItems"].as_u64(), Some(raftbox_api::routes::files::FILE_CHUNKS_MAX as u64), "{commit}");
    let status = &document["components"]["schemas"]["StatusRequest"]["properties"]["hashes"];
    assert_eq!(status["maxItems"].as_u64(), Some(raftbox_api::routes::blocks::STATUS_HASHES_MAX as u64));
}
