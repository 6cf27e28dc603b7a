//! The replicated commands and their outcomes: what a Raft log entry carries.
//!
//! A log entry holds one [`Batch`]: the commands that arrived while the previous entry was in
//! flight, stamped with the proposing leader's clock. Ids (uuid strings) are generated before
//! proposing and travel inside the commands, so `apply` stays deterministic.

use serde::{Deserialize, Serialize};

use crate::blocks::BlockHash;
use crate::jobs::{Job, JobPatch, RunReport};
use crate::paths::FilePath;
use crate::ratelimit::{Algorithm, Decision, LimitState};
use crate::records::{Grantee, IdempotencyResult, Role, SavedResponse};

/// One log entry's worth of commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The leader's wall clock when it proposed this batch, Unix milliseconds.
    pub now_ms: u64,
    /// Shared, so a copy of the entry (openraft keeps several: the append, replication to
    /// each follower, apply) costs a reference count, not the commands. Encoded as a list.
    pub commands: std::sync::Arc<[Command]>,
    /// The oldest data format that reads this entry: the highest [`Command::format`] of its
    /// commands ([`crate::format`]). 1 in entries written before formats were recorded.
    #[serde(default = "crate::format::unrecorded")]
    pub format: u32,
}

impl Batch {
    /// A batch of `commands` stamped `now_ms`, with the format they need.
    pub fn new(now_ms: u64, commands: std::sync::Arc<[Command]>) -> Batch {
        let format = commands.iter().map(Command::format).max().unwrap_or(crate::format::unrecorded());
        Batch { now_ms, commands, format }
    }
}

/// The deepest nesting of arrays and objects the JSON decoder of every node takes (serde_json's
/// recursion limit of 128 refuses the 128th level). Every node decodes every log entry with it, so a command whose entry
/// would nest deeper is refused before it is proposed (`raftbox_raft` checks the depth of
/// the deepest encoding an entry travels in).
pub const DECODER_DEPTH_MAX: usize = 127;

/// How deeply the JSON text `json` nests: the most arrays and objects open at once, strings
/// skipped. One pass over the bytes, no allocation.
pub fn json_depth(json: &[u8]) -> usize {
    json_nesting(json).0
}

/// The most arrays and objects open at once in the JSON text (or prefix) `json`, and how
/// many are open at its end.
pub fn json_nesting(json: &[u8]) -> (usize, usize) {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in json {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    (deepest, depth)
}

/// A state change. Each variant is applied atomically with the rest of its batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Creates a user and its personal namespace. User names are unique.
    CreateUser {
        user_id: String,
        namespace_id: String,
        name: String,
    },
    /// Creates a bearer token for a user. Only the blake3 hash of the secret is stored.
    CreateToken {
        token_id: String,
        user_id: String,
        name: String,
        token_hash: [u8; 32],
        /// When it stops working (Unix ms); `None`: never.
        #[serde(default)]
        expires_ms: Option<u64>,
        /// A login session: the user's password epoch its password was checked under
        /// (refused if the password changed since). Format 5.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_epoch: Option<u64>,
    },
    /// Sets (or, with `None`, removes) a user's password: its argon2id hash as a PHC string,
    /// computed before proposing (apply never hashes). Format 4; with `ends_sessions`, the
    /// user's login sessions made under the password before stop working (format 5).
    SetPassword {
        user_id: String,
        password_hash: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ends_sessions: bool,
    },
    /// Sets a user's webhook signing secret (generated before proposing). With
    /// `keep_previous_ms`, a rotation: the secret before it still signs (beside the new one)
    /// for that long. Without, only if the user has none yet (two nodes creating one at once
    /// leave the first). Format 4.
    SetWebhookSecret {
        user_id: String,
        secret: crate::records::SecretText,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep_previous_ms: Option<u64>,
    },
    /// Records a share link for its creator (refused unless they may read the namespace, or
    /// past `links_max` links). Format 4.
    CreateLink {
        link: Box<crate::links::Link>,
        links_max: u32,
    },
    /// Removes one of the actor's share links (format 4); with `namespace_id`, a link in a
    /// namespace the actor owns, whoever made it (format 5).
    RevokeLink {
        actor_user_id: String,
        link_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace_id: Option<String>,
    },
    /// Counts a download through a link (refused once its downloads are used up). Format 4.
    CountLinkDownload {
        token_hash: [u8; 32],
    },
    /// Revokes a user's token: it stops working on every node as each applies this.
    RevokeToken {
        user_id: String,
        token_id: String,
    },
    /// Makes sure an admin user holding this token exists (idempotent: every node that is
    /// configured with the admin token proposes it once at start).
    EnsureAdmin {
        user_id: String,
        namespace_id: String,
        token_id: String,
        token_hash: [u8; 32],
    },
    /// Applies `command` at most once per idempotency `scope` (a hash of principal, route and
    /// key): the record and the effect are written in this same apply. `on_success` is the
    /// response to save when `command` succeeds (ids are generated before proposing, so it is
    /// known in advance); a rejection is saved as such.
    Idempotent {
        scope: [u8; 32],
        fingerprint: [u8; 32],
        ttl_ms: u64,
        /// None: save the outcome itself (the route renders it the same way on replay).
        on_success: Option<SavedResponse>,
        command: Box<Command>,
    },
    /// Starts multi-step keyed work: inserts an `IN_PROGRESS` record with a lease.
    IdempotencyBegin {
        scope: [u8; 32],
        fingerprint: [u8; 32],
        ttl_ms: u64,
        lease_ms: u64,
    },
    /// Finishes multi-step keyed work: the record becomes `DONE` with the response.
    IdempotencyComplete {
        scope: [u8; 32],
        response: SavedResponse,
    },
    /// The keyed work did not happen (e.g. no quorum before it started): forget the record.
    IdempotencyRelease {
        scope: [u8; 32],
    },
    /// Applies `command` once per `(consumer, message_id)`: a processed-message record
    /// written with the effect; a duplicate is skipped.
    Once {
        consumer: String,
        message_id: String,
        ttl_ms: u64,
        command: Box<Command>,
    },
    /// Checks and updates rate limits atomically: either every check admits the request and
    /// all states advance, or none does.
    RateCheck {
        checks: Vec<RateCheck>,
    },
    /// Records rate-limit states the leader decided in memory (see `raft::limiter`): each
    /// key's state is replaced. Only the leader of `term` writes these, in order.
    RateSet {
        entries: Vec<RateEntry>,
    },
    /// Records a block in the chunk index once a majority of nodes hold it (refcount 0 until
    /// a commit references it). Registering a known block changes nothing.
    RegisterChunk {
        hash: BlockHash,
        size: u64,
        /// The user who uploaded it: they may read it and commit it (recorded again for
        /// each user who uploads the same content). Empty in entries from before sharing.
        #[serde(default)]
        uploader: String,
        /// The uploader's storage quota, in bytes (`None`: no quota). A block is counted once
        /// per user who uploaded it ([`crate::chunks::stored_bytes`]); one that would take the
        /// uploader past the quota is refused (`Rejection::QuotaExceeded`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quota_bytes: Option<u64>,
        /// The configuration whose voters the block was made durable on (`None`: not placed
        /// by this command, or a cluster below format 4). Refused
        /// (`Rejection::MembersChanged`) unless it is still the configuration in effect where
        /// the entry sits in the log: a member change between the placement and this entry
        /// could leave the block on fewer than a majority of the new voters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placed_in: Option<ConfigId>,
    },
    /// Commits a file version with the conflict rules of DESIGN.md §4 (a stale base makes a
    /// conflicted copy with the client's content, in this same apply).
    CommitFile(Box<FileCommit>),
    /// Moves (renames) a file: its content becomes a new version at `to` and `from` gets a
    /// tombstone, in one apply, so both changes sync.
    MoveFile(Box<FileMove>),
    /// Deletes versions that stopped being current at or before `superseded_before_ms`
    /// (never a current version), at most `max_versions`, dropping their chunk references.
    ExpireVersions {
        superseded_before_ms: u64,
        max_versions: u32,
    },
    /// Removes chunk-index entries unreferenced since at or before `orphaned_before_ms`, at
    /// most `max_chunks` (each node then reclaims the block files on its own).
    CollectOrphans {
        orphaned_before_ms: u64,
        max_chunks: u32,
    },
    /// Schedules a new job (fully formed by the API, status SCHEDULED).
    CreateJob(Box<Job>),
    /// Schedules a new job if its owner has fewer than `active_jobs_max` jobs that may still
    /// run (a non-admin's creation: the quota is checked in apply, atomically).
    CreateJobWithin {
        job: Box<Job>,
        active_jobs_max: u32,
    },
    PatchJob {
        job_id: String,
        patch: Box<JobPatch>,
    },
    CancelJob {
        job_id: String,
    },
    /// Pauses a job: no fire or retry of it starts until it is resumed (a run in progress
    /// goes on to its end). Pausing a paused job changes nothing.
    PauseJob {
        job_id: String,
    },
    /// Resumes a paused job. Fires a recurring job missed while paused are not made up: its
    /// next fire is the first scheduled time from now on. A one-off job whose time passed,
    /// or a fire waiting for a retry, runs now.
    ResumeJob {
        job_id: String,
    },
    /// Fires a scheduled job now, once: claimed, fenced and recorded as any fire is; the
    /// schedule goes on after it (a recurring job's next fire is its first scheduled time
    /// after this one ends, a one-off job still fires at its time if that is later).
    RunJobNow {
        job_id: String,
        /// The least time between two runs made now of the job (its owner's shortest cron
        /// interval; refused sooner). `None`: any time (admins; entries before format 5).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_interval_ms: Option<u64>,
    },
    /// Claims due jobs and jobs whose lease expired for `worker` (fence incremented).
    ClaimJobs {
        worker: String,
        lease_ms: u64,
        max_jobs: u32,
    },
    /// The fence holder starts an attempt (a run record is written, kept `run_ttl_ms` after
    /// it ends however it ends).
    StartRun {
        job_id: String,
        fence: u64,
        run_id: String,
        worker: String,
        run_ttl_ms: u64,
    },
    /// The fence holder extends its lease.
    RenewLease {
        job_id: String,
        fence: u64,
        lease_ms: u64,
    },
    /// The fence holder reports the attempt's outcome.
    FinishRun(Box<RunReport>),
    /// Deletes finished runs whose retention ended at or before `before_ms`.
    ExpireRuns {
        before_ms: u64,
        max_runs: u32,
    },
    /// Deletes expired idempotency, processed-message and idle rate-limit records, at most
    /// `max_records` of each kind.
    PurgeExpired {
        max_records: u32,
    },
    /// Creates a shared folder; its creator becomes its (first) owner. With `folders_max`,
    /// only if the creator has fewer shared folders (created and not deleted).
    CreateSharedFolder {
        namespace_id: String,
        name: String,
        owner_user_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        folders_max: Option<u32>,
    },
    /// Grants (`role: Some`), changes or revokes (`None`) a user's or a group's access. Only
    /// an owner acts, except that anyone may revoke their own entry (leaving); the last
    /// direct owner can neither leave nor be demoted.
    SetAccess {
        actor_user_id: String,
        namespace_id: String,
        grantee: Grantee,
        role: Option<Role>,
        /// A new entry naming someone else is an invitation (pending until accepted). Absent
        /// in entries from before invitations, which granted at once and still do.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        invite: bool,
    },
    /// Accepts or declines a pending invitation (an ACL entry `pending`): the user it names,
    /// or for a group an admin. Accepting one already accepted changes nothing.
    RespondInvitation {
        actor_user_id: String,
        namespace_id: String,
        grantee: Grantee,
        accept: bool,
    },
    /// Deletes a shared folder (owner only): its ACL, files, versions, chunk references and
    /// change feed, in this one apply.
    DeleteSharedFolder {
        actor_user_id: String,
        namespace_id: String,
    },
    /// Creates a group (the API lets only the admin ask). Group names are unique.
    CreateGroup {
        group_id: String,
        name: String,
    },
    /// Adds (`member: true`) or removes a user from a group.
    SetGroupMember {
        group_id: String,
        user_id: String,
        member: bool,
    },
    /// Brings stored data up to data format `schema` and makes it the cluster's format
    /// ([`crate::format`]; the leader proposes it once every member reads that format; once
    /// done it changes nothing). Format 2 rebuilds the per-namespace chunk references.
    Migrate {
        schema: u32,
    },
    /// Replaces the cluster's runtime limits (rate limits, job limits, quotas: the API's
    /// `LimitsConfig`, checked whole before proposing) with `limits`. With `seed`, only if
    /// none are set yet (the bootstrap node seeds them from its TOML). Format 3.
    SetLimits {
        limits: serde_json::Value,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        seed: bool,
    },
    /// Sets and removes dead properties of a file (WebDAV PROPPATCH, [`crate::props`]).
    /// Format 5.
    PatchProps(Box<crate::props::PropPatch>),
    /// `ClaimJobs` and `StartRun` in one command: claims due jobs and jobs whose lease expired
    /// for `worker` (fence incremented) and starts each one's attempt in the same apply — the
    /// i-th job claimed is RUNNING as run `run_ids[i]` (so at most `run_ids.len()` are
    /// claimed), its record kept `run_ttl_ms` after it ends.
    ClaimAndStartJobs {
        worker: String,
        lease_ms: u64,
        run_ids: Vec<String>,
        run_ttl_ms: u64,
    },
}

impl Command {
    /// The oldest data format that reads this command ([`crate::format`]). Every variant is
    /// named, so a command added later must say here which format it needs: older nodes
    /// cannot decode it, and it is proposed only once the cluster is at that format.
    pub fn format(&self) -> u32 {
        match self {
            Command::Migrate { schema } => (*schema).max(crate::format::unrecorded()),
            Command::SetLimits { .. } => 3,
            Command::SetPassword { ends_sessions: true, .. } | Command::CreateToken { session_epoch: Some(_), .. } => 5,
            Command::CommitFile(commit) if commit.quota_bytes.is_some() => 5,
            Command::RunJobNow { min_interval_ms: Some(_), .. } => 5,
            Command::RevokeLink { namespace_id: Some(_), .. } | Command::PatchProps(_) => 5,
            Command::SetPassword { .. } | Command::SetWebhookSecret { .. } => 4,
            Command::CreateLink { .. } | Command::RevokeLink { .. } | Command::CountLinkDownload { .. } => 4,
            Command::PauseJob { .. } | Command::ResumeJob { .. } | Command::RunJobNow { .. } => 4,
            Command::RegisterChunk { placed_in: Some(_), .. } => crate::format::PLACEMENT_FENCE,
            Command::Idempotent { command, .. } | Command::Once { command, .. } => command.format(),
            Command::CreateUser { .. }
            | Command::CreateToken { .. }
            | Command::RevokeToken { .. }
            | Command::EnsureAdmin { .. }
            | Command::IdempotencyBegin { .. }
            | Command::IdempotencyComplete { .. }
            | Command::IdempotencyRelease { .. }
            | Command::RateCheck { .. }
            | Command::RateSet { .. }
            | Command::RegisterChunk { .. }
            | Command::CommitFile(_)
            | Command::MoveFile(_)
            | Command::ExpireVersions { .. }
            | Command::CollectOrphans { .. }
            | Command::CreateJob(_)
            | Command::CreateJobWithin { .. }
            | Command::PatchJob { .. }
            | Command::CancelJob { .. }
            | Command::ClaimJobs { .. }
            | Command::StartRun { .. }
            | Command::RenewLease { .. }
            | Command::FinishRun(_)
            | Command::ExpireRuns { .. }
            | Command::PurgeExpired { .. }
            | Command::CreateSharedFolder { .. }
            | Command::SetAccess { .. }
            | Command::RespondInvitation { .. }
            | Command::DeleteSharedFolder { .. }
            | Command::CreateGroup { .. }
            | Command::SetGroupMember { .. }
            | Command::ClaimAndStartJobs { .. } => crate::format::unrecorded(),
        }
    }
}

/// What applied commands may have changed for the notification channels: which change
/// feeds moved, whose access to which namespace, whose groups, which tokens stopped. A
/// listener reads this instead of re-reading everything the caller can see, so what an
/// entry costs a channel does not grow with the caller's namespaces. Rejected commands are
/// included (they changed nothing: a listener that looks finds nothing new).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Namespaces whose change feed (or cursor) moved.
    pub namespaces: Vec<String>,
    /// A grantee's access to a namespace may have changed; `None`: everyone's (the folder
    /// was deleted).
    pub access: Vec<(Option<Grantee>, String)>,
    /// Users whose group memberships changed (their whole set of namespaces may differ).
    pub members: Vec<String>,
    /// Tokens revoked, by user and token id (a listener confirms with a point read: a
    /// refused revocation names a token too).
    pub revoked_tokens: Vec<(String, String)>,
    /// Users whose login sessions a password change ended (a listener confirms, as above).
    pub sessions_ended: Vec<String>,
}

impl Touched {
    /// Adds what `command` may change. Every variant is named, so a new command decides here
    /// whether channels hear of it.
    pub fn add(&mut self, command: &Command) {
        match command {
            Command::CommitFile(commit) => self.namespaces.push(commit.namespace_id.clone()),
            Command::MoveFile(moved) => self.namespaces.push(moved.namespace_id.clone()),
            Command::CreateSharedFolder { namespace_id, owner_user_id, .. } => {
                self.access.push((Some(Grantee::User(owner_user_id.clone())), namespace_id.clone()))
            }
            Command::SetAccess { namespace_id, grantee, .. } => {
                self.namespaces.push(namespace_id.clone());
                self.access.push((Some(grantee.clone()), namespace_id.clone()));
            }
            Command::RespondInvitation { namespace_id, grantee, .. } => {
                self.namespaces.push(namespace_id.clone());
                self.access.push((Some(grantee.clone()), namespace_id.clone()));
            }
            Command::DeleteSharedFolder { namespace_id, .. } => {
                self.namespaces.push(namespace_id.clone());
                self.access.push((None, namespace_id.clone()));
            }
            Command::SetGroupMember { user_id, .. } => self.members.push(user_id.clone()),
            Command::RevokeToken { user_id, token_id } => self.revoked_tokens.push((user_id.clone(), token_id.clone())),
            Command::SetPassword { user_id, ends_sessions: true, .. } => self.sessions_ended.push(user_id.clone()),
            Command::Idempotent { command, .. } | Command::Once { command, .. } => self.add(command),
            Command::CreateUser { .. }
            | Command::CreateToken { .. }
            | Command::PatchProps(_)
            | Command::SetPassword { .. }
            | Command::SetWebhookSecret { .. }
            | Command::CreateLink { .. }
            | Command::RevokeLink { .. }
            | Command::CountLinkDownload { .. }
            | Command::EnsureAdmin { .. }
            | Command::IdempotencyBegin { .. }
            | Command::IdempotencyComplete { .. }
            | Command::IdempotencyRelease { .. }
            | Command::RateCheck { .. }
            | Command::RateSet { .. }
            | Command::RegisterChunk { .. }
            | Command::ExpireVersions { .. }
            | Command::CollectOrphans { .. }
            | Command::CreateJob(_)
            | Command::CreateJobWithin { .. }
            | Command::PatchJob { .. }
            | Command::CancelJob { .. }
            | Command::PauseJob { .. }
            | Command::ResumeJob { .. }
            | Command::RunJobNow { .. }
            | Command::ClaimJobs { .. }
            | Command::StartRun { .. }
            | Command::RenewLease { .. }
            | Command::FinishRun(_)
            | Command::ExpireRuns { .. }
            | Command::PurgeExpired { .. }
            | Command::CreateGroup { .. }
            | Command::Migrate { .. }
            | Command::SetLimits { .. }
            | Command::ClaimAndStartJobs { .. } => {}
        }
    }

    /// Whether nothing a channel listens for happened.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.access.is_empty()
            && self.members.is_empty()
            && self.revoked_tokens.is_empty()
    }
}

/// A commit request, with the ids the leader may need already generated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommit {
    pub namespace_id: String,
    pub path: FilePath,
    pub chunks: Vec<BlockHash>,
    pub size: u64,
    pub mtime_ms: u64,
    /// The file is executable (the owner's execute bit travels with the content). Absent in
    /// entries from before it existed: not executable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    pub base_version: u64,
    /// A tombstone: the file is deleted in this version.
    pub deleted: bool,
    /// Names the committing device in conflicted copies.
    pub device: String,
    /// The file id if the path has no file yet.
    pub new_file_id: String,
    /// The file id of a conflicted copy, if one is made.
    pub copy_file_id: String,
    /// The user committing: apply judges their permission (and which blocks they may name)
    /// in log order. Empty in entries from before sharing, which are applied as before.
    #[serde(default)]
    pub actor_user_id: String,
    /// The actor's quota: each block the commit names that is not yet charged to the actor is
    /// charged now (refused beyond), so whoever references a block pays for it as its
    /// uploader did. `None` (admins, entries from before format 5): nothing is charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<u64>,
}

/// A move request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMove {
    pub namespace_id: String,
    pub from: FilePath,
    pub to: FilePath,
    /// The version of `from` the client saw; a stale base is a conflict.
    pub base_version: u64,
    pub device: String,
    /// The file id at `to` if no file was ever there.
    pub new_file_id: String,
    /// The user moving (see [`FileCommit::actor_user_id`]).
    #[serde(default)]
    pub actor_user_id: String,
}

/// One limit to check: its state key and algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateCheck {
    pub key: String,
    pub algorithm: Algorithm,
}

/// One key's rate-limit state as the leader holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateEntry {
    pub key: String,
    pub state: LimitState,
    /// When the record may be purged: the state is idle by then, and so would be any state
    /// the leader decided after it but did not replicate (see `raft::limiter`).
    pub idle_at_ms: u64,
    /// The term whose leader decides this key in memory.
    pub charged_term: u64,
}

/// What an idempotent command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum IdempotencyOutcome {
    /// First time: the work ran (for `Idempotent`, with this outcome).
    Applied { outcome: Box<Outcome> },
    /// First time (`IdempotencyBegin`): the caller runs the work now.
    Begun,
    /// Already done: the saved result, the work is not run again.
    Replay { result: IdempotencyResult },
    /// A request with this key is still running.
    InProgress { retry_after_ms: u64 },
    /// The key was used with a different request body.
    KeyReused,
}

/// The result of one command, in the order of the batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    UserCreated {
        user_id: String,
        namespace_id: String,
    },
    TokenCreated {
        token_id: String,
    },
    AdminReady {
        user_id: String,
    },
    Rejected(Rejection),
    Idempotency(IdempotencyOutcome),
    /// `Once`: the message was processed before; nothing was applied.
    Duplicate,
    /// `RateCheck`: one decision per check, in order.
    Rate {
        allowed: bool,
        decisions: Vec<Decision>,
    },
    /// Idempotency completion and release, which have no result of their own.
    Done,
    /// Expired guard records removed; `more`: some kind hit the command's bound, so more
    /// may be due.
    Purged {
        records: u64,
        more: bool,
    },
    /// Jobs this claim took, as they are after the claim.
    JobsClaimed {
        jobs: Vec<Job>,
    },
    /// Versions expired / orphan chunks / runs removed; `more`: the command's bound was
    /// reached, so more may be due.
    Collected {
        removed: u64,
        more: bool,
    },
    /// A commit made (or, on an identical retry, had made) this version; `unchanged`: the
    /// content already was the current version's, nothing was written.
    FileCommitted {
        file_id: String,
        version: u64,
        unchanged: bool,
    },
    /// The base version was stale: nothing changed at `path`; the client's content was kept
    /// as a conflicted copy (none for a stale delete).
    FileConflict {
        current_version: u64,
        copy: Option<ConflictedCopy>,
    },
    /// A shared folder was created.
    NamespaceCreated {
        namespace_id: String,
    },
    /// A group was created.
    GroupCreated {
        group_id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictedCopy {
    pub path: FilePath,
    pub file_id: String,
    pub version: u64,
}

/// A command that was applied but changed nothing, and why. Deterministic on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Rejection {
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// A worker's write with a fence that no longer holds the job.
    #[error("stale fence; the job's fence is {current}")]
    StaleFence { current: u64 },
    /// A commit names chunks absent from the chunk index (or that its author may not read).
    #[error("missing chunks")]
    MissingChunks(Vec<BlockHash>),
    /// The actor may see the namespace but not do this (a viewer's change, a non-owner's
    /// ACL change).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The request makes no sense for its target (sharing a personal namespace).
    #[error("invalid: {0}")]
    Invalid(String),
    /// A per-user limit is reached (jobs that may still run, folders, pending invitations):
    /// 409, and curable (the user cancels, deletes, or the grantee answers), so not saved
    /// under an idempotency key.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The block would take its uploader past their storage quota.
    #[error("storage quota exceeded: {stored_bytes} of {quota_bytes} bytes stored, this block is {size} more")]
    QuotaExceeded { stored_bytes: u64, quota_bytes: u64, size: u64 },
    /// The cluster's members changed between placing a block and registering it: placed
    /// again, it registers.
    #[error("the cluster's members changed while the block was stored; store it again")]
    MembersChanged,
}

/// A configuration (membership) entry of the log, by its term and index: where the voters a
/// block was placed on were named. Every node applying an entry holds the same one in effect
/// (the last configuration entry before it in the log), so comparing is deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigId {
    pub term: u64,
    pub index: u64,
}

impl Rejection {
    /// A rejection the client can cure and then retry with the same request (upload the
    /// missing chunks, make room under a limit): not saved under an idempotency key, so the
    /// retry runs.
    pub fn is_curable(&self) -> bool {
        matches!(
            self,
            Rejection::MissingChunks(_)
                | Rejection::LimitReached(_)
                | Rejection::QuotaExceeded { .. }
                | Rejection::MembersChanged
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_depth_counts_open_arrays_and_objects_outside_strings() {
        for (json, depth) in [
            ("1", 0),
            ("[]", 1),
            (r#"{"a":[1,{"b":[]}]}"#, 4),
            (r#"["[[[[", "{\"]"]"#, 1),
            (r#"[["\\"],[]]"#, 2),
            (r#"{"a":{}}{"b":{}}"#, 2),
        ] {
            assert_eq!(json_depth(json.as_bytes()), depth, "{json}");
        }
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        assert_eq!(json_depth(deep.as_bytes()), 300);
    }

    #[test]
    fn the_decoder_takes_exactly_decoder_depth_max() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<serde_json::Value>(&nested(DECODER_DEPTH_MAX)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&nested(DECODER_DEPTH_MAX + 1)).is_err());
    }
}
