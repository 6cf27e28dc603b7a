//! What every test needs before it talks to a node: the `raftbox` binary, free ports,
//! tokens, the harness's HTTP client, the seed of a run and deadlines.

use std::env;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
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

/// `n` distinct free loopback ports. All listeners are held until every port is chosen, so
/// the ports are distinct; they are released on return for the nodes to bind.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()
        .context("bind a free loopback port")?;
    listeners.iter().map(|listener| Ok(listener.local_addr().context("read a bound port")?.port())).collect()
}

/// A fresh admin token: `rbx_` and base64url (no padding) of 32 random bytes, the same shape
/// `scripts/cluster up` writes.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill(&mut bytes[..]);
    format!("rbx_{}", base64url(&bytes))
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b0 = u32::from(chunk[0]);
        let b1 = u32::from(chunk.get(1).copied().unwrap_or(0));
        let b2 = u32::from(chunk.get(2).copied().unwrap_or(0));
        let triple = (b0 << 16) | (b1 << 8) | b2;
        // 1 byte → 2 characters, 2 → 3, 3 → 4.
        for i in 0..=chunk.len() {
            let sextet = (triple >> (18 - 6 * i)) & 63;
            out.push(char::from(ALPHABET[sextet as usize]));
        }
    }
    out
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
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn base64url_matches_rfc4648_vectors() {
        let check = |input: &[u8], expected: &str| assert_eq!(base64url(input), expected);
        check(b"", "");
        check(b"f", "Zg");
        check(b"fo", "Zm8");
        check(b"foo", "Zm9v");
        check(b"foob", "Zm9vYg");
        check(b"fooba", "Zm9vYmE");
        check(b"foobar", "Zm9vYmFy");
        check(&[0xfb, 0xff], "-_8");
    }

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
}
