//! Accounts: users, tokens and the caller's identity.
//!
//! `POST /v1/admin/users`, `GET /v1/admin/users/{userId}`,
//! `POST /v1/admin/users/{userId}/tokens`, `GET /v1/me`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use raftbox_storage::records::User;
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use crate::auth::{generate_token, hash_token, Principal};
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
        UserView {
            user_id: user.id,
            name: user.name,
            namespace_id: user.namespace_id,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    token: String,
    token_id: String,
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn unexpected(outcome: Outcome) -> ApiError {
    ApiError::Internal(format!("unexpected outcome {outcome:?}"))
}

pub async fn create_user(
    State(state): State<AppState>,
    principal: Principal,
    body: Bytes,
) -> Result<(StatusCode, Json<UserCreated>), ApiError> {
    principal.require_admin()?;
    let request: NameRequest = json::parse(&body)?;
    let name = json::name("name", &request.name)?;
    let command = Command::CreateUser {
        user_id: new_id(),
        namespace_id: new_id(),
        name,
    };
    match state.node.write(command).await? {
        Outcome::UserCreated {
            user_id,
            namespace_id,
        } => Ok((
            StatusCode::CREATED,
            Json(UserCreated {
                user_id,
                namespace_id,
            }),
        )),
        Outcome::Rejected(rejection) => Err(rejection.into()),
        other => Err(unexpected(other)),
    }
}

pub async fn get_user(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
) -> Result<Json<UserView>, ApiError> {
    principal.require_admin()?;
    state.node.read_barrier().await?;
    let user = state
        .node
        .state()
        .user(&user_id)?
        .ok_or_else(|| ApiError::NotFound(format!("user {user_id}")))?;
    Ok(Json(user.into()))
}

pub async fn create_token(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    principal.require_admin()?;
    let request: NameRequest = json::parse(&body)?;
    let name = json::name("name", &request.name)?;
    let token = generate_token();
    let command = Command::CreateToken {
        token_id: new_id(),
        user_id,
        name,
        token_hash: hash_token(&token),
    };
    match state.node.write(command).await? {
        Outcome::TokenCreated { token_id } => {
            Ok((StatusCode::CREATED, Json(TokenCreated { token, token_id })))
        }
        Outcome::Rejected(rejection) => Err(rejection.into()),
        other => Err(unexpected(other)),
    }
}

/// The caller. Authentication already read the user after a read barrier where needed.
pub async fn me(principal: Principal) -> Json<UserView> {
    Json(principal.user.into())
}
