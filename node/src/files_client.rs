//! `raftbox files`: a command-line client of the file service.
//!
//! `put` splits a file with content-defined chunking (FastCDC), asks which chunks the
//! cluster lacks, uploads only those (concurrently, with a progress bar on a terminal) and
//! commits; `get` downloads only the chunks the local copy does not already contain. Any
//! node's address works.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::StatusCode;
use serde_json::json;

use crate::client::{problem, Api, Connection};

/// FastCDC chunk sizes: small enough to dedupe edits, far below the 8 MiB block limit.
const CHUNK_MIN_BYTES: usize = 256 * 1024;
const CHUNK_AVG_BYTES: usize = 1024 * 1024;
const CHUNK_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Chunks uploaded or downloaded at once.
const TRANSFERS_IN_FLIGHT: usize = 8;

#[derive(clap::Args, Debug)]
pub struct FilesArgs {
    #[command(flatten)]
    connection: Connection,
    /// Device name used for conflicted copies (X-Device-Id).
    #[arg(long, env = "RAFTBOX_DEVICE", global = true)]
    device: Option<String>,
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

/// Content-defined chunks of `data`: (hash, offset, length).
fn chunk(data: &[u8]) -> Vec<(String, usize, usize)> {
    fastcdc::v2020::FastCDC::new(data, CHUNK_MIN_BYTES, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES)
        .map(|c| (blake3::hash(&data[c.offset..c.offset + c.length]).to_hex().to_string(), c.offset, c.length))
        .collect()
}

pub async fn run(args: FilesArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.connection, args.device.clone())?;
    match args.command {
        FilesCommand::Put { local, remote } => put(&api, &local, &remote).await,
        FilesCommand::Get { remote, local } => get(&api, &remote, &local).await,
        FilesCommand::Ls { folder } => ls(&api, folder.as_deref().unwrap_or("/")).await,
        FilesCommand::History { remote } => history(&api, &remote).await,
        FilesCommand::Restore { remote, version } => {
            let body = json!({ "path": remote, "version": version });
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
            let body = json!({ "from": from, "to": to, "baseVersion": current["version"] });
            let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/move").json(&body)).await?;
            if !status.is_success() {
                bail!("mv {from} {to}: {}", problem(status, &answer));
            }
            println!("{from} → {to}");
            Ok(())
        }
        FilesCommand::Rm { remote } => {
            let current = api.current_version(&remote).await?.with_context(|| format!("no file at {remote}"))?;
            let body = json!({ "path": remote, "baseVersion": current["version"] });
            let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/delete").json(&body)).await?;
            if !status.is_success() {
                bail!("rm {remote}: {}", problem(status, &answer));
            }
            println!("{remote}: deleted (version {})", answer["version"]);
            Ok(())
        }
    }
}

async fn put(api: &Api, local: &Path, remote: &str) -> anyhow::Result<()> {
    let data = Arc::new(std::fs::read(local).with_context(|| format!("read {}", local.display()))?);
    let chunks = chunk(&data);
    let hashes: Vec<&String> = chunks.iter().map(|c| &c.0).collect();
    let (status, answer) =
        api.send(api.request(reqwest::Method::POST, "/v1/blocks/status").json(&json!({ "hashes": hashes }))).await?;
    if status != StatusCode::OK {
        bail!("ask which chunks are missing: {}", problem(status, &answer));
    }
    let missing: Vec<String> = serde_json::from_value(answer["missing"].clone())?;
    let todo: Vec<&(String, usize, usize)> = chunks.iter().filter(|c| missing.contains(&c.0)).collect();
    let bytes: u64 = todo.iter().map(|c| c.2 as u64).sum();
    let bar = progress(bytes, "upload");
    stream::iter(todo.into_iter().map(|(hash, offset, length)| {
        let (data, bar) = (data.clone(), bar.clone());
        async move {
            let body = data[*offset..*offset + *length].to_vec();
            let (status, answer) =
                api.send(api.request(reqwest::Method::PUT, &format!("/v1/blocks/{hash}")).body(body)).await?;
            if status != StatusCode::CREATED {
                bail!("upload chunk {hash}: {}", problem(status, &answer));
            }
            bar.inc(*length as u64);
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(TRANSFERS_IN_FLIGHT)
    .try_collect::<Vec<()>>()
    .await?;
    bar.finish_and_clear();
    let base = api.current_version(remote).await?.map_or(0, |f| f["version"].as_u64().unwrap_or(0));
    let mtime = std::fs::metadata(local)?.modified()?.duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    let body = json!({ "path": remote, "chunks": hashes, "baseVersion": base, "size": data.len(), "mtime": mtime });
    let (status, answer) = api.send(api.request(reqwest::Method::POST, "/v1/files/commit").json(&body)).await?;
    match status {
        StatusCode::CREATED => println!(
            "{remote}: version {} ({} bytes, {} chunks, {} uploaded)",
            answer["version"],
            data.len(),
            chunks.len(),
            missing.len()
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

async fn get(api: &Api, remote: &str, local: &Path) -> anyhow::Result<()> {
    let file = api.current_version(remote).await?.with_context(|| format!("no file at {remote}"))?;
    let wanted: Vec<String> = serde_json::from_value(file["chunks"].clone())?;
    // Chunks the local copy already has are reused, not downloaded.
    let existing = std::fs::read(local).unwrap_or_default();
    let mut have: HashMap<String, Vec<u8>> = HashMap::new();
    for (hash, offset, length) in chunk(&existing) {
        have.insert(hash, existing[offset..offset + length].to_vec());
    }
    let mut lacking: Vec<String> = wanted.iter().filter(|h| !have.contains_key(*h)).cloned().collect();
    lacking.dedup();
    let bar = progress(file["size"].as_u64().unwrap_or(0), "download");
    let fetched: Vec<(String, Vec<u8>)> = stream::iter(lacking.iter().map(|hash| {
        let bar = bar.clone();
        async move {
            let response = api.request(reqwest::Method::GET, &format!("/v1/blocks/{hash}")).send().await?;
            if response.status() != StatusCode::OK {
                bail!("download chunk {hash}: {}", response.status());
            }
            let bytes = response.bytes().await?.to_vec();
            if blake3::hash(&bytes).to_hex().as_str() != hash {
                bail!("chunk {hash} arrived corrupted");
            }
            bar.inc(bytes.len() as u64);
            anyhow::Ok((hash.clone(), bytes))
        }
    }))
    .buffer_unordered(TRANSFERS_IN_FLIGHT)
    .try_collect()
    .await?;
    bar.finish_and_clear();
    have.extend(fetched);
    let mut out = Vec::with_capacity(file["size"].as_u64().unwrap_or(0) as usize);
    for hash in &wanted {
        out.extend_from_slice(have.get(hash).with_context(|| format!("chunk {hash} missing"))?);
    }
    let tmp = local.with_extension("raftbox-partial");
    std::fs::write(&tmp, &out).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, local).with_context(|| format!("move into {}", local.display()))?;
    println!(
        "{remote} → {}: version {}, {} bytes, {} of {} chunks downloaded",
        local.display(),
        file["version"],
        out.len(),
        lacking.len(),
        wanted.len()
    );
    Ok(())
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

    #[test]
    fn an_edit_changes_few_chunks() {
        let mut data = vec![0u8; 8_000_000];
        blake3::Hasher::new().update(b"seed").finalize_xof().fill(&mut data);
        let before = chunk(&data);
        assert!(before.len() >= 4, "{} chunks", before.len());
        assert!(before.iter().all(|c| c.2 <= CHUNK_MAX_BYTES));
        data.splice(4_000_000..4_000_000, b"an insertion in the middle".iter().copied());
        let after = chunk(&data);
        let unchanged = after.iter().filter(|c| before.iter().any(|b| b.0 == c.0)).count();
        assert!(unchanged + 2 >= after.len(), "{unchanged} of {} chunks kept", after.len());
    }
}
