//! Invariant: the operator commands do their work against a real cluster, through any node:
//! `raftbox users create|show` and `raftbox tokens create|ls|revoke` (the README
//! walk-through's admin work), and `raftbox status` lists every member with its role, one
//! leader and a lag.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{me, raftbox_bin, within, Cluster, ClusterOptions, Outcome};
use serde_json::Value;

const TEST_DEADLINE: Duration = Duration::from_secs(90);
/// How long a revoked token may still work on the node asked (it applies the revocation).
const REVOKED_WITHIN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_tokens_and_status_commands_work_through_any_node() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

/// Runs `raftbox ARGS`; its stdout, or an error with its stderr.
async fn raftbox(args: &[&str]) -> Result<String> {
    let output = tokio::process::Command::new(raftbox_bin()?)
        .args(args)
        .env_remove("RAFTBOX_TOKEN")
        .env_remove("RAFTBOX_TOKEN_FILE")
        .output()
        .await
        .context("run raftbox")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "raftbox {args:?} failed: {stderr}");
    Ok(String::from_utf8(output.stdout)?)
}

async fn json(args: &[&str]) -> Result<Value> {
    let out = raftbox(args).await?;
    serde_json::from_str(&out).with_context(|| format!("raftbox {args:?} printed no JSON: {out}"))
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let admin_file = cluster.root().join("cli-admin.token");
    std::fs::write(&admin_file, cluster.admin_token())?;
    let admin = admin_file.to_str().context("path")?;
    let (url1, url2, url3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));

    // users create prints the id alone; show through another node finds it.
    let user_id = raftbox(&["users", "create", "carol", "--url", &url1, "--token-file", admin]).await?;
    let user_id = user_id.trim().to_string();
    ensure!(user_id.len() == 36, "users create printed {user_id:?}, not a user id");
    let shown = json(&["users", "show", &user_id, "--json", "--url", &url2, "--token-file", admin]).await?;
    ensure!(shown["userId"] == user_id.as_str() && shown["name"] == "carol", "users show: {shown}");
    let again = raftbox(&["users", "create", "carol", "--url", &url3, "--token-file", admin]).await;
    ensure!(again.as_ref().is_err_and(|e| e.to_string().contains("409")), "a second carol: {again:?}");

    // tokens create prints the token; it works as carol through a third node.
    let args = ["tokens", "create", &user_id, "--name", "laptop", "--url", &url3, "--token-file", admin];
    let token = raftbox(&args).await?.trim().to_string();
    ensure!(token.starts_with("rbx_"), "tokens create printed {token:?}");
    let http = cluster.client();
    let answer = me(&http, &url1, &token).await?;
    ensure!(answer.body().is_some_and(|b| b["userId"] == user_id.as_str()), "the new token as carol: {answer:?}");

    // ls as the admin and as carol herself name the same token; revoke ends it.
    let listed = json(&["tokens", "ls", &user_id, "--json", "--url", &url2, "--token-file", admin]).await?;
    let own = json(&["tokens", "ls", "--json", "--url", &url1, "--token", &token]).await?;
    ensure!(listed == own, "the admin's listing {listed} and carol's {own} differ");
    let tokens = listed["tokens"].as_array().context("tokens")?;
    ensure!(tokens.len() == 1 && tokens[0]["name"] == "laptop", "tokens ls: {listed}");
    let token_id = tokens[0]["tokenId"].as_str().context("tokenId")?;
    raftbox(&["tokens", "revoke", token_id, "--user", &user_id, "--url", &url2, "--token-file", admin]).await?;
    let revoked = Instant::now();
    loop {
        match me(&http, &url2, &token).await? {
            Outcome::Rejected(401, _) => break,
            other => ensure!(revoked.elapsed() < REVOKED_WITHIN, "the revoked token still works: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // status through one node lists all three, with one leader, a term and a lag each.
    let table = raftbox(&["status", "--url", &url1]).await?;
    let lines: Vec<&str> = table.lines().collect();
    ensure!(lines.len() == 5, "status printed {} lines:\n{table}", lines.len());
    ensure!(lines[0].starts_with("cluster: 3 members, leader "), "status:\n{table}");
    ensure!(lines[2..].iter().filter(|l| l.contains(" Leader ")).count() == 1, "one leader:\n{table}");
    for line in &lines[2..] {
        let lag = line.split_whitespace().last().unwrap_or("");
        ensure!(lag.parse::<u64>().is_ok() && line.contains("voter"), "a node's line: {line}\n{table}");
    }
    let nodes = json(&["status", "--json", "--url", &url3]).await?;
    let nodes = nodes["nodes"].as_array().context("nodes")?.clone();
    ensure!(nodes.len() == 3 && nodes.iter().all(|n| n["cluster"]["term"].is_u64()), "status --json: {nodes:?}");
    eprintln!("{table}");
    Ok(())
}
