//! Network faults enforced by the kernel: each node in its own network namespace, joined to
//! the test's bridge by a veth pair, and `nft` rules inside the namespaces that drop packets.
//!
//! Layout for a test with prefix `P` (unique per process) on subnet `10.A.B.0/24`:
//!
//! ```text
//!   test process (root namespace) ── bridge P-br 10.A.B.254 ──┬── veth ── netns P-n1: eth0 10.A.B.1
//!                                                             ├── veth ── netns P-n2: eth0 10.A.B.2
//!                                                             └── …
//! ```
//!
//! Each namespace has a table `inet raftbox_nemesis` with an input chain; a fault is a set
//! of `ip saddr X drop` rules in it, or for a lossy link a rule dropping a random share of
//! what the peers send (`numgen random`) and a token-bucket qdisc capping what the node
//! sends (`tc tbf`: a slow link; this machine's kernel has no `netem`, so no added delay). Clients (the test process, at the bridge address) are
//! never cut off: as in Jepsen's partitions, a client may still reach an isolated leader.
//! Everything is removed on drop. A machine that cannot create namespaces fails
//! [`Network::create`] with the command's error — tests never skip.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Context as _, Result};

/// The nft table each namespace gets.
const TABLE: &str = "raftbox_nemesis";
/// The chain of the lossy links' rules (the cuts are in `input`).
const LOSSY_CHAIN: &str = "lossy";
/// First octet of the test subnets (10.0.0.0/8 is private; the harness picks the others).
const SUBNET_FIRST_OCTET: u8 = 10;

/// The namespaces, veths and bridge of one test.
pub struct Network {
    prefix: String,
    bridge: String,
    /// Second and third octets of the subnet.
    subnet: (u8, u8),
    nodes: BTreeSet<u64>,
    /// Directed pairs (from, to) whose packets are dropped now.
    cut: BTreeSet<(u64, u64)>,
    /// Nodes whose link is lossy and slow now.
    degraded: BTreeSet<u64>,
}

fn run(args: &[&str]) -> Result<()> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("run {} (is iproute2/nftables installed?)", args.join(" ")))?;
    if !output.status.success() {
        bail!("`{}` failed ({}): {}", args.join(" "), output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

impl Network {
    /// Creates the bridge and one namespace per node in `nodes` (ids 1–200). Needs root and
    /// `ip`/`nft`; any failure is an error (and what was created is removed).
    pub fn create(nodes: &[u64]) -> Result<Network> {
        let pid = std::process::id();
        // Distinct per process: interface names hold at most 15 bytes.
        let prefix = format!("rbx{:05x}", pid & 0xf_ffff);
        let subnet = (100 + (pid % 100) as u8, ((pid / 100) % 250) as u8);
        let mut network = Network {
            bridge: format!("{prefix}br"),
            prefix,
            subnet,
            nodes: BTreeSet::new(),
            cut: BTreeSet::new(),
            degraded: BTreeSet::new(),
        };
        network.clean_leftovers();
        run(&["ip", "link", "add", &network.bridge, "type", "bridge"])
            .context("create the test bridge; the partition tests need root and network namespaces")?;
        let bridge_addr = format!("{}/24", network.bridge_ip());
        run(&["ip", "addr", "add", &bridge_addr, "dev", &network.bridge])?;
        run(&["ip", "link", "set", &network.bridge, "up"])?;
        for &id in nodes {
            network.add_node(id)?;
        }
        Ok(network)
    }

    /// Adds node `id`'s namespace (for a node that joins later).
    pub fn add_node(&mut self, id: u64) -> Result<()> {
        if id == 0 || id > 200 {
            bail!("node ids 1-200 only, got {id}");
        }
        if self.nodes.contains(&id) {
            return Ok(());
        }
        let ns = self.namespace(id);
        let veth = self.veth(id);
        run(&["ip", "netns", "add", &ns])?;
        self.nodes.insert(id);
        run(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
        run(&["ip", "link", "set", &veth, "master", &self.bridge])?;
        run(&["ip", "link", "set", &veth, "up"])?;
        let addr = format!("{}/24", self.ip(id));
        run(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
        run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        run(&["ip", "netns", "exec", &ns, "nft", "add", "table", "inet", TABLE])?;
        run(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "nft",
            &format!("add chain inet {TABLE} input {{ type filter hook input priority 0 ; policy accept ; }}"),
        ])?;
        // A lossy link's rule lives in a chain of its own, so healing the cuts leaves it.
        run(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "nft",
            &format!("add chain inet {TABLE} {LOSSY_CHAIN} {{ type filter hook input priority 1 ; policy accept ; }}"),
        ])?;
        Ok(())
    }

    /// Node `id`'s address.
    pub fn ip(&self, id: u64) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET_FIRST_OCTET, self.subnet.0, self.subnet.1, id as u8)
    }

    /// The test process's address on the bridge.
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET_FIRST_OCTET, self.subnet.0, self.subnet.1, 254)
    }

    /// Node `id`'s namespace.
    pub fn namespace(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// The command prefix that runs a program in node `id`'s namespace (`ip netns exec`
    /// execs in place, so the child's pid is the program's).
    pub fn exec_prefix(&self, id: u64) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.namespace(id)]
    }

    /// Drops packets from `from` to `to` (one way).
    pub fn drop_one_way(&mut self, from: u64, to: u64) -> Result<()> {
        if from == to || !self.cut.insert((from, to)) {
            return Ok(());
        }
        let rule = format!("add rule inet {TABLE} input ip saddr {} drop", self.ip(from));
        run(&["ip", "netns", "exec", &self.namespace(to), "nft", &rule])
    }

    /// Cuts every link between two nodes of different `groups` (both ways); nodes in no
    /// group keep all their links. Overlapping groups make a bridge: a node in two groups
    /// talks to both.
    pub fn partition(&mut self, groups: &[Vec<u64>]) -> Result<()> {
        let nodes: Vec<u64> = self.nodes.iter().copied().collect();
        for &a in &nodes {
            for &b in &nodes {
                let a_groups: Vec<usize> = (0..groups.len()).filter(|g| groups[*g].contains(&a)).collect();
                let b_groups: Vec<usize> = (0..groups.len()).filter(|g| groups[*g].contains(&b)).collect();
                let share = a_groups.iter().any(|g| b_groups.contains(g));
                if a != b && !a_groups.is_empty() && !b_groups.is_empty() && !share {
                    self.drop_one_way(a, b)?;
                }
            }
        }
        Ok(())
    }

    /// Cuts `id` off from every other node (clients still reach it).
    pub fn isolate(&mut self, id: u64) -> Result<()> {
        let others: Vec<u64> = self.nodes.iter().copied().filter(|n| *n != id).collect();
        self.partition(&[vec![id], others])
    }

    /// Makes node `id`'s link lossy and slow: `loss_percent` of the packets its peers send
    /// it are dropped at random, and what it sends goes through a token bucket of `kbit`
    /// kbit/s (queueing up to `queue_ms`, dropping beyond).
    pub fn degrade(&mut self, id: u64, loss_percent: u8, kbit: u32, queue_ms: u32) -> Result<()> {
        if self.degraded.contains(&id) {
            return Ok(());
        }
        // Marked first, so a heal undoes whatever part of it was applied.
        self.degraded.insert(id);
        let ns = self.namespace(id);
        let peers: Vec<String> = self.nodes.iter().filter(|n| **n != id).map(|n| self.ip(*n).to_string()).collect();
        if !peers.is_empty() {
            let rule = format!(
                "add rule inet {TABLE} {LOSSY_CHAIN} ip saddr {{ {} }} numgen random mod 100 < {loss_percent} drop",
                peers.join(", ")
            );
            run(&["ip", "netns", "exec", &ns, "nft", &rule])?;
        }
        let (rate, latency) = (format!("{kbit}kbit"), format!("{queue_ms}ms"));
        let tbf = [
            "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate, "burst", "16kb", "latency", &latency,
        ];
        run(&[&["ip", "netns", "exec", &ns][..], &tbf[..]].concat())
    }

    /// Removes every cut link (lossy links stay: [`Network::restore`] heals those).
    pub fn heal(&mut self) -> Result<()> {
        let targets: BTreeSet<u64> = self.cut.iter().map(|(_, to)| *to).collect();
        let mut first_error = None;
        for to in targets {
            let flushed =
                run(&["ip", "netns", "exec", &self.namespace(to), "nft", "flush", "chain", "inet", TABLE, "input"]);
            match flushed {
                Ok(()) => self.cut.retain(|(_, t)| *t != to),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Makes node `id`'s lossy, slow link whole again.
    pub fn restore(&mut self, id: u64) -> Result<()> {
        if !self.degraded.contains(&id) {
            return Ok(());
        }
        let ns = self.namespace(id);
        run(&["ip", "netns", "exec", &ns, "nft", "flush", "chain", "inet", TABLE, LOSSY_CHAIN])?;
        let removed = run(&["ip", "netns", "exec", &ns, "tc", "qdisc", "del", "dev", "eth0", "root"]);
        // No qdisc to remove: `degrade` failed before it added one.
        if let Err(e) = removed {
            if !e.to_string().contains("No such file") && !e.to_string().contains("Cannot find") {
                return Err(e);
            }
        }
        self.degraded.remove(&id);
        Ok(())
    }

    /// The directed links cut now, as (from, to).
    pub fn cut_links(&self) -> &BTreeSet<(u64, u64)> {
        &self.cut
    }

    /// Removes namespaces and a bridge with this process's prefix left by an earlier run whose
    /// pid this process reuses.
    fn clean_leftovers(&self) {
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        for id in 1..=200u64 {
            let ns = self.namespace(id);
            if std::path::Path::new("/run/netns").join(&ns).exists() {
                let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            }
            if std::path::Path::new("/sys/class/net").join(self.veth(id)).exists() {
                let _ = Command::new("ip").args(["link", "del", &self.veth(id)]).output();
            }
        }
    }

    /// The root-namespace end of node `id`'s veth pair.
    fn veth(&self, id: u64) -> String {
        format!("{}v{id}", self.prefix)
    }

    /// A description for logs: the cut links.
    pub fn describe(&self) -> String {
        let mut by_target: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (from, to) in &self.cut {
            by_target.entry(*to).or_default().push(*from);
        }
        let mut parts: Vec<String> =
            by_target.iter().map(|(to, from)| format!("{to} hears nothing from {from:?}")).collect();
        parts.extend(self.degraded.iter().map(|id| format!("{id}'s link lossy and slow")));
        if parts.is_empty() {
            return "all links up".into();
        }
        parts.join("; ")
    }
}

impl Drop for Network {
    /// Deleting a veth end deletes the pair; the namespaces go once their processes have.
    fn drop(&mut self) {
        for id in &self.nodes {
            let _ = Command::new("ip").args(["link", "del", &self.veth(*id)]).output();
            let _ = Command::new("ip").args(["netns", "del", &self.namespace(*id)]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}
