//! Client-write batching and leader forwarding.
//!
//! Commands submitted while the previous log entry is in flight are gathered into one
//! [`Batch`] (one log entry, one fsync) and the outcomes fanned back out. On the leader the
//! batch is stamped with the leader's clock and proposed; on a follower it is forwarded to the
//! leader as one `Forward` RPC, where it joins the leader's own queue.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use raftbox_storage::{Batch, Command, Outcome};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::WriteError;
use crate::network::Peers;
use crate::pb::forward_reply::Result as ForwardResult;
use crate::pb::ForwardRequest;
use crate::types::{NodeId, Raft};

/// Commands waiting for the next batch, at most (back-pressure beyond this).
pub const QUEUE_UNITS_MAX: usize = 16_384;
/// Commands in one log entry, at most.
pub const BATCH_COMMANDS_MAX: usize = 4_096;
/// After a leader refused or could not be reached, wait this long (or until the node's view
/// of the cluster changes) before trying again.
const LEADER_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Submitted commands and where their outcomes go.
struct Unit {
    commands: Vec<Command>,
    reply: oneshot::Sender<Result<Vec<Outcome>, WriteError>>,
}

/// What the proposer needs of the node.
#[derive(Clone)]
pub(crate) struct ProposerContext {
    pub node_id: NodeId,
    pub raft: Raft,
    pub peers: Peers,
    pub write_timeout: Duration,
}

/// Handle to the node's proposer task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Unit>,
}

impl Proposer {
    pub(crate) fn spawn(ctx: ProposerContext) -> Proposer {
        let (tx, rx) = mpsc::channel(QUEUE_UNITS_MAX);
        tokio::spawn(run(ctx, rx));
        Proposer { tx }
    }

    /// Applies `commands` (atomically, in order, within one log entry) and returns one outcome
    /// per command.
    pub async fn submit(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Unit { commands, reply }).await.map_err(|_| WriteError::ShuttingDown)?;
        rx.await.map_err(|_| WriteError::ShuttingDown)?
    }
}

async fn run(ctx: ProposerContext, mut rx: mpsc::Receiver<Unit>) {
    while let Some(first) = rx.recv().await {
        let mut count = first.commands.len();
        let mut units = vec![first];
        while count < BATCH_COMMANDS_MAX {
            match rx.try_recv() {
                Ok(unit) => {
                    count += unit.commands.len();
                    units.push(unit);
                }
                Err(_) => break,
            }
        }
        let commands: Vec<Command> = units.iter().flat_map(|u| u.commands.iter().cloned()).collect();
        let result = commit(&ctx, commands).await;
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

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Proposes on the leader, or forwards to it; retries only where the write surely did not
/// happen (no leader yet, or the peer said it is not the leader).
async fn commit(ctx: &ProposerContext, commands: Vec<Command>) -> Result<Vec<Outcome>, WriteError> {
    let deadline = Instant::now() + ctx.write_timeout;
    loop {
        let (leader, addr) = wait_for_leader(&ctx.raft, deadline).await?;
        if leader == ctx.node_id {
            let batch = Batch { now_ms: now_ms(), commands };
            return match ctx.raft.client_write(batch).await {
                Ok(response) => Ok(response.data),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                    Err(WriteError::Unknown("leadership changed during the write".into()))
                }
                Err(e) => Err(WriteError::Unknown(e.to_string())),
            };
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match forward(&ctx.peers, &addr, &commands, remaining).await? {
            Some(outcomes) => return Ok(outcomes),
            None => {
                // Not applied: let the node learn of a new leader, then try again.
                let mut metrics = ctx.raft.metrics();
                let _ = tokio::time::timeout(LEADER_RETRY_DELAY, metrics.changed()).await;
                if Instant::now() >= deadline {
                    return Err(WriteError::Unavailable(format!("leader {leader} unreachable")));
                }
            }
        }
    }
}

/// Sends commands to the leader. `Ok(None)`: not applied, the peer is not (or no longer) the
/// leader or could not be reached at all.
async fn forward(
    peers: &Peers,
    addr: &str,
    commands: &[Command],
    timeout: Duration,
) -> Result<Option<Vec<Outcome>>, WriteError> {
    let encoded = serde_json::to_vec(commands).map_err(|e| WriteError::Unknown(e.to_string()))?;
    let mut client = peers.client(addr).map_err(|e| WriteError::Unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(ForwardRequest { commands: encoded });
    request.set_timeout(timeout);
    let reply = match client.forward(request).await {
        Ok(reply) => reply.into_inner(),
        Err(status) if never_sent(&status) => return Ok(None),
        Err(status) => return Err(WriteError::Unknown(format!("forward to leader: {}", status.message()))),
    };
    match reply.result {
        Some(ForwardResult::Outcomes(bytes)) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| WriteError::Unknown(e.to_string()))
        }
        Some(ForwardResult::NotLeader(_)) => Ok(None),
        Some(ForwardResult::Unknown(message)) => Err(WriteError::Unknown(message)),
        None => Err(WriteError::Unknown("empty forward reply".into())),
    }
}

/// A connection that was refused never carried the request.
fn never_sent(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && format!("{status:?}").contains("onnect")
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
