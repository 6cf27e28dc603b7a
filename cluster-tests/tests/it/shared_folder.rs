//! Invariant: two users with two devices each share one folder across a three-node cluster,
//! each device talking to its own node. Edits by each reach the other's devices through
//! `/v1/sync`; a simultaneous edit leaves a conflicted copy naming the user and the device,
//! visible to both; a viewer's commit is 403; after the revoke the folder disappears from the
//! former member's sync (reported once as removed) and its files and blocks answer 404.
//! The same life through the CLI: `raftbox share`, `raftbox groups`, `raftbox files
//! --namespace`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use raftbox_cluster_tests::{
    accept_invitation, commit_in, create_folder, get_block, grant, missing_blocks, new_user, put_block, raftbox_bin,
    revoke_user, send, sync_page, within, Cluster, ClusterOptions, Outcome,
};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// How long a change may take to reach another device's sync.
const SYNC_DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_share_a_folder_across_nodes() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

/// One device of a user, talking to one node, keeping what its syncs told it.
struct Device {
    http: reqwest::Client,
    url: String,
    token: String,
    name: &'static str,
    cursor: String,
    /// (namespace, path) → (version, chunks) of live files.
    files: BTreeMap<(String, String), (u64, Vec<String>)>,
    /// Namespaces reported removed.
    removed: Vec<String>,
}

impl Device {
    fn new(cluster: &Cluster, node: u64, token: &str, name: &'static str) -> Device {
        Device {
            http: cluster.client(),
            url: cluster.http_url(node),
            token: token.to_owned(),
            name,
            cursor: "0".into(),
            files: BTreeMap::new(),
            removed: Vec::new(),
        }
    }

    /// Syncs until `hasMore` is false, applying each change.
    async fn sync(&mut self) -> Result<()> {
        loop {
            let page = match sync_page(&self.http, &self.url, &self.token, self.name, &self.cursor).await? {
                Outcome::Ok(page) => page,
                other => bail!("{} syncs through {}: {other:?}", self.name, self.url),
            };
            for change in page["changes"].as_array().context("changes")? {
                let ns = change["namespaceId"].as_str().context("namespaceId")?.to_owned();
                if change["namespaceRemoved"] == true {
                    self.files.retain(|(n, _), _| *n != ns);
                    self.removed.push(ns);
                    continue;
                }
                let path = change["path"].as_str().context("path")?.to_owned();
                if change["deleted"] == true {
                    self.files.remove(&(ns, path));
                } else {
                    let chunks = serde_json::from_value(change["chunks"].clone())?;
                    self.files.insert((ns, path), (change["version"].as_u64().context("version")?, chunks));
                }
            }
            self.cursor = page["cursor"].as_str().context("cursor")?.to_owned();
            if page["hasMore"] != true {
                return Ok(());
            }
        }
    }

    /// Syncs until `path` of `ns` is at `version`.
    async fn wait_for(&mut self, ns: &str, path: &str, version: u64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + SYNC_DEADLINE;
        loop {
            self.sync().await?;
            if self.files.get(&(ns.to_owned(), path.to_owned())).is_some_and(|(v, _)| *v == version) {
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{} never saw {path} v{version} through {}; it has {:?}",
                self.name,
                self.url,
                self.files.keys().collect::<Vec<_>>()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn commit(&self, ns: &str, path: &str, chunks: &[String], base: u64) -> Result<Outcome> {
        commit_in(&self.http, &self.url, &self.token, self.name, ns, path, chunks, base).await
    }
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let http = cluster.client();
    let (n1, n2, n3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));
    let (_, ann) = new_user(cluster, 1, "ann", "ann-token").await?;
    let (bob_id, bob) = new_user(cluster, 2, "bob", "bob-token").await?;
    let mut ann_laptop = Device::new(cluster, 1, &ann, "laptop");
    let mut ann_phone = Device::new(cluster, 2, &ann, "phone");
    let mut bob_phone = Device::new(cluster, 2, &bob, "phone");
    let mut bob_desktop = Device::new(cluster, 3, &bob, "desktop");

    let folder = create_folder(&http, &n1, &ann, "plans").await?;
    let ns = folder.body().and_then(|b| b["namespaceId"].as_str()).with_context(|| format!("{folder:?}"))?.to_owned();
    for device in [&mut ann_laptop, &mut ann_phone, &mut bob_phone, &mut bob_desktop] {
        device.sync().await?;
    }
    let granted = grant(&http, &n3, &ann, &ns, json!({ "userName": "bob" }), "editor").await?;
    ensure!(granted.is_ok(), "grant bob through node 3: {granted:?}");
    let accepted = accept_invitation(&http, &n2, &bob, &ns).await?;
    ensure!(accepted.is_ok(), "bob accepts through node 2: {accepted:?}");

    // ann's laptop (node 1) writes; bob's devices (nodes 2 and 3) and ann's phone see it.
    let v1 = put_block(&http, &n1, &ann, b"the plan, version one").await?;
    let made = ann_laptop.commit(&ns, "/plan.txt", std::slice::from_ref(&v1), 0).await?;
    ensure!(made.is_ok(), "ann commits through node 1: {made:?}");
    for device in [&mut bob_phone, &mut bob_desktop, &mut ann_phone] {
        device.wait_for(&ns, "/plan.txt", 1).await?;
    }
    // bob downloads ann's block through node 3, byte-identical.
    ensure!(get_block(&http, &n3, &bob, &v1).await? == b"the plan, version one", "bob's download differs");

    // bob's phone (node 2) writes; ann's devices see it.
    let v2 = put_block(&http, &n2, &bob, b"the plan, bob's edit").await?;
    let made = bob_phone.commit(&ns, "/plan.txt", std::slice::from_ref(&v2), 1).await?;
    ensure!(made.is_ok(), "bob commits through node 2: {made:?}");
    for device in [&mut ann_laptop, &mut ann_phone, &mut bob_desktop] {
        device.wait_for(&ns, "/plan.txt", 2).await?;
    }
    ensure!(get_block(&http, &n1, &ann, &v2).await? == b"the plan, bob's edit", "ann's download differs");

    // A simultaneous edit through nodes 1 and 3 on the same base: one wins, the other's
    // content is kept as a copy naming its user and device.
    let ann_edit = put_block(&http, &n1, &ann, b"ann's simultaneous edit").await?;
    let bob_edit = put_block(&http, &n3, &bob, b"bob's simultaneous edit").await?;
    let (a, b) = tokio::join!(
        ann_laptop.commit(&ns, "/plan.txt", std::slice::from_ref(&ann_edit), 2),
        bob_desktop.commit(&ns, "/plan.txt", std::slice::from_ref(&bob_edit), 2)
    );
    let (a, b) = (a?, b?);
    let (loser, copy) = match (&a, &b) {
        (Outcome::Ok(_), Outcome::Rejected(409, body)) => ("bob's desktop", body),
        (Outcome::Rejected(409, body), Outcome::Ok(_)) => ("ann's laptop", body),
        other => bail!("a simultaneous edit should be one 201 and one 409: {other:?}"),
    };
    let copy: Value = serde_json::from_str(copy)?;
    let copy_path = copy["conflictedCopy"]["path"].as_str().context("conflictedCopy")?.to_owned();
    ensure!(copy_path == format!("/plan (conflicted copy, {loser}).txt"), "copy named {copy_path}");
    for device in [&mut ann_laptop, &mut ann_phone, &mut bob_phone, &mut bob_desktop] {
        device.wait_for(&ns, &copy_path, 1).await?;
        device.wait_for(&ns, "/plan.txt", 3).await?;
    }
    eprintln!("conflicted copy {copy_path:?} reached all four devices");

    // bob made a viewer through node 2: his commit through node 3 is 403.
    let demoted = grant(&http, &n2, &ann, &ns, json!({ "userId": bob_id }), "viewer").await?;
    ensure!(demoted.is_ok(), "demote bob: {demoted:?}");
    match bob_desktop.commit(&ns, "/viewer.txt", std::slice::from_ref(&v2), 0).await? {
        Outcome::Rejected(403, _) => {}
        other => bail!("a viewer's commit: {other:?}"),
    }

    // Revoked through node 1: his next sync through node 2 reports the folder removed, once.
    let revoked = revoke_user(&http, &n1, &ann, &ns, &bob_id).await?;
    ensure!(revoked.is_ok(), "revoke bob: {revoked:?}");
    bob_phone.sync().await?;
    ensure!(bob_phone.removed == vec![ns.clone()], "bob's phone was told {:?}", bob_phone.removed);
    ensure!(bob_phone.files.keys().all(|(n, _)| *n != ns), "bob's phone still lists the folder");
    bob_phone.sync().await?;
    ensure!(bob_phone.removed.len() == 1, "removal reported again: {:?}", bob_phone.removed);
    // Files, blocks and commits of the folder answer 404 to him through every node.
    for url in [&n1, &n2, &n3] {
        let file = send(http.get(format!("{url}/v1/files?path=/plan.txt&namespaceId={ns}")).bearer_auth(&bob)).await?;
        ensure!(matches!(file, Outcome::Rejected(404, _)), "bob reads the file through {url}: {file:?}");
        let block = http.get(format!("{url}/v1/blocks/{ann_edit}")).bearer_auth(&bob).send().await?.status();
        ensure!(block.as_u16() == 404, "bob reads ann's block through {url}: {block}");
        let missing = missing_blocks(&http, url, &bob, std::slice::from_ref(&ann_edit)).await?;
        ensure!(missing == vec![ann_edit.clone()], "status shows bob ann's block through {url}");
    }
    match bob_desktop.commit(&ns, "/late.txt", std::slice::from_ref(&v2), 0).await? {
        Outcome::Rejected(404, _) => {}
        other => bail!("a former member's commit: {other:?}"),
    }
    // ann still has everything.
    ann_phone.sync().await?;
    ensure!(ann_phone.files.keys().filter(|(n, _)| *n == ns).count() == 2, "ann's phone: {:?}", ann_phone.files);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shares_a_folder_through_a_group() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, cli_scenario(&cluster)).await;
    cluster.conclude(result);
}

/// Runs `raftbox ARGS` against `url` with `token`: its stdout, or an error with its stderr.
async fn cli(url: &str, token: &str, args: &[&str]) -> Result<String> {
    let mut command = std::process::Command::new(raftbox_bin()?);
    command.args(args).args(["--url", url, "--token", token]);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    ensure!(output.status.success(), "raftbox {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

async fn cli_scenario(cluster: &Cluster) -> Result<()> {
    let (n1, n2, n3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));
    let admin = cluster.admin_token();
    let (_, ann) = new_user(cluster, 1, "ann", "laptop").await?;
    let (bob_id, bob) = new_user(cluster, 1, "bob", "phone").await?;
    let ns = cli(&n1, &ann, &["share", "create", "plans"]).await?.trim().to_owned();
    let group = cli(&n2, admin, &["groups", "create", "team"]).await?.trim().to_owned();
    cli(&n3, admin, &["groups", "add", &group, &bob_id]).await?;
    ensure!(cli(&n1, admin, &["groups", "show", &group]).await?.contains("bob"), "bob is not shown in the group");
    cli(&n1, &ann, &["share", "grant", &ns, "--group", "team", "--role", "editor"]).await?;
    // An invitation until accepted (a group's, by an admin): bob does not list it yet.
    let members = cli(&n2, &ann, &["share", "members", &ns]).await?;
    ensure!(members.contains("not yet accepted"), "members:\n{members}");
    ensure!(!cli(&n3, &bob, &["share", "ls"]).await?.contains(&ns), "bob lists a folder not accepted");
    cli(&n3, admin, &["share", "accept", &ns, "--group", "team"]).await?;
    let members = cli(&n2, &ann, &["share", "members", &ns]).await?;
    ensure!(members.contains("team") && members.contains("editor"), "members:\n{members}");
    let listed = cli(&n3, &bob, &["share", "ls"]).await?;
    ensure!(
        listed.lines().any(|l| l.contains(&ns) && l.contains("editor") && l.contains("plans")),
        "bob's list:\n{listed}"
    );

    // bob puts a file into the folder; ann gets it, byte-identical.
    let dir = tempfile::tempdir()?;
    let local = dir.path().join("plan.txt");
    std::fs::write(&local, b"bob's plan, through the CLI")?;
    let local = local.to_str().context("path")?.to_owned();
    cli(&n2, &bob, &["files", "--namespace", &ns, "put", &local, "/plan.txt"]).await?;
    let fetched = dir.path().join("fetched.txt");
    let fetched_arg = fetched.to_str().context("path")?.to_owned();
    cli(&n3, &ann, &["files", "--namespace", &ns, "get", "/plan.txt", &fetched_arg]).await?;
    ensure!(std::fs::read(&fetched)? == b"bob's plan, through the CLI", "ann's copy differs");
    ensure!(cli(&n1, &ann, &["files", "--namespace", &ns, "ls"]).await?.contains("plan.txt"), "ls misses the file");
    // Not in ann's personal namespace.
    ensure!(!cli(&n1, &ann, &["files", "ls"]).await?.contains("plan.txt"), "the file leaked into ann's own files");

    // The group's access revoked: bob no longer reaches the folder.
    cli(&n1, &ann, &["share", "revoke", &ns, "--group-id", &group]).await?;
    ensure!(!cli(&n3, &bob, &["share", "ls"]).await?.contains(&ns), "bob still lists the folder");
    ensure!(cli(&n2, &bob, &["files", "--namespace", &ns, "ls"]).await.is_err(), "bob still lists its files");
    // The last owner cannot leave; she deletes the folder instead.
    ensure!(cli(&n1, &ann, &["share", "leave", &ns]).await.is_err(), "the last owner left");
    cli(&n1, &ann, &["share", "delete", &ns]).await?;
    ensure!(!cli(&n1, &ann, &["share", "ls"]).await?.contains(&ns), "the deleted folder is still listed");
    Ok(())
}
