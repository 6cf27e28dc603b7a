//! The error types of the raft crate.

/// Why a proposed write has no outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// No leader could be reached before the deadline; the write was not applied.
    #[error("no leader available: {0}")]
    Unavailable(String),
    /// The write may or may not have been applied (the leader failed mid-write).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// This node is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
    /// The commands encode to more than one log entry may hold; nothing was proposed.
    #[error("the request makes a log entry of {bytes} bytes; at most {max} are allowed")]
    TooLarge { bytes: usize, max: usize },
    /// The commands could not be encoded; nothing was proposed.
    #[error("invalid command: {0}")]
    Invalid(String),
    /// The command needs a newer data format than the cluster's (a node still runs an older
    /// release); nothing was proposed.
    #[error(
        "this needs data format {needs}, but the cluster is at format {current}: every node must run a raftbox \
         that reads format {needs} first (docs/operations.md, \"Upgrading\")"
    )]
    FormatNotReached { needs: u32, current: u32 },
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Storage(#[from] raftbox_storage::StorageError),
    /// openraft's storage, configuration or core failed (described: its types stay inside
    /// this crate).
    #[error("raft: {0}")]
    Raft(String),
    #[error("bootstrap: {0}")]
    Bootstrap(String),
}

impl StartError {
    /// An openraft failure (storage, configuration or core), described.
    pub(crate) fn raft(e: impl std::fmt::Display) -> StartError {
        StartError::Raft(e.to_string())
    }
}
