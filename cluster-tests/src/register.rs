//! The files workload: concurrent clients commit and read a few paths through random
//! nodes, each commit a compare-and-set on the version the client last saw, each with
//! content of its own (one unique block). Every operation is recorded as invoke → ok /
//! conflict / unknown ([`crate::checker::Operation`]), so a history can be checked
//! linearizable per path; conflicting commits record the conflicted copy that must hold
//! their content.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::checker::{Operation, RegisterInput, RegisterOutput};
use crate::client::{send, Outcome};
use crate::{ms, RETRY_BACKOFF_MS};

/// Content ids of one client start at `client * CONTENT_IDS_PER_CLIENT`.
const CONTENT_IDS_PER_CLIENT: u64 = 1_000_000;
/// The content id a read reports for chunks that no commit of the workload wrote.
pub const FOREIGN_CONTENT: u64 = u64::MAX;

/// What the workload does.
#[derive(Debug, Clone)]
pub struct RegisterSpec {
    pub clients: usize,
    pub paths: Vec<String>,
    /// HTTP URLs of the nodes; each operation picks one at random, of those not forked.
    pub targets: Vec<String>,
    /// Nodes serving another cluster for now (`Cluster::forked_nodes`): never called.
    pub forked: crate::ForkedNodes,
    pub token: String,
    /// Share of reads among operations.
    pub read_ratio: f64,
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct RegisterRecord {
    pub path: String,
    pub op: Operation<RegisterInput, RegisterOutput>,
    pub node: String,
    /// A conflicting commit's conflicted copy: its path.
    pub conflicted_copy: Option<String>,
    /// Why the outcome is unknown, for the history file.
    pub note: String,
}

impl RegisterRecord {
    /// One JSON line for the history file.
    pub fn to_json(&self) -> Value {
        json!({
            "path": self.path, "client": self.op.client, "input": format!("{:?}", self.op.input),
            "callUs": self.op.call, "retUs": self.op.ret.as_ref().map(|(t, _)| *t),
            "output": self.op.ret.as_ref().map(|(_, o)| format!("{o:?}")), "node": self.node,
            "conflictedCopy": self.conflicted_copy, "note": self.note,
        })
    }
}

/// The content a commit wrote, by block hash (shared by the clients).
type Contents = Arc<Mutex<HashMap<String, u64>>>;
/// Blocks whose upload was acknowledged: hash → content id.
type Stored = Arc<Mutex<BTreeMap<String, u64>>>;

/// The bytes of content `id`: one small block of its own.
pub fn content_bytes(id: u64) -> Vec<u8> {
    format!("raftbox chaos content {id}\n").into_bytes()
}

/// A running files workload.
pub struct RegisterWorkload {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    contents: Contents,
    stored: Stored,
    tasks: JoinSet<Result<Vec<RegisterRecord>>>,
}

impl RegisterWorkload {
    /// Starts `spec.clients` clients; times are µs since `epoch`.
    pub fn spawn(http: reqwest::Client, spec: RegisterSpec, rng: &mut StdRng, epoch: Instant) -> RegisterWorkload {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let contents: Contents = Arc::default();
        let stored: Stored = Arc::default();
        let mut tasks = JoinSet::new();
        for client in 0..spec.clients as u64 {
            let task = Client {
                id: client,
                http: http.clone(),
                spec: spec.clone(),
                rng: StdRng::seed_from_u64(rng.gen()),
                epoch,
                contents: contents.clone(),
                stored: stored.clone(),
                acked: acked.clone(),
                known: BTreeMap::new(),
                next_content: client * CONTENT_IDS_PER_CLIENT,
            };
            let stop = stop.clone();
            tasks.spawn(task.run(stop));
        }
        RegisterWorkload { stop, acked, contents, stored, tasks }
    }

    /// Operations with a known outcome so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Blocks whose upload was acknowledged so far: hash → content id.
    pub fn stored_blocks(&self) -> BTreeMap<String, u64> {
        self.stored.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops the clients (each finishes its operation in flight) and returns every record,
    /// and the content id of every block hash the clients wrote.
    pub async fn stop(mut self) -> Result<(Vec<RegisterRecord>, HashMap<String, u64>)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut records = Vec::new();
        while let Some(joined) = self.tasks.join_next().await {
            records.extend(joined.context("a register client panicked")??);
        }
        records.sort_by_key(|r| r.op.call);
        let contents = self.contents.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Ok((records, contents))
    }
}

struct Client {
    id: u64,
    http: reqwest::Client,
    spec: RegisterSpec,
    rng: StdRng,
    epoch: Instant,
    contents: Contents,
    stored: Stored,
    acked: Arc<AtomicUsize>,
    /// The version this client last saw at each path: the base of its next commit there.
    known: BTreeMap<String, u64>,
    next_content: u64,
}

/// The content id of a file answer's chunks.
fn content_of(contents: &Contents, body: &Value) -> Option<u64> {
    let chunks = body["chunks"].as_array()?;
    let hash = chunks.first()?.as_str()?;
    let known = contents.lock().unwrap_or_else(PoisonError::into_inner).get(hash).copied();
    Some(known.filter(|_| chunks.len() == 1).unwrap_or(FOREIGN_CONTENT))
}

impl Client {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    async fn run(mut self, stop: Arc<AtomicBool>) -> Result<Vec<RegisterRecord>> {
        let mut records = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let node = {
                let forked = self.spec.forked.lock().unwrap_or_else(|e| e.into_inner());
                let ours: Vec<&String> = self.spec.targets.iter().filter(|t| !forked.contains(*t)).collect();
                (*ours.choose(&mut self.rng).context("no target serves this cluster")?).clone()
            };
            let path = self.spec.paths.choose(&mut self.rng).context("no paths")?.clone();
            let record = if self.rng.gen_bool(self.spec.read_ratio) {
                self.read(&node, &path).await?
            } else {
                self.commit(&node, &path).await?
            };
            match record {
                Some(record) => {
                    if record.op.ret.is_some() {
                        self.acked.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
                    }
                    records.push(record);
                }
                None => tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await,
            }
        }
        Ok(records)
    }

    fn record(
        &self,
        path: &str,
        input: RegisterInput,
        call: u64,
        ret: Option<RegisterOutput>,
        node: &str,
    ) -> RegisterRecord {
        let ret = ret.map(|output| (self.now_us(), output));
        RegisterRecord {
            path: path.to_owned(),
            op: Operation { client: self.id, input, call, ret },
            node: node.to_owned(),
            conflicted_copy: None,
            note: String::new(),
        }
    }

    /// A read; `None` when its outcome is unknown (a read that did not answer changed
    /// nothing, so it is left out of the history).
    async fn read(&mut self, node: &str, path: &str) -> Result<Option<RegisterRecord>> {
        let call = self.now_us();
        let request = self.http.get(format!("{node}/v1/files")).query(&[("path", path)]).bearer_auth(&self.spec.token);
        let output = match send(request).await? {
            Outcome::Ok(body) => {
                let version = body["version"].as_u64().with_context(|| format!("a read without a version: {body}"))?;
                RegisterOutput::Read { version, content: content_of(&self.contents, &body) }
            }
            Outcome::Rejected(404, _) => RegisterOutput::Read { version: 0, content: None },
            Outcome::Rejected(status, body) => bail!("read {path} through {node}: {status} {body}"),
            Outcome::Unknown(_) => return Ok(None),
        };
        if let RegisterOutput::Read { version, .. } = output {
            self.known.insert(path.to_owned(), version);
        }
        Ok(Some(self.record(path, RegisterInput::Read, call, Some(output), node)))
    }

    /// A commit of fresh content on the version last seen; `None` when its block could not
    /// be stored (then nothing was committed).
    async fn commit(&mut self, node: &str, path: &str) -> Result<Option<RegisterRecord>> {
        let content = self.next_content;
        self.next_content += 1;
        let data = content_bytes(content);
        let hash = blake3::hash(&data).to_hex().to_string();
        self.contents.lock().unwrap_or_else(PoisonError::into_inner).insert(hash.clone(), content);
        let put = self.http.put(format!("{node}/v1/blocks/{hash}")).bearer_auth(&self.spec.token).body(data.clone());
        if !send(put).await?.is_ok() {
            return Ok(None);
        }
        self.stored.lock().unwrap_or_else(PoisonError::into_inner).insert(hash.clone(), content);
        let base = self.known.get(path).copied().unwrap_or(0);
        let body = json!({ "path": path, "chunks": [hash], "baseVersion": base, "size": data.len(), "mtime": 0 });
        let request = self
            .http
            .post(format!("{node}/v1/files/commit"))
            .bearer_auth(&self.spec.token)
            .header("x-device-id", format!("client-{}", self.id))
            .json(&body);
        let call = self.now_us();
        let input = RegisterInput::Commit { base, content };
        let (output, copy, note) = match send(request).await? {
            Outcome::Ok(body) => {
                let version =
                    body["version"].as_u64().with_context(|| format!("a commit without a version: {body}"))?;
                self.known.insert(path.to_owned(), version);
                (Some(RegisterOutput::Committed { version }), None, String::new())
            }
            Outcome::Rejected(409, text) => {
                let body: Value = serde_json::from_str(&text).with_context(|| format!("a 409 without JSON: {text}"))?;
                let current =
                    body["currentVersion"].as_u64().with_context(|| format!("409 without currentVersion: {text}"))?;
                let copy = body["conflictedCopy"]["path"].as_str().map(str::to_owned);
                self.known.insert(path.to_owned(), current);
                (Some(RegisterOutput::Conflict { current }), copy, String::new())
            }
            Outcome::Rejected(status, text) => bail!("commit {path} through {node}: {status} {text}"),
            Outcome::Unknown(why) => (None, None, why),
        };
        let mut record = self.record(path, input, call, output, node);
        record.conflicted_copy = copy;
        record.note = note;
        Ok(Some(record))
    }
}

/// Pause between attempts of the final reads while the cluster recovers.
pub const FINAL_READ_BACKOFF: Duration = Duration::from_millis(200);
