//! TLS of a node (node TOML `[tls]`): its certificate and key, the CA it trusts, and whether
//! nodes authenticate each other by certificate (mutual TLS).
//!
//! One [`NodeTls`] serves three ends: the HTTPS listener of the API
//! ([`NodeTls::http_server_config`]), the gRPC listener between nodes
//! ([`NodeTls::grpc_incoming`]), which with `mutual` demands a client certificate signed by
//! the CA, and the channels a node dials its peers on ([`NodeTls::grpc_client`]), which
//! present the node's own certificate when `mutual`. Everything is loaded and checked once,
//! at start, so a bad file is a start-up error, not a failed handshake later.
//!
//! rustls has one crypto provider in this build, ring ([`provider`]); the workspace turns off
//! every crate feature that would bring aws-lc-rs in beside it (two providers and none
//! installed makes rustls panic on first use).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// ALPN protocols the HTTPS listener offers, preferred first.
const HTTP_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// Longest TLS handshake the gRPC listener waits for; a caller that stalls is dropped.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// TLS handshakes in progress on the gRPC listener, at most; further connections wait in
/// the kernel's backlog until one finishes.
pub const HANDSHAKES_MAX: usize = 256;
/// Pause after a failed `accept` (out of file descriptors, say) before the next one.
const ACCEPT_ERROR_PAUSE_MS: u64 = 50;

/// The crypto provider of every TLS configuration in raftbox.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process-wide default provider, for libraries that ask rustls for the
/// default (reqwest, tonic); a no-op when it is installed already.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A node's validated TLS material. Never prints its key.
#[derive(Clone)]
pub struct NodeTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Option<Vec<u8>>,
    mutual: bool,
    http: Arc<rustls::ServerConfig>,
    grpc: Arc<rustls::ServerConfig>,
}

impl fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls").field("ca", &self.ca_pem.is_some()).field("mutual", &self.mutual).finish()
    }
}

impl NodeTls {
    /// Reads and checks the files of `[tls]`; the error names the setting and the file.
    pub fn load(cert_file: &Path, key_file: &Path, ca_file: Option<&Path>, mutual: bool) -> Result<NodeTls, String> {
        let read =
            |name: &str, path: &Path| std::fs::read(path).map_err(|e| format!("tls.{name} {}: {e}", path.display()));
        if mutual && ca_file.is_none() {
            return Err("tls.mutual = true needs tls.ca_file: the CA whose certificates the nodes accept".into());
        }
        let cert_pem = read("cert_file", cert_file)?;
        let key_pem = read("key_file", key_file)?;
        let ca_pem = ca_file.map(|path| read("ca_file", path)).transpose()?;
        NodeTls::from_pem(cert_pem, key_pem, ca_pem, mutual).map_err(|e| {
            let files = match ca_file {
                Some(ca) => format!("{}, {}, {}", cert_file.display(), key_file.display(), ca.display()),
                None => format!("{}, {}", cert_file.display(), key_file.display()),
            };
            format!("{e} ({files})")
        })
    }

    /// Checks PEM material: at least one certificate, a private key that matches it, a CA
    /// that parses as trust anchors; `mutual` needs the CA.
    pub fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Option<Vec<u8>>,
        mutual: bool,
    ) -> Result<NodeTls, String> {
        let certs = certificates(&cert_pem).map_err(|e| format!("tls.cert_file: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("tls.key_file: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))?;
        let roots = match &ca_pem {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(ca).map_err(|e| format!("tls.ca_file: {e}"))? {
                    roots.add(cert).map_err(|e| format!("tls.ca_file: not a usable CA certificate: {e}"))?;
                }
                Some(roots)
            }
            None if mutual => return Err("tls.mutual = true needs tls.ca_file".into()),
            None => None,
        };
        let builder = || {
            rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS protocol versions: {e}"))
        };
        let pair = |e: rustls::Error| format!("tls.cert_file and tls.key_file do not make a usable pair: {e}");
        let mut http =
            builder()?.with_no_client_auth().with_single_cert(certs.clone(), key.clone_key()).map_err(pair)?;
        http.alpn_protocols = HTTP_ALPN.iter().map(|p| p.to_vec()).collect();
        let grpc = match roots {
            Some(roots) if mutual => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| format!("tls.ca_file: {e}"))?;
                builder()?.with_client_cert_verifier(verifier)
            }
            _ => builder()?.with_no_client_auth(),
        };
        let mut grpc = grpc.with_single_cert(certs, key).map_err(pair)?;
        grpc.alpn_protocols = vec![b"h2".to_vec()];
        Ok(NodeTls { cert_pem, key_pem, ca_pem, mutual, http: Arc::new(http), grpc: Arc::new(grpc) })
    }

    /// Whether nodes present and demand certificates signed by the CA.
    pub fn mutual(&self) -> bool {
        self.mutual
    }

    /// The HTTPS listener's configuration (no client certificates: API clients use tokens).
    pub fn http_server_config(&self) -> Arc<rustls::ServerConfig> {
        self.http.clone()
    }

    /// The connections of the gRPC listener on `listener`, TLS done: the node's certificate,
    /// and with `mutual` a client certificate signed by the CA is required before any call.
    /// Each handshake is bounded by [`HANDSHAKE_TIMEOUT_MS`] and at most [`HANDSHAKES_MAX`]
    /// run at once (tonic's own TLS waits for a handshake without limit). Ends when the
    /// stream is dropped.
    pub(crate) fn grpc_incoming(&self, listener: TcpListener) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
        let (tx, rx) = mpsc::channel(HANDSHAKES_MAX);
        let acceptor = TlsAcceptor::from(self.grpc.clone());
        let permits = Arc::new(Semaphore::new(HANDSHAKES_MAX));
        tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    _ = tx.closed() => return,
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                };
                let (tcp, peer) = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            tracing::debug!(error = %e, "gRPC accept");
                            tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                            continue;
                        }
                    },
                };
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "set TCP_NODELAY");
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let handshake = Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
                    match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC TLS handshake refused"),
                        Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }

    /// TLS of the channels to peers: peers are verified against the CA (or, without one,
    /// the public web roots), and with `mutual` the node presents its own certificate.
    pub(crate) fn grpc_client(&self) -> ClientTlsConfig {
        let config = match &self.ca_pem {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_webpki_roots(),
        };
        if self.mutual {
            config.identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
        } else {
            config
        }
    }
}

/// Every certificate in a PEM text; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_material_is_refused_with_the_setting_named() {
        let no_cert = NodeTls::from_pem(b"hello".to_vec(), b"".to_vec(), None, false).unwrap_err();
        assert!(no_cert.contains("tls.cert_file"), "{no_cert}");
        let missing =
            NodeTls::load(Path::new("/nonexistent/node.pem"), Path::new("/nonexistent/node.key"), None, false)
                .unwrap_err();
        assert!(missing.contains("tls.cert_file /nonexistent/node.pem"), "{missing}");
        let mutual = NodeTls::load(Path::new("/x.pem"), Path::new("/x.key"), None, true).unwrap_err();
        assert!(mutual.contains("tls.ca_file"), "{mutual}");
    }

    fn issued(ca: &rcgen::Issuer<'_, rcgen::KeyPair>) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        params.extended_key_usages =
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, ca).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_matching_pair_loads_and_a_foreign_key_does_not() {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca_params.self_signed(&ca_key).expect("ca").pem();
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let (cert, key) = issued(&ca);
        let (_, other_key) = issued(&ca);
        let tls = NodeTls::from_pem(cert.clone().into(), key.into(), Some(ca_pem.clone().into()), true).expect("valid");
        assert!(tls.mutual());
        assert!(!format!("{tls:?}").contains("PRIVATE"), "never printed");
        assert_eq!(tls.http_server_config().alpn_protocols[0], b"h2");
        let mismatch = NodeTls::from_pem(cert.into(), other_key.into(), Some(ca_pem.into()), true).unwrap_err();
        assert!(mismatch.contains("usable pair"), "{mismatch}");
    }

    /// A client config trusting `ca_pem`, presenting `identity` (certificate, key) if given.
    fn client(ca_pem: &str, identity: Option<(&str, &str)>) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca_pem.as_bytes()).expect("ca") {
            roots.add(cert).expect("root");
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    certificates(cert.as_bytes()).expect("cert"),
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
                )
                .expect("identity"),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    #[tokio::test]
    async fn the_grpc_listener_demands_a_certificate_and_a_stalled_caller_blocks_no_one() {
        use futures::StreamExt as _;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca_params.self_signed(&ca_key).expect("ca").pem();
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let (cert, key) = issued(&ca);
        let tls = NodeTls::from_pem(cert.clone().into(), key.clone().into(), Some(ca_pem.clone().into()), true)
            .expect("valid");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = tls.grpc_incoming(listener);
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");

        // A caller that connects and says nothing holds no one up.
        let _stalled = TcpStream::connect(addr).await.expect("connect");
        // One without a certificate completes its side (TLS 1.3) but is refused: no stream.
        let mut anonymous = client(&ca_pem, None)
            .connect(name.clone(), TcpStream::connect(addr).await.expect("connect"))
            .await
            .expect("client side of the handshake");
        let _ = anonymous.write_all(b"PRI * HTTP/2.0").await;
        let mut buf = [0u8; 16];
        let refused = tokio::time::timeout(Duration::from_secs(5), anonymous.read(&mut buf)).await.expect("answered");
        assert!(matches!(refused, Err(_) | Ok(0)), "read without a certificate: {refused:?}");
        // A node with its certificate gets through at once.
        let _node = client(&ca_pem, Some((&cert, &key)))
            .connect(name, TcpStream::connect(addr).await.expect("connect"))
            .await
            .expect("handshake with a node certificate");
        let accepted = tokio::time::timeout(Duration::from_secs(2), incoming.next()).await.expect("in time");
        assert!(matches!(accepted, Some(Ok(_))), "the node's connection is served");
    }
}
