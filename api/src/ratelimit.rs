//! Rate limiting: configured limits applied as axum middleware to every matching route.
//!
//! Each request's applicable limits (by route) are turned into keys by scope (user, token,
//! ip, tenant, global, endpoint) and checked together by the leader's limiter
//! (`raftbox_raft::limiter`: decided in memory with the leader's time, replicated in batches),
//! so a limit holds across all nodes. The most restrictive answer wins. If no decision arrives within the deadline, a
//! limit's `failure` mode decides (`open` admits, `closed` rejects with 503).

use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use raftbox_raft::RateAnswer;
use raftbox_storage::command::RateCheck;
use raftbox_storage::ratelimit::{Algorithm, Decision};
use serde::Deserialize;

use crate::auth::{LookedUp, Principal};
use crate::metrics::LimiterDecision;
use crate::runtime_limits::Limits;
use crate::{ApiError, AppState};

/// What a limit counts requests by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The authenticated user (all of their tokens together).
    User,
    /// One bearer token.
    Token,
    /// The client's IP address.
    Ip,
    /// The caller's tenant (a property of the authenticated user).
    Tenant,
    /// Everyone together.
    Global,
    /// The route (method and path template), for all callers together.
    Endpoint,
}

/// What to do when no decision can be had in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// Admit the request (usage quotas).
    #[default]
    Open,
    /// Reject it with 503 (abuse protection).
    Closed,
}

/// One configured limit, parsed and checked (node TOML `[[rate_limits]]`, see
/// [`RateLimitConfig`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub name: String,
    pub scope: Scope,
    /// Path patterns: exact paths, or prefixes ending in `*` (`/v1/*`).
    pub routes: Vec<String>,
    /// Patterns of paths the limit does not cover although `routes` match them.
    pub exclude: Vec<String>,
    pub algorithm: Algorithm,
    pub failure: Failure,
}

/// Rate-limiting settings (node TOML `[rate_limiting]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitingConfig {
    /// How long a request waits for the limiter's decision before `failure` decides.
    pub decision_timeout_ms: u64,
}

impl Default for RateLimitingConfig {
    fn default() -> RateLimitingConfig {
        RateLimitingConfig { decision_timeout_ms: 500 }
    }
}

/// Bounds on limit parameters, checked at config load, so a limiter's arithmetic, memory
/// and waits stay bounded.
pub const LIMIT_MAX: u64 = 1_000_000_000;
pub const RATE_PER_S_MAX: u64 = 1_000_000;
pub const WINDOW_MS_MAX: u64 = 30 * 24 * 3600 * 1000;
/// A limit's name is part of every key it keeps (and of the `RateLimit-Policy` header).
pub const NAME_BYTES_MAX: usize = 64;
/// Route and exclude patterns of one limit: each request matches its path against them.
pub const PATTERNS_MAX: usize = 32;
pub const PATTERN_BYTES_MAX: usize = 256;
/// Where limits are changed is never rate-limited, so no limit can lock the admin out of
/// changing it.
pub const UNLIMITED_PATHS: [&str; 1] = ["/v1/admin/limits"];
/// A sliding log keeps one timestamp per admitted request in the window.
pub const SLIDING_LOG_LIMIT_MAX: u64 = 10_000;
/// A leaky bucket's queue makes a request wait at most this long.
pub const LEAKY_QUEUE_WAIT_MS_MAX: u64 = 60_000;

/// The names of the algorithms, for the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    LeakyBucket,
}

/// A limit as written in the TOML: `algorithm` defaults to `token_bucket`; the parameters
/// are those of the algorithm (`capacity` + `refill_per_s`, `limit` + `window_ms`, or
/// `capacity` + `drain_per_s`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub name: String,
    pub scope: Scope,
    pub routes: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub algorithm: AlgorithmName,
    pub capacity: Option<u64>,
    pub refill_per_s: Option<u64>,
    pub drain_per_s: Option<u64>,
    pub limit: Option<u64>,
    pub window_ms: Option<u64>,
    #[serde(default)]
    pub failure: Failure,
}

impl RateLimitConfig {
    /// Checks the limit's parameters and builds it; the error names the limit and what is
    /// wrong.
    pub fn validate(self) -> Result<RateLimit, String> {
        let name = self.name.clone();
        let fail = |what: String| format!("rate limit {name:?}: {what}");
        if self.name.is_empty()
            || self.name.len() > NAME_BYTES_MAX
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return Err(fail(format!("the name must be 1 to {NAME_BYTES_MAX} letters, digits, '-', '_', '.' or ':'")));
        }
        if self.routes.is_empty() {
            return Err(fail("routes must not be empty".into()));
        }
        if self.routes.len() + self.exclude.len() > PATTERNS_MAX {
            return Err(fail(format!("at most {PATTERNS_MAX} route and exclude patterns together")));
        }
        if let Some(bad) =
            self.routes.iter().chain(&self.exclude).find(|p| !p.starts_with('/') || p.len() > PATTERN_BYTES_MAX)
        {
            return Err(fail(format!("pattern {bad:?} must start with '/' and be at most {PATTERN_BYTES_MAX} bytes")));
        }
        let need = |value: Option<u64>, field: &str, min: u64, max: u64| -> Result<u64, String> {
            let value = value.ok_or_else(|| fail(format!("{:?} needs {field}", self.algorithm)))?;
            if !(min..=max).contains(&value) {
                return Err(fail(format!("{field} must be {min} to {max}, not {value}")));
            }
            Ok(value)
        };
        let algorithm = match self.algorithm {
            AlgorithmName::TokenBucket => Algorithm::TokenBucket {
                capacity: need(self.capacity, "capacity", 1, LIMIT_MAX)?,
                refill_per_s: need(self.refill_per_s, "refill_per_s", 1, RATE_PER_S_MAX)?,
            },
            AlgorithmName::LeakyBucket => {
                let capacity = need(self.capacity, "capacity", 1, LIMIT_MAX)?;
                let drain_per_s = need(self.drain_per_s, "drain_per_s", 1, RATE_PER_S_MAX)?;
                if capacity.saturating_mul(1_000) / drain_per_s > LEAKY_QUEUE_WAIT_MS_MAX {
                    return Err(fail(format!(
                        "capacity / drain_per_s is the longest queue wait; at most {} s",
                        LEAKY_QUEUE_WAIT_MS_MAX / 1_000
                    )));
                }
                Algorithm::LeakyBucket { capacity, drain_per_s }
            }
            AlgorithmName::FixedWindow => Algorithm::FixedWindow {
                limit: need(self.limit, "limit", 1, LIMIT_MAX)?,
                window_ms: need(self.window_ms, "window_ms", 1, WINDOW_MS_MAX)?,
            },
            AlgorithmName::SlidingWindow => Algorithm::SlidingWindow {
                limit: need(self.limit, "limit", 1, LIMIT_MAX)?,
                window_ms: need(self.window_ms, "window_ms", 1, WINDOW_MS_MAX)?,
            },
            AlgorithmName::SlidingLog => Algorithm::SlidingLog {
                limit: need(self.limit, "limit", 1, SLIDING_LOG_LIMIT_MAX)?,
                window_ms: need(self.window_ms, "window_ms", 1, WINDOW_MS_MAX)?,
            },
        };
        let used: &[(&str, Option<u64>)] = &[
            ("capacity", self.capacity),
            ("refill_per_s", self.refill_per_s),
            ("drain_per_s", self.drain_per_s),
            ("limit", self.limit),
            ("window_ms", self.window_ms),
        ];
        let wanted: &[&str] = match self.algorithm {
            AlgorithmName::TokenBucket => &["capacity", "refill_per_s"],
            AlgorithmName::LeakyBucket => &["capacity", "drain_per_s"],
            _ => &["limit", "window_ms"],
        };
        if let Some((field, _)) = used.iter().find(|(field, value)| value.is_some() && !wanted.contains(field)) {
            return Err(fail(format!("{field} does not apply to {:?}", self.algorithm)));
        }
        Ok(RateLimit {
            name: self.name,
            scope: self.scope,
            routes: self.routes,
            exclude: self.exclude,
            algorithm,
            failure: self.failure,
        })
    }
}

fn pattern_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == pattern,
    }
}

impl RateLimit {
    /// The limit as written (what [`RateLimitConfig::validate`] took).
    pub fn to_config(&self) -> RateLimitConfig {
        let (algorithm, capacity, refill_per_s, drain_per_s, limit, window_ms) = match self.algorithm {
            Algorithm::TokenBucket { capacity, refill_per_s } => {
                (AlgorithmName::TokenBucket, Some(capacity), Some(refill_per_s), None, None, None)
            }
            Algorithm::LeakyBucket { capacity, drain_per_s } => {
                (AlgorithmName::LeakyBucket, Some(capacity), None, Some(drain_per_s), None, None)
            }
            Algorithm::FixedWindow { limit, window_ms } => {
                (AlgorithmName::FixedWindow, None, None, None, Some(limit), Some(window_ms))
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                (AlgorithmName::SlidingWindow, None, None, None, Some(limit), Some(window_ms))
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                (AlgorithmName::SlidingLog, None, None, None, Some(limit), Some(window_ms))
            }
        };
        RateLimitConfig {
            name: self.name.clone(),
            scope: self.scope,
            routes: self.routes.clone(),
            exclude: self.exclude.clone(),
            algorithm,
            capacity,
            refill_per_s,
            drain_per_s,
            limit,
            window_ms,
            failure: self.failure,
        }
    }

    fn matches(&self, path: &str) -> bool {
        self.routes.iter().any(|p| pattern_matches(p, path)) && !self.exclude.iter().any(|p| pattern_matches(p, path))
    }
}

impl Scope {
    /// Whether the scope's key names the caller (so it needs the token looked up).
    fn needs_caller(self) -> bool {
        matches!(self, Scope::User | Scope::Token | Scope::Tenant)
    }
}

/// A limit that applies to this request, with its state key.
struct Applied<'a> {
    limit: &'a RateLimit,
    key: String,
}

/// The middleware: finds the caller once, checks every applicable limit, then runs the route
/// or answers 429.
///
/// The caller is resolved here for every request that carries credentials, and left in the
/// request for the route (`Principal`, or `auth::LookedUp(None)` for an unknown token), so it
/// is never looked up twice. A token this node knows costs one point read. A token it does
/// not know (forged, or made an instant ago through another node), and on WebDAV a user's
/// password, first meet the limits that need no caller (ip, global, endpoint): only once
/// they admit the request does the lookup's read barrier cost the leader a round, or the
/// password's check its argon2 work. So a WebDAV client logged in with a password meets its
/// user's, token's and tenant's limits as any other.
pub async fn enforce(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    // The limits in force for this request's whole check (a change swaps them whole).
    let in_force = state.limits.get();
    let mut checked_anonymous = false;
    // Credentials refused here (an expired token) leave the request anonymous: a route that
    // needs a caller answers 401 with why (`auth::Refused`); one that does not serves it.
    let (caller, known) = match crate::auth::resolve_local(&state, request.uri().path(), request.headers()) {
        Ok(found) => found,
        Err(refused) => {
            request.extensions_mut().insert(crate::auth::Refused(refused.to_string()));
            (None, true)
        }
    };
    let mut caller = caller;
    if !known {
        let anonymous = applicable(&in_force, &request, None);
        if !anonymous.is_empty() {
            match decide(&state, &anonymous).await {
                Err(refused) => return refused,
                Ok(Decided::Undecided(reason)) if anonymous.iter().any(|a| a.limit.failure == Failure::Closed) => {
                    state.http_metrics.limiter_decision(LimiterDecision::UndecidedClosed);
                    return ApiError::Unavailable(format!("rate limiter unavailable ({reason})")).into_response();
                }
                Ok(_) => {}
            }
            checked_anonymous = true;
        }
        // A lookup whose barrier failed cannot tell who calls: 503, never a wrong 401, and
        // never a pass past the caller's own limits.
        let path = request.uri().path().to_owned();
        let client = request.extensions().get::<crate::front_door::Client>().copied();
        match crate::auth::resolve(&state, &path, request.headers(), client).await {
            Ok(found) => {
                caller = found;
                request.extensions_mut().insert(LookedUp(caller.clone()));
            }
            Err(refused) => return crate::dav::refusal(&path, refused),
        }
    }
    if let Some(principal) = &caller {
        request.extensions_mut().insert(principal.clone());
    }
    let mut applied = applicable(&in_force, &request, caller.as_ref());
    if checked_anonymous {
        applied.retain(|a| a.limit.scope.needs_caller());
    }
    if applied.is_empty() {
        return next.run(request).await;
    }
    match decide(&state, &applied).await {
        Err(refused) => refused,
        Ok(Decided::Undecided(reason)) => undecided(&state, &applied, reason, request, next).await,
        Ok(Decided::Admitted { delay_ms, decisions }) => {
            // A leaky bucket admits into a queue: the request leaves at the drain rate.
            if delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            }
            let mut response = next.run(request).await;
            let (index, decision) = most_restrictive(&decisions);
            set_headers(response.headers_mut(), &applied, &decisions, index, decision);
            response
        }
    }
}

/// What the limiter said of some limits.
enum Decided {
    Admitted {
        delay_ms: u64,
        decisions: Vec<Decision>,
    },
    /// No decision in time: the limits' failure modes decide.
    Undecided(String),
}

/// Asks the limiter about `applied`; `Err` is the 429 (or the 503 of a closed limit left
/// undecided by the anonymous pre-check) to answer.
async fn decide(state: &AppState, applied: &[Applied<'_>]) -> Result<Decided, Response> {
    let checks = applied.iter().map(|a| RateCheck { key: a.key.clone(), algorithm: a.limit.algorithm }).collect();
    let timeout = Duration::from_millis(state.config.rate_limiting.decision_timeout_ms);
    let deadline = tokio::time::Instant::now() + timeout;
    let decided = tokio::time::timeout_at(deadline, state.node.limiter().check(checks, deadline)).await;
    let RateAnswer { allowed, decisions } = match decided {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Ok(Decided::Undecided(e.to_string())),
        Err(_) => return Ok(Decided::Undecided(format!("no decision within {} ms", timeout.as_millis()))),
    };
    let (index, decision) = most_restrictive(&decisions);
    let counted = if allowed { LimiterDecision::Admitted } else { LimiterDecision::Rejected };
    state.http_metrics.limiter_decision(counted);
    if !allowed {
        let mut response =
            ApiError::RateLimited { retry_after_s: decision.retry_after_ms.div_ceil(1_000).max(1) }.into_response();
        set_headers(response.headers_mut(), applied, &decisions, index, decision);
        return Err(response);
    }
    let delay_ms = decisions.iter().map(|d| d.delay_ms).max().unwrap_or(0);
    Ok(Decided::Admitted { delay_ms, decisions })
}

async fn undecided(
    state: &AppState,
    applied: &[Applied<'_>],
    reason: String,
    request: Request,
    next: Next,
) -> Response {
    if let Some(closed) = applied.iter().find(|a| a.limit.failure == Failure::Closed) {
        state.http_metrics.limiter_decision(LimiterDecision::UndecidedClosed);
        tracing::warn!(limit = %closed.limit.name, %reason, "rate limiter undecided; failing closed");
        return ApiError::Unavailable(format!("rate limiter unavailable ({reason})")).into_response();
    }
    state.http_metrics.limiter_decision(LimiterDecision::UndecidedOpen);
    tracing::debug!(%reason, "rate limiter undecided; failing open");
    next.run(request).await
}

/// The limits that apply to this request and their keys; scopes that need a caller are
/// skipped for requests without a known token (those get their 401 from the route).
fn applicable<'a>(in_force: &'a Limits, request: &Request, caller: Option<&Principal>) -> Vec<Applied<'a>> {
    let path = request.uri().path();
    if UNLIMITED_PATHS.contains(&path) {
        return Vec::new();
    }
    let limits: Vec<&RateLimit> = in_force.rate_limits.iter().filter(|l| l.matches(path)).collect();
    if limits.is_empty() {
        return Vec::new();
    }
    let ip = request.extensions().get::<crate::front_door::Client>().map(|client| client.to_string());
    let endpoint = request.extensions().get::<MatchedPath>().map_or(path, |m| m.as_str());
    limits
        .into_iter()
        .filter_map(|limit| {
            let value = match limit.scope {
                Scope::User => format!("user:{}", caller?.user.id),
                // A password's caller (WebDAV) has no token: its password is its "token".
                Scope::Token => match caller? {
                    c if c.token_id.is_empty() => format!("token:password:{}", c.user.id),
                    c => format!("token:{}", c.token_id),
                },
                Scope::Ip => format!("ip:{}", ip.as_ref()?),
                Scope::Tenant => format!("tenant:{}", caller?.tenant()),
                Scope::Global => "global".to_string(),
                Scope::Endpoint => format!("endpoint:{} {endpoint}", request.method()),
            };
            Some(Applied { limit, key: format!("{}|{value}", limit.name) })
        })
        .collect()
}

/// The decision that binds: a rejection with the longest wait, else the fewest remaining.
fn most_restrictive(decisions: &[Decision]) -> (usize, Decision) {
    let mut best = 0;
    for (i, d) in decisions.iter().enumerate() {
        let b = &decisions[best];
        let tighter = match (d.allowed, b.allowed) {
            (false, true) => true,
            (false, false) => d.retry_after_ms > b.retry_after_ms,
            (true, true) => d.remaining < b.remaining,
            (true, false) => false,
        };
        if tighter {
            best = i;
        }
    }
    (best, decisions[best])
}

fn set_headers(headers: &mut HeaderMap, applied: &[Applied<'_>], decisions: &[Decision], index: usize, d: Decision) {
    let reset_s = d.reset_ms.div_ceil(1_000);
    let mut put = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    };
    put("x-ratelimit-limit", d.limit.to_string());
    put("x-ratelimit-remaining", d.remaining.to_string());
    put("x-ratelimit-reset", reset_s.to_string());
    let policies: Vec<String> = applied
        .iter()
        .zip(decisions)
        .map(|(a, d)| format!("\"{}\";q={};w={}", a.limit.name, d.limit, a.limit.algorithm.window_s()))
        .collect();
    put("ratelimit-policy", policies.join(", "));
    put("ratelimit", format!("\"{}\";r={};t={}", applied[index].limit.name, d.remaining, reset_s));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(routes: &[&str]) -> RateLimit {
        RateLimit {
            name: "l".into(),
            scope: Scope::Global,
            routes: routes.iter().map(|r| r.to_string()).collect(),
            exclude: vec!["/v1/blocks/*".into()],
            algorithm: Algorithm::TokenBucket { capacity: 1, refill_per_s: 1 },
            failure: Failure::Open,
        }
    }

    #[test]
    fn route_patterns() {
        let l = limit(&["/v1/*", "/healthz"]);
        assert!(l.matches("/v1/me"));
        assert!(l.matches("/v1/admin/users/x/tokens"));
        assert!(l.matches("/healthz"));
        assert!(!l.matches("/healthz/x"));
        assert!(!l.matches("/readyz"));
        assert!(!l.matches("/v1/blocks/abc"), "excluded");
    }

    #[test]
    fn the_most_restrictive_decision_wins() {
        let d = |allowed, remaining, retry_after_ms| Decision {
            allowed,
            limit: 10,
            remaining,
            reset_ms: 0,
            retry_after_ms,
            delay_ms: 0,
        };
        assert_eq!(most_restrictive(&[d(true, 5, 0), d(true, 2, 0), d(true, 7, 0)]).0, 1);
        assert_eq!(most_restrictive(&[d(true, 0, 0), d(false, 0, 300), d(false, 0, 900)]).0, 2);
    }

    fn parse(text: &str) -> Result<RateLimit, String> {
        toml::from_str::<RateLimitConfig>(text).map_err(|e| e.to_string())?.validate()
    }

    #[test]
    fn config_parses_from_toml() {
        let parsed = parse(
            "name = \"per-user\"\nscope = \"user\"\nroutes = [\"/v1/*\"]\nalgorithm = \"sliding_window\"\nlimit = 5\nwindow_ms = 1000\nfailure = \"closed\"",
        )
        .expect("parse");
        assert_eq!(parsed.algorithm, Algorithm::SlidingWindow { limit: 5, window_ms: 1000 });
        assert_eq!((parsed.scope, parsed.failure), (Scope::User, Failure::Closed));
        // The algorithm defaults to the token bucket.
        let default =
            parse("name = \"d\"\nscope = \"ip\"\nroutes = [\"/\"]\ncapacity = 10\nrefill_per_s = 2").expect("parse");
        assert_eq!(default.algorithm, Algorithm::TokenBucket { capacity: 10, refill_per_s: 2 });
    }

    #[test]
    fn bad_parameters_are_refused_with_a_reason() {
        let base = "name = \"x\"\nscope = \"ip\"\nroutes = [\"/\"]\n";
        for (params, says) in [
            ("algorithm = \"fixed_window\"\nlimit = 0\nwindow_ms = 1", "limit must be"),
            ("capacity = 10", "needs refill_per_s"),
            ("capacity = 99999999999999999\nrefill_per_s = 1", "capacity must be"),
            ("capacity = 10\nrefill_per_s = 1\nwindow_ms = 5", "does not apply"),
            ("algorithm = \"sliding_log\"\nlimit = 100000\nwindow_ms = 1000", "limit must be"),
            ("algorithm = \"leaky_bucket\"\ncapacity = 1000\ndrain_per_s = 1", "queue wait"),
            ("algorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 999999999999", "window_ms must be"),
        ] {
            let error = parse(&format!("{base}{params}")).expect_err(params);
            assert!(error.contains(says), "{params}: {error}");
        }
    }
}
