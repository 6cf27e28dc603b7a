//! `raftbox cluster`: the cluster's members, and online membership change (admin token).

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::client::{problem, Api, Connection};

/// How long `cluster add` keeps repeating the request while the new node catches up.
const ADD_DEADLINE: Duration = Duration::from_secs(30 * 60);

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ClusterCommand {
    /// List the members: id, role (voter or learner), HTTP and gRPC addresses.
    Members,
    /// Add node ID (already started, with an empty or its own data directory): it joins as a
    /// learner, catches up, then becomes a voter. Waits until it is a voter.
    Add {
        id: u64,
        /// The node's HTTP address, e.g. 127.0.0.1:7084.
        http_addr: String,
        /// The node's gRPC address, e.g. 127.0.0.1:7094.
        grpc_addr: String,
    },
    /// Remove node ID from the cluster (stop its process afterwards). A node whose disk was
    /// lost rejoins only through remove, then add.
    Remove { id: u64 },
}

fn print_members(answer: &Value) {
    println!("{:>4}  {:<8} {:<22} grpc", "id", "role", "http");
    for member in answer["members"].as_array().into_iter().flatten() {
        println!(
            "{:>4}  {:<8} {:<22} {}",
            member["id"].as_u64().unwrap_or(0),
            member["role"].as_str().unwrap_or("?"),
            member["httpAddr"].as_str().unwrap_or("?"),
            member["grpcAddr"].as_str().unwrap_or("?")
        );
    }
}

async fn call(api: &Api, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<(StatusCode, Value)> {
    let mut request = api.request(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let (status, answer) = api.send(request).await?;
    if !status.is_success() {
        bail!("{path}: {}", problem(status, &answer));
    }
    Ok((status, answer))
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    match args.command {
        ClusterCommand::Members => {
            let (_, answer) = call(&api, Method::GET, "/v1/admin/cluster/members", None).await?;
            print_members(&answer);
        }
        ClusterCommand::Add { id, http_addr, grpc_addr } => {
            let body = json!({ "id": id, "httpAddr": http_addr, "grpcAddr": grpc_addr });
            let started = Instant::now();
            // Whatever stops the command part-way, the change may be half done: say how to
            // finish it or undo it.
            let half_done = || {
                format!(
                    "node {id} may have joined as a learner and not become a voter yet; to finish, run \
                     `raftbox cluster add {id} {http_addr} {grpc_addr}` again (it goes on where it \
                     stopped); to undo, `raftbox cluster remove {id}`; `raftbox cluster members` shows \
                     where it stands"
                )
            };
            loop {
                let (status, answer) = call(&api, Method::POST, "/v1/admin/cluster/members", Some(body.clone()))
                    .await
                    .with_context(half_done)?;
                if status == StatusCode::OK {
                    eprintln!("node {id} is a voter");
                    print_members(&answer);
                    break;
                }
                if started.elapsed() > ADD_DEADLINE {
                    bail!("node {id} is still catching up after {ADD_DEADLINE:?}: {}", half_done());
                }
                eprintln!("node {id} joined as a learner and is catching up ({}s)…", started.elapsed().as_secs());
            }
        }
        ClusterCommand::Remove { id } => {
            // 202 while the remaining voters fill in the blocks they lack: each repeat goes
            // on from where the fill got, so a removal needing any number of them arrives.
            let started = std::time::Instant::now();
            loop {
                let (status, answer) =
                    call(&api, Method::DELETE, &format!("/v1/admin/cluster/members/{id}"), None).await?;
                if status == StatusCode::OK {
                    eprintln!("node {id} removed; stop its process");
                    print_members(&answer);
                    break;
                }
                if started.elapsed() > ADD_DEADLINE {
                    bail!("the remaining voters are still filling in blocks after {ADD_DEADLINE:?}; run the removal again to go on");
                }
                eprintln!(
                    "node {id} not removed yet: the remaining voters are filling in blocks ({}s)…",
                    started.elapsed().as_secs()
                );
            }
        }
    }
    Ok(())
}
