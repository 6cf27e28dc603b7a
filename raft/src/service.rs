//! The server side of the node-to-node gRPC protocol, and [`serve`], which runs it behind
//! the cluster-secret check with bounded message sizes.

use openraft::raft::{AppendEntriesRequest, VoteRequest};
use raftbox_storage::blocks::{BlockHash, VerifiedBlock};
use raftbox_storage::Command;
use serde::Serialize;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;

use tonic::{Request, Response, Status};

use crate::error::WriteError;
use crate::limiter::Forwarded;
use crate::membership::MembershipChange;
use crate::network::{CONNECTION_WINDOW_BYTES, FRAME_BYTES_MAX, MESSAGE_BYTES_MAX, STREAM_WINDOW_BYTES};
use crate::node::RaftNode;
use crate::pb::forward_reply::Result as ForwardResult;
use crate::pb::raft_reply::Result as ReplyResult;
use crate::pb::raft_service_server::{RaftService, RaftServiceServer};
use crate::pb::rate_check_reply::Result as RateCheckResult;
use crate::pb::read_index_reply::Result as ReadIndexResult;
use crate::pb::{
    AppendEntriesFrame, BlockData, BlockRequest, ConfirmLeaderReply, ConfirmLeaderRequest, FillBlocksReply,
    FillBlocksRequest, ForwardReply, ForwardRequest, PutBlockReply, RaftMessage, RaftReply, RateCheckReply,
    RateCheckRequest, ReadIndexReply, ReadIndexRequest, StatusReply, StatusRequest,
};
use crate::types::{Entry, NodeId, NodeInfo, TypeConfig};

/// Serves the `RaftService` of one node.
#[derive(Clone)]
pub(crate) struct RaftGrpc {
    node: RaftNode,
}

/// Why the node-to-node server stopped (the transport's error, described).
#[derive(Debug)]
pub struct ServeError(String);

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node-to-node server: {}", self.0)
    }
}

impl std::error::Error for ServeError {}

impl RaftGrpc {
    pub(crate) fn new(node: RaftNode) -> RaftGrpc {
        RaftGrpc { node }
    }

    /// Refuses a call from a leader whose configuration records another incarnation for this
    /// node: this data directory is not the one that acknowledged that leader's entries, so
    /// its acknowledgements must not count (a wiped node would otherwise help a stale leader
    /// of an old term commit). It takes entries again once removed and added back. `true`
    /// when the call names this directory's incarnation exactly: only such a call may give a
    /// fresh node its cluster id (never one that merely reached its address).
    fn addressed_to_this_directory<T>(&self, request: &Request<T>) -> Result<bool, Status> {
        // The header is read once here; whether it names this directory exactly is the answer.
        let Some(expected) = request.metadata().get(crate::network::INCARNATION_HEADER) else { return Ok(false) };
        let mine = self.node.incarnation();
        let named = expected.as_bytes() == mine.as_bytes();
        let legacy_record = expected.as_bytes() == crate::network::LEGACY_INCARNATION.as_bytes();
        if named || (legacy_record && self.node.legacy_directory()) {
            return Ok(named);
        }
        Err(Status::failed_precondition(format!(
            "node {} runs another data directory (incarnation {mine}) than the sender's configuration records \
             ({}): it lost its data; remove it and add it again",
            self.node.id(),
            expected.to_str().unwrap_or("?")
        )))
    }

    /// Refuses what would write entries while the NOSPACE alarm is raised (the leader
    /// retries; see [`crate::disk`]).
    fn disk_has_room(&self) -> Result<(), Status> {
        let disk = self.node.disk();
        if disk.full {
            return Err(Status::resource_exhausted(disk.refusal()));
        }
        Ok(())
    }
}

fn block_hash(bytes: &[u8]) -> Result<BlockHash, Status> {
    let array: [u8; 32] = bytes.try_into().map_err(|_| Status::invalid_argument("a block hash is 32 bytes"))?;
    Ok(BlockHash(array))
}

fn decode<T: serde::de::DeserializeOwned>(message: &RaftMessage) -> Result<T, Status> {
    serde_json::from_slice(&message.json).map_err(|e| Status::invalid_argument(format!("decode request: {e}")))
}

fn reply<T: Serialize, E: Serialize>(result: Result<T, E>) -> Result<Response<RaftReply>, Status> {
    let encoded = match result {
        Ok(ok) => serde_json::to_vec(&ok).map(ReplyResult::Ok),
        Err(error) => serde_json::to_vec(&error).map(ReplyResult::Error),
    };
    let result = encoded.map_err(|e| Status::internal(format!("encode reply: {e}")))?;
    Ok(Response::new(RaftReply { result: Some(result) }))
}

#[tonic::async_trait]
impl RaftService for RaftGrpc {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        let named = self.addressed_to_this_directory(&request)?;
        self.node.same_cluster(&request, named)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        if !rpc.entries.is_empty() {
            self.disk_has_room()?;
        }
        reply(self.node.append_entries(rpc).await)
    }

    async fn append_entries_framed(&self, request: Request<AppendEntriesFrame>) -> Result<Response<RaftReply>, Status> {
        let named = self.addressed_to_this_directory(&request)?;
        self.node.same_cluster(&request, named)?;
        let frame = request.into_inner();
        if !frame.entries.is_empty() {
            self.disk_has_room()?;
        }
        let mut rpc: AppendEntriesRequest<TypeConfig> = serde_json::from_slice(&frame.header)
            .map_err(|e| Status::invalid_argument(format!("decode request: {e}")))?;
        rpc.entries.reserve(frame.entries.len());
        for bytes in frame.entries {
            let entry: Entry =
                serde_json::from_slice(&bytes).map_err(|e| Status::invalid_argument(format!("decode entry: {e}")))?;
            // The append writes these bytes rather than encoding the entry again.
            self.node.log_cache().received(entry.log_id, bytes);
            rpc.entries.push(entry);
        }
        reply(self.node.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        // A vote counts for the directory the candidate's configuration records: a machine
        // started on a replaced member's old directory (whose own stale configuration still
        // says it votes) must not lend the candidate a vote its replacement may have given
        // another candidate in the same term.
        self.addressed_to_this_directory(&request)?;
        self.node.same_cluster(&request, false)?;
        let rpc: VoteRequest<NodeId> = decode(request.get_ref())?;
        match self.node.vote(rpc).await {
            Ok(result) => reply(result),
            Err(why) => Err(Status::failed_precondition(why)),
        }
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        let named = self.addressed_to_this_directory(&request)?;
        self.node.same_cluster(&request, named)?;
        self.disk_has_room()?;
        let rpc: openraft::raft::InstallSnapshotRequest<crate::types::TypeConfig> = decode(request.get_ref())?;
        // The image's size travels in its id: what is still to come, and the install's copy
        // of it into the state, must fit above the minimum (the leader retries later).
        if let Some(bytes) = crate::state_machine::image_bytes(&rpc.meta.snapshot_id) {
            let need = bytes.saturating_sub(rpc.offset).saturating_add(bytes);
            self.node.disk().room_for(need, "installing this snapshot").map_err(Status::resource_exhausted)?;
        }
        reply(self.node.install_snapshot(rpc).await)
    }

    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardReply>, Status> {
        self.node.same_cluster(&request, false)?;
        let commands: Vec<Command> = serde_json::from_slice(&request.get_ref().commands)
            .map_err(|e| Status::invalid_argument(format!("decode commands: {e}")))?;
        // From the metrics, not a round trip to the Raft core: a caller that gives up must
        // not leave the core answering no one.
        let leader = self.node.metrics().current_leader;
        let result = if leader != Some(self.node.id()) || !self.node.clock().may_lead() {
            ForwardResult::NotLeader(leader.unwrap_or(0))
        } else if !commands.iter().all(crate::format::forwardable) {
            ForwardResult::Unavailable("only the leader itself raises the cluster's data format".into())
        } else {
            match self.node.proposer().submit(commands).await {
                Ok(outcomes) => ForwardResult::Outcomes(
                    serde_json::to_vec(&outcomes).map_err(|e| Status::internal(format!("encode outcomes: {e}")))?,
                ),
                Err(WriteError::ShuttingDown) => return Err(Status::unavailable("leader is shutting down")),
                Err(
                    e @ (WriteError::Unavailable(_)
                    | WriteError::TooLarge { .. }
                    | WriteError::Invalid(_)
                    | WriteError::FormatNotReached { .. }),
                ) => ForwardResult::Unavailable(e.to_string()),
                Err(e @ WriteError::Unknown(_)) => ForwardResult::Unknown(e.to_string()),
            }
        };
        Ok(Response::new(ForwardReply { result: Some(result) }))
    }

    /// A follower's rate-limit checks, decided here if this node leads (each bounded by the
    /// write timeout; the caller's deadline drops the call sooner).
    async fn rate_check(&self, request: Request<RateCheckRequest>) -> Result<Response<RateCheckReply>, Status> {
        self.node.same_cluster(&request, false)?;
        let requests: Vec<Vec<raftbox_storage::command::RateCheck>> = serde_json::from_slice(&request.get_ref().checks)
            .map_err(|e| Status::invalid_argument(format!("decode checks: {e}")))?;
        let leader = self.node.metrics().current_leader;
        if leader != Some(self.node.id()) {
            let result = RateCheckResult::NotLeader(leader.unwrap_or(0));
            return Ok(Response::new(RateCheckReply { result: Some(result) }));
        }
        let deadline = tokio::time::Instant::now() + self.node.write_timeout();
        let limiter = self.node.limiter();
        let decided = futures::future::join_all(requests.iter().map(|checks| limiter.decide(checks, deadline))).await;
        let answers: Vec<Forwarded> = decided.into_iter().map(Forwarded::from).collect();
        let encoded = serde_json::to_vec(&answers).map_err(|e| Status::internal(format!("encode answers: {e}")))?;
        Ok(Response::new(RateCheckReply { result: Some(RateCheckResult::Answers(encoded)) }))
    }

    /// Whether this node's saved vote is still for the caller's leadership (a vote for a
    /// later leader is saved before it is granted).
    async fn confirm_leader(
        &self,
        request: Request<ConfirmLeaderRequest>,
    ) -> Result<Response<ConfirmLeaderReply>, Status> {
        self.node.same_cluster(&request, false)?;
        let ConfirmLeaderRequest { term, leader_id } = request.into_inner();
        Ok(Response::new(ConfirmLeaderReply { holds: self.node.confirm_leader(term, leader_id).await }))
    }

    /// The leader's read index, after it confirmed its leadership with a quorum (bounded by
    /// the write timeout); a node that cannot confirm says it is not the leader.
    async fn read_index(&self, request: Request<ReadIndexRequest>) -> Result<Response<ReadIndexReply>, Status> {
        self.node.same_cluster(&request, false)?;
        let result = match self.node.confirmed_read_index().await {
            Some(index) => ReadIndexResult::Index(index),
            None => ReadIndexResult::NotLeader(self.node.metrics().current_leader.unwrap_or(0)),
        };
        Ok(Response::new(ReadIndexReply { result: Some(result) }))
    }

    async fn put_block(&self, request: Request<BlockData>) -> Result<Response<PutBlockReply>, Status> {
        self.node.same_cluster(&request, false)?;
        self.disk_has_room()?;
        let BlockData { hash, data } = request.into_inner();
        let block = VerifiedBlock::verify(block_hash(&hash)?, data)
            .map_err(|_| Status::invalid_argument("block bytes do not match the hash"))?;
        self.node.blocks().put_local(block).await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(PutBlockReply {}))
    }

    async fn get_block(&self, request: Request<BlockRequest>) -> Result<Response<BlockData>, Status> {
        self.node.same_cluster(&request, false)?;
        let hash = block_hash(&request.get_ref().hash)?;
        let store = self.node.blocks().store().clone();
        let found = tokio::task::spawn_blocking(move || store.get(&hash))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(e.to_string()))?;
        match found {
            Some(data) => Ok(Response::new(BlockData { hash: hash.0.to_vec(), data: data.into() })),
            None => Err(Status::not_found(format!("block {hash} not on this node"))),
        }
    }

    /// Never refused for its cluster id: it is how a node (`cluster add`, a bootstrap) learns
    /// which cluster another belongs to.
    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        // From the metrics (a probe may give up at any time; see `forward`): a node is
        // initialized once it holds a membership from a log entry.
        let metrics = self.node.metrics();
        let initialized = metrics.membership_config.log_id().is_some();
        Ok(Response::new(StatusReply {
            initialized,
            node_id: self.node.id(),
            now_ms: crate::clock::now_ms(),
            voter_ids: metrics.membership_config.membership().voter_ids().collect(),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            incarnation: self.node.incarnation().to_owned(),
            format: self.node.reads_format(),
            cluster_id: self.node.cluster_id().as_deref().unwrap_or_default().to_owned(),
            knows_cluster_ids: true,
            leads_refusing_writes: metrics.current_leader == Some(self.node.id()) && !self.node.keeps_leading(),
        }))
    }

    /// The bootstrapping node's initial configuration (see [`RaftNode::initialize_here`]).
    async fn initialize(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let members: std::collections::BTreeMap<NodeId, NodeInfo> = decode(request.get_ref())?;
        // The id is taken only from a configuration that names this directory.
        let names_me =
            members.get(&self.node.id()).and_then(|info| info.incarnation.as_deref()) == Some(self.node.incarnation());
        self.node.same_cluster(&request, names_me)?;
        let result = self.node.initialize_here(members).await;
        let json = serde_json::to_vec(&result).map_err(|e| Status::internal(format!("encode reply: {e}")))?;
        Ok(Response::new(RaftMessage { json }))
    }

    /// The leader, about to promote this learner, asks it to fetch every indexed block it
    /// lacks once it has applied as far as the leader had.
    async fn fill_blocks(&self, request: Request<FillBlocksRequest>) -> Result<Response<FillBlocksReply>, Status> {
        self.node.same_cluster(&request, false)?;
        let FillBlocksRequest { applied_index, after, budget_ms } = request.into_inner();
        let after = if after.is_empty() { None } else { Some(block_hash(&after)?) };
        let budget = (budget_ms > 0).then(|| Duration::from_millis(budget_ms));
        let (report, next) = self.node.fill_blocks(applied_index, after, budget).await.map_err(Status::unavailable)?;
        Ok(Response::new(FillBlocksReply {
            fetched: report.fetched,
            unavailable: report.unavailable,
            failed: report.failed,
            next: match next {
                crate::blocks::FillEnd::At(Some(hash)) => hash.0.to_vec(),
                _ => Vec::new(),
            },
            more: next != crate::blocks::FillEnd::Done,
        }))
    }

    /// A membership change forwarded by a follower; carried out only on the leader.
    async fn change_membership(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.node.same_cluster(&request, false)?;
        let change: MembershipChange = decode(request.get_ref())?;
        let result = self.node.change_membership_here(&change).await;
        let json = serde_json::to_vec(&result).map_err(|e| Status::internal(format!("encode reply: {e}")))?;
        Ok(Response::new(RaftMessage { json }))
    }
}

/// Serves the node's `RaftService` on `listener` until `shutdown` resolves. Every call must
/// carry the cluster secret if there is one (checked before the message is decoded); with the
/// node's TLS the listener serves TLS only, and under mutual TLS it demands a client
/// certificate from the cluster's CA in the handshake. Messages either way are bounded by
/// [`MESSAGE_BYTES_MAX`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    node: RaftNode,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let service = RaftServiceServer::new(RaftGrpc::new(node.clone()))
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);
    let checked = InterceptedService::new(service, node.secret().check());
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(FRAME_BYTES_MAX)
        .add_service(checked);
    let served = match node.tls() {
        Some(tls) => server.serve_with_incoming_shutdown(tls.grpc_incoming(listener), shutdown).await,
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            server.serve_with_incoming_shutdown(incoming, shutdown).await
        }
    };
    served.map_err(|e| ServeError(e.to_string()))
}
