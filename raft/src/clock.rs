//! Clock safety: a node whose wall clock is off from the other members' by more than the
//! configured bound refuses to lead (CockroachDB's maximum clock offset is the model).
//!
//! The leader stamps its clock into every batch, and leases, run expiry and token refills
//! follow that stamp, so one wrong clock at the leader could expire every lease at once or
//! freeze refills. Every [`CLOCK_CHECK_INTERVAL`] the node asks each member for its time
//! (the `Status` RPC) and estimates the offset NTP-style, `peer − (sent + received) / 2`,
//! with half the round trip as its uncertainty. The node is *off* when even counting every
//! member it could not measure in its favour, the members whose clocks agree with its own
//! (itself included) are no majority. An off node does not stand for election, stops the
//! leader heartbeats (so a healthy majority elects another leader) and proposes nothing;
//! `/readyz` reports it not ready. Until its first check a node does not stand for election.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::membership::VoteRight;
use crate::network::Peers;
use crate::pb::StatusRequest;
use crate::types::{NodeId, Raft};

/// How often the offsets to the other members are measured.
pub const CLOCK_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long one member's time may take to arrive.
const CLOCK_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What the last check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockHealth {
    /// `None` before the first check.
    pub ok: Option<bool>,
    /// Estimated offset of each member's clock from this node's (peer minus this node), in
    /// ms; members that did not answer are absent.
    pub offsets_ms: BTreeMap<NodeId, i64>,
    /// When the last check found the clock fine: the wall clock then (Unix ms) and the
    /// monotonic instant. Stamps are kept near the wall clock this predicts (see
    /// [`ClockHealth::stamp`]).
    pub agreed_at: Option<(u64, Instant)>,
    /// The configured bound on the offset, in ms.
    pub max_offset_ms: u64,
}

impl ClockHealth {
    /// Whether this node may lead and propose.
    pub fn may_lead(&self) -> bool {
        self.ok == Some(true)
    }

    /// The time a leader stamps into a batch: the wall clock, kept within the offset bound
    /// of what the monotonic clock predicts since the last check that found it fine. A
    /// wall clock that jumps between two checks (a second apart) therefore moves the
    /// replicated clock by at most the bound — it cannot expire every lease at once or
    /// freeze refills — and the next check stops the node from leading.
    pub fn stamp(&self) -> u64 {
        self.stamp_for(now_ms(), Instant::now())
    }

    fn stamp_for(&self, wall_ms: u64, now: Instant) -> u64 {
        match self.agreed_at {
            Some((agreed_wall_ms, agreed)) => {
                let expected = agreed_wall_ms.saturating_add(now.saturating_duration_since(agreed).as_millis() as u64);
                wall_ms.clamp(expected.saturating_sub(self.max_offset_ms), expected.saturating_add(self.max_offset_ms))
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

/// Whether this node's clock is fine, given the samples it took of the other members of a
/// cluster of `cluster_size` nodes (itself included): a member counts against it only when
/// the offset exceeds the bound by more than the measurement's uncertainty.
fn judge(samples: &[Sample], cluster_size: usize, max_offset_ms: u64) -> bool {
    let max_offset = i64::try_from(max_offset_ms).unwrap_or(i64::MAX);
    let off = samples.iter().filter(|s| s.offset_ms.abs().saturating_sub(s.uncertainty_ms) > max_offset).count();
    let could_agree = cluster_size.saturating_sub(off);
    could_agree * 2 > cluster_size
}

async fn sample(peers: &Peers, addr: &str) -> Option<Sample> {
    let mut client = peers.client(addr).ok()?;
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(CLOCK_PROBE_TIMEOUT);
    let sent = now_ms();
    let started = Instant::now();
    let reply = tokio::time::timeout(CLOCK_PROBE_TIMEOUT, client.status(request)).await.ok()?.ok()?.into_inner();
    let round_trip = started.elapsed().as_millis() as i64;
    let midpoint = i64::try_from(sent).ok()?.saturating_add(round_trip / 2);
    let peer = i64::try_from(reply.now_ms).ok()?;
    Some(Sample { offset_ms: peer.saturating_sub(midpoint), uncertainty_ms: round_trip / 2 + 1 })
}

/// Measures the members' clocks forever, publishing the verdict and switching elections
/// and heartbeats with it.
pub(crate) async fn watch_clock(
    id: NodeId,
    raft: Raft,
    peers: Peers,
    max_offset_ms: u64,
    health: watch::Sender<ClockHealth>,
    vote_right: watch::Receiver<VoteRight>,
) {
    let mut electing = None;
    let mut ticks = tokio::time::interval(CLOCK_CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let members: Vec<(NodeId, String)> = {
            let metrics = raft.metrics().borrow().clone();
            let membership = metrics.membership_config.membership().clone();
            membership.nodes().filter(|(m, _)| **m != id).map(|(m, info)| (*m, info.grpc_addr.clone())).collect()
        };
        let measured = futures::future::join_all(members.iter().map(|(_, addr)| sample(&peers, addr))).await;
        let mut offsets_ms = BTreeMap::new();
        let mut samples = Vec::new();
        for ((member, _), found) in members.iter().zip(measured) {
            if let Some(s) = found {
                offsets_ms.insert(*member, s.offset_ms);
                samples.push(s);
            }
        }
        let ok = judge(&samples, members.len() + 1, max_offset_ms);
        let was = health.borrow().ok;
        if was != Some(ok) {
            if ok {
                tracing::info!(?offsets_ms, "clock agrees with the cluster; this node may lead");
            } else {
                tracing::warn!(?offsets_ms, max_offset_ms, "clock is off from the cluster; this node will not lead");
            }
            raft.runtime_config().heartbeat(ok);
        }
        // A node that lost its data does not stand for election either (crate::membership).
        let elect = ok && vote_right.borrow().may_vote();
        if electing != Some(elect) {
            raft.runtime_config().elect(elect);
            electing = Some(elect);
        }
        let agreed_at = if ok { Some((now_ms(), Instant::now())) } else { health.borrow().agreed_at };
        health.send_replace(ClockHealth { ok: Some(ok), offsets_ms, agreed_at, max_offset_ms });
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
        let agreed = Instant::now();
        let health = ClockHealth {
            ok: Some(true),
            offsets_ms: BTreeMap::new(),
            agreed_at: Some((1_000_000, agreed)),
            max_offset_ms: 500,
        };
        let later = agreed + Duration::from_millis(300);
        // An honest clock passes as it is.
        assert_eq!(health.stamp_for(1_000_300, later), 1_000_300);
        // An hour ahead, or behind: held within the bound of the prediction.
        assert_eq!(health.stamp_for(1_000_300 + 3_600_000, later), 1_000_800);
        assert_eq!(health.stamp_for(1_000_300 - 600_000, later), 999_800);
        // Before any agreeing check there is nothing to predict from.
        let fresh = ClockHealth { agreed_at: None, ..health };
        assert_eq!(fresh.stamp_for(42, later), 42);
    }

    #[test]
    fn a_node_is_off_when_no_majority_can_agree_with_it() {
        // Three nodes: off from both others.
        assert!(!judge(&[s(5_000), s(5_100)], 3, 500));
        // Off from one only (that one is the odd one out), or one unreachable: fine.
        assert!(judge(&[s(5_000), s(10)], 3, 500));
        assert!(judge(&[s(5_000)], 3, 500));
        // Within the bound, allowing for the measurement's uncertainty.
        assert!(judge(&[s(400), s(-450)], 3, 500));
        assert!(judge(&[Sample { offset_ms: 600, uncertainty_ms: 150 }, s(-700)], 3, 500));
        // Five nodes: off from three of four is off; from two, fine.
        assert!(!judge(&[s(900), s(900), s(900), s(0)], 5, 500));
        assert!(judge(&[s(900), s(900), s(0), s(0)], 5, 500));
        // Alone, a node agrees with itself.
        assert!(judge(&[], 1, 500));
    }
}
