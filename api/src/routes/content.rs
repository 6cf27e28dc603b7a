//! Whole files in one request, for curl and the console: the server cuts, hashes and
//! reassembles the blocks, so a client needs no hashing library.
//!
//! | route | what |
//! |---|---|
//! | `PUT /v1/files/content?path=` | the body is the file: spooled, cut into blocks (the sync client's sizes), stored on a majority, committed as a new version |
//! | `GET /v1/files/content?path=` | the current version's bytes, streamed block by block |
//! | `POST /v1/blocks` | one block (at most 8 MiB) hashed by the server: `{"hash"}`, for uploads in pieces that resume |
//!
//! The whole-file routes run under the transfer deadline (`crate::TRANSFER_DEADLINE`), not
//! the request timeout. A PUT without `baseVersion` replaces the version current when it
//! began (as WebDAV's PUT): a commit that lands in between makes a conflicted copy, as any
//! stale commit does. Repeating a PUT of the same bytes answers `unchanged`.

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt as _;
use raftbox_storage::records::Role;
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::blocks::declared_length;
use super::files::{device, empty_commit, parse_mtime, parse_path, render_commit};
use crate::access;
use crate::auth::Principal;
use crate::spool::Spool;
use crate::{ApiError, AppState};

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ContentQuery {
    #[param(value_type = crate::schema::FilePath)]
    path: String,
    /// Default: the caller's personal namespace.
    namespace_id: Option<String>,
    /// The version this content replaces (0: a new file). Default: the version current
    /// when the upload began.
    base_version: Option<u64>,
    /// The modification time. Default: now.
    #[param(value_type = Option<crate::schema::Mtime>)]
    mtime: Option<String>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `PUT /v1/files/content`: the body as a new version of the file.
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<ContentQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let path = parse_path(&query.path)?;
    let namespace_id = access::resolve(&principal, query.namespace_id.as_deref());
    let mtime_ms = match &query.mtime {
        None => now_ms(),
        Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            let ms = text.parse::<u64>().map_or(serde_json::Value::Null, serde_json::Value::from);
            parse_mtime(&ms)?
        }
        Some(text) => parse_mtime(&serde_json::Value::String(text.clone()))?,
    };
    let device = device(request.headers(), &principal)?;
    // Refused before a byte of the body is taken: a namespace the caller may not change.
    if access::read(&state, &principal, &namespace_id).await? == Role::Viewer {
        return Err(ApiError::Forbidden("a viewer cannot change files".into()));
    }
    let current = state.node.state().file_at(&namespace_id, path.as_str())?.filter(|(file, _)| !file.deleted);
    let executable = current.as_ref().is_some_and(|(_, version)| version.executable);
    let base_version = query.base_version.unwrap_or(current.as_ref().map_or(0, |(file, _)| file.current_version));
    let declared = declared_length(request.headers());
    let mut spool = Spool::open(&state, &principal, declared).await?;
    // A body that sends nothing for `crate::TRANSFER_BODY_IDLE` fails here, and its place among
    // the node's uploads goes back.
    let mut body = request.into_body().into_data_stream();
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| ApiError::BadRequest(format!("read the body ({e}); nothing was stored")))?;
        spool.append(&piece).await?;
    }
    let size = spool.written();
    if declared.is_some_and(|declared| declared != size) {
        return Err(ApiError::BadRequest(format!("the body has {size} bytes, not its Content-Length")));
    }
    let chunks = spool.store_blocks(&state, &principal).await?;
    // The bytes of the version it replaces (a retry of this PUT): no new version.
    if let Some((file, version)) = current.filter(|(file, _)| file.current_version == base_version) {
        if version.chunks == chunks {
            let unchanged = Outcome::FileCommitted { file_id: file.id, version: file.current_version, unchanged: true };
            return render_commit(unchanged);
        }
    }
    let commit = raftbox_storage::command::FileCommit {
        chunks,
        size,
        mtime_ms,
        executable,
        ..empty_commit(&principal, namespace_id, path, base_version, device)
    };
    let commit = super::files::charged(&state, &principal, commit);
    render_commit(state.node.write(Command::CommitFile(Box::new(commit))).await?)
}

/// `GET /v1/files/content`: the current version's bytes, each block fetched (from this node
/// or a peer) as the answer is sent, so memory holds one block at a time.
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<super::files::PathQuery>,
) -> Result<Response, ApiError> {
    let namespace_id = access::resolve(&principal, query.namespace_id.as_deref());
    let path = parse_path(&query.path)?;
    access::read(&state, &principal, &namespace_id).await?;
    let (file, version) = match state.node.state().file_at(&namespace_id, path.as_str())? {
        Some((file, version)) if !file.deleted => (file, version),
        _ => return Err(ApiError::NotFound(format!("no file at {path}"))),
    };
    Ok(file_response(&state, &format!("{}-{}", file.id, version.version), &version))
}

/// A version's bytes as an answer, streamed block by block. A block no member can give
/// (lost, or every holder unreachable) ends the answer short, which the client sees as a
/// failed transfer (its length was promised), never as a shorter file.
pub(crate) fn file_response(
    state: &AppState,
    etag: &str,
    version: &raftbox_storage::records::VersionRecord,
) -> Response {
    let blocks = state.node.blocks().clone();
    let path = version.path.as_str().to_owned();
    let stream = futures_util::stream::iter(version.chunks.clone()).then(move |hash| {
        let (blocks, path) = (blocks.clone(), path.clone());
        async move {
            match blocks.get(hash).await {
                Ok(Some(data)) => Ok::<Bytes, std::io::Error>(data),
                Ok(None) => {
                    tracing::warn!(%hash, path, "no member holds a block of a file being read");
                    Err(std::io::Error::other(format!("block {hash} is not available")))
                }
                Err(e) => {
                    tracing::warn!(%hash, path, error = %e, "a block of a file being read could not be fetched");
                    Err(std::io::Error::other(e.to_string()))
                }
            }
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(version.size));
    // A user's bytes, maybe served to someone without an account: kept by no cache, so a
    // revoked link or token reaches nothing through one (drHEADer's rule too).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store, max-age=0"));
    if let Ok(etag) = HeaderValue::try_from(format!("\"{etag}\"")) {
        headers.insert(header::ETAG, etag);
    }
    response
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct BlockStored {
    /// The block's BLAKE3 hash, 64 lowercase hex characters: name it in a commit's `chunks`.
    hash: String,
}

/// `POST /v1/blocks`: one block whose hash the server computes, stored for the caller like
/// `PUT /v1/blocks/{hash}` (durable on a majority, then indexed).
pub async fn post_block(
    State(state): State<AppState>,
    caller: Principal,
    request: Request,
) -> Result<(StatusCode, Json<BlockStored>), ApiError> {
    let block = super::blocks::receive(request).await?.hashed();
    if block.is_empty() {
        // No file needs one: an empty file has no blocks.
        return Err(ApiError::BadRequest("a block has at least one byte".into()));
    }
    let hash = block.hash().to_hex();
    super::blocks::store(&state, &caller, block).await?;
    Ok((StatusCode::CREATED, Json(BlockStored { hash })))
}
