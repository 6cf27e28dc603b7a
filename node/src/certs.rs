//! `raftbox certs DIR --nodes N --host H`: a cluster CA and one certificate per node, for
//! `[tls]` (README "TLS"). ECDSA P-256 keys; each node certificate is good for server and
//! client authentication (so it serves mutual TLS both ways) and names `127.0.0.1`, `::1`,
//! `localhost` and every `--host`. Keys are written mode 0600; existing files are never
//! overwritten.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chrono::{Datelike as _, Days, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// Years the CA is valid.
const CA_YEARS: i32 = 10;
/// Years a node certificate is valid.
const NODE_YEARS: i32 = 2;
/// Most node certificates one call makes.
const NODES_MAX: u64 = 99;

#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Directory to write `ca.pem`, `ca.key`, `nodeN.pem` and `nodeN.key` into (created if
    /// missing).
    pub dir: PathBuf,
    /// Node certificates to make: node1 … nodeN.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Another name or IP address the nodes are reached by (besides 127.0.0.1, ::1 and
    /// localhost); repeat for several.
    #[arg(long)]
    pub host: Vec<String>,
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    if !(1..=NODES_MAX).contains(&args.nodes) {
        bail!("--nodes must be 1 to {NODES_MAX}");
    }
    let mut names = vec!["127.0.0.1".to_string(), "::1".to_string(), "localhost".to_string()];
    for host in &args.host {
        if host.is_empty() || host.contains(char::is_whitespace) {
            bail!("--host {host:?} is not a name or an address");
        }
        if !names.contains(host) {
            names.push(host.clone());
        }
    }
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    let mut files = vec!["ca.pem".to_string(), "ca.key".to_string()];
    for id in 1..=args.nodes {
        files.push(format!("node{id}.pem"));
        files.push(format!("node{id}.key"));
    }
    if let Some(existing) = files.iter().map(|f| args.dir.join(f)).find(|p| p.exists()) {
        bail!("{} exists already; remove it or choose another directory", existing.display());
    }

    let ca_key = KeyPair::generate().context("generate the CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(DnType::CommonName, "raftbox cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    valid_for(&mut ca_params, CA_YEARS);
    let ca_cert = ca_params.self_signed(&ca_key).context("sign the CA")?;
    write(&args.dir.join("ca.pem"), &ca_cert.pem(), 0o644)?;
    write(&args.dir.join("ca.key"), &ca_key.serialize_pem(), 0o600)?;
    let issuer = Issuer::new(ca_params, ca_key);

    for id in 1..=args.nodes {
        let key = KeyPair::generate().context("generate a node key")?;
        let mut params = CertificateParams::new(names.clone())?;
        params.distinguished_name.push(DnType::CommonName, format!("raftbox node {id}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        valid_for(&mut params, NODE_YEARS);
        let cert = params.signed_by(&key, &issuer).with_context(|| format!("sign node {id}'s certificate"))?;
        write(&args.dir.join(format!("node{id}.pem")), &cert.pem(), 0o644)?;
        write(&args.dir.join(format!("node{id}.key")), &key.serialize_pem(), 0o600)?;
    }
    println!(
        "wrote {dir}/ca.pem (keep {dir}/ca.key offline) and node1..node{n}.pem/.key for {names}",
        dir = args.dir.display(),
        n = args.nodes,
        names = names.join(", ")
    );
    Ok(())
}

/// Valid from yesterday (clocks differ a little) for `years`.
fn valid_for(params: &mut CertificateParams, years: i32) {
    let from = Utc::now().date_naive().checked_sub_days(Days::new(1)).unwrap_or_else(|| Utc::now().date_naive());
    params.not_before = rcgen::date_time_ymd(from.year(), from.month() as u8, from.day() as u8);
    // The 28th exists in every month, so the end date is always valid.
    params.not_after = rcgen::date_time_ymd(from.year() + years, from.month() as u8, from.day().min(28) as u8);
}

fn write(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_load_as_node_tls_and_are_never_overwritten() {
        let dir = tempfile::tempdir().expect("dir");
        let args = || CertsArgs { dir: dir.path().to_path_buf(), nodes: 2, host: vec!["raftbox.example".into()] };
        run(args()).expect("certs");
        let file = |name: &str| dir.path().join(name);
        for id in [1, 2] {
            let tls = raftbox_raft::NodeTls::load(
                &file(&format!("node{id}.pem")),
                &file(&format!("node{id}.key")),
                Some(&file("ca.pem")),
                true,
            )
            .expect("loads");
            assert!(tls.mutual());
        }
        let mode = std::fs::metadata(file("node1.key")).expect("key").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        let again = run(args()).unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
    }
}
