//! Rate limiting: configured limits applied as axum middleware to every matching route.
//!
//! Each request's applicable limits (by route) are turned into keys by scope (user, token,
//! ip, tenant, global, endpoint) and checked in one replicated `RateCheck` command — batched
//! with every other write, evaluated with the leader's time, so a limit holds across all
//! nodes. The most restrictive answer wins. If no decision arrives within the deadline, a
//! limit's `failure` mode decides (`open` admits, `closed` rejects with 503).

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use raftbox_storage::command::RateCheck;
use raftbox_storage::ratelimit::{Algorithm, Decision};
use raftbox_storage::{Command, Outcome};
use serde::Deserialize;

use crate::auth::{bearer_hash, lookup, Principal, TENANT_HEADER};
use crate::{ApiError, AppState};

/// What a limit counts requests by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The authenticated user (all of their tokens together).
    User,
    /// One bearer token.
    Token,
    /// The client's IP address.
    Ip,
    /// The caller's tenant: the `X-Tenant-Id` header, else the user's personal namespace.
    Tenant,
    /// Everyone together.
    Global,
    /// The route (method and path template), for all callers together.
    Endpoint,
}

/// What to do when no decision can be had in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// Admit the request (usage quotas).
    #[default]
    Open,
    /// Reject it with 503 (abuse protection).
    Closed,
}

/// One configured limit (node TOML `[[rate_limits]]`).
#[derive(Debug, Clone, Deserialize)]
pub struct RateLimit {
    pub name: String,
    pub scope: Scope,
    /// Path patterns: exact paths, or prefixes ending in `*` (`/v1/*`).
    pub routes: Vec<String>,
    #[serde(flatten)]
    pub algorithm: Algorithm,
    #[serde(default)]
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

impl RateLimit {
    /// Checks the limit's own parameters.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.contains(['"', '|']) {
            return Err(format!("rate limit name {:?} must be non-empty, without '\"' or '|'", self.name));
        }
        if self.routes.is_empty() {
            return Err(format!("rate limit {}: routes must not be empty", self.name));
        }
        let positive = match self.algorithm {
            Algorithm::TokenBucket { capacity, refill_per_s } => capacity > 0 && refill_per_s > 0,
            Algorithm::LeakyBucket { capacity, drain_per_s } => capacity > 0 && drain_per_s > 0,
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => limit > 0 && window_ms > 0,
        };
        if !positive {
            return Err(format!("rate limit {}: every parameter must be positive", self.name));
        }
        Ok(())
    }

    fn matches(&self, path: &str) -> bool {
        self.routes.iter().any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == pattern,
        })
    }
}

/// A limit that applies to this request, with its state key.
struct Applied<'a> {
    limit: &'a RateLimit,
    key: String,
}

/// The middleware: checks every applicable limit, then runs the route or answers 429.
pub async fn enforce(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let caller = match bearer_hash(request.headers()) {
        Some(hash) if !state.config.rate_limits.is_empty() => lookup(&state, &hash).await.ok().flatten(),
        _ => None,
    };
    if let Some(principal) = &caller {
        request.extensions_mut().insert(principal.clone());
    }
    let applied = applicable(&state, &request, caller.as_ref());
    if applied.is_empty() {
        return next.run(request).await;
    }
    let checks = applied.iter().map(|a| RateCheck { key: a.key.clone(), algorithm: a.limit.algorithm }).collect();
    let timeout = Duration::from_millis(state.config.rate_limiting.decision_timeout_ms);
    let decided = tokio::time::timeout(timeout, state.node.write(Command::RateCheck { checks })).await;
    let (allowed, decisions) = match decided {
        Ok(Ok(Outcome::Rate { allowed, decisions })) => (allowed, decisions),
        other => {
            let reason = match other {
                Err(_) => format!("no decision within {} ms", timeout.as_millis()),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(outcome)) => format!("unexpected outcome {outcome:?}"),
            };
            return undecided(&applied, reason, request, next).await;
        }
    };
    let (index, decision) = most_restrictive(&decisions);
    let mut response = if allowed {
        next.run(request).await
    } else {
        ApiError::RateLimited { retry_after_s: decision.retry_after_ms.div_ceil(1_000).max(1) }.into_response()
    };
    set_headers(response.headers_mut(), &applied, &decisions, index, decision);
    response
}

async fn undecided(applied: &[Applied<'_>], reason: String, request: Request, next: Next) -> Response {
    if let Some(closed) = applied.iter().find(|a| a.limit.failure == Failure::Closed) {
        tracing::warn!(limit = %closed.limit.name, %reason, "rate limiter undecided; failing closed");
        return ApiError::Unavailable(format!("rate limiter unavailable ({reason})")).into_response();
    }
    tracing::debug!(%reason, "rate limiter undecided; failing open");
    next.run(request).await
}

/// The limits that apply to this request and their keys; scopes that need a caller are
/// skipped for requests without a known token (those get their 401 from the route).
fn applicable<'a>(state: &'a AppState, request: &Request, caller: Option<&Principal>) -> Vec<Applied<'a>> {
    let path = request.uri().path();
    let limits: Vec<&RateLimit> = state.config.rate_limits.iter().filter(|l| l.matches(path)).collect();
    if limits.is_empty() {
        return Vec::new();
    }
    let ip = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string());
    let endpoint = request.extensions().get::<MatchedPath>().map_or(path, |m| m.as_str());
    let tenant = request.headers().get(TENANT_HEADER).and_then(|v| v.to_str().ok());
    limits
        .into_iter()
        .filter_map(|limit| {
            let value = match limit.scope {
                Scope::User => format!("user:{}", caller?.user.id),
                Scope::Token => format!("token:{}", caller?.token_id),
                Scope::Ip => format!("ip:{}", ip.as_ref()?),
                Scope::Tenant => match tenant {
                    Some(t) => format!("tenant:{t}"),
                    None => format!("tenant:{}", caller?.user.namespace_id),
                },
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
    }

    #[test]
    fn the_most_restrictive_decision_wins() {
        let d = |allowed, remaining, retry_after_ms| Decision {
            allowed,
            limit: 10,
            remaining,
            reset_ms: 0,
            retry_after_ms,
        };
        assert_eq!(most_restrictive(&[d(true, 5, 0), d(true, 2, 0), d(true, 7, 0)]).0, 1);
        assert_eq!(most_restrictive(&[d(true, 0, 0), d(false, 0, 300), d(false, 0, 900)]).0, 2);
    }

    #[test]
    fn config_parses_from_toml() {
        let parsed: RateLimit = toml::from_str(
            "name = \"per-user\"\nscope = \"user\"\nroutes = [\"/v1/*\"]\nalgorithm = \"sliding_window\"\nlimit = 5\nwindow_ms = 1000\nfailure = \"closed\"",
        )
        .expect("parse");
        assert_eq!(parsed.algorithm, Algorithm::SlidingWindow { limit: 5, window_ms: 1000 });
        assert_eq!((parsed.scope, parsed.failure), (Scope::User, Failure::Closed));
        assert!(parsed.validate().is_ok());
        let zero = RateLimit { algorithm: Algorithm::FixedWindow { limit: 0, window_ms: 1 }, ..parsed };
        assert!(zero.validate().is_err());
    }
}
