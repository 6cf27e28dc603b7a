//! `raftbox backup` (from a running cluster, admin token), and the offline `raftbox restore`
//! and `raftbox recover --force-new-cluster` on a stopped node's data directory (see
//! `raftbox_raft::recover` for what they do to it and what they cost).

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context as _};
use futures::StreamExt as _;
use raftbox_storage::blocks::{BlockHash, BlockStore, VerifiedBlock};

use crate::client::{problem, Api, Connection};
use crate::config::{Config, ServeArgs};

/// Blocks `backup --with-blocks` fetches at once.
const BLOCK_FETCHES_IN_FLIGHT: usize = 8;

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    connection: Connection,
    /// Where to write the backup (a snapshot image of the replicated state, ending in its
    /// blake3 checksum). Refused if it exists.
    file: PathBuf,
    /// Also copy every block the backup's state names into FILE.blocks.d/ (one file per
    /// block, named by its hash). Without it, FILE.blocks lists their hashes, one per line,
    /// for copying from a node's `blocks/` directory.
    #[arg(long)]
    with_blocks: bool,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// A backup written by `raftbox backup`.
    file: PathBuf,
    /// The configuration of the node to seed (its id, addresses and data directory, which
    /// must hold no database yet).
    #[arg(long, env = "RAFTBOX_CONFIG")]
    config: PathBuf,
    /// A directory of blocks to copy into the node's block store (`FILE.blocks.d` of
    /// `raftbox backup --with-blocks`, or a node's `blocks/` tree); each is checked against
    /// its hash.
    #[arg(long)]
    blocks: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// Make this stopped node the only voter of a new configuration, keeping its data: the
    /// way back after losing a majority. Whatever only the lost nodes held is lost.
    #[arg(long, required = true)]
    force_new_cluster: bool,
    /// The node's configuration (its id, addresses and data directory).
    #[arg(long, env = "RAFTBOX_CONFIG")]
    config: PathBuf,
}

fn node_config(path: &Path) -> anyhow::Result<Config> {
    Config::load(ServeArgs::from_file(path.to_path_buf())).with_context(|| format!("load {}", path.display()))
}

/// A node's id and addresses as the offline commands hand them to `raftbox_raft::recover`.
fn node_identity(config: &Config) -> (u64, String, String) {
    (config.node_id, config.http_addr.to_string(), config.grpc_addr.to_string())
}

pub async fn run_backup(args: BackupArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(!args.file.exists(), "{} exists: choose another name", args.file.display());
    let api = Api::new(&args.connection, None)?;
    let partial = with_suffix(&args.file, ".partial");
    let fetched = fetch_image(&api, &partial).await;
    let (index, term, bytes) = match fetched {
        Ok(fetched) => fetched,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    // Checked as written, before it takes its name: magic and the checksum that ends it.
    let mut blocks = Vec::new();
    let summary = raftbox_storage::snapshot::read_image(std::fs::File::open(&partial)?, |hash| {
        blocks.push(hash);
        Ok(())
    });
    let summary = match summary {
        Ok(summary) => summary,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            bail!("the backup as received is not a sound image ({e}); nothing was kept");
        }
    };
    // A link, not a rename: it fails rather than replace a file that appeared meanwhile.
    std::fs::hard_link(&partial, &args.file).with_context(|| format!("name the backup {}", args.file.display()))?;
    std::fs::remove_file(&partial)?;
    sync_parent(&args.file)?;
    let checksum = blake3::Hash::from_bytes(summary.checksum).to_hex();

    let list = with_suffix(&args.file, ".blocks");
    let mut text = String::with_capacity(blocks.len() * 65);
    for hash in &blocks {
        text.push_str(&hash.to_hex());
        text.push('\n');
    }
    std::fs::write(&list, text).with_context(|| format!("write {}", list.display()))?;
    eprintln!(
        "backup of log index {index} (term {term}): {bytes} bytes, {} records, blake3 {checksum}, in {:.1} s",
        summary.records,
        started.elapsed().as_secs_f64()
    );
    if args.with_blocks {
        let dir = with_suffix(&args.file, ".blocks.d");
        std::fs::create_dir_all(&dir)?;
        let fetched = fetch_blocks(&api, &blocks, &dir).await?;
        std::fs::File::open(&dir)?.sync_all()?;
        eprintln!("{fetched} blocks copied into {} ({:.1} s in all)", dir.display(), started.elapsed().as_secs_f64());
    } else {
        eprintln!(
            "{} blocks are named by it: listed in {} (copy them from a node's blocks/ directory, or \
             back up again with --with-blocks)",
            blocks.len(),
            list.display()
        );
    }
    println!("{}", args.file.display());
    Ok(())
}

/// A backup file's mode: its owner's only (it holds password hashes and webhook secrets).
pub const BACKUP_FILE_MODE: u32 = 0o600;

/// Streams the node's backup into `partial` (synced): the index and term it reflects, and
/// its length.
async fn fetch_image(api: &Api, partial: &Path) -> anyhow::Result<(String, String, u64)> {
    let response = api.send_raw(api.request(reqwest::Method::GET, "/v1/admin/backup")).await?;
    let status = response.status();
    if !status.is_success() {
        let body = response.json().await.unwrap_or_default();
        bail!("/v1/admin/backup: {}", problem(status, &body));
    }
    let header = |name: &str| -> anyhow::Result<String> {
        let value = response.headers().get(name).with_context(|| format!("the answer lacks {name}"))?;
        Ok(value.to_str().with_context(|| format!("{name} is not text"))?.to_string())
    };
    let (index, term) = (header("x-raftbox-backup-index")?, header("x-raftbox-backup-term")?);
    // The image holds password hashes and webhook secrets: readable by its owner only, from
    // its first byte (an existing file keeps its mode, so it is set again).
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(BACKUP_FILE_MODE)
        .open(partial)
        .with_context(|| format!("create {}", partial.display()))?;
    out.set_permissions(std::fs::Permissions::from_mode(BACKUP_FILE_MODE))
        .with_context(|| format!("make {} private", partial.display()))?;
    let mut stream = response.bytes_stream();
    let mut bytes = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("the backup's transfer broke off")?;
        out.write_all(&chunk).with_context(|| format!("write {}", partial.display()))?;
        bytes += chunk.len() as u64;
    }
    out.sync_all()?;
    Ok((index, term, bytes))
}

/// Fetches `blocks` into `dir` (each checked against its hash and synced; a file already
/// there is kept only if it holds its block), a few at a time; returns how many it went
/// through.
async fn fetch_blocks(api: &Api, blocks: &[BlockHash], dir: &Path) -> anyhow::Result<usize> {
    let fetches = futures::stream::iter(blocks.iter().copied())
        .map(|hash| async move {
            let path = dir.join(hash.to_hex());
            if std::fs::read(&path).is_ok_and(|data| BlockHash::of(&data) == hash) {
                return Ok::<_, anyhow::Error>(());
            }
            let response = api.send_raw(api.request(reqwest::Method::GET, &format!("/v1/admin/blocks/{hash}"))).await?;
            let status = response.status();
            if !status.is_success() {
                let body = response.json().await.unwrap_or_default();
                bail!("block {hash}: {}", problem(status, &body));
            }
            let data = response.bytes().await.with_context(|| format!("block {hash}"))?;
            let block = VerifiedBlock::verify(hash, data).map_err(|e| anyhow::anyhow!("block {hash}: {e}"))?;
            let partial = with_suffix(&path, ".partial");
            let mut file = std::fs::File::create(&partial)?;
            file.write_all(block.data())?;
            file.sync_all()?;
            std::fs::rename(&partial, &path)?;
            Ok(())
        })
        .buffer_unordered(BLOCK_FETCHES_IN_FLIGHT);
    futures::pin_mut!(fetches);
    let mut done = 0;
    while let Some(fetched) = fetches.next().await {
        fetched?;
        done += 1;
    }
    Ok(done)
}

pub fn run_restore(args: RestoreArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let config = node_config(&args.config)?;
    // The blocks first: a restore whose blocks fail leaves the database untouched, to run
    // again.
    let store = BlockStore::open(&config.data_dir.join("blocks"))?;
    if let Some(dir) = &args.blocks {
        let copied = copy_blocks(dir, &store)?;
        eprintln!("{copied} blocks copied from {} into the node's block store", dir.display());
    }
    let mut missing = Vec::new();
    raftbox_storage::snapshot::read_image(std::fs::File::open(&args.file)?, |hash| {
        if !store.has(&hash) {
            missing.push(hash);
        }
        Ok(())
    })
    .with_context(|| format!("{} is not a sound backup", args.file.display()))?;
    if !missing.is_empty() {
        let dir = config.data_dir.join("blocks");
        match &args.blocks {
            Some(given) => bail!(
                "{} of the backup's blocks are not in {} (the first: {}); nothing was restored",
                missing.len(),
                given.display(),
                missing[0]
            ),
            None => eprintln!(
                "warning: {} of the backup's blocks are not in {} yet: copy them there (FILE.blocks \
                 lists them) before starting the node, or their files cannot be read",
                missing.len(),
                dir.display()
            ),
        }
    }
    let (id, http_addr, grpc_addr) = node_identity(&config);
    let restored = raftbox_raft::restore_backup(&args.file, &config.data_dir, id, &http_addr, &grpc_addr)?;
    eprintln!(
        "restored log index {} (term {}) into {} as node {}, the only voter of a new configuration \
         (entry {}, term {}) of a new cluster {}, in {:.1} s",
        restored.backup_index,
        restored.backup_term,
        config.data_dir.display(),
        config.node_id,
        restored.recovered.membership_index,
        restored.recovered.term,
        restored.recovered.cluster_id,
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "next: start the node, then add the others back, each with an empty data directory \
         (scripts/cluster add N, or raftbox cluster add N HTTP GRPC)"
    );
    Ok(())
}

/// Copies every block file under `dir` (any depth; a file named by its hash) into `store`,
/// each checked against its name.
fn copy_blocks(dir: &Path, store: &BlockStore) -> anyhow::Result<usize> {
    let mut copied = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).with_context(|| format!("read {}", folder.display()))? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path);
                continue;
            }
            let Some(hash) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<BlockHash>().ok()) else {
                continue;
            };
            if store.has(&hash) {
                continue;
            }
            let data = std::fs::read(&path)?;
            let block =
                VerifiedBlock::verify(hash, data.into()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            store.put(&block)?;
            copied += 1;
        }
    }
    Ok(copied)
}

pub fn run_recover(args: RecoverArgs) -> anyhow::Result<()> {
    debug_assert!(args.force_new_cluster);
    let config = node_config(&args.config)?;
    let (id, http_addr, grpc_addr) = node_identity(&config);
    let recovered = raftbox_raft::force_new_cluster(&config.data_dir, id, &http_addr, &grpc_addr)?;
    eprintln!(
        "node {} is now the only voter of a new configuration (log entry {}, term {}) of a new cluster {}, \
         with all the data it held (log up to entry {}).\n\
         Whatever only the lost nodes held is gone. The lost nodes can never rejoin on their old data \
         (the new cluster refuses them, and they it): wipe their data directories, then start the \
         recovered node and add them back (scripts/cluster add N, or raftbox cluster add N HTTP GRPC).",
        config.node_id, recovered.membership_index, recovered.term, recovered.cluster_id, recovered.previous_index
    );
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes a rename in `path`'s directory durable.
fn sync_parent(path: &Path) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)?.sync_all()?;
    Ok(())
}
