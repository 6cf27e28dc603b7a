//! Clock safety: a node whose wall clock is off from the other members' by more than the
//! configured bound refuses to lead (CockroachDB's maximum clock offset is the model).
//!
//! The leader stamps its clock into every batch, and leases, run expiry and token refills
//! follow that stamp, so one wrong clock at the leader could expire every lease at once or
//! freeze refills. Every [`CLOCK_CHECK_INTERVAL`] the node asks each member for its time
//! (the `Status` RPC) and estimates the offset NTP-style, `peer − (sent + received) / 2`,
//! with half the round trip as its uncertainty. A member *agrees* when a measurement taken
//! within the last [`SAMPLE_VALID`] puts its clock within the bound of this node's, the
//! uncertainty counted against it; a member not measured does not agree. The node is fine
//! only when the voters that agree (itself included) are a majority of the configuration's
//! voters;
//! otherwise it is *off*: it does not stand for election, stops the leader heartbeats (so a
//! healthy majority elects another leader) and proposes nothing; `/readyz` reports it not
//! ready. Until its first check a node does not stand for election, and a node that knows no
//! configuration yet (restarted before openraft publishes it, wiped, never initialized) gets
//! no verdict: it is never judged a cluster of one.
//!
//! Stamps are anchored on the cluster's time, not this node's: each check that finds the
//! clock fine records the median of the agreeing members' clocks (this node's included)
//! with the instant of the check, and [`ClockHealth::stamp`] keeps the wall clock within the
//! bound of that anchor advanced by the boot-time clock (which keeps counting through a
//! suspended machine).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::network::Peers;
use crate::pb::StatusRequest;
use crate::types::{NodeId, Raft};

/// How often the offsets to the other members are measured.
pub const CLOCK_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long one member's time may take to arrive.
const CLOCK_PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a measurement of a member counts (a missed probe or two under load does not
/// unseat a leader; a member silent for longer no longer agrees).
pub const SAMPLE_VALID: Duration = Duration::from_secs(3);

/// What the last check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockHealth {
    /// `None` before the first check.
    pub ok: Option<bool>,
    /// Estimated offset of each member's clock from this node's (peer minus this node), in
    /// ms; members that did not answer are absent.
    pub offsets_ms: BTreeMap<NodeId, i64>,
    /// When the last check found the clock fine: the cluster's time then (the median of the
    /// agreeing members' clocks, Unix ms) and the boot-time instant. Stamps are kept near
    /// the time this predicts (see [`ClockHealth::stamp`]).
    pub agreed_at: Option<(u64, crate::boot_clock::BootInstant)>,
    /// The configured bound on the offset, in ms.
    pub max_offset_ms: u64,
    /// The members the verdict counted, this node included (the configuration held, or,
    /// before there is one, the initial configuration this node was handed).
    pub cluster_size: usize,
    /// The members whose last answer, within [`SAMPLE_VALID`], said they lead but refuse
    /// writes (a full disk or a clock off: stepping down). A follower of one is not ready.
    pub leading_refusing_writes: std::collections::BTreeSet<NodeId>,
}

impl ClockHealth {
    /// Whether this node may lead and propose.
    pub fn may_lead(&self) -> bool {
        self.ok == Some(true)
    }

    /// The time a leader stamps into a batch: the wall clock, kept within half the offset
    /// bound of what the boot-time clock predicts since the last check that found it fine.
    /// A wall clock that jumps between two checks (a second apart) therefore moves the
    /// replicated clock by at most half the bound — it cannot expire every lease at once or
    /// freeze refills — and the next check stops the node from leading.
    ///
    /// Where a majority of the clocks are right, the prediction is within the bound of real
    /// time and every stamp within 1.5 bounds, so a span the replicated clock measures is at
    /// most three bounds longer than the real one; with measurement errors small beside the
    /// bound, half of each (ARCHITECTURE.md, "Time", has the argument).
    pub fn stamp(&self) -> u64 {
        self.stamp_for(now_ms(), crate::boot_clock::BootInstant::now())
    }

    fn stamp_for(&self, wall_ms: u64, now: crate::boot_clock::BootInstant) -> u64 {
        match self.agreed_at {
            Some((agreed_wall_ms, agreed)) => {
                let expected = agreed_wall_ms.saturating_add(now.saturating_duration_since(agreed).as_millis() as u64);
                let slack = self.max_offset_ms / 2;
                wall_ms.clamp(expected.saturating_sub(slack), expected.saturating_add(slack))
            }
            None => wall_ms,
        }
    }
}

/// Wall clock, Unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// One measurement of a peer: estimated offset and its uncertainty, in ms.
#[derive(Debug, Clone, Copy)]
struct Sample {
    offset_ms: i64,
    uncertainty_ms: i64,
}

/// A sample taken when this node's wall clock read `taken_wall_ms`, seen `elapsed` (boot
/// time) later when it reads `wall_now_ms`: whatever this node's wall clock moved beyond the
/// elapsed time (a jump, a step) moves the member's offset the other way, so an old sample
/// never vouches for a clock that has since jumped.
fn aged(sample: Sample, taken_wall_ms: u64, wall_now_ms: u64, elapsed: Duration) -> Sample {
    let wall_moved = i64::try_from(wall_now_ms).unwrap_or(i64::MAX) - i64::try_from(taken_wall_ms).unwrap_or(0);
    let jump = wall_moved.saturating_sub(i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX));
    Sample { offset_ms: sample.offset_ms.saturating_sub(jump), uncertainty_ms: sample.uncertainty_ms }
}

/// Whether `sample` shows a member's clock within the bound, its uncertainty counted
/// against it.
fn agrees(sample: &Sample, max_offset_ms: u64) -> bool {
    let max_offset = i64::try_from(max_offset_ms).unwrap_or(i64::MAX);
    sample.offset_ms.abs().saturating_add(sample.uncertainty_ms) <= max_offset
}

/// Whether this node's clock is fine, given the valid samples it holds of the other members
/// of a cluster of `cluster_size` nodes (itself included): the members that agree, itself
/// included, must be a majority; a member without a sample does not agree.
fn judge(samples: &[Sample], cluster_size: usize, max_offset_ms: u64) -> bool {
    let agreeing = 1 + samples.iter().filter(|s| agrees(s, max_offset_ms)).count();
    agreeing * 2 > cluster_size
}

/// The offset of the cluster's time from this node's clock: the median of the agreeing
/// members' offsets, this node's own (0) included; of an even count, the mean of the middle
/// two (this node and the one peer it agrees with meet halfway: neither is taken as right).
fn cluster_offset_ms(samples: &[Sample], max_offset_ms: u64) -> i64 {
    let mut offsets: Vec<i64> =
        samples.iter().filter(|s| agrees(s, max_offset_ms)).map(|s| s.offset_ms).chain([0]).collect();
    offsets.sort_unstable();
    let middle = offsets.len() / 2;
    if offsets.len() % 2 == 0 {
        offsets[middle - 1] + (offsets[middle] - offsets[middle - 1]) / 2
    } else {
        offsets[middle]
    }
}

/// A measurement and the moment it refers to: this node's wall clock and boot clock read
/// together when the probe left. Aging from that pair (not from when the answer was handled)
/// sees a wall-clock jump that happened while the probe was out, so a sample taken on the
/// clock before a jump never vouches for the clock after it.
#[derive(Debug, Clone, Copy)]
struct Measured {
    sample: Sample,
    /// The member said it leads but refuses writes.
    leads_refusing_writes: bool,
    taken_wall_ms: u64,
    taken: crate::boot_clock::BootInstant,
}

async fn sample(peers: &Peers, addr: &str) -> Option<Measured> {
    let mut client = peers.client(addr).ok()?;
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(CLOCK_PROBE_TIMEOUT);
    let (sent, taken) = (now_ms(), crate::boot_clock::BootInstant::now());
    let started = Instant::now();
    let reply = tokio::time::timeout(CLOCK_PROBE_TIMEOUT, client.status(request)).await.ok()?.ok()?.into_inner();
    let round_trip = started.elapsed().as_millis() as i64;
    let midpoint = i64::try_from(sent).ok()?.saturating_add(round_trip / 2);
    let peer = i64::try_from(reply.now_ms).ok()?;
    let sample = Sample { offset_ms: peer.saturating_sub(midpoint), uncertainty_ms: round_trip / 2 + 1 };
    Some(Measured { sample, leads_refusing_writes: reply.leads_refusing_writes, taken_wall_ms: sent, taken })
}

/// One check's verdict from the measurements held, judged at one reading of both clocks
/// (`wall_now_ms`, `now`): whether this node's clock is fine, the members' offsets, and when
/// fine the cluster's time at that same reading (the anchor of [`ClockHealth::stamp`]).
fn verdict(
    last: &BTreeMap<NodeId, Measured>,
    wall_now_ms: u64,
    now: crate::boot_clock::BootInstant,
    cluster_size: usize,
    max_offset_ms: u64,
) -> (bool, BTreeMap<NodeId, i64>, Option<(u64, crate::boot_clock::BootInstant)>) {
    let mut offsets_ms = BTreeMap::new();
    let mut samples = Vec::new();
    for (member, measured) in last {
        let elapsed = now.saturating_duration_since(measured.taken);
        if elapsed <= SAMPLE_VALID {
            let s = aged(measured.sample, measured.taken_wall_ms, wall_now_ms, elapsed);
            offsets_ms.insert(*member, s.offset_ms);
            samples.push(s);
        }
    }
    let ok = judge(&samples, cluster_size, max_offset_ms);
    let agreed_at = ok.then(|| {
        let cluster_ms =
            i64::try_from(wall_now_ms).unwrap_or(i64::MAX).saturating_add(cluster_offset_ms(&samples, max_offset_ms));
        (u64::try_from(cluster_ms).unwrap_or(0), now)
    });
    (ok, offsets_ms, agreed_at)
}

/// The members whose last valid answer said they lead but refuse writes.
fn leading_refusing_writes(
    last: &BTreeMap<NodeId, Measured>,
    now: crate::boot_clock::BootInstant,
) -> std::collections::BTreeSet<NodeId> {
    last.iter()
        .filter(|(_, m)| m.leads_refusing_writes && now.saturating_duration_since(m.taken) <= SAMPLE_VALID)
        .map(|(member, _)| *member)
        .collect()
}

/// The members whose clocks this node is judged against (itself left out): the voters of the
/// configuration it holds (a learner — one being added, or abandoned half-way — has no
/// say), or, before it holds one, the initial configuration it was handed. `None` when it
/// knows neither: a restarted node before openraft publishes the configuration it loaded
/// sees an empty one, and judging it a cluster of one would let it lead on its own clock.
fn judged_members(
    id: NodeId,
    held: &openraft::Membership<NodeId, crate::types::NodeInfo>,
    initial: &[(NodeId, String)],
) -> Option<Vec<(NodeId, String)>> {
    if held.nodes().next().is_some() {
        let voters = held
            .voter_ids()
            .filter(|m| *m != id)
            .filter_map(|m| held.get_node(&m).map(|info| (m, info.grpc_addr.clone())))
            .collect();
        return Some(voters);
    }
    let named: Vec<(NodeId, String)> = initial.iter().filter(|(m, _)| *m != id).cloned().collect();
    (!initial.is_empty()).then_some(named)
}

/// Measures the members' clocks forever, publishing the verdict and switching heartbeats
/// with it (elections follow it too: `RaftNode`'s election switch reads the verdict).
pub(crate) async fn watch_clock(
    id: NodeId,
    raft: Raft,
    peers: Peers,
    max_offset_ms: u64,
    health: watch::Sender<ClockHealth>,
    initial: watch::Receiver<Vec<(NodeId, String)>>,
) {
    // The last measurement of each member, with this node's wall clock and boot time then.
    let mut last: BTreeMap<NodeId, Measured> = BTreeMap::new();
    let mut ticks = tokio::time::interval(CLOCK_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let held = raft.metrics().borrow().membership_config.membership().clone();
        let Some(members) = judged_members(id, &held, &initial.borrow()) else {
            // Nothing to judge against yet (a restarted node before openraft publishes the
            // configuration it holds, or a node never initialized): no verdict, so no leading.
            continue;
        };
        let measured = futures::future::join_all(members.iter().map(|(_, addr)| sample(&peers, addr))).await;
        last.retain(|member, _| members.iter().any(|(m, _)| m == member));
        for ((member, _), found) in members.iter().zip(measured) {
            if let Some(m) = found {
                last.insert(*member, m);
            }
        }
        // One reading of both clocks for the aging and the anchor alike.
        let (wall_now, now) = (now_ms(), crate::boot_clock::BootInstant::now());
        let cluster_size = members.len() + 1;
        let (ok, offsets_ms, agreed) = verdict(&last, wall_now, now, cluster_size, max_offset_ms);
        let was = health.borrow().ok;
        if was != Some(ok) {
            if ok {
                tracing::info!(?offsets_ms, "clock agrees with the cluster; this node may lead");
            } else {
                tracing::warn!(?offsets_ms, max_offset_ms, "clock is off from the cluster; this node will not lead");
            }
        }
        let agreed_at = agreed.or(health.borrow().agreed_at);
        let leading_refusing_writes = leading_refusing_writes(&last, now);
        health.send_replace(ClockHealth {
            ok: Some(ok),
            offsets_ms,
            agreed_at,
            max_offset_ms,
            cluster_size,
            leading_refusing_writes,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(offset_ms: i64) -> Sample {
        Sample { offset_ms, uncertainty_ms: 1 }
    }

    #[test]
    fn a_wall_clock_jump_between_checks_moves_stamps_by_the_bound_at_most() {
        let agreed = crate::boot_clock::BootInstant::now();
        let health = ClockHealth {
            ok: Some(true),
            offsets_ms: BTreeMap::new(),
            agreed_at: Some((1_000_000, agreed)),
            max_offset_ms: 500,
            cluster_size: 3,
            leading_refusing_writes: Default::default(),
        };
        let later = agreed.plus(Duration::from_millis(300));
        // An honest clock passes as it is.
        assert_eq!(health.stamp_for(1_000_300, later), 1_000_300);
        // An hour ahead, or behind: held within half the bound of the prediction.
        assert_eq!(health.stamp_for(1_000_300 + 3_600_000, later), 1_000_550);
        assert_eq!(health.stamp_for(1_000_300 - 600_000, later), 1_000_050);
        // Before any agreeing check there is nothing to predict from.
        let fresh = ClockHealth { agreed_at: None, ..health };
        assert_eq!(fresh.stamp_for(42, later), 42);
    }

    #[test]
    fn a_leader_refusing_writes_is_named_while_its_answer_is_valid() {
        let taken = crate::boot_clock::BootInstant::now();
        let answer = |refusing| Measured { sample: s(0), leads_refusing_writes: refusing, taken_wall_ms: 0, taken };
        let last = BTreeMap::from([(1, answer(true)), (2, answer(false))]);
        assert_eq!(leading_refusing_writes(&last, taken), [1].into());
        let stale = taken.plus(SAMPLE_VALID + Duration::from_millis(1));
        assert!(leading_refusing_writes(&last, stale).is_empty(), "an old answer says nothing");
    }

    #[test]
    fn a_node_is_fine_only_when_a_measured_majority_agrees_with_it() {
        // Three nodes: off from both others.
        assert!(!judge(&[s(5_000), s(5_100)], 3, 500));
        // Off from one only (that one is the odd one out): fine.
        assert!(judge(&[s(5_000), s(10)], 3, 500));
        // Off from the one it reaches, the other not measured: off (it once counted as
        // agreeing, so a node 30 s ahead with one reachable peer could lead).
        assert!(!judge(&[s(30_000)], 3, 500));
        // No peer measured at all: off.
        assert!(!judge(&[], 3, 500));
        // One agreeing peer measured, the other not: a majority.
        assert!(judge(&[s(10)], 3, 500));
        // Within the bound, the measurement's uncertainty counted against it.
        assert!(judge(&[s(400), s(-450)], 3, 500));
        assert!(!judge(&[Sample { offset_ms: 400, uncertainty_ms: 150 }, s(-700)], 3, 500));
        // Five nodes: three agreeing of five (itself included) is fine; two is not.
        assert!(judge(&[s(900), s(900), s(0), s(0)], 5, 500));
        assert!(!judge(&[s(900), s(900), s(900), s(0)], 5, 500));
        assert!(!judge(&[s(0)], 5, 500));
        // Alone, a node agrees with itself.
        assert!(judge(&[], 1, 500));
    }

    #[test]
    fn a_node_that_knows_no_configuration_is_not_judged_a_cluster_of_one() {
        use std::collections::{BTreeMap as Map, BTreeSet};
        let info = |n: u64| crate::types::NodeInfo {
            http_addr: format!("h{n}"),
            grpc_addr: format!("g{n}"),
            incarnation: None,
        };
        let empty = openraft::Membership::<NodeId, crate::types::NodeInfo>::default();
        // Restarted, before openraft publishes the configuration it loaded: the chaos
        // campaign saw such a node judge itself alone ("may lead", no peers measured).
        assert_eq!(judged_members(1, &empty, &[]), None);
        // Handed an initial configuration: judged against it.
        let initial = [(1, "g1".to_string()), (2, "g2".to_string()), (3, "g3".to_string())];
        assert_eq!(judged_members(1, &empty, &initial), Some(initial[1..].to_vec()));
        // A cluster of one, bootstrapped: alone, and that is right.
        assert_eq!(judged_members(1, &empty, &initial[..1]), Some(vec![]));
        // Holding a configuration: its voters only, a learner left out.
        let held = openraft::Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            Map::from([(1, info(1)), (2, info(2)), (3, info(3)), (4, info(4))]),
        );
        assert_eq!(judged_members(1, &held, &[]), Some(initial[1..].to_vec()));
        let single = openraft::Membership::new(vec![BTreeSet::from([1])], Map::from([(1, info(1))]));
        assert_eq!(judged_members(1, &single, &initial), Some(vec![]));
    }

    #[test]
    fn an_old_sample_follows_this_nodes_clock_jumps() {
        let sample = s(20);
        // A second later by both clocks: unchanged.
        assert_eq!(aged(sample, 1_000, 2_000, Duration::from_secs(1)).offset_ms, 20);
        // This node's wall clock jumped 30 s ahead meanwhile: the member is now 30 s behind.
        assert_eq!(aged(sample, 1_000, 32_000, Duration::from_secs(1)).offset_ms, 20 - 30_000);
        assert!(!agrees(&aged(sample, 1_000, 32_000, Duration::from_secs(1)), 500));
    }

    #[test]
    fn a_jump_while_a_probe_is_out_is_seen_and_never_anchored() {
        // The chaos campaign's failure: node 1's wall clock jumped +20 s while its probe of
        // node 3 was out; the answer was filed under the wall time read after the jump, so
        // the sample (taken on the old clock) vouched for the new one and the anchor moved
        // 20 s ahead. Filed under the moment the probe left, it disagrees.
        let left = crate::boot_clock::BootInstant::now();
        let mut last = BTreeMap::new();
        let on_old_clock =
            Measured { sample: s(3), leads_refusing_writes: false, taken_wall_ms: 1_000_000, taken: left };
        last.insert(3, on_old_clock);
        let after = left.plus(Duration::from_millis(300));
        let (ok, offsets, agreed) = verdict(&last, 1_000_300 + 20_000, after, 3, 500);
        assert!(!ok, "a clock 20 s off with one peer measured is off");
        assert_eq!(offsets.get(&3), Some(&(3 - 20_000)));
        assert_eq!(agreed, None, "a failed check never re-anchors stamps");
        // Without the jump the same sample agrees, and the anchor is the one reading's.
        let (ok, _, agreed) = verdict(&last, 1_000_300, after, 3, 500);
        assert!(ok);
        assert_eq!(agreed, Some((1_000_300 + 1, after)), "halfway to the one agreeing peer, rounded down");
    }

    /// The stamp of a leader whose wall clock jumped either way since its last good check,
    /// made `elapsed_ms` later, from a check that found this node `leader_off_ms` off real
    /// time and these samples of its peers; returns the worst distance from real time.
    fn worst_stamp_error(leader_off_ms: i64, samples: &[Sample], bound: u64) -> u64 {
        let real_at_check = 1_000_000i64;
        let offset = cluster_offset_ms(samples, bound);
        let agreed = crate::boot_clock::BootInstant::now();
        let health = ClockHealth {
            ok: Some(true),
            offsets_ms: BTreeMap::new(),
            agreed_at: Some(((real_at_check + leader_off_ms + offset) as u64, agreed)),
            max_offset_ms: bound,
            cluster_size: 3,
            leading_refusing_writes: Default::default(),
        };
        let later = agreed.plus(Duration::from_millis(700));
        let real = (real_at_check + 700) as u64;
        [real + 30_000, real - 30_000, real.saturating_add_signed(leader_off_ms)]
            .into_iter()
            .map(|wall| health.stamp_for(wall, later).abs_diff(real))
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn with_a_majority_of_right_clocks_a_stamp_stays_near_real_time() {
        let bound = 500u64;
        let b = bound as i64;
        let exact = |offset_ms| Sample { offset_ms, uncertainty_ms: 1 };
        // A right leader measuring right peers over asymmetric links (each seems as far off as
        // agreement lets a right clock seem): its own stamps are real time; after a jump, one
        // bound off at most.
        let skewed = Sample { offset_ms: b / 2, uncertainty_ms: b / 2 };
        assert!(agrees(&skewed, bound));
        assert_eq!(worst_stamp_error(0, &[skewed, skewed], bound), bound);
        // A leader almost a bound fast, agreeing with the one right peer it reaches (the third
        // is cut off): the two meet halfway, so a jump puts its stamps a bound off at most...
        assert!(worst_stamp_error(b - 1, &[exact(-(b - 1))], bound) <= bound);
        // ...and 1.5 bounds where that one measurement is as wrong as agreement allows.
        let worst = Sample { offset_ms: 0, uncertainty_ms: b };
        assert!(agrees(&worst, bound));
        let error = worst_stamp_error(b, &[worst], bound);
        assert!(error > bound && error <= bound * 3 / 2, "{error}");
    }

    #[test]
    fn the_anchor_is_the_median_of_the_agreeing_clocks() {
        // This node 400 ms ahead of two peers that agree with each other: the cluster's time
        // is theirs, not this node's.
        assert_eq!(cluster_offset_ms(&[s(-400), s(-410)], 500), -400);
        // A peer out of bound does not move it.
        assert_eq!(cluster_offset_ms(&[s(30_000), s(10)], 500), 5);
        // Two agreeing clocks meet halfway: this node 450 ms fast with one right peer takes
        // neither its own time nor the peer's.
        assert_eq!(cluster_offset_ms(&[s(-450)], 500), -225);
        assert_eq!(cluster_offset_ms(&[], 500), 0);
    }
}
