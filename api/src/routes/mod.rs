//! The handlers, one module per area, and the route table.

pub mod accounts;
pub(crate) mod backup;
pub mod blocks;
pub mod cluster;
pub mod content;
pub mod files;
pub mod jobs;
pub mod links;
pub mod login;
pub mod probes;
pub mod sharing;
pub mod sync;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;

use crate::{ApiError, AppState};

/// Page size of lists (DESIGN.md §3): default and largest.
pub const PAGE_DEFAULT: usize = 100;
pub const PAGE_MAX: usize = 1_000;

/// Records one listing request reads at most, whatever its page size (a page may come short,
/// with a token, when what it skips is large: deleted files in a folder, say).
pub const LISTING_WORK_MAX: usize = 10_000;

/// `limit` and `pageToken` of a listing.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Entries per page: default 100, at most 1,000 (a larger one is cut to 1,000).
    #[param(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    pub(crate) limit: Option<u32>,
    /// The `nextPageToken` of the page before: the page goes on after it, in the list's
    /// order (any text is a place in that order).
    pub(crate) page_token: Option<String>,
}

/// A page of a list, as every list answers: its entries under `$field`, and
/// `nextPageToken` when more may follow.
macro_rules! page {
    ($(#[$doc:meta])* $name:ident { $field:ident: $item:ty }) => {
        $(#[$doc])*
        #[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            pub $field: Vec<$item>,
            /// Present when more may follow: the `pageToken` of the next page.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(required = false)]
            pub next_page_token: Option<String>,
        }
    };
}
pub(crate) use page;

/// Runs a read of the local state off the async workers: a long read never holds a worker,
/// and the request's deadline still holds while it runs.
pub(crate) async fn read_state<T: Send + 'static>(
    state: &AppState,
    read: impl FnOnce(&raftbox_storage::StateMachine) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let sm = state.node.state().clone();
    tokio::task::spawn_blocking(move || read(&sm))
        .await
        .map_err(|e| ApiError::Internal(format!("a read of the state failed: {e}")))?
}

/// A page token that is a sequence number, as `schema::SeqPageToken` states it: 1 to 19
/// digits (always a u64).
pub(crate) fn seq_token(token: &str) -> Result<u64, ApiError> {
    let digits = (1..=19).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| token.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| ApiError::BadRequest("pageToken is 1 to 19 digits".into()))
}

/// A requested page size: absent → `default`, 0 → 400, above `max` → `max`.
pub(crate) fn page_limit(requested: Option<u32>, default: usize, max: usize) -> Result<usize, ApiError> {
    match requested.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)) {
        0 => Err(ApiError::BadRequest("limit must be positive".into())),
        n => Ok(n.min(max)),
    }
}

/// A new identifier, generated before proposing so apply stays deterministic: a uuid v7
/// (time-ordered, 74 random bits), so the records keyed by new ids land next to each other
/// in RocksDB's memtable and files instead of at random places.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Every route of the API but the notification channels ([`notify_router`]).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/cluster", get(probes::cluster))
        .route("/v1/openapi.json", get(crate::openapi::serve))
        .route("/v1/admin/cluster/members", get(cluster::list).post(cluster::add))
        .route("/v1/admin/cluster/members/{id}", axum::routing::delete(cluster::remove))
        .route("/v1/admin/backup", get(backup::backup))
        .route("/v1/admin/limits", get(crate::runtime_limits::get).put(crate::runtime_limits::put))
        .route("/v1/admin/blocks/{hash}", get(backup::block))
        .route("/v1/admin/users", post(accounts::create_user))
        .route("/v1/admin/users/{user_id}", get(accounts::get_user))
        .route("/v1/admin/users/{user_id}/tokens", post(accounts::create_token).get(accounts::list_tokens))
        .route("/v1/admin/users/{user_id}/tokens/{token_id}", axum::routing::delete(accounts::revoke_token))
        .route("/v1/login", post(login::login))
        .route("/v1/me/password", axum::routing::put(login::set_mine).delete(login::remove_mine))
        .route("/v1/admin/users/{user_id}/password", axum::routing::put(login::set_for).delete(login::remove_for))
        .route("/v1/me", get(accounts::me))
        .route("/v1/me/tokens", get(accounts::my_tokens))
        .route("/v1/me/webhook-secret", get(accounts::webhook_secret).post(accounts::rotate_webhook_secret))
        .route("/v1/me/tokens/{token_id}", axum::routing::delete(accounts::revoke_my_token))
        .route("/v1/blocks/status", post(blocks::status))
        .route("/v1/files", get(files::get))
        .route("/v1/files/commit", post(files::commit))
        .route("/v1/files/history", get(files::history))
        .route("/v1/files/restore", post(files::restore))
        .route("/v1/files/delete", post(files::delete))
        .route("/v1/files/move", post(files::move_file))
        .route("/v1/files/list", get(files::list))
        .route("/v1/links", post(links::create).get(links::list))
        .route("/v1/links/{link_id}", delete(links::revoke))
        .route("/v1/namespaces/{namespace_id}/links", get(links::list_in_namespace))
        .route("/v1/namespaces/{namespace_id}/links/{link_id}", delete(links::revoke_in_namespace))
        .route("/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/jobs/{job_id}", get(jobs::get).patch(jobs::patch).delete(jobs::cancel).post(jobs::action))
        .route("/v1/jobs/{job_id}/runs", get(jobs::runs))
        .route("/v1/sync", get(sync::sync).post(sync::sync_post))
        .route("/v1/namespaces", post(sharing::create).get(sharing::list))
        .route("/v1/namespaces/{namespace_id}", get(sharing::get_one).delete(sharing::delete))
        .route("/v1/namespaces/{namespace_id}/acl", get(sharing::acl).put(sharing::grant))
        .route("/v1/namespaces/{namespace_id}/acl/users/{user_id}", delete(sharing::revoke_user))
        .route("/v1/namespaces/{namespace_id}/acl/groups/{group_id}", delete(sharing::revoke_group))
        .route("/v1/namespaces/{namespace_id}/leave", post(sharing::leave))
        .route("/v1/namespaces/{namespace_id}/accept", post(sharing::accept))
        .route("/v1/namespaces/{namespace_id}/decline", post(sharing::decline))
        .route("/v1/me/invitations", get(sharing::invitations))
        .route("/v1/admin/groups", post(sharing::create_group).get(sharing::list_groups))
        .route("/v1/admin/groups/{group_id}", get(sharing::get_group))
        .route(
            "/v1/admin/groups/{group_id}/members/{user_id}",
            axum::routing::put(sharing::add_member).delete(sharing::remove_member),
        )
        .route(
            "/v1/blocks",
            post(content::post_block).layer(DefaultBodyLimit::max(raftbox_storage::blocks::BLOCK_BYTES_MAX)),
        )
        .route(
            "/v1/blocks/{hash}",
            get(blocks::get).put(blocks::put).layer(DefaultBodyLimit::max(raftbox_storage::blocks::BLOCK_BYTES_MAX)),
        )
        .fallback(|| async { crate::ApiError::NotFound("no such route".into()) })
}

/// The web console's page and files ([`crate::console`]), with its headers.
pub fn console_router() -> Router<AppState> {
    let pages =
        Router::new().route("/", get(crate::console::index)).route("/console/{file}", get(crate::console::asset));
    crate::headers::console(pages)
}

/// The routes that carry a whole file in one request, under the transfer deadline
/// (`crate::TRANSFER_DEADLINE`) instead of the request timeout.
/// They serve a user's files: with [`crate::headers::user_content`].
pub fn transfer_router() -> Router<AppState> {
    let routes = Router::new()
        .route("/v1/files/content", get(content::get).put(content::put))
        .route("/s/{token}", get(links::open))
        .route("/s/{token}/{*path}", get(links::open_under));
    crate::headers::user_content(routes)
}

/// The probes, outside the cap on requests in flight (a loaded node still says it is up).
pub fn probe_router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
}

/// The notification channels: a long poll bounds its own wait (at most
/// `NOTIFY_TIMEOUT_S_MAX`), and a WebSocket lives as long as its client.
pub fn notify_router() -> Router<AppState> {
    Router::new()
        .route("/v1/notify", get(sync::long_poll).post(sync::long_poll_post))
        .route("/v1/notify/ws", get(sync::websocket))
}
