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
    // Every body is an object (or `null` where a body is optional): serde would otherwise
    // take an array for a struct, its fields by position.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::BadRequest("the JSON body is an object, not an array".into()));
    }
    let bad = |e: serde_json::Error| ApiError::BadRequest(format!("invalid JSON body: {e}"));
    match serde_json::from_slice(body) {
        Ok(parsed) => Ok(parsed),
        // JSON has one number type: `7.0` is the integer 7 (as JSON Schema's `integer` says),
        // which serde takes only as written `7`. Read again with such numbers made integers,
        // only on this rare path (a commit's 100,000 chunks are read straight, above).
        Err(first) => {
            let mut value: serde_json::Value = serde_json::from_slice(body).map_err(bad)?;
            if !integral_floats_to_integers(&mut value) {
                return Err(bad(first));
            }
            serde_json::from_value(value).map_err(bad)
        }
    }
}

/// Makes every float with no fraction an integer (within ±2^53, exact in an f64); whether
/// any changed.
fn integral_floats_to_integers(value: &mut serde_json::Value) -> bool {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        serde_json::Value::Number(n) if !n.is_i64() && !n.is_u64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() <= EXACT => {
                *value = if f < 0.0 { serde_json::Value::from(f as i64) } else { serde_json::Value::from(f as u64) };
                true
            }
            _ => false,
        },
        serde_json::Value::Array(items) => items.iter_mut().fold(false, |any, v| integral_floats_to_integers(v) | any),
        serde_json::Value::Object(map) => map.values_mut().fold(false, |any, v| integral_floats_to_integers(v) | any),
        _ => false,
    }
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
