//! The client survives its own cluster's defaults (issue 8): on a cluster configured as
//! `scripts/cluster up` configures it (its default rate limits, printed by
//! `scripts/cluster limits`), `raftbox files put` of a 1 GiB file through node 1 and
//! `raftbox files get` of it through node 2 bring back the same bytes, and neither client's
//! peak RSS reaches 100 MB: both stream, a few chunks at a time, and wait out 429s.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::{new_user, raftbox_bin, within, Cluster, ClusterOptions, Seed};

const TEST_DEADLINE: Duration = Duration::from_secs(600);
const FILE_BYTES: u64 = 1 << 30;
const RSS_LIMIT_KB: u64 = 100 * 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_file_goes_up_and_comes_back_with_little_memory() {
    let seed = Seed::new("big_file::a_1_gib_file_goes_up_and_comes_back_with_little_memory");
    let options =
        ClusterOptions { extra_toml: default_limits().expect("the default limits"), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster, &seed)).await;
    cluster.conclude(result);
}

/// The rate limits `scripts/cluster up` gives its nodes.
fn default_limits() -> Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster");
    let output = Command::new("bash").arg(&script).arg("limits").output().context("run scripts/cluster limits")?;
    ensure!(output.status.success(), "scripts/cluster limits: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

/// Writes `bytes` of seeded pseudo-random content (incompressible, chunked by content).
fn write_random(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut xof = blake3::Hasher::new().update(&seed.to_be_bytes()).finalize_xof();
    let mut buffer = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        xof.fill(&mut buffer[..n]);
        file.write_all(&buffer[..n])?;
        left -= n as u64;
    }
    file.flush()?;
    Ok(())
}

fn blake3_of(path: &Path) -> Result<blake3::Hash> {
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(std::fs::File::open(path)?)?;
    Ok(hasher.finalize())
}

/// Runs `raftbox files …`; returns its peak RSS (VmHWM, kB), read from /proc while it runs.
async fn files_command(url: &str, token: &str, args: &[&str]) -> Result<u64> {
    let mut child = Command::new(raftbox_bin()?)
        .arg("files")
        .args(["--url", url, "--token", token])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn raftbox files")?;
    let status_path = PathBuf::from(format!("/proc/{}/status", child.id()));
    let mut peak_kb = 0;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_path) {
            if let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let output = child.wait_with_output()?;
    ensure!(
        status.success(),
        "raftbox files {args:?}: {status}\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("raftbox files {}: {}", args[0], String::from_utf8_lossy(&output.stdout).trim());
    Ok(peak_kb)
}

async fn scenario(cluster: &mut Cluster, seed: &Seed) -> Result<()> {
    let (_, token) = new_user(cluster, 1, &format!("big-{}", seed.value()), "laptop").await?;
    let dir = tempfile::tempdir()?;
    let (up, down) = (dir.path().join("up.bin"), dir.path().join("down.bin"));
    write_random(&up, FILE_BYTES, seed.value())?;
    let started = Instant::now();
    let put_kb =
        files_command(&cluster.http_url(1), &token, &["put", up.to_str().context("path")?, "/big.bin"]).await?;
    let put_took = started.elapsed();
    let started = Instant::now();
    let get_kb =
        files_command(&cluster.http_url(2), &token, &["get", "/big.bin", down.to_str().context("path")?]).await?;
    let get_took = started.elapsed();
    eprintln!(
        "1 GiB: put {put_took:.1?} (peak RSS {} MB), get {get_took:.1?} (peak RSS {} MB)",
        put_kb / 1_000,
        get_kb / 1_000
    );
    ensure!(blake3_of(&up)? == blake3_of(&down)?, "the file came back different");
    ensure!(put_kb > 0 && get_kb > 0, "no RSS reading");
    ensure!(put_kb < RSS_LIMIT_KB, "put peaked at {put_kb} kB");
    ensure!(get_kb < RSS_LIMIT_KB, "get peaked at {get_kb} kB");
    Ok(())
}
