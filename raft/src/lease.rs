//! Leadership leases for the rate limiter: a voter that confirms a leader promises not to
//! help elect anyone else for a while, so the leader may decide in memory until shortly
//! before that promise ends, without a confirmation round per decision.
//!
//! - A voter answering a `ConfirmLeader` round with "my vote is yours" promises, from the
//!   moment it answers, to refuse every other candidate's vote request for
//!   [`Promises::lease`] ([`Promises::refusal`], checked by the gRPC `Vote` handler before
//!   openraft sees the request, under the node's vote gate, which the confirmation holds
//!   too: no vote is granted between a check that passed and a promise made) and not to
//!   stand for election itself ([`Promises::promise`] switches openraft's elections off
//!   before the answer, and [`Promises::may_stand`] keeps them off until the promise ends;
//!   the answer is `yes` only if openraft's in-memory vote, read in its core after the
//!   switch, is still that leader's). The leader makes the same promise to itself when a
//!   round begins, since its own vote counts in the round's quorum.
//! - Promises live in memory: a node that restarts refuses every vote, and stands for no
//!   election, for one lease after it started, so a promise given before a crash is kept.
//! - Every instant is of the boot-time clock ([`crate::boot_clock`]), which keeps counting
//!   through a suspended machine: a lease never outlives a pause.
//! - A round that began at `t` (leader's monotonic clock) and gathered a quorum of promises
//!   lets the leader decide until `t + lease - lease / LEASE_DRIFT_DIVISOR`: every promise of
//!   that quorum began after `t` and lasts a lease on its own clock, so with clock rates apart
//!   by less than 1/16 (the margin of 1/8 covers both clocks) no other leader can be elected
//!   before the leader's lease ends. ARCHITECTURE.md ("Rate limiting on the leader") gives
//!   the whole argument.

use std::sync::Mutex;
use std::time::Duration;

use crate::boot_clock::BootInstant as Instant;

use crate::types::NodeId;

/// The part of a lease the leader does not use: room for its clock running slow and the
/// voters' running fast (far beyond what real clocks drift).
pub const LEASE_DRIFT_DIVISOR: u32 = 8;

/// The lease for a cluster whose election timeout is at least `election_timeout_min`: half
/// of it, so a promise is always over before a follower would stand for election anyway.
pub fn lease_for(election_timeout_min: Duration) -> Duration {
    election_timeout_min / 2
}

/// How long after a round began the leader may decide on its strength.
pub fn usable(lease: Duration) -> Duration {
    lease - lease / LEASE_DRIFT_DIVISOR
}

#[derive(Debug, Clone, Copy)]
struct Promise {
    leader: NodeId,
    term: u64,
    until: Instant,
}

/// The promises this node has made as a voter.
#[derive(Debug)]
pub struct Promises {
    lease: Duration,
    /// Refuses every vote until then: promises made before a restart were lost with memory.
    started_until: Instant,
    /// The promises still running (or just ended), at most one per leader and term.
    running: Mutex<Vec<Promise>>,
}

impl Promises {
    /// The promises of a node that started at `now`.
    pub fn new(lease: Duration, now: Instant) -> Promises {
        Promises { lease, started_until: now.plus(lease), running: Mutex::new(Vec::new()) }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Promises `leader` of `term` at `now` to refuse other candidates for a lease. Every
    /// promise runs to its end, whatever is promised meanwhile (two running promises to
    /// different leaders refuse every candidate). `stand_down` runs under the same lock as
    /// [`Promises::may_stand`]'s switch, so the two cannot interleave: the caller switches
    /// this node's elections off in it (when `leader` is another node).
    pub fn promise(&self, term: u64, leader: NodeId, now: Instant, stand_down: impl FnOnce()) {
        let until = now.plus(self.lease);
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        stand_down();
        running.retain(|p| p.until > now);
        match running.iter_mut().find(|p| (p.term, p.leader) == (term, leader)) {
            Some(p) => p.until = p.until.max(until),
            None => running.push(Promise { leader, term, until }),
        }
    }

    /// Whether node `me` may stand for election at `now` (no promise to another leader
    /// runs, and it did not start less than a lease ago), passed to `switch` under the lock
    /// [`Promises::promise`] holds.
    pub fn may_stand(&self, me: NodeId, now: Instant, switch: impl FnOnce(bool)) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let free = now >= self.started_until && !running.iter().any(|p| p.until > now && p.leader != me);
        switch(free);
    }

    /// Why a vote for `candidate` must be refused at `now`, if it must.
    pub fn refusal(&self, candidate: NodeId, now: Instant) -> Option<String> {
        if now < self.started_until {
            return Some(format!(
                "this node started less than {} ms ago and may have promised another leader before",
                self.lease.as_millis()
            ));
        }
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.iter().find(|p| p.until > now && p.leader != candidate).map(|p| {
            format!(
                "this node promised leader {} of term {} not to elect another for {} ms more",
                p.leader,
                p.term,
                p.until.saturating_duration_since(now).as_millis()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(200);

    /// A node's promises, and the first instant its start no longer refuses every vote.
    fn started() -> (Promises, Instant) {
        let t0 = Instant::now();
        (Promises::new(LEASE, t0), t0.plus(LEASE))
    }

    #[test]
    fn a_new_node_refuses_every_vote_for_one_lease() {
        let t0 = Instant::now();
        let promises = Promises::new(LEASE, t0);
        assert!(promises.refusal(1, t0).is_some());
        assert_eq!(promises.refusal(1, t0.plus(LEASE)), None);
    }

    #[test]
    fn a_promise_refuses_other_candidates_until_it_ends() {
        let (promises, t1) = started();
        promises.promise(3, 1, t1, || {});
        assert!(promises.refusal(2, t1).is_some(), "another candidate is refused");
        assert_eq!(promises.refusal(1, t1), None, "the promised leader may stand again");
        let t2 = t1.plus(LEASE / 2);
        promises.promise(3, 1, t2, || {});
        assert!(promises.refusal(2, t2.plus(LEASE * 3 / 4)).is_some(), "the second promise runs from when it was made");
        assert_eq!(promises.refusal(2, t2.plus(LEASE)), None);
    }

    #[test]
    fn every_promise_runs_to_its_end() {
        let (promises, t1) = started();
        promises.promise(4, 1, t1, || {});
        let t2 = t1.plus(LEASE / 2);
        promises.promise(5, 2, t2, || {});
        assert!(promises.refusal(2, t2).is_some(), "the promise to node 1 still holds");
        assert!(promises.refusal(1, t2).is_some(), "and so does the one to node 2");
        assert!(promises.refusal(3, t2).is_some());
        let t3 = t1.plus(LEASE);
        assert_eq!(promises.refusal(2, t3), None, "only the promise to node 2 is left");
        assert!(promises.refusal(1, t3).is_some());
    }

    #[test]
    fn a_promise_to_another_leader_keeps_the_node_from_standing() {
        let (promises, t1) = started();
        let stands = |at| {
            let mut free = None;
            promises.may_stand(2, at, |f| free = Some(f));
            free.expect("switched")
        };
        let t0 = t1.plus(Duration::ZERO);
        assert!(stands(t0), "free once a lease after its start");
        let mut switched_off = false;
        promises.promise(3, 1, t1, || switched_off = true);
        assert!(switched_off, "the promise switches elections off under the lock");
        assert!(!stands(t1.plus(LEASE / 2)), "node 2 promised node 1: it does not stand");
        assert!(stands(t1.plus(LEASE)), "the promise over, it may stand again");
        // A promise to itself (a leader's own round) does not keep it from standing.
        promises.promise(4, 2, t1.plus(LEASE), || {});
        assert!(stands(t1.plus(LEASE + LEASE / 2)));
        // Nor may a node that just started stand.
        let fresh = Promises::new(LEASE, t1);
        let mut free = None;
        fresh.may_stand(2, t1.plus(LEASE / 2), |f| free = Some(f));
        assert_eq!(free, Some(false));
    }

    #[test]
    fn the_usable_lease_leaves_the_drift_margin() {
        assert_eq!(lease_for(Duration::from_millis(400)), LEASE);
        assert_eq!(usable(LEASE), Duration::from_millis(175));
    }
}
