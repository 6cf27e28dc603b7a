//! A cluster's identity (etcd's cluster id): a random id that every node-to-node call
//! carries, so a node never takes entries, votes, snapshots or forwarded work from another
//! cluster.
//!
//! Why: `recover --force-new-cluster` and `restore` make a *new* cluster out of one node's
//! data. The members it replaced keep their old configuration and their old log. Should they
//! come back (a partition the operator took for a loss, a machine restarted on its old
//! disk), their calls would pass every other check (the secret is the same), and the two
//! clusters would merge: openraft truncates a follower's log to its leader's, below what
//! that follower already applied, and writes acknowledged on one side vanish from the other.
//!
//! The rules ([`judge`]):
//! - An id is minted (a random UUID, written durably before anyone is told) by the node that
//!   bootstraps a cluster, and by `recover --force-new-cluster` and `restore`, which also
//!   give the directory a new incarnation ([`renew_offline`]).
//! - Every call a node makes to a peer carries its id ([`CLUSTER_ID_HEADER`], by
//!   [`Stamp`]) once it has one; `Status` answers it, and is the one call never refused.
//! - A node with an id refuses any call that carries another id, or none.
//! - A node without one takes the id of the first call that would write Raft state
//!   (AppendEntries, InstallSnapshot, Initialize) while it holds none, and only if the call
//!   names this data directory's incarnation (checked first): a fresh node being added or
//!   bootstrapped, never one a stray leader merely reached. A node that holds Raft state without an id (a cluster formed
//!   before identities) refuses every call carrying an id and takes those carrying none,
//!   as before: such a cluster has no id until its next recovery.
//! - `cluster add` refuses a node with another id, or one holding data under another id
//!   (`membership::add`).

use std::sync::{Arc, Mutex, RwLock};

use raftbox_storage::{keys, Db, StorageError};
use tonic::{Request, Status};

use crate::secret::ClusterSecret;

/// The metadata naming the sender's cluster on every node-to-node call.
pub const CLUSTER_ID_HEADER: &str = "x-raftbox-cluster-id";

/// What a node does with a call, by the ids at both ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Take,
    /// Take it, and the id with it (a fresh node's first write).
    Adopt(String),
    Refuse(String),
}

/// The verdict on a call naming `presented` for a node of cluster `mine`. `holds_state`:
/// the node holds Raft state (a vote, a log or a snapshot); `writes`: the call would write
/// Raft state (append, snapshot, initialize).
pub(crate) fn judge(mine: Option<&str>, presented: Option<&str>, holds_state: bool, writes: bool) -> Verdict {
    match (mine, presented) {
        (Some(mine), Some(presented)) if mine == presented => Verdict::Take,
        (Some(mine), Some(presented)) => Verdict::Refuse(format!(
            "this node belongs to cluster {mine}, the caller to cluster {presented} (a member of a cluster \
             that was recovered or restored since, or of another cluster): never joined"
        )),
        (Some(mine), None) => Verdict::Refuse(format!(
            "this node belongs to cluster {mine}; the caller names no cluster (a member from before a \
             recovery or restore, or a node of an older version): never joined"
        )),
        (None, None) => Verdict::Take,
        (None, Some(presented)) if !holds_state && writes => Verdict::Adopt(presented.to_owned()),
        // A fresh node holds nothing to protect (and does not vote): it may serve a block.
        (None, Some(_)) if !holds_state => Verdict::Take,
        (None, Some(presented)) => Verdict::Refuse(format!(
            "this node holds the data of a cluster without an identity (formed before identities), the \
             caller belongs to cluster {presented}: never joined"
        )),
    }
}

/// This node's cluster id, shared by its peers' clients (which send it) and its gRPC
/// service (which checks it).
#[derive(Clone, Default, Debug)]
pub struct ClusterId {
    current: Arc<RwLock<Option<Arc<str>>>>,
    /// Held while an id is taken, so two first calls cannot take two.
    taking: Arc<Mutex<()>>,
}

impl ClusterId {
    /// The id stored in `db`, if any.
    pub(crate) fn load(db: &Db) -> Result<ClusterId, StorageError> {
        let stored: Option<Arc<str>> =
            db.meta_get(keys::meta::CLUSTER_ID)?.map(|raw| Arc::from(String::from_utf8_lossy(&raw).as_ref()));
        Ok(ClusterId { current: Arc::new(RwLock::new(stored)), taking: Arc::default() })
    }

    /// The id, once the node has one.
    pub fn get(&self) -> Option<Arc<str>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The node's id, minted (durably, before anyone is told) if it has none: the
    /// bootstrapping node's first step.
    pub(crate) fn mint(&self, db: &Db) -> Result<Arc<str>, StorageError> {
        let _taking = self.taking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = self.get() {
            return Ok(id);
        }
        let id = new_id();
        self.store(db, &id)
    }

    fn store(&self, db: &Db, id: &str) -> Result<Arc<str>, StorageError> {
        db.meta_put(keys::meta::CLUSTER_ID, id.as_bytes(), true)?;
        let id: Arc<str> = Arc::from(id);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(id.clone());
        tracing::info!(cluster_id = %id, "this node belongs to cluster {id}");
        Ok(id)
    }

    /// Whether this node takes `request` (see [`judge`]); `writes`: it would write Raft
    /// state, so a fresh node takes the caller's id with it (durably, first).
    pub(crate) fn check<T>(&self, db: &Db, request: &Request<T>, writes: bool) -> Result<(), Status> {
        let presented = match request.metadata().get(CLUSTER_ID_HEADER) {
            None => None,
            Some(value) => {
                Some(value.to_str().map_err(|_| Status::invalid_argument("the cluster id is not visible ASCII"))?)
            }
        };
        let mine = self.get();
        // The common case first, without touching the database.
        if mine.is_some() || presented.is_none() {
            return verdict(judge(mine.as_deref(), presented, true, writes));
        }
        let _taking = self.taking.lock().unwrap_or_else(|e| e.into_inner());
        let mine = self.get();
        let holds = holds_state(db).map_err(|e| Status::internal(format!("reading the Raft state: {e}")))?;
        match judge(mine.as_deref(), presented, holds, writes) {
            Verdict::Adopt(id) => {
                self.store(db, &id).map_err(|e| Status::unavailable(format!("storing the cluster id: {e}")))?;
                Ok(())
            }
            other => verdict(other),
        }
    }
}

fn verdict(verdict: Verdict) -> Result<(), Status> {
    match verdict {
        Verdict::Take | Verdict::Adopt(_) => Ok(()),
        Verdict::Refuse(why) => Err(Status::failed_precondition(why)),
    }
}

fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Whether `db` holds Raft state: a vote, a log entry or a snapshot.
pub(crate) fn holds_state(db: &Db) -> Result<bool, StorageError> {
    Ok(db.meta_get(keys::meta::VOTE)?.is_some()
        || db.log_last()?.is_some()
        || db.meta_get(keys::meta::SNAPSHOT)?.is_some())
}

/// A stopped node's directory, made the first of a new cluster (`recover`, `restore`): a
/// new cluster id and a new incarnation, both durable. Returns the cluster id.
pub(crate) fn renew_offline(db: &Db) -> Result<String, StorageError> {
    let incarnation = new_id();
    db.meta_put(keys::meta::INCARNATION, incarnation.as_bytes(), true)?;
    // The new incarnation is recorded by name in the new configuration: no longer legacy.
    db.meta_delete(keys::meta::INCARNATION_LEGACY)?;
    let id = new_id();
    db.meta_put(keys::meta::CLUSTER_ID, id.as_bytes(), true)?;
    Ok(id)
}

/// What every call to a peer carries: the cluster secret, and this node's cluster id once it
/// has one.
#[derive(Clone, Debug)]
pub struct Stamp {
    secret: ClusterSecret,
    cluster: ClusterId,
}

impl Stamp {
    pub(crate) fn new(secret: ClusterSecret, cluster: ClusterId) -> Stamp {
        Stamp { secret, cluster }
    }
}

impl tonic::service::Interceptor for Stamp {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let mut request = self.secret.call(request)?;
        if let Some(id) = self.cluster.get() {
            let value = tonic::metadata::MetadataValue::try_from(&*id)
                .map_err(|_| Status::internal("this node's cluster id is not visible ASCII"))?;
            request.metadata_mut().insert(CLUSTER_ID_HEADER, value);
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_takes_calls_of_its_own_cluster_only() {
        let (a, b) = ("aaaa", "bbbb");
        // A node with an id: its own cluster only, never a call naming none.
        assert_eq!(judge(Some(a), Some(a), true, true), Verdict::Take);
        assert!(matches!(judge(Some(a), Some(b), true, true), Verdict::Refuse(_)));
        assert!(matches!(judge(Some(a), Some(b), false, false), Verdict::Refuse(_)));
        assert!(matches!(judge(Some(a), None, true, false), Verdict::Refuse(_)));
        assert!(matches!(judge(Some(a), None, false, true), Verdict::Refuse(_)));
        // A fresh node takes the id of its first write, and serves anything before it.
        assert_eq!(judge(None, Some(a), false, true), Verdict::Adopt(a.into()));
        assert_eq!(judge(None, Some(a), false, false), Verdict::Take);
        // A node of a cluster from before identities: as before, and no one else.
        assert_eq!(judge(None, None, true, true), Verdict::Take);
        assert!(matches!(judge(None, Some(a), true, true), Verdict::Refuse(_)));
        assert!(matches!(judge(None, Some(a), true, false), Verdict::Refuse(_)));
    }

    #[test]
    fn an_id_is_taken_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("open");
        let cluster = ClusterId::load(&db).expect("load");
        assert!(cluster.get().is_none());
        let mut first = Request::new(());
        first.metadata_mut().insert(CLUSTER_ID_HEADER, "aaaa".parse().expect("ascii"));
        cluster.check(&db, &first, true).expect("a fresh node takes the first writer's id");
        assert_eq!(cluster.get().as_deref(), Some("aaaa"));
        let mut other = Request::new(());
        other.metadata_mut().insert(CLUSTER_ID_HEADER, "bbbb".parse().expect("ascii"));
        assert_eq!(cluster.check(&db, &other, true).unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(cluster.check(&db, &Request::new(()), true).unwrap_err().code(), tonic::Code::FailedPrecondition);
        drop(cluster);
        let reloaded = ClusterId::load(&db).expect("load");
        assert_eq!(reloaded.get().as_deref(), Some("aaaa"), "durable");
        assert_eq!(reloaded.mint(&db).expect("mint").as_ref(), "aaaa", "minting keeps an id it has");
    }

    #[test]
    fn renewing_a_directory_gives_a_new_cluster_and_incarnation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("open");
        db.meta_put(keys::meta::INCARNATION, b"old", true).expect("put");
        db.meta_put(keys::meta::INCARNATION_LEGACY, b"1", true).expect("put");
        db.meta_put(keys::meta::CLUSTER_ID, b"old-cluster", true).expect("put");
        let id = renew_offline(&db).expect("renew");
        assert_ne!(id, "old-cluster");
        assert_eq!(ClusterId::load(&db).expect("load").get().as_deref(), Some(id.as_str()));
        assert_ne!(db.meta_get(keys::meta::INCARNATION).expect("get").as_deref(), Some(&b"old"[..]));
        assert!(db.meta_get(keys::meta::INCARNATION_LEGACY).expect("get").is_none());
    }
}
