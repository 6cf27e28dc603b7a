//! TLS (issue 10), with certificates made by `raftbox certs` at launch.
//!
//! `a_tls_cluster_refuses_plaintext_and_strangers`: three nodes that authenticate each other
//! by mutual TLS, without a cluster secret.
//! - It works: a user is created and a file committed through a follower (forwarded to the
//!   leader over mutual TLS) and read, blocks included, through the third node over HTTPS.
//! - Plaintext HTTP to the API gets no answer; a client that does not trust the cluster's
//!   CA refuses the nodes.
//! - The gRPC port refuses a caller without a client certificate, in plaintext, and with a
//!   certificate from another CA; the same call with a node certificate gets through the
//!   handshake and is answered.
//!
//! `a_server_tls_cluster_still_demands_the_secret`: TLS without client certificates, with
//! the secret: the same traffic works, and a TLS caller without the secret is refused
//! (unauthenticated) while one with it is answered.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{
    commit_file, get_block, new_user, put_block, raftbox_bin, send, tls_http_client, within, Cluster, ClusterOptions,
    Tls,
};

const TEST_DEADLINE: Duration = Duration::from_secs(90);
/// How long one probe of a refusing port may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const SECRET_KEY: &str = "x-raftbox-cluster-secret";
/// gRPC status code `UNAUTHENTICATED`.
const GRPC_UNAUTHENTICATED: &str = "16";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_refuses_plaintext_and_strangers() {
    let options = ClusterOptions { tls: Tls::Mutual, ..ClusterOptions::default() };
    let cluster = Cluster::start(options).await.expect("start the TLS cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    for id in cluster.node_ids() {
        let config = std::fs::read_to_string(cluster.root().join(format!("node{id}/config.toml")))?;
        ensure!(!config.contains("cluster_secret_file"), "node {id} must run without a secret:\n{config}");
        ensure!(cluster.http_url(id).starts_with("https://"), "{}", cluster.http_url(id));
    }
    works_across_nodes(cluster).await?;

    // The API: no plaintext, and no answer a client without the CA would accept.
    let plain = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build()?;
    let stranger_client = reqwest::Client::builder().use_rustls_tls().timeout(PROBE_TIMEOUT).build()?;
    for id in cluster.node_ids() {
        let (addr, grpc) = cluster.addresses(id);
        let answer = plain.get(format!("http://{addr}/healthz")).send().await;
        ensure!(answer.is_err(), "node {id} answered plaintext HTTP: {:?}", answer.map(|r| r.status()));
        let answer = stranger_client.get(format!("https://{addr}/healthz")).send().await;
        ensure!(answer.is_err(), "a client without the CA accepted node {id}: {:?}", answer.map(|r| r.status()));
        let answer = plain.get(format!("https://{grpc}/")).send().await;
        ensure!(answer.is_err(), "node {id}'s gRPC port answered a client without the CA");
    }

    // The gRPC port: no certificate, plaintext, another CA's certificate: refused; a node's
    // certificate: answered.
    let ca = std::fs::read(cluster.tls_file("ca.pem")?)?;
    let node_identity =
        [std::fs::read(cluster.tls_file("node1.pem")?)?, std::fs::read(cluster.tls_file("node1.key")?)?].concat();
    let stranger_dir = cluster.root().join("stranger-certs");
    let made =
        std::process::Command::new(raftbox_bin()?).arg("certs").arg(&stranger_dir).arg("--nodes").arg("1").output()?;
    ensure!(made.status.success(), "stranger certs: {}", String::from_utf8_lossy(&made.stderr));
    let stranger_identity =
        [std::fs::read(stranger_dir.join("node1.pem"))?, std::fs::read(stranger_dir.join("node1.key"))?].concat();
    // As `grpc_secret` speaks to a node without TLS: HTTP/2 in plaintext.
    let plain_h2 = reqwest::Client::builder().http2_prior_knowledge().timeout(PROBE_TIMEOUT).build()?;
    let without_cert = tls_http_client(&ca, None)?;
    let with_stranger_cert = tls_http_client(&ca, Some(&stranger_identity))?;
    let with_node_cert = tls_http_client(&ca, Some(&node_identity))?;
    for id in cluster.node_ids() {
        let grpc = cluster.grpc_addr(id).to_owned();
        let plaintext = grpc_status(&plain_h2, &format!("http://{grpc}"), None).await;
        ensure!(plaintext.is_err(), "node {id}'s gRPC port answered plaintext: {plaintext:?}");
        let anonymous = grpc_status(&without_cert, &format!("https://{grpc}"), None).await;
        ensure!(anonymous.is_err(), "node {id}'s gRPC port answered a caller without a certificate: {anonymous:?}");
        let stranger = grpc_status(&with_stranger_cert, &format!("https://{grpc}"), None).await;
        ensure!(stranger.is_err(), "node {id}'s gRPC port answered another CA's certificate: {stranger:?}");
        let node = grpc_status(&with_node_cert, &format!("https://{grpc}"), None).await;
        let node = node.with_context(|| format!("node {id}'s gRPC port with a node certificate"))?;
        ensure!(
            node.0 == 200 && node.1.is_none() && node.2 > 5,
            "node {id}'s Status with a node certificate: {node:?}"
        );
        eprintln!(
            "node {id}: gRPC refused plaintext, no certificate and a stranger's; a node certificate got {node:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_tls_cluster_still_demands_the_secret() {
    let options = ClusterOptions { tls: Tls::Server, ..ClusterOptions::default() };
    let cluster = Cluster::start(options).await.expect("start the TLS cluster");
    let result = within(TEST_DEADLINE, server_tls(&cluster)).await;
    cluster.conclude(result);
}

async fn server_tls(cluster: &Cluster) -> Result<()> {
    for id in cluster.node_ids() {
        let config = std::fs::read_to_string(cluster.root().join(format!("node{id}/config.toml")))?;
        ensure!(config.contains("cluster_secret_file") && config.contains("mutual = false"), "node {id}:\n{config}");
    }
    works_across_nodes(cluster).await?;
    let ca = std::fs::read(cluster.tls_file("ca.pem")?)?;
    let tls = tls_http_client(&ca, None)?;
    let plain_h2 = reqwest::Client::builder().http2_prior_knowledge().timeout(PROBE_TIMEOUT).build()?;
    let secret = cluster.cluster_secret()?;
    for id in cluster.node_ids() {
        let grpc = cluster.grpc_addr(id).to_owned();
        let plaintext = grpc_status(&plain_h2, &format!("http://{grpc}"), Some(&secret)).await;
        ensure!(plaintext.is_err(), "node {id}'s gRPC port answered plaintext: {plaintext:?}");
        let (status, grpc_code, _) = grpc_status(&tls, &format!("https://{grpc}"), None).await?;
        ensure!(
            status == 200 && grpc_code.as_deref() == Some(GRPC_UNAUTHENTICATED),
            "node {id} without the secret: {status} {grpc_code:?}"
        );
        let with = grpc_status(&tls, &format!("https://{grpc}"), Some(&secret)).await?;
        ensure!(with.0 == 200 && with.1.is_none() && with.2 > 5, "node {id} with the secret: {with:?}");
    }
    Ok(())
}

/// A user created and a file committed through a follower, read through the third node.
async fn works_across_nodes(cluster: &Cluster) -> Result<()> {
    let leader = cluster.wait_for_leader(None, Duration::from_secs(10)).await?;
    let others: Vec<u64> = cluster.node_ids().into_iter().filter(|&id| id != leader).collect();
    let (follower, third) = (others[0], others[1]);
    let http = cluster.client();

    // Forwarded writes and reads across nodes, all over TLS.
    let (_, token) = new_user(cluster, follower, "tls-user", "laptop").await?;
    let url = cluster.http_url(follower);
    let data = b"sealed in transit".repeat(1_000);
    let hash = put_block(&http, &url, &token, &data).await?;
    let committed = commit_file(&http, &url, &token, "laptop", "/secret.txt", std::slice::from_ref(&hash), 0).await?;
    ensure!(committed.is_ok(), "commit through follower {follower}: {committed:?}");
    let third_url = cluster.http_url(third);
    let read =
        send(http.get(format!("{third_url}/v1/files")).query(&[("path", "/secret.txt")]).bearer_auth(&token)).await?;
    let chunks = read.body().map(|b| b["chunks"].clone()).with_context(|| format!("read via {third}: {read:?}"))?;
    ensure!(chunks == serde_json::json!([hash]), "the file through node {third}: {read:?}");
    let block = get_block(&http, &third_url, &token, &hash).await?;
    ensure!(block == data, "the block through node {third} differs");
    Ok(())
}

/// A `Status` call (an empty message) to the gRPC endpoint at `base` over HTTP/2, carrying
/// `secret` if given: the HTTP status, a trailers-only `grpc-status` (an error) if any, and
/// the body's length. `Err` when no HTTP answer comes (the handshake or the connection
/// failed).
async fn grpc_status(http: &reqwest::Client, base: &str, secret: Option<&str>) -> Result<(u16, Option<String>, usize)> {
    let mut request = http
        .post(format!("{base}/raftbox.raft.RaftService/Status"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .timeout(PROBE_TIMEOUT)
        .body(vec![0u8, 0, 0, 0, 0]);
    if let Some(secret) = secret {
        request = request.header(SECRET_KEY, secret);
    }
    let response = request.send().await.context("send")?;
    let status = response.status().as_u16();
    let grpc = response.headers().get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.bytes().await.context("read the body")?;
    Ok((status, grpc, body.len()))
}
