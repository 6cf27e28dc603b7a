//! Three safety arguments rest on the order in which openraft 0.9.25 runs things, not on its
//! documented contract (ARCHITECTURE.md names each where it is used):
//!
//! 1. **A vote is saved before it is granted**: the engine queues `SaveVote` before the
//!    response (`engine/handler/vote_handler/mod.rs`), and the core awaits `save_vote` before
//!    it runs the next command (`core/raft_core.rs`, `run_command`). The vote lease
//!    (`lease.rs`) and the vote gate in `service.rs` assume it.
//! 2. **The in-memory vote is read after the election switch**: `RuntimeConfigHandle::elect`
//!    is an atomic store read by the core at each tick, and `with_raft_state` runs in the same
//!    core loop, so a vote read after switching elections off sees every election begun
//!    before (`RaftNode::switch_elections`).
//! 3. **`begin_receiving_snapshot` runs on every install path we use**: only the chunked
//!    `install_snapshot` calls it (`network/snapshot_transport.rs`); `install_full_snapshot`
//!    bypasses it, and the purge that follows an install is held back only by the flag it
//!    sets (`state_machine.rs`, `log_store.rs`).
//!
//! A change of openraft — even a patch release — must re-check each of them against its
//! source. These tests fail first, so nobody bumps it without doing so.

/// The openraft release the arguments above were checked against.
const CHECKED_OPENRAFT: &str = "0.9.25";

#[test]
fn openraft_is_the_release_the_ordering_arguments_were_checked_against() {
    let lock = include_str!("../../../Cargo.lock");
    let pinned = format!("name = \"openraft\"\nversion = \"{CHECKED_OPENRAFT}\"");
    assert!(
        lock.contains(&pinned),
        "Cargo.lock no longer holds openraft {CHECKED_OPENRAFT}: re-check the three ordering arguments in \
         raft/src/tests/openraft_pins.rs against the new source, then update CHECKED_OPENRAFT"
    );
    let manifest = include_str!("../../../Cargo.toml");
    assert!(manifest.contains(&format!("openraft = {{ version = \"={CHECKED_OPENRAFT}\"")), "an exact pin");
}

#[test]
fn no_install_path_skips_begin_receiving_snapshot() {
    // Argument 3 holds only while every install goes through the chunked path.
    let sources = [
        include_str!("../node.rs"),
        include_str!("../service.rs"),
        include_str!("../network.rs"),
        include_str!("../state_machine.rs"),
        include_str!("../recover.rs"),
    ];
    for source in sources {
        assert!(!source.contains(&["install_full", "_snapshot"].concat()), "a full-snapshot install bypasses the flag");
    }
}
