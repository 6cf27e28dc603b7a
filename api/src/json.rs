//! Request bodies: JSON parsed into typed requests, every failure a 400 problem.

use axum::body::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize as _;

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
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

/// A JSON number or, from a query string, its digits.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum RawInteger {
    Number(serde_json::Number),
    Text(String),
}

/// `raw` as a `T`: an integer, or a float without a fraction within ±2^53 (exact there).
fn integral<T: TryFrom<i128>, E: serde::de::Error>(raw: RawInteger, digits: bool) -> Result<T, E> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let wide: Option<i128> = match raw {
        RawInteger::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() <= EXACT).map(|f| f as i128)),
        RawInteger::Text(text) if digits => text.parse::<i128>().ok(),
        RawInteger::Text(_) => None,
    };
    let wide = wide.ok_or_else(|| E::custom("expected an integer"))?;
    T::try_from(wide).map_err(|_| E::custom(format!("{wide} is out of range")))
}

/// An integer field as JSON Schema's `integer` has it: `7` and `7.0` alike (serde alone takes
/// only `7`): `#[serde(deserialize_with = "crate::json::integer")]`.
pub fn integer<'de, D: serde::Deserializer<'de>, T: TryFrom<i128>>(deserializer: D) -> Result<T, D::Error> {
    integral(RawInteger::deserialize(deserializer)?, false)
}

/// [`integer`] for an optional field (with `#[serde(default)]`).
pub fn optional_integer<'de, D: serde::Deserializer<'de>, T: TryFrom<i128>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    Option::<RawInteger>::deserialize(deserializer)?.map(|raw| integral(raw, false)).transpose()
}

/// [`optional_integer`] for a struct that is both a query string and a JSON body: digits
/// are taken too (the query string's form).
pub fn optional_integer_or_digits<'de, D: serde::Deserializer<'de>, T: TryFrom<i128>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    Option::<RawInteger>::deserialize(deserializer)?.map(|raw| integral(raw, true)).transpose()
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
