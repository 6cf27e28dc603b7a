//! A whole file arriving in one request body (the whole-file upload, a WebDAV PUT): spooled
//! to a temporary file, so memory stays bounded whatever its size, then cut into blocks with
//! the sync client's content-defined sizes and stored on a majority, block by block.
//!
//! What spools take is bounded, so no user can fill a node's disk with them:
//! - **by the quota still free**: a user's open spools on a node together hold at most what
//!   their quota leaves (`[quotas] stored_bytes_per_user` less what they store), reserved as
//!   bytes arrive, given back when the spool ends (507 beyond); and [`PUT_BYTES_MAX`] each;
//! - **by the disk**: a spool is refused (503), at its start and at every piece, once the data
//!   disk would keep less than twice the NOSPACE minimum (`raft.min_free_disk_mb`; where the
//!   alarm clears), so spools give way long before the node's own writes would (a leader
//!   never steps down for them); the disk is read every 250 ms, and the minimum is the
//!   margin for what arrives in between;
//! - **by time**: a body must send something every `crate::TRANSFER_BODY_IDLE`, and the
//!   whole request ends by `crate::TRANSFER_DEADLINE`; [`SPOOLS_MAX`] at once per node,
//!   [`SPOOLS_PER_USER_MAX`] per user.

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
/// Uploads spooling at once on a node, and per user (more are refused with 503).
pub const SPOOLS_MAX: usize = 32;
pub const SPOOLS_PER_USER_MAX: usize = 4;

/// The uploads spooling on this node: per user, how many and the bytes they hold.
#[derive(Default)]
pub struct Spools {
    by_user: std::sync::Mutex<std::collections::HashMap<String, Held>>,
}

/// One user's open spools on this node.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    spools: usize,
    bytes: u64,
}

/// One upload's place among [`Spools`], given back (with its bytes) when dropped.
struct Place {
    state: AppState,
    user_id: String,
    bytes: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut by_user = self.state.spools.by_user.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = by_user.get_mut(&self.user_id) {
            assert!(held.spools > 0 && held.bytes >= self.bytes, "a spool gave back more than it held");
            held.spools -= 1;
            held.bytes -= self.bytes;
            if held.spools == 0 {
                by_user.remove(&self.user_id);
            }
        }
    }
}

impl Spools {
    fn take(state: &AppState, user_id: &str) -> Result<Place, ApiError> {
        let mut by_user = state.spools.by_user.lock().unwrap_or_else(|e| e.into_inner());
        if by_user.values().map(|held| held.spools).sum::<usize>() >= SPOOLS_MAX {
            return Err(ApiError::Unavailable(format!(
                "this node takes {SPOOLS_MAX} uploads at once, the most it takes; try again shortly"
            )));
        }
        let mine = by_user.entry(user_id.to_owned()).or_default();
        if mine.spools >= SPOOLS_PER_USER_MAX {
            return Err(ApiError::Unavailable(format!(
                "you have {SPOOLS_PER_USER_MAX} uploads running on this node, the most at once; finish one first"
            )));
        }
        mine.spools += 1;
        Ok(Place { state: state.clone(), user_id: user_id.to_owned(), bytes: 0 })
    }

    /// Reserves `more` bytes for `place`, if its user's spools then hold at most `bytes_max`.
    fn reserve(place: &mut Place, more: u64, bytes_max: u64) -> bool {
        let mut by_user = place.state.spools.by_user.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = by_user.get_mut(&place.user_id) else { return false };
        if held.bytes.saturating_add(more) > bytes_max {
            return false;
        }
        held.bytes += more;
        place.bytes += more;
        true
    }
}

/// A request body being spooled.
pub(crate) struct Spool {
    file: Option<tokio::fs::File>,
    written: u64,
    /// What this user's spools may hold together: the quota still free when it opened (or
    /// [`PUT_BYTES_MAX`] for an admin).
    bytes_max: u64,
    /// Its place among the node's uploads, the bytes it reserved, and the node whose disk it
    /// fills.
    place: Place,
}

fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(format!("one upload carries at most {PUT_BYTES_MAX} bytes"))
}

fn over_quota(bytes_max: u64) -> ApiError {
    ApiError::QuotaExceeded(format!(
        "the upload is larger than what your storage quota leaves, with your other uploads on this node ({bytes_max} bytes)"
    ))
}

/// 503 when this node's data disk would keep less than twice its NOSPACE minimum after `more`
/// bytes.
fn disk_takes(state: &AppState, more: u64) -> Result<(), ApiError> {
    let disk = state.node.disk();
    if disk.full {
        return Err(ApiError::Unavailable(disk.refusal()));
    }
    let floor = disk.min_free_bytes.saturating_mul(2);
    match disk.free_bytes {
        Some(free) if free.saturating_sub(more) < floor => Err(ApiError::Unavailable(format!(
            "this node keeps its last {} MiB of disk for the cluster's own writes; try the upload again later, \
             or through another node",
            floor >> 20
        ))),
        _ => Ok(()),
    }
}

impl Spool {
    /// A spool for an upload by `principal` of `declared` bytes (its `Content-Length`, if it
    /// sent one): refused before anything is written when that cannot fit (413, 507), or when
    /// this node's disk has no room for it (503).
    pub(crate) async fn open(
        state: &AppState,
        principal: &Principal,
        declared: Option<u64>,
    ) -> Result<Spool, ApiError> {
        if declared.is_some_and(|size| size > PUT_BYTES_MAX) {
            return Err(too_large());
        }
        disk_takes(state, declared.unwrap_or(0))?;
        let bytes_max = match principal.user.admin {
            true => PUT_BYTES_MAX,
            false => {
                let quota = state.limits.get().quotas.stored_bytes_per_user;
                let stored = state.node.state().stored_bytes(&principal.user.id)?;
                if stored >= quota {
                    return Err(ApiError::QuotaExceeded(format!(
                        "you store {stored} bytes, your whole quota ({quota} bytes)"
                    )));
                }
                PUT_BYTES_MAX.min(quota - stored)
            }
        };
        if declared.is_some_and(|size| size > bytes_max) {
            return Err(over_quota(bytes_max));
        }
        let mut place = Spools::take(state, &principal.user.id)?;
        // A declared size is reserved whole at once: a second upload that would not fit beside
        // it is refused before it starts.
        if !Spools::reserve(&mut place, declared.unwrap_or(0), bytes_max) {
            return Err(over_quota(bytes_max));
        }
        // On the data disk, which the disk-full alarm watches (not /tmp, maybe memory).
        let dir = state.node.blocks().store().temp_dir();
        let file = tokio::task::spawn_blocking(move || tempfile::tempfile_in(dir))
            .await
            .map_err(|e| ApiError::Internal(format!("open a spool file: {e}")))?
            .map_err(|e| {
                tracing::warn!(error = %e, "no temporary file to spool an upload");
                ApiError::Unavailable("this node has no room to take the upload now; try again".into())
            })?;
        Ok(Spool { file: Some(tokio::fs::File::from_std(file)), written: 0, bytes_max, place })
    }

    /// Bytes spooled so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Spools the next piece of the body: within the reservation (or reserving more, within
    /// what the quota leaves), and only while the disk keeps its margin.
    pub(crate) async fn append(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        let file = self.file.as_mut().ok_or_else(|| ApiError::Internal("the spool was already stored".into()))?;
        let after = self.written + bytes.len() as u64;
        if after > PUT_BYTES_MAX {
            return Err(too_large());
        }
        let more = after.saturating_sub(self.place.bytes);
        if more > 0 && !Spools::reserve(&mut self.place, more, self.bytes_max) {
            return Err(over_quota(self.bytes_max));
        }
        assert!(self.place.bytes >= after, "a spool holds more than it reserved");
        disk_takes(&self.place.state, bytes.len() as u64)?;
        self.written = after;
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
