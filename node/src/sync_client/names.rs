//! Server paths as local names. A path from the server is checked before anything touches
//! the disk ([`Rel::from_server`]): relative to the folder, no `.` or `..` component, no NUL,
//! no component longer than the local file system holds, never the client's own `.raftbox/`
//! nor one of its temporary names. A path that fails is that file's failure, never the
//! pass's.
//!
//! Also here: the fold key under which a case-insensitive or normalising file system sees two
//! names as one ([`fold`]), the local name a colliding server path gets instead
//! ([`case_conflict`]), and the client's temporary names ([`temp_name`]): short, fixed-length
//! and random, so a long file name never makes its temporary name too long, and no user
//! file is ever taken for one.

use std::fmt;

use unicode_normalization::UnicodeNormalization as _;

/// Longest name of one file or folder, in bytes (`NAME_MAX` of Linux file systems).
pub const NAME_BYTES_MAX: usize = 255;
/// Longest relative path, in bytes (`PATH_MAX` less the folder's own path, roughly).
pub const PATH_BYTES_MAX: usize = 3_500;
/// The client's own folder at the top of the synced folder (state, trash, status).
pub const STATE_DIR: &str = ".raftbox";
/// The local ignore file at the top of the synced folder: never uploaded, never downloaded.
pub const IGNORE_FILE: &str = ".raftboxignore";
/// Temporary names: `.raftbox-` + 16 hex digits + `.tmp` (29 bytes).
const TEMP_PREFIX: &str = ".raftbox-";
const TEMP_SUFFIX: &str = ".tmp";
const TEMP_HEX_DIGITS: usize = 16;

/// Why a server path cannot be a local file here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the path is empty or has an empty component")]
    Empty,
    #[error("the path has a `.` or `..` component")]
    Dots,
    #[error("the path holds a NUL or control character")]
    Control,
    #[error("the name {0:?}… is longer than the {NAME_BYTES_MAX} bytes this file system holds")]
    NameTooLong(String),
    #[error("the path is longer than the {PATH_BYTES_MAX} bytes this client writes")]
    PathTooLong,
    #[error("the name is reserved for the sync client's own files")]
    Reserved,
}

/// A path inside the synced folder, relative and `/`-separated (`a/b.txt`), every component
/// checked; its server form is `/a/b.txt`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rel(String);

impl Rel {
    /// The local form of server path `path` (`/a/b.txt`), if this machine can hold it.
    pub fn from_server(path: &str) -> Result<Rel, NameError> {
        Rel::parse(path.strip_prefix('/').unwrap_or(path))
    }

    /// A relative path as the walk found it (`a/b.txt`).
    pub fn parse(relative: &str) -> Result<Rel, NameError> {
        Rel::parse_as(relative, false)
    }

    /// A temporary file of the client's own, found by the walk.
    pub fn temp(relative: &str) -> Result<Rel, NameError> {
        Rel::parse_as(relative, true)
    }

    fn parse_as(relative: &str, temp: bool) -> Result<Rel, NameError> {
        if relative.len() > PATH_BYTES_MAX {
            return Err(NameError::PathTooLong);
        }
        let last = relative.rsplit('/').next().unwrap_or("");
        for component in relative.split('/') {
            match check_name(component) {
                Err(NameError::Reserved) if temp && std::ptr::eq(component, last) => {}
                other => other?,
            }
        }
        // The client's own folder, at any depth (a synced folder inside a synced folder).
        if relative.split('/').any(|component| fold(component) == STATE_DIR) {
            return Err(NameError::Reserved);
        }
        Ok(Rel(relative.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The server's form: `/a/b.txt`.
    pub fn server(&self) -> String {
        format!("/{}", self.0)
    }

    /// The folder holding it, relative (`""` at the top).
    pub fn parent(&self) -> &str {
        self.0.rsplit_once('/').map_or("", |(parent, _)| parent)
    }

    /// Its last component.
    pub fn name(&self) -> &str {
        self.0.rsplit_once('/').map_or(self.0.as_str(), |(_, name)| name)
    }

    /// Whether this is the local ignore file.
    pub fn is_ignore_file(&self) -> bool {
        fold(&self.0) == IGNORE_FILE
    }
}

impl fmt::Display for Rel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots);
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::Control);
    }
    if name.len() > NAME_BYTES_MAX {
        let cut = (0..=40).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
        return Err(NameError::NameTooLong(name[..cut].to_string()));
    }
    if is_temp_name(name) {
        return Err(NameError::Reserved);
    }
    Ok(())
}

/// How a case-insensitive, normalising file system compares names: NFC, then lower case.
pub fn fold(name: &str) -> String {
    nfc(name).to_lowercase()
}

/// How a normalising (but case-sensitive) file system compares names: NFC.
pub fn nfc(name: &str) -> String {
    name.nfc().collect()
}

/// Whether two names are the same name in different Unicode normal forms (not a rename).
pub fn same_normalized(a: &str, b: &str) -> bool {
    a.nfc().eq(b.nfc())
}

/// A fresh temporary name for a download beside its target.
pub fn temp_name() -> String {
    format!("{TEMP_PREFIX}{:016x}{TEMP_SUFFIX}", rand::random::<u64>())
}

/// Whether `name` has the exact shape of [`temp_name`]'s names.
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX).and_then(|rest| rest.strip_suffix(TEMP_SUFFIX)).is_some_and(|hex| {
        hex.len() == TEMP_HEX_DIGITS && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The local name a server path gets when its own collides with another's on this file
/// system: `dir/stem (case conflict).ext`, then `(case conflict 2)`, … (`n` ≥ 1). Shortened
/// so the name fits.
pub fn case_conflict(rel: &Rel, n: u32) -> Rel {
    let name = rel.name();
    let (stem, ext) = match name.rfind('.') {
        Some(dot) if dot > 0 => (&name[..dot], &name[dot..]),
        _ => (name, ""),
    };
    let label = if n <= 1 { " (case conflict)".to_string() } else { format!(" (case conflict {n})") };
    let room = NAME_BYTES_MAX.saturating_sub(label.len() + ext.len());
    let cut = (0..=room.min(stem.len())).rev().find(|&i| stem.is_char_boundary(i)).unwrap_or(0);
    let new_name = format!("{}{label}{ext}", &stem[..cut]);
    match rel.parent() {
        "" => Rel(new_name),
        parent => Rel(format!("{parent}/{new_name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(server: &str, expected: Result<&str, NameError>) {
        assert_eq!(Rel::from_server(server).map(|r| r.0), expected.map(str::to_string), "{server:?}");
    }

    #[test]
    fn server_paths_are_checked_before_they_reach_the_disk() {
        check("/a/b.txt", Ok("a/b.txt"));
        check("/top", Ok("top"));
        check("/a/../../etc/passwd", Err(NameError::Dots));
        check("/a/./b", Err(NameError::Dots));
        check("/a//b", Err(NameError::Empty));
        check("/", Err(NameError::Empty));
        check("/a\u{0}b", Err(NameError::Control));
        check("/a\nb", Err(NameError::Control));
        check("/.raftbox/state.redb", Err(NameError::Reserved));
        check("/.RaftBox/x", Err(NameError::Reserved));
        check("/sub/.raftbox/x", Err(NameError::Reserved));
        check("/sub/.raftboxes/x", Ok("sub/.raftboxes/x"));
        check("/d/.raftbox-0123456789abcdef.tmp", Err(NameError::Reserved));
        check("/d/.raftbox-tmp", Ok("d/.raftbox-tmp"));
        let long = "n".repeat(256);
        assert!(matches!(Rel::from_server(&format!("/{long}")), Err(NameError::NameTooLong(_))));
        assert!(Rel::from_server(&format!("/{}", "n".repeat(255))).is_ok());
        let deep = vec!["abcdefgh"; 500].join("/");
        assert_eq!(Rel::from_server(&format!("/{deep}")), Err(NameError::PathTooLong));
        // A multi-byte name is measured in bytes, and its excerpt cut on a character boundary.
        assert!(matches!(Rel::from_server(&format!("/{}", "é".repeat(128))), Err(NameError::NameTooLong(_))));
    }

    #[test]
    fn parts_of_a_relative_path() {
        let rel = Rel::from_server("/a/b/c.txt").expect("valid");
        assert_eq!((rel.parent(), rel.name(), rel.server().as_str()), ("a/b", "c.txt", "/a/b/c.txt"));
        let top = Rel::from_server("/c.txt").expect("valid");
        assert_eq!((top.parent(), top.name()), ("", "c.txt"));
        assert!(Rel::from_server("/.raftboxignore").expect("valid").is_ignore_file());
        assert!(!Rel::from_server("/sub/.raftboxignore").expect("valid").is_ignore_file());
    }

    #[test]
    fn temporary_names_are_short_fixed_and_recognised_exactly() {
        let name = temp_name();
        assert_eq!(name.len(), 29);
        assert!(is_temp_name(&name));
        assert!(!is_temp_name(".raftbox-0123456789ABCDEF.tmp"));
        assert!(!is_temp_name("report.raftbox-tmp"));
        assert!(!is_temp_name(".raftbox-012.tmp"));
    }

    #[test]
    fn folding_and_case_conflict_names() {
        assert_eq!(fold("Readme.MD"), "readme.md");
        assert_eq!(fold("e\u{301}t\u{e9}"), fold("\u{e9}t\u{e9}"));
        assert!(same_normalized("e\u{301}", "\u{e9}"));
        assert!(!same_normalized("A", "a"));
        let rel = Rel::from_server("/docs/Report.pdf").expect("valid");
        assert_eq!(case_conflict(&rel, 1).as_str(), "docs/Report (case conflict).pdf");
        assert_eq!(case_conflict(&rel, 2).as_str(), "docs/Report (case conflict 2).pdf");
        let bare = Rel::from_server("/Makefile").expect("valid");
        assert_eq!(case_conflict(&bare, 1).as_str(), "Makefile (case conflict)");
        let long = Rel::from_server(&format!("/{}.txt", "x".repeat(250))).expect("valid");
        let renamed = case_conflict(&long, 3);
        assert!(renamed.name().len() <= NAME_BYTES_MAX && renamed.name().ends_with(" (case conflict 3).txt"));
    }
}
