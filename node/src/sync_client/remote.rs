//! The cluster side of `raftbox sync`: a list of endpoints with failover, the change feed,
//! the writes (commit, delete, move) with their outcome made certain, and the notification
//! channel (WebSocket, long-poll when it cannot be had).
//!
//! Failover: every request has bounded timeouts; a request that could not reach a node goes
//! to the next endpoint. Reads and block transfers are simply repeated there. A write whose
//! outcome is unknown (sent, then the connection broke or timed out) is not blindly repeated:
//! the file is read again first, and the write is repeated only if its effect is not there —
//! and then with the same base version, which the server answers as the retry it is.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::StreamExt as _;
use raftbox_api::error::Problem;
use raftbox_api::routes::accounts::MeView;
use raftbox_api::routes::files::{CommitRequest, DeleteRequest, FileCommitted, FileHistory, FileView, MoveRequest};
use raftbox_api::routes::sharing::NamespaceView;
use raftbox_api::routes::sync::{ChangeView, NotifyAnswer, NotifyQuery, SyncEntry, SyncPage, SyncQuery};
use raftbox_storage::records::Role;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::{problem, Api};
use crate::files_client::Throttle;

/// Time to open a connection to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a request may go without a byte arriving: an idle limit, not a total one, so a
/// large chunk on a slow link takes as long as it takes while a dead node is found within
/// this. Above the long poll's wait.
const IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// Long-poll wait asked of the server, and the request's own limit beyond it.
const LONG_POLL_S: u64 = 25;
const LONG_POLL_SLACK: Duration = Duration::from_secs(10);
/// Changes asked for per `/v1/sync` page.
const SYNC_PAGE: u32 = 1_000;
/// Versions read of a file's history to find a content in it (the API's page maximum).
const HISTORY_PAGE: &str = "1000";

pub struct Remote {
    apis: Vec<Api>,
    /// The endpoint in use: the last one that answered.
    at: AtomicUsize,
    /// `--limit-up`, `--limit-down`.
    pub up: Option<Throttle>,
    pub down: Option<Throttle>,
}

/// A change of the feed (and the current version of a file, read alone): a file's latest
/// state. Kept with a failed download, to apply when it is tried again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    #[serde(default)]
    pub namespace_id: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub version: u64,
    #[serde(default)]
    pub chunks: Vec<String>,
    #[serde(default)]
    pub size: u64,
    /// RFC 3339, as the server writes it.
    #[serde(default)]
    pub mtime: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub namespace_removed: bool,
}

impl Change {
    /// The modification time in ms since the epoch (0 if the server sent none).
    pub fn mtime_ms(&self) -> u64 {
        chrono::DateTime::parse_from_rfc3339(&self.mtime).map_or(0, |t| t.timestamp_millis().max(0) as u64)
    }
}

/// What the caller may do in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read and write (editor, owner).
    ReadWrite,
    /// Read only (viewer).
    ReadOnly,
    /// Not at all any more: revoked, left or deleted.
    Gone,
}

/// A page of the change feed, as the engine works through it.
#[derive(Debug)]
pub struct Page {
    pub changes: Vec<Change>,
    pub cursor: String,
    pub has_more: bool,
}

impl TryFrom<SyncPage<'static>> for Page {
    type Error = anyhow::Error;

    fn try_from(page: SyncPage<'static>) -> anyhow::Result<Page> {
        let changes = page
            .changes
            .into_iter()
            .map(|entry| match entry {
                // Only `"namespaceRemoved": true` says a namespace is gone.
                SyncEntry::Removed { namespace_id, namespace_removed: true } => {
                    Ok(Change { namespace_id: namespace_id.into_owned(), namespace_removed: true, ..Change::default() })
                }
                SyncEntry::Removed { namespace_id, .. } => {
                    bail!("a sync page named namespace {namespace_id} without a change or its removal")
                }
                SyncEntry::Change(change) => Ok(Change::from(change)),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Page { changes, cursor: page.cursor, has_more: page.has_more })
    }
}

impl From<ChangeView<'static>> for Change {
    fn from(change: ChangeView<'static>) -> Change {
        Change {
            namespace_id: change.namespace_id.into_owned(),
            path: change.path,
            version: change.version,
            chunks: change.chunks.iter().map(|h| h.to_hex()).collect(),
            size: change.size,
            mtime: change.mtime,
            executable: change.executable,
            deleted: change.deleted,
            namespace_removed: false,
        }
    }
}

impl From<FileView> for Change {
    fn from(file: FileView) -> Change {
        Change {
            namespace_id: file.namespace_id,
            path: file.path,
            version: file.version,
            chunks: file.chunks,
            size: file.size,
            mtime: file.mtime,
            executable: file.executable,
            deleted: false,
            namespace_removed: false,
        }
    }
}

/// An answer's body as `T`, or the reason it is not one.
fn decode<T: serde::de::DeserializeOwned>(what: &str, body: Value) -> anyhow::Result<T> {
    serde_json::from_value(body).with_context(|| format!("read {what}"))
}

/// The certain outcome of a write.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Done (or found already done): the version it made or found.
    Done(u64),
    /// 409: the file changed meanwhile; a commit's content was kept as `copy`.
    Conflict { copy: Option<String> },
    /// 404: no file there (deleted meanwhile), or (for a commit) no namespace.
    Gone,
    /// 403: this user may only read here now.
    Forbidden,
    /// Any other refusal (400, 413, 422, …): this file cannot go up as it is; why.
    Refused(String),
}

/// Whether `error` is a failure to talk to the node (rather than an answer).
pub fn unreachable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<reqwest::Error>().is_some())
}

/// Whether the request surely never reached the node (so repeating it is always safe).
fn never_sent(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<reqwest::Error>().is_some_and(|e| e.is_connect()))
}

impl Remote {
    /// Clients of each of `urls`, working in `namespace` (`None`: the personal one).
    pub fn new(
        connection: &crate::client::Connection,
        device: Option<String>,
        urls: &[String],
        namespace: Option<String>,
    ) -> anyhow::Result<Remote> {
        let mut apis = Vec::new();
        for url in urls {
            let builder = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).read_timeout(IDLE_TIMEOUT);
            apis.push(Api::connect(connection, device.clone(), url, builder)?.in_namespace(namespace.clone()));
        }
        if apis.is_empty() {
            bail!("no endpoint: give --endpoint URL (or --url)");
        }
        Ok(Remote { apis, at: AtomicUsize::new(0), up: None, down: None })
    }

    /// What the caller may do in `namespace` now.
    pub async fn access(&self, namespace: &str) -> anyhow::Result<Access> {
        let route = format!("/v1/namespaces/{namespace}");
        let route = &route;
        self.read(|api| async move {
            let (status, body) = api.send(api.request(reqwest::Method::GET, route)).await?;
            match status {
                StatusCode::OK => Ok(match decode::<NamespaceView>("a namespace", body)?.role {
                    Role::Viewer => Access::ReadOnly,
                    Role::Editor | Role::Owner => Access::ReadWrite,
                }),
                StatusCode::NOT_FOUND => Ok(Access::Gone),
                _ => bail!("read namespace {namespace}: {}", problem(status, &body)),
            }
        })
        .await
    }

    /// The client of the endpoint in use.
    pub fn current(&self) -> Api {
        self.apis[self.at.load(Ordering::Relaxed) % self.apis.len()].clone()
    }

    /// Moves to the next endpoint (after `failed` could not be reached).
    fn next(&self, failed: usize, error: &anyhow::Error) {
        let next = (failed + 1) % self.apis.len();
        if self.at.compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() && self.apis.len() > 1 {
            eprintln!("sync: {} unreachable ({error:#}); using {}", self.apis[failed].url(), self.apis[next].url());
        }
    }

    /// `call` on the endpoint in use, then on each other one while a node cannot be reached
    /// (at most two rounds). For requests that are safe to repeat.
    pub async fn read<T, F, Fut>(&self, call: F) -> anyhow::Result<T>
    where
        F: Fn(Api) -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let mut last = None;
        for _ in 0..2 * self.apis.len() {
            let at = self.at.load(Ordering::Relaxed) % self.apis.len();
            match call(self.apis[at].clone()).await {
                Ok(value) => return Ok(value),
                Err(error) if unreachable(&error) => {
                    self.next(at, &error);
                    last = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no endpoint answered")))
    }

    /// The caller's personal namespace id.
    pub async fn personal_namespace(&self) -> anyhow::Result<String> {
        let me = self
            .read(|api| async move {
                let (status, body) = api.send(api.request(reqwest::Method::GET, "/v1/me")).await?;
                if status != StatusCode::OK {
                    bail!("who am I: {}", problem(status, &body));
                }
                decode::<MeView>("/v1/me", body)
            })
            .await?;
        Ok(me.namespace_id)
    }

    /// One page of the change feed after `cursor`; `None`: the cursor can no longer be served
    /// (410), start again from `0`.
    pub async fn changes(&self, cursor: &str) -> anyhow::Result<Option<Page>> {
        self.read(|api| async move {
            // The cursor in the body: it holds a position per readable namespace.
            let query = SyncQuery { cursor: cursor.to_string(), limit: Some(SYNC_PAGE) };
            let request = api.request(reqwest::Method::POST, "/v1/sync").json(&query);
            let response = api.send_raw(request).await?;
            match response.status() {
                StatusCode::OK => {
                    let page: SyncPage<'static> = response.json().await.context("read a sync page")?;
                    Ok(Some(Page::try_from(page)?))
                }
                StatusCode::GONE => Ok(None),
                status => {
                    let body = response.json().await.unwrap_or(Value::Null);
                    bail!("sync: {}", problem(status, &body))
                }
            }
        })
        .await
    }

    /// Whether the server's history of `path` (its newest page of versions) holds a version
    /// with exactly `chunks`.
    pub async fn history_holds(&self, path: &str, chunks: &[String]) -> anyhow::Result<bool> {
        let history = self
            .read(|api| async move {
                let request = api
                    .request(reqwest::Method::GET, "/v1/files/history")
                    .query(&[("path", path), ("limit", HISTORY_PAGE)]);
                let (status, body) = api.send(request).await?;
                match status {
                    StatusCode::OK => Ok(Some(decode::<FileHistory>("a file's history", body)?)),
                    StatusCode::NOT_FOUND => Ok(None),
                    _ => bail!("history of {path}: {}", problem(status, &body)),
                }
            })
            .await?;
        Ok(history.is_some_and(|history| history.versions.iter().any(|v| v.chunks == chunks)))
    }

    /// The current version of `path`, `None` if there is no live file.
    pub async fn current_file(&self, path: &str) -> anyhow::Result<Option<Change>> {
        let found = self.read(|api| async move { api.current_version(path).await }).await?;
        found.map(|file| Ok(Change::from(decode::<FileView>("a file's version", file)?))).transpose()
    }

    /// A write: POST `body` to `route`, its answer read by `judge`. When the outcome is
    /// unknown, `settled` reads the state again and says whether the write took effect; only
    /// if not is it sent again (through the next endpoint).
    async fn write<J, S, SFut>(&self, route: &str, body: Value, judge: J, settled: S) -> anyhow::Result<Written>
    where
        J: Fn(StatusCode, &Value) -> anyhow::Result<Written>,
        S: Fn() -> SFut,
        SFut: Future<Output = anyhow::Result<Option<Written>>>,
    {
        let mut last = None;
        for _ in 0..2 * self.apis.len() {
            let at = self.at.load(Ordering::Relaxed) % self.apis.len();
            let api = &self.apis[at];
            let request = api.request(reqwest::Method::POST, route).json(&api.file_body(body.clone()));
            match api.send(request).await {
                Ok((status, answer)) => return judge(status, &answer),
                Err(error) if unreachable(&error) => {
                    self.next(at, &error);
                    if !never_sent(&error) {
                        // Sent, and no answer: read the outcome before anything else.
                        if let Some(done) = settled().await? {
                            return Ok(done);
                        }
                    }
                    last = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no endpoint answered")))
    }

    /// Commits `chunks` as the new content of `path`, based on `base` (0: a new file).
    pub async fn commit(
        &self,
        path: &str,
        chunks: &[String],
        size: u64,
        mtime_ms: u64,
        executable: bool,
        base: u64,
    ) -> anyhow::Result<Written> {
        let chunks_sent =
            chunks.iter().map(|h| h.parse()).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!("{e}"))?;
        let body = serde_json::to_value(CommitRequest {
            path: path.to_string(),
            chunks: chunks_sent,
            base_version: base,
            size,
            mtime: Value::from(mtime_ms),
            namespace_id: None,
            deleted: false,
            executable,
        })?;
        let settled = || async move {
            Ok(match self.current_file(path).await? {
                Some(now) if now.chunks == chunks && now.version > base => Some(Written::Done(now.version)),
                _ => None,
            })
        };
        self.write("/v1/files/commit", body, |status, answer| judge_commit(path, status, answer), settled).await
    }

    /// Deletes `path` as of version `base`.
    pub async fn delete(&self, path: &str, base: u64) -> anyhow::Result<Written> {
        let body =
            serde_json::to_value(DeleteRequest { path: path.to_string(), base_version: base, namespace_id: None })?;
        let settled = || async move { Ok(self.current_file(path).await?.is_none().then_some(Written::Gone)) };
        self.write("/v1/files/delete", body, |status, answer| judge_commit(path, status, answer), settled).await
    }

    /// Moves `from` (at version `base`, content `chunks`) to `to`.
    pub async fn rename(&self, from: &str, to: &str, base: u64, chunks: &[String]) -> anyhow::Result<Written> {
        let body = serde_json::to_value(MoveRequest {
            from: from.to_string(),
            to: to.to_string(),
            base_version: base,
            namespace_id: None,
        })?;
        let settled = || async move {
            if self.current_file(from).await?.is_some() {
                return Ok(None);
            }
            Ok(match self.current_file(to).await? {
                Some(now) if now.chunks == chunks => Some(Written::Done(now.version)),
                _ => None,
            })
        };
        self.write("/v1/files/move", body, |status, answer| judge_commit(from, status, answer), settled).await
    }

    /// Sends a wake-up on `wake` whenever the cluster has something newer than the cursor
    /// in `cursor`: through the WebSocket of the endpoint in use, else its long-poll. Runs
    /// until `wake` is closed.
    pub async fn notifications(
        &self,
        cursor: tokio::sync::watch::Receiver<String>,
        wake: tokio::sync::mpsc::Sender<()>,
    ) {
        loop {
            if wake.is_closed() {
                return;
            }
            let api = self.current();
            // Whatever ends the socket (its node died, say), the feed is read again.
            let socket = websocket(&api, &wake).await;
            let _ = wake.try_send(());
            if socket.is_err() {
                // No WebSocket here (TLS, a proxy): long-poll until that fails too.
                loop {
                    let at = cursor.borrow().clone();
                    match long_poll(&api, &at).await {
                        Ok(true) => {
                            let _ = wake.try_send(());
                        }
                        Ok(false) => {}
                        Err(_) => break,
                    }
                    if wake.is_closed() {
                        return;
                    }
                }
            }
            // Not in a tight loop against a dead node; the sync loop's own failover moves
            // `current` meanwhile.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The answer to a commit, delete or move.
fn judge_commit(path: &str, status: StatusCode, answer: &Value) -> anyhow::Result<Written> {
    match status {
        StatusCode::OK | StatusCode::CREATED => {
            Ok(Written::Done(decode::<FileCommitted>("a commit's answer", answer.clone())?.version))
        }
        StatusCode::CONFLICT => {
            let problem: Option<Problem> = serde_json::from_value(answer.clone()).ok();
            Ok(Written::Conflict { copy: problem.and_then(|p| p.conflicted_copy).map(|copy| copy.path) })
        }
        StatusCode::NOT_FOUND => Ok(Written::Gone),
        StatusCode::FORBIDDEN => Ok(Written::Forbidden),
        status if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS => {
            Ok(Written::Refused(problem(status, answer)))
        }
        _ => bail!("{path}: {}", problem(status, answer)),
    }
}

/// Listens on `api`'s `/v1/notify/ws` until it closes, waking the loop on each message.
/// An error if it could not be opened.
async fn websocket(api: &Api, wake: &tokio::sync::mpsc::Sender<()>) -> anyhow::Result<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let url = api.url().trim_end_matches('/');
    let Some(rest) = url.strip_prefix("http://") else { bail!("WebSocket only over plain HTTP here") };
    let mut request = format!("ws://{rest}/v1/notify/ws").into_client_request()?;
    request.headers_mut().insert("authorization", format!("Bearer {}", api.token()).parse()?);
    let (mut socket, _) = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(request))
        .await
        .context("WebSocket: no answer")??;
    // Anything may have changed before the socket was open.
    let _ = wake.try_send(());
    let mut ping_unanswered = false;
    loop {
        use futures::SinkExt as _;
        use tokio_tungstenite::tungstenite::Message;
        match tokio::time::timeout(LONG_POLL_SLACK * 2, socket.next()).await {
            Ok(Some(Ok(Message::Text(_)))) => {
                let _ = wake.try_send(());
            }
            Ok(Some(Ok(Message::Pong(_)))) => ping_unanswered = false,
            Ok(Some(Ok(Message::Close(_)))) | Ok(Some(Err(_))) | Ok(None) => return Ok(()),
            Ok(Some(Ok(_))) => {}
            // Quiet for a while: a ping finds a dead node (no FIN) by the next timeout.
            Err(_) if ping_unanswered => return Ok(()),
            Err(_) => {
                let ping = tokio::time::timeout(CONNECT_TIMEOUT, socket.send(Message::Ping(Vec::new().into()))).await;
                if !matches!(ping, Ok(Ok(()))) {
                    return Ok(());
                }
                ping_unanswered = true;
            }
        }
        if wake.is_closed() {
            return Ok(());
        }
    }
}

/// One long poll: whether anything is newer than `cursor`.
async fn long_poll(api: &Api, cursor: &str) -> anyhow::Result<bool> {
    let request = api
        .request(reqwest::Method::POST, "/v1/notify")
        .json(&NotifyQuery { cursor: cursor.to_string(), timeout: Some(LONG_POLL_S) })
        .timeout(Duration::from_secs(LONG_POLL_S) + LONG_POLL_SLACK);
    let (status, body) = api.send(request).await?;
    if status != StatusCode::OK {
        bail!("notify: {}", problem(status, &body));
    }
    Ok(decode::<NotifyAnswer>("a long poll's answer", body)?.changes)
}
