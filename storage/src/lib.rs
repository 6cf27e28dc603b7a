//! raftbox-storage: the one RocksDB instance of a node and everything written to it.
//!
//! - [`cf`]: column-family names (the storage layout, part 1).
//! - [`keys`]: key encodings (the storage layout, part 2).
//! - [`db`]: opening the database; raw Raft-log and Raft-metadata access.
//! - [`format`]: the data formats (of the data directory, log entries, the state) and the
//!   rules that keep an older node from being sent what it cannot read.
//! - [`command`]: the replicated commands and their outcomes (what travels in the log).
//! - [`records`]: the stored records of the state machine.
//! - [`blocks`]: the on-disk, content-addressed block store.
//! - [`state`]: the deterministic `apply` (a dispatcher: each command goes to the module that
//!   owns it) and the shared read helpers.
//! - [`snapshot`]: snapshot build and restore, streamed (an image file in, an image file out).
//! - [`accounts`], [`chunks`], [`files`], [`jobs`], [`sharing`], `guards`: the apply logic and
//!   queries of users and tokens, the chunk index, files and versions, the scheduler, shared
//!   folders, ACLs, groups and the permission rule, and the request guards (idempotency,
//!   processed messages, rate limits); [`limits`]: the replicated runtime limits.
//! - [`paths`], [`schedule`], [`ratelimit`]: pure domain values and functions (paths and
//!   conflicted-copy names, cron fires, rate-limit algorithms).
//!
//! `apply` never fails on a command's content: every input problem is an `Outcome`; it
//! returns an error only for a disk failure or real corruption.
//!
//! This crate knows nothing of openraft, tonic, axum or clocks: time arrives inside commands.

pub mod accounts;
pub mod blocks;
pub mod cf;
pub mod chunks;
pub mod command;
pub mod db;
mod error;
pub mod files;
mod floor;
pub mod format;
mod guards;
pub mod jobs;
pub mod keys;
pub mod limits;
pub mod links;
pub mod paths;
pub mod props;
pub mod ratelimit;
pub mod records;
pub mod schedule;
pub mod sharing;
pub mod snapshot;
pub mod state;

pub use command::{Batch, Command, ConfigId, Outcome, Rejection};
pub use db::Db;
pub use error::StorageError;
pub use state::StateMachine;
