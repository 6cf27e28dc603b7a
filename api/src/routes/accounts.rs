//! Accounts: users, tokens and the caller's identity.
//!
//! `POST /v1/admin/users`, `GET /v1/admin/users/{userId}`,
//! `POST /v1/admin/users/{userId}/tokens`, `GET /v1/me`.

use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Json;
use raftbox_storage::records::User;
use raftbox_storage::schedule::format_utc;
use raftbox_storage::Command;
use serde::{Deserialize, Serialize};

use super::{new_id, page_limit, read_state, PageQuery, PAGE_DEFAULT, PAGE_MAX};
use crate::auth::{generate_token, hash_token, Principal};
use crate::idempotency::{Keyed, Success};
use crate::{json, ApiError, AppState};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NameRequest {
    #[schema(value_type = crate::schema::DisplayName)]
    pub(crate) name: String,
}

/// Longest token lifetime a client may ask for: 10 years.
pub const TOKEN_LIFETIME_S_MAX: u64 = 10 * 365 * 24 * 3600;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TokenRequest {
    #[schema(value_type = crate::schema::DisplayName)]
    name: String,
    /// Seconds until the token stops working; absent: it never expires.
    #[schema(minimum = 1, maximum = 315_360_000)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    expires_in_s: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub token_id: String,
    pub name: String,
    pub created_at: String,
    /// When the token stops working; absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub expires_at: Option<String>,
}

super::page! {
    /// A page of a user's tokens (never their secrets).
    TokenList { tokens: TokenView }
}

/// A revoked token.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevoked {
    pub token_id: String,
    pub revoked: bool,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserCreated {
    pub user_id: String,
    pub namespace_id: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserView {
    pub user_id: String,
    pub name: String,
    pub namespace_id: String,
}

impl From<User> for UserView {
    fn from(user: User) -> UserView {
        UserView { user_id: user.id, name: user.name, namespace_id: user.namespace_id }
    }
}

/// A new token. Its secret is in the first answer only: a replay under the same
/// `Idempotency-Key` has no `token` and says `"tokenShownOnce": true`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    pub token_id: String,
    /// The secret (`rbx_…`): give it as `Authorization: Bearer`. Absent on a replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub token: Option<String>,
    /// A replay: the secret was shown once, in the first answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub token_shown_once: bool,
}

/// `POST /v1/admin/users` (idempotency-keyed).
pub async fn create_user(
    State(state): State<AppState>,
    principal: Principal,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: NameRequest = json::parse(&keyed.body)?;
    let name = json::name("name", &request.name)?;
    let (user_id, namespace_id) = (new_id(), new_id());
    let created = UserCreated { user_id: user_id.clone(), namespace_id: namespace_id.clone() };
    let command = Command::CreateUser { user_id, namespace_id, name };
    keyed.write(&state, &principal, command, Success::created(created)).await
}

pub async fn get_user(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
) -> Result<Json<UserView>, ApiError> {
    principal.require_admin()?;
    crate::access::barrier(&state, &principal).await?;
    let user = state.node.state().user(&user_id)?.ok_or_else(|| ApiError::NotFound(format!("user {user_id}")))?;
    Ok(Json(user.into()))
}

/// `POST /v1/admin/users/{userId}/tokens` (idempotency-keyed). The token's plaintext is in
/// the first answer only: it never enters the Raft log, the state or a snapshot, so a replay
/// under the key answers the same `tokenId` without `token` (and `"tokenShownOnce": true`);
/// a client that lost the first answer creates another token.
pub async fn create_token(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: TokenRequest = json::parse(&keyed.body)?;
    let name = json::name("name", &request.name)?;
    let expires_ms = match request.expires_in_s {
        None => None,
        Some(s) if (1..=TOKEN_LIFETIME_S_MAX).contains(&s) => {
            Some(state.node.cluster_now_ms().saturating_add(s * 1_000))
        }
        Some(_) => {
            return Err(ApiError::BadRequest(format!("expiresInS must be 1 to {TOKEN_LIFETIME_S_MAX} seconds")));
        }
    };
    let (token, token_id) = (generate_token(), new_id());
    let command = Command::CreateToken {
        token_id: token_id.clone(),
        user_id,
        name,
        token_hash: hash_token(&token),
        expires_ms,
        session_epoch: None,
    };
    let replay = TokenCreated { token_id: token_id.clone(), token: None, token_shown_once: true };
    let created = TokenCreated { token_id, token: Some(token), token_shown_once: false };
    keyed.write(&state, &principal, command, Success::created(created).replayed_as(replay)).await
}

/// The caller as `GET /v1/me` shows them: who they are and what they store.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeView {
    pub user_id: String,
    pub name: String,
    pub namespace_id: String,
    /// Bytes of the blocks the caller uploaded, each counted once.
    pub stored_bytes: u64,
    /// The most the caller may store (`[quotas] stored_bytes_per_user`); absent for an admin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub quota_bytes: Option<u64>,
    /// Whether the caller has a password (`POST /v1/login` and WebDAV take it).
    #[serde(default)]
    pub password_set: bool,
}

/// The caller. Authentication already read the user after a read barrier where needed; the
/// stored bytes are this node's (one point read).
pub async fn me(State(state): State<AppState>, principal: Principal) -> Result<Json<MeView>, ApiError> {
    crate::access::barrier(&state, &principal).await?;
    let sm = state.node.state();
    let stored_bytes = sm.stored_bytes(&principal.user.id)?;
    let password_set = sm.password_hash(&principal.user.id)?.is_some();
    let quota_bytes = (!principal.user.admin).then_some(state.limits.get().quotas.stored_bytes_per_user);
    let user = principal.user;
    Ok(Json(MeView {
        user_id: user.id,
        name: user.name,
        namespace_id: user.namespace_id,
        stored_bytes,
        quota_bytes,
        password_set,
    }))
}

/// A user's tokens as the API shows them (never their secrets).
async fn token_views(state: &AppState, user_id: String, query: PageQuery) -> Result<Json<TokenList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    let after = query.page_token;
    let found = read_state(state, move |sm| Ok(sm.tokens_page(&user_id, after.as_deref(), limit + 1)?)).await?;
    let tokens: Vec<TokenView> = found
        .iter()
        .take(limit)
        .map(|t| TokenView {
            token_id: t.id.clone(),
            name: t.name.clone(),
            created_at: format_utc(t.created_ms),
            expires_at: t.expires_ms.map(format_utc),
        })
        .collect();
    let next_page_token = (found.len() > limit).then(|| found[limit - 1].id.clone());
    Ok(Json(TokenList { tokens, next_page_token }))
}

/// Revokes `user_id`'s token `token_id`: it stops working on every node as each applies the
/// revocation (within a heartbeat of the answer).
async fn revoke(state: &AppState, user_id: String, token_id: String) -> Result<Json<TokenRevoked>, ApiError> {
    match state.node.write(Command::RevokeToken { user_id, token_id: token_id.clone() }).await? {
        raftbox_storage::Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(Json(TokenRevoked { token_id, revoked: true })),
    }
}

/// `GET /v1/admin/users/{userId}/tokens` (admin).
pub async fn list_tokens(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Json<TokenList>, ApiError> {
    principal.require_admin()?;
    crate::access::barrier(&state, &principal).await?;
    state.node.state().user(&user_id)?.ok_or_else(|| ApiError::NotFound(format!("user {user_id}")))?;
    token_views(&state, user_id, query).await
}

/// `DELETE /v1/admin/users/{userId}/tokens/{tokenId}` (admin).
pub async fn revoke_token(
    State(state): State<AppState>,
    principal: Principal,
    Path((user_id, token_id)): Path<(String, String)>,
) -> Result<Json<TokenRevoked>, ApiError> {
    principal.require_admin()?;
    revoke(&state, user_id, token_id).await
}

/// `GET /v1/me/tokens`: the caller's own tokens.
pub async fn my_tokens(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PageQuery>,
) -> Result<Json<TokenList>, ApiError> {
    crate::access::barrier(&state, &principal).await?;
    token_views(&state, principal.user.id.clone(), query).await
}

/// `DELETE /v1/me/tokens/{tokenId}`: revokes one of the caller's own tokens (the one it
/// calls with included).
pub async fn revoke_my_token(
    State(state): State<AppState>,
    principal: Principal,
    Path(token_id): Path<String>,
) -> Result<Json<TokenRevoked>, ApiError> {
    revoke(&state, principal.user.id, token_id).await
}

/// The caller's webhook signing secret, as `GET` and `POST /v1/me/webhook-secret` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSecretView {
    /// `whsec_` and the base64 of the HMAC-SHA256 key: give it to a Standard Webhooks
    /// library to verify the `webhook-signature` of this user's webhook calls.
    pub secret: String,
    pub created_at: String,
    /// Until when the secret before this one still signs too (after a rotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub previous_valid_until: Option<String>,
}

/// Hours the previous secret goes on signing after a rotation, by default and at most.
pub const KEEP_PREVIOUS_HOURS_DEFAULT: u64 = 24;
pub const KEEP_PREVIOUS_HOURS_MAX: u64 = 7 * 24;

fn secret_view(secret: raftbox_storage::records::WebhookSecret, now_ms: u64) -> WebhookSecretView {
    let previous = secret.previous.is_some() && now_ms < secret.previous_until_ms;
    WebhookSecretView {
        created_at: format_utc(secret.created_ms),
        previous_valid_until: previous.then(|| format_utc(secret.previous_until_ms)),
        secret: secret.secret,
    }
}

/// `GET /v1/me/webhook-secret`: the secret that signs the caller's webhook calls (made on
/// the first ask, or with the first webhook job).
pub async fn webhook_secret(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<WebhookSecretView>, ApiError> {
    // The secret as of now (a rotation through another node an instant ago included).
    crate::access::barrier(&state, &principal).await?;
    let secret = crate::webhooks::ensure_secret(&state.node, &principal.user.id).await?.ok_or_else(|| {
        ApiError::Unavailable(format!(
            "webhook secrets come with data format {}, which the cluster has not reached yet",
            crate::webhooks::SECRETS_FORMAT
        ))
    })?;
    Ok(Json(secret_view(secret, state.node.cluster_now_ms())))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RotateRequest {
    /// Hours the current secret goes on signing beside the new one (0 to 168; default 24),
    /// so receivers can switch without missing a call.
    #[schema(minimum = 0, maximum = 168)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    keep_previous_hours: Option<u64>,
}

/// `POST /v1/me/webhook-secret`: a new secret (201); the one before it still signs for
/// `keepPreviousHours`. While a secret before it still signs, a rotation that keeps one is
/// refused (409): the secret receivers hold would stop at once (a retried rotation, or two in
/// a row); `keepPreviousHours: 0` rotates anyway, stopping every older secret now.
pub async fn rotate_webhook_secret(
    State(state): State<AppState>,
    principal: Principal,
    body: axum::body::Bytes,
) -> Result<(axum::http::StatusCode, Json<WebhookSecretView>), ApiError> {
    // No body, or JSON `null`: the defaults.
    let request: Option<RotateRequest> =
        if body.iter().all(u8::is_ascii_whitespace) { None } else { json::parse(&body)? };
    let request = request.unwrap_or_default();
    let hours = request.keep_previous_hours.unwrap_or(KEEP_PREVIOUS_HOURS_DEFAULT);
    if hours > KEEP_PREVIOUS_HOURS_MAX {
        return Err(ApiError::BadRequest(format!("keepPreviousHours is at most {KEEP_PREVIOUS_HOURS_MAX}")));
    }
    if hours > 0 {
        crate::access::barrier(&state, &principal).await?;
        let now = state.node.cluster_now_ms();
        if let Some(current) = state.node.state().webhook_secret(&principal.user.id)? {
            if current.previous.is_some() && now < current.previous_until_ms {
                return Err(ApiError::Conflict(format!(
                    "the secret before this one still signs until {}: rotate after that, or with keepPreviousHours 0 \
                     to stop every older secret now",
                    format_utc(current.previous_until_ms)
                )));
            }
        }
    }
    let command = Command::SetWebhookSecret {
        user_id: principal.user.id.clone(),
        secret: raftbox_storage::records::SecretText(crate::webhooks::new_secret()),
        keep_previous_ms: Some(hours * 3_600_000),
    };
    if let raftbox_storage::Outcome::Rejected(rejection) = state.node.write(command).await? {
        return Err(rejection.into());
    }
    crate::access::barrier(&state, &principal).await?;
    let secret = state
        .node
        .state()
        .webhook_secret(&principal.user.id)?
        .ok_or_else(|| ApiError::Internal("the webhook secret just made is not in the state".into()))?;
    Ok((axum::http::StatusCode::CREATED, Json(secret_view(secret, state.node.cluster_now_ms()))))
}
