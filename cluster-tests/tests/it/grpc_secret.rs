//! The port between nodes is not a back door (issue 8): a `Forward` of an `EnsureAdmin`
//! command sent straight to a node's gRPC port without the cluster secret, or with a wrong
//! one, is refused (gRPC status 16, unauthenticated) and the token it names gets 401; so is
//! an `AppendEntries`. The same call carrying the secret works — the attack is real, only
//! the secret stops it.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{generate_token, me, within, Cluster, ClusterOptions, Outcome, Seed};

const TEST_DEADLINE: Duration = Duration::from_secs(60);
const SECRET_KEY: &str = "x-raftbox-cluster-secret";
/// gRPC status code `UNAUTHENTICATED`.
const GRPC_UNAUTHENTICATED: &str = "16";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_without_the_cluster_secret_are_refused() {
    let seed = Seed::new("grpc_secret::grpc_calls_without_the_cluster_secret_are_refused");
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// A gRPC request body: one uncompressed, length-prefixed message whose field 1 is `bytes`.
fn grpc_frame(field_1: &[u8]) -> Vec<u8> {
    let mut message = vec![0x0a];
    let mut len = field_1.len();
    while len >= 0x80 {
        message.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    message.push(len as u8);
    message.extend_from_slice(field_1);
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame
}

/// A `Forward` of `EnsureAdmin` for `token`, as a peer would send it.
fn forward_ensure_admin(token: &str, tag: &str) -> Vec<u8> {
    let hash: Vec<u8> = blake3::hash(token.as_bytes()).as_bytes().to_vec();
    let commands = serde_json::json!([{
        "type": "ensure_admin", "user_id": format!("evil-user-{tag}"), "namespace_id": format!("evil-ns-{tag}"),
        "token_id": format!("evil-token-{tag}"), "token_hash": hash,
    }]);
    grpc_frame(commands.to_string().as_bytes())
}

/// The header naming the caller's cluster (`raft/src/cluster_id.rs`).
const CLUSTER_ID_KEY: &str = "x-raftbox-cluster-id";
/// gRPC status code `FAILED_PRECONDITION`: a call from no cluster, or another.
const GRPC_FAILED_PRECONDITION: &str = "9";

async fn call(addr: &str, method: &str, secret: Option<&str>, body: Vec<u8>) -> Result<Option<String>> {
    call_from(addr, method, (secret, None), body).await
}

/// A call presenting `secret` and naming `cluster_id`.
async fn call_from(
    addr: &str,
    method: &str,
    (secret, cluster_id): (Option<&str>, Option<&str>),
    body: Vec<u8>,
) -> Result<Option<String>> {
    let http = reqwest::Client::builder().http2_prior_knowledge().timeout(Duration::from_secs(10)).build()?;
    let mut request = http
        .post(format!("http://{addr}/raftbox.raft.RaftService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body);
    if let Some(secret) = secret {
        request = request.header(SECRET_KEY, secret);
    }
    if let Some(cluster_id) = cluster_id {
        request = request.header(CLUSTER_ID_KEY, cluster_id);
    }
    let response = request.send().await.with_context(|| format!("gRPC {method} to {addr}"))?;
    ensure!(response.status().as_u16() == 200, "HTTP status {}", response.status());
    // A refusal is a trailers-only answer: its grpc-status comes with the headers.
    let status = response.headers().get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let _ = response.bytes().await;
    Ok(status)
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let secret = cluster.cluster_secret()?;
    for id in cluster.node_ids() {
        let addr = cluster.grpc_addr(id).to_owned();
        let token = generate_token();
        for presented in [None, Some("a-wrong-secret-of-enough-length")] {
            let status =
                call(&addr, "Forward", presented, forward_ensure_admin(&token, &seed.value().to_string())).await?;
            ensure!(status.as_deref() == Some(GRPC_UNAUTHENTICATED), "node {id}, secret {presented:?}: {status:?}");
        }
        let status = call(&addr, "AppendEntries", None, grpc_frame(b"{\"vote\":{}}")).await?;
        ensure!(status.as_deref() == Some(GRPC_UNAUTHENTICATED), "node {id} AppendEntries: {status:?}");
        let outcome = me(&http, &cluster.http_url(id), &token).await?;
        ensure!(matches!(outcome, Outcome::Rejected(401, _)), "the minted token on node {id}: {outcome:?}");
    }
    // The control: the same call with the secret mints a working admin token.
    let leader = cluster.wait_for_leader(None, Duration::from_secs(10)).await?;
    let token = generate_token();
    // The secret alone is not enough: a call must name the node's cluster too.
    let addr = cluster.grpc_addr(leader).to_owned();
    let status = call(&addr, "Forward", Some(&secret), forward_ensure_admin(&token, "control")).await?;
    ensure!(status.as_deref() == Some(GRPC_FAILED_PRECONDITION), "with the secret, naming no cluster: {status:?}");
    let info = cluster.cluster_info(leader).await?;
    let cluster_id = info["clusterId"].as_str().context("the leader's cluster id")?.to_owned();
    let named = (Some(secret.as_str()), Some(cluster_id.as_str()));
    let status = call_from(&addr, "Forward", named, forward_ensure_admin(&token, "control")).await?;
    ensure!(status.is_none() || status.as_deref() == Some("0"), "with the secret: {status:?}");
    let outcome = me(&http, &cluster.http_url(leader), &token).await?;
    ensure!(
        outcome.is_ok(),
        "with the secret the call works, so the refusals above are the secret's doing: {outcome:?}"
    );
    Ok(())
}
