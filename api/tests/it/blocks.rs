//! API tests of the block API on a single-node cluster.

use raftbox_storage::blocks::BlockHash;
use reqwest::StatusCode;
use serde_json::json;

use crate::{assert_problem, TestNode, ADMIN_TOKEN};

impl TestNode {
    async fn put_block(&self, hash: &str, body: Vec<u8>) -> (StatusCode, serde_json::Value) {
        let response = self
            .client
            .put(format!("{}/v1/blocks/{hash}", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .body(body)
            .send()
            .await
            .expect("send");
        let status = response.status();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    /// PUTs `data` in pieces of `piece` bytes, without a length (chunked transfer encoding).
    async fn put_streamed(&self, hash: &str, data: &[u8], piece: usize) -> (StatusCode, serde_json::Value) {
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> = data.chunks(piece).map(|p| Ok(p.to_vec())).collect();
        let response = self
            .client
            .put(format!("{}/v1/blocks/{hash}", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(pieces)))
            .send()
            .await
            .expect("send");
        let status = response.status();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    async fn missing(&self, hashes: &[String]) -> Vec<String> {
        let body = json!({ "hashes": hashes }).to_string();
        let (status, _, answer) = self.call("POST", "/v1/blocks/status", Some(ADMIN_TOKEN), Some(&body)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        serde_json::from_value(answer["missing"].clone()).expect("missing array")
    }
}

#[tokio::test]
async fn put_status_get_round_trip_and_repeat_is_a_no_op() {
    let node = TestNode::start().await;
    let data = b"some block bytes".to_vec();
    let hash = BlockHash::of(&data).to_hex();
    let other = BlockHash::of(b"never uploaded").to_hex();
    assert_eq!(node.missing(&[hash.clone(), other.clone()]).await, vec![hash.clone(), other.clone()]);
    assert_eq!(node.put_block(&hash, data.clone()).await.0, StatusCode::CREATED);
    assert_eq!(node.put_block(&hash, data.clone()).await.0, StatusCode::CREATED);
    assert_eq!(node.missing(&[hash.clone(), other.clone()]).await, vec![other]);
    let response =
        node.client.get(format!("{}/v1/blocks/{hash}", node.url)).bearer_auth(ADMIN_TOKEN).send().await.expect("get");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    // Private, not public (DESIGN.md said public): blocks are access-controlled.
    assert_eq!(headers["cache-control"], "private, max-age=31536000, immutable");
    assert_eq!(headers["etag"].to_str().expect("ascii"), format!("\"{hash}\""));
    assert_eq!(response.bytes().await.expect("bytes").to_vec(), data);
}

#[tokio::test]
async fn a_mismatched_put_stores_nothing() {
    let node = TestNode::start().await;
    let hash = BlockHash::of(b"the real bytes").to_hex();
    let (status, problem) = node.put_block(&hash, b"other bytes".to_vec()).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "hash-mismatch");
    assert_eq!(node.missing(&[hash.clone()]).await, vec![hash.clone()]);
    let (status, _, problem) = node.call("GET", &format!("/v1/blocks/{hash}"), Some(ADMIN_TOKEN), None).await;
    assert_problem(status, &problem, StatusCode::NOT_FOUND, "not-found");
}

#[tokio::test]
async fn malformed_hashes_oversized_blocks_and_anonymous_calls_are_refused() {
    let node = TestNode::start().await;
    for bad in ["abc", &"A".repeat(64), &"g".repeat(64)] {
        let (status, problem) = node.put_block(bad, b"x".to_vec()).await;
        assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    }
    let body = json!({ "hashes": ["nothex"] }).to_string();
    let (status, _, problem) = node.call("POST", "/v1/blocks/status", Some(ADMIN_TOKEN), Some(&body)).await;
    assert_problem(status, &problem, StatusCode::BAD_REQUEST, "bad-request");
    let big = vec![7u8; (8 << 20) + 1];
    let (status, problem) = node.put_block(&BlockHash::of(&big).to_hex(), big).await;
    assert_problem(status, &problem, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    let exact = vec![7u8; 8 << 20];
    assert_eq!(node.put_block(&BlockHash::of(&exact).to_hex(), exact).await.0, StatusCode::CREATED);
    let (status, _, problem) = node.call("GET", &format!("/v1/blocks/{}", "0".repeat(64)), None, None).await;
    assert_problem(status, &problem, StatusCode::UNAUTHORIZED, "unauthenticated");
}

/// A body sent in pieces with no length is hashed as it arrives: stored when the pieces hash
/// to the block's name, refused with nothing stored when they do not, 413 past 8 MiB.
#[tokio::test]
async fn a_streamed_body_is_hashed_as_it_arrives_and_bounded() {
    let node = TestNode::start().await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let hash = BlockHash::of(&data).to_hex();
    let (status, problem) = node.put_streamed(&BlockHash::of(b"other").to_hex(), &data, 65_537).await;
    assert_problem(status, &problem, StatusCode::UNPROCESSABLE_ENTITY, "hash-mismatch");
    assert_eq!(node.missing(&[hash.clone()]).await, vec![hash.clone()], "a mismatch stores nothing");
    assert_eq!(node.put_streamed(&hash, &data, 65_537).await.0, StatusCode::CREATED);
    assert_eq!(node.missing(&[hash.clone()]).await, Vec::<String>::new());
    let response =
        node.client.get(format!("{}/v1/blocks/{hash}", node.url)).bearer_auth(ADMIN_TOKEN).send().await.expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.bytes().await.expect("body")[..] == data[..], "the stored bytes are the ones sent");
    let big = vec![7u8; (8 << 20) + 1];
    let (status, problem) = node.put_streamed(&BlockHash::of(&big).to_hex(), &big, 1 << 20).await;
    assert_problem(status, &problem, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
}
