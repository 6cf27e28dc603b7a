//! A device running `raftbox sync` on a folder, as the sync tests drive it: started, killed
//! (`kill -9`), stopped with Ctrl-C, restarted, its status read; and the views the tests
//! judge: a folder's files ([`tree`]), the server's live files ([`server_tree`]), and a
//! file's history ([`history_contents`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::Value;

use crate::{get_block, raftbox_bin, Deadline};

/// Every file of a folder (or the server), relative path → bytes.
pub type Tree = BTreeMap<String, Vec<u8>>;

/// How long a device may take to stop after Ctrl-C.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// A running `raftbox sync`; killed when dropped.
pub struct SyncDevice {
    child: Option<Child>,
    pub dir: PathBuf,
    pub log: PathBuf,
    /// Where its status file is (`DIR/.raftbox/status.json` unless the test moves it).
    pub status_file: PathBuf,
    args: Vec<String>,
    starts: usize,
}

impl SyncDevice {
    /// `raftbox sync DIR` through `endpoints` as `token` named `device`, with `extra`
    /// arguments; its stderr goes to `DIR.log` (then `DIR.2.log`, … on restarts).
    pub fn start(dir: &Path, endpoints: &[String], token: &str, device: &str, extra: &[&str]) -> Result<SyncDevice> {
        let mut args: Vec<String> = ["--endpoint", &endpoints.join(","), "--token", token, "--device", device]
            .iter()
            .map(|a| a.to_string())
            .collect();
        args.extend(["--interval", "2"].iter().map(|a| a.to_string()));
        args.extend(extra.iter().map(|a| a.to_string()));
        let status_file = dir.join(".raftbox/status.json");
        let mut device =
            SyncDevice { child: None, dir: dir.to_path_buf(), log: PathBuf::new(), status_file, args, starts: 0 };
        device.spawn(&[])?;
        Ok(device)
    }

    fn spawn(&mut self, extra: &[&str]) -> Result<()> {
        self.starts += 1;
        let name = self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("device").to_string();
        let suffix = if self.starts == 1 { "log".to_string() } else { format!("{}.log", self.starts) };
        self.log = self.dir.with_file_name(format!("{name}.{suffix}"));
        // The folders a client remembers as set up live under XDG_STATE_HOME: one per test.
        let state_home = self.dir.parent().map(|p| p.join(".xdg-state")).unwrap_or_default();
        let child = Command::new(raftbox_bin()?)
            .env("XDG_STATE_HOME", state_home)
            .arg("sync")
            .arg(&self.dir)
            .args(&self.args)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.log)?)
            .spawn()
            .context("spawn raftbox sync")?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL (if running), then the same device again, with `extra` arguments this time.
    pub fn restart(&mut self, extra: &[&str]) -> Result<()> {
        self.kill9()?;
        self.spawn(extra)
    }

    /// SIGKILL, and reaped.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Ctrl-C (SIGINT), then waits for the exit: the client must stop promptly.
    pub async fn stop(&mut self) -> Result<ExitStatus> {
        self.signal("-INT")?;
        self.wait_exit(STOP_DEADLINE).await
    }

    /// The exit status, once it exits by itself within `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus> {
        let deadline = Deadline::after(limit, format!("raftbox sync {} to exit", self.dir.display()));
        loop {
            let child = self.child.as_mut().context("not running")?;
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            deadline.tick(&self.log_tail()).await?;
        }
    }

    pub fn signal(&self, signal: &str) -> Result<()> {
        let Some(child) = &self.child else { return Ok(()) };
        let status = Command::new("kill").args([signal, &child.id().to_string()]).status()?;
        ensure!(status.success(), "kill {signal} {}", child.id());
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Every log line of every start.
    pub fn logs(&self) -> String {
        let name = self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("device").to_string();
        (1..=self.starts)
            .map(|n| {
                let suffix = if n == 1 { "log".to_string() } else { format!("{n}.log") };
                std::fs::read_to_string(self.dir.with_file_name(format!("{name}.{suffix}"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn ensure_running(&mut self) -> Result<()> {
        let child = self.child.as_mut().context("not running")?;
        if let Some(status) = child.try_wait()? {
            bail!("raftbox sync {} exited ({status}):\n{}", self.dir.display(), self.log_tail());
        }
        Ok(())
    }

    /// The status file the client writes after each pass.
    pub fn status(&self) -> Result<Value> {
        let path = &self.status_file;
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Polls the folder's files until `holds` (the device must keep running); the tree then.
    pub async fn wait_tree(&mut self, what: &str, limit: Duration, holds: impl Fn(&Tree) -> bool) -> Result<Tree> {
        let deadline = Deadline::after(limit, format!("{}: {what}", self.dir.display()));
        loop {
            self.ensure_running()?;
            let tree = tree(&self.dir)?;
            if holds(&tree) {
                return Ok(tree);
            }
            deadline.tick(&format!("{:?}\n{}", tree.keys().collect::<Vec<_>>(), self.log_tail())).await?;
        }
    }

    /// Polls the status until `holds`; the status then.
    pub async fn wait_status(&mut self, what: &str, limit: Duration, holds: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Deadline::after(limit, format!("{}: {what}", self.dir.display()));
        loop {
            self.ensure_running()?;
            let status = self.status().unwrap_or(Value::Null);
            if holds(&status) {
                return Ok(status);
            }
            deadline.tick(&format!("{status}\n{}", self.log_tail())).await?;
        }
    }
}

impl Drop for SyncDevice {
    fn drop(&mut self) {
        let _ = self.signal("-CONT");
        let _ = self.kill9();
    }
}

/// `raftbox sync ARGS…` run to its end (a one-off pass, or a status/trash/confirm command).
pub fn sync_command(args: &[&str]) -> Result<Output> {
    Command::new(raftbox_bin()?).arg("sync").args(args).output().context("run raftbox sync")
}

/// Every regular file under `dir` but the client's own `.raftbox/` and its in-flight
/// temporary files (`.raftbox-<hex>.tmp`, not a place a user keeps anything), with its
/// bytes; links are not followed.
pub fn tree(dir: &Path) -> Result<Tree> {
    fn visit(root: &Path, dir: &Path, out: &mut Tree) -> Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            // Not made yet, or removed as it was read: nothing there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            let relative = path.strip_prefix(root)?.to_string_lossy().into_owned();
            if relative == ".raftbox" || is_client_temporary(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                visit(root, &path, out)?;
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(&path) {
                    out.insert(relative, bytes);
                }
            }
        }
        Ok(())
    }
    let mut out = Tree::new();
    visit(dir, dir, &mut out)?;
    Ok(out)
}

/// A name the client gives a download in flight: `.raftbox-<16 hex>.tmp`.
fn is_client_temporary(name: &str) -> bool {
    name.strip_prefix(".raftbox-")
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Deterministic bytes for `seed`.
pub fn pseudo_bytes(seed: &str, length: usize) -> Vec<u8> {
    let mut out = vec![0u8; length];
    blake3::Hasher::new().update(seed.as_bytes()).finalize_xof().fill(&mut out);
    out
}

/// Writes `content` at `path` under `dir`, making folders.
pub fn write_file(dir: &Path, path: &str, content: &[u8]) -> Result<()> {
    let target = dir.join(path);
    std::fs::create_dir_all(target.parent().context("a parent")?)?;
    std::fs::write(&target, content).with_context(|| format!("write {}", target.display()))
}

/// The latest change of every path in `namespace` (the caller's personal one if `None`), read
/// through `/v1/sync` from cursor 0: path (`/a/b.txt`) → the change, deleted ones included.
pub async fn server_feed(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    namespace: Option<&str>,
) -> Result<BTreeMap<String, Value>> {
    let namespace = match namespace {
        Some(ns) => ns.to_string(),
        None => {
            let me: Value = http.get(format!("{url}/v1/me")).bearer_auth(token).send().await?.json().await?;
            me["namespaceId"].as_str().context("no namespace in /v1/me")?.to_string()
        }
    };
    let mut latest = BTreeMap::new();
    let mut cursor = "0".to_string();
    loop {
        let page: Value = http
            .get(format!("{url}/v1/sync"))
            .query(&[("cursor", cursor.as_str()), ("limit", "1000")])
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        for change in page["changes"].as_array().context("a sync page")? {
            if let (Some(ns), Some(path)) = (change["namespaceId"].as_str(), change["path"].as_str()) {
                if ns == namespace {
                    latest.insert(path.to_string(), change.clone());
                }
            }
        }
        cursor = page["cursor"].as_str().context("a cursor")?.to_string();
        if page["hasMore"].as_bool() != Some(true) {
            return Ok(latest);
        }
    }
}

/// The server's live files in `namespace` (the caller's personal one if `None`): relative
/// path → bytes.
pub async fn server_tree(http: &reqwest::Client, url: &str, token: &str, namespace: Option<&str>) -> Result<Tree> {
    let mut out = Tree::new();
    for (path, change) in server_feed(http, url, token, namespace).await? {
        if change["deleted"].as_bool() == Some(true) {
            continue;
        }
        let mut bytes = Vec::new();
        for hash in change["chunks"].as_array().context("chunks")? {
            bytes.extend(get_block(http, url, token, hash.as_str().unwrap_or("")).await?);
        }
        out.insert(path.trim_start_matches('/').to_string(), bytes);
    }
    Ok(out)
}

/// Polls `server_tree` until `holds`; the tree then.
pub async fn wait_server(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    limit: Duration,
    what: &str,
    holds: impl Fn(&Tree) -> bool,
) -> Result<Tree> {
    let deadline = Deadline::after(limit, format!("server: {what}"));
    loop {
        let tree = server_tree(http, url, token, None).await?;
        if holds(&tree) {
            return Ok(tree);
        }
        deadline.tick(&format!("{:?}", tree.keys().collect::<Vec<_>>())).await?;
    }
}

/// The content of every kept version of `path`, newest first (deletions as `None`).
pub async fn history_contents(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    path: &str,
) -> Result<Vec<Option<Vec<u8>>>> {
    let body: Value = http
        .get(format!("{url}/v1/files/history"))
        .query(&[("path", path), ("limit", "1000")])
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    let mut out = Vec::new();
    for version in body["versions"].as_array().with_context(|| format!("history of {path}: {body}"))? {
        if version["deleted"].as_bool() == Some(true) {
            out.push(None);
            continue;
        }
        let mut bytes = Vec::new();
        for hash in version["chunks"].as_array().context("chunks")? {
            bytes.extend(get_block(http, url, token, hash.as_str().unwrap_or("")).await?);
        }
        out.push(Some(bytes));
    }
    Ok(out)
}

/// Whether `content` survives in `tree` (as any file) — the file itself or a copy.
pub fn holds(tree: &Tree, content: &[u8]) -> bool {
    tree.values().any(|bytes| bytes == content)
}
