//! `raftbox limits`: the cluster's runtime limits (admin token) — rate limits, job limits and
//! quotas, replicated, so a change acts on every node without a restart. `show` prints them
//! as TOML with the node config's sections; `set FILE` takes the same TOML back.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use raftbox_api::runtime_limits::LimitsConfig;
use reqwest::Method;
use serde_json::Value;

use crate::client::{problem, Api, Connection};

const PATH: &str = "/v1/admin/limits";

#[derive(clap::Args, Debug)]
pub struct LimitsArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: LimitsCommand,
}

#[derive(clap::Subcommand, Debug)]
enum LimitsCommand {
    /// Print the limits in force as TOML (`[[rate_limits]]`, `[job_limits]`, `[quotas]`, as
    /// in the node config), after comments saying where they come from: the cluster's (with
    /// their revision), or, before any were set, the answering node's TOML.
    Show {
        /// Print the API's JSON answer instead.
        #[arg(long)]
        json: bool,
    },
    /// Replace the cluster's limits with those in FILE (TOML with the sections `show` prints;
    /// `-` reads standard input). Checked whole: one bad limit refuses the file and nothing
    /// changes. Each node enforces the new limits as soon as it applies the change (within a
    /// second). Needs every node at data format 3 (docs/operations.md, "Upgrading").
    ///
    /// Example: raftbox limits show > limits.toml; edit it; raftbox limits set limits.toml
    Set { file: PathBuf },
}

pub async fn run(args: LimitsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, None)?;
    match args.command {
        LimitsCommand::Show { json } => {
            let answer = call(&api, Method::GET, None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                print!("{}", as_toml(&answer)?);
            }
        }
        LimitsCommand::Set { file } => {
            let text = if file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).context("read standard input")?;
                text
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?
            };
            let limits: LimitsConfig =
                toml::from_str(&text).with_context(|| format!("{} is not a limits file", file.display()))?;
            // The server checks them again; this names a mistake before anything is sent.
            limits.validate().map_err(|why| anyhow::anyhow!("{}: {why}; nothing changed", file.display()))?;
            let answer = call(&api, Method::PUT, Some(serde_json::to_value(&limits)?)).await?;
            eprintln!(
                "limits set: revision {}; each node enforces them as soon as it applies the change",
                answer["revision"].as_u64().unwrap_or(0)
            );
        }
    }
    Ok(())
}

async fn call(api: &Api, method: Method, body: Option<Value>) -> anyhow::Result<Value> {
    let mut request = api.request(method, PATH);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let (status, answer) = api.send(request).await?;
    if !status.is_success() {
        bail!("{PATH}: {}", problem(status, &answer));
    }
    Ok(answer)
}

/// `GET /v1/admin/limits`'s answer as a limits file: where they come from, in comments,
/// then the limits.
fn as_toml(answer: &Value) -> anyhow::Result<String> {
    let limits: LimitsConfig = serde_json::from_value(answer["limits"].clone())
        .context("the server's limits are not in this version's shape")?;
    let source = match (answer["source"].as_str(), answer["revision"].as_u64()) {
        (Some("cluster"), Some(revision)) => format!("the cluster's limits, revision {revision}"),
        _ => "the answering node's TOML (the cluster has none set yet)".to_owned(),
    };
    let format = answer["clusterFormat"].as_u64().unwrap_or(0);
    Ok(format!("# {source}; cluster data format {format}\n{}", toml::to_string(&limits)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_prints_what_set_takes_back() {
        let text = "[[rate_limits]]\nname = \"u\"\nscope = \"user\"\nroutes = [\"/v1/*\"]\ncapacity = 10\n\
                    refill_per_s = 2\n\n[quotas]\nfolders_per_user = 4\n";
        let limits: LimitsConfig = toml::from_str(text).expect("parses");
        let answer = serde_json::json!({"source": "cluster", "revision": 2, "clusterFormat": 3, "limits": limits});
        let shown = as_toml(&answer).expect("toml");
        assert!(shown.starts_with("# the cluster's limits, revision 2; cluster data format 3\n"), "{shown}");
        let back: LimitsConfig = toml::from_str(&shown).expect("show's output parses as a limits file");
        assert_eq!(back.validate().expect("valid").rate_limits, limits.validate().expect("valid").rate_limits);
        assert_eq!(back.quotas.folders_per_user, 4);
    }
}
