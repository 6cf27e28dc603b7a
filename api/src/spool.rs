//! A whole file arriving in one request body (the whole-file upload, a WebDAV PUT): spooled
//! to a temporary file, so memory stays bounded whatever its size, then cut into blocks with
//! the sync client's content-defined sizes and stored on a majority, block by block. What a
//! spool takes is bounded before a byte is written: [`PUT_BYTES_MAX`], the caller's quota,
//! and a node whose disk is full takes nothing.

use std::io::SeekFrom;

use axum::body::Bytes;
use raftbox_storage::blocks::{BlockHash, VerifiedBlock, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES, CHUNK_MIN_BYTES};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::auth::Principal;
use crate::routes::files::FILE_CHUNKS_MAX;
use crate::{ApiError, AppState};

/// Bytes one whole-file request may carry, at most (a file also has at most
/// `FILE_CHUNKS_MAX` chunks).
pub const PUT_BYTES_MAX: u64 = 64 << 30;

/// Blocks cut and waiting to be stored, at most: the cutter runs ahead of the stores by this.
const CUT_AHEAD_BLOCKS: usize = 2;

/// A request body being spooled.
pub(crate) struct Spool {
    file: Option<tokio::fs::File>,
    written: u64,
    /// What it may take: the caller's quota (507 beyond), or [`PUT_BYTES_MAX`].
    bytes_max: u64,
}

fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(format!("one upload carries at most {PUT_BYTES_MAX} bytes"))
}

fn over_quota(bytes_max: u64) -> ApiError {
    ApiError::QuotaExceeded(format!("the upload is larger than your storage quota ({bytes_max} bytes)"))
}

impl Spool {
    /// A spool for an upload by `principal` of `declared` bytes (its `Content-Length`, if it
    /// sent one): refused before anything is written when that cannot fit (413, 507), or when
    /// this node's disk is full (503).
    pub(crate) async fn open(
        state: &AppState,
        principal: &Principal,
        declared: Option<u64>,
    ) -> Result<Spool, ApiError> {
        if declared.is_some_and(|size| size > PUT_BYTES_MAX) {
            return Err(too_large());
        }
        let disk = state.node.disk();
        if disk.full {
            return Err(ApiError::Unavailable(disk.refusal()));
        }
        let bytes_max = match principal.user.admin {
            true => PUT_BYTES_MAX,
            false => PUT_BYTES_MAX.min(state.limits.get().quotas.stored_bytes_per_user),
        };
        if declared.is_some_and(|size| size > bytes_max) {
            return Err(over_quota(bytes_max));
        }
        let file = tokio::task::spawn_blocking(tempfile::tempfile)
            .await
            .map_err(|e| ApiError::Internal(format!("open a spool file: {e}")))?
            .map_err(|e| {
                tracing::warn!(error = %e, "no temporary file to spool an upload");
                ApiError::Unavailable("this node has no room to take the upload now; try again".into())
            })?;
        Ok(Spool { file: Some(tokio::fs::File::from_std(file)), written: 0, bytes_max })
    }

    /// Bytes spooled so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Spools the next piece of the body.
    pub(crate) async fn append(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        let file = self.file.as_mut().ok_or_else(|| ApiError::Internal("the spool was already stored".into()))?;
        self.written += bytes.len() as u64;
        if self.written > PUT_BYTES_MAX {
            return Err(too_large());
        }
        if self.written > self.bytes_max {
            return Err(over_quota(self.bytes_max));
        }
        file.write_all(bytes).await.map_err(|e| {
            tracing::warn!(error = %e, "spooling an upload failed");
            ApiError::Unavailable("this node has no room to take the upload now; try again".into())
        })
    }

    /// Cuts what was spooled into blocks (off the async workers) and stores each on a
    /// majority for `principal` as it is cut ([`CUT_AHEAD_BLOCKS`] waiting at most); the
    /// file's chunk list.
    pub(crate) async fn store_blocks(
        &mut self,
        state: &AppState,
        principal: &Principal,
    ) -> Result<Vec<BlockHash>, ApiError> {
        let failed = |e: std::io::Error| {
            tracing::warn!(error = %e, "reading a spooled upload failed");
            ApiError::Internal(format!("read the spooled upload: {e}"))
        };
        let mut file = self.file.take().ok_or_else(|| ApiError::Internal("the spool was already stored".into()))?;
        file.flush().await.map_err(failed)?;
        file.seek(SeekFrom::Start(0)).await.map_err(failed)?;
        let file = file.into_std().await;
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(CUT_AHEAD_BLOCKS);
        let cutter = tokio::task::spawn_blocking(move || {
            let cdc = fastcdc::v2020::StreamCDC::new(file, CHUNK_MIN_BYTES, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES);
            for found in cdc {
                let piece = found.map(|c| Bytes::from(c.data)).map_err(std::io::Error::other);
                if sender.blocking_send(piece).is_err() {
                    return;
                }
            }
        });
        let mut chunks = Vec::new();
        while let Some(piece) = receiver.recv().await {
            let data = piece.map_err(failed)?;
            if chunks.len() == FILE_CHUNKS_MAX {
                return Err(ApiError::PayloadTooLarge(format!("a file has at most {FILE_CHUNKS_MAX} chunks")));
            }
            let block = VerifiedBlock::of(data);
            chunks.push(block.hash());
            crate::routes::blocks::store(state, principal, block).await?;
        }
        cutter.await.map_err(|e| ApiError::Internal(format!("cutting the upload failed: {e}")))?;
        Ok(chunks)
    }
}
