//! Request bodies: JSON parsed into typed requests, every failure a 400 problem.

use axum::body::Bytes;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// How deeply a request body may nest arrays and objects. Far below what every node's decoder
/// takes of a log entry (`raftbox_storage::command::DECODER_DEPTH_MAX`, with the entry's own
/// levels around a command): every free-form value — a job's payload, above all — reaches the
/// log inside a request body, so none can ever make an entry a follower refuses.
pub const JSON_DEPTH_MAX: usize = 32;

/// Parses a JSON request body; bad JSON, a wrong shape or nesting deeper than
/// [`JSON_DEPTH_MAX`] is a 400. The Content-Type is not checked, so `curl -d '{...}'` works
/// as typed.
pub fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let depth = raftbox_storage::command::json_depth(body);
    if depth > JSON_DEPTH_MAX {
        return Err(ApiError::BadRequest(format!(
            "the JSON body nests {depth} levels deep; at most {JSON_DEPTH_MAX} are accepted"
        )));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

/// Length limit of user and token names, in characters.
pub const NAME_CHARS_MAX: usize = 64;

/// A display name: 1 to [`NAME_CHARS_MAX`] characters, no control characters, not blank.
pub fn name(field: &str, value: &str) -> Result<String, ApiError> {
    let chars = value.chars().count();
    if value.trim().is_empty() || chars > NAME_CHARS_MAX || value.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(format!(
            "{field} must be 1 to {NAME_CHARS_MAX} characters without control characters"
        )));
    }
    Ok(value.to_string())
}
