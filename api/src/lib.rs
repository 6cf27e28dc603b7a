//! raftbox-api: the HTTP API of a node (axum).
//!
//! - [`error`]: `ApiError`, the only place errors become HTTP statuses (problem+json).
//! - [`access`]: who may do what: every route's permission check, through the one rule
//!   `raftbox_storage::sharing::role`.
//! - [`auth`]: bearer tokens: generation, hashing, the `Principal` extractor.
//! - [`json`]: request-body parsing with problem+json errors.
//! - [`idempotency`]: `Idempotency-Key` handling, declared per route through `Keyed`.
//! - [`ratelimit`]: configured rate limits, applied as middleware to matching routes.
//! - [`runtime_limits`]: the cluster's replicated rate limits, job limits and quotas
//!   (`/v1/admin/limits`), reloaded as they change.
//! - [`metrics`]: per-route request counts and latency histograms (middleware).
//! - [`routes`]: the handlers, one module per area (probes, accounts).
//! - [`console`]: the web console's static files (embedded), served at `/`.
//! - [`openapi`]: the OpenAPI 3.1 description of every route (`GET /v1/openapi.json`).
//!
//! Every handler talks to the cluster through [`raftbox_raft::RaftNode`]: writes are
//! commands proposed through the leader, reads are local after a read barrier.

pub mod access;
pub mod auth;
pub mod console;
pub mod dav;
pub mod error;
pub mod front_door;
pub mod fuzz;
pub mod headers;
pub mod idempotency;
pub mod json;
mod limit;
pub mod metrics;
pub mod notify;
pub mod openapi;
pub mod ratelimit;
pub mod routes;
pub mod runtime_limits;
pub mod schema;
pub mod spool;
pub mod webhooks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use raftbox_raft::RaftNode;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::map_request_body::MapRequestBodyLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

pub use error::ApiError;

/// What every handler can reach. Cloned for every request by each middleware and
/// extractor, so it is one shared pointer (cloning the fields one by one was about 2 % of a
/// node's CPU under the 256-client commit load).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The fields of [`AppState`].
pub struct Shared {
    pub node: RaftNode,
    pub config: Arc<ApiConfig>,
    /// Open notification channels (long polls and WebSockets), for their limits.
    pub channels: routes::sync::Channels,
    /// What each applied entry may have changed, for those channels.
    pub hub: notify::Hub,
    /// Per-route request counts and latencies, in the node's registry.
    pub http_metrics: metrics::HttpMetrics,
    /// Places for requests in flight, in all, per client and per user (`[http]`): a request
    /// beyond is answered 503 at once.
    pub in_flight: Arc<front_door::InFlight>,
    /// The rate limits, job limits and quotas in force (the cluster's, once set; this
    /// node's TOML before).
    pub limits: Arc<runtime_limits::Live>,
    /// The WebDAV locks this node granted.
    pub dav_locks: dav::Locks,
    /// Password hashing places and login attempt limits.
    pub passwords: routes::login::Passwords,
    /// The whole-file uploads spooling on this node.
    pub spools: spool::Spools,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Starts the node's notification hub: call within a Tokio runtime.
    pub fn new(node: RaftNode, config: ApiConfig) -> AppState {
        let http_metrics = metrics::HttpMetrics::new(node.node_metrics().registry());
        let channels = routes::sync::Channels::default();
        let in_flight = front_door::InFlight::new(&config.http);
        tokio::spawn(front_door::sample_forever(Arc::downgrade(&in_flight)));
        let hub = notify::Hub::start(&node);
        let own = config.limits_config();
        let in_force = runtime_limits::Limits {
            rate_limits: config.rate_limits.clone(),
            job_limits: config.job_limits.clone(),
            quotas: config.quotas.clone(),
        };
        let limits = Arc::new(runtime_limits::Live::new(own, in_force));
        // Subscribed before the first load, so a change applied meanwhile is heard.
        let applied = node.applied_events();
        limits.refresh(&node);
        tokio::spawn(runtime_limits::reload(node.clone(), limits.clone(), applied));
        let dav_locks = dav::Locks::default();
        AppState(Arc::new(Shared {
            node,
            config: Arc::new(config),
            channels,
            hub,
            http_metrics,
            in_flight,
            limits,
            dav_locks,
            passwords: routes::login::Passwords::default(),
            spools: spool::Spools::default(),
        }))
    }
}

/// The API's part of the node configuration.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    pub http: HttpConfig,
    pub idempotency: idempotency::IdempotencyConfig,
    pub rate_limiting: ratelimit::RateLimitingConfig,
    /// This node's TOML rate limits, job limits and quotas: in force until the cluster's are
    /// set ([`runtime_limits`]); the bootstrap node seeds the cluster's from them.
    pub rate_limits: Vec<ratelimit::RateLimit>,
    /// Where webhooks may go (checked at job creation and by the executor at each call).
    pub webhooks: webhooks::WebhookPolicy,
    /// What a non-admin's jobs may ask for.
    pub job_limits: JobLimits,
    /// How many notification channels may be open.
    pub notify_limits: NotifyLimits,
    /// What one non-admin user may store and own.
    pub quotas: Quotas,
}

impl ApiConfig {
    /// This node's TOML limits as written (what `GET /v1/admin/limits` shows before the
    /// cluster's are set, and what the bootstrap node seeds them with).
    pub fn limits_config(&self) -> runtime_limits::LimitsConfig {
        runtime_limits::LimitsConfig {
            rate_limits: self.rate_limits.iter().map(ratelimit::RateLimit::to_config).collect(),
            job_limits: self.job_limits.clone(),
            quotas: self.quotas.clone(),
        }
    }
}

/// Per-user quotas of non-admins (node TOML `[quotas]`), enforced in apply (the limit travels
/// in the command, so every node judges it alike).
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Bytes of blocks a user stores, each block counted once per user who uploaded it
    /// (507 `quota-exceeded` beyond). Default 100 GiB.
    pub stored_bytes_per_user: u64,
    /// Shared folders a user may have created and not deleted. Default 1,000.
    pub folders_per_user: u32,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas { stored_bytes_per_user: 100 << 30, folders_per_user: 1_000 }
    }
}

/// Open long polls and WebSockets allowed (node TOML `[notify_limits]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyLimits {
    pub per_principal_max: usize,
    pub per_node_max: usize,
}

impl Default for NotifyLimits {
    fn default() -> NotifyLimits {
        NotifyLimits { per_principal_max: 64, per_node_max: 10_000 }
    }
}

/// Limits on non-admins' jobs (node TOML `[job_limits]`).
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JobLimits {
    /// The shortest interval between two fires of a recurring job, in seconds.
    pub min_cron_interval_s: u64,
    /// Jobs an owner may have that may still run (scheduled, claimed or running).
    pub active_jobs_per_owner_max: usize,
}

impl Default for JobLimits {
    fn default() -> JobLimits {
        JobLimits { min_cron_interval_s: 60, active_jobs_per_owner_max: 256 }
    }
}

/// HTTP settings (node TOML `[http]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Every request but the notification channels (which bound themselves) answers within
    /// this many ms, or 503.
    pub request_timeout_ms: u64,
    /// Requests a node serves at once, notification channels aside (those have
    /// `[notify_limits]`); beyond, 503 with `Retry-After` at once.
    pub requests_in_flight_max: usize,
    /// Of those, what one client address may hold (an IPv6 /64 counts as one address).
    pub requests_in_flight_per_client_max: usize,
    /// Of those, what one user may hold (admins aside).
    pub requests_in_flight_per_user_max: usize,
    /// Reverse proxies whose `X-Forwarded-For` names the client (`front_door`); none by
    /// default, so every client is its connection's address.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Addresses that read `/metrics` without a token (anyone else needs the admin's):
    /// loopback by default.
    pub metrics_allow: Vec<ipnet::IpNet>,
    /// Connections a node holds open at once; beyond, a new one waits in the kernel's backlog
    /// until one closes.
    pub connections_max: usize,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            request_timeout_ms: 60_000,
            requests_in_flight_max: 1_024,
            requests_in_flight_per_client_max: 512,
            requests_in_flight_per_user_max: 256,
            trusted_proxies: Vec::new(),
            metrics_allow: ["127.0.0.0/8", "::1/128"].iter().filter_map(|net| net.parse().ok()).collect(),
            connections_max: 4_096,
        }
    }
}

/// The complete router of a node: every route, rate-limited where configured.
pub fn router(state: AppState) -> Router {
    router_with(Router::new(), state)
}

/// The node's routes plus `extra` (tests add some). What a request meets, in order: who the
/// client is (`front_door::identify`, every route), the front door (its client's share of
/// the places in flight, `front_door::admit`), the caller
/// found and the rate limits (`ratelimit::enforce`), the caller's share (`admit_user`), the
/// deadline, then its body, read with an idle bound. Probes and notification channels take
/// no place (they bound themselves). Every answer then gets the security headers.
pub fn router_with(extra: Router<AppState>, state: AppState) -> Router {
    let limiter = axum::middleware::from_fn_with_state(state.clone(), ratelimit::enforce);
    let timeout = axum::middleware::from_fn_with_state(state.clone(), request_timeout);
    let admit = axum::middleware::from_fn_with_state(state.clone(), front_door::admit);
    let admit_user = axum::middleware::from_fn_with_state(state.clone(), front_door::admit_user);
    let probes = routes::probe_router().layer(timeout.clone()).layer(limiter.clone());
    let bounded = routes::router()
        .merge(routes::console_router())
        .merge(extra)
        // One stack, one `layer` call (axum boxes every route once per call), outermost first.
        .layer(
            ServiceBuilder::new()
                .layer(admit.clone())
                .layer(limiter.clone())
                .layer(admit_user.clone())
                .layer(timeout)
                .layer(RequestBodyTimeoutLayer::new(BODY_IDLE))
                .layer(MapRequestBodyLayer::new(axum::body::Body::new)),
        );
    // WebDAV and the whole-file routes carry whole files in one request: a longer deadline,
    // and a longer wait for each piece of a body.
    let transfers = headers::user_content(dav::router()).merge(routes::transfer_router()).layer(
        ServiceBuilder::new()
            .layer(admit)
            .layer(limiter.clone())
            .layer(admit_user)
            .layer(axum::middleware::from_fn(transfer_timeout))
            .layer(RequestBodyTimeoutLayer::new(TRANSFER_BODY_IDLE))
            .layer(MapRequestBodyLayer::new(axum::body::Body::new)),
    );
    let app = bounded
        .merge(transfers)
        .merge(probes)
        .merge(routes::notify_router().layer(limiter))
        .layer(
            ServiceBuilder::new()
                .layer(axum::middleware::from_fn(error::problems_everywhere))
                .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
                .layer(axum::middleware::from_fn_with_state(state.clone(), front_door::identify)),
        )
        .with_state(state);
    headers::everywhere(app)
}

/// The longest wait for the next piece of a request body (a body that stalls longer fails,
/// and the request with it), on every route but those carrying whole files.
pub const BODY_IDLE: Duration = Duration::from_secs(10);
/// [`BODY_IDLE`] for the routes carrying whole files (WebDAV, `/v1/files/content`): a
/// large upload over a slow, busy link.
pub const TRANSFER_BODY_IDLE: Duration = Duration::from_secs(60);

/// How long one request carrying a whole file may take (WebDAV, `/v1/files/content`), body
/// included: a large file over a slow link. Every wait inside is bounded on its own as well.
pub const TRANSFER_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Answers 503 when the route has not answered within `[http] request_timeout_ms`. A write
/// still in flight then may or may not happen, and the answer says so.
async fn request_timeout(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit = Duration::from_millis(state.config.http.request_timeout_ms);
    answer_within(limit, "the request timeout", next.run(request)).await
}

/// [`request_timeout`] for the routes that carry whole files, with [`TRANSFER_DEADLINE`].
async fn transfer_timeout(request: Request, next: Next) -> Response {
    answer_within(TRANSFER_DEADLINE, "the deadline of whole-file transfers", next.run(request)).await
}

async fn answer_within(limit: Duration, what: &str, answer: impl Future<Output = Response>) -> Response {
    match tokio::time::timeout(limit, answer).await {
        Ok(response) => response,
        Err(_) => ApiError::Unavailable(format!(
            "no answer within {what} ({} ms); a write in flight may or may not happen",
            limit.as_millis()
        ))
        .into_response(),
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then drains open requests. With
/// the node's TLS ([`RaftNode::tls`]) it serves HTTPS only (HTTP/2 or 1.1 by ALPN; a
/// plaintext request gets no answer).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let connections_max = state.config.http.connections_max;
    let tls = state.node.tls().map(|tls| tls.http_server_config());
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    if let Some(config) = tls {
        let handle = axum_server::Handle::new();
        let stopper = handle.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopper.graceful_shutdown(None);
        });
        // TCP_NODELAY on every connection, then the handshake (axum-server bounds it: 10 s).
        let config = axum_server::tls_rustls::RustlsConfig::from_config(config);
        let acceptor =
            axum_server::tls_rustls::RustlsAcceptor::new(config).acceptor(axum_server::accept::NoDelayAcceptor::new());
        return axum_server::from_tcp(listener.into_std()?)?.acceptor(acceptor).handle(handle).serve(app).await;
    }
    // At most `connections_max` open; small responses must not wait for Nagle's algorithm.
    let listener = limit::Limited::new(listener, connections_max).tap_io(|tcp| {
        if let Err(e) = tcp.inner().set_nodelay(true) {
            tracing::debug!(error = %e, "set TCP_NODELAY");
        }
    });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
