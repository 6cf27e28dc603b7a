//! The one client of the harness: every request goes through [`send`], which classifies its
//! answer as acknowledged, rejected or *unknown* (a timeout, a lost connection or a 5xx), and
//! the request helpers built on it; [`NodeView`] is a node's `/v1/cluster` answer.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::*;

// ---------------------------------------------------------------------------------------------
// Client operations

/// What a client knows about one operation.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// 2xx: the operation took effect. The parsed JSON body (`null` when empty).
    Ok(Value),
    /// 4xx: the node refused the operation; it did not take effect.
    Rejected(u16, String),
    /// Timeout, connection error or 5xx: the operation may or may not have taken effect.
    Unknown(String),
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }

    pub fn is_rejected(&self) -> bool {
        matches!(self, Outcome::Rejected(..))
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown(_))
    }

    pub fn body(&self) -> Option<&Value> {
        match self {
            Outcome::Ok(body) => Some(body),
            _ => None,
        }
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timeout"
    } else if err.is_connect() {
        "connect"
    } else {
        "transport"
    };
    format!("{kind}: {}", error_chain(err))
}

/// Sends a request and classifies the answer. `Err` only for a protocol violation: a 2xx
/// whose body is not JSON.
pub async fn send(request: reqwest::RequestBuilder) -> Result<Outcome> {
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => return Ok(Outcome::Unknown(describe(&err))),
    };
    let status = response.status();
    let body = match response.text().await {
        Ok(body) => body,
        Err(err) => return Ok(Outcome::Unknown(format!("{status}, body lost: {}", describe(&err)))),
    };
    if status.is_success() {
        let value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body)
                .with_context(|| format!("parse the JSON body of a {status} answer: {body:?}"))?
        };
        Ok(Outcome::Ok(value))
    } else if status.is_client_error() {
        Ok(Outcome::Rejected(status.as_u16(), body))
    } else {
        Ok(Outcome::Unknown(format!("{status}: {body}")))
    }
}

/// A new user named `name` and a bearer token of theirs (named `token_name`), created
/// through node `id`: `(userId, token)`.
pub async fn new_user(cluster: &Cluster, id: u64, name: &str, token_name: &str) -> Result<(String, String)> {
    let (http, url) = (cluster.client(), cluster.http_url(id));
    let user = create_user(&http, &url, cluster.admin_token(), name).await?;
    let user_id = user.body().and_then(|b| b["userId"].as_str()).with_context(|| format!("create {name}: {user:?}"))?;
    let token = create_token(&http, &url, cluster.admin_token(), user_id, token_name).await?;
    let secret = token.body().and_then(|b| b["token"].as_str()).with_context(|| format!("token: {token:?}"))?;
    Ok((user_id.to_owned(), secret.to_owned()))
}

/// `PUT /v1/blocks/{hash}` of `data`; the hash.
pub async fn put_block(http: &reqwest::Client, url: &str, token: &str, data: &[u8]) -> Result<String> {
    let hash = blake3::hash(data).to_hex().to_string();
    let request = http.put(format!("{url}/v1/blocks/{hash}")).bearer_auth(token).body(data.to_vec());
    match send(request).await? {
        Outcome::Ok(_) => Ok(hash),
        other => bail!("PUT block {hash} through {url}: {other:?}"),
    }
}

/// `GET /v1/blocks/{hash}`: the block's bytes; any answer but 200 is an error.
pub async fn get_block(http: &reqwest::Client, url: &str, token: &str, hash: &str) -> Result<Vec<u8>> {
    let response = http.get(format!("{url}/v1/blocks/{hash}")).bearer_auth(token).send().await?;
    ensure!(response.status().as_u16() == 200, "GET block {hash} through {url}: {}", response.status());
    Ok(response.bytes().await?.to_vec())
}

/// `POST /v1/blocks/status {"hashes"}`: those of `hashes` the node does not hold.
pub async fn missing_blocks(http: &reqwest::Client, url: &str, token: &str, hashes: &[String]) -> Result<Vec<String>> {
    let request = http.post(format!("{url}/v1/blocks/status")).bearer_auth(token).json(&json!({ "hashes": hashes }));
    let body: Value = request.send().await?.json().await?;
    Ok(serde_json::from_value(body["missing"].clone())?)
}

/// `POST /v1/files/commit` of `path` with `chunks` on `base`, as `device`.
pub async fn commit_file(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    device: &str,
    path: &str,
    chunks: &[String],
    base: u64,
) -> Result<Outcome> {
    let body =
        serde_json::json!({ "path": path, "chunks": chunks, "baseVersion": base, "size": chunks.len(), "mtime": 0 });
    send(http.post(format!("{url}/v1/files/commit")).bearer_auth(token).header("x-device-id", device).json(&body)).await
}

/// `POST /v1/admin/users {"name"}` with the admin token.
pub async fn create_user(http: &reqwest::Client, url: &str, admin_token: &str, name: &str) -> Result<Outcome> {
    let request = http.post(format!("{url}/v1/admin/users")).bearer_auth(admin_token).json(&json!({ "name": name }));
    send(request).await
}

/// `GET /v1/admin/users/{userId}` with the admin token (a linearizable read).
pub async fn get_user(http: &reqwest::Client, url: &str, admin_token: &str, user_id: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/admin/users/{user_id}")).bearer_auth(admin_token)).await
}

/// `POST /v1/admin/users/{userId}/tokens {"name"}` with the admin token.
pub async fn create_token(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    user_id: &str,
    name: &str,
) -> Result<Outcome> {
    let request = http
        .post(format!("{url}/v1/admin/users/{user_id}/tokens"))
        .bearer_auth(admin_token)
        .json(&json!({ "name": name }));
    send(request).await
}

/// `GET /v1/me` with any token.
pub async fn me(http: &reqwest::Client, url: &str, token: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/me")).bearer_auth(token)).await
}

/// A user whose creation was acknowledged (201).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedUser {
    pub name: String,
    pub user_id: String,
    pub namespace_id: String,
}

impl CreatedUser {
    /// Reads `{"userId","namespaceId"}` from a 201 body.
    pub fn from_body(name: &str, body: &Value) -> Result<CreatedUser> {
        let field = |key: &str| {
            body[key]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("creating user {name}: no string {key:?} in {body}"))
        };
        Ok(CreatedUser { name: name.to_owned(), user_id: field("userId")?, namespace_id: field("namespaceId")? })
    }
}

/// Fails if two acknowledged users share an id.
pub fn ensure_distinct_ids(users: &[CreatedUser]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for user in users {
        ensure!(
            seen.insert(user.user_id.as_str()),
            "user id {} was returned for two creations (one is {})",
            user.user_id,
            user.name
        );
    }
    Ok(())
}

/// Runs `work` over `items` on `lanes` concurrent tasks (item `i` on lane `i % lanes`, each
/// lane in order) and returns the results in the order of `items`.
pub async fn in_lanes<T, R, F, Fut>(items: Vec<T>, lanes: usize, work: F) -> Result<Vec<R>>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<R>> + Send + 'static,
{
    let lanes = lanes.max(1);
    let mut buckets: Vec<Vec<(usize, T)>> = (0..lanes).map(|_| Vec::new()).collect();
    for (index, item) in items.into_iter().enumerate() {
        buckets[index % lanes].push((index, item));
    }
    let mut tasks = JoinSet::new();
    for bucket in buckets {
        let work = work.clone();
        tasks.spawn(async move {
            let mut done = Vec::with_capacity(bucket.len());
            for (index, item) in bucket {
                done.push((index, work(item).await?));
            }
            Ok::<_, anyhow::Error>(done)
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.context("a lane task panicked")??);
    }
    all.sort_by_key(|(index, _)| *index);
    Ok(all.into_iter().map(|(_, result)| result).collect())
}

/// Creates one user per name through `urls` (name `i` through `urls[i % len]`), `lanes` at a
/// time, for phases without faults. An unknown outcome is retried under a fresh name
/// (`<name>-retryN`: the first attempt may have taken effect); a rejection is an error.
pub async fn create_users(
    http: &reqwest::Client,
    urls: &[String],
    admin_token: &str,
    names: Vec<String>,
    lanes: usize,
) -> Result<Vec<CreatedUser>> {
    ensure!(!urls.is_empty(), "create_users needs at least one endpoint");
    let urls = Arc::new(urls.to_vec());
    let http = http.clone();
    let admin_token = admin_token.to_owned();
    let indexed: Vec<(usize, String)> = names.into_iter().enumerate().collect();
    in_lanes(indexed, lanes, move |(index, name)| {
        let http = http.clone();
        let urls = urls.clone();
        let admin_token = admin_token.clone();
        async move {
            let url = &urls[index % urls.len()];
            create_user_settled(&http, url, &admin_token, &name).await
        }
    })
    .await
}

async fn create_user_settled(http: &reqwest::Client, url: &str, admin_token: &str, name: &str) -> Result<CreatedUser> {
    let mut last = String::new();
    for attempt in 0..CREATE_ATTEMPTS_MAX {
        let attempt_name = if attempt == 0 { name.to_owned() } else { format!("{name}-retry{attempt}") };
        match create_user(http, url, admin_token, &attempt_name).await? {
            Outcome::Ok(body) => return CreatedUser::from_body(&attempt_name, &body),
            Outcome::Rejected(status, body) => {
                bail!("creating user {attempt_name} through {url} was rejected: {status} {body}")
            }
            Outcome::Unknown(why) => {
                last = why;
                tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
            }
        }
    }
    bail!("creating user {name} through {url}: no answer in {CREATE_ATTEMPTS_MAX} attempts: {last}")
}

/// Checks one user with `GET /v1/admin/users/{userId}`: `None` when present and equal.
pub(crate) async fn check_user(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    user: &CreatedUser,
) -> Result<Option<String>> {
    let mut last = String::new();
    for _ in 0..VERIFY_ATTEMPTS_MAX {
        match get_user(http, url, admin_token, &user.user_id).await? {
            Outcome::Ok(body) => {
                let same = body["userId"].as_str() == Some(user.user_id.as_str())
                    && body["name"].as_str() == Some(user.name.as_str())
                    && body["namespaceId"].as_str() == Some(user.namespace_id.as_str());
                return Ok((!same).then(|| format!("{user:?}: answered {body}")));
            }
            Outcome::Rejected(status, body) => {
                return Ok(Some(format!("{user:?}: {status} {body}")));
            }
            Outcome::Unknown(why) => {
                last = why;
                tokio::time::sleep(ms(RETRY_BACKOFF_MS)).await;
            }
        }
    }
    Ok(Some(format!("{user:?}: no answer in {VERIFY_ATTEMPTS_MAX} attempts: {last}")))
}

// ---------------------------------------------------------------------------------------------
// Node state as reported by /v1/cluster

/// One node's answer to `GET /v1/cluster`.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub role: String,
    pub last_applied: u64,
    pub last_log_index: u64,
    pub snapshot_index: Option<u64>,
    /// `false` while the node, having lost its data, awaits being added again.
    pub votes: bool,
    /// Voter ids of the configuration this node knows.
    pub voters: Vec<u64>,
    /// Learner ids of that configuration.
    pub learners: Vec<u64>,
}

impl NodeView {
    pub fn parse(body: &Value) -> Result<NodeView> {
        let number = |key: &str| body[key].as_u64().ok_or_else(|| anyhow!("no number {key:?} in /v1/cluster: {body}"));
        Ok(NodeView {
            node_id: number("nodeId")?,
            leader_id: body["leaderId"].as_u64(),
            term: number("term")?,
            role: body["role"].as_str().ok_or_else(|| anyhow!("no string \"role\" in /v1/cluster: {body}"))?.to_owned(),
            // Null before anything was applied.
            last_applied: body["lastApplied"].as_u64().unwrap_or(0),
            last_log_index: body["lastLogIndex"].as_u64().unwrap_or(0),
            snapshot_index: body["snapshotIndex"].as_u64(),
            votes: body["votes"].as_bool().ok_or_else(|| anyhow!("no boolean \"votes\" in /v1/cluster: {body}"))?,
            voters: members_with_role(body, "voter"),
            learners: members_with_role(body, "learner"),
        })
    }

    pub fn is_leader(&self) -> bool {
        self.role == "Leader"
    }
}

/// The ids of the members with `role` in a `/v1/cluster` or members answer.
pub fn members_with_role(body: &Value, role: &str) -> Vec<u64> {
    body["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"].as_str() == Some(role))
        .filter_map(|m| m["id"].as_u64())
        .collect()
}

/// `GET /v1/admin/cluster/members` through `url`.
pub async fn cluster_members(http: &reqwest::Client, url: &str, admin_token: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/admin/cluster/members")).bearer_auth(admin_token)).await
}

/// `POST /v1/admin/cluster/members` through `url`: joins node `id` with these addresses.
pub async fn add_member(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    id: u64,
    http_addr: &str,
    grpc_addr: &str,
) -> Result<Outcome> {
    let body = json!({ "id": id, "httpAddr": http_addr, "grpcAddr": grpc_addr });
    send(http.post(format!("{url}/v1/admin/cluster/members")).bearer_auth(admin_token).json(&body)).await
}

/// `DELETE /v1/admin/cluster/members/{id}` through `url`.
pub async fn remove_member(http: &reqwest::Client, url: &str, admin_token: &str, id: u64) -> Result<Outcome> {
    send(http.delete(format!("{url}/v1/admin/cluster/members/{id}")).bearer_auth(admin_token)).await
}

// ---------------------------------------------------------------------------------------------
// Sharing

/// `POST /v1/namespaces {"name"}`: a shared folder owned by the caller.
pub async fn create_folder(http: &reqwest::Client, url: &str, token: &str, name: &str) -> Result<Outcome> {
    send(http.post(format!("{url}/v1/namespaces")).bearer_auth(token).json(&json!({ "name": name }))).await
}

/// `PUT /v1/namespaces/{id}/acl`: invites `grantee` with `role`, or changes its role (`{"userId"}`, `{"userName"}`,
/// `{"groupId"}` or `{"groupName"}`).
pub async fn grant(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    namespace_id: &str,
    mut grantee: Value,
    role: &str,
) -> Result<Outcome> {
    grantee["role"] = json!(role);
    send(http.put(format!("{url}/v1/namespaces/{namespace_id}/acl")).bearer_auth(token).json(&grantee)).await
}

/// `POST /v1/namespaces/{id}/accept`: the caller accepts their invitation to the folder.
pub async fn accept_invitation(http: &reqwest::Client, url: &str, token: &str, namespace_id: &str) -> Result<Outcome> {
    send(http.post(format!("{url}/v1/namespaces/{namespace_id}/accept")).bearer_auth(token)).await
}

/// `DELETE /v1/namespaces/{id}/acl/users/{userId}`.
pub async fn revoke_user(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    namespace_id: &str,
    user_id: &str,
) -> Result<Outcome> {
    send(http.delete(format!("{url}/v1/namespaces/{namespace_id}/acl/users/{user_id}")).bearer_auth(token)).await
}

/// `POST /v1/admin/groups {"name"}` with the admin token.
pub async fn create_group(http: &reqwest::Client, url: &str, admin_token: &str, name: &str) -> Result<Outcome> {
    send(http.post(format!("{url}/v1/admin/groups")).bearer_auth(admin_token).json(&json!({ "name": name }))).await
}

/// `PUT /v1/admin/groups/{groupId}/members/{userId}` with the admin token.
pub async fn add_group_member(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    group_id: &str,
    user_id: &str,
) -> Result<Outcome> {
    send(http.put(format!("{url}/v1/admin/groups/{group_id}/members/{user_id}")).bearer_auth(admin_token)).await
}

/// `POST /v1/files/commit` of `path` in namespace `namespace_id` with `chunks` on `base`, as
/// `device`.
#[allow(clippy::too_many_arguments)]
pub async fn commit_in(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    device: &str,
    namespace_id: &str,
    path: &str,
    chunks: &[String],
    base: u64,
) -> Result<Outcome> {
    let body = json!({
        "namespaceId": namespace_id, "path": path, "chunks": chunks, "baseVersion": base, "size": chunks.len(),
        "mtime": 0,
    });
    send(http.post(format!("{url}/v1/files/commit")).bearer_auth(token).header("x-device-id", device).json(&body)).await
}

/// `GET /v1/sync?cursor=` as `device`: one page.
pub async fn sync_page(http: &reqwest::Client, url: &str, token: &str, device: &str, cursor: &str) -> Result<Outcome> {
    send(http.get(format!("{url}/v1/sync?cursor={cursor}")).bearer_auth(token).header("x-device-id", device)).await
}

/// Sets user `user_id`'s password with the admin token through node 1, waiting (up to 20 s)
/// while the cluster is not yet at the data format that stores passwords (409: a fresh
/// cluster raises its format a clock check or two after it forms).
pub async fn set_password(cluster: &Cluster, user_id: &str, password: &str) -> Result<()> {
    let wait = crate::Deadline::after(Duration::from_secs(20), "a password set (the cluster at data format 4)");
    loop {
        let answer = cluster
            .client()
            .put(format!("{}/v1/admin/users/{user_id}/password", cluster.http_url(1)))
            .bearer_auth(cluster.admin_token())
            .json(&json!({ "password": password }))
            .send()
            .await?;
        match answer.status().as_u16() {
            204 => return Ok(()),
            409 => wait.tick(&answer.text().await.unwrap_or_default()).await?,
            other => bail!("set the password of {user_id}: {other} {}", answer.text().await.unwrap_or_default()),
        }
    }
}
