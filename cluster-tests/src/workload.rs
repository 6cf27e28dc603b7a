//! Workloads: concurrent writers that record the outcome of every operation.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{ensure, Context as _, Result};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::task::JoinSet;

use crate::*;

// ---------------------------------------------------------------------------------------------
// Workload

/// One write of a [`Workload`].
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub name: String,
    pub node: u64,
    pub started: Instant,
    pub finished: Instant,
    pub outcome: Outcome,
}

/// What a [`Workload`] should do.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Concurrent writer tasks.
    pub writers: usize,
    /// `(node id, http url)` endpoints; each write picks one at random.
    pub targets: Vec<(u64, String)>,
    pub admin_token: String,
    /// User names are `<prefix>-w<writer>-<seq>`, unique within the workload.
    pub name_prefix: String,
}

/// Writer tasks creating uniquely named users until stopped, recording every outcome. A
/// writer pauses [`RETRY_BACKOFF_MS`] after an operation that was not acknowledged.
pub struct Workload {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    records: Arc<Mutex<Vec<WriteRecord>>>,
    tasks: JoinSet<Result<()>>,
}

impl Workload {
    /// Spawns the writers; each draws its own generator from `rng`.
    pub fn spawn(http: reqwest::Client, spec: WorkloadSpec, rng: &mut StdRng) -> Workload {
        assert!(!spec.targets.is_empty(), "a workload needs at least one target");
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let records = Arc::new(Mutex::new(Vec::new()));
        let targets = Arc::new(spec.targets);
        let mut tasks = JoinSet::new();
        for writer in 0..spec.writers {
            let writer_rng = StdRng::seed_from_u64(rng.gen());
            let context = WriterContext {
                writer,
                http: http.clone(),
                targets: targets.clone(),
                admin_token: spec.admin_token.clone(),
                name_prefix: spec.name_prefix.clone(),
                stop: stop.clone(),
                acked: acked.clone(),
                records: records.clone(),
            };
            tasks.spawn(run_writer(context, writer_rng));
        }
        Workload { stop, acked, records, tasks }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Records so far that satisfy `predicate`.
    pub fn count(&self, predicate: impl Fn(&WriteRecord) -> bool) -> usize {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records.iter().filter(|record| predicate(record)).count()
    }

    /// Stops the writers (each finishes its current operation) and returns every record.
    pub async fn stop(mut self) -> Result<Vec<WriteRecord>> {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(joined) = self.tasks.join_next().await {
            joined.context("a writer task panicked")??;
        }
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *records))
    }
}

struct WriterContext {
    writer: usize,
    http: reqwest::Client,
    targets: Arc<Vec<(u64, String)>>,
    admin_token: String,
    name_prefix: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    records: Arc<Mutex<Vec<WriteRecord>>>,
}

async fn run_writer(context: WriterContext, mut rng: StdRng) -> Result<()> {
    let mut seq = 0u64;
    while !context.stop.load(Ordering::Relaxed) {
        let (node, url) = &context.targets[rng.gen_range(0..context.targets.len())];
        let name = format!("{}-w{}-{seq}", context.name_prefix, context.writer);
        seq += 1;
        let started = Instant::now();
        let outcome = create_user(&context.http, url, &context.admin_token, &name).await?;
        let finished = Instant::now();
        let acknowledged = outcome.is_ok();
        {
            let mut records = context.records.lock().unwrap_or_else(PoisonError::into_inner);
            if records.len() >= WORKLOAD_RECORDS_MAX {
                return Ok(());
            }
            records.push(WriteRecord { name, node: *node, started, finished, outcome });
        }
        if acknowledged {
            context.acked.fetch_add(1, Ordering::Relaxed);
        } else {
            tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
        }
    }
    Ok(())
}

/// Counts of a workload's outcomes.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteSummary {
    pub acknowledged: usize,
    pub rejected: usize,
    pub unknown: usize,
}

impl WriteSummary {
    pub fn of(records: &[WriteRecord]) -> WriteSummary {
        let mut summary = WriteSummary::default();
        for record in records {
            match record.outcome {
                Outcome::Ok(_) => summary.acknowledged += 1,
                Outcome::Rejected(..) => summary.rejected += 1,
                Outcome::Unknown(_) => summary.unknown += 1,
            }
        }
        summary
    }
}

impl fmt::Display for WriteSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} acknowledged, {} rejected, {} unknown", self.acknowledged, self.rejected, self.unknown)
    }
}

/// The users whose creation was acknowledged.
pub fn acknowledged_users(records: &[WriteRecord]) -> Result<Vec<CreatedUser>> {
    records
        .iter()
        .filter_map(|record| record.outcome.body().map(|body| (record, body)))
        .map(|(record, body)| CreatedUser::from_body(&record.name, body))
        .collect()
}

/// Fails on any rejected write, showing a few: a unique name must never be refused.
pub fn ensure_none_rejected(records: &[WriteRecord]) -> Result<()> {
    let rejected: Vec<String> = records
        .iter()
        .filter(|record| record.outcome.is_rejected())
        .take(10)
        .map(|record| format!("{} via node {}: {:?}", record.name, record.node, record.outcome))
        .collect();
    ensure!(rejected.is_empty(), "writes were rejected:\n{}", rejected.join("\n"));
    Ok(())
}
