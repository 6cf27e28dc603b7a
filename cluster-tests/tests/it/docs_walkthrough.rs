//! The README's walk-through and the user guide run as written: every `sh` block of
//! `README.md`, then of `docs/user-guide.md`, in order, as one bash script from the checkout,
//! against a cluster started by `scripts/cluster up` with a home and port base of its own.
//! A command that fails fails the test, naming the block it came from, so the docs cannot
//! drift from what the code does.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use raftbox_cluster_tests::{free_port_range, raftbox_bin};

/// The documents whose `sh` blocks run, in this order (one shell: variables carry over).
const DOCUMENTS: [&str; 2] = ["README.md", "docs/user-guide.md"];
/// At least this many blocks each, so a renamed fence cannot quietly skip a document.
const BLOCKS_MIN: [usize; 2] = [2, 7];
/// `scripts/cluster` numbers node N's ports base+N (HTTP) and base+10+N (gRPC), N ≤ 9.
const PORT_RANGE: u16 = 20;
/// The whole walk-through's deadline (a job that fires five seconds after its creation, a
/// sync of two folders, a few dozen commands).
const DEADLINE: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(100);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// The `sh` blocks of a markdown text: (line of the fence, body).
fn sh_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (number, line) in markdown.lines().enumerate() {
        match open.as_mut() {
            None if line.trim_end() == "```sh" => open = Some((number + 1, String::new())),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(open.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    blocks
}

/// The environment of `scripts/cluster` for this test's cluster.
fn cluster_env(command: &mut Command, home: &Path, base: u16, bin: &Path) {
    command
        .current_dir(repo())
        .env("RAFTBOX_HOME", home.join("cluster"))
        .env("RAFTBOX_PORT_BASE", base.to_string())
        .env("RAFTBOX_BIN", bin)
        // The sync client remembers folders under $XDG_STATE_HOME; keep them in the test's.
        .env("HOME", home.join("home"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("RAFTBOX_URL")
        .env_remove("RAFTBOX_TOKEN")
        .env_remove("RAFTBOX_TOKEN_FILE")
        .env_remove("RAFTBOX_TLS")
        .env_remove("RAFTBOX_RATE_LIMITS");
}

/// Stops the cluster (and anything the script left running) however the test ends.
struct Teardown {
    home: PathBuf,
    base: u16,
    bin: PathBuf,
    script_group: Option<u32>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(group) = self.script_group {
            // The script's whole process group: a sync client or receiver it left running.
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).stderr(Stdio::null()).status();
        }
        let mut down = Command::new("bash");
        down.arg("scripts/cluster").arg("down");
        cluster_env(&mut down, &self.home, self.base, &self.bin);
        let _ = down.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

#[test]
fn the_readme_and_the_user_guide_run_as_written() -> Result<()> {
    let mut script = String::from("set -euo pipefail\n");
    for (document, min) in DOCUMENTS.iter().zip(BLOCKS_MIN) {
        let text = std::fs::read_to_string(repo().join(document)).with_context(|| format!("read {document}"))?;
        let blocks = sh_blocks(&text);
        ensure!(blocks.len() >= min, "{document}: {} sh blocks, expected at least {min}", blocks.len());
        for (line, body) in blocks {
            script.push_str(&format!("echo '>>> {document}:{line}' >&2\n{body}"));
        }
    }
    script.push_str("echo '>>> walk-through done' >&2\n");

    let dir = tempfile::tempdir()?;
    let home = dir.path().to_path_buf();
    std::fs::create_dir_all(home.join("home"))?;
    let base = free_port_range(PORT_RANGE)?;
    let bin = raftbox_bin()?;
    let mut teardown = Teardown { home: home.clone(), base, bin: bin.clone(), script_group: None };

    let mut run = Command::new("bash");
    run.arg("-c").arg(&script);
    cluster_env(&mut run, &home, base, &bin);
    let mut child = run
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start bash")?;
    teardown.script_group = Some(child.id());
    // Drain both pipes while waiting, so a chatty command never blocks on a full pipe.
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            break None;
        }
        std::thread::sleep(POLL);
    };
    if status.is_none() {
        // Past the deadline: end the script and whatever it started, then report.
        drop(teardown);
        let _ = child.wait();
        teardown = Teardown { home: home.clone(), base, bin: bin.clone(), script_group: None };
    }
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let last_block = err.lines().filter(|l| l.starts_with(">>> ")).last().unwrap_or(">>> (none)").to_string();
    let tail =
        |text: &str| text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    match status {
        Some(status) if status.success() => {
            ensure!(last_block == ">>> walk-through done", "the script ended early, after {last_block}");
            eprintln!("walk-through: every block ran in {:.1} s", started.elapsed().as_secs_f64());
        }
        Some(status) => anyhow::bail!(
            "the walk-through failed ({status}) in {}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}",
            last_block.trim_start_matches(">>> "),
            tail(&out),
            tail(&err)
        ),
        None => anyhow::bail!(
            "the walk-through ran past {DEADLINE:?}, in {}\n--- stderr (tail)\n{}",
            last_block.trim_start_matches(">>> "),
            tail(&err)
        ),
    }
    drop(teardown);
    Ok(())
}

#[test]
fn sh_blocks_are_found_and_other_fences_skipped() {
    let text = "intro\n```sh\na\nb\n```\n```text\nnot run\n```\n```sh\nc\n```\n";
    assert_eq!(sh_blocks(text), vec![(2, "a\nb\n".to_string()), (9, "c\n".to_string())]);
}
