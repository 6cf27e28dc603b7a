//! The file watcher that wakes the sync loop: any change in the folder but the client's own
//! `.raftbox/` (its state, trash and temporary files), and there only a confirmation of
//! held deletions.

use std::path::Path;

use anyhow::Context;

use super::names::{self, STATE_DIR};

/// Watches `root` recursively; each batch of relevant changes sends one wake-up on `wake`.
/// The watcher runs as long as the value lives. An error (an unreadable subfolder, more
/// folders than inotify allows) is the caller's to report: the periodic rescan still finds
/// every change.
pub fn watch(root: &Path, wake: tokio::sync::mpsc::Sender<()>) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let state_dir = root.join(STATE_DIR);
    let handler = move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(event) => event.paths.iter().any(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if p.starts_with(&state_dir) {
                    return name == "confirm-deletes";
                }
                !names::is_temp_name(name)
            }),
            Err(_) => true,
        };
        if relevant {
            // Full: a wake-up is already pending, which is all that is needed.
            let _ = wake.try_send(());
        }
    };
    // Never through a link (it could lead the watcher over the whole disk).
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher = notify::RecommendedWatcher::new(handler, config).context("start the file watcher")?;
    watcher.watch(root, notify::RecursiveMode::Recursive).with_context(|| format!("watch {}", root.display()))?;
    Ok(watcher)
}
