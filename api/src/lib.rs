//! raftbox-api: the HTTP API of a node (axum).
//!
//! - [`error`]: `ApiError`, the only place errors become HTTP statuses (problem+json).
//! - [`auth`]: bearer tokens: generation, hashing, the `Principal` extractor.
//! - [`json`]: request-body parsing with problem+json errors.
//! - [`routes`]: the handlers, one module per area (probes, accounts).
//!
//! Every handler talks to the cluster through [`raftbox_raft::RaftNode`]: writes are
//! commands proposed through the leader, reads are local after a read barrier.

pub mod auth;
pub mod error;
pub mod json;
pub mod routes;

use std::future::Future;

use axum::Router;
use raftbox_raft::RaftNode;
use tokio::net::TcpListener;

pub use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub node: RaftNode,
}

/// The complete router of a node.
pub fn router(state: AppState) -> Router {
    routes::router().with_state(state)
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
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
