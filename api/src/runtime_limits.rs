//! The cluster's runtime limits: rate limits, job limits and quotas, replicated (the
//! storage crate's `SetLimits`), so an operator changes them through the admin API or
//! `raftbox limits set` and every node applies the same ones within a second, without a
//! restart (as Envoy's ratelimit service reloads its configuration).
//!
//! - Until limits are set, a node uses its TOML's `[[rate_limits]]`, `[job_limits]` and
//!   `[quotas]`; the bootstrap node seeds the cluster's from them once the cluster's data
//!   format allows (`seed`), so a new cluster has one set from the start.
//! - A change is checked whole before it is proposed ([`LimitsConfig::validate`], the same
//!   checks as the TOML at start): one bad limit refuses all of it, and nothing changes.
//! - Each node loads them at start and reloads them as it applies a change ([`reload`], on
//!   the applied-entry events): they act on a node as soon as it has applied the entry.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use raftbox_raft::{Applied, RaftNode};
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use crate::auth::Principal;
use crate::ratelimit::{RateLimit, RateLimitConfig};
use crate::{json, ApiError, AppState, JobLimits, Quotas};

/// How long the bootstrap node waits between tries to seed the cluster's limits (while the
/// cluster has no quorum, or is not yet at format 3).
const SEED_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Rate limits in one set, at most (each request checks those matching its route).
pub const RATE_LIMITS_MAX: usize = 256;

/// The limits as an operator writes them: the node TOML's sections, or the same in JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default)]
    pub rate_limits: Vec<RateLimitConfig>,
    #[serde(default)]
    pub job_limits: JobLimits,
    #[serde(default)]
    pub quotas: Quotas,
}

/// Limits in force: checked, with the rate limits parsed.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub rate_limits: Vec<RateLimit>,
    pub job_limits: JobLimits,
    pub quotas: Quotas,
}

impl LimitsConfig {
    /// Checks every limit; the first problem, named, refuses the whole set.
    pub fn validate(&self) -> Result<Limits, String> {
        if self.rate_limits.len() > RATE_LIMITS_MAX {
            return Err(format!("at most {RATE_LIMITS_MAX} rate limits, not {}", self.rate_limits.len()));
        }
        let mut names = std::collections::BTreeSet::new();
        let mut rate_limits = Vec::with_capacity(self.rate_limits.len());
        for limit in &self.rate_limits {
            if !names.insert(limit.name.as_str()) {
                return Err(format!("rate limit name {:?} appears twice", limit.name));
            }
            rate_limits.push(limit.clone().validate()?);
        }
        let jobs = &self.job_limits;
        in_range("job_limits.min_cron_interval_s", jobs.min_cron_interval_s, 1, 86_400)?;
        in_range("job_limits.active_jobs_per_owner_max", jobs.active_jobs_per_owner_max as u64, 1, 10_000_000)?;
        in_range("quotas.stored_bytes_per_user", self.quotas.stored_bytes_per_user, 1, u64::MAX)?;
        in_range("quotas.folders_per_user", u64::from(self.quotas.folders_per_user), 1, 1_000_000)?;
        Ok(Limits { rate_limits, job_limits: self.job_limits.clone(), quotas: self.quotas.clone() })
    }
}

/// `value` of the setting `name` is within `min..=max`, or an error naming it.
pub fn in_range(name: &str, value: u64, min: u64, max: u64) -> Result<(), String> {
    if !(min..=max).contains(&value) {
        return Err(format!("{name} must be {min} to {max}, not {value}"));
    }
    Ok(())
}

/// Where the limits in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// This node's TOML: the cluster has none set (yet).
    NodeConfig,
    /// The cluster's replicated limits, at this revision.
    Cluster,
}

/// The limits a node enforces now, swapped whole when they change.
pub struct Live {
    current: RwLock<Arc<Limits>>,
    /// The revision of the cluster's limits in force (0: the node's own).
    revision: std::sync::atomic::AtomicU64,
    /// The node's TOML limits, as written: the seed, and what `GET` shows before any is set.
    own: LimitsConfig,
    /// A revision found unreadable here (not tried again); 0 for none.
    refused: std::sync::Mutex<u64>,
}

impl Live {
    pub fn new(own: LimitsConfig, limits: Limits) -> Live {
        Live { current: RwLock::new(Arc::new(limits)), revision: Default::default(), own, refused: Default::default() }
    }

    /// The limits in force.
    pub fn get(&self) -> Arc<Limits> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set(&self, limits: Limits, revision: u64) {
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(limits);
        self.revision.store(revision, std::sync::atomic::Ordering::SeqCst);
    }

    fn revision(&self) -> u64 {
        self.revision.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Swaps in the cluster's limits as `node` has applied them, if they differ from those in
    /// force. A record that does not check out (only a newer release's could) is refused
    /// once, loudly, and the limits in force stay.
    pub fn refresh(&self, node: &RaftNode) {
        let record = match node.state().limits() {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(e) => return tracing::warn!(error = %e, "could not read the cluster's limits"),
        };
        let mut refused = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if record.revision == self.revision() || record.revision == *refused {
            return;
        }
        match serde_json::from_value::<LimitsConfig>(record.limits)
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate())
        {
            Ok(limits) => {
                tracing::info!(revision = record.revision, "runtime limits in force");
                self.set(limits, record.revision);
            }
            Err(why) => {
                tracing::error!(revision = record.revision, %why, "the cluster's limits are unreadable here");
                *refused = record.revision;
            }
        }
    }
}

/// Keeps `live` in step with the cluster's limits as this node applies them: again whenever
/// an applied entry sets them or a snapshot replaces the state. Ends when the node's state
/// machine goes away. ([`AppState::new`](crate::AppState::new) loaded them first.)
pub async fn reload(node: RaftNode, live: Arc<Live>, mut applied: tokio::sync::broadcast::Receiver<Applied>) {
    loop {
        match applied.recv().await {
            Ok(Applied::Commands(commands)) if !commands.iter().any(sets_limits) => continue,
            Ok(_) | Err(RecvError::Lagged(_)) => live.refresh(&node),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Whether `command` (or the command it wraps) sets the limits.
fn sets_limits(command: &Command) -> bool {
    match command {
        Command::SetLimits { .. } => true,
        Command::Idempotent { command, .. } | Command::Once { command, .. } => sets_limits(command),
        _ => false,
    }
}

/// On the bootstrap node: seeds the cluster's limits from this node's TOML once the
/// cluster's format allows it (a seed never replaces limits set already).
pub async fn seed(node: RaftNode, own: LimitsConfig) {
    let limits = match serde_json::to_value(&own) {
        Ok(limits) => limits,
        Err(e) => return tracing::error!(error = %e, "could not encode this node's limits"),
    };
    loop {
        match node.write(Command::SetLimits { limits: limits.clone(), seed: true }).await {
            Ok(Outcome::Done) => {
                return tracing::info!("the cluster's limits are set (seeded from this node's TOML if none were)")
            }
            Ok(other) => return tracing::error!(outcome = ?other, "seeding the cluster's limits failed"),
            Err(raftbox_raft::WriteError::ShuttingDown) => return,
            Err(e) => tracing::debug!(error = %e, "limits not seeded yet; retrying"),
        }
        tokio::time::sleep(SEED_RETRY_INTERVAL).await;
    }
}

/// `GET /v1/admin/limits` and the answer of a change.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsView {
    pub source: Source,
    /// The revision of the cluster's limits (absent before any was set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// When they were set, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_at_ms: Option<u64>,
    /// The cluster's data format (limits change at runtime from format 3).
    pub cluster_format: u32,
    pub limits: LimitsConfig,
}

fn view(state: &AppState) -> Result<LimitsView, ApiError> {
    let cluster_format = state.node.cluster_format();
    match state.node.state().limits()? {
        Some(record) => {
            let limits = serde_json::from_value(record.limits)
                .map_err(|e| ApiError::Internal(format!("the cluster's limits are unreadable here: {e}")))?;
            Ok(LimitsView {
                source: Source::Cluster,
                revision: Some(record.revision),
                set_at_ms: Some(record.set_at_ms),
                cluster_format,
                limits,
            })
        }
        None => Ok(LimitsView {
            source: Source::NodeConfig,
            revision: None,
            set_at_ms: None,
            cluster_format,
            limits: state.limits.own.clone(),
        }),
    }
}

/// The limits in force (admin), after a read barrier.
pub async fn get(State(state): State<AppState>, principal: Principal) -> Result<Json<LimitsView>, ApiError> {
    principal.require_admin()?;
    state.node.read_barrier().await?;
    Ok(Json(view(&state)?))
}

/// Replaces the cluster's limits (admin): the body is a whole `LimitsConfig`, checked whole.
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    body: axum::body::Bytes,
) -> Result<Json<LimitsView>, ApiError> {
    principal.require_admin()?;
    let config: LimitsConfig = json::parse(&body)?;
    config.validate().map_err(|why| ApiError::BadRequest(format!("limits refused, nothing changed: {why}")))?;
    let limits = serde_json::to_value(&config).map_err(|e| ApiError::Internal(e.to_string()))?;
    match state.node.write(Command::SetLimits { limits, seed: false }).await? {
        Outcome::Done => {}
        other => return Err(ApiError::Internal(format!("unexpected outcome {other:?}"))),
    }
    // The leader applied it; this node shows it, and enforces it, once it has applied as far.
    state.node.read_barrier().await?;
    state.limits.refresh(&state.node);
    Ok(Json(view(&state)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_with_one_bad_limit_is_refused_whole_and_the_toml_shape_round_trips() {
        let text = r#"
            [[rate_limits]]
            name = "per-user"
            scope = "user"
            routes = ["/v1/*"]
            capacity = 10
            refill_per_s = 5

            [job_limits]
            min_cron_interval_s = 30

            [quotas]
            folders_per_user = 3
        "#;
        let config: LimitsConfig = toml::from_str(text).expect("parses");
        let limits = config.validate().expect("valid");
        assert_eq!(
            (limits.rate_limits.len(), limits.job_limits.min_cron_interval_s, limits.quotas.folders_per_user),
            (1, 30, 3)
        );
        let json = serde_json::to_value(&config).expect("encode");
        let back: LimitsConfig = serde_json::from_value(json).expect("decode");
        assert_eq!(back.validate().expect("valid").rate_limits, limits.rate_limits);

        let mut twice = config.clone();
        twice.rate_limits.push(config.rate_limits[0].clone());
        assert!(twice.validate().expect_err("refused").contains("appears twice"));
        let mut zero = config.clone();
        zero.quotas.folders_per_user = 0;
        assert!(zero.validate().expect_err("refused").contains("quotas.folders_per_user"));
        let mut bad = config;
        bad.rate_limits[0].refill_per_s = None;
        assert!(bad.validate().expect_err("refused").contains("needs refill_per_s"));
        assert!(serde_json::from_str::<LimitsConfig>(r#"{"quota": {}}"#).is_err(), "unknown sections are refused");
    }
}
