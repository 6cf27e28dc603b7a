//! Invariant: on a file system that folds names (case-insensitive and Unicode-normalising, as
//! macOS, Windows and ext4 `casefold`), `raftbox sync` keeps both of two server names that
//! are one name there (the second as `NAME (case conflict).EXT`, its edits going back to its
//! own server path), and a rename that only changes case — made there or elsewhere — is a
//! rename, never a delete.
//!
//! The folding file system is ext4 with `casefold` on a loop device where the kernel has it
//! (`/sys/fs/ext4/features/casefold`); otherwise (a kernel without CONFIG_UNICODE, as the
//! test machines) `tests/data/ci_fuse.py`, a case-insensitive, case-preserving FUSE file
//! system with the same lookup rules (fuse3 and the mfusepy module: scripts/test installs
//! both). Either way the client meets a real mount and probes it itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use raftbox_cluster_tests::sync_device::{self, holds, tree, write_file, SyncDevice, Tree};
use raftbox_cluster_tests::{new_user, within, Cluster, ClusterOptions, Deadline};

const TEST_DEADLINE: Duration = Duration::from_secs(150);
const CONVERGE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colliding_names_are_kept_apart_and_case_renames_never_delete() {
    let cluster = Cluster::start(ClusterOptions::default()).await.expect("start the cluster");
    let result = within(TEST_DEADLINE, scenario(&cluster)).await;
    cluster.conclude(result);
}

/// A mounted folding file system, unmounted when dropped.
struct FoldingFs {
    mountpoint: PathBuf,
    fuse: Option<Child>,
    image: Option<PathBuf>,
}

impl FoldingFs {
    async fn mount(work: &Path) -> Result<FoldingFs> {
        let mountpoint = work.join("folding");
        std::fs::create_dir_all(&mountpoint)?;
        if Path::new("/sys/fs/ext4/features/casefold").exists() {
            return FoldingFs::ext4_casefold(work, mountpoint);
        }
        let backing = work.join("folding-backing");
        std::fs::create_dir_all(&backing)?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ci_fuse.py");
        let child = Command::new("python3")
            .arg(&script)
            .arg(&backing)
            .arg(&mountpoint)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("ci_fuse.log"))?)
            .spawn()
            .context("start ci_fuse.py (python3 with mfusepy, and fuse3: scripts/test installs them)")?;
        let mut fs = FoldingFs { mountpoint, fuse: Some(child), image: None };
        let deadline = Deadline::after(Duration::from_secs(15), "the FUSE file system to be mounted");
        while !fs.mounted()? {
            if let Some(child) = &mut fs.fuse {
                if let Some(status) = child.try_wait()? {
                    let log = std::fs::read_to_string(work.join("ci_fuse.log")).unwrap_or_default();
                    bail!("ci_fuse.py exited ({status}) before mounting:\n{log}");
                }
            }
            deadline.tick("not mounted yet").await?;
        }
        Ok(fs)
    }

    /// ext4 with `casefold` on a loop device, the synced folder with `chattr +F`.
    fn ext4_casefold(work: &Path, mountpoint: PathBuf) -> Result<FoldingFs> {
        let image = work.join("casefold.img");
        run(Command::new("truncate").args(["-s", "64M"]).arg(&image))?;
        run(Command::new("mkfs.ext4").args(["-q", "-O", "casefold"]).arg(&image))?;
        run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mountpoint))?;
        let fs = FoldingFs { mountpoint, fuse: None, image: Some(image) };
        std::fs::create_dir_all(fs.mountpoint.join("box"))?;
        run(Command::new("chattr").arg("+F").arg(fs.mountpoint.join("box")))?;
        Ok(fs)
    }

    fn mounted(&self) -> Result<bool> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        let target = self.mountpoint.to_string_lossy();
        Ok(mounts.lines().any(|line| line.split(' ').nth(4) == Some(target.as_ref())))
    }
}

impl Drop for FoldingFs {
    fn drop(&mut self) {
        let unmount = if self.fuse.is_some() { "fusermount3" } else { "umount" };
        let mut command = Command::new(unmount);
        if self.fuse.is_some() {
            command.arg("-u");
        }
        let _ = command.arg(&self.mountpoint).status();
        if let Some(mut child) = self.fuse.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

fn run(command: &mut Command) -> Result<()> {
    let output = command.output().with_context(|| format!("run {command:?}"))?;
    ensure!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

async fn wait_tree(device: &mut SyncDevice, what: &str, holds: impl Fn(&Tree) -> bool) -> Result<Tree> {
    device.wait_tree(what, CONVERGE, holds).await
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let (_, token) = new_user(cluster, 1, "folder", "folder-token").await?;
    let (http, url) = (cluster.client(), cluster.http_url(1));
    let work = tempfile::tempdir()?;
    let folding = FoldingFs::mount(work.path()).await?;
    let endpoints = cluster.http_urls(&[1, 2, 3]);
    // B: an ordinary case-sensitive folder holding names that are one name where names fold.
    let b_dir = work.path().join("b");
    let nfc = "caf\u{e9}.txt";
    let nfd = "cafe\u{301}.txt";
    for (name, content) in [
        ("README.md", "upper"),
        ("readme.md", "lower"),
        ("Notes.txt", "notes"),
        ("Plan.txt", "plan"),
        (nfc, "composed"),
        (nfd, "decomposed"),
    ] {
        write_file(&b_dir, name, content.as_bytes())?;
    }
    let mut b = SyncDevice::start(&b_dir, &endpoints, &token, "b", &[])?;
    wait_server(&http, &url, &token, "six files", |t| t.len() == 6).await?;
    // A: the same namespace on the folding file system.
    let mut a = SyncDevice::start(&folding.mountpoint.join("box"), &endpoints, &token, "a", &[])?;
    let local = wait_tree(&mut a, "all six contents", |t| {
        t.len() == 6
            && ["upper", "lower", "notes", "plan", "composed", "decomposed"].iter().all(|c| holds(t, c.as_bytes()))
    })
    .await?;
    ensure!(a.logs().contains("folds names"), "the client did not find the file system folds names:\n{}", a.log_tail());
    let conflict =
        local.keys().find(|k| k.starts_with("readme (case conflict)") || k.starts_with("README (case conflict)"));
    let conflict =
        conflict.with_context(|| format!("no case conflict name: {:?}", local.keys().collect::<Vec<_>>()))?.clone();
    // An edit of the case-conflict file goes back to its own server path.
    let own = if local[&conflict] == b"lower" { "readme.md" } else { "README.md" };
    write_file(&a.dir, &conflict, b"edited on the folding side")?;
    let server = wait_server(&http, &url, &token, "the edit on its own path", |t| {
        t.get(own).is_some_and(|c| c == b"edited on the folding side")
    })
    .await?;
    ensure!(server.len() == 6, "{:?}", server.keys().collect::<Vec<_>>());
    // A case-only rename on the folding side is a rename, not a delete.
    std::fs::rename(a.dir.join("Notes.txt"), a.dir.join("notes.txt"))?;
    let server = wait_server(&http, &url, &token, "Notes.txt renamed", |t| {
        t.get("notes.txt").is_some_and(|c| c == b"notes") && !t.contains_key("Notes.txt")
    })
    .await?;
    ensure!(server.len() == 6, "{:?}", server.keys().collect::<Vec<_>>());
    wait_tree(&mut b, "notes.txt on B", |t| t.get("notes.txt").is_some_and(|c| c == b"notes")).await?;
    // A case-only rename made elsewhere is a rename here.
    std::fs::rename(b.dir.join("Plan.txt"), b.dir.join("PLAN.txt"))?;
    let deadline = Deadline::after(CONVERGE, "PLAN.txt under its new name on the folding side");
    loop {
        a.ensure_running()?;
        let names: Vec<String> =
            std::fs::read_dir(&a.dir)?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        if names.iter().any(|n| n == "PLAN.txt") && !names.iter().any(|n| n == "Plan.txt") {
            break;
        }
        deadline.tick(&format!("{names:?}\n{}", a.log_tail())).await?;
    }
    ensure!(std::fs::read(a.dir.join("PLAN.txt"))? == b"plan");
    // Everything converged, nothing lost, nothing failed.
    let b_tree = wait_tree(&mut b, "B like the server", |_| true).await?;
    let server = wait_server(&http, &url, &token, "the server like B", |t| *t == b_tree).await?;
    let local = tree(&a.dir)?;
    for content in server.values() {
        ensure!(holds(&local, content), "the folding side lacks a server file's content");
    }
    ensure!(a.status()?["failuresCount"] == 0, "{}", a.status()?);
    drop(a);
    drop(b);
    drop(folding);
    Ok(())
}

async fn wait_server(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    what: &str,
    holds: impl Fn(&Tree) -> bool,
) -> Result<Tree> {
    sync_device::wait_server(http, url, token, CONVERGE, what, holds).await
}
