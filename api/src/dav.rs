//! WebDAV at `/dav/` (RFC 4918 class 1 and 2), through the `dav-server` crate: it speaks the
//! protocol (PROPFIND, GET with ranges, PUT, DELETE, MKCOL, COPY, MOVE, LOCK/UNLOCK,
//! conditional headers, multi-status answers); [`RaftFs`] maps it onto the caller's personal
//! namespace with the API's own rules, so WebDAV is one more client of the same commands:
//!
//! - **A PUT is a new version**, committed on the version the file had when the PUT began: a
//!   commit that raced another writer keeps both (the state machine's conflicted copy) and
//!   answers 409. The body is spooled to a temporary file (bounded memory, whatever its size),
//!   cut with the same FastCDC sizes as every raftbox writer, each block stored durably on a
//!   majority, then committed. Quota and a full disk answer 507.
//! - **Folders** are implicit, as in the API (a folder exists while a file is under it); MKCOL
//!   makes one explicit with an empty marker file, [`FOLDER_MARKER`], which WebDAV does not
//!   list. The API and the sync client see the marker as an ordinary empty file, so an empty
//!   folder made here also appears on every synced device (git's `.gitkeep`, made for you).
//! - **DELETE** of a file is a tombstone version (history keeps every version); of a folder, a
//!   tombstone for every file under it. **MOVE** of a file is the API's move; of a folder, a
//!   move per file. **COPY** commits the same blocks at the destination (no bytes copied).
//!   A folder operation touching more than [`TREE_FILES_MAX`] files is refused (507): it
//!   would be unbounded work for one request (the sync client or the CLI move such trees).
//! - **Locks** are kept in memory by the node that granted them (`dav-server`'s `MemLs`): a
//!   client keeps talking to one node, and a restart forgets them (they are advisory).
//! - **Authentication:** Basic, with the user's name and a token of theirs as the password (as
//!   Nextcloud's app passwords), or a bearer token. Without credentials the answer is 401 with
//!   a Basic challenge, which davfs2 and Windows wait for.
//! - **Dead properties** (PROPPATCH of properties WebDAV does not define) are not stored: the
//!   PROPPATCH answers 403 per property, as RFC 4918 allows.

use std::io::SeekFrom;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, FsError, FsFuture, FsResult, FsStream, GuardedFileSystem, OpenOptions,
    ReadDirMeta,
};
use dav_server::memls::MemLs;
use dav_server::DavHandler;
use futures_util::{stream, FutureExt as _};
use raftbox_storage::blocks::{BlockHash, VerifiedBlock, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES, CHUNK_MIN_BYTES};
use raftbox_storage::command::{FileCommit, FileMove};
use raftbox_storage::files::FolderEntry;
use raftbox_storage::paths::FilePath;
use raftbox_storage::{Command, Outcome, Rejection};
use tokio::io::{AsyncSeekExt as _, AsyncWriteExt as _};

use crate::auth::Principal;
use crate::routes::{new_id, LISTING_WORK_MAX};
use crate::{ApiError, AppState};

/// The empty file that makes a folder made with MKCOL explicit.
pub const FOLDER_MARKER: &str = ".raftbox-folder";
/// Entries one folder listing (PROPFIND depth 1) returns, at most; a larger folder answers
/// 507 rather than a listing that silently leaves files out.
pub const LISTING_ENTRIES_MAX: usize = 10_000;
/// Files one folder DELETE, MOVE or COPY may touch, at most (each is one command).
pub const TREE_FILES_MAX: usize = 1_000;
/// Bytes one PUT may write, at most (a file also has at most `FILE_CHUNKS_MAX` chunks).
pub const PUT_BYTES_MAX: u64 = 64 << 30;
/// The device named in conflicted copies made by WebDAV writes.
const DEVICE: &str = "webdav";

/// How long one WebDAV request may take, whole body included (a PUT of a large file over a
/// slow link); every wait inside is bounded on its own as well.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Answers 503 when a WebDAV request has not finished within [`REQUEST_DEADLINE`].
pub async fn deadline(request: Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(REQUEST_DEADLINE, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Unavailable(format!(
            "no answer within the WebDAV deadline ({} s); a write in flight may or may not happen",
            REQUEST_DEADLINE.as_secs()
        ))
        .into_response(),
    }
}

/// The routes: `/dav` and everything under it, every method.
pub fn router() -> Router<AppState> {
    Router::new().route("/dav", any(handle)).route("/dav/", any(handle)).route("/dav/{*path}", any(handle))
}

/// The locks every WebDAV request on this node shares.
#[derive(Clone)]
pub struct Locks(Box<MemLs>);

impl Default for Locks {
    fn default() -> Locks {
        Locks(MemLs::new())
    }
}

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Locks")
    }
}

async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let principal = match crate::auth::from_headers(&state, request.headers()).await {
        Ok(principal) => principal,
        Err(error) => {
            let mut response = error.into_response();
            if response.status() == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"raftbox\", charset=\"UTF-8\""),
                );
            }
            return response;
        }
    };
    let handler = DavHandler::builder()
        .filesystem(Box::new(RaftFs { state: state.clone() }))
        .locksystem(state.dav_locks.0.clone())
        .strip_prefix("/dav")
        .build_handler();
    let name = principal.user.name.clone();
    handler.handle_guarded(request, name, principal).await.map(Body::new)
}

/// The caller's files as a `dav-server` file system.
#[derive(Clone)]
pub struct RaftFs {
    state: AppState,
}

/// What a failed call answers, logged when it is the server's fault.
fn fs_error(error: ApiError) -> FsError {
    match error {
        ApiError::NotFound(_) => FsError::NotFound,
        ApiError::Forbidden(_) => FsError::Forbidden,
        ApiError::QuotaExceeded(_) => FsError::InsufficientStorage,
        ApiError::PayloadTooLarge(_) => FsError::TooLarge,
        ApiError::BadRequest(_) => FsError::Forbidden,
        ApiError::Conflict(_) | ApiError::CommitConflict { .. } => FsError::Exists,
        other => {
            tracing::warn!(error = %other, "webdav: a call failed");
            FsError::GeneralFailure
        }
    }
}

/// The path a WebDAV path names in the namespace, without a trailing `/` (`"/"` for the
/// root). A path the namespace cannot hold (not UTF-8, a component too long) is not found.
fn path_of(path: &DavPath) -> FsResult<String> {
    let text = std::str::from_utf8(path.as_bytes()).map_err(|_| FsError::NotFound)?;
    let trimmed = text.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".to_string());
    }
    let parsed = FilePath::parse(trimmed).map_err(|_| FsError::NotFound)?;
    Ok(parsed.as_str().to_string())
}

fn file_path(text: &str) -> FsResult<FilePath> {
    FilePath::parse(text).map_err(|_| FsError::Forbidden)
}

/// The folder form of a path: `/` or `/a/b/`.
fn folder_of(path: &str) -> String {
    if path == "/" {
        "/".to_string()
    } else {
        format!("{path}/")
    }
}

fn is_marker(path: &str) -> bool {
    path.rsplit('/').next() == Some(FOLDER_MARKER)
}

#[derive(Debug, Clone)]
struct Meta {
    len: u64,
    modified_ms: u64,
    dir: bool,
    /// `fileId-version` of a file: it changes with every version.
    etag: Option<String>,
    executable: bool,
}

impl Meta {
    fn folder() -> Meta {
        // Folders keep no times: "now" is what clients show for one.
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Meta { len: 0, modified_ms: now_ms, dir: true, etag: None, executable: false }
    }

    fn file(file: &raftbox_storage::records::FileRecord, version: &raftbox_storage::records::VersionRecord) -> Meta {
        Meta {
            len: version.size,
            modified_ms: version.mtime_ms,
            dir: false,
            etag: Some(format!("{}-{}", file.id, version.version)),
            executable: version.executable,
        }
    }
}

impl DavMetaData for Meta {
    fn len(&self) -> u64 {
        self.len
    }

    fn modified(&self) -> FsResult<SystemTime> {
        Ok(UNIX_EPOCH + Duration::from_millis(self.modified_ms))
    }

    fn is_dir(&self) -> bool {
        self.dir
    }

    fn etag(&self) -> Option<String> {
        self.etag.clone()
    }

    fn executable(&self) -> FsResult<bool> {
        Ok(self.executable)
    }
}

struct Entry {
    name: String,
    meta: Meta,
}

impl DavDirEntry for Entry {
    fn name(&self) -> Vec<u8> {
        self.name.as_bytes().to_vec()
    }

    fn metadata(&self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let meta: Box<dyn DavMetaData> = Box::new(self.meta.clone());
        async move { Ok(meta) }.boxed()
    }
}

impl RaftFs {
    /// The caller's namespace, after a read barrier (so what follows reads the state as of
    /// now); writable or not.
    async fn namespace(&self, principal: &Principal) -> FsResult<(String, bool)> {
        let namespace_id = principal.user.namespace_id.clone();
        let role = crate::access::read(&self.state, principal, &namespace_id).await.map_err(fs_error)?;
        Ok((namespace_id, role.can_write()))
    }

    async fn writable(&self, principal: &Principal) -> FsResult<String> {
        match self.namespace(principal).await? {
            (namespace_id, true) => Ok(namespace_id),
            _ => Err(FsError::Forbidden),
        }
    }

    /// What is at `path`: a live file, a folder (the root, or a path with a live file under
    /// it), or nothing.
    fn lookup(&self, namespace_id: &str, path: &str) -> FsResult<Option<Meta>> {
        if path == "/" {
            return Ok(Some(Meta::folder()));
        }
        let sm = self.state.node.state();
        if let Some((file, version)) = sm.file_at(namespace_id, path).map_err(|e| fs_error(e.into()))? {
            if !file.deleted {
                return Ok(Some(Meta::file(&file, &version)));
            }
        }
        let mut budget = LISTING_WORK_MAX;
        match self.live_under(namespace_id, path, &mut budget) {
            Ok(live) => Ok(live.then(Meta::folder)),
            // Only tombstones within the work bound: counted as a folder (a live file may
            // follow), never as nothing.
            Err(FsError::InsufficientStorage) => Ok(Some(Meta::folder())),
            Err(other) => Err(other),
        }
    }

    /// Whether a live file is under `folder` (`/a/b`), looking at `budget` records at most
    /// (spent from it; 507 when it runs out first). The API's listing names a folder while any
    /// record is under it, a deleted file's included; a WebDAV folder exists while a live
    /// file is.
    fn live_under(&self, namespace_id: &str, folder: &str, budget: &mut usize) -> FsResult<bool> {
        let prefix = folder_of(folder);
        let sm = self.state.node.state();
        let mut after: Option<String> = None;
        loop {
            if *budget == 0 {
                return Err(FsError::InsufficientStorage);
            }
            let want = (*budget).min(256);
            let page = sm.files_under(namespace_id, &prefix, after.as_deref(), want).map_err(|e| fs_error(e.into()))?;
            *budget -= page.len().min(*budget);
            if page.iter().any(|(file, _)| !file.deleted) {
                return Ok(true);
            }
            if page.len() < want {
                return Ok(false);
            }
            after = page.last().map(|(file, _)| file.path.as_str().to_string());
        }
    }

    /// The live files under `folder` (`/a/b`), at most [`TREE_FILES_MAX`] (else 507).
    fn files_under(&self, namespace_id: &str, folder: &str) -> FsResult<Vec<(String, u64)>> {
        let prefix = folder_of(folder);
        let sm = self.state.node.state();
        let (mut out, mut after, mut scanned) = (Vec::new(), None::<String>, 0usize);
        loop {
            let page = sm
                .files_under(namespace_id, &prefix, after.as_deref(), TREE_FILES_MAX)
                .map_err(|e| fs_error(e.into()))?;
            let done = page.len() < TREE_FILES_MAX;
            for (file, _) in &page {
                after = Some(file.path.as_str().to_string());
                if !file.deleted {
                    out.push((file.path.as_str().to_string(), file.current_version));
                }
            }
            scanned += page.len();
            if out.len() > TREE_FILES_MAX || scanned > LISTING_WORK_MAX {
                return Err(FsError::InsufficientStorage);
            }
            if done {
                return Ok(out);
            }
        }
    }

    /// Proposes `command` and reads its outcome as a file system result.
    async fn commit(&self, command: Command) -> FsResult<(String, u64)> {
        let outcome = self.state.node.write(command).await.map_err(|e| fs_error(e.into()))?;
        match outcome {
            Outcome::FileCommitted { file_id, version, .. } => Ok((file_id, version)),
            Outcome::FileConflict { .. } => Err(FsError::Exists),
            Outcome::Rejected(Rejection::QuotaExceeded { .. }) => Err(FsError::InsufficientStorage),
            Outcome::Rejected(rejection) => Err(fs_error(rejection.into())),
            other => {
                tracing::warn!(?other, "webdav: unexpected outcome");
                Err(FsError::GeneralFailure)
            }
        }
    }

    fn empty_commit(principal: &Principal, namespace_id: &str, path: FilePath, base_version: u64) -> FileCommit {
        crate::routes::files::empty_commit(principal, namespace_id.to_string(), path, base_version, DEVICE.to_string())
    }

    /// The current version of the live file at `path`, or 0.
    fn current_version(&self, namespace_id: &str, path: &str) -> FsResult<u64> {
        let found = self.state.node.state().file_at(namespace_id, path).map_err(|e| fs_error(e.into()))?;
        Ok(found.filter(|(f, _)| !f.deleted).map_or(0, |(f, _)| f.current_version))
    }

    /// Refuses a write whose parent folder does not exist (409 to the client).
    fn parent_exists(&self, namespace_id: &str, path: &str) -> FsResult<()> {
        let parent = path.rsplit_once('/').map_or("/", |(p, _)| if p.is_empty() { "/" } else { p });
        match self.lookup(namespace_id, parent)? {
            Some(meta) if meta.dir => Ok(()),
            _ => Err(FsError::NotFound),
        }
    }

    async fn delete_file(&self, principal: &Principal, namespace_id: &str, path: &str, base: u64) -> FsResult<()> {
        let commit =
            FileCommit { deleted: true, ..Self::empty_commit(principal, namespace_id, file_path(path)?, base) };
        self.commit(Command::CommitFile(Box::new(commit))).await.map(|_| ())
    }

    async fn move_file(
        &self,
        principal: &Principal,
        namespace_id: &str,
        from: &str,
        to: &str,
        base: u64,
    ) -> FsResult<()> {
        let request = FileMove {
            namespace_id: namespace_id.to_string(),
            from: file_path(from)?,
            to: file_path(to)?,
            base_version: base,
            device: DEVICE.to_string(),
            new_file_id: new_id(),
            actor_user_id: principal.user.id.clone(),
        };
        self.commit(Command::MoveFile(Box::new(request))).await.map(|_| ())
    }
}

impl GuardedFileSystem<Principal> for RaftFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
        principal: &'a Principal,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        async move {
            let path = path_of(path)?;
            if !options.write {
                let (namespace_id, _) = self.namespace(principal).await?;
                let sm = self.state.node.state();
                let (file, version) = match sm.file_at(&namespace_id, &path).map_err(|e| fs_error(e.into()))? {
                    Some((file, version)) if !file.deleted => (file, version),
                    _ => return Err(FsError::NotFound),
                };
                let mut chunks = Vec::with_capacity(version.chunks.len());
                for hash in &version.chunks {
                    let size = sm.chunk(hash).map_err(|e| fs_error(e.into()))?.ok_or(FsError::GeneralFailure)?.size;
                    chunks.push((*hash, size));
                }
                let meta = Meta::file(&file, &version);
                let reader = Reader { state: self.state.clone(), meta, chunks, position: 0, block: None };
                return Ok(Box::new(reader) as Box<dyn DavFile>);
            }
            if path == "/" || is_marker(&path) {
                return Err(FsError::Forbidden);
            }
            let namespace_id = self.writable(principal).await?;
            let existing = self.lookup(&namespace_id, &path)?;
            match &existing {
                Some(meta) if meta.dir => return Err(FsError::Forbidden),
                Some(_) if options.create_new => return Err(FsError::Exists),
                Some(_) if !options.truncate => return Err(FsError::NotImplemented),
                None if !options.create && !options.create_new => return Err(FsError::NotFound),
                _ => {}
            }
            self.parent_exists(&namespace_id, &path)?;
            if options.size.is_some_and(|size| size > PUT_BYTES_MAX) {
                return Err(FsError::TooLarge);
            }
            let base_version = self.current_version(&namespace_id, &path)?;
            let spool = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(|_| FsError::GeneralFailure)?
                .map_err(|e| {
                    tracing::warn!(error = %e, "webdav: no temporary file for a PUT");
                    FsError::InsufficientStorage
                })?;
            let writer = Writer {
                fs: self.clone(),
                principal: principal.clone(),
                namespace_id,
                path: file_path(&path)?,
                base_version,
                spool: Some(tokio::fs::File::from_std(spool)),
                written: 0,
                committed: None,
            };
            Ok(Box::new(writer) as Box<dyn DavFile>)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
        principal: &'a Principal,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        async move {
            let path = path_of(path)?;
            let (namespace_id, _) = self.namespace(principal).await?;
            let folder = folder_of(&path);
            let sm = self.state.node.state();
            let (mut entries, mut after): (Vec<Box<dyn DavDirEntry>>, Option<String>) = (Vec::new(), None);
            // What telling live subfolders from deleted ones may cost, for the whole listing.
            let mut budget = LISTING_WORK_MAX;
            loop {
                let page = sm
                    .list_folder(&namespace_id, &folder, after.as_deref(), LISTING_ENTRIES_MAX, LISTING_WORK_MAX)
                    .map_err(|e| fs_error(e.into()))?;
                for entry in page.entries {
                    let entry: Box<dyn DavDirEntry> = match entry {
                        FolderEntry::Folder { name } => {
                            let sub = format!("{folder}{name}");
                            if !self.live_under(&namespace_id, &sub, &mut budget)? {
                                continue;
                            }
                            Box::new(Entry { name, meta: Meta::folder() })
                        }
                        FolderEntry::File { name, .. } if name == FOLDER_MARKER => continue,
                        FolderEntry::File { name, file, version } => {
                            Box::new(Entry { name, meta: Meta::file(&file, &version) })
                        }
                    };
                    entries.push(entry);
                }
                if entries.len() > LISTING_ENTRIES_MAX {
                    return Err(FsError::InsufficientStorage);
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            let entries: FsStream<Box<dyn DavDirEntry>> = Box::pin(stream::iter(entries.into_iter().map(Ok)));
            Ok(entries)
        }
        .boxed()
    }

    fn metadata<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, Box<dyn DavMetaData>> {
        async move {
            let path = path_of(path)?;
            if is_marker(&path) {
                return Err(FsError::NotFound);
            }
            let (namespace_id, _) = self.namespace(principal).await?;
            match self.lookup(&namespace_id, &path)? {
                Some(meta) => Ok(Box::new(meta) as Box<dyn DavMetaData>),
                None => Err(FsError::NotFound),
            }
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let path = path_of(path)?;
            let namespace_id = self.writable(principal).await?;
            if self.lookup(&namespace_id, &path)?.is_some() {
                return Err(FsError::Exists);
            }
            self.parent_exists(&namespace_id, &path)?;
            let marker = file_path(&format!("{path}/{FOLDER_MARKER}"))?;
            let commit = Self::empty_commit(principal, &namespace_id, marker, 0);
            self.commit(Command::CommitFile(Box::new(commit))).await.map(|_| ())
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let path = path_of(path)?;
            if path == "/" {
                return Err(FsError::Forbidden);
            }
            let namespace_id = self.writable(principal).await?;
            for (file, base) in self.files_under(&namespace_id, &path)? {
                self.delete_file(principal, &namespace_id, &file, base).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let path = path_of(path)?;
            let namespace_id = self.writable(principal).await?;
            match self.current_version(&namespace_id, &path)? {
                0 => Err(FsError::NotFound),
                base => self.delete_file(principal, &namespace_id, &path, base).await,
            }
        }
        .boxed()
    }

    fn rename<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (from, to) = (path_of(from)?, path_of(to)?);
            if from == "/" || to == "/" || to.starts_with(&folder_of(&from)) {
                return Err(FsError::Forbidden);
            }
            let namespace_id = self.writable(principal).await?;
            self.parent_exists(&namespace_id, &to)?;
            match self.lookup(&namespace_id, &from)? {
                None => Err(FsError::NotFound),
                Some(meta) if !meta.dir => {
                    let base = self.current_version(&namespace_id, &from)?;
                    self.move_file(principal, &namespace_id, &from, &to, base).await
                }
                Some(_) => {
                    for (file, base) in self.files_under(&namespace_id, &from)? {
                        let target = format!("{to}{}", &file[from.len()..]);
                        self.move_file(principal, &namespace_id, &file, &target, base).await?;
                    }
                    Ok(())
                }
            }
        }
        .boxed()
    }

    fn copy<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (from, to) = (path_of(from)?, path_of(to)?);
            let namespace_id = self.writable(principal).await?;
            let sm = self.state.node.state();
            let version = match sm.file_at(&namespace_id, &from).map_err(|e| fs_error(e.into()))? {
                Some((file, version)) if !file.deleted => version,
                _ => return Err(FsError::NotFound),
            };
            let base = self.current_version(&namespace_id, &to)?;
            let commit = FileCommit {
                chunks: version.chunks,
                size: version.size,
                mtime_ms: version.mtime_ms,
                executable: version.executable,
                ..Self::empty_commit(principal, &namespace_id, file_path(&to)?, base)
            };
            self.commit(Command::CommitFile(Box::new(commit))).await.map(|_| ())
        }
        .boxed()
    }

    fn get_quota<'a>(&'a self, principal: &'a Principal) -> FsFuture<'a, (u64, Option<u64>)> {
        async move {
            let used = self.state.node.state().stored_bytes(&principal.user.id).map_err(|e| fs_error(e.into()))?;
            let quota = (!principal.user.admin).then(|| self.state.limits.get().quotas.stored_bytes_per_user);
            Ok((used, quota))
        }
        .boxed()
    }
}

/// A file being read: its chunks with their sizes, and the block last fetched.
struct Reader {
    state: AppState,
    meta: Meta,
    chunks: Vec<(BlockHash, u64)>,
    position: u64,
    /// The block holding `position` when last read: (its offset in the file, its bytes).
    block: Option<(u64, Bytes)>,
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
struct Writer {
    fs: RaftFs,
    principal: Principal,
    namespace_id: String,
    path: FilePath,
    base_version: u64,
    spool: Option<tokio::fs::File>,
    written: u64,
    /// The version the flush committed: (file id, version, size, mtime).
    committed: Option<(String, u64, u64, u64)>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("path", &self.path.as_str()).field("written", &self.written).finish()
    }
}

impl Writer {
    async fn append(&mut self, bytes: &[u8]) -> FsResult<()> {
        let spool = self.spool.as_mut().ok_or(FsError::GeneralFailure)?;
        self.written += bytes.len() as u64;
        if self.written > PUT_BYTES_MAX {
            return Err(FsError::TooLarge);
        }
        spool.write_all(bytes).await.map_err(|e| {
            tracing::warn!(error = %e, "webdav: spooling a PUT failed");
            FsError::InsufficientStorage
        })
    }

    /// Cuts the spooled body into blocks (off the async workers), stores each on a majority as
    /// it is cut (two in flight at most), and returns the chunk list.
    async fn store_blocks(&mut self) -> FsResult<Vec<BlockHash>> {
        let mut spool = self.spool.take().ok_or(FsError::GeneralFailure)?;
        spool.flush().await.map_err(|_| FsError::GeneralFailure)?;
        spool.seek(SeekFrom::Start(0)).await.map_err(|_| FsError::GeneralFailure)?;
        let spool = spool.into_std().await;
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
        let cutter = tokio::task::spawn_blocking(move || {
            let cdc = fastcdc::v2020::StreamCDC::new(spool, CHUNK_MIN_BYTES, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES);
            for found in cdc {
                let piece = found.map(|c| Bytes::from(c.data)).map_err(std::io::Error::other);
                if sender.blocking_send(piece).is_err() {
                    return;
                }
            }
        });
        let mut chunks = Vec::new();
        while let Some(piece) = receiver.recv().await {
            let data = piece.map_err(|e| {
                tracing::warn!(error = %e, "webdav: reading a spooled PUT failed");
                FsError::GeneralFailure
            })?;
            if chunks.len() == crate::routes::files::FILE_CHUNKS_MAX {
                return Err(FsError::TooLarge);
            }
            let hash = BlockHash::of(&data);
            let block = VerifiedBlock::verify(hash, data).map_err(|_| FsError::GeneralFailure)?;
            crate::routes::blocks::store(&self.fs.state, &self.principal, block).await.map_err(fs_error)?;
            chunks.push(hash);
        }
        cutter.await.map_err(|_| FsError::GeneralFailure)?;
        Ok(chunks)
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
            let chunks = self.store_blocks().await?;
            let mtime_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let size = self.written;
            let commit = FileCommit {
                chunks,
                size,
                mtime_ms,
                ..RaftFs::empty_commit(&self.principal, &self.namespace_id, self.path.clone(), self.base_version)
            };
            let (file_id, version) = self.fs.commit(Command::CommitFile(Box::new(commit))).await?;
            self.committed = Some((file_id, version, size, mtime_ms));
            Ok(())
        }
        .boxed()
    }
}
