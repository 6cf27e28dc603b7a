//! Nemeses: faults injected from outside the nodes (the production binary runs unmodified),
//! every few seconds, each healed before the next: `kill -9` and restart, SIGSTOP/SIGCONT
//! pauses, network partitions enforced by the kernel (the leader isolated, a minority cut
//! off, one-way loss, a bridge node that sees both sides), a lossy and slow link, clock skew
//! (libfaketime), a full disk, a node killed again while it catches up (installing a
//! snapshot when the log moved past it), and a node's data wiped in place under its id.
//! Every fault and heal is logged with its time, so a history can be read against it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::Rng as _;

use crate::client::{add_member, remove_member, Outcome};
use crate::cluster::{Cluster, ClusterOptions};
use crate::support::Deadline;

/// The kinds of fault a nemesis draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL a node (the leader half of the time); restart it at heal.
    Kill,
    /// SIGSTOP a node (the leader half of the time) for longer than an election timeout.
    Pause,
    /// Cut the leader off from every other node (clients still reach it).
    IsolateLeader,
    /// Cut a minority off from the rest.
    Minority,
    /// Drop packets from one node to another, not back.
    OneWay,
    /// Two sides that cannot talk, and one node that talks to both.
    Bridge,
    /// Move one node's wall clock (any node: leader or follower) by seconds, or now and
    /// then by a month (needs `fake_clocks`).
    ClockSkew,
    /// Replace a follower as an operator replaces a machine: remove it, wipe its disk,
    /// start it empty and add it back (learner, then voter) at heal.
    Replace,
    /// Drop a random share of what one node's peers send it and cap what it sends with a
    /// token bucket (needs `network_namespaces`).
    LossyLink,
    /// Fill one node's disk below the NOSPACE minimum (needs `small_disks_mb`); free it at
    /// heal.
    DiskFull,
    /// Kill a node; at heal, start it and kill it again a moment later, while it catches
    /// up (installing a snapshot when the leader's log moved past it), then start it again.
    KillCatchingUp,
    /// Kill a follower, wipe its data directory and start it again under the same id,
    /// without removing it: it must take no part until removed and added back, which the
    /// heal does.
    WipeInPlace,
    /// An operator's mistake: a follower cut off is taken for the last one alive, killed and
    /// recovered with `raftbox recover --force-new-cluster` (a new cluster id), started
    /// still cut off, and written to. At heal the cut heals and for a while both sides must
    /// stay apart (the recovered node leads only itself; no majority node follows it); then
    /// it is wiped and added back. The workloads do not call it meanwhile: it serves another
    /// cluster (needs `network_namespaces`).
    RecoverMinority,
    /// An operator's mistake: a backup restored into a follower's wiped directory with
    /// `raftbox restore` while the old members live and reach it. The restored node leads a
    /// new cluster (a new cluster id) and is written to; both sides must stay apart, then it
    /// is wiped and added back. The workloads do not call it meanwhile.
    RestoreBeside,
    /// A machine restarted on its old directory: a follower's directory is copied aside
    /// (killed for the copy, started again); at heal the follower is replaced (removed, wiped,
    /// added back empty) and then started on the copy, the data of a member the cluster has
    /// replaced. It must take no part (its leader refuses the old incarnation) while the
    /// cluster serves; then it is wiped and added back again.
    OldDirectory,
}

/// Environment variable restricting the fault kinds of a chaos scenario (`scripts/chaos
/// --nemesis`): a comma-separated list of [`FaultKind::name`]s, `partition` meaning the four
/// network kinds.
pub const NEMESES_ENV: &str = "RAFTBOX_NEMESES";
/// Environment variable naming a file each chaos scenario appends its summary row to.
pub const REPORT_ENV: &str = "RAFTBOX_CHAOS_REPORT";
/// At most how many faults run at once (`scripts/chaos --combined` sets 3); 1 if unset.
pub const COMBINED_ENV: &str = "RAFTBOX_COMBINED";

/// At most how many faults the nemesis runs at once: [`COMBINED_ENV`], else one.
pub fn at_once() -> usize {
    std::env::var(COMBINED_ENV).ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).unwrap_or(1)
}

impl FaultKind {
    pub const ALL: [FaultKind; 15] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::IsolateLeader,
        FaultKind::Minority,
        FaultKind::OneWay,
        FaultKind::Bridge,
        FaultKind::ClockSkew,
        FaultKind::Replace,
        FaultKind::LossyLink,
        FaultKind::DiskFull,
        FaultKind::KillCatchingUp,
        FaultKind::WipeInPlace,
        FaultKind::RecoverMinority,
        FaultKind::RestoreBeside,
        FaultKind::OldDirectory,
    ];

    /// The name `scripts/chaos --nemesis` and the report use.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::Minority => "minority",
            FaultKind::OneWay => "one-way",
            FaultKind::Bridge => "bridge",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::Replace => "replace",
            FaultKind::LossyLink => "lossy-link",
            FaultKind::DiskFull => "disk-full",
            FaultKind::KillCatchingUp => "kill-catching-up",
            FaultKind::WipeInPlace => "wipe-in-place",
            FaultKind::RecoverMinority => "recover-minority",
            FaultKind::RestoreBeside => "restore-beside",
            FaultKind::OldDirectory => "old-directory",
        }
    }

    /// The kinds a name stands for: one, or the four network kinds for `partition`.
    pub fn parse(name: &str) -> Result<Vec<FaultKind>> {
        if name == "partition" {
            return Ok(FaultKind::ALL.into_iter().filter(|k| k.is_partition()).collect());
        }
        let kind = FaultKind::ALL.into_iter().find(|k| k.name() == name);
        kind.map(|k| vec![k]).with_context(|| {
            let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown fault kind {name:?}; known: {}, partition", names.join(", "))
        })
    }

    /// The four kinds that cut links.
    pub fn is_partition(self) -> bool {
        matches!(self, FaultKind::IsolateLeader | FaultKind::Minority | FaultKind::OneWay | FaultKind::Bridge)
    }

    /// The kinds that need network namespaces.
    pub fn needs_network(self) -> bool {
        self.is_partition() || matches!(self, FaultKind::LossyLink | FaultKind::RecoverMinority)
    }

    /// The kinds that change membership at heal (which needs a quorum): they run alone.
    fn runs_alone(self) -> bool {
        matches!(
            self,
            FaultKind::Replace
                | FaultKind::WipeInPlace
                | FaultKind::RecoverMinority
                | FaultKind::RestoreBeside
                | FaultKind::OldDirectory
        )
    }
}

/// One fault, as applied.
#[derive(Debug, Clone)]
pub enum Fault {
    Kill(u64),
    Pause(u64),
    /// Links cut (`from → to` directed pairs), described.
    Network(String),
    ClockSkew(u64, String),
    Replace(u64),
    DiskFull(u64),
    /// A lossy, slow link (how lossy, how slow).
    LossyLink(u64, String),
    /// Killed; at heal started, killed again after this many ms, and started.
    KillCatchingUp(u64, u64),
    WipeInPlace(u64),
    /// Made a cluster of its own (recovered cut off, or restored beside the old members):
    /// its new cluster id and what it acknowledged.
    Forked(u64, String),
    /// Its directory copied aside, to this path.
    OldDirectory(u64, std::path::PathBuf),
}

/// The kinds of `supported` a scenario runs with: all of them, or those `RAFTBOX_NEMESES`
/// names. A list that leaves the scenario no fault at all is an error, never a quiet pass.
pub fn selected(supported: &[FaultKind]) -> Result<Vec<FaultKind>> {
    let Ok(list) = std::env::var(NEMESES_ENV) else { return Ok(supported.to_vec()) };
    let mut wanted = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        wanted.extend(FaultKind::parse(name)?);
    }
    let kinds: Vec<FaultKind> = supported.iter().copied().filter(|k| wanted.contains(k)).collect();
    anyhow::ensure!(
        !kinds.is_empty(),
        "{NEMESES_ENV}={list:?} leaves this scenario no fault (it supports {})",
        supported.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    );
    Ok(kinds)
}

/// The cluster options `kinds` need, set on `options`: namespaces for network faults, fake
/// clocks for skew, small disks and a NOSPACE minimum for a full disk, frequent snapshots and
/// a short log for a kill during catch-up (so that the catch-up is a snapshot install).
pub fn prepare(options: &mut ClusterOptions, kinds: &[FaultKind]) {
    for kind in kinds {
        match kind {
            kind if kind.needs_network() => options.network_namespaces = true,
            FaultKind::ClockSkew => options.fake_clocks = true,
            FaultKind::DiskFull => {
                options.small_disks_mb = Some(SMALL_DISK_MB);
                options.raft.min_free_disk_mb = Some(DISK_FULL_MIN_FREE_MB);
            }
            FaultKind::KillCatchingUp => {
                options.raft.snapshot_logs_since_last = CATCH_UP_SNAPSHOT_EVERY;
                options.raft.logs_to_keep = CATCH_UP_LOGS_KEPT;
            }
            _ => {}
        }
    }
}

/// Tolerates the ERROR lines `kinds` make on purpose: the NOSPACE alarm and the entries a
/// full disk refuses, a wiped node refusing entries until it is added back.
pub fn allow_log_errors(cluster: &mut Cluster, kinds: &[FaultKind]) {
    if kinds.contains(&FaultKind::DiskFull) {
        cluster.allow_log_error("NOSPACE");
        cluster.allow_log_error("disk is full");
    }
    if kinds.contains(&FaultKind::WipeInPlace) || kinds.contains(&FaultKind::OldDirectory) {
        cluster.allow_log_error("lost its data");
    }
    if kinds.contains(&FaultKind::RecoverMinority) || kinds.contains(&FaultKind::RestoreBeside) {
        // Each side refuses the other's calls (and openraft logs the refused ones as errors).
        cluster.allow_log_error("never joined");
    }
}

/// What the nemesis did, with times since the test's start.
#[derive(Debug, Clone)]
pub struct NemesisEvent {
    pub at: Duration,
    pub what: String,
    /// The kind of fault injected; `None` for a heal.
    pub kind: Option<FaultKind>,
}

/// The faults of a nemesis log, counted by kind: `kill 2, pause 1`.
pub fn fault_counts(events: &[NemesisEvent]) -> String {
    let mut counts: Vec<(FaultKind, usize)> = Vec::new();
    for kind in events.iter().filter_map(|e| e.kind) {
        match counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((kind, 1)),
        }
    }
    counts.iter().map(|(k, n)| format!("{} {n}", k.name())).collect::<Vec<_>>().join(", ")
}

/// Appends one row to the file `RAFTBOX_CHAOS_REPORT` names, if any (`scripts/chaos` prints
/// the rows as its summary table): scenario, seed, faults by kind, and what was checked.
pub fn report(scenario: &str, seed: u64, events: &[NemesisEvent], checked: &str) -> Result<()> {
    let Some(path) = std::env::var_os(REPORT_ENV) else { return Ok(()) };
    use std::io::Write as _;
    let row = format!("{scenario}\t{seed}\t{}\t{}\n", fault_counts(events), checked.replace(['\t', '\n'], " "));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("open {}", std::path::Path::new(&path).display()))?;
    file.write_all(row.as_bytes()).context("append the chaos report row")
}

/// How the nemesis behaves.
#[derive(Debug, Clone)]
pub struct NemesisSpec {
    pub kinds: Vec<FaultKind>,
    /// How long a fault lasts, and the calm between two faults (ranges, ms).
    pub fault_ms: (u64, u64),
    pub calm_ms: (u64, u64),
    /// How long the fault phase lasts in all.
    pub duration: Duration,
    /// At most how many faults run at once, of different kinds (see [`at_once`]): each
    /// round injects one to this many, holds them together, then heals them in reverse.
    pub at_once: usize,
}

/// Injects faults into `cluster` as `spec` says until its duration is over, then heals
/// everything. Returns the log of what it did.
pub async fn run(
    cluster: &mut Cluster,
    spec: &NemesisSpec,
    rng: &mut StdRng,
    epoch: Instant,
) -> Result<Vec<NemesisEvent>> {
    let mut events = Vec::new();
    let log = |events: &mut Vec<NemesisEvent>, what: String, kind: Option<FaultKind>| {
        eprintln!("nemesis +{:.1}s: {what}", epoch.elapsed().as_secs_f64());
        events.push(NemesisEvent { at: epoch.elapsed(), what, kind });
    };
    let started = Instant::now();
    while started.elapsed() < spec.duration {
        // The schedule's own pace: the calm between faults, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(spec.calm_ms.0..=spec.calm_ms.1))).await;
        let kinds = combination(&spec.kinds, spec.at_once, rng)?;
        let mut faults = Vec::with_capacity(kinds.len());
        for kind in kinds {
            let fault = inject(cluster, kind, rng).await?;
            log(&mut events, format!("{fault:?}"), Some(kind));
            faults.push(fault);
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(spec.fault_ms.0..=spec.fault_ms.1))).await;
        for fault in faults.iter().rev() {
            heal(cluster, fault).await?;
            log(&mut events, format!("healed {fault:?}"), None);
        }
    }
    Ok(events)
}

/// The kinds of one round: one to `at_once` different kinds of `kinds`. A replacement or a
/// wipe in place (a membership change at heal, which needs a quorum) only ever runs alone.
pub fn combination(kinds: &[FaultKind], at_once: usize, rng: &mut StdRng) -> Result<Vec<FaultKind>> {
    let first = *kinds.choose(rng).context("no fault kinds")?;
    let count = rng.gen_range(1..=at_once.max(1));
    if count == 1 || first.runs_alone() {
        return Ok(vec![first]);
    }
    let mut others: Vec<FaultKind> = kinds.iter().copied().filter(|k| *k != first && !k.runs_alone()).collect();
    others.shuffle(rng);
    let mut chosen = vec![first];
    chosen.extend(others.into_iter().take(count - 1));
    Ok(chosen)
}

/// A node to hit: the leader half of the time (if one is known), else any running node.
async fn target(cluster: &Cluster, rng: &mut StdRng) -> Result<u64> {
    if rng.gen_bool(0.5) {
        if let Some(leader) = cluster.leader_id().await.filter(|id| cluster.is_running(*id)) {
            return Ok(leader);
        }
    }
    cluster.live_ids().choose(rng).copied().context("no running node")
}

async fn inject(cluster: &mut Cluster, kind: FaultKind, rng: &mut StdRng) -> Result<Fault> {
    let ids = cluster.node_ids();
    let fault = match kind {
        FaultKind::Kill => {
            let id = target(cluster, rng).await?;
            cluster.kill9(id)?;
            Fault::Kill(id)
        }
        FaultKind::KillCatchingUp => {
            let id = target(cluster, rng).await?;
            cluster.kill9(id)?;
            Fault::KillCatchingUp(id, rng.gen_range(KILL_CATCHING_UP_MS.0..=KILL_CATCHING_UP_MS.1))
        }
        FaultKind::DiskFull => {
            let id = target(cluster, rng).await?;
            cluster.fill_disk(id, DISK_FULL_LEAVE_MB)?;
            Fault::DiskFull(id)
        }
        FaultKind::WipeInPlace => {
            // A known leader, so that the node wiped is surely a follower.
            let leader = Some(cluster.wait_for_leader(None, READD_DEADLINE).await?);
            let followers: Vec<u64> = cluster.live_ids().into_iter().filter(|id| Some(*id) != leader).collect();
            let id = *followers.choose(rng).context("no running follower")?;
            cluster.kill9(id)?;
            cluster.wipe(id)?;
            cluster.start_node(id)?;
            Fault::WipeInPlace(id)
        }
        FaultKind::RecoverMinority | FaultKind::RestoreBeside => {
            let leader = cluster.wait_for_leader(None, READD_DEADLINE).await?;
            let followers: Vec<u64> = cluster.live_ids().into_iter().filter(|id| *id != leader).collect();
            let id = *followers.choose(rng).context("no running follower")?;
            let config = cluster.config_path(id);
            let config = config.to_str().context("a UTF-8 config path")?.to_owned();
            cluster.set_forked(id, true);
            if kind == FaultKind::RecoverMinority {
                cluster.network().context("a recovery of a minority needs `network_namespaces`")?.isolate(id)?;
                // Dead, as the operator believes (cut off, a graceful stop may wait on its peers).
                cluster.kill9(id)?;
                cli(&["recover", "--force-new-cluster", "--config", &config]).await?;
            } else {
                let backup = cluster.root().join(format!("restore-beside-{}.backup", rng.gen::<u32>()));
                let backup = backup.to_str().context("a UTF-8 backup path")?.to_owned();
                let url = cluster.http_url(leader);
                cli(&["backup", &backup, "--url", &url, "--token", cluster.admin_token()]).await?;
                cluster.kill9(id)?;
                cluster.wipe(id)?;
                cli(&["restore", &backup, "--config", &config]).await?;
                std::fs::remove_file(&backup).with_context(|| format!("remove {backup}"))?;
            }
            cluster.start_node(id)?;
            cluster.wait_view(id, READD_DEADLINE, "the forked node leading alone", |v| v.leader_id == Some(id)).await?;
            // It acknowledges writes of its own: the fork is real.
            let (user, _) = crate::new_user(cluster, id, &format!("fork-{}", rng.gen::<u32>()), "t").await?;
            let cluster_id = cluster.cluster_info(id).await?["clusterId"].as_str().unwrap_or_default().to_owned();
            Fault::Forked(id, format!("cluster {cluster_id}, wrote user {user}"))
        }
        FaultKind::OldDirectory => {
            let leader = cluster.wait_for_leader(None, READD_DEADLINE).await?;
            let followers: Vec<u64> = cluster.live_ids().into_iter().filter(|id| *id != leader).collect();
            let id = *followers.choose(rng).context("no running follower")?;
            cluster.kill9(id)?;
            let copy = cluster.root().join(format!("node{id}-old-directory"));
            crate::copy_dir(cluster.data_dir(id), &copy)?;
            cluster.start_node(id)?;
            Fault::OldDirectory(id, copy)
        }
        FaultKind::LossyLink => {
            let id = target(cluster, rng).await?;
            let loss = rng.gen_range(LOSS_PERCENT.0..=LOSS_PERCENT.1);
            let kbit = rng.gen_range(LINK_KBIT.0..=LINK_KBIT.1);
            let network = cluster.network().context("a lossy link needs `network_namespaces`")?;
            network.degrade(id, loss, kbit, LINK_QUEUE_MS)?;
            Fault::LossyLink(id, format!("{loss}% lost, {kbit} kbit/s"))
        }
        FaultKind::Pause => {
            let id = target(cluster, rng).await?;
            cluster.pause(id)?;
            Fault::Pause(id)
        }
        FaultKind::ClockSkew => {
            let id = *ids.choose(rng).context("no node")?;
            // Seconds off as a rule; now and then a month (every cutoff must still come from
            // the cluster's time: nothing within retention expires, nothing fires early).
            let sign = if rng.gen_bool(0.5) { "+" } else { "-" };
            let offset =
                if rng.gen_bool(0.2) { format!("{sign}31d") } else { format!("{sign}{}s", rng.gen_range(2..=30)) };
            cluster.set_clock_offset(id, &offset)?;
            Fault::ClockSkew(id, offset)
        }
        FaultKind::Replace => {
            let leader = cluster.leader_id().await;
            let followers: Vec<u64> = cluster.live_ids().into_iter().filter(|id| Some(*id) != leader).collect();
            let id = *followers.choose(rng).context("no running follower")?;
            let via = leader.unwrap_or(*ids.iter().find(|n| **n != id).context("another node")?);
            let removed = remove_member(&cluster.client(), &cluster.http_url(via), cluster.admin_token(), id).await?;
            anyhow::ensure!(removed.is_ok(), "remove node {id} through node {via}: {removed:?}");
            cluster.kill9(id)?;
            cluster.wipe(id)?;
            cluster.start_node(id)?;
            Fault::Replace(id)
        }
        FaultKind::IsolateLeader | FaultKind::Minority | FaultKind::OneWay | FaultKind::Bridge => {
            let leader = cluster.leader_id().await;
            let network = cluster.network().context("network faults need `network_namespaces`")?;
            let mut shuffled = ids.clone();
            shuffled.shuffle(rng);
            match kind {
                FaultKind::IsolateLeader => network.isolate(leader.unwrap_or(shuffled[0]))?,
                FaultKind::Minority => {
                    let (minority, majority) = shuffled.split_at((ids.len() - 1) / 2);
                    network.partition(&[minority.to_vec(), majority.to_vec()])?;
                }
                FaultKind::OneWay => network.drop_one_way(shuffled[0], shuffled[1])?,
                _ => {
                    // [a.., bridge] and [bridge, b..]: the bridge node talks to both sides.
                    let bridge = shuffled[0];
                    let rest = &shuffled[1..];
                    let (left, right) = rest.split_at(rest.len() / 2);
                    let mut one = left.to_vec();
                    one.push(bridge);
                    let mut two = right.to_vec();
                    two.push(bridge);
                    network.partition(&[one, two])?;
                }
            }
            Fault::Network(network.describe())
        }
    };
    Ok(fault)
}

async fn heal(cluster: &mut Cluster, fault: &Fault) -> Result<()> {
    match fault {
        Fault::Replace(id) => readd(cluster, *id).await,
        Fault::WipeInPlace(id) => {
            remove(cluster, *id).await?;
            readd(cluster, *id).await
        }
        Fault::Forked(id, _) => {
            let majority: Vec<u64> = cluster.node_ids().into_iter().filter(|n| n != id).collect();
            if let Some(network) = cluster.network() {
                network.heal()?;
            }
            // For a while after the cut heals neither side joins the other.
            let healed = Instant::now();
            while healed.elapsed() < APART_AFTER_HEAL {
                let recovered = cluster.view(*id).await?;
                anyhow::ensure!(
                    recovered.leader_id == Some(*id) && recovered.voters == vec![*id],
                    "{:?} after the heal, forked node {id} names leader {:?} and voters {:?}",
                    healed.elapsed(),
                    recovered.leader_id,
                    recovered.voters
                );
                for other in &majority {
                    // A node of the majority down for another reason says nothing.
                    if let Ok(view) = cluster.view(*other).await {
                        anyhow::ensure!(
                            view.leader_id != Some(*id),
                            "{:?} after the heal, node {other} follows the forked node {id}",
                            healed.elapsed()
                        );
                    }
                }
                // The check's own pace while both sides run, not a synchronisation.
                tokio::time::sleep(APART_POLL).await;
            }
            // The operator learns of the mistake: the machine is wiped and added back.
            cluster.kill9(*id)?;
            remove(cluster, *id).await?;
            cluster.wipe(*id)?;
            cluster.start_node(*id)?;
            readd(cluster, *id).await?;
            cluster.set_forked(*id, false);
            Ok(())
        }
        Fault::OldDirectory(id, copy) => {
            // The machine is replaced...
            remove(cluster, *id).await?;
            cluster.kill9(*id)?;
            cluster.wipe(*id)?;
            cluster.start_node(*id)?;
            readd(cluster, *id).await?;
            // ...and then started on its old disk, a member the cluster replaced.
            cluster.kill9(*id)?;
            cluster.wipe(*id)?;
            crate::copy_dir(copy, cluster.data_dir(*id))?;
            std::fs::remove_dir_all(copy).with_context(|| format!("remove {}", copy.display()))?;
            cluster.start_node(*id)?;
            let started = Instant::now();
            while started.elapsed() < APART_AFTER_HEAL {
                let leader = cluster.leader_id().await;
                anyhow::ensure!(
                    leader != Some(*id),
                    "node {id}, started on the directory of a member the cluster replaced, leads"
                );
                // The check's own pace while the cluster serves, not a synchronisation.
                tokio::time::sleep(APART_POLL).await;
            }
            // Then wiped and added back once more.
            cluster.kill9(*id)?;
            cluster.wipe(*id)?;
            cluster.start_node(*id)?;
            remove(cluster, *id).await?;
            readd(cluster, *id).await
        }
        Fault::Kill(id) => cluster.start_node(*id),
        Fault::KillCatchingUp(id, after_ms) => {
            cluster.start_node(*id)?;
            // The fault's own timing (a kill part-way through the catch-up), not a wait.
            tokio::time::sleep(Duration::from_millis(*after_ms)).await;
            // A node that exited on its own meanwhile is recorded (and fails the test).
            cluster.reap_exited()?;
            if cluster.is_running(*id) {
                cluster.kill9(*id)?;
            }
            cluster.start_node(*id)
        }
        Fault::DiskFull(id) => cluster.free_disk(*id),
        Fault::Pause(id) => cluster.resume(*id),
        Fault::ClockSkew(id, _) => cluster.set_clock_offset(*id, "+0"),
        Fault::Network(_) => cluster.network().context("network")?.heal(),
        Fault::LossyLink(id, _) => cluster.network().context("network")?.restore(*id),
    }
}

/// How long after a forked or stale node comes back the nemesis checks it stays apart.
const APART_AFTER_HEAL: Duration = Duration::from_secs(4);
const APART_POLL: Duration = Duration::from_millis(250);

/// Runs the `raftbox` command line as an operator would; fails with its output if it fails.
async fn cli(args: &[&str]) -> Result<()> {
    let output = crate::run_cli(args).await?;
    anyhow::ensure!(
        output.status.success(),
        "raftbox {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// How long adding a replaced node back may take (its catch-up included).
const READD_DEADLINE: Duration = Duration::from_secs(60);
/// How long after its restart a node catching up is killed again (ms).
const KILL_CATCHING_UP_MS: (u64, u64) = (50, 1_500);
/// With [`FaultKind::KillCatchingUp`]: a snapshot every this many entries, and this many
/// kept behind it, so a node down for a second or two catches up by a snapshot install.
const CATCH_UP_SNAPSHOT_EVERY: u64 = 300;
const CATCH_UP_LOGS_KEPT: u64 = 50;
/// A lossy link: the share of packets dropped, and the node's sending rate.
const LOSS_PERCENT: (u8, u8) = (5, 40);
const LINK_KBIT: (u32, u32) = (256, 4_096);
const LINK_QUEUE_MS: u32 = 400;
/// What a full disk leaves free (MiB): under the NOSPACE minimum a scenario with this fault
/// sets ([`DISK_FULL_MIN_FREE_MB`]), so the alarm rings before the disk is truly out.
const DISK_FULL_LEAVE_MB: u64 = 8;
/// The `raft.min_free_disk_mb` and disk size (MiB) of a scenario with [`FaultKind::DiskFull`].
pub const DISK_FULL_MIN_FREE_MB: u64 = 32;
pub const SMALL_DISK_MB: u64 = 256;

/// Removes node `id` from the membership through any other running node, repeating the
/// request while its outcome is unknown or no leader answers (a removal repeats harmlessly).
async fn remove(cluster: &Cluster, id: u64) -> Result<()> {
    let wait = Deadline::after(READD_DEADLINE, format!("node {id} removed"));
    loop {
        let via = cluster.live_ids().into_iter().find(|n| *n != id).context("no other running node")?;
        match remove_member(&cluster.client(), &cluster.http_url(via), cluster.admin_token(), id).await? {
            Outcome::Ok(body) if body["complete"] == true => return Ok(()),
            Outcome::Rejected(404, _) => return Ok(()),
            other => wait.tick(&format!("through node {via}: {other:?}")).await?,
        }
    }
}

/// Adds node `id` back through any other running node, repeating the request while it
/// catches up or while the outcome is unknown (adding a voter again changes nothing).
async fn readd(cluster: &Cluster, id: u64) -> Result<()> {
    let (http_addr, grpc_addr) = cluster.addresses(id);
    let wait = Deadline::after(READD_DEADLINE, format!("node {id} added back as a voter"));
    loop {
        let via = cluster.live_ids().into_iter().find(|n| *n != id).context("no other running node")?;
        let answer =
            add_member(&cluster.client(), &cluster.http_url(via), cluster.admin_token(), id, &http_addr, &grpc_addr)
                .await?;
        match answer {
            Outcome::Ok(body) if body["complete"] == true => return Ok(()),
            other => wait.tick(&format!("through node {via}: {other:?}")).await?,
        }
    }
}
