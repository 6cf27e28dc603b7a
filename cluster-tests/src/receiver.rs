//! A local webhook receiver for job tests: records every call (time, headers, body) and
//! applies each `Idempotency-Key` at most once, as targets are told to.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::Value;

/// One received call.
#[derive(Debug, Clone)]
pub struct Call {
    pub received_ms: u64,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    /// The body's bytes as they came (what a signature covers).
    pub raw: Vec<u8>,
}

#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    /// Effects applied, by idempotency key.
    effects: HashMap<String, u32>,
    /// Paths answered 500, and how long each path makes its caller wait.
    failing: Vec<String>,
    delay_ms: HashMap<String, u64>,
    /// Calls being answered now, and the most at once, by path.
    in_flight: HashMap<String, u32>,
    max_in_flight: HashMap<String, u32>,
}

/// A running receiver; dropped with the test.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Receiver {
    pub async fn start() -> anyhow::Result<Receiver> {
        Receiver::start_on(std::net::Ipv4Addr::LOCALHOST).await
    }

    /// A receiver on `ip` (port 0): the bridge address when the nodes run in network
    /// namespaces, where the test's loopback is out of their reach.
    pub async fn start_on(ip: std::net::Ipv4Addr) -> anyhow::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new().route("/{*path}", post(handle)).with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver { addr, inner })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// Calls to `path` answer 500.
    pub fn fail(&self, path: &str) {
        self.lock().failing.push(format!("/{path}"));
    }

    /// Calls to `path` are answered after `ms`.
    pub fn delay(&self, path: &str, ms: u64) {
        self.lock().delay_ms.insert(format!("/{path}"), ms);
    }

    pub fn calls(&self, path: &str) -> Vec<Call> {
        let path = format!("/{path}");
        self.lock().calls.iter().filter(|c| c.path == path).cloned().collect()
    }

    /// The most calls to `path` that were being answered at the same time.
    pub fn max_in_flight(&self, path: &str) -> u32 {
        self.lock().max_in_flight.get(&format!("/{path}")).copied().unwrap_or(0)
    }

    /// How many times each key's effect was applied (always at most 1 here).
    pub fn effects(&self) -> HashMap<String, u32> {
        self.lock().effects.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, &'static str) {
    let path = uri.path().to_string();
    let call = Call {
        received_ms: now_ms(),
        path: path.clone(),
        headers: headers.iter().filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_string()))).collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: body.to_vec(),
    };
    let (failing, delay) = {
        let mut inner = inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.calls.push(call.clone());
        let now = {
            let count = inner.in_flight.entry(path.clone()).or_insert(0);
            *count += 1;
            *count
        };
        let max = inner.max_in_flight.entry(path.clone()).or_insert(0);
        *max = (*max).max(now);
        (inner.failing.contains(&path), inner.delay_ms.get(&path).copied().unwrap_or(0))
    };
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(count) = inner.lock().unwrap_or_else(|e| e.into_inner()).in_flight.get_mut(&path) {
        *count -= 1;
    }
    if failing {
        return (StatusCode::INTERNAL_SERVER_ERROR, "receiver: failing on purpose");
    }
    // The effect: applied once per idempotency key, whatever the number of calls.
    let key = call.headers.get("idempotency-key").cloned().unwrap_or_default();
    let mut inner = inner.lock().unwrap_or_else(|e| e.into_inner());
    let applied = inner.effects.entry(key).or_insert(0);
    if *applied == 0 {
        *applied = 1;
        return (StatusCode::OK, "effect applied");
    }
    (StatusCode::OK, "duplicate: effect already applied")
}
