//! `raftbox sync DIR`: keeps a local folder and a namespace in step, both ways, until stopped;
//! `raftbox sync status|confirm-deletes|trash` look after it.
//!
//! The promise (README "Syncing a folder"): every byte a user wrote survives somewhere they
//! can find it — the file, a conflicted copy, the server's history or the local trash — and
//! the client never writes outside its folder.
//!
//! - [`folder`]: the folder on disk through descriptors that never follow a link; the walk,
//!   the checked swap, the file system's probes.
//! - [`identity`]: the folder marker and inode, checked before every pass.
//! - [`names`]: server paths checked before they reach the disk; temporary names.
//! - [`local_names`]: where each server path lives locally where names fold.
//! - [`state`]: the local state database (cursor; per file what was synced; failures).
//! - [`ignore_rules`]: `.raftboxignore` (local only) and the defaults.
//! - [`remote`]: endpoints and failover, the change feed, writes with certain outcomes,
//!   notifications (WebSocket, else long-poll).
//! - [`transfer`]: chunking and upload of missing chunks; resumable downloads reusing local
//!   chunks.
//! - [`engine`]: one pass and its rules; `push` is its upload half.
//! - [`trash`]: the local trash; [`status`]: the status file; [`watch`]: the file watcher.
//!
//! The loop runs a pass at start, then whenever the watcher or the notification channel
//! wakes it (after a short pause that gathers a burst of events), and at least every
//! `--interval` seconds (a full rescan and a `/v1/sync` read: the backstop for anything a
//! watcher or a notification missed). A pass that could not reach the cluster is retried
//! with a growing pause; a paused folder is looked at again every few seconds.

mod engine;
mod folder;
mod identity;
mod ignore_rules;
mod local_names;
mod names;
mod remote;
mod state;
mod status;
mod transfer;
mod trash;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::signal::unix::{signal, SignalKind};

use crate::client::Connection;
use crate::files_client::{parse_rate, Throttle};
use engine::{Engine, Options, PassEnd, Tally};
use remote::Remote;
use state::StateDb;
use status::{Status, StatusDir};

/// Pause after a wake-up, gathering the rest of a burst of changes into one pass.
const SETTLE: Duration = Duration::from_millis(200);
/// Longest pause before retrying after a pass that could not reach the cluster.
const RETRY_WAIT_MAX: Duration = Duration::from_secs(10);
/// How often a paused folder is looked at again.
const PAUSED_RECHECK: Duration = Duration::from_secs(5);
/// Passes `--once` adds while files are being written.
const ONCE_BUSY_RETRIES: usize = 5;
/// The exit status when the namespace can no longer be read (a systemd unit's
/// `RestartPreventExitStatus=3` keeps it stopped).
const EXIT_REMOVED: i32 = 3;

/// `raftbox sync`'s arguments (its help text is on the subcommand in `main.rs`).
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SyncArgs {
    #[command(subcommand)]
    command: Option<SyncCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum SyncCommand {
    /// What the client of DIR is doing: up to date, paused and why, files that failed and
    /// why, deletions held, local changes not sent.
    Status(FolderArgs),
    /// Lets the client of DIR go on with the deletions the mass-delete guard held.
    ConfirmDeletes(FolderArgs),
    /// The local trash of DIR: files the client replaced or deleted, kept --trash-days.
    #[command(subcommand)]
    Trash(TrashCommand),
}

#[derive(clap::Args, Debug)]
struct FolderArgs {
    /// The synced folder.
    dir: PathBuf,
    /// Its state database, if not the default DIR/.raftbox/state.redb.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum TrashCommand {
    /// List the trash, oldest first: id, when, size, where it was, why it was moved.
    Ls {
        /// The synced folder.
        dir: PathBuf,
    },
    /// Put an item back where it was (or at --to, relative to DIR); never over a file.
    Restore {
        /// The synced folder.
        dir: PathBuf,
        /// The item's id (see `trash ls`).
        id: String,
        /// Where to put it instead, relative to DIR.
        #[arg(long)]
        to: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    connection: Connection,
    /// The local folder to keep in step. Created only at its first setup; afterwards a
    /// missing or replaced folder pauses syncing until it is back.
    dir: Option<PathBuf>,
    /// Node HTTP addresses, in order of preference (repeat, or separate with commas); when
    /// one cannot be reached the client moves to the next. Default: --url.
    #[arg(long = "endpoint", value_delimiter = ',', value_name = "URL")]
    endpoints: Vec<String>,
    /// Sync this namespace (a shared folder's id, see `raftbox share ls`) instead of your
    /// personal one.
    #[arg(long, env = "RAFTBOX_NAMESPACE", value_parser = crate::client::id)]
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
    /// Send nothing: changes made here are reported, not uploaded (a viewer's folder is
    /// always so).
    #[arg(long)]
    receive_only: bool,
    /// In a receive-only folder, put the server's versions back over the local changes (the
    /// changed files go to the trash).
    #[arg(long)]
    revert: bool,
    /// Go on with deletions the mass-delete guard would hold, this once.
    #[arg(long)]
    confirm_deletes: bool,
    /// The mass-delete guard: hold a pass that would delete more files than this on the
    /// server…
    #[arg(long, default_value_t = 1000, value_name = "N")]
    max_deletes: usize,
    /// …or more than this share of the synced files (once more than 10).
    #[arg(long, default_value_t = 50, value_name = "PERCENT", value_parser = clap::value_parser!(u64).range(1..=100))]
    max_delete_percent: u64,
    /// Compare the whole folder with the server's tree by content before going on (what the
    /// client does by itself after a cursor reset): what the server lacks goes up, nothing
    /// is skipped by version number.
    #[arg(long)]
    rescan: bool,
    /// Adopt DIR as the folder even though it is not the one set up (restored from a backup,
    /// copied to a new disk); its files are compared with the server's by content.
    #[arg(long)]
    accept_folder: bool,
    /// Upload at most this many bytes per second (`500K`, `2M`).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    limit_up: Option<u64>,
    /// Download at most this many bytes per second (`500K`, `2M`).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    limit_down: Option<u64>,
    /// Days the local trash keeps what the client replaced or deleted.
    #[arg(long, default_value_t = 30, value_name = "DAYS")]
    trash_days: u64,
}

pub async fn run(args: SyncArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SyncCommand::Status(f)) => {
            let status = status::read(&status::path_beside(&state_path(&f.dir, f.state.as_deref())))?;
            print!("{}", status::render(&status));
            Ok(())
        }
        Some(SyncCommand::ConfirmDeletes(f)) => confirm_deletes(&f),
        Some(SyncCommand::Trash(TrashCommand::Ls { dir })) => {
            for item in trash::Trash::at(&dir)?.list()? {
                let when = chrono::DateTime::from_timestamp_millis(item.label.trashed_ms as i64)
                    .map_or_else(String::new, |t| t.format("%Y-%m-%d %H:%M:%S").to_string());
                println!("{}  {when}  {:>12}  {}  ({})", item.id, item.size, item.label.path, item.label.reason);
            }
            Ok(())
        }
        Some(SyncCommand::Trash(TrashCommand::Restore { dir, id, to })) => {
            let went = trash::Trash::at(&dir)?.restore(&dir, &id, to.as_deref())?;
            println!("restored {id} to {went}");
            Ok(())
        }
        None => sync(args.run).await,
    }
}

/// The state database of the folder `dir`.
fn state_path(dir: &Path, state: Option<&Path>) -> PathBuf {
    state.map_or_else(|| dir.join(names::STATE_DIR).join("state.redb"), Path::to_path_buf)
}

fn confirm_deletes(f: &FolderArgs) -> anyhow::Result<()> {
    let state = state_path(&f.dir, f.state.as_deref());
    let status = status::read(&status::path_beside(&state))?;
    let held = status.report.held_deletes.first().context("no deletions are held for this folder")?;
    if status.report.held_fingerprint.is_empty() {
        bail!("no deletions are held for this folder");
    }
    std::fs::write(status::confirm_path_beside(&state), &status.report.held_fingerprint)?;
    println!(
        "{held}: confirmed; the client goes on with exactly these at its next pass (if the set changed \
         meanwhile it asks again)"
    );
    Ok(())
}

/// Ctrl-C and SIGTERM: the first stops the client cleanly (a pass in flight is dropped at
/// its next await; everything it did is recorded, and a kill at any point is safe anyway),
/// the second at once.
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    fn install() -> anyhow::Result<Stop> {
        let mut interrupt = signal(SignalKind::interrupt()).context("listen for Ctrl-C")?;
        let mut terminate = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            tokio::select! { _ = interrupt.recv() => {}, _ = terminate.recv() => {} }
            eprintln!("sync: stopping (Ctrl-C again to stop at once)");
            let _ = tx.send(true);
            tokio::select! { _ = interrupt.recv() => {}, _ = terminate.recv() => {} }
            eprintln!("sync: stopped at once");
            std::process::exit(130);
        });
        Ok(Stop(rx))
    }

    fn requested(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(&mut self) {
        while !*self.0.borrow_and_update() {
            if self.0.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The endpoints given (or `--url`), checked.
fn endpoints(args: &RunArgs) -> anyhow::Result<Vec<String>> {
    let given: Vec<String> = args.endpoints.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
    let urls = if given.is_empty() { vec![args.connection.url().to_string()] } else { given };
    for url in &urls {
        let parsed = url::Url::parse(url).with_context(|| format!("endpoint {url:?} is not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            bail!("endpoint {url}: an http:// or https:// address is needed");
        }
    }
    Ok(urls)
}

/// The folder, made only at its first setup (no state database, and never set up on this
/// machine before); a folder set up before but missing, or missing its state (a drive not
/// mounted at its mount point), is waited for, unless `accept` says to set it up anew.
async fn find_folder(
    dir: &Path,
    state: &Path,
    accept: bool,
    once: bool,
    stop: &mut Stop,
) -> anyhow::Result<Option<PathBuf>> {
    let mut told = false;
    loop {
        let known = identity::was_set_up(dir) && !accept;
        if dir.exists() && (state.exists() || !known) {
            let root = dir.canonicalize().with_context(|| format!("open {}", dir.display()))?;
            if !root.is_dir() {
                bail!("{} is not a folder", root.display());
            }
            return Ok(Some(root));
        }
        if !dir.exists() && !state.exists() && !known {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            eprintln!("sync: created {} (first setup)", dir.display());
            continue;
        }
        let why = if dir.exists() {
            format!(
                "{} was set up before but its state is gone (a drive not mounted at its mount point?); waiting \
                 for it. To set it up anew here, start with --accept-folder",
                dir.display()
            )
        } else {
            format!(
                "{} is missing but was set up before (moved, deleted, or its drive is not mounted); waiting for \
                 it. To set it up anew, start with --accept-folder",
                dir.display()
            )
        };
        if once {
            bail!("{why}");
        }
        if !told {
            eprintln!("sync: {why}");
            told = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(PAUSED_RECHECK) => {}
            _ = stop.wait() => return Ok(None),
        }
    }
}

async fn sync(args: RunArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().context("give the folder to sync: raftbox sync DIR (see --help)")?;
    let dir = std::path::absolute(&dir).with_context(|| format!("resolve {}", dir.display()))?;
    let state_path = state_path(&dir, args.state.as_deref());
    let mut stop = Stop::install()?;
    let found = find_folder(&dir, &state_path, args.accept_folder, args.once, &mut stop).await?;
    let Some(root) = found else { return Ok(()) };
    let urls = endpoints(&args)?;
    let mut remote = Remote::new(&args.connection, args.device.clone(), &urls, args.namespace.clone())?;
    remote.up = args.limit_up.map(Throttle::new);
    remote.down = args.limit_down.map(Throttle::new);
    let remote = Arc::new(remote);
    let db = StateDb::open(&state_path)?;
    let folder = folder::Folder::open(&root, args.trash_days)?;
    identity::setup(&folder, &db, args.accept_folder)?;
    if args.rescan {
        db.begin_reconcile()?;
    }
    if folder.caps.folds_names() {
        eprintln!(
            "sync: {} folds names (case-insensitive or normalising): colliding names are kept apart",
            root.display()
        );
    }
    let namespace = match &args.namespace {
        Some(ns) => ns.clone(),
        None => remote.personal_namespace().await.context("find your personal namespace")?,
    };
    db.bind_namespace(&namespace)?;
    let options = Options {
        receive_only: args.receive_only,
        revert: args.revert,
        max_deletes: args.max_deletes,
        max_delete_percent: args.max_delete_percent,
    };
    let mut engine = Engine::new(folder, db, remote.clone(), namespace.clone(), args.namespace.is_none(), options)?;
    if args.confirm_deletes {
        *engine.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine::Confirmation::Any);
    }
    eprintln!("sync: {} ⇄ namespace {namespace} via {}", root.display(), urls.join(", "));
    let status_dir = StatusDir::open(&state_path)?;
    let mut status = Status {
        folder: root.display().to_string(),
        namespace: namespace.clone(),
        state: "starting".into(),
        ..Status::default()
    };
    let _ = status_dir.write(&status);
    if args.once {
        return once(&mut engine, &mut status, &status_dir).await;
    }
    let result = keep_in_step(&mut engine, &mut status, &status_dir, &remote, &args, &mut stop).await;
    engine.db.flush()?;
    if let Err(removed) = &result {
        if removed.downcast_ref::<Removed>().is_some() {
            eprintln!("sync: {removed:#}");
            std::process::exit(EXIT_REMOVED);
        }
    }
    result
}

/// The namespace can no longer be read: the client stops.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Removed(String);

async fn once(engine: &mut Engine, status: &mut Status, status_dir: &StatusDir) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut end = engine.pass().await?;
    // Files being written are looked at again once they have been still for a moment; the
    // summary counts every pass.
    let mut total = Tally::default();
    for _ in 0..ONCE_BUSY_RETRIES {
        match &end {
            PassEnd::Synced(tally) if tally.busy > 0 => {
                total.add(tally);
                tokio::time::sleep(Duration::from_nanos(engine.folder.caps.racy_window_ns) + SETTLE).await;
                end = engine.pass().await?;
            }
            _ => break,
        }
    }
    if let PassEnd::Synced(last) = &mut end {
        total.add(last);
        total.busy = last.busy;
        *last = total;
    }
    record(engine, status, status_dir, &end);
    match end {
        PassEnd::Synced(tally) => {
            eprintln!("{}", progress_line(&tally, started.elapsed()));
            let failed = engine.db.failures()?.len();
            if failed > 0 {
                bail!("{failed} file(s) did not sync (see `raftbox sync status`)");
            }
            if tally.busy > 0 {
                bail!("{} file(s) were being written and were left for the next pass", tally.busy);
            }
            let report = engine.report();
            if let Some(held) = report.held_deletes.first() {
                bail!("{held} by the mass-delete guard (see `raftbox sync status`)");
            }
            Ok(())
        }
        PassEnd::Paused(why) => bail!("{why}"),
        PassEnd::Removed(why) => {
            eprintln!("sync: {why}");
            std::process::exit(EXIT_REMOVED);
        }
    }
}

/// Updates and writes the status after a pass.
fn record(engine: &Engine, status: &mut Status, status_dir: &StatusDir, end: &PassEnd) {
    let (state, reason) = match end {
        PassEnd::Synced(_) => ("up to date", None),
        PassEnd::Paused(why) => ("paused", Some(why.clone())),
        PassEnd::Removed(why) => ("stopped", Some(why.clone())),
    };
    status.state = state.to_string();
    status.reason = reason;
    if let PassEnd::Synced(tally) = end {
        status.last_pass = Some(*tally);
    }
    status.read_only = engine.options.receive_only || engine.access == remote::Access::ReadOnly;
    status.report = engine.report();
    let failures = engine.db.failures().unwrap_or_default();
    *status = std::mem::take(status).with_failures(failures);
    if let Err(e) = status_dir.write(status) {
        eprintln!("sync: cannot write the status: {e:#}");
    }
}

async fn keep_in_step(
    engine: &mut Engine,
    status: &mut Status,
    status_dir: &StatusDir,
    remote: &Arc<Remote>,
    args: &RunArgs,
    stop: &mut Stop,
) -> anyhow::Result<()> {
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let _watcher = match watch::watch(engine.folder.path(), wake_tx.clone()) {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            eprintln!("sync: no file watcher ({e:#}); changes are found by the rescan every {} s", args.interval);
            None
        }
    };
    let (cursor_tx, cursor_rx) = tokio::sync::watch::channel(engine.cursor()?);
    let notifier = {
        let remote = remote.clone();
        tokio::spawn(async move { remote.notifications(cursor_rx, wake_tx).await })
    };
    let interval = Duration::from_secs(args.interval.max(1));
    let mut failures = 0u32;
    let mut paused: Option<String> = None;
    let result = loop {
        if stop.requested() {
            break Ok(());
        }
        if let Some(fingerprint) = status_dir.take_confirmation() {
            *engine.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = Some(engine::Confirmation::Held(fingerprint));
        }
        let started = Instant::now();
        if status.state != "syncing" {
            status.state = "syncing".into();
            let _ = status_dir.write(status);
        }
        let pass = tokio::select! {
            pass = engine.pass() => pass,
            _ = stop.wait() => break Ok(()),
        };
        let wait = match pass {
            Ok(end) => {
                failures = 0;
                record(engine, status, status_dir, &end);
                match end {
                    PassEnd::Synced(tally) => {
                        if paused.take().is_some() {
                            eprintln!("sync: the folder is back; syncing again");
                        }
                        if tally.any() {
                            eprintln!("{}", progress_line(&tally, started.elapsed()));
                        }
                        let busy = Duration::from_nanos(engine.folder.caps.racy_window_ns) + SETTLE;
                        if tally.busy > 0 {
                            busy
                        } else {
                            interval
                        }
                    }
                    PassEnd::Paused(why) => {
                        if paused.as_deref() != Some(why.as_str()) {
                            eprintln!("sync: paused: {why}");
                        }
                        paused = Some(why);
                        PAUSED_RECHECK.min(interval)
                    }
                    PassEnd::Removed(why) => break Err(Removed(why).into()),
                }
            }
            Err(error) => {
                failures += 1;
                let wait = (Duration::from_millis(500) * 2u32.saturating_pow(failures - 1)).min(RETRY_WAIT_MAX);
                eprintln!("sync: {error:#}; trying again in {:.1} s", wait.as_secs_f64());
                status.state = "offline".into();
                status.reason = Some(format!("{error:#}"));
                let _ = status_dir.write(status);
                wait
            }
        };
        let _ = cursor_tx.send(engine.cursor()?);
        tokio::select! {
            woken = wake_rx.recv(), if failures == 0 => {
                if woken.is_none() {
                    break Ok(());
                }
                tokio::time::sleep(SETTLE).await;
                while wake_rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait() => break Ok(()),
        }
    };
    notifier.abort();
    status.state = "stopped".into();
    let _ = status_dir.write(status);
    eprintln!("sync: stopped");
    result
}

/// The pass's summary for stderr.
fn progress_line(t: &Tally, took: Duration) -> String {
    let seconds = took.as_secs_f64().max(0.001);
    let mb = |bytes: u64| bytes as f64 / 1e6;
    format!(
        "sync: pass done in {seconds:.1} s · ↑ {} files, {} chunks, {:.1} MB ({:.1} MB/s) · ↓ {} files, {} chunks \
         fetched ({:.1} MB), {} reused · {} moved · {} deleted here, {} there · {} conflicts · {} failed",
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
        t.conflicts,
        t.failed
    )
}
