//! `raftbox users`, `raftbox tokens` (accounts; admin token unless the caller's own) and
//! `raftbox status` (a cluster summary from every member's `GET /v1/cluster`, no token).
//!
//! Scripts take a command's one useful value from stdout (`users create` prints the user id,
//! `tokens create` the token); the rest goes to stderr. `--json` prints the API's answer.

use std::time::Duration;

use anyhow::bail;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::client::{problem, Api, Connection};

/// Longest wait for one node's `/v1/cluster` in `raftbox status`.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(clap::Args, Debug)]
pub struct UsersArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print the API's JSON answer instead of the summary.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: UsersCommand,
}

#[derive(clap::Subcommand, Debug)]
enum UsersCommand {
    /// Create user NAME with its personal namespace; prints the user id (admin token).
    Create { name: String },
    /// Show a user: id, name, personal namespace (admin token).
    Show {
        #[arg(value_parser = crate::client::id)]
        user_id: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct TokensArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print the API's JSON answer instead of the summary.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: TokensCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TokensCommand {
    /// Create a token for USER_ID; prints the token (shown once) (admin token).
    Create {
        #[arg(value_parser = crate::client::id)]
        user_id: String,
        /// The token's name (e.g. the device it is for).
        #[arg(long, default_value = "cli")]
        name: String,
        /// Seconds until the token stops working (default: never).
        #[arg(long)]
        expires_in_s: Option<u64>,
    },
    /// List USER_ID's tokens (admin token), or without USER_ID the caller's own.
    Ls {
        #[arg(value_parser = crate::client::id)]
        user_id: Option<String>,
    },
    /// Revoke TOKEN_ID of --user USER_ID (admin token), or without --user one of the caller's.
    Revoke {
        #[arg(value_parser = crate::client::id)]
        token_id: String,
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    connection: Connection,
    /// More nodes to ask besides --url (their HTTP URLs); members found are asked too.
    #[arg(long = "endpoint")]
    endpoints: Vec<String>,
    /// Print every node's `/v1/cluster` answer as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("-")
}

pub async fn run_users(args: UsersArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    let answer = match &args.command {
        UsersCommand::Create { name } => {
            api.call(Method::POST, "/v1/admin/users", Some(json!({ "name": name }))).await?
        }
        UsersCommand::Show { user_id } => api.call(Method::GET, &format!("/v1/admin/users/{user_id}"), None).await?,
    };
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    match args.command {
        UsersCommand::Create { name } => {
            eprintln!("created user {name}: namespace {}", text(&answer, "namespaceId"));
            println!("{}", text(&answer, "userId"));
        }
        UsersCommand::Show { .. } => {
            println!("user       {}", text(&answer, "userId"));
            println!("name       {}", text(&answer, "name"));
            println!("namespace  {}", text(&answer, "namespaceId"));
        }
    }
    Ok(())
}

fn print_tokens(answer: &Value) {
    println!("{:<36}  {:<20} {:<24} expires", "token id", "name", "created");
    for token in answer["tokens"].as_array().into_iter().flatten() {
        println!(
            "{:<36}  {:<20} {:<24} {}",
            text(token, "tokenId"),
            text(token, "name"),
            text(token, "createdAt"),
            token["expiresAt"].as_str().unwrap_or("never")
        );
    }
}

pub async fn run_tokens(args: TokensArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    match args.command {
        TokensCommand::Create { user_id, name, expires_in_s } => {
            let mut body = json!({ "name": name });
            if let Some(seconds) = expires_in_s {
                body["expiresInS"] = json!(seconds);
            }
            let answer = api.call(Method::POST, &format!("/v1/admin/users/{user_id}/tokens"), Some(body)).await?;
            if args.json {
                println!("{answer}");
            } else {
                eprintln!(
                    "created token {} ({name}) for user {user_id}; it is shown only now",
                    text(&answer, "tokenId")
                );
                println!("{}", text(&answer, "token"));
            }
        }
        TokensCommand::Ls { user_id } => {
            let path = match &user_id {
                Some(user_id) => format!("/v1/admin/users/{user_id}/tokens"),
                None => "/v1/me/tokens".to_string(),
            };
            let answer = api.call(Method::GET, &path, None).await?;
            if args.json {
                println!("{answer}");
            } else {
                print_tokens(&answer);
            }
        }
        TokensCommand::Revoke { token_id, user } => {
            let path = match &user {
                Some(user_id) => format!("/v1/admin/users/{user_id}/tokens/{token_id}"),
                None => format!("/v1/me/tokens/{token_id}"),
            };
            let answer = api.call(Method::DELETE, &path, None).await?;
            if args.json {
                println!("{answer}");
            } else {
                eprintln!("token {token_id} revoked");
            }
        }
    }
    Ok(())
}

/// One node's `/v1/cluster`, or why not.
async fn cluster_view(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let answer = http
        .get(format!("{}/v1/cluster", url.trim_end_matches('/')))
        .timeout(STATUS_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("unreachable ({e})"))?;
    let status = answer.status();
    let body: Value = answer.json().await.map_err(|e| format!("bad answer ({e})"))?;
    if status != StatusCode::OK {
        return Err(problem(status, &body));
    }
    Ok(body)
}

/// The URL of a member's HTTP address, in the scheme the user gave.
fn member_url(scheme: &str, http_addr: &str) -> String {
    format!("{scheme}://{http_addr}")
}

pub async fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    let (http, url) = args.connection.anonymous()?;
    let scheme = if url.starts_with("https://") { "https" } else { "http" };
    let mut asked: Vec<String> = std::iter::once(url.clone()).chain(args.endpoints.iter().cloned()).collect();
    let mut views: Vec<(String, Result<Value, String>)> = Vec::new();
    let mut index = 0;
    // Ask every endpoint given, then every member any of them names.
    while index < asked.len() {
        let endpoint = asked[index].clone();
        index += 1;
        let view = cluster_view(&http, &endpoint).await;
        let seen = |id: Option<u64>| views.iter().any(|(_, v)| v.as_ref().is_ok_and(|v| v["nodeId"].as_u64() == id));
        if view.as_ref().is_ok_and(|v| seen(v["nodeId"].as_u64())) {
            continue; // the same node under another address
        }
        if let Ok(view) = &view {
            for member in view["members"].as_array().into_iter().flatten() {
                let member = member_url(scheme, text(member, "httpAddr"));
                if !asked.iter().any(|a| a.trim_end_matches('/') == member) {
                    asked.push(member);
                }
            }
        }
        views.push((endpoint, view));
    }
    if views.iter().all(|(_, view)| view.is_err()) {
        let why: Vec<String> =
            views.iter().map(|(url, v)| format!("{url}: {}", v.as_ref().err().map_or("", |e| e))).collect();
        bail!("no node answered: {}", why.join("; "));
    }
    if args.json {
        let nodes: Vec<Value> = views
            .iter()
            .map(|(url, view)| match view {
                Ok(view) => json!({ "url": url, "cluster": view }),
                Err(e) => json!({ "url": url, "error": e }),
            })
            .collect();
        println!("{}", json!({ "nodes": nodes }));
        return Ok(());
    }
    print!("{}", summary(&views));
    Ok(())
}

/// The status table: the members as the best-informed node sees them (highest term), then
/// one line per node asked with its own view; lag is the leader's last log index minus the
/// node's applied index.
fn summary(views: &[(String, Result<Value, String>)]) -> String {
    use std::fmt::Write;
    let answered: Vec<&Value> = views.iter().filter_map(|(_, v)| v.as_ref().ok()).collect();
    let best = answered.iter().max_by_key(|v| (v["term"].as_u64(), v["leaderId"].is_u64())).copied();
    let mut out = String::new();
    let Some(best) = best else { return out };
    let leader = best["leaderId"].as_u64();
    let leader_log = answered
        .iter()
        .find(|v| leader.is_some() && v["nodeId"].as_u64() == leader)
        .and_then(|v| v["lastLogIndex"].as_u64());
    let members = best["members"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "cluster: {} members, leader {}, term {}",
        members.len(),
        leader.map_or("none".to_string(), |l| l.to_string()),
        best["term"].as_u64().unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "{:>4}  {:<9} {:<7} {:<22} {:>6} {:>9} {:>9} {:>6}",
        "id", "role", "member", "http", "term", "applied", "log", "lag"
    );
    for (url, view) in views {
        match view {
            Ok(v) => {
                let id = v["nodeId"].as_u64().unwrap_or(0);
                let member = members.iter().find(|m| m["id"].as_u64() == Some(id));
                let applied = v["lastApplied"].as_u64().unwrap_or(0);
                let lag = leader_log.map_or("?".to_string(), |log| log.saturating_sub(applied).to_string());
                let _ = writeln!(
                    out,
                    "{:>4}  {:<9} {:<7} {:<22} {:>6} {:>9} {:>9} {:>6}",
                    id,
                    text(v, "role"),
                    member.map_or("no", |m| text(m, "role")),
                    member.map_or(url.as_str(), |m| text(m, "httpAddr")),
                    v["term"].as_u64().unwrap_or(0),
                    applied,
                    v["lastLogIndex"].as_u64().unwrap_or(0),
                    lag
                );
            }
            Err(e) => {
                let _ = writeln!(out, "{:>4}  {:<9} {:<7} {:<22} {e}", "?", "-", "-", url);
            }
        }
    }
    // A node with no id and no log is fresh (not added yet): it belongs to no cluster.
    let clusters: std::collections::BTreeSet<&str> = answered
        .iter()
        .filter_map(|v| match v["clusterId"].as_str().filter(|id| !id.is_empty()) {
            Some(id) => Some(id),
            None => (v["lastLogIndex"].as_u64().unwrap_or(0) > 0).then_some("(none)"),
        })
        .collect();
    if clusters.len() > 1 {
        let _ = writeln!(
            out,
            "warning: these nodes belong to different clusters ({}): the members a recovery or restore \
             replaced still run on their old data; they never join the new cluster",
            clusters.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_members_leader_and_lag() {
        let members = json!([
            { "id": 1, "httpAddr": "127.0.0.1:1", "grpcAddr": "x", "role": "voter" },
            { "id": 2, "httpAddr": "127.0.0.1:2", "grpcAddr": "x", "role": "voter" },
        ]);
        let node = |id: u64, role: &str, applied: u64, log: u64| {
            json!({ "nodeId": id, "leaderId": 2, "term": 7, "role": role, "members": members,
                    "lastApplied": applied, "lastLogIndex": log, "votes": true, "snapshotIndex": null })
        };
        let views = vec![
            ("http://127.0.0.1:1".to_string(), Ok(node(1, "Follower", 90, 95))),
            ("http://127.0.0.1:2".to_string(), Ok(node(2, "Leader", 100, 100))),
            ("http://127.0.0.1:3".to_string(), Err("unreachable (refused)".to_string())),
        ];
        let text = summary(&views);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cluster: 2 members, leader 2, term 7", "{text}");
        assert!(lines[2].contains("Follower") && lines[2].trim_end().ends_with("10"), "{text}");
        assert!(lines[3].contains("Leader") && lines[3].trim_end().ends_with(" 0"), "{text}");
        assert!(lines[4].contains("unreachable"), "{text}");
        assert_eq!(lines.len(), 5, "one cluster: no warning\n{text}");
        let mut other = node(3, "Leader", 5, 5);
        other["clusterId"] = json!("new-cluster");
        let views = vec![
            ("http://127.0.0.1:2".to_string(), Ok(node(2, "Leader", 100, 100))),
            ("http://127.0.0.1:3".to_string(), Ok(other)),
        ];
        let text = summary(&views);
        assert!(text.lines().last().is_some_and(|l| l.contains("different clusters ((none), new-cluster)")), "{text}");
        // A fresh node (no id, no log) is no other cluster.
        let mut fresh = node(3, "Learner", 0, 0);
        fresh["clusterId"] = json!("");
        let mut ours = node(2, "Leader", 100, 100);
        ours["clusterId"] = json!("new-cluster");
        let views = vec![("http://127.0.0.1:2".to_string(), Ok(ours)), ("http://127.0.0.1:3".to_string(), Ok(fresh))];
        let text = summary(&views);
        assert!(!text.contains("different clusters"), "{text}");
    }
}
