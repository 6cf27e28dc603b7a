//! Fuzz targets: each parser of untrusted bytes the API has, as a function of bytes that must
//! never panic, abort or overflow a stack, and that holds the parser to its promises (its
//! bounds, its round trips, its agreement with the library that reads after it).
//!
//! Two drivers run them (`docs/testing.md`, "Fuzzing"): `api/tests/it/fuzz_targets.rs`, in
//! `cargo test` on stable (every seed, then seeded mutations for a bounded time: the CI
//! smoke), and `api/fuzz/` with `cargo fuzz` (libFuzzer, coverage-guided; `scripts/fuzz`).
//! Both start from the seeds in `api/fuzz/seeds/<target>/`.

use std::str;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::dav::request;

/// Every target, by name (the name of its seed folder and of its `cargo fuzz` target).
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("xml_body", xml_body),
    ("destination", destination),
    ("dav_request", dav_request),
    ("json_body", json_body),
    ("paths", paths),
    ("share_link", share_link),
    ("cursor", cursor),
    ("credentials", credentials),
    ("idempotency_key", idempotency_key),
    ("upload", upload),
    ("schedule", schedule),
];

/// The deepest element of `tree`, counted without recursion.
fn tree_depth(tree: &xmltree::Element) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(tree, 1usize)];
    while let Some((element, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        stack.extend(element.children.iter().filter_map(|n| n.as_element()).map(|e| (e, depth + 1)));
    }
    deepest
}

/// A WebDAV XML body: refused past its depth, or parsed by the library's tree builder
/// (`xmltree`, recursive) to a tree no deeper than the bound.
pub fn xml_body(data: &[u8]) {
    let depth = request::xml_depth(data, request::XML_DEPTH_MAX);
    match request::check_xml(data) {
        Err(_) => assert!(depth.is_none(), "a body within the depth was refused"),
        Ok(()) => {
            assert!(depth.is_some_and(|d| d <= request::XML_DEPTH_MAX));
            if let Ok(tree) = xmltree::Element::parse(data) {
                assert!(tree_depth(&tree) <= request::XML_DEPTH_MAX, "the tree is deeper than was counted");
            }
        }
    }
}

/// `Destination`: what [`request::destination`] takes reads back as itself from its
/// canonical form, and the library's own reading of that form is the same path.
pub fn destination(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let Ok(path) = request::destination(&value) else { return };
    let canonical = request::canonical(&path).expect("a canonical form");
    let again = request::destination(&canonical).expect("a canonical destination reads back");
    assert_eq!(again.with_prefix().as_bytes(), path.with_prefix().as_bytes());
    // dav-server reads a Destination starting with `/` as it is, then normalizes it.
    let text = canonical.to_str().expect("ASCII");
    assert!(text.starts_with(request::PREFIX) && !text.contains('\\'));
    let mut library = dav_server::davpath::DavPath::new(text).expect("the library reads the canonical form");
    library.set_prefix(request::PREFIX).expect("under the prefix");
    assert_eq!(library.as_bytes(), path.as_bytes(), "the library reads another path than was checked");
}

/// Reads `data` as fields separated by `\n`: a fuzzer's way to make several strings.
fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |b| *b == b'\n').collect();
    out.resize(n, b"");
    out
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
}

/// A whole WebDAV request (method, path, the headers the library parses, body) through the
/// checks this node makes first, then, if they pass, through `dav-server` itself over an
/// in-memory file system: its header parsers (`If`, `Depth`, `Overwrite`, `Timeout`,
/// `Range`, `Lock-Token`, `Destination`) and XML handling must survive it.
pub fn dav_request(data: &[u8]) {
    const METHODS: [&str; 12] =
        ["PROPFIND", "PROPPATCH", "LOCK", "UNLOCK", "MOVE", "COPY", "DELETE", "MKCOL", "GET", "PUT", "HEAD", "OPTIONS"];
    const HEADERS: [&str; 8] =
        ["destination", "if", "depth", "overwrite", "timeout", "range", "lock-token", "if-match"];
    let parts = fields(data, HEADERS.len() + 3);
    let method = METHODS[usize::from(parts[0].first().copied().unwrap_or(0)) % METHODS.len()];
    let path = format!("/dav/{}", String::from_utf8_lossy(parts[1]).replace(['\r', '\n', ' '], "%20"));
    let mut builder = axum::http::Request::builder().method(method).uri(path.as_str());
    for (name, value) in HEADERS.iter().zip(&parts[2..]) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            if !value.is_empty() {
                builder = builder.header(HeaderName::from_static(name), value);
            }
        }
    }
    let body = parts[HEADERS.len() + 2].to_vec();
    let Ok(request) = builder.body(axum::body::Body::from(body)) else { return };
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let Ok((request, destination)) = crate::dav::checked(request).await else { return };
            // The node refuses a DELETE, MOVE or COPY of or onto a namespace's root before the
            // library sees it (the library's in-memory file system panics on a DELETE of its
            // root, which the target found).
            let root = |path: &dav_server::davpath::DavPath| path.as_bytes() == b"/";
            let changes = matches!(method, "DELETE" | "MOVE" | "COPY");
            let target = dav_server::davpath::DavPath::new(request.uri().path()).ok().and_then(|mut p| {
                p.set_prefix(request::PREFIX).ok()?;
                Some(p)
            });
            if changes && (target.as_ref().is_none_or(root) || destination.as_ref().is_some_and(root)) {
                return;
            }
            let handler = dav_server::DavHandler::builder()
                .filesystem(dav_server::memfs::MemFs::new())
                .locksystem(dav_server::memls::MemLs::new())
                .strip_prefix(request::PREFIX)
                .build_handler();
            let response = handler.handle(request).await;
            let _ = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 20).await;
        })
    });
}

/// A JSON request body: refused past its depth, or read (as a value and as requests the
/// API takes) without panicking.
pub fn json_body(data: &[u8]) {
    let body = Bytes::copy_from_slice(data);
    if crate::json::parse::<serde_json::Value>(&body).is_ok() {
        assert!(raftbox_storage::command::json_depth(data) <= crate::json::JSON_DEPTH_MAX);
    }
    let _ = crate::json::parse::<crate::routes::files::CommitRequest>(&body);
    let _ = crate::json::parse::<crate::routes::files::MoveRequest>(&body);
    let _ = crate::json::parse::<crate::routes::sync::SyncQuery>(&body);
    let _ = crate::json::parse::<crate::routes::jobs::CreateRequest>(&body);
    let _ = crate::json::parse::<crate::routes::jobs::PatchRequest>(&body);
    if let Ok(value) = crate::json::parse::<serde_json::Value>(&body) {
        let _ = crate::routes::files::parse_mtime(&value);
        if let Some(mtime) = value.get("mtime") {
            let _ = crate::routes::files::parse_mtime(mtime);
        }
    }
}

/// A file or folder path: a path taken is one the namespace can hold (no empty, `.` or
/// `..` component, within its byte bounds) and reads back as itself.
pub fn paths(data: &[u8]) {
    let Ok(text) = str::from_utf8(data) else { return };
    if let Ok(path) = raftbox_storage::paths::FilePath::parse(text) {
        let s = path.as_str();
        assert!(s.starts_with('/') && s.len() <= raftbox_storage::paths::PATH_BYTES_MAX);
        assert!(s[1..].split('/').all(|c| !c.is_empty() && c != "." && c != ".."), "{s:?}");
        assert_eq!(raftbox_storage::paths::FilePath::parse(s).expect("reads back").as_str(), s);
        let _ = path.folder();
        let _ = path.conflicted_copy(text);
    }
    let _ = crate::routes::files::folder_position("/a/", Some(text));
    let _ = crate::routes::seq_token(text);
    let _ = raftbox_storage::paths::device_label(text);
}

/// `/s/{token}/{path}`: whatever follows a folder link's token names that folder or
/// something under it, never anything beside it.
pub fn share_link(data: &[u8]) {
    let parts = fields(data, 2);
    let (Ok(link), Ok(below)) = (str::from_utf8(parts[0]), str::from_utf8(parts[1])) else { return };
    let Ok(link) = raftbox_storage::paths::FilePath::parse(link) else { return };
    let base = link.as_str();
    let within = |path: &str| path == base || path.starts_with(&format!("{base}/"));
    match crate::routes::links::link_target(base, true, below) {
        Ok(crate::routes::links::Target::File(path)) | Ok(crate::routes::links::Target::Folder(path, _)) => {
            assert!(within(&path), "{below:?} under {base:?} names {path:?}");
        }
        Err(_) => {}
    }
    if let Ok(target) = crate::routes::links::link_target(base, false, below) {
        assert_eq!(target, crate::routes::links::Target::File(base.to_owned()));
        assert!(below.is_empty());
    }
}

/// A sync cursor or a page token.
pub fn cursor(data: &[u8]) {
    let Ok(text) = str::from_utf8(data) else { return };
    if let Ok(Some(cursor)) = crate::routes::sync::parse_cursor(text) {
        assert!(cursor.len() <= raftbox_storage::sharing::LISTED_NAMESPACES_MAX);
    }
    let _ = crate::routes::jobs::parse_page_token(text);
}

/// `Authorization` (bearer or Basic, a user's password or a token) and `X-Forwarded-For`.
pub fn credentials(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let mut headers = HeaderMap::new();
    headers.insert(axum::http::header::AUTHORIZATION, value.clone());
    if let Ok(Some(crate::auth::Credentials::Basic { name, secret })) = crate::auth::credentials(&headers) {
        assert!(!name.contains(':'), "a Basic name holds a colon");
        let _ = secret;
    }
    let _ = crate::auth::bearer_hash(&headers);
    headers.insert("x-forwarded-for", value);
    let config = crate::HttpConfig {
        trusted_proxies: vec!["127.0.0.0/8".parse().expect("a net")],
        ..crate::HttpConfig::default()
    };
    let in_flight = crate::front_door::InFlight::new(&config);
    let _ = in_flight.client_of(std::net::Ipv4Addr::LOCALHOST.into(), &headers);
}

/// `Idempotency-Key`.
pub fn idempotency_key(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    if let Ok(key) = crate::idempotency::parse_key(&value) {
        assert!(key.chars().count() <= crate::idempotency::KEY_CHARS_MAX);
    }
}

/// A whole file's body: cut with the writers' content-defined sizes, every piece within
/// the block bounds and together the body itself; a block body within its bound.
pub fn upload(data: &[u8]) {
    use raftbox_storage::blocks::{BlockReceiver, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES, CHUNK_MIN_BYTES};
    let cdc = fastcdc::v2020::FastCDC::new(data, CHUNK_MIN_BYTES, CHUNK_AVG_BYTES, CHUNK_MAX_BYTES);
    let mut covered = 0usize;
    for chunk in cdc {
        assert_eq!(chunk.offset, covered, "pieces leave a gap");
        assert!(chunk.length <= CHUNK_MAX_BYTES as usize);
        covered += chunk.length;
    }
    assert_eq!(covered, data.len());
    let mut receiver = BlockReceiver::with_capacity(data.len());
    for piece in data.chunks(data.first().map_or(1, |b| usize::from(*b).max(1))) {
        if receiver.push(piece).is_err() {
            return;
        }
    }
    let block = receiver.hashed();
    assert_eq!(block.len(), data.len());
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(data) {
        headers.insert(axum::http::header::CONTENT_LENGTH, value);
        let _ = crate::routes::blocks::declared_length(&headers);
    }
}

/// A job's schedule: a cron expression and a time zone, a timestamp.
pub fn schedule(data: &[u8]) {
    let parts = fields(data, 2);
    let (Ok(expr), Ok(zone)) = (str::from_utf8(parts[0]), str::from_utf8(parts[1])) else { return };
    if let Ok(cron) = raftbox_storage::schedule::CronSchedule::parse(expr, zone) {
        let _ = cron.next_after(0);
        let _ = cron.next_after(u64::MAX / 2);
    }
    let _ = raftbox_storage::schedule::parse_utc_signed(expr);
    let _ = raftbox_storage::schedule::parse_timestamp(expr);
}
