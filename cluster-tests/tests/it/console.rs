//! The web console in a real browser (headless Chromium through chromedriver): a user logs
//! in with a token, sees the cluster's members, browses to a file with two versions, opens
//! its history, downloads the old version (the saved bytes compared) and restores it, and
//! finds a job's run; a folder shared with it as a viewer shows its files' history with no
//! restore; an API refusal is shown; a file whose name looks like HTML shows as text.
//! Screenshots go to `<target>/console-screenshots/`.
//!
//! The everyday actions, in a second run: a new folder; uploads by the file picker (a file
//! of three pieces) and by drag and drop; an upload that resumes from the piece a failed one
//! stored; rename and delete; usage against the quota; a shared folder made, a user invited
//! as an editor and removed again. Each result is checked through the API.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use raftbox_cluster_tests::webdriver::Browser;
use raftbox_cluster_tests::{
    accept_invitation, create_folder, grant, new_user, put_block, within, Cluster, ClusterOptions, Deadline, Seed,
};
use serde_json::{json, Value};

const TEST_DEADLINE: Duration = Duration::from_secs(90);
/// How long the page may take to show what a step awaits.
const PAGE_WAIT: Duration = Duration::from_secs(15);
const FIRST: &[u8] = b"first version of the report\n";
const SECOND: &[u8] = b"second version of the report, somewhat longer\n";
/// A name the console must show as text, never as markup.
const MARKUP_NAME: &str = "<img src=x onerror=alert(1)>.txt";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_logs_in_browses_history_and_finds_job_runs() {
    let seed = Seed::new("console::console_logs_in_browses_history_and_finds_job_runs");
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster, &seed)).await;
    cluster.conclude(result);
}

/// `<target>/console-screenshots/<name>`, emptied (see [`screenshot_dir`]).
fn screenshot_dir_named(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe.ancestors().nth(3).context("target directory above the test executable")?;
    let dir = target.join("console-screenshots").join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `<target>/console-screenshots`, emptied: beside `debug/` in the directory of this test
/// executable (`<target>/debug/deps/cluster-…`).
fn screenshot_dir() -> Result<PathBuf> {
    screenshot_dir_named("")
}

async fn commit(http: &reqwest::Client, url: &str, token: &str, path: &str, data: &[u8], base: u64) -> Result<u64> {
    commit_in(http, url, token, None, path, data, base).await
}

/// A commit of `data` at `path` in `namespace` (default: the caller's personal one).
async fn commit_in(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    namespace: Option<&str>,
    path: &str,
    data: &[u8],
    base: u64,
) -> Result<u64> {
    let chunk = put_block(http, url, token, data).await?;
    let mut body = json!({ "path": path, "chunks": [chunk], "baseVersion": base, "size": data.len(), "mtime": 0 });
    if let Some(namespace) = namespace {
        body["namespaceId"] = json!(namespace);
    }
    let response = http.post(format!("{url}/v1/files/commit")).bearer_auth(token).json(&body).send().await?;
    ensure!(response.status().as_u16() == 201, "commit {path}: {}", response.status());
    let body: Value = response.json().await?;
    body["version"].as_u64().context("version")
}

async fn get(http: &reqwest::Client, url: &str, token: &str) -> Result<Value> {
    let response = http.get(url).bearer_auth(token).send().await?;
    ensure!(response.status().is_success(), "GET {url}: {}", response.status());
    Ok(response.json().await?)
}

/// The static files: no token needed, right content types, a strict policy; the API still
/// demands a token.
async fn check_static_files(http: &reqwest::Client, url: &str) -> Result<()> {
    for (path, content_type) in
        [("/", "text/html"), ("/console/app.js", "text/javascript"), ("/console/style.css", "text/css")]
    {
        let response = http.get(format!("{url}{path}")).send().await?;
        ensure!(response.status().as_u16() == 200, "GET {path}: {}", response.status());
        let headers = response.headers();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        ensure!(
            header("content-type").starts_with(content_type),
            "GET {path}: content type {}",
            header("content-type")
        );
        let policy = header("content-security-policy");
        ensure!(
            policy.contains("default-src 'none'") && policy.contains("script-src 'self'") && !policy.contains("unsafe"),
            "GET {path}: policy {policy:?}"
        );
        ensure!(header("x-content-type-options") == "nosniff", "GET {path}: no nosniff");
    }
    let missing = http.get(format!("{url}/console/nope.js")).send().await?;
    ensure!(missing.status().as_u16() == 404, "unknown console file: {}", missing.status());
    let anonymous = http.get(format!("{url}/v1/me")).send().await?;
    ensure!(anonymous.status().as_u16() == 401, "GET /v1/me without a token: {}", anonymous.status());
    Ok(())
}

async fn scenario(cluster: &Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let n1 = cluster.http_url(1);
    let name = format!("console-{}", seed.value());
    let team = format!("team-{}", seed.value());
    let (user_id, token) = new_user(cluster, 1, &name, "browser").await?;
    raftbox_cluster_tests::set_password(cluster, &user_id, CONSOLE_PASSWORD).await?;
    check_static_files(&http, &cluster.http_url(2)).await?;

    // A file with two versions, a file named like markup, and a job that has run.
    ensure!(commit(&http, &n1, &token, "/docs/report.txt", FIRST, 0).await? == 1, "first version");
    ensure!(commit(&http, &n1, &token, "/docs/report.txt", SECOND, 1).await? == 2, "second version");
    commit(&http, &n1, &token, &format!("/docs/{MARKUP_NAME}"), b"x", 0).await?;
    // A folder another user shares with this one as a viewer: listed, but not restorable.
    let (_, owner_token) = new_user(cluster, 1, &format!("{name}-owner"), "owner").await?;
    let folder = create_folder(&http, &n1, &owner_token, &team).await?;
    let team_id = folder.body().and_then(|b| b["namespaceId"].as_str()).context("namespaceId")?.to_owned();
    commit_in(&http, &n1, &owner_token, Some(&team_id), "/plan.txt", FIRST, 0).await?;
    commit_in(&http, &n1, &owner_token, Some(&team_id), "/plan.txt", SECOND, 1).await?;
    let granted = grant(&http, &n1, &owner_token, &team_id, json!({ "userName": name }), "viewer").await?;
    ensure!(granted.is_ok(), "grant viewer: {granted:?}");
    let accepted = accept_invitation(&http, &n1, &token, &team_id).await?;
    ensure!(accepted.is_ok(), "accept: {accepted:?}");
    let job =
        json!({ "type": "noop", "payload": {}, "schedule": { "runAt": "2020-01-01T00:00:00Z" }, "maxRetries": 0 });
    let response = http.post(format!("{n1}/v1/jobs")).bearer_auth(&token).json(&job).send().await?;
    ensure!(response.status().as_u16() == 201, "create job: {}", response.status());
    let job_id = response.json::<Value>().await?["jobId"].as_str().context("jobId")?.to_owned();
    let ran = Deadline::after(Duration::from_secs(20), format!("a finished run of job {job_id}"));
    loop {
        let runs = get(&http, &format!("{n1}/v1/jobs/{job_id}/runs"), &token).await?;
        if runs["runs"][0]["finishedAt"].is_string() {
            break;
        }
        ran.tick(&runs.to_string()).await?;
    }

    // Only the leader knows each member's replication; followers say null.
    let leader = cluster.leader_id().await.context("a leader")?;
    let follower = if leader == 1 { 2 } else { 1 };
    let deadline = Deadline::after(Duration::from_secs(10), "the leader's view of every follower");
    loop {
        let view = cluster.cluster_info(leader).await?;
        let matched: Vec<u64> = view["replication"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["nodeId"] != leader && r["matchedIndex"].is_u64())
            .filter_map(|r| r["nodeId"].as_u64())
            .collect();
        if matched.len() == 2 {
            break;
        }
        deadline.tick(&view.to_string()).await?;
    }
    ensure!(cluster.cluster_info(follower).await?["replication"].is_null(), "a follower reports replication");

    let shots = screenshot_dir()?;
    let browser = Browser::start(1280, 900).await?;
    let mut result = browse(&browser, &cluster.http_url(follower), &name, &team, &token, &job_id, &shots).await;
    if result.is_ok() {
        result = leader_view(&browser, &cluster.http_url(leader), &token, &shots).await;
    }
    if result.is_err() {
        let _ = browser.screenshot(&shots.join("failure.png")).await;
    }
    browser.close().await?;
    result?;

    // The restore the browser asked for is the cluster's current version, with v1's content.
    let current = get(&http, &format!("{n1}/v1/files?path=/docs/report.txt"), &token).await?;
    ensure!(current["version"] == 3 && current["size"] == FIRST.len(), "after the restore: {current}");
    Ok(())
}

/// The browser user's password (set by the admin before the browser starts).
const CONSOLE_PASSWORD: &str = "a console password";

async fn browse(
    browser: &Browser,
    url: &str,
    name: &str,
    team: &str,
    token: &str,
    job_id: &str,
    shots: &std::path::Path,
) -> Result<()> {
    browser.goto(&format!("{url}/")).await?;
    browser.wait_for("#token", "", PAGE_WAIT).await?;
    // Logged out: no navigation and no "Log out" on the page.
    let shown = browser
        .script("return ['nav', 'who'].filter(id => getComputedStyle(document.getElementById(id)).display !== 'none');")
        .await?;
    ensure!(shown == serde_json::json!([]), "shown while logged out: {shown}");
    // Name and password: a wrong password is refused with a visible error; the right one
    // logs in (a session token from POST /v1/login); then log out.
    browser.type_into(&browser.wait_for("#login-name", "", PAGE_WAIT).await?, name).await?;
    browser.type_into(&browser.wait_for("#login-password", "", PAGE_WAIT).await?, "not the password").await?;
    browser.click(&browser.wait_for("#password-submit", "Log in", PAGE_WAIT).await?).await?;
    browser.wait_for("#error", "401", PAGE_WAIT).await?;
    browser.script("document.getElementById('login-password').value = ''; return null;").await?;
    browser.type_into(&browser.wait_for("#login-password", "", PAGE_WAIT).await?, CONSOLE_PASSWORD).await?;
    browser.click(&browser.wait_for("#password-submit", "Log in", PAGE_WAIT).await?).await?;
    browser.wait_for("#who-name", name, PAGE_WAIT).await?;
    browser.screenshot(&shots.join("0b-logged-in-with-password.png")).await?;
    browser.click(&browser.wait_for("#logout", "", PAGE_WAIT).await?).await?;
    let input = browser.wait_for("#token", "", PAGE_WAIT).await?;
    // A wrong token is refused with a visible error, and the page stays on the login form.
    browser.type_into(&input, "rbx_not-a-token").await?;
    browser.click(&browser.wait_for("#login-submit", "Use token", PAGE_WAIT).await?).await?;
    browser.wait_for("#error", "401", PAGE_WAIT).await?;
    let input = browser.wait_for("#token", "", PAGE_WAIT).await?;
    browser.script("document.getElementById('token').value = ''; return null;").await?;
    browser.type_into(&input, token).await?;
    browser.click(&browser.wait_for("#login-submit", "Use token", PAGE_WAIT).await?).await?;
    browser.wait_for("#who-name", name, PAGE_WAIT).await?;

    // Cluster status: three members, one leader, a term and an applied index.
    browser.wait_for("#members tbody tr", "leader", PAGE_WAIT).await?;
    let members: Value = browser.script("return document.querySelectorAll('#members tbody tr').length;").await?;
    ensure!(members == 3, "{members} member rows");
    let term = browser.text_of("#cluster-term").await?.unwrap_or_default();
    ensure!(term.parse::<u64>().is_ok_and(|t| t >= 1), "term shown: {term:?}");
    let applied = browser.text_of("#cluster-applied").await?.unwrap_or_default();
    ensure!(applied.parse::<u64>().is_ok_and(|a| a >= 1), "applied index shown: {applied:?}");
    browser.screenshot(&shots.join("1-cluster.png")).await?;

    // Files: into /docs/, where the markup name shows as text.
    browser.click(&browser.wait_for("#nav-files", "Files", PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("tr[data-folder='docs'] button", "docs/", PAGE_WAIT).await?).await?;
    browser.wait_for("tr[data-file='report.txt']", "report.txt", PAGE_WAIT).await?;
    browser.wait_for("#files tbody tr", MARKUP_NAME, PAGE_WAIT).await?;
    let images = browser.script("return document.querySelectorAll('img').length;").await?;
    ensure!(images == 0, "a file name became markup: {images} img elements");
    browser.screenshot(&shots.join("2-files.png")).await?;

    // History: both versions; download v1, then restore it (version 3).
    browser.click(&browser.wait_for("tr[data-file='report.txt'] button.history", "History", PAGE_WAIT).await?).await?;
    browser.wait_for("#history tr[data-version='2']", "2", PAGE_WAIT).await?;
    browser.wait_for("#history tr[data-version='1']", "1", PAGE_WAIT).await?;
    browser
        .click(&browser.wait_for("#history tr[data-version='1'] button.download", "Download", PAGE_WAIT).await?)
        .await?;
    let downloaded = format!("version 1: {} bytes", FIRST.len());
    browser.wait_for("#notice", &downloaded, PAGE_WAIT).await?;
    let saved = browser.download_dir().join("report.txt");
    let deadline = Deadline::after(PAGE_WAIT, format!("{} saved", saved.display()));
    loop {
        // Chromium writes a `.crdownload` file and renames it when the download is complete.
        match std::fs::read(&saved) {
            Ok(bytes) => {
                ensure!(bytes == FIRST, "the downloaded version 1 holds {:?}", String::from_utf8_lossy(&bytes));
                break;
            }
            Err(e) => deadline.tick(&e.to_string()).await?,
        }
    }
    browser.screenshot(&shots.join("3-history.png")).await?;
    browser
        .click(&browser.wait_for("#history tr[data-version='1'] button.restore", "Restore", PAGE_WAIT).await?)
        .await?;
    browser.wait_for("#notice", "as version 3", PAGE_WAIT).await?;
    browser.wait_for("#history tr[data-version='3']", "3", PAGE_WAIT).await?;

    // The shared folder, picked from the namespaces: its file's history, downloadable but
    // with no restore for a viewer.
    browser.click(&browser.wait_for("#history-back", "Back", PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("#namespace option", team, PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("tr[data-file='plan.txt'] button.history", "History", PAGE_WAIT).await?).await?;
    browser.wait_for("#history tr[data-version='1'] button.download", "Download", PAGE_WAIT).await?;
    let restores = browser.find_all("#history button.restore").await?;
    ensure!(restores.is_empty(), "a viewer is offered {} restores", restores.len());
    browser.click(&browser.wait_for("#history-back", "Back", PAGE_WAIT).await?).await?;
    browser.wait_for("tr[data-file='plan.txt']", "plan.txt", PAGE_WAIT).await?;
    let offered = browser.find_all("#upload-button, #new-folder, #drop-zone, button.rename, button.delete").await?;
    ensure!(offered.is_empty(), "a viewer is offered {} changes", offered.len());
    browser.click(&browser.wait_for("tr[data-file='plan.txt'] button.history", "History", PAGE_WAIT).await?).await?;
    browser.screenshot(&shots.join("3b-shared-as-viewer.png")).await?;
    // An API refusal shows as the problem's status and detail.
    browser.goto(&format!("{url}/#/history?path=/docs/nope.txt")).await?;
    browser.wait_for("#error", "404 Not found: no file at /docs/nope.txt", PAGE_WAIT).await?;

    // Jobs: the job, then its run.
    browser.click(&browser.wait_for("#nav-jobs", "Jobs", PAGE_WAIT).await?).await?;
    let row = format!("#jobs tr[data-job='{job_id}']");
    browser.wait_for(&row, "noop", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("4-jobs.png")).await?;
    browser.click(&browser.wait_for(&format!("{row} a.job-link"), job_id, PAGE_WAIT).await?).await?;
    browser.wait_for("#runs-job", job_id, PAGE_WAIT).await?;
    browser.wait_for("#runs tbody tr[data-run]", "SUCCEEDED", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("5-runs.png")).await?;

    // Reloading keeps the session (the token is in sessionStorage) and the page (the fragment).
    browser.script("location.reload(); return null;").await?;
    browser.wait_for("#runs tbody tr[data-run]", "SUCCEEDED", PAGE_WAIT).await?;
    Ok(())
}

/// The leader's console (another origin: log in again) shows each member's matched index
/// and lag.
async fn leader_view(browser: &Browser, url: &str, token: &str, shots: &std::path::Path) -> Result<()> {
    browser.goto(&format!("{url}/#/cluster")).await?;
    let input = browser.wait_for("#token", "", PAGE_WAIT).await?;
    browser.type_into(&input, token).await?;
    browser.click(&browser.wait_for("#login-submit", "Use token", PAGE_WAIT).await?).await?;
    browser.wait_for("#cluster-role", "Leader", PAGE_WAIT).await?;
    let deadline = Deadline::after(PAGE_WAIT, "a matched index and a lag for every member");
    loop {
        let cells: Value = browser
            .script(
                "return [...document.querySelectorAll('#members tbody tr')]\
                 .map(r => [...r.cells].slice(5).map(c => c.textContent));",
            )
            .await?;
        let rows = cells.as_array().map(Vec::as_slice).unwrap_or_default();
        let numeric = |v: &Value| v.as_str().is_some_and(|t| t.parse::<u64>().is_ok());
        if rows.len() == 3 && rows.iter().all(|r| r.as_array().is_some_and(|c| c.len() == 2 && c.iter().all(numeric))) {
            break;
        }
        deadline.tick(&cells.to_string()).await?;
    }
    browser.screenshot(&shots.join("0-cluster-leader.png")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_uploads_and_organizes_files_and_shares_a_folder() {
    let seed = Seed::new("console::console_uploads_and_organizes_files_and_shares_a_folder");
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, everyday(&cluster, &seed)).await;
    cluster.conclude(result);
}

/// Bytes of a test file: `len` of them, different for each `salt`.
fn content(salt: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    blake3::Hasher::new().update(salt.as_bytes()).finalize_xof().fill(&mut out);
    out
}

/// What the cluster holds at `path` of the caller's personal namespace (`None`: no file).
async fn content_at(http: &reqwest::Client, url: &str, token: &str, path: &str) -> Result<Option<Vec<u8>>> {
    let response = http.get(format!("{url}/v1/files/content?path={path}")).bearer_auth(token).send().await?;
    match response.status().as_u16() {
        200 => Ok(Some(response.bytes().await?.to_vec())),
        404 => Ok(None),
        other => anyhow::bail!("GET content of {path}: {other}"),
    }
}

/// CRC-32 (IEEE), as the console checks a resumed upload's pieces with.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffff_u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { 0xedb8_8320 ^ (crc >> 1) } else { crc >> 1 };
        }
    }
    !crc
}

/// The console's upload piece, as `api/console/app.js` cuts them.
const PIECE_BYTES: usize = 4 * 1024 * 1024;

async fn everyday(cluster: &Cluster, seed: &Seed) -> Result<()> {
    let http = cluster.client();
    let url = cluster.http_url(1);
    let name = format!("everyday-{}", seed.value());
    let friend = format!("friend-{}", seed.value());
    let (user_id, token) = new_user(cluster, 1, &name, "browser").await?;
    let (_, friend_token) = new_user(cluster, 1, &friend, "friend").await?;
    let me = get(&http, &format!("{url}/v1/me"), &token).await?;
    let personal = me["namespaceId"].as_str().context("namespaceId")?.to_owned();

    // The files the browser is handed: three pieces; two pieces whose first is stored by an
    // earlier, interrupted upload (its piece list in localStorage, as the console keeps it).
    let files = tempfile::tempdir()?;
    let big = content(&format!("big {}", seed.value()), 2 * PIECE_BYTES + 123);
    let big_path = files.path().join("big.bin");
    std::fs::write(&big_path, &big)?;
    let big_copy = big.clone();
    let resumed = content(&format!("resumed {}", seed.value()), PIECE_BYTES + 77);
    let resumed_path = files.path().join("resumed.bin");
    std::fs::write(&resumed_path, &resumed)?;
    let modified_ms: u64 = 1_700_000_000_000;
    std::fs::File::options()
        .write(true)
        .open(&resumed_path)?
        .set_modified(std::time::UNIX_EPOCH + Duration::from_millis(modified_ms))?;
    let first_piece = put_block(&http, &url, &token, &resumed[..PIECE_BYTES]).await?;
    let resume_key = format!("raftbox.upload:{user_id}:{personal}:/inbox/resumed.bin:{}:{modified_ms}", resumed.len());
    let resume_record = json!({ "pieces": [{ "hash": first_piece, "crc": crc32(&resumed[..PIECE_BYTES]) }] });

    let shots = screenshot_dir_named("everyday")?;
    let browser = Browser::start(1280, 900).await?;
    let mut result =
        organize(&browser, &url, &token, &big_path, &resumed_path, &resume_key, &resume_record, &shots).await;
    if result.is_ok() {
        result = share(&browser, &friend, &seed.value().to_string(), &shots).await;
    }
    if result.is_ok() {
        result = share_link(&browser, &http, &url, &big_copy, &shots).await;
    }
    if result.is_ok() {
        result = hostile_page(&browser, cluster, (&name, &token), (&friend, &friend_token), &shots).await;
    }
    if result.is_err() {
        let _ = browser.screenshot(&shots.join("failure.png")).await;
    }
    browser.close().await?;
    result?;

    // What the browser did, as the cluster holds it.
    ensure!(content_at(&http, &url, &token, "/inbox/big.bin").await? == Some(big), "big.bin as uploaded");
    ensure!(content_at(&http, &url, &token, "/inbox/resumed.bin").await? == Some(resumed), "resumed.bin as uploaded");
    ensure!(content_at(&http, &url, &token, "/inbox/dropped.txt").await?.is_none(), "dropped.txt was renamed");
    ensure!(content_at(&http, &url, &token, "/inbox/renamed.txt").await?.is_none(), "renamed.txt was deleted");
    let history = get(&http, &format!("{url}/v1/files/history?path=/inbox/renamed.txt"), &token).await?;
    ensure!(history["versions"][0]["deleted"] == true, "the deletion is a version: {history}");
    ensure!(history["versions"][1]["size"] == DROPPED.len(), "the renamed content is in the history: {history}");
    Ok(())
}

const DROPPED: &str = "dropped into the console\n";

/// A page a member puts in a shared folder to run script on the console's origin.
const HOSTILE_PAGE: &str = "<!doctype html><html><body><script>localStorage.setItem('pwned', 'yes');\
     document.title = 'pwned';</script>hostile</body></html>";

/// Issue 34, item 3: a member's HTML file, opened by another member in the browser through
/// WebDAV (the URL with its Basic credentials, as a user would paste it): it downloads as an
/// attachment, sandboxed, and no script of it runs on the console's origin.
async fn hostile_page(
    browser: &Browser,
    cluster: &Cluster,
    (owner, owner_token): (&str, &str),
    (member, member_token): (&str, &str),
    shots: &std::path::Path,
) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(1));
    let folder = create_folder(&http, &url, owner_token, "pages").await?;
    let pages = folder.body().and_then(|b| b["namespaceId"].as_str()).context("namespaceId")?.to_owned();
    ensure!(grant(&http, &url, owner_token, &pages, json!({ "userName": member }), "editor").await?.is_ok(), "grant");
    ensure!(accept_invitation(&http, &url, member_token, &pages).await?.is_ok(), "accept");
    let put = http
        .put(format!("{url}/dav/Shared/pages/hostile.html"))
        .basic_auth(member, Some(member_token))
        .body(HOSTILE_PAGE)
        .send()
        .await?;
    ensure!(put.status().as_u16() == 201, "the member's PUT of hostile.html: {}", put.status());
    let host = url.trim_start_matches("http://");
    browser.goto(&format!("http://{owner}:{owner_token}@{host}/dav/Shared/pages/hostile.html")).await?;
    let downloaded = browser.download_dir().join("hostile.html");
    let wait = Deadline::after(PAGE_WAIT, "hostile.html downloaded");
    while std::fs::read(&downloaded).ok().as_deref() != Some(HOSTILE_PAGE.as_bytes()) {
        wait.tick("not yet").await?;
    }
    browser.goto(&url).await?;
    let title = browser.script("return document.title").await?;
    let planted = browser.script("return localStorage.getItem('pwned')").await?;
    browser.screenshot(&shots.join("11-hostile-page-downloaded.png")).await?;
    ensure!(planted.is_null(), "the hostile page's script ran on the console's origin: localStorage {planted}");
    ensure!(title != "pwned", "the hostile page's script ran: title {title}");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn organize(
    browser: &Browser,
    url: &str,
    token: &str,
    big: &std::path::Path,
    resumed: &std::path::Path,
    resume_key: &str,
    resume_record: &Value,
    shots: &std::path::Path,
) -> Result<()> {
    browser.goto(&format!("{url}/#/files")).await?;
    browser.type_into(&browser.wait_for("#token", "", PAGE_WAIT).await?, token).await?;
    browser.click(&browser.wait_for("#login-submit", "Use token", PAGE_WAIT).await?).await?;
    browser.wait_for("#files", "", PAGE_WAIT).await?;

    // A new folder, then into it.
    browser.type_into(&browser.wait_for("#new-folder-name", "", PAGE_WAIT).await?, "inbox").await?;
    browser.click(&browser.wait_for("#new-folder", "New folder", PAGE_WAIT).await?).await?;
    browser.wait_for("#notice", "Made folder /inbox/", PAGE_WAIT).await?;
    browser.click(&browser.wait_for("tr[data-folder='inbox'] button", "inbox/", PAGE_WAIT).await?).await?;
    browser.wait_for("#files", "This folder is empty.", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("6-new-folder.png")).await?;

    // The file picker: three pieces, progress to 100%.
    let picker = browser.wait_for("#upload-input", "", PAGE_WAIT).await?;
    browser.type_into(&picker, &big.display().to_string()).await?;
    browser.wait_for("#notice", "Uploaded 1 file to /inbox/", PAGE_WAIT).await?;
    browser.wait_for("tr[data-file='big.bin']", "8.0 MiB", PAGE_WAIT).await?;
    browser.wait_for("#who-storage", "MiB", PAGE_WAIT).await?;
    browser.wait_for("#who-storage", " of ", PAGE_WAIT).await?;

    // An upload that failed after its first piece: chosen again, it goes on from the second.
    let set =
        format!("localStorage.setItem({}, {}); return null;", json!(resume_key), json!(resume_record.to_string()));
    browser.script(&set).await?;
    let picker = browser.wait_for("#upload-input", "", PAGE_WAIT).await?;
    browser.type_into(&picker, &resumed.display().to_string()).await?;
    browser.wait_for("#uploads .upload.done", "resumed at piece 2 of 2", PAGE_WAIT).await?;
    browser.wait_for("tr[data-file='resumed.bin']", "resumed.bin", PAGE_WAIT).await?;
    let left = browser.script(&format!("return localStorage.getItem({});", json!(resume_key))).await?;
    ensure!(left.is_null(), "the finished upload's pieces are still remembered: {left}");

    // Drag and drop onto the drop zone.
    let drop = format!(
        "const data = new DataTransfer();\
         data.items.add(new File([{}], 'dropped.txt', {{ type: 'text/plain' }}));\
         document.getElementById('drop-zone').dispatchEvent(new DragEvent('drop', {{ dataTransfer: data, bubbles: true, cancelable: true }}));\
         return null;",
        json!(DROPPED)
    );
    browser.script(&drop).await?;
    browser.wait_for("tr[data-file='dropped.txt']", "dropped.txt", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("7-uploads.png")).await?;

    // Rename in the row, then delete (asked twice).
    browser.click(&browser.wait_for("tr[data-file='dropped.txt'] button.rename", "Rename", PAGE_WAIT).await?).await?;
    let input = browser.wait_for("tr[data-file='dropped.txt'] input.rename-input", "", PAGE_WAIT).await?;
    browser.script("document.querySelector('input.rename-input').value = ''; return null;").await?;
    browser.type_into(&input, "renamed.txt").await?;
    browser.screenshot(&shots.join("8-rename.png")).await?;
    browser
        .click(&browser.wait_for("tr[data-file='dropped.txt'] button.rename-save", "Save", PAGE_WAIT).await?)
        .await?;
    browser.wait_for("#notice", "Renamed /inbox/dropped.txt to /inbox/renamed.txt", PAGE_WAIT).await?;
    let delete = browser.wait_for("tr[data-file='renamed.txt'] button.delete", "Delete", PAGE_WAIT).await?;
    browser.click(&delete).await?;
    browser.click(&browser.wait_for("tr[data-file='renamed.txt'] button.delete", "for sure", PAGE_WAIT).await?).await?;
    browser.wait_for("#notice", "Deleted /inbox/renamed.txt", PAGE_WAIT).await?;
    let rows = browser.find_all("tr[data-file='renamed.txt'], tr[data-file='.raftbox-folder']").await?;
    ensure!(rows.is_empty(), "the deleted file or the folder marker is listed");
    Ok(())
}

/// A shared folder made in the console; `friend` invited as an editor, then removed.
async fn share(browser: &Browser, friend: &str, salt: &str, shots: &std::path::Path) -> Result<()> {
    let folder = format!("project-{salt}");
    browser.click(&browser.wait_for("#nav-sharing", "Sharing", PAGE_WAIT).await?).await?;
    browser.type_into(&browser.wait_for("#share-name", "", PAGE_WAIT).await?, &folder).await?;
    browser.click(&browser.wait_for("#share-create", "New shared folder", PAGE_WAIT).await?).await?;
    browser.wait_for("#members-of", &folder, PAGE_WAIT).await?;
    browser.type_into(&browser.wait_for("#grant-name", "", PAGE_WAIT).await?, friend).await?;
    browser.click(&browser.wait_for("#grant-role option[value='editor']", "editor", PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("#grant", "Invite", PAGE_WAIT).await?).await?;
    browser.wait_for("#notice", &format!("Invited user {friend} as editor"), PAGE_WAIT).await?;
    let row = format!("#members-list tr[data-member='{friend}']");
    browser.wait_for(&row, "invited", PAGE_WAIT).await?;
    browser.wait_for(&row, "editor", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("9-members.png")).await?;
    browser.click(&browser.wait_for(&format!("{row} button.revoke"), "Remove", PAGE_WAIT).await?).await?;
    browser.wait_for("#notice", &format!("Removed {friend}"), PAGE_WAIT).await?;
    ensure!(browser.find_all(&row).await?.is_empty(), "{friend} is still listed after removal");
    browser.click(&browser.wait_for("#members-back", "All shared folders", PAGE_WAIT).await?).await?;
    browser.wait_for(&format!("#shares tr[data-share='{folder}']"), "owner", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("9b-shared-folders.png")).await
}

/// A share link to big.bin made in the console: it serves the file to anyone (no token);
/// revoked under Sharing, it answers 404.
async fn share_link(
    browser: &Browser,
    http: &reqwest::Client,
    url: &str,
    big: &[u8],
    shots: &std::path::Path,
) -> Result<()> {
    browser.click(&browser.wait_for("#nav-files", "Files", PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("tr[data-folder='inbox'] button", "inbox/", PAGE_WAIT).await?).await?;
    browser.click(&browser.wait_for("tr[data-file='big.bin'] button.share-link", "Link", PAGE_WAIT).await?).await?;
    let notice = browser.wait_for("#notice", "Share link to /inbox/big.bin", PAGE_WAIT).await?;
    let text = browser.text(&notice).await?;
    let link = text.rsplit(' ').next().context("the link's URL in the notice")?.to_owned();
    ensure!(link.starts_with(url) && link.contains("/s/"), "the link shown: {text}");
    let fetched = http.get(&link).send().await?;
    ensure!(fetched.status().as_u16() == 200, "GET the link: {}", fetched.status());
    ensure!(fetched.bytes().await? == big, "the link serves other bytes than big.bin");
    browser.screenshot(&shots.join("10-share-link.png")).await?;
    browser.click(&browser.wait_for("#nav-sharing", "Sharing", PAGE_WAIT).await?).await?;
    let row = "#links tr[data-link='/inbox/big.bin']";
    browser.wait_for(row, "active", PAGE_WAIT).await?;
    browser.screenshot(&shots.join("10b-links.png")).await?;
    browser.click(&browser.wait_for(&format!("{row} button.revoke-link"), "Revoke", PAGE_WAIT).await?).await?;
    browser.wait_for("#notice", "Revoked the link to /inbox/big.bin", PAGE_WAIT).await?;
    let gone = http.get(&link).send().await?.status().as_u16();
    ensure!(gone == 404, "a revoked link answered {gone}");
    Ok(())
}
