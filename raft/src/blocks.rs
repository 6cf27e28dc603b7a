//! Block transfer between nodes: majority-durable replication of a new block, background
//! fill of the remaining peers, and fetching a block this node lacks from a peer.
//!
//! Blocks travel outside the Raft log; only their chunk-index entry is a Raft command.

use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use raftbox_storage::blocks::{BlockHash, BlockStore, VerifiedBlock};
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

/// What filling in lacking blocks did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FillReport {
    /// Blocks fetched from a peer.
    pub fetched: u64,
    /// Blocks every member answered it does not hold.
    pub unavailable: u64,
    /// Blocks not fetched because a peer failed or did not answer (worth another try).
    pub failed: u64,
}

impl FillReport {
    fn add(&mut self, other: FillReport) {
        self.fetched += other.fetched;
        self.unavailable += other.unavailable;
        self.failed += other.failed;
    }
}

/// What asking the peers for one block gave.
enum Fetched {
    Got(Bytes),
    /// Every peer answered that it does not hold the block.
    NoHolder,
    /// No peer gave it, and at least one failed to answer.
    Failed,
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
    pub async fn put_local(&self, block: VerifiedBlock) -> Result<(), BlockError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.put(&block)).await.map_err(|e| BlockError::Task(e.to_string()))??;
        Ok(())
    }

    /// Makes a block durable on a majority of the members and returns then; the others keep
    /// receiving it in the background. This node's write and fsync run at the same time as
    /// the transfers to the peers, and each copy counts when it is durable, wherever it is.
    pub async fn put_replicated(&self, block: VerifiedBlock) -> Result<(), BlockError> {
        let hash = block.hash();
        let peers = self.peer_addrs();
        let needed = (peers.len() + 1) / 2 + 1;
        let (tx, mut rx) = mpsc::channel(peers.len() + 1);
        for (peer, addr) in peers {
            let (tx, this, data) = (tx.clone(), self.clone(), block.data().clone());
            tokio::spawn(async move {
                let result = this.send(&addr, hash, data).await;
                if let Err(e) = &result {
                    tracing::debug!(peer, %hash, error = %e, "block not sent; the peer fetches it when needed");
                }
                let _ = tx.send(result.is_ok()).await;
            });
        }
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.put_local(block).await;
            if let Err(e) = &result {
                tracing::warn!(%hash, error = %e, "block not stored on this node");
            }
            let _ = tx.send(result.is_ok()).await;
        });
        let mut stored = 0;
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
        Ok(match self.from_peers(hash).await? {
            Fetched::Got(data) => Some(data),
            Fetched::NoHolder | Fetched::Failed => None,
        })
    }

    /// Fetches (and keeps) each of `hashes` this node lacks from the peers.
    pub async fn fill(&self, hashes: impl IntoIterator<Item = BlockHash>) -> FillReport {
        let mut report = FillReport::default();
        for hash in hashes {
            if self.store.has(&hash) {
                continue;
            }
            match self.from_peers(hash).await {
                Ok(Fetched::Got(_)) => report.fetched += 1,
                Ok(Fetched::NoHolder) => {
                    tracing::warn!(%hash, "no member holds an indexed block");
                    report.unavailable += 1;
                }
                Ok(Fetched::Failed) => report.failed += 1,
                Err(e) => {
                    tracing::warn!(%hash, error = %e, "could not keep a fetched block");
                    report.failed += 1;
                }
            }
        }
        report
    }

    /// Fills in every block the chunk index of `state` names and this node lacks, walking
    /// the whole index `round` entries at a time.
    pub async fn fill_all(
        &self,
        state: &raftbox_storage::StateMachine,
        round: usize,
    ) -> Result<FillReport, BlockError> {
        let mut report = FillReport::default();
        let mut cursor = None;
        loop {
            let hashes = state.chunk_hashes(cursor.as_ref(), round.max(1))?;
            let last = (hashes.len() >= round.max(1)).then(|| hashes.last().copied()).flatten();
            report.add(self.fill(hashes).await);
            match last {
                Some(last) => cursor = Some(last),
                None => return Ok(report),
            }
        }
    }

    /// Asks every peer in turn for the block, keeping the first verified copy.
    async fn from_peers(&self, hash: BlockHash) -> Result<Fetched, BlockError> {
        let mut failed = false;
        for (peer, addr) in self.peer_addrs() {
            match self.fetch(&addr, hash).await {
                Ok(Some(block)) => {
                    let data = block.data().clone();
                    self.put_local(block).await?;
                    tracing::debug!(peer, %hash, "fetched block from peer");
                    return Ok(Fetched::Got(data));
                }
                Ok(None) => {}
                Err(status) => {
                    failed = true;
                    tracing::debug!(peer, %hash, error = %status, "peer could not serve block");
                }
            }
        }
        Ok(if failed { Fetched::Failed } else { Fetched::NoHolder })
    }

    /// One peer's copy, verified; `None` if it does not hold the block.
    async fn fetch(&self, addr: &str, hash: BlockHash) -> Result<Option<VerifiedBlock>, tonic::Status> {
        let mut client = self
            .peers
            .client_on(crate::network::Lane::Bulk, addr)
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(BlockRequest { hash: hash.0.to_vec() });
        request.set_timeout(Duration::from_millis(BLOCK_TRANSFER_TIMEOUT_MS));
        match client.get_block(request).await {
            Ok(reply) => match VerifiedBlock::verify(hash, reply.into_inner().data) {
                Ok(block) => Ok(Some(block)),
                Err(_) => Err(tonic::Status::data_loss("peer sent bytes that do not match the hash")),
            },
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status),
        }
    }
}
