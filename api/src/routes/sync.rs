//! Sync and notifications: `GET /v1/sync`, `GET /v1/notify` (long-poll) and
//! `GET /v1/notify/ws` (WebSocket).
//!
//! The cursor is opaque to clients: base64url of the JSON map namespace → last sequence
//! seen. `cursor=0` starts from nothing (the whole tree). Notifications come from this
//! node's own apply stream (Raft metrics change on every apply) and carry no data.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::schedule::format_utc;
use serde::Deserialize;
use serde_json::json;

use crate::auth::Principal;
use crate::{ApiError, AppState};

/// Changes per sync page: default and largest.
pub const SYNC_PAGE_DEFAULT: usize = 1_000;
pub const SYNC_PAGE_MAX: usize = 10_000;
/// Long-poll timeout: default, least and most, in seconds.
pub const NOTIFY_TIMEOUT_S_DEFAULT: u64 = 30;
pub const NOTIFY_TIMEOUT_S_MIN: u64 = 1;
pub const NOTIFY_TIMEOUT_S_MAX: u64 = 120;

/// Per-namespace positions.
type Cursor = BTreeMap<String, u64>;

/// The namespaces the caller can read.
fn readable(principal: &Principal) -> Vec<String> {
    vec![principal.user.namespace_id.clone()]
}

fn encode_cursor(cursor: &Cursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

/// Parses a cursor; one that can no longer be served (a namespace the caller cannot read,
/// or a position past the namespace's end) is 410 `cursor-reset`.
fn decode_cursor(state: &AppState, principal: &Principal, text: &str) -> Result<Cursor, ApiError> {
    let namespaces = readable(principal);
    if text == "0" {
        return Ok(namespaces.into_iter().map(|ns| (ns, 0)).collect());
    }
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| ApiError::BadRequest("malformed cursor".into()))?;
    let mut cursor: Cursor =
        serde_json::from_slice(&bytes).map_err(|_| ApiError::BadRequest("malformed cursor".into()))?;
    for (ns, seq) in &cursor {
        if !namespaces.contains(ns) || *seq > state.node.state().namespace_cursor(ns)? {
            return Err(ApiError::CursorReset);
        }
    }
    for ns in namespaces {
        cursor.entry(ns).or_insert(0);
    }
    Ok(cursor)
}

#[derive(Deserialize)]
pub struct SyncQuery {
    cursor: String,
    limit: Option<usize>,
}

pub async fn sync(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<SyncQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = super::page_limit(query.limit, SYNC_PAGE_DEFAULT, SYNC_PAGE_MAX)?;
    state.node.read_barrier().await?;
    let mut cursor = decode_cursor(&state, &principal, &query.cursor)?;
    let mut changes = Vec::new();
    let mut has_more = false;
    for (ns, seq) in cursor.iter_mut() {
        let room = limit - changes.len();
        if room == 0 {
            has_more |= state.node.state().namespace_cursor(ns)? > *seq;
            continue;
        }
        let page = state.node.state().changes(ns, *seq, room + 1)?;
        has_more |= page.len() > room;
        for change in page.into_iter().take(room) {
            *seq = change.seq;
            let mut view = json!({
                "namespaceId": ns, "path": change.file.path.as_str(), "fileId": change.file.id,
                "version": change.version.version,
                "chunks": change.version.chunks.iter().map(BlockHash::to_hex).collect::<Vec<_>>(),
                "size": change.version.size, "mtime": format_utc(change.version.mtime_ms),
            });
            if change.version.deleted {
                view["deleted"] = json!(true);
            }
            changes.push(view);
        }
    }
    Ok(Json(json!({ "changes": changes, "cursor": encode_cursor(&cursor), "hasMore": has_more })))
}

/// Namespaces whose position moved past `cursor`.
fn changed(state: &AppState, cursor: &Cursor) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for (ns, seq) in cursor {
        if state.node.state().namespace_cursor(ns)? > *seq {
            out.push(ns.clone());
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
pub struct NotifyQuery {
    cursor: String,
    timeout: Option<u64>,
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

pub async fn long_poll(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<NotifyQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let _slot = state.channels.open(&principal.user.id, &state.config.notify_limits)?;
    let timeout = query.timeout.unwrap_or(NOTIFY_TIMEOUT_S_DEFAULT);
    if !(NOTIFY_TIMEOUT_S_MIN..=NOTIFY_TIMEOUT_S_MAX).contains(&timeout) {
        return Err(ApiError::BadRequest(format!(
            "timeout is {NOTIFY_TIMEOUT_S_MIN} to {NOTIFY_TIMEOUT_S_MAX} seconds"
        )));
    }
    // As in /v1/sync: a cursor from a node a few ms ahead is servable once this one caught up.
    state.node.read_barrier().await?;
    let cursor = decode_cursor(&state, &principal, &query.cursor)?;
    let mut applied = state.node.raft().metrics();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        applied.borrow_and_update();
        if !changed(&state, &cursor)?.is_empty() {
            return Ok(Json(json!({ "changes": true })));
        }
        match tokio::time::timeout_at(deadline, applied.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ApiError::Unavailable("node is shutting down".into())),
            Err(_) => return Ok(Json(json!({ "changes": false }))),
        }
    }
}

/// Sends `{"type":"namespace_changed","namespaceId":…}` whenever a readable namespace
/// changes on this node, until the client goes away.
pub async fn websocket(
    State(state): State<AppState>,
    principal: Principal,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    // Positions are taken before the upgrade answer, so no commit after it goes unheard.
    let mut seen: Cursor = BTreeMap::new();
    for ns in readable(&principal) {
        let at = state.node.state().namespace_cursor(&ns)?;
        seen.insert(ns, at);
    }
    let applied = state.node.raft().metrics();
    let slot = state.channels.open(&principal.user.id, &state.config.notify_limits)?;
    Ok(upgrade.on_upgrade(move |socket| async move {
        notify_socket(state, seen, applied, socket).await;
        drop(slot);
    }))
}

async fn notify_socket(
    state: AppState,
    mut seen: Cursor,
    mut applied: tokio::sync::watch::Receiver<raftbox_raft::RaftMetrics>,
    mut socket: WebSocket,
) {
    loop {
        // Anything applied between the positions above and now is found by this check.
        for ns in changed(&state, &seen).unwrap_or_default() {
            let message = json!({ "type": "namespace_changed", "namespaceId": ns }).to_string();
            if socket.send(Message::Text(message.into())).await.is_err() {
                return;
            }
            let at = state.node.state().namespace_cursor(&ns).unwrap_or(0);
            seen.insert(ns, at);
        }
        tokio::select! {
            change = applied.changed() => {
                if change.is_err() {
                    return;
                }
            }
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
        }
    }
}
