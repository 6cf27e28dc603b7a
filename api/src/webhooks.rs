//! Where webhooks may go. A webhook is a request the cluster makes on a user's behalf, so
//! without a rule any user could make the nodes call their own ports, the cluster's private
//! network or a cloud metadata service (`169.254.169.254`). The rule:
//!
//! - only `http` and `https` URLs with a host, and no user name or password in them;
//! - an address in a private, loopback, link-local, shared, unspecified, multicast,
//!   broadcast or documentation range (IPv4 and IPv6, IPv4-mapped included) is refused,
//!   unless the allow-list (`[webhooks] allow`: CIDRs, addresses or host names) names it;
//!   every other address is allowed;
//! - a host name counts by the addresses it resolves to — all of them, checked when a job is
//!   created or changed, and again by the executor at each call (its resolver drops refused
//!   addresses, so a name that later resolves elsewhere is refused too) — unless the name
//!   itself is allow-listed;
//! - the executor follows no redirects.
//!
//! Every call is signed as the Standard Webhooks specification says
//! (<https://www.standardwebhooks.com>): `webhook-id` (the fire, the same on each retry),
//! `webhook-timestamp` (Unix seconds) and `webhook-signature`, `v1,` and the base64 of
//! HMAC-SHA256 over `{id}.{timestamp}.{body}` keyed by the job owner's secret
//! (`GET /v1/me/webhook-secret`; during a rotation the previous secret signs too, so a
//! receiver may switch at its own pace). A receiver verifies with any Standard Webhooks
//! library, and refuses a timestamp far from its clock.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use url::{Host, Url};

/// The prefix of a Standard Webhooks secret; the rest is the base64 of the HMAC key.
pub const SECRET_PREFIX: &str = "whsec_";
/// Bytes of the HMAC key of a new secret.
const SECRET_KEY_BYTES: usize = 32;

/// A new webhook signing secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    use base64::Engine as _;
    use rand::RngCore as _;
    let mut key = [0u8; SECRET_KEY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(key))
}

/// The `webhook-signature` header of a message: `v1,<base64>` for each secret, separated by
/// spaces. A secret's HMAC key is the base64 after `whsec_`.
pub fn signature(secrets: &[&str], id: &str, timestamp_s: u64, body: &[u8]) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    let engine = base64::engine::general_purpose::STANDARD;
    let signatures: Vec<String> = secrets
        .iter()
        .map(|secret| {
            let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
            let key = engine.decode(encoded).unwrap_or_else(|_| encoded.as_bytes().to_vec());
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp_s.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("v1,{}", engine.encode(mac.finalize().into_bytes()))
        })
        .collect();
    signatures.join(" ")
}

/// The data format from which users have webhook secrets (`SetWebhookSecret`).
pub const SECRETS_FORMAT: u32 = 4;

/// The user's webhook secret, made now if they have none (two nodes making one at once keep
/// the first); `None` while the cluster is below [`SECRETS_FORMAT`] (a rolling
/// upgrade). What the job API calls before a webhook job exists, and the executor before a
/// call of a job from before signatures.
pub async fn ensure_secret(
    node: &raftbox_raft::RaftNode,
    user_id: &str,
) -> Result<Option<raftbox_storage::records::WebhookSecret>, crate::ApiError> {
    if let Some(secret) = node.state().webhook_secret(user_id)? {
        return Ok(Some(secret));
    }
    // Below the format no one has a secret: nothing to wait for.
    if node.cluster_format() < SECRETS_FORMAT {
        return Ok(None);
    }
    node.read_barrier().await?;
    if let Some(secret) = node.state().webhook_secret(user_id)? {
        return Ok(Some(secret));
    }
    let secret = raftbox_storage::records::SecretText(new_secret());
    let command =
        raftbox_storage::Command::SetWebhookSecret { user_id: user_id.to_owned(), secret, keep_previous_ms: None };
    if let raftbox_storage::Outcome::Rejected(rejection) = node.write(command).await? {
        return Err(rejection.into());
    }
    node.read_barrier().await?;
    node.state()
        .webhook_secret(user_id)?
        .map(Some)
        .ok_or_else(|| crate::ApiError::Internal("the webhook secret just made is not in the state".into()))
}

/// How long resolving a webhook's host may take at creation.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The node's `[webhooks]` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// CIDRs (`10.0.0.0/8`), addresses (`127.0.0.1`) or host names (`hooks.internal`)
    /// webhooks may reach although they are private, loopback or link-local.
    pub allow: Vec<String>,
}

/// The parsed rule.
#[derive(Debug, Clone, Default)]
pub struct WebhookPolicy {
    nets: Vec<IpNet>,
    hosts: Vec<String>,
}

impl WebhookPolicy {
    /// Parses the allow-list; the error names the entry that is neither a CIDR, an address
    /// nor a host name.
    pub fn new(config: &WebhooksConfig) -> Result<WebhookPolicy, String> {
        let mut policy = WebhookPolicy::default();
        for entry in &config.allow {
            let entry = entry.trim();
            if let Ok(net) = entry.parse::<IpNet>() {
                policy.nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                policy.nets.push(IpNet::from(ip));
            } else if Host::parse(entry).is_ok_and(|h| matches!(h, Host::Domain(_))) && !entry.is_empty() {
                policy.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(format!("webhooks.allow: {entry:?} is not a CIDR, an address or a host name"));
            }
        }
        Ok(policy)
    }

    /// Whether a call to `ip` is allowed.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|net| net.contains(&ip)) || !is_special(ip)
    }

    /// Whether host name `name` is allow-listed as such (then all its addresses are allowed).
    pub fn allows_name(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.iter().any(|h| *h == name)
    }

    /// Checks a URL's form and, for an address literal, the address: the parsed URL, or why
    /// it is refused. A host name still has to be resolved ([`WebhookPolicy::check`]).
    pub fn check_form(&self, target: &str) -> Result<Url, String> {
        let url = Url::parse(target).map_err(|e| format!("target {target:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("a webhook's target is an http:// or https:// URL, not {}://", url.scheme()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a webhook's target carries no user name or password".into());
        }
        match url.host() {
            None => Err("a webhook's target needs a host".into()),
            Some(Host::Ipv4(ip)) => self.address_ok(IpAddr::V4(ip)).map(|_| url.clone()),
            Some(Host::Ipv6(ip)) => self.address_ok(IpAddr::V6(ip)).map(|_| url.clone()),
            Some(Host::Domain(_)) => Ok(url.clone()),
        }
    }

    fn address_ok(&self, ip: IpAddr) -> Result<(), String> {
        if self.allows_ip(ip) {
            Ok(())
        } else {
            Err(format!(
                "webhooks may not call {ip}: a private, loopback or link-local address (allow it in [webhooks] allow)"
            ))
        }
    }

    /// Checks `target` fully: its form, and every address its host resolves to (within
    /// [`RESOLVE_TIMEOUT`]). A name that does not resolve is refused.
    pub async fn check(&self, target: &str) -> Result<(), String> {
        let url = self.check_form(target)?;
        let Some(Host::Domain(name)) = url.host() else { return Ok(()) };
        if self.allows_name(name) {
            return Ok(());
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let lookup = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, port))).await;
        // What a name resolves to is the cluster's network's business: a refusal says that it
        // was refused, never to what (an internal name's addresses are no one else's to learn).
        let addrs: Vec<SocketAddr> = match lookup {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(_)) => return Err(format!("webhook host {name:?} does not resolve")),
            Err(_) => return Err(format!("webhook host {name:?} did not resolve within {RESOLVE_TIMEOUT:?}")),
        };
        if addrs.is_empty() {
            return Err(format!("webhook host {name:?} resolves to no address"));
        }
        if addrs.iter().any(|addr| !self.allows_ip(addr.ip())) {
            return Err(format!(
                "webhook host {name:?} resolves to an address webhooks may not call (private, loopback, \
                 link-local or reserved; an operator may allow it in [webhooks] allow)"
            ));
        }
        Ok(())
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Addresses a webhook must not reach by default.
fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => is_special_v6(v6),
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier-grade NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240 // reserved
}

/// Every IPv6 range that is not plain global unicast, or that carries an IPv4 address a
/// relay or translator may reach (RFC 6890's registry and the transition mechanisms).
fn is_special_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let (first, second) = (s[0], s[1]);
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || s[..6] == [0; 6] // ::/96, IPv4-compatible (deprecated): ::10.0.0.1
        || s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0 // ::ffff:0:0/96, SIIT translated
        || s[..4] == [0x0100, 0, 0, 0] // 100::/64, discard-only
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || first == 0x2001 && second == 0x0db8 // documentation
        || first == 0x2001 && second == 0x0000 // Teredo: an IPv4 address inside
        || first == 0x2001 && (second & 0xfff0) == 0x0010 // ORCHID
        || first == 0x2001 && (second & 0xfff0) == 0x0020 // ORCHIDv2
        || first == 0x2001 && second == 0x0002 && s[2] == 0 // benchmarking
        || first == 0x2002 // 6to4: an IPv4 address inside
        || first == 0x0064 && second == 0xff9b // NAT64 (64:ff9b::/96 and 64:ff9b:1::/48)
        || first == 0x3fff && (second & 0xf000) == 0 // documentation (3fff::/20)
        || first == 0x5f00 // SRv6 SIDs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_matches_the_standard_webhooks_example() {
        // The specification's example (standard-webhooks, spec/standard-webhooks.md).
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&[secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let new = new_secret();
        assert!(new.starts_with(SECRET_PREFIX) && new.len() > 40, "{new}");
        assert_eq!(signature(&[secret, &new], "m", 1, b"x").split(' ').count(), 2);
    }

    fn policy(allow: &[&str]) -> WebhookPolicy {
        WebhookPolicy::new(&WebhooksConfig { allow: allow.iter().map(|s| s.to_string()).collect() }).expect("valid")
    }

    #[test]
    fn private_loopback_link_local_and_metadata_addresses_are_refused_by_default() {
        let p = policy(&[]);
        for target in [
            "http://127.0.0.1:7081/v1/admin/users",
            "http://127.1/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://0.0.0.0/",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://2130706433/",
            // IPv4 inside IPv6, every way a relay or translator reads it.
            "http://[::10.0.0.1]/",
            "http://[::127.0.0.1]/",
            "http://[::ffff:0:10.0.0.1]/",
            "http://[64:ff9b::a00:1]/",
            "http://[64:ff9b:1::a00:1]/",
            "http://[2002:a00:1::]/",
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
            "http://[100::1]/",
            "http://192.88.99.1/",
        ] {
            assert!(p.check_form(target).is_err(), "{target} must be refused");
        }
        for target in ["https://93.184.216.34/hook", "http://[2606:4700::1111]/", "https://hooks.example.com/x"] {
            assert!(p.check_form(target).is_ok(), "{target} must pass the form check");
        }
    }

    #[test]
    fn only_http_urls_with_a_host_and_no_credentials() {
        let p = policy(&[]);
        for target in
            ["ftp://example.com/", "file:///etc/passwd", "http://user:pw@example.com/", "not a url", "http://"]
        {
            assert!(p.check_form(target).is_err(), "{target} must be refused");
        }
    }

    #[test]
    fn the_allow_list_opens_cidrs_addresses_and_names() {
        let p = policy(&["127.0.0.0/8", "10.9.8.7", "hooks.internal"]);
        assert!(p.check_form("http://127.0.0.1:9000/").is_ok());
        assert!(p.check_form("http://[::ffff:127.0.0.1]/").is_ok());
        assert!(p.check_form("http://10.9.8.7/").is_ok());
        assert!(p.check_form("http://10.9.8.8/").is_err());
        assert!(p.allows_name("HOOKS.internal."));
        assert!(WebhookPolicy::new(&WebhooksConfig { allow: vec!["not a cidr/99".into()] }).is_err());
    }

    #[tokio::test]
    async fn a_name_counts_by_the_addresses_it_resolves_to() {
        let closed = policy(&[]);
        let error = closed.check("http://localhost:9/").await.expect_err("localhost resolves to loopback");
        assert!(error.contains("may not call"), "{error}");
        // The refusal never tells what the name resolves to.
        assert!(!error.contains("127.0.0.1") && !error.contains("::1"), "{error}");
        assert!(policy(&["127.0.0.0/8", "::1/128"]).check("http://localhost:9/").await.is_ok());
        assert!(policy(&["localhost"]).check("http://localhost:9/").await.is_ok());
    }
}
