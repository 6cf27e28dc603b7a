//! Records stored in the state column family, one struct per table.

use serde::{Deserialize, Serialize};

/// Text that must not show in logs (its `Debug` prints no part of it); serialized as is.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretText(…)")
    }
}

/// A user's webhook signing secret (Standard Webhooks: `whsec_` and the base64 of the key),
/// and during a rotation the one before it, which still signs until `previous_until_ms`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecret {
    pub secret: String,
    pub created_ms: u64,
    pub previous: Option<String>,
    pub previous_until_ms: u64,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSecret").field("created_ms", &self.created_ms).finish_non_exhaustive()
    }
}

impl WebhookSecret {
    /// The secrets that sign at `now_ms`: the current one, and the previous one until its
    /// time is up.
    pub fn signing(&self, now_ms: u64) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let Some(previous) = self.previous.as_deref().filter(|_| now_ms < self.previous_until_ms) {
            secrets.push(previous);
        }
        secrets
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: String,
    pub name: String,
    pub namespace_id: String,
    pub admin: bool,
    pub created_ms: u64,
    /// The groups the user belongs to (kept here so a permission check is point reads).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Raised by every password change that ends sessions (format 5): a login session made
    /// under an earlier one stops working.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub password_epoch: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
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
    /// A login session's: the user's `password_epoch` when it was made; it works only while
    /// that is still the user's (format 5). `None`: any other token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_epoch: Option<u64>,
}

impl Token {
    /// Whether the token still works for `user` as far as passwords go (expiry aside).
    pub fn current_for(&self, user: &User) -> bool {
        self.password_epoch.is_none_or(|epoch| epoch == user.password_epoch)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NamespaceKind {
    /// A user's own tree; its owner is `owner_user_id`, nobody else has access.
    Personal,
    /// A folder shared through its ACL; `owner_user_id` is its creator.
    SharedFolder,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub id: String,
    pub kind: NamespaceKind,
    pub owner_user_id: String,
    pub created_ms: u64,
    /// A shared folder's name (empty for a personal namespace).
    #[serde(default)]
    pub name: String,
    /// In its creator's count of folders (`keys::folders_created`): made by a command with
    /// a folder quota, so folders from before the count neither raise it nor lower it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Deleted: gone for everyone (`sharing::role` answers none) while its records are
    /// removed a bounded step at a time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// A permission on a namespace; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads files, history, blocks and the ACL; syncs.
    Viewer,
    /// Also commits, restores, moves and deletes files.
    Editor,
    /// Also manages the ACL and deletes the folder.
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Owner => "owner",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "viewer" => Some(Role::Viewer),
            "editor" => Some(Role::Editor),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }

    /// May change files (commit, restore, move, delete).
    pub fn can_write(self) -> bool {
        self >= Role::Editor
    }
}

/// Who an ACL entry names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Grantee {
    User(String),
    Group(String),
}

impl Grantee {
    /// The form used inside keys: `u:<id>` or `g:<id>`.
    pub fn key(&self) -> String {
        match self {
            Grantee::User(id) => format!("u:{id}"),
            Grantee::Group(id) => format!("g:{id}"),
        }
    }
}

/// One ACL entry: `grantee` holds `role` on `namespace_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclEntry {
    pub namespace_id: String,
    pub grantee: Grantee,
    pub role: Role,
    pub granted_ms: u64,
    /// An invitation not yet accepted: it grants nothing ([`crate::sharing::role`] skips
    /// it) and is indexed under the grantee's invitations, not their folders. Entries from
    /// before invitations existed have none (accepted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// A group of users (managed by the admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub id: String,
    pub name: String,
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
    /// The term whose leader decided this key in memory (`Command::RateSet`); 0 for a
    /// state written by a `RateCheck`.
    #[serde(default)]
    pub charged_term: u64,
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

/// An entry of a namespace's change feed: the file and its version at that sequence. That
/// version is the file's latest (writing a newer one deletes the older entry), so a sync page
/// is one range scan with no point reads. Entries written before this record existed hold
/// the file id alone (a JSON string); readers look those up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    pub file_id: String,
    pub version: VersionRecord,
}

/// One committed version of a file (append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub version: u64,
    pub path: crate::paths::FilePath,
    pub chunks: Vec<crate::blocks::BlockHash>,
    pub size: u64,
    pub mtime_ms: u64,
    /// See [`crate::command::FileCommit::executable`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    pub device: String,
    pub created_ms: u64,
    pub deleted: bool,
    pub seq: u64,
}
