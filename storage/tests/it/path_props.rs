//! Properties of path parsing and conflicted-copy naming over arbitrary strings: a parsed
//! path is always absolute, bounded, free of control characters and of empty, `.` and `..`
//! components, and parses back to itself; anything else is refused, never mangled; a
//! conflicted copy of any valid path, for any device label, is itself a valid path, another
//! one, in the same folder (or at the root when the folder leaves no room).

use proptest::prelude::*;
use raftbox_storage::paths::{device_label, FilePath, PATH_BYTES_MAX};

/// Strings that look like paths and strings that do not.
fn candidate() -> impl Strategy<Value = String> {
    let component = prop_oneof![
        4 => "[a-zA-Z0-9 _.-]{1,12}",
        1 => Just(".".to_string()),
        1 => Just("..".to_string()),
        1 => Just(String::new()),
        1 => "\\PC{1,8}",
        1 => "[\\x00-\\x1f\\x7f]{1,3}",
        1 => "é{1,300}",
    ];
    prop_oneof![
        8 => proptest::collection::vec(component, 1..6).prop_map(|parts| format!("/{}", parts.join("/"))),
        1 => "\\PC{0,40}",
        1 => "[a-z/]{0,20}",
        1 => Just(format!("/{}", "x".repeat(PATH_BYTES_MAX))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn a_parsed_path_is_normal_and_parses_back_to_itself(text in candidate()) {
        match FilePath::parse(&text) {
            Ok(path) => {
                let s = path.as_str();
                prop_assert_eq!(s, text.as_str(), "parsing never rewrites a path");
                prop_assert!(s.starts_with('/') && s.len() <= PATH_BYTES_MAX);
                prop_assert!(!s.chars().any(char::is_control));
                prop_assert!(s[1..].split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
                prop_assert_eq!(FilePath::parse(s).ok(), Some(path.clone()));
            }
            Err(reason) => prop_assert!(!reason.is_empty()),
        }
    }

    #[test]
    fn a_conflicted_copy_of_a_valid_path_is_valid(text in candidate(), device in "\\PC{0,300}") {
        if let Ok(path) = FilePath::parse(&text) {
            let copy = path.conflicted_copy(&device_label(&device));
            prop_assert!(FilePath::parse(copy.as_str()).is_ok(), "{:?} -> {:?}", path, copy);
            // In the same folder, or at the root when the folder leaves no room for a name.
            prop_assert!(copy.folder() == path.folder() || copy.folder() == "/", "{:?} -> {:?}", path, copy);
            prop_assert_ne!(copy.as_str(), path.as_str());
        }
    }
}
