//! The one error type of the storage crate.

/// Everything that can go wrong between a node and its disk.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("decode {what}: {source}")]
    Decode { what: &'static str, source: serde_json::Error },
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Data in a newer format than this code reads (see [`crate::format`]): the message
    /// says which and what to do.
    #[error("{0}")]
    TooNew(String),
}

impl StorageError {
    pub(crate) fn decode(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| StorageError::Decode { what, source }
    }
}
