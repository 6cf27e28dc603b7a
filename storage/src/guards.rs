//! Apply logic of the request guards: idempotency records, processed-message records and
//! rate-limiter state, and the purge of those that expired.
//!
//! Each record kind has an expiry index (`keys::Expiring`) so the purge reads only what is
//! due, in time order, and never runs on the request path.

use crate::command::{Command, IdempotencyOutcome, Outcome, RateCheck, RateEntry, Rejection};
use crate::keys::Expiring;
use crate::records::{
    ConflictRecord, IdempotencyRecord, IdempotencyResult, IdempotencyStatus, RateRecord, SavedResponse,
};
use crate::state::{apply_command, StateMachine, Txn};
use crate::StorageError;

fn get_record(txn: &Txn<'_>, scope: &[u8; 32]) -> Result<Option<IdempotencyRecord>, StorageError> {
    txn.get("idempotency record", &Expiring::Idempotency.record(scope))
}

/// What an existing, unexpired record means for a new request with the same scope; `None`
/// when the request should run (no record, expired, or an abandoned lease).
fn existing(
    txn: &Txn<'_>,
    scope: &[u8; 32],
    fingerprint: &[u8; 32],
) -> Result<Option<IdempotencyOutcome>, StorageError> {
    let Some(record) = get_record(txn, scope)? else {
        return Ok(None);
    };
    if record.expires_ms <= txn.now_ms {
        return Ok(None);
    }
    if record.fingerprint != *fingerprint {
        return Ok(Some(IdempotencyOutcome::KeyReused));
    }
    Ok(match record.status {
        IdempotencyStatus::Done { result } => Some(IdempotencyOutcome::Replay { result }),
        IdempotencyStatus::InProgress { lease_until_ms } if lease_until_ms > txn.now_ms => {
            Some(IdempotencyOutcome::InProgress { retry_after_ms: lease_until_ms - txn.now_ms })
        }
        IdempotencyStatus::InProgress { .. } => None,
    })
}

/// Writes `record` under `scope`, keeping the expiry index in step.
fn put_record(txn: &mut Txn<'_>, scope: &[u8; 32], record: &IdempotencyRecord) -> Result<(), StorageError> {
    if let Some(old) = get_record(txn, scope)? {
        if old.expires_ms != record.expires_ms {
            txn.delete(Expiring::Idempotency.index(old.expires_ms, scope));
        }
    }
    txn.put(Expiring::Idempotency.record(scope), record);
    txn.put_raw(Expiring::Idempotency.index(record.expires_ms, scope), Vec::new());
    Ok(())
}

/// A replayed version conflict reports the version current *now*, as an unkeyed retry does
/// (`files::commit`): the first answer's may have expired since, and a client rebasing on it
/// would conflict again. Everything else replays as it was. (The same key and fingerprint
/// name the same body, so the same namespace and path.)
fn with_current_version(
    txn: &Txn<'_>,
    command: &Command,
    earlier: IdempotencyOutcome,
) -> Result<IdempotencyOutcome, StorageError> {
    let IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(outcome) } = &earlier else {
        return Ok(earlier);
    };
    let Outcome::FileConflict { copy, .. } = outcome.as_ref() else { return Ok(earlier) };
    let (namespace_id, path) = match command {
        Command::CommitFile(c) => (&c.namespace_id, c.path.as_str()),
        Command::MoveFile(m) => (&m.namespace_id, m.from.as_str()),
        _ => return Ok(earlier),
    };
    let current_version = crate::files::file_at(txn, namespace_id, path)?.map_or(0, |f| f.current_version);
    let outcome = Outcome::FileConflict { current_version, copy: copy.clone() };
    Ok(IdempotencyOutcome::Replay { result: IdempotencyResult::Outcome(Box::new(outcome)) })
}

pub(crate) fn idempotent(
    txn: &mut Txn<'_>,
    scope: &[u8; 32],
    fingerprint: &[u8; 32],
    ttl_ms: u64,
    on_success: &Option<SavedResponse>,
    command: &Command,
) -> Result<Outcome, StorageError> {
    // The API never nests key guards; a nested one's answer would not fit a saved record.
    if matches!(
        command,
        Command::Idempotent { .. }
            | Command::IdempotencyBegin { .. }
            | Command::IdempotencyComplete { .. }
            | Command::IdempotencyRelease { .. }
    ) {
        return Ok(Outcome::Rejected(Rejection::Conflict("an idempotency guard cannot wrap another".into())));
    }
    if let Some(earlier) = existing(txn, scope, fingerprint)? {
        return Ok(Outcome::Idempotency(with_current_version(txn, command, earlier)?));
    }
    let outcome = apply_command(txn, command)?;
    if matches!(&outcome, Outcome::Rejected(rejection) if rejection.is_curable()) {
        // Nothing changed, and the same request will succeed once the client cured it.
        return Ok(Outcome::Idempotency(IdempotencyOutcome::Applied { outcome: Box::new(outcome) }));
    }
    let result = match (&outcome, on_success) {
        (Outcome::Rejected(rejection), _) => IdempotencyResult::Rejected(rejection.clone()),
        (_, Some(response)) => IdempotencyResult::Response(response.clone()),
        (outcome, None) => IdempotencyResult::Outcome(Box::new(outcome.clone())),
    };
    let record = IdempotencyRecord {
        fingerprint: *fingerprint,
        status: IdempotencyStatus::Done { result },
        created_ms: txn.now_ms,
        expires_ms: txn.now_ms.saturating_add(ttl_ms),
    };
    put_record(txn, scope, &record)?;
    Ok(Outcome::Idempotency(IdempotencyOutcome::Applied { outcome: Box::new(outcome) }))
}

pub(crate) fn begin(
    txn: &mut Txn<'_>,
    scope: &[u8; 32],
    fingerprint: &[u8; 32],
    ttl_ms: u64,
    lease_ms: u64,
) -> Result<Outcome, StorageError> {
    if let Some(earlier) = existing(txn, scope, fingerprint)? {
        return Ok(Outcome::Idempotency(earlier));
    }
    let record = IdempotencyRecord {
        fingerprint: *fingerprint,
        status: IdempotencyStatus::InProgress { lease_until_ms: txn.now_ms.saturating_add(lease_ms) },
        created_ms: txn.now_ms,
        expires_ms: txn.now_ms.saturating_add(ttl_ms),
    };
    put_record(txn, scope, &record)?;
    Ok(Outcome::Idempotency(IdempotencyOutcome::Begun))
}

pub(crate) fn complete(txn: &mut Txn<'_>, scope: &[u8; 32], response: &SavedResponse) -> Result<Outcome, StorageError> {
    if let Some(mut record) = get_record(txn, scope)? {
        if matches!(record.status, IdempotencyStatus::InProgress { .. }) {
            record.status = IdempotencyStatus::Done { result: IdempotencyResult::Response(response.clone()) };
            put_record(txn, scope, &record)?;
        }
    }
    Ok(Outcome::Done)
}

pub(crate) fn release(txn: &mut Txn<'_>, scope: &[u8; 32]) -> Result<Outcome, StorageError> {
    if let Some(record) = get_record(txn, scope)? {
        if matches!(record.status, IdempotencyStatus::InProgress { .. }) {
            txn.delete(Expiring::Idempotency.index(record.expires_ms, scope));
            txn.delete(Expiring::Idempotency.record(scope));
        }
    }
    Ok(Outcome::Done)
}

fn message_key(consumer: &str, message_id: &str) -> Vec<u8> {
    let mut id = consumer.as_bytes().to_vec();
    id.push(0);
    id.extend_from_slice(message_id.as_bytes());
    id
}

pub(crate) fn once(
    txn: &mut Txn<'_>,
    consumer: &str,
    message_id: &str,
    ttl_ms: u64,
    command: &Command,
) -> Result<Outcome, StorageError> {
    let id = message_key(consumer, message_id);
    let previous: Option<u64> = txn.get("processed message", &Expiring::Processed.record(&id))?;
    if previous.is_some_and(|expires_ms| expires_ms > txn.now_ms) {
        return Ok(Outcome::Duplicate);
    }
    if let Some(expires_ms) = previous {
        txn.delete(Expiring::Processed.index(expires_ms, &id));
    }
    let outcome = apply_command(txn, command)?;
    let expires_ms = txn.now_ms.saturating_add(ttl_ms);
    txn.put(Expiring::Processed.record(&id), &expires_ms);
    txn.put_raw(Expiring::Processed.index(expires_ms, &id), Vec::new());
    Ok(outcome)
}

pub(crate) fn rate_check(txn: &mut Txn<'_>, checks: &[RateCheck]) -> Result<Outcome, StorageError> {
    let mut decisions = Vec::with_capacity(checks.len());
    let mut updates = Vec::with_capacity(checks.len());
    for check in checks {
        let key = Expiring::Rate.record(check.key.as_bytes());
        let previous: Option<RateRecord> = txn.get("rate state", &key)?;
        let (decision, state) = check.algorithm.check(previous.as_ref().map(|r| &r.state), txn.now_ms);
        decisions.push(decision);
        let record = RateRecord {
            state,
            idle_at_ms: txn.now_ms.saturating_add(check.algorithm.idle_after_ms()),
            charged_term: 0,
        };
        updates.push((check.key.as_bytes(), previous.map(|p| p.idle_at_ms), record));
    }
    let allowed = decisions.iter().all(|d| d.allowed);
    if allowed {
        for (id, previous_idle_at, record) in updates {
            put_rate_record(txn, id, previous_idle_at, &record);
        }
    }
    Ok(Outcome::Rate { allowed, decisions })
}

/// Replaces each key's rate-limit state with the one the leader decided, unless a leader
/// of a later term already took the key over.
pub(crate) fn rate_set(txn: &mut Txn<'_>, entries: &[RateEntry]) -> Result<Outcome, StorageError> {
    for entry in entries {
        let id = entry.key.as_bytes();
        let previous: Option<RateRecord> = txn.get("rate state", &Expiring::Rate.record(id))?;
        if previous.as_ref().is_some_and(|p| p.charged_term > entry.charged_term) {
            // From a leader of an earlier term, after a later leader took the key over (a
            // write forwarded late): the later leader's state stands.
            continue;
        }
        let record =
            RateRecord { state: entry.state.clone(), idle_at_ms: entry.idle_at_ms, charged_term: entry.charged_term };
        put_rate_record(txn, id, previous.map(|p| p.idle_at_ms), &record);
    }
    Ok(Outcome::Done)
}

fn put_rate_record(txn: &mut Txn<'_>, id: &[u8], previous_idle_at: Option<u64>, record: &RateRecord) {
    if let Some(old) = previous_idle_at.filter(|old| *old != record.idle_at_ms) {
        txn.delete(Expiring::Rate.index(old, id));
    }
    txn.put_raw(Expiring::Rate.index(record.idle_at_ms, id), Vec::new());
    txn.put(Expiring::Rate.record(id), record);
}

impl StateMachine {
    /// One key's rate-limit state as last applied.
    pub fn rate_record(&self, key: &str) -> Result<Option<RateRecord>, StorageError> {
        self.read("rate state", &Expiring::Rate.record(key.as_bytes()))
    }
}

pub(crate) fn purge_expired(txn: &mut Txn<'_>, max_records: usize) -> Result<Outcome, StorageError> {
    let mut purged = 0;
    let mut more = false;
    for kind in Expiring::ALL {
        let (start, end) = kind.index_range();
        let index = txn.committed_keys(&start, &end, max_records)?;
        let mut due = 0;
        for index_key in index {
            let Some((expires_ms, id)) = Expiring::parse_index(&index_key) else {
                continue;
            };
            if expires_ms > txn.now_ms {
                break;
            }
            due += 1;
            let record_key = kind.record(id);
            if record_expiry(txn, kind, &record_key)? == Some(expires_ms) {
                match kind {
                    // A token has an index entry by user beside its record.
                    Expiring::Token => crate::accounts::delete_token(txn, &record_key)?,
                    _ => txn.delete(record_key),
                }
                purged += 1;
            }
            txn.delete(index_key.clone());
        }
        more |= due == max_records;
    }
    // Deleted shared folders, a bounded step each time (their own budget).
    let (removed, folders_left) = crate::sharing::purge_deleted(txn, max_records)?;
    Ok(Outcome::Purged { records: purged + removed as u64, more: more || folders_left })
}

/// The expiry a record currently has (it may have been renewed since an index entry).
fn record_expiry(txn: &Txn<'_>, kind: Expiring, key: &[u8]) -> Result<Option<u64>, StorageError> {
    Ok(match kind {
        Expiring::Idempotency => txn.get::<IdempotencyRecord>("idempotency record", key)?.map(|r| r.expires_ms),
        Expiring::Processed => txn.get::<u64>("processed message", key)?,
        Expiring::Rate => txn.get::<RateRecord>("rate state", key)?.map(|r| r.idle_at_ms),
        Expiring::Conflict => txn.get::<ConflictRecord>("conflict", key)?.map(|r| r.expires_ms),
        Expiring::Token => txn.get::<crate::records::Token>("token", key)?.and_then(|t| t.expires_ms),
    })
}

#[cfg(test)]
#[path = "guards_tests.rs"]
mod tests;
