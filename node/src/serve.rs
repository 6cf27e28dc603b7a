//! `raftbox serve`: opens the database, starts Raft, serves gRPC (peers) and HTTP (clients),
//! bootstraps the cluster where configured, and shuts down gracefully on SIGTERM or Ctrl-C.

use std::time::Duration;

use anyhow::Context;
use raftbox_api::AppState;
use raftbox_raft::{RaftNode, WriteError};
use raftbox_storage::blocks::BlockStore;
use raftbox_storage::{Command, Db, Outcome};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Config, LogFormat};
use crate::{executor, maintenance};

/// Pause between attempts to register the admin token while the cluster has no quorum yet.
const ADMIN_RETRY_DELAY: Duration = Duration::from_millis(200);

/// The log on stderr, filtered by `RUST_LOG`: text, or one JSON object per line
/// (`--log-format json`: `timestamp`, `level`, `target`, `fields`, `span`s).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn,h2=warn,tower=warn,hyper=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).init(),
    }
}

pub async fn run(config: Config) -> anyhow::Result<()> {
    init_logging(config.log_format);
    let tls = match &config.tls {
        Some(tls) if tls.mutual() => "mutual",
        Some(_) => "server",
        None => "off",
    };
    tracing::info!(node_id = config.node_id, http = %config.http_addr, grpc = %config.grpc_addr,
        data_dir = %config.data_dir.display(), tls, cluster_secret = config.cluster_secret.is_set(),
        "starting raftbox node");

    let db = Db::open(&config.data_dir.join("db")).context("open database")?;
    let blocks = std::sync::Arc::new(BlockStore::open(&config.data_dir.join("blocks")).context("open block store")?);
    let node = RaftNode::start_with_tls(
        config.node_id,
        db,
        blocks,
        config.raft.clone(),
        config.cluster_secret.clone(),
        config.tls.clone(),
    )
    .await
    .context("start raft")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let grpc_listener =
        TcpListener::bind(config.grpc_addr).await.with_context(|| format!("bind gRPC {}", config.grpc_addr))?;
    let http_listener =
        TcpListener::bind(config.http_addr).await.with_context(|| format!("bind HTTP {}", config.http_addr))?;
    let grpc = tokio::spawn(raftbox_raft::serve(grpc_listener, node.clone(), stopped()));
    let state = AppState::new(node.clone(), config.api.clone());
    let http = tokio::spawn(raftbox_api::serve(http_listener, state, stopped()));
    tokio::spawn(maintenance::run(node.clone(), config.files.clone(), stopped()));
    let webhooks = config.api.webhooks.clone();
    tokio::spawn(executor::run(node.clone(), config.jobs.clone(), config.files.clone(), webhooks, stopped()));
    tokio::spawn(ensure_system_jobs(node.clone(), config.files.maintenance_interval_s));
    tokio::spawn(migrate_to_baseline(node.clone()));
    if config.bootstrap {
        tokio::spawn(raftbox_api::runtime_limits::seed(node.clone(), config.api.limits_config()));
        // In the background: it waits for every member to answer (raftbox_raft::membership).
        let (node, members) = (node.clone(), config.members.clone());
        tokio::spawn(async move {
            if let Err(e) = node.bootstrap(members).await {
                tracing::error!(error = %e, "bootstrap failed");
            }
        });
    }
    if let Some(path) = &config.admin_token_file {
        let token = std::fs::read_to_string(path).with_context(|| format!("read admin token {}", path.display()))?;
        tokio::spawn(ensure_admin(node.clone(), token.trim().to_string()));
    }

    wait_for_signal().await?;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    http.await.context("join HTTP server")?.context("HTTP server")?;
    grpc.await.context("join gRPC server")?.context("gRPC server")?;
    node.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("install SIGTERM handler")?;
    tokio::select! {
        _ = terminate.recv() => {}
        result = tokio::signal::ctrl_c() => result.context("wait for Ctrl-C")?,
    }
    Ok(())
}

/// Brings the replicated data up to the format every supported release reads
/// (`storage::format::BASELINE`; once done it changes nothing, so every node proposes it at
/// start); retries until the cluster has a quorum. The leader raises it further once every
/// member reads the newer format (`raft::format`).
async fn migrate_to_baseline(node: RaftNode) {
    let schema = raftbox_storage::format::BASELINE;
    loop {
        match node.write(Command::Migrate { schema }).await {
            Ok(Outcome::Done) => return tracing::info!(schema, "stored data is at the baseline format"),
            Ok(other) => return tracing::error!(outcome = ?other, "stored data could not be migrated"),
            Err(WriteError::ShuttingDown) => return,
            Err(e) => tracing::debug!(error = %e, "migration not proposed yet; retrying"),
        }
        tokio::time::sleep(ADMIN_RETRY_DELAY).await;
    }
}

/// Makes sure an admin user holding `token` exists; retries until the cluster has a quorum.
async fn ensure_admin(node: RaftNode, token: String) {
    let token_hash = raftbox_api::auth::hash_token(&token);
    loop {
        let command = Command::EnsureAdmin {
            user_id: uuid::Uuid::new_v4().to_string(),
            namespace_id: uuid::Uuid::new_v4().to_string(),
            token_id: uuid::Uuid::new_v4().to_string(),
            token_hash,
        };
        match node.write(command).await {
            Ok(Outcome::AdminReady { user_id }) => {
                tracing::info!(%user_id, "admin token registered");
                return;
            }
            Ok(other) => {
                tracing::error!(outcome = ?other, "admin token could not be registered");
                return;
            }
            Err(WriteError::ShuttingDown) => return,
            Err(e) => tracing::debug!(error = %e, "admin token not registered yet; retrying"),
        }
        tokio::time::sleep(ADMIN_RETRY_DELAY).await;
    }
}

/// Makes sure the built-in maintenance jobs exist with the configured interval (creating an
/// existing one changes nothing; one with another interval — the setting changed — gets the
/// new schedule); retries until the cluster has a quorum.
async fn ensure_system_jobs(node: RaftNode, interval_s: u64) {
    for task in 0..executor::system_jobs(interval_s, 0).len() {
        loop {
            // The first fire is counted from the cluster's time, read after the barrier (so
            // from a stamp at least as new as the cluster's when it began).
            let barrier = node.read_barrier().await;
            let job = executor::system_jobs(interval_s, node.cluster_now_ms()).swap_remove(task);
            let written = match barrier.map(|()| node.state().job(&job.id)) {
                Err(e) => Err(e),
                Ok(Ok(Some(existing))) if existing.schedule == job.schedule => break,
                Ok(Ok(Some(_))) => {
                    let patch = raftbox_storage::jobs::JobPatch {
                        schedule: Some(job.schedule.clone()),
                        next_run_at_ms: job.next_run_at_ms,
                        ..Default::default()
                    };
                    tracing::info!(job = %job.id, "maintenance interval changed; rescheduling");
                    node.write(Command::PatchJob { job_id: job.id.clone(), patch: Box::new(patch) }).await
                }
                Ok(Ok(None)) => node.write(Command::CreateJob(Box::new(job.clone()))).await,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, job = %job.id, "reading a system job");
                    break;
                }
            };
            match written {
                Ok(_) => break,
                Err(WriteError::ShuttingDown) => return,
                Err(e) => tracing::debug!(error = %e, "system job not ensured yet; retrying"),
            }
            tokio::time::sleep(ADMIN_RETRY_DELAY).await;
        }
    }
}
