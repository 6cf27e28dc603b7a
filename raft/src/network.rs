//! The client side of the node-to-node gRPC protocol: openraft's `RaftNetwork` and the
//! forwarding calls of the proposer.
//!
//! Every call has a deadline; channels connect lazily with a connect timeout and HTTP/2
//! keep-alive, so a dead peer never hangs a call. Transport failures become
//! `RPCError::Unreachable`, which makes openraft back off. Every call carries the cluster
//! secret (if the cluster has one) and, when the node has TLS, travels over TLS to
//! `https://` peers, presenting the node's certificate under mutual TLS; messages are
//! bounded by [`MESSAGE_BYTES_MAX`], and an AppendEntries that would exceed
//! [`APPEND_BYTES_MAX`] asks openraft to send fewer entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::cluster_id::{ClusterId, Stamp};
use crate::log_cache::LogCache;
use crate::pb::raft_reply::Result as ReplyResult;
use crate::pb::raft_service_client::RaftServiceClient;
use crate::pb::{AppendEntriesFrame, RaftMessage, RaftReply};
use crate::secret::ClusterSecret;
use crate::tls::NodeTls;
use crate::types::{NodeId, NodeInfo, TypeConfig};

/// How long establishing a TCP connection to a peer may take.
pub const CONNECT_TIMEOUT_MS: u64 = 500;
/// HTTP/2 keep-alive ping interval; a peer that stops answering is detected within
/// interval + timeout.
pub const KEEPALIVE_INTERVAL_MS: u64 = 1_000;
pub const KEEPALIVE_TIMEOUT_MS: u64 = 2_000;
/// Largest encoded log entry (one batch of commands), in bytes. The proposer keeps batches
/// under it and refuses a single command above it.
pub const ENTRY_BYTES_MAX: usize = 16 << 20;
/// Largest AppendEntries request openraft is let to send at once (several entries), in
/// bytes; above it openraft is asked to send fewer entries.
pub const APPEND_BYTES_MAX: usize = 2 * ENTRY_BYTES_MAX;
/// Largest gRPC message between nodes, either way, in bytes: an AppendEntries of
/// [`APPEND_BYTES_MAX`] or a block of `BLOCK_BYTES_MAX`, with room for framing.
pub const MESSAGE_BYTES_MAX: usize = APPEND_BYTES_MAX + (1 << 20);

const _: () = assert!(MESSAGE_BYTES_MAX > raftbox_storage::blocks::BLOCK_BYTES_MAX + (64 << 10));
/// HTTP/2 flow-control window of one stream, either way, in bytes: a whole block travels
/// without waiting for a window update (the defaults, 64 KiB to 1 MiB, made a 4 MiB
/// `PutBlock` wait on the receiver several times).
pub const STREAM_WINDOW_BYTES: u32 = raftbox_storage::blocks::BLOCK_BYTES_MAX as u32;
/// HTTP/2 flow-control window of one connection, in bytes: several blocks in flight at once.
/// It bounds what a node buffers unread per connection.
pub const CONNECTION_WINDOW_BYTES: u32 = 4 * STREAM_WINDOW_BYTES;
/// Largest HTTP/2 frame a node accepts, in bytes (default 16 KiB): fewer frames per block,
/// while a heartbeat still waits behind at most this much on its connection.
pub const FRAME_BYTES_MAX: u32 = 256 << 10;

/// A client of a peer's `RaftService` whose every call carries the cluster secret and this
/// node's cluster id ([`Stamp`]).
pub type PeerClient = RaftServiceClient<InterceptedService<Channel, Stamp>>;

/// Which connection to a peer a call travels on: Raft and control calls never queue behind
/// block transfers (megabytes each) on one HTTP/2 connection, so heartbeats stay on time
/// while a large file is replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Raft messages, forwarding, read index, status, membership.
    Control,
    /// `PutBlock` / `GetBlock`.
    Bulk,
}

/// A cache of lazily-connected channels: one per peer address and [`Lane`].
#[derive(Debug, Clone)]
pub struct Peers {
    channels: Arc<Mutex<HashMap<(Lane, String), Channel>>>,
    stamp: Stamp,
    tls: Option<NodeTls>,
}

impl Peers {
    /// Peers dialled in plaintext (tests; a node dials with its TLS settings).
    #[cfg(test)]
    pub fn new(secret: ClusterSecret) -> Peers {
        Peers::with_tls(secret, ClusterId::default(), None)
    }

    /// Peers dialled over TLS when `tls` is given, every call naming `cluster`.
    pub fn with_tls(secret: ClusterSecret, cluster: ClusterId, tls: Option<NodeTls>) -> Peers {
        Peers { channels: Arc::default(), stamp: Stamp::new(secret, cluster), tls }
    }

    /// A client for the peer at `grpc_addr` (host:port) on the control lane; connects on
    /// first use.
    pub fn client(&self, grpc_addr: &str) -> Result<PeerClient, tonic::transport::Error> {
        self.client_on(Lane::Control, grpc_addr)
    }

    /// A client for the peer at `grpc_addr` on `lane`; connects on first use.
    pub fn client_on(&self, lane: Lane, grpc_addr: &str) -> Result<PeerClient, tonic::transport::Error> {
        let key = (lane, grpc_addr.to_string());
        let channel = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            match channels.get(&key) {
                Some(channel) => channel.clone(),
                None => {
                    let endpoint = match &self.tls {
                        Some(tls) => {
                            Endpoint::from_shared(format!("https://{grpc_addr}"))?.tls_config(tls.grpc_client())?
                        }
                        None => Endpoint::from_shared(format!("http://{grpc_addr}"))?,
                    };
                    let channel = endpoint
                        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(Duration::from_millis(KEEPALIVE_INTERVAL_MS))
                        .keep_alive_timeout(Duration::from_millis(KEEPALIVE_TIMEOUT_MS))
                        .keep_alive_while_idle(true)
                        .initial_stream_window_size(STREAM_WINDOW_BYTES)
                        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                        .connect_lazy();
                    channels.insert(key, channel.clone());
                    channel
                }
            }
        };
        Ok(RaftServiceClient::with_interceptor(channel, self.stamp.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX))
    }
}

/// Builds one [`PeerNetwork`] per replication target.
#[derive(Clone)]
pub struct NetworkFactory {
    pub peers: Peers,
    /// The log store's cache: AppendEntries sends the encodings written to the log.
    pub cache: LogCache,
}

impl std::fmt::Debug for NetworkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkFactory").field("peers", &self.peers).finish_non_exhaustive()
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerNetwork {
        PeerNetwork {
            target,
            addr: node.grpc_addr.clone(),
            peers: self.peers.clone(),
            cache: self.cache.clone(),
            framed: true,
            incarnation: node.incarnation.clone(),
        }
    }
}

/// The metadata naming the incarnation the sender's configuration records for the target
/// (see [`crate::membership`]): a node whose data directory is another refuses the call.
pub const INCARNATION_HEADER: &str = "x-raftbox-incarnation";
/// What the header says for a record written before incarnations: only a data directory
/// that already held Raft state then (a legacy one) may take such a call.
pub const LEGACY_INCARNATION: &str = "legacy";

/// openraft's connection to one peer.
pub struct PeerNetwork {
    target: NodeId,
    addr: String,
    peers: Peers,
    cache: LogCache,
    /// Whether the peer serves `AppendEntriesFramed` (a node of an earlier version does not;
    /// it then gets the whole request as one JSON document).
    framed: bool,
    /// The incarnation the configuration records for the peer (sent with every call).
    incarnation: Option<String>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, NodeInfo, E>>;

/// A failed call. Only a connection that could not be made means the peer is unreachable,
/// after which openraft stops replicating to it for 500 ms. A call that timed out or failed
/// after it was sent is a network error, retried at the next heartbeat or entry: under load an
/// AppendEntries can outlast its timeout (openraft's is the heartbeat interval), and treating
/// that as "unreachable" stalled replication to a busy follower for 500 ms, and every write
/// with it when both followers were busy (seen in the 10,000-jobs burst).
fn failed<E: std::error::Error>(status: &tonic::Status) -> RPCError<NodeId, NodeInfo, E> {
    // A peer that refuses entries for a while (it lost its data, or its disk is full) is
    // treated as unreachable, so openraft backs off instead of retrying every heartbeat.
    let refusing = matches!(status.code(), tonic::Code::ResourceExhausted | tonic::Code::FailedPrecondition);
    if refusing || crate::proposer::never_sent(status) {
        RPCError::Unreachable(Unreachable::new(status))
    } else {
        network(status)
    }
}

fn network<E: std::error::Error, S: std::error::Error + 'static>(source: &S) -> RPCError<NodeId, NodeInfo, E> {
    RPCError::Network(NetworkError::new(source))
}

impl PeerNetwork {
    async fn call<Req, Resp, E>(
        &self,
        method: Method,
        request: &Req,
        timeout: Duration,
    ) -> RpcResult<Resp, RaftError<NodeId, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let json = serde_json::to_vec(request).map_err(|e| network(&e))?;
        self.call_encoded(method, json, timeout).await
    }

    async fn call_encoded<Resp, E>(
        &self,
        method: Method,
        json: Vec<u8>,
        timeout: Duration,
    ) -> RpcResult<Resp, RaftError<NodeId, E>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut client = self.peers.client(&self.addr).map_err(|e| network(&e))?;
        let mut message = tonic::Request::new(RaftMessage { json });
        message.set_timeout(timeout);
        self.name_incarnation(&mut message);
        let reply = match method {
            Method::AppendEntries => client.append_entries(message).await,
            Method::Vote => client.vote(message).await,
            Method::InstallSnapshot => client.install_snapshot(message).await,
        };
        self.answer(reply)
    }

    /// Names the incarnation the configuration records for the peer on `request`
    /// ([`LEGACY_INCARNATION`] for a record written before incarnations).
    fn name_incarnation<T>(&self, request: &mut tonic::Request<T>) {
        let named = self.incarnation.as_deref().unwrap_or(LEGACY_INCARNATION);
        let value = tonic::metadata::MetadataValue::try_from(named).ok();
        if let Some(value) = value {
            request.metadata_mut().insert(INCARNATION_HEADER, value);
        }
    }

    /// The request without its entries, and each entry's encoding: the one the log store
    /// wrote (or received), else made here.
    fn frame(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesFrame, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let header = AppendEntriesRequest::<TypeConfig> {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            leader_commit: rpc.leader_commit,
            entries: Vec::new(),
        };
        let header = serde_json::to_vec(&header).map_err(|e| network(&e))?.into();
        let entries = rpc
            .entries
            .iter()
            .map(|entry| match self.cache.encoded(&entry.log_id) {
                Some(bytes) => Ok(bytes),
                None => serde_json::to_vec(entry).map(Bytes::from).map_err(|e| network(&e)),
            })
            .collect::<Result<_, _>>()?;
        Ok(AppendEntriesFrame { header, entries })
    }

    /// The peer's answer to a call, or the error it stands for.
    fn answer<Resp, E>(
        &self,
        reply: Result<tonic::Response<RaftReply>, tonic::Status>,
    ) -> RpcResult<Resp, RaftError<NodeId, E>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply: RaftReply = reply.map_err(|status| failed(&status))?.into_inner();
        match reply.result {
            Some(ReplyResult::Ok(bytes)) => serde_json::from_slice(&bytes).map_err(|e| network(&e)),
            Some(ReplyResult::Error(bytes)) => {
                let error: RaftError<NodeId, E> = serde_json::from_slice(&bytes).map_err(|e| network(&e))?;
                Err(RPCError::RemoteError(RemoteError::new(self.target, error)))
            }
            None => Err(network(&std::io::Error::other("empty reply"))),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let too_large = |bytes: usize, entries: usize| {
            (bytes > APPEND_BYTES_MAX && entries > 1)
                .then(|| RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((entries / 2) as u64)))
        };
        if self.framed {
            let frame = self.frame(&rpc)?;
            let bytes = frame.header.len() + frame.entries.iter().map(Bytes::len).sum::<usize>();
            if let Some(error) = too_large(bytes, rpc.entries.len()) {
                return Err(error);
            }
            let mut client = self.peers.client(&self.addr).map_err(|e| network(&e))?;
            let mut message = tonic::Request::new(frame);
            message.set_timeout(option.hard_ttl());
            self.name_incarnation(&mut message);
            match client.append_entries_framed(message).await {
                Err(status) if status.code() == tonic::Code::Unimplemented => self.framed = false,
                reply => return self.answer(reply),
            }
        }
        let json = serde_json::to_vec(&rpc).map_err(|e| network(&e))?;
        if let Some(error) = too_large(json.len(), rpc.entries.len()) {
            return Err(error);
        }
        self.call_encoded(Method::AppendEntries, json, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(Method::InstallSnapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(Method::Vote, &rpc, option.hard_ttl()).await
    }
}
