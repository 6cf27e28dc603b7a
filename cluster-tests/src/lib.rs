//! Harness for raftbox's process-level cluster tests.
//!
//! The tests drive real `raftbox serve` processes through their HTTP API only; they know
//! nothing of the other crates' internals (DESIGN.md §1, STYLE.md item 12). This crate offers:
//!
//! - [`Cluster`]: a temporary directory, one `config.toml` per node, one child process per
//!   node, fault injection by process handle ([`Cluster::kill9`], [`Cluster::terminate`],
//!   [`Cluster::wipe`], [`Cluster::start_node`]) and probes that poll with a deadline
//!   ([`Cluster::wait_ready`], [`Cluster::wait_for_leader`], [`Cluster::wait_caught_up`]).
//! - [`Outcome`] and the request helpers ([`create_user`], [`get_user`], [`create_token`],
//!   [`me`]): an operation is acknowledged, rejected, or *unknown* — a timeout or a lost
//!   connection is unknown, never "failed".
//! - [`Workload`]: concurrent writers creating uniquely named users, recording every outcome.
//! - [`Seed`]: the single source of a test's random choices, printed with the command that
//!   replays it.
//! - [`Cluster::check_logs`] and [`Cluster::conclude`]: a panic or an ERROR line in any node
//!   log fails the test; on failure the log tails and the cluster directory are printed
//!   (`RAFTBOX_KEEP=1` keeps the directory).

pub mod receiver;

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::future::Future;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{json, Value};
use tokio::task::JoinSet;

/// What openraft logs (at ERROR) when a peer cannot be reached: expected once a test has
/// stopped a node, so such lines are allowed from then on. Panics never are.
const PEER_DOWN_LOG_FRAGMENT: &str = "Unreachable node";
/// What else openraft logs at ERROR while a peer is down or frozen: timed-out replication
/// and leadership confirmations.
const PEER_FAULT_LOG_FRAGMENTS: [&str; 3] =
    [PEER_DOWN_LOG_FRAGMENT, "RPCError err=timeout", "timeout while confirming leadership"];

/// Interval between two probes of a condition awaited with a deadline.
pub const POLL_INTERVAL_MS: u64 = 25;
/// Deadline of one client request made by the harness; a request that exceeds it is unknown.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Deadline of one probe (`/readyz`, `/v1/cluster`) made while polling.
pub const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Deadline for establishing a TCP connection to a node.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Deadline for a freshly started cluster to elect a leader and accept the admin token.
pub const STARTUP_DEADLINE_MS: u64 = 30_000;
/// How long a node may take to exit after SIGTERM before it is killed.
pub const TERMINATE_DEADLINE_MS: u64 = 10_000;
/// Lines of each node log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 60;
/// Pause after an operation that was not acknowledged, so a dead endpoint is not spun on.
pub const RETRY_BACKOFF_MS: u64 = 100;
/// Attempts of one user creation in [`create_users`] while the outcome stays unknown.
pub const CREATE_ATTEMPTS_MAX: u32 = 50;
/// Attempts of one read in [`Cluster::verify_users`] while the outcome stays unknown.
pub const VERIFY_ATTEMPTS_MAX: u32 = 50;
/// Concurrent requests of [`Cluster::verify_users`].
pub const VERIFY_LANES: usize = 8;
/// Records a [`Workload`] keeps; its writers stop when it is reached.
pub const WORKLOAD_RECORDS_MAX: usize = 1_000_000;
/// Directories above the test executable searched for the `raftbox` binary.
pub const BIN_SEARCH_DEPTH: usize = 4;

/// Environment variable naming the `raftbox` binary explicitly.
pub const BIN_ENV: &str = "RAFTBOX_BIN";
/// Environment variable holding the seed of a run to replay.
pub const SEED_ENV: &str = "RAFTBOX_SEED";
/// Environment variable that keeps the cluster directory when set to `1`.
pub const KEEP_ENV: &str = "RAFTBOX_KEEP";

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

// ---------------------------------------------------------------------------------------------
// Locating the binary, ports, tokens

/// The `raftbox` binary under test: `$RAFTBOX_BIN`, else the `raftbox` executable in the
/// target profile directory that holds this test executable (`<target>/debug/deps/it-…`).
///
/// Cargo does not build another package's binary for an integration test, so the binary must
/// have been built first (`cargo build -p raftbox`; `scripts/test` builds the workspace).
pub fn raftbox_bin() -> Result<PathBuf> {
    if let Some(path) = env::var_os(BIN_ENV) {
        let path = PathBuf::from(path);
        ensure!(path.is_file(), "{BIN_ENV}={} is not a file", path.display());
        return Ok(path);
    }
    let exe = env::current_exe().context("locate the test executable")?;
    exe.ancestors()
        .skip(1)
        .take(BIN_SEARCH_DEPTH)
        .map(|dir| dir.join("raftbox"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow!(
                "no `raftbox` binary found in the target directory above {}; build it first \
                 with `cargo build -p raftbox` (scripts/test does), or set {BIN_ENV}",
                exe.display()
            )
        })
}

/// `n` distinct free loopback ports. All listeners are held until every port is chosen, so
/// the ports are distinct; they are released on return for the nodes to bind.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()
        .context("bind a free loopback port")?;
    listeners.iter().map(|listener| Ok(listener.local_addr().context("read a bound port")?.port())).collect()
}

/// A fresh admin token: `rbx_` and base64url (no padding) of 32 random bytes, the same shape
/// `scripts/cluster up` writes.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill(&mut bytes[..]);
    format!("rbx_{}", base64url(&bytes))
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b0 = u32::from(chunk[0]);
        let b1 = u32::from(chunk.get(1).copied().unwrap_or(0));
        let b2 = u32::from(chunk.get(2).copied().unwrap_or(0));
        let triple = (b0 << 16) | (b1 << 8) | b2;
        // 1 byte → 2 characters, 2 → 3, 3 → 4.
        for i in 0..=chunk.len() {
            let sextet = (triple >> (18 - 6 * i)) & 63;
            out.push(char::from(ALPHABET[sextet as usize]));
        }
    }
    out
}

/// An HTTP client for talking to nodes: no proxy (nodes are on loopback), bounded connect
/// and request times.
pub fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(ms(CONNECT_TIMEOUT_MS))
        .timeout(ms(REQUEST_TIMEOUT_MS))
        .build()
        .context("build the HTTP client")
}

// ---------------------------------------------------------------------------------------------
// Seeds and deadlines

/// The one source of a test's random choices. Taken from `$RAFTBOX_SEED` when set, else
/// random; printed at creation and again when the test panics, with the replay command.
pub struct Seed {
    value: u64,
    test: String,
}

impl Seed {
    /// `test` is the test's path inside the `it` binary, e.g. `failover::leader_killed`.
    pub fn new(test: &str) -> Seed {
        let value = match env::var(SEED_ENV) {
            Ok(text) => {
                text.trim().parse().unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not an unsigned integer"))
            }
            Err(_) => rand::random(),
        };
        let seed = Seed { value, test: test.to_owned() };
        eprintln!("seed {value}; replay with: {}", seed.replay_command());
        seed
    }

    pub fn value(&self) -> u64 {
        self.value
    }

    /// A generator seeded with this seed; every call starts the same sequence.
    pub fn rng(&self) -> StdRng {
        StdRng::seed_from_u64(self.value)
    }

    pub fn replay_command(&self) -> String {
        format!("{SEED_ENV}={} cargo test --workspace --test cluster {}", self.value, self.test)
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test {} failed; replay with: {}", self.test, self.replay_command());
        }
    }
}

/// A condition awaited by polling: `tick` sleeps one poll interval, or fails once the limit
/// has passed, naming what was awaited and the last observation.
pub struct Deadline {
    what: String,
    limit: Duration,
    until: Instant,
}

impl Deadline {
    pub fn after(limit: Duration, what: impl Into<String>) -> Deadline {
        Deadline { what: what.into(), limit, until: Instant::now() + limit }
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.until
    }

    pub async fn tick(&self, last_observation: &str) -> Result<()> {
        if self.expired() {
            bail!("{} not reached within {:?}; last observation: {last_observation}", self.what, self.limit);
        }
        let remaining = self.until.saturating_duration_since(Instant::now());
        tokio::time::sleep(remaining.min(ms(POLL_INTERVAL_MS))).await;
        Ok(())
    }
}

/// Runs a test scenario under an overall deadline; exceeding it is an error.
pub async fn within(limit: Duration, scenario: impl Future<Output = Result<()>>) -> Result<()> {
    match tokio::time::timeout(limit, scenario).await {
        Ok(result) => result,
        Err(_) => bail!("the test exceeded its overall deadline of {limit:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Client operations

/// What a client knows about one operation.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// 2xx: the operation took effect. The parsed JSON body (`null` when empty).
    Ok(Value),
    /// 4xx: the node refused the operation; it did not take effect.
    Rejected(u16, String),
    /// Timeout, connection error or 5xx: the operation may or may not have taken effect.
    Unknown(String),
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }

    pub fn is_rejected(&self) -> bool {
        matches!(self, Outcome::Rejected(..))
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown(_))
    }

    pub fn body(&self) -> Option<&Value> {
        match self {
            Outcome::Ok(body) => Some(body),
            _ => None,
        }
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timeout"
    } else if err.is_connect() {
        "connect"
    } else {
        "transport"
    };
    format!("{kind}: {}", error_chain(err))
}

/// Sends a request and classifies the answer. `Err` only for a protocol violation: a 2xx
/// whose body is not JSON.
pub async fn send(request: reqwest::RequestBuilder) -> Result<Outcome> {
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => return Ok(Outcome::Unknown(describe(&err))),
    };
    let status = response.status();
    let body = match response.text().await {
        Ok(body) => body,
        Err(err) => return Ok(Outcome::Unknown(format!("{status}, body lost: {}", describe(&err)))),
    };
    if status.is_success() {
        let value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body)
                .with_context(|| format!("parse the JSON body of a {status} answer: {body:?}"))?
        };
        Ok(Outcome::Ok(value))
    } else if status.is_client_error() {
        Ok(Outcome::Rejected(status.as_u16(), body))
    } else {
        Ok(Outcome::Unknown(format!("{status}: {body}")))
    }
}

/// A new user named `name` and a bearer token of theirs (named `token_name`), created
/// through node `id`: `(userId, token)`.
pub async fn new_user(cluster: &Cluster, id: u64, name: &str, token_name: &str) -> Result<(String, String)> {
    let (http, url) = (cluster.client(), cluster.http_url(id));
    let user = create_user(&http, &url, cluster.admin_token(), name).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).with_context(|| format!("create {name}: {user:?}"))?;
    let token = create_token(&http, &url, cluster.admin_token(), user_id, token_name).await?;
    let secret = token.body().and_then(|b| b["token"].as_str()).with_context(|| format!("token: {token:?}"))?;
    Ok((user_id.to_owned(), secret.to_owned()))
}

/// `PUT /v1/blocks/{hash}` of `data`; the hash.
pub async fn put_block(http: &reqwest::Client, url: &str, token: &str, data: &[u8]) -> Result<String> {
    let hash = blake3::hash(data).to_hex().to_string();
    let request = http.put(format!("{url}/v1/blocks/{hash}")).bearer_auth(token).body(data.to_vec());
    match send(request).await? {
        Outcome::Ok(_) => Ok(hash),
        other => bail!("PUT block {hash} through {url}: {other:?}"),
    }
}

/// `POST /v1/files/commit` of `path` with `chunks` on `base`, as `device`.
pub async fn commit_file(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    device: &str,
    path: &str,
    chunks: &[String],
    base: u64,
) -> Result<Outcome> {
    let body =
        serde_json::json!({ "path": path, "chunks": chunks, "baseVersion": base, "size": chunks.len(), "mtime": 0 });
    send(http.post(format!("{url}/v1/files/commit")).bearer_auth(token).header("x-device-id", device).json(&body)).await
}

/// `POST /v1/admin/users {"name"}` with the admin token.
pub async fn create_user(http: &reqwest::Client, url: &str, admin_token: &str, name: &str) -> Result<Outcome> {
    let request = http.post(format!("{url}/v1/admin/users")).bearer_auth(admin_token).json(&json!({ "name": name }));
    send(request).await
}

/// `GET /v1/admin/users/{userId}` with the admin token (a linearizable read).
pub async fn get_user(http: &reqwest::Client, url: &str, admin_token: &str, user_id: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/admin/users/{user_id}")).bearer_auth(admin_token)).await
}

/// `POST /v1/admin/users/{userId}/tokens {"name"}` with the admin token.
pub async fn create_token(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    user_id: &str,
    name: &str,
) -> Result<Outcome> {
    let request = http
        .post(format!("{url}/v1/admin/users/{user_id}/tokens"))
        .bearer_auth(admin_token)
        .json(&json!({ "name": name }));
    send(request).await
}

/// `GET /v1/me` with any token.
pub async fn me(http: &reqwest::Client, url: &str, token: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/me")).bearer_auth(token)).await
}

/// A user whose creation was acknowledged (201).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedUser {
    pub name: String,
    pub user_id: String,
    pub namespace_id: String,
}

impl CreatedUser {
    /// Reads `{"userId","namespaceId"}` from a 201 body.
    pub fn from_body(name: &str, body: &Value) -> Result<CreatedUser> {
        let field = |key: &str| {
            body[key]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("creating user {name}: no string {key:?} in {body}"))
        };
        Ok(CreatedUser { name: name.to_owned(), user_id: field("userId")?, namespace_id: field("namespaceId")? })
    }
}

/// Fails if two acknowledged users share an id.
pub fn ensure_distinct_ids(users: &[CreatedUser]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for user in users {
        ensure!(
            seen.insert(user.user_id.as_str()),
            "user id {} was returned for two creations (one is {})",
            user.user_id,
            user.name
        );
    }
    Ok(())
}

/// Runs `work` over `items` on `lanes` concurrent tasks (item `i` on lane `i % lanes`, each
/// lane in order) and returns the results in the order of `items`.
pub async fn in_lanes<T, R, F, Fut>(items: Vec<T>, lanes: usize, work: F) -> Result<Vec<R>>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<R>> + Send + 'static,
{
    let lanes = lanes.max(1);
    let mut buckets: Vec<Vec<(usize, T)>> = (0..lanes).map(|_| Vec::new()).collect();
    for (index, item) in items.into_iter().enumerate() {
        buckets[index % lanes].push((index, item));
    }
    let mut tasks = JoinSet::new();
    for bucket in buckets {
        let work = work.clone();
        tasks.spawn(async move {
            let mut done = Vec::with_capacity(bucket.len());
            for (index, item) in bucket {
                done.push((index, work(item).await?));
            }
            Ok::<_, anyhow::Error>(done)
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.context("a lane task panicked")??);
    }
    all.sort_by_key(|(index, _)| *index);
    Ok(all.into_iter().map(|(_, result)| result).collect())
}

/// Creates one user per name through `urls` (name `i` through `urls[i % len]`), `lanes` at a
/// time, for phases without faults. An unknown outcome is retried under a fresh name
/// (`<name>-retryN`: the first attempt may have taken effect); a rejection is an error.
pub async fn create_users(
    http: &reqwest::Client,
    urls: &[String],
    admin_token: &str,
    names: Vec<String>,
    lanes: usize,
) -> Result<Vec<CreatedUser>> {
    ensure!(!urls.is_empty(), "create_users needs at least one endpoint");
    let urls = Arc::new(urls.to_vec());
    let http = http.clone();
    let admin_token = admin_token.to_owned();
    let indexed: Vec<(usize, String)> = names.into_iter().enumerate().collect();
    in_lanes(indexed, lanes, move |(index, name)| {
        let http = http.clone();
        let urls = urls.clone();
        let admin_token = admin_token.clone();
        async move {
            let url = &urls[index % urls.len()];
            create_user_settled(&http, url, &admin_token, &name).await
        }
    })
    .await
}

async fn create_user_settled(http: &reqwest::Client, url: &str, admin_token: &str, name: &str) -> Result<CreatedUser> {
    let mut last = String::new();
    for attempt in 0..CREATE_ATTEMPTS_MAX {
        let attempt_name = if attempt == 0 { name.to_owned() } else { format!("{name}-retry{attempt}") };
        match create_user(http, url, admin_token, &attempt_name).await? {
            Outcome::Ok(body) => return CreatedUser::from_body(&attempt_name, &body),
            Outcome::Rejected(status, body) => {
                bail!("creating user {attempt_name} through {url} was rejected: {status} {body}")
            }
            Outcome::Unknown(why) => {
                last = why;
                tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
            }
        }
    }
    bail!("creating user {name} through {url}: no answer in {CREATE_ATTEMPTS_MAX} attempts: {last}")
}

/// Checks one user with `GET /v1/admin/users/{userId}`: `None` when present and equal.
async fn check_user(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    user: &CreatedUser,
) -> Result<Option<String>> {
    let mut last = String::new();
    for _ in 0..VERIFY_ATTEMPTS_MAX {
        match get_user(http, url, admin_token, &user.user_id).await? {
            Outcome::Ok(body) => {
                let same = body["userId"].as_str() == Some(user.user_id.as_str())
                    && body["name"].as_str() == Some(user.name.as_str())
                    && body["namespaceId"].as_str() == Some(user.namespace_id.as_str());
                return Ok((!same).then(|| format!("{user:?}: answered {body}")));
            }
            Outcome::Rejected(status, body) => {
                return Ok(Some(format!("{user:?}: {status} {body}")));
            }
            Outcome::Unknown(why) => {
                last = why;
                tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
            }
        }
    }
    Ok(Some(format!("{user:?}: no answer in {VERIFY_ATTEMPTS_MAX} attempts: {last}")))
}

// ---------------------------------------------------------------------------------------------
// Node state as reported by /v1/cluster

/// One node's answer to `GET /v1/cluster`.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub role: String,
    pub last_applied: u64,
    pub last_log_index: u64,
    pub snapshot_index: Option<u64>,
}

impl NodeView {
    pub fn parse(body: &Value) -> Result<NodeView> {
        let number = |key: &str| body[key].as_u64().ok_or_else(|| anyhow!("no number {key:?} in /v1/cluster: {body}"));
        Ok(NodeView {
            node_id: number("nodeId")?,
            leader_id: body["leaderId"].as_u64(),
            term: number("term")?,
            role: body["role"].as_str().ok_or_else(|| anyhow!("no string \"role\" in /v1/cluster: {body}"))?.to_owned(),
            // Null before anything was applied.
            last_applied: body["lastApplied"].as_u64().unwrap_or(0),
            last_log_index: body["lastLogIndex"].as_u64().unwrap_or(0),
            snapshot_index: body["snapshotIndex"].as_u64(),
        })
    }

    pub fn is_leader(&self) -> bool {
        self.role == "Leader"
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster

/// Raft timing and snapshot policy written to each node's `[raft]` section.
#[derive(Clone, Debug)]
pub struct RaftTuning {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_logs_since_last: u64,
    pub logs_to_keep: u64,
    pub write_timeout_ms: u64,
}

impl Default for RaftTuning {
    fn default() -> RaftTuning {
        RaftTuning {
            heartbeat_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            snapshot_logs_since_last: 10_000,
            logs_to_keep: 1_000,
            write_timeout_ms: 5_000,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub nodes: u64,
    pub raft: RaftTuning,
    /// TOML appended to every node's config (rate limits, idempotency settings).
    pub extra_toml: String,
    /// Run every node under libfaketime with a per-node offset file, so a test can move a
    /// node's wall clock ([`Cluster::set_clock_offset`]) while it runs.
    pub fake_clocks: bool,
    /// With `fake_clocks`: offsets the nodes start with (libfaketime syntax, `+5s`); `+0`
    /// for the others.
    pub clock_offsets: BTreeMap<u64, String>,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            nodes: 3,
            raft: RaftTuning::default(),
            extra_toml: String::new(),
            fake_clocks: false,
            clock_offsets: BTreeMap::new(),
        }
    }
}

/// libfaketime's multi-threaded library (Debian `faketime`), preloaded into a node whose
/// clock a test moves.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

#[derive(Clone, Debug)]
struct Member {
    id: u64,
    http_addr: String,
    grpc_addr: String,
}

struct Node {
    member: Member,
    data_dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    /// libfaketime's offset file for this node, when the cluster fakes clocks.
    clock_path: Option<PathBuf>,
    /// The running process; `None` while stopped.
    child: Option<Child>,
}

/// A cluster of `raftbox` processes in a temporary directory:
/// `<dir>/admin.token` and, per node, `<dir>/nodeN/{config.toml,log,data/}`.
///
/// Dropping it kills every running node by its handle. Call [`Cluster::conclude`] at the end
/// of a test: it fails the test on a scenario error, an unexpected exit, a panic or an ERROR
/// line in a node log.
pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    bin: PathBuf,
    admin_token: String,
    nodes: BTreeMap<u64, Node>,
    http: reqwest::Client,
    allowed_log_errors: Vec<String>,
    unexpected_exits: Vec<String>,
    failed: bool,
}

impl Cluster {
    /// Launches every node and waits until all are ready (see [`Cluster::wait_ready`]).
    pub async fn start(options: ClusterOptions) -> Result<Cluster> {
        let mut cluster = Cluster::launch(options)?;
        cluster.wait_ready(ms(STARTUP_DEADLINE_MS)).await?;
        Ok(cluster)
    }

    /// Writes the cluster directory and spawns every node, without waiting.
    pub fn launch(options: ClusterOptions) -> Result<Cluster> {
        ensure!(options.nodes >= 1, "a cluster needs at least one node");
        if options.fake_clocks {
            ensure!(
                Path::new(LIBFAKETIME).is_file(),
                "{LIBFAKETIME} is missing: install Debian's faketime (scripts/test does)"
            );
        }
        let bin = raftbox_bin()?;
        let dir =
            tempfile::Builder::new().prefix("raftbox-cluster-").tempdir().context("create the cluster directory")?;
        let root = dir.path().to_path_buf();
        eprintln!("cluster directory: {} (binary {})", root.display(), bin.display());

        let admin_token = generate_token();
        let token_path = root.join("admin.token");
        write_private(&token_path, &format!("{admin_token}\n"))?;
        let secret_path = root.join("cluster.secret");
        write_private(&secret_path, &format!("{}\n", generate_token()))?;

        let count = usize::try_from(options.nodes).context("node count")?;
        let ports = free_ports(2 * count)?;
        let members: Vec<Member> = (1..=options.nodes)
            .zip(ports.chunks(2))
            .map(|(id, pair)| Member {
                id,
                http_addr: format!("127.0.0.1:{}", pair[0]),
                grpc_addr: format!("127.0.0.1:{}", pair[1]),
            })
            .collect();

        let mut nodes = BTreeMap::new();
        for member in &members {
            let node_dir = root.join(format!("node{}", member.id));
            let data_dir = node_dir.join("data");
            fs::create_dir_all(&data_dir).with_context(|| format!("create {}", data_dir.display()))?;
            let config_path = node_dir.join("config.toml");
            let config = render_config(&NodeConfig {
                member,
                members: &members,
                data_dir: &data_dir,
                token_path: &token_path,
                secret_path: &secret_path,
                raft: &options.raft,
                extra_toml: &options.extra_toml,
            });
            fs::write(&config_path, config).with_context(|| format!("write {}", config_path.display()))?;
            let clock_path = if options.fake_clocks {
                let path = node_dir.join("faketime");
                let offset = options.clock_offsets.get(&member.id).map_or("+0", String::as_str);
                fs::write(&path, format!("{offset}\n")).with_context(|| format!("write {}", path.display()))?;
                Some(path)
            } else {
                None
            };
            let log_path = node_dir.join("log");
            let node = Node { member: member.clone(), data_dir, config_path, log_path, clock_path, child: None };
            nodes.insert(member.id, node);
        }

        let mut cluster = Cluster {
            dir: Some(dir),
            root,
            bin,
            admin_token,
            nodes,
            http: http_client()?,
            allowed_log_errors: Vec::new(),
            unexpected_exits: Vec::new(),
            failed: false,
        };
        for id in cluster.node_ids() {
            cluster.start_node(id)?;
        }
        Ok(cluster)
    }

    // --- accessors -----------------------------------------------------------------------

    fn node(&self, id: u64) -> &Node {
        self.nodes.get(&id).unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.get_mut(&id).unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Every node id, running or not, ascending.
    pub fn node_ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Ids of the nodes whose process the harness started and has not stopped.
    pub fn live_ids(&self) -> Vec<u64> {
        self.nodes.values().filter(|n| n.child.is_some()).map(|n| n.member.id).collect()
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).child.is_some()
    }

    /// `127.0.0.1:<port>` of node `id`'s gRPC (node-to-node) endpoint.
    pub fn grpc_addr(&self, id: u64) -> &str {
        &self.node(id).member.grpc_addr
    }

    /// The cluster secret the nodes share.
    pub fn cluster_secret(&self) -> Result<String> {
        let path = self.root.join("cluster.secret");
        Ok(fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?.trim().to_string())
    }

    /// `http://127.0.0.1:<port>` of node `id`.
    pub fn http_url(&self, id: u64) -> String {
        format!("http://{}", self.node(id).member.http_addr)
    }

    /// The HTTP URLs of the given nodes.
    pub fn http_urls(&self, ids: &[u64]) -> Vec<String> {
        ids.iter().map(|&id| self.http_url(id)).collect()
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A handle on the harness's HTTP client (cheap to clone; share it with tasks).
    pub fn client(&self) -> reqwest::Client {
        self.http.clone()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn log_path(&self, id: u64) -> &Path {
        &self.node(id).log_path
    }

    pub fn data_dir(&self, id: u64) -> &Path {
        &self.node(id).data_dir
    }

    /// Tolerates ERROR lines containing `fragment` in [`Cluster::check_logs`]. Panics are
    /// never tolerated.
    pub fn allow_log_error(&mut self, fragment: &str) {
        self.allowed_log_errors.push(fragment.to_owned());
    }

    // --- process control -----------------------------------------------------------------

    /// Starts node `id` with its config (the first start, or a restart after a stop).
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        let bin = self.bin.clone();
        let node = self.node_mut(id);
        ensure!(node.child.is_none(), "node {id} is already running");
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("open {}", node.log_path.display()))?;
        writeln!(log, "=== harness: starting node {id} ===")
            .with_context(|| format!("write {}", node.log_path.display()))?;
        let log_err = log.try_clone().context("duplicate the log file handle")?;
        let mut command = Command::new(&bin);
        command
            .arg("serve")
            .arg("--config")
            .arg(&node.config_path)
            .env_remove("RAFTBOX_CONFIG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        if let Some(clock) = &node.clock_path {
            // The wall clock follows the offset in the file (re-read every second); timers
            // (the monotonic clock) are left alone.
            command
                .env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", clock)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = command.spawn().with_context(|| format!("spawn node {id} ({})", bin.display()))?;
        node.child = Some(child);
        Ok(())
    }

    /// SIGKILL node `id` through its process handle and reap it.
    pub fn kill9(&mut self, id: u64) -> Result<()> {
        // Peers of a stopped node report it unreachable; openraft logs that at ERROR.
        self.allow_log_error(PEER_DOWN_LOG_FRAGMENT);
        let node = self.node_mut(id);
        let mut child = node.child.take().ok_or_else(|| anyhow!("node {id} is not running"))?;
        child.kill().with_context(|| format!("SIGKILL node {id}"))?;
        child.wait().with_context(|| format!("reap node {id}"))?;
        Ok(())
    }

    /// SIGTERM node `id` (by the pid of its handle) and wait up to `deadline` for it to exit;
    /// past the deadline it is killed and an error returned.
    pub async fn terminate(&mut self, id: u64, deadline: Duration) -> Result<ExitStatus> {
        self.allow_log_error(PEER_DOWN_LOG_FRAGMENT);
        let node = self.node_mut(id);
        let child = node.child.as_mut().ok_or_else(|| anyhow!("node {id} is not running"))?;
        // The workspace forbids `unsafe`, so no libc::kill: the shell's kill builtin (present
        // even where procps is not) signals the pid of our own unreaped child, which cannot
        // have been reused.
        let pid = child.id().to_string();
        let sent =
            Command::new("sh").args(["-c", "kill -TERM \"$1\"", "sh", &pid]).status().context("run kill -TERM")?;
        ensure!(sent.success(), "kill -TERM {pid} (node {id}) failed: {sent}");
        let wait = Deadline::after(deadline, format!("node {id} to exit after SIGTERM"));
        loop {
            if let Some(status) = child.try_wait().with_context(|| format!("poll node {id}"))? {
                node.child = None;
                return Ok(status);
            }
            if let Err(err) = wait.tick("still running").await {
                let _ = child.kill();
                let _ = child.wait();
                node.child = None;
                return Err(err);
            }
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, …) to node `id` by the pid of its handle. The
    /// workspace forbids `unsafe`, so no libc::kill: the shell's kill builtin (present even
    /// where procps is not) signals the pid of our own unreaped child, which cannot have been
    /// reused.
    pub fn signal(&self, id: u64, signal: &str) -> Result<()> {
        let child = self.node(id).child.as_ref().ok_or_else(|| anyhow!("node {id} is not running"))?;
        let pid = child.id().to_string();
        let script = format!("kill -{signal} \"$1\"");
        let sent = Command::new("sh").args(["-c", &script, "sh", &pid]).status().context("run kill")?;
        ensure!(sent.success(), "kill -{signal} {pid} (node {id}) failed: {sent}");
        Ok(())
    }

    /// Freezes node `id` (SIGSTOP): it holds its sockets but answers nothing.
    pub fn pause(&mut self, id: u64) -> Result<()> {
        for fragment in PEER_FAULT_LOG_FRAGMENTS {
            self.allow_log_error(fragment);
        }
        self.signal(id, "STOP")
    }

    /// Lets a paused node `id` run again (SIGCONT).
    pub fn resume(&self, id: u64) -> Result<()> {
        self.signal(id, "CONT")
    }

    /// Moves node `id`'s wall clock to `offset` from the real one (libfaketime's syntax:
    /// `+5s`, `-2s`, `+0`); it takes effect within about a second. The cluster must have
    /// been started with `fake_clocks`.
    pub fn set_clock_offset(&self, id: u64, offset: &str) -> Result<()> {
        let path = self.node(id).clock_path.as_ref().ok_or_else(|| anyhow!("the cluster does not fake clocks"))?;
        fs::write(path, format!("{offset}\n")).with_context(|| format!("write {}", path.display()))
    }

    /// The block files node `id` holds on its disk.
    pub fn block_files(&self, id: u64) -> Result<BTreeSet<String>> {
        let root = self.node(id).data_dir.join("blocks");
        let mut found = BTreeSet::new();
        for shard in fs::read_dir(&root).with_context(|| format!("read {}", root.display()))? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(shard.path())? {
                found.insert(entry?.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(found)
    }

    /// Removes one part of node `id`'s data directory — `blocks` (a replaced block disk) or
    /// `db` (the Raft log and state) — and keeps the other; the node must be stopped.
    pub fn wipe_part(&mut self, id: u64, part: &str) -> Result<()> {
        let node = self.node(id);
        ensure!(node.child.is_none(), "node {id} must be stopped before its {part} are wiped");
        let path = node.data_dir.join(part);
        fs::remove_dir_all(&path).with_context(|| format!("remove {}", path.display()))
    }

    /// Removes every file of node `id`'s data directory; the node must be stopped.
    pub fn wipe(&mut self, id: u64) -> Result<()> {
        let node = self.node(id);
        ensure!(node.child.is_none(), "node {id} must be stopped before its data is wiped");
        fs::remove_dir_all(&node.data_dir).with_context(|| format!("remove {}", node.data_dir.display()))?;
        fs::create_dir_all(&node.data_dir).with_context(|| format!("create {}", node.data_dir.display()))?;
        Ok(())
    }

    /// Notices nodes that exited without being told to; each is recorded (and fails the
    /// test in [`Cluster::conclude`]) and reported as an error.
    pub fn reap_exited(&mut self) -> Result<()> {
        let mut exited = Vec::new();
        for node in self.nodes.values_mut() {
            let id = node.member.id;
            let status = match node.child.as_mut() {
                Some(child) => child.try_wait().with_context(|| format!("poll node {id}"))?,
                None => None,
            };
            if let Some(status) = status {
                node.child = None;
                exited.push(format!("node {id} exited on its own: {status}"));
            }
        }
        self.unexpected_exits.extend(exited.iter().cloned());
        ensure!(exited.is_empty(), "{}", exited.join("; "));
        Ok(())
    }

    // --- probes --------------------------------------------------------------------------

    /// Node `id`'s `/v1/cluster` as JSON.
    pub async fn cluster_info(&self, id: u64) -> Result<Value> {
        let request = self.http.get(format!("{}/v1/cluster", self.http_url(id))).timeout(ms(PROBE_TIMEOUT_MS));
        match send(request).await? {
            Outcome::Ok(body) => Ok(body),
            other => bail!("GET /v1/cluster on node {id}: {other:?}"),
        }
    }

    /// Node `id`'s `/v1/cluster`, parsed.
    pub async fn view(&self, id: u64) -> Result<NodeView> {
        NodeView::parse(&self.cluster_info(id).await?)
    }

    /// The leader as seen by the first running node that knows one.
    pub async fn leader_id(&self) -> Option<u64> {
        for id in self.live_ids() {
            if let Ok(NodeView { leader_id: Some(leader), .. }) = self.view(id).await {
                return Some(leader);
            }
        }
        None
    }

    /// Ready means `/readyz` answers 200 and the admin token is accepted (`/v1/me` 200).
    async fn probe_ready(&self, id: u64) -> Result<()> {
        let url = self.http_url(id);
        let request = self.http.get(format!("{url}/readyz")).timeout(ms(PROBE_TIMEOUT_MS));
        match send(request).await? {
            Outcome::Ok(_) => {}
            other => bail!("/readyz: {other:?}"),
        }
        match me(&self.http, &url, &self.admin_token).await? {
            Outcome::Ok(_) => Ok(()),
            other => bail!("/v1/me with the admin token: {other:?}"),
        }
    }

    /// Polls every running node until all are ready; on the deadline the error carries the
    /// tail of every node log. A node exiting meanwhile fails at once.
    pub async fn wait_ready(&mut self, deadline: Duration) -> Result<()> {
        let ids = self.live_ids();
        self.wait_ready_nodes(&ids, deadline).await
    }

    /// Polls nodes `ids` until all are ready (see [`Cluster::wait_ready`]).
    pub async fn wait_ready_nodes(&mut self, ids: &[u64], deadline: Duration) -> Result<()> {
        let wait = Deadline::after(deadline, format!("nodes {ids:?} ready"));
        loop {
            if let Err(err) = self.reap_exited() {
                bail!("{err:#}\n{}", self.log_tails(LOG_TAIL_LINES));
            }
            let mut waiting = Vec::new();
            for id in ids.iter().copied().filter(|id| self.is_running(*id)) {
                if let Err(err) = self.probe_ready(id).await {
                    waiting.push(format!("node {id}: {err:#}"));
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if let Err(err) = wait.tick(&waiting.join("; ")).await {
                bail!("{err:#}\n{}", self.log_tails(LOG_TAIL_LINES));
            }
        }
    }

    /// The leader every running node agrees on, provided it is running and says it leads.
    async fn agreed_leader(&self) -> Result<u64> {
        let mut agreed: Option<u64> = None;
        for id in self.live_ids() {
            let view = self.view(id).await?;
            let leader = view.leader_id.ok_or_else(|| anyhow!("node {id} knows no leader"))?;
            if let Some(previous) = agreed {
                ensure!(previous == leader, "nodes disagree on the leader: {previous} vs {leader}");
            }
            agreed = Some(leader);
        }
        let leader = agreed.ok_or_else(|| anyhow!("no node is running"))?;
        ensure!(self.is_running(leader), "the reported leader {leader} is not running");
        let view = self.view(leader).await?;
        ensure!(view.is_leader(), "node {leader} is reported leader but says {}", view.role);
        Ok(leader)
    }

    /// Polls until every running node names the same running leader, other than
    /// `excluding`, and that node says it leads.
    pub async fn wait_for_leader(&self, excluding: Option<u64>, deadline: Duration) -> Result<u64> {
        let what = match excluding {
            Some(old) => format!("a leader other than node {old}"),
            None => "an agreed leader".to_owned(),
        };
        let wait = Deadline::after(deadline, what);
        loop {
            let last = match self.agreed_leader().await {
                Ok(leader) if Some(leader) != excluding => return Ok(leader),
                Ok(leader) => format!("the running nodes still follow node {leader}"),
                Err(err) => format!("{err:#}"),
            };
            wait.tick(&last).await?;
        }
    }

    /// Polls node `id`'s `/v1/cluster` until `done` holds.
    pub async fn wait_view(
        &self,
        id: u64,
        deadline: Duration,
        what: &str,
        done: impl Fn(&NodeView) -> bool,
    ) -> Result<NodeView> {
        let wait = Deadline::after(deadline, what);
        loop {
            let last = match self.view(id).await {
                Ok(view) if done(&view) => return Ok(view),
                Ok(view) => format!("{view:?}"),
                Err(err) => format!("{err:#}"),
            };
            wait.tick(&last).await?;
        }
    }

    /// Waits until node `id` has applied everything the leader had applied when called.
    pub async fn wait_caught_up(&self, id: u64, deadline: Duration) -> Result<NodeView> {
        let started = Instant::now();
        let leader = self.wait_for_leader(None, deadline).await?;
        let target = self.view(leader).await?.last_applied;
        let remaining = deadline.saturating_sub(started.elapsed());
        let what = format!("node {id} to apply up to index {target} (leader {leader})");
        self.wait_view(id, remaining, &what, |view| view.last_applied >= target).await
    }

    // --- checks --------------------------------------------------------------------------

    /// Checks every user with `GET /v1/admin/users/{userId}` through node `id`.
    pub async fn verify_users(&self, id: u64, users: &[CreatedUser]) -> Result<()> {
        let url = self.http_url(id);
        let http = self.http.clone();
        let admin_token = self.admin_token.clone();
        let failures = in_lanes(users.to_vec(), VERIFY_LANES, move |user: CreatedUser| {
            let http = http.clone();
            let url = url.clone();
            let admin_token = admin_token.clone();
            async move { check_user(&http, &url, &admin_token, &user).await }
        })
        .await?;
        let failures: Vec<String> = failures.into_iter().flatten().collect();
        ensure!(
            failures.is_empty(),
            "{} of {} users missing or wrong through node {id}; first ones:\n{}",
            failures.len(),
            users.len(),
            failures[..failures.len().min(10)].join("\n")
        );
        Ok(())
    }

    /// Lines of the node logs with a panic (`panicked at`) or an ERROR level, except ERROR
    /// lines allowed with [`Cluster::allow_log_error`]; each prefixed by its node.
    pub fn check_logs(&self) -> Vec<String> {
        let mut found = Vec::new();
        for node in self.nodes.values() {
            let id = node.member.id;
            let text = match fs::read(&node.log_path) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => {
                    found.push(format!("node {id}: cannot read {}: {err}", node.log_path.display()));
                    continue;
                }
            };
            for raw in text.lines() {
                let line = strip_ansi(raw);
                let panic = line.contains("panicked at");
                let error = line.contains(" ERROR ")
                    && !self.allowed_log_errors.iter().any(|allowed| line.contains(allowed.as_str()));
                if panic || error {
                    found.push(format!("node {id}: {line}"));
                }
            }
        }
        found
    }

    /// The last `lines` lines of every node log, with headers.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in self.nodes.values() {
            let text = fs::read(&node.log_path)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_else(|err| format!("(cannot read: {err})"));
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!(
                "----- node {} log {} (last {} lines) -----\n",
                node.member.id,
                node.log_path.display(),
                tail.len()
            ));
            for line in tail {
                out.push_str(&strip_ansi(line));
                out.push('\n');
            }
        }
        out
    }

    /// Ends a test: fails it (panics) if the scenario failed, a node exited on its own, or a
    /// node log holds a panic or an unexpected ERROR line. Dropping the cluster then prints
    /// the log tails and the directory, and kills the nodes.
    pub fn conclude(mut self, result: Result<()>) {
        let mut problems = Vec::new();
        if let Err(err) = result {
            problems.push(format!("{err:?}"));
        }
        if let Err(err) = self.reap_exited() {
            problems.push(format!("{err:#}"));
        } else if !self.unexpected_exits.is_empty() {
            problems.push(self.unexpected_exits.join("; "));
        }
        let log_problems = self.check_logs();
        if !log_problems.is_empty() {
            problems.push(format!(
                "{} panic or ERROR line(s) in node logs:\n{}",
                log_problems.len(),
                log_problems.join("\n")
            ));
        }
        if problems.is_empty() {
            return;
        }
        self.failed = true;
        panic!("{}", problems.join("\n\n"));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let failed = self.failed || std::thread::panicking();
        if failed {
            eprintln!("{}", self.log_tails(LOG_TAIL_LINES));
        }
        let keep = env::var(KEEP_ENV).is_ok_and(|value| value == "1");
        if let Some(dir) = self.dir.take() {
            if keep {
                let path = dir.keep();
                eprintln!("{KEEP_ENV}=1: cluster directory kept at {}", path.display());
            } else if failed {
                eprintln!("cluster directory {} removed; rerun with {KEEP_ENV}=1 to keep it", self.root.display());
            }
        }
    }
}

struct NodeConfig<'a> {
    member: &'a Member,
    members: &'a [Member],
    data_dir: &'a Path,
    token_path: &'a Path,
    secret_path: &'a Path,
    raft: &'a RaftTuning,
    extra_toml: &'a str,
}

/// The node's TOML config; node 1 bootstraps the cluster.
fn render_config(config: &NodeConfig<'_>) -> String {
    let member = config.member;
    let raft = config.raft;
    let mut out = format!(
        "node_id = {}\ndata_dir = {}\nhttp_addr = {}\ngrpc_addr = {}\nadmin_token_file = {}\n\
         cluster_secret_file = {}\nbootstrap = {}\n",
        member.id,
        toml_string(&config.data_dir.display().to_string()),
        toml_string(&member.http_addr),
        toml_string(&member.grpc_addr),
        toml_string(&config.token_path.display().to_string()),
        toml_string(&config.secret_path.display().to_string()),
        member.id == 1,
    );
    for peer in config.members {
        out.push_str(&format!(
            "\n[[members]]\nid = {}\nhttp_addr = {}\ngrpc_addr = {}\n",
            peer.id,
            toml_string(&peer.http_addr),
            toml_string(&peer.grpc_addr),
        ));
    }
    out.push_str(&format!(
        "\n[raft]\nheartbeat_ms = {}\nelection_timeout_min_ms = {}\nelection_timeout_max_ms = {}\n\
         snapshot_logs_since_last = {}\nlogs_to_keep = {}\nwrite_timeout_ms = {}\n",
        raft.heartbeat_ms,
        raft.election_timeout_min_ms,
        raft.election_timeout_max_ms,
        raft.snapshot_logs_since_last,
        raft.logs_to_keep,
        raft.write_timeout_ms,
    ));
    out.push('\n');
    out.push_str(config.extra_toml);
    out
}

fn toml_string(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(contents.as_bytes()).with_context(|| format!("write {}", path.display()))
}

/// Removes ANSI CSI escape sequences (colours), in case a node logs with colours on.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Workload

/// One write of a [`Workload`].
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub name: String,
    pub node: u64,
    pub started: Instant,
    pub finished: Instant,
    pub outcome: Outcome,
}

/// What a [`Workload`] should do.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Concurrent writer tasks.
    pub writers: usize,
    /// `(node id, http url)` endpoints; each write picks one at random.
    pub targets: Vec<(u64, String)>,
    pub admin_token: String,
    /// User names are `<prefix>-w<writer>-<seq>`, unique within the workload.
    pub name_prefix: String,
}

/// Writer tasks creating uniquely named users until stopped, recording every outcome. A
/// writer pauses [`RETRY_BACKOFF_MS`] after an operation that was not acknowledged.
pub struct Workload {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    records: Arc<Mutex<Vec<WriteRecord>>>,
    tasks: JoinSet<Result<()>>,
}

impl Workload {
    /// Spawns the writers; each draws its own generator from `rng`.
    pub fn spawn(http: reqwest::Client, spec: WorkloadSpec, rng: &mut StdRng) -> Workload {
        assert!(!spec.targets.is_empty(), "a workload needs at least one target");
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let records = Arc::new(Mutex::new(Vec::new()));
        let targets = Arc::new(spec.targets);
        let mut tasks = JoinSet::new();
        for writer in 0..spec.writers {
            let writer_rng = StdRng::seed_from_u64(rng.gen());
            let context = WriterContext {
                writer,
                http: http.clone(),
                targets: targets.clone(),
                admin_token: spec.admin_token.clone(),
                name_prefix: spec.name_prefix.clone(),
                stop: stop.clone(),
                acked: acked.clone(),
                records: records.clone(),
            };
            tasks.spawn(run_writer(context, writer_rng));
        }
        Workload { stop, acked, records, tasks }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Records so far that satisfy `predicate`.
    pub fn count(&self, predicate: impl Fn(&WriteRecord) -> bool) -> usize {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records.iter().filter(|record| predicate(record)).count()
    }

    /// Stops the writers (each finishes its current operation) and returns every record.
    pub async fn stop(mut self) -> Result<Vec<WriteRecord>> {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(joined) = self.tasks.join_next().await {
            joined.context("a writer task panicked")??;
        }
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *records))
    }
}

struct WriterContext {
    writer: usize,
    http: reqwest::Client,
    targets: Arc<Vec<(u64, String)>>,
    admin_token: String,
    name_prefix: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    records: Arc<Mutex<Vec<WriteRecord>>>,
}

async fn run_writer(context: WriterContext, mut rng: StdRng) -> Result<()> {
    let mut seq = 0u64;
    while !context.stop.load(Ordering::Relaxed) {
        let (node, url) = &context.targets[rng.gen_range(0..context.targets.len())];
        let name = format!("{}-w{}-{seq}", context.name_prefix, context.writer);
        seq += 1;
        let started = Instant::now();
        let outcome = create_user(&context.http, url, &context.admin_token, &name).await?;
        let finished = Instant::now();
        let acknowledged = outcome.is_ok();
        {
            let mut records = context.records.lock().unwrap_or_else(PoisonError::into_inner);
            if records.len() >= WORKLOAD_RECORDS_MAX {
                return Ok(());
            }
            records.push(WriteRecord { name, node: *node, started, finished, outcome });
        }
        if acknowledged {
            context.acked.fetch_add(1, Ordering::Relaxed);
        } else {
            tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
        }
    }
    Ok(())
}

/// Counts of a workload's outcomes.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteSummary {
    pub acknowledged: usize,
    pub rejected: usize,
    pub unknown: usize,
}

impl WriteSummary {
    pub fn of(records: &[WriteRecord]) -> WriteSummary {
        let mut summary = WriteSummary::default();
        for record in records {
            match record.outcome {
                Outcome::Ok(_) => summary.acknowledged += 1,
                Outcome::Rejected(..) => summary.rejected += 1,
                Outcome::Unknown(_) => summary.unknown += 1,
            }
        }
        summary
    }
}

impl fmt::Display for WriteSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} acknowledged, {} rejected, {} unknown", self.acknowledged, self.rejected, self.unknown)
    }
}

/// The users whose creation was acknowledged.
pub fn acknowledged_users(records: &[WriteRecord]) -> Result<Vec<CreatedUser>> {
    records
        .iter()
        .filter_map(|record| record.outcome.body().map(|body| (record, body)))
        .map(|(record, body)| CreatedUser::from_body(&record.name, body))
        .collect()
}

/// Fails on any rejected write, showing a few: a unique name must never be refused.
pub fn ensure_none_rejected(records: &[WriteRecord]) -> Result<()> {
    let rejected: Vec<String> = records
        .iter()
        .filter(|record| record.outcome.is_rejected())
        .take(10)
        .map(|record| format!("{} via node {}: {:?}", record.name, record.node, record.outcome))
        .collect();
    ensure!(rejected.is_empty(), "writes were rejected:\n{}", rejected.join("\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_rfc4648_vectors() {
        let check = |input: &[u8], expected: &str| assert_eq!(base64url(input), expected);
        check(b"", "");
        check(b"f", "Zg");
        check(b"fo", "Zm8");
        check(b"foo", "Zm9v");
        check(b"foob", "Zm9vYg");
        check(b"fooba", "Zm9vYmE");
        check(b"foobar", "Zm9vYmFy");
        check(&[0xfb, 0xff], "-_8");
    }

    #[test]
    fn token_has_prefix_and_43_characters() {
        let token = generate_token();
        assert!(token.starts_with("rbx_"));
        assert_eq!(token.len(), 4 + 43);
    }

    #[test]
    fn strip_ansi_removes_colours() {
        let line = "\u{1b}[2m2025-01-01T00:00:00Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m raftbox: boom";
        assert_eq!(strip_ansi(line), "2025-01-01T00:00:00Z ERROR raftbox: boom");
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(6).expect("bind ports");
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 6);
    }

    #[test]
    fn config_names_bootstrap_only_on_node_one() {
        let members: Vec<Member> = (1..=3)
            .map(|id| Member {
                id,
                http_addr: format!("127.0.0.1:{}", 7080 + id),
                grpc_addr: format!("127.0.0.1:{}", 7090 + id),
            })
            .collect();
        let raft = RaftTuning::default();
        let render = |member: &Member| {
            render_config(&NodeConfig {
                member,
                members: &members,
                data_dir: Path::new("/tmp/x/node1/data"),
                token_path: Path::new("/tmp/x/admin.token"),
                secret_path: Path::new("/tmp/x/cluster.secret"),
                raft: &raft,
                extra_toml: "",
            })
        };
        let first = render(&members[0]);
        assert!(first.contains("bootstrap = true\n"));
        assert!(first.contains("data_dir = \"/tmp/x/node1/data\"\n"));
        assert_eq!(first.matches("[[members]]").count(), 3);
        assert!(first.contains("snapshot_logs_since_last = 10000\n"));
        assert!(render(&members[1]).contains("bootstrap = false\n"));
    }
}
