//! File paths inside a namespace: a newtype built only by its parser, and the conflicted-copy
//! naming rule.

use std::fmt;

/// Longest path, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest path component, in bytes.
pub const COMPONENT_BYTES_MAX: usize = 255;

/// An absolute, `/`-separated UTF-8 path with no empty, `.` or `..` components and no
/// control characters.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct FilePath(String);

impl fmt::Display for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilePath({:?})", self.0)
    }
}

impl FilePath {
    /// Parses a path; the error says what is wrong.
    pub fn parse(text: &str) -> Result<FilePath, String> {
        if !text.starts_with('/') {
            return Err("a path is absolute: it starts with '/'".into());
        }
        if text.len() > PATH_BYTES_MAX {
            return Err(format!("a path is at most {PATH_BYTES_MAX} bytes"));
        }
        if text.chars().any(char::is_control) {
            return Err("a path has no control characters".into());
        }
        for component in text[1..].split('/') {
            if component.is_empty() || component == "." || component == ".." {
                return Err("a path has no empty, '.' or '..' components".into());
            }
            if component.len() > COMPONENT_BYTES_MAX {
                return Err(format!("a path component is at most {COMPONENT_BYTES_MAX} bytes"));
            }
        }
        Ok(FilePath(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent folder with a trailing slash (`/a/` for `/a/b.txt`, `/` for `/b.txt`).
    pub fn folder(&self) -> &str {
        let cut = self.0.rfind('/').map_or(0, |i| i + 1);
        &self.0[..cut]
    }

    /// The `n`th conflicted copy's path: `<stem> (conflicted copy, <device>).<ext>`, with
    /// ` n` after the device from the second on.
    pub fn conflicted_copy(&self, device: &str, n: u32) -> Result<FilePath, String> {
        let folder = self.folder();
        let name = &self.0[folder.len()..];
        let (stem, ext) = match name.rfind('.') {
            Some(dot) if dot > 0 => (&name[..dot], &name[dot..]),
            _ => (name, ""),
        };
        let device = if n <= 1 { device.to_string() } else { format!("{device} {n}") };
        FilePath::parse(&format!("{folder}{stem} (conflicted copy, {device}){ext}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_and_refuses() {
        for good in ["/a", "/a/b.txt", "/ü/ñ", "/a b/c"] {
            assert!(FilePath::parse(good).is_ok(), "{good}");
        }
        let long_component = format!("/{}", "x".repeat(256));
        let long_path = "/x".repeat(2049);
        for bad in
            ["", "a/b", "/", "/a//b", "/a/./b", "/a/../b", "/a/", "/a\u{0}b", "/a\nb", &long_component, &long_path]
        {
            assert!(FilePath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn conflicted_copy_names() {
        let check = |path: &str, n: u32, expected: &str| {
            let copy = FilePath::parse(path).expect("valid").conflicted_copy("laptop", n).expect("valid copy");
            assert_eq!(copy.as_str(), expected);
        };
        check("/docs/report.pdf", 1, "/docs/report (conflicted copy, laptop).pdf");
        check("/docs/report.pdf", 2, "/docs/report (conflicted copy, laptop 2).pdf");
        check("/Makefile", 1, "/Makefile (conflicted copy, laptop)");
        check("/.bashrc", 1, "/.bashrc (conflicted copy, laptop)");
        check("/a.tar.gz", 1, "/a.tar (conflicted copy, laptop).gz");
    }
}
