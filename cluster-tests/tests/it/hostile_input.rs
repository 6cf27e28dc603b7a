//! Invariant: no input can kill, stall or blind a node (issue 34). The hostile-tenant suite's
//! attacks on what came after it (WebDAV, passwords, share links, whole-file uploads), each
//! while a bystander commits through another node and judged as the suite judges
//! (`bystander::judge`: the term, the bystander's failures and p99, the row printed):
//!
//! 1. WebDAV bodies of 21,000 nested elements (PROPFIND, PROPPATCH, LOCK) to every node: 400,
//!    every node still up.
//! 2. An editor's MOVE with `Destination: …/dav/x\..\Shared`: 400, and the shared folder's
//!    files all still there.
//! 5. 1,100 connections from one address trickling request bodies (logins, and a user's
//!    commits): that address gets its share of the node's places and no more, and another
//!    user's reads on that node answer 200 throughout.
//! 7. A user's password guessed from 60 addresses while the user logs in: every login of
//!    the user succeeds at once.
//! 6. (`spools_cannot_fill_a_nodes_disk`, small disks) A user's uploads trickled and kept
//!    open: refused once the node's disk would keep less than twice its minimum; the alarm is
//!    never raised and the leader never steps down.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use futures_util::StreamExt as _;
use raftbox_cluster_tests::bystander::{judge, term, Attacker, Bystander};
use raftbox_cluster_tests::{create_folder, grant, new_user, within, Cluster, ClusterOptions};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const TEST_DEADLINE: Duration = Duration::from_secs(360);
/// Bystander commits measured before each attack begins: enough that their p99 is not one
/// unlucky sample (of 200, the p99 is the second slowest; CI saw it from 2.2 to 5.2 ms on one
/// machine, so a quiet baseline alone could fail an attack that costs nothing).
const BASELINE_COMMITS: usize = 1_000;
/// How long the deep XML bodies keep coming, at least.
const DEEP_XML_FOR: Duration = Duration::from_secs(4);
/// Nested elements in the deep XML bodies (63 KB with the declaration: under the 64 KiB cap).
const NESTED_ELEMENTS: usize = 21_000;
/// Connections the trickling client opens.
const TRICKLES: usize = 1_100;
/// Each node's disk in the spool test (a tmpfs), and how fast each of its uploads sends.
const SMALL_DISK_MB: u64 = 320;
const UPLOAD_PIECE_INTERVAL: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_xml_backslashes_trickles_and_guesses_hurt_no_one() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, attacks(&cluster)).await;
    cluster.conclude(result);
}

/// The attacks `RAFTBOX_HOSTILE_ONLY` names (comma-separated: `xml,backslash,trickles,
/// guesses`), or all: to run one alone, against another binary too (`RAFTBOX_BIN`).
fn chosen(attack: &str) -> bool {
    std::env::var("RAFTBOX_HOSTILE_ONLY").map_or(true, |only| only.split(',').any(|a| a.trim() == attack))
}

async fn attacks(cluster: &Cluster) -> Result<()> {
    cluster.wait_for_leader(None, Duration::from_secs(20)).await?;
    if chosen("xml") {
        deep_xml(cluster).await?;
    }
    if chosen("backslash") {
        backslash_move(cluster).await?;
    }
    if chosen("trickles") {
        trickles(cluster).await?;
    }
    if chosen("guesses") {
        guesses(cluster).await?;
    }
    Ok(())
}

fn dav(
    cluster: &Cluster,
    node: u64,
    (name, secret): (&str, &str),
    method: &str,
    path: &str,
) -> reqwest::RequestBuilder {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    cluster.client().request(method, format!("{}/dav{path}", cluster.http_url(node))).basic_auth(name, Some(secret))
}

/// Every node answers `/healthz`.
async fn all_up(cluster: &Cluster) -> Result<()> {
    for node in 1..=3 {
        let health = cluster.client().get(format!("{}/healthz", cluster.http_url(node))).send().await;
        ensure!(matches!(&health, Ok(answer) if answer.status() == 200), "node {node} is down: {health:?}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 1. 21,000 nested elements in a PROPFIND, PROPPATCH or LOCK body killed a node.

async fn deep_xml(cluster: &Cluster) -> Result<()> {
    let (_, token) = new_user(cluster, 1, "xml-nester", "laptop").await?;
    let body = format!("<?xml version=\"1.0\"?>{}", "<a>".repeat(NESTED_ELEMENTS));
    ensure!(body.len() < 64 * 1024, "the attack body is under the body cap ({} bytes)", body.len());
    let bystander = Bystander::start_as(cluster, 3, "xml-bystander").await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let mut refused = 0;
    // At least ten rounds, and for long enough that the bystander's p99 is a percentile of
    // many commits, not the slowest of a few dozen.
    let started = Instant::now();
    let mut round = 0;
    while round < 10 || started.elapsed() < DEEP_XML_FOR {
        round += 1;
        for node in 1..=3 {
            for method in ["PROPFIND", "PROPPATCH", "LOCK"] {
                let answer = dav(cluster, node, ("xml-nester", &token), method, "/").body(body.clone()).send().await;
                let status = answer.with_context(|| format!("{method} to node {node}, round {round}"))?.status();
                ensure!(status == 400, "{method} with {NESTED_ELEMENTS} nested elements to node {node}: {status}");
                refused += 1;
            }
        }
        all_up(cluster).await?;
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    let attacker =
        format!("{refused} WebDAV bodies of {NESTED_ELEMENTS} nested elements to 3 nodes, all 400, every node up");
    judge("deep XML to WebDAV", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// 2. A backslash in Destination read as a slash by one parser deleted a shared folder.

async fn backslash_move(cluster: &Cluster) -> Result<()> {
    let (http, url) = (cluster.client(), cluster.http_url(1));
    let (_, alice) = new_user(cluster, 1, "team-owner", "laptop").await?;
    let (bob_id, bob) = new_user(cluster, 1, "team-editor", "laptop").await?;
    let created = create_folder(&http, &url, &alice, "Team").await?;
    let team = created.body().and_then(|b| b["namespaceId"].as_str()).context("a folder")?.to_owned();
    ensure!(grant(&http, &url, &alice, &team, json!({ "userId": bob_id }), "editor").await?.is_ok(), "grant");
    let accepted = http.post(format!("{url}/v1/namespaces/{team}/accept")).bearer_auth(&bob).send().await?;
    ensure!(accepted.status().is_success(), "bob accepts: {}", accepted.status());
    let files = ["/a.txt", "/b.txt", "/c.txt"];
    for path in files {
        let put = dav(cluster, 1, ("team-owner", &alice), "PUT", &format!("/Shared/Team{path}"))
            .body("alice's")
            .send()
            .await?;
        ensure!(put.status() == 201, "alice PUT {path}: {}", put.status());
    }
    let mine = dav(cluster, 2, ("team-editor", &bob), "PUT", "/mine.txt").body("bob's").send().await?;
    ensure!(mine.status() == 201, "bob PUT /mine.txt: {}", mine.status());
    let bystander = Bystander::start_as(cluster, 3, "move-bystander").await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let host = cluster.http_url(2);
    let mut refused = 0;
    for destination in [
        format!("{host}/dav/x\\..\\Shared"),
        format!("{host}/dav/x\\..\\Shared\\Team"),
        "/dav/x\\..\\Shared".to_string(),
        format!("{host}/dav/Shared/Team/..\\..\\Shared"),
    ] {
        for node in 1..=3 {
            let answer = dav(cluster, node, ("team-editor", &bob), "MOVE", "/mine.txt")
                .header("Destination", destination.clone())
                .header("Overwrite", "T")
                .send()
                .await?;
            ensure!(
                answer.status() == 400,
                "MOVE with Destination {destination:?} through node {node}: {}",
                answer.status()
            );
            refused += 1;
        }
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    for path in files {
        let file = http
            .get(format!("{}/v1/files", cluster.http_url(3)))
            .query(&[("path", path), ("namespaceId", team.as_str())])
            .bearer_auth(&alice)
            .send()
            .await?;
        ensure!(file.status() == 200, "alice's {path} in Team is gone: {}", file.status());
    }
    let attacker = format!("{refused} MOVEs by an editor onto x\\..\\Shared, all 400; the folder's 3 files all there");
    judge("backslash Destination", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// 5. 1,100 connections trickling login bodies took every place of a node's front door.

/// Opens a connection from `from` to `to` and sends the head of `request` with a body of
/// `length` bytes, of which it sends the first byte only; the connection is kept.
async fn start_trickle(from: IpAddr, to: SocketAddr, head: String) -> Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let mut stream = socket.connect(to).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(b"{").await?;
    Ok(stream)
}

/// What a trickling connection got before the test ended it: a status line, or nothing.
async fn answer_of(mut stream: tokio::net::TcpStream) -> Option<u16> {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_millis(20), stream.read(&mut buf)).await {
        Ok(Ok(n)) if n >= 12 => std::str::from_utf8(&buf[9..12]).ok()?.parse().ok(),
        _ => None,
    }
}

async fn trickles(cluster: &Cluster) -> Result<()> {
    let (_, attacker) = new_user(cluster, 1, "trickler", "laptop").await?;
    let (_, reader) = new_user(cluster, 1, "reader", "laptop").await?;
    let bystander = Bystander::start_as(cluster, 3, "trickle-bystander").await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let node: SocketAddr = cluster.http_url(1).trim_start_matches("http://").parse()?;
    let from: IpAddr = "127.0.0.2".parse()?;
    let mut held = Vec::new();
    for i in 0..TRICKLES {
        // Half unauthenticated logins, half a user's commits: both carry a body that never ends.
        let head = if i % 2 == 0 {
            format!("POST /v1/login HTTP/1.1\r\nHost: {node}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        } else {
            format!(
                "POST /v1/files/commit HTTP/1.1\r\nHost: {node}\r\nAuthorization: Bearer {attacker}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
        };
        held.push(start_trickle(from, node, head).await?);
    }
    // Meanwhile another user reads through the same node, from another address.
    let started = Instant::now();
    let (mut reads, mut slowest) = (0, Duration::ZERO);
    while started.elapsed() < Duration::from_secs(6) {
        let asked = Instant::now();
        let me = cluster.client().get(format!("{}/v1/me", cluster.http_url(1))).bearer_auth(&reader).send().await?;
        ensure!(me.status() == 200, "the reader's GET /v1/me during the trickles: {}", me.status());
        slowest = slowest.max(asked.elapsed());
        reads += 1;
    }
    let ready = cluster.client().get(format!("{}/readyz", cluster.http_url(1))).send().await?.status();
    let mut answered = std::collections::BTreeMap::<Option<u16>, usize>::new();
    for stream in held {
        *answered.entry(answer_of(stream).await).or_default() += 1;
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    all_up(cluster).await?;
    let still_open = answered.get(&None).copied().unwrap_or(0);
    ensure!(still_open <= 512, "the trickling address held {still_open} places: more than its share");
    let attacker = format!(
        "{TRICKLES} connections from 127.0.0.2 trickling bodies (answers {answered:?}); {reads} reads by another user \
         all 200, slowest {:.0} ms; /readyz {ready}",
        slowest.as_secs_f64() * 1e3
    );
    judge("trickled bodies at the front door", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// 7. Ten guesses a minute at a name locked its user out of login and WebDAV.

async fn guesses(cluster: &Cluster) -> Result<()> {
    let (user_id, _) = new_user(cluster, 1, "guessed", "laptop").await?;
    raftbox_cluster_tests::set_password(cluster, &user_id, "the user's own password").await?;
    let bystander = Bystander::start_as(cluster, 3, "guess-bystander").await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    let url = cluster.http_url(1);
    let guesser = {
        let url = url.clone();
        Attacker::spawn("guesser", move || async move {
            let mut tries = std::collections::BTreeMap::<u16, usize>::new();
            // One client per address, made once: the guesser's own work (a client's setup per
            // guess) is not charged to the node as a slower bystander on a shared machine.
            let guessers: Vec<reqwest::Client> = (0..60u8)
                .filter_map(|i| {
                    let from: IpAddr = format!("127.0.3.{}", i + 1).parse().expect("an address");
                    reqwest::Client::builder().local_address(from).build().ok()
                })
                .collect();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(6) {
                for (i, http) in guessers.iter().enumerate() {
                    let guess = json!({ "name": "guessed", "password": format!("guess number {i}") });
                    if let Ok(answer) = http.post(format!("{url}/v1/login")).json(&guess).send().await {
                        *tries.entry(answer.status().as_u16()).or_default() += 1;
                    }
                }
            }
            tries
        })?
    };
    let mut logins = 0;
    // The user's own logins, twice a second: within the address's attempts a minute.
    let mut pace = tokio::time::interval(Duration::from_millis(500));
    while !guesser.is_finished() {
        pace.tick().await;
        let right = json!({ "name": "guessed", "password": "the user's own password" });
        let answer = cluster.client().post(format!("{url}/v1/login")).json(&right).send().await?;
        ensure!(answer.status() == 201, "the user's own login during the guesses: {}", answer.status());
        let dav = dav(cluster, 1, ("guessed", "the user's own password"), "PROPFIND", "/")
            .header("Depth", "0")
            .send()
            .await?;
        ensure!(dav.status() == 207, "the user's WebDAV login during the guesses: {}", dav.status());
        logins += 1;
    }
    let tries = guesser.finish().await?;
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    let wrong = tries.get(&401).copied().unwrap_or(0);
    ensure!(wrong > 0, "no guess was checked: {tries:?}");
    let attacker = format!(
        "guesses at one name from 60 addresses ({tries:?}); the user's {logins} logins and WebDAV logins all passed"
    );
    judge("password guesses at a name", &attacker, baseline, during, (before, after))
}

// ---------------------------------------------------------------------------------------
// 6. Uploads kept open by a byte every 50 s held a node below its disk minimum.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spools_cannot_fill_a_nodes_disk() {
    let options = ClusterOptions {
        small_disks_mb: Some(SMALL_DISK_MB),
        extra_toml: "[quotas]\nstored_bytes_per_user = 10737418240\n".into(),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(options).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, spools(&cluster)).await;
    cluster.conclude(result);
}

/// `raftbox_disk_full` on node `node` (1 raised).
async fn disk_alarm(cluster: &Cluster, node: u64) -> Result<bool> {
    let text = cluster.client().get(format!("{}/metrics", cluster.http_url(node))).send().await?.text().await?;
    Ok(text.lines().any(|line| line.starts_with("raftbox_disk_full") && line.trim_end().ends_with(" 1")))
}

async fn spools(cluster: &Cluster) -> Result<()> {
    cluster.wait_for_leader(None, Duration::from_secs(20)).await?;
    let (_, token) = new_user(cluster, 2, "spooler", "laptop").await?;
    let bystander = Bystander::start_as(cluster, 3, "spool-bystander").await?;
    bystander.wait_for(BASELINE_COMMITS).await?;
    let before = term(cluster, 1).await?;
    let mark = bystander.count();
    // Four uploads at once (a user's most on a node), no declared length, 1 MiB every 50 ms
    // each, more in all than the disk holds: each must be refused before the disk gets near
    // its minimum, and give its bytes back.
    let chunk = vec![7u8; 1 << 20];
    let mut uploads = Vec::new();
    for i in 0..4 {
        let (http, url, token, chunk) = (cluster.client(), cluster.http_url(2), token.clone(), chunk.clone());
        uploads.push(tokio::spawn(async move {
            let pieces = futures_util::stream::iter(0..400).then(move |_| {
                let chunk = chunk.clone();
                async move {
                    tokio::time::sleep(UPLOAD_PIECE_INTERVAL).await;
                    Ok::<_, std::io::Error>(chunk)
                }
            });
            let body = pieces;
            let answer = http
                .put(format!("{url}/v1/files/content"))
                .query(&[("path", format!("/big-{i}.bin"))])
                .bearer_auth(&token)
                .body(reqwest::Body::wrap_stream(body))
                .send()
                .await;
            answer.map(|a| a.status().as_u16()).unwrap_or(0)
        }));
    }
    let mut alarms = 0;
    let watching = Instant::now();
    while uploads.iter().any(|u| !u.is_finished()) && watching.elapsed() < Duration::from_secs(120) {
        if disk_alarm(cluster, 2).await? {
            alarms += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = Vec::new();
    for upload in uploads {
        statuses.push(upload.await?);
    }
    let after = term(cluster, 1).await?;
    let (baseline, during) = bystander.stop(mark).await;
    ensure!(alarms == 0, "node 2 raised its disk alarm {alarms} times under the uploads");
    ensure!(statuses.iter().all(|s| *s == 503 || *s == 0), "uploads larger than the disk answered {statuses:?}");
    let attacker =
        format!("4 uploads of 400 MiB into a {SMALL_DISK_MB} MiB disk: {statuses:?} (503: no room), no disk alarm");
    judge("uploads kept open to fill a disk", &attacker, baseline, during, (before, after))
}
