//! Invariants of the file service across nodes: a file committed through one node downloads
//! byte-identical through another; a WebSocket client on one node hears a commit made on
//! another; an interrupted upload resumes by asking `status` again and uploading only what
//! is missing.

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use futures_util::StreamExt as _;
use raftbox_cluster_tests::{
    create_token, create_user, missing_blocks, put_block, within, Cluster, ClusterOptions, Seed,
};
use rand::{Rng as _, RngCore as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

const TEST_DEADLINE: Duration = Duration::from_secs(120);
const NOTIFY_DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_move_between_nodes_and_notifications_cross_them() {
    let seed = Seed::new("files_sync::files_move_between_nodes_and_notifications_cross_them");
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster, &seed)).await;
    cluster.conclude(result);
}

struct Client {
    http: reqwest::Client,
    token: String,
}

impl Client {
    async fn commit(&self, url: &str, path: &str, chunks: &[String], size: usize) -> Result<Value> {
        let body = json!({ "path": path, "chunks": chunks, "baseVersion": 0, "size": size, "mtime": 0 });
        let response =
            self.http.post(format!("{url}/v1/files/commit")).bearer_auth(&self.token).json(&body).send().await?;
        ensure!(response.status().as_u16() == 201, "commit {path}: {}", response.status());
        Ok(response.json().await?)
    }
}

fn split(data: &[u8], pieces: usize) -> Vec<Vec<u8>> {
    data.chunks(data.len().div_ceil(pieces)).map(<[u8]>::to_vec).collect()
}

async fn scenario(cluster: &Cluster, seed: &Seed) -> Result<()> {
    let mut rng = seed.rng();
    let http = cluster.client();
    let (n1, n2, n3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));
    let user = create_user(&http, &n1, cluster.admin_token(), &format!("sync-{}", seed.value())).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).context("user")?.to_owned();
    let token = create_token(&http, &n1, cluster.admin_token(), &user_id, "laptop").await?;
    let client = Client {
        http: http.clone(),
        token: token.body().and_then(|b| b["token"].as_str()).context("token")?.to_owned(),
    };

    // A WebSocket client on node 2 listens before anything is committed.
    let mut request = format!("{}/v1/notify/ws", n2.replacen("http", "ws", 1)).into_client_request()?;
    request.headers_mut().insert("authorization", format!("Bearer {}", client.token).parse()?);
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.context("connect the WebSocket")?;

    // Commit through node 1; download through node 3.
    let mut data = vec![0u8; rng.gen_range(100_000..400_000)];
    rng.fill_bytes(&mut data);
    let mut chunks = Vec::new();
    for piece in split(&data, 5) {
        chunks.push(put_block(&http, &n1, &client.token, &piece).await?);
    }
    client.commit(&n1, "/photos/a.raw", &chunks, data.len()).await?;
    let file: Value =
        http.get(format!("{n3}/v1/files?path=/photos/a.raw")).bearer_auth(&client.token).send().await?.json().await?;
    let mut downloaded = Vec::new();
    for hash in file["chunks"].as_array().context("chunks")? {
        let hash = hash.as_str().context("hash")?;
        let bytes = http.get(format!("{n3}/v1/blocks/{hash}")).bearer_auth(&client.token).send().await?.bytes().await?;
        downloaded.extend_from_slice(&bytes);
    }
    ensure!(downloaded == data, "the file downloaded through node 3 differs");
    eprintln!("{} bytes committed via node 1 downloaded byte-identical via node 3", data.len());

    // The commit through node 1 reached the listener on node 2; now one through node 3 too.
    let namespace = wait_for_message(&mut socket).await?;
    let more = put_block(&http, &n3, &client.token, b"second file").await?;
    client.commit(&n3, "/b.txt", &[more], 11).await?;
    let again = wait_for_message(&mut socket).await?;
    ensure!(namespace == again, "notifications name the user's namespace");
    eprintln!("WebSocket on node 2 heard commits made via nodes 1 and 3");

    // An upload interrupted after two of four chunks resumes by asking status again.
    let pieces: Vec<Vec<u8>> = (0..4).map(|i| format!("resumable piece {i} {}", seed.value()).into_bytes()).collect();
    let hashes: Vec<String> = pieces.iter().map(|p| blake3::hash(p).to_hex().to_string()).collect();
    ensure!(missing_blocks(&http, &n2, &client.token, &hashes).await? == hashes, "nothing uploaded yet");
    for piece in &pieces[..2] {
        put_block(&http, &n2, &client.token, piece).await?;
    }
    let missing = missing_blocks(&http, &n3, &client.token, &hashes).await?;
    ensure!(missing == hashes[2..], "status after the interruption: {missing:?}");
    for piece in &pieces[2..] {
        put_block(&http, &n1, &client.token, piece).await?;
    }
    ensure!(missing_blocks(&http, &n2, &client.token, &hashes).await?.is_empty(), "all uploaded");
    client.commit(&n2, "/resumed.bin", &hashes, 4).await?;
    eprintln!("interrupted upload resumed: only the 2 missing chunks were sent");
    Ok(())
}

/// The next `namespace_changed` message's namespace id.
async fn wait_for_message(
    socket: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) -> Result<String> {
    loop {
        let message = tokio::time::timeout(NOTIFY_DEADLINE, socket.next())
            .await
            .context("no notification in time")?
            .context("socket closed")??;
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text)?;
            ensure!(value["type"] == "namespace_changed", "unexpected message {value}");
            return Ok(value["namespaceId"].as_str().context("namespaceId")?.to_owned());
        }
    }
}
