//! Accounts: users (each with a personal namespace), bearer tokens (stored by the hash of
//! their secret only) and the admin user, with their read queries.

use crate::command::{Outcome, Rejection};
use crate::records::{Namespace, NamespaceKind, Token, User, WebhookSecret};
use crate::state::{StateMachine, Txn};
use crate::{keys, StorageError};

/// Name of the admin user that `EnsureAdmin` creates.
pub const ADMIN_USER_NAME: &str = "admin";

pub(crate) fn create_user(
    txn: &mut Txn<'_>,
    user_id: &str,
    namespace_id: &str,
    name: &str,
    admin: bool,
) -> Result<Outcome, StorageError> {
    if txn.get_raw(&keys::user_name(name))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("a user named {name:?} exists"))));
    }
    if txn.get_raw(&keys::user(user_id))?.is_some() || txn.get_raw(&keys::namespace(namespace_id))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("id {user_id} or {namespace_id} is taken"))));
    }
    let created_ms = txn.now_ms;
    let user = User {
        id: user_id.into(),
        name: name.into(),
        namespace_id: namespace_id.into(),
        admin,
        created_ms,
        groups: Vec::new(),
        password_epoch: 0,
    };
    let namespace = Namespace {
        id: namespace_id.into(),
        kind: NamespaceKind::Personal,
        owner_user_id: user_id.into(),
        created_ms,
        name: String::new(),
        counted: false,
        deleting: false,
    };
    txn.put(keys::user(user_id), &user);
    txn.put(keys::user_name(name), &user_id.to_string());
    txn.put(keys::namespace(namespace_id), &namespace);
    Ok(Outcome::UserCreated { user_id: user_id.into(), namespace_id: namespace_id.into() })
}

/// A token for an existing user; `(expires_ms, session_epoch)` as `Command::CreateToken` has
/// them. A login session whose password epoch is no longer the user's (the password changed
/// after it was checked) is refused.
pub(crate) fn create_token(
    txn: &mut Txn<'_>,
    token_id: &str,
    user_id: &str,
    name: &str,
    token_hash: &[u8; 32],
    (expires_ms, session_epoch): (Option<u64>, Option<u64>),
) -> Result<Outcome, StorageError> {
    let Some(user) = txn.get::<User>("user", &keys::user(user_id))? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {user_id}"))));
    };
    if session_epoch.is_some_and(|epoch| epoch != user.password_epoch) {
        return Ok(Outcome::Rejected(Rejection::Conflict(
            "the password changed while logging in; log in again".into(),
        )));
    }
    put_token(txn, token_id, user_id, name, token_hash, (expires_ms, session_epoch))
}

fn put_token(
    txn: &mut Txn<'_>,
    token_id: &str,
    user_id: &str,
    name: &str,
    token_hash: &[u8; 32],
    (expires_ms, password_epoch): (Option<u64>, Option<u64>),
) -> Result<Outcome, StorageError> {
    if txn.get_raw(&keys::token(token_hash))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict("token already registered".into())));
    }
    if txn.get_raw(&keys::user_token(user_id, token_id))?.is_some() {
        return Ok(Outcome::Rejected(Rejection::Conflict(format!("token id {token_id} is taken"))));
    }
    let token = Token {
        id: token_id.into(),
        user_id: user_id.into(),
        name: name.into(),
        created_ms: txn.now_ms,
        expires_ms,
        password_epoch,
    };
    txn.put(keys::token(token_hash), &token);
    txn.put_raw(keys::user_token(user_id, token_id), token_hash.to_vec());
    // Expiring tokens are purged once expired, through the expiry index: from format 5, once
    // every node writes and purges it alike (tokens from before stay until revoked).
    if let Some(expires_ms) = expires_ms {
        if crate::sharing::schema_in(txn)? >= TOKEN_EXPIRY_FORMAT {
            txn.put_raw(keys::Expiring::Token.index(expires_ms, token_hash), Vec::new());
        }
    }
    Ok(Outcome::TokenCreated { token_id: token_id.into() })
}

/// The cluster format from which expiring tokens are indexed and purged.
pub const TOKEN_EXPIRY_FORMAT: u32 = 5;

/// Removes the token stored at `record_key` and its index entry by user (the expiry purge).
pub(crate) fn delete_token(txn: &mut Txn<'_>, record_key: &[u8]) -> Result<(), StorageError> {
    if let Some(token) = txn.get::<Token>("token", record_key)? {
        txn.delete(keys::user_token(&token.user_id, &token.id));
    }
    txn.delete(record_key.to_vec());
    Ok(())
}

/// Sets or removes a user's password hash; an unknown user is a rejection, never an error.
/// With `ends_sessions`, the user's password epoch moves on, so every login session made
/// before stops working (one write, whatever their number).
pub(crate) fn set_password(
    txn: &mut Txn<'_>,
    user_id: &str,
    hash: Option<&str>,
    ends_sessions: bool,
) -> Result<Outcome, StorageError> {
    let Some(mut user) = txn.get::<User>("user", &keys::user(user_id))? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {user_id}"))));
    };
    if ends_sessions {
        user.password_epoch = user.password_epoch.saturating_add(1);
        txn.put(keys::user(user_id), &user);
    }
    match hash {
        Some(hash) => txn.put(keys::password(user_id), &hash.to_string()),
        None => txn.delete(keys::password(user_id)),
    }
    Ok(Outcome::Done)
}

pub(crate) fn set_webhook_secret(
    txn: &mut Txn<'_>,
    user_id: &str,
    secret: &str,
    keep_previous_ms: Option<u64>,
) -> Result<Outcome, StorageError> {
    if txn.get::<User>("user", &keys::user(user_id))?.is_none() {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("user {user_id}"))));
    }
    let key = keys::webhook_secret(user_id);
    let before = txn.get::<WebhookSecret>("webhook secret", &key)?;
    let now = txn.now_ms;
    let record = match (before, keep_previous_ms) {
        (Some(_), None) => return Ok(Outcome::Done),
        (None, _) => WebhookSecret { secret: secret.to_owned(), created_ms: now, previous: None, previous_until_ms: 0 },
        (Some(before), Some(keep)) => WebhookSecret {
            secret: secret.to_owned(),
            created_ms: now,
            previous: (keep > 0).then_some(before.secret),
            previous_until_ms: now.saturating_add(keep),
        },
    };
    txn.put(key, &record);
    Ok(Outcome::Done)
}

pub(crate) fn revoke_token(txn: &mut Txn<'_>, user_id: &str, token_id: &str) -> Result<Outcome, StorageError> {
    let index = keys::user_token(user_id, token_id);
    let Some(raw) = txn.get_raw(&index)? else {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("token {token_id} of user {user_id}"))));
    };
    // Only `put_token` writes this index, always with a 32-byte hash: anything else is corruption.
    let hash: [u8; 32] =
        raw.try_into().map_err(|_| StorageError::Corrupt(format!("token index of {token_id} is not a hash")))?;
    // Ids are joined into one key with a separator: make sure this is the token named.
    let named =
        txn.get::<Token>("token", &keys::token(&hash))?.is_some_and(|t| t.id == token_id && t.user_id == user_id);
    if !named {
        return Ok(Outcome::Rejected(Rejection::NotFound(format!("token {token_id} of user {user_id}"))));
    }
    txn.delete(keys::token(&hash));
    txn.delete(index);
    Ok(Outcome::Done)
}

/// Makes sure an admin user holding this token exists (every node configured with the
/// admin token proposes it at start; all but the first change nothing).
pub(crate) fn ensure_admin(
    txn: &mut Txn<'_>,
    user_id: &str,
    namespace_id: &str,
    token_id: &str,
    token_hash: &[u8; 32],
) -> Result<Outcome, StorageError> {
    if let Some(token) = txn.get::<Token>("token", &keys::token(token_hash))? {
        return Ok(Outcome::AdminReady { user_id: token.user_id });
    }
    let admin_id = match txn.get::<String>("user name", &keys::user_name(ADMIN_USER_NAME))? {
        Some(existing) => existing,
        None => match create_user(txn, user_id, namespace_id, ADMIN_USER_NAME, true)? {
            Outcome::UserCreated { user_id, .. } => user_id,
            other => return Ok(other),
        },
    };
    match put_token(txn, token_id, &admin_id, "admin", token_hash, (None, None))? {
        Outcome::TokenCreated { .. } => Ok(Outcome::AdminReady { user_id: admin_id }),
        other => Ok(other),
    }
}

impl StateMachine {
    pub fn user(&self, user_id: &str) -> Result<Option<User>, StorageError> {
        self.read("user", &keys::user(user_id))
    }

    /// A user's webhook signing secret, if they have one.
    pub fn webhook_secret(&self, user_id: &str) -> Result<Option<WebhookSecret>, StorageError> {
        self.read("webhook secret", &keys::webhook_secret(user_id))
    }

    /// A user's password hash (a PHC string), if they have a password.
    pub fn password_hash(&self, user_id: &str) -> Result<Option<String>, StorageError> {
        self.read("password", &keys::password(user_id))
    }

    /// The token with this secret hash and the user it belongs to.
    pub fn token(&self, token_hash: &[u8; 32]) -> Result<Option<(Token, User)>, StorageError> {
        let Some(token) = self.read::<Token>("token", &keys::token(token_hash))? else {
            return Ok(None);
        };
        let user = self
            .user(&token.user_id)?
            .ok_or_else(|| StorageError::Corrupt(format!("token {} names a missing user", token.id)))?;
        Ok(Some((token, user)))
    }

    /// Whether the token with this hash is still `token_id` of `user_id` (not revoked, and for
    /// a login session, its password not changed since; expiry is the reader's to judge). One
    /// point read, two for a session (the notification channels).
    pub fn token_active(&self, token_hash: &[u8; 32], user_id: &str, token_id: &str) -> Result<bool, StorageError> {
        let Some(token) = self.read::<Token>("token", &keys::token(token_hash))? else {
            return Ok(false);
        };
        if token.id != token_id || token.user_id != user_id {
            return Ok(false);
        }
        if token.password_epoch.is_none() {
            return Ok(true);
        }
        Ok(self.user(user_id)?.is_some_and(|user| token.current_for(&user)))
    }

    /// A user's tokens (tests; requests page through [`StateMachine::tokens_page`]).
    pub fn tokens(&self, user_id: &str) -> Result<Vec<Token>, StorageError> {
        self.tokens_page(user_id, None, usize::MAX)
    }

    /// A user's tokens in index order after token `after` (an id), at most `limit`.
    pub fn tokens_page(&self, user_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<Token>, StorageError> {
        let (mut start, end) = keys::user_token_range(user_id);
        if let Some(after) = after {
            start = keys::user_token(user_id, after);
            start.push(0);
        }
        let mut tokens = Vec::new();
        for (key, hash) in self.scan_raw(&start, &end, limit)? {
            let hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| StorageError::Corrupt(format!("token index {key:?} does not hold a hash")))?;
            if let Some(token) = self.read::<Token>("token", &keys::token(&hash))? {
                tokens.push(token);
            }
        }
        Ok(tokens)
    }

    pub fn namespace(&self, namespace_id: &str) -> Result<Option<Namespace>, StorageError> {
        self.read("namespace", &keys::namespace(namespace_id))
    }

    /// Number of users (for metrics and tests).
    pub fn user_count(&self) -> Result<u64, StorageError> {
        let (start, end) = keys::user_range();
        Ok(self.scan_keys(&start, &end, usize::MAX)?.len() as u64)
    }
}
