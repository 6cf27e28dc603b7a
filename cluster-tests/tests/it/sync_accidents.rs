//! Invariant: whatever happens to a synced folder, every byte the user wrote survives
//! somewhere they can find it — the file, a conflicted copy, the server's history or the local
//! trash — and `raftbox sync` never writes outside its folder. One test per accident of a real
//! laptop (issue 21): the folder moved away while the client runs; a subfolder that is a link
//! to elsewhere; a file that cannot be written here; an edit that keeps size and mtime; a
//! missing, replaced or stale folder; a pass that would delete many files; an edit made while
//! a download of the same file runs; a cursor reset; ignore rules; the mtime and execute bit;
//! a viewer's folder and a removed one; Ctrl-C.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context as _, Result};
use raftbox_cluster_tests::sync_device::{
    history_contents, holds, pseudo_bytes, server_tree, sync_command, tree, wait_server, write_file, SyncDevice, Tree,
};
use raftbox_cluster_tests::{
    accept_invitation, create_folder, grant, new_user, put_block, within, Cluster, ClusterOptions, Deadline,
};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(150);
/// How long a change may take to show where it is awaited.
const CONVERGE: Duration = Duration::from_secs(30);

/// One user of a running cluster, with a work folder for their devices.
struct Ctx {
    http: reqwest::Client,
    url: String,
    endpoints: Vec<String>,
    token: String,
    user_id: String,
    work: tempfile::TempDir,
}

impl Ctx {
    async fn new(cluster: &Cluster, name: &str) -> Result<Ctx> {
        let (user_id, token) = new_user(cluster, 1, name, &format!("{name}-token")).await?;
        Ok(Ctx {
            http: cluster.client(),
            url: cluster.http_url(1),
            endpoints: cluster.http_urls(&[1, 2, 3]),
            token,
            user_id,
            work: tempfile::tempdir()?,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn device(&self, name: &str, extra: &[&str]) -> Result<SyncDevice> {
        SyncDevice::start(&self.path(name), &self.endpoints, &self.token, name, extra)
    }

    async fn server(&self) -> Result<Tree> {
        server_tree(&self.http, &self.url, &self.token, None).await
    }

    /// Another device's commit of `content` at `path` (over whatever version is current).
    async fn commit(&self, path: &str, content: &[u8]) -> Result<u64> {
        commit_as(&self.http, &self.url, &self.token, None, path, content).await
    }

    /// Waits until the server's tree satisfies `holds`; the tree.
    async fn wait_server(&self, what: &str, holds: impl Fn(&Tree) -> bool) -> Result<Tree> {
        wait_server(&self.http, &self.url, &self.token, CONVERGE, what, holds).await
    }
}

/// Commits `content` at `path` (in `namespace`, else the personal one) over the current
/// version; the new version.
async fn commit_as(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    namespace: Option<&str>,
    path: &str,
    content: &[u8],
) -> Result<u64> {
    let hash = put_block(http, url, token, content).await?;
    let mut query = vec![("path", path.to_string())];
    if let Some(ns) = namespace {
        query.push(("namespaceId", ns.to_string()));
    }
    let current = http.get(format!("{url}/v1/files")).query(&query).bearer_auth(token).send().await?;
    let base = if current.status().as_u16() == 200 {
        current.json::<Value>().await?["version"].as_u64().unwrap_or(0)
    } else {
        0
    };
    let mut body = json!({ "path": path, "chunks": [hash], "baseVersion": base, "size": content.len(), "mtime": 1 });
    if let Some(ns) = namespace {
        body["namespaceId"] = json!(ns);
    }
    let answer = http
        .post(format!("{url}/v1/files/commit"))
        .bearer_auth(token)
        .header("x-device-id", "api")
        .json(&body)
        .send()
        .await?;
    let status = answer.status().as_u16();
    let answer: Value = answer.json().await?;
    ensure!(status == 201 || status == 200, "commit {path}: {status} {answer}");
    answer["version"].as_u64().context("a version")
}

/// Waits until the folder of `device` satisfies `holds`; its tree.
async fn wait_local(device: &mut SyncDevice, what: &str, holds: impl Fn(&Tree) -> bool) -> Result<Tree> {
    device.wait_tree(what, CONVERGE, holds).await
}

fn up_to_date(status: &Value) -> bool {
    status["state"] == "up to date"
}

/// Waits until the device has finished `passes` more passes than when asked.
async fn more_passes(device: &mut SyncDevice, passes: u64) -> Result<()> {
    let since = device.status()?["updatedMs"].as_u64().unwrap_or(0);
    let min_gap_ms = passes * 1_500;
    device
        .wait_status("further passes", CONVERGE, |s| s["updatedMs"].as_u64().unwrap_or(0) >= since + min_gap_ms)
        .await?;
    Ok(())
}

fn failures(status: &Value) -> Vec<(String, String)> {
    status["failures"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|f| (f["path"].as_str().unwrap_or("").to_string(), f["reason"].as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

macro_rules! cluster_test {
    ($name:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
            let result = within(TEST_DEADLINE, $scenario(&cluster)).await;
            cluster.conclude(result);
        }
    };
}

// ---------------------------------------------------------------------------------------
// The folder moved away while the client runs: paused, nothing deleted anywhere.

cluster_test!(a_folder_moved_away_pauses_and_deletes_nothing, moved_folder);

async fn moved_folder(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "mover").await?;
    let files: Tree = (0..5).map(|i| (format!("docs/{i}.txt"), pseudo_bytes(&format!("doc {i}"), 1000 + i))).collect();
    for (path, bytes) in &files {
        write_file(&ctx.path("box"), path, bytes)?;
    }
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("the five files", |t| *t == files).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    std::fs::rename(ctx.path("box"), ctx.path("moved"))?;
    // The status follows the folder it belongs to.
    a.status_file = ctx.path("moved/.raftbox/status.json");
    let status = a.wait_status("paused: missing", CONVERGE, |s| s["state"] == "paused").await?;
    ensure!(status["reason"].as_str().unwrap_or("").contains("missing"), "{status}");
    more_passes(&mut a, 2).await?;
    ensure!(ctx.server().await? == files, "the server lost files while the folder was away");
    // Another device still gets everything.
    let mut b = ctx.device("other", &[])?;
    wait_local(&mut b, "all five files", |t| *t == files).await?;
    // Moved back: syncing resumes where it was.
    std::fs::rename(ctx.path("moved"), ctx.path("box"))?;
    a.status_file = ctx.path("box/.raftbox/status.json");
    write_file(&ctx.path("box"), "after.txt", b"after the move back")?;
    ctx.wait_server("after.txt", |t| t.get("after.txt").is_some_and(|b| b == b"after the move back")).await?;
    ensure!(ctx.server().await?.len() == 6);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A subfolder that is a link to elsewhere: nothing written through it, nothing read through
// it, nothing deleted beneath it.

cluster_test!(a_linked_folder_is_never_written_through_read_through_or_deleted, linked_folder);

async fn linked_folder(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "linker").await?;
    let outside = ctx.path("outside");
    write_file(&outside, "private.txt", b"never leaves this machine")?;
    std::fs::create_dir_all(ctx.path("box"))?;
    std::os::unix::fs::symlink(&outside, ctx.path("box/linked"))?;
    std::os::unix::fs::symlink(outside.join("private.txt"), ctx.path("box/private-link"))?;
    write_file(&ctx.path("box"), "plain.txt", b"plain")?;
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("plain.txt", |t| t.contains_key("plain.txt")).await?;
    // Another device puts a file under the linked folder's name.
    ctx.commit("/linked/planted.txt", b"from elsewhere").await?;
    let status = a
        .wait_status("a failure for the planted file", CONVERGE, |s| {
            failures(s).iter().any(|(p, _)| p == "/linked/planted.txt")
        })
        .await?;
    let reason = &failures(&status)[0].1;
    ensure!(reason.contains("symbolic link"), "{reason}");
    more_passes(&mut a, 1).await?;
    let outside_now = tree(&outside)?;
    ensure!(
        outside_now.len() == 1 && outside_now.contains_key("private.txt"),
        "written outside the folder: {:?}",
        outside_now.keys().collect::<Vec<_>>()
    );
    let server = ctx.server().await?;
    ensure!(server.get("linked/planted.txt").is_some_and(|b| b == b"from elsewhere"), "deleted on the server");
    ensure!(!holds(&server, b"never leaves this machine"), "a file outside the folder was uploaded");
    let skipped = status["report"]["blind"].to_string();
    ensure!(skipped.contains("linked") && skipped.contains("private-link"), "not reported: {skipped}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// One file that cannot be written here stops nothing else; long names work.

cluster_test!(a_file_that_cannot_be_written_here_stops_nothing_else, unwritable_file);

async fn unwritable_file(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "namer").await?;
    let long = format!("{}.txt", "L".repeat(246));
    ctx.commit(&format!("/{long}"), b"a 250-byte name").await?;
    ctx.commit("/clash", b"a file named clash").await?;
    ctx.commit("/clash/inner.txt", b"a file in a folder named clash").await?;
    ctx.commit("/ok.txt", b"ok").await?;
    let mut a = ctx.device("box", &[])?;
    let local =
        wait_local(&mut a, "the long name and ok.txt", |t| t.contains_key(&long) && t.contains_key("ok.txt")).await?;
    ensure!(local[&long] == b"a 250-byte name");
    let status = a.wait_status("one failure", CONVERGE, |s| s["failuresCount"] == 1).await?;
    let (path, reason) = failures(&status).remove(0);
    ensure!(path == "/clash" || path == "/clash/inner.txt", "{path}");
    ensure!(reason.contains("in the way") || reason.contains("not a folder"), "{reason}");
    // The cursor moved on: later changes arrive.
    ctx.commit("/after.txt", b"after").await?;
    wait_local(&mut a, "after.txt", |t| t.contains_key("after.txt")).await?;
    let text = String::from_utf8(sync_command(&["status", &a.dir.display().to_string()])?.stdout)?;
    ensure!(text.contains("failed:    1 file(s)") && text.contains(&path), "{text}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// An edit that keeps the size and the mtime (cp -p, rsync -t, touch -r) is uploaded.

cluster_test!(an_edit_keeping_size_and_mtime_is_uploaded, same_size_and_mtime);

async fn same_size_and_mtime(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "toucher").await?;
    write_file(&ctx.path("box"), "vault.bin", &pseudo_bytes("before", 4096))?;
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("vault.bin", |t| t.contains_key("vault.bin")).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    more_passes(&mut a, 1).await?;
    let path = ctx.path("box/vault.bin");
    let mtime = std::fs::metadata(&path)?.modified()?;
    // Rewritten in place, same size, the old mtime put back (as a VeraCrypt container is).
    let edited = pseudo_bytes("after", 4096);
    {
        use std::io::{Seek as _, Write as _};
        let mut file = std::fs::OpenOptions::new().write(true).open(&path)?;
        file.seek(std::io::SeekFrom::Start(0))?;
        file.write_all(&edited)?;
        file.set_modified(mtime)?;
    }
    ensure!(std::fs::metadata(&path)?.modified()? == mtime && std::fs::metadata(&path)?.len() == 4096);
    ctx.wait_server("the edit", |t| t.get("vault.bin").is_some_and(|b| *b == edited)).await?;
    // A later remote edit: the local edit is in the history, never silently overwritten.
    ctx.commit("/vault.bin", b"remote").await?;
    wait_local(&mut a, "the remote edit", |t| t.get("vault.bin").is_some_and(|b| b == b"remote")).await?;
    let history = history_contents(&ctx.http, &ctx.url, &ctx.token, "/vault.bin").await?;
    ensure!(history.contains(&Some(edited)), "the local edit is not in the history");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A folder missing at start is not recreated; a replaced or stale folder pauses; an adopted
// one is compared by content, and the stale content never overwrites newer versions.

cluster_test!(a_missing_replaced_or_stale_folder_is_never_taken_for_deleted_files, folder_identity);

async fn folder_identity(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "drive").await?;
    let state = ctx.path("state/state.redb");
    let state_arg = state.display().to_string();
    let dir = ctx.path("drive");
    write_file(&dir, "doc.txt", b"old")?;
    write_file(&dir, "keep.txt", b"keep")?;
    let mut a = ctx.device("drive", &["--state", &state_arg])?;
    ctx.wait_server("both files", |t| t.len() == 2).await?;
    a.status_file = ctx.path("state/status.json");
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    // Ctrl-C stops the client promptly and cleanly.
    ensure!(a.stop().await?.success(), "Ctrl-C did not stop the client cleanly");
    // A snapshot of the folder as it is now (an old copy on a backup drive).
    let stale = ctx.path("stale-copy");
    copy_tree(&dir, &stale)?;
    // The folder vanishes (an unmounted drive); the client starts and waits, creating nothing.
    std::fs::rename(&dir, ctx.path("drive-away"))?;
    a.restart(&[])?;
    let deadline = Deadline::after(CONVERGE, "the client waiting for its folder");
    while !a.logs().contains("waiting for it") {
        a.ensure_running()?;
        deadline.tick(&a.log_tail()).await?;
    }
    ensure!(!dir.exists(), "the client recreated a folder it had set up before");
    // Meanwhile the file changes on the server.
    ctx.commit("/doc.txt", b"new").await?;
    // The stale copy appears at the folder's place (the old drive mounted there).
    std::fs::rename(&stale, &dir)?;
    let status = a.wait_status("paused: not the folder", CONVERGE, |s| s["state"] == "paused").await?;
    ensure!(status["reason"].as_str().unwrap_or("").contains("no longer the folder"), "{status}");
    more_passes(&mut a, 2).await?;
    let server = ctx.server().await?;
    ensure!(server.get("doc.txt").is_some_and(|b| b == b"new"), "stale content went up: {server:?}");
    ensure!(server.len() == 2, "{:?}", server.keys().collect::<Vec<_>>());
    // Adopted, it is compared by content: the newer version comes down, the stale one goes
    // to the trash, nothing goes up.
    a.restart(&["--accept-folder"])?;
    let local = wait_local(&mut a, "the newer version", |t| t.get("doc.txt").is_some_and(|b| b == b"new")).await?;
    ensure!(local.len() == 2, "{:?}", local.keys().collect::<Vec<_>>());
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    let server = ctx.server().await?;
    ensure!(server.len() == 2 && server["doc.txt"] == b"new", "{:?}", server.keys().collect::<Vec<_>>());
    let trash = String::from_utf8(sync_command(&["trash", "ls", &dir.display().to_string()])?.stdout)?;
    ensure!(trash.contains("doc.txt"), "the replaced stale file is not in the trash: {trash}");
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let status = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    ensure!(status.success(), "cp -a");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A pass that would delete many files is held until the user confirms.

cluster_test!(a_pass_deleting_many_files_is_held_until_confirmed, mass_delete);

async fn mass_delete(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "deleter").await?;
    for i in 0..30 {
        write_file(&ctx.path("box"), &format!("f{i:02}.txt"), format!("file {i}").as_bytes())?;
    }
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("30 files", |t| t.len() == 30).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    // Deleted a little at a time while the client runs: the guard counts the last minute's
    // deletions together.
    for i in 0..20 {
        std::fs::remove_file(ctx.path(&format!("box/f{i:02}.txt")))?;
        if i % 4 == 3 {
            let seen = a.status()?["updatedMs"].as_u64().unwrap_or(0);
            a.wait_status("a pass", CONVERGE, |s| s["updatedMs"].as_u64().unwrap_or(0) > seen).await?;
        }
    }
    a.wait_status("deletions held", CONVERGE, |s| s["report"]["heldDeletes"].as_array().is_some_and(|h| !h.is_empty()))
        .await?;
    // Read after more passes: a pass that began before the last deletions holds fewer.
    more_passes(&mut a, 2).await?;
    let status = a.status()?;
    let held: usize = status["report"]["heldDeletes"][0]
        .as_str()
        .and_then(|h| h.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("a held count")?;
    let left = ctx.server().await?.len();
    ensure!(left == 30 - 20 + held && left > 10 + 4, "{left} files left with {held} deletions held");
    let dir = a.dir.display().to_string();
    let text = String::from_utf8(sync_command(&["status", &dir])?.stdout)?;
    ensure!(text.contains("confirm-deletes"), "{text}");
    let confirmed = sync_command(&["confirm-deletes", &dir])?;
    ensure!(confirmed.status.success(), "{}", String::from_utf8_lossy(&confirmed.stderr));
    ctx.wait_server("10 files left", |t| t.len() == 10).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// An edit made while a download of the same file runs is kept.

cluster_test!(an_edit_made_during_a_download_is_kept, edit_during_download);

async fn edit_during_download(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "racer").await?;
    write_file(&ctx.path("box"), "big.bin", b"version one")?;
    let mut a = ctx.device("box", &["--limit-down", "256K"])?;
    ctx.wait_server("big.bin", |t| t.contains_key("big.bin")).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    // A 2 MB version from elsewhere: at 256 KiB/s its download takes about 8 s.
    let remote = pseudo_bytes("remote version", 2_000_000);
    let started = Instant::now();
    ctx.commit("/big.bin", &remote).await?;
    let deadline = Deadline::after(CONVERGE, "the download's temporary file");
    while !std::fs::read_dir(&a.dir)?.flatten().any(|e| e.file_name().to_string_lossy().starts_with(".raftbox-")) {
        deadline.tick(&a.log_tail()).await?;
    }
    // The user saves the file meanwhile.
    write_file(&a.dir, "big.bin", b"the user's edit during the download")?;
    let local = wait_local(&mut a, "both versions here", |t| {
        holds(t, b"the user's edit during the download") && holds(t, &remote)
    })
    .await?;
    ensure!(started.elapsed() >= Duration::from_secs(6), "the download ignored --limit-down: {:?}", started.elapsed());
    ensure!(local.keys().any(|k| k.contains("conflicted copy")), "{:?}", local.keys().collect::<Vec<_>>());
    let server = ctx
        .wait_server("both versions there", |t| holds(t, b"the user's edit during the download") && holds(t, &remote))
        .await?;
    ensure!(server.len() == 2, "{:?}", server.keys().collect::<Vec<_>>());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A cursor reset (410) is reconciled by content.

cluster_test!(a_cursor_reset_is_reconciled_by_content, cursor_reset);

async fn cursor_reset(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "resetter").await?;
    write_file(&ctx.path("b"), "f.txt", b"first")?;
    write_file(&ctx.path("b"), "g.txt", b"gone soon")?;
    write_file(&ctx.path("b"), "same.txt", b"unchanged")?;
    let mut b = ctx.device("b", &[])?;
    ctx.wait_server("three files", |t| t.len() == 3).await?;
    b.wait_status("up to date", CONVERGE, up_to_date).await?;
    ensure!(b.stop().await?.success());
    // While B is off: B's user edits f.txt, another device edits it too and deletes g.txt.
    write_file(&b.dir, "f.txt", b"b's offline edit")?;
    ctx.commit("/f.txt", b"the other device's edit").await?;
    delete_file(&ctx, "/g.txt").await?;
    // B comes back through a proxy whose first feed read answers 410 cursor-reset.
    let proxy = ResetProxy::start(&ctx.url).await?;
    let mut b = SyncDevice::start(&b.dir, &[proxy.url.clone()], &ctx.token, "b-again", &[])?;
    let local = wait_local(&mut b, "reconciled", |t| {
        holds(t, b"b's offline edit")
            && t.get("f.txt").is_some_and(|v| v == b"the other device's edit")
            && !t.contains_key("g.txt")
    })
    .await?;
    ensure!(proxy.fired.load(Ordering::SeqCst), "the proxy never answered 410");
    ensure!(b.logs().contains("comparing the whole tree by content"), "{}", b.log_tail());
    ensure!(local.get("same.txt").is_some_and(|v| v == b"unchanged"));
    let server = ctx.wait_server("the offline edit kept", |t| holds(t, b"b's offline edit")).await?;
    ensure!(server["f.txt"] == b"the other device's edit" && !server.contains_key("g.txt"));
    let trash = String::from_utf8(sync_command(&["trash", "ls", &b.dir.display().to_string()])?.stdout)?;
    ensure!(trash.contains("g.txt"), "g.txt deleted here without the trash: {trash}");
    Ok(())
}

async fn delete_file(ctx: &Ctx, path: &str) -> Result<()> {
    let current: Value = ctx
        .http
        .get(format!("{}/v1/files", ctx.url))
        .query(&[("path", path)])
        .bearer_auth(&ctx.token)
        .send()
        .await?
        .json()
        .await?;
    let base = current["version"].as_u64().context("a version")?;
    let answer = ctx
        .http
        .post(format!("{}/v1/files/delete", ctx.url))
        .bearer_auth(&ctx.token)
        .json(&json!({ "path": path, "baseVersion": base }))
        .send()
        .await?;
    ensure!(answer.status().is_success(), "delete {path}: {}", answer.status());
    Ok(())
}

/// A reverse proxy to one node that answers the first `/v1/sync` read of a non-zero cursor
/// with 410 cursor-reset (as a node restored from a backup would), and passes everything
/// else through.
struct ResetProxy {
    url: String,
    fired: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ResetProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ResetProxy {
    async fn start(upstream: &str) -> Result<ResetProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let fired = Arc::new(AtomicBool::new(false));
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let (upstream, seen) = (upstream.to_string(), fired.clone());
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let (http, upstream, seen) = (http.clone(), upstream.clone(), seen.clone());
            async move { forward(&http, &upstream, &seen, request).await }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ResetProxy { url: format!("http://{addr}"), fired, task })
    }
}

async fn forward(
    http: &reqwest::Client,
    upstream: &str,
    fired: &AtomicBool,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let (parts, body) = request.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    if parts.uri.path() == "/v1/sync" && !target.contains("cursor=0&") && !target.ends_with("cursor=0") {
        if !fired.swap(true, Ordering::SeqCst) {
            let problem = json!({ "type": "cursor-reset", "title": "cursor reset", "status": 410 });
            return (axum::http::StatusCode::GONE, axum::Json(problem)).into_response();
        }
    }
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return axum::http::StatusCode::BAD_REQUEST.into_response();
    };
    let mut outgoing = http.request(parts.method.clone(), format!("{upstream}{target}")).body(bytes);
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            outgoing = outgoing.header(name, value);
        }
    }
    match outgoing.send().await {
        Ok(answer) => {
            let status = answer.status();
            let headers = answer.headers().clone();
            let body = answer.bytes().await.unwrap_or_default();
            let mut response = (status, body).into_response();
            for (name, value) in &headers {
                if name != "content-length" && name != "transfer-encoding" {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            response
        }
        Err(_) => axum::http::StatusCode::BAD_GATEWAY.into_response(),
    }
}

// ---------------------------------------------------------------------------------------
// Ignore rules are each device's own.

cluster_test!(ignore_rules_are_local_and_a_bad_one_pauses, ignore_rules);

async fn ignore_rules(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "ignorer").await?;
    let dir = ctx.path("box");
    write_file(&dir, ".raftboxignore", b"secret.env\ndata/\n")?;
    write_file(&dir, "secret.env", b"API_KEY=do-not-upload")?;
    write_file(&dir, ".DS_Store", b"finder litter")?;
    write_file(&dir, "a.txt", b"a")?;
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("a.txt", |t| t.contains_key("a.txt")).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    // Someone sharing the folder commits ignore rules and a data file.
    ctx.commit("/.raftboxignore", b"*.txt\n!secret.env\n").await?;
    ctx.commit("/data/x.bin", b"big data").await?;
    ctx.commit("/b.txt", b"b").await?;
    wait_local(&mut a, "b.txt", |t| t.contains_key("b.txt")).await?;
    more_passes(&mut a, 1).await?;
    let local = tree(&dir)?;
    ensure!(local[".raftboxignore"] == b"secret.env\ndata/\n", "the server's ignore file was written here");
    ensure!(!local.contains_key("data/x.bin"), "an ignored folder came down");
    let server = ctx.server().await?;
    ensure!(
        !holds(&server, b"API_KEY=do-not-upload") && !server.contains_key(".DS_Store"),
        "{:?}",
        server.keys().collect::<Vec<_>>()
    );
    ensure!(server[".raftboxignore"] == b"*.txt\n!secret.env\n", "the local ignore file went up");
    // A rule taken away: the server's tree is listed again and what it hid comes down.
    write_file(&dir, ".raftboxignore", b"secret.env\n")?;
    wait_local(&mut a, "data/x.bin", |t| t.get("data/x.bin").is_some_and(|b| b == b"big data")).await?;
    // An invalid pattern pauses the folder, saying where; nothing new goes up meanwhile.
    write_file(&dir, ".raftboxignore", b"secret.env\n[z-a].log\n")?;
    let status = a.wait_status("paused", CONVERGE, |s| s["state"] == "paused").await?;
    ensure!(status["reason"].as_str().unwrap_or("").contains("line 2"), "{status}");
    write_file(&dir, "while-paused.txt", b"wait")?;
    more_passes(&mut a, 1).await?;
    ensure!(!ctx.server().await?.contains_key("while-paused.txt"));
    write_file(&dir, ".raftboxignore", b"secret.env\n")?;
    ctx.wait_server("while-paused.txt", |t| t.contains_key("while-paused.txt")).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The mtime and the execute bit travel with the file.

cluster_test!(mtime_and_execute_bit_travel, metadata);

async fn metadata(cluster: &Cluster) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let ctx = Ctx::new(cluster, "meta").await?;
    let a_dir = ctx.path("a");
    write_file(&a_dir, "run.sh", b"#!/bin/sh\necho hi\n")?;
    std::fs::set_permissions(a_dir.join("run.sh"), std::fs::Permissions::from_mode(0o755))?;
    write_file(&a_dir, "old.txt", b"from 2001")?;
    let old = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000_000_123);
    std::fs::File::options().write(true).open(a_dir.join("old.txt")).context("open old.txt")?.set_modified(old)?;
    let mut a = ctx.device("a", &[])?;
    let mut b = ctx.device("b", &[])?;
    wait_local(&mut b, "both files", |t| t.len() == 2).await?;
    let b_dir = b.dir.clone();
    let meta = |path: PathBuf| std::fs::metadata(&path).with_context(|| format!("stat {}", path.display()));
    ensure!(meta(b_dir.join("run.sh"))?.permissions().mode() & 0o111 != 0, "the execute bit was lost");
    ensure!(meta(b_dir.join("old.txt"))?.permissions().mode() & 0o111 == 0);
    ensure!(meta(b_dir.join("old.txt"))?.modified()? == old, "the mtime was not kept");
    // The bit taken away on B reaches A.
    std::fs::set_permissions(b_dir.join("run.sh"), std::fs::Permissions::from_mode(0o644))?;
    let deadline = Deadline::after(CONVERGE, "the execute bit cleared on A");
    while meta(a_dir.join("run.sh"))?.permissions().mode() & 0o111 != 0 {
        a.ensure_running()?;
        deadline.tick(&a.log_tail()).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A viewer's folder is receive-only; a removed namespace stops the client, files kept.

cluster_test!(a_viewers_folder_is_receive_only_and_a_removed_one_stops_the_client, roles);

async fn roles(cluster: &Cluster) -> Result<()> {
    let owner = Ctx::new(cluster, "owner").await?;
    let viewer = Ctx::new(cluster, "viewer").await?;
    let created = create_folder(&owner.http, &owner.url, &owner.token, "team").await?;
    let ns = created.body().and_then(|b| b["namespaceId"].as_str()).context("a namespace")?.to_string();
    let granted =
        grant(&owner.http, &owner.url, &owner.token, &ns, json!({ "userId": viewer.user_id }), "viewer").await?;
    ensure!(granted.is_ok(), "{granted:?}");
    let accepted = accept_invitation(&viewer.http, &viewer.url, &viewer.token, &ns).await?;
    ensure!(accepted.is_ok(), "{accepted:?}");
    commit_as(&owner.http, &owner.url, &owner.token, Some(&ns), "/plan.txt", b"the owner's plan").await?;
    let mut v = viewer.device("team", &["--namespace", &ns])?;
    wait_local(&mut v, "plan.txt", |t| t.contains_key("plan.txt")).await?;
    v.wait_status("up to date", CONVERGE, up_to_date).await?;
    write_file(&v.dir, "plan.txt", b"the viewer's edit")?;
    write_file(&v.dir, "mine.txt", b"the viewer's new file")?;
    let status = v
        .wait_status("changes not sent", CONVERGE, |s| s["report"]["notSent"].as_array().is_some_and(|n| n.len() == 2))
        .await?;
    ensure!(status["readOnly"] == true, "{status}");
    ensure!(status["failuresCount"] == 0, "a viewer's edit must not fail every pass: {status}");
    let server = server_tree(&owner.http, &owner.url, &owner.token, Some(&ns)).await?;
    ensure!(server.len() == 1 && server["plan.txt"] == b"the owner's plan", "{server:?}");
    // --revert puts the server's versions back; the local changes go to the trash.
    v.restart(&["--revert"])?;
    wait_local(&mut v, "reverted", |t| t.len() == 1 && t["plan.txt"] == b"the owner's plan").await?;
    let trash = String::from_utf8(sync_command(&["trash", "ls", &v.dir.display().to_string()])?.stdout)?;
    ensure!(trash.contains("plan.txt") && trash.contains("mine.txt"), "{trash}");
    // The owner deletes the folder: the viewer's client stops, saying why, files kept.
    let deleted =
        owner.http.delete(format!("{}/v1/namespaces/{ns}", owner.url)).bearer_auth(&owner.token).send().await?;
    ensure!(deleted.status().is_success(), "delete the folder: {}", deleted.status());
    let exit = v.wait_exit(CONVERGE).await?;
    ensure!(exit.code() == Some(3), "exit {exit:?}:\n{}", v.log_tail());
    ensure!(v.logs().contains("can no longer be read"), "{}", v.log_tail());
    ensure!(tree(&v.dir)?["plan.txt"] == b"the owner's plan", "the local files were not kept");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Ctrl-C stops the client promptly, even in the middle of a slow upload.

cluster_test!(ctrl_c_stops_the_client_promptly_mid_transfer, ctrl_c);

async fn ctrl_c(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "stopper").await?;
    let file = ctx.path("box/slow.bin");
    write_file(&ctx.path("box"), "slow.bin", &pseudo_bytes("slow", 4_000_000))?;
    // Still for longer than the client's racy window, so the first pass reads and sends it.
    let deadline = Deadline::after(CONVERGE, "the file to be still for 1.5 s");
    while std::fs::metadata(&file)?.modified()?.elapsed().unwrap_or_default() < Duration::from_millis(1_500) {
        deadline.tick("").await?;
    }
    let mut a = ctx.device("box", &["--limit-up", "100K"])?;
    a.wait_status("a pass under way", CONVERGE, |s| s["state"] == "syncing").await?;
    let asked = Instant::now();
    let exit = a.stop().await?;
    ensure!(exit.success(), "{exit:?}");
    ensure!(asked.elapsed() < Duration::from_secs(3), "stopping took {:?}", asked.elapsed());
    ensure!(a.logs().contains("sync: stopped"), "{}", a.log_tail());
    if ctx.server().await?.contains_key("slow.bin") {
        bail!("4 MB went up at 100 KiB/s in under 3 s: the limit was not applied");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A download cut short (kill -9) resumes from the chunks already written.

cluster_test!(a_download_cut_short_resumes_from_its_chunks, resumed_download);

async fn resumed_download(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "resumer").await?;
    let big = pseudo_bytes("twenty megabytes", 20_000_000);
    write_file(&ctx.path("up"), "big.bin", &big)?;
    let _up = ctx.device("up", &[])?;
    ctx.wait_server("big.bin", |t| t.contains_key("big.bin")).await?;
    let mut down = ctx.device("down", &["--limit-down", "2M"])?;
    // Killed once its temporary file holds a few whole chunks.
    let deadline = Deadline::after(CONVERGE, "a few chunks written");
    loop {
        down.ensure_running()?;
        let written = std::fs::read_dir(&down.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(".raftbox-"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        if written >= 4_000_000 {
            break;
        }
        deadline.tick(&format!("{written} bytes written")).await?;
    }
    down.restart(&[])?;
    wait_local(&mut down, "big.bin whole", |t| t.get("big.bin").is_some_and(|b| *b == big)).await?;
    let line = down.logs().lines().find(|l| l.contains("↓ /big.bin")).unwrap_or_default().to_string();
    ensure!(line.contains("resumed"), "the download started over: {line:?}");
    ensure!(tree(&down.dir)?.len() == 1, "a temporary file was left behind");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A folder set up before is never recreated empty: deleted (or its drive's mount point
// left bare) with its state inside it, the client waits.

cluster_test!(a_folder_set_up_before_is_never_recreated_empty, never_recreated);

async fn never_recreated(cluster: &Cluster) -> Result<()> {
    let ctx = Ctx::new(cluster, "recreate").await?;
    write_file(&ctx.path("box"), "keep.txt", b"keep")?;
    let mut a = ctx.device("box", &[])?;
    ctx.wait_server("keep.txt", |t| t.contains_key("keep.txt")).await?;
    a.wait_status("up to date", CONVERGE, up_to_date).await?;
    ensure!(a.stop().await?.success());
    // The folder and its state (inside it) are gone; its place is an empty folder, as a
    // mount point is when its drive is not mounted.
    std::fs::remove_dir_all(&a.dir)?;
    std::fs::create_dir_all(&a.dir)?;
    a.restart(&[])?;
    let deadline = Deadline::after(CONVERGE, "the client waiting for its folder");
    while !a.logs().contains("its state is gone") {
        a.ensure_running()?;
        deadline.tick(&a.log_tail()).await?;
    }
    ensure!(tree(&a.dir)?.is_empty(), "the client wrote into a folder it did not recognise");
    ensure!(!a.dir.join(".raftbox").exists(), "the client set up a folder it had set up before");
    ensure!(ctx.server().await?.contains_key("keep.txt"));
    // Set up anew on purpose: everything comes back.
    a.restart(&["--accept-folder"])?;
    wait_local(&mut a, "keep.txt back", |t| t.get("keep.txt").is_some_and(|b| b == b"keep")).await?;
    Ok(())
}
