//! Backups (admin): `GET /v1/admin/backup` streams a consistent image of the replicated
//! state, `GET /v1/admin/blocks/{hash}` one block a backup names (`raftbox backup
//! --with-blocks` copies them).
//!
//! A backup reflects at least every write acknowledged before the request (a read barrier
//! first, so any node serves it), and is one RocksDB snapshot view of this node's applied
//! state, streamed straight from it (nothing written to the node's disk; memory bounded).
//! The answer names the log index and term it reflects; the image ends with its blake3
//! checksum, which the client checks. One backup runs per node at a time (until its stream
//! ends or is dropped); another answers 503 with `Retry-After`. The request timeout bounds
//! the wait for the answer's head, not the streaming of a large state.
//!
//! A backup holds everyone's data (the admin token reads every block through it), as an
//! etcd snapshot does: keep it as safe as the nodes' disks.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::auth::Principal;
use crate::routes::blocks::{block_response, parse_hash};
use crate::{ApiError, AppState};

/// Set while this node writes a backup.
static BACKUP_RUNNING: AtomicBool = AtomicBool::new(false);

/// Clears [`BACKUP_RUNNING`] when the backup's writing ends (streamed, failed or dropped).
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        BACKUP_RUNNING.store(false, Ordering::Release);
    }
}

pub async fn backup(State(state): State<AppState>, principal: Principal) -> Result<Response, ApiError> {
    principal.require_admin()?;
    if BACKUP_RUNNING.swap(true, Ordering::AcqRel) {
        return Err(ApiError::Unavailable("a backup is already running on this node; try again later".into()));
    }
    let running = Running;
    crate::access::barrier(&state, &principal).await?;
    // The guard goes with the writer: the next backup may start once this one's writing ends.
    let (image, chunks) = state.node.backup(running).await?;
    tracing::info!(index = image.index, term = image.term, "backup streaming");
    let mut response = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(chunks)).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE.as_str(), "application/octet-stream".to_string()),
        ("x-raftbox-backup-index", image.index.to_string()),
        ("x-raftbox-backup-term", image.term.to_string()),
        (header::CONTENT_DISPOSITION.as_str(), format!("attachment; filename=\"raftbox-{}.backup\"", image.index)),
    ] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(header::HeaderName::from_static(name), value);
        }
    }
    Ok(response)
}

pub async fn block(
    State(state): State<AppState>,
    principal: Principal,
    Path(hash): Path<String>,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let hash = parse_hash(&hash)?;
    if state.node.state().chunk(&hash)?.is_none() {
        return Err(ApiError::NotFound(format!("block {hash}: not in the chunk index")));
    }
    block_response(&state, hash).await
}
