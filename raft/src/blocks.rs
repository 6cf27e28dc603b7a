//! Block transfer between nodes: majority-durable replication of a new block, background
//! fill of the remaining peers, and fetching a block this node lacks from a peer.
//!
//! Blocks travel outside the Raft log; only their chunk-index entry is a Raft command.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use raftbox_storage::blocks::{BlockHash, BlockStore, VerifiedBlock};
use raftbox_storage::ConfigId;
use tokio::sync::mpsc;

use crate::network::Peers;
use crate::pb::{BlockData, BlockRequest};
use crate::types::{NodeId, Raft};

/// Deadline of one block transfer to or from a peer.
pub const BLOCK_TRANSFER_TIMEOUT_MS: u64 = 30_000;
/// Blocks a fill checks for (and fetches) at once: presence checks are a file system lookup
/// each, a disk seek on a cold cache, so they overlap.
pub const FILL_IN_FLIGHT: usize = 16;

/// Why a block could not be made durable or found.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("block store: {0}")]
    Store(#[from] raftbox_storage::StorageError),
    #[error("only {stored} of the {needed} copies a majority needs could be stored")]
    NoMajority { stored: usize, needed: usize },
    /// This node does not know the cluster's configuration yet (just started): it cannot
    /// tell where a majority is, so it stores nothing it would have to call durable.
    #[error("this node does not know the cluster's members yet; try again")]
    MembershipUnknown,
    #[error("block store task failed: {0}")]
    Task(String),
    /// This node lacks the block and a peer that may hold it did not answer: it may exist.
    #[error("block {0} is not on this node and a member that may hold it could not be reached; try again")]
    Unreachable(BlockHash),
}

/// Where a new block must be durable: the voter sets of the configuration (two while a
/// change is joint), and every other member to send it to.
#[derive(Debug, Clone)]
struct Placement {
    /// The configuration entry these come from: its `RegisterChunk` is refused in any other.
    config: ConfigId,
    configs: Vec<BTreeSet<NodeId>>,
    peers: Vec<(NodeId, String)>,
}

impl Placement {
    fn of(metrics: &crate::types::RaftMetrics, this: NodeId) -> Result<Placement, BlockError> {
        let membership = metrics.membership_config.membership();
        let configs: Vec<BTreeSet<NodeId>> = membership.get_joint_config().to_vec();
        // Before openraft publishes the stored configuration, the metrics hold an empty one.
        let Some(log_id) = metrics.membership_config.log_id() else {
            return Err(BlockError::MembershipUnknown);
        };
        if configs.iter().all(BTreeSet::is_empty) {
            return Err(BlockError::MembershipUnknown);
        }
        let config = ConfigId { term: log_id.leader_id.term, index: log_id.index };
        let peers =
            membership.nodes().filter(|(id, _)| **id != this).map(|(id, info)| (*id, info.grpc_addr.clone())).collect();
        Ok(Placement { config, configs, peers })
    }

    /// Whether `holders` hold a majority of every voter set.
    fn durable(&self, holders: &BTreeSet<NodeId>) -> bool {
        self.configs.iter().all(|voters| voters.intersection(holders).count() > voters.len() / 2)
    }

    /// Copies a majority of the largest voter set needs (for the error message).
    fn needed(&self) -> usize {
        self.configs.iter().map(|voters| voters.len() / 2 + 1).max().unwrap_or(1)
    }
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
    pub(crate) fn add(&mut self, other: FillReport) {
        self.fetched += other.fetched;
        self.unavailable += other.unavailable;
        self.failed += other.failed;
    }
}

/// Where a budgeted fill stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillEnd {
    /// The end of the chunk index: every entry was handled.
    Done,
    /// The budget ran out; every entry up to this position (none: from the start) was handled.
    At(Option<BlockHash>),
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

    /// Makes a block durable on a majority of the voters (of each configuration, while a
    /// change is joint) and returns then; learners and the rest keep receiving it in the
    /// background. This node's write and fsync run at the same time as the transfers to the
    /// peers, and each voter's copy counts when it is durable, wherever it is. A node that
    /// does not know the configuration yet (openraft publishes it a moment after start)
    /// refuses: with no members in view, its own copy would have passed for a majority.
    ///
    /// Returns the configuration the block was placed in, for its `RegisterChunk`
    /// (`placed_in`): registered in any other, it could sit on fewer than a majority of the
    /// voters that count.
    pub async fn put_replicated(&self, block: VerifiedBlock) -> Result<ConfigId, BlockError> {
        let hash = block.hash();
        let placement = Placement::of(&self.raft.metrics().borrow(), self.node_id)?;
        let (tx, mut rx) = mpsc::channel(placement.peers.len() + 1);
        for (peer, addr) in placement.peers.clone() {
            let (tx, this, data) = (tx.clone(), self.clone(), block.data().clone());
            tokio::spawn(async move {
                let result = this.send(&addr, hash, data).await;
                if let Err(e) = &result {
                    tracing::debug!(peer, %hash, error = %e, "block not sent; the peer fetches it when needed");
                }
                let _ = tx.send((peer, result.is_ok())).await;
            });
        }
        let (this, own) = (self.clone(), self.node_id);
        tokio::spawn(async move {
            let result = this.put_local(block).await;
            if let Err(e) = &result {
                tracing::warn!(%hash, error = %e, "block not stored on this node");
            }
            let _ = tx.send((own, result.is_ok())).await;
        });
        let mut holders = BTreeSet::new();
        while let Some((node, ok)) = rx.recv().await {
            if ok {
                holders.insert(node);
            }
            if placement.durable(&holders) {
                return Ok(placement.config);
            }
        }
        Err(BlockError::NoMajority { stored: holders.len(), needed: placement.needed() })
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

    /// The block's bytes: from this node, else fetched (and kept) from a peer that holds it;
    /// `None` only when every peer answered that it does not hold it, and
    /// [`BlockError::Unreachable`] when one that might did not answer.
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
            Fetched::NoHolder => None,
            Fetched::Failed => return Err(BlockError::Unreachable(hash)),
        })
    }

    /// Fetches (and keeps) each of `hashes` this node lacks from the peers, up to
    /// [`FILL_IN_FLIGHT`] at once.
    pub async fn fill(&self, hashes: impl IntoIterator<Item = BlockHash>) -> FillReport {
        use futures::StreamExt as _;
        let mut report = FillReport::default();
        let mut each = futures::stream::iter(hashes).map(|hash| self.fill_one(hash)).buffer_unordered(FILL_IN_FLIGHT);
        while let Some(one) = each.next().await {
            report.add(one);
        }
        report
    }

    /// Fetches (and keeps) one block if this node lacks it.
    async fn fill_one(&self, hash: BlockHash) -> FillReport {
        let store = self.store.clone();
        let mut report = FillReport::default();
        if tokio::task::spawn_blocking(move || store.has(&hash)).await.unwrap_or(false) {
            return report;
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
        report
    }

    /// Fills in the blocks the chunk index of `state` names after `after` (from the start
    /// when `None`) and this node lacks, `round` entries at a time, until the index ends or
    /// `until` passes. Returns what it did and where it stopped: [`FillEnd::Done`] only when
    /// the end of the index was reached; otherwise the position to go on from, every entry up
    /// to it handled (`after` itself when the budget ran out before any was).
    pub async fn fill_from(
        &self,
        state: &raftbox_storage::StateMachine,
        after: Option<BlockHash>,
        round: usize,
        until: Option<tokio::time::Instant>,
    ) -> Result<(FillReport, FillEnd), BlockError> {
        use futures::StreamExt as _;
        let mut report = FillReport::default();
        let mut cursor = after;
        if until.is_some_and(|until| tokio::time::Instant::now() >= until) {
            return Ok((report, FillEnd::At(cursor)));
        }
        loop {
            let hashes = state.chunk_hashes(cursor.as_ref(), round.max(1))?;
            let whole_round = hashes.len() >= round.max(1);
            // In index order (`buffered`, not `buffer_unordered`), so the position handed
            // back has every entry before it handled, even when the budget ends mid-round.
            let mut each = futures::stream::iter(hashes)
                .map(|hash| async move { (hash, self.fill_one(hash).await) })
                .buffered(FILL_IN_FLIGHT);
            loop {
                // The budget ends the wait for the next block too (those in flight are
                // dropped, and the position stays at the last one handled).
                let next = match until {
                    Some(until) => match tokio::time::timeout_at(until, each.next()).await {
                        Ok(next) => next,
                        Err(_) => return Ok((report, FillEnd::At(cursor))),
                    },
                    None => each.next().await,
                };
                let Some((hash, one)) = next else { break };
                report.add(one);
                cursor = Some(hash);
            }
            if !whole_round {
                return Ok((report, FillEnd::Done));
            }
        }
    }

    /// Asks every peer in turn for the block, keeping the first verified copy.
    async fn from_peers(&self, hash: BlockHash) -> Result<Fetched, BlockError> {
        // With no peer in view (the configuration not known yet), nobody was asked: worth
        // another try, never "no member holds it".
        let peers = self.peer_addrs();
        let mut failed = peers.is_empty();
        for (peer, addr) in peers {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(configs: &[&[NodeId]]) -> Placement {
        Placement {
            config: ConfigId { term: 1, index: 1 },
            configs: configs.iter().map(|c| c.iter().copied().collect()).collect(),
            peers: Vec::new(),
        }
    }

    fn held(nodes: &[NodeId]) -> BTreeSet<NodeId> {
        nodes.iter().copied().collect()
    }

    #[test]
    fn a_block_is_durable_on_a_majority_of_each_voter_set_only() {
        let three = placement(&[&[1, 2, 3]]);
        assert!(!three.durable(&held(&[1])));
        assert!(three.durable(&held(&[1, 3])));
        // A learner's copy (node 4) does not count.
        assert!(!three.durable(&held(&[1, 4])));
        // Joint {1,2,3,4,5} -> {1,2,3}: three copies on 1, 4 and 5 are a majority of the
        // old set only.
        let joint = placement(&[&[1, 2, 3, 4, 5], &[1, 2, 3]]);
        assert!(!joint.durable(&held(&[1, 4, 5])));
        assert!(joint.durable(&held(&[1, 2, 4])));
        assert_eq!(joint.needed(), 3);
    }

    #[test]
    fn a_node_that_does_not_know_the_configuration_yet_stores_nothing_as_durable() {
        // What openraft's metrics hold before the core publishes the stored configuration.
        let initial = crate::types::RaftMetrics::new_initial(1);
        assert!(matches!(Placement::of(&initial, 1), Err(BlockError::MembershipUnknown)));
    }
}
