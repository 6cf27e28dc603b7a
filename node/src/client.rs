//! What the client subcommands share: the connection flags and a small API caller that
//! survives its own cluster's defaults — it waits out 429 and 503 answers as their
//! `Retry-After` asks (bounded), and every POST carries an `Idempotency-Key`, so a retry after
//! an unknown outcome has one effect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::StatusCode;
use serde_json::Value;

/// Retries of one request after 429 or 503, at most.
const RETRIES_MAX: u32 = 10;
/// Longest single wait between retries, whatever `Retry-After` says.
const RETRY_WAIT_MAX: Duration = Duration::from_secs(30);
/// Wait when a 429 or 503 names none.
const RETRY_WAIT_DEFAULT: Duration = Duration::from_secs(1);

/// Where and as whom the client subcommands talk to the cluster.
#[derive(clap::Args, Debug)]
pub struct Connection {
    /// Any node's HTTP address.
    #[arg(long, env = "RAFTBOX_URL", default_value = "http://127.0.0.1:7081", global = true)]
    url: String,
    /// Bearer token (or --token-file). Without either flag: $RAFTBOX_TOKEN, then
    /// $RAFTBOX_TOKEN_FILE (a flag given on the command line always wins over both).
    #[arg(long, global = true)]
    token: Option<String>,
    /// File holding the bearer token.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an `https://` URL, besides the public roots: the
    /// cluster's `ca.pem` (README "TLS").
    #[arg(long, env = "RAFTBOX_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
}

impl Connection {
    /// A client without a token and the node's URL, for the routes that need none.
    pub fn anonymous(&self) -> anyhow::Result<(reqwest::Client, String)> {
        let http = http_client(reqwest::Client::builder(), self.ca_file.as_deref())?;
        Ok((http, self.url.trim_end_matches('/').to_string()))
    }
}

/// Where the client's token comes from.
#[derive(Debug, PartialEq, Eq)]
enum TokenSource {
    Given(String),
    File(PathBuf),
}

/// The token to use: `--token`, else `--token-file`, else `RAFTBOX_TOKEN`, else
/// `RAFTBOX_TOKEN_FILE` — what the user typed beats what the environment holds.
fn token_source(
    flag: Option<&str>,
    flag_file: Option<&std::path::Path>,
    (env, env_file): (Option<String>, Option<PathBuf>),
) -> Option<TokenSource> {
    match (flag, flag_file) {
        (Some(token), _) => Some(TokenSource::Given(token.to_owned())),
        (None, Some(path)) => Some(TokenSource::File(path.to_owned())),
        (None, None) => env.map(TokenSource::Given).or(env_file.map(TokenSource::File)),
    }
}

/// Where `raftbox login` keeps the session token, and where every command looks for one last:
/// `$XDG_CONFIG_HOME/raftbox/token`, else `~/.config/raftbox/token`.
pub fn saved_token_path() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()).map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|home| PathBuf::from(home).join(".config"))
    })?;
    Some(config.join("raftbox").join("token"))
}

/// An id on the command line (a user's, a folder's, a job's…): refused here when empty or
/// when it could not be one path segment, so `raftbox share members ""` says so instead of
/// calling `/v1/namespaces//acl`.
pub fn id(given: &str) -> Result<String, String> {
    if given.trim().is_empty() {
        return Err("an id cannot be empty (did a variable holding it go unset?)".into());
    }
    if let Some(c) = given.chars().find(|c| matches!(c, '/' | '?' | '#' | '%') || c.is_whitespace() || c.is_control()) {
        return Err(format!("an id holds no {c:?}: {given:?} is not one"));
    }
    Ok(given.to_string())
}

#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
    device: Option<String>,
    /// The namespace file calls work in (`namespaceId`); `None`: the personal one.
    namespace: Option<String>,
}

impl Connection {
    /// The node address given with `--url` (or `RAFTBOX_URL`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Api {
    pub fn new(connection: &Connection, device: Option<String>) -> anyhow::Result<Api> {
        Api::connect(connection, device, &connection.url, reqwest::Client::builder())
    }

    /// A client of the node at `url` (instead of `--url`), its HTTP client made from `builder`
    /// (timeouts, for instance).
    pub fn connect(
        connection: &Connection,
        device: Option<String>,
        url: &str,
        builder: reqwest::ClientBuilder,
    ) -> anyhow::Result<Api> {
        let from_env = (
            std::env::var("RAFTBOX_TOKEN").ok().filter(|t| !t.is_empty()),
            std::env::var_os("RAFTBOX_TOKEN_FILE").filter(|f| !f.is_empty()).map(PathBuf::from),
        );
        let token = match token_source(connection.token.as_deref(), connection.token_file.as_deref(), from_env) {
            Some(TokenSource::Given(token)) => token,
            Some(TokenSource::File(path)) => {
                std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?.trim().to_string()
            }
            None => match saved_token_path().filter(|path| path.exists()) {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("read {}", path.display()))?
                    .trim()
                    .to_string(),
                None => bail!(
                    "a token is needed: --token, --token-file, RAFTBOX_TOKEN, RAFTBOX_TOKEN_FILE, or `raftbox login`"
                ),
            },
        };
        let http = http_client(builder, connection.ca_file.as_deref())?;
        Ok(Api { http, url: url.to_string(), token, device, namespace: None })
    }

    /// The node address this client talks to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token this client sends.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// File calls through this client work in `namespace` (a shared folder's id).
    pub fn in_namespace(mut self, namespace: Option<String>) -> Api {
        self.namespace = namespace;
        self
    }

    /// A file call's JSON body, with the namespace added when one is set.
    pub fn file_body(&self, mut body: Value) -> Value {
        if let Some(namespace) = &self.namespace {
            body["namespaceId"] = Value::String(namespace.clone());
        }
        body
    }

    /// A request to `path`; a POST gets a fresh `Idempotency-Key`, which its retries keep.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_keyed(method, path, None)
    }

    /// A request to `path` whose POST carries `key` as its one `Idempotency-Key` (the user's,
    /// from `--idempotency-key`), or a fresh one when `None`. (One header only: a server acts
    /// on the first, so a second one would be ignored.)
    pub fn request_keyed(&self, method: reqwest::Method, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let is_post = method == reqwest::Method::POST;
        let is_get = method == reqwest::Method::GET;
        let mut request =
            self.http.request(method, format!("{}{path}", self.url.trim_end_matches('/'))).bearer_auth(&self.token);
        if is_post {
            let key = key.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
            request = request.header("idempotency-key", key);
        }
        if let (true, true, Some(namespace)) = (is_get, path.starts_with("/v1/files"), &self.namespace) {
            request = request.query(&[("namespaceId", namespace)]);
        }
        match &self.device {
            Some(device) => request.header("x-device-id", device),
            None => request,
        }
    }

    /// Sends, waiting out 429 and 503 answers (see [`Api::send_raw`]), and parses the JSON
    /// answer (problem+json included).
    pub async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        let response = self.send_raw(request).await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// One JSON call of `path` (with `body`, if any); a non-2xx answer is an error naming the
    /// problem.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (status, answer) = self.send(request).await?;
        if !status.is_success() {
            bail!("{path}: {}", problem(status, &answer));
        }
        Ok(answer)
    }

    /// Sends; on 429 or 503 waits as `Retry-After` says (at most [`RETRY_WAIT_MAX`]) and tries
    /// again, at most [`RETRIES_MAX`] times, then returns the last answer. Every request this
    /// client retries is safe to repeat: reads, block PUTs (content-addressed), and POSTs
    /// (which carry an idempotency key).
    pub async fn send_raw(&self, request: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let mut retries = 0;
        loop {
            let attempt = request.try_clone().context("a request with a streamed body cannot be retried")?;
            let response = attempt.send().await.context("reach the cluster")?;
            let status = response.status();
            let busy = status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
            if !busy || retries >= RETRIES_MAX {
                return Ok(response);
            }
            retries += 1;
            tokio::time::sleep(retry_wait(response.headers(), retries)).await;
        }
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

/// `builder`'s client, trusting the CA in `ca_file` (PEM, one or more certificates) as well.
pub fn http_client(builder: reqwest::ClientBuilder, ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut builder = builder.use_rustls_tls();
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).with_context(|| format!("read CA file {}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("CA file {}: not PEM certificates", path.display()))?;
        if certs.is_empty() {
            bail!("CA file {} holds no PEM certificate", path.display());
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().context("build the HTTP client")
}

/// How long to wait before retry number `retry`: the answer's `Retry-After` seconds if it
/// names them, else a backoff doubling from [`RETRY_WAIT_DEFAULT`]; never above
/// [`RETRY_WAIT_MAX`], with up to 25 % jitter so clients that were refused together do not
/// return together.
fn retry_wait(headers: &reqwest::header::HeaderMap, retry: u32) -> Duration {
    let asked = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let base = asked.unwrap_or_else(|| RETRY_WAIT_DEFAULT * 2u32.saturating_pow(retry.saturating_sub(1)));
    let base = base.min(RETRY_WAIT_MAX);
    base + base.mul_f64(rand::random::<f64>() * 0.25)
}

pub fn problem(status: StatusCode, body: &Value) -> String {
    match body["detail"].as_str() {
        Some(detail) => format!("{status}: {detail}"),
        None => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api() -> Api {
        let http = reqwest::Client::new();
        Api { http, url: "http://127.0.0.1:9".into(), token: "t".into(), device: None, namespace: None }
    }

    fn keys(request: reqwest::RequestBuilder) -> Vec<String> {
        let built = request.build().expect("a request");
        built.headers().get_all("idempotency-key").iter().map(|v| v.to_str().expect("ascii").to_owned()).collect()
    }

    #[test]
    fn a_flag_beats_the_environment_and_a_token_beats_a_file() {
        let env = || (Some("from-env".to_owned()), Some(PathBuf::from("/env/file")));
        let file = std::path::Path::new("/flag/file");
        assert_eq!(token_source(None, Some(file), env()), Some(TokenSource::File(file.to_owned())));
        assert_eq!(token_source(Some("flag"), Some(file), env()), Some(TokenSource::Given("flag".into())));
        assert_eq!(token_source(None, None, env()), Some(TokenSource::Given("from-env".into())));
        assert_eq!(
            token_source(None, None, (None, Some(PathBuf::from("/env/file")))),
            Some(TokenSource::File(PathBuf::from("/env/file")))
        );
        assert_eq!(token_source(None, None, (None, None)), None);
    }

    #[test]
    fn a_post_carries_one_idempotency_key_the_users_when_given() {
        let api = api();
        let given = keys(api.request_keyed(reqwest::Method::POST, "/v1/jobs", Some("mine")));
        assert_eq!(given, vec!["mine".to_owned()], "the user's key, once");
        let fresh = keys(api.request(reqwest::Method::POST, "/v1/jobs"));
        assert_eq!(fresh.len(), 1, "one fresh key: {fresh:?}");
        assert!(keys(api.request(reqwest::Method::GET, "/v1/jobs")).is_empty(), "a GET carries none");
    }

    #[test]
    fn an_empty_or_path_breaking_id_is_refused() {
        assert_eq!(super::id("01a2-77").as_deref(), Ok("01a2-77"));
        for bad in ["", "  ", "a/b", "a b", "x?y", "../x", "a%2f"] {
            assert!(super::id(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn retry_waits_follow_retry_after_within_bounds() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().expect("value"));
        let wait = retry_wait(&headers, 1);
        assert!(wait >= Duration::from_secs(2) && wait <= Duration::from_millis(2_500), "{wait:?}");
        headers.insert(reqwest::header::RETRY_AFTER, "3600".parse().expect("value"));
        assert!(retry_wait(&headers, 1) <= RETRY_WAIT_MAX.mul_f64(1.25));
        let none = reqwest::header::HeaderMap::new();
        assert!(retry_wait(&none, 3) >= Duration::from_secs(4));
    }
}
