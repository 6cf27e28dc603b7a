//! Accounts: users, tokens and the caller's identity.
//!
//! `POST /v1/admin/users`, `GET /v1/admin/users/{userId}`,
//! `POST /v1/admin/users/{userId}/tokens`, `GET /v1/me`.

use axum::extract::{Path, State};
use axum::response::Response;
use axum::Json;
use raftbox_storage::records::User;
use raftbox_storage::Command;
use serde::{Deserialize, Serialize};

use super::new_id;
use crate::auth::{generate_token, hash_token, Principal};
use crate::idempotency::{Keyed, Success};
use crate::{json, ApiError, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameRequest {
    name: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserCreated {
    user_id: String,
    namespace_id: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserView {
    user_id: String,
    name: String,
    namespace_id: String,
}

impl From<User> for UserView {
    fn from(user: User) -> UserView {
        UserView { user_id: user.id, name: user.name, namespace_id: user.namespace_id }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    token: String,
    token_id: String,
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
    state.node.read_barrier().await?;
    let user = state.node.state().user(&user_id)?.ok_or_else(|| ApiError::NotFound(format!("user {user_id}")))?;
    Ok(Json(user.into()))
}

/// `POST /v1/admin/users/{userId}/tokens` (idempotency-keyed: a replay returns the same
/// token).
pub async fn create_token(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: NameRequest = json::parse(&keyed.body)?;
    let name = json::name("name", &request.name)?;
    let (token, token_id) = (generate_token(), new_id());
    let command = Command::CreateToken { token_id: token_id.clone(), user_id, name, token_hash: hash_token(&token) };
    keyed.write(&state, &principal, command, Success::created(TokenCreated { token, token_id })).await
}

/// The caller. Authentication already read the user after a read barrier where needed.
pub async fn me(principal: Principal) -> Json<UserView> {
    Json(principal.user.into())
}
