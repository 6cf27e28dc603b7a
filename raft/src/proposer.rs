//! Client-write batching and leader forwarding.
//!
//! Commands submitted while the previous log entry is in flight are gathered into one
//! [`Batch`] (one log entry, one fsync) and the outcomes fanned back out. On the leader the
//! batch is stamped with the leader's clock and proposed; on a follower it is forwarded to the
//! leader as one `Forward` RPC, where it joins the leader's own queue.
//!
//! Every wait is bounded: a submission answers by its deadline (`write_timeout` after it was
//! submitted). A submission still queued at its deadline is dropped unproposed (`Unavailable`:
//! surely not applied); one proposed or forwarded whose answer does not come in time is
//! `Unknown` (it may still apply) — never retried blindly.

use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use raftbox_storage::command::{json_depth, json_nesting, DECODER_DEPTH_MAX};
use raftbox_storage::{Batch, Command, Outcome};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::clock::ClockHealth;
use crate::error::WriteError;
use crate::metrics::NodeMetrics;
use crate::network::{Peers, ENTRY_BYTES_MAX};
use crate::pb::forward_reply::Result as ForwardResult;
use crate::pb::ForwardRequest;
use crate::types::{Entry, LogId, NodeId, Raft, TypeConfig, Vote};

/// Submissions waiting for the next batch, at most (back-pressure beyond this).
pub const QUEUE_UNITS_MAX: usize = 16_384;
/// Commands in one log entry, at most.
pub const BATCH_COMMANDS_MAX: usize = 4_096;
/// After a leader refused or could not be reached, wait this long (or until the node's view
/// of the cluster changes) before trying again.
const LEADER_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Submitted commands, their encoded size, their deadline and where their outcomes go.
struct Unit {
    commands: Vec<Command>,
    /// The commands as a JSON array (what a forward sends; its length bounds the entry).
    encoded: Vec<u8>,
    deadline: Instant,
    reply: oneshot::Sender<Result<Vec<Outcome>, WriteError>>,
}

/// What the proposer needs of the node.
#[derive(Clone)]
pub(crate) struct ProposerContext {
    pub node_id: NodeId,
    pub raft: Raft,
    pub peers: Peers,
    pub write_timeout: Duration,
    pub clock: watch::Receiver<ClockHealth>,
    /// The NOSPACE alarm: a node whose disk is full proposes nothing.
    pub disk: watch::Receiver<crate::disk::DiskHealth>,
    pub metrics: NodeMetrics,
}

/// Handle to the node's proposer task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Unit>,
    write_timeout: Duration,
    metrics: NodeMetrics,
}

impl Proposer {
    pub(crate) fn spawn(ctx: ProposerContext) -> Proposer {
        let (tx, rx) = mpsc::channel(QUEUE_UNITS_MAX);
        let write_timeout = ctx.write_timeout;
        let metrics = ctx.metrics.clone();
        tokio::spawn(run(ctx, rx));
        Proposer { tx, write_timeout, metrics }
    }

    /// Applies `commands` (atomically, in order, within one log entry) and returns one outcome
    /// per command, within the write timeout.
    pub async fn submit(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, WriteError> {
        let _timer = self.metrics.write_seconds.start_timer();
        let encoded = serde_json::to_vec(&commands).map_err(|e| WriteError::Invalid(format!("encode: {e}")))?;
        if encoded.len() > ENTRY_BYTES_MAX {
            return Err(WriteError::TooLarge { bytes: encoded.len(), max: ENTRY_BYTES_MAX });
        }
        check_depth(&encoded)?;
        let deadline = Instant::now() + self.write_timeout;
        let (reply, rx) = oneshot::channel();
        let unit = Unit { commands, encoded, deadline, reply };
        match tokio::time::timeout_at(deadline, self.tx.send(unit)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(WriteError::ShuttingDown),
            Err(_) => return Err(WriteError::Unavailable("the proposer queue stayed full".into())),
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(WriteError::ShuttingDown),
            Err(_) => Err(WriteError::Unknown(format!("no answer within {} ms", self.write_timeout.as_millis()))),
        }
    }
}

/// Refuses commands that, inside a log entry, would nest deeper than every node's decoder
/// takes: such an entry would be appended by the leader and refused by every follower and by
/// the log reader, and cost the cluster its leader (DESIGN.md §2, "Nothing unreadable
/// reaches the log"). `encoded` is the commands as a JSON array, as the entry holds them.
fn check_depth(encoded: &[u8]) -> Result<(), WriteError> {
    // The array's own brackets sit at `commands_level()` in the deepest encoding.
    let depth = commands_level().saturating_sub(1) + json_depth(encoded);
    if depth > DECODER_DEPTH_MAX {
        return Err(WriteError::Invalid(format!(
            "the command nests {depth} levels deep in a log entry; every node decodes at most {DECODER_DEPTH_MAX}"
        )));
    }
    Ok(())
}

/// The nesting level at which a log entry's command array opens in the deepest encoding an
/// entry travels in — a whole `AppendEntries` request (the framed request, the forward RPC
/// and the log store hold it shallower) — measured once from a real encoding.
fn commands_level() -> usize {
    static LEVEL: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
        let batch = Batch::new(0, std::sync::Arc::from(Vec::new()));
        let request = openraft::raft::AppendEntriesRequest::<TypeConfig> {
            vote: Vote::default(),
            prev_log_id: None,
            entries: vec![Entry { log_id: LogId::default(), payload: openraft::EntryPayload::Normal(batch) }],
            leader_commit: None,
        };
        let encoded = serde_json::to_vec(&request).expect("an AppendEntries request encodes");
        let key = b"\"commands\":[";
        let at = encoded.windows(key.len()).position(|w| w == key).expect("an entry's batch holds its commands");
        json_nesting(&encoded[..at + key.len()]).1
    });
    *LEVEL
}

async fn run(ctx: ProposerContext, mut rx: mpsc::Receiver<Unit>) {
    let mut next: Option<Unit> = None;
    loop {
        let first = match next.take() {
            Some(unit) => unit,
            None => match rx.recv().await {
                Some(unit) => unit,
                None => return,
            },
        };
        let mut units = Vec::new();
        let (mut count, mut bytes) = (0, 0);
        for unit in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            if unit.reply.is_closed() || unit.deadline <= Instant::now() {
                // The submitter gave up (and answered itself): never proposed.
                let _ = unit.reply.send(Err(WriteError::Unavailable("not proposed before its deadline".into())));
                continue;
            }
            let full = count + unit.commands.len() > BATCH_COMMANDS_MAX || bytes + unit.encoded.len() > ENTRY_BYTES_MAX;
            if full && !units.is_empty() {
                next = Some(unit);
                break;
            }
            count += unit.commands.len();
            bytes += unit.encoded.len();
            units.push(unit);
        }
        if units.is_empty() {
            continue;
        }
        let deadline = units.iter().map(|u| u.deadline).max().unwrap_or_else(Instant::now);
        ctx.metrics.batch_commands.observe(count as f64);
        ctx.metrics.batches_in_flight.inc();
        let result = commit(&ctx, &units, deadline).await;
        ctx.metrics.batches_in_flight.dec();
        fan_out(units, result);
    }
}

fn fan_out(units: Vec<Unit>, result: Result<Vec<Outcome>, WriteError>) {
    match result {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for unit in units {
                let mine: Vec<Outcome> = outcomes.by_ref().take(unit.commands.len()).collect();
                let _ = unit.reply.send(Ok(mine));
            }
        }
        Err(error) => {
            for unit in units {
                let _ = unit.reply.send(Err(error.clone()));
            }
        }
    }
}

/// Proposes on the leader, or forwards to it, by `deadline`; retries only where the write
/// surely did not happen (no leader yet, the peer said it is not the leader, or the request
/// never left this node).
async fn commit(ctx: &ProposerContext, units: &[Unit], deadline: Instant) -> Result<Vec<Outcome>, WriteError> {
    loop {
        let (leader, addr) = wait_for_leader(&ctx.raft, deadline).await?;
        if leader == ctx.node_id {
            let disk = *ctx.disk.borrow();
            if disk.full {
                return Err(WriteError::Unavailable(disk.refusal()));
            }
            let stamp = {
                let clock = ctx.clock.borrow();
                if !clock.may_lead() {
                    return Err(WriteError::Unavailable(
                        "this node's clock is off from the cluster; it does not lead".into(),
                    ));
                }
                clock.stamp()
            };
            let commands = units.iter().flat_map(|u| u.commands.iter().cloned()).collect();
            return propose(&ctx.raft, Batch::new(stamp, commands), deadline).await;
        }
        let encoded = join_encoded(units);
        match forward(&ctx.peers, &addr, encoded, deadline).await? {
            Some(outcomes) => return Ok(outcomes),
            None => {
                // Not applied: let the node learn of a new leader, then try again.
                let mut metrics = ctx.raft.metrics();
                let _ = tokio::time::timeout(LEADER_RETRY_DELAY, metrics.changed()).await;
                if Instant::now() >= deadline {
                    return Err(WriteError::Unavailable(format!("leader {leader} could not be reached in time")));
                }
            }
        }
    }
}

/// One `client_write` on this (leader) node, bounded by `deadline`: a leader that lost its
/// quorum never commits, and the entry it appended may still commit later, so that is
/// `Unknown`.
async fn propose(raft: &Raft, batch: Batch, deadline: Instant) -> Result<Vec<Outcome>, WriteError> {
    match tokio::time::timeout_at(deadline, raft.client_write(batch)).await {
        Ok(Ok(response)) => Ok(response.data),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
            // Not "never appended": openraft answers this both to a write refused before its
            // append and to one appended and then truncated by a newer leader — which, with
            // five voters, may still commit it (it was copied to a node that a later leader
            // wins with). Only the `Forward` RPC's NotLeader, decided before submitting, is
            // a sure "not applied".
            Err(WriteError::Unknown("leadership moved while the write was in flight; it may still apply".into()))
        }
        Ok(Err(e)) => Err(WriteError::Unknown(e.to_string())),
        Err(_) => Err(WriteError::Unknown("no quorum acknowledged the write before the deadline".into())),
    }
}

/// The units' commands as one JSON array, from their already encoded arrays.
fn join_encoded(units: &[Unit]) -> Vec<u8> {
    let mut out = Vec::with_capacity(units.iter().map(|u| u.encoded.len()).sum::<usize>() + 2);
    out.push(b'[');
    for unit in units {
        // Each is `[...]`; its inside joins the others.
        let inner = &unit.encoded[1..unit.encoded.len() - 1];
        if inner.is_empty() {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(inner);
    }
    out.push(b']');
    out
}

/// Sends commands to the leader. `Ok(None)`: not applied — the peer is not (or no longer)
/// the leader, or the request never left this node.
async fn forward(
    peers: &Peers,
    addr: &str,
    commands: Vec<u8>,
    deadline: Instant,
) -> Result<Option<Vec<Outcome>>, WriteError> {
    let Ok(mut client) = peers.client(addr) else { return Ok(None) };
    let mut request = tonic::Request::new(ForwardRequest { commands });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let Some(reply) = call_leader(deadline, "forward to the leader", client.forward(request)).await? else {
        return Ok(None);
    };
    match reply.result {
        Some(ForwardResult::Outcomes(bytes)) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| WriteError::Unknown(e.to_string()))
        }
        Some(ForwardResult::NotLeader(_)) => Ok(None),
        Some(ForwardResult::Unavailable(message)) => Err(WriteError::Unavailable(message)),
        Some(ForwardResult::Unknown(message)) => Err(WriteError::Unknown(message)),
        None => Err(WriteError::Unknown("empty forward reply".into())),
    }
}

/// One call to the leader by `deadline`. `Ok(None)`: it provably never reached the peer
/// (see [`never_sent`]); any other failure may have had its effect, so it is `Unknown`.
pub(crate) async fn call_leader<T>(
    deadline: Instant,
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<Option<T>, WriteError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(reply)) => Ok(Some(reply.into_inner())),
        Ok(Err(status)) if never_sent(&status) => Ok(None),
        Ok(Err(status)) => Err(WriteError::Unknown(format!("{what}: {}", status.message()))),
        Err(_) => Err(WriteError::Unknown("the leader did not answer before the deadline".into())),
    }
}

/// Whether a failed call provably never reached the peer: the connection could not be
/// established (refused, unreachable, timed out while connecting). Decided from the error's
/// kind, never its text; anything else — a reset after sending, a deadline — is unknown.
pub(crate) fn never_sent(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    use std::io::ErrorKind;
    let mut source = status.source();
    let mut connecting = false;
    while let Some(error) = source {
        if let Some(transport) = error.downcast_ref::<tonic::transport::Error>() {
            // tonic reports a failed connect as a transport error whose source is the connector's.
            connecting |=
                transport.source().is_some_and(|s| s.is::<tonic::transport::Error>() || s.is::<std::io::Error>());
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            // Refused and address-not-available only happen while connecting; unreachable and
            // timed-out can also hit an established connection after bytes left (an ICMP
            // error, a stalled peer), so they count only when the error came from connecting.
            return matches!(io.kind(), ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable)
                || (connecting
                    && matches!(
                        io.kind(),
                        ErrorKind::TimedOut | ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable
                    ));
        }
        source = error.source();
    }
    false
}

/// Waits until the node knows a leader; returns its id and gRPC address.
pub(crate) async fn wait_for_leader(raft: &Raft, deadline: Instant) -> Result<(NodeId, String), WriteError> {
    let mut metrics = raft.metrics();
    loop {
        {
            let m = metrics.borrow_and_update();
            if let Some(leader) = m.current_leader {
                if let Some(node) = m.membership_config.membership().get_node(&leader) {
                    return Ok((leader, node.grpc_addr.clone()));
                }
            }
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Err(WriteError::Unavailable("no leader elected before the deadline".into()));
        }
        match tokio::time::timeout(wait, metrics.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => return Err(WriteError::ShuttingDown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_arrays_join_into_one() {
        let unit = |json: &str| Unit {
            commands: Vec::new(),
            encoded: json.as_bytes().to_vec(),
            deadline: Instant::now(),
            reply: oneshot::channel().0,
        };
        let joined = join_encoded(&[unit("[1,2]"), unit("[]"), unit("[3]")]);
        assert_eq!(String::from_utf8(joined).expect("utf-8"), "[1,2,3]");
        assert_eq!(join_encoded(&[unit("[]")]), b"[]");
    }

    /// A job command whose payload nests `levels` deep.
    fn deep_job(levels: usize) -> Command {
        let mut payload = serde_json::json!(1);
        for _ in 0..levels {
            payload = serde_json::json!([payload]);
        }
        let spec = raftbox_storage::jobs::JobSpec {
            id: "j".into(),
            owner_user_id: "u".into(),
            job_type: "noop".into(),
            target: String::new(),
            payload,
            schedule: raftbox_storage::jobs::Schedule::Once { run_at_ms: 1 },
            max_retries: 0,
            retry_backoff_ms: 1_000,
            timeout_s: 30,
        };
        Command::CreateJob(Box::new(raftbox_storage::jobs::Job::scheduled(spec, Some(1))))
    }

    #[test]
    fn a_command_is_proposed_only_if_every_encoding_of_its_entry_decodes() {
        let mut deepest_taken = None;
        for levels in 60..140 {
            let commands = vec![deep_job(levels)];
            let encoded = serde_json::to_vec(&commands).expect("encode");
            let batch = Batch::new(1, commands.into());
            let entry = Entry { log_id: LogId::default(), payload: openraft::EntryPayload::Normal(batch) };
            let request = openraft::raft::AppendEntriesRequest::<TypeConfig> {
                vote: Vote::default(),
                prev_log_id: None,
                entries: vec![entry.clone()],
                leader_commit: None,
            };
            let whole = serde_json::to_vec(&request).expect("encode");
            let decodes = serde_json::from_slice::<openraft::raft::AppendEntriesRequest<TypeConfig>>(&whole).is_ok()
                && serde_json::from_slice::<Entry>(&serde_json::to_vec(&entry).expect("encode")).is_ok();
            // Taken exactly when every decoder takes it: never one a follower refuses.
            assert_eq!(check_depth(&encoded).is_ok(), decodes, "{levels} levels");
            if decodes {
                deepest_taken = Some(levels);
            }
        }
        let deepest = deepest_taken.expect("some depths decode");
        assert!((100..127).contains(&deepest), "payloads up to {deepest} levels are proposed");
    }

    fn peers() -> Peers {
        Peers::new(crate::secret::ClusterSecret::parse("proposer-tests-secret").expect("secret"))
    }

    async fn status_error(addr: &str) -> tonic::Status {
        let mut client = peers().client(addr).expect("client");
        let mut request = tonic::Request::new(crate::pb::StatusRequest {});
        request.set_timeout(Duration::from_secs(2));
        client.status(request).await.expect_err("no server answers")
    }

    #[tokio::test]
    async fn a_refused_connection_never_sent_the_request() {
        // Bind and drop: nothing listens on that port now.
        let addr = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
        let status = status_error(&addr.to_string()).await;
        assert!(never_sent(&status), "refused connect: {status:?}");
    }

    #[tokio::test]
    async fn a_connection_dropped_after_accepting_is_unknown() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                // Read what the client sends, then hang up: the request may have arrived.
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_millis(200), socket.readable()).await;
                let _ = socket.try_read(&mut buf);
                drop(socket);
            }
        });
        let status = status_error(&addr.to_string()).await;
        assert!(!never_sent(&status), "a reset after the connection was accepted: {status:?}");
    }
}
