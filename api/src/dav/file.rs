//! The files WebDAV opens: a [`Reader`] streams a version's blocks, fetched one at a time
//! from this node or a peer; a [`Writer`] spools a PUT's body to a temporary file and, at the
//! flush, cuts it into blocks, stores each on a majority and commits the new version.

use std::io::SeekFrom;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{fs_error, Meta, RaftFs};
use crate::auth::Principal;
use crate::spool::Spool;
use crate::{ApiError, AppState};
use bytes::Bytes;
use dav_server::fs::{DavFile, DavMetaData, FsError, FsFuture, FsResult};
use futures_util::FutureExt as _;
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::command::FileCommit;
use raftbox_storage::paths::FilePath;
use raftbox_storage::Command;

/// A file being read: its chunks with their sizes, and the block last fetched.
pub(super) struct Reader {
    pub(super) state: AppState,
    pub(super) meta: Meta,
    pub(super) chunks: Vec<(BlockHash, u64)>,
    pub(super) position: u64,
    /// The block holding `position` when last read: (its offset in the file, its bytes).
    pub(super) block: Option<(u64, Bytes)>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("meta", &self.meta).field("position", &self.position).finish()
    }
}

impl Reader {
    /// The block holding `position` and its offset in the file, fetched from this node or a
    /// peer; `None` at the end.
    async fn block_at(&mut self) -> FsResult<Option<(u64, Bytes)>> {
        if let Some((start, data)) = &self.block {
            if self.position >= *start && self.position < start + data.len() as u64 {
                return Ok(Some((*start, data.clone())));
            }
        }
        let mut start = 0u64;
        for (hash, size) in &self.chunks {
            if self.position < start + size {
                let data = self
                    .state
                    .node
                    .blocks()
                    .get(*hash)
                    .await
                    .map_err(|e| {
                        tracing::warn!(error = %e, %hash, "webdav: a block could not be read");
                        FsError::GeneralFailure
                    })?
                    .ok_or(FsError::GeneralFailure)?;
                self.block = Some((start, data.clone()));
                return Ok(Some((start, data)));
            }
            start += size;
        }
        Ok(None)
    }
}

impl DavFile for Reader {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let meta: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        async move { Ok(meta) }.boxed()
    }

    fn write_buf(&mut self, _buf: Box<dyn bytes::Buf + Send>) -> FsFuture<'_, ()> {
        async { Err(FsError::Forbidden) }.boxed()
    }

    fn write_bytes(&mut self, _buf: Bytes) -> FsFuture<'_, ()> {
        async { Err(FsError::Forbidden) }.boxed()
    }

    fn read_bytes(&mut self, count: usize) -> FsFuture<'_, Bytes> {
        async move {
            let Some((start, data)) = self.block_at().await? else {
                return Ok(Bytes::new());
            };
            let from = (self.position - start) as usize;
            let to = data.len().min(from + count);
            self.position += (to - from) as u64;
            Ok(data.slice(from..to))
        }
        .boxed()
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        async move {
            let target = match pos {
                SeekFrom::Start(n) => Some(n),
                SeekFrom::End(n) => self.meta.len.checked_add_signed(n),
                SeekFrom::Current(n) => self.position.checked_add_signed(n),
            };
            self.position = target.ok_or(FsError::GeneralFailure)?;
            Ok(self.position)
        }
        .boxed()
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        async { Ok(()) }.boxed()
    }
}

/// A file being written: the body spooled to a temporary file, cut into blocks, stored and
/// committed at the first flush.
pub(super) struct Writer {
    pub(super) fs: RaftFs,
    pub(super) principal: Principal,
    pub(super) namespace_id: String,
    pub(super) path: FilePath,
    pub(super) base_version: u64,
    /// The body so far (`None` for the empty file a LOCK made).
    pub(super) spool: Option<Spool>,
    pub(super) written: u64,
    /// The body's declared length: a flush after any other amount commits nothing.
    pub(super) expected: Option<u64>,
    /// The execute bit of the version this one replaces, kept.
    pub(super) executable: bool,
    /// The version the flush committed: (file id, version, size, mtime).
    pub(super) committed: Option<(String, u64, u64, u64)>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("path", &self.path.as_str()).field("written", &self.written).finish()
    }
}

impl Writer {
    async fn append(&mut self, bytes: &[u8]) -> FsResult<()> {
        let spool = self.spool.as_mut().ok_or(FsError::GeneralFailure)?;
        spool.append(bytes).await.map_err(spool_error)?;
        self.written = spool.written();
        Ok(())
    }
}

/// A spool's refusal as WebDAV says it: no room (the quota, this node's disk) is 507.
pub(super) fn spool_error(error: ApiError) -> FsError {
    match error {
        ApiError::Unavailable(_) => FsError::InsufficientStorage,
        other => fs_error(other),
    }
}

impl DavFile for Writer {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        async move {
            let meta = match &self.committed {
                Some((file_id, version, size, mtime_ms)) => Meta {
                    len: *size,
                    modified_ms: *mtime_ms,
                    dir: false,
                    etag: Some(format!("{file_id}-{version}")),
                    executable: false,
                },
                None => Meta { len: self.written, modified_ms: 0, dir: false, etag: None, executable: false },
            };
            Ok(Box::new(meta) as Box<dyn DavMetaData>)
        }
        .boxed()
    }

    fn write_buf(&mut self, mut buf: Box<dyn bytes::Buf + Send>) -> FsFuture<'_, ()> {
        async move {
            while buf.has_remaining() {
                let piece = buf.chunk().to_vec();
                buf.advance(piece.len());
                self.append(&piece).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn write_bytes(&mut self, buf: Bytes) -> FsFuture<'_, ()> {
        async move { self.append(&buf).await }.boxed()
    }

    fn read_bytes(&mut self, _count: usize) -> FsFuture<'_, Bytes> {
        async { Err(FsError::Forbidden) }.boxed()
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        // Only the position already reached: a PUT writes its body in order.
        async move {
            match pos {
                SeekFrom::Current(0) => Ok(self.written),
                SeekFrom::Start(n) if n == self.written => Ok(n),
                _ => Err(FsError::NotImplemented),
            }
        }
        .boxed()
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        async move {
            if self.committed.is_some() {
                return Ok(());
            }
            // A body cut short, or longer than declared (dav-server flushes before it answers
            // 400): nothing is committed.
            if self.expected.is_some_and(|expected| expected != self.written) {
                return Err(FsError::Forbidden);
            }
            let spool = self.spool.as_mut().ok_or(FsError::GeneralFailure)?;
            let chunks = spool.store_blocks(&self.fs.state, &self.principal).await.map_err(fs_error)?;
            let mtime_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let size = self.written;
            let commit = FileCommit {
                chunks,
                size,
                mtime_ms,
                executable: self.executable,
                ..RaftFs::empty_commit(&self.principal, &self.namespace_id, self.path.clone(), self.base_version)
            };
            let commit = crate::routes::files::charged(&self.fs.state, &self.principal, commit);
            let (file_id, version) = self.fs.commit(Command::CommitFile(Box::new(commit))).await?;
            self.committed = Some((file_id, version, size, mtime_ms));
            Ok(())
        }
        .boxed()
    }
}
