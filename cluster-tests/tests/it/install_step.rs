//! The README's two commands, `scripts/cluster up` and `scripts/test`, prepare a fresh
//! machine through one install step (`scripts/lib/deps.bash`): the build cannot need on one
//! path what only the other installs (a first `scripts/cluster up` once failed for lack of
//! libclang, which only `scripts/test` installed).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Context, Result};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

fn script(name: &str) -> Result<String> {
    let path = repo().join("scripts").join(name);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// The packages `deps_missing what` names on a machine where no command is found.
fn missing_on_a_bare_machine(what: &str) -> Result<Vec<String>> {
    let bare = tempfile::tempdir()?;
    let out = Command::new("/bin/bash")
        .arg("-c")
        .arg(format!("source scripts/lib/deps.bash && deps_missing {what}"))
        .current_dir(repo())
        // Nothing on PATH, no libclang hint: every command-based check finds nothing.
        .env("PATH", bare.path())
        .env_remove("LIBCLANG_PATH")
        .output()?;
    ensure!(out.status.success(), "deps_missing {what}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?.lines().map(str::to_string).collect())
}

#[test]
fn both_readme_commands_install_through_one_step() -> Result<()> {
    let cluster = script("cluster")?;
    let test = script("test")?;
    for (name, text, call) in [("cluster", &cluster, "deps_install build"), ("test", &test, "deps_install test")] {
        ensure!(
            text.contains("source \"$ROOT/scripts/lib/deps.bash\""),
            "scripts/{name} does not source scripts/lib/deps.bash"
        );
        ensure!(text.contains(call), "scripts/{name} does not call `{call}`");
        // No second install step beside the shared one.
        for installer in ["apt-get", "pip install"] {
            ensure!(!text.contains(installer), "scripts/{name} runs {installer} itself, outside scripts/lib/deps.bash");
        }
    }

    // What the build needs is part of what the tests install, so a machine prepared by either
    // builds.
    let build = missing_on_a_bare_machine("build")?;
    let tests = missing_on_a_bare_machine("test")?;
    for package in ["clang", "libclang-dev", "g++", "curl"] {
        ensure!(build.iter().any(|p| p == package), "the build's step lacks {package}: {build:?}");
    }
    for package in &build {
        ensure!(tests.contains(package), "scripts/test would not install {package}, which the build needs");
    }
    ensure!(tests.len() > build.len(), "the tests need more than the build: {tests:?}");

    // On this machine, prepared by scripts/test, nothing the tests need is missing: the
    // step's checks find what it installs.
    let out = Command::new("/bin/bash")
        .arg("-c")
        .arg("source scripts/lib/deps.bash && deps_missing test")
        .current_dir(repo())
        .output()?;
    ensure!(
        out.status.success() && out.stdout.is_empty(),
        "after scripts/test, still missing: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}
