//! What `raftbox sync` leaves alone, both ways: the patterns of `DIR/.raftboxignore`
//! (gitignore syntax: `*.log`, `build/`, `/only-at-top`, `!keep.log`, `#` comments), plus
//! always the client's own `.raftbox/` folder and its partial downloads (`*.raftbox-tmp`).

use std::path::Path;

use anyhow::Context;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// The ignore file, at the top of the synced folder.
pub const IGNORE_FILE: &str = ".raftboxignore";
/// The client's own folder (state database).
pub const STATE_DIR: &str = ".raftbox";
/// Suffix of a download being written (renamed into place when complete).
pub const TEMP_SUFFIX: &str = ".raftbox-tmp";

pub struct Rules {
    matcher: Gitignore,
}

impl Rules {
    /// The rules of `root/.raftboxignore` (none if the file does not exist).
    pub fn load(root: &Path) -> anyhow::Result<Rules> {
        let path = root.join(IGNORE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Rules::parse(&text).with_context(|| format!("{}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Rules::parse(""),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<Rules> {
        // The root only anchors patterns; paths are always given relative to it.
        let mut builder = GitignoreBuilder::new("/");
        for (n, line) in text.lines().enumerate() {
            builder.add_line(None, line).with_context(|| format!("line {}: {line:?}", n + 1))?;
        }
        Ok(Rules { matcher: builder.build()? })
    }

    /// Whether the file or folder at `relative` (`a/b.txt`, `/`-separated, no leading `/`)
    /// is left alone.
    pub fn ignored(&self, relative: &str, is_dir: bool) -> bool {
        let relative = relative.trim_start_matches('/');
        let top = relative.split('/').next().unwrap_or("");
        if top == STATE_DIR || relative.ends_with(TEMP_SUFFIX) {
            return true;
        }
        self.matcher.matched_path_or_any_parents(relative, is_dir).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitignore_patterns_and_the_clients_own_files() {
        let rules = Rules::parse("# comment\n*.log\n!keep.log\nbuild/\n/top.txt\n").expect("rules");
        assert!(rules.ignored("a.log", false));
        assert!(rules.ignored("deep/er/b.log", false));
        assert!(!rules.ignored("keep.log", false), "negation re-includes");
        assert!(rules.ignored("build/out.bin", false), "a file under an ignored folder");
        assert!(rules.ignored("src/build/x", false));
        assert!(rules.ignored("top.txt", false));
        assert!(!rules.ignored("sub/top.txt", false), "a leading / anchors at the top");
        assert!(!rules.ignored("notes.txt", false));
        assert!(rules.ignored(".raftbox/state.redb", false));
        assert!(rules.ignored("/.raftbox", true));
        assert!(rules.ignored("sub/.x.txt.raftbox-tmp", false));
        assert!(!Rules::parse("").expect("none").ignored("a.log", false));
    }
}
