//! Sharing: shared folders, their ACLs, and groups.
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST /v1/namespaces` | any user | create a shared folder (the caller is its owner); keyed |
//! | `GET /v1/namespaces` | any user | the namespaces the caller can access, with their role |
//! | `GET /v1/namespaces/{id}` | readers | one namespace with the caller's role |
//! | `GET /v1/namespaces/{id}/acl` | readers | the folder's ACL |
//! | `PUT /v1/namespaces/{id}/acl` | owners | invite, or change a role: `{userId\|userName\|groupId\|groupName, role}`; keyed |
//! | `GET /v1/me/invitations` | any user | the caller's pending invitations |
//! | `POST /v1/namespaces/{id}/accept`, `…/decline` | the invited user (a group's: an admin, body `{groupId\|groupName}`) | answer an invitation; keyed |
//! | `DELETE /v1/namespaces/{id}/acl/users/{userId}` | owners | revoke a user's entry |
//! | `DELETE /v1/namespaces/{id}/acl/groups/{groupId}` | owners | revoke a group's entry |
//! | `POST /v1/namespaces/{id}/leave` | members | remove one's own entry; keyed |
//! | `DELETE /v1/namespaces/{id}` | owners | delete the folder and everything in it |
//! | `POST /v1/admin/groups` | admin | create a group; keyed |
//! | `GET /v1/admin/groups`, `GET /v1/admin/groups/{id}` | admin | groups, a group's members |
//! | `PUT/DELETE /v1/admin/groups/{id}/members/{userId}` | admin | add / remove a member |
//!
//! Every change is one command carrying the caller as its actor: apply judges it with
//! `sharing::role` in log order (404 for a folder the caller cannot read, 403 for a
//! non-owner, 409 when the last owner would leave or be demoted). A new entry naming someone
//! else is an invitation (`"pending": true` in the ACL) that grants nothing until its
//! grantee accepts it: nobody can put a folder into another user's namespaces, sync and
//! notifications, and a grantee holds at most `INVITATIONS_PENDING_MAX` (409 beyond).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use raftbox_storage::records::{Grantee, NamespaceKind, Role};
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::accounts::NameRequest;
use super::{new_id, page_limit, read_state, PageQuery, PAGE_DEFAULT, PAGE_MAX};
use crate::access;
use crate::auth::Principal;
use crate::idempotency::{Keyed, Success};
use crate::{json, ApiError, AppState};

/// What a namespace is, on the wire: `user` (personal) or `shared_folder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = NamespaceKind)]
pub enum Kind {
    User,
    SharedFolder,
}

impl From<NamespaceKind> for Kind {
    fn from(kind: NamespaceKind) -> Kind {
        match kind {
            NamespaceKind::Personal => Kind::User,
            NamespaceKind::SharedFolder => Kind::SharedFolder,
        }
    }
}

/// A namespace the caller can reach, with the caller's role in it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceView {
    pub namespace_id: String,
    pub kind: Kind,
    pub name: String,
    pub role: Role,
}

super::page! {
    /// A page of the caller's namespaces, personal first.
    NamespaceList { namespaces: NamespaceView }
}

/// An access entry: a user's (`userId`, `userName`) or a group's (`groupId`, `groupName`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum AclEntry {
    #[serde(rename_all = "camelCase")]
    User {
        user_id: String,
        user_name: String,
        role: Role,
        /// An invitation not yet accepted (it grants nothing); absent when accepted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        #[schema(required = false)]
        pending: bool,
    },
    #[serde(rename_all = "camelCase")]
    Group {
        group_id: String,
        group_name: String,
        role: Role,
        /// An invitation not yet accepted (it grants nothing); absent when accepted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        #[schema(required = false)]
        pending: bool,
    },
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AclView {
    pub namespace_id: String,
    pub kind: Kind,
    pub name: String,
    pub entries: Vec<AclEntry>,
    /// Present when more may follow: the `pageToken` of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub next_page_token: Option<String>,
}

/// A shared folder the caller is invited to, and the role accepting gives.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InvitationView {
    pub namespace_id: String,
    pub name: String,
    pub role: Role,
}

super::page! {
    /// A page of the caller's pending invitations.
    InvitationList { invitations: InvitationView }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupView {
    pub group_id: String,
    pub name: String,
}

super::page! {
    /// A page of the groups.
    GroupList { groups: GroupView }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupMember {
    pub user_id: String,
    pub name: String,
}

/// A group and a page of its members.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupDetail {
    pub group_id: String,
    pub name: String,
    pub members: Vec<GroupMember>,
    /// Present when more members may follow: the `pageToken` of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub next_page_token: Option<String>,
}

/// 409 for the caller's own personal namespace, which is never shared, left or deleted
/// (apply refuses it too; a namespace's kind never changes, so this is decided here and the
/// status is the API's). Anyone else's is left to apply, whose answer is 404.
fn refuse_personal(state: &AppState, principal: &Principal, namespace_id: &str, done: &str) -> Result<(), ApiError> {
    match state.node.state().namespace(namespace_id)? {
        Some(namespace)
            if namespace.kind == NamespaceKind::Personal && namespace.owner_user_id == principal.user.id =>
        {
            Err(ApiError::Conflict(format!("a personal namespace cannot be {done}")))
        }
        _ => Ok(()),
    }
}

/// An answer with no body for a command that succeeded; its rejection as a problem.
fn no_content(outcome: Outcome) -> Result<Response, ApiError> {
    match outcome {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// `POST /v1/namespaces` (keyed): a new shared folder owned by the caller.
pub async fn create(State(state): State<AppState>, principal: Principal, keyed: Keyed) -> Result<Response, ApiError> {
    let request: NameRequest = json::parse(&keyed.body)?;
    let name = json::name("name", &request.name)?;
    let namespace_id = new_id();
    let body = NamespaceView {
        namespace_id: namespace_id.clone(),
        kind: Kind::SharedFolder,
        name: name.clone(),
        role: Role::Owner,
    };
    let folders_max = (!principal.user.admin).then_some(state.limits.get().quotas.folders_per_user);
    let command =
        Command::CreateSharedFolder { namespace_id, name, owner_user_id: principal.user.id.clone(), folders_max };
    keyed.write(&state, &principal, command, Success::created(body)).await
}

/// `GET /v1/namespaces`: the caller's namespaces (personal first) with their role.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PageQuery>,
) -> Result<Json<NamespaceList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    crate::access::barrier(&state, &principal).await?;
    let user_id = principal.user.id.clone();
    let after = query.page_token.clone();
    let found = read_state(&state, move |sm| Ok(sm.namespaces_page(&user_id, after.as_deref(), limit + 1)?)).await?;
    let next_page_token = (found.len() > limit).then(|| found[limit - 1].namespace.id.clone());
    let namespaces = found
        .into_iter()
        .take(limit)
        .map(|a| NamespaceView {
            namespace_id: a.namespace.id,
            kind: a.namespace.kind.into(),
            name: a.namespace.name,
            role: a.role,
        })
        .collect();
    Ok(Json(NamespaceList { namespaces, next_page_token }))
}

/// `GET /v1/namespaces/{id}`: one namespace the caller can read, with their role (404 for
/// one they cannot): a point read, as a sync client asks it before each pass.
pub async fn get_one(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
) -> Result<Json<NamespaceView>, ApiError> {
    let role = access::read(&state, &principal, &namespace_id).await?;
    let namespace = state
        .node
        .state()
        .namespace(&namespace_id)?
        .ok_or_else(|| ApiError::NotFound(format!("namespace {namespace_id}")))?;
    Ok(Json(NamespaceView { namespace_id: namespace.id, kind: namespace.kind.into(), name: namespace.name, role }))
}

/// `GET /v1/namespaces/{id}/acl`: every entry, with user and group names.
pub async fn acl(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Json<AclView>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    access::read(&state, &principal, &namespace_id).await?;
    let after = query.page_token.clone();
    read_state(&state, move |sm| {
        let namespace =
            sm.namespace(&namespace_id)?.ok_or_else(|| ApiError::NotFound(format!("namespace {namespace_id}")))?;
        let mut entries = Vec::new();
        if namespace.kind == NamespaceKind::Personal && after.is_none() {
            let owner = sm.user(&namespace.owner_user_id)?.map(|u| u.name).unwrap_or_default();
            let user_id = namespace.owner_user_id.clone();
            entries.push(AclEntry::User { user_id, user_name: owner, role: Role::Owner, pending: false });
        }
        let page = sm.acl_page(&namespace_id, after.as_deref(), limit + 1)?;
        for entry in page.iter().take(limit) {
            let (role, pending) = (entry.role, entry.pending);
            entries.push(match &entry.grantee {
                Grantee::User(id) => AclEntry::User {
                    user_id: id.clone(),
                    user_name: sm.user(id)?.map(|u| u.name).unwrap_or_default(),
                    role,
                    pending,
                },
                Grantee::Group(id) => AclEntry::Group {
                    group_id: id.clone(),
                    group_name: sm.group(id)?.map(|g| g.name).unwrap_or_default(),
                    role,
                    pending,
                },
            });
        }
        Ok(Json(AclView {
            next_page_token: (page.len() > limit).then(|| page[limit - 1].grantee.key()),
            namespace_id,
            kind: namespace.kind.into(),
            name: namespace.name,
            entries,
        }))
    })
    .await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct GrantRequest {
    /// Name exactly one of `userId`, `userName`, `groupId` and `groupName` (else 422).
    user_id: Option<String>,
    user_name: Option<String>,
    group_id: Option<String>,
    group_name: Option<String>,
    #[schema(value_type = Role)]
    role: String,
}

/// The one grantee a grant names (by id or by name; names are looked up after a read
/// barrier, an unknown one is 404).
async fn grantee(state: &AppState, request: &GrantRequest) -> Result<Grantee, ApiError> {
    let named = [&request.user_id, &request.user_name, &request.group_id, &request.group_name];
    if named.iter().filter(|f| f.is_some()).count() != 1 {
        return Err(ApiError::Unprocessable("name exactly one of userId, userName, groupId, groupName".into()));
    }
    if let Some(id) = &request.user_id {
        return Ok(Grantee::User(id.clone()));
    }
    if let Some(id) = &request.group_id {
        return Ok(Grantee::Group(id.clone()));
    }
    state.node.read_barrier().await?;
    if let Some(name) = &request.user_name {
        let user =
            state.node.state().user_by_name(name)?.ok_or_else(|| ApiError::NotFound(format!("user {name:?}")))?;
        return Ok(Grantee::User(user.id));
    }
    let name = request.group_name.as_deref().unwrap_or_default();
    let id = state.node.state().group_by_name(name)?.ok_or_else(|| ApiError::NotFound(format!("group {name:?}")))?;
    Ok(Grantee::Group(id))
}

/// `PUT /v1/namespaces/{id}/acl` (keyed): grant or change an entry; 204.
pub async fn grant(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    let request: GrantRequest = json::parse(&keyed.body)?;
    let role = Role::parse(&request.role)
        .ok_or_else(|| ApiError::BadRequest(format!("role {:?} is not viewer, editor or owner", request.role)))?;
    let grantee = grantee(&state, &request).await?;
    refuse_personal(&state, &principal, &namespace_id, "shared")?;
    let command = Command::SetAccess {
        actor_user_id: principal.user.id.clone(),
        namespace_id,
        grantee,
        role: Some(role),
        invite: true,
    };
    keyed.write_with(&state, &principal, command, no_content).await
}

async fn revoke(
    state: &AppState,
    principal: &Principal,
    namespace_id: String,
    grantee: Grantee,
) -> Result<Response, ApiError> {
    refuse_personal(state, principal, &namespace_id, "shared")?;
    let command = Command::SetAccess {
        actor_user_id: principal.user.id.clone(),
        namespace_id,
        grantee,
        role: None,
        invite: false,
    };
    no_content(state.node.write(command).await?)
}

/// `DELETE /v1/namespaces/{id}/acl/users/{userId}`: 204.
pub async fn revoke_user(
    State(state): State<AppState>,
    principal: Principal,
    Path((namespace_id, user_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    revoke(&state, &principal, namespace_id, Grantee::User(user_id)).await
}

/// `DELETE /v1/namespaces/{id}/acl/groups/{groupId}`: 204.
pub async fn revoke_group(
    State(state): State<AppState>,
    principal: Principal,
    Path((namespace_id, group_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    revoke(&state, &principal, namespace_id, Grantee::Group(group_id)).await
}

/// `POST /v1/namespaces/{id}/leave` (keyed): removes the caller's own entry; 204. Access
/// through a group stays.
pub async fn leave(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    refuse_personal(&state, &principal, &namespace_id, "left")?;
    let me = Grantee::User(principal.user.id.clone());
    let command = Command::SetAccess {
        actor_user_id: principal.user.id.clone(),
        namespace_id,
        grantee: me,
        role: None,
        invite: false,
    };
    keyed.write_with(&state, &principal, command, no_content).await
}

/// Whose invitation an answer is about: the caller's own, or (admin) a group's.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct InvitationRequest {
    group_id: Option<String>,
    group_name: Option<String>,
}

async fn respond(
    state: AppState,
    principal: Principal,
    namespace_id: String,
    keyed: Keyed,
    accept: bool,
) -> Result<Response, ApiError> {
    let body = &keyed.body;
    // No body, or JSON `null`: the caller's own invitation.
    let request: Option<InvitationRequest> =
        if body.iter().all(u8::is_ascii_whitespace) { None } else { json::parse(body)? };
    let request = request.unwrap_or_default();
    let grantee = match (request.group_id, request.group_name) {
        (None, None) => Grantee::User(principal.user.id.clone()),
        (Some(id), None) => Grantee::Group(id),
        (None, Some(name)) => {
            crate::access::barrier(&state, &principal).await?;
            let id = state
                .node
                .state()
                .group_by_name(&name)?
                .ok_or_else(|| ApiError::NotFound(format!("group {name:?}")))?;
            Grantee::Group(id)
        }
        (Some(_), Some(_)) => return Err(ApiError::Unprocessable("name at most one of groupId, groupName".into())),
    };
    let command =
        Command::RespondInvitation { actor_user_id: principal.user.id.clone(), namespace_id, grantee, accept };
    keyed.write_with(&state, &principal, command, no_content).await
}

/// `POST /v1/namespaces/{id}/accept` (keyed): the caller (or, admin, a group) accepts an
/// invitation; 204. The folder then syncs like any other.
pub async fn accept(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    respond(state, principal, namespace_id, keyed, true).await
}

/// `POST /v1/namespaces/{id}/decline` (keyed): the invitation is removed; 204.
pub async fn decline(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    respond(state, principal, namespace_id, keyed, false).await
}

/// `GET /v1/me/invitations`: the caller's pending invitations, by namespace id, paged.
pub async fn invitations(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PageQuery>,
) -> Result<Json<InvitationList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    crate::access::barrier(&state, &principal).await?;
    let me = Grantee::User(principal.user.id.clone());
    let after = query.page_token.clone();
    let (found, next) = read_state(&state, move |sm| Ok(sm.invitations_page(&me, after.as_deref(), limit)?)).await?;
    let invitations = found
        .into_iter()
        .map(|(entry, namespace)| InvitationView { namespace_id: namespace.id, name: namespace.name, role: entry.role })
        .collect();
    Ok(Json(InvitationList { invitations, next_page_token: next }))
}

/// `DELETE /v1/namespaces/{id}`: deletes a shared folder and everything in it; 204.
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
) -> Result<Response, ApiError> {
    refuse_personal(&state, &principal, &namespace_id, "deleted")?;
    let command = Command::DeleteSharedFolder { actor_user_id: principal.user.id.clone(), namespace_id };
    no_content(state.node.write(command).await?)
}

/// `POST /v1/admin/groups` (keyed).
pub async fn create_group(
    State(state): State<AppState>,
    principal: Principal,
    keyed: Keyed,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    let request: NameRequest = json::parse(&keyed.body)?;
    let name = json::name("name", &request.name)?;
    let group_id = new_id();
    let body = GroupView { group_id: group_id.clone(), name: name.clone() };
    keyed.write(&state, &principal, Command::CreateGroup { group_id, name }, Success::created(body)).await
}

/// `GET /v1/admin/groups`.
pub async fn list_groups(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PageQuery>,
) -> Result<Json<GroupList>, ApiError> {
    principal.require_admin()?;
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    crate::access::barrier(&state, &principal).await?;
    let after = query.page_token.clone();
    let found = read_state(&state, move |sm| Ok(sm.groups_page(after.as_deref(), limit + 1)?)).await?;
    let next_page_token = (found.len() > limit).then(|| found[limit - 1].id.clone());
    let groups = found.into_iter().take(limit).map(|g| GroupView { group_id: g.id, name: g.name }).collect();
    Ok(Json(GroupList { groups, next_page_token }))
}

/// `GET /v1/admin/groups/{id}`: the group and its members (paginated: `limit`, `pageToken`).
pub async fn get_group(
    State(state): State<AppState>,
    principal: Principal,
    Path(group_id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Json<GroupDetail>, ApiError> {
    principal.require_admin()?;
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    crate::access::barrier(&state, &principal).await?;
    let after = query.page_token.clone();
    read_state(&state, move |sm| {
        let group = sm.group(&group_id)?.ok_or_else(|| ApiError::NotFound(format!("group {group_id}")))?;
        let ids = sm.group_members_page(&group_id, after.as_deref(), limit + 1)?;
        let mut members = Vec::new();
        for user_id in ids.iter().take(limit) {
            let name = sm.user(user_id)?.map(|u| u.name).unwrap_or_default();
            members.push(GroupMember { user_id: user_id.clone(), name });
        }
        let next_page_token = (ids.len() > limit).then(|| ids[limit - 1].clone());
        Ok(Json(GroupDetail { group_id: group.id, name: group.name, members, next_page_token }))
    })
    .await
}

async fn set_member(
    state: &AppState,
    principal: &Principal,
    group_id: String,
    user_id: String,
    member: bool,
) -> Result<Response, ApiError> {
    principal.require_admin()?;
    no_content(state.node.write(Command::SetGroupMember { group_id, user_id, member }).await?)
}

/// `PUT /v1/admin/groups/{id}/members/{userId}`: 204 (adding a member again changes nothing).
pub async fn add_member(
    State(state): State<AppState>,
    principal: Principal,
    Path((group_id, user_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    set_member(&state, &principal, group_id, user_id, true).await
}

/// `DELETE /v1/admin/groups/{id}/members/{userId}`: 204; 404 if not a member.
pub async fn remove_member(
    State(state): State<AppState>,
    principal: Principal,
    Path((group_id, user_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    set_member(&state, &principal, group_id, user_id, false).await
}
