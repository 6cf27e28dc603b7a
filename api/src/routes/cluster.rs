//! Cluster membership (admin): `GET /v1/admin/cluster/members`,
//! `POST /v1/admin/cluster/members {"id","httpAddr","grpcAddr"}`,
//! `DELETE /v1/admin/cluster/members/{id}`.
//!
//! Any node answers; a change is carried out by the leader (see `raftbox_raft::membership`).
//! A POST answers 200 once the node is a voter, or 202 while it is still a learner catching
//! up — the same POST again finishes the job. Adding a voter again changes nothing.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use raftbox_raft::{Member, MembershipAnswer, MembershipChange, NodeInfo};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::{json, ApiError, AppState};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct AddRequest {
    id: u64,
    http_addr: String,
    grpc_addr: String,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    id: u64,
    http_addr: String,
    grpc_addr: String,
    /// `voter` or `learner`.
    #[schema(value_type = String, pattern = "^(voter|learner)$")]
    role: &'static str,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersView {
    members: Vec<MemberView>,
    /// `false` while an added node is still a learner catching up.
    complete: bool,
}

/// The members as the API shows them (here and in `/v1/cluster`).
pub(super) fn member_views(members: Vec<Member>) -> Vec<MemberView> {
    members
        .into_iter()
        .map(|m| MemberView {
            id: m.id,
            http_addr: m.info.http_addr,
            grpc_addr: m.info.grpc_addr,
            role: if m.voter { "voter" } else { "learner" },
        })
        .collect()
}

fn view(members: Vec<Member>, complete: bool) -> MembersView {
    MembersView { members: member_views(members), complete }
}

/// A node id: positive (0 means "no node" between nodes).
fn node_id(id: u64) -> Result<u64, ApiError> {
    if id == 0 {
        return Err(ApiError::BadRequest("a node id is a positive integer".into()));
    }
    Ok(id)
}

/// A `host:port` socket address.
fn address(field: &str, value: &str) -> Result<String, ApiError> {
    value
        .parse::<SocketAddr>()
        .map(|addr| addr.to_string())
        .map_err(|_| ApiError::BadRequest(format!("{field} must be an IP address and port, e.g. 127.0.0.1:7084")))
}

/// The members after a read barrier (so a stale node does not show an old configuration).
pub async fn list(State(state): State<AppState>, principal: Principal) -> Result<Json<MembersView>, ApiError> {
    principal.require_admin()?;
    crate::access::barrier(&state, &principal).await?;
    Ok(Json(view(state.node.members(), true)))
}

pub async fn add(
    State(state): State<AppState>,
    principal: Principal,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: AddRequest = json::parse(&body)?;
    let id = node_id(request.id)?;
    let info = NodeInfo::new(address("httpAddr", &request.http_addr)?, address("grpcAddr", &request.grpc_addr)?);
    let MembershipAnswer { members, complete } =
        state.node.change_membership(MembershipChange::Add { id, info }).await?;
    let status = if complete { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(view(members, complete))).into_response())
}

pub async fn remove(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let id = id.parse::<u64>().map_err(|_| ApiError::BadRequest(format!("{id:?} is not a node id")))?;
    let id = node_id(id)?;
    let MembershipAnswer { members, complete } = state.node.change_membership(MembershipChange::Remove { id }).await?;
    // 202: the remaining voters are still filling in blocks; a repeat goes on from there.
    let status = if complete { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(view(members, complete))).into_response())
}
