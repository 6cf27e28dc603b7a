//! Per-route HTTP metrics: `raftbox_http_requests_total{route,method,status}`,
//! `raftbox_http_request_duration_seconds{route,method}` and the rate limiter's
//! `raftbox_ratelimit_decisions_total{decision}`, in the node's registry (rendered on
//! `/metrics` with the Raft series, see `raftbox_raft::metrics`). `route` is the matched route
//! template (`/v1/jobs/{job_id}`), never the raw path, so the series stay few; a request no
//! route matched counts as `unmatched`.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tokio::time::Instant;

use crate::AppState;

/// The route label of requests no route matched.
const UNMATCHED: &str = "unmatched";

/// The HTTP series; cloning shares them.
#[derive(Clone)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    /// Rate-limit decisions on requests a configured limit applies to, by `decision`.
    limiter: IntCounterVec,
}

/// A rate-limit decision as counted in `raftbox_ratelimit_decisions_total{decision}`.
#[derive(Debug, Clone, Copy)]
pub enum LimiterDecision {
    Admitted,
    Rejected,
    /// The limiter did not decide in time; the limit fails open (admitted).
    UndecidedOpen,
    /// The limiter did not decide in time; the limit fails closed (503).
    UndecidedClosed,
}

impl LimiterDecision {
    fn label(self) -> &'static str {
        match self {
            LimiterDecision::Admitted => "admitted",
            LimiterDecision::Rejected => "rejected",
            LimiterDecision::UndecidedOpen => "undecided_open",
            LimiterDecision::UndecidedClosed => "undecided_closed",
        }
    }
}

impl HttpMetrics {
    /// The series, registered in `registry`. Registering twice in one registry (a second API
    /// over the same node) keeps the second unregistered, with a warning.
    pub fn new(registry: &Registry) -> HttpMetrics {
        let requests = IntCounterVec::new(
            Opts::new("raftbox_http_requests_total", "HTTP requests answered, by route template, method and status."),
            &["route", "method", "status"],
        )
        .expect("valid counter");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "raftbox_http_request_duration_seconds",
                "Time from a request's arrival to its answer's head, by route template and method.",
            )
            .buckets(vec![
                0.000_25, 0.000_5, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5, 5.0,
                10.0,
            ]),
            &["route", "method"],
        )
        .expect("valid histogram");
        let limiter = IntCounterVec::new(
            Opts::new(
                "raftbox_ratelimit_decisions_total",
                "Rate-limit decisions on requests a configured limit applies to: admitted, rejected (429), \
                 undecided_open (admitted without a decision), undecided_closed (503).",
            ),
            &["decision"],
        )
        .expect("valid counter");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(limiter.clone()),
        ] {
            if let Err(e) = registry.register(collector) {
                tracing::warn!(error = %e, "HTTP metrics not registered");
            }
        }
        HttpMetrics { requests, duration, limiter }
    }

    /// Counts one rate-limit decision.
    pub fn limiter_decision(&self, decision: LimiterDecision) {
        self.limiter.with_label_values(&[decision.label()]).inc();
    }
}

/// Middleware: counts and times every request by its matched route.
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = request.extensions().get::<MatchedPath>().map_or(UNMATCHED, |m| m.as_str()).to_owned();
    let method = request.method().as_str().to_owned();
    let response = next.run(request).await;
    let metrics = &state.http_metrics;
    metrics.duration.with_label_values(&[&route, &method]).observe(start.elapsed().as_secs_f64());
    metrics.requests.with_label_values(&[&route, &method, response.status().as_str()]).inc();
    response
}
