//! WebDAV at `/dav/` (RFC 4918 class 1 and 2), through the `dav-server` crate: it speaks the
//! protocol (PROPFIND, GET with ranges, PUT, DELETE, MKCOL, COPY, MOVE, LOCK/UNLOCK,
//! conditional headers, multi-status answers); [`RaftFs`] maps it onto the caller's
//! namespaces with the API's own rules, so WebDAV is one more client of the same commands:
//!
//! - **Where:** the personal namespace is the root; each shared folder the caller can read is
//!   `/Shared/<its name>/` (`name (end of its id)` where that name is taken), with the
//!   caller's role (a viewer reads; a change is 403). `/Shared` itself lists them, with any
//!   personal files under `/Shared`. A MOVE between namespaces copies, then deletes.
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
//! - **Locks** are kept in memory by the node that granted them, one table per user, each
//!   lock with a timeout (at most an hour) and at most 100 per user ([`locks`]): a client
//!   keeps talking to one node, and a restart forgets them (they are advisory).
//! - **Authentication:** Basic, with the user's name and their password or a token of theirs
//!   as the password (as Nextcloud's app passwords), or a bearer token. Without credentials the answer is 401 with
//!   a Basic challenge, which davfs2 and Windows wait for.
//! - **Dead properties** (PROPPATCH of properties WebDAV does not define, as Finder and
//!   Windows write) are stored per file, replicated (`raftbox_storage::props`: bounded per
//!   file and per user, 507 beyond), kept by new versions, carried by a move, removed with
//!   the file. Folders hold none.
//! - **Every request is checked before the library sees it** ([`request`]): its body read
//!   whole and its XML depth bounded, its `Destination` parsed once; and what a DELETE, MOVE
//!   or COPY may remove is fenced ([`Fence`]) where the file system changes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use dav_server::davpath::DavPath;
use dav_server::fs::{DavDirEntry, DavMetaData, FsError, FsFuture, FsResult};
use dav_server::DavHandler;
use futures_util::FutureExt as _;
use raftbox_storage::command::{FileCommit, FileMove};
use raftbox_storage::files::FolderEntry;
use raftbox_storage::paths::FilePath;
use raftbox_storage::{Command, Outcome, Rejection};

mod file;
mod fs;
mod locks;
pub mod request;

use crate::auth::Principal;
use crate::routes::{new_id, LISTING_WORK_MAX};
use crate::{ApiError, AppState};

/// The folder under the root that holds the caller's shared folders.
pub const SHARED_FOLDER: &str = "Shared";
/// The empty file that makes a folder made with MKCOL explicit.
pub const FOLDER_MARKER: &str = ".raftbox-folder";
/// Entries one folder listing (PROPFIND depth 1) returns, at most; a larger folder answers
/// 507 rather than a listing that silently leaves files out.
pub const LISTING_ENTRIES_MAX: usize = 10_000;
/// Files one folder DELETE, MOVE or COPY may touch, at most (each is one command).
pub const TREE_FILES_MAX: usize = 1_000;
/// The device named in conflicted copies made by WebDAV writes.
const DEVICE: &str = "webdav";

/// The routes: `/dav` and everything under it, every method.
pub fn router() -> Router<AppState> {
    Router::new().route("/dav", any(handle)).route("/dav/", any(handle)).route("/dav/{*path}", any(handle))
}

pub use locks::Locks;

/// A refusal of a request to `path`: on WebDAV, a 401 carries the Basic challenge davfs2 and
/// Windows wait for before they send credentials.
pub fn refusal(path: &str, error: ApiError) -> Response {
    let mut response = error.into_response();
    let dav = path == "/dav" || path.starts_with("/dav/");
    if dav && response.status() == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"raftbox\", charset=\"UTF-8\""));
    }
    response
}

async fn handle(State(state): State<AppState>, request: Request) -> Response {
    // The caller, resolved once before the rate limits (`ratelimit::enforce`): a token, or a
    // user's name and password.
    let Some(principal) = request.extensions().get::<Principal>().cloned() else {
        let why = match request.extensions().get::<crate::auth::Refused>() {
            Some(crate::auth::Refused(why)) => why.clone(),
            None => "log in with your name and password, or a token".into(),
        };
        return refusal(request.uri().path(), ApiError::Unauthenticated(why));
    };
    let (request, destination) = match checked(request).await {
        Ok(checked) => checked,
        Err(refused) => return refused.into_response(),
    };
    let (method, target) = (request.method().as_str().to_owned(), request.uri().path().to_owned());
    let fs = match RaftFs::for_request(&state, &principal, (&method, &target), destination.as_ref()).await {
        Ok(fs) => fs,
        Err(refused) => {
            let status = match refused {
                FsError::Forbidden => StatusCode::FORBIDDEN,
                FsError::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
                FsError::NotFound => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            return status.into_response();
        }
    };
    let handler = DavHandler::builder()
        .filesystem(Box::new(fs))
        .locksystem(Box::new(state.dav_locks.of(&principal.user.id)))
        .strip_prefix(request::PREFIX)
        .build_handler();
    let name = principal.user.name.clone();
    handler.handle_guarded(request, name, principal).await.map(Body::new)
}

/// The request as `dav-server` gets it: its body read and checked ([`request::read_body`];
/// a PUT's streams on), its `Destination`, `If` and entity-tag conditions parsed once and
/// rewritten to what was parsed ([`request::destination`], [`request::if_header`],
/// [`request::etags`]), and no `X-Litmus` (the library answers PROPFIND with Depth:
/// infinity, a walk of the whole tree, to a client that says it is litmus; this node answers
/// it as to anyone else: 403, RFC 4918 9.1).
pub(crate) async fn checked(request: Request) -> Result<(Request, Option<DavPath>), ApiError> {
    let (mut parts, body) = request.into_parts();
    parts.headers.remove("x-litmus");
    if let Some(value) = parts.headers.get("if") {
        let rebuilt = request::if_header(value)?;
        parts.headers.insert("if", rebuilt);
    }
    for (name, if_range) in [(header::IF_MATCH, false), (header::IF_NONE_MATCH, false), (header::IF_RANGE, true)] {
        if parts.headers.get_all(&name).iter().count() > 1 {
            return Err(ApiError::BadRequest(format!("{name} is given once")));
        }
        if let Some(value) = parts.headers.get(&name) {
            let rebuilt = request::etags(value, if_range)?;
            parts.headers.insert(name, rebuilt);
        }
    }
    let destination = match parts.headers.get("destination") {
        Some(value) => {
            let parsed = request::destination(value)?;
            parts.headers.insert("destination", request::canonical(&parsed)?);
            Some(parsed)
        }
        None => None,
    };
    let body = match parts.method.as_str() {
        "PUT" | "PATCH" => body,
        _ => Body::from(request::read_body(body).await?),
    };
    Ok((Request::from_parts(parts, body), destination))
}

/// The caller's files as a `dav-server` file system, for one request.
#[derive(Clone)]
pub struct RaftFs {
    state: AppState,
    /// What this request may remove or overwrite.
    fence: std::sync::Arc<Fence>,
    /// Whether the request's read barrier (with the caller's token checked after it) holds:
    /// passed, and nothing written by this request since. Every call after it reads the state
    /// as of then or later; a listing asks `dav-server`'s property calls once per entry, and
    /// they cost a point read each, not a barrier. A write clears it ([`RaftFs::wrote`]): on a
    /// follower the leader answers before this node applied the write, so the next call (a
    /// COPY's copy after its overwrite's delete) passes a barrier again and reads its own
    /// write.
    barrier: std::sync::Arc<tokio::sync::Mutex<bool>>,
    /// The caller's shared folders as the request first named them (one listing of
    /// `/Shared` per request, and one naming for all its paths).
    named: std::sync::Arc<std::sync::OnceLock<Vec<Share>>>,
}

/// The places one request may remove or overwrite, each checked whole before `dav-server`
/// starts ([`RaftFs::for_request`]): a DELETE's target, a MOVE's source, a MOVE's or COPY's
/// destination. Every call that removes or overwrites (`remove_file`, `remove_dir`,
/// `rename`, `copy`) must name a path at or under one of them, in the same namespace, or it
/// is refused: no path reaches a delete unchecked, whatever the library made of the request.
#[derive(Debug, Default)]
struct Fence {
    /// (namespace, path): never a namespace's root, `/Shared` or a folder marker.
    places: Vec<(String, String)>,
}

impl Fence {
    fn admits(&self, namespace_id: &str, path: &str) -> bool {
        self.places.iter().any(|(namespace, place)| {
            namespace == namespace_id
                && (path == place || path.strip_prefix(place.as_str()).is_some_and(|rest| rest.starts_with('/')))
        })
    }

    /// `Ok` where `(namespace_id, path)` may be removed or overwritten, else 403 (logged: it
    /// means the library asked for what the precheck did not see).
    fn check(&self, namespace_id: &str, path: &str) -> FsResult<()> {
        if self.admits(namespace_id, path) {
            return Ok(());
        }
        tracing::warn!(namespace_id, path, fence = ?self.places, "webdav: a change outside what the request was checked for was refused");
        Err(FsError::Forbidden)
    }
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

/// What a WebDAV path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// A path in a namespace (the caller's personal one, or a shared folder's), and whether
    /// the caller may change files there.
    Files { namespace_id: String, path: String, writable: bool },
    /// `/Shared`: the folder that lists the caller's shared folders.
    Shares,
}

/// A shared folder as WebDAV shows it under `/Shared/`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Share {
    name: String,
    namespace_id: String,
    writable: bool,
}

/// A shared folder's name as a path component: its name with `/` and control characters
/// made `_`; its id when that leaves nothing usable.
fn share_name(namespace: &raftbox_storage::records::Namespace) -> String {
    let cleaned: String = namespace.name.chars().map(|c| if c == '/' || c.is_control() { '_' } else { c }).collect();
    let cleaned = cleaned.trim();
    if cleaned.is_empty() || cleaned == "." || cleaned == ".." || cleaned.len() > 200 {
        namespace.id.clone()
    } else {
        cleaned.to_string()
    }
}

/// The shared folders as WebDAV names them: each by its name, unless another shared folder
/// of the caller has that name too, or the personal namespace has its own `/Shared/<name>`;
/// then every one of them with the end of its id after it (`Team (9f3c2a1b)`). No folder
/// hides another, and a name never moves from one folder to another: accepting a second
/// `Team` renames the first one's path (a client writing to the old one gets 409, never a
/// write into the other folder).
fn name_shares(accesses: Vec<raftbox_storage::sharing::Access>, personal: &str, taken: &[String]) -> Vec<Share> {
    let shared: Vec<_> = accesses.into_iter().filter(|a| a.namespace.id != personal).collect();
    let mut uses: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for access in &shared {
        *uses.entry(share_name(&access.namespace)).or_default() += 1;
    }
    let taken: std::collections::HashSet<&String> = taken.iter().collect();
    let mut shares: Vec<Share> = shared
        .into_iter()
        .map(|access| {
            let base = share_name(&access.namespace);
            let id = &access.namespace.id;
            let name = if uses.get(&base).copied().unwrap_or(0) > 1 || taken.contains(&base) {
                let tail: String = id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
                format!("{base} ({tail})")
            } else {
                base
            };
            Share { name, namespace_id: access.namespace.id, writable: access.role.can_write() }
        })
        .collect();
    // A folder named like another's suffixed name (`Team (9f3c2a1b)`) must not meet it: any
    // name still held twice, or by a personal entry, falls back to the folder's whole id
    // (ids are unique), until none is, so a path names one folder or none. Each round turns
    // at least one name into its id, so it ends.
    loop {
        let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for share in &shares {
            *counts.entry(share.name.clone()).or_default() += 1;
        }
        let clashes = |share: &Share| counts.get(&share.name).copied().unwrap_or(0) > 1 || taken.contains(&share.name);
        let clashing: Vec<usize> =
            (0..shares.len()).filter(|&i| clashes(&shares[i]) && shares[i].name != shares[i].namespace_id).collect();
        if clashing.is_empty() {
            return shares;
        }
        for i in clashing {
            shares[i].name = shares[i].namespace_id.clone();
        }
    }
}

impl RaftFs {
    /// What `path` names for the caller, after a read barrier (so what follows reads the
    /// state as of now): `/Shared/<name>/…` a shared folder's files, `/Shared` the list of
    /// them, anything else the personal namespace (its own `/Shared/<other>` included).
    async fn locate(&self, principal: &Principal, path: &DavPath) -> FsResult<Place> {
        let path = path_of(path)?;
        {
            let mut holds = self.barrier.lock().await;
            if !*holds {
                crate::access::barrier(&self.state, principal).await.map_err(fs_error)?;
                *holds = true;
            }
        }
        let shared_root = format!("/{SHARED_FOLDER}");
        if path == shared_root {
            return Ok(Place::Shares);
        }
        let personal =
            Place::Files { namespace_id: principal.user.namespace_id.clone(), path: path.clone(), writable: true };
        let Some(rest) = path.strip_prefix(&format!("{shared_root}/")) else {
            return Ok(personal);
        };
        let (name, inner) = rest.split_once('/').unwrap_or((rest, ""));
        match self.shares(principal)?.into_iter().find(|share| share.name == name) {
            Some(share) => Ok(Place::Files {
                namespace_id: share.namespace_id,
                path: format!("/{inner}"),
                writable: share.writable,
            }),
            None => Ok(personal),
        }
    }

    /// Like [`RaftFs::locate`], for a change: the namespace and path, or 403 where the caller
    /// may not change files (a viewer, the `/Shared` list).
    async fn locate_writable(&self, principal: &Principal, path: &DavPath) -> FsResult<(String, String)> {
        match self.locate(principal, path).await? {
            Place::Files { namespace_id, path, writable: true } => Ok((namespace_id, path)),
            _ => Err(FsError::Forbidden),
        }
    }

    /// The caller's shared folders, named (see [`name_shares`]).
    fn shares(&self, principal: &Principal) -> FsResult<Vec<Share>> {
        if let Some(named) = self.named.get() {
            return Ok(named.clone());
        }
        let sm = self.state.node.state();
        let personal = &principal.user.namespace_id;
        let own = sm
            .list_folder(personal, &format!("/{SHARED_FOLDER}/"), None, LISTING_ENTRIES_MAX, LISTING_WORK_MAX)
            .map_err(|e| fs_error(e.into()))?;
        let taken: Vec<String> = own
            .entries
            .into_iter()
            .map(|entry| match entry {
                FolderEntry::Folder { name } | FolderEntry::File { name, .. } => name,
            })
            .collect();
        let accesses = sm.namespaces_of(&principal.user.id).map_err(|e| fs_error(e.into()))?;
        let named = name_shares(accesses, personal, &taken);
        Ok(self.named.get_or_init(|| named).clone())
    }

    /// The file system for one request by `principal`, with its [`Fence`]: a DELETE, MOVE or
    /// COPY is checked whole before `dav-server` starts on it (it deletes an existing
    /// destination before it moves or copies, and walks folders itself, so what would be
    /// refused half-way must be refused here, with nothing changed). Refused: a change where
    /// the caller may not write; a namespace's root, `/Shared` or a folder marker as what is
    /// deleted, moved or overwritten; a folder of more than [`TREE_FILES_MAX`] live files as
    /// source or as the destination overwritten (507). The paths are the ones the library
    /// reads: the request's own (`target`), and `Destination` as [`checked`] parsed it.
    async fn for_request(
        state: &AppState,
        principal: &Principal,
        (method, target): (&str, &str),
        destination: Option<&DavPath>,
    ) -> FsResult<RaftFs> {
        let mut fs = RaftFs {
            state: state.clone(),
            fence: std::sync::Arc::default(),
            barrier: std::sync::Arc::default(),
            named: std::sync::Arc::default(),
        };
        if !matches!(method, "DELETE" | "MOVE" | "COPY") {
            return Ok(fs);
        }
        let dav_path = |path: &str| -> FsResult<DavPath> {
            let mut parsed = DavPath::new(path).map_err(|_| FsError::Forbidden)?;
            parsed.set_prefix(request::PREFIX).map_err(|_| FsError::Forbidden)?;
            Ok(parsed)
        };
        let target = dav_path(target)?;
        let source = fs.locate(principal, &target).await?;
        let protected = |place: &Place| match place {
            Place::Shares => true,
            Place::Files { path, .. } => path == "/" || is_marker(path),
        };
        let mut places = Vec::new();
        if method != "COPY" {
            // What is deleted or moved away.
            if protected(&source) || !matches!(source, Place::Files { writable: true, .. }) {
                return Err(FsError::Forbidden);
            }
        } else if matches!(source, Place::Shares) {
            return Err(FsError::Forbidden);
        }
        fs.within_tree_bound(&source)?;
        if let Place::Files { namespace_id, path, writable: true } = &source {
            if method != "COPY" {
                places.push((namespace_id.clone(), path.clone()));
            }
        }
        if let Some(destination) = destination {
            let to = fs.locate(principal, destination).await?;
            let Place::Files { namespace_id, path, writable: true } = &to else {
                return Err(FsError::Forbidden);
            };
            if protected(&to) {
                return Err(FsError::Forbidden);
            }
            fs.within_tree_bound(&to)?;
            places.push((namespace_id.clone(), path.clone()));
        }
        if places.iter().any(|(_, path)| path == "/" || is_marker(path)) {
            tracing::error!(?places, "webdav: a protected place reached the fence; the request is refused");
            return Err(FsError::Forbidden);
        }
        fs.fence = std::sync::Arc::new(Fence { places });
        Ok(fs)
    }

    /// 507 when `place` is a folder of more than [`TREE_FILES_MAX`] live files.
    fn within_tree_bound(&self, place: &Place) -> FsResult<()> {
        if let Place::Files { namespace_id, path, .. } = place {
            if self.lookup(namespace_id, path)?.is_some_and(|meta| meta.dir) {
                self.files_under(namespace_id, path)?;
            }
        }
        Ok(())
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
        let outcome = self.state.node.write(command).await;
        self.wrote().await;
        let outcome = outcome.map_err(|e| fs_error(e.into()))?;
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

    /// After a write of this request (whatever its outcome): the next call passes a read
    /// barrier again, so it sees the write even where this node has not applied it yet.
    async fn wrote(&self) {
        *self.barrier.lock().await = false;
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

    /// Commits the live file at `from` (in `from_namespace`) at `to` (in `to_namespace`), on
    /// whatever is there: the same blocks, no bytes copied.
    async fn copy_file(
        &self,
        principal: &Principal,
        (from_namespace, from): (&str, &str),
        (to_namespace, to): (&str, &str),
    ) -> FsResult<()> {
        let sm = self.state.node.state();
        let version = match sm.file_at(from_namespace, from).map_err(|e| fs_error(e.into()))? {
            Some((file, version)) if !file.deleted => version,
            _ => return Err(FsError::NotFound),
        };
        let base = self.current_version(to_namespace, to)?;
        let commit = FileCommit {
            chunks: version.chunks,
            size: version.size,
            mtime_ms: version.mtime_ms,
            executable: version.executable,
            ..Self::empty_commit(principal, to_namespace, file_path(to)?, base)
        };
        let commit = crate::routes::files::charged(&self.state, principal, commit);
        self.commit(Command::CommitFile(Box::new(commit))).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use raftbox_storage::records::{Namespace, NamespaceKind, Role};
    use raftbox_storage::sharing::Access;

    use super::*;

    fn access(id: &str, name: &str, role: Role) -> Access {
        let kind = if name.is_empty() { NamespaceKind::Personal } else { NamespaceKind::SharedFolder };
        let namespace = Namespace {
            id: id.into(),
            kind,
            owner_user_id: "u".into(),
            created_ms: 0,
            name: name.into(),
            counted: false,
            deleting: false,
        };
        Access { namespace, role }
    }

    #[test]
    fn a_shared_folders_name_never_moves_to_another_folder() {
        let names = |accesses, taken: &[String]| -> Vec<String> {
            name_shares(accesses, "personal", taken).into_iter().map(|s| s.name).collect()
        };
        // One Team: its own name; the personal namespace is not a share.
        let one = vec![access("personal", "", Role::Owner), access("ns-bbbbbbbb", "Team", Role::Viewer)];
        assert_eq!(names(one, &[]), ["Team"]);
        // A second Team, whatever its id's order: both carry their ids, so "Team" names
        // neither (a client's path to the first fails rather than writing into the second).
        let two = vec![access("ns-aaaaaaaa", "Team", Role::Editor), access("ns-bbbbbbbb", "Team", Role::Viewer)];
        assert_eq!(names(two, &[]), ["Team (aaaaaaaa)", "Team (bbbbbbbb)"]);
        // The personal namespace's own /Shared/Team keeps its name.
        let mine = vec![access("ns-bbbbbbbb", "Team", Role::Viewer)];
        assert_eq!(names(mine, &["Team".to_string()]), ["Team (bbbbbbbb)"]);
        // A folder named like another's suffixed name meets it nowhere: both fall back to ids.
        let mimic = vec![
            access("ns-aaaaaaaa", "Team", Role::Editor),
            access("ns-bbbbbbbb", "Team", Role::Editor),
            access("ns-evilevil", "Team (bbbbbbbb)", Role::Owner),
        ];
        assert_eq!(names(mimic, &[]), ["Team (aaaaaaaa)", "ns-bbbbbbbb", "ns-evilevil"]);
        // A name that cannot be a path component is replaced by the id.
        let odd = vec![access("ns-cccccccc", "a/b", Role::Viewer), access("ns-dddddddd", "..", Role::Viewer)];
        assert_eq!(names(odd, &[]), ["a_b", "ns-dddddddd"]);
    }
}
