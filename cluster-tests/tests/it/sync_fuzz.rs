//! Invariant: three `raftbox sync` devices and a fourth writer through the API, doing random
//! creates, edits, appends, renames, case-only renames, deletes, long names, links to
//! elsewhere and kills (`kill -9`) of the devices for a while, converge — every folder and
//! the server hold the same files — and every last write of every writer survives somewhere
//! the user can find it: a file or conflicted copy, the server's history, or a device's trash.
//! Nothing is written outside the folders. Every choice comes from one printed seed;
//! `RAFTBOX_CHAOS_S` sets the length of the random phase (scripts/chaos runs it long).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::sync_device::{
    history_contents, server_feed, server_tree, tree, write_file, SyncDevice, Tree,
};
use raftbox_cluster_tests::{new_user, put_block, within, Cluster, ClusterOptions, Deadline, Seed};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{json, Value};

/// Length of the random phase, unless `RAFTBOX_CHAOS_S` says otherwise.
const PHASE_S: u64 = 30;
const DEVICES: usize = 3;
/// How long the folders may take to converge once the writers stop.
const CONVERGE: Duration = Duration::from_secs(120);
const FOLDERS: [&str; 4] = ["", "docs", "docs/deep", "Photos"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_and_the_api_converge_keeping_every_last_write() {
    let seed = Seed::new("sync_fuzz::devices_and_the_api_converge_keeping_every_last_write");
    let phase = std::env::var("RAFTBOX_CHAOS_S").ok().and_then(|v| v.parse().ok()).unwrap_or(PHASE_S);
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let limit = Duration::from_secs(phase) + CONVERGE + Duration::from_secs(120);
    let result = within(limit, scenario(&cluster, seed.rng(), phase)).await;
    cluster.conclude(result);
}

/// What one writer last left at each path (its own later writes, deletes and renames
/// supersede it; nobody else's do).
type LastWrites = BTreeMap<String, Vec<u8>>;

struct World {
    http: reqwest::Client,
    url: String,
    token: String,
    devices: Vec<SyncDevice>,
    last: Vec<LastWrites>,
    outside: PathBuf,
    ops: u64,
    counts: BTreeMap<&'static str, u64>,
}

async fn scenario(cluster: &Cluster, mut rng: StdRng, phase_s: u64) -> Result<()> {
    let (_, token) = new_user(cluster, 1, "fuzzer", "fuzzer-token").await?;
    let work = tempfile::tempdir()?;
    let outside = work.path().join("outside");
    write_file(&outside, "sentinel.txt", b"outside every synced folder")?;
    let mut devices = Vec::new();
    for d in 0..DEVICES {
        let endpoints = cluster.http_urls(&[(d as u64 % 3) + 1, ((d as u64 + 1) % 3) + 1]);
        let dir = work.path().join(format!("device{d}"));
        let guard_off = ["--max-delete-percent", "100", "--max-deletes", "100000"];
        devices.push(SyncDevice::start(&dir, &endpoints, &token, &format!("device{d}"), &guard_off)?);
    }
    let mut world = World {
        http: cluster.client(),
        url: cluster.http_url(1),
        token,
        devices,
        last: vec![LastWrites::new(); DEVICES + 1],
        outside: outside.clone(),
        ops: 0,
        counts: BTreeMap::new(),
    };
    let phase = Deadline::after(Duration::from_secs(phase_s), "the random phase");
    while !phase.expired() {
        world.step(&mut rng).await?;
        let pause = Duration::from_millis(rng.gen_range(20..120));
        tokio::time::sleep(pause).await;
    }
    eprintln!("sync fuzz: {} operations: {:?}", world.ops, world.counts);
    for device in &mut world.devices {
        if device.ensure_running().is_err() {
            device.restart(&[])?;
        }
    }
    let converged = world.converge().await?;
    world.check_last_writes(&converged).await?;
    ensure!(tree(&outside)?.len() == 1, "something was written outside the folders: {:?}", tree(&outside)?.keys());
    for device in &world.devices {
        let status = device.status()?;
        ensure!(status["failuresCount"] == 0, "{}: {status}", device.dir.display());
    }
    Ok(())
}

impl World {
    async fn step(&mut self, rng: &mut StdRng) -> Result<()> {
        self.ops += 1;
        let writer = rng.gen_range(0..=DEVICES);
        if writer == DEVICES {
            return self.api_step(rng).await;
        }
        let op = match rng.gen_range(0..100) {
            0..=24 => "create",
            25..=44 => "edit",
            45..=54 => "append",
            55..=66 => "rename",
            67..=71 => "case-rename",
            72..=81 => "delete",
            82..=86 => "long-name",
            87..=89 => "link",
            90..=92 => "kill",
            _ => "restart",
        };
        *self.counts.entry(op).or_default() += 1;
        let dir = self.devices[writer].dir.clone();
        // The user's files: not the client's temporary ones (a download under way).
        let files: Vec<String> = tree(&dir)?
            .into_keys()
            .filter(|path| !path.rsplit('/').next().unwrap_or("").starts_with(".raftbox-"))
            .collect();
        let existing = (!files.is_empty()).then(|| files[rng.gen_range(0..files.len())].clone());
        let content = self.content(rng, writer);
        let last = &mut self.last[writer];
        match (op, existing) {
            ("create", _) | ("edit" | "append" | "rename" | "case-rename" | "delete", None) => {
                let path = new_name(rng, false);
                write_file(&dir, &path, &content)?;
                last.insert(path, content);
            }
            ("long-name", _) => {
                let path = new_name(rng, true);
                write_file(&dir, &path, &content)?;
                last.insert(path, content);
            }
            ("edit", Some(path)) => {
                write_file(&dir, &path, &content)?;
                last.insert(path, content);
            }
            ("append", Some(path)) => {
                use std::io::Write as _;
                let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(dir.join(&path)) else {
                    return Ok(());
                };
                file.write_all(&content)?;
                drop(file);
                if let Ok(now) = std::fs::read(dir.join(&path)) {
                    last.insert(path, now);
                }
            }
            ("rename" | "case-rename", Some(path)) => {
                let to = if op == "rename" { new_name(rng, false) } else { flip_case(&path) };
                let Ok(moved) = std::fs::read(dir.join(&path)) else { return Ok(()) };
                std::fs::create_dir_all(dir.join(&to).parent().context("a parent")?)?;
                if std::fs::rename(dir.join(&path), dir.join(&to)).is_ok() {
                    last.remove(&path);
                    last.insert(to, moved);
                }
            }
            ("delete", Some(path)) => {
                if std::fs::remove_file(dir.join(&path)).is_ok() {
                    last.remove(&path);
                }
            }
            ("link", _) => {
                let name = format!("lnk-{}", self.ops);
                let target = if rng.gen_bool(0.5) { self.outside.clone() } else { self.outside.join("sentinel.txt") };
                // The device may not have made its folder yet.
                std::fs::create_dir_all(&dir)?;
                std::os::unix::fs::symlink(target, dir.join(name))?;
            }
            ("kill", _) => self.devices[writer].kill9()?,
            (_, _) => {
                if self.devices[writer].ensure_running().is_err() {
                    self.devices[writer].restart(&[])?;
                }
            }
        }
        Ok(())
    }

    /// The fourth writer: a commit or a delete through the API, on the current version.
    async fn api_step(&mut self, rng: &mut StdRng) -> Result<()> {
        let server = server_paths(&self.http, &self.url, &self.token).await?;
        let content = self.content(rng, DEVICES);
        let delete = rng.gen_bool(0.2) && !server.is_empty();
        let path = match (rng.gen_bool(0.6), server.is_empty()) {
            (true, false) => server.iter().nth(rng.gen_range(0..server.len())).cloned().unwrap_or_default(),
            _ => format!("/{}", new_name(rng, false)),
        };
        *self.counts.entry(if delete { "api-delete" } else { "api-commit" }).or_default() += 1;
        let current = self
            .http
            .get(format!("{}/v1/files", self.url))
            .query(&[("path", &path)])
            .bearer_auth(&self.token)
            .send()
            .await?;
        let base = if current.status().as_u16() == 200 {
            current.json::<Value>().await?["version"].as_u64().unwrap_or(0)
        } else {
            0
        };
        let relative = path.trim_start_matches('/').to_string();
        if delete {
            if base > 0 {
                let body = json!({ "path": path, "baseVersion": base });
                let answer = self
                    .http
                    .post(format!("{}/v1/files/delete", self.url))
                    .bearer_auth(&self.token)
                    .json(&body)
                    .send()
                    .await?;
                if answer.status().is_success() {
                    self.last[DEVICES].remove(&relative);
                }
            }
            return Ok(());
        }
        let hash = put_block(&self.http, &self.url, &self.token, &content).await?;
        let body = json!({ "path": path, "chunks": [hash], "baseVersion": base, "size": content.len(), "mtime": 1_700_000_000_000u64 });
        let answer = self
            .http
            .post(format!("{}/v1/files/commit", self.url))
            .bearer_auth(&self.token)
            .header("x-device-id", "api")
            .json(&body)
            .send()
            .await?;
        // A 409 kept the content as a conflicted copy: findable either way.
        ensure!(answer.status().is_success() || answer.status().as_u16() == 409, "commit {path}: {}", answer.status());
        self.last[DEVICES].insert(relative, content);
        Ok(())
    }

    /// Fresh content that says who wrote it: mostly small, sometimes several chunks.
    fn content(&self, rng: &mut StdRng, writer: usize) -> Vec<u8> {
        let length = match rng.gen_range(0..20) {
            0 => rng.gen_range(1_500_000..3_000_000),
            1..=3 => 0,
            _ => rng.gen_range(1..40_000),
        };
        let mut out = format!("writer {writer} op {}\n", self.ops).into_bytes();
        let mut filler = StdRng::seed_from_u64(self.ops.wrapping_mul(7919) ^ writer as u64);
        out.extend((0..length).map(|_| filler.gen::<u8>()));
        out
    }

    /// Waits until every folder and the server hold the same files.
    async fn converge(&mut self) -> Result<Tree> {
        let deadline = Deadline::after(CONVERGE, "the devices and the server to converge");
        loop {
            for device in &mut self.devices {
                device.ensure_running()?;
            }
            let server = server_tree(&self.http, &self.url, &self.token, None).await?;
            let trees: Vec<Tree> = self.devices.iter().map(|d| tree(&d.dir)).collect::<Result<_>>()?;
            if trees.iter().all(|t| *t == server) {
                return Ok(server);
            }
            let differences: Vec<String> = trees
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let only_here: Vec<&String> = t.keys().filter(|k| server.get(*k) != t.get(*k)).collect();
                    let only_there: Vec<&String> = server.keys().filter(|k| t.get(*k) != server.get(*k)).collect();
                    if only_here.is_empty() && only_there.is_empty() {
                        return format!("device{i}: converged");
                    }
                    // What each side holds of every path that differs (which writer's write,
                    // how long), and the device's own failures: enough to tell a missed
                    // change from a held retry without the folders, which are gone by then.
                    let describe = |content: Option<&Vec<u8>>| match content {
                        None => "nothing".to_string(),
                        Some(c) => format!(
                            "{:?} ({} bytes)",
                            String::from_utf8_lossy(
                                &c[..c.iter().position(|b| *b == b'\n').unwrap_or(c.len()).min(40)]
                            ),
                            c.len()
                        ),
                    };
                    let paths: BTreeSet<&String> = only_here.iter().chain(&only_there).copied().collect();
                    let sides: Vec<String> = paths
                        .iter()
                        .map(|p| {
                            let logs = self.devices[i].logs();
                            let mentions: Vec<&str> = logs.lines().filter(|l| l.contains(p.as_str())).collect();
                            format!(
                                "  {p}: here {}, there {}; the device's log of it:\n    {}",
                                describe(t.get(*p)),
                                describe(server.get(*p)),
                                mentions.join("\n    ")
                            )
                        })
                        .collect();
                    let failures = self.devices[i].status().map(|s| s["failures"].to_string()).unwrap_or_default();
                    format!(
                        "device{i}: differs\n{}\n  failures: {failures}\n{}",
                        sides.join("\n"),
                        self.devices[i].log_tail()
                    )
                })
                .collect();
            deadline.tick(&differences.join("\n")).await?;
        }
    }

    /// Every writer's last writes are findable: in the converged tree, the server's history
    /// of any path, or a device's trash.
    async fn check_last_writes(&self, converged: &Tree) -> Result<()> {
        let mut findable: BTreeSet<Vec<u8>> = converged.values().cloned().collect();
        for path in all_server_paths(&self.http, &self.url, &self.token).await? {
            for version in history_contents(&self.http, &self.url, &self.token, &path).await?.into_iter().flatten() {
                findable.insert(version);
            }
        }
        for device in &self.devices {
            findable.extend(trash_contents(&device.dir)?);
        }
        let mut lost = Vec::new();
        for (writer, last) in self.last.iter().enumerate() {
            for (path, content) in last {
                if !findable.contains(content) {
                    lost.push(format!("writer {writer}'s last write of {path} ({} bytes)", content.len()));
                }
            }
        }
        ensure!(lost.is_empty(), "lost writes:\n{}", lost.join("\n"));
        eprintln!(
            "sync fuzz: {} files converged; {} last writes, all findable",
            converged.len(),
            self.last.iter().map(BTreeMap::len).sum::<usize>()
        );
        Ok(())
    }
}

/// A new file name: in one of [`FOLDERS`], of mixed case, sometimes 200-245 bytes long.
fn new_name(rng: &mut StdRng, long: bool) -> String {
    let folder = FOLDERS[rng.gen_range(0..FOLDERS.len())];
    let stem = if long {
        "N".repeat(rng.gen_range(200..245))
    } else {
        let base = ["notes", "Report", "photo", "TODO", "data"][rng.gen_range(0..5)];
        format!("{base}{}", rng.gen_range(0..40))
    };
    let ext = [".txt", ".TXT", ".bin", ".md"][rng.gen_range(0..4)];
    if folder.is_empty() {
        format!("{stem}{ext}")
    } else {
        format!("{folder}/{stem}{ext}")
    }
}

/// The same path with the case of its file name's letters flipped.
fn flip_case(path: &str) -> String {
    let (folder, name) = path.rsplit_once('/').map_or(("", path), |(f, n)| (f, n));
    let flipped: String =
        name.chars().map(|c| if c.is_uppercase() { c.to_ascii_lowercase() } else { c.to_ascii_uppercase() }).collect();
    if folder.is_empty() {
        flipped
    } else {
        format!("{folder}/{flipped}")
    }
}

/// The server's live paths (`/a/b.txt`).
async fn server_paths(http: &reqwest::Client, url: &str, token: &str) -> Result<BTreeSet<String>> {
    Ok(server_tree(http, url, token, None).await?.into_keys().map(|p| format!("/{p}")).collect())
}

/// Every path the server's feed names, deleted ones too.
async fn all_server_paths(http: &reqwest::Client, url: &str, token: &str) -> Result<BTreeSet<String>> {
    Ok(server_feed(http, url, token, None).await?.into_keys().collect())
}

/// The contents of a device's trash.
fn trash_contents(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let trash = dir.join(".raftbox/trash");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&trash) else { return Ok(out) };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().ends_with(".json") {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                out.push(bytes);
            }
        }
    }
    Ok(out)
}
