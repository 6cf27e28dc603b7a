//! Data formats: what a node's data directory, its log entries and the replicated state are
//! written in, so a node refuses what it cannot read instead of misreading it.
//!
//! - **Formats.** 1: before sharing. 2: shared folders (chunk references per namespace).
//!   3: format versions themselves and runtime limits ([`crate::Command::SetLimits`]).
//!   4: passwords ([`crate::Command::SetPassword`]), the block placement fence
//!   (`RegisterChunk`'s `placed_in`), jobs paused and run now, webhook secrets, share links.
//!   5: login sessions that a password change ends (`CreateToken`'s `session_epoch`,
//!   `SetPassword`'s `ends_sessions`).
//! - **The data directory** records the format of the code that last opened it
//!   ([`crate::keys::meta::FORMAT`], absent before format 3); [`crate::Db::open`] refuses a
//!   newer one.
//! - **A log entry** ([`crate::Batch::format`]) carries the oldest format that reads it: the
//!   highest [`crate::Command::format`] of its commands (1 for every command older code
//!   knows). A node refuses an entry newer than it reads, before applying anything.
//! - **The cluster's format** is the replicated `schema` record: the leader raises it
//!   (`Migrate`) only once every member reports that it reads the new format (`raft::format`),
//!   and a command of a newer format is proposed only after that. So in a rolling upgrade
//!   no member is ever sent an entry it cannot read, and a member too old for the cluster is
//!   refused at `cluster add` and at start.

/// The format this code reads and writes.
pub const FORMAT: u32 = 5;

/// The format from which a block's registration names the configuration it was placed in
/// ([`crate::Command::RegisterChunk`]'s `placed_in`): older code would ignore the fence.
pub const PLACEMENT_FENCE: u32 = 4;

/// The format every release that may share a cluster with this one reads: each node brings
/// the stored data up to it at start (`Migrate`, as the previous release did), so only the
/// move beyond it waits for every member ([`FORMAT`] is raised by the leader).
pub const BASELINE: u32 = 2;

/// The format of entries and records written before formats were recorded.
pub const fn unrecorded() -> u32 {
    1
}

/// The error text for data in `format`, newer than this code reads: what it is and what to do.
pub fn too_new(what: &str, format: u32) -> String {
    format!(
        "{what} is in data format {format}, but this raftbox reads formats up to {FORMAT}: \
         run a newer raftbox on this node (docs/operations.md, \"Upgrading\")"
    )
}

/// The format a log entry that failed to decode declares, if it declares one: what makes
/// "an entry of a newer format" tell itself apart from a damaged one.
pub fn declared_entry_format(entry_json: &[u8]) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_slice(entry_json).ok()?;
    let format = value.get("payload")?.get("Normal")?.get("format")?.as_u64()?;
    u32::try_from(format).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Command};

    #[test]
    fn an_entry_carries_the_oldest_format_that_reads_it() {
        let old = Batch::new(1, vec![Command::PurgeExpired { max_records: 1 }].into());
        assert_eq!(old.format, 1);
        let limits = Command::SetLimits { limits: serde_json::json!({}), seed: false };
        let keyed = Command::Once {
            consumer: "c".into(),
            message_id: "m".into(),
            ttl_ms: 1,
            command: Box::new(limits.clone()),
        };
        assert_eq!(Batch::new(1, vec![Command::PurgeExpired { max_records: 1 }, keyed].into()).format, 3);
        assert_eq!(Batch::new(1, vec![Command::Migrate { schema: 2 }].into()).format, 2);
        // An entry written before formats were recorded reads as format 1.
        let legacy: Batch = serde_json::from_str(r#"{"now_ms":5,"commands":[]}"#).expect("decode");
        assert_eq!(legacy.format, 1);
    }

    #[test]
    fn a_newer_entry_declares_its_format() {
        let entry = br#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":7},
            "payload":{"Normal":{"now_ms":1,"commands":[{"type":"from_the_future"}],"format":9}}}"#;
        assert_eq!(declared_entry_format(entry), Some(9));
        assert_eq!(declared_entry_format(b"{\"payload\":\"Blank\"}"), None);
        assert_eq!(declared_entry_format(b"not json"), None);
        assert!(too_new("log entry 7", 9).contains(&format!("formats up to {FORMAT}")));
    }
}
