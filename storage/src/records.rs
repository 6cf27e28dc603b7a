//! Records stored in the state column family, one struct per table.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: String,
    pub name: String,
    pub namespace_id: String,
    pub admin: bool,
    pub created_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub created_ms: u64,
    /// When the token stops working (Unix ms); `None`: never.
    #[serde(default)]
    pub expires_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NamespaceKind {
    Personal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub id: String,
    pub kind: NamespaceKind,
    pub owner_user_id: String,
    pub created_ms: u64,
}

/// An HTTP response saved for idempotent replay; opaque to storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// What a finished idempotent request produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum IdempotencyResult {
    Response(SavedResponse),
    Rejected(crate::Rejection),
    /// The command's outcome, for routes whose answer is rendered from it.
    Outcome(Box<crate::Outcome>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IdempotencyStatus {
    InProgress { lease_until_ms: u64 },
    Done { result: IdempotencyResult },
}

/// An idempotency record: key scope (the record id), body fingerprint, status, expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    pub fingerprint: [u8; 32],
    pub status: IdempotencyStatus,
    pub created_ms: u64,
    pub expires_ms: u64,
}

/// Rate-limiter state of one key, and when it becomes indistinguishable from no state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateRecord {
    pub state: crate::ratelimit::LimitState,
    pub idle_at_ms: u64,
}

/// A chunk index entry: a block the cluster holds durably on a majority of nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub size: u64,
    /// Committed file versions that reference the block.
    pub refcount: u64,
    pub created_ms: u64,
    /// When the refcount last became 0 (or the chunk was registered): its orphan-index time.
    pub orphan_since_ms: u64,
}

/// The answer a conflicting commit got, kept for a while so that a retry of the same commit
/// (path, chunks, base version, device) gets the same answer instead of a second copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictRecord {
    pub current_version: u64,
    pub copy: crate::command::ConflictedCopy,
    pub expires_ms: u64,
}

/// A file: its place and its latest version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub id: String,
    pub namespace_id: String,
    pub path: crate::paths::FilePath,
    pub current_version: u64,
    pub deleted: bool,
    /// Sequence of the file's latest change in its namespace's feed.
    pub seq: u64,
}

/// One committed version of a file (append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub version: u64,
    pub path: crate::paths::FilePath,
    pub chunks: Vec<crate::blocks::BlockHash>,
    pub size: u64,
    pub mtime_ms: u64,
    pub device: String,
    pub created_ms: u64,
    pub deleted: bool,
    pub seq: u64,
}
