//! WebDAV locks: `dav-server`'s in-memory `MemLs`, one per user, every lock with a timeout
//! and a cap on how many a user holds. A user's locks bind only that user's requests: one
//! user's LOCK (a viewer's included) can never make another's writes answer 423, and nobody
//! sees or releases another's lock tokens. They are advisory, like every WebDAV client's
//! use of them; held by the node that granted them and forgotten when it restarts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dav_server::davpath::DavPath;
use dav_server::ls::{DavLock, DavLockSystem, LsFuture};
use dav_server::memls::MemLs;
use futures_util::FutureExt as _;
use xmltree::Element;

/// The longest a lock lasts without a refresh (also what a LOCK without a timeout gets).
pub const LOCK_TIMEOUT_MAX: Duration = Duration::from_secs(3600);
/// Locks one user holds on one node, at most; a LOCK beyond answers 423.
pub const LOCKS_PER_USER_MAX: usize = 100;
/// Users with a lock table on one node before the empty tables are dropped.
const USERS_MAX: usize = 10_000;

/// Every user's lock table on this node.
#[derive(Default)]
pub struct Locks(Mutex<HashMap<String, UserLocks>>);

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Locks")
    }
}

impl Locks {
    /// The lock table of user `user_id`.
    pub fn of(&self, user_id: &str) -> UserLocks {
        let Ok(mut tables) = self.0.lock() else {
            return UserLocks::default();
        };
        if tables.len() >= USERS_MAX && !tables.contains_key(user_id) {
            tables.retain(|_, table| table.holds_any());
        }
        tables.entry(user_id.to_string()).or_default().clone()
    }
}

/// One user's locks: `MemLs`, with each lock's end kept beside it.
#[derive(Clone)]
pub struct UserLocks {
    inner: Box<MemLs>,
    /// Token → (path, when it ends).
    held: Arc<Mutex<HashMap<String, (DavPath, SystemTime)>>>,
}

impl Default for UserLocks {
    fn default() -> UserLocks {
        UserLocks { inner: MemLs::new(), held: Arc::default() }
    }
}

impl std::fmt::Debug for UserLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserLocks")
    }
}

fn capped(timeout: Option<Duration>) -> Duration {
    timeout.unwrap_or(LOCK_TIMEOUT_MAX).min(LOCK_TIMEOUT_MAX)
}

impl UserLocks {
    fn holds_any(&self) -> bool {
        self.held.lock().map(|held| !held.is_empty()).unwrap_or(false)
    }

    /// Releases every lock past its end.
    async fn expire(&self) {
        let now = SystemTime::now();
        let ended: Vec<(String, DavPath)> = match self.held.lock() {
            Ok(mut held) => {
                let ended: Vec<(String, DavPath)> =
                    held.iter().filter(|(_, (_, end))| *end <= now).map(|(t, (p, _))| (t.clone(), p.clone())).collect();
                for (token, _) in &ended {
                    held.remove(token);
                }
                ended
            }
            Err(_) => Vec::new(),
        };
        for (token, path) in ended {
            let _ = self.inner.unlock(&path, &token).await;
        }
    }

    fn refused(path: &DavPath) -> DavLock {
        DavLock {
            token: String::new(),
            path: Box::new(path.clone()),
            principal: None,
            owner: None,
            timeout_at: None,
            timeout: None,
            shared: false,
            deep: false,
        }
    }
}

impl DavLockSystem for UserLocks {
    fn lock(
        &self,
        path: &DavPath,
        principal: Option<&str>,
        owner: Option<&Element>,
        timeout: Option<Duration>,
        shared: bool,
        deep: bool,
    ) -> LsFuture<'_, Result<DavLock, DavLock>> {
        let (path, principal, owner) = (path.clone(), principal.map(str::to_string), owner.cloned());
        async move {
            self.expire().await;
            if self.held.lock().map(|held| held.len() >= LOCKS_PER_USER_MAX).unwrap_or(true) {
                return Err(Self::refused(&path));
            }
            let timeout = capped(timeout);
            let lock =
                self.inner.lock(&path, principal.as_deref(), owner.as_ref(), Some(timeout), shared, deep).await?;
            if let Ok(mut held) = self.held.lock() {
                held.insert(lock.token.clone(), (path, SystemTime::now() + timeout));
            }
            Ok(lock)
        }
        .boxed()
    }

    fn unlock(&self, path: &DavPath, token: &str) -> LsFuture<'_, Result<(), ()>> {
        let (path, token) = (path.clone(), token.to_string());
        async move {
            self.expire().await;
            let result = self.inner.unlock(&path, &token).await;
            if result.is_ok() {
                if let Ok(mut held) = self.held.lock() {
                    held.remove(&token);
                }
            }
            result
        }
        .boxed()
    }

    fn refresh(&self, path: &DavPath, token: &str, timeout: Option<Duration>) -> LsFuture<'_, Result<DavLock, ()>> {
        let (path, token) = (path.clone(), token.to_string());
        async move {
            self.expire().await;
            let timeout = capped(timeout);
            let lock = self.inner.refresh(&path, &token, Some(timeout)).await?;
            if let Ok(mut held) = self.held.lock() {
                if let Some(entry) = held.get_mut(&token) {
                    entry.1 = SystemTime::now() + timeout;
                }
            }
            Ok(lock)
        }
        .boxed()
    }

    fn check(
        &self,
        path: &DavPath,
        principal: Option<&str>,
        ignore_principal: bool,
        deep: bool,
        submitted_tokens: &[String],
    ) -> LsFuture<'_, Result<(), DavLock>> {
        let (path, principal, tokens) = (path.clone(), principal.map(str::to_string), submitted_tokens.to_vec());
        async move {
            self.expire().await;
            self.inner.check(&path, principal.as_deref(), ignore_principal, deep, &tokens).await
        }
        .boxed()
    }

    fn discover(&self, path: &DavPath) -> LsFuture<'_, Vec<DavLock>> {
        let path = path.clone();
        async move {
            self.expire().await;
            self.inner.discover(&path).await
        }
        .boxed()
    }

    fn delete(&self, path: &DavPath) -> LsFuture<'_, Result<(), ()>> {
        let path = path.clone();
        async move {
            let result = self.inner.delete(&path).await;
            // What the inner table dropped under `path` is no longer held.
            let remaining: Vec<String> = self.inner.discover(&path).await.into_iter().map(|l| l.token).collect();
            if let Ok(mut held) = self.held.lock() {
                let prefix = path.as_bytes().to_vec();
                held.retain(|token, (p, _)| !p.as_bytes().starts_with(&prefix) || remaining.contains(token));
            }
            result
        }
        .boxed()
    }
}
