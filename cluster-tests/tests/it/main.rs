//! Process-level cluster tests: each module checks one invariant against real `raftbox`
//! processes launched by [`raftbox_cluster_tests::Cluster`], through the HTTP API only.
//!
//! Each test starts its own three nodes, so run them one at a time:
//! `cargo test --workspace --test cluster -- --test-threads=1` (the `raftbox` binary must be
//! built first; `scripts/test` does both). `RAFTBOX_SEED` replays a run, `RAFTBOX_KEEP=1`
//! keeps the cluster directory with the node logs.
//!
//! - `blocks_durable`: an acknowledged block survives SIGKILL of any one node.
//! - `files_sync`: files cross nodes byte-identical; WebSocket hears other nodes' commits;
//!   interrupted uploads resume through `status`.
//! - `folder_sync`: two `raftbox sync` clients through two nodes converge through creates,
//!   edits, renames and deletes; a simultaneous edit keeps both versions; a killed node is
//!   survived through the next endpoint.
//! - `sync_accidents`: `raftbox sync` through the accidents of a real laptop (a folder moved
//!   away, a linked subfolder, a name that cannot be written, an edit keeping size and mtime,
//!   a missing, replaced or stale folder, mass deletes, an edit during a download, a cursor
//!   reset, ignore rules, mtime and execute bit, a viewer's and a removed folder, Ctrl-C):
//!   every byte survives somewhere findable, nothing is written outside the folder.
//! - `sync_case_folding`: on a file system that folds names (ext4 casefold, else a FUSE
//!   stand-in), two server names that are one name there are both kept, and a case-only
//!   rename either way is a rename, never a delete.
//! - `sync_fuzz`: three sync devices and the API doing random creates, edits, renames,
//!   deletes, long names, links and kills (seeded); everything converges and every last
//!   write is findable.
//! - `maintenance`: orphan blocks reclaimed, old versions expired, missed blocks replicated.
//! - `jobs_exec`: webhooks fire once and on time, retry, recur, cancel, survive a killed worker.
//! - `failover`: SIGKILL of the leader under write load; election time, no lost ack.
//! - `snapshot_rejoin`: a wiped node is rebuilt from a snapshot, votes only once removed and
//!   added again, and can lead.
//! - `restart_durability`: SIGKILL of every node at once loses no acknowledged write.
//! - `shared_folder`: two users, two devices each, one shared folder across three nodes:
//!   edits cross, a conflicted copy names user and device, a viewer's commit is 403, a
//!   revoke removes the folder from the former member's sync and closes its files and blocks.
//! - `shared_rate_limit`: a limit holds across all nodes hammered at once.
//! - `hostile_tenants`: one ordinary user's attacks (deep JSON, …) while a bystander commits:
//!   the term does not move, no bystander commit fails, its p99 stays within 3x.
//! - `hostile_input`: the same judge over input attacks on WebDAV, passwords and uploads:
//!   deep XML, a backslash in `Destination`, trickled bodies, guessed passwords, spools
//!   against a small disk.
//! - `idempotency_across_nodes`: one key sent to every node at once runs once.
//! - `limiter_failure_modes`: without quorum, fail-open admits and fail-closed rejects.
//! - `membership`: nodes join and leave under load; five nodes survive two down; bad changes refused.
//! - `poison_pill`: requests that once stopped every node are applied, and survive a restart.
//! - `lost_quorum`: a leader without quorum answers 503 in time; a lagging follower's long poll.
//! - `guards_chaos`: rate limits, idempotency keys and job fires under kills and pauses.
//! - `grpc_secret`: node-to-node calls without the cluster secret are refused.
//! - `block_replication`: the replicator walks the whole index; no early reclaiming.
//! - `chaos`: files under partitions, pauses, kills and clock skew; histories checked
//!   linearizable, no acknowledged commit lost, conflicted copies kept.
//! - `checker`: the linearizability checker on histories whose verdict is known.
//! - `clock_skew`: a node with a wrong clock does not lead.
//! - `disk_full`: a leader's disk filled past the NOSPACE minimum: it steps down, others
//!   commit, it catches up once space is freed.
//! - `slow_disk`: a leader's fsync stalled for 3 s: another leads within an election, the
//!   slow node never leads while slow and catches up once fast.
//! - `system_jobs`: the maintenance jobs follow a changed interval.
//! - `token_revocation`: a revoked token is refused on every node within a second.
//! - `webhook_egress`: webhooks to loopback refused at creation and at run time.
//! - `tls`: a mutual-TLS cluster without a secret works, and refuses plaintext and strangers;
//!   with server TLS only, the secret is still demanded.
//! - `big_file`: 1 GiB up and down through the CLI with bounded client memory.
//! - `console`: the web console in headless Chromium: log in, cluster status, a file's
//!   history, download and restore, a job's runs; screenshots in `<target>/console-screenshots/`.
//! - `admin_cli`: `raftbox users`, `raftbox tokens` and `raftbox status` through any node.
//! - `backup_restore`: `raftbox backup` under load, every node lost, `raftbox restore`:
//!   everything back; two of three nodes lost, `raftbox recover --force-new-cluster`.
//! - `cluster_identity`: a node recovered with `--force-new-cluster` while the majority was
//!   only cut off, and that majority, never merge once the cut heals; `cluster add` refuses
//!   a machine holding the old cluster's data.
//! - `docs_walkthrough`: every `sh` block of README.md and docs/user-guide.md runs, in
//!   order, against a `scripts/cluster up` cluster.
//! - `install_step`: `scripts/cluster` and `scripts/test` install through one shared step.

mod admin_cli;
mod backup_restore;
mod big_file;
mod block_replication;
mod blocks_durable;
mod chaos;
mod checker;
mod clock_skew;
mod cluster_identity;
mod console;
mod disk_full;
mod docs_walkthrough;
mod failover;
mod files_sync;
mod folder_sync;
mod grpc_secret;
mod guards_chaos;
mod hostile_input;
mod hostile_tenants;
mod idempotency_across_nodes;
mod install_step;
mod jobs_exec;
mod limiter_failure_modes;
mod lost_quorum;
mod maintenance;
mod membership;
mod membership_identity;
mod poison_pill;
mod restart_durability;
mod runtime_limits;
mod shared_folder;
mod shared_rate_limit;
mod slow_disk;
mod snapshot_install_crash;
mod snapshot_rejoin;
mod sync_accidents;
mod sync_case_folding;
mod sync_fuzz;
mod system_jobs;
mod tls;
mod token_revocation;
mod upgrade;
mod webdav;
mod webhook_egress;
