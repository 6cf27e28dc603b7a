//! The block API: `POST /v1/blocks/status`, `PUT /v1/blocks/{hash}`, `GET /v1/blocks/{hash}`.
//!
//! A block is visible only to its uploaders and the readers of a namespace that references
//! it ([`crate::access::block`]): to anyone else `status` says missing and `GET` is 404, so
//! nobody reads or probes other users' content by its hash. Blocks are `Cache-Control:
//! private` (DESIGN.md said `public`; a shared cache would hand them to anyone).
//!
//! A PUT answers 201 only once the block is durable on a majority of nodes and its chunk
//! index entry is committed through Raft, so `status` (a linearizable read of the index)
//! never reports a block as present that a commit could not use.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use raftbox_storage::blocks::{BlockHash, BlockReceiver, VerifiedBlock, BLOCK_BYTES_MAX};
use raftbox_storage::{Command, Outcome, Rejection};
use serde::{Deserialize, Serialize};

use crate::access;
use crate::auth::Principal;
use crate::{json, ApiError, AppState};

/// Times one block PUT places its block, at most, when the cluster's members keep changing
/// before it registers (then 503).
const PLACEMENTS_MAX: u32 = 3;

/// Hashes one status call may ask about, at most.
pub const STATUS_HASHES_MAX: usize = 10_000;

pub(crate) fn parse_hash(text: &str) -> Result<BlockHash, ApiError> {
    text.parse()
        .map_err(|_| ApiError::BadRequest(format!("{text:?} is not a block hash (64 lowercase hex characters)")))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusRequest {
    #[schema(value_type = Vec<crate::schema::BlockHash>, max_items = 10_000)]
    hashes: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct StatusResponse {
    missing: Vec<String>,
}

/// Which of these blocks the cluster lacks, or the caller may not read (linearizable).
pub async fn status(
    State(state): State<AppState>,
    caller: Principal,
    body: Bytes,
) -> Result<Json<StatusResponse>, ApiError> {
    let request: StatusRequest = json::parse(&body)?;
    if request.hashes.len() > STATUS_HASHES_MAX {
        return Err(ApiError::BadRequest(format!("at most {STATUS_HASHES_MAX} hashes per call")));
    }
    let hashes = request.hashes.iter().map(|h| parse_hash(h)).collect::<Result<Vec<_>, _>>()?;
    crate::access::barrier(&state, &caller).await?;
    let mut missing = Vec::new();
    for (hash, text) in hashes.iter().zip(&request.hashes) {
        let present = state.node.state().chunk(hash)?.is_some() && access::block_now(&state, &caller, hash)?;
        if !present && !missing.contains(text) {
            missing.push(text.clone());
        }
    }
    Ok(Json(StatusResponse { missing }))
}

/// Stores a block: hash verified, durable on a majority, then indexed with the caller as an
/// uploader. A repeat by the same user is a no-op; another user's upload of known content
/// records them as an uploader too (they proved they hold it). The body is hashed as it
/// arrives, into one buffer sized from its `Content-Length`.
pub async fn put(
    State(state): State<AppState>,
    caller: Principal,
    Path(hash): Path<String>,
    request: Request,
) -> Result<StatusCode, ApiError> {
    let hash = parse_hash(&hash)?;
    let block = receive(request)
        .await?
        .finish(hash)
        .map_err(|e| ApiError::HashMismatch(format!("the body hashes to {}, not {}", e.actual, e.expected)))?;
    store(&state, &caller, block).await?;
    Ok(StatusCode::CREATED)
}

/// Stores a verified block for `caller`: durable on a majority, then indexed with the caller
/// as an uploader (a repeat is a no-op); refused when it cannot fit the caller's quota or
/// this node's disk is full. The block PUT, WebDAV and the whole-file upload all store
/// through here.
pub(crate) async fn store(state: &AppState, caller: &Principal, block: VerifiedBlock) -> Result<(), ApiError> {
    let hash = block.hash();
    let blocks = state.node.blocks();
    let size = block.len() as u64;
    let uploader = caller.user.id.clone();
    // The quota is judged in apply; a block that plainly does not fit is refused before its
    // bytes are written anywhere.
    let quota_bytes = (!caller.user.admin).then_some(state.limits.get().quotas.stored_bytes_per_user);
    let register = |uploader, placed_in| Command::RegisterChunk { hash, size, uploader, quota_bytes, placed_in };
    let registered = |outcome: Outcome| match outcome {
        Outcome::Rejected(rejection) => Err(ApiError::from(rejection)),
        _ => Ok(()),
    };
    if state.node.state().chunk(&hash)?.is_some() && blocks.store().has(&hash) {
        // Known here, but this node may lag behind a collection of the chunk: judged on the
        // state as of now before the copy here is trusted as the majority's.
        state.node.read_barrier().await?;
    }
    if state.node.state().chunk(&hash)?.is_some() && blocks.store().has(&hash) {
        if state.node.state().uploaded_by(&uploader, &hash)? {
            return Ok(());
        }
        return registered(state.node.write(register(uploader, None)).await?);
    }
    let over = |stored_bytes: u64| quota_bytes.filter(|q| stored_bytes.saturating_add(size) > *q);
    if over(state.node.state().stored_bytes(&uploader)?).is_some() {
        // This node may lag: judged again once it has applied everything acknowledged.
        state.node.read_barrier().await?;
        let stored_bytes = state.node.state().stored_bytes(&uploader)?;
        if let Some(quota_bytes) = over(stored_bytes) {
            return Err(ApiError::from(Rejection::QuotaExceeded { stored_bytes, quota_bytes, size }));
        }
    }
    let disk = state.node.disk();
    if disk.full {
        return Err(ApiError::Unavailable(disk.refusal()));
    }
    // The registration names the configuration the block was placed in (once every member
    // reads the fence); the members changed in between, it is placed again in the new one.
    let fenced = state.node.cluster_format() >= raftbox_storage::format::PLACEMENT_FENCE;
    let mut placements = 0;
    loop {
        placements += 1;
        let config = blocks.put_replicated(block.clone()).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
        match state.node.write(register(uploader.clone(), fenced.then_some(config))).await? {
            Outcome::Rejected(Rejection::MembersChanged) if placements < PLACEMENTS_MAX => {
                tracing::info!(%hash, "the members changed while the block was stored; placing it again");
            }
            outcome => return registered(outcome),
        }
    }
}

/// A request's `Content-Length`, if it declares one.
pub(crate) fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// Reads a PUT body into a [`BlockReceiver`] (413 past `BLOCK_BYTES_MAX`, declared or sent).
pub(super) async fn receive(request: Request) -> Result<BlockReceiver, ApiError> {
    let too_large = || ApiError::PayloadTooLarge(format!("a block is at most {BLOCK_BYTES_MAX} bytes"));
    let declared = declared_length(request.headers());
    if declared.is_some_and(|n| n > BLOCK_BYTES_MAX as u64) {
        return Err(too_large());
    }
    let mut receiver = BlockReceiver::with_capacity(declared.unwrap_or(0) as usize);
    let mut body = request.into_body().into_data_stream();
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| ApiError::BadRequest(format!("read the body: {e}")))?;
        receiver.push(&piece).map_err(|_| too_large())?;
    }
    Ok(receiver)
}

/// A block's bytes, from this node or fetched from a peer, if the caller may read it (else
/// 404). Immutable, but access-controlled: cacheable by the client only.
pub async fn get(
    State(state): State<AppState>,
    caller: Principal,
    Path(hash): Path<String>,
) -> Result<Response, ApiError> {
    let hash = parse_hash(&hash)?;
    if !access::block(&state, &caller, &hash).await? {
        return Err(ApiError::NotFound(format!("block {hash}")));
    }
    block_response(&state, hash).await
}

/// A block's bytes as an answer (fetched from a peer when this node lacks it); 404 when no
/// node has it, 503 when this node lacks it and a peer that may hold it did not answer.
pub(crate) async fn block_response(state: &AppState, hash: BlockHash) -> Result<Response, ApiError> {
    let data = state
        .node
        .blocks()
        .get(hash)
        .await
        .map_err(|e| match e {
            raftbox_raft::BlockError::Unreachable(_) => ApiError::Unavailable(e.to_string()),
            e => ApiError::Internal(e.to_string()),
        })?
        .ok_or_else(|| ApiError::NotFound(format!("block {hash}")))?;
    let mut response = Body::from(data).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=31536000, immutable"));
    if let Ok(etag) = HeaderValue::try_from(format!("\"{hash}\"")) {
        headers.insert(header::ETAG, etag);
    }
    Ok(response)
}
