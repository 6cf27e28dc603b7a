//! raftbox-api: the HTTP API of a node (axum).
//!
//! - [`error`]: `ApiError`, the only place errors become HTTP statuses (problem+json).
//! - [`auth`]: bearer tokens: generation, hashing, the `Principal` extractor.
//! - [`json`]: request-body parsing with problem+json errors.
//! - [`idempotency`]: `Idempotency-Key` handling, declared per route through `Keyed`.
//! - [`ratelimit`]: configured rate limits, applied as middleware to matching routes.
//! - [`routes`]: the handlers, one module per area (probes, accounts).
//!
//! Every handler talks to the cluster through [`raftbox_raft::RaftNode`]: writes are
//! commands proposed through the leader, reads are local after a read barrier.

pub mod auth;
pub mod error;
pub mod idempotency;
pub mod json;
pub mod ratelimit;
pub mod routes;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use raftbox_raft::RaftNode;
use tokio::net::TcpListener;

pub use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub node: RaftNode,
    pub config: Arc<ApiConfig>,
}

/// The API's part of the node configuration.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    pub idempotency: idempotency::IdempotencyConfig,
    pub rate_limiting: ratelimit::RateLimitingConfig,
    pub rate_limits: Vec<ratelimit::RateLimit>,
}

/// The complete router of a node: every route, rate-limited where configured.
pub fn router(state: AppState) -> Router {
    router_with(routes::router(), state)
}

/// `routes` (the node's, possibly with more) behind the rate-limit middleware.
pub fn router_with(routes: Router<AppState>, state: AppState) -> Router {
    let limiter = axum::middleware::from_fn_with_state(state.clone(), ratelimit::enforce);
    routes.route_layer(limiter).with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves, then drains open requests.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Small responses must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set TCP_NODELAY");
        }
    });
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
