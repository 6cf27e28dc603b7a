//! Cluster control: a temporary directory, one `config.toml` per node, one child process per
//! node, faults by process handle (kill, pause, wipe, clock offsets) and probes that poll with
//! a deadline; at the end, the node logs are checked for panics and unexpected ERROR lines.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use serde_json::Value;

use crate::net::Network;
use crate::*;

// ---------------------------------------------------------------------------------------------
// The cluster

/// Raft timing and snapshot policy written to each node's `[raft]` section.
#[derive(Clone, Debug)]
pub struct RaftTuning {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_logs_since_last: u64,
    pub logs_to_keep: u64,
    pub write_timeout_ms: u64,
    /// The nodes' NOSPACE minimum (`raft.min_free_disk_mb`); the node's default if `None`.
    pub min_free_disk_mb: Option<u64>,
    /// The deadline of one membership change (`raft.membership_timeout_ms`); the node's
    /// default if `None`.
    pub membership_timeout_ms: Option<u64>,
}

impl Default for RaftTuning {
    fn default() -> RaftTuning {
        RaftTuning {
            heartbeat_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            snapshot_logs_since_last: 10_000,
            logs_to_keep: 1_000,
            write_timeout_ms: 5_000,
            min_free_disk_mb: None,
            membership_timeout_ms: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub nodes: u64,
    pub raft: RaftTuning,
    /// TOML appended to every node's config (rate limits, idempotency settings).
    pub extra_toml: String,
    /// Run every node under libfaketime with a per-node offset file, so a test can move a
    /// node's wall clock ([`Cluster::set_clock_offset`]) while it runs.
    pub fake_clocks: bool,
    /// With `fake_clocks`: offsets the nodes start with (libfaketime syntax, `+5s`); `+0`
    /// for the others.
    pub clock_offsets: BTreeMap<u64, String>,
    /// Run each node in its own network namespace behind a bridge ([`crate::net`]), so a
    /// test can cut links with [`Cluster::network`]. Needs root; fails loudly without.
    pub network_namespaces: bool,
    /// Give each node's data directory a tmpfs of this many MiB of its own (mounted by the
    /// harness, unmounted when the cluster is dropped), so a test can fill one node's disk
    /// ([`Cluster::fill_disk`]). Needs root.
    pub small_disks_mb: Option<u64>,
    /// Preload a layer that delays each node's `fsync` and `fdatasync` by what a file says
    /// (`tests/data/slow_fsync.c`, compiled with `cc`), so a test can slow one node's disk
    /// down ([`Cluster::set_fsync_delay`]).
    pub slow_disks: bool,
    /// The nodes' `[webhooks] allow` list: by default loopback and 10/8 (where a test's
    /// receiver listens, on loopback or on the namespaces' bridge).
    pub webhook_allow: Vec<String>,
    /// TLS for the API and between the nodes (see [`Tls`]).
    pub tls: Tls,
    /// Start every node as the previous release ([`PREVIOUS_BIN_ENV`] if set, else this build
    /// telling its peers it reads data format 2 only, `RAFTBOX_REPORT_FORMAT=2`), until
    /// [`Cluster::upgrade`] moves a node to this build.
    pub previous_release: bool,
}

/// The raftbox binary of the previous release, for the rolling-upgrade test.
pub const PREVIOUS_BIN_ENV: &str = "RAFTBOX_PREVIOUS_BIN";

/// A cluster's TLS. With TLS, the certificates are made at launch by `raftbox certs` into
/// `<dir>/certs` (a CA and one per node id up to [`TLS_NODE_CERTS`], naming every node's
/// host), and the harness's client trusts that CA only ([`Cluster::tls_file`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tls {
    /// Plaintext HTTP and gRPC, with the cluster secret.
    #[default]
    Off,
    /// HTTPS and TLS between the nodes (peers verified against the CA), with the secret.
    Server,
    /// HTTPS and mutual TLS between the nodes, without a secret.
    Mutual,
}

/// Node certificates a TLS cluster gets (ids 1..=this), so nodes can be added.
pub const TLS_NODE_CERTS: u64 = 9;

impl ClusterOptions {
    /// Three nodes that snapshot every `since_last` entries and keep `logs_to_keep` behind.
    pub fn snapshotting(since_last: u64, logs_to_keep: u64) -> ClusterOptions {
        let raft = RaftTuning { snapshot_logs_since_last: since_last, logs_to_keep, ..RaftTuning::default() };
        ClusterOptions { raft, ..ClusterOptions::default() }
    }
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            nodes: 3,
            raft: RaftTuning::default(),
            extra_toml: String::new(),
            fake_clocks: false,
            clock_offsets: BTreeMap::new(),
            network_namespaces: false,
            small_disks_mb: None,
            slow_disks: false,
            webhook_allow: ["127.0.0.0/8", "::1/128", "10.0.0.0/8"].map(String::from).to_vec(),
            tls: Tls::Off,
            previous_release: false,
        }
    }
}

/// libfaketime's multi-threaded library (Debian `faketime`), preloaded into a node whose
/// clock a test moves.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

#[derive(Clone, Debug)]
struct Member {
    id: u64,
    http_addr: String,
    grpc_addr: String,
}

struct Node {
    member: Member,
    data_dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    /// libfaketime's offset file for this node, when the cluster fakes clocks.
    clock_path: Option<PathBuf>,
    /// The file holding this node's fsync delay (ms), when the cluster has slow disks.
    fsync_delay_path: Option<PathBuf>,
    /// The running process; `None` while stopped.
    child: Option<Child>,
    /// Started as the previous release ([`ClusterOptions::previous_release`]).
    previous: bool,
}

/// A cluster of `raftbox` processes in a temporary directory:
/// `<dir>/admin.token` and, per node, `<dir>/nodeN/{config.toml,log,data/}`.
///
/// Dropping it kills every running node by its handle. Call [`Cluster::conclude`] at the end
/// of a test: it fails the test on a scenario error, an unexpected exit, a panic or an ERROR
/// line in a node log.
pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    bin: PathBuf,
    admin_token: String,
    token_path: PathBuf,
    secret_path: PathBuf,
    /// `<dir>/certs` of a TLS cluster.
    certs_dir: Option<PathBuf>,
    options: ClusterOptions,
    /// The namespaces and bridge, when the nodes run in namespaces (dropped after the nodes
    /// are killed: fields drop after `Drop::drop`).
    network: Option<Network>,
    nodes: BTreeMap<u64, Node>,
    http: reqwest::Client,
    allowed_log_errors: Vec<String>,
    unexpected_exits: Vec<String>,
    failed: bool,
    /// tmpfs mounted over data directories ([`ClusterOptions::small_disks_mb`]).
    mounts: Vec<PathBuf>,
    /// The compiled slow-disk layer ([`ClusterOptions::slow_disks`]).
    fsync_layer: Option<PathBuf>,
    /// URLs of nodes that serve another cluster for now ([`Cluster::set_forked`]).
    forked: ForkedNodes,
}

/// URLs of the nodes a workload must not call for now: each serves a cluster of its own (an
/// operator recovered it with `--force-new-cluster`), so what it acknowledges is not this
/// cluster's history. Shared by the harness and the workloads.
pub type ForkedNodes = std::sync::Arc<std::sync::Mutex<BTreeSet<String>>>;

impl Cluster {
    /// Launches every node and waits until all are ready (see [`Cluster::wait_ready`]).
    pub async fn start(options: ClusterOptions) -> Result<Cluster> {
        let mut cluster = Cluster::launch(options)?;
        cluster.wait_ready(ms(STARTUP_DEADLINE_MS)).await?;
        Ok(cluster)
    }

    /// Writes the cluster directory and spawns every node, without waiting.
    pub fn launch(options: ClusterOptions) -> Result<Cluster> {
        let mut cluster = Cluster::launch_stopped(options)?;
        for id in cluster.node_ids() {
            cluster.start_node(id)?;
        }
        Ok(cluster)
    }

    /// Prepares every node (configs, directories) and starts none, so a test can put data
    /// in place first ([`Cluster::start_node`] starts one).
    pub fn launch_stopped(options: ClusterOptions) -> Result<Cluster> {
        ensure!(options.nodes >= 1, "a cluster needs at least one node");
        if options.fake_clocks {
            ensure!(
                Path::new(LIBFAKETIME).is_file(),
                "{LIBFAKETIME} is missing: install Debian's faketime (scripts/test does)"
            );
        }
        let bin = raftbox_bin()?;
        let dir =
            tempfile::Builder::new().prefix("raftbox-cluster-").tempdir().context("create the cluster directory")?;
        let root = dir.path().to_path_buf();
        eprintln!("cluster directory: {} (binary {})", root.display(), bin.display());

        let admin_token = generate_token();
        let token_path = root.join("admin.token");
        write_private(&token_path, &format!("{admin_token}\n"))?;
        let secret_path = root.join("cluster.secret");
        write_private(&secret_path, &format!("{}\n", generate_token()))?;

        let network = if options.network_namespaces {
            let ids: Vec<u64> = (1..=options.nodes).collect();
            Some(Network::create(&ids)?)
        } else {
            None
        };
        let mut cluster = Cluster {
            dir: Some(dir),
            root,
            bin,
            admin_token,
            token_path,
            secret_path,
            certs_dir: None,
            options,
            network,
            nodes: BTreeMap::new(),
            http: http_client()?,
            allowed_log_errors: PEER_FAULT_LOG_FRAGMENTS.iter().map(|f| f.to_string()).collect(),
            unexpected_exits: Vec::new(),
            failed: false,
            mounts: Vec::new(),
            fsync_layer: None,
            forked: ForkedNodes::default(),
        };
        if cluster.options.slow_disks {
            cluster.fsync_layer = Some(compile_fsync_layer(&cluster.root)?);
        }
        let members: Vec<Member> =
            (1..=cluster.options.nodes).map(|id| cluster.new_member(id)).collect::<Result<_>>()?;
        if cluster.options.tls != Tls::Off {
            cluster.make_certs(&members)?;
        }
        for member in &members {
            cluster.prepare_node(member, &members, member.id == 1)?;
        }
        Ok(cluster)
    }

    /// Addresses for a new node `id`: free ports, on loopback or on the node's namespace
    /// address.
    fn new_member(&mut self, id: u64) -> Result<Member> {
        let host = match &mut self.network {
            Some(network) => {
                network.add_node(id)?;
                network.ip(id).to_string()
            }
            None => "127.0.0.1".to_string(),
        };
        let ports = free_ports(2)?;
        Ok(Member { id, http_addr: format!("{host}:{}", ports[0]), grpc_addr: format!("{host}:{}", ports[1]) })
    }

    /// Makes the CA and node certificates of a TLS cluster with `raftbox certs`, naming the
    /// hosts of `members` (loopback, or the namespaces' addresses), and makes the harness's
    /// client trust the CA (and only it).
    fn make_certs(&mut self, members: &[Member]) -> Result<()> {
        let dir = self.root.join("certs");
        let mut command = Command::new(&self.bin);
        command.arg("certs").arg(&dir).arg("--nodes").arg(TLS_NODE_CERTS.to_string());
        let hosts: BTreeSet<&str> =
            members.iter().filter_map(|m| m.http_addr.rsplit_once(':').map(|(host, _)| host)).collect();
        for host in hosts {
            command.arg("--host").arg(host);
        }
        let output = command.output().with_context(|| format!("run {} certs", self.bin.display()))?;
        ensure!(output.status.success(), "raftbox certs failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        let ca = fs::read(dir.join("ca.pem")).context("read the cluster CA")?;
        self.http = tls_http_client(&ca, None)?;
        self.certs_dir = Some(dir);
        Ok(())
    }

    /// A file of a TLS cluster's `<dir>/certs`: `ca.pem`, `nodeN.pem`, `nodeN.key`.
    pub fn tls_file(&self, name: &str) -> Result<PathBuf> {
        let dir = self.certs_dir.as_ref().ok_or_else(|| anyhow!("this cluster runs without TLS"))?;
        Ok(dir.join(name))
    }

    /// Writes node `member`'s directory and config (`members` as its `[[members]]`).
    fn prepare_node(&mut self, member: &Member, members: &[Member], bootstrap: bool) -> Result<()> {
        let node_dir = self.root.join(format!("node{}", member.id));
        let data_dir = node_dir.join("data");
        fs::create_dir_all(&data_dir).with_context(|| format!("create {}", data_dir.display()))?;
        if let Some(mb) = self.options.small_disks_mb {
            let size = format!("size={mb}m");
            run_command("mount", &["-t", "tmpfs", "-o", &size, "raftbox-test", &data_dir.display().to_string()])?;
            self.mounts.push(data_dir.clone());
        }
        let config_path = node_dir.join("config.toml");
        let config = render_config(&NodeConfig {
            member,
            members,
            bootstrap,
            data_dir: &data_dir,
            token_path: &self.token_path,
            secret_path: &self.secret_path,
            certs_dir: self.certs_dir.as_deref(),
            tls: self.options.tls,
            raft: &self.options.raft,
            webhook_allow: &self.options.webhook_allow,
            extra_toml: &self.options.extra_toml,
        });
        fs::write(&config_path, config).with_context(|| format!("write {}", config_path.display()))?;
        let clock_path = if self.options.fake_clocks {
            let path = node_dir.join("faketime");
            let offset = self.options.clock_offsets.get(&member.id).map_or("+0", String::as_str);
            fs::write(&path, format!("{offset}\n")).with_context(|| format!("write {}", path.display()))?;
            Some(path)
        } else {
            None
        };
        let fsync_delay_path = self.options.slow_disks.then(|| node_dir.join("fsync_delay_ms"));
        let log_path = node_dir.join("log");
        let node = Node {
            member: member.clone(),
            data_dir,
            config_path,
            log_path,
            clock_path,
            fsync_delay_path,
            child: None,
            previous: self.options.previous_release,
        };
        self.nodes.insert(member.id, node);
        Ok(())
    }

    /// Fills node `id`'s data directory's file system (a small disk: see
    /// [`ClusterOptions::small_disks_mb`]) until `leave_mb` MiB are free, with one file.
    pub fn fill_disk(&self, id: u64, leave_mb: u64) -> Result<()> {
        let dir = &self.node(id).data_dir;
        let stat = rustix::fs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        let fill = free.saturating_sub(leave_mb << 20);
        let path = dir.join(DISK_FILLER);
        let file = fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let current = file.metadata()?.len();
        let allocated = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), current, fill);
        allocated.with_context(|| format!("fallocate {fill} bytes in {}", path.display()))?;
        Ok(())
    }

    /// Removes what [`Cluster::fill_disk`] wrote (nothing if a wipe removed it already).
    pub fn free_disk(&self, id: u64) -> Result<()> {
        let path = self.node(id).data_dir.join(DISK_FILLER);
        match fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            removed => removed.with_context(|| format!("remove {}", path.display())),
        }
    }

    /// Prepares a new node `id` that is not a member yet (not started): its config names the
    /// current nodes and itself, without bootstrap. Start it, then add it through the
    /// membership API ([`crate::add_member`]).
    pub fn add_node(&mut self, id: u64) -> Result<()> {
        ensure!(!self.nodes.contains_key(&id), "node {id} exists already");
        let member = self.new_member(id)?;
        let mut members: Vec<Member> = self.nodes.values().map(|n| n.member.clone()).collect();
        members.push(member.clone());
        self.prepare_node(&member, &members, false)
    }

    /// Rewrites node `id`'s config with `edit` (it takes effect at the node's next start).
    pub fn edit_config(&self, id: u64, edit: impl FnOnce(&str) -> String) -> Result<()> {
        let path = &self.node(id).config_path;
        let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        fs::write(path, edit(&text)).with_context(|| format!("write {}", path.display()))
    }

    /// Node `id`'s HTTP and gRPC addresses (`host:port`), as the membership API takes them.
    pub fn addresses(&self, id: u64) -> (String, String) {
        let member = &self.node(id).member;
        (member.http_addr.clone(), member.grpc_addr.clone())
    }

    /// The network namespaces, to cut and heal links; `None` unless the cluster was started
    /// with `network_namespaces`.
    pub fn network(&mut self) -> Option<&mut Network> {
        self.network.as_mut()
    }

    // --- accessors -----------------------------------------------------------------------

    fn node(&self, id: u64) -> &Node {
        self.nodes.get(&id).unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.get_mut(&id).unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Every node id, running or not, ascending.
    pub fn node_ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Ids of the nodes whose process the harness started and has not stopped.
    pub fn live_ids(&self) -> Vec<u64> {
        self.nodes.values().filter(|n| n.child.is_some()).map(|n| n.member.id).collect()
    }

    /// The nodes that serve another cluster for now, as the workloads see them.
    pub fn forked_nodes(&self) -> ForkedNodes {
        self.forked.clone()
    }

    /// Marks node `id` as serving another cluster (`true`) or this one again.
    pub fn set_forked(&self, id: u64, forked: bool) {
        let url = self.http_url(id);
        let mut set = self.forked.lock().unwrap_or_else(|e| e.into_inner());
        if forked {
            set.insert(url);
        } else {
            set.remove(&url);
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).child.is_some()
    }

    /// `127.0.0.1:<port>` of node `id`'s gRPC (node-to-node) endpoint.
    pub fn grpc_addr(&self, id: u64) -> &str {
        &self.node(id).member.grpc_addr
    }

    /// The cluster secret the nodes share.
    pub fn cluster_secret(&self) -> Result<String> {
        let path = self.root.join("cluster.secret");
        Ok(fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?.trim().to_string())
    }

    /// `http://127.0.0.1:<port>` of node `id` (`https://` in a TLS cluster).
    pub fn http_url(&self, id: u64) -> String {
        let scheme = if self.options.tls == Tls::Off { "http" } else { "https" };
        format!("{scheme}://{}", self.node(id).member.http_addr)
    }

    /// The HTTP URLs of the given nodes.
    pub fn http_urls(&self, ids: &[u64]) -> Vec<String> {
        ids.iter().map(|&id| self.http_url(id)).collect()
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A handle on the harness's HTTP client (cheap to clone; share it with tasks).
    pub fn client(&self) -> reqwest::Client {
        self.http.clone()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn log_path(&self, id: u64) -> &Path {
        &self.node(id).log_path
    }

    pub fn data_dir(&self, id: u64) -> &Path {
        &self.node(id).data_dir
    }

    /// Node `id`'s `config.toml` (what `raftbox recover --config` is given).
    pub fn config_path(&self, id: u64) -> PathBuf {
        self.root.join(format!("node{id}")).join("config.toml")
    }

    /// Tolerates ERROR lines containing `fragment` in [`Cluster::check_logs`]. Panics are
    /// never tolerated.
    pub fn allow_log_error(&mut self, fragment: &str) {
        self.allowed_log_errors.push(fragment.to_owned());
    }

    // --- process control -----------------------------------------------------------------

    /// Starts node `id` with its config (the first start, or a restart after a stop).
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        let previous = self.node(id).previous;
        let previous_bin = std::env::var_os(PREVIOUS_BIN_ENV).map(PathBuf::from).filter(|_| previous);
        let bin = previous_bin.clone().unwrap_or_else(|| self.bin.clone());
        let mut command = match &self.network {
            Some(network) => {
                // `ip netns exec` execs in place: the child's pid is the node's.
                let prefix = network.exec_prefix(id);
                let mut command = Command::new(&prefix[0]);
                command.args(&prefix[1..]).arg(&bin);
                command
            }
            None => Command::new(&bin),
        };
        let fsync_layer = self.fsync_layer.clone();
        let node = self.node_mut(id);
        ensure!(node.child.is_none(), "node {id} is already running");
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("open {}", node.log_path.display()))?;
        writeln!(log, "=== harness: starting node {id} ===")
            .with_context(|| format!("write {}", node.log_path.display()))?;
        let log_err = log.try_clone().context("duplicate the log file handle")?;
        command
            .arg("serve")
            .arg("--config")
            .arg(&node.config_path)
            .env_remove("RAFTBOX_CONFIG")
            .env_remove("RAFTBOX_REPORT_FORMAT")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let mut preload = Vec::new();
        if let (Some(layer), Some(delay)) = (&fsync_layer, &node.fsync_delay_path) {
            preload.push(layer.display().to_string());
            command.env("RAFTBOX_FSYNC_DELAY_FILE", delay);
        }
        if let Some(clock) = &node.clock_path {
            preload.push(LIBFAKETIME.to_string());
            // The wall clock follows the offset in the file (re-read every second); timers
            // (the monotonic clock) are left alone.
            command
                .env("FAKETIME_TIMESTAMP_FILE", clock)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if !preload.is_empty() {
            command.env("LD_PRELOAD", preload.join(":"));
        }
        if previous && previous_bin.is_none() {
            command.env("RAFTBOX_REPORT_FORMAT", "2");
        }
        let child = command.spawn().with_context(|| format!("spawn node {id} ({})", bin.display()))?;
        node.child = Some(child);
        Ok(())
    }

    /// Node `id` starts as this build from now on (stop it first; the next start upgrades it).
    pub fn upgrade(&mut self, id: u64) {
        self.node_mut(id).previous = false;
    }

    /// Node `id` starts as the previous release from now on
    /// ([`ClusterOptions::previous_release`]).
    pub fn as_previous_release(&mut self, id: u64) {
        self.node_mut(id).previous = true;
    }

    /// SIGKILL node `id` through its process handle and reap it.
    pub fn kill9(&mut self, id: u64) -> Result<()> {
        // Peers of a stopped node report it unreachable; openraft logs that at ERROR.
        self.allow_log_error(PEER_DOWN_LOG_FRAGMENT);
        let node = self.node_mut(id);
        let mut child = node.child.take().ok_or_else(|| anyhow!("node {id} is not running"))?;
        child.kill().with_context(|| format!("SIGKILL node {id}"))?;
        child.wait().with_context(|| format!("reap node {id}"))?;
        Ok(())
    }

    /// SIGTERM node `id` (by the pid of its handle) and wait up to `deadline` for it to exit;
    /// past the deadline it is killed and an error returned.
    pub async fn terminate(&mut self, id: u64, deadline: Duration) -> Result<ExitStatus> {
        self.allow_log_error(PEER_DOWN_LOG_FRAGMENT);
        // A request still waiting on the Raft core when it stops for the shutdown: openraft
        // logs that at ERROR. (A core stopped by a storage error logs that error too.)
        for fragment in SHUTDOWN_LOG_FRAGMENTS {
            self.allow_log_error(fragment);
        }
        let node = self.node_mut(id);
        let child = node.child.as_mut().ok_or_else(|| anyhow!("node {id} is not running"))?;
        // The workspace forbids `unsafe`, so no libc::kill: the shell's kill builtin (present
        // even where procps is not) signals the pid of our own unreaped child, which cannot
        // have been reused.
        let pid = child.id().to_string();
        let sent =
            Command::new("sh").args(["-c", "kill -TERM \"$1\"", "sh", &pid]).status().context("run kill -TERM")?;
        ensure!(sent.success(), "kill -TERM {pid} (node {id}) failed: {sent}");
        let wait = Deadline::after(deadline, format!("node {id} to exit after SIGTERM"));
        loop {
            if let Some(status) = child.try_wait().with_context(|| format!("poll node {id}"))? {
                node.child = None;
                return Ok(status);
            }
            if let Err(err) = wait.tick("still running").await {
                let _ = child.kill();
                let _ = child.wait();
                node.child = None;
                return Err(err);
            }
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, …) to node `id` by the pid of its handle. The
    /// workspace forbids `unsafe`, so no libc::kill: the shell's kill builtin (present even
    /// where procps is not) signals the pid of our own unreaped child, which cannot have been
    /// reused.
    pub fn signal(&self, id: u64, signal: &str) -> Result<()> {
        let child = self.node(id).child.as_ref().ok_or_else(|| anyhow!("node {id} is not running"))?;
        let pid = child.id().to_string();
        let script = format!("kill -{signal} \"$1\"");
        let sent = Command::new("sh").args(["-c", &script, "sh", &pid]).status().context("run kill")?;
        ensure!(sent.success(), "kill -{signal} {pid} (node {id}) failed: {sent}");
        Ok(())
    }

    /// Freezes node `id` (SIGSTOP): it holds its sockets but answers nothing.
    pub fn pause(&mut self, id: u64) -> Result<()> {
        for fragment in PEER_FAULT_LOG_FRAGMENTS {
            self.allow_log_error(fragment);
        }
        self.signal(id, "STOP")
    }

    /// Lets a paused node `id` run again (SIGCONT).
    pub fn resume(&self, id: u64) -> Result<()> {
        self.signal(id, "CONT")
    }

    /// Moves node `id`'s wall clock to `offset` from the real one (libfaketime's syntax:
    /// `+5s`, `-2s`, `+0`); it takes effect within about a second. The cluster must have
    /// been started with `fake_clocks`.
    pub fn set_clock_offset(&self, id: u64, offset: &str) -> Result<()> {
        let path = self.node(id).clock_path.as_ref().ok_or_else(|| anyhow!("the cluster does not fake clocks"))?;
        fs::write(path, format!("{offset}\n")).with_context(|| format!("write {}", path.display()))
    }

    /// Makes every `fsync` and `fdatasync` of node `id` wait `ms` first (0: none), from its
    /// next call on. The cluster must have been started with `slow_disks`.
    pub fn set_fsync_delay(&self, id: u64, ms: u64) -> Result<()> {
        let path = self.node(id).fsync_delay_path.as_ref().ok_or_else(|| anyhow!("the cluster has no slow disks"))?;
        fs::write(path, format!("{ms}\n")).with_context(|| format!("write {}", path.display()))
    }

    /// The block files node `id` holds on its disk.
    pub fn block_files(&self, id: u64) -> Result<BTreeSet<String>> {
        let root = self.node(id).data_dir.join("blocks");
        let mut found = BTreeSet::new();
        for shard in fs::read_dir(&root).with_context(|| format!("read {}", root.display()))? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(shard.path())? {
                found.insert(entry?.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(found)
    }

    /// Deletes node `id`'s block files (not their directories) while it runs: a node that
    /// missed the blocks (down during their PUTs, or the transfers failed) before its
    /// replicator came round.
    pub fn lose_block_files(&self, id: u64) -> Result<usize> {
        let root = self.node(id).data_dir.join("blocks");
        let mut removed = 0;
        for shard in fs::read_dir(&root).with_context(|| format!("read {}", root.display()))? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(shard.path())? {
                fs::remove_file(entry?.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes one part of node `id`'s data directory — `blocks` (a replaced block disk) or
    /// `db` (the Raft log and state) — and keeps the other; the node must be stopped.
    pub fn wipe_part(&mut self, id: u64, part: &str) -> Result<()> {
        let node = self.node(id);
        ensure!(node.child.is_none(), "node {id} must be stopped before its {part} are wiped");
        let path = node.data_dir.join(part);
        fs::remove_dir_all(&path).with_context(|| format!("remove {}", path.display()))
    }

    /// Removes every file of node `id`'s data directory; the node must be stopped.
    pub fn wipe(&mut self, id: u64) -> Result<()> {
        let node = self.node(id);
        ensure!(node.child.is_none(), "node {id} must be stopped before its data is wiped");
        // What is inside, not the directory: it may be a small disk's mount point.
        let entries = fs::read_dir(&node.data_dir).with_context(|| format!("list {}", node.data_dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
            removed.with_context(|| format!("remove {}", path.display()))?;
        }
        Ok(())
    }

    /// Notices nodes that exited without being told to; each is recorded (and fails the
    /// test in [`Cluster::conclude`]) and reported as an error.
    pub fn reap_exited(&mut self) -> Result<()> {
        let mut exited = Vec::new();
        for node in self.nodes.values_mut() {
            let id = node.member.id;
            let status = match node.child.as_mut() {
                Some(child) => child.try_wait().with_context(|| format!("poll node {id}"))?,
                None => None,
            };
            if let Some(status) = status {
                node.child = None;
                exited.push(format!("node {id} exited on its own: {status}"));
            }
        }
        self.unexpected_exits.extend(exited.iter().cloned());
        ensure!(exited.is_empty(), "{}", exited.join("; "));
        Ok(())
    }

    // --- probes --------------------------------------------------------------------------

    /// Node `id`'s `/v1/cluster` as JSON.
    pub async fn cluster_info(&self, id: u64) -> Result<Value> {
        let request = self.http.get(format!("{}/v1/cluster", self.http_url(id))).timeout(ms(PROBE_TIMEOUT_MS));
        match send(request).await? {
            Outcome::Ok(body) => Ok(body),
            other => bail!("GET /v1/cluster on node {id}: {other:?}"),
        }
    }

    /// Node `id`'s `/v1/cluster`, parsed.
    pub async fn view(&self, id: u64) -> Result<NodeView> {
        NodeView::parse(&self.cluster_info(id).await?)
    }

    /// The leader as seen by the first running node that knows one.
    pub async fn leader_id(&self) -> Option<u64> {
        for id in self.live_ids() {
            if let Ok(NodeView { leader_id: Some(leader), .. }) = self.view(id).await {
                return Some(leader);
            }
        }
        None
    }

    /// Ready means `/readyz` answers 200 and the admin token is accepted (`/v1/me` 200).
    async fn probe_ready(&self, id: u64) -> Result<()> {
        let url = self.http_url(id);
        let request = self.http.get(format!("{url}/readyz")).timeout(ms(PROBE_TIMEOUT_MS));
        match send(request).await? {
            Outcome::Ok(_) => {}
            other => bail!("/readyz: {other:?}"),
        }
        match me(&self.http, &url, &self.admin_token).await? {
            Outcome::Ok(_) => Ok(()),
            other => bail!("/v1/me with the admin token: {other:?}"),
        }
    }

    /// Polls every running node until all are ready; on the deadline the error carries the
    /// tail of every node log. A node exiting meanwhile fails at once.
    pub async fn wait_ready(&mut self, deadline: Duration) -> Result<()> {
        let ids = self.live_ids();
        self.wait_ready_nodes(&ids, deadline).await
    }

    /// Polls nodes `ids` until all are ready (see [`Cluster::wait_ready`]).
    pub async fn wait_ready_nodes(&mut self, ids: &[u64], deadline: Duration) -> Result<()> {
        let wait = Deadline::after(deadline, format!("nodes {ids:?} ready"));
        // A node found ready is not probed again: each probe spends a request of the admin's
        // (a test may rate-limit `/v1/me`), and nodes turn ready a clock check apart.
        let mut ready = std::collections::BTreeSet::new();
        loop {
            if let Err(err) = self.reap_exited() {
                bail!("{err:#}\n{}", self.log_tails(LOG_TAIL_LINES));
            }
            let mut waiting = Vec::new();
            let unready: Vec<u64> =
                ids.iter().copied().filter(|id| self.is_running(*id) && !ready.contains(id)).collect();
            for id in unready {
                match self.probe_ready(id).await {
                    Ok(()) => {
                        ready.insert(id);
                    }
                    Err(err) => waiting.push(format!("node {id}: {err:#}")),
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if let Err(err) = wait.tick(&waiting.join("; ")).await {
                bail!("{err:#}\n{}", self.log_tails(LOG_TAIL_LINES));
            }
        }
    }

    /// The leader every running node agrees on (but a node that lost its data and knows no
    /// leader), provided it is running and says it leads.
    async fn agreed_leader(&self) -> Result<u64> {
        let mut agreed: Option<u64> = None;
        for id in self.live_ids() {
            let view = self.view(id).await?;
            if view.leader_id.is_none() && !view.votes {
                // A node that lost its data takes nothing from leaders until it is added again.
                continue;
            }
            let leader = view.leader_id.ok_or_else(|| anyhow!("node {id} knows no leader"))?;
            if let Some(previous) = agreed {
                ensure!(previous == leader, "nodes disagree on the leader: {previous} vs {leader}");
            }
            agreed = Some(leader);
        }
        let leader = agreed.ok_or_else(|| anyhow!("no node is running"))?;
        ensure!(self.is_running(leader), "the reported leader {leader} is not running");
        let view = self.view(leader).await?;
        ensure!(view.is_leader(), "node {leader} is reported leader but says {}", view.role);
        Ok(leader)
    }

    /// Polls until every running node names the same running leader, other than
    /// `excluding`, and that node says it leads.
    pub async fn wait_for_leader(&self, excluding: Option<u64>, deadline: Duration) -> Result<u64> {
        let what = match excluding {
            Some(old) => format!("a leader other than node {old}"),
            None => "an agreed leader".to_owned(),
        };
        let wait = Deadline::after(deadline, what);
        loop {
            let last = match self.agreed_leader().await {
                Ok(leader) if Some(leader) != excluding => return Ok(leader),
                Ok(leader) => format!("the running nodes still follow node {leader}"),
                Err(err) => format!("{err:#}"),
            };
            wait.tick(&last).await?;
        }
    }

    /// Polls until every node of `among` names the same leader, one of them, and it says it
    /// leads: a majority's leader while another node (cut off, recovered) leads elsewhere.
    pub async fn wait_for_leader_among(&self, among: &[u64], deadline: Duration) -> Result<u64> {
        let wait = Deadline::after(deadline, format!("a leader agreed by nodes {among:?}"));
        loop {
            let mut agreed = Vec::new();
            for id in among {
                agreed.push(self.view(*id).await.ok().and_then(|view| view.leader_id));
            }
            let last = match agreed.first().copied().flatten() {
                Some(leader) if among.contains(&leader) && agreed.iter().all(|l| *l == Some(leader)) => {
                    match self.view(leader).await {
                        Ok(view) if view.is_leader() => return Ok(leader),
                        Ok(view) => format!("node {leader} is named leader but says {}", view.role),
                        Err(e) => format!("{e:#}"),
                    }
                }
                _ => format!("their leaders: {agreed:?}"),
            };
            wait.tick(&last).await?;
        }
    }

    /// Polls node `id`'s `/v1/cluster` until `done` holds.
    pub async fn wait_view(
        &self,
        id: u64,
        deadline: Duration,
        what: &str,
        done: impl Fn(&NodeView) -> bool,
    ) -> Result<NodeView> {
        let wait = Deadline::after(deadline, what);
        loop {
            let last = match self.view(id).await {
                Ok(view) if done(&view) => return Ok(view),
                Ok(view) => format!("{view:?}"),
                Err(err) => format!("{err:#}"),
            };
            wait.tick(&last).await?;
        }
    }

    /// Waits until node `id` has applied everything the leader had applied when called.
    pub async fn wait_caught_up(&self, id: u64, deadline: Duration) -> Result<NodeView> {
        let started = Instant::now();
        let leader = self.wait_for_leader(None, deadline).await?;
        let target = self.view(leader).await?.last_applied;
        let remaining = deadline.saturating_sub(started.elapsed());
        let what = format!("node {id} to apply up to index {target} (leader {leader})");
        self.wait_view(id, remaining, &what, |view| view.last_applied >= target).await
    }

    // --- checks --------------------------------------------------------------------------

    /// Checks every user with `GET /v1/admin/users/{userId}` through node `id`.
    pub async fn verify_users(&self, id: u64, users: &[CreatedUser]) -> Result<()> {
        let url = self.http_url(id);
        let http = self.http.clone();
        let admin_token = self.admin_token.clone();
        let failures = in_lanes(users.to_vec(), VERIFY_LANES, move |user: CreatedUser| {
            let http = http.clone();
            let url = url.clone();
            let admin_token = admin_token.clone();
            async move { check_user(&http, &url, &admin_token, &user).await }
        })
        .await?;
        let failures: Vec<String> = failures.into_iter().flatten().collect();
        ensure!(
            failures.is_empty(),
            "{} of {} users missing or wrong through node {id}; first ones:\n{}",
            failures.len(),
            users.len(),
            failures[..failures.len().min(10)].join("\n")
        );
        Ok(())
    }

    /// Lines of the node logs with a panic (`panicked at`) or an ERROR level, except ERROR
    /// lines allowed with [`Cluster::allow_log_error`]; each prefixed by its node.
    pub fn check_logs(&self) -> Vec<String> {
        let mut found = Vec::new();
        for node in self.nodes.values() {
            let id = node.member.id;
            let text = match fs::read(&node.log_path) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => {
                    found.push(format!("node {id}: cannot read {}: {err}", node.log_path.display()));
                    continue;
                }
            };
            for raw in text.lines() {
                let line = strip_ansi(raw);
                let panic = line.contains("panicked at");
                let error = line.contains(" ERROR ")
                    && !self.allowed_log_errors.iter().any(|allowed| line.contains(allowed.as_str()));
                if panic || error {
                    found.push(format!("node {id}: {line}"));
                }
            }
        }
        found
    }

    /// The last `lines` lines of every node log, with headers.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in self.nodes.values() {
            let text = fs::read(&node.log_path)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_else(|err| format!("(cannot read: {err})"));
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!(
                "----- node {} log {} (last {} lines) -----\n",
                node.member.id,
                node.log_path.display(),
                tail.len()
            ));
            for line in tail {
                out.push_str(&strip_ansi(line));
                out.push('\n');
            }
        }
        out
    }

    /// Ends a test: fails it (panics) if the scenario failed, a node exited on its own, or a
    /// node log holds a panic or an unexpected ERROR line. Dropping the cluster then prints
    /// the log tails and the directory, and kills the nodes.
    pub fn conclude(mut self, result: Result<()>) {
        let mut problems = Vec::new();
        if let Err(err) = result {
            problems.push(format!("{err:?}"));
        }
        if let Err(err) = self.reap_exited() {
            problems.push(format!("{err:#}"));
        } else if !self.unexpected_exits.is_empty() {
            problems.push(self.unexpected_exits.join("; "));
        }
        let log_problems = self.check_logs();
        if !log_problems.is_empty() {
            problems.push(format!(
                "{} panic or ERROR line(s) in node logs:\n{}",
                log_problems.len(),
                log_problems.join("\n")
            ));
        }
        if problems.is_empty() {
            return;
        }
        self.failed = true;
        panic!("{}", problems.join("\n\n"));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let failed = self.failed || std::thread::panicking();
        if failed {
            eprintln!("{}", self.log_tails(LOG_TAIL_LINES));
        }
        for mount in self.mounts.drain(..) {
            if let Err(e) = run_command("umount", &[&mount.display().to_string()]) {
                eprintln!("unmount {}: {e:#}", mount.display());
            }
        }
        let keep = env::var(KEEP_ENV).is_ok_and(|value| value == "1");
        // A failed run keeps its directory (configs, node logs, histories) for the post-mortem.
        if let Some(dir) = self.dir.take() {
            if keep || failed {
                let path = dir.keep();
                eprintln!("cluster directory kept at {} (node logs, configs, histories)", path.display());
            }
        }
    }
}

struct NodeConfig<'a> {
    member: &'a Member,
    members: &'a [Member],
    bootstrap: bool,
    data_dir: &'a Path,
    token_path: &'a Path,
    secret_path: &'a Path,
    /// A TLS cluster's certificates.
    certs_dir: Option<&'a Path>,
    tls: Tls,
    raft: &'a RaftTuning,
    webhook_allow: &'a [String],
    extra_toml: &'a str,
}

/// The node's TOML config (node 1 of the initial members bootstraps the cluster).
fn render_config(config: &NodeConfig<'_>) -> String {
    let member = config.member;
    let raft = config.raft;
    let mut out = format!(
        "node_id = {}\ndata_dir = {}\nhttp_addr = {}\ngrpc_addr = {}\nadmin_token_file = {}\nbootstrap = {}\n",
        member.id,
        toml_string(&config.data_dir.display().to_string()),
        toml_string(&member.http_addr),
        toml_string(&member.grpc_addr),
        toml_string(&config.token_path.display().to_string()),
        config.bootstrap,
    );
    if config.tls != Tls::Mutual {
        out.push_str(&format!("cluster_secret_file = {}\n", toml_string(&config.secret_path.display().to_string())));
    }
    for peer in config.members {
        out.push_str(&format!(
            "\n[[members]]\nid = {}\nhttp_addr = {}\ngrpc_addr = {}\n",
            peer.id,
            toml_string(&peer.http_addr),
            toml_string(&peer.grpc_addr),
        ));
    }
    out.push_str(&format!(
        "\n[raft]\nheartbeat_ms = {}\nelection_timeout_min_ms = {}\nelection_timeout_max_ms = {}\n\
         snapshot_logs_since_last = {}\nlogs_to_keep = {}\nwrite_timeout_ms = {}\n{}{}",
        raft.heartbeat_ms,
        raft.election_timeout_min_ms,
        raft.election_timeout_max_ms,
        raft.snapshot_logs_since_last,
        raft.logs_to_keep,
        raft.write_timeout_ms,
        raft.min_free_disk_mb.map_or(String::new(), |mb| format!("min_free_disk_mb = {mb}\n")),
        raft.membership_timeout_ms.map_or(String::new(), |ms| format!("membership_timeout_ms = {ms}\n")),
    ));
    if let (Some(dir), true) = (config.certs_dir, config.tls != Tls::Off) {
        let file = |name: String| toml_string(&dir.join(name).display().to_string());
        out.push_str(&format!(
            "\n[tls]\ncert_file = {}\nkey_file = {}\nca_file = {}\nmutual = {}\n",
            file(format!("node{}.pem", member.id)),
            file(format!("node{}.key", member.id)),
            file("ca.pem".into()),
            config.tls == Tls::Mutual,
        ));
    }
    let allow: Vec<String> = config.webhook_allow.iter().map(|a| toml_string(a)).collect();
    out.push_str(&format!("\n[webhooks]\nallow = [{}]\n", allow.join(", ")));
    out.push('\n');
    out.push_str(config.extra_toml);
    out
}

fn toml_string(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(contents.as_bytes()).with_context(|| format!("write {}", path.display()))
}

/// Removes ANSI CSI escape sequences (colours), in case a node logs with colours on.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_ansi_removes_colours() {
        let line = "\u{1b}[2m2025-01-01T00:00:00Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m raftbox: boom";
        assert_eq!(strip_ansi(line), "2025-01-01T00:00:00Z ERROR raftbox: boom");
    }

    #[test]
    fn config_names_bootstrap_only_on_node_one() {
        let members: Vec<Member> = (1..=3)
            .map(|id| Member {
                id,
                http_addr: format!("127.0.0.1:{}", 7080 + id),
                grpc_addr: format!("127.0.0.1:{}", 7090 + id),
            })
            .collect();
        let raft = RaftTuning::default();
        let render = |member: &Member| {
            render_config(&NodeConfig {
                member,
                members: &members,
                bootstrap: member.id == 1,
                data_dir: Path::new("/tmp/x/node1/data"),
                token_path: Path::new("/tmp/x/admin.token"),
                secret_path: Path::new("/tmp/x/cluster.secret"),
                certs_dir: None,
                tls: Tls::Off,
                raft: &raft,
                webhook_allow: &[],
                extra_toml: "",
            })
        };
        let first = render(&members[0]);
        assert!(first.contains("bootstrap = true\n"));
        assert!(first.contains("data_dir = \"/tmp/x/node1/data\"\n"));
        assert_eq!(first.matches("[[members]]").count(), 3);
        assert!(first.contains("snapshot_logs_since_last = 10000\n"));
        assert!(render(&members[1]).contains("bootstrap = false\n"));
    }
}

/// The file [`Cluster::fill_disk`] writes in a data directory.
const DISK_FILLER: &str = "disk-filler";

/// Runs `program` with `args`; an error carries its output.
fn run_command(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(program).args(args).output().with_context(|| format!("run {program}"))?;
    ensure!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// Compiles the slow-disk layer (`tests/data/slow_fsync.c`) into `dir`, with the system's C
/// compiler (scripts/test installs one: rocksdb needs it too).
fn compile_fsync_layer(dir: &Path) -> Result<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/slow_fsync.c");
    let out = dir.join("slow_fsync.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .arg("-ldl")
        .status()
        .context("run cc to build the slow-disk layer")?;
    ensure!(status.success(), "cc {} failed ({status})", source.display());
    Ok(out)
}
