//! The front door: who is at it, and the places for requests in flight, shared so that no one
//! client address or user takes them all (mini-redis's `MAX_CONNECTIONS`, per client).
//!
//! - **The client's address** ([`ClientAddress`], and the [`Client`] the limits count it as)
//!   is found once per request, by [`identify`], and every layer after reads that (the login
//!   and share-link attempt limits, the `ip` rate-limit scope, `/metrics`' allow-list): the
//!   connection's peer, or, when that peer is one of `[http] trusted_proxies`, the entry of
//!   `X-Forwarded-For` the nearest untrusted hop appended, read from the right (what a
//!   client writes to the left of it is never read). An IPv6 address counts by its /64 (one
//!   host's whole allocation), an IPv4-mapped one as the IPv4 address.
//! - **Places**: `[http] requests_in_flight_max` in all; one client address holds at most
//!   `requests_in_flight_per_client_max`, one user (admins aside) at most
//!   `requests_in_flight_per_user_max`. Beyond any of them: 503 with `Retry-After`, at once,
//!   before the body is read. A request takes its address's place first (no credentials
//!   needed), its user's once the caller is known (`ratelimit::enforce`).
//! - **Readiness**: `/readyz` answers 503 while this node refused more requests for want of a
//!   place (its own cap, not one client's or user's share) than it admitted over the last
//!   [`READINESS_WINDOW`] (at least [`READINESS_REFUSALS_MIN`]), so a balancer sends its
//!   clients elsewhere and an operator sees it; one client past its share cannot make it so.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ipnet::IpNet;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{ApiError, AppState, HttpConfig};

/// How far back `/readyz` looks at refusals.
pub const READINESS_WINDOW: Duration = Duration::from_secs(5);
/// Refusals within [`READINESS_WINDOW`] below which a node stays ready whatever the ratio.
pub const READINESS_REFUSALS_MIN: u64 = 20;
/// Addresses in one `X-Forwarded-For`, at most (a longer header is not believed).
pub const FORWARDED_HOPS_MAX: usize = 16;

/// The address a request comes from, as [`identify`] found it (whole, not by /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// A client as the limits count it: an IPv4 address, or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client(IpAddr);

impl Client {
    /// The client an address belongs to.
    pub fn of(address: IpAddr) -> Client {
        match address {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let [a, b, c, d, ..] = v6.segments();
                    Client(IpAddr::V6(Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0)))
                }
            },
        }
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// Who holds places: a client address or a user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    Client(Client),
    User(String),
}

/// The node's places for requests in flight, and what it refused lately.
pub struct InFlight {
    places: Arc<Semaphore>,
    total: usize,
    per_client_max: usize,
    per_user_max: usize,
    trusted_proxies: Vec<IpNet>,
    held: Mutex<HashMap<Holder, usize>>,
    admitted: AtomicU64,
    refused: AtomicU64,
    /// (admitted, refused) totals sampled once a second, newest last.
    samples: Mutex<std::collections::VecDeque<(u64, u64)>>,
}

/// A place held by one request (or one holder's share), given back when dropped.
pub struct Place {
    in_flight: Arc<InFlight>,
    holder: Option<Holder>,
    _global: Option<OwnedSemaphorePermit>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            let mut held = self.in_flight.held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = held.get_mut(&holder) {
                assert!(*count > 0, "a share given back twice");
                *count -= 1;
                if *count == 0 {
                    held.remove(&holder);
                }
            }
        }
    }
}

impl InFlight {
    pub fn new(config: &HttpConfig) -> Arc<InFlight> {
        Arc::new(InFlight {
            places: Arc::new(Semaphore::new(config.requests_in_flight_max)),
            total: config.requests_in_flight_max,
            per_client_max: config.requests_in_flight_per_client_max,
            per_user_max: config.requests_in_flight_per_user_max,
            trusted_proxies: config.trusted_proxies.clone(),
            held: Mutex::new(HashMap::new()),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            samples: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// One of `holder`'s `max` places, or `None` when it holds them all.
    fn share(self: &Arc<Self>, holder: Holder, max: usize) -> Option<Place> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(holder.clone()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Place { in_flight: self.clone(), holder: Some(holder), _global: None })
    }

    /// A place for a request from `client`: one of the node's and one of the client's.
    fn admit_client(self: &Arc<Self>, client: Client) -> Result<Place, ApiError> {
        let global = self.places.clone().try_acquire_owned().map_err(|_| {
            // The node's own cap: what readiness counts.
            self.refused.fetch_add(1, Ordering::Relaxed);
            ApiError::Unavailable(format!(
                "this node serves {} requests at once, the most it takes; try again shortly",
                self.total
            ))
        })?;
        let mut place = self.share(Holder::Client(client), self.per_client_max).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "your address has {} requests in flight on this node, the most one client may; try again shortly",
                self.per_client_max
            ))
        })?;
        place._global = Some(global);
        Ok(place)
    }

    /// One of `user_id`'s places, or 503 when the user holds their share.
    pub fn admit_user(self: &Arc<Self>, user_id: &str) -> Result<Place, ApiError> {
        self.share(Holder::User(user_id.to_owned()), self.per_user_max).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "you have {} requests in flight on this node, the most one user may; try again shortly",
                self.per_user_max
            ))
        })
    }

    /// The address a request comes from: its peer, or, from a trusted proxy, the entry of
    /// `X-Forwarded-For` the nearest untrusted hop appended. Read from the right, past trusted
    /// proxies, at most [`FORWARDED_HOPS_MAX`] entries; what lies left of the entry taken (the
    /// client's own words) is never read. An entry that is no address (`ip`, `ip:port`,
    /// `[v6]:port`) where one is needed means the proxy is not one this node understands: the
    /// nearest address known, then.
    pub fn address_of(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> IpAddr {
        let trusted = |address: &IpAddr| self.trusted_proxies.iter().any(|net| net.contains(address));
        if !trusted(&peer) {
            return peer;
        }
        let values: Vec<&str> = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).collect();
        let entries = values.iter().rev().flat_map(|value| value.rsplit(','));
        let mut nearest = peer;
        for entry in entries.take(FORWARDED_HOPS_MAX) {
            let Some(address) = forwarded_address(entry.trim()) else { return nearest };
            if !trusted(&address) {
                return address;
            }
            nearest = address;
        }
        nearest
    }

    /// The client a request comes from (see [`InFlight::address_of`]).
    pub fn client_of(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> Client {
        Client::of(self.address_of(peer, headers))
    }

    /// Records the totals (called once a second by [`sample_forever`]).
    fn sample(&self) {
        let now = (self.admitted.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed));
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(now);
        while samples.len() > READINESS_WINDOW.as_secs() as usize + 1 {
            samples.pop_front();
        }
    }

    /// Whether this node refused most requests lately (see the module's readiness rule):
    /// (admitted, refused) over the window when it did.
    pub fn refusing_most(&self) -> Option<(u64, u64)> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let (first, last) = (samples.front()?, samples.back()?);
        let (admitted, refused) = (last.0 - first.0, last.1 - first.1);
        (refused >= READINESS_REFUSALS_MIN && refused > admitted).then_some((admitted, refused))
    }
}

/// An address as a proxy writes it in `X-Forwarded-For`: `ip`, `ip:port` or `[v6]:port`.
fn forwarded_address(entry: &str) -> Option<IpAddr> {
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(address);
    }
    if let Ok(socket) = entry.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    entry.strip_prefix('[')?.strip_suffix(']')?.parse::<IpAddr>().ok()
}

/// Samples the admission counters once a second, for as long as `in_flight` is in use.
pub async fn sample_forever(in_flight: std::sync::Weak<InFlight>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        match in_flight.upgrade() {
            Some(in_flight) => in_flight.sample(),
            None => return,
        }
    }
}

/// Middleware on every route: finds the client once ([`ClientAddress`] and [`Client`], left
/// in the request's extensions for every later layer).
pub async fn identify(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    // No connection info: a router served in-process (tests); one client.
    let unknown = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let address = peer.map_or(unknown, |peer| state.in_flight.address_of(peer, request.headers()));
    request.extensions_mut().insert(ClientAddress(address));
    request.extensions_mut().insert(Client::of(address));
    next.run(request).await
}

/// Middleware: takes the client's place ([`identify`] found it), or answers 503 at once: a
/// flood queues nowhere inside the node.
pub async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let unknown = Client::of(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    let client = request.extensions().get::<Client>().copied().unwrap_or(unknown);
    let place = match state.in_flight.admit_client(client) {
        Ok(place) => place,
        Err(refused) => return refused.into_response(),
    };
    state.in_flight.admitted.fetch_add(1, Ordering::Relaxed);
    let response = next.run(request).await;
    drop(place);
    response
}

/// Middleware: takes one of the caller's places (admins aside), once `ratelimit::enforce`
/// found who calls, or answers 503 at once.
pub async fn admit_user(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let place = match request.extensions().get::<crate::auth::Principal>() {
        Some(principal) if !principal.user.admin => match state.in_flight.admit_user(&principal.user.id) {
            Ok(place) => Some(place),
            Err(refused) => return refused.into_response(),
        },
        _ => None,
    };
    let response = next.run(request).await;
    drop(place);
    response
}

/// The client a request came from, as [`admit`] found it.
pub fn client(request: &axum::http::request::Parts) -> Option<Client> {
    request.extensions.get::<Client>().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(total: usize, per_client: usize, per_user: usize, proxies: &[&str]) -> HttpConfig {
        HttpConfig {
            requests_in_flight_max: total,
            requests_in_flight_per_client_max: per_client,
            requests_in_flight_per_user_max: per_user,
            trusted_proxies: proxies.iter().map(|p| p.parse().expect("a net")).collect(),
            ..HttpConfig::default()
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn one_client_or_user_holds_only_its_share() {
        let in_flight = InFlight::new(&config(4, 2, 1, &[]));
        let (a, b) = (Client::of(ip("10.0.0.1")), Client::of(ip("10.0.0.2")));
        let first = in_flight.admit_client(a).expect("a's first");
        let _second = in_flight.admit_client(a).expect("a's second");
        assert!(in_flight.admit_client(a).is_err(), "a third for a");
        let _b = in_flight.admit_client(b).expect("b still gets one");
        drop(first);
        let _again = in_flight.admit_client(a).expect("a place given back is taken again");
        let _b2 = in_flight.admit_client(b).expect("b's second");
        let c = Client::of(ip("10.0.0.3"));
        assert!(in_flight.admit_client(c).is_err(), "all four places are held");
        let alice = in_flight.admit_user("alice").expect("alice's");
        assert!(in_flight.admit_user("alice").is_err());
        let _bob = in_flight.admit_user("bob").expect("bob's is his own");
        drop(alice);
        assert!(in_flight.admit_user("alice").is_ok());
        assert!(in_flight.held.lock().expect("held").values().all(|count| *count > 0));
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(Client::of(ip("2001:db8:1:2:3:4:5:6")), Client::of(ip("2001:db8:1:2:ffff::1")));
        assert_ne!(Client::of(ip("2001:db8:1:2::1")), Client::of(ip("2001:db8:1:3::1")));
        assert_eq!(Client::of(ip("::ffff:192.0.2.7")), Client::of(ip("192.0.2.7")));
        assert_eq!(Client::of(ip("2001:db8:1:2::9")).to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn forwarded_for_is_believed_only_from_a_trusted_proxy() {
        let in_flight = InFlight::new(&config(4, 2, 1, &["10.0.0.0/8"]));
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-forwarded-for", "203.0.113.9, 198.51.100.4, 10.1.1.1".parse().expect("a value"));
        // From the proxy: the rightmost address that is not a trusted proxy.
        assert_eq!(in_flight.client_of(ip("10.0.0.5"), &headers), Client::of(ip("198.51.100.4")));
        // From anyone else: the header is the client's own word, not believed.
        assert_eq!(in_flight.client_of(ip("192.0.2.1"), &headers), Client::of(ip("192.0.2.1")));
        // What a client writes left of the entry its proxy appended is never read: junk there,
        // or many entries, changes nothing.
        headers.insert("x-forwarded-for", "junk, 1.1.1.1, x, 198.51.100.4".parse().expect("a value"));
        assert_eq!(in_flight.address_of(ip("10.0.0.5"), &headers), ip("198.51.100.4"));
        let many = format!("{}198.51.100.7", "9.9.9.9, ".repeat(40));
        headers.insert("x-forwarded-for", many.parse().expect("a value"));
        assert_eq!(in_flight.address_of(ip("10.0.0.5"), &headers), ip("198.51.100.7"));
        // Ports and brackets, as some proxies write them.
        headers.insert("x-forwarded-for", "[2001:db8::7]:4711".parse().expect("a value"));
        assert_eq!(in_flight.address_of(ip("10.0.0.5"), &headers), ip("2001:db8::7"));
        headers.insert("x-forwarded-for", "198.51.100.8:5000".parse().expect("a value"));
        assert_eq!(in_flight.address_of(ip("10.0.0.5"), &headers), ip("198.51.100.8"));
        // The nearest entry is no address: the proxy is not understood; its own address.
        headers.insert("x-forwarded-for", "198.51.100.4, not-an-address".parse().expect("a value"));
        assert_eq!(in_flight.address_of(ip("10.0.0.5"), &headers), ip("10.0.0.5"));
    }

    #[test]
    fn only_the_nodes_own_cap_counts_toward_readiness() {
        let in_flight = InFlight::new(&config(4, 1, 1, &[]));
        let a = Client::of(ip("10.0.0.1"));
        let _held = in_flight.admit_client(a).expect("a's place");
        let _user = in_flight.admit_user("u").expect("u's place");
        for _ in 0..100 {
            assert!(in_flight.admit_client(a).is_err(), "a's second place");
            assert!(in_flight.admit_user("u").is_err(), "u's second place");
        }
        assert_eq!(in_flight.refused.load(Ordering::Relaxed), 0, "one client's share is not the node's cap");
    }

    #[test]
    fn a_node_refusing_most_requests_says_so() {
        let in_flight = InFlight::new(&config(1, 1, 1, &[]));
        in_flight.sample();
        assert_eq!(in_flight.refusing_most(), None);
        in_flight.admitted.fetch_add(5, Ordering::Relaxed);
        in_flight.refused.fetch_add(READINESS_REFUSALS_MIN, Ordering::Relaxed);
        in_flight.sample();
        assert_eq!(in_flight.refusing_most(), Some((5, READINESS_REFUSALS_MIN)));
        in_flight.admitted.fetch_add(100, Ordering::Relaxed);
        in_flight.sample();
        assert_eq!(in_flight.refusing_most(), None);
    }
}
