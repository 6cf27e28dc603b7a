//! A bystander for the hostile-tenant tests: an ordinary user committing small files, one
//! at a time, through one node while another user attacks, recording each commit's latency
//! and whether it succeeded; and the verdict the tests judge — the bystander's p50 and p99
//! before and during the attack, its failures, and the cluster's term before and after.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

use crate::{new_user, put_block, Cluster, Deadline};

/// How long one bystander commit may take before it counts as failed.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// One commit: how long it took, and whether it was acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub latency: Duration,
    pub ok: bool,
}

pub struct Bystander {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// Latencies at the 50th and 99th percentile, and failures, of some samples.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub commits: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub failures: usize,
}

impl Latency {
    pub fn of(samples: &[Sample]) -> Latency {
        let mut ok: Vec<Duration> = samples.iter().filter(|s| s.ok).map(|s| s.latency).collect();
        ok.sort();
        let at = |q: f64| ok.get(((ok.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default();
        Latency {
            commits: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            failures: samples.iter().filter(|s| !s.ok).count(),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} commits, p50 {:.1} ms, p99 {:.1} ms, {} failed",
            self.commits,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.failures
        )
    }
}

impl Bystander {
    /// A new user committing through node `node`, started.
    pub async fn start(cluster: &Cluster, node: u64) -> Result<Bystander> {
        Bystander::start_as(cluster, node, "bystander").await
    }

    /// [`Bystander::start`] as a new user named `name` (one cluster, several attacks).
    pub async fn start_as(cluster: &Cluster, node: u64, name: &str) -> Result<Bystander> {
        let (_, token) = new_user(cluster, node, name, "bystander-token").await?;
        let (http, url) = (cluster.client(), cluster.http_url(node));
        let hash = put_block(&http, &url, &token, b"a bystander's file").await?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (kept, stopping) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                n += 1;
                let body = json!({ "path": format!("/by/{n}.txt"), "chunks": [hash], "baseVersion": 0, "size": 18, "mtime": 1 });
                let started = Instant::now();
                let sent = http
                    .post(format!("{url}/v1/files/commit"))
                    .bearer_auth(&token)
                    .timeout(COMMIT_TIMEOUT)
                    .json(&body)
                    .send()
                    .await;
                let ok = matches!(&sent, Ok(answer) if answer.status().as_u16() == 201);
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(Sample { latency: started.elapsed(), ok });
            }
        });
        Ok(Bystander { samples, stop, task })
    }

    /// How many commits it has made.
    pub fn count(&self) -> usize {
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits until it has made `n` commits in all (its baseline, before an attack).
    pub async fn wait_for(&self, n: usize) -> Result<()> {
        let deadline = Deadline::after(Duration::from_secs(60), format!("{n} bystander commits"));
        while self.count() < n {
            deadline.tick(&format!("{} so far", self.count())).await?;
        }
        Ok(())
    }

    /// Stops it; the samples before and after `mark` (a [`Bystander::count`] taken when the
    /// attack began).
    pub async fn stop(self, mark: usize) -> (Latency, Latency) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mark = mark.min(samples.len());
        (Latency::of(&samples[..mark]), Latency::of(&samples[mark..]))
    }
}

/// The niceness of an attacker's thread: the lowest priority.
const ATTACKER_NICENESS: i32 = 19;

/// An attack's traffic, generated on a thread of its own at the lowest priority
/// ([`Attacker::spawn`]). On one small machine the test's own client work (thousands of
/// requests a second built, sent and read) competes for the cores the nodes run on; a real
/// attacker's client runs elsewhere. At the lowest priority that work takes only the CPU the
/// nodes and the bystander leave, so the bystander's latency measures what the *nodes* spend
/// on the attack. (In CI the password guesser, at normal priority in the test's runtime,
/// tripled the bystander's p99 on its own.)
pub struct Attacker<T> {
    thread: std::thread::JoinHandle<Result<T>>,
}

impl<T: Send + 'static> Attacker<T> {
    /// Runs `attack` (made on the new thread) on a one-thread runtime of its own.
    pub fn spawn<F, Fut>(name: &str, attack: F) -> Result<Attacker<T>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let thread = std::thread::Builder::new().name(format!("attacker-{name}")).spawn(move || {
            rustix::process::setpriority_process(Some(rustix::thread::gettid()), ATTACKER_NICENESS)
                .context("lower the attacker's priority")?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            Ok(runtime.block_on(attack()))
        })?;
        Ok(Attacker { thread })
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the attack to end and hands back what it returned.
    pub async fn finish(self) -> Result<T> {
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the attacker's thread panicked"))?
    }
}

/// The cluster's term as node `node` sees it.
pub async fn term(cluster: &Cluster, node: u64) -> Result<u64> {
    let view: Value =
        cluster.client().get(format!("{}/v1/cluster", cluster.http_url(node))).send().await?.json().await?;
    view["term"].as_u64().context("a term in /v1/cluster")
}

/// The verdict of an attack: the term did not move, no bystander commit failed, and the
/// bystander's p99 during the attack stayed within three times its p99 before. Prints the
/// row for the closing note's table.
pub fn judge(attack: &str, attacker: &str, before: Latency, during: Latency, terms: (u64, u64)) -> Result<()> {
    eprintln!("hostile | {attack} | {attacker} | before: {before} | during: {during} | term {} → {}", terms.0, terms.1);
    ensure!(terms.0 == terms.1, "{attack}: the term moved from {} to {}", terms.0, terms.1);
    ensure!(during.failures == 0 && before.failures == 0, "{attack}: bystander commits failed: {during}");
    ensure!(during.commits > 0, "{attack}: the bystander made no commit during the attack");
    ensure!(
        during.p99 <= before.p99 * 3,
        "{attack}: the bystander's p99 went from {:?} to {:?} (more than 3x)",
        before.p99,
        during.p99
    );
    Ok(())
}
