//! Passwords and login (issue 25, item 2).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/login {name, password}` | 201 `{token, tokenId, userId, expiresAt}`: a session token (a bearer token like any other, named `login`, expiring after [`SESSION_TTL`]); 401 for a wrong name or password, alike |
//! | `PUT /v1/me/password {password, currentPassword?}` | 204: sets the caller's password (`currentPassword` needed once one is set) |
//! | `PUT /v1/admin/users/{userId}/password {password}` | 204: the admin sets a user's password |
//! | `DELETE /v1/admin/users/{userId}/password` | 204: the user can no longer log in with a password |
//!
//! - **Stored** as an argon2id hash (the `argon2` crate's defaults, RFC 9106's second
//!   recommended setting: 19 MiB, 2 passes) in a PHC string, hashed by the node that takes
//!   the request before proposing: apply never hashes. Format 4 (`Command::SetPassword`).
//! - **Bounded:** at most [`HASHES_IN_FLIGHT`] hashes at once per node (a login flood costs
//!   this node two cores' worth at most, and waits at most [`HASH_WAIT`] for a place, then
//!   503); logins are limited per name ([`LOGINS_PER_NAME`]) and per client IP
//!   ([`LOGINS_PER_IP`]) per minute on each node, before any hashing.
//! - **No oracle:** an unknown name, a user without a password and a wrong password answer the
//!   same 401 after the same work (a dummy hash is checked when there is nothing to check).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use raftbox_storage::schedule::format_utc;
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::new_id;
use crate::auth::{generate_token, hash_token, now_ms, Principal};
use crate::{json, ApiError, AppState};

/// Characters of a password, at least and at most (as the API description's
/// `minLength`/`maxLength` count them).
pub const PASSWORD_CHARS_MIN: usize = 8;
pub const PASSWORD_CHARS_MAX: usize = 1024;
/// How long a session token from `POST /v1/login` works.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Password hashes computed at once on one node.
pub const HASHES_IN_FLIGHT: usize = 2;
/// How long a request waits for a place to hash before 503.
pub const HASH_WAIT: Duration = Duration::from_secs(5);
/// Bytes of a login body, at most.
/// (1,024 characters of password, each up to 12 bytes as JSON escapes them, and a name.)
const LOGIN_BODY_BYTES_MAX: usize = 16 * 1024;
/// Login attempts per user name, per minute, on one node.
pub const LOGINS_PER_NAME: u32 = 10;
/// Login attempts per client IP, per minute, on one node.
pub const LOGINS_PER_IP: u32 = 30;

/// What every login on this node shares: the places to hash and the attempt limits.
pub struct Passwords {
    hashing: Arc<tokio::sync::Semaphore>,
    /// Passwords checked lately for WebDAV (see [`CHECKED_FOR`]), by a hash of name, password
    /// and stored hash.
    checked: std::sync::Mutex<std::collections::HashMap<[u8; 32], std::time::Instant>>,
    per_name: DefaultKeyedRateLimiter<String>,
    per_ip: DefaultKeyedRateLimiter<String>,
}

impl Default for Passwords {
    fn default() -> Passwords {
        let per_minute = |n: u32| Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
        Passwords {
            hashing: Arc::new(tokio::sync::Semaphore::new(HASHES_IN_FLIGHT)),
            checked: std::sync::Mutex::new(std::collections::HashMap::new()),
            per_name: RateLimiter::keyed(per_minute(LOGINS_PER_NAME)),
            per_ip: RateLimiter::keyed(per_minute(LOGINS_PER_IP)),
        }
    }
}

/// A hash of nothing anyone knows, checked when there is no real one (the same work either way).
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| {
    let salt =
        SaltString::encode_b64(b"raftbox-no-user!").unwrap_or_else(|_| SaltString::generate(&mut rand::rngs::OsRng));
    Argon2::default().hash_password(b"no password matches this", &salt).map(|h| h.to_string()).unwrap_or_default()
});

impl Passwords {
    /// Runs `work` (argon2) off the async workers, holding one of the node's places to hash.
    async fn hash_work<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
        let place = tokio::time::timeout(HASH_WAIT, self.hashing.clone().acquire_owned())
            .await
            .map_err(|_| ApiError::Unavailable("this node is busy checking passwords; try again shortly".into()))?
            .map_err(|_| ApiError::Internal("the password places are closed".into()))?;
        let result = tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        .map_err(|e| ApiError::Internal(format!("hashing failed: {e}")))?;
        Ok(result)
    }

    /// Whether a password try at share link `link_id` is allowed now (at most
    /// [`super::links::LINK_ATTEMPTS_PER_MINUTE`] a minute per link, with logins' names).
    pub(super) fn link_attempt(&self, link_id: &str, peer: Option<String>) -> bool {
        self.tidy();
        let by_ip = peer.is_none_or(|ip| self.per_ip.check_key(&ip).is_ok());
        by_ip && self.per_name.check_key(&format!("\u{0}link:{link_id}")).is_ok()
    }

    /// What a check of `secret` for `who` against `stored` is remembered by.
    pub(super) fn checked_key(&self, who: &str, secret: &str, stored: &str) -> [u8; 32] {
        *blake3::hash(format!("{who}\0{secret}\0{stored}").as_bytes()).as_bytes()
    }

    /// Whether the check `key` names succeeded within [`CHECKED_FOR`].
    pub(super) fn checked_lately(&self, key: &[u8; 32]) -> bool {
        let fresh = |at: &std::time::Instant| at.elapsed() < CHECKED_FOR;
        self.checked.lock().map(|checked| checked.get(key).is_some_and(fresh)).unwrap_or(false)
    }

    /// Remembers a check that succeeded.
    pub(super) fn remember_checked(&self, key: [u8; 32]) {
        if let Ok(mut checked) = self.checked.lock() {
            if checked.len() >= CHECKED_MAX {
                checked.clear();
            }
            checked.insert(key, std::time::Instant::now());
        }
    }

    /// Forgets idle attempt counts (called now and then, so the tables stay small).
    fn tidy(&self) {
        self.per_name.retain_recent();
        self.per_ip.retain_recent();
    }
}

/// How long a password checked for WebDAV's Basic authentication (or a share link's) is
/// taken as checked on this node (the hash is part of what is remembered, so a changed password is checked
/// again at once): a client sends it with every request, and argon2 is made to be slow.
const CHECKED_FOR: Duration = Duration::from_secs(300);
/// Checked passwords remembered at once, at most (forgotten all together beyond).
const CHECKED_MAX: usize = 10_000;

/// The caller for WebDAV: credentials as for the API (a bearer token, or Basic with a token),
/// or Basic with the user's name and password.
pub async fn from_headers_or_password(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    peer: Option<String>,
) -> Result<Principal, ApiError> {
    let credentials = crate::auth::credentials(headers)?;
    let Some(crate::auth::Credentials::Basic { name, secret }) = credentials else {
        return crate::auth::from_headers(state, headers).await;
    };
    if secret.starts_with(crate::auth::TOKEN_PREFIX) {
        return crate::auth::from_headers(state, headers).await;
    }
    if name.chars().count() > crate::json::NAME_CHARS_MAX {
        return Err(wrong());
    }
    let sm = state.node.state();
    let lookup = || -> Result<_, ApiError> {
        let user = sm.user_by_name(&name)?;
        let stored = match &user {
            Some(user) => sm.password_hash(&user.id)?,
            None => None,
        };
        Ok((user, stored))
    };
    let (mut user, mut stored) = lookup()?;
    let mut key = state.passwords.checked_key(&name, &secret, stored.as_deref().unwrap_or(""));
    if !(stored.is_some() && state.passwords.checked_lately(&key)) {
        // Each check is an attempt, limited per address and per name as logins are; a
        // remembered one is not.
        attempt(state, &name, peer.as_deref())?;
        // Read after a barrier: a user or password set an instant ago through another node
        // counts here too (a read after an acknowledged write sees it, from any node).
        state.node.read_barrier().await?;
        (user, stored) = lookup()?;
        key = state.passwords.checked_key(&name, &secret, stored.as_deref().unwrap_or(""));
        if !verify(state, stored, secret).await? {
            return Err(wrong());
        }
        state.passwords.remember_checked(key);
    }
    let user = user.ok_or_else(wrong)?;
    Ok(Principal {
        token_id: String::new(),
        token_name: "password".into(),
        token_expires_ms: None,
        token_hash: [0; 32],
        user,
    })
}

fn check_password_shape(password: &str) -> Result<(), ApiError> {
    let chars = password.chars().count();
    if !(PASSWORD_CHARS_MIN..=PASSWORD_CHARS_MAX).contains(&chars) {
        return Err(ApiError::BadRequest(format!(
            "a password is {PASSWORD_CHARS_MIN} to {PASSWORD_CHARS_MAX} characters"
        )));
    }
    Ok(())
}

/// The argon2id hash of `password`, as a PHC string.
pub(super) async fn hash(state: &AppState, password: String) -> Result<String, ApiError> {
    check_password_shape(&password)?;
    state
        .passwords
        .hash_work(move || {
            let salt = SaltString::generate(&mut rand::rngs::OsRng);
            Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string())
        })
        .await?
        .map_err(|e| ApiError::Internal(format!("hashing a password failed: {e}")))
}

/// Whether `password` matches `stored` (a dummy hash when there is none: same work).
pub(super) async fn verify(state: &AppState, stored: Option<String>, password: String) -> Result<bool, ApiError> {
    let real = stored.is_some();
    let stored = stored.unwrap_or_else(|| DUMMY_HASH.clone());
    let matched = state
        .passwords
        .hash_work(move || {
            PasswordHash::new(&stored).is_ok_and(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
        })
        .await?;
    Ok(real && matched)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The user's name.
    #[schema(min_length = 1, max_length = 64)]
    name: String,
    #[schema(min_length = 8, max_length = 1024)]
    password: String,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoginResponse {
    /// A bearer token, shown once.
    token: String,
    token_id: String,
    user_id: String,
    /// When the token stops working (RFC 3339).
    expires_at: String,
}

fn wrong() -> ApiError {
    ApiError::Unauthenticated("wrong name or password".into())
}

/// The client's address, as the connection gives it.
pub fn peer(request: &Request) -> Option<String> {
    request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string())
}

/// Counts one password check against `name` (a login, WebDAV's Basic, a password change):
/// refused with 429 past [`LOGINS_PER_IP`] a minute from the address, first, then past
/// [`LOGINS_PER_NAME`] for the name, before any argon2 work. The address comes first, so
/// made-up names cannot each bring a fresh allowance; a name longer than any user's is
/// refused as wrong at once.
fn attempt(state: &AppState, name: &str, peer: Option<&str>) -> Result<(), ApiError> {
    let limited = || ApiError::RateLimited { retry_after_s: 60 / u64::from(LOGINS_PER_NAME.min(LOGINS_PER_IP)).max(1) };
    if name.chars().count() > crate::json::NAME_CHARS_MAX {
        return Err(wrong());
    }
    if let Some(peer) = peer {
        state.passwords.per_ip.check_key(&peer.to_string()).map_err(|_| limited())?;
    }
    state.passwords.per_name.check_key(&name.to_string()).map_err(|_| limited())?;
    state.passwords.tidy();
    Ok(())
}

/// `POST /v1/login`: a session token for a name and password.
pub async fn login(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let peer = peer(&request);
    let body = axum::body::to_bytes(request.into_body(), LOGIN_BODY_BYTES_MAX)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("a login is at most {LOGIN_BODY_BYTES_MAX} bytes")))?;
    let request: LoginRequest = json::parse(&body)?;
    attempt(&state, &request.name, peer.as_deref())?;
    if request.password.chars().count() > PASSWORD_CHARS_MAX {
        return Err(wrong());
    }
    // Always after a barrier (a user created an instant ago through another node is found),
    // and so in the same time whether the name is known or not.
    state.node.read_barrier().await?;
    let sm = state.node.state();
    let user = sm.user_by_name(&request.name)?;
    let stored = match &user {
        Some(user) => sm.password_hash(&user.id)?,
        None => None,
    };
    let user = match (verify(&state, stored, request.password).await?, user) {
        (true, Some(user)) => user,
        _ => return Err(wrong()),
    };
    let token = generate_token();
    let token_id = new_id();
    let expires_ms = now_ms().saturating_add(SESSION_TTL.as_millis() as u64);
    let command = Command::CreateToken {
        token_id: token_id.clone(),
        user_id: user.id.clone(),
        name: "login".into(),
        token_hash: hash_token(&token),
        expires_ms: Some(expires_ms),
    };
    match state.node.write(command).await? {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => {
            let body = LoginResponse { token, token_id, user_id: user.id, expires_at: format_utc(expires_ms) };
            Ok((StatusCode::CREATED, Json(body)).into_response())
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PasswordRequest {
    #[schema(min_length = 8, max_length = 1024)]
    password: String,
    /// The password now: needed once one is set (`PUT /v1/me/password` only).
    current_password: Option<String>,
}

async fn set(state: &AppState, user_id: &str, hash: Option<String>) -> Result<Response, ApiError> {
    match state.node.write(Command::SetPassword { user_id: user_id.to_string(), password_hash: hash }).await? {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// `PUT /v1/me/password`: the caller sets their own password.
pub async fn set_mine(
    State(state): State<AppState>,
    principal: Principal,
    request: Request,
) -> Result<Response, ApiError> {
    let peer = peer(&request);
    let body = axum::body::to_bytes(request.into_body(), LOGIN_BODY_BYTES_MAX)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("a password change is at most {LOGIN_BODY_BYTES_MAX} bytes")))?;
    let request: PasswordRequest = json::parse(&body)?;
    check_password_shape(&request.password)?;
    state.node.read_barrier().await?;
    if let Some(stored) = state.node.state().password_hash(&principal.user.id)? {
        let current = request
            .current_password
            .ok_or_else(|| ApiError::Forbidden("currentPassword is needed to change a password".into()))?;
        // A guess at the password through a token: limited as a login is.
        attempt(&state, &principal.user.name, peer.as_deref())?;
        if !verify(&state, Some(stored), current).await? {
            return Err(ApiError::Forbidden("currentPassword is not the password".into()));
        }
    }
    let hashed = hash(&state, request.password).await?;
    set(&state, &principal.user.id, Some(hashed)).await
}

/// `PUT /v1/admin/users/{userId}/password`: the admin sets a user's password.
pub async fn set_for(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: PasswordRequest = json::parse(&body)?;
    if request.current_password.is_some() {
        return Err(ApiError::BadRequest("currentPassword is for PUT /v1/me/password".into()));
    }
    let hashed = hash(&state, request.password).await?;
    set(&state, &user_id, Some(hashed)).await
}

/// `DELETE /v1/admin/users/{userId}/password`: no password login for the user any more.
pub async fn remove_for(
    State(state): State<AppState>,
    principal: Principal,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    set(&state, &user_id, None).await
}
