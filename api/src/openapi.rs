//! The OpenAPI 3.1 description of the HTTP API, served on `GET /v1/openapi.json`.
//!
//! Generated with utoipa from the handlers' own request and answer types, which derive
//! `ToSchema` (`IntoParams` for queries): each wire shape is defined once, beside its
//! handler, and the sync client and the benchmark read answers with the same types. One
//! `#[utoipa::path]` per route declares
//! its parameters, body and the statuses particular to it; [`Common`] adds the statuses every
//! route shares (problem+json: 429 rate-limited, 500, 503 unavailable or timed out; 401 where
//! a token is needed; 400 and 413 where the request carries parameters or a body).
//!
//! The API tests hold the description to the router: every route of [`crate::routes`] is in
//! it and nothing else, and every answer of the API test suite (status and body) validates
//! against it (`api/tests/it/openapi.rs`).

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::error::Problem;
use crate::routes::accounts::{TokenCreated, TokenList, TokenRevoked};
use crate::routes::files::{FileCommitted, FileHistory, FileView, FolderListing};
use crate::routes::jobs::{JobCreated, JobList, JobView, RunList};
use crate::routes::links::{LinkFolder, LinkList};
use crate::routes::probes::{Health, Ready};
use crate::routes::sharing::{
    AclView, GroupDetail, GroupList, GroupView, InvitationList, NamespaceList, NamespaceView,
};
use crate::routes::sync::NotifyAnswer;
use crate::routes::{accounts, blocks, cluster, files, jobs, probes, sync};

/// The description as JSON, built once.
pub fn document_json() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| ApiDoc::openapi().to_json().unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

/// The description as a JSON value (for tests and tools).
pub fn document() -> Value {
    serde_json::from_str(document_json()).unwrap_or(Value::Null)
}

/// `GET /v1/openapi.json` (no token needed).
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document_json())
}

/// The description of every route (the route table is `crate::routes::router`).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "raftbox",
        description = "A Raft-replicated file store, job scheduler and rate limiter. Errors are RFC 9457 problem+json."
    ),
    paths(
        ops::console_index, ops::console_asset,
        ops::healthz, ops::readyz, ops::metrics, ops::cluster, ops::openapi,
        ops::members, ops::add_member_node, ops::remove_member_node, ops::backup, ops::backup_block,
        ops::get_limits, ops::put_limits,
        ops::create_user, ops::get_user, ops::create_token, ops::list_tokens, ops::revoke_token,
        ops::me, ops::my_tokens, ops::revoke_my_token, ops::webhook_secret, ops::rotate_webhook_secret,
        ops::login, ops::set_my_password, ops::remove_my_password, ops::set_password, ops::remove_password,
        ops::blocks_status, ops::get_block, ops::put_block, ops::post_block,
        ops::get_file, ops::commit_file, ops::put_file_content, ops::get_file_content, ops::file_history, ops::restore_file, ops::delete_file, ops::move_file,
        ops::list_folder,
        ops::create_job, ops::list_jobs, ops::get_job, ops::patch_job, ops::cancel_job, ops::job_method,
        ops::create_link, ops::list_links, ops::revoke_link, ops::list_namespace_links, ops::revoke_namespace_link, ops::open_link, ops::open_link_under, ops::job_runs,
        ops::sync, ops::sync_post, ops::notify, ops::notify_post, ops::notify_ws,
        ops::create_namespace, ops::list_namespaces, ops::get_namespace, ops::delete_namespace, ops::get_acl, ops::grant,
        ops::revoke_user, ops::revoke_group, ops::leave, ops::accept_invitation, ops::decline_invitation,
        ops::my_invitations,
        ops::create_group, ops::list_groups, ops::get_group, ops::add_group_member, ops::remove_group_member,
    ),
    components(schemas(
        Problem, crate::routes::sync::NotifyMessage, crate::schema::IdempotencyKey, crate::schema::DeviceName,
        crate::schema::BlockHash, crate::schema::FilePath, crate::schema::FolderPath, crate::schema::LinkFolderPath,
        crate::schema::DisplayName, crate::schema::Cursor, crate::schema::SeqPageToken, crate::schema::JobPageToken,
        crate::schema::Mtime, crate::schema::UtcTimestamp, crate::schema::JobType, crate::schema::Schedule, crate::schema::SchedulePatch,
    )),
    modifiers(&Common),
    tags(
        (name = "console", description = "The web console's static files (HTML, JavaScript, CSS); no token needed."),
        (name = "probes", description = "Health, readiness, metrics and cluster status; no token needed."),
        (name = "admin", description = "Users, tokens, groups and cluster membership (admin token)."),
        (name = "me", description = "The caller and its tokens."),
        (name = "blocks", description = "Content-addressed blocks (chunks) of files."),
        (name = "files", description = "File metadata: commit, read, history, restore, delete, move, list."),
        (name = "sync", description = "Changes since a cursor, and notification channels."),
        (name = "jobs", description = "Scheduled jobs and their runs."),
        (name = "sharing", description = "Shared folders and their access lists."),
    )
)]
pub struct ApiDoc;

/// Statuses every route shares, and the bearer token scheme.
struct Common;

/// Routes that need no token.
const OPEN_PATHS: [&str; 10] = [
    "/",
    "/console/{file}",
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/cluster",
    "/v1/openapi.json",
    "/v1/login",
    "/s/{token}",
    "/s/{token}/{path}",
];

fn problem(description: &str) -> RefOr<utoipa::openapi::Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    ResponseBuilder::new().description(description).content("application/problem+json", content).build().into()
}

fn add_common(path: &str, operation: &mut Operation) {
    let open = OPEN_PATHS.contains(&path);
    if !open {
        operation.security =
            Some(vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
    let has_input = operation.request_body.is_some() || operation.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let responses = &mut operation.responses.responses;
    let mut add = |status: &str, description: &str| {
        responses.entry(status.to_string()).or_insert_with(|| problem(description));
    };
    if has_input {
        add("400", "Bad request: a malformed parameter or body.");
    }
    if operation.request_body.is_some() {
        add("413", "Payload too large.");
    }
    let keyed = operation.parameters.iter().flatten().any(|p| p.name == "Idempotency-Key");
    if keyed {
        add("422", "The `Idempotency-Key` was used with another body.");
    }
    if !open {
        add("401", "Unauthenticated: missing, unknown or expired token.");
    }
    add("429", "Rate limited (where a limit is configured); see Retry-After.");
    add("500", "Internal error.");
    add("503", "Unavailable: no leader or quorum, or no answer within the request timeout; see Retry-After.");
}

impl Modify for Common {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some("rbx_… token")).build();
            components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            for operation in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
                &mut item.head,
                &mut item.options,
                &mut item.trace,
            ]
            .into_iter()
            .flatten()
            {
                add_common(path, operation);
            }
        }
    }
}

/// One declaration per route; the handlers are in [`crate::routes`].
#[allow(dead_code)]
mod ops {
    use super::*;

    #[utoipa::path(get, path = "/", tag = "console", responses(
        (status = 200, description = "The web console's page.", body = String, content_type = "text/html"),
    ))]
    fn console_index() {}

    #[utoipa::path(get, path = "/console/{file}", tag = "console", params(("file" = String, Path, description = "`app.js` or `style.css`")), responses(
        (status = 200, description = "One of the console's files.", content((String = "text/javascript"), (String = "text/css"))),
        (status = 404, description = "No such file.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn console_asset() {}

    #[utoipa::path(get, path = "/healthz", tag = "probes", responses((status = 200, description = "The process is up.", body = Health)))]
    fn healthz() {}

    #[utoipa::path(get, path = "/readyz", tag = "probes", responses(
        (status = 200, description = "A member of a cluster with a leader, its clock in step.", body = Ready),
    ))]
    fn readyz() {}

    #[utoipa::path(get, path = "/metrics", tag = "probes", responses(
        (status = 200, description = "Prometheus text exposition (README \"Metrics\").", body = String, content_type = "text/plain"),
        (status = 403, description = "A caller from outside `[http] metrics_allow` (loopback by default) without the admin token.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn metrics() {}

    #[utoipa::path(get, path = "/v1/cluster", tag = "probes", responses((status = 200, description = "This node's view of the cluster.", body = probes::ClusterInfo)))]
    fn cluster() {}

    #[utoipa::path(get, path = "/v1/openapi.json", tag = "probes", responses((status = 200, description = "This description (OpenAPI 3.1).", body = serde_json::Value)))]
    fn openapi() {}

    #[utoipa::path(get, path = "/v1/admin/cluster/members", tag = "admin", responses(
        (status = 200, description = "The members.", body = cluster::MembersView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn members() {}

    #[utoipa::path(post, path = "/v1/admin/cluster/members", tag = "admin", request_body = cluster::AddRequest, responses(
        (status = 200, description = "The node is a voter.", body = cluster::MembersView),
        (status = 202, description = "The node is a learner catching up; POST again to finish.", body = cluster::MembersView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The change conflicts with the membership.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn add_member_node() {}

    #[utoipa::path(delete, path = "/v1/admin/cluster/members/{id}", tag = "admin", params(("id" = u64, Path, description = "Node id")), responses(
        (status = 200, description = "The members after the removal.", body = cluster::MembersView),
        (status = 202, description = "Not removed yet: the remaining voters are still filling in the blocks they lack (`complete` is false). Repeat the request; it goes on from where the fill got.", body = cluster::MembersView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such member.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The change conflicts with the membership.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn remove_member_node() {}

    #[utoipa::path(get, path = "/v1/me/webhook-secret", tag = "me", responses(
        (status = 200, description = "The secret that signs the caller's webhook calls (Standard Webhooks), made on the first ask.", body = crate::routes::accounts::WebhookSecretView),
    ))]
    fn webhook_secret() {}

    #[utoipa::path(post, path = "/v1/me/webhook-secret", tag = "me", request_body(content = Option<crate::routes::accounts::RotateRequest>, description = "Optional (no body, or `null`: the defaults)."), responses(
        (status = 201, description = "A new secret; the one before it still signs for `keepPreviousHours`.", body = crate::routes::accounts::WebhookSecretView),
        (status = 409, description = "A secret before the current one still signs (rotate after it stops, or with `keepPreviousHours` 0).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn rotate_webhook_secret() {}

    #[utoipa::path(post, path = "/v1/login", tag = "me", request_body = crate::routes::login::LoginRequest, responses(
        (status = 201, description = "A session token (a bearer token named `login`, expiring after 30 days), shown once.", body = crate::routes::login::LoginResponse),
        (status = 401, description = "Wrong name or password (the same answer for both, and for a user without a password).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn login() {}

    #[utoipa::path(put, path = "/v1/me/password", tag = "me", request_body = crate::routes::login::PasswordRequest, responses(
        (status = 204, description = "The caller's password is set; it logs in with `POST /v1/login`. Every login session made under the password before ends."),
        (status = 403, description = "A password is set, and `currentPassword` is missing or wrong; or none is set, and the caller has no fresh proof (a token made in the last 10 minutes that is not a login session, or the admin's).", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A node still runs a release that cannot end sessions (the cluster's data format is below 5).", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many password attempts from this address, or on this name from this address lately.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn set_my_password() {}

    #[utoipa::path(delete, path = "/v1/me/password", tag = "me", request_body(content = Option<crate::routes::login::PasswordRemoval>, description = "The current password, unless the caller has fresh proof."), responses(
        (status = 204, description = "The caller's password is removed; every login session ends."),
        (status = 403, description = "`currentPassword` is missing or wrong, and the caller has no fresh proof.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No password is set.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A node still runs a release that cannot end sessions (the cluster's data format is below 5).", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many password attempts.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn remove_my_password() {}

    #[utoipa::path(put, path = "/v1/admin/users/{user_id}/password", tag = "admin", params(("user_id" = String, Path, description = "User id")), request_body = crate::routes::login::PasswordRequest, responses(
        (status = 204, description = "The user's password is set; their login sessions made under the one before end."),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A node still runs a release that cannot store passwords (the cluster's data format is below 4).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn set_password() {}

    #[utoipa::path(delete, path = "/v1/admin/users/{user_id}/password", tag = "admin", params(("user_id" = String, Path, description = "User id")), responses(
        (status = 204, description = "The user can no longer log in with a password; their login sessions end (their other tokens still work)."),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn remove_password() {}

    #[utoipa::path(get, path = "/v1/admin/limits", tag = "admin", responses(
        (status = 200, description = "The rate limits, job limits and quotas in force: the cluster's (`source` `cluster`, with `revision` and `setAtMs`), or the answering node's TOML before any were set (`nodeConfig`); and the cluster's data format.", body = crate::runtime_limits::LimitsView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_limits() {}

    #[utoipa::path(put, path = "/v1/admin/limits", tag = "admin", request_body = crate::runtime_limits::LimitsConfig, responses(
        (status = 200, description = "The new limits, in force on every node as it applies the change (on this one already).", body = crate::runtime_limits::LimitsView),
        (status = 400, description = "A limit is invalid: the whole change is refused and nothing changed.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A node still runs a release that cannot read runtime limits (the cluster's data format is below 3).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn put_limits() {}

    #[utoipa::path(get, path = "/v1/admin/backup", tag = "admin", responses(
        (status = 200, description = "A consistent image of the replicated state (a snapshot image ending in its blake3 checksum), reflecting every write acknowledged before the request. Headers: `X-Raftbox-Backup-Index` and `X-Raftbox-Backup-Term` (the last log entry it reflects).", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "No quorum for the read barrier, or a backup already runs on this node.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn backup() {}

    #[utoipa::path(get, path = "/v1/admin/blocks/{hash}", tag = "admin", params(("hash" = crate::schema::BlockHash, Path)), responses(
        (status = 200, description = "The block's bytes (for a backup's blocks).", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "Not a block hash.", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not in the chunk index, or no node holds it.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn backup_block() {}

    #[utoipa::path(post, path = "/v1/admin/users", tag = "admin", request_body = accounts::NameRequest, params(crate::idempotency::Keyed), responses(
        (status = 201, description = "The user and its personal namespace.", body = accounts::UserCreated),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A user of that name exists, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_user() {}

    #[utoipa::path(get, path = "/v1/admin/users/{user_id}", tag = "admin", params(("user_id" = String, Path)), responses(
        (status = 200, description = "The user.", body = accounts::UserView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_user() {}

    #[utoipa::path(post, path = "/v1/admin/users/{user_id}/tokens", tag = "admin", request_body = accounts::TokenRequest, params(("user_id" = String, Path), crate::idempotency::Keyed), responses(
        (status = 201, description = "The token (its secret in this answer only).", body = TokenCreated),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_token() {}

    #[utoipa::path(get, path = "/v1/admin/users/{user_id}/tokens", tag = "admin", params(("user_id" = String, Path), crate::routes::PageQuery), responses(
        (status = 200, description = "The user's tokens (never their secrets).", body = TokenList),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn list_tokens() {}

    #[utoipa::path(delete, path = "/v1/admin/users/{user_id}/tokens/{token_id}", tag = "admin", params(("user_id" = String, Path), ("token_id" = String, Path)), responses(
        (status = 200, description = "Revoked on every node within a heartbeat.", body = TokenRevoked),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_token() {}

    #[utoipa::path(get, path = "/v1/me", tag = "me", responses((status = 200, description = "The caller, with the bytes they store and their quota.", body = accounts::MeView)))]
    fn me() {}

    #[utoipa::path(get, path = "/v1/me/tokens", tag = "me", params(crate::routes::PageQuery), responses((status = 200, description = "The caller's tokens.", body = TokenList)))]
    fn my_tokens() {}

    #[utoipa::path(delete, path = "/v1/me/tokens/{token_id}", tag = "me", params(("token_id" = String, Path)), responses(
        (status = 200, description = "Revoked.", body = TokenRevoked),
        (status = 404, description = "No such token of the caller's.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_my_token() {}

    #[utoipa::path(post, path = "/v1/blocks/status", tag = "blocks", request_body = blocks::StatusRequest, responses(
        (status = 200, description = "The blocks the cluster lacks or the caller may not read.", body = blocks::StatusResponse),
    ))]
    fn blocks_status() {}

    #[utoipa::path(get, path = "/v1/blocks/{hash}", tag = "blocks", params(("hash" = crate::schema::BlockHash, Path)), responses(
        (status = 200, description = "The block's bytes.", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 404, description = "No such block, or the caller may not read it.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_block() {}

    #[utoipa::path(put, path = "/v1/blocks/{hash}", tag = "blocks", params(("hash" = crate::schema::BlockHash, Path)),
        request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "At most 8 MiB."), responses(
        (status = 201, description = "Durable on a majority and indexed."),
        (status = 422, description = "The body does not hash to `hash`.", body = Problem, content_type = "application/problem+json"),
        (status = 507, description = "The block would take the caller past their storage quota (`quota-exceeded`).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn put_block() {}

    #[utoipa::path(post, path = "/v1/blocks", tag = "blocks",
        request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "At most 8 MiB."), responses(
        (status = 201, description = "Durable on a majority and indexed, under the hash the server computed.", body = crate::routes::content::BlockStored),
        (status = 413, description = "Larger than a block may be.", body = Problem, content_type = "application/problem+json"),
        (status = 507, description = "The block would take the caller past their storage quota (`quota-exceeded`).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn post_block() {}

    #[utoipa::path(get, path = "/v1/files", tag = "files", params(files::PathQuery), responses(
        (status = 200, description = "The current version.", body = FileView),
        (status = 404, description = "No live file there, or a namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_file() {}

    #[utoipa::path(post, path = "/v1/files/commit", tag = "files", request_body = files::CommitRequest, params(files::DeviceHeader, crate::idempotency::Keyed), responses(
        (status = 200, description = "Unchanged: the content equals the current version.", body = FileCommitted),
        (status = 201, description = "A new version.", body = FileCommitted),
        (status = 403, description = "A viewer cannot change files.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The file changed since baseVersion (content kept as a conflicted copy), or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Chunks not stored yet (`missing`), a deletion with chunks, an `mtime` before 1970, or the `Idempotency-Key` was used with another body.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn commit_file() {}

    #[utoipa::path(put, path = "/v1/files/content", tag = "files", params(crate::routes::content::ContentQuery, files::DeviceHeader),
        request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The whole file (at most 64 GiB, and the caller's quota)."), responses(
        (status = 200, description = "Unchanged: the content equals the current version.", body = FileCommitted),
        (status = 201, description = "A new version: the body was cut into blocks, stored on a majority and committed.", body = FileCommitted),
        (status = 403, description = "A viewer cannot change files.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The file changed since baseVersion (the upload was kept as a conflicted copy).", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Larger than one upload may be.", body = Problem, content_type = "application/problem+json"),
        (status = 507, description = "Larger than the caller's storage quota allows (`quota-exceeded`).", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An `mtime` before 1970.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn put_file_content() {}

    #[utoipa::path(get, path = "/v1/files/content", tag = "files", params(files::PathQuery), responses(
        (status = 200, description = "The current version's bytes.", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 404, description = "No live file there, or a namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_file_content() {}

    #[utoipa::path(get, path = "/v1/files/history", tag = "files", params(files::HistoryQuery), responses(
        (status = 200, description = "Every kept version, newest first.", body = FileHistory),
        (status = 404, description = "No file there.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn file_history() {}

    #[utoipa::path(post, path = "/v1/files/restore", tag = "files", request_body = files::RestoreRequest, params(files::DeviceHeader, crate::idempotency::Keyed), responses(
        (status = 200, description = "Unchanged.", body = FileCommitted),
        (status = 201, description = "A new version with the old content.", body = FileCommitted),
        (status = 403, description = "A viewer cannot change files.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such file or version.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Conflict, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn restore_file() {}

    #[utoipa::path(post, path = "/v1/files/delete", tag = "files", request_body = files::DeleteRequest, params(files::DeviceHeader, crate::idempotency::Keyed), responses(
        (status = 200, description = "Already deleted.", body = FileCommitted),
        (status = 201, description = "A tombstone version.", body = FileCommitted),
        (status = 403, description = "A viewer cannot change files.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such file.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The file changed since baseVersion, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn delete_file() {}

    #[utoipa::path(post, path = "/v1/files/move", tag = "files", request_body = files::MoveRequest, params(files::DeviceHeader, crate::idempotency::Keyed), responses(
        (status = 200, description = "Unchanged.", body = FileCommitted),
        (status = 201, description = "The new version at `to`.", body = FileCommitted),
        (status = 403, description = "A viewer cannot change files.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No file at `from`.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`from` changed since baseVersion or `to` is taken, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn move_file() {}

    #[utoipa::path(get, path = "/v1/files/list", tag = "files", params(files::FolderQuery), responses(
        (status = 200, description = "Files and subfolders directly in the folder, by name.", body = FolderListing),
        (status = 404, description = "A namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn list_folder() {}

    #[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = jobs::CreateRequest, params(crate::idempotency::Keyed), responses(
        (status = 201, description = "Scheduled.", body = JobCreated),
        (status = 403, description = "A limit of non-admins' jobs.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Too many active jobs, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A schedule or target the server cannot take: a cron expression or time zone it does not know, a schedule that never fires or fires more often than `[job_limits] min_cron_interval_s` allows, a `runAt` before 1970, a webhook target the node may not call, or the `Idempotency-Key` was used with another body.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_job() {}

    #[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(jobs::JobsQuery), responses((status = 200, description = "The caller's jobs.", body = JobList)))]
    fn list_jobs() {}

    #[utoipa::path(get, path = "/v1/jobs/{job_id}", tag = "jobs", params(("job_id" = String, Path)), responses(
        (status = 200, description = "The job.", body = JobView),
        (status = 404, description = "No such job of the caller's.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_job() {}

    #[utoipa::path(patch, path = "/v1/jobs/{job_id}", tag = "jobs", params(("job_id" = String, Path)), request_body = jobs::PatchRequest, responses(
        (status = 200, description = "The changed job.", body = JobView),
        (status = 403, description = "A limit of non-admins' jobs.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job of the caller's.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job is final.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A schedule or target the server cannot take (as for `POST /v1/jobs`).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn patch_job() {}

    #[utoipa::path(delete, path = "/v1/jobs/{job_id}", tag = "jobs", params(("job_id" = String, Path)), responses(
        (status = 200, description = "The cancelled job: no fire starts any more; the job stays readable, `CANCELLED`, with its runs.", body = JobView),
        (status = 404, description = "No such job of the caller's.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job is final.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn cancel_job() {}

    #[utoipa::path(post, path = "/v1/links", tag = "sharing", request_body = crate::routes::links::CreateRequest, responses(
        (status = 201, description = "The link, with its token (shown only now) and its path `/s/{token}`.", body = crate::routes::links::CreatedLink),
        (status = 403, description = "A viewer cannot share a folder's files by link.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A namespace the caller cannot read, or no file at `path`.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The caller has the most links allowed (1,000).", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Neither or both of `path` and `folder`, or an `expiresAt` not within the coming year.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_link() {}

    #[utoipa::path(get, path = "/v1/links", tag = "sharing", params(crate::routes::PageQuery), responses(
        (status = 200, description = "The caller's links (never their tokens).", body = LinkList),
    ))]
    fn list_links() {}

    #[utoipa::path(delete, path = "/v1/links/{link_id}", tag = "sharing", params(("link_id" = String, Path)), responses(
        (status = 204, description = "Revoked: the link stops working on every node."),
        (status = 404, description = "No such link of the caller's.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_link() {}

    #[utoipa::path(get, path = "/v1/namespaces/{namespace_id}/links", tag = "sharing", params(("namespace_id" = String, Path), crate::routes::PageQuery), responses(
        (status = 200, description = "Every link into a namespace the caller owns, whoever made it (never their tokens).", body = LinkList),
        (status = 403, description = "The caller reads the namespace but does not own it.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A namespace the caller cannot read.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A node still runs a release that does not index links by namespace (the cluster's data format is below 5).", body = Problem, content_type = "application/problem+json"),
    ))]
    fn list_namespace_links() {}

    #[utoipa::path(delete, path = "/v1/namespaces/{namespace_id}/links/{link_id}", tag = "sharing", params(("namespace_id" = String, Path), ("link_id" = String, Path)), responses(
        (status = 204, description = "Revoked: a link into a namespace the caller owns, whoever made it."),
        (status = 404, description = "No such link in a namespace the caller owns.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The cluster's data format is below 5.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_namespace_link() {}

    #[utoipa::path(get, path = "/s/{token}", tag = "sharing", params(("token" = String, Path, description = "The link's token."), crate::routes::PageQuery), responses(
        (status = 200, description = "A file link: the file. A folder link: its listing, HTML or (for `Accept: application/json`) JSON.", content((Vec<u8> = "application/octet-stream"), (String = "text/html"), (LinkFolder = "application/json"))),
        (status = 401, description = "The link asks for a password (HTTP Basic, any user name).", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such link, revoked, or its creator can no longer read there.", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired, or its downloads are used up.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn open_link() {}

    #[utoipa::path(get, path = "/s/{token}/{path}", tag = "sharing", params(("token" = String, Path, description = "The link's token."), ("path" = String, Path, description = "A file, or a folder ending in `/`, under the link's folder."), crate::routes::PageQuery), responses(
        (status = 200, description = "The file, or the subfolder's listing.", content((Vec<u8> = "application/octet-stream"), (String = "text/html"), (LinkFolder = "application/json"))),
        (status = 401, description = "The link asks for a password (HTTP Basic, any user name).", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such link, file or folder.", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired, or its downloads are used up.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn open_link_under() {}

    #[utoipa::path(post, path = "/v1/jobs/{job_id}", tag = "jobs", operation_id = "job_method",
        params(("job_id" = String, Path, description = "The job id and a method: `{id}:pause` (no new fire or retry starts; a run in progress ends as it would), `{id}:resume` (fires missed meanwhile are not made up; a one-off job whose time passed runs now) or `{id}:run` (one fire now, fenced and recorded; the schedule goes on).", pattern = "^[0-9A-Za-z_-]+:(pause|resume|run)$"),
            crate::idempotency::Keyed), responses(
        (status = 200, description = "The job after the change.", body = JobView),
        (status = 404, description = "No such job of the caller's, or no such method.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job is final; or, for `:run`, paused or running now.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn job_method() {}

    #[utoipa::path(get, path = "/v1/jobs/{job_id}/runs", tag = "jobs", params(("job_id" = String, Path), jobs::RunsQuery), responses(
        (status = 200, description = "The job's runs, newest first.", body = RunList),
        (status = 404, description = "No such job of the caller's.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn job_runs() {}

    #[utoipa::path(get, path = "/v1/sync", tag = "sync", params(sync::SyncQuery), responses(
        (status = 200, description = "Changes since the cursor in every readable namespace.", body = sync::SyncPage),
        (status = 410, description = "The cursor can no longer be served: sync again from 0.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn sync() {}

    #[utoipa::path(post, path = "/v1/sync", tag = "sync", request_body = sync::SyncQuery, responses(
        (status = 200, description = "As `GET /v1/sync`, the cursor in the body (a cursor never meets a URL length limit).", body = sync::SyncPage),
        (status = 410, description = "The cursor can no longer be served: sync again from 0.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn sync_post() {}

    #[utoipa::path(get, path = "/v1/notify", tag = "sync", params(sync::NotifyQuery), responses(
        (status = 200, description = "Whether anything is newer than the cursor, as soon as it is or at the timeout.", body = NotifyAnswer),
        (status = 410, description = "The cursor can no longer be served.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn notify() {}

    #[utoipa::path(post, path = "/v1/notify", tag = "sync", request_body = sync::NotifyQuery, responses(
        (status = 200, description = "As `GET /v1/notify`, the cursor in the body.", body = NotifyAnswer),
        (status = 410, description = "The cursor can no longer be served.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn notify_post() {}

    #[utoipa::path(get, path = "/v1/notify/ws", tag = "sync", params(
            ("Connection" = String, Header, description = "The WebSocket handshake (RFC 6455).", pattern = "^[Uu]pgrade$"),
            ("Upgrade" = String, Header, pattern = "^[Ww]eb[Ss]ocket$"),
            ("Sec-WebSocket-Version" = String, Header, pattern = "^13$"),
            ("Sec-WebSocket-Key" = String, Header, description = "16 random bytes, base64 (RFC 6455)."),
        ), responses(
        (status = 101, description = "A WebSocket: a `NotifyMessage` per change."),
        (status = 400, description = "Not a WebSocket upgrade request.", body = Problem, content_type = "application/problem+json"),
        (status = 426, description = "The connection cannot be upgraded.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn notify_ws() {}

    #[utoipa::path(post, path = "/v1/namespaces", tag = "sharing", request_body = accounts::NameRequest, params(crate::idempotency::Keyed), responses(
        (status = 201, description = "The new shared folder, owned by the caller.", body = NamespaceView),
        (status = 409, description = "The caller has created `[quotas] folders_per_user` folders, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_namespace() {}

    #[utoipa::path(get, path = "/v1/namespaces", tag = "sharing", params(crate::routes::PageQuery), responses((status = 200, description = "The caller's namespaces, personal first.", body = NamespaceList)))]
    fn list_namespaces() {}

    #[utoipa::path(get, path = "/v1/namespaces/{namespace_id}", tag = "sharing", params(("namespace_id" = String, Path)), responses(
        (status = 200, description = "The namespace, with the caller's role in it.", body = NamespaceView),
        (status = 404, description = "No such namespace the caller can read.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_namespace() {}

    #[utoipa::path(delete, path = "/v1/namespaces/{namespace_id}", tag = "sharing", params(("namespace_id" = String, Path)), responses(
        (status = 204, description = "Deleted with everything in it."),
        (status = 403, description = "Not its owner.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such shared folder the caller can read.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not a shared folder.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn delete_namespace() {}

    #[utoipa::path(get, path = "/v1/namespaces/{namespace_id}/acl", tag = "sharing", params(("namespace_id" = String, Path), crate::routes::PageQuery), responses(
        (status = 200, description = "Who has access.", body = AclView),
        (status = 404, description = "No such namespace the caller can read.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_acl() {}

    #[utoipa::path(put, path = "/v1/namespaces/{namespace_id}/acl", tag = "sharing", params(("namespace_id" = String, Path), crate::idempotency::Keyed), request_body = crate::routes::sharing::GrantRequest, responses(
        (status = 204, description = "Invited (a new entry naming someone else is pending until they accept), or the role changed."),
        (status = 403, description = "Not its owner.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace, user or group.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not allowed on this namespace, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not exactly one of `userId`, `userName`, `groupId`, `groupName`, or the `Idempotency-Key` was used with another body.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn grant() {}

    #[utoipa::path(delete, path = "/v1/namespaces/{namespace_id}/acl/users/{user_id}", tag = "sharing", params(("namespace_id" = String, Path), ("user_id" = String, Path)), responses(
        (status = 204, description = "Revoked."),
        (status = 403, description = "Not its owner.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace or entry.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not allowed on this namespace.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_user() {}

    #[utoipa::path(delete, path = "/v1/namespaces/{namespace_id}/acl/groups/{group_id}", tag = "sharing", params(("namespace_id" = String, Path), ("group_id" = String, Path)), responses(
        (status = 204, description = "Revoked."),
        (status = 403, description = "Not its owner.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace or entry.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not allowed on this namespace.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn revoke_group() {}

    #[utoipa::path(post, path = "/v1/namespaces/{namespace_id}/leave", tag = "sharing", params(("namespace_id" = String, Path), crate::idempotency::Keyed), responses(
        (status = 204, description = "The caller left the shared folder."),
        (status = 403, description = "Not allowed.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace the caller is in.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The owner cannot leave, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn leave() {}

    #[utoipa::path(post, path = "/v1/namespaces/{namespace_id}/accept", tag = "sharing", params(("namespace_id" = String, Path), crate::idempotency::Keyed), request_body(content = Option<crate::routes::sharing::InvitationRequest>, description = "Empty for the caller's own invitation; a group's (admin) by `groupId` or `groupName`."), responses(
        (status = 204, description = "Accepted (or accepted already): the folder is the grantee's."),
        (status = 403, description = "Not the invited user, or a group's invitation and not an admin.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such invitation.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Both `groupId` and `groupName`, or the `Idempotency-Key` was used with another body.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn accept_invitation() {}

    #[utoipa::path(post, path = "/v1/namespaces/{namespace_id}/decline", tag = "sharing", params(("namespace_id" = String, Path), crate::idempotency::Keyed), request_body(content = Option<crate::routes::sharing::InvitationRequest>, description = "Empty for the caller's own invitation; a group's (admin) by `groupId` or `groupName`."), responses(
        (status = 204, description = "Declined: the invitation is gone."),
        (status = 403, description = "Not the invited user, or a group's invitation and not an admin.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pending invitation.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Both `groupId` and `groupName`, or the `Idempotency-Key` was used with another body.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn decline_invitation() {}

    #[utoipa::path(get, path = "/v1/me/invitations", tag = "sharing", params(crate::routes::PageQuery), responses(
        (status = 200, description = "The caller's pending invitations.", body = InvitationList),
    ))]
    fn my_invitations() {}

    #[utoipa::path(post, path = "/v1/admin/groups", tag = "admin", request_body = accounts::NameRequest, params(crate::idempotency::Keyed), responses(
        (status = 201, description = "The new group.", body = GroupView),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A group of that name exists, or a request with this key is in progress.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn create_group() {}

    #[utoipa::path(get, path = "/v1/admin/groups", tag = "admin", params(crate::routes::PageQuery), responses(
        (status = 200, description = "Every group.", body = GroupList),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn list_groups() {}

    #[utoipa::path(get, path = "/v1/admin/groups/{group_id}", tag = "admin", params(("group_id" = String, Path), crate::routes::PageQuery), responses(
        (status = 200, description = "The group and its members.", body = GroupDetail),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such group.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn get_group() {}

    #[utoipa::path(put, path = "/v1/admin/groups/{group_id}/members/{user_id}", tag = "admin", params(("group_id" = String, Path), ("user_id" = String, Path)), responses(
        (status = 204, description = "A member (again)."),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such group or user.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn add_group_member() {}

    #[utoipa::path(delete, path = "/v1/admin/groups/{group_id}/members/{user_id}", tag = "admin", params(("group_id" = String, Path), ("user_id" = String, Path)), responses(
        (status = 204, description = "No longer a member."),
        (status = 403, description = "Not the admin token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such group, or not a member.", body = Problem, content_type = "application/problem+json"),
    ))]
    fn remove_group_member() {}
}
