//! The server side of the node-to-node gRPC protocol.

use raftbox_storage::blocks::BlockHash;
use raftbox_storage::Command;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::error::WriteError;
use crate::node::RaftNode;
use crate::pb::forward_reply::Result as ForwardResult;
use crate::pb::raft_reply::Result as ReplyResult;
use crate::pb::raft_service_server::RaftService;
use crate::pb::read_index_reply::Result as ReadIndexResult;
use crate::pb::{
    BlockData, BlockRequest, ForwardReply, ForwardRequest, PutBlockReply, RaftMessage, RaftReply, ReadIndexReply,
    ReadIndexRequest, StatusReply, StatusRequest,
};

/// Serves the `RaftService` of one node.
#[derive(Clone)]
pub struct RaftGrpc {
    node: RaftNode,
}

impl RaftGrpc {
    pub fn new(node: RaftNode) -> RaftGrpc {
        RaftGrpc { node }
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
        let rpc = decode(request.get_ref())?;
        reply(self.node.raft().append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        let rpc = decode(request.get_ref())?;
        reply(self.node.raft().vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftReply>, Status> {
        let rpc = decode(request.get_ref())?;
        reply(self.node.raft().install_snapshot(rpc).await)
    }

    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardReply>, Status> {
        let commands: Vec<Command> = serde_json::from_slice(&request.get_ref().commands)
            .map_err(|e| Status::invalid_argument(format!("decode commands: {e}")))?;
        let leader = self.node.raft().current_leader().await;
        let result = if leader != Some(self.node.id()) {
            ForwardResult::NotLeader(leader.unwrap_or(0))
        } else {
            match self.node.proposer().submit(commands).await {
                Ok(outcomes) => ForwardResult::Outcomes(
                    serde_json::to_vec(&outcomes).map_err(|e| Status::internal(format!("encode outcomes: {e}")))?,
                ),
                Err(WriteError::ShuttingDown) => return Err(Status::unavailable("leader is shutting down")),
                Err(e) => ForwardResult::Unknown(e.to_string()),
            }
        };
        Ok(Response::new(ForwardReply { result: Some(result) }))
    }

    async fn read_index(&self, _request: Request<ReadIndexRequest>) -> Result<Response<ReadIndexReply>, Status> {
        let result = match self.node.raft().get_read_log_id().await {
            Ok((read_log_id, _applied)) => ReadIndexResult::Index(read_log_id.map(|id| id.index).unwrap_or(0)),
            Err(_) => ReadIndexResult::NotLeader(self.node.raft().current_leader().await.unwrap_or(0)),
        };
        Ok(Response::new(ReadIndexReply { result: Some(result) }))
    }

    async fn put_block(&self, request: Request<BlockData>) -> Result<Response<PutBlockReply>, Status> {
        let BlockData { hash, data } = request.into_inner();
        let hash = block_hash(&hash)?;
        if BlockHash::of(&data) != hash {
            return Err(Status::invalid_argument("block bytes do not match the hash"));
        }
        self.node.blocks().put_local(hash, data).await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(PutBlockReply {}))
    }

    async fn get_block(&self, request: Request<BlockRequest>) -> Result<Response<BlockData>, Status> {
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

    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let initialized = self.node.raft().is_initialized().await.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(StatusReply { initialized, node_id: self.node.id() }))
    }
}
