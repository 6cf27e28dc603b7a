//! Sync and notifications: `GET /v1/sync`, `GET /v1/notify` (long-poll) and
//! `GET /v1/notify/ws` (WebSocket).
//!
//! The cursor is opaque to clients: base64url of the JSON map namespace → last sequence
//! seen. `cursor=0` starts from nothing (the whole tree). A namespace granted since the
//! cursor joins at 0; one the caller can no longer read is reported once as
//! `{"namespaceId": …, "namespaceRemoved": true}` and dropped. Notifications come from this
//! node's own apply stream (the hub's summary of each applied entry, `notify.rs`) and carry
//! no data.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::records::Grantee;
use raftbox_storage::schedule::format_utc;
use raftbox_storage::sharing::LISTED_NAMESPACES_MAX;
use serde::{Deserialize, Serialize};

use crate::access;
use crate::auth::Principal;
use crate::notify::{Event, Listener};
use crate::{ApiError, AppState};

/// Changes per sync page: default and largest.
pub const SYNC_PAGE_DEFAULT: usize = 1_000;
pub const SYNC_PAGE_MAX: usize = 10_000;
/// Bytes a one-chunk change takes in a sync answer, about: the answer's buffer starts at this
/// times the page's changes.
const CHANGE_JSON_BYTES_ESTIMATE: usize = 320;
/// Long-poll timeout: default, least and most, in seconds.
pub const NOTIFY_TIMEOUT_S_DEFAULT: u64 = 30;
pub const NOTIFY_TIMEOUT_S_MIN: u64 = 1;
pub const NOTIFY_TIMEOUT_S_MAX: u64 = 120;

/// Per-namespace positions.
pub(crate) type Cursor = BTreeMap<String, u64>;

/// The namespaces the caller can read now.
fn readable(state: &AppState, user_id: &str) -> Result<Vec<String>, ApiError> {
    Ok(access::namespaces(state, user_id)?.into_iter().map(|a| a.namespace.id).collect())
}

fn encode_cursor(cursor: &Cursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

/// A cursor as it applies now: the caller's readable namespaces with their positions (a
/// namespace granted since the cursor joins it at 0, so its whole tree arrives), and the
/// namespaces of the cursor the caller can no longer read (revoked, left or deleted), which
/// are reported once and dropped. A position past a namespace's end is 410 `cursor-reset`.
struct Position {
    cursor: Cursor,
    removed: Vec<String>,
}

/// The positions a cursor's text holds (`None`: `0`, the start of everything). A cursor is
/// `0` or base64url: anything else is a malformed request (400). One in that alphabet this
/// server cannot read (not one it made, or of an older form), or holding more namespaces
/// than any it makes, cannot be served: 410, and the client syncs again from 0, as after
/// any reset.
pub(crate) fn parse_cursor(text: &str) -> Result<Option<Cursor>, ApiError> {
    if text == "0" {
        return Ok(None);
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(ApiError::BadRequest("a cursor is 0 or the cursor of a sync page (base64url)".into()));
    }
    // Its JSON nests no deeper than a cursor's: one object.
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| ApiError::CursorReset)?;
    if raftbox_storage::command::json_depth(&bytes) > 1 {
        return Err(ApiError::CursorReset);
    }
    let given: Cursor = serde_json::from_slice(&bytes).map_err(|_| ApiError::CursorReset)?;
    if given.len() > LISTED_NAMESPACES_MAX {
        return Err(ApiError::CursorReset);
    }
    Ok(Some(given))
}

fn decode_cursor(state: &AppState, principal: &Principal, text: &str) -> Result<Position, ApiError> {
    let namespaces: HashSet<String> = readable(state, &principal.user.id)?.into_iter().collect();
    let Some(given) = parse_cursor(text)? else {
        return Ok(Position { cursor: namespaces.into_iter().map(|ns| (ns, 0)).collect(), removed: Vec::new() });
    };
    let mut position = Position { cursor: Cursor::new(), removed: Vec::new() };
    for (ns, seq) in given {
        if !namespaces.contains(&ns) {
            position.removed.push(ns);
        } else if seq > state.node.state().namespace_cursor(&ns)? {
            return Err(ApiError::CursorReset);
        } else {
            position.cursor.insert(ns, seq);
        }
    }
    for ns in namespaces {
        position.cursor.entry(ns).or_insert(0);
    }
    Ok(position)
}

/// Where a sync page starts: in the query of `GET /v1/sync`, or the body of `POST /v1/sync`
/// (the cursor holds a position for each namespace the caller reads, at most
/// `LISTED_NAMESPACES_MAX`: too long for a URL once they read a few hundred; the POST never
/// meets a URL limit).
#[derive(Debug, Serialize, Deserialize, utoipa::IntoParams, utoipa::ToSchema)]
#[into_params(parameter_in = Query)]
pub struct SyncQuery {
    #[param(value_type = crate::schema::Cursor)]
    #[schema(value_type = crate::schema::Cursor)]
    pub cursor: String,
    /// Changes per page: default 1,000, at most 10,000 (a larger one is cut to 10,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    #[serde(default, deserialize_with = "crate::json::optional_integer_or_digits")]
    pub limit: Option<u32>,
}

/// One entry of a sync page: a namespace the caller lost, or a file's latest state.
/// Borrowed where the server writes it (no string per change), owned where a client reads
/// it (`SyncPage<'static>`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SyncEntry<'a> {
    #[serde(rename_all = "camelCase")]
    Removed {
        #[schema(value_type = String)]
        namespace_id: Cow<'a, str>,
        /// Always true: the caller can no longer read this namespace.
        namespace_removed: bool,
    },
    Change(ChangeView<'a>),
}

/// A file's latest state as `/v1/sync` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeView<'a> {
    #[schema(value_type = String)]
    pub namespace_id: Cow<'a, str>,
    pub path: String,
    pub file_id: String,
    pub version: u64,
    /// The content's blocks, in order (BLAKE3, hex).
    #[schema(value_type = Vec<String>)]
    pub chunks: Vec<BlockHash>,
    pub size: u64,
    /// RFC 3339.
    pub mtime: String,
    /// The file is executable; absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub executable: bool,
    /// A tombstone: the file was deleted; absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub deleted: bool,
}

/// A page of changes, and the cursor to go on from.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPage<'a> {
    pub changes: Vec<SyncEntry<'a>>,
    pub cursor: String,
    /// More changes follow: ask again from `cursor` at once.
    pub has_more: bool,
}

/// The answer of a long poll.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NotifyAnswer {
    /// Whether anything is newer than the cursor (`false`: the wait timed out).
    pub changes: bool,
}

/// A message of the notification WebSocket.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NotifyMessage {
    /// Something in the namespace changed, or the caller gained or lost it: sync.
    #[serde(rename_all = "camelCase")]
    NamespaceChanged { namespace_id: String },
}

/// `GET /v1/sync?cursor=…`: the changes after the cursor.
pub async fn sync(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<SyncQuery>,
) -> Result<Response, ApiError> {
    sync_page(&state, &principal, query).await
}

/// `POST /v1/sync {"cursor", "limit"}`: the same, the cursor in the body.
pub async fn sync_post(State(state): State<AppState>, principal: Principal, body: Bytes) -> Result<Response, ApiError> {
    let query: SyncQuery = crate::json::parse(&body)?;
    sync_page(&state, &principal, query).await
}

async fn sync_page(state: &AppState, principal: &Principal, query: SyncQuery) -> Result<Response, ApiError> {
    let limit = super::page_limit(query.limit, SYNC_PAGE_DEFAULT, SYNC_PAGE_MAX)?;
    crate::access::barrier(state, principal).await?;
    let Position { mut cursor, removed } = decode_cursor(state, principal, &query.cursor)?;
    let mut changes: Vec<SyncEntry<'_>> = removed
        .iter()
        .map(|ns| SyncEntry::Removed { namespace_id: Cow::Borrowed(ns), namespace_removed: true })
        .collect();
    let limit = limit.saturating_add(changes.len());
    let mut has_more = false;
    let namespaces: Vec<String> = cursor.keys().cloned().collect();
    for ns in &namespaces {
        let Some(seq) = cursor.get_mut(ns) else { continue };
        let room = limit - changes.len();
        if room == 0 {
            has_more |= state.node.state().namespace_cursor(ns)? > *seq;
            continue;
        }
        let page = state.node.state().changes(ns, *seq, room + 1)?;
        has_more |= page.len() > room;
        changes.reserve(page.len().min(room));
        for change in page.into_iter().take(room) {
            *seq = change.seq;
            changes.push(SyncEntry::Change(ChangeView {
                namespace_id: Cow::Borrowed(ns),
                path: change.version.path.into(),
                file_id: change.file.id,
                version: change.version.version,
                chunks: change.version.chunks,
                size: change.version.size,
                mtime: format_utc(change.version.mtime_ms),
                executable: change.version.executable,
                deleted: change.version.deleted,
            }));
        }
    }
    let estimate = changes.len().saturating_mul(CHANGE_JSON_BYTES_ESTIMATE).saturating_add(1024);
    json_response(&SyncPage { changes, cursor: encode_cursor(&cursor), has_more }, estimate)
}

/// `value` as a JSON answer, encoded into one buffer of `estimate` bytes to start with (no
/// regrowing copies for a typical page).
fn json_response<T: Serialize>(value: &T, estimate: usize) -> Result<Response, ApiError> {
    let mut body = Vec::with_capacity(estimate);
    serde_json::to_writer(&mut body, value).map_err(|e| ApiError::Internal(format!("encode the answer: {e}")))?;
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}

/// Whether anything is newer than the cursor: a change in one of its namespaces, a
/// namespace granted or removed since.
fn pending(state: &AppState, position: &Position, given: &str) -> Result<bool, ApiError> {
    if !position.removed.is_empty() {
        return Ok(true);
    }
    let known: Option<Cursor> = match given {
        "0" => None,
        text => URL_SAFE_NO_PAD.decode(text).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()),
    };
    for (ns, seq) in &position.cursor {
        let joined = known.as_ref().is_some_and(|k| !k.contains_key(ns));
        if joined || state.node.state().namespace_cursor(ns)? > *seq {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What a long poll waits on: in the query of `GET /v1/notify`, or the body of
/// `POST /v1/notify`.
#[derive(Debug, Serialize, Deserialize, utoipa::IntoParams, utoipa::ToSchema)]
#[into_params(parameter_in = Query)]
pub struct NotifyQuery {
    #[param(value_type = crate::schema::Cursor)]
    #[schema(value_type = crate::schema::Cursor)]
    pub cursor: String,
    /// Seconds to wait at most: 1 to 120, default 30.
    #[param(minimum = 1, maximum = 120)]
    #[schema(minimum = 1, maximum = 120)]
    #[serde(default, deserialize_with = "crate::json::optional_integer_or_digits")]
    pub timeout: Option<u64>,
}

/// Answers `{"changes": true}` as soon as anything newer than the cursor exists, else
/// `{"changes": false}` at the timeout.
/// The open notification channels of a node: in all, and by principal (user).
#[derive(Clone, Default)]
pub struct Channels {
    open: Arc<Mutex<(usize, HashMap<String, usize>)>>,
}

/// One open channel; closing it (dropping this) frees its place.
pub struct ChannelSlot {
    channels: Channels,
    user_id: String,
}

impl Channels {
    /// A place for one more channel of `user_id`, or 429 when the user or the node has as
    /// many open as `limits` allow.
    fn open(&self, user_id: &str, limits: &crate::NotifyLimits) -> Result<ChannelSlot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mine = open.1.get(user_id).copied().unwrap_or(0);
        if mine >= limits.per_principal_max {
            return Err(ApiError::TooManyChannels(format!(
                "you have {mine} notification channels open on this node, the most allowed"
            )));
        }
        if open.0 >= limits.per_node_max {
            return Err(ApiError::TooManyChannels(
                "this node has as many notification channels open as it allows".into(),
            ));
        }
        open.0 += 1;
        *open.1.entry(user_id.to_string()).or_default() += 1;
        Ok(ChannelSlot { channels: self.clone(), user_id: user_id.to_string() })
    }
}

impl Drop for ChannelSlot {
    fn drop(&mut self) {
        let mut open = self.channels.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(count) = open.1.get_mut(&self.user_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.1.remove(&self.user_id);
            }
        }
    }
}

/// `GET /v1/notify?cursor=…&timeout=…`.
pub async fn long_poll(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<NotifyQuery>,
) -> Result<Json<NotifyAnswer>, ApiError> {
    wait_for_changes(state, principal, query).await
}

/// `POST /v1/notify {"cursor", "timeout"}`: the same, the cursor in the body.
pub async fn long_poll_post(
    State(state): State<AppState>,
    principal: Principal,
    body: Bytes,
) -> Result<Json<NotifyAnswer>, ApiError> {
    let query: NotifyQuery = crate::json::parse(&body)?;
    wait_for_changes(state, principal, query).await
}

async fn wait_for_changes(
    state: AppState,
    principal: Principal,
    query: NotifyQuery,
) -> Result<Json<NotifyAnswer>, ApiError> {
    let _slot = state.channels.open(&principal.user.id, &state.config.notify_limits)?;
    let timeout = query.timeout.unwrap_or(NOTIFY_TIMEOUT_S_DEFAULT);
    if !(NOTIFY_TIMEOUT_S_MIN..=NOTIFY_TIMEOUT_S_MAX).contains(&timeout) {
        return Err(ApiError::BadRequest(format!(
            "timeout is {NOTIFY_TIMEOUT_S_MIN} to {NOTIFY_TIMEOUT_S_MAX} seconds"
        )));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    // Listening before the state is read: nothing applied after the read goes unheard.
    let mut listener = state.hub.listen();
    // As in /v1/sync: a cursor from a node a few ms ahead is servable once this one caught up.
    crate::access::barrier(&state, &principal).await?;
    let position = decode_cursor(&state, &principal, &query.cursor)?;
    if pending(&state, &position, &query.cursor)? {
        return Ok(Json(NotifyAnswer { changes: true }));
    }
    let mut watch = Watch::new(&state, &principal, position.cursor)?;
    loop {
        let event = tokio::select! {
            event = listener.next() => event,
            () = watch.token_expiry() => return Err(ApiError::Unauthenticated("token expired".into())),
            () = tokio::time::sleep_until(deadline) => return Ok(Json(NotifyAnswer { changes: false })),
        };
        let Some(event) = event else { return Err(ApiError::Unavailable("node is shutting down".into())) };
        match watch.hear(&state, &event)? {
            Heard::Revoked => return Err(ApiError::Unauthenticated("token revoked".into())),
            Heard::Changed(changed) if !changed.is_empty() => return Ok(Json(NotifyAnswer { changes: true })),
            Heard::Changed(_) => {}
        }
    }
}

/// Sends `{"type":"namespace_changed","namespaceId":…}` whenever a readable namespace
/// changes on this node, and when one is granted or taken away (the client's next sync then
/// brings its tree or its removal), until the client goes away. A revoked or expired token
/// closes the socket (close code 1008, policy violation).
pub async fn websocket(
    State(state): State<AppState>,
    principal: Principal,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let slot = state.channels.open(&principal.user.id, &state.config.notify_limits)?;
    // Listening, then the positions, before the upgrade answer: no commit after it goes
    // unheard.
    let listener = state.hub.listen();
    let mut seen: Cursor = BTreeMap::new();
    for ns in readable(&state, &principal.user.id)? {
        let at = state.node.state().namespace_cursor(&ns)?;
        seen.insert(ns, at);
    }
    let watch = Watch::new(&state, &principal, seen)?;
    Ok(upgrade.on_upgrade(move |socket| async move {
        notify_socket(state, watch, listener, socket).await;
        drop(slot);
    }))
}

async fn notify_socket(state: AppState, mut watch: Watch, mut listener: Listener, mut socket: WebSocket) {
    loop {
        let event = tokio::select! {
            event = listener.next() => event,
            () = watch.token_expiry() => return close(socket, "token expired").await,
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
        };
        let Some(event) = event else { return };
        let changed = match watch.hear(&state, &event) {
            Ok(Heard::Changed(changed)) => changed,
            Ok(Heard::Revoked) => return close(socket, "token revoked").await,
            Err(e) => {
                tracing::warn!(error = %e, "a notification channel could not read the state");
                return;
            }
        };
        for ns in changed {
            let message = NotifyMessage::NamespaceChanged { namespace_id: ns };
            let message = serde_json::to_string(&message).unwrap_or_default();
            if socket.send(Message::Text(message.into())).await.is_err() {
                return;
            }
        }
    }
}

/// Closes a socket whose token stopped working (1008: policy violation).
async fn close(mut socket: WebSocket, reason: &'static str) {
    let frame = axum::extract::ws::CloseFrame { code: 1008, reason: reason.into() };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// What one channel follows: its caller, their token and groups, and a position in each
/// namespace they read.
struct Watch {
    user_id: String,
    token_id: String,
    token_hash: [u8; 32],
    /// When the token stops working, on this node's clock.
    expires: Option<tokio::time::Instant>,
    groups: HashSet<String>,
    seen: Cursor,
}

/// What an event meant for a channel.
enum Heard {
    /// These namespaces changed, joined or left (the positions moved on).
    Changed(Vec<String>),
    /// The channel's token was revoked.
    Revoked,
}

impl Watch {
    fn new(state: &AppState, principal: &Principal, seen: Cursor) -> Result<Watch, ApiError> {
        let expires = principal.token_expires_ms.map(|at| {
            tokio::time::Instant::now() + Duration::from_millis(at.saturating_sub(state.node.expiry_now_ms()))
        });
        let mut watch = Watch {
            user_id: principal.user.id.clone(),
            token_id: principal.token_id.clone(),
            token_hash: principal.token_hash,
            expires,
            groups: HashSet::new(),
            seen,
        };
        watch.read_groups(state)?;
        Ok(watch)
    }

    fn read_groups(&mut self, state: &AppState) -> Result<(), ApiError> {
        let groups = state.node.state().user(&self.user_id)?.map(|u| u.groups).unwrap_or_default();
        self.groups = groups.into_iter().collect();
        Ok(())
    }

    /// Whether the channel's token still exists.
    fn token_active(&self, state: &AppState) -> Result<bool, ApiError> {
        Ok(state.node.state().token_active(&self.token_hash, &self.user_id, &self.token_id)?)
    }

    /// Resolves when the token expires (never, for a token without expiry).
    async fn token_expiry(&self) {
        match self.expires {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// What `event` changed for this channel. A summary costs a look at each of its items
    /// (a point read for those that concern the caller), whatever the caller's namespace
    /// count; only [`Event::Everything`] and a change to the caller's own groups read all
    /// their namespaces again.
    fn hear(&mut self, state: &AppState, event: &Event) -> Result<Heard, ApiError> {
        let touched = match event {
            Event::Everything => {
                if !self.token_active(state)? {
                    return Ok(Heard::Revoked);
                }
                self.read_groups(state)?;
                return Ok(Heard::Changed(moved(state, &self.user_id, &mut self.seen)?));
            }
            Event::Touched(touched) => touched,
        };
        let named = touched.revoked_tokens.iter().any(|(user, token)| *user == self.user_id && *token == self.token_id);
        if named && !self.token_active(state)? {
            return Ok(Heard::Revoked);
        }
        if touched.members.contains(&self.user_id) {
            self.read_groups(state)?;
            return Ok(Heard::Changed(moved(state, &self.user_id, &mut self.seen)?));
        }
        let mut changed = Vec::new();
        for (grantee, ns) in &touched.access {
            let concerns_me = match grantee {
                Some(Grantee::User(user)) => *user == self.user_id,
                Some(Grantee::Group(group)) => self.groups.contains(group),
                None => self.seen.contains_key(ns),
            };
            if !concerns_me {
                continue;
            }
            let readable = state.node.state().role(&self.user_id, ns)?.is_some();
            if readable && !self.seen.contains_key(ns) {
                self.seen.insert(ns.clone(), state.node.state().namespace_cursor(ns)?);
                changed.push(ns.clone());
            } else if !readable && self.seen.remove(ns).is_some() {
                changed.push(ns.clone());
            }
        }
        for ns in &touched.namespaces {
            let Some(before) = self.seen.get(ns).copied() else { continue };
            let at = state.node.state().namespace_cursor(ns)?;
            if at > before {
                self.seen.insert(ns.clone(), at);
                if !changed.contains(ns) {
                    changed.push(ns.clone());
                }
            }
        }
        Ok(Heard::Changed(changed))
    }
}

/// The namespaces that changed, joined or left since `seen`, which is brought up to date
/// (reads every namespace the caller can read: the channels' fallback).
fn moved(state: &AppState, user_id: &str, seen: &mut Cursor) -> Result<Vec<String>, ApiError> {
    let now: HashSet<String> = readable(state, user_id)?.into_iter().collect();
    let mut out: Vec<String> = seen.keys().filter(|ns| !now.contains(*ns)).cloned().collect();
    seen.retain(|ns, _| now.contains(ns));
    for ns in now {
        let at = state.node.state().namespace_cursor(&ns)?;
        if seen.get(&ns).is_none_or(|before| at > *before) {
            seen.insert(ns.clone(), at);
            out.push(ns);
        }
    }
    Ok(out)
}
