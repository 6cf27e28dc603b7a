//! The cluster secret: every node-to-node call carries it, and a node refuses a call without
//! it, or with a wrong one, before the message is decoded (a tonic interceptor sees only the
//! metadata). Without it, anyone who reaches the gRPC port could forward commands or append
//! entries of a higher term.
//!
//! A cluster whose nodes authenticate each other by mutual TLS may do without a secret
//! ([`ClusterSecret::mutual_tls_only`]): the gRPC listener then refuses a caller without a
//! certificate from the cluster's CA during the handshake, before any call.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq as _;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The metadata key that carries the secret.
pub const SECRET_METADATA_KEY: &str = "x-raftbox-cluster-secret";
/// Shortest accepted secret, in bytes.
pub const SECRET_BYTES_MIN: usize = 16;
/// Longest accepted secret, in bytes.
pub const SECRET_BYTES_MAX: usize = 1_024;

/// A validated cluster secret: visible ASCII, 16 to 1024 bytes. Never printed. `None` only
/// where mutual TLS authenticates the nodes instead.
#[derive(Clone)]
pub struct ClusterSecret {
    value: Option<Arc<MetadataValue<tonic::metadata::Ascii>>>,
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(…)")
    }
}

impl ClusterSecret {
    /// Parses a secret (surrounding whitespace ignored); the error says what is wrong.
    pub fn parse(text: &str) -> Result<ClusterSecret, String> {
        let text = text.trim();
        if !(SECRET_BYTES_MIN..=SECRET_BYTES_MAX).contains(&text.len()) {
            return Err(format!("the cluster secret is {SECRET_BYTES_MIN} to {SECRET_BYTES_MAX} bytes"));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the cluster secret is visible ASCII (no spaces or control characters)".into());
        }
        let value = MetadataValue::try_from(text).map_err(|e| format!("the cluster secret: {e}"))?;
        Ok(ClusterSecret { value: Some(Arc::new(value)) })
    }

    /// No secret: calls carry none and the server checks none. Only for a node whose gRPC
    /// listener demands client certificates (`[tls] mutual = true`); the configuration
    /// refuses to start with neither.
    pub fn mutual_tls_only() -> ClusterSecret {
        ClusterSecret { value: None }
    }

    /// Whether there is a secret (false: mutual TLS only).
    pub fn is_set(&self) -> bool {
        self.value.is_some()
    }

    fn matches(&self, presented: &[u8]) -> bool {
        self.value.as_ref().is_some_and(|value| bool::from(value.as_bytes().ct_eq(presented)))
    }

    /// The server-side check, as a tonic interceptor.
    pub fn check(&self) -> SecretCheck {
        SecretCheck { secret: self.clone() }
    }
}

/// Client side: attaches the secret to every outgoing call.
impl tonic::service::Interceptor for ClusterSecret {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.value {
            request.metadata_mut().insert(SECRET_METADATA_KEY, (**value).clone());
        }
        Ok(request)
    }
}

/// Server side: refuses a call whose secret is missing or wrong.
#[derive(Clone, Debug)]
pub struct SecretCheck {
    secret: ClusterSecret,
}

impl tonic::service::Interceptor for SecretCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.secret.is_set() {
            // Mutual TLS only: the handshake checked the caller's certificate.
            return Ok(request);
        }
        match request.metadata().get(SECRET_METADATA_KEY) {
            Some(presented) if self.secret.matches(presented.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong cluster secret")),
            None => Err(Status::unauthenticated("missing cluster secret")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    #[test]
    fn secrets_are_validated_and_checked() {
        assert!(ClusterSecret::parse("short").is_err());
        assert!(ClusterSecret::parse("has a space in it, long enough").is_err());
        let mut secret = ClusterSecret::parse("0123456789abcdef0123").expect("valid");
        let other = ClusterSecret::parse("0123456789abcdef0124").expect("valid");
        let mut check = secret.check();
        let signed = secret.call(Request::new(())).expect("attach");
        assert!(check.call(signed).is_ok());
        let mut other_client = other.clone();
        let wrong = other_client.call(Request::new(())).expect("attach");
        assert_eq!(check.call(wrong).map(|_| ()).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(check.call(Request::new(())).map(|_| ()).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(!format!("{secret:?}").contains("0123"), "never printed");
        let mut none = ClusterSecret::mutual_tls_only();
        let bare = none.call(Request::new(())).expect("attach nothing");
        assert!(bare.metadata().get(SECRET_METADATA_KEY).is_none());
        assert!(none.check().call(bare).is_ok(), "mutual TLS only: the handshake authenticated the caller");
    }
}
