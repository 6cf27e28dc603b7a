//! File paths inside a namespace: a newtype built only by its parser, and the conflicted-copy
//! naming rule (a total function: every commit's content can always be kept somewhere).

use std::fmt;

/// Longest path, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest path component, in bytes.
pub const COMPONENT_BYTES_MAX: usize = 255;
/// Longest label inside a conflicted copy's name (`<device>` plus a number or an id), in bytes.
pub const COPY_LABEL_BYTES_MAX: usize = 120;
/// Longest device name as it appears in a conflicted copy's name, in bytes.
pub const DEVICE_BYTES_MAX: usize = 64;
/// The device label used when a device name has nothing printable left.
const DEVICE_UNKNOWN: &str = "unknown device";

/// An absolute, `/`-separated UTF-8 path with no empty, `.` or `..` components and no
/// control characters.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
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

impl TryFrom<String> for FilePath {
    type Error = String;

    fn try_from(text: String) -> Result<FilePath, String> {
        FilePath::parse(&text)
    }
}

impl From<FilePath> for String {
    fn from(path: FilePath) -> String {
        path.0
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char boundary.
pub fn cut(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A device name fit for a file name: control characters and `/` become `_`, surrounding
/// whitespace goes, at most [`DEVICE_BYTES_MAX`] bytes; "unknown device" if nothing is left.
pub fn device_label(device: &str) -> String {
    let clean: String = device.chars().map(|c| if c.is_control() || c == '/' { '_' } else { c }).collect();
    let clean = cut(clean.trim(), DEVICE_BYTES_MAX).trim();
    if clean.is_empty() {
        DEVICE_UNKNOWN.to_string()
    } else {
        clean.to_string()
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

    /// The path of a conflicted copy: `<stem> (conflicted copy, <label>).<ext>` in the same
    /// folder. Always a valid path, whatever the label and however long this path is: the
    /// label is sanitised like a device name, a name that would pass 255 bytes shortens its
    /// stem, an extension that leaves no room joins the stem, and a folder that leaves no
    /// room (a path near 4096 bytes) gives way to the namespace root.
    pub fn conflicted_copy(&self, label: &str) -> FilePath {
        let label: String = label.chars().map(|c| if c.is_control() || c == '/' { '_' } else { c }).collect();
        let label = cut(&label, COPY_LABEL_BYTES_MAX);
        let folder = self.folder();
        let name = &self.0[folder.len()..];
        let (stem, ext) = match name.rfind('.') {
            Some(dot) if dot > 0 => (&name[..dot], &name[dot..]),
            _ => (name, ""),
        };
        let fit = |folder: &str, stem: &str, ext: &str| -> Option<String> {
            let suffix = format!(" (conflicted copy, {label}){ext}");
            let room = COMPONENT_BYTES_MAX.min(PATH_BYTES_MAX.saturating_sub(folder.len()));
            let stem = cut(stem, room.checked_sub(suffix.len())?);
            (!stem.is_empty()).then(|| format!("{folder}{stem}{suffix}"))
        };
        let text = fit(folder, stem, ext)
            .or_else(|| fit(folder, name, ""))
            .or_else(|| fit("/", stem, ext))
            .or_else(|| fit("/", name, ""))
            // The root leaves 255 bytes for a ≤ 120-byte label and a stem of at least 4
            // bytes (one char), so the line above always fits; this is only a total fallback.
            .unwrap_or_else(|| format!("/conflicted copy, {}", cut(label, 64)));
        debug_assert!(FilePath::parse(&text).is_ok(), "conflicted copy {text:?} of {self:?}");
        FilePath(text)
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
    fn a_path_that_does_not_parse_does_not_deserialize() {
        assert!(serde_json::from_str::<FilePath>("\"/a/b\"").is_ok());
        assert!(serde_json::from_str::<FilePath>("\"/a//b\"").is_err());
        assert!(serde_json::from_str::<FilePath>("\"relative\"").is_err());
    }

    fn copy(path: &str, label: &str) -> String {
        FilePath::parse(path).expect("valid").conflicted_copy(label).as_str().to_string()
    }

    #[test]
    fn conflicted_copy_names() {
        assert_eq!(copy("/docs/report.pdf", "laptop"), "/docs/report (conflicted copy, laptop).pdf");
        assert_eq!(copy("/docs/report.pdf", "laptop 2"), "/docs/report (conflicted copy, laptop 2).pdf");
        assert_eq!(copy("/Makefile", "laptop"), "/Makefile (conflicted copy, laptop)");
        assert_eq!(copy("/.bashrc", "laptop"), "/.bashrc (conflicted copy, laptop)");
        assert_eq!(copy("/a.tar.gz", "laptop"), "/a.tar (conflicted copy, laptop).gz");
    }

    #[test]
    fn a_copy_of_a_long_name_shortens_the_stem() {
        // The report that stopped the cluster: a legal 236-character name.
        let name = format!("/{}.txt", "x".repeat(232));
        let copied = copy(&name, "phone");
        assert!(FilePath::parse(&copied).is_ok(), "{copied}");
        assert!(copied.ends_with(" (conflicted copy, phone).txt"), "{copied}");
        assert_eq!(copied.len() - 1, COMPONENT_BYTES_MAX);
        // Multi-byte characters are cut on a boundary.
        let wide = format!("/{}", "é".repeat(127));
        assert!(FilePath::parse(&copy(&wide, "phone")).is_ok());
    }

    #[test]
    fn a_copy_is_valid_whatever_the_label_or_the_folder() {
        let deep = format!("{}/f.txt", "/abcdefghi".repeat(408));
        assert!(deep.len() <= PATH_BYTES_MAX);
        let long_ext = format!("/a.{}", "e".repeat(250));
        for path in ["/f.txt", deep.as_str(), long_ext.as_str()] {
            for label in ["tab\there", "a//b", "", "\u{7f}", "x".repeat(500).as_str(), "🙂".repeat(100).as_str()] {
                let copied = copy(path, label);
                assert!(FilePath::parse(&copied).is_ok(), "{path:?} / {label:?} -> {copied:?}");
            }
        }
        assert!(copy(&deep, "phone").starts_with("/f (conflicted copy, phone)"), "root fallback");
    }

    #[test]
    fn device_labels_are_sanitised() {
        assert_eq!(device_label("laptop"), "laptop");
        assert_eq!(device_label("a//b"), "a__b");
        assert_eq!(device_label("tab\there"), "tab_here");
        assert_eq!(device_label("  "), "unknown device");
        assert_eq!(device_label(&"x".repeat(100)).len(), DEVICE_BYTES_MAX);
    }
}
