//! Invariant: two `raftbox sync` clients of one user, on two folders, through two different
//! nodes, keep the folders identical (byte for byte) through creates, edits, a rename and
//! deletes on both sides; an edit of one file made on both sides at once ends with both
//! versions on both sides (one as a conflicted copy); a client killed with SIGKILL resumes
//! without sending again what it had synced; when the node one client uses is killed the
//! client carries on through its next endpoint.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use raftbox_cluster_tests::sync_device::{pseudo_bytes as bytes, tree, write_file as write, SyncDevice, Tree};
use raftbox_cluster_tests::{new_user, within, Cluster, ClusterOptions};

const TEST_DEADLINE: Duration = Duration::from_secs(100);
/// How long two folders may take to agree after a change.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(25);
const POLL: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sync_clients_converge_keep_conflicts_and_survive_a_dead_node() {
    let mut cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&mut cluster)).await;
    cluster.conclude(result);
}

fn names(tree: &Tree) -> Vec<&str> {
    tree.keys().map(String::as_str).collect()
}

/// Waits until both folders hold the same files with the same bytes and `expected` holds of
/// that tree; the tree.
async fn converge(
    a: &mut SyncDevice,
    b: &mut SyncDevice,
    what: &str,
    expected: impl Fn(&Tree) -> bool,
) -> Result<Tree> {
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    loop {
        a.ensure_running()?;
        b.ensure_running()?;
        let (left, right) = (tree(&a.dir)?, tree(&b.dir)?);
        if left == right && expected(&left) {
            return Ok(left);
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: the folders did not converge within {CONVERGE_DEADLINE:?}\nA: {:?}\nB: {:?}\nA's log:\n{}\nB's log:\n{}",
                names(&left),
                names(&right),
                a.log_tail(),
                b.log_tail()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn exactly(expected: Tree) -> impl Fn(&Tree) -> bool {
    move |tree| *tree == expected
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let (_, token) = new_user(cluster, 1, "sam", "sam-token").await?;
    let work = tempfile::tempdir()?;
    let (n1, n2, n3) = (cluster.http_url(1), cluster.http_url(2), cluster.http_url(3));
    let mut a = SyncDevice::start(&work.path().join("a"), &[n1.clone(), n3.clone()], &token, "alpha", &[])?;
    let mut b = SyncDevice::start(&work.path().join("b"), &[n2, n3.clone()], &token, "beta", &[])?;

    // Creates on both sides, one of them large enough for several chunks.
    let report = bytes("report", 2_500_000);
    write(&a.dir, "notes.txt", b"hello from a")?;
    write(&a.dir, "docs/report.bin", &report)?;
    write(&b.dir, "todo.txt", b"b's list")?;
    let mut expected: Tree = [
        ("notes.txt".to_string(), b"hello from a".to_vec()),
        ("docs/report.bin".to_string(), report.clone()),
        ("todo.txt".to_string(), b"b's list".to_vec()),
    ]
    .into();
    converge(&mut a, &mut b, "creates", exactly(expected.clone())).await?;

    // An edit and a new file on A; a rename and a delete on B.
    write(&a.dir, "notes.txt", b"hello again from a")?;
    write(&a.dir, "photos/cat.jpg", &bytes("cat", 100_000))?;
    std::fs::rename(b.dir.join("docs/report.bin"), b.dir.join("docs/final.bin"))?;
    std::fs::remove_file(b.dir.join("todo.txt"))?;
    expected.insert("notes.txt".into(), b"hello again from a".to_vec());
    expected.insert("photos/cat.jpg".into(), bytes("cat", 100_000));
    expected.remove("docs/report.bin");
    expected.insert("docs/final.bin".into(), report);
    expected.remove("todo.txt");
    converge(&mut a, &mut b, "edit, rename, delete", exactly(expected.clone())).await?;

    // The same file edited on both sides at once (both clients held still meanwhile).
    a.signal("-STOP")?;
    b.signal("-STOP")?;
    write(&a.dir, "notes.txt", b"alpha's edit")?;
    write(&b.dir, "notes.txt", b"beta's edit")?;
    a.signal("-CONT")?;
    b.signal("-CONT")?;
    let after_conflict = converge(&mut a, &mut b, "simultaneous edit", |tree| {
        let copies: Vec<&Vec<u8>> =
            tree.iter().filter(|(name, _)| name.starts_with("notes (conflicted copy, ")).map(|(_, v)| v).collect();
        let both = [b"alpha's edit".to_vec(), b"beta's edit".to_vec()];
        tree.len() == expected.len() + 1
            && copies.len() == 1
            && tree.get("notes.txt").is_some_and(|current| both.contains(current) && both.contains(copies[0]))
            && copies[0] != &tree["notes.txt"]
    })
    .await?;
    expected = after_conflict;

    // B is killed (kill -9) just after a new file appears, and while it is down a file
    // changes on each side; restarted, it resumes: what it had synced is not sent again,
    // nothing is lost.
    let fresh = bytes("fresh", 6_000_000);
    write(&b.dir, "big/fresh.bin", &fresh)?;
    let current_notes = expected["notes.txt"].clone();
    b.kill9()?;
    write(&a.dir, "notes.txt", b"a's edit while b was down")?;
    write(&b.dir, "offline.txt", b"written while b was down")?;
    b.restart(&[])?;
    ensure!(current_notes != b"a's edit while b was down".to_vec());
    expected.insert("notes.txt".into(), b"a's edit while b was down".to_vec());
    expected.insert("big/fresh.bin".into(), fresh);
    expected.insert("offline.txt".into(), b"written while b was down".to_vec());
    converge(&mut a, &mut b, "B killed and restarted", exactly(expected.clone())).await?;
    let restarted = std::fs::read_to_string(&b.log)?;
    for synced in ["/docs/final.bin", "/photos/cat.jpg", "/notes.txt"] {
        ensure!(!restarted.contains(&format!("↑ {synced} ")), "B sent {synced} again after its restart:\n{restarted}");
    }

    // A's node dies; A carries on through its next endpoint.
    cluster.kill9(1)?;
    write(&a.dir, "after/a.txt", b"written after node 1 died")?;
    std::fs::remove_file(a.dir.join("photos/cat.jpg"))?;
    write(&b.dir, "b2.txt", b"from b, node 1 down")?;
    expected.insert("after/a.txt".into(), b"written after node 1 died".to_vec());
    expected.remove("photos/cat.jpg");
    expected.insert("b2.txt".into(), b"from b, node 1 down".to_vec());
    converge(&mut a, &mut b, "node 1 killed", exactly(expected)).await?;
    let log = std::fs::read_to_string(&a.log)?;
    ensure!(log.contains(&format!("using {n3}")), "A never moved to {n3}:\n{}", a.log_tail());
    Ok(())
}
