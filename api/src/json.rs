//! Request bodies: JSON parsed into typed requests, every failure a 400 problem.

use axum::body::Bytes;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// Parses a JSON request body; bad JSON or a wrong shape is a 400. The Content-Type is not
/// checked, so `curl -d '{...}'` works as typed.
pub fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
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
