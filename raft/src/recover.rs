//! Offline surgery on a stopped node's data directory: a new one-member cluster from a
//! surviving node after the others were lost (etcd's `--force-new-cluster`, rqlite's
//! `peers.json`), and a new cluster seeded from a backup (etcdctl `snapshot restore`).
//!
//! Both end the same way: the log gets one more entry, a configuration naming this node
//! alone as the voter (with this data directory's incarnation, so it may vote), in a term
//! above every term the directory has seen, and the node's vote moves to that term. When the
//! node starts it is its own majority: it elects itself, and its first commit commits that
//! configuration and every entry before it. Nodes added back later (`raftbox cluster add`)
//! join this configuration, with fresh data directories. The result is a new cluster, with
//! a new cluster id and a new incarnation ([`crate::cluster_id`]): the members it replaced
//! can never join it, nor it them.
//!
//! What it costs, and why it is an operator's decision: whatever only the lost nodes held is
//! gone (acknowledged writes included, if this node had not received them), and entries this
//! node held but never saw committed are committed now. Should the "lost" nodes come back
//! on their old data (a partition taken for a loss), two of them are still a majority of
//! their old configuration and go on as the old cluster: the cluster ids keep the two apart
//! (each refuses the other's calls, and `cluster add` refuses their directories), but
//! clients of the old one see none of the new one's writes. Opening the database fails while
//! the node runs (RocksDB's lock).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use openraft::{CommittedLeaderId, EntryPayload, Membership};
use raftbox_storage::{keys, Db, StateMachine};

use crate::log_store::{purge_upto, stored_vote};
use crate::membership::load_identity;
use crate::state_machine::{load_marker, AppliedMarker, StateMachineStore};
use crate::types::{Entry, LogId, NodeId, NodeInfo, SnapshotMeta, Vote};

/// Why a recovery could not be done; nothing was changed unless said.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("storage: {0}")]
    Storage(#[from] raftbox_storage::StorageError),
    #[error("{0}")]
    Refused(String),
}

fn refused(why: impl Into<String>) -> RecoverError {
    RecoverError::Refused(why.into())
}

/// What a recovery left in the data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The entry that makes this node the only voter.
    pub membership_index: u64,
    pub term: u64,
    /// The last entry of the log before it (for a restore: the backup's index).
    pub previous_index: u64,
    /// The incarnation of the data directory, new, now the configuration's.
    pub incarnation: String,
    /// The new cluster's id ([`crate::cluster_id`]).
    pub cluster_id: String,
}

/// Makes the stopped node at `data_dir` (its `db` directory) the only voter of a new
/// configuration, keeping its data: the way back from losing a majority.
pub fn force_new_cluster(
    data_dir: &Path,
    id: NodeId,
    http_addr: &str,
    grpc_addr: &str,
) -> Result<Recovered, RecoverError> {
    let db = open(data_dir)?;
    let last = last_log_id(&db)?;
    // A crash inside a snapshot install can leave the state applied past the log's end (the
    // install purges the log after its synced switch): the new entry goes after what is
    // applied, and the log is purged that far first, as openraft does at start-up.
    let applied = load_marker(&StateMachine::new(db.clone())).map_err(|e| refused(e.to_string()))?.last_applied;
    let base = match (last, applied) {
        (Some(last), Some(applied)) if applied.index > last.index => {
            purge_upto(&db, applied)?;
            applied
        }
        (Some(last), _) => last,
        (None, Some(applied)) => applied,
        (None, None) => {
            return Err(refused(format!("{} holds no Raft log: there is nothing to recover from", data_dir.display())))
        }
    };
    sole_voter(&db, base, id, NodeInfo::new(http_addr, grpc_addr))
}

/// What [`restore_backup`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub recovered: Recovered,
    /// The log index (and its term) the backup reflects.
    pub backup_index: u64,
    pub backup_term: u64,
}

/// Seeds the empty data directory `data_dir` from the backup image at `image` (a snapshot
/// image, as `raftbox backup` writes it): the state becomes the backup's, the image the
/// node's current snapshot (so nodes added later receive it), and the node the only voter of
/// a new configuration.
pub fn restore_backup(
    image: &Path,
    data_dir: &Path,
    id: NodeId,
    http_addr: &str,
    grpc_addr: &str,
) -> Result<Restored, RecoverError> {
    let file = std::fs::File::open(image).map_err(raftbox_storage::StorageError::from)?;
    let summary = raftbox_storage::snapshot::read_image(&file, |_| Ok(()))?;
    let marker: AppliedMarker = match &summary.marker {
        Some(bytes) => serde_json::from_slice(bytes)
            .map_err(|e| refused(format!("{}: its applied marker does not decode: {e}", image.display())))?,
        None => return Err(refused(format!("{} holds no applied marker: not a backup", image.display()))),
    };
    let last = marker.last_applied.ok_or_else(|| refused(format!("{} reflects no entry", image.display())))?;
    let db = open(data_dir)?;
    // A database without Raft state (a restore that stopped before its install) is empty.
    let held = db.meta_get(keys::meta::VOTE)?.is_some()
        || db.log_last()?.is_some()
        || db.meta_get(keys::meta::SNAPSHOT)?.is_some();
    if held {
        return Err(refused(format!(
            "{} already holds Raft state: restore seeds an empty data directory only (if an earlier \
             restore into it stopped after installing the backup, `raftbox recover \
             --force-new-cluster` finishes it)",
            data_dir.join("db").display()
        )));
    }
    load_identity(&db)?;
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: marker.membership,
        snapshot_id: format!("restored-{}-{}-{}", last.leader_id.term, last.leader_id.node_id, last.index),
    };
    let store = StateMachineStore::new(StateMachine::new(db.clone())).map_err(|e| refused(e.to_string()))?;
    // As a follower installs a snapshot: the image copied in, the state restored from it and
    // made current with its record in one synced write, the (empty) log purged up to it.
    store.install_blocking(&meta, file, image.to_path_buf()).map_err(|e| refused(e.to_string()))?;
    drop(store);
    let recovered = sole_voter(&db, last, id, NodeInfo::new(http_addr, grpc_addr))?;
    Ok(Restored { recovered, backup_index: last.index, backup_term: last.leader_id.term })
}

fn open(data_dir: &Path) -> Result<Db, RecoverError> {
    Db::open(&data_dir.join("db")).map_err(|e| {
        refused(format!(
            "cannot open {}: {e} (is the node still running? stop it first)",
            data_dir.join("db").display()
        ))
    })
}

/// The id of the log's last entry, or of the last one purged when the log is empty.
fn last_log_id(db: &Db) -> Result<Option<LogId>, RecoverError> {
    if let Some((_, bytes)) = db.log_last()? {
        let entry: Entry = serde_json::from_slice(&bytes)
            .map_err(|e| refused(format!("the log's last entry does not decode: {e}")))?;
        return Ok(Some(entry.log_id));
    }
    let purged = db.meta_get(keys::meta::PURGED)?;
    Ok(purged.and_then(|raw| serde_json::from_slice(&raw).ok()))
}

/// Appends, after `last`, a configuration naming node `id` alone, with this directory's
/// incarnation, in a term above every term the directory saw, and moves the vote there.
///
/// The directory first becomes the first of a new cluster: a new cluster id and a new
/// incarnation ([`crate::cluster_id::renew_offline`]). The members it replaces, should they
/// come back, are refused by every node of the new cluster, and refuse it. A crash between
/// the two steps leaves a directory whose new identity matches no configuration: it takes
/// nothing from anyone (closed), and running the recovery again completes it.
fn sole_voter(db: &Db, last: LogId, id: NodeId, mut info: NodeInfo) -> Result<Recovered, RecoverError> {
    let cluster_id = crate::cluster_id::renew_offline(db)?;
    let identity = load_identity(db)?;
    info.incarnation = Some(identity.incarnation.clone());
    let seen = stored_vote(db).map_or(0, |vote| vote.leader_id().term).max(last.leader_id.term);
    let term = seen.checked_add(1).ok_or_else(|| refused("the term is at its maximum"))?;
    let index = last.index.checked_add(1).ok_or_else(|| refused("the log index is at its maximum"))?;
    let membership = Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, info)]));
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, id), index),
        payload: EntryPayload::Membership(membership),
    };
    let bytes = serde_json::to_vec(&entry).map_err(|e| refused(e.to_string()))?;
    // The entry first, then the vote: a crash between the two leaves an entry of a term the
    // vote has not reached, which the next run supersedes (it counts the entry's term).
    db.log_append([(index, bytes)])?;
    let vote = serde_json::to_vec(&Vote::new(term, id)).map_err(|e| refused(e.to_string()))?;
    db.meta_put(keys::meta::VOTE, &vote, true)?;
    debug_assert_eq!(last_log_id(db).ok().flatten().map(|l| l.index), Some(index));
    tracing::warn!(node = id, term, index, "this node is now the only voter of a new configuration");
    tracing::warn!(cluster_id = %cluster_id, "the new cluster is {cluster_id}; the old members can never rejoin it");
    Ok(Recovered {
        membership_index: index,
        term,
        previous_index: last.index,
        incarnation: identity.incarnation,
        cluster_id,
    })
}
