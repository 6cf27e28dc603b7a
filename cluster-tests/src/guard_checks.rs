//! Checkers for the guards and the scheduler, as pure functions over a recorded history, so
//! each can be shown to fail on a hand-made bad history (`tests/it/checker.rs`):
//!
//! - [`check_admissions`]: a token bucket never admitted more than it holds plus what refilled,
//!   in *any* window of the run (not only over the whole run);
//! - [`check_fires`]: a fence goes to one fire only, fences grow with the fires' times, no
//!   fire took effect twice at a target that applies each `Idempotency-Key` once, and, in
//!   the order the target received them, no call of a fire carried an older fence than one
//!   already received for it (a lease stops work: [`check_fence_arrivals`]);
//! - [`check_fire_times`]: no fire arrived before its time, and a fire ran again (a new
//!   fence) only once the lease of its run before had lapsed: at most one run per lease;
//! - [`check_due_fires`]: every fire due in a span arrived;
//! - [`check_keyed_answers`]: every idempotency key got one answer, however often it was sent.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, ensure, Result};

/// One admitted request, as the client saw it: sent at `call_ms`, answered at `ret_ms`
/// (milliseconds on one clock). The limiter decided somewhere in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub call_ms: u64,
    pub ret_ms: u64,
}

/// A token bucket: at most `capacity` at once, refilled by `refill_per_s` tokens a second.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub capacity: u64,
    pub refill_per_s: u64,
    /// How much longer than a real-time span the limiter's clock may see it: 0 where every
    /// node reads one clock; three times `raft.max_clock_offset_ms` where clocks are skewed
    /// (a stamp is within 1.5 bounds of real time where a majority of clocks are right, so
    /// the time refilling a span may start that much late and end that much early:
    /// ARCHITECTURE.md, "Time").
    pub clock_slack_ms: u64,
}

impl Bucket {
    /// The most admissions any span of `span_ms` can hold: a full bucket plus what refilled.
    pub fn allows(&self, span_ms: u64) -> u64 {
        self.capacity + self.refill_per_s.saturating_mul(span_ms + self.clock_slack_ms) / 1_000
    }
}

/// Checks that no window of the run holds more admissions than `bucket` allows.
///
/// For every window `[s, e]` that starts at an admission's call and ends at an admission's
/// answer, the admissions wholly inside it (called at or after `s`, answered at or before
/// `e`) were surely decided inside it, so there can be at most `bucket.allows(e - s)`.
/// O(n² log n); a run admits a few thousand requests.
pub fn check_admissions(admissions: &[Admission], bucket: Bucket) -> Result<()> {
    let mut starts: Vec<u64> = admissions.iter().map(|a| a.call_ms).collect();
    starts.sort_unstable();
    starts.dedup();
    for &start in &starts {
        let mut ends: Vec<u64> = admissions.iter().filter(|a| a.call_ms >= start).map(|a| a.ret_ms).collect();
        ends.sort_unstable();
        // The k-th earliest answer closes a window holding at least k admissions.
        for (k, &end) in ends.iter().enumerate() {
            let inside = k as u64 + 1;
            let allowed = bucket.allows(end.saturating_sub(start));
            ensure!(
                inside <= allowed,
                "over-admission: {inside} requests admitted within [{start}, {end}] ms ({} ms), \
                 the bucket allows at most {allowed}",
                end.saturating_sub(start)
            );
        }
    }
    Ok(())
}

/// One webhook call a target received for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireCall {
    pub job_id: String,
    /// The fire's scheduled time (Unix seconds).
    pub scheduled_s: u64,
    pub fence: u64,
    /// The `Idempotency-Key` it carried: the target applies each key's effect once.
    pub key: String,
    /// When the target received it (Unix ms, the test's clock).
    pub received_ms: u64,
}

/// What the fire calls add up to, for the test's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FireSummary {
    pub calls: usize,
    pub fires: BTreeSet<(String, u64)>,
    pub fences: usize,
}

/// Checks the calls a target received: a fence is never handed to two fires, in fence order
/// the fires' times never go back (a later fire never got an older fence, across leader
/// changes too), and each fire took effect once: all its calls carry one key (the target
/// applies a key once, so two keys would be two effects).
pub fn check_fires(calls: &[FireCall]) -> Result<FireSummary> {
    let mut by_fence: BTreeMap<u64, BTreeSet<(String, u64)>> = BTreeMap::new();
    let mut keys: BTreeMap<(String, u64), BTreeSet<&str>> = BTreeMap::new();
    for call in calls {
        let fire = (call.job_id.clone(), call.scheduled_s);
        by_fence.entry(call.fence).or_default().insert(fire.clone());
        keys.entry(fire).or_default().insert(&call.key);
    }
    for (fence, fires) in &by_fence {
        ensure!(fires.len() == 1, "fence {fence} was handed to several fires: {fires:?}");
    }
    let mut last: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (fence, fires) in &by_fence {
        for (job, scheduled) in fires {
            if let Some((previous_fence, previous)) = last.insert(job, (*fence, *scheduled)) {
                ensure!(
                    previous <= *scheduled,
                    "job {job}: fence {fence} went to the fire at {scheduled}, older than the fire at \
                     {previous} that fence {previous_fence} went to"
                );
            }
        }
    }
    for (fire, fire_keys) in &keys {
        ensure!(fire_keys.len() == 1, "fire {fire:?} took effect {} times, under keys {fire_keys:?}", fire_keys.len());
    }
    check_fence_arrivals(calls)?;
    Ok(FireSummary { calls: calls.len(), fires: keys.into_keys().collect(), fences: by_fence.len() })
}

/// Checks a fire's calls in the order the target received them: once a call with fence f
/// arrived, no call with a lower fence arrives (a target that keeps the highest fence seen
/// and refuses lower ones — the fencing contract — then never sees a stale executor's work
/// after the new one's). A worker whose lease was taken over must have stopped calling.
pub fn check_fence_arrivals(calls: &[FireCall]) -> Result<()> {
    let mut by_arrival: Vec<&FireCall> = calls.iter().collect();
    by_arrival.sort_by_key(|call| call.received_ms);
    let mut highest: BTreeMap<(&str, u64), (u64, u64)> = BTreeMap::new();
    for call in by_arrival {
        let seen = highest.entry((&call.job_id, call.scheduled_s)).or_insert((call.fence, call.received_ms));
        // Calls received in the same millisecond are not ordered: only a later one counts.
        ensure!(
            call.fence >= seen.0 || call.received_ms == seen.1,
            "job {}: a call of the fire at {} s with fence {} arrived at {} ms, after one with fence {} at {} ms",
            call.job_id,
            call.scheduled_s,
            call.fence,
            call.received_ms,
            seen.0,
            seen.1
        );
        if call.fence > seen.0 {
            *seen = (call.fence, call.received_ms);
        }
    }
    Ok(())
}

/// Checks when the fires arrived, on the target's clock, allowing `tolerance_ms` for the
/// cluster's clock bound: a fire's first run (its lowest fence) never arrived before the
/// fire's time, and its k-th run (the k-th fence seen) not before `k` leases after it. A run
/// is claimed at or after the fire's time and the next only once the lease of the one
/// before lapsed (each claim takes a lease of `lease_ms` at least), so two runs of one fire
/// within one lease are two executors at once. Its limits: it measures from the fire's time,
/// so a run claimed k leases late is not judged against the run before it (the fences and
/// keys of [`check_fires`] still catch a second effect); and a failed attempt is retried
/// sooner, after its backoff, so it is for targets that answer every call.
pub fn check_fire_times(calls: &[FireCall], lease_ms: u64, tolerance_ms: u64) -> Result<()> {
    // Each fire's runs: fence → first arrival.
    let mut runs: BTreeMap<(&str, u64), BTreeMap<u64, u64>> = BTreeMap::new();
    for call in calls {
        let first = runs.entry((&call.job_id, call.scheduled_s)).or_default().entry(call.fence).or_insert(u64::MAX);
        *first = (*first).min(call.received_ms);
    }
    for ((job, scheduled_s), fences) in &runs {
        let due_ms = scheduled_s.saturating_mul(1_000);
        for (k, (fence, arrived_ms)) in fences.iter().enumerate() {
            let earliest = due_ms + k as u64 * lease_ms;
            ensure!(
                arrived_ms + tolerance_ms >= earliest,
                "job {job}: {}",
                if k == 0 {
                    format!("the fire due at {due_ms} ms arrived {} ms early (fence {fence})", earliest - arrived_ms)
                } else {
                    format!(
                        "run {} of the fire due at {due_ms} ms (fence {fence}) arrived {} ms after the fire's \
                         time: {k} lease(s) of {lease_ms} ms must lapse first",
                        k + 1,
                        arrived_ms.saturating_sub(due_ms)
                    )
                }
            );
        }
    }
    Ok(())
}

/// Checks that every fire of `job_id` due each second in `[from_s, to_s)` arrived.
pub fn check_due_fires(fires: &BTreeSet<(String, u64)>, job_id: &str, from_s: u64, to_s: u64) -> Result<usize> {
    ensure!(from_s < to_s, "no fire was due in [{from_s}, {to_s})");
    let missing: Vec<u64> = (from_s..to_s).filter(|s| !fires.contains(&(job_id.to_owned(), *s))).collect();
    ensure!(missing.is_empty(), "fires due in [{from_s}, {to_s}) never arrived (Unix s): {missing:?}");
    Ok((to_s - from_s) as usize)
}

/// One acknowledged commit: the path's version it became, and its content's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedWrite {
    pub path: String,
    pub version: u64,
    pub content: String,
}

/// Checks that every acknowledged write is readable where it was acknowledged: `histories`
/// holds each path's versions as read back after the run (version → content hash). A path's
/// versions are 1..=N without a gap, and each acknowledged write is there, at its version,
/// with its content. Returns the versions checked.
pub fn check_acked_writes(histories: &BTreeMap<String, BTreeMap<u64, String>>, acked: &[AckedWrite]) -> Result<usize> {
    for (path, versions) in histories {
        let count = versions.len() as u64;
        ensure!(
            versions.keys().copied().eq(1..=count),
            "{path}: versions are not gapless: {:?}",
            versions.keys().collect::<Vec<_>>()
        );
    }
    for write in acked {
        let found = histories.get(&write.path).and_then(|versions| versions.get(&write.version));
        ensure!(
            found == Some(&write.content),
            "{}: the acknowledged write of {} as version {} is not readable (found {found:?})",
            write.path,
            write.content,
            write.version
        );
    }
    Ok(histories.values().map(BTreeMap::len).sum())
}

/// Checks that every idempotency key got one and the same answer (status and body text, or
/// the created id) each time it was answered, and that each key was answered at least once.
pub fn check_keyed_answers(answers: &BTreeMap<String, Vec<(u16, String)>>) -> Result<()> {
    for (key, seen) in answers {
        let Some(first) = seen.first() else { bail!("key {key} was never answered") };
        ensure!(seen.iter().all(|a| a == first), "key {key}: different answers {seen:?}");
    }
    Ok(())
}
