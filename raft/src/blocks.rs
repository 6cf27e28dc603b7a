//! Block transfer between nodes: majority-durable replication of a new block, background
//! fill of the remaining peers, and fetching a block this node lacks from a peer.
//!
//! Blocks travel outside the Raft log; only their chunk-index entry is a Raft command.

use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use raftbox_storage::blocks::{BlockHash, BlockStore};
use tokio::sync::mpsc;

use crate::network::Peers;
use crate::pb::{BlockData, BlockRequest};
use crate::types::{NodeId, Raft};

/// Deadline of one block transfer to or from a peer.
pub const BLOCK_TRANSFER_TIMEOUT_MS: u64 = 30_000;

/// Why a block could not be made durable or found.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("block store: {0}")]
    Store(#[from] raftbox_storage::StorageError),
    #[error("only {stored} of the {needed} copies a majority needs could be stored")]
    NoMajority { stored: usize, needed: usize },
    #[error("block store task failed: {0}")]
    Task(String),
}

/// This node's block store and its way to the peers' stores.
#[derive(Clone)]
pub struct Blocks {
    node_id: NodeId,
    store: Arc<BlockStore>,
    raft: Raft,
    peers: Peers,
}

impl Blocks {
    pub(crate) fn new(node_id: NodeId, store: Arc<BlockStore>, raft: Raft, peers: Peers) -> Blocks {
        Blocks { node_id, store, raft, peers }
    }

    pub fn store(&self) -> &Arc<BlockStore> {
        &self.store
    }

    /// The other members' gRPC addresses.
    fn peer_addrs(&self) -> Vec<(NodeId, String)> {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        membership
            .nodes()
            .filter(|(id, _)| **id != self.node_id)
            .map(|(id, info)| (*id, info.grpc_addr.clone()))
            .collect()
    }

    /// Stores locally, on a blocking thread.
    pub async fn put_local(&self, hash: BlockHash, data: Bytes) -> Result<(), BlockError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.put(&hash, &data))
            .await
            .map_err(|e| BlockError::Task(e.to_string()))??;
        Ok(())
    }

    /// Makes a block durable on a majority of the members (this node included) and returns
    /// then; the other members keep receiving it in the background.
    pub async fn put_replicated(&self, hash: BlockHash, data: Bytes) -> Result<(), BlockError> {
        self.put_local(hash, data.clone()).await?;
        let peers = self.peer_addrs();
        let needed = (peers.len() + 1) / 2 + 1;
        let mut stored = 1;
        if stored >= needed {
            return Ok(());
        }
        let (tx, mut rx) = mpsc::channel(peers.len().max(1));
        for (peer, addr) in peers {
            let (tx, this, data) = (tx.clone(), self.clone(), data.clone());
            tokio::spawn(async move {
                let result = this.send(&addr, hash, data).await;
                if let Err(e) = &result {
                    tracing::debug!(peer, %hash, error = %e, "block not sent; the peer fetches it when needed");
                }
                let _ = tx.send(result.is_ok()).await;
            });
        }
        drop(tx);
        while let Some(ok) = rx.recv().await {
            stored += usize::from(ok);
            if stored >= needed {
                return Ok(());
            }
        }
        Err(BlockError::NoMajority { stored, needed })
    }

    async fn send(&self, addr: &str, hash: BlockHash, data: Bytes) -> Result<(), tonic::Status> {
        let mut client = self
            .peers
            .client_on(crate::network::Lane::Bulk, addr)
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(BlockData { hash: hash.0.to_vec(), data });
        request.set_timeout(Duration::from_millis(BLOCK_TRANSFER_TIMEOUT_MS));
        client.put_block(request).await.map(|_| ())
    }

    /// The block's bytes: from this node, else fetched (and kept) from a peer that holds it.
    pub async fn get(&self, hash: BlockHash) -> Result<Option<Bytes>, BlockError> {
        let store = self.store.clone();
        let local =
            tokio::task::spawn_blocking(move || store.get(&hash)).await.map_err(|e| BlockError::Task(e.to_string()))?;
        match local {
            Ok(Some(bytes)) => return Ok(Some(Bytes::from(bytes))),
            Ok(None) => {}
            Err(e) => tracing::warn!(%hash, error = %e, "local copy unusable; fetching from a peer"),
        }
        for (peer, addr) in self.peer_addrs() {
            match self.fetch(&addr, hash).await {
                Ok(Some(data)) => {
                    self.put_local(hash, data.clone()).await?;
                    tracing::debug!(peer, %hash, "fetched block from peer");
                    return Ok(Some(data));
                }
                Ok(None) => {}
                Err(status) => tracing::debug!(peer, %hash, error = %status, "peer could not serve block"),
            }
        }
        Ok(None)
    }

    /// One peer's copy, verified; `None` if it does not hold the block.
    async fn fetch(&self, addr: &str, hash: BlockHash) -> Result<Option<Bytes>, tonic::Status> {
        let mut client = self
            .peers
            .client_on(crate::network::Lane::Bulk, addr)
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(BlockRequest { hash: hash.0.to_vec() });
        request.set_timeout(Duration::from_millis(BLOCK_TRANSFER_TIMEOUT_MS));
        match client.get_block(request).await {
            Ok(reply) => {
                let data = reply.into_inner().data;
                if BlockHash::of(&data) != hash {
                    return Err(tonic::Status::data_loss("peer sent bytes that do not match the hash"));
                }
                Ok(Some(data))
            }
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status),
        }
    }
}
