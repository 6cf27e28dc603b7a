//! What every test needs before it talks to a node: the `raftbox` binary, free ports,
//! tokens, the harness's HTTP client, the seed of a run and deadlines.

use std::collections::BTreeSet;
use std::env;
use std::future::Future;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::*;

// ---------------------------------------------------------------------------------------------
// Locating the binary, ports, tokens

/// The `raftbox` binary under test: `$RAFTBOX_BIN`, else the `raftbox` executable in the
/// target profile directory that holds this test executable (`<target>/debug/deps/it-…`).
///
/// Cargo does not build another package's binary for an integration test, so the binary must
/// have been built first (`cargo build -p raftbox`; `scripts/test` builds the workspace).
pub fn raftbox_bin() -> Result<PathBuf> {
    if let Some(path) = env::var_os(BIN_ENV) {
        let path = PathBuf::from(path);
        ensure!(path.is_file(), "{BIN_ENV}={} is not a file", path.display());
        return Ok(path);
    }
    let exe = env::current_exe().context("locate the test executable")?;
    exe.ancestors()
        .skip(1)
        .take(BIN_SEARCH_DEPTH)
        .map(|dir| dir.join("raftbox"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow!(
                "no `raftbox` binary found in the target directory above {}; build it first \
                 with `cargo build -p raftbox` (scripts/test does), or set {BIN_ENV}",
                exe.display()
            )
        })
}

/// Where test ports are drawn from: below 32768, the start of the kernel's ephemeral range,
/// so no outgoing connection can take a port between the harness choosing it and a node
/// binding it.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// Ports this process has handed out. A port is handed out once per process, so two nodes
/// (of one cluster or of two tests running side by side) never get the same port, even after
/// the first has stopped.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// `n` distinct free loopback ports from [`TEST_PORTS`], none handed out before by this
/// process. A port counts as free when it can be bound on loopback now; it is released on
/// return for the node to bind.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = rand::thread_rng();
    let mut ports = Vec::with_capacity(n);
    let mut tries = 0;
    while ports.len() < n {
        tries += 1;
        ensure!(
            tries <= FREE_PORT_TRIES,
            "no free loopback port in {TEST_PORTS:?} after {FREE_PORT_TRIES} tries ({} handed out \
             by this process)",
            handed_out.len()
        );
        let port = rng.gen_range(TEST_PORTS);
        if handed_out.contains(&port) || TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        handed_out.insert(port);
        ports.push(port);
    }
    Ok(ports)
}

/// A base port `b` such that `b..b + len` are all free and handed out to the caller, for a
/// program that numbers its ports from a base (`scripts/cluster`'s `RAFTBOX_PORT_BASE`).
pub fn free_port_range(len: u16) -> Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = rand::thread_rng();
    for _ in 0..FREE_PORT_TRIES {
        let base = rng.gen_range(TEST_PORTS.start..TEST_PORTS.end - len);
        let range = base..base + len;
        let free = range
            .clone()
            .all(|port| !handed_out.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok());
        if free {
            handed_out.extend(range);
            return Ok(base);
        }
    }
    bail!("no {len} consecutive free loopback ports in {TEST_PORTS:?} after {FREE_PORT_TRIES} tries")
}

/// How many random ports [`free_ports`] tries before it gives up.
const FREE_PORT_TRIES: usize = 10_000;

/// A fresh admin token: `rbx_` and base64url (no padding) of 32 random bytes, the same shape
/// `scripts/cluster up` writes.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill(&mut bytes[..]);
    format!("rbx_{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// An HTTP client for talking to nodes: no proxy (nodes are on loopback), bounded connect
/// and request times.
pub fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(ms(CONNECT_TIMEOUT_MS))
        .timeout(ms(REQUEST_TIMEOUT_MS))
        .build()
        .context("build the HTTP client")
}

/// [`http_client`] for a TLS cluster: it trusts the CA in `ca_pem` and nothing else, and
/// presents `identity` (a PEM certificate chain followed by its key) when given.
pub fn tls_http_client(ca_pem: &[u8], identity: Option<&[u8]>) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .no_proxy()
        .connect_timeout(ms(CONNECT_TIMEOUT_MS))
        .timeout(ms(REQUEST_TIMEOUT_MS));
    for cert in reqwest::Certificate::from_pem_bundle(ca_pem).context("parse the CA")? {
        builder = builder.add_root_certificate(cert);
    }
    if let Some(pem) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(pem).context("parse the client identity")?);
    }
    builder.build().context("build the TLS HTTP client")
}

// ---------------------------------------------------------------------------------------------
// Seeds and deadlines

/// The one source of a test's random choices. Taken from `$RAFTBOX_SEED` when set, else
/// random; printed at creation and again when the test panics, with the replay command.
/// Settings that shape a chaos run's schedule besides the seed, so a replay sets them too.
const REPLAY_ENVS: [&str; 2] = ["RAFTBOX_CHAOS_S", "RAFTBOX_NEMESES"];

pub struct Seed {
    value: u64,
    test: String,
}

impl Seed {
    /// `test` is the test's path inside the `it` binary, e.g. `failover::leader_killed`.
    pub fn new(test: &str) -> Seed {
        let value = match env::var(SEED_ENV) {
            Ok(text) => {
                text.trim().parse().unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not an unsigned integer"))
            }
            Err(_) => rand::random(),
        };
        let seed = Seed { value, test: test.to_owned() };
        eprintln!("seed {value}; replay with: {}", seed.replay_command());
        seed
    }

    pub fn value(&self) -> u64 {
        self.value
    }

    /// A generator seeded with this seed; every call starts the same sequence.
    pub fn rng(&self) -> StdRng {
        StdRng::seed_from_u64(self.value)
    }

    /// The test's path inside the `it` binary.
    pub fn test(&self) -> &str {
        &self.test
    }

    /// The command that replays this run: the seed, and the chaos settings in force
    /// (`RAFTBOX_CHAOS_S`, `RAFTBOX_NEMESES`), which shape the schedule too.
    pub fn replay_command(&self) -> String {
        let mut settings = format!("{SEED_ENV}={}", self.value);
        for name in REPLAY_ENVS {
            if let Ok(value) = env::var(name) {
                settings.push_str(&format!(" {name}={value}"));
            }
        }
        format!("{settings} cargo test --workspace --test cluster -- --exact {}", self.test)
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test {} failed; replay with: {}", self.test, self.replay_command());
        }
    }
}

/// A condition awaited by polling: `tick` sleeps one poll interval, or fails once the limit
/// has passed, naming what was awaited and the last observation.
pub struct Deadline {
    what: String,
    limit: Duration,
    until: Instant,
}

impl Deadline {
    pub fn after(limit: Duration, what: impl Into<String>) -> Deadline {
        Deadline { what: what.into(), limit, until: Instant::now() + limit }
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.until
    }

    pub async fn tick(&self, last_observation: &str) -> Result<()> {
        if self.expired() {
            bail!("{} not reached within {:?}; last observation: {last_observation}", self.what, self.limit);
        }
        let remaining = self.until.saturating_duration_since(Instant::now());
        tokio::time::sleep(remaining.min(ms(POLL_INTERVAL_MS))).await;
        Ok(())
    }
}

/// Runs a test scenario under an overall deadline; exceeding it is an error.
pub async fn within(limit: Duration, scenario: impl Future<Output = Result<()>>) -> Result<()> {
    match tokio::time::timeout(limit, scenario).await {
        Ok(result) => result,
        Err(_) => bail!("the test exceeded its overall deadline of {limit:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_has_prefix_and_43_characters() {
        let token = generate_token();
        assert!(token.starts_with("rbx_"));
        assert_eq!(token.len(), 4 + 43);
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(6).expect("bind ports");
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 6);
    }

    #[test]
    fn free_ports_are_never_handed_out_twice_and_lie_below_the_ephemeral_range() {
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            for port in free_ports(2).expect("bind ports") {
                assert!(TEST_PORTS.contains(&port), "port {port} outside {TEST_PORTS:?}");
                assert!(seen.insert(port), "port {port} handed out twice");
            }
        }
    }
}

/// Runs the `raftbox` CLI with `args` (no token from the environment) and returns what it
/// did: a test judges the exit status and the output itself.
pub async fn run_cli(args: &[&str]) -> Result<std::process::Output> {
    tokio::process::Command::new(raftbox_bin()?)
        .args(args)
        .env_remove("RAFTBOX_TOKEN")
        .env_remove("RAFTBOX_TOKEN_FILE")
        .env_remove("RAFTBOX_URL")
        .output()
        .await
        .context("run raftbox")
}

/// Copies directory `from` into `to` (created), as `cp -a` does: a machine's disk image.
pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .context("run cp")?;
    ensure!(status.success(), "cp -a {} {}: {status}", from.display(), to.display());
    Ok(())
}
