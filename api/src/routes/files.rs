//! The metadata API: commit, read, history, restore, delete and folder listing of files.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/files/commit` | a new version (conflict rules of DESIGN.md §4); keyed |
//! | `GET /v1/files?path=` | the current version |
//! | `GET /v1/files/history?path=` | every kept version, newest first (paginated) |
//! | `POST /v1/files/restore` | a new version with an old version's content; keyed |
//! | `POST /v1/files/delete` | a tombstone version; keyed |
//! | `POST /v1/files/move` | rename: a new version at `to`, a tombstone at `from`; keyed |
//! | `GET /v1/files/list?path=/folder/` | files and subfolders directly in a folder (paginated) |
//!
//! Every call takes an optional `namespaceId` (query or body); the default is the caller's
//! personal namespace. Reads ask [`crate::access`] (a namespace the caller cannot read is
//! 404); changes carry the caller as their actor and apply judges them (a viewer's is 403).

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use raftbox_storage::blocks::BlockHash;
use raftbox_storage::command::{FileCommit, FileMove};
use raftbox_storage::files::{FolderEntry, FolderPage};
use raftbox_storage::paths::FilePath;
use raftbox_storage::records::{FileRecord, VersionRecord};
use raftbox_storage::schedule::{format_utc, parse_signed_ms};
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::{new_id, page_limit, read_state, LISTING_WORK_MAX, PAGE_DEFAULT, PAGE_MAX};
use crate::access;
use crate::auth::Principal;
use crate::error::ConflictedCopy;
use crate::idempotency::Keyed;
use crate::{json, ApiError, AppState};

/// Longest `X-Device-Id`, in characters.
pub const DEVICE_CHARS_MAX: usize = 64;
/// Chunks in one file version, at most.
pub const FILE_CHUNKS_MAX: usize = 100_000;

pub(crate) fn parse_path(text: &str) -> Result<FilePath, ApiError> {
    FilePath::parse(text).map_err(|e| ApiError::BadRequest(format!("path {text:?}: {e}")))
}

/// The optional `X-Device-Id` header of the routes that may make a conflicted copy
/// (`params(DeviceHeader)`), read by [`device`].
pub struct DeviceHeader;

impl utoipa::IntoParams for DeviceHeader {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![crate::idempotency::header_param(
            "X-Device-Id",
            "The device named in conflicted copies; default: the token's name.",
            utoipa::openapi::Ref::from_schema_name("DeviceName"),
        )]
    }
}

/// The device named in conflicted copies: `X-Device-Id`, else the token's name (which the
/// state machine sanitises when it names a copy: any token name is safe).
pub(crate) fn device(headers: &HeaderMap, principal: &Principal) -> Result<String, ApiError> {
    match headers.get("x-device-id") {
        None => Ok(principal.token_name.clone()),
        Some(value) => {
            let device = value.to_str().map_err(|_| ApiError::BadRequest("X-Device-Id must be ASCII".into()))?;
            let printable = device.chars().all(|c| !c.is_control() && c != '/');
            if device.trim().is_empty() || device.chars().count() > DEVICE_CHARS_MAX || !printable {
                return Err(ApiError::BadRequest(format!(
                    "X-Device-Id must be 1 to {DEVICE_CHARS_MAX} printable characters, no '/'"
                )));
            }
            Ok(device.to_string())
        }
    }
}

/// A modification time as sent: an RFC 3339 timestamp (the spec's form) or integer Unix
/// milliseconds. Answers always carry the RFC 3339 UTC form with milliseconds.
pub(crate) fn parse_mtime(value: &serde_json::Value) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "mtime is an RFC 3339 timestamp or Unix milliseconds (0 to {})",
            crate::schema::MTIME_MS_MAX
        ))
    };
    match value {
        // `1.7e12` is an integer to JSON Schema too: any number without a fraction.
        serde_json::Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
            .filter(|ms| *ms <= crate::schema::MTIME_MS_MAX)
            .ok_or_else(bad),
        serde_json::Value::String(text) => match parse_signed_ms(text) {
            Err(e) => Err(ApiError::BadRequest(format!("mtime: {e}"))),
            Ok(ms) => u64::try_from(ms)
                .ok()
                .filter(|ms| *ms <= crate::schema::MTIME_MS_MAX)
                .ok_or_else(|| ApiError::Unprocessable(format!("mtime {text:?} is before 1970 or after 9999"))),
        },
        _ => Err(bad()),
    }
}

/// A commit of no content at `path` on `base_version`, with fresh ids; callers fill in the
/// rest with struct update syntax.
pub(crate) fn empty_commit(
    principal: &Principal,
    namespace_id: String,
    path: FilePath,
    base_version: u64,
    device: String,
) -> FileCommit {
    FileCommit {
        actor_user_id: principal.user.id.clone(),
        namespace_id,
        path,
        chunks: Vec::new(),
        size: 0,
        mtime_ms: 0,
        executable: false,
        base_version,
        deleted: false,
        device,
        new_file_id: new_id(),
        copy_file_id: new_id(),
        quota_bytes: None,
    }
}

/// The cluster format from which a commit charges the blocks it names to its author.
pub const REFERENCE_CHARGE_FORMAT: u32 = 5;

/// `commit` as proposed by `principal`: charging the blocks it names to a non-admin's quota,
/// once every node does so (a rolling upgrade proposes as before).
pub(crate) fn charged(state: &AppState, principal: &Principal, mut commit: FileCommit) -> FileCommit {
    if !principal.user.admin && state.node.cluster_format() >= REFERENCE_CHARGE_FORMAT {
        commit.quota_bytes = Some(state.limits.get().quotas.stored_bytes_per_user);
    }
    commit
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CommitRequest {
    #[schema(value_type = crate::schema::FilePath)]
    pub path: String,
    /// Decoded as they are read (no string per chunk: a commit may name 100,000).
    #[schema(value_type = Vec<crate::schema::BlockHash>, max_items = 100_000)]
    pub chunks: Vec<BlockHash>,
    #[serde(deserialize_with = "crate::json::integer")]
    pub base_version: u64,
    #[serde(deserialize_with = "crate::json::integer")]
    pub size: u64,
    #[schema(value_type = crate::schema::Mtime)]
    pub mtime: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
    /// A tombstone: then `chunks` is empty (else 422).
    #[serde(default)]
    pub deleted: bool,
    /// The file is executable (its owner's execute bit); default false.
    #[serde(default)]
    pub executable: bool,
}

/// A committed version (201), or the current one when the content equalled it (200,
/// `unchanged`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileCommitted {
    pub file_id: String,
    pub version: u64,
    /// The content equalled the current version: nothing was written; absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub unchanged: bool,
}

/// The answer to a commit, from its outcome (also on an idempotent replay).
pub(crate) fn render_commit(outcome: Outcome) -> Result<Response, ApiError> {
    match outcome {
        Outcome::FileCommitted { file_id, version, unchanged: false } => {
            Ok((StatusCode::CREATED, Json(FileCommitted { file_id, version, unchanged: false })).into_response())
        }
        Outcome::FileCommitted { file_id, version, unchanged: true } => {
            Ok(Json(FileCommitted { file_id, version, unchanged: true }).into_response())
        }
        Outcome::FileConflict { current_version, copy } => Err(ApiError::CommitConflict {
            current_version,
            conflicted_copy: copy.map(|c| ConflictedCopy {
                path: c.path.as_str().to_string(),
                file_id: c.file_id,
                version: c.version,
            }),
        }),
        Outcome::Rejected(rejection) => Err(rejection.into()),
        other => Err(ApiError::Internal(format!("unexpected outcome {other:?}"))),
    }
}

async fn propose_commit(
    state: &AppState,
    principal: &Principal,
    keyed: Keyed,
    commit: FileCommit,
) -> Result<Response, ApiError> {
    let commit = charged(state, principal, commit);
    keyed.write_with(state, principal, Command::CommitFile(Box::new(commit)), render_commit).await
}

/// Bytes of a commit body decoded on the request's own task; a larger one is decoded off the
/// async workers.
const BODY_PARSED_INLINE_BYTES_MAX: usize = 16 * 1024;

/// Chunks one look at the local index checks on the request's own task; more are checked
/// off the async workers.
const CHUNKS_CHECKED_INLINE_MAX: usize = 64;

/// Absent chunks a refused commit lists, at most: the client uploads them and commits again
/// (or asks `POST /v1/blocks/status` first, as raftbox's clients do).
pub const MISSING_REPORTED_MAX: usize = 1_000;

/// Refuses (422 `missing-chunks`) a commit naming blocks the cluster's index lacks, before
/// it becomes an entry every node applies: a hopeless commit (15,000 random hashes, say)
/// costs this node a point read per distinct chunk up to the [`MISSING_REPORTED_MAX`]th
/// absent one (at most `FILE_CHUNKS_MAX`), not the cluster a large entry. A block absent here is looked for again after a read barrier
/// (it may have been registered through another node an instant ago). Apply judges again,
/// readability included: its answer is the one that counts.
async fn refuse_absent_chunks(state: &AppState, chunks: &[BlockHash]) -> Result<(), ApiError> {
    fn absent(sm: &raftbox_storage::StateMachine, chunks: &[BlockHash]) -> Result<Vec<BlockHash>, ApiError> {
        let (mut out, mut seen) = (Vec::new(), std::collections::HashSet::new());
        for hash in chunks {
            if seen.insert(*hash) && sm.chunk(hash)?.is_none() {
                out.push(*hash);
                if out.len() == MISSING_REPORTED_MAX {
                    break;
                }
            }
        }
        Ok(out)
    }
    async fn look(state: &AppState, chunks: Vec<BlockHash>) -> Result<Vec<BlockHash>, ApiError> {
        if chunks.len() <= CHUNKS_CHECKED_INLINE_MAX {
            return absent(state.node.state(), &chunks);
        }
        super::read_state(state, move |sm| absent(sm, &chunks)).await
    }
    if chunks.is_empty() {
        return Ok(());
    }
    let missing = look(state, chunks.to_vec()).await?;
    if missing.is_empty() {
        return Ok(());
    }
    state.node.read_barrier().await?;
    let missing = look(state, missing).await?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::MissingChunks(missing.iter().map(|h| h.to_hex()).collect()))
}

pub async fn commit(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    fn parse(body: &axum::body::Bytes) -> Result<(CommitRequest, Vec<BlockHash>), ApiError> {
        let request: CommitRequest = json::parse(body)?;
        if request.chunks.len() > FILE_CHUNKS_MAX {
            return Err(ApiError::BadRequest(format!("a file has at most {FILE_CHUNKS_MAX} chunks")));
        }
        if request.deleted && !request.chunks.is_empty() {
            return Err(ApiError::Unprocessable("a deletion has no chunks".into()));
        }
        let mut request = request;
        let chunks = std::mem::take(&mut request.chunks);
        Ok((request, chunks))
    }
    // A large body (a file of thousands of chunks) is decoded off the async workers, which
    // every other request on this node shares.
    let (request, chunks) = if keyed.body.len() <= BODY_PARSED_INLINE_BYTES_MAX {
        parse(&keyed.body)?
    } else {
        let body = keyed.body.clone();
        tokio::task::spawn_blocking(move || parse(&body))
            .await
            .map_err(|e| ApiError::Internal(format!("decoding a commit failed: {e}")))??
    };
    refuse_absent_chunks(&state, &chunks).await?;
    let namespace_id = access::resolve(&principal, request.namespace_id.as_deref());
    let commit = FileCommit {
        chunks,
        size: request.size,
        mtime_ms: parse_mtime(&request.mtime)?,
        executable: request.executable && !request.deleted,
        deleted: request.deleted,
        ..empty_commit(
            &principal,
            namespace_id,
            parse_path(&request.path)?,
            request.base_version,
            device(&headers, &principal)?,
        )
    };
    propose_commit(&state, &principal, keyed, commit).await
}

/// A file: `GET /v1/files`, `GET /v1/files/content`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    #[param(value_type = crate::schema::FilePath)]
    pub(crate) path: String,
    /// Default: the caller's personal namespace.
    pub(crate) namespace_id: Option<String>,
}

/// A file's versions, a page of them: `GET /v1/files/history`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    #[param(value_type = crate::schema::FilePath)]
    path: String,
    /// Default: the caller's personal namespace.
    namespace_id: Option<String>,
    /// Versions per page: default 100, at most 1,000 (a larger one is cut to 1,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    limit: Option<u32>,
    #[param(value_type = Option<crate::schema::SeqPageToken>)]
    page_token: Option<String>,
}

/// A folder, a page of its entries: `GET /v1/files/list`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct FolderQuery {
    #[param(value_type = crate::schema::FolderPath)]
    path: String,
    /// Default: the caller's personal namespace.
    namespace_id: Option<String>,
    /// Entries per page: default 100, at most 1,000 (a larger one is cut to 1,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    limit: Option<u32>,
    /// The `nextPageToken` of the page before: the page goes on after it, in the folder's
    /// order (any text is a place in that order).
    page_token: Option<String>,
}

/// One kept version of a file.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionView {
    pub version: u64,
    /// The content's blocks, in order (BLAKE3, hex).
    pub chunks: Vec<String>,
    pub size: u64,
    /// RFC 3339.
    pub mtime: String,
    /// The file is executable; absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub executable: bool,
    pub device: String,
    pub created_at: String,
    /// A tombstone (the file was deleted); absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub deleted: bool,
}

/// A file's current version.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileView {
    pub file_id: String,
    pub namespace_id: String,
    pub path: String,
    pub version: u64,
    pub chunks: Vec<String>,
    pub size: u64,
    /// RFC 3339.
    pub mtime: String,
    pub executable: bool,
}

/// A file's kept versions, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileHistory {
    pub file_id: String,
    pub path: String,
    pub versions: Vec<VersionView>,
    /// Present when more may follow: the `pageToken` of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub next_page_token: Option<String>,
}

/// An entry of a folder: a file or a subfolder.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FolderEntryView {
    #[serde(rename_all = "camelCase")]
    File {
        name: String,
        file_id: String,
        version: u64,
        size: u64,
    },
    Folder {
        name: String,
    },
}

/// The files and subfolders directly in a folder, by name.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FolderListing {
    pub path: String,
    pub entries: Vec<FolderEntryView>,
    /// Present when more may follow: the `pageToken` of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub next_page_token: Option<String>,
}

impl From<&VersionRecord> for VersionView {
    fn from(v: &VersionRecord) -> VersionView {
        VersionView {
            version: v.version,
            chunks: v.chunks.iter().map(BlockHash::to_hex).collect(),
            size: v.size,
            mtime: format_utc(v.mtime_ms),
            executable: v.executable,
            device: v.device.clone(),
            created_at: format_utc(v.created_ms),
            deleted: v.deleted,
        }
    }
}

/// The live file at `path` (after a read barrier), or 404.
async fn live_file(
    state: &AppState,
    principal: &Principal,
    query: &PathQuery,
) -> Result<(FileRecord, VersionRecord), ApiError> {
    let namespace_id = access::resolve(principal, query.namespace_id.as_deref());
    let path = parse_path(&query.path)?;
    access::read(state, principal, &namespace_id).await?;
    match state.node.state().file_at(&namespace_id, path.as_str())? {
        Some((file, version)) if !file.deleted => Ok((file, version)),
        _ => Err(ApiError::NotFound(format!("no file at {path}"))),
    }
}

pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PathQuery>,
) -> Result<Json<FileView>, ApiError> {
    let (file, version) = live_file(&state, &principal, &query).await?;
    let view = VersionView::from(&version);
    Ok(Json(FileView {
        path: file.path.as_str().to_string(),
        file_id: file.id,
        namespace_id: file.namespace_id,
        version: view.version,
        chunks: view.chunks,
        size: view.size,
        mtime: view.mtime,
        executable: view.executable,
    }))
}

pub async fn history(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<HistoryQuery>,
) -> Result<Json<FileHistory>, ApiError> {
    let namespace_id = access::resolve(&principal, query.namespace_id.as_deref());
    let path = parse_path(&query.path)?;
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    let below = match &query.page_token {
        None => u64::MAX,
        Some(token) => super::seq_token(token)?,
    };
    access::read(&state, &principal, &namespace_id).await?;
    read_state(&state, move |sm| {
        let (file, _) = sm
            .file_at(&namespace_id, path.as_str())?
            .ok_or_else(|| ApiError::NotFound(format!("no file at {path}")))?;
        let versions = sm.versions_page(&file.id, below, limit + 1)?;
        Ok(Json(FileHistory {
            path: file.path.as_str().to_string(),
            file_id: file.id,
            versions: versions.iter().take(limit).map(VersionView::from).collect(),
            next_page_token: (versions.len() > limit).then(|| versions[limit - 1].version.to_string()),
        }))
    })
    .await
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RestoreRequest {
    #[schema(value_type = crate::schema::FilePath)]
    pub path: String,
    #[serde(deserialize_with = "crate::json::integer")]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
}

/// A new version with the content of an old one (based on the current version).
pub async fn restore(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    let request: RestoreRequest = json::parse(&keyed.body)?;
    let namespace_id = access::resolve(&principal, request.namespace_id.as_deref());
    let path = parse_path(&request.path)?;
    if !access::read(&state, &principal, &namespace_id).await?.can_write() {
        return Err(ApiError::Forbidden("a viewer cannot change files".into()));
    }
    let (file, _) = state
        .node
        .state()
        .file_at(&namespace_id, path.as_str())?
        .ok_or_else(|| ApiError::NotFound(format!("no file at {path}")))?;
    let old = state
        .node
        .state()
        .version(&file.id, request.version)?
        .filter(|v| !v.deleted)
        .ok_or_else(|| ApiError::NotFound(format!("{path} has no version {} to restore", request.version)))?;
    let commit = FileCommit {
        chunks: old.chunks,
        size: old.size,
        mtime_ms: old.mtime_ms,
        executable: old.executable,
        ..empty_commit(&principal, namespace_id, path, file.current_version, device(&headers, &principal)?)
    };
    propose_commit(&state, &principal, keyed, commit).await
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteRequest {
    #[schema(value_type = crate::schema::FilePath)]
    pub path: String,
    #[serde(deserialize_with = "crate::json::integer")]
    pub base_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
}

/// A tombstone version (it syncs as `deleted: true`); same conflict rules as a commit.
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    let request: DeleteRequest = json::parse(&keyed.body)?;
    let namespace_id = access::resolve(&principal, request.namespace_id.as_deref());
    let commit = FileCommit {
        deleted: true,
        ..empty_commit(
            &principal,
            namespace_id,
            parse_path(&request.path)?,
            request.base_version,
            device(&headers, &principal)?,
        )
    };
    propose_commit(&state, &principal, keyed, commit).await
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MoveRequest {
    #[schema(value_type = crate::schema::FilePath)]
    pub from: String,
    #[schema(value_type = crate::schema::FilePath)]
    pub to: String,
    #[serde(deserialize_with = "crate::json::integer")]
    pub base_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
}

/// Moves (renames) a file; 409 if `from` changed since `baseVersion` or `to` is taken.
pub async fn move_file(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    let request: MoveRequest = json::parse(&keyed.body)?;
    let request = FileMove {
        namespace_id: access::resolve(&principal, request.namespace_id.as_deref()),
        from: parse_path(&request.from)?,
        to: parse_path(&request.to)?,
        base_version: request.base_version,
        device: device(&headers, &principal)?,
        new_file_id: new_id(),
        actor_user_id: principal.user.id.clone(),
    };
    keyed.write_with(&state, &principal, Command::MoveFile(Box::new(request)), render_commit).await
}

/// Where a listing of `folder` goes on after `token`: any text is a place in the folder's
/// order. `None` when it is past the folder's end (an empty page); `Some(None)` before its
/// start.
pub(crate) fn folder_position<'t>(folder: &str, token: Option<&'t str>) -> Option<Option<&'t str>> {
    match token {
        Some(token) if token.starts_with(folder) => Some(Some(token)),
        Some(token) if token > folder => None,
        _ => Some(None),
    }
}

/// Files and subfolders directly in a folder (`path` ends with `/`), by name.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<FolderQuery>,
) -> Result<Json<FolderListing>, ApiError> {
    let namespace_id = access::resolve(&principal, query.namespace_id.as_deref());
    let folder = query.path.as_str();
    if folder != "/" && (!folder.ends_with('/') || FilePath::parse(&folder[..folder.len() - 1]).is_err()) {
        return Err(ApiError::BadRequest("path must be a folder: '/' or an absolute path ending in '/'".into()));
    }
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    access::read(&state, &principal, &namespace_id).await?;
    let (folder, token) = (folder.to_string(), query.page_token.clone());
    read_state(&state, move |sm| {
        let page = match folder_position(&folder, token.as_deref()) {
            Some(after) => sm.list_folder(&namespace_id, &folder, after, limit, LISTING_WORK_MAX)?,
            None => FolderPage::default(),
        };
        let entries = page
            .entries
            .into_iter()
            .map(|entry| match entry {
                FolderEntry::Folder { name } => FolderEntryView::Folder { name },
                FolderEntry::File { name, file, version } => {
                    FolderEntryView::File { name, file_id: file.id, version: file.current_version, size: version.size }
                }
            })
            .collect();
        Ok(Json(FolderListing { path: folder, entries, next_page_token: page.next }))
    })
    .await
}
