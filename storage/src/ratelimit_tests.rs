//! Hand-computed sequences for each rate-limit algorithm.

use super::*;

/// Runs `times` through `algorithm` from an empty state; returns (allowed, remaining) per
/// request.
fn run(algorithm: Algorithm, times: &[u64]) -> Vec<(bool, u64)> {
    let mut state = None;
    let mut out = Vec::new();
    for &t in times {
        let (decision, next) = algorithm.check(state.as_ref(), t);
        state = Some(next);
        out.push((decision.allowed, decision.remaining));
    }
    out
}

fn check(algorithm: Algorithm, times: &[u64], expected: &[(bool, u64)]) {
    assert_eq!(run(algorithm, times), expected, "{algorithm:?} at {times:?}");
}

#[test]
fn token_bucket_burst_then_refill() {
    // B = 3, r = 2/s: three at once, the fourth rejected; 500 ms later one token is back.
    let bucket = Algorithm::TokenBucket { capacity: 3, refill_per_s: 2 };
    check(
        bucket,
        &[0, 0, 0, 0, 499, 500, 500],
        &[(true, 2), (true, 1), (true, 0), (false, 0), (false, 0), (true, 0), (false, 0)],
    );
    // Refill never exceeds B: idle for an hour, still only 3.
    check(
        bucket,
        &[0, 3_600_000, 3_600_000, 3_600_000, 3_600_000],
        &[(true, 2), (true, 2), (true, 1), (true, 0), (false, 0)],
    );
}

#[test]
fn token_bucket_retry_after_and_reset() {
    let bucket = Algorithm::TokenBucket { capacity: 2, refill_per_s: 4 };
    let (first, s) = bucket.check(None, 1_000);
    let (_, s) = bucket.check(Some(&s), 1_000);
    let (rejected, _) = bucket.check(Some(&s), 1_100);
    assert_eq!((first.reset_ms, first.retry_after_ms), (250, 0)); // one token missing: 1/4 s
                                                                  // At 1100 ms 0.4 tokens are back; 0.6 more take 150 ms.
    assert_eq!((rejected.allowed, rejected.retry_after_ms), (false, 150));
    assert_eq!(rejected.reset_ms, 400);
}

#[test]
fn fixed_window_allows_double_burst_at_the_boundary() {
    // limit 3 per 1000 ms: 3 at 900..999 and 3 more at 1000..1099 — 6 within 200 ms.
    let window = Algorithm::FixedWindow { limit: 3, window_ms: 1_000 };
    check(
        window,
        &[900, 950, 999, 999, 1_000, 1_050, 1_099, 1_100],
        &[(true, 2), (true, 1), (true, 0), (false, 0), (true, 2), (true, 1), (true, 0), (false, 0)],
    );
    let (rejected, _) = window.check(Some(&LimitState::Window { window_start_ms: 1_000, count: 3 }), 1_100);
    assert_eq!((rejected.reset_ms, rejected.retry_after_ms), (900, 900));
}

#[test]
fn sliding_log_is_exact() {
    // limit 3 per 1000 ms: the boundary burst of the fixed window is refused.
    let log = Algorithm::SlidingLog { limit: 3, window_ms: 1_000 };
    check(
        log,
        &[900, 950, 999, 1_000, 1_050, 1_899, 1_900, 1_950],
        // 1900: 900 left the view (900 + 1000 <= 1900); 1950: 950 left too.
        &[(true, 2), (true, 1), (true, 0), (false, 0), (false, 0), (false, 0), (true, 0), (true, 0)],
    );
    let (rejected, _) = log.check(Some(&LimitState::Log { times_ms: vec![900, 950, 999] }), 1_000);
    assert_eq!(rejected.retry_after_ms, 900); // until 900 leaves the view at 1900
}

#[test]
fn sliding_window_counter_approximates() {
    // limit 10 per 1000 ms; 10 requests in window [0, 1000), then at 1250 the previous
    // window still counts 10 × 750/1000 = 7.5, so 2 more fit (7.5 + 2 = 9.5 ≤ 10), a third
    // does not (10.5).
    let counter = Algorithm::SlidingWindow { limit: 10, window_ms: 1_000 };
    let mut times = vec![500; 10];
    times.extend([1_250, 1_250, 1_250]);
    let result = run(counter, &times);
    assert!(result[..10].iter().all(|(allowed, _)| *allowed));
    assert_eq!(result[9], (true, 0));
    // Remaining after each: floor(10 − 8.5) = 1, floor(10 − 9.5) = 0.
    assert_eq!(&result[10..], &[(true, 1), (true, 0), (false, 0)]);
    // At 1500 the weight is 5: 5 + 2 = 7, so 3 more fit: 8, 9, 10.
    let state = LimitState::Counter { window_start_ms: 1_000, current: 2, previous: 10 };
    let mut s = Some(state);
    let mut allowed = 0;
    for _ in 0..5 {
        let (d, next) = counter.check(s.as_ref(), 1_500);
        allowed += u64::from(d.allowed);
        s = Some(next);
    }
    assert_eq!(allowed, 3);
    // Two windows later nothing is remembered.
    let (d, _) = counter.check(s.as_ref(), 3_000);
    assert_eq!((d.allowed, d.remaining), (true, 9));
}

#[test]
fn sliding_window_retry_after_points_at_room() {
    let counter = Algorithm::SlidingWindow { limit: 10, window_ms: 1_000 };
    // current 2, previous 10 at 1250: 2 + 7.5 = 9.5 → one more needs ≤ 9: previous part ≤ 7
    // → 10 × (1000 − e)/1000 ≤ 7 → e ≥ 300 → 50 ms from 1250.
    let state = LimitState::Counter { window_start_ms: 1_000, current: 2, previous: 10 };
    let (d, _) = counter.check(Some(&state), 1_250);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms, 50);
}

#[test]
fn leaky_bucket_queues_then_drops_without_burst_refill() {
    // capacity 2, drain 1/s: two fit, the third is dropped; after 1 s one slot is free.
    let leaky = Algorithm::LeakyBucket { capacity: 2, drain_per_s: 1 };
    check(leaky, &[0, 0, 0, 999, 1_000, 1_000], &[(true, 1), (true, 0), (false, 0), (false, 0), (true, 0), (false, 0)]);
    let (d, _) = leaky.check(Some(&LimitState::Queue { free_at_us: 2_000_000 }), 250);
    assert_eq!((d.allowed, d.retry_after_ms, d.reset_ms), (false, 750, 1_750));
}

#[test]
fn leaky_bucket_admits_into_a_queue_that_leaves_at_the_drain_rate() {
    // capacity 4, 10/s: four requests at once are all admitted, but they leave 100 ms apart.
    let leaky = Algorithm::LeakyBucket { capacity: 4, drain_per_s: 10 };
    let mut state = None;
    let mut delays = Vec::new();
    for _ in 0..5 {
        let (d, next) = leaky.check(state.as_ref(), 5_000);
        state = Some(next);
        delays.push((d.allowed, d.delay_ms));
    }
    assert_eq!(delays, vec![(true, 0), (true, 100), (true, 200), (true, 300), (false, 0)]);
    // 250 ms later the first three have left: two places free, the next waits for 150 ms.
    let (d, _) = leaky.check(state.as_ref(), 5_250);
    assert_eq!((d.allowed, d.delay_ms), (true, 150));
}

#[test]
fn extreme_parameters_and_times_never_overflow() {
    let extremes = [0, 1, 2, 999, 1_000, u64::MAX / 1_000, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    for &a in &extremes {
        for &b in &extremes {
            for algorithm in [
                Algorithm::TokenBucket { capacity: a, refill_per_s: b },
                Algorithm::FixedWindow { limit: a, window_ms: b },
                Algorithm::SlidingLog { limit: a.min(3), window_ms: b },
                Algorithm::SlidingWindow { limit: a, window_ms: b },
                Algorithm::LeakyBucket { capacity: a, drain_per_s: b },
            ] {
                let mut state = None;
                for &now in &extremes {
                    let (_, next) = algorithm.check(state.as_ref(), now);
                    state = Some(next);
                }
                let _ = (algorithm.idle_after_ms(), algorithm.window_s(), algorithm.limit());
            }
        }
    }
}

#[test]
fn rejected_requests_do_not_consume() {
    for algorithm in [
        Algorithm::TokenBucket { capacity: 1, refill_per_s: 1 },
        Algorithm::FixedWindow { limit: 1, window_ms: 1_000 },
        Algorithm::SlidingLog { limit: 1, window_ms: 1_000 },
        Algorithm::SlidingWindow { limit: 1, window_ms: 1_000 },
        Algorithm::LeakyBucket { capacity: 1, drain_per_s: 1 },
    ] {
        let (_, s1) = algorithm.check(None, 10);
        let (d, s2) = algorithm.check(Some(&s1), 10);
        assert!(!d.allowed, "{algorithm:?}");
        assert_eq!(s1, s2, "{algorithm:?}: a rejection changed the state");
    }
}

fn every_algorithm(limit: u64) -> [Algorithm; 5] {
    [
        Algorithm::TokenBucket { capacity: limit, refill_per_s: 5 },
        Algorithm::FixedWindow { limit, window_ms: 1_000 },
        Algorithm::SlidingLog { limit, window_ms: 1_000 },
        Algorithm::SlidingWindow { limit, window_ms: 1_000 },
        Algorithm::LeakyBucket { capacity: limit, drain_per_s: 5 },
    ]
}

#[test]
fn a_charge_that_fits_is_the_same_as_that_many_admissions() {
    for algorithm in every_algorithm(10) {
        for n in 0..=10 {
            let mut admitted = None;
            for _ in 0..n {
                let (d, next) = algorithm.check(admitted.as_ref(), 5_000);
                assert!(d.allowed, "{algorithm:?}");
                admitted = Some(next);
            }
            let charged = algorithm.charge(None, 5_000, n);
            match admitted {
                Some(admitted) => assert_eq!(charged, admitted, "{algorithm:?}, n = {n}"),
                None => assert!(algorithm.check(Some(&charged), 5_000).0.allowed, "{algorithm:?}: n = 0 takes nothing"),
            }
        }
    }
}

#[test]
fn a_charge_beyond_the_limit_rejects_until_it_is_repaid() {
    for algorithm in every_algorithm(10) {
        let charged = algorithm.charge(None, 5_000, 10);
        let (d, after) = algorithm.check(Some(&charged), 5_000);
        assert!(!d.allowed && d.retry_after_ms > 0, "{algorithm:?}: {d:?}");
        assert_eq!(after, charged, "{algorithm:?}: a rejection changed the state");
    }
    // A token bucket (10, 5/s) charged 25 at t = 0 owes 15 tokens: empty for 3 s, then it
    // refills from zero (one token per 200 ms).
    let bucket = Algorithm::TokenBucket { capacity: 10, refill_per_s: 5 };
    let charged = bucket.charge(None, 0, 25);
    assert_eq!(charged, LimitState::Bucket { milli_tokens: 0, at_ms: 3_000 });
    let (d, _) = bucket.check(Some(&charged), 2_999);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms, 1 + 200, "the debt, then one token's refill");
    assert!(!bucket.check(Some(&charged), 3_199).0.allowed);
    let (d, _) = bucket.check(Some(&charged), 3_200);
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    assert!(bucket.idle_at_ms(&charged, 0) >= 3_000 + bucket.idle_after_ms(), "idle only once repaid and refilled");
    // A second charge adds to the debt.
    assert_eq!(bucket.charge(Some(&charged), 1_000, 5), LimitState::Bucket { milli_tokens: 0, at_ms: 4_000 });
    // Charges are total: extreme counts and times saturate.
    for algorithm in every_algorithm(1) {
        for now in [0, 1, u64::MAX / 2, u64::MAX] {
            let state = algorithm.charge(None, now, u64::MAX);
            let state = algorithm.charge(Some(&state), now, u64::MAX);
            let _ = (algorithm.check(Some(&state), now), algorithm.idle_at_ms(&state, now));
        }
    }
}

#[test]
fn the_credit_is_an_eighth_of_the_limit_within_bounds() {
    assert_eq!(Algorithm::TokenBucket { capacity: 200, refill_per_s: 100 }.credit(), 25);
    assert_eq!(Algorithm::TokenBucket { capacity: 10, refill_per_s: 5 }.credit(), 1);
    assert_eq!(Algorithm::FixedWindow { limit: 1, window_ms: 1 }.credit(), 1);
    assert_eq!(Algorithm::FixedWindow { limit: 1_000_000, window_ms: 1 }.credit(), CREDIT_MAX);
}
