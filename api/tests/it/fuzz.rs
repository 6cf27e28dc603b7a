//! A fuzz test of the request parsers: a valid body of each JSON route is mutated
//! [`MUTANTS_PER_ROUTE`] times from a fixed seed — truncated, bytes flipped, inserted or cut,
//! values swapped for values of other types, keys added, nesting deepened — and sent to a
//! real node. No answer may be a 5xx, every refusal must be problem+json, and the node must
//! still write afterwards. `RAFTBOX_FUZZ_SEED=N` runs another seed; the seed is printed, and
//! a failure lists each surprising answer with the body that caused it.
//!
//! `POST /v1/admin/cluster/members` is left out: a mutant that is still a valid member
//! makes the node wait out the membership timeout for a peer that does not exist (its
//! parser is covered by `bad_input`).

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::{TestNode, ADMIN_TOKEN};

/// Mutants sent per route.
const MUTANTS_PER_ROUTE: usize = 150;
/// The seed of a run without `RAFTBOX_FUZZ_SEED`.
const DEFAULT_SEED: u64 = 0x5EED_0010;

/// Bytes worth inserting: JSON structure, escapes, NUL, invalid UTF-8.
const INTERESTING_BYTES: &[u8] = b"{}[]\":,\\\0\x7f\xff\xc3-+.eE0 \n\t";

fn seed() -> u64 {
    match std::env::var("RAFTBOX_FUZZ_SEED") {
        Ok(text) => text.trim().parse().expect("RAFTBOX_FUZZ_SEED is a number"),
        Err(_) => DEFAULT_SEED,
    }
}

/// A value of some other type (or an absurd one of the same), to swap in.
fn odd_value(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..14) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(1e308),
        4 => json!(u64::MAX),
        5 => json!(-9_223_372_036_854_775_808i64),
        6 => json!(0.5),
        7 => json!(""),
        8 => json!("x".repeat(rng.gen_range(1_000..70_000))),
        9 => json!("/a/../../b\u{0}\u{7}\u{202e}"),
        10 => json!([]),
        11 => json!({}),
        12 => json!([1, "two", null, {"three": [3]}]),
        _ => {
            let mut nested = json!(1);
            for _ in 0..rng.gen_range(10..120) {
                nested = json!([nested]);
            }
            nested
        }
    }
}

/// Replaces one value somewhere in `value` (an object field, an array element, or the whole).
fn swap_a_value(value: &mut Value, rng: &mut StdRng) {
    let descend = rng.gen_bool(0.7);
    match value {
        Value::Object(map) if !map.is_empty() && descend => {
            let key = map.keys().nth(rng.gen_range(0..map.len())).cloned().expect("a key");
            swap_a_value(map.get_mut(&key).expect("the key"), rng);
        }
        Value::Array(items) if !items.is_empty() && descend => {
            let i = rng.gen_range(0..items.len());
            swap_a_value(&mut items[i], rng);
        }
        _ => *value = odd_value(rng),
    }
}

/// One mutant of `valid` (a JSON text).
fn mutate(valid: &str, rng: &mut StdRng) -> (String, Vec<u8>) {
    let bytes = valid.as_bytes();
    let at = |rng: &mut StdRng| rng.gen_range(0..=bytes.len());
    match rng.gen_range(0..9) {
        0 => {
            let cut = rng.gen_range(0..bytes.len());
            ("truncated".into(), bytes[..cut].to_vec())
        }
        1 => {
            let mut out = bytes.to_vec();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..out.len());
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            ("bits flipped".into(), out)
        }
        2 => {
            let mut out = bytes.to_vec();
            for _ in 0..rng.gen_range(1..4) {
                let byte = if rng.gen_bool(0.5) {
                    INTERESTING_BYTES[rng.gen_range(0..INTERESTING_BYTES.len())]
                } else {
                    rng.gen()
                };
                out.insert(rng.gen_range(0..=out.len()), byte);
            }
            ("bytes inserted".into(), out)
        }
        3 => {
            let (a, b) = (at(rng), at(rng));
            let (from, to) = (a.min(b), a.max(b));
            ("bytes cut".into(), [&bytes[..from], &bytes[to..]].concat())
        }
        4 | 5 | 6 => {
            let mut value: Value = serde_json::from_str(valid).expect("a valid body");
            for _ in 0..rng.gen_range(1..3) {
                swap_a_value(&mut value, rng);
            }
            ("value swapped".into(), value.to_string().into_bytes())
        }
        7 => {
            let mut value: Value = serde_json::from_str(valid).expect("a valid body");
            if let Value::Object(map) = &mut value {
                let key = ["isAdmin", "namespaceId", "__proto__", "", "path", "name"][rng.gen_range(0..6)];
                map.insert(key.into(), odd_value(rng));
            }
            ("key added".into(), value.to_string().into_bytes())
        }
        _ => {
            let depth = rng.gen_range(100..20_000);
            let text = format!("{}{valid}{}", "[".repeat(depth), "]".repeat(depth));
            (format!("nested {depth} deep"), text.into_bytes())
        }
    }
}

#[tokio::test]
async fn mutated_bodies_get_no_5xx_and_refusals_are_problems() {
    let seed = seed();
    println!("fuzz seed {seed} (RAFTBOX_FUZZ_SEED={seed} replays this run)");
    let mut rng = StdRng::seed_from_u64(seed);
    let node = TestNode::start().await;
    let user = node.create_user("fuzzy").await;
    let user_id = user["userId"].as_str().expect("userId").to_owned();
    let me = node.create_token(&user_id).await;

    // A file to restore, move and delete, and a job to patch.
    let data = b"fuzzed file".to_vec();
    let hash = blake3::hash(&data).to_hex().to_string();
    let put = node.client.put(format!("{}/v1/blocks/{hash}", node.url)).bearer_auth(&me).body(data.clone());
    assert!(put.send().await.expect("put block").status().is_success());
    let commit = json!({ "path": "/f.txt", "chunks": [hash], "baseVersion": 0, "size": data.len(), "mtime": 0 });
    let (status, _, body) = node.call("POST", "/v1/files/commit", Some(&me), Some(&commit.to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let job = json!({ "type": "noop", "payload": {"n": 1}, "schedule": { "runAt": "2099-01-01T00:00:00Z" }, "maxRetries": 2 });
    let (status, _, created) = node.call("POST", "/v1/jobs", Some(&me), Some(&job.to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let job_id = created["jobId"].as_str().expect("jobId").to_owned();
    // A shared folder of the user's, whose ACL the mutants change.
    let folder = json!({ "name": "fuzzed folder" }).to_string();
    let (status, _, created) = node.call("POST", "/v1/namespaces", Some(&me), Some(&folder)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let folder_id = created["namespaceId"].as_str().expect("namespaceId").to_owned();

    let routes: Vec<(&str, String, &str, Value)> = vec![
        ("POST", "/v1/admin/users".into(), ADMIN_TOKEN, json!({ "name": "someone" })),
        (
            "POST",
            format!("/v1/admin/users/{user_id}/tokens"),
            ADMIN_TOKEN,
            json!({ "name": "phone", "expiresInS": 3600 }),
        ),
        ("POST", "/v1/blocks/status".into(), me.as_str(), json!({ "hashes": [hash, "b".repeat(64)] })),
        ("POST", "/v1/files/commit".into(), me.as_str(), commit.clone()),
        ("POST", "/v1/files/restore".into(), me.as_str(), json!({ "path": "/f.txt", "version": 1 })),
        ("POST", "/v1/files/move".into(), me.as_str(), json!({ "from": "/f.txt", "to": "/g.txt", "baseVersion": 1 })),
        ("POST", "/v1/files/delete".into(), me.as_str(), json!({ "path": "/f.txt", "baseVersion": 1 })),
        ("POST", "/v1/jobs".into(), me.as_str(), job.clone()),
        (
            "PATCH",
            format!("/v1/jobs/{job_id}"),
            me.as_str(),
            json!({ "schedule": { "runAt": "2098-01-01T00:00:00Z" }, "payload": {"n": 2}, "maxRetries": 3 }),
        ),
        ("POST", "/v1/namespaces".into(), me.as_str(), json!({ "name": "team" })),
        (
            "PUT",
            format!("/v1/namespaces/{folder_id}/acl"),
            me.as_str(),
            json!({ "userName": "someone", "role": "viewer" }),
        ),
        ("POST", "/v1/admin/groups".into(), ADMIN_TOKEN, json!({ "name": "staff" })),
    ];

    let started = std::time::Instant::now();
    let mut surprises = Vec::new();
    let mut sent = 0;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for (method, path, token, valid) in &routes {
        let valid = valid.to_string();
        for _ in 0..MUTANTS_PER_ROUTE {
            let (kind, body) = mutate(&valid, &mut rng);
            let (status, headers, answer) = node.call_bytes(method, path, Some(*token), body.clone()).await;
            sent += 1;
            *statuses.entry(status.as_u16()).or_default() += 1;
            let problem = headers.get("content-type").and_then(|v| v.to_str().ok()) == Some("application/problem+json");
            let refused_properly = status.is_client_error() && problem && answer["detail"].is_string();
            if !(status.is_success() || refused_properly) {
                let shown: String = String::from_utf8_lossy(&body).chars().take(200).collect();
                let answer: String = answer.to_string().chars().take(200).collect();
                surprises.push(format!("{method} {path} ({kind}) {shown:?} -> {status} {answer}"));
            }
        }
    }
    println!("{sent} mutants in {:.1} s; answers by status: {statuses:?}", started.elapsed().as_secs_f64());
    assert!(
        surprises.is_empty(),
        "seed {seed}: {} answers were neither 2xx nor 4xx problem+json:\n{}",
        surprises.len(),
        surprises.join("\n")
    );

    // The node is healthy and still writes.
    assert_eq!(node.call("GET", "/healthz", None, None).await.0, StatusCode::OK);
    let (status, _, body) = node.call("POST", "/v1/admin/users", Some(ADMIN_TOKEN), Some(r#"{"name":"after"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "the node no longer writes: {body}");
    let again = json!({ "path": "/after.txt", "chunks": [hash], "baseVersion": 0, "size": data.len(), "mtime": 0 });
    let (status, _, body) = node.call("POST", "/v1/files/commit", Some(&me), Some(&again.to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "the node no longer commits files: {body}");
}
