//! Share links: anyone holding a link's URL reads one file or one folder without an account.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/links` | a link to a file (`path`) or a folder (`folder`) the caller may change (a viewer may not), with `expiresAt`, `password`, `maxDownloads` if wanted: 201 with its token, shown once |
//! | `GET /v1/links` | the caller's links (never their tokens), paged |
//! | `DELETE /v1/links/{linkId}` | revokes one: 204 |
//! | `GET /s/{token}` | no account: the file, or the folder's listing (HTML, or JSON for `Accept: application/json`) |
//! | `GET /s/{token}/{path}` | a file or a subfolder of a folder link |
//!
//! A token is 256 random bits; the cluster keeps only its hash. A link answers 404 once
//! revoked, or once its creator can no longer change the namespace (removed, or made a
//! viewer), and 410 once expired or its downloads are used up (with a limit, each file a GET
//! sends counts, through the log, so the limit holds across nodes). A password is asked with
//! HTTP Basic authentication (any user name), checked with argon2id in the node's password
//! places; each try is a password attempt of its client, with the link as the name
//! (`login::Attempts`: per address, then a back-off per link and address); a right one is
//! remembered for a while, as WebDAV's. Creating a link with a password hashes it only for a
//! caller under the link cap, as one of its client's attempts.

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use raftbox_storage::files::FolderEntry;
use raftbox_storage::links::Link;
use raftbox_storage::schedule::{format_utc, parse_utc_signed};
use raftbox_storage::{Command, Outcome};
use serde::{Deserialize, Serialize};

use super::files::parse_path;
use super::{new_id, page_limit, read_state, PageQuery, LISTING_WORK_MAX, PAGE_DEFAULT, PAGE_MAX};
use crate::access;
use crate::auth::{generate_token, hash_token, Principal};
use crate::front_door::Client;
use crate::{json, ApiError, AppState};

/// Links one user may have at once.
pub const LINKS_PER_USER_MAX: u32 = 1_000;
/// The longest a link may live.
pub const LINK_TTL_MS_MAX: u64 = 366 * 24 * 3_600_000;
/// The most downloads a link may allow.
pub const MAX_DOWNLOADS_MAX: u64 = 1_000_000;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CreateRequest {
    /// The file to share (give this or `folder`, not both: 422).
    #[schema(value_type = Option<crate::schema::FilePath>)]
    path: Option<String>,
    /// The folder to share, everything under it (`/` for the whole namespace).
    #[schema(value_type = Option<crate::schema::LinkFolderPath>)]
    folder: Option<String>,
    /// Default: the caller's personal namespace.
    namespace_id: Option<String>,
    /// When the link stops working: in the future, at most a year ahead (else 422).
    #[schema(value_type = Option<crate::schema::UtcTimestamp>)]
    expires_at: Option<String>,
    /// A password the link asks for.
    #[schema(min_length = 8, max_length = 1024)]
    password: Option<String>,
    /// Files the link may send, in all (1 to 1,000,000).
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(default, deserialize_with = "crate::json::optional_integer")]
    max_downloads: Option<u64>,
}

/// A link as its creator sees it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkView {
    pub link_id: String,
    pub namespace_id: String,
    /// Who made it.
    #[serde(default)]
    pub creator_user_id: String,
    /// The file, or the folder, shared.
    pub path: String,
    pub folder: bool,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub max_downloads: Option<u64>,
    pub downloads: u64,
    pub password_protected: bool,
    /// Still serving: not expired and downloads left (a creator who lost access to the
    /// namespace also stops it, which this does not show).
    pub active: bool,
}

/// A new link: its token (shown only now), where it answers, and the link.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedLink {
    pub token: String,
    /// The link's path on any node: `/s/{token}`.
    pub url: String,
    pub link: LinkView,
}

super::page! {
    /// A page of the caller's links (never their tokens).
    LinkList { links: LinkView }
}

/// An entry of a folder shared by a link; `url` is its path under `/s/`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LinkEntry {
    File { name: String, size: u64, url: String },
    Folder { name: String, url: String },
}

/// A folder shared by a link, as JSON (`Accept: application/json`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkFolder {
    /// The folder, as the link names it.
    pub folder: String,
    pub entries: Vec<LinkEntry>,
    /// Present when more may follow: the `pageToken` of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub next_page_token: Option<String>,
}

fn view(link: &Link, now: u64) -> LinkView {
    LinkView {
        link_id: link.id.clone(),
        namespace_id: link.namespace_id.clone(),
        creator_user_id: link.creator_user_id.clone(),
        path: link.path.clone(),
        folder: link.folder,
        created_at: format_utc(link.created_ms),
        expires_at: link.expires_ms.map(format_utc),
        max_downloads: link.max_downloads,
        downloads: link.downloads,
        password_protected: link.password_hash.is_some(),
        active: !link.expired(now) && !link.used_up(),
    }
}

/// `/` or a folder path without its trailing `/`.
fn parse_folder(text: &str) -> Result<String, ApiError> {
    let trimmed = text.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".into());
    }
    Ok(parse_path(trimmed)?.as_str().to_owned())
}

/// `POST /v1/links`.
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    client: Option<axum::Extension<Client>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let client = client.map_or(Client::of(std::net::Ipv6Addr::UNSPECIFIED.into()), |c| c.0);
    let request: CreateRequest = json::parse(&body)?;
    let namespace_id = access::resolve(&principal, request.namespace_id.as_deref());
    let (path, folder) = match (&request.path, &request.folder) {
        (Some(path), None) => (parse_path(path)?.as_str().to_owned(), false),
        (None, Some(folder)) => (parse_folder(folder)?, true),
        _ => return Err(ApiError::Unprocessable("give a file's path or a folder, one of the two".into())),
    };
    let now = state.node.cluster_now_ms();
    let expires_ms = match &request.expires_at {
        None => None,
        Some(text) => {
            let at = parse_utc_signed(text).map_err(|e| ApiError::BadRequest(format!("expiresAt: {e}")))?;
            let at = u64::try_from(at).unwrap_or(0);
            if at <= now || at - now > LINK_TTL_MS_MAX {
                return Err(ApiError::Unprocessable("expiresAt is in the future, at most a year ahead".into()));
            }
            Some(at)
        }
    };
    if request.max_downloads.is_some_and(|n| !(1..=MAX_DOWNLOADS_MAX).contains(&n)) {
        return Err(ApiError::BadRequest(format!("maxDownloads is 1 to {MAX_DOWNLOADS_MAX}")));
    }
    // Publishing is a change: a viewer of a shared folder may not open it to everyone.
    if access::read(&state, &principal, &namespace_id).await? == raftbox_storage::records::Role::Viewer {
        return Err(ApiError::Forbidden("a viewer cannot share a folder's files by link; an editor can".into()));
    }
    if !folder {
        match state.node.state().file_at(&namespace_id, &path)? {
            Some((file, _)) if !file.deleted => {}
            _ => return Err(ApiError::NotFound(format!("no file at {path}"))),
        }
    }
    // Hashing is the expensive part: only for a caller under the link cap, and counted as one
    // of the client's password attempts.
    let password_hash = match request.password {
        Some(password) => {
            let links = state.node.state().links_count(&principal.user.id)?;
            if links >= u64::from(LINKS_PER_USER_MAX) {
                return Err(ApiError::Conflict(format!(
                    "you have {links} share links, the most allowed; revoke some first"
                )));
            }
            state.passwords.attempts.from_client(client)?;
            Some(super::login::hash(&state, password).await?)
        }
        None => None,
    };
    let token = format!("rbxl_{}", generate_token().trim_start_matches(crate::auth::TOKEN_PREFIX));
    let link = Link {
        id: new_id(),
        token_hash: hash_token(&token),
        creator_user_id: principal.user.id.clone(),
        namespace_id,
        path,
        folder,
        created_ms: now,
        expires_ms,
        password_hash,
        max_downloads: request.max_downloads,
        downloads: 0,
    };
    let command = Command::CreateLink { link: Box::new(link.clone()), links_max: LINKS_PER_USER_MAX };
    if let Outcome::Rejected(rejection) = state.node.write(command).await? {
        return Err(rejection.into());
    }
    let url = format!("/s/{token}");
    Ok((StatusCode::CREATED, Json(CreatedLink { link: view(&link, now), token, url })).into_response())
}

/// `GET /v1/links`: the caller's links, by id.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<PageQuery>,
) -> Result<Json<LinkList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    crate::access::barrier(&state, &principal).await?;
    let (user_id, after) = (principal.user.id.clone(), query.page_token.clone());
    let found = read_state(&state, move |sm| Ok(sm.links_page(&user_id, after.as_deref(), limit + 1)?)).await?;
    let now = state.node.cluster_now_ms();
    let links = found.iter().take(limit).map(|l| view(l, now)).collect();
    Ok(Json(LinkList { links, next_page_token: (found.len() > limit).then(|| found[limit - 1].id.clone()) }))
}

/// `DELETE /v1/links/{linkId}`: the link stops working on every node as each applies this.
pub async fn revoke(
    State(state): State<AppState>,
    principal: Principal,
    Path(link_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let command = Command::RevokeLink { actor_user_id: principal.user.id.clone(), link_id, namespace_id: None };
    match state.node.write(command).await? {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// The cluster format from which an owner lists and revokes the links into their namespaces.
pub const OWNER_LINKS_FORMAT: u32 = raftbox_storage::links::NAMESPACE_INDEX_FORMAT;

/// `GET /v1/namespaces/{namespaceId}/links`: every link into a namespace the caller owns,
/// by id, whoever made it.
pub async fn list_in_namespace(
    State(state): State<AppState>,
    principal: Principal,
    Path(namespace_id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Json<LinkList>, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    access::own(&state, &principal, &namespace_id).await?;
    if state.node.cluster_format() < OWNER_LINKS_FORMAT {
        return Err(ApiError::Conflict(format!(
            "links are listed by folder from data format {OWNER_LINKS_FORMAT}, once every node runs this release"
        )));
    }
    let after = query.page_token.clone();
    let found =
        read_state(&state, move |sm| Ok(sm.namespace_links_page(&namespace_id, after.as_deref(), limit + 1)?)).await?;
    let now = state.node.cluster_now_ms();
    let links = found.iter().take(limit).map(|l| view(l, now)).collect();
    Ok(Json(LinkList { links, next_page_token: (found.len() > limit).then(|| found[limit - 1].id.clone()) }))
}

/// `DELETE /v1/namespaces/{namespaceId}/links/{linkId}`: the owner revokes any link into
/// their namespace (the ownership is judged in apply, in log order).
pub async fn revoke_in_namespace(
    State(state): State<AppState>,
    principal: Principal,
    Path((namespace_id, link_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let command =
        Command::RevokeLink { actor_user_id: principal.user.id.clone(), link_id, namespace_id: Some(namespace_id) };
    match state.node.write(command).await? {
        Outcome::Rejected(rejection) => Err(rejection.into()),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// `GET /s/{token}`.
pub async fn open(
    State(state): State<AppState>,
    Path(token): Path<String>,
    Query(query): Query<PageQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, _) = request.into_parts();
    serve(&state, &token, "", &query, &parts).await
}

/// `GET /s/{token}/{path}`.
pub async fn open_under(
    State(state): State<AppState>,
    Path((token, below)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, _) = request.into_parts();
    serve(&state, &token, &below, &query, &parts).await
}

fn gone(why: &str) -> ApiError {
    ApiError::Gone(why.into())
}

fn no_link() -> ApiError {
    ApiError::NotFound("no such link".into())
}

async fn serve(
    state: &AppState,
    token: &str,
    below: &str,
    query: &PageQuery,
    request: &axum::http::request::Parts,
) -> Result<Response, ApiError> {
    let (method, headers) = (&request.method, &request.headers);
    let token_hash = hash_token(token);
    // A revocation acknowledged anywhere is seen here.
    state.node.read_barrier().await?;
    let sm = state.node.state();
    let link = sm.link(&token_hash)?.ok_or_else(no_link)?;
    // A link serves while its creator may still change what it shares (a viewer could not
    // have made it): a creator demoted or removed ends it.
    if !sm.role(&link.creator_user_id, &link.namespace_id)?.is_some_and(|role| role.can_write()) {
        return Err(no_link());
    }
    if link.expired(state.node.expiry_now_ms()) {
        return Err(gone("this link has expired"));
    }
    if let Some(stored) = &link.password_hash {
        let client = request.extensions.get::<Client>().copied();
        if let Some(refused) = check_password(state, &link, stored, headers, client).await? {
            return Ok(refused);
        }
    }
    match link_target(&link.path, link.folder, below)? {
        Target::File(path) => {
            let (file, version) = match sm.file_at(&link.namespace_id, &path)? {
                Some((file, version)) if !file.deleted => (file, version),
                _ => return Err(ApiError::NotFound(format!("no file at {path} in this link"))),
            };
            // Counted only where a limit needs the count, and only for a GET: a HEAD (a link
            // preview) sends nothing.
            if link.max_downloads.is_some() && *method == axum::http::Method::GET {
                match state.node.write(Command::CountLinkDownload { token_hash }).await? {
                    Outcome::Rejected(raftbox_storage::Rejection::LimitReached(why)) => return Err(gone(&why)),
                    Outcome::Rejected(rejection) => return Err(rejection.into()),
                    _ => {}
                }
            }
            let mut response =
                super::content::file_response(state, &format!("{}-{}", file.id, version.version), &version);
            let name = path.rsplit('/').next().unwrap_or("file");
            if let Ok(disposition) = HeaderValue::try_from(format!("attachment; filename*=UTF-8''{}", encode(name))) {
                response.headers_mut().insert(header::CONTENT_DISPOSITION, disposition);
            }
            Ok(response)
        }
        Target::Folder(folder, relative) => listing(state, &link, token, &folder, &relative, query, headers).await,
    }
}

/// What a request through a link names in the namespace.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    File(String),
    /// The folder's path in the namespace, and as the link names it (`""` or `sub/`).
    Folder(String, String),
}

/// What `/s/{token}/{below}` names through a link to `link_path` (a folder link, or a file's):
/// the link's file, or a file or folder at or under its folder, never anything beside it
/// (`below` is a path of components, none `.` or `..`: `FilePath`'s rules). 404 otherwise.
pub fn link_target(link_path: &str, folder: bool, below: &str) -> Result<Target, ApiError> {
    match (folder, below) {
        (false, "") => Ok(Target::File(link_path.to_owned())),
        (false, _) => Err(no_link()),
        (true, below) => {
            let joined = format!("{}/{}", link_path.trim_end_matches('/'), below);
            if below.is_empty() || below.ends_with('/') {
                Ok(Target::Folder(parse_folder(&joined)?, below.to_owned()))
            } else {
                Ok(Target::File(parse_path(&joined)?.as_str().to_owned()))
            }
        }
    }
}

/// 401 asking for the link's password, 429 past the tries, or `None`: the password is right.
async fn check_password(
    state: &AppState,
    link: &Link,
    stored: &str,
    headers: &HeaderMap,
    client: Option<Client>,
) -> Result<Option<Response>, ApiError> {
    let ask = || {
        let mut response = ApiError::Unauthenticated("this link asks for a password".into()).into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"raftbox share link\", charset=\"UTF-8\""),
        );
        response
    };
    let Some(given) = crate::auth::basic_password(headers) else { return Ok(Some(ask())) };
    // A browser sends the password with every request: one right lately is taken as checked.
    let remembered = state.passwords.checked_key(&link.id, &given, stored);
    if state.passwords.checked_lately(&remembered) {
        return Ok(None);
    }
    // Tries are a client's password attempts, on the link as a name (see `login::Attempts`).
    let client = client.unwrap_or(Client::of(std::net::Ipv6Addr::UNSPECIFIED.into()));
    let name = format!("\u{0}link:{}", link.id);
    let attempts = &state.passwords.attempts;
    attempts.from_client(client)?;
    attempts.on_name(&name, client)?;
    let right = super::login::verify(state, Some(stored.to_owned()), given).await?;
    attempts.record(&name, client, right);
    match right {
        true => {
            state.passwords.remember_checked(remembered);
            Ok(None)
        }
        false => Ok(Some(ask())),
    }
}

/// A folder's entries through a folder link: JSON for `Accept: application/json`, else a page.
async fn listing(
    state: &AppState,
    link: &Link,
    token: &str,
    folder: &str,
    relative: &str,
    query: &PageQuery,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let limit = page_limit(query.limit, PAGE_DEFAULT, PAGE_MAX)?;
    let prefix = if folder == "/" { "/".to_owned() } else { format!("{folder}/") };
    let (namespace_id, listed, after) = (link.namespace_id.clone(), prefix.clone(), query.page_token.clone());
    let page = read_state(state, move |sm| match super::files::folder_position(&listed, after.as_deref()) {
        Some(after) => Ok(sm.list_folder(&namespace_id, &listed, after, limit, LISTING_WORK_MAX)?),
        None => Ok(raftbox_storage::files::FolderPage::default()),
    })
    .await?;
    let base = format!("/s/{token}/{}", relative.split('/').map(encode).collect::<Vec<_>>().join("/"));
    let entries: Vec<LinkEntry> = page
        .entries
        .into_iter()
        .filter_map(|entry| match entry {
            FolderEntry::Folder { name } => Some(LinkEntry::Folder { url: format!("{base}{}/", encode(&name)), name }),
            FolderEntry::File { name, .. } if name == crate::dav::FOLDER_MARKER => None,
            FolderEntry::File { name, version, .. } => {
                Some(LinkEntry::File { url: format!("{base}{}", encode(&name)), name, size: version.size })
            }
        })
        .collect();
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json"));
    if wants_json {
        let body = LinkFolder { folder: format!("/{relative}"), entries, next_page_token: page.next };
        return Ok(Json(body).into_response());
    }
    let mut html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title></head><body>\
         <h1>{title}</h1><ul>",
        title = escape(&format!("/{relative}"))
    );
    for entry in &entries {
        let (url, shown) = match entry {
            LinkEntry::Folder { name, url } => (url, format!("{name}/")),
            LinkEntry::File { name, url, .. } => (url, name.clone()),
        };
        html.push_str(&format!("<li><a href=\"{}\">{}</a></li>", escape(url), escape(&shown)));
    }
    html.push_str("</ul>");
    if let Some(next) = &page.next {
        html.push_str(&format!("<p><a href=\"{}?pageToken={}\">More</a></p>", escape(&base), encode(next)));
    }
    html.push_str("</body></html>");
    let mut response = html.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    );
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // This node's own page, shown (sandboxed, as every answer here): not a user's file.
    headers.insert(header::CONTENT_DISPOSITION, HeaderValue::from_static("inline"));
    Ok(response)
}

/// Percent-encodes all but RFC 3986's unreserved characters (a path segment, a filename*).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_for_urls_and_escaped_for_pages() {
        assert_eq!(encode("a b/ü?.txt"), "a%20b%2F%C3%BC%3F.txt");
        assert_eq!(escape("<img src=x onerror='1'>&"), "&lt;img src=x onerror=&#39;1&#39;&gt;&amp;");
    }
}
