//! Node configuration: a TOML file, overridden by flags and `RAFTBOX_*` environment
//! variables, parsed once into a validated [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use raftbox_api::idempotency::IdempotencyConfig;
use raftbox_api::ratelimit::{RateLimitConfig, RateLimitingConfig};
use raftbox_api::runtime_limits::LimitsConfig;
use raftbox_api::webhooks::{WebhookPolicy, WebhooksConfig};
use raftbox_api::{ApiConfig, HttpConfig, JobLimits, NotifyLimits};

use crate::executor::JobsConfig;
use crate::maintenance::FilesConfig;
use raftbox_raft::{ClusterSecret, NodeInfo, NodeTls, RaftSettings};
use serde::Deserialize;

/// `raftbox serve` flags; each also reads an environment variable.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// TOML configuration file (see README.md, "Configuration").
    #[arg(long, env = "RAFTBOX_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id; must be one of the members.
    #[arg(long, env = "RAFTBOX_NODE_ID")]
    pub node_id: Option<u64>,
    /// Directory for the node's database.
    #[arg(long, env = "RAFTBOX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address (default: this node's member entry).
    #[arg(long, env = "RAFTBOX_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// gRPC listen address (default: this node's member entry).
    #[arg(long, env = "RAFTBOX_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// File holding the admin bearer token; the cluster makes sure an admin user has it.
    #[arg(long, env = "RAFTBOX_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the cluster secret that every node-to-node call carries (the same on
    /// every node; 16+ visible ASCII characters; keep it mode 0600).
    #[arg(long, env = "RAFTBOX_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Initialize the cluster on first start (set on exactly one node).
    #[arg(long, env = "RAFTBOX_BOOTSTRAP")]
    pub bootstrap: bool,
    /// Log lines on stderr: `text` (for people) or `json` (one object per line, for a log
    /// pipeline).
    #[arg(long, env = "RAFTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How `raftbox serve` writes its log.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    node_id: Option<u64>,
    data_dir: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    admin_token_file: Option<PathBuf>,
    cluster_secret_file: Option<PathBuf>,
    #[serde(default)]
    bootstrap: bool,
    #[serde(default)]
    members: Vec<MemberConfig>,
    #[serde(default)]
    raft: RaftConfig,
    #[serde(default)]
    http: HttpConfig,
    #[serde(default)]
    idempotency: IdempotencyConfig,
    #[serde(default)]
    rate_limiting: RateLimitingConfig,
    #[serde(default)]
    rate_limits: Vec<RateLimitConfig>,
    #[serde(default)]
    files: FilesConfig,
    #[serde(default)]
    jobs: JobsConfig,
    #[serde(default)]
    webhooks: WebhooksConfig,
    #[serde(default)]
    job_limits: JobLimits,
    #[serde(default)]
    notify_limits: NotifyLimits,
    #[serde(default)]
    quotas: raftbox_api::Quotas,
    tls: Option<TlsConfig>,
}

/// `[tls]`: HTTPS for the API and TLS between nodes (README "TLS").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsConfig {
    /// The node's certificate chain (PEM), server and client auth.
    cert_file: PathBuf,
    /// Its private key (PEM).
    key_file: PathBuf,
    /// The cluster's CA (PEM): peers are verified against it; without it, against the
    /// public web roots.
    ca_file: Option<PathBuf>,
    /// Nodes present and demand certificates signed by `ca_file`; the cluster secret is
    /// then optional.
    #[serde(default)]
    mutual: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberConfig {
    id: u64,
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RaftConfig {
    heartbeat_ms: Option<u64>,
    election_timeout_min_ms: Option<u64>,
    election_timeout_max_ms: Option<u64>,
    snapshot_logs_since_last: Option<u64>,
    logs_to_keep: Option<u64>,
    write_timeout_ms: Option<u64>,
    max_clock_offset_ms: Option<u64>,
    membership_timeout_ms: Option<u64>,
    /// Free space (MiB) below which the data directory's disk counts as full (NOSPACE).
    min_free_disk_mb: Option<u64>,
}

/// A validated node configuration.
impl ServeArgs {
    /// The arguments of a node given by its configuration file alone (the offline commands,
    /// `raftbox restore` and `raftbox recover`).
    pub fn from_file(config: PathBuf) -> ServeArgs {
        ServeArgs { config: Some(config), ..ServeArgs::none() }
    }

    /// No file, no flag.
    pub fn none() -> ServeArgs {
        ServeArgs {
            config: None,
            node_id: None,
            data_dir: None,
            http_addr: None,
            grpc_addr: None,
            admin_token_file: None,
            cluster_secret_file: None,
            bootstrap: false,
            log_format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: u64,
    pub data_dir: PathBuf,
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub admin_token_file: Option<PathBuf>,
    pub cluster_secret: ClusterSecret,
    /// TLS for HTTP and gRPC, if configured.
    pub tls: Option<NodeTls>,
    pub bootstrap: bool,
    pub log_format: LogFormat,
    pub members: BTreeMap<u64, NodeInfo>,
    pub raft: RaftSettings,
    pub api: ApiConfig,
    pub files: FilesConfig,
    pub jobs: JobsConfig,
}

impl Config {
    /// Reads the file named by `--config` (if any), applies flags, validates.
    pub fn load(args: ServeArgs) -> anyhow::Result<Config> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("read config {}", path.display()))?;
                toml::from_str(&text).with_context(|| format!("parse config {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let tls = match &file.tls {
            Some(t) => Some(
                NodeTls::load(&t.cert_file, &t.key_file, t.ca_file.as_deref(), t.mutual).map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        let mutual = tls.as_ref().is_some_and(NodeTls::mutual);
        let secret = match args.cluster_secret_file.clone().or_else(|| file.cluster_secret_file.clone()) {
            Some(secret_file) => {
                let text = std::fs::read_to_string(&secret_file)
                    .with_context(|| format!("read cluster secret {}", secret_file.display()))?;
                ClusterSecret::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", secret_file.display()))?
            }
            None if mutual => ClusterSecret::mutual_tls_only(),
            None => bail!(
                "cluster_secret_file is required (config or --cluster-secret-file) unless [tls] mutual = true: \
                 without a secret or mutual TLS anyone who reaches the gRPC port could act as a node"
            ),
        };
        Config::merge(file, args, secret, tls)
    }

    fn merge(
        file: FileConfig,
        args: ServeArgs,
        cluster_secret: ClusterSecret,
        tls: Option<NodeTls>,
    ) -> anyhow::Result<Config> {
        let node_id = args.node_id.or(file.node_id).context("node_id is required (config or --node-id)")?;
        let data_dir = args.data_dir.or(file.data_dir).context("data_dir is required (config or --data-dir)")?;
        let mut members = BTreeMap::new();
        let mut addrs = BTreeSet::new();
        for m in &file.members {
            if !addrs.insert(m.http_addr) || !addrs.insert(m.grpc_addr) {
                bail!("member {} reuses an address of another member", m.id);
            }
            let info = NodeInfo::new(m.http_addr.to_string(), m.grpc_addr.to_string());
            if members.insert(m.id, info).is_some() {
                bail!("member id {} appears twice", m.id);
            }
        }
        let own = file.members.iter().find(|m| m.id == node_id);
        let Some(own) = own else {
            bail!("node_id {node_id} is not among the [[members]] ({:?})", members.keys().collect::<Vec<_>>());
        };
        let d = RaftSettings::default();
        let raft = RaftSettings {
            heartbeat_ms: file.raft.heartbeat_ms.unwrap_or(d.heartbeat_ms),
            election_timeout_min_ms: file.raft.election_timeout_min_ms.unwrap_or(d.election_timeout_min_ms),
            election_timeout_max_ms: file.raft.election_timeout_max_ms.unwrap_or(d.election_timeout_max_ms),
            snapshot_logs_since_last: file.raft.snapshot_logs_since_last.unwrap_or(d.snapshot_logs_since_last),
            logs_to_keep: file.raft.logs_to_keep.unwrap_or(d.logs_to_keep),
            write_timeout_ms: file.raft.write_timeout_ms.unwrap_or(d.write_timeout_ms),
            bootstrap_wait_ms: d.bootstrap_wait_ms,
            max_clock_offset_ms: file.raft.max_clock_offset_ms.unwrap_or(d.max_clock_offset_ms),
            membership_timeout_ms: file.raft.membership_timeout_ms.unwrap_or(d.membership_timeout_ms),
            min_free_disk_bytes: file.raft.min_free_disk_mb.map_or(d.min_free_disk_bytes, |mb| mb << 20),
            reads_format: reported_format()?,
        };
        if raft.heartbeat_ms == 0 || raft.heartbeat_ms >= raft.election_timeout_min_ms {
            bail!("raft.heartbeat_ms must be positive and below raft.election_timeout_min_ms");
        }
        if raft.election_timeout_min_ms >= raft.election_timeout_max_ms {
            bail!("raft.election_timeout_min_ms must be below raft.election_timeout_max_ms");
        }
        if raft.snapshot_logs_since_last == 0 {
            bail!("raft.snapshot_logs_since_last must be positive");
        }
        in_range("raft.write_timeout_ms", raft.write_timeout_ms, 100, 600_000)?;
        in_range("notify_limits.per_principal_max", file.notify_limits.per_principal_max as u64, 1, 1_000_000)?;
        in_range("notify_limits.per_node_max", file.notify_limits.per_node_max as u64, 1, 10_000_000)?;
        // The same checks as a change at runtime (`raftbox limits set`).
        let limits = LimitsConfig { rate_limits: file.rate_limits, job_limits: file.job_limits, quotas: file.quotas }
            .validate()
            .map_err(anyhow::Error::msg)?;
        in_range("raft.membership_timeout_ms", raft.membership_timeout_ms, 1_000, 3_600_000)?;
        in_range("raft.max_clock_offset_ms", raft.max_clock_offset_ms, 10, 3_600_000)?;
        in_range("http.request_timeout_ms", file.http.request_timeout_ms, 1_000, 3_600_000)?;
        in_range("http.requests_in_flight_max", file.http.requests_in_flight_max as u64, 1, 1_000_000)?;
        in_range("http.connections_max", file.http.connections_max as u64, 1, 1_000_000)?;
        let in_flight = file.http.requests_in_flight_max as u64;
        in_range(
            "http.requests_in_flight_per_client_max",
            file.http.requests_in_flight_per_client_max as u64,
            1,
            in_flight,
        )?;
        in_range(
            "http.requests_in_flight_per_user_max",
            file.http.requests_in_flight_per_user_max as u64,
            1,
            in_flight,
        )?;
        if raft.membership_timeout_ms >= file.http.request_timeout_ms {
            bail!("raft.membership_timeout_ms must be below http.request_timeout_ms (a change answers before the request times out)");
        }
        in_range("rate_limiting.decision_timeout_ms", file.rate_limiting.decision_timeout_ms, 1, 60_000)?;
        in_range("idempotency.ttl_s", file.idempotency.ttl_s, 1, 365 * 24 * 3600)?;
        in_range("idempotency.lease_s", file.idempotency.lease_s, 1, 24 * 3600)?;
        in_range("jobs.lease_ms", file.jobs.lease_ms, 100, 3_600_000)?;
        in_range("jobs.concurrency", u64::from(file.jobs.concurrency), 1, 65_536)?;
        in_range("jobs.run_retention_s", file.jobs.run_retention_s, 1, 365 * 24 * 3600)?;
        in_range("files.version_retention_s", file.files.version_retention_s, 0, 100 * 365 * 24 * 3600)?;
        in_range("files.orphan_grace_s", file.files.orphan_grace_s, 0, 365 * 24 * 3600)?;
        in_range("files.maintenance_interval_s", file.files.maintenance_interval_s, 1, 24 * 3600)?;
        in_range("files.replicator_round_chunks", file.files.replicator_round_chunks as u64, 1, 1_000_000)?;
        Ok(Config {
            node_id,
            data_dir,
            http_addr: args.http_addr.or(file.http_addr).unwrap_or(own.http_addr),
            grpc_addr: args.grpc_addr.or(file.grpc_addr).unwrap_or(own.grpc_addr),
            admin_token_file: args.admin_token_file.or(file.admin_token_file),
            cluster_secret,
            tls,
            bootstrap: args.bootstrap || file.bootstrap,
            log_format: args.log_format,
            members,
            raft,
            files: file.files,
            jobs: file.jobs,
            api: ApiConfig {
                http: file.http,
                idempotency: file.idempotency,
                rate_limiting: file.rate_limiting,
                rate_limits: limits.rate_limits,
                webhooks: WebhookPolicy::new(&file.webhooks).map_err(|e| anyhow::anyhow!(e))?,
                job_limits: limits.job_limits,
                notify_limits: file.notify_limits,
                quotas: limits.quotas,
            },
        })
    }
}

/// `value` of the setting `name` is within `min..=max`, or a clear start-up error.
fn in_range(name: &str, value: u64, min: u64, max: u64) -> anyhow::Result<()> {
    raftbox_api::runtime_limits::in_range(name, value, min, max).map_err(anyhow::Error::msg)
}

/// The data format the node tells its peers it reads: this code's, or — only where the
/// rolling-upgrade test stands in for a node of the previous release —
/// `RAFTBOX_REPORT_FORMAT` (docs/testing.md).
fn reported_format() -> anyhow::Result<u32> {
    let newest = raftbox_storage::format::FORMAT;
    match std::env::var("RAFTBOX_REPORT_FORMAT") {
        Err(_) => Ok(newest),
        Ok(text) => match text.parse::<u32>() {
            Ok(format) if (2..=newest).contains(&format) => Ok(format),
            _ => bail!("RAFTBOX_REPORT_FORMAT must be 2 to {newest}, not {text:?}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_text_unless_json_is_asked_for() {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        let format = |flags: &[&str]| {
            let argv = std::iter::once("serve").chain(flags.iter().copied());
            <Serve as clap::Parser>::try_parse_from(argv).map(|s| s.args.log_format)
        };
        assert_eq!(format(&[]).expect("no flag"), LogFormat::Text);
        assert_eq!(format(&["--log-format", "json"]).expect("json"), LogFormat::Json);
        assert_eq!(format(&["--log-format", "text"]).expect("text"), LogFormat::Text);
        assert!(format(&["--log-format", "yaml"]).is_err());
    }

    fn args() -> ServeArgs {
        ServeArgs::none()
    }

    const THREE: &str = r#"
        node_id = 2
        data_dir = "/tmp/n2"
        [[members]]
        id = 1
        http_addr = "127.0.0.1:7081"
        grpc_addr = "127.0.0.1:7091"
        [[members]]
        id = 2
        http_addr = "127.0.0.1:7082"
        grpc_addr = "127.0.0.1:7092"
        [raft]
        heartbeat_ms = 50
    "#;

    fn check(text: &str, args: ServeArgs) -> anyhow::Result<Config> {
        let secret = ClusterSecret::parse("config-tests-cluster-secret").expect("secret");
        Config::merge(toml::from_str(text)?, args, secret, None)
    }

    #[test]
    fn file_values_and_member_defaults() {
        let config = check(THREE, args()).expect("valid");
        assert_eq!(config.node_id, 2);
        assert_eq!(config.http_addr.to_string(), "127.0.0.1:7082");
        assert_eq!(config.raft.heartbeat_ms, 50);
        assert_eq!(config.raft.election_timeout_min_ms, 400);
        assert_eq!(config.members.len(), 2);
    }

    #[test]
    fn flags_override_the_file() {
        let config = check(THREE, ServeArgs { node_id: Some(1), bootstrap: true, ..args() }).expect("valid");
        assert_eq!((config.node_id, config.bootstrap), (1, true));
        assert_eq!(config.grpc_addr.to_string(), "127.0.0.1:7091");
    }

    #[test]
    fn rate_limits_and_idempotency_parse() {
        let text = format!(
            "{THREE}\n[idempotency]\nttl_s = 60\n[rate_limiting]\ndecision_timeout_ms = 100\n\
             [[rate_limits]]\nname = \"u\"\nscope = \"user\"\nroutes = [\"/v1/*\"]\n\
             algorithm = \"token_bucket\"\ncapacity = 10\nrefill_per_s = 5\nfailure = \"closed\""
        );
        let config = check(&text, args()).expect("valid");
        assert_eq!(config.api.idempotency.ttl_s, 60);
        assert_eq!(config.api.rate_limiting.decision_timeout_ms, 100);
        assert_eq!(config.api.rate_limits.len(), 1);
        let twice = format!("{text}\n[[rate_limits]]\nname = \"u\"\nscope = \"ip\"\nroutes = [\"/\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow_ms = 1");
        assert!(check(&twice, args()).unwrap_err().to_string().contains("twice"));
    }

    /// `Config::load` of `THREE` plus `extra` (top-level keys go in `top`).
    fn load(dir: &std::path::Path, top: &str, extra: &str) -> anyhow::Result<Config> {
        let path = dir.join("config.toml");
        std::fs::write(&path, format!("{top}\n{THREE}\n{extra}")).expect("write config");
        Config::load(ServeArgs { config: Some(path), ..args() })
    }

    #[test]
    fn tls_is_checked_at_start_and_mutual_tls_may_replace_the_secret() {
        let dir = tempfile::tempdir().expect("dir");
        let certs = dir.path().join("certs");
        crate::certs::run(crate::certs::CertsArgs { dir: certs.clone(), nodes: 2, host: vec![] }).expect("certs");
        let file = |name: &str| certs.join(name).display().to_string();
        let secret_path = dir.path().join("secret");
        std::fs::write(&secret_path, "config-tests-cluster-secret\n").expect("secret");
        let secret = format!("cluster_secret_file = \"{}\"", secret_path.display());
        let tls = |cert: &str, key: &str, ca: Option<&str>, mutual: bool| {
            let ca = ca.map(|ca| format!("ca_file = \"{}\"\n", file(ca))).unwrap_or_default();
            format!("[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{ca}mutual = {mutual}\n", file(cert), file(key))
        };
        let refusal = |top: &str, extra: &str| load(dir.path(), top, extra).unwrap_err().to_string();

        let mutual = load(dir.path(), "", &tls("node2.pem", "node2.key", Some("ca.pem"), true)).expect("valid");
        assert!(mutual.tls.as_ref().is_some_and(NodeTls::mutual));
        assert!(!mutual.cluster_secret.is_set(), "mutual TLS without a secret");
        let both = load(dir.path(), &secret, &tls("node2.pem", "node2.key", Some("ca.pem"), false)).expect("valid");
        assert!(both.cluster_secret.is_set() && both.tls.is_some());

        let neither = refusal("", "");
        assert!(neither.contains("cluster_secret_file is required"), "{neither}");
        let server_only = refusal("", &tls("node2.pem", "node2.key", Some("ca.pem"), false));
        assert!(server_only.contains("cluster_secret_file is required"), "{server_only}");
        let no_ca = refusal("", &tls("node2.pem", "node2.key", None, true));
        assert!(no_ca.contains("tls.ca_file"), "{no_ca}");
        let missing = refusal(&secret, &tls("node7.pem", "node2.key", Some("ca.pem"), false));
        assert!(missing.contains("tls.cert_file") && missing.contains("node7.pem"), "{missing}");
        let crossed = refusal(&secret, &tls("node1.pem", "node2.key", Some("ca.pem"), false));
        assert!(crossed.contains("usable pair"), "{crossed}");
        let not_a_cert = refusal(&secret, &tls("node2.key", "node2.key", Some("ca.pem"), false));
        assert!(not_a_cert.contains("tls.cert_file"), "{not_a_cert}");
        let not_a_ca = refusal(&secret, &tls("node2.pem", "node2.key", Some("node2.key"), true));
        assert!(not_a_ca.contains("tls.ca_file"), "{not_a_ca}");
        let unknown = refusal(&secret, "[tls]\ncert_file = \"x\"\nkey_file = \"y\"\nmutal = true\n");
        assert!(unknown.contains("parse config"), "{unknown}");
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let unknown_member = check(THREE, ServeArgs { node_id: Some(9), ..args() });
        assert!(unknown_member.unwrap_err().to_string().contains("not among"));
        let bad_timing = THREE.replace("heartbeat_ms = 50", "heartbeat_ms = 500");
        assert!(check(&bad_timing, args()).unwrap_err().to_string().contains("heartbeat_ms"));
        assert!(check("nodeid = 1", args()).is_err(), "unknown keys are errors");
        assert!(check("data_dir = \"/x\"", args()).unwrap_err().to_string().contains("node_id"));
        let huge_limit = format!(
            "{THREE}\n[[rate_limits]]\nname = \"u\"\nscope = \"user\"\nroutes = [\"/v1/*\"]\n\
             capacity = 9223372036854775807\nrefill_per_s = 5"
        );
        assert!(check(&huge_limit, args()).unwrap_err().to_string().contains("capacity must be"));
        let no_timeout = format!("{THREE}\n[http]\nrequest_timeout_ms = 0");
        assert!(check(&no_timeout, args()).unwrap_err().to_string().contains("request_timeout_ms"));
    }
}
