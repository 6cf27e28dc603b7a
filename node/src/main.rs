//! `raftbox`: runs a cluster node (`serve`) and drives a running cluster (`bench`).
//!
//! - [`config`]: the node's configuration: TOML file, flags and environment, validated once.
//! - [`serve`]: wiring of storage, Raft, gRPC and HTTP; signals and graceful shutdown.
//! - [`bench`]: the benchmark client.
//! - [`certs`]: `raftbox certs`, a cluster CA and node certificates for `[tls]`.
//! - [`backup_client`]: `raftbox backup`, and the offline `raftbox restore` and `raftbox recover`.
//! - [`admin_client`]: `raftbox users`, `raftbox tokens` (accounts) and `raftbox status`.
//! - [`client`]: what the client subcommands share (connection flags, API calls).
//! - [`cluster_client`]: `raftbox cluster`, members and membership change.
//! - [`files_client`]: `raftbox files`, the file-service client.
//! - [`jobs_client`]: `raftbox jobs`, the job-service client.
//! - [`share_client`]: `raftbox share` (shared folders, members) and `raftbox groups`.
//! - [`sync_client`]: `raftbox sync DIR`, continuous two-way sync of a folder.
//! - [`executor`]: the job executor (claims, leases, webhooks, built-in and maintenance tasks).
//! - [`maintenance`]: node-local background work: block replication and reclaiming.

mod admin_client;
mod backup_client;
mod bench;
mod certs;
mod client;
mod cluster_client;
mod config;
mod executor;
mod files_client;
mod jobs_client;
mod limits_client;
mod login_client;
mod maintenance;
mod serve;
mod share_client;
mod sync_client;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc for every Rust allocation: see README "Benchmarks".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// raftbox: a Raft-replicated file store, job scheduler and rate limiter.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run a cluster node until SIGTERM or Ctrl-C.
    Serve(config::ServeArgs),
    /// Store and fetch files on a running cluster (put, get, ls, history, restore, rm, mv);
    /// `--namespace ID` works in a shared folder.
    Files(files_client::FilesArgs),
    /// Keep a local folder and a namespace in step, both ways, until stopped (`--once`: one
    /// pass); `raftbox sync status|confirm-deletes|trash DIR` look after it.
    ///
    /// Every byte you write survives somewhere you can find it — the file, a conflicted copy,
    /// the server's history or the local trash (DIR/.raftbox/trash, `raftbox sync trash ls
    /// DIR`) — and nothing is ever written outside DIR or through a link. Local edits go up
    /// (only the chunks the cluster lacks), remote ones come down (reusing chunks on disk);
    /// deletes and renames go both ways. An edit made on both sides keeps both (`NAME
    /// (conflicted copy, DEVICE).EXT`). A moved, missing or replaced folder pauses syncing;
    /// a pass deleting many files waits for `raftbox sync confirm-deletes DIR`; a file that
    /// cannot sync is retried and shown by `raftbox sync status DIR`. DIR/.raftboxignore
    /// (gitignore syntax) is this device's own. Progress goes to stderr. Stop with Ctrl-C;
    /// a killed client resumes where it was.
    ///
    /// Example: raftbox sync ~/box --token-file tok --device laptop --endpoint
    /// http://10.0.0.1:7081,http://10.0.0.2:7081
    Sync(sync_client::SyncArgs),
    /// Shared folders: list, create, show members, grant, revoke, leave, delete.
    Share(share_client::ShareArgs),
    /// Groups of users, for granting access to many at once (admin token): ls, create, show,
    /// add, remove.
    Groups(share_client::GroupsArgs),
    /// Schedule and inspect jobs on a running cluster (create, get, ls, runs, cancel, pause, resume, run).
    Jobs(jobs_client::JobsArgs),
    /// Show and change the cluster's members (members, add, remove; admin token).
    Cluster(cluster_client::ClusterArgs),
    /// The cluster's rate limits, job limits and quotas (admin token): show them as TOML, or
    /// set them from a TOML file; every node enforces a change within a second, no restart.
    Limits(limits_client::LimitsArgs),
    /// A cluster summary: members, roles, leader, term, applied index and lag of each node
    /// (no token needed).
    Status(admin_client::StatusArgs),
    /// Users (admin token): create, show.
    Users(admin_client::UsersArgs),
    /// Log in with your name and password: a session token (30 days), kept in
    /// ~/.config/raftbox/token, which every command then uses when given no other token.
    Login(login_client::LoginArgs),
    /// Set your password (asks for the current one once one is set), or a user's with
    /// --user ID (admin token; --remove takes it away).
    Passwd(login_client::PasswdArgs),
    /// Bearer tokens: create (admin), ls, revoke (a user's with the admin token, or your own).
    Tokens(admin_client::TokensArgs),
    /// Measure write throughput and latency of a running cluster with N concurrent writers.
    Bench(bench::BenchArgs),
    /// Make a cluster CA and a certificate per node for `[tls]` (DIR --nodes N --host H).
    Certs(certs::CertsArgs),
    /// Back up the replicated state of a running cluster through any node (admin token):
    /// a consistent image with its log index and blake3 checksum; the blocks it names are
    /// listed (FILE.blocks) or copied (--with-blocks).
    Backup(backup_client::BackupArgs),
    /// Seed a stopped node's empty data directory from a backup: the node starts as the only
    /// voter of a new cluster, and the others are added back with empty data directories.
    Restore(backup_client::RestoreArgs),
    /// After losing a majority: make a stopped surviving node the only voter of a new
    /// cluster, keeping its data (etcd's --force-new-cluster). Whatever only the lost nodes
    /// held is lost; never start them again on their old data.
    Recover(backup_client::RecoverArgs),
}

fn main() {
    if let Err(error) = run(Cli::parse()) {
        eprintln!("raftbox: {error:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // ring is the one rustls provider of this build; installed before anything uses TLS.
    raftbox_raft::install_default_provider();
    let runtime = match cli.command {
        // A node, the benchmark and the folder sync (hashing while it transfers) use every
        // core. The other clients wait on the network: one thread serves them, so a buffer
        // is freed on the thread that allocated it, which keeps mimalloc's per-thread heaps
        // and the client's RSS small (`raftbox files get` of 1 GiB: peak 101-105 MB on
        // the multi-threaded runtime, 72-74 MB on one thread; big_file cluster test).
        Commands::Serve(_) | Commands::Bench(_) | Commands::Sync(_) => {
            tokio::runtime::Builder::new_multi_thread().enable_all().build()?
        }
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
    };
    match cli.command {
        Commands::Serve(args) => {
            let config = config::Config::load(args)?;
            runtime.block_on(serve::run(config))
        }
        Commands::Bench(args) => runtime.block_on(bench::run(args)),
        Commands::Certs(args) => certs::run(args),
        Commands::Backup(args) => runtime.block_on(backup_client::run_backup(args)),
        Commands::Restore(args) => backup_client::run_restore(args),
        Commands::Recover(args) => backup_client::run_recover(args),
        Commands::Cluster(args) => runtime.block_on(cluster_client::run(args)),
        Commands::Limits(args) => runtime.block_on(limits_client::run(args)),
        Commands::Status(args) => runtime.block_on(admin_client::run_status(args)),
        Commands::Users(args) => runtime.block_on(admin_client::run_users(args)),
        Commands::Login(args) => runtime.block_on(login_client::run_login(args)),
        Commands::Passwd(args) => runtime.block_on(login_client::run_passwd(args)),
        Commands::Tokens(args) => runtime.block_on(admin_client::run_tokens(args)),
        Commands::Files(args) => runtime.block_on(files_client::run(args)),
        Commands::Jobs(args) => runtime.block_on(jobs_client::run(args)),
        Commands::Sync(args) => runtime.block_on(sync_client::run(args)),
        Commands::Share(args) => runtime.block_on(share_client::run_share(args)),
        Commands::Groups(args) => runtime.block_on(share_client::run_groups(args)),
    }
}
