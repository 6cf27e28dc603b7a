//! Bearer tokens: generation, hashing, and the `Principal` extractor.
//!
//! A token is `rbx_` + base64url(32 random bytes). Only its blake3 hash is stored.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use raftbox_storage::records::User;
use rand::RngCore;

use crate::{ApiError, AppState};

/// Prefix of every raftbox token, so a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "rbx_";
/// Random bytes in a token.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// A new random token.
pub fn generate_token() -> String {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// The hash under which a token is stored.
pub fn hash_token(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: User,
    pub token_id: String,
    pub token_name: String,
    /// When the token stops working, Unix ms (the notification channels close then).
    pub token_expires_ms: Option<u64>,
    /// When the token was made, Unix ms (replicated time; 0 for a password's caller).
    pub token_created_ms: u64,
    /// Whether the token is a login session (made by a password).
    pub token_session: bool,
    /// The token's stored hash (a channel asks whether the token still exists).
    pub token_hash: [u8; 32],
}

impl Principal {
    /// The caller's tenant, for tenant-scoped limits and job records: a property of the
    /// authenticated user (never a client header). Every user is its own tenant.
    pub fn tenant(&self) -> &str {
        &self.user.id
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.user.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden("this call needs the admin token".into()))
        }
    }
}

/// What a request's `Authorization` header carries: `Bearer <token>`, or `Basic` with a
/// user's name and a token of theirs as the password (WebDAV clients and curl send that;
/// Nextcloud's app passwords work the same way).
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials {
    Bearer(String),
    Basic { name: String, secret: String },
}

/// The request's credentials: `None` without an `Authorization` header, an error for one
/// that is malformed.
pub fn credentials(headers: &axum::http::HeaderMap) -> Result<Option<Credentials>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let malformed = |why: &str| ApiError::Unauthenticated(format!("malformed Authorization header: {why}"));
    let value = value.to_str().map_err(|_| malformed("not ASCII"))?;
    if let Some(token) = value.strip_prefix("Bearer ").map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(Some(Credentials::Bearer(token.to_string())));
    }
    if let Some(encoded) = value.strip_prefix("Basic ").map(str::trim) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| malformed("Basic credentials are not base64"))?;
        let text = String::from_utf8(decoded).map_err(|_| malformed("Basic credentials are not UTF-8"))?;
        let (name, secret) = text.split_once(':').ok_or_else(|| malformed("Basic credentials need name:password"))?;
        return Ok(Some(Credentials::Basic { name: name.to_string(), secret: secret.to_string() }));
    }
    Err(ApiError::Unauthenticated("Authorization must be Bearer <token>, or Basic with your name and a token".into()))
}

/// The password of a request's `Authorization: Basic` (the name is not looked at), if it
/// carries well-formed Basic credentials.
pub fn basic_password(headers: &axum::http::HeaderMap) -> Option<String> {
    match credentials(headers) {
        Ok(Some(Credentials::Basic { secret, .. })) => Some(secret),
        _ => None,
    }
}

impl Credentials {
    /// The token these credentials present, if any.
    pub fn token(&self) -> &str {
        match self {
            Credentials::Bearer(token) => token,
            Credentials::Basic { secret, .. } => secret,
        }
    }

    /// Whether `principal`, found by [`Credentials::token`], is who these credentials name.
    fn names(&self, principal: &Principal) -> bool {
        match self {
            Credentials::Bearer(_) => true,
            Credentials::Basic { name, .. } => *name == principal.user.name,
        }
    }
}

/// The hash of the request's token (bearer or Basic), if it carries a well-formed one.
pub fn bearer_hash(headers: &axum::http::HeaderMap) -> Option<[u8; 32]> {
    let credentials = credentials(headers).ok()??;
    let token = credentials.token();
    (!token.is_empty()).then(|| hash_token(token))
}

/// The caller named by these headers (any route outside axum's extractors: WebDAV).
pub async fn from_headers(state: &AppState, headers: &axum::http::HeaderMap) -> Result<Principal, ApiError> {
    let credentials = credentials(headers)?
        .ok_or_else(|| ApiError::Unauthenticated("missing Authorization: Bearer <token>, or Basic".into()))?;
    let principal = lookup(state, &hash_token(credentials.token()))
        .await?
        .filter(|principal| credentials.names(principal))
        .ok_or_else(|| ApiError::Unauthenticated("unknown token, or a token of another user".into()))?;
    Ok(principal)
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Principal, ApiError> {
        // The rate limiter may have resolved the caller already, or found the token unknown.
        if let Some(principal) = parts.extensions.get::<Principal>() {
            // Found by its token: Basic credentials must also name its user.
            if credentials(&parts.headers)?.is_some_and(|c| c.names(principal)) {
                return Ok(principal.clone());
            }
            return Err(ApiError::Unauthenticated("unknown token, or a token of another user".into()));
        }
        if let Some(Refused(why)) = parts.extensions.get::<Refused>() {
            return Err(ApiError::Unauthenticated(why.clone()));
        }
        if let Some(LookedUp(None)) = parts.extensions.get::<LookedUp>() {
            return Err(ApiError::Unauthenticated("unknown token".into()));
        }
        from_headers(state, &parts.headers).await
    }
}

/// Whether `path` is WebDAV's, where a user's password stands in for a token.
fn takes_passwords(path: &str) -> bool {
    path == "/dav" || path.starts_with("/dav/")
}

/// Whether `path` authenticates by something other than a user: a share link (its
/// `Authorization` is the link's password, with any name).
fn authenticates_no_user(path: &str) -> bool {
    path.starts_with("/s/")
}

/// The caller as this node knows it now, without waiting: the principal, and whether that is
/// final. Final: no credentials (or malformed ones, which the route refuses), a token this
/// node holds, a share link's password. Not final: a token this node does not hold (made an
/// instant ago through another node, or forged) and, on WebDAV, a user's password:
/// [`resolve`] settles those. An expired token is 401.
pub fn resolve_local(
    state: &AppState,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Result<(Option<Principal>, bool), ApiError> {
    if authenticates_no_user(path) {
        return Ok((None, true));
    }
    let Ok(Some(credentials)) = credentials(headers) else {
        return Ok((None, true));
    };
    if let Credentials::Basic { secret, .. } = &credentials {
        if !secret.starts_with(TOKEN_PREFIX) {
            // A password: WebDAV's to check (after the anonymous limits); anywhere else it is
            // an unknown token, without a lookup.
            return Ok((None, !takes_passwords(path)));
        }
    }
    match lookup_local(state, &hash_token(credentials.token()))? {
        Some(principal) => Ok((Some(principal).filter(|p| credentials.names(p)), true)),
        None => Ok((None, false)),
    }
}

/// The caller [`resolve_local`] could not settle: a token looked up again after a read
/// barrier (the paced one), or, on WebDAV, a user's name and password checked
/// (`routes::login::check_password`: per-address and per-name attempt limits, argon2 in the
/// node's hashing places). `None`: no such token, or one of another user.
pub async fn resolve(
    state: &AppState,
    path: &str,
    headers: &axum::http::HeaderMap,
    client: Option<crate::front_door::Client>,
) -> Result<Option<Principal>, ApiError> {
    let Ok(Some(credentials)) = credentials(headers) else {
        return Ok(None);
    };
    if let Credentials::Basic { name, secret } = &credentials {
        if !secret.starts_with(TOKEN_PREFIX) {
            if !takes_passwords(path) {
                return Ok(None);
            }
            return crate::routes::login::check_password(state, name, secret, client).await.map(Some);
        }
    }
    let found = lookup(state, &hash_token(credentials.token())).await?;
    Ok(found.filter(|principal| credentials.names(principal)))
}

/// Why the request's credentials were refused before the route (an expired token): the
/// route's 401 says so, if the route needs a caller.
#[derive(Debug, Clone)]
pub struct Refused(pub String);

/// What the rate limiter's lookup of the request's token found (`None`: unknown after a read
/// barrier), so the route does not look it up again.
#[derive(Debug, Clone)]
pub struct LookedUp(pub Option<Principal>);

/// The principal holding the token with this hash as this node knows it, without a barrier.
pub fn lookup_local(state: &AppState, hash: &[u8; 32]) -> Result<Option<Principal>, ApiError> {
    principal_of(state.node.state().token(hash)?, hash, state.node.expiry_now_ms())
}

/// The principal holding the token with this hash. A token unknown here may have been
/// created an instant ago through another node: it is looked up again after a read
/// barrier, so authentication is linearizable too. That barrier is the paced one (shared
/// with every unknown token waiting then, at most one round per 10 ms): a flood of forged
/// tokens costs the cluster a bounded number of rounds, never another user's.
pub async fn lookup(state: &AppState, hash: &[u8; 32]) -> Result<Option<Principal>, ApiError> {
    let state_machine = state.node.state();
    let mut found = state_machine.token(hash)?;
    if found.is_none() {
        state.node.read_barrier_paced().await?;
        found = state_machine.token(hash)?;
    }
    principal_of(found, hash, state.node.expiry_now_ms())
}

fn principal_of(
    found: Option<(raftbox_storage::records::Token, User)>,
    hash: &[u8; 32],
    now_ms: u64,
) -> Result<Option<Principal>, ApiError> {
    match found {
        Some((token, _)) if token.expires_ms.is_some_and(|at| at <= now_ms) => {
            Err(ApiError::Unauthenticated("token expired".into()))
        }
        // A login session whose password changed since: ended, as a revoked token.
        Some((token, user)) if !token.current_for(&user) => Ok(None),
        found => Ok(found.map(|(token, user)| Principal {
            user,
            token_id: token.id,
            token_name: token.name,
            token_expires_ms: token.expires_ms,
            token_created_ms: token.created_ms,
            token_session: token.password_epoch.is_some(),
            token_hash: *hash,
        })),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).expect("a header value"));
        headers
    }

    #[test]
    fn bearer_and_basic_credentials_are_read_and_bad_ones_refused() {
        assert_eq!(credentials(&HeaderMap::new()).expect("none"), None);
        assert_eq!(credentials(&with("Bearer rbx_x")).expect("bearer"), Some(Credentials::Bearer("rbx_x".into())));
        // alice:rbx_se:cret — the password may hold a colon; the name may not.
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("alice:rbx_se:cret"));
        let found = credentials(&with(&basic)).expect("basic").expect("some");
        assert_eq!(found, Credentials::Basic { name: "alice".into(), secret: "rbx_se:cret".into() });
        assert_eq!(found.token(), "rbx_se:cret");
        assert_eq!(bearer_hash(&with(&basic)), Some(hash_token("rbx_se:cret")));
        for bad in ["Basic !!!", "Basic bm9jb2xvbg==", "Digest x", "Bearer "] {
            assert!(credentials(&with(bad)).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn tokens_are_random_prefixed_and_hash_stably() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), hash_token(&b));
    }
}
