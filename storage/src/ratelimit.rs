//! The five rate-limit algorithms of the spec, each a small pure type: given its state and
//! the time, `check` answers whether one more request is allowed and returns the new state.
//!
//! All arithmetic is in integers (milliseconds, milli-tokens, microseconds for the leaky
//! bucket's queue) so every node computes exactly the same answer inside `apply`, and it is
//! total: intermediate products are taken in `u128` and results saturate, so no parameter or
//! time, however extreme, can overflow or panic (configs bound the parameters anyway).

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
    /// A queue of `capacity` requests drained at `drain_per_s` per second: an admitted request
    /// waits for its slot (`Decision::delay_ms`) and leaves at the drain rate; a request that
    /// does not fit is dropped. No burst passes at once.
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
    /// Leaky bucket: when the queue is empty again, i.e. the earliest departure time of the
    /// next request (a GCRA theoretical arrival time), in microseconds.
    Queue { free_at_us: u64 },
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    /// The limit that applies (bucket size or requests per window).
    pub limit: u64,
    /// Requests left right now after this one.
    pub remaining: u64,
    /// Milliseconds until the limit is fully reset (bucket full, window over, queue empty).
    pub reset_ms: u64,
    /// When rejected: milliseconds until a request would be admitted.
    pub retry_after_ms: u64,
    /// When admitted by a leaky bucket: milliseconds the request waits in the queue for its
    /// slot before it may proceed (0 for every other algorithm).
    #[serde(default)]
    pub delay_ms: u64,
}

const MILLI: u64 = 1_000;

/// Most admissions a leader holds unreplicated per key (see [`Algorithm::credit`]).
pub const CREDIT_MAX: u64 = 4_096;
/// Most timestamps one charge adds to a sliding log (a charge is at most a credit).
const SLIDING_LOG_CHARGE_MAX: u64 = CREDIT_MAX;

/// `a / b` rounded up; `u64::MAX` for `b = 0`.
fn ceil_div(a: u64, b: u64) -> u64 {
    if b == 0 {
        return u64::MAX;
    }
    a.div_ceil(b)
}

/// A `u128` intermediate back to `u64`, saturating.
fn sat(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// `a × b`, saturating.
fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
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

    /// Admissions a leader may hand out for one key before they are replicated (see the
    /// leader's limiter, `raft::limiter`): a new leader charges this many to every key it
    /// takes over, as admissions the old leader may have given that no log holds. An
    /// eighth of the limit, 1 to [`CREDIT_MAX`].
    pub fn credit(&self) -> u64 {
        (self.limit() / 8).clamp(1, CREDIT_MAX)
    }

    /// `state` with `n` admissions recorded at `now_ms` whether or not they fit (the bucket
    /// may go into debt: tokens come back only after it is repaid). Used for admissions that
    /// may have happened but are not known; counting them is the conservative choice.
    pub fn charge(&self, state: Option<&LimitState>, now_ms: u64, n: u64) -> LimitState {
        match *self {
            Algorithm::TokenBucket { capacity, refill_per_s } => {
                let full = mul(capacity, MILLI);
                // Tokens at `base`: now, or later for a bucket in debt (empty until then).
                let (tokens, base) = match state {
                    Some(LimitState::Bucket { milli_tokens, at_ms }) if *at_ms > now_ms => (*milli_tokens, *at_ms),
                    Some(LimitState::Bucket { milli_tokens, at_ms }) => {
                        (full.min(milli_tokens.saturating_add(mul(now_ms - at_ms, refill_per_s))), now_ms)
                    }
                    _ => (full, now_ms),
                };
                let owed = mul(n, MILLI);
                if tokens >= owed {
                    LimitState::Bucket { milli_tokens: tokens - owed, at_ms: base }
                } else {
                    // In debt: empty until the refill has repaid what is owed (rounded up).
                    let debt_ms = ceil_div(owed - tokens, refill_per_s);
                    LimitState::Bucket { milli_tokens: 0, at_ms: base.saturating_add(debt_ms) }
                }
            }
            Algorithm::FixedWindow { window_ms, .. } => {
                let window_ms = window_ms.max(1);
                let start = now_ms - now_ms % window_ms;
                let count = match state {
                    Some(LimitState::Window { window_start_ms, count }) if *window_start_ms == start => *count,
                    _ => 0,
                };
                LimitState::Window { window_start_ms: start, count: count.saturating_add(n) }
            }
            Algorithm::SlidingLog { window_ms, .. } => {
                let mut times: Vec<u64> = match state {
                    Some(LimitState::Log { times_ms }) => {
                        times_ms.iter().copied().filter(|t| t.saturating_add(window_ms.max(1)) > now_ms).collect()
                    }
                    _ => Vec::new(),
                };
                let newest = times.last().copied().unwrap_or(now_ms).max(now_ms);
                times.extend(std::iter::repeat_n(newest, n.min(SLIDING_LOG_CHARGE_MAX) as usize));
                LimitState::Log { times_ms: times }
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                let window_ms = window_ms.max(1);
                let start = now_ms - now_ms % window_ms;
                let (current, previous) = counts_at(state, window_ms, start);
                LimitState::Counter { window_start_ms: start, current: current.saturating_add(n), previous }
            }
            Algorithm::LeakyBucket { drain_per_s, .. } => {
                let now_us = mul(now_ms, MILLI);
                let free_at = match state {
                    Some(LimitState::Queue { free_at_us }) => (*free_at_us).max(now_us),
                    _ => now_us,
                };
                LimitState::Queue { free_at_us: free_at.saturating_add(mul(n, interval_us(drain_per_s))) }
            }
        }
    }

    /// When `state`, last touched at `now_ms`, becomes indistinguishable from no state (an
    /// upper bound, also for a bucket in debt or a queue that reaches into the future).
    pub fn idle_at_ms(&self, state: &LimitState, now_ms: u64) -> u64 {
        let own = match state {
            LimitState::Bucket { at_ms, .. } => *at_ms,
            LimitState::Queue { free_at_us } => free_at_us.div_ceil(MILLI),
            LimitState::Log { times_ms } => times_ms.last().copied().unwrap_or(0),
            LimitState::Window { .. } | LimitState::Counter { .. } => 0,
        };
        own.max(now_ms).saturating_add(self.idle_after_ms())
    }

    /// How long after a check the key's state becomes indistinguishable from no state (an
    /// upper bound): used to drop idle keys.
    pub fn idle_after_ms(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, refill_per_s } => ceil_div(mul(capacity, MILLI), refill_per_s),
            Algorithm::LeakyBucket { capacity, drain_per_s } => {
                ceil_div(mul(capacity, interval_us(drain_per_s)), MILLI)
            }
            Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingLog { window_ms, .. } => window_ms,
            Algorithm::SlidingWindow { window_ms, .. } => window_ms.saturating_mul(2),
        }
    }
}

fn token_bucket(capacity: u64, refill_per_s: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let full = mul(capacity, MILLI);
    let (tokens, at_ms) = match state {
        Some(LimitState::Bucket { milli_tokens, at_ms }) => (*milli_tokens, *at_ms),
        _ => (full, now_ms),
    };
    // tokens = min(B, tokens + elapsed × r); elapsed ms × r tokens/s = milli-tokens.
    let elapsed_ms = now_ms.saturating_sub(at_ms);
    let tokens = full.min(tokens.saturating_add(mul(elapsed_ms, refill_per_s)));
    let allowed = tokens >= MILLI;
    let after = if allowed { tokens - MILLI } else { tokens };
    // A bucket charged into debt (see `Algorithm::charge`) refills only from `at_ms` on.
    let waiting_ms = at_ms.saturating_sub(now_ms);
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: after / MILLI,
        reset_ms: waiting_ms.saturating_add(ceil_div(full.saturating_sub(after), refill_per_s)),
        retry_after_ms: if allowed { 0 } else { waiting_ms.saturating_add(ceil_div(MILLI - tokens, refill_per_s)) },
        delay_ms: 0,
    };
    (decision, LimitState::Bucket { milli_tokens: after, at_ms: now_ms.max(at_ms) })
}

fn fixed_window(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let start = now_ms - now_ms % window_ms;
    let count = match state {
        Some(LimitState::Window { window_start_ms, count }) if *window_start_ms == start => *count,
        _ => 0,
    };
    let reset_ms = start.saturating_add(window_ms).saturating_sub(now_ms);
    let allowed = count < limit;
    let count = if allowed { count + 1 } else { count };
    let decision = Decision {
        allowed,
        limit,
        remaining: limit.saturating_sub(count),
        reset_ms,
        retry_after_ms: if allowed { 0 } else { reset_ms },
        delay_ms: 0,
    };
    (decision, LimitState::Window { window_start_ms: start, count })
}

fn sliding_log(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let mut times: Vec<u64> = match state {
        Some(LimitState::Log { times_ms }) => {
            times_ms.iter().copied().filter(|t| t.saturating_add(window_ms) > now_ms).collect()
        }
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
        reset_ms: newest.saturating_add(window_ms).saturating_sub(now_ms),
        retry_after_ms: if allowed { 0 } else { oldest.saturating_add(window_ms).saturating_sub(now_ms) },
        delay_ms: 0,
    };
    (decision, LimitState::Log { times_ms: times })
}

/// A sliding-window counter's current and previous counts in the window starting at `start`.
fn counts_at(state: Option<&LimitState>, window_ms: u64, start: u64) -> (u64, u64) {
    match state {
        Some(LimitState::Counter { window_start_ms, current, previous }) => {
            if *window_start_ms == start {
                (*current, *previous)
            } else if window_start_ms.checked_add(window_ms) == Some(start) {
                (0, *current)
            } else {
                (0, 0)
            }
        }
        _ => (0, 0),
    }
}

fn sliding_window(limit: u64, window_ms: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let start = now_ms - now_ms % window_ms;
    let (current, previous) = counts_at(state, window_ms, start);
    // count ≈ current + previous × (part of the previous window still in view), in
    // milli-requests: previous × (window − elapsed) / window.
    let elapsed = now_ms - start;
    let weighted_milli = |current: u64| -> u128 {
        u128::from(current) * 1_000
            + u128::from(previous) * 1_000 * u128::from(window_ms - elapsed) / u128::from(window_ms)
    };
    let limit_milli = u128::from(limit) * 1_000;
    let allowed = weighted_milli(current) + 1_000 <= limit_milli;
    let current = if allowed { current + 1 } else { current };
    let used_milli = weighted_milli(current);
    let decision = Decision {
        allowed,
        limit,
        remaining: sat(limit_milli.saturating_sub(used_milli) / 1_000),
        reset_ms: start.saturating_add(window_ms.saturating_mul(2)).saturating_sub(now_ms),
        retry_after_ms: if allowed { 0 } else { retry_sliding(limit, window_ms, current, previous, elapsed) },
        delay_ms: 0,
    };
    (decision, LimitState::Counter { window_start_ms: start, current, previous })
}

/// Milliseconds until the weighted count leaves room for one more request.
fn retry_sliding(limit: u64, window_ms: u64, current: u64, previous: u64, elapsed: u64) -> u64 {
    // Within this window: need current + previous × (w − e')/w ≤ limit − 1, i.e.
    // previous × (w − e') × 1000 / w ≤ room  ⇔  e' ≥ w − room × w / (previous × 1000).
    if current < limit && previous > 0 {
        let room_milli = u128::from(limit - 1 - current) * 1_000;
        let keep = sat(room_milli * u128::from(window_ms) / (u128::from(previous) * 1_000));
        let at = window_ms.saturating_sub(keep);
        if at > elapsed && at < window_ms {
            return at - elapsed;
        }
    }
    // Otherwise the next window, where `current` becomes the previous count.
    window_ms - elapsed
}

/// Microseconds between two departures of a leaky bucket (at least 1).
fn interval_us(drain_per_s: u64) -> u64 {
    ceil_div(1_000_000, drain_per_s).max(1)
}

/// The leaky bucket as a queue (GCRA): `free_at` is when the queue would be empty. A request
/// fits while fewer than `capacity` requests are in the queue (`free_at − now ≤ (capacity − 1)
/// × interval`); it departs at `max(now, free_at)`, which is its delay, and moves `free_at`
/// one interval on.
fn leaky_bucket(capacity: u64, drain_per_s: u64, state: Option<&LimitState>, now_ms: u64) -> (Decision, LimitState) {
    let interval = interval_us(drain_per_s);
    let now_us = mul(now_ms, MILLI);
    let free_at = match state {
        Some(LimitState::Queue { free_at_us }) => (*free_at_us).max(now_us),
        _ => now_us,
    };
    let queued = free_at - now_us;
    let room = mul(capacity.saturating_sub(1), interval);
    let allowed = capacity > 0 && queued <= room;
    let free_at = if allowed { free_at.saturating_add(interval) } else { free_at };
    let level = free_at - now_us;
    let decision = Decision {
        allowed,
        limit: capacity,
        remaining: capacity.saturating_sub(ceil_div(level, interval)),
        reset_ms: ceil_div(level, MILLI),
        retry_after_ms: if allowed { 0 } else { ceil_div(queued.saturating_sub(room), MILLI).max(1) },
        delay_ms: if allowed { ceil_div(queued, MILLI) } else { 0 },
    };
    (decision, LimitState::Queue { free_at_us: free_at })
}

#[cfg(test)]
#[path = "ratelimit_tests.rs"]
mod tests;
