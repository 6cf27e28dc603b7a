//! Passwords and login.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/login {name, password}` | 201 `{token, tokenId, userId, expiresAt}`: a session token (a bearer token like any other, named `login`, expiring after [`SESSION_TTL`]); 401 for a wrong name or password, alike |
//! | `PUT /v1/me/password {password, currentPassword?}` | 204: sets the caller's password: `currentPassword` once one is set; the first one needs fresh proof ([`FRESH_PROOF`]) |
//! | `DELETE /v1/me/password {currentPassword?}` | 204: removes it: the current password, or fresh proof |
//! | `PUT /v1/admin/users/{userId}/password {password}` | 204: the admin sets a user's password |
//! | `DELETE /v1/admin/users/{userId}/password` | 204: the user can no longer log in with a password |
//!
//! - **Stored** as an argon2id hash (the `argon2` crate's defaults, RFC 9106's second
//!   recommended setting: 19 MiB, 2 passes) in a PHC string, hashed by the node that takes
//!   the request before proposing: apply never hashes. Format 4 (`Command::SetPassword`).
//! - **Sessions end with their password:** every change or removal moves the user's password
//!   epoch on (format 5), and a session made under an earlier one stops working at once, on
//!   every node (its token is checked against the epoch with the user it reads anyway).
//! - **Fresh proof:** a first password (or a removal without the current one) needs an admin,
//!   or a token made within [`FRESH_PROOF`] that is not itself a login session, so a token
//!   someone stole and kept cannot plant a permanent login; `GET /v1/me` says whether a
//!   password is set.
//! - **Bounded:** at most [`hashes_in_flight`] hashes at once per node (a login flood costs
//!   this node half its cores at most, and waits at most [`HASH_WAIT`] for a place, then
//!   503). Each password check (a login, WebDAV's Basic, a share link's password, a change) is
//!   an attempt ([`Attempts`]), judged before any hashing and before a login's body is read:
//!   at most [`ATTEMPTS_PER_CLIENT`] a minute from one client address (an IPv6 /64 counts as
//!   one); then, per (name, address), a back-off after the [`FAILURES_FREE`] first failures
//!   (a typo costs no wait) that doubles with each further failure up to [`BACKOFF_MAX`];
//!   and a name's failures beyond [`FAILURES_PER_NAME`] a minute stop only the addresses
//!   that failed on it. No one can lock a user out: a right password from an
//!   address that has not failed is always checked.
//! - **No oracle:** an unknown name, a user without a password and a wrong password answer the
//!   same 401 after the same work (a dummy hash is checked when there is nothing to check).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use raftbox_storage::schedule::format_utc;
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::new_id;
use crate::auth::{generate_token, hash_token, Principal};
use crate::front_door::Client;
use crate::{json, ApiError, AppState};

/// Characters of a password, at least and at most (as the API description's
/// `minLength`/`maxLength` count them).
pub const PASSWORD_CHARS_MIN: usize = 8;
pub const PASSWORD_CHARS_MAX: usize = 1024;
/// How long a session token from `POST /v1/login` works.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// The cluster format from which sessions end with their password (`session_epoch`,
/// `ends_sessions`): before it, during a rolling upgrade, logins and changes work as in
/// format 4.
pub const SESSIONS_FORMAT: u32 = 5;
/// How young a token must be to stand as fresh proof of who calls.
pub const FRESH_PROOF: Duration = Duration::from_secs(10 * 60);
/// Password hashes computed at once on one node: half its cores, at least one, so a flood
/// of logins leaves the other half to everyone else.
pub fn hashes_in_flight() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}
/// The niceness of the threads that hash: the lowest priority, so serving requests always
/// comes first and a flood of password checks waits for spare CPU (on two cores, argon2 run
/// at normal priority more than tripled a bystander's p99: `hostile_input`'s guesses).
const HASHER_NICENESS: i32 = 19;
/// How long a request waits for a place to hash before 503.
pub const HASH_WAIT: Duration = Duration::from_secs(5);
/// Bytes of a login or password body, at most.
/// (1,024 characters of password, each up to 12 bytes as JSON escapes them, and a name.)
const LOGIN_BODY_BYTES_MAX: usize = 16 * 1024;
/// Password checks per client address, per minute, on one node (every attempt counts).
pub const ATTEMPTS_PER_CLIENT: u32 = 30;
/// Failed checks of one name (or share link), per minute, on one node, past which the
/// addresses that failed on it wait out their back-off.
pub const FAILURES_PER_NAME: u32 = 10;
/// Failures of a (name, address) that cost no wait: someone who mistypes their password
/// once tries again at once.
pub const FAILURES_FREE: u32 = 1;
/// The wait after the first failure beyond [`FAILURES_FREE`]; it doubles with each one after.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait a back-off imposes.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// (name, address) pairs whose failures are remembered at once, at most (the oldest are
/// forgotten beyond).
const FAILURES_TRACKED_MAX: usize = 100_000;
/// How long after its back-off ends a (name, address)'s failures are forgotten: an address
/// that failed once long ago is no longer held back by a name's busy minute.
pub const FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(10 * 60);

/// A (name, address) pair's failures, and until when it waits.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    until: Instant,
}

/// The attempt limits of password checks on this node (see the module's rules).
pub struct Attempts {
    per_client: DefaultKeyedRateLimiter<Client>,
    /// Failures per name within the current minute, and when it began.
    failures_per_name: Mutex<HashMap<String, (Instant, u32)>>,
    backoff: Mutex<HashMap<(String, Client), Backoff>>,
}

impl Default for Attempts {
    fn default() -> Attempts {
        let per_minute = Quota::per_minute(NonZeroU32::new(ATTEMPTS_PER_CLIENT).unwrap_or(NonZeroU32::MIN));
        Attempts {
            per_client: RateLimiter::keyed(per_minute),
            failures_per_name: Mutex::new(HashMap::new()),
            backoff: Mutex::new(HashMap::new()),
        }
    }
}

fn limited(wait: Duration) -> ApiError {
    ApiError::RateLimited { retry_after_s: wait.as_secs().max(1) }
}

impl Attempts {
    /// Takes one attempt from `client`: 429 past [`ATTEMPTS_PER_CLIENT`] a minute. Needs no
    /// name, so it comes before a login's body is read.
    pub fn from_client(&self, client: Client) -> Result<(), ApiError> {
        self.per_client
            .check_key(&client)
            .map_err(|_| limited(Duration::from_secs(60 / u64::from(ATTEMPTS_PER_CLIENT))))?;
        self.per_client.retain_recent();
        Ok(())
    }

    /// Whether `client` may try `name` now: not while its back-off runs, nor, once the name's
    /// failures this minute passed [`FAILURES_PER_NAME`], if it failed on the name lately.
    pub fn on_name(&self, name: &str, client: Client) -> Result<(), ApiError> {
        let now = Instant::now();
        let key = (name.to_owned(), client);
        let backoff = {
            let mut backoffs = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
            let found = backoffs.get(&key).copied();
            if found.is_some_and(|b| now > b.until + FAILURES_FORGOTTEN_AFTER) {
                backoffs.remove(&key);
                None
            } else {
                found
            }
        };
        if let Some(backoff) = backoff {
            if now < backoff.until {
                return Err(limited(backoff.until - now));
            }
            let failures = self.failures_per_name.lock().unwrap_or_else(|e| e.into_inner()).get(name).copied();
            if failures.is_some_and(|(since, count)| {
                now.duration_since(since) < Duration::from_secs(60) && count >= FAILURES_PER_NAME
            }) {
                return Err(limited(Duration::from_secs(60)));
            }
        }
        Ok(())
    }

    /// Records the outcome of a check of `name` from `client`.
    pub fn record(&self, name: &str, client: Client, succeeded: bool) {
        let key = (name.to_owned(), client);
        let mut backoffs = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        if succeeded {
            backoffs.remove(&key);
            return;
        }
        let now = Instant::now();
        if backoffs.len() >= FAILURES_TRACKED_MAX && !backoffs.contains_key(&key) {
            backoffs.retain(|_, backoff| backoff.until + FAILURES_FORGOTTEN_AFTER > now);
            if backoffs.len() >= FAILURES_TRACKED_MAX {
                backoffs.clear();
            }
        }
        let entry = backoffs.entry(key).or_insert(Backoff { failures: 0, until: now });
        entry.failures = entry.failures.saturating_add(1);
        entry.until = match entry.failures.checked_sub(FAILURES_FREE + 1) {
            None => now,
            Some(beyond) => now + BACKOFF_FIRST.saturating_mul(1u32 << beyond.min(16)).min(BACKOFF_MAX),
        };
        drop(backoffs);
        let mut per_name = self.failures_per_name.lock().unwrap_or_else(|e| e.into_inner());
        if per_name.len() >= FAILURES_TRACKED_MAX && !per_name.contains_key(name) {
            per_name.retain(|_, (since, _)| now.duration_since(*since) < Duration::from_secs(60));
        }
        let (since, count) = per_name.entry(name.to_owned()).or_insert((now, 0));
        if now.duration_since(*since) >= Duration::from_secs(60) {
            (*since, *count) = (now, 0);
        }
        *count = count.saturating_add(1);
    }
}

/// What every password check on this node shares: the places to hash and the attempt limits.
pub struct Passwords {
    hashing: Arc<tokio::sync::Semaphore>,
    /// Passwords checked lately (see [`CHECKED_FOR`]), by a hash of name, password and stored
    /// hash.
    checked: Mutex<HashMap<[u8; 32], Instant>>,
    /// The checks under way, by the same key: one at a time per key ([`Passwords::turn`]).
    checking: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>,
    pub attempts: Attempts,
}

/// One check's turn ([`Passwords::turn`]); its entry goes when the last waiter is done.
pub(super) struct CheckTurn<'a> {
    passwords: &'a Passwords,
    key: [u8; 32],
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for CheckTurn<'_> {
    fn drop(&mut self) {
        let mut checking = self.passwords.checking.lock().unwrap_or_else(|e| e.into_inner());
        // This turn, its guard, and the table's: no one else waits.
        if Arc::strong_count(&self.lock) <= 3 {
            checking.remove(&self.key);
        }
    }
}

impl Default for Passwords {
    fn default() -> Passwords {
        Passwords {
            hashing: Arc::new(tokio::sync::Semaphore::new(hashes_in_flight())),
            checked: Mutex::new(HashMap::new()),
            checking: Mutex::new(HashMap::new()),
            attempts: Attempts::default(),
        }
    }
}

/// One piece of hashing work.
type HashJob = Box<dyn FnOnce() + Send>;

/// The threads that hash passwords, at [`HASHER_NICENESS`], one per [`hashes_in_flight`]:
/// the process's, shared by its nodes (each bounds its own work with its places to hash).
struct Hashers {
    jobs: Mutex<std::sync::mpsc::Sender<HashJob>>,
}

static HASHERS: LazyLock<Hashers> = LazyLock::new(Hashers::start);

impl Hashers {
    fn start() -> Hashers {
        let (jobs, queue) = std::sync::mpsc::channel::<HashJob>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..hashes_in_flight() {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new().name(format!("password-hasher-{n}")).spawn(move || {
                // On Linux a thread id names the thread alone.
                let me = rustix::thread::gettid();
                if let Err(e) = rustix::process::setpriority_process(Some(me), HASHER_NICENESS) {
                    tracing::warn!(error = %e, "password hashing runs at normal priority");
                }
                loop {
                    let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(job) = job else { return };
                    job();
                }
            });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "a password hasher could not start");
            }
        }
        Hashers { jobs: Mutex::new(jobs) }
    }

    fn run(&self, job: HashJob) -> Result<(), ApiError> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.send(job).map_err(|_| ApiError::Internal("no password hasher runs".into()))
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
        let (answer, result) = tokio::sync::oneshot::channel();
        HASHERS.run(Box::new(move || {
            let _place = place;
            let _ = answer.send(work());
        }))?;
        result.await.map_err(|_| ApiError::Internal("hashing failed: the hasher stopped".into()))
    }

    /// What a check of `secret` for `who` against `stored` is remembered by.
    pub(super) fn checked_key(&self, who: &str, secret: &str, stored: &str) -> [u8; 32] {
        *blake3::hash(format!("{who}\0{secret}\0{stored}").as_bytes()).as_bytes()
    }

    /// Whether the check `key` names succeeded within [`CHECKED_FOR`].
    pub(super) fn checked_lately(&self, key: &[u8; 32]) -> bool {
        let fresh = |at: &Instant| at.elapsed() < CHECKED_FOR;
        self.checked.lock().map(|checked| checked.get(key).is_some_and(fresh)).unwrap_or(false)
    }

    /// Remembers a check that succeeded (the stale ones go first when the table is full; if
    /// all are fresh, all go: each is checked again once).
    pub(super) fn remember_checked(&self, key: [u8; 32]) {
        if let Ok(mut checked) = self.checked.lock() {
            if checked.len() >= CHECKED_MAX {
                checked.retain(|_, at| at.elapsed() < CHECKED_FOR);
                if checked.len() >= CHECKED_MAX {
                    checked.clear();
                }
            }
            checked.insert(key, Instant::now());
        }
    }

    /// A turn to check `key`'s credentials: checks of the same credentials at once (a WebDAV
    /// client opening many connections with one password) wait for one another, so the first
    /// does the argon2 work and spends the attempt, and the rest find it remembered.
    pub(super) async fn turn(&self, key: [u8; 32]) -> CheckTurn<'_> {
        let lock = {
            let mut checking = self.checking.lock().unwrap_or_else(|e| e.into_inner());
            checking.entry(key).or_default().clone()
        };
        let guard = lock.clone().lock_owned().await;
        CheckTurn { passwords: self, key, lock, _guard: guard }
    }
}

/// How long a password checked for WebDAV's Basic authentication (or a share link's) is
/// taken as checked on this node (the hash is part of what is remembered, so a changed password is checked
/// again at once): a client sends it with every request, and argon2 is made to be slow.
const CHECKED_FOR: Duration = Duration::from_secs(300);
/// Checked passwords remembered at once, at most (forgotten all together beyond).
const CHECKED_MAX: usize = 10_000;

/// The client a request comes from (as the front door found it; one for an in-process router).
pub fn client_of(request: &Request) -> Client {
    request.extensions().get::<Client>().copied().unwrap_or(Client::of(std::net::Ipv6Addr::UNSPECIFIED.into()))
}

/// Checks a password `secret` for the user `name` (WebDAV's Basic authentication): the user,
/// or 401. An attempt ([`Attempts`]) unless the same check succeeded lately.
pub async fn check_password(
    state: &AppState,
    name: &str,
    secret: &str,
    client: Option<Client>,
) -> Result<Principal, ApiError> {
    if name.chars().count() > crate::json::NAME_CHARS_MAX {
        return Err(wrong());
    }
    let client = client.unwrap_or(Client::of(std::net::Ipv6Addr::UNSPECIFIED.into()));
    let sm = state.node.state();
    let lookup = || -> Result<_, ApiError> {
        let user = sm.user_by_name(name)?;
        let stored = match &user {
            Some(user) => sm.password_hash(&user.id)?,
            None => None,
        };
        Ok((user, stored))
    };
    let (mut user, mut stored) = lookup()?;
    let mut key = state.passwords.checked_key(name, secret, stored.as_deref().unwrap_or(""));
    let _turn;
    if !(stored.is_some() && state.passwords.checked_lately(&key)) {
        // One check at a time of these credentials; a check done meanwhile is taken as done.
        _turn = state.passwords.turn(key).await;
    }
    if !(stored.is_some() && state.passwords.checked_lately(&key)) {
        let attempts = &state.passwords.attempts;
        attempts.from_client(client)?;
        attempts.on_name(name, client)?;
        // Read after a barrier: a user or password set an instant ago through another node
        // counts here too (a read after an acknowledged write sees it, from any node).
        state.node.read_barrier().await?;
        (user, stored) = lookup()?;
        key = state.passwords.checked_key(name, secret, stored.as_deref().unwrap_or(""));
        let right = verify(state, stored.clone(), secret.to_owned()).await?;
        attempts.record(name, client, right);
        if !right {
            return Err(wrong());
        }
        state.passwords.remember_checked(key);
    }
    let user = user.ok_or_else(wrong)?;
    let stored = stored.ok_or_else(wrong)?;
    Ok(Principal {
        token_id: String::new(),
        token_name: "password".into(),
        token_expires_ms: None,
        token_created_ms: 0,
        token_session: false,
        // What the password's caller holds: the stored hash it was checked against, which a
        // read barrier compares again (`access::barrier`).
        token_hash: password_fingerprint(&stored),
        user,
    })
}

/// What a password's caller is known by: a hash of the stored password hash it was checked
/// against (a change of the password changes it).
pub fn password_fingerprint(stored: &str) -> [u8; 32] {
    *blake3::hash(stored.as_bytes()).as_bytes()
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

/// Reads a small JSON body (a login, a password change) whole, at most
/// [`LOGIN_BODY_BYTES_MAX`] bytes, each piece within the router's body idle bound.
async fn small_body(request: Request) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(request.into_body(), LOGIN_BODY_BYTES_MAX)
        .await
        .map_err(|e| crate::error::body_refusal(e, LOGIN_BODY_BYTES_MAX))
}

/// `POST /v1/login`: a session token for a name and password. The client's attempt is taken
/// before the body is read; the name's limits and back-off once it is.
pub async fn login(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let client = client_of(&request);
    let attempts = &state.passwords.attempts;
    attempts.from_client(client)?;
    let body = small_body(request).await?;
    let request: LoginRequest = json::parse(&body)?;
    if request.name.chars().count() > crate::json::NAME_CHARS_MAX
        || request.password.chars().count() > PASSWORD_CHARS_MAX
    {
        return Err(wrong());
    }
    attempts.on_name(&request.name, client)?;
    // Always after a barrier (a user created an instant ago through another node is found),
    // and so in the same time whether the name is known or not.
    state.node.read_barrier().await?;
    let sm = state.node.state();
    let user = sm.user_by_name(&request.name)?;
    let stored = match &user {
        Some(user) => sm.password_hash(&user.id)?,
        None => None,
    };
    let right = verify(&state, stored, request.password).await?;
    attempts.record(&request.name, client, right);
    let user = match (right, user) {
        (true, Some(user)) => user,
        _ => return Err(wrong()),
    };
    let token = generate_token();
    let token_id = new_id();
    let expires_ms = state.node.cluster_now_ms().saturating_add(SESSION_TTL.as_millis() as u64);
    let command = Command::CreateToken {
        token_id: token_id.clone(),
        user_id: user.id.clone(),
        name: "login".into(),
        token_hash: hash_token(&token),
        expires_ms: Some(expires_ms),
        // A session ends with its password once every node knows how (format 5); during a
        // rolling upgrade sessions are made as before.
        session_epoch: (state.node.cluster_format() >= SESSIONS_FORMAT).then_some(user.password_epoch),
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

/// `DELETE /v1/me/password`'s body (optional): the current password, where the caller has no
/// fresh proof.
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PasswordRemoval {
    current_password: Option<String>,
}

/// Sets (or removes) a user's password; every login session made under the one before ends.
async fn set(state: &AppState, user_id: &str, hash: Option<String>) -> Result<Response, ApiError> {
    let ends_sessions = state.node.cluster_format() >= SESSIONS_FORMAT;
    let command = Command::SetPassword { user_id: user_id.to_string(), password_hash: hash, ends_sessions };
    match state.node.write(command).await? {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// Whether the caller proves who they are afresh: an admin, or a token made within
/// [`FRESH_PROOF`] that is not a login session (a session proves only a password, and a
/// password is what is being changed).
fn fresh_proof(principal: &Principal, now_ms: u64) -> bool {
    if principal.user.admin {
        return true;
    }
    let age_ms = now_ms.saturating_sub(principal.token_created_ms);
    !principal.token_session && !principal.token_id.is_empty() && age_ms <= FRESH_PROOF.as_millis() as u64
}

/// 403 unless the caller proves who they are: `current` is the password `stored` (an attempt,
/// as a login is), or, with no `current` given, [`fresh_proof`].
async fn prove(
    state: &AppState,
    principal: &Principal,
    client: Client,
    stored: Option<String>,
    current: Option<String>,
) -> Result<(), ApiError> {
    let Some(current) = current else {
        if fresh_proof(principal, state.node.expiry_now_ms()) {
            return Ok(());
        }
        let needs = if stored.is_some() { "currentPassword" } else { "fresh proof" };
        return Err(ApiError::Forbidden(format!(
            "{needs} is needed: give currentPassword, or call with a token made in the last {} minutes \
             (ask an admin for one), or as an admin",
            FRESH_PROOF.as_secs() / 60
        )));
    };
    let Some(stored) = stored else {
        return Err(ApiError::Forbidden("no password is set; currentPassword names none".into()));
    };
    // A guess at the password through a token: limited as a login is.
    let attempts = &state.passwords.attempts;
    attempts.from_client(client)?;
    attempts.on_name(&principal.user.name, client)?;
    let right = verify(state, Some(stored), current).await?;
    attempts.record(&principal.user.name, client, right);
    if !right {
        return Err(ApiError::Forbidden("currentPassword is not the password".into()));
    }
    Ok(())
}

/// `PUT /v1/me/password`: the caller sets their own password (the current one to change it,
/// fresh proof for a first one).
pub async fn set_mine(
    State(state): State<AppState>,
    principal: Principal,
    request: Request,
) -> Result<Response, ApiError> {
    let client = client_of(&request);
    let body = small_body(request).await?;
    let request: PasswordRequest = json::parse(&body)?;
    check_password_shape(&request.password)?;
    crate::access::barrier(&state, &principal).await?;
    let stored = state.node.state().password_hash(&principal.user.id)?;
    // Once a password is set, only it changes it (fresh proof is for the first one).
    if stored.is_some() && request.current_password.is_none() {
        return Err(ApiError::Forbidden("currentPassword is needed to change a password".into()));
    }
    prove(&state, &principal, client, stored, request.current_password).await?;
    let hashed = hash(&state, request.password).await?;
    set(&state, &principal.user.id, Some(hashed)).await
}

/// `DELETE /v1/me/password`: the caller removes their password (the current one, or fresh
/// proof); their login sessions end.
pub async fn remove_mine(
    State(state): State<AppState>,
    principal: Principal,
    request: Request,
) -> Result<Response, ApiError> {
    let client = client_of(&request);
    let body = small_body(request).await?;
    // No body, or JSON `null` (the description's body is optional and nullable), is none.
    let removal: PasswordRemoval = if body.iter().all(u8::is_ascii_whitespace) {
        PasswordRemoval::default()
    } else {
        json::parse::<Option<PasswordRemoval>>(&body)?.unwrap_or_default()
    };
    crate::access::barrier(&state, &principal).await?;
    let stored = state.node.state().password_hash(&principal.user.id)?;
    if stored.is_none() {
        return Err(ApiError::NotFound("no password is set".into()));
    }
    prove(&state, &principal, client, stored, removal.current_password).await?;
    set(&state, &principal.user.id, None).await
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
