//! The replicated commands and their outcomes: what a Raft log entry carries.
//!
//! A log entry holds one [`Batch`]: the commands that arrived while the previous entry was in
//! flight, stamped with the proposing leader's clock. Ids (uuid strings) are generated before
//! proposing and travel inside the commands, so `apply` stays deterministic.

use serde::{Deserialize, Serialize};

/// One log entry's worth of commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Batch {
    /// The leader's wall clock when it proposed this batch, Unix milliseconds.
    pub now_ms: u64,
    pub commands: Vec<Command>,
}

/// A state change. Each variant is applied atomically with the rest of its batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Creates a user and its personal namespace. User names are unique.
    CreateUser {
        user_id: String,
        namespace_id: String,
        name: String,
    },
    /// Creates a bearer token for a user. Only the blake3 hash of the secret is stored.
    CreateToken {
        token_id: String,
        user_id: String,
        name: String,
        token_hash: [u8; 32],
    },
    /// Makes sure an admin user holding this token exists (idempotent: every node that is
    /// configured with the admin token proposes it once at start).
    EnsureAdmin {
        user_id: String,
        namespace_id: String,
        token_id: String,
        token_hash: [u8; 32],
    },
}

/// The result of one command, in the order of the batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    UserCreated {
        user_id: String,
        namespace_id: String,
    },
    TokenCreated {
        token_id: String,
    },
    AdminReady {
        user_id: String,
    },
    Rejected(Rejection),
}

/// A command that was applied but changed nothing, and why. Deterministic on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Rejection {
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("not found: {0}")]
    NotFound(String),
}
