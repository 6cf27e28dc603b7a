//! The cluster's runtime limits: rate limits, job limits and quotas, replicated so every node
//! applies the same ones and an operator changes them without restarts (`SetLimits`).
//!
//! The record is the API's `LimitsConfig` as JSON, checked whole by the API before it is
//! proposed; this crate stores it as given (apply never judges content it does not own).

use serde::{Deserialize, Serialize};

use crate::state::{StateMachine, Txn};
use crate::{keys, Outcome, StorageError};

/// The stored limits and when they were set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsRecord {
    /// The API's `LimitsConfig`, as JSON.
    pub limits: serde_json::Value,
    /// The state machine's clock when they were set (Unix ms).
    pub set_at_ms: u64,
    /// How many times they were set (1 for the first): a node's API swaps in the limits
    /// when this differs from the revision it enforces.
    pub revision: u64,
}

pub(crate) fn set(txn: &mut Txn<'_>, limits: &serde_json::Value, seed: bool) -> Result<Outcome, StorageError> {
    let stored = txn.get::<LimitsRecord>("limits", &keys::limits())?;
    if seed && stored.is_some() {
        return Ok(Outcome::Done);
    }
    let revision = stored.map_or(1, |record| record.revision + 1);
    txn.put(keys::limits(), &LimitsRecord { limits: limits.clone(), set_at_ms: txn.now_ms, revision });
    Ok(Outcome::Done)
}

impl StateMachine {
    /// The cluster's runtime limits, once set or seeded.
    pub fn limits(&self) -> Result<Option<LimitsRecord>, StorageError> {
        self.read("limits", &keys::limits())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Batch, Command, Db, StateMachine};

    #[test]
    fn a_seed_sets_limits_once_and_a_change_replaces_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
        let apply = |now_ms, command| sm.apply(b"m", Some(&Batch::new(now_ms, vec![command].into()))).expect("apply");
        assert_eq!(sm.limits().expect("read"), None);
        apply(10, Command::SetLimits { limits: json!({"quotas": {"folders_per_user": 5}}), seed: true });
        apply(20, Command::SetLimits { limits: json!({"quotas": {"folders_per_user": 9}}), seed: true });
        let seeded = sm.limits().expect("read").expect("seeded");
        assert_eq!(
            (seeded.limits["quotas"]["folders_per_user"].as_u64(), seeded.revision, seeded.set_at_ms),
            (Some(5), 1, 10)
        );
        apply(30, Command::SetLimits { limits: json!({"quotas": {"folders_per_user": 7}}), seed: false });
        let changed = sm.limits().expect("read").expect("set");
        assert_eq!(
            (changed.limits["quotas"]["folders_per_user"].as_u64(), changed.revision, changed.set_at_ms),
            (Some(7), 2, 30)
        );
    }

    #[test]
    fn an_entry_of_a_newer_format_stops_apply_before_anything_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sm = StateMachine::new(Db::open(dir.path()).expect("open"));
        let mut batch = Batch::new(10, vec![Command::SetLimits { limits: json!({}), seed: false }].into());
        batch.format = crate::format::FORMAT + 1;
        let error = sm.apply(b"m", Some(&batch)).expect_err("refused");
        assert!(error.to_string().contains("run a newer raftbox"), "{error}");
        assert_eq!(sm.limits().expect("read"), None);
        assert_eq!(sm.applied_marker().expect("marker"), None);
    }
}
