//! Backups (admin): `GET /v1/admin/backup` streams a consistent image of the replicated
//! state, `GET /v1/admin/blocks/{hash}` one block a backup names (`raftbox backup
//! --with-blocks` copies them).
//!
//! A backup reflects at least every write acknowledged before the request (a read barrier
//! first, so any node serves it), and is one RocksDB snapshot view of this node's applied
//! state, written to an unnamed file in the data directory and streamed from there: memory
//! stays bounded, and the node goes on applying meanwhile. The answer says which log index
//! (and term) it reflects and its blake3 checksum, which also ends the image. One backup
//! runs per node at a time; another answers 503 with `Retry-After`.
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

/// Set while this node writes or sends a backup.
static BACKUP_RUNNING: AtomicBool = AtomicBool::new(false);

/// Clears [`BACKUP_RUNNING`] when the backup's answer is done with (sent or dropped).
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
    state.node.read_barrier().await?;
    // An unnamed file (its name removed at once): the image goes when the answer is done.
    let dir = state.node.state().db().path().to_path_buf();
    let path = dir.join(format!("backup-{}.partial", uuid::Uuid::now_v7().simple()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| ApiError::Internal(format!("backup file in {}: {e}", dir.display())))?;
    let _ = std::fs::remove_file(&path);
    let writer = file.try_clone().map_err(|e| ApiError::Internal(format!("backup file: {e}")))?;
    let image = state.node.backup(writer).await?;
    tracing::info!(index = image.index, term = image.term, bytes = image.bytes, "backup written");

    let mut file = tokio::fs::File::from_std(file);
    use tokio::io::AsyncSeekExt as _;
    file.seek(std::io::SeekFrom::Start(0)).await.map_err(|e| ApiError::Internal(format!("backup file: {e}")))?;
    let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20);
    let body = Body::from_stream(futures_util::StreamExt::map(stream, move |chunk| {
        // Held by the stream: the next backup may start once this one is sent or dropped.
        let _ = &running;
        chunk
    }));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let checksum = blake3::Hash::from_bytes(image.checksum).to_hex();
    for (name, value) in [
        (header::CONTENT_TYPE.as_str(), "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH.as_str(), image.bytes.to_string()),
        ("x-raftbox-backup-index", image.index.to_string()),
        ("x-raftbox-backup-term", image.term.to_string()),
        ("x-raftbox-backup-checksum", checksum.to_string()),
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
