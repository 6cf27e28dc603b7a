//! What a running `raftbox sync` is doing, for `raftbox sync status DIR`: the client writes
//! `status.json` beside its state database after every pass (atomically: a temporary file
//! renamed over it), and the status command reads it, also when no client runs. The state
//! database itself is held by the running client, so the status goes through this file.
//! `raftbox sync confirm-deletes DIR` leaves `confirm-deletes` there, which the running client
//! takes at its next pass.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

use super::engine::{Report, Tally};
use super::folder::now_ns;
use super::state::{Direction, Failure};

/// Failures listed in the status file, at most (the count is always whole).
const FAILURES_LISTED_MAX: usize = 200;

/// The status file's content.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub pid: u32,
    pub folder: String,
    pub namespace: String,
    /// `starting`, `up to date`, `syncing`, `paused`, `offline`, `stopped`.
    pub state: String,
    /// Why, when paused, offline or stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub read_only: bool,
    pub updated_ms: u64,
    #[serde(default)]
    pub last_pass: Option<Tally>,
    #[serde(default)]
    pub failures: Vec<FailureView>,
    #[serde(default)]
    pub failures_count: usize,
    #[serde(default)]
    pub report: Report,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureView {
    pub path: String,
    pub direction: Direction,
    pub reason: String,
    pub attempts: u32,
    pub retry_at_ms: u64,
}

impl Status {
    pub fn with_failures(mut self, failures: Vec<(String, Failure)>) -> Status {
        self.failures_count = failures.len();
        self.failures = failures
            .into_iter()
            .take(FAILURES_LISTED_MAX)
            .map(|(path, f)| FailureView {
                path,
                direction: f.direction,
                reason: f.reason,
                attempts: f.attempts,
                retry_at_ms: f.retry_at_ms,
            })
            .collect();
        self
    }
}

/// Where a state database's status file is.
pub fn path_beside(state: &Path) -> PathBuf {
    state.with_file_name(STATUS_FILE)
}

/// Where a state database's confirmation of deletions is.
pub fn confirm_path_beside(state: &Path) -> PathBuf {
    state.with_file_name(CONFIRM_FILE)
}

/// The folder of the status file and the confirmation, held open: while the synced folder
/// is moved away (and the state with it), the status still reaches the moved folder.
pub struct StatusDir(OwnedFd);

const STATUS_FILE: &str = "status.json";
const CONFIRM_FILE: &str = "confirm-deletes";

impl StatusDir {
    /// The folder holding the state database `state`.
    pub fn open(state: &Path) -> anyhow::Result<StatusDir> {
        let dir = state.parent().context("a state file without a folder")?;
        let fd = rfs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(std::io::Error::from)
            .with_context(|| format!("open {}", dir.display()))?;
        Ok(StatusDir(fd))
    }

    /// Writes `status` atomically (a temporary file renamed over the old one).
    pub fn write(&self, status: &Status) -> anyhow::Result<()> {
        let status = Status { updated_ms: now_ns() / 1_000_000, pid: std::process::id(), ..status.clone() };
        let temp = "status.json.tmp";
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(&self.0, temp, flags, Mode::from_raw_mode(0o644))
            .map_err(std::io::Error::from)
            .context("write the status")?;
        std::fs::File::from(fd).write_all(&serde_json::to_vec_pretty(&status)?).context("write the status")?;
        rfs::renameat(&self.0, temp, &self.0, STATUS_FILE).map_err(std::io::Error::from).context("write the status")?;
        Ok(())
    }

    /// Takes (and removes) the fingerprint of the held deletions the user confirmed, if any.
    pub fn take_confirmation(&self) -> Option<String> {
        let fd = rfs::openat(&self.0, CONFIRM_FILE, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .ok()?;
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).ok()?;
        let _ = rfs::unlinkat(&self.0, CONFIRM_FILE, AtFlags::empty());
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    }
}

pub fn read(path: &Path) -> anyhow::Result<Status> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("read {} (has `raftbox sync` ever run on this folder?)", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not a status file", path.display()))
}

/// Whether process `pid` still runs (as the status file's writer).
fn running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The status as `raftbox sync status` prints it.
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    let age_s = (now_ns() / 1_000_000).saturating_sub(status.updated_ms) / 1000;
    let alive = running(status.pid);
    let state = if alive { status.state.as_str() } else { "not running" };
    out.push_str(&format!("folder:    {}\nnamespace: {}\n", status.folder, status.namespace));
    out.push_str(&format!(
        "state:     {state}{} (as of {age_s} s ago{})\n",
        if status.read_only { ", read-only (changes here are not sent)" } else { "" },
        if alive { format!(", pid {}", status.pid) } else { format!("; last pid {}", status.pid) }
    ));
    if let Some(reason) = &status.reason {
        out.push_str(&format!("why:       {reason}\n"));
    }
    if let Some(t) = &status.last_pass {
        out.push_str(&format!(
            "last pass: ↑ {} files, ↓ {} files, {} moved, {} deleted here, {} there, {} conflicts, {} busy\n",
            t.up_files, t.down_files, t.moved, t.deleted_here, t.deleted_there, t.conflicts, t.busy
        ));
    }
    let r = &status.report;
    if !r.held_deletes.is_empty() {
        out.push_str(&format!(
            "held:      {}: run `raftbox sync confirm-deletes {}` if you meant it\n",
            r.held_deletes[0], status.folder
        ));
        for path in r.held_deletes.iter().skip(1) {
            out.push_str(&format!("           {path}\n"));
        }
    }
    if !r.not_sent.is_empty() {
        out.push_str(&format!("not sent:  {} local change(s) (read-only folder):\n", r.not_sent.len()));
        for path in &r.not_sent {
            out.push_str(&format!("           {path}\n"));
        }
    }
    out.push_str(&format!("failed:    {} file(s)\n", status.failures_count));
    for f in &status.failures {
        let dir = match f.direction {
            Direction::Up => "↑",
            Direction::Down => "↓",
        };
        let retry_s = f.retry_at_ms.saturating_sub(now_ns() / 1_000_000) / 1000;
        out.push_str(&format!("  {dir} {}: {} ({} attempt(s), next in {retry_s} s)\n", f.path, f.reason, f.attempts));
    }
    for (path, why) in r.blind.iter().chain(&r.skipped) {
        out.push_str(&format!("skipped:   {path}: {why}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_round_trips_and_renders_what_needs_attention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("status.json");
        let status_dir = StatusDir::open(&dir.path().join("state.redb")).expect("status dir");
        let failure = Failure::next(None, Direction::Down, "the name is too long".into(), None, now_ns() / 1_000_000);
        let status = Status {
            folder: "/home/u/box".into(),
            namespace: "ns".into(),
            state: "up to date".into(),
            report: Report {
                held_deletes: vec!["1200 deletions held".into(), "/a".into()],
                blind: vec![("link".into(), "a symbolic link".into())],
                ..Report::default()
            },
            ..Status::default()
        }
        .with_failures(vec![("/x".into(), failure)]);
        status_dir.write(&status).expect("write");
        let read_back = read(&path).expect("read");
        assert_eq!(read_back.pid, std::process::id());
        let text = render(&read_back);
        assert!(text.contains("up to date"), "{text}");
        assert!(text.contains("/x: the name is too long"), "{text}");
        assert!(text.contains("confirm-deletes"), "{text}");
        assert!(text.contains("link: a symbolic link"), "{text}");
        std::fs::write(dir.path().join("confirm-deletes"), "ab12\n").expect("write");
        assert_eq!(status_dir.take_confirmation(), Some("ab12".to_string()));
        assert_eq!(status_dir.take_confirmation(), None);
    }
}
