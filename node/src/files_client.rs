//! `raftbox files`: a command-line client of the file service.
//!
//! `put` splits a file with content-defined chunking (FastCDC), asks which chunks the
//! cluster lacks, uploads only those (concurrently, with a progress bar on a terminal) and
//! commits; `get` downloads only the chunks the local copy does not already contain. Both
//! stream: the file is read (or written) a chunk at a time, with at most
//! [`TRANSFERS_IN_FLIGHT`] + [`CHUNKS_QUEUED`] chunks in memory, whatever its size. Any node's
//! address works.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{IsTerminal as _, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::StatusCode;
use serde_json::json;

use crate::client::{problem, Api, Connection};

use raftbox_storage::blocks::{CHUNK_AVG_BYTES, CHUNK_MAX_BYTES, CHUNK_MIN_BYTES};
/// Chunks uploaded or downloaded at once.
const TRANSFERS_IN_FLIGHT: usize = 8;
/// Chunks read ahead of the uploads, at most.
const CHUNKS_QUEUED: usize = 2;
/// The largest block the service stores (DESIGN.md §4): 8 MiB.
const BLOCK_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Hashes asked about in one status call (well under the API's request limits).
const STATUS_BATCH_HASHES: usize = 5_000;

#[derive(clap::Args, Debug)]
pub struct FilesArgs {
    #[command(flatten)]
    connection: Connection,
    /// Device name used for conflicted copies (X-Device-Id).
    #[arg(long, env = "RAFTBOX_DEVICE", global = true)]
    device: Option<String>,
    /// Work in this namespace (a shared folder's id, see `raftbox share ls`) instead of
    /// your personal one.
    #[arg(long, env = "RAFTBOX_NAMESPACE", global = true, value_parser = crate::client::id)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: FilesCommand,
}

#[derive(clap::Subcommand, Debug)]
enum FilesCommand {
    /// Upload LOCAL as REMOTE (a new version if it exists).
    Put { local: PathBuf, remote: String },
    /// Download REMOTE into LOCAL, fetching only chunks LOCAL lacks.
    Get { remote: String, local: PathBuf },
    /// List a folder (default /).
    Ls { folder: Option<String> },
    /// Show a file's versions, newest first.
    History { remote: String },
    /// Make an old version of REMOTE current again.
    Restore { remote: String, version: u64 },
    /// Delete REMOTE (a tombstone version; history keeps the content).
    Rm { remote: String },
    /// Move (rename) FROM to TO.
    Mv { from: String, to: String },
}

fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// One content-defined chunk of a file: its hash (hex), where it is and how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) hash: String,
    pub(crate) offset: u64,
    pub(crate) length: usize,
}

/// The content-defined chunks of `source`, read a chunk at a time; `each` sees every chunk
/// with its bytes.
pub(crate) fn chunks_of<R: Read>(
    source: R,
    mut each: impl FnMut(&Chunk, Vec<u8>) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Chunk>> {
    let mut out = Vec::new();
    for found in fastcdc::v2020::StreamCDC::new(source, CHUNK_MIN_BYTES, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES) {
        let found = found.context("read for chunking")?;
        let chunk =
            Chunk { hash: blake3::hash(&found.data).to_hex().to_string(), offset: found.offset, length: found.length };
        each(&chunk, found.data)?;
        out.push(chunk);
    }
    Ok(out)
}

/// The chunks of the file at `path` (hashes only; nothing kept in memory).
pub(crate) async fn chunk_file(path: &Path) -> anyhow::Result<Vec<Chunk>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = File::open(&path).with_context(|| format!("open {}", path.display()))?;
        chunks_of(std::io::BufReader::new(file), |_, _| Ok(()))
    })
    .await?
}

pub async fn run(args: FilesArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, args.device.clone())?.in_namespace(args.namespace.clone());
    match args.command {
        FilesCommand::Put { local, remote } => put(&api, &local, &remote).await,
        FilesCommand::Get { remote, local } => get(&api, &remote, &local).await,
        FilesCommand::Ls { folder } => ls(&api, folder.as_deref().unwrap_or("/")).await,
        FilesCommand::History { remote } => history(&api, &remote).await,
        FilesCommand::Restore { remote, version } => {
            let body = api.file_body(json!({ "path": remote, "version": version }));
            let (status, answer) =
                api.send(api.request(reqwest::Method::POST, "/v1/files/restore").json(&body)).await?;
            if !status.is_success() {
                bail!("restore {remote}: {}", problem(status, &answer));
            }
            println!("{remote}: version {version} restored as version {}", answer["version"]);
            Ok(())
        }
        FilesCommand::Mv { from, to } => {
            let current = api.current_version(&from).await?.with_context(|| format!("no file at {from}"))?;
            let body = api.file_body(json!({ "from": from, "to": to, "baseVersion": current["version"] }));
            let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/move").json(&body)).await?;
            if !status.is_success() {
                bail!("mv {from} {to}: {}", problem(status, &answer));
            }
            println!("{from} → {to}");
            Ok(())
        }
        FilesCommand::Rm { remote } => {
            let current = api.current_version(&remote).await?.with_context(|| format!("no file at {remote}"))?;
            let body = api.file_body(json!({ "path": remote, "baseVersion": current["version"] }));
            let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/delete").json(&body)).await?;
            if !status.is_success() {
                bail!("rm {remote}: {}", problem(status, &answer));
            }
            println!("{remote}: deleted (version {})", answer["version"]);
            Ok(())
        }
    }
}

/// The hashes among `hashes` the cluster lacks (asked in batches).
pub(crate) async fn missing(api: &Api, hashes: &[String]) -> anyhow::Result<HashSet<String>> {
    let mut missing = HashSet::new();
    for batch in hashes.chunks(STATUS_BATCH_HASHES) {
        let request = api.request(reqwest::Method::POST, "/v1/blocks/status").json(&json!({ "hashes": batch }));
        let (status, answer) = api.send(request).await?;
        if status != StatusCode::OK {
            bail!("ask which chunks are missing: {}", problem(status, &answer));
        }
        let found: Vec<String> = serde_json::from_value(answer["missing"].clone())?;
        missing.extend(found);
    }
    Ok(missing)
}

async fn put(api: &Api, local: &Path, remote: &str) -> anyhow::Result<()> {
    let before = std::fs::metadata(local).with_context(|| format!("read {}", local.display()))?;
    let chunks = chunk_file(local).await?;
    let hashes: Vec<String> = chunks.iter().map(|c| c.hash.clone()).collect();
    let missing = missing(api, &hashes).await?;
    let bytes: u64 = chunks.iter().filter(|c| missing.contains(&c.hash)).map(|c| c.length as u64).sum();
    let file = File::open(local).with_context(|| format!("open {}", local.display()))?;
    let uploaded = upload(api, file, &local.display().to_string(), &missing, progress(bytes, "upload"), None).await?;
    let after = std::fs::metadata(local)?;
    if after.len() != before.len() || after.modified()? != before.modified()? {
        bail!("{} changed while it was uploaded; nothing was committed", local.display());
    }
    let base = api.current_version(remote).await?.map_or(0, |f| f["version"].as_u64().unwrap_or(0));
    let mtime = before.modified()?.duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    let body = api.file_body(
        json!({ "path": remote, "chunks": hashes, "baseVersion": base, "size": before.len(), "mtime": mtime }),
    );
    let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/commit").json(&body)).await?;
    match status {
        StatusCode::CREATED => println!(
            "{remote}: version {} ({} bytes, {} chunks, {uploaded} uploaded)",
            answer["version"],
            before.len(),
            chunks.len(),
        ),
        StatusCode::OK => println!("{remote}: unchanged (version {})", answer["version"]),
        StatusCode::CONFLICT => bail!(
            "{remote} changed meanwhile (now version {}); your content was kept as {}",
            answer["currentVersion"],
            answer["conflictedCopy"]["path"]
        ),
        _ => bail!("commit {remote}: {}", problem(status, &answer)),
    }
    Ok(())
}

/// Uploads the chunks of `file` (named `label` in messages) whose hash is in `wanted`, each
/// once: a reader thread chunks the file again and hands over at most [`CHUNKS_QUEUED`]
/// chunks ahead of the [`TRANSFERS_IN_FLIGHT`] uploads, each taken from `throttle` first when
/// there is one. Returns how many chunks went up.
pub(crate) async fn upload(
    api: &Api,
    file: File,
    label: &str,
    wanted: &HashSet<String>,
    bar: ProgressBar,
    throttle: Option<&Throttle>,
) -> anyhow::Result<usize> {
    let (tx, rx) = tokio::sync::mpsc::channel::<(String, Vec<u8>)>(CHUNKS_QUEUED);
    let wanted_by_reader = wanted.clone();
    let reader = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut sent = HashSet::new();
        chunks_of(std::io::BufReader::new(file), |chunk, data| {
            if wanted_by_reader.contains(&chunk.hash) && sent.insert(chunk.hash.clone()) {
                // The uploads stopped (an error): stop reading too.
                tx.blocking_send((chunk.hash.clone(), data)).map_err(|_| anyhow::anyhow!("upload stopped"))?;
            }
            Ok(())
        })
        .map(|_| ())
    });
    let uploads = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|(hash, data)| {
            let bar = bar.clone();
            async move {
                let length = data.len() as u64;
                if let Some(throttle) = throttle {
                    throttle.take(data.len()).await;
                }
                let request = api.request(reqwest::Method::PUT, &format!("/v1/blocks/{hash}")).body(data);
                let (status, answer) = api.send(request).await?;
                if status != StatusCode::CREATED {
                    bail!("upload chunk {hash}: {}", problem(status, &answer));
                }
                bar.inc(length);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(TRANSFERS_IN_FLIGHT)
        .try_fold(0usize, |n, ()| async move { Ok(n + 1) })
        .await;
    let read = reader.await?;
    let uploaded = uploads?;
    read?;
    bar.finish_and_clear();
    if uploaded != wanted.len() {
        bail!("{label} changed while it was uploaded: {uploaded} of {} chunks found", wanted.len());
    }
    Ok(uploaded)
}

async fn get(api: &Api, remote: &str, local: &Path) -> anyhow::Result<()> {
    let file = api.current_version(remote).await?.with_context(|| format!("no file at {remote}"))?;
    let wanted: Vec<String> = serde_json::from_value(file["chunks"].clone())?;
    // Chunks the local copy already has are read from it, not downloaded.
    let have: HashMap<String, Chunk> = match chunk_file(local).await {
        Ok(chunks) => chunks.into_iter().map(|c| (c.hash.clone(), c)).collect(),
        Err(_) => HashMap::new(),
    };
    let lacking: HashSet<&String> = wanted.iter().filter(|h| !have.contains_key(*h)).collect();
    let bar = progress(file["size"].as_u64().unwrap_or(0), "download");
    let tmp = local.with_extension("raftbox-partial");
    let mut out = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut old = File::open(local).ok();
    let mut pieces = stream::iter(wanted.iter().map(|hash| {
        let local_copy = have.get(hash).cloned();
        async move {
            match local_copy {
                Some(chunk) => anyhow::Ok(Piece::Local(chunk)),
                None => download(api, hash, None).await.map(Piece::Fetched),
            }
        }
    }))
    .buffered(TRANSFERS_IN_FLIGHT);
    let mut written = 0u64;
    while let Some(piece) = pieces.try_next().await? {
        let bytes = match piece {
            Piece::Fetched(bytes) => bytes,
            Piece::Local(chunk) => read_at(old.as_mut().context("the local copy vanished")?, &chunk)?.into(),
        };
        out.write_all(&bytes).with_context(|| format!("write {}", tmp.display()))?;
        written += bytes.len() as u64;
        bar.inc(bytes.len() as u64);
    }
    out.sync_all()?;
    drop(out);
    std::fs::rename(&tmp, local).with_context(|| format!("move into {}", local.display()))?;
    bar.finish_and_clear();
    println!(
        "{remote} → {}: version {}, {written} bytes, {} of {} chunks downloaded",
        local.display(),
        file["version"],
        lacking.len(),
        wanted.len()
    );
    Ok(())
}

/// A chunk of the file being assembled: downloaded, or to be read from the old local copy.
enum Piece {
    Fetched(bytes::Bytes),
    Local(Chunk),
}

pub(crate) fn read_at(file: &mut File, chunk: &Chunk) -> anyhow::Result<Vec<u8>> {
    let mut bytes = vec![0; chunk.length];
    file.seek(SeekFrom::Start(chunk.offset))?;
    file.read_exact(&mut bytes)?;
    if blake3::hash(&bytes).to_hex().as_str() != chunk.hash {
        bail!("the local copy changed while it was read");
    }
    Ok(bytes)
}

/// One block, hash-checked; read as it arrives through `throttle` when there is one (else
/// the body as received: no copy).
pub(crate) async fn download(api: &Api, hash: &str, throttle: Option<&Throttle>) -> anyhow::Result<bytes::Bytes> {
    let response = api.send_raw(api.request(reqwest::Method::GET, &format!("/v1/blocks/{hash}"))).await?;
    if response.status() != StatusCode::OK {
        bail!("download chunk {hash}: {}", response.status());
    }
    // A block is at most BLOCK_BYTES_MAX: a longer answer is refused as it arrives.
    if response.content_length().is_some_and(|n| n > BLOCK_BYTES_MAX as u64) {
        bail!("chunk {hash}: the answer is longer than a block can be");
    }
    let mut body = bytes::BytesMut::with_capacity(response.content_length().unwrap_or(0) as usize);
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        let piece = piece?;
        if body.len() + piece.len() > BLOCK_BYTES_MAX {
            bail!("chunk {hash}: the answer is longer than a block can be");
        }
        if let Some(throttle) = throttle {
            throttle.take(piece.len()).await;
        }
        body.extend_from_slice(&piece);
    }
    let bytes = body.freeze();
    if blake3::hash(&bytes).to_hex().as_str() != hash {
        bail!("chunk {hash} arrived corrupted");
    }
    Ok(bytes)
}

/// A bandwidth limit in bytes per second, shared by every transfer it is given to
/// (`raftbox sync --limit-up/--limit-down`): the GCRA of the `governor` crate, with a
/// second's worth of burst.
pub struct Throttle {
    limiter: governor::DefaultDirectRateLimiter,
    burst: u32,
}

impl Throttle {
    pub fn new(bytes_per_s: u64) -> Throttle {
        let rate = u32::try_from(bytes_per_s).unwrap_or(u32::MAX).max(1);
        let rate = std::num::NonZeroU32::new(rate).unwrap_or(std::num::NonZeroU32::MIN);
        Throttle { limiter: governor::RateLimiter::direct(governor::Quota::per_second(rate)), burst: rate.get() }
    }

    /// Waits until `bytes` may pass.
    pub async fn take(&self, bytes: usize) {
        let mut left = bytes;
        while left > 0 {
            let step = left.min(self.burst as usize);
            let n = std::num::NonZeroU32::new(step as u32).unwrap_or(std::num::NonZeroU32::MIN);
            // `step` never exceeds the burst, so the capacity is always there eventually.
            let _ = self.limiter.until_n_ready(n).await;
            left -= step;
        }
    }
}

/// A rate such as `500K`, `2M` or `1.5G` (powers of 1024; a bare number is bytes) per second.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&text[..i], text[i..].trim_end_matches(['B', 'b', '/', 's'])),
        None => (text, ""),
    };
    let factor: f64 = match unit.to_ascii_uppercase().as_str() {
        "" => 1.0,
        "K" | "KI" => 1024.0,
        "M" | "MI" => 1024.0 * 1024.0,
        "G" | "GI" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown unit {other:?}: use K, M or G")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("{text:?} is not a rate such as 500K or 2M"))?;
    let bytes = value * factor;
    if !(1.0..=1e12).contains(&bytes) {
        return Err(format!("{text:?}: a rate is 1 byte to 1 TB per second"));
    }
    Ok(bytes as u64)
}

async fn ls(api: &Api, folder: &str) -> anyhow::Result<()> {
    let folder = if folder.ends_with('/') { folder.to_string() } else { format!("{folder}/") };
    let mut token: Option<String> = None;
    loop {
        let mut query = vec![("path", folder.clone())];
        if let Some(t) = &token {
            query.push(("pageToken", t.clone()));
        }
        let (status, page) = api.send(api.request(reqwest::Method::GET, "/v1/files/list").query(&query)).await?;
        if status != StatusCode::OK {
            bail!("list {folder}: {}", problem(status, &page));
        }
        for entry in page["entries"].as_array().into_iter().flatten() {
            match entry["type"].as_str() {
                Some("folder") => println!("{:>12}  {:>4}  {}/", "-", "-", entry["name"].as_str().unwrap_or("")),
                _ => println!(
                    "{:>12}  v{:<3}  {}",
                    entry["size"],
                    entry["version"],
                    entry["name"].as_str().unwrap_or("")
                ),
            }
        }
        match page["nextPageToken"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => return Ok(()),
        }
    }
}

async fn history(api: &Api, remote: &str) -> anyhow::Result<()> {
    let (status, body) = api
        .send(api.request(reqwest::Method::GET, "/v1/files/history").query(&[("path", remote), ("limit", "1000")]))
        .await?;
    if status != StatusCode::OK {
        bail!("history of {remote}: {}", problem(status, &body));
    }
    for v in body["versions"].as_array().into_iter().flatten() {
        let what =
            if v["deleted"].as_bool() == Some(true) { "deleted".to_string() } else { format!("{} bytes", v["size"]) };
        println!(
            "v{:<4} {:<14} from {} at {}",
            v["version"],
            what,
            v["device"].as_str().unwrap_or("?"),
            v["createdAt"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(data: &[u8]) -> Vec<Chunk> {
        chunks_of(data, |_, _| Ok(())).expect("chunk")
    }

    #[test]
    fn rates_parse_with_units() {
        assert_eq!(parse_rate("500K"), Ok(500 * 1024));
        assert_eq!(parse_rate("2M"), Ok(2 * 1024 * 1024));
        assert_eq!(parse_rate("1.5G"), Ok(1_610_612_736));
        assert_eq!(parse_rate("4096"), Ok(4096));
        assert_eq!(parse_rate("3MB/s"), Ok(3 * 1024 * 1024));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("5X").is_err());
    }

    #[tokio::test]
    async fn a_throttle_holds_its_rate() {
        let throttle = Throttle::new(100_000);
        let started = std::time::Instant::now();
        // The first second's burst passes at once; the next 100,000 bytes take a second.
        throttle.take(200_000).await;
        let took = started.elapsed();
        assert!(took >= std::time::Duration::from_millis(900), "{took:?}");
    }

    #[test]
    fn an_edit_changes_few_chunks() {
        let mut data = vec![0u8; 8_000_000];
        blake3::Hasher::new().update(b"seed").finalize_xof().fill(&mut data);
        let before = chunks(&data);
        assert!(before.len() >= 4, "{} chunks", before.len());
        assert!(before.iter().all(|c| c.length <= CHUNK_MAX_BYTES));
        data.splice(4_000_000..4_000_000, b"an insertion in the middle".iter().copied());
        let after = chunks(&data);
        let unchanged = after.iter().filter(|c| before.iter().any(|b| b.hash == c.hash)).count();
        assert!(unchanged + 2 >= after.len(), "{unchanged} of {} chunks kept", after.len());
    }
}
