//! What `raftbox sync` leaves alone, both ways. The rules are local to each device: the
//! patterns of `DIR/.raftboxignore` (gitignore syntax: `*.log`, `build/`, `/only-at-top`,
//! `!keep.log`, `#` comments), after a few defaults for operating-system and editor litter
//! (which a `!` pattern in the file can take back). The ignore file itself never syncs: it is
//! never uploaded and a server file of that name is never written, so nobody sharing a folder
//! can change what another member's client uploads. Always left alone too: the client's own
//! `.raftbox/` folder and its temporary files.
//!
//! A file with an invalid pattern is refused whole, with the line at fault: syncing pauses
//! until it is fixed, rather than upload what the user meant to keep out.

use std::path::Path;

use anyhow::Context;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::names::{self, IGNORE_FILE, STATE_DIR};

/// Left alone on every device unless `.raftboxignore` says `!pattern`: Finder's and
/// Explorer's metadata, Office lock files, LibreOffice locks, vim swap files.
const DEFAULT_PATTERNS: &[&str] =
    &[".DS_Store", "._*", "Thumbs.db", "desktop.ini", "~$*", ".~lock.*#", "*.swp", "*.swo", ".Trash-*/"];

pub struct Rules {
    matcher: Gitignore,
    /// blake3 of the file's text ("" without one): a change makes the client list the
    /// server's tree again.
    pub fingerprint: String,
}

impl Rules {
    /// The rules of `root/.raftboxignore` (the defaults alone if there is none).
    pub fn load(root: &Path) -> anyhow::Result<Rules> {
        let path = root.join(IGNORE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Rules::parse(&text).with_context(|| format!("{} has an invalid pattern", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Rules::parse(""),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<Rules> {
        // The root only anchors patterns; paths are always given relative to it.
        let mut builder = GitignoreBuilder::new("/");
        for pattern in DEFAULT_PATTERNS {
            builder.add_line(None, pattern)?;
        }
        for (n, line) in text.lines().enumerate() {
            builder.add_line(None, line).with_context(|| format!("line {}: {line:?}", n + 1))?;
        }
        let fingerprint =
            if text.is_empty() { String::new() } else { blake3::hash(text.as_bytes()).to_hex().to_string() };
        Ok(Rules { matcher: builder.build()?, fingerprint })
    }

    /// Whether the file or folder at `relative` (`a/b.txt`, `/`-separated, no leading `/`)
    /// is left alone. As in git, a path beneath an ignored folder is ignored whatever a
    /// later `!` pattern says of it: the walk does not enter such a folder, and the two must
    /// agree (a file taken for unignored but never walked would look deleted).
    pub fn ignored(&self, relative: &str, is_dir: bool) -> bool {
        let relative = relative.trim_start_matches('/');
        let name = relative.rsplit('/').next().unwrap_or("");
        if relative.split('/').any(|c| c == STATE_DIR) || relative == IGNORE_FILE || names::is_temp_name(name) {
            return true;
        }
        let ancestors = relative.match_indices('/').map(|(i, _)| &relative[..i]);
        for folder in ancestors {
            if self.matcher.matched(folder, true).is_ignore() {
                return true;
            }
        }
        self.matcher.matched(relative, is_dir).is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitignore_patterns_defaults_and_the_clients_own_files() {
        let rules = Rules::parse("# comment\n*.log\n!keep.log\nbuild/\n/top.txt\n!.DS_Store\n").expect("rules");
        assert!(rules.ignored("a.log", false));
        assert!(rules.ignored("deep/er/b.log", false));
        assert!(!rules.ignored("keep.log", false), "negation re-includes");
        assert!(rules.ignored("build/out.bin", false), "a file under an ignored folder");
        assert!(rules.ignored("src/build/x", false));
        // A `!` pattern cannot take a file back from an ignored folder (as in git): the walk
        // never enters it, so the file must count as ignored, never as deleted.
        let only_txt = Rules::parse("*\n!*.txt\n").expect("rules");
        assert!(only_txt.ignored("docs", true) && only_txt.ignored("docs/a.txt", false));
        assert!(!only_txt.ignored("a.txt", false));
        assert!(rules.ignored("top.txt", false));
        assert!(!rules.ignored("sub/top.txt", false), "a leading / anchors at the top");
        assert!(!rules.ignored("notes.txt", false));
        assert!(rules.ignored(".raftbox/state.redb", false));
        assert!(rules.ignored("/.raftbox", true));
        assert!(rules.ignored("sub/.raftbox-0123456789abcdef.tmp", false));
        assert!(!rules.ignored("sub/report.raftbox-tmp", false), "a user's file of a similar name syncs");
        assert!(rules.ignored(".raftboxignore", false), "the ignore file is local");
        assert!(!rules.ignored(".DS_Store", false), "a default taken back with !");
        let none = Rules::parse("").expect("none");
        assert!(!none.ignored("a.log", false));
        for litter in ["Thumbs.db", "a/.DS_Store", "~$report.docx", ".~lock.notes.odt#", "x/.main.rs.swp"] {
            assert!(none.ignored(litter, false), "{litter}");
        }
        assert!(none.fingerprint.is_empty() && !rules.fingerprint.is_empty());
    }

    #[test]
    fn an_invalid_pattern_is_refused_with_its_line() {
        let error = Rules::parse("*.log\n[z-a].txt\n").err().expect("an invalid pattern");
        assert!(format!("{error:#}").contains("line 2"), "{error:#}");
    }
}
