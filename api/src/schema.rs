//! The constrained strings and numbers of the API, as the description states them: one type
//! per kind of value, each with the JSON Schema of exactly what the server accepts, named by
//! the requests that take one (`#[schema(value_type = schema::FilePath)]`,
//! `("hash" = schema::BlockHash, Path)`). The checks themselves stay where they were
//! (`FilePath::parse`, `json::name`, …); `api/tests/it/openapi.rs` holds each pattern to its
//! check on examples from both sides.
//!
//! Lengths in JSON Schema count characters where the server counts UTF-8 bytes for paths
//! (255 per component, 4,096 in all): the patterns state the byte limits as character
//! limits, exact for ASCII names, and the descriptions say so.

use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::RefOr;

/// Characters that are never in a path, a name or a device: `/` and the control characters
/// (Unicode Cc, as Rust's `char::is_control`).
const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";

fn text(description: &str, pattern: String, max_length: Option<usize>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .pattern(Some(pattern))
        .max_length(max_length)
        .into()
}

/// One path component: not empty, `.` or `..`, no `/` or control character, at most 255
/// characters.
fn component() -> String {
    let any = format!("[^/{CONTROL}]");
    let not_dot = format!("[^/.{CONTROL}]");
    format!(r"(?:{not_dot}{any}{{0,254}}|\.{not_dot}{any}{{0,253}}|\.\.{any}{{1,253}})")
}

macro_rules! described {
    ($(#[$doc:meta])* $name:ident => $schema:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

described! {
    /// A file's path in a namespace.
    FilePath => text(
        "A file's absolute path: `/` then components separated by `/`, none empty, `.` or `..`, \
         no control characters; at most 255 bytes a component and 4,096 in all (UTF-8).",
        format!("^(?:/{})+$", component()),
        Some(raftbox_storage::paths::PATH_BYTES_MAX),
    )
}

described! {
    /// A folder's path in a namespace, ending in `/` (`/` is the root).
    FolderPath => text(
        "A folder: `/`, or an absolute path ending in `/` (the components as a file's path).",
        format!("^(?:/{})*/$", component()),
        Some(raftbox_storage::paths::PATH_BYTES_MAX + 1),
    )
}

described! {
    /// A folder to share by link: `/`, or a folder's path with or without its last `/`.
    LinkFolderPath => text(
        "A folder: `/`, or an absolute path (a trailing `/` may follow).",
        format!("^(?:/{})*/?$", component()),
        Some(raftbox_storage::paths::PATH_BYTES_MAX + 1),
    )
}

described! {
    /// A block's BLAKE3 hash.
    BlockHash => text("A BLAKE3-256 hash: 64 lowercase hex digits.", "^[0-9a-f]{64}$".into(), None)
}

described! {
    /// A display name: of a user, a token, a group, a shared folder.
    DisplayName => text(
        "1 to 64 characters, no control characters, not only white space.",
        format!(r"^[^{CONTROL}]*[^\s{CONTROL}][^{CONTROL}]*$"),
        Some(crate::json::NAME_CHARS_MAX),
    )
}

described! {
    /// A device's name in conflicted copies (`X-Device-Id`).
    DeviceName => text(
        "1 to 64 visible ASCII characters (spaces inside), no `/`.",
        "^[!-.0-~](?:[ -.0-~]{0,62}[!-.0-~])?$".into(),
        None,
    )
}

described! {
    /// An `Idempotency-Key`.
    IdempotencyKey => text(
        "1 to 255 visible ASCII characters (spaces inside): the same key and body answer the \
         first answer again (DESIGN.md §7).",
        "^[!-~](?:[ -~]{0,253}[!-~])?$".into(),
        None,
    )
}

described! {
    /// A sync cursor: `0`, or one a sync page answered.
    Cursor => text(
        "`0` for the start, else the `cursor` of a sync page (base64url). A cursor the server \
         cannot serve any more, or cannot read, is 410 `cursor-reset`: sync again from 0.",
        "^(?:0|[A-Za-z0-9_-]+)$".into(),
        None,
    )
}

described! {
    /// A page token that is a sequence number.
    SeqPageToken => text(
        "The `nextPageToken` of the page before (a sequence number).",
        "^[0-9]{1,19}$".into(),
        None,
    )
}

described! {
    /// A page token of the job list: the creation time and id of the last job shown.
    JobPageToken => text(
        "The `nextPageToken` of the page before (`{createdMs}:{jobId}`).",
        "^[0-9]{1,19}:".into(),
        None,
    )
}

/// The latest modification time a file may have: the end of year 9999, in Unix ms.
pub const MTIME_MS_MAX: u64 = 253_402_300_799_999;

described! {
    /// A modification time: RFC 3339, or Unix milliseconds.
    Mtime => utoipa::openapi::schema::OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::DateTime)))
                .description(Some("RFC 3339 (before 1970 is 422)")),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .maximum(Some(MTIME_MS_MAX as f64))
                .description(Some("Unix milliseconds")),
        )
        .description(Some("A modification time: RFC 3339, or Unix milliseconds."))
        .into()
}

described! {
    /// An RFC 3339 timestamp in UTC.
    UtcTimestamp => ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::DateTime)))
        .pattern(Some("(?:[Zz]|[+-]00:00)$"))
        .description(Some("An RFC 3339 timestamp in UTC (`Z`)."))
        .into()
}

described! {
    /// The type of a job a user may create.
    JobType => ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(crate::routes::jobs::USER_JOB_TYPES))
        .description(Some("`webhook` calls `target`; `noop`, `fail` and `sleep` are built-in tasks."))
        .into()
}

described! {
    /// A job's schedule as a client writes it.
    Schedule => {
        let once = ObjectBuilder::new()
            .property("runAt", UtcTimestamp::schema())
            .required("runAt")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("Once, at `runAt` (a time before 1970 is 422)."));
        let cron = ObjectBuilder::new()
            .property("cron", ObjectBuilder::new().schema_type(Type::String).description(Some(
                "A cron expression: 5 fields, or 6 with seconds first (one the server cannot \
                 read, or that never fires, is 422).",
            )))
            .required("cron")
            .property("timezone", ObjectBuilder::new().schema_type(Type::String).description(Some(
                "An IANA time zone, e.g. `Europe/Paris` (an unknown one is 422).",
            )))
            .required("timezone")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)));
        utoipa::openapi::schema::OneOfBuilder::new().item(once).item(cron).into()
    }
}

described! {
    /// A change to a job's schedule: a JSON merge patch (RFC 7396) of [`Schedule`].
    SchedulePatch => {
        let nullable = |description: &str| {
            ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::SchemaType::from_iter([Type::String, Type::Null]))
                .description(Some(description))
        };
        ObjectBuilder::new()
            .property("runAt", nullable("A new time, RFC 3339 in UTC: the job runs once (it was cron: 422 if `cron` stays)."))
            .property("cron", nullable("A new cron expression (the job was one-off: it becomes cron, `timezone` needed)."))
            .property("timezone", nullable("A new IANA time zone for the cron expression."))
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("Merged into the schedule (RFC 7396): `null` removes a key; what results must be a `Schedule` the server can take (else 422)."))
            .into()
    }
}
