//! What the client subcommands share: the connection flags and a small API caller.

use std::path::PathBuf;

use anyhow::{bail, Context};
use reqwest::StatusCode;
use serde_json::Value;

/// Where and as whom the client subcommands talk to the cluster.
#[derive(clap::Args, Debug)]
pub struct Connection {
    /// Any node's HTTP address.
    #[arg(long, env = "RAFTBOX_URL", default_value = "http://127.0.0.1:7081", global = true)]
    url: String,
    /// Bearer token (or --token-file).
    #[arg(long, env = "RAFTBOX_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token.
    #[arg(long, env = "RAFTBOX_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
}

pub struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
    device: Option<String>,
}

impl Api {
    pub fn new(connection: &Connection, device: Option<String>) -> anyhow::Result<Api> {
        let token = match (&connection.token, &connection.token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => {
                std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?.trim().to_string()
            }
            (None, None) => bail!("a token is needed: --token, --token-file, RAFTBOX_TOKEN or RAFTBOX_TOKEN_FILE"),
        };
        Ok(Api { http: reqwest::Client::new(), url: connection.url.clone(), token, device })
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request =
            self.http.request(method, format!("{}{path}", self.url.trim_end_matches('/'))).bearer_auth(&self.token);
        match &self.device {
            Some(device) => request.header("x-device-id", device),
            None => request,
        }
    }

    /// Sends, and turns a problem+json answer into an error naming its detail.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        let response = request.send().await.context("reach the cluster")?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    pub async fn current_version(&self, remote: &str) -> anyhow::Result<Option<Value>> {
        let (status, body) =
            self.send(self.request(reqwest::Method::GET, "/v1/files").query(&[("path", remote)])).await?;
        match status {
            StatusCode::OK => Ok(Some(body)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => bail!("read {remote}: {}", problem(status, &body)),
        }
    }
}

pub fn problem(status: StatusCode, body: &Value) -> String {
    match body["detail"].as_str() {
        Some(detail) => format!("{status}: {detail}"),
        None => status.to_string(),
    }
}
