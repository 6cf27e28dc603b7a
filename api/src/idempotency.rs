//! Idempotency keys: one mechanism for every state-changing POST.
//!
//! A handler declares its route keyed by taking [`Keyed`] (the body plus the optional
//! `Idempotency-Key`) and finishing with [`Keyed::write`] when its work is one Raft command —
//! record and effect are then written in the same apply — or [`Keyed::run`] for multi-step
//! work (an `IN_PROGRESS` record with a lease, then `DONE`). Scope = (principal, method and
//! concrete path, key) — `/users/A/tokens` and `/users/B/tokens` are different scopes;
//! fingerprint = blake3 of the body. A rejection the client can cure (422 `missing-chunks`)
//! is not saved, so the retry after the cure runs.

use std::future::Future;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use raftbox_storage::command::IdempotencyOutcome;
use raftbox_storage::records::{IdempotencyResult, SavedResponse};
use raftbox_storage::{Command, Outcome};
use serde::Deserialize;

use crate::auth::Principal;
use crate::{ApiError, AppState};

/// The request header carrying the key.
pub const KEY_HEADER: &str = "idempotency-key";
/// Set on a response that was replayed from a saved result.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Longest accepted key, in characters.
pub const KEY_CHARS_MAX: usize = 255;
/// Largest request body a keyed route accepts (and fingerprints), in bytes.
pub const BODY_BYTES_MAX: usize = 1 << 20;
/// Largest response a two-phase route may save, in bytes.
pub const SAVED_RESPONSE_BYTES_MAX: usize = 1 << 20;

/// Idempotency settings (node TOML `[idempotency]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long a record (and so a replay) lives, in seconds.
    pub ttl_s: u64,
    /// How long a multi-step request may hold its key before a retry may take over.
    pub lease_s: u64,
}

impl Default for IdempotencyConfig {
    fn default() -> IdempotencyConfig {
        IdempotencyConfig { ttl_s: 24 * 3600, lease_s: 60 }
    }
}

/// The response a keyed write gives when its command succeeds.
pub struct Success {
    pub status: StatusCode,
    pub body: serde_json::Value,
    /// What a replay under the key answers instead of `body`, when `body` holds a secret
    /// that must not be stored (the saved answer travels through the Raft log and the
    /// state).
    pub replay_body: Option<serde_json::Value>,
}

impl Success {
    pub fn created(body: impl serde::Serialize) -> Success {
        Success { status: StatusCode::CREATED, body: serde_json::to_value(body).unwrap_or_default(), replay_body: None }
    }

    /// A replay answers `body` instead (see [`Success::replay_body`]).
    pub fn replayed_as(mut self, body: impl serde::Serialize) -> Success {
        self.replay_body = Some(serde_json::to_value(body).unwrap_or_default());
        self
    }

    fn saved(&self) -> SavedResponse {
        SavedResponse {
            status: self.status.as_u16(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: self.replay_body.as_ref().unwrap_or(&self.body).to_string(),
        }
    }
}

/// A keyed route's request: the body and, when the client sent one, the idempotency key.
pub struct Keyed {
    key: Option<String>,
    route: String,
    pub body: Bytes,
}

/// Validates an `Idempotency-Key` header value.
pub fn parse_key(value: &HeaderValue) -> Result<String, ApiError> {
    // As `schema::IdempotencyKey` states it (HTTP trims the spaces around a value).
    let bytes = value.as_bytes();
    let visible = bytes.iter().all(|b| (b' '..=b'~').contains(b));
    if bytes.is_empty() || bytes.len() > KEY_CHARS_MAX || !visible {
        return Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {KEY_CHARS_MAX} visible ASCII characters"
        )));
    }
    let key = String::from_utf8_lossy(bytes);
    Ok(key.into_owned())
}

/// A keyed route describes its optional `Idempotency-Key` header (`params(Keyed)`).
impl utoipa::IntoParams for Keyed {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![header_param(
            "Idempotency-Key",
            "Repeating a request with the same key and body answers the first answer again.",
            utoipa::openapi::Ref::from_schema_name("IdempotencyKey"),
        )]
    }
}

/// An optional header parameter of schema `schema`.
pub(crate) fn header_param(
    name: &str,
    description: &str,
    schema: utoipa::openapi::Ref,
) -> utoipa::openapi::path::Parameter {
    utoipa::openapi::path::ParameterBuilder::new()
        .name(name)
        .parameter_in(utoipa::openapi::path::ParameterIn::Header)
        .required(utoipa::openapi::Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

impl FromRequest<AppState> for Keyed {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &AppState) -> Result<Keyed, ApiError> {
        let key = request.headers().get(KEY_HEADER).map(parse_key).transpose()?;
        // The concrete path, not the route template: a key is scoped to the resource.
        let route = format!("{} {}", request.method(), request.uri().path());
        let body = to_bytes(request.into_body(), BODY_BYTES_MAX)
            .await
            .map_err(|e| ApiError::PayloadTooLarge(format!("request body: {e}")))?;
        Ok(Keyed { key, route, body })
    }
}

impl Keyed {
    fn scope(&self, principal: &Principal, key: &str) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        for part in [principal.user.id.as_str(), self.route.as_str(), key] {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        *hasher.finalize().as_bytes()
    }

    fn fingerprint(&self) -> [u8; 32] {
        *blake3::hash(&self.body).as_bytes()
    }

    /// Runs a one-command write whose success answer is known before proposing. With a key
    /// the command is wrapped so that the record is written in the same apply as its
    /// effect; a retry replays the saved answer.
    pub async fn write(
        self,
        state: &AppState,
        principal: &Principal,
        command: Command,
        success: Success,
    ) -> Result<Response, ApiError> {
        let saved = success.saved();
        self.write_inner(state, principal, command, Some(saved), move |outcome| render(outcome, &success)).await
    }

    /// Runs a one-command write whose answer is rendered from its outcome; a retry with the
    /// key renders the saved outcome the same way.
    pub async fn write_with<R>(
        self,
        state: &AppState,
        principal: &Principal,
        command: Command,
        render: R,
    ) -> Result<Response, ApiError>
    where
        R: Fn(Outcome) -> Result<Response, ApiError>,
    {
        self.write_inner(state, principal, command, None, render).await
    }

    async fn write_inner<R>(
        self,
        state: &AppState,
        principal: &Principal,
        command: Command,
        on_success: Option<SavedResponse>,
        render: R,
    ) -> Result<Response, ApiError>
    where
        R: Fn(Outcome) -> Result<Response, ApiError>,
    {
        let Some(key) = &self.key else {
            return render(state.node.write(command).await?);
        };
        let wrapped = Command::Idempotent {
            scope: self.scope(principal, key),
            fingerprint: self.fingerprint(),
            ttl_ms: state.config.idempotency.ttl_s.saturating_mul(1_000),
            on_success,
            command: Box::new(command),
        };
        match state.node.write(wrapped).await? {
            Outcome::Idempotency(IdempotencyOutcome::Applied { outcome }) => render(*outcome),
            Outcome::Idempotency(IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(outcome) }) => {
                let mut response = render(*outcome).unwrap_or_else(IntoResponse::into_response);
                response.headers_mut().insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
                Ok(response)
            }
            Outcome::Idempotency(other) => early(other),
            other => Err(ApiError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Runs multi-step keyed work: `IN_PROGRESS` with a lease while `work` runs, then `DONE`
    /// with its response. A 503 (the work may not have happened) saves nothing: the lease
    /// runs out and a retry may run the work.
    pub async fn run<F, Fut>(self, state: &AppState, principal: &Principal, work: F) -> Result<Response, ApiError>
    where
        F: FnOnce(Bytes) -> Fut,
        Fut: Future<Output = Response>,
    {
        let Some(key) = &self.key else {
            return Ok(work(self.body).await);
        };
        let scope = self.scope(principal, key);
        let begin = Command::IdempotencyBegin {
            scope,
            fingerprint: self.fingerprint(),
            ttl_ms: state.config.idempotency.ttl_s.saturating_mul(1_000),
            lease_ms: state.config.idempotency.lease_s.saturating_mul(1_000),
        };
        match state.node.write(begin).await? {
            Outcome::Idempotency(IdempotencyOutcome::Begun) => {}
            Outcome::Idempotency(other) => return early(other),
            other => return Err(ApiError::Internal(format!("unexpected outcome {other:?}"))),
        }
        let response = work(self.body).await;
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            return Ok(response);
        }
        let (saved, response) = save(response).await?;
        if let Err(e) = state.node.write(Command::IdempotencyComplete { scope, response: saved }).await {
            tracing::warn!(error = %e, "idempotency record not completed; the lease will expire");
        }
        Ok(response)
    }
}

/// Outcome of a command → the route's success response or the rejection's problem.
fn render(outcome: Outcome, success: &Success) -> Result<Response, ApiError> {
    match outcome {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok((success.status, axum::Json(success.body.clone())).into_response()),
    }
}

/// Answers for a key that was seen before.
fn early(outcome: IdempotencyOutcome) -> Result<Response, ApiError> {
    match outcome {
        IdempotencyOutcome::Replay { result } => Ok(replay(result)),
        IdempotencyOutcome::InProgress { retry_after_ms } => {
            Err(ApiError::IdempotencyInProgress { retry_after_s: retry_after_ms.div_ceil(1_000).max(1) })
        }
        IdempotencyOutcome::KeyReused => Err(ApiError::IdempotencyKeyReused),
        other => Err(ApiError::Internal(format!("unexpected idempotency outcome {other:?}"))),
    }
}

fn replay(result: IdempotencyResult) -> Response {
    let mut response = match result {
        IdempotencyResult::Response(saved) => {
            let mut response = Response::new(Body::from(saved.body));
            *response.status_mut() = StatusCode::from_u16(saved.status).unwrap_or(StatusCode::OK);
            for (name, value) in saved.headers {
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
        IdempotencyResult::Rejected(rejection) => ApiError::from(rejection).into_response(),
        IdempotencyResult::Outcome(outcome) => {
            ApiError::Internal(format!("saved outcome {outcome:?} without its renderer")).into_response()
        }
    };
    response.headers_mut().insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// Buffers a response so it can be both saved and returned.
async fn save(response: Response) -> Result<(SavedResponse, Response), ApiError> {
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, SAVED_RESPONSE_BYTES_MAX)
        .await
        .map_err(|e| ApiError::Internal(format!("buffer response: {e}")))?;
    let headers = parts
        .headers
        .iter()
        .filter(|(name, _)| *name == "content-type" || *name == "location")
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
        .collect();
    let saved =
        SavedResponse { status: parts.status.as_u16(), headers, body: String::from_utf8_lossy(&bytes).into_owned() };
    Ok((saved, Response::from_parts(parts, Body::from(bytes))))
}
