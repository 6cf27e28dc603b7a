//! `raftbox sync DIR`: keeps a local folder and a namespace in step, both ways, until stopped.
//!
//! - [`state`]: the local state database (cursor; per file the version and chunks synced).
//! - [`ignore_rules`]: `.raftboxignore` and the client's own files.
//! - [`scan`]: the local walk, local ↔ remote paths, the file watcher.
//! - [`remote`]: endpoints and failover, the change feed, writes with certain outcomes,
//!   notifications (WebSocket, else long-poll).
//! - [`transfer`]: chunking and upload of missing chunks; atomic downloads reusing local chunks.
//! - [`engine`]: one pass: pull, push, pull; the rules that turn concurrent edits into
//!   conflicted copies and never overwrite an unsynced local edit.
//!
//! The loop runs a pass at start, then whenever the watcher or the notification channel
//! wakes it (after a short pause that gathers a burst of events), and at least every
//! `--interval` seconds (a full rescan and a `/v1/sync` read: the backstop for anything a
//! watcher or a notification missed). A failed pass is retried with a growing pause.

mod engine;
mod ignore_rules;
mod remote;
mod scan;
mod state;
mod transfer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::client::Connection;
use engine::{Engine, Tally};
use remote::Remote;
use state::StateDb;

/// Pause after a wake-up, gathering the rest of a burst of changes into one pass.
const SETTLE: Duration = Duration::from_millis(200);
/// Longest pause before retrying after a failed pass.
const RETRY_WAIT_MAX: Duration = Duration::from_secs(10);

/// `raftbox sync`'s arguments (its help text is on the subcommand in `main.rs`).
#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    #[command(flatten)]
    connection: Connection,
    /// The local folder to keep in step (created if missing).
    dir: PathBuf,
    /// Node HTTP addresses, in order of preference (repeat, or separate with commas); when
    /// one cannot be reached the client moves to the next. Default: --url.
    #[arg(long = "endpoint", value_delimiter = ',', value_name = "URL")]
    endpoints: Vec<String>,
    /// Sync this namespace (a shared folder's id, see `raftbox share ls`) instead of your
    /// personal one.
    #[arg(long, env = "RAFTBOX_NAMESPACE")]
    namespace: Option<String>,
    /// Device name used in conflicted copies (X-Device-Id); default: the token's name.
    #[arg(long, env = "RAFTBOX_DEVICE")]
    device: Option<String>,
    /// State database file (default DIR/.raftbox/state.redb). One per folder and namespace.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// One pass (pull, push, pull), then exit: status 0 only if everything synced.
    #[arg(long)]
    once: bool,
    /// Seconds between full rescans and feed reads when nothing woke the client.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    interval: u64,
}

pub async fn run(args: SyncArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    let root = args.dir.canonicalize().with_context(|| format!("open {}", args.dir.display()))?;
    if !root.is_dir() {
        anyhow::bail!("{} is not a folder", root.display());
    }
    let urls: Vec<String> = match args.endpoints.iter().map(|u| u.trim()).filter(|u| !u.is_empty()).count() {
        0 => vec![args.connection.url().to_string()],
        _ => args.endpoints.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect(),
    };
    for url in &urls {
        let parsed = url::Url::parse(url).with_context(|| format!("endpoint {url:?} is not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            anyhow::bail!("endpoint {url}: an http:// or https:// address is needed");
        }
    }
    let remote = Arc::new(Remote::new(&args.connection, args.device.clone(), &urls, args.namespace.clone())?);
    let state_path = args.state.clone().unwrap_or_else(|| root.join(ignore_rules::STATE_DIR).join("state.redb"));
    let db = StateDb::open(&state_path)?;
    let namespace = match &args.namespace {
        Some(ns) => ns.clone(),
        None => remote.personal_namespace().await.context("find your personal namespace")?,
    };
    db.bind_namespace(&namespace)?;
    for path in db.resolve_pending(|path| scan::Meta::read(&scan::local_path(&root, path)))? {
        eprintln!("sync: {path}: the download cut short by the last stop had completed");
    }
    let mut engine = Engine::new(root.clone(), db, remote.clone(), namespace.clone())?;
    eprintln!("sync: {} ⇄ namespace {namespace} via {}", root.display(), urls.join(", "));
    if args.once {
        let started = Instant::now();
        let tally = engine.pass().await?;
        eprintln!("{}", progress_line(&tally, started.elapsed()));
        return Ok(());
    }

    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let _watcher = scan::watch(&root, wake_tx.clone())?;
    let (cursor_tx, cursor_rx) = tokio::sync::watch::channel(engine.cursor()?);
    let notifier = {
        let remote = remote.clone();
        tokio::spawn(async move { remote.notifications(cursor_rx, wake_tx).await })
    };
    let interval = Duration::from_secs(args.interval.max(1));
    let mut failures = 0u32;
    let result = loop {
        let started = Instant::now();
        let wait = match engine.pass().await {
            Ok(tally) => {
                failures = 0;
                if tally.any() {
                    eprintln!("{}", progress_line(&tally, started.elapsed()));
                }
                interval
            }
            Err(error) => {
                failures += 1;
                let wait = (Duration::from_millis(500) * 2u32.saturating_pow(failures - 1)).min(RETRY_WAIT_MAX);
                eprintln!("sync: {error:#}; trying again in {:.1} s", wait.as_secs_f64());
                wait
            }
        };
        let _ = cursor_tx.send(engine.cursor()?);
        if failures > 0 {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = tokio::signal::ctrl_c() => break Ok(()),
            }
            while wake_rx.try_recv().is_ok() {}
            continue;
        }
        tokio::select! {
            woken = wake_rx.recv() => {
                if woken.is_none() {
                    break Ok(());
                }
                tokio::time::sleep(SETTLE).await;
                while wake_rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::signal::ctrl_c() => break Ok(()),
        }
    };
    notifier.abort();
    eprintln!("sync: stopped");
    result
}

/// The pass's summary for stderr.
fn progress_line(t: &Tally, took: Duration) -> String {
    let seconds = took.as_secs_f64().max(0.001);
    let mb = |bytes: u64| bytes as f64 / 1e6;
    format!(
        "sync: pass done in {seconds:.1} s · ↑ {} files, {} chunks, {:.1} MB ({:.1} MB/s) · ↓ {} files, {} chunks \
         fetched ({:.1} MB), {} reused · {} moved · {} deleted here, {} there · {} conflicts",
        t.up_files,
        t.up_chunks,
        mb(t.up_bytes),
        mb(t.up_bytes) / seconds,
        t.down_files,
        t.down_chunks,
        mb(t.down_bytes),
        t.reused_chunks,
        t.moved,
        t.deleted_here,
        t.deleted_there,
        t.conflicts
    )
}
