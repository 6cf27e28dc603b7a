//! `ApiError`: the one place where errors map to HTTP statuses, as RFC 9457 problem+json.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use raftbox_raft::{MembershipError, WriteError};
use raftbox_storage::{Rejection, StorageError};
use serde::{Deserialize, Serialize};

/// An RFC 9457 problem: the body of every error answer (`application/problem+json`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// A slug: `bad-request`, `unauthenticated`, `forbidden`, `not-found`, `conflict`,
    /// `stale-fence`, `cursor-reset`, `missing-chunks`, `hash-mismatch`, `rate-limited`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// `missing-chunks`: the chunks to upload first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<Vec<String>>,
    /// A commit's `conflict`: the file's current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<u64>,
    /// A commit's `conflict`: where the caller's content was kept, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflicted_copy: Option<ConflictedCopy>,
}

/// Where a commit that lost a race kept the caller's content.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConflictedCopy {
    pub path: String,
    pub file_id: String,
    pub version: u64,
}

impl Problem {
    fn new(status: StatusCode, slug: &str, title: &str, detail: String) -> Problem {
        Problem {
            kind: slug.to_string(),
            title: title.to_string(),
            status: status.as_u16(),
            detail,
            missing: None,
            current_version: None,
            conflicted_copy: None,
        }
    }

    fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Seconds a client is asked to wait after a 503.
pub const RETRY_AFTER_UNAVAILABLE_S: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The caller's storage quota would be exceeded (507).
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The request's body stopped coming (`crate::BODY_IDLE`): 408.
    #[error("{0}")]
    RequestTimeout(String),
    /// What was asked for is gone for good (an expired or used-up share link): 410.
    #[error("{0}")]
    Gone(String),
    /// Well-formed, and as the API description says, but not to be done as asked: a rule
    /// that joins fields or depends on the state or the time (a one-off job in the past, a
    /// block whose bytes are not its hash): 422.
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    HashMismatch(String),
    #[error("this cursor can no longer be served; sync again from cursor 0")]
    CursorReset,
    #[error("stale fence token; the job's fence is now {0}")]
    StaleFence(u64),
    #[error("some chunks are not stored; upload them first")]
    MissingChunks(Vec<String>),
    #[error("the file changed since baseVersion; your content was kept as a conflicted copy")]
    CommitConflict { current_version: u64, conflicted_copy: Option<ConflictedCopy> },
    #[error("a request with this Idempotency-Key is still in progress")]
    IdempotencyInProgress { retry_after_s: u64 },
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("rate limit exceeded")]
    RateLimited { retry_after_s: u64 },
    /// Too many notification channels open (per user or per node).
    #[error("{0}")]
    TooManyChannels(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated", "Unauthenticated"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", "Payload too large"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request-timeout", "Request timeout"),
            ApiError::Gone(_) => (StatusCode::GONE, "gone", "Gone"),
            ApiError::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", "Unprocessable"),
            ApiError::QuotaExceeded(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "quota-exceeded", "Storage quota exceeded")
            }
            ApiError::MissingChunks(_) => (StatusCode::UNPROCESSABLE_ENTITY, "missing-chunks", "Missing chunks"),
            ApiError::CommitConflict { .. } => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::StaleFence(_) => (StatusCode::CONFLICT, "stale-fence", "Stale fence"),
            ApiError::CursorReset => (StatusCode::GONE, "cursor-reset", "Cursor reset"),
            ApiError::HashMismatch(_) => (StatusCode::UNPROCESSABLE_ENTITY, "hash-mismatch", "Hash mismatch"),
            ApiError::IdempotencyInProgress { .. } => {
                (StatusCode::CONFLICT, "idempotency-in-progress", "Request in progress")
            }
            ApiError::IdempotencyKeyReused => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused", "Idempotency key reused")
            }
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate-limited", "Too many requests"),
            ApiError::TooManyChannels(_) => {
                (StatusCode::TOO_MANY_REQUESTS, "too-many-channels", "Too many notification channels")
            }
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error"),
        }
    }
}

impl From<WriteError> for ApiError {
    fn from(error: WriteError) -> ApiError {
        match error {
            WriteError::TooLarge { .. } => ApiError::PayloadTooLarge(error.to_string()),
            WriteError::Invalid(_) => ApiError::BadRequest(error.to_string()),
            WriteError::FormatNotReached { .. } => ApiError::Conflict(error.to_string()),
            _ => ApiError::Unavailable(error.to_string()),
        }
    }
}

impl From<MembershipError> for ApiError {
    fn from(error: MembershipError) -> ApiError {
        match error {
            MembershipError::Invalid(detail) => ApiError::Conflict(detail),
            MembershipError::NotFound(detail) => ApiError::NotFound(detail),
            MembershipError::Unavailable(detail) => ApiError::Unavailable(detail),
            e @ (MembershipError::Unknown(_) | MembershipError::NotLeader) => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(error: StorageError) -> ApiError {
        ApiError::Internal(error.to_string())
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> ApiError {
        match rejection {
            Rejection::Conflict(detail) | Rejection::LimitReached(detail) => ApiError::Conflict(detail),
            Rejection::NotFound(detail) => ApiError::NotFound(detail),
            Rejection::StaleFence { current } => ApiError::StaleFence(current),
            Rejection::MissingChunks(missing) => ApiError::MissingChunks(missing.iter().map(|h| h.to_hex()).collect()),
            Rejection::Forbidden(detail) => ApiError::Forbidden(detail),
            Rejection::Invalid(detail) => ApiError::BadRequest(detail),
            rejection @ Rejection::QuotaExceeded { .. } => ApiError::QuotaExceeded(rejection.to_string()),
            rejection @ Rejection::MembersChanged => ApiError::Unavailable(rejection.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.parts();
        // A full quota is the caller's condition, not the server's.
        if status.is_server_error() && !matches!(self, ApiError::QuotaExceeded(_)) {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        }
        let mut body = Problem::new(status, slug, title, self.to_string());
        match &self {
            ApiError::MissingChunks(missing) => body.missing = Some(missing.clone()),
            ApiError::CommitConflict { current_version, conflicted_copy } => {
                body.current_version = Some(*current_version);
                body.conflicted_copy = conflicted_copy.clone();
            }
            _ => {}
        }
        let mut response = (status, body.to_json()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        let retry_after_s = match self {
            ApiError::IdempotencyInProgress { retry_after_s } | ApiError::RateLimited { retry_after_s } => {
                Some(retry_after_s)
            }
            ApiError::Unavailable(_) | ApiError::TooManyChannels(_) => Some(RETRY_AFTER_UNAVAILABLE_S),
            _ => None,
        };
        if let Some(seconds) = retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Longest body of a framework rejection quoted in the problem's `detail`.
const REJECTION_DETAIL_BYTES_MAX: usize = 512;

/// Turns every error answer that is not already problem+json — axum's own rejections of a
/// bad query, path or body, a 405 for a wrong method, a 413 from a body limit — into the
/// same RFC 9457 shape as every other error, its text as the `detail`.
pub async fn problems_everywhere(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, REJECTION_DETAIL_BYTES_MAX * 4).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    };
    let detail = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_string(),
        text => raftbox_storage::paths::cut(text, REJECTION_DETAIL_BYTES_MAX).to_string(),
    };
    let slug = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        StatusCode::NOT_FOUND => "not-found",
        s if s.is_server_error() => "internal",
        _ => "bad-request",
    };
    let body = Problem::new(status, slug, status.canonical_reason().unwrap_or("Error"), detail);
    let mut response = (status, body.to_json()).into_response();
    let headers = response.headers_mut();
    for (name, value) in parts.headers.iter().filter(|(name, _)| *name == header::ALLOW || *name == header::RETRY_AFTER)
    {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

/// Why a request body could not be read whole within `limit` bytes: too long (413), or it
/// stopped coming within the router's idle bound (408); told apart by the error's kind.
pub fn body_refusal(error: axum::Error, limit: usize) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(cause) = source {
        if cause.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::RequestTimeout(format!(
                "the request body stopped coming for {} s; nothing was done",
                crate::BODY_IDLE.as_secs()
            ));
        }
        source = cause.source();
    }
    ApiError::PayloadTooLarge(format!("this body is at most {limit} bytes"))
}
