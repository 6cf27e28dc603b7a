//! Probes and cluster status: `/healthz`, `/readyz`, `/v1/cluster`, `/metrics`.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::cluster::{member_views, MemberView};
use crate::{ApiError, AppState};

/// `GET /healthz`: the process is up (`status` is `ok`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(pattern = "^ok$")]
    pub status: String,
}

/// `GET /readyz`: a member of a cluster with a leader, its clock in step.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    pub ready: bool,
    pub leader_id: u64,
}

/// Process is up.
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Member of a cluster that has a leader taking writes, with a clock that agrees with the
/// cluster's and a disk with room.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Ready>, ApiError> {
    if let Some((admitted, refused)) = state.in_flight.refusing_most() {
        return Err(ApiError::Unavailable(format!(
            "this node refused most requests lately ({refused} refused, {admitted} admitted in the last {} s): \
             it is at its limits",
            crate::front_door::READINESS_WINDOW.as_secs()
        )));
    }
    let status = state.node.status();
    let disk = state.node.disk();
    if disk.full {
        return Err(ApiError::Unavailable(disk.refusal()));
    }
    let clock = state.node.clock();
    match clock.ok {
        Some(true) => {}
        Some(false) => {
            return Err(ApiError::Unavailable(format!(
                "this node's clock is off from the cluster (offsets to peers in ms: {:?})",
                clock.offsets_ms
            )))
        }
        None => return Err(ApiError::Unavailable("this node's clock is not confirmed by the cluster yet".into())),
    }
    match status.leader_id {
        // A leader that refuses writes is stepping down; until the others elect another, its
        // followers take no write either (a reader must not keep this node in a balancer).
        Some(leader) if status.member && clock.leading_refusing_writes.contains(&leader) => {
            Err(ApiError::Unavailable(format!(
                "the leader, node {leader}, refuses writes (its disk is full or its clock is off); \
                 waiting for the cluster to elect another"
            )))
        }
        Some(leader) if status.member => Ok(Json(Ready { ready: true, leader_id: leader })),
        _ => Err(ApiError::Unavailable("not a member of a cluster with a leader".into())),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// The cluster this node belongs to: minted when it was bootstrapped, recovered or
    /// restored (a recovered or restored cluster is a new one); `null` on a fresh node not
    /// yet written to, or in a cluster formed before identities.
    cluster_id: Option<String>,
    node_id: u64,
    leader_id: Option<u64>,
    term: u64,
    role: String,
    /// `false` while this node, having lost its data, awaits being added again.
    votes: bool,
    members: Vec<MemberView>,
    last_applied: u64,
    last_log_index: u64,
    snapshot_index: Option<u64>,
    /// On the leader: how far each member's log matches the leader's; `null` elsewhere
    /// (only the leader knows).
    replication: Option<Vec<ReplicationView>>,
}

/// One member's replication as the leader sees it.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationView {
    node_id: u64,
    /// The last log index known to match the leader's, `null` before the first reply.
    matched_index: Option<u64>,
    /// Entries the leader has that the member is not known to have.
    lag: u64,
}

/// This node's view of the cluster.
pub async fn cluster(State(state): State<AppState>) -> Json<ClusterInfo> {
    let status = state.node.status();
    let last = status.last_log_index;
    Json(ClusterInfo {
        cluster_id: state.node.cluster_id().map(|id| id.to_string()),
        node_id: status.id,
        leader_id: status.leader_id,
        term: status.term,
        role: format!("{:?}", status.role),
        votes: state.node.vote_right().may_vote(),
        members: member_views(status.members),
        last_applied: status.last_applied,
        last_log_index: last,
        snapshot_index: status.snapshot_index,
        replication: status.replication.map(|replication| {
            replication
                .into_iter()
                .map(|(node_id, matched_index)| ReplicationView {
                    node_id,
                    matched_index,
                    lag: last.saturating_sub(matched_index.unwrap_or(0)),
                })
                .collect()
        }),
    })
}

/// Prometheus text exposition of the node's series: HTTP per route, the write path, and
/// the Raft state (see `RaftNode::render_metrics`). They tell how the node is doing (its free
/// disk among them), so only addresses in `[http] metrics_allow` (loopback by default) read
/// them without a token; anyone else needs the admin's.
pub async fn metrics(State(state): State<AppState>, request: Request) -> Result<impl IntoResponse, ApiError> {
    // The client as the front door found it: behind a trusted proxy, the forwarded address,
    // never the proxy's own (a proxy on this host would make everyone loopback).
    let address = request.extensions().get::<crate::front_door::ClientAddress>().map(|a| a.0);
    let in_process = request.extensions().get::<ConnectInfo<SocketAddr>>().is_none();
    let allowed = in_process
        || address.is_some_and(|address| state.config.http.metrics_allow.iter().any(|net| net.contains(&address)));
    let admin = request.extensions().get::<crate::auth::Principal>().is_some_and(|principal| principal.user.admin);
    if !allowed && !admin {
        return Err(ApiError::Forbidden(
            "metrics are read from an address in [http] metrics_allow, or with the admin token".into(),
        ));
    }
    let body = state.node.render_metrics();
    Ok(([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body))
}
