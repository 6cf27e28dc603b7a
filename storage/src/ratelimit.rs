//! The five rate-limit algorithms of the spec, each a small pure type: given its state and
//! the time, `check` answers whether one more request is allowed and returns the new state.
//!
//! All arithmetic is in integer milliseconds (and milli-tokens for the buckets) so every node
//! computes exactly the same answer inside `apply`.

use serde::{Deserialize, Serialize};

/// A limit's algorithm and parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    /// Bucket of `capacity` tokens refilled at `refill_per_s` tokens per second; a request
    /// takes one token.
    TokenBucket { capacity: u64, refill_per_s: u64 },
    /// At most `limit` requests per aligned window of `window_ms`.
    FixedWindow { limit: u64, window_ms: u64 },
    /// At most `limit` requests in any trailing `window_ms` (exact; one timestamp each).
    SlidingLog { limit: u64, window_ms: u64 },
    /// Current window count plus the previous window's count weighted by the part of it
    /// still in view, at most `limit` (approximate).
    SlidingWindow { limit: u64, window_ms: u64 },
    /// A queue of `capacity` requests drained at `drain_per_s` per second; a request that
    /// does not fit is dropped.
    LeakyBucket { capacity: u64, drain_per_s: u64 },
}

/// The state kept per limit and key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LimitState {
    /// Token bucket: milli-tokens available at `at_ms`.
    Bucket { milli_tokens: u64, at_ms: u64 },
    /// Fixed window: requests counted in the window starting at `window_start_ms`.
    Window { window_start_ms: u64, count: u64 },
    /// Sliding log: time of each admitted request still in view, oldest first.
    Log { times_ms: Vec<u64> },
    /// Sliding window counter: counts of the current and previous aligned windows.
    Counter { window_start_ms: u64, current: u64, previous: u64 },
    /// Leaky bucket: milli-requests queued at `at_ms`.
    Queue { milli_level: u64, at_ms: u64 },
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    /// The limit that applies (bucket size or requests per window).
    pub limit: u64,
    /// Requests left right now after this one.
    pub remaining: u64,
    /// Milliseconds until the limit is fully reset (bucket full, window over).
    pub reset_ms: u64,
    /// When rejected: milliseconds until a request would be admitted.
    pub retry_after_ms: u64,
}

const MILLI: u64 = 1_000;

fn ceil_div(a: u64, b: u64) -> u64 {
    if b == 0 {
        return u64::MAX;
    }
    a.div_ceil(b)
}

impl Algorithm {
    /// The limit as a client sees it (for headers).
    pub fn limit(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => capacity,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::SlidingWindow { limit, .. } => limit,
        }
    }

    /// The policy window in seconds (for the `RateLimit-Policy` header).
    pub fn window_s(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, refill_per_s } => ceil_div(capacity, refill_per_s).max(1),
            Algorithm::LeakyBucket { capacity, drain_per_s } => ceil_div(capacity, drain_per_s).max(1),
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. }
            | Algorithm::SlidingWindow { window_ms, .. } => ceil_div(window_ms, 1_000).max(1),
        }
    }

    /// Checks one request at `now_ms` against `state` (None: never seen). Returns the
    /// decision and the state to store; a rejected request leaves the state as it would be
    /// without it.
    pub fn check(&self, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
        match *self {
            Algorithm::TokenBucket { capacity, refill_per_s } => token_bucket(capacity, refill_per_s, state, now_ms),
            Algorithm::FixedWindow { limit, window_ms } => fixed_window(limit, window_ms.max(1), state, now_ms),
            Algorithm::SlidingLog { limit, window_ms } => sliding_log(limit, window_ms.max(1), state, now_ms),
            Algorithm::SlidingWindow { limit, window_ms } => sliding_window(limit, window_ms.max(1), state, now_ms),
            Algorithm::LeakyBucket { capacity, drain_per_s } => leaky_bucket(capacity, drain_per_s, state, now_ms),
        }
    }

    /// The state the key returns to when idle long enough: used to drop idle keys.
    pub fn idle_after_ms(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, refill_per_s } => ceil_div(capacity * MILLI, refill_per_s),
            Algorithm::LeakyBucket { capacity, drain_per_s } => ceil_div(capacity * MILLI, drain_per_s),
            Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingLog { window_ms, .. } => window_ms,
            Algorithm::SlidingWindow { window_ms, .. } => window_ms.saturating_mul(2),
        }
    }
}

fn token_bucket(capacity: u64, refill_per_s: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let full = capacity * MILLI;
    let (tokens, at_ms) = match state {
        Some(LimitState::Bucket { milli_tokens, at_ms }) => (*milli_tokens, *at_ms),
        _ => (full, now_ms),
    };
    // tokens = min(B, tokens + elapsed × r); elapsed ms × r tokens/s = milli-tokens.
    let elapsed_ms = now_ms.saturating_sub(at_ms);
    let tokens = full.min(tokens.saturating_add(elapsed_ms.saturating_mul(refill_per_s)));
    let allowed = tokens >= MILLI;
    let after = if allowed { tokens - MILLI } else { tokens };
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: after / MILLI,
        reset_ms: ceil_div(full - after, refill_per_s),
        retry_after_ms: if allowed { 0 } else { ceil_div(MILLI - tokens, refill_per_s) },
    };
    (decision, LimitState::Bucket { milli_tokens: after, at_ms: now_ms.max(at_ms) })
}

fn fixed_window(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let start = now_ms - now_ms % window_ms;
    let count = match state {
        Some(LimitState::Window { window_start_ms, count }) if *window_start_ms == start => *count,
        _ => 0,
    };
    let reset_ms = start + window_ms - now_ms;
    let allowed = count < limit;
    let count = if allowed { count + 1 } else { count };
    let decision = Decision {
        allowed,
        limit,
        remaining: limit.saturating_sub(count),
        reset_ms,
        retry_after_ms: if allowed { 0 } else { reset_ms },
    };
    (decision, LimitState::Window { window_start_ms: start, count })
}

fn sliding_log(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let mut times: Vec<u64> = match state {
        Some(LimitState::Log { times_ms }) => times_ms.iter().copied().filter(|t| t + window_ms > now_ms).collect(),
        _ => Vec::new(),
    };
    let allowed = (times.len() as u64) < limit;
    if allowed {
        times.push(now_ms);
    }
    let oldest = times.first().copied().unwrap_or(now_ms);
    let newest = times.last().copied().unwrap_or(now_ms);
    let decision = Decision {
        allowed,
        limit,
        remaining: limit.saturating_sub(times.len() as u64),
        reset_ms: (newest + window_ms).saturating_sub(now_ms),
        retry_after_ms: if allowed { 0 } else { (oldest + window_ms).saturating_sub(now_ms) },
    };
    (decision, LimitState::Log { times_ms: times })
}

fn sliding_window(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let start = now_ms - now_ms % window_ms;
    let (current, previous) = match state {
        Some(LimitState::Counter { window_start_ms, current, previous }) => {
            if *window_start_ms == start {
                (*current, *previous)
            } else if *window_start_ms + window_ms == start {
                (0, *current)
            } else {
                (0, 0)
            }
        }
        _ => (0, 0),
    };
    // count ≈ current + previous × (part of the previous window still in view), in
    // milli-requests: previous × (window − elapsed) / window.
    let elapsed = now_ms - start;
    let weighted_milli = |current: u64| current * MILLI + previous * MILLI * (window_ms - elapsed) / window_ms;
    let allowed = weighted_milli(current) + MILLI <= limit * MILLI;
    let current = if allowed { current + 1 } else { current };
    let used_milli = weighted_milli(current);
    let decision = Decision {
        allowed,
        limit,
        remaining: (limit * MILLI).saturating_sub(used_milli) / MILLI,
        reset_ms: start + 2 * window_ms - now_ms,
        retry_after_ms: if allowed { 0 } else { retry_sliding(limit, window_ms, current, previous, elapsed) },
    };
    (decision, LimitState::Counter { window_start_ms: start, current, previous })
}

/// Milliseconds until the weighted count leaves room for one more request.
fn retry_sliding(limit: u64, window_ms: u64, current: u64, previous: u64, elapsed: u64) -> u64 {
    // Within this window: need current + previous × (w − e')/w ≤ limit − 1.
    if current < limit && previous > 0 {
        let room_milli = (limit - 1 - current) * MILLI; // capacity left for the previous part
                                                        // previous × (w − e') × MILLI / w ≤ room  ⇔  e' ≥ w − room × w / (previous × MILLI)
        let keep = room_milli * window_ms / (previous * MILLI);
        let at = window_ms.saturating_sub(keep);
        if at > elapsed && at < window_ms {
            return at - elapsed;
        }
    }
    // Otherwise the next window, where `current` becomes the previous count.
    window_ms - elapsed
}

fn leaky_bucket(capacity: u64, drain_per_s: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let (level, at_ms) = match state {
        Some(LimitState::Queue { milli_level, at_ms }) => (*milli_level, *at_ms),
        _ => (0, now_ms),
    };
    let drained = now_ms.saturating_sub(at_ms).saturating_mul(drain_per_s);
    let level = level.saturating_sub(drained);
    let allowed = level + MILLI <= capacity * MILLI;
    let level = if allowed { level + MILLI } else { level };
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: (capacity * MILLI - level) / MILLI,
        reset_ms: ceil_div(level, drain_per_s),
        retry_after_ms: if allowed { 0 } else { ceil_div(level + MILLI - capacity * MILLI, drain_per_s) },
    };
    (decision, LimitState::Queue { milli_level: level, at_ms: now_ms.max(at_ms) })
}

#[cfg(test)]
#[path = "ratelimit_tests.rs"]
mod tests;
