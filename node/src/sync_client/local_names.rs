//! Where each server path lives locally, and which server path each local file is. The two
//! are the same path, except on a file system that folds names (case-insensitive, or
//! normalising Unicode: macOS, Windows, ext4 with `casefold`), where two server names can be
//! one local name. There:
//!
//! - a new server path whose name is taken locally by another server path's file gets a
//!   name of its own (`name (case conflict).ext`), remembered in its entry, so both files
//!   are kept on this device and each edit goes back to the path it came from;
//! - a folder on the way that exists locally under another case is used as it is;
//! - a local file whose name differs from its entry's only by Unicode form is that file;
//!   one that differs by case is the user's rename (sent as a move, never a delete).
//!
//! Elsewhere every lookup answers the path itself.

use std::collections::HashMap;

use super::folder::{Caps, Folder};
use super::names::{self, case_conflict, NameError, Rel};
use super::state::Entry;

#[derive(Default)]
pub struct LocalNames {
    /// How this file system compares names (`None`: it never folds two strings into one).
    caps: Option<Caps>,
    /// Server path → local path, where they differ.
    alias: HashMap<String, Rel>,
    /// Local path → server path, where they differ.
    reverse: HashMap<Rel, String>,
    /// Folded local path → server path, of every entry (only where names fold).
    by_fold: HashMap<String, String>,
}

impl LocalNames {
    /// The names of `entries` on a file system with `caps`.
    pub fn new<'a>(caps: Caps, entries: impl Iterator<Item = (&'a String, &'a Entry)>) -> LocalNames {
        let mut names = LocalNames { caps: caps.folds_names().then_some(caps), ..LocalNames::default() };
        for (server, entry) in entries {
            if let Some(local) = entry.local.as_deref().and_then(|l| Rel::parse(l).ok()) {
                names.note(server, &local);
            } else if let Some(caps) = &names.caps {
                if let Ok(rel) = Rel::from_server(server) {
                    names.by_fold.insert(caps.key(rel.as_str()), server.clone());
                }
            }
        }
        names
    }

    /// Remembers that `server` lives at `local`.
    pub fn note(&mut self, server: &str, local: &Rel) {
        if local.server() != server {
            self.alias.insert(server.to_string(), local.clone());
            self.reverse.insert(local.clone(), server.to_string());
        }
        if let Some(caps) = &self.caps {
            self.by_fold.insert(caps.key(local.as_str()), server.to_string());
        }
    }

    /// Forgets `server` (deleted, or renamed away).
    pub fn forget(&mut self, server: &str) {
        let local = self.alias.remove(server);
        if let Some(local) = &local {
            self.reverse.remove(local);
        }
        if let Some(caps) = &self.caps {
            let key = local.map_or_else(
                || Rel::from_server(server).map(|r| caps.key(r.as_str())).ok(),
                |l| Some(caps.key(l.as_str())),
            );
            if let Some(key) = key {
                if self.by_fold.get(&key).is_some_and(|s| s == server) {
                    self.by_fold.remove(&key);
                }
            }
        }
    }

    /// Where the synced file `server` lives.
    pub fn local_of(&self, server: &str) -> Result<Rel, NameError> {
        match self.alias.get(server) {
            Some(local) => Ok(local.clone()),
            None => Rel::from_server(server),
        }
    }

    /// Where a server path not synced yet is to live (see the module's comment).
    pub fn place(&self, folder: &Folder, server: &str) -> Result<Rel, NameError> {
        let rel = Rel::from_server(server)?;
        let Some(caps) = &self.caps else { return Ok(rel) };
        let matching = |listing: &super::folder::Listing, name: &str| listing.matching(caps, name);
        let mut parent = String::new();
        for component in rel.parent().split('/').filter(|c| !c.is_empty()) {
            let on_disk = matching(&folder.listing(&parent), component);
            let component = on_disk.as_deref().unwrap_or(component);
            parent = if parent.is_empty() { component.to_string() } else { format!("{parent}/{component}") };
        }
        let name = rel.name();
        let here = |name: &str| if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") };
        let listing = folder.listing(&parent);
        let candidate = Rel::parse(&here(name))?;
        let taken_by_other = |r: &Rel| self.by_fold.get(&caps.key(r.as_str())).is_some_and(|s| s != server);
        match matching(&listing, name) {
            // Nothing of that name here, or an untracked file of it (the same file, as on a
            // first sync): this is its place.
            None if !taken_by_other(&candidate) => Ok(candidate),
            Some(found) if !taken_by_other(&candidate) => Rel::parse(&here(&found)),
            _ => {
                let mut n = 1;
                loop {
                    let other = case_conflict(&candidate, n);
                    if !taken_by_other(&other) && matching(&listing, other.name()).is_none() {
                        return Ok(other);
                    }
                    n += 1;
                }
            }
        }
    }

    /// The server path of the local file `local`, given where its entry (if any) says it is.
    pub fn server_of(&self, local: &Rel) -> String {
        if let Some(server) = self.reverse.get(local) {
            return server.clone();
        }
        if let Some(caps) = &self.caps {
            if let Some(server) = self.by_fold.get(&caps.key(local.as_str())) {
                let known = self.local_of(server).ok();
                // The same name in another Unicode form is the same file; another case is a
                // rename by the user.
                if known.is_some_and(|k| names::same_normalized(k.as_str(), local.as_str())) {
                    return server.clone();
                }
            }
        }
        local.server()
    }
}

/// Where the local file of another server path is, for `place` to keep a new one apart.
impl LocalNames {
    /// Whether the local name `local` belongs to a server path other than `server`.
    pub fn taken_by_other(&self, server: &str, local: &Rel) -> bool {
        match &self.caps {
            Some(caps) => self.by_fold.get(&caps.key(local.as_str())).is_some_and(|s| s != server),
            None => self.reverse.get(local).is_some_and(|s| s != server),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(folds: bool) -> Caps {
        Caps { folds_case: folds, normalizes: folds, racy_window_ns: 0 }
    }

    #[test]
    fn where_names_do_not_fold_every_path_is_itself() {
        let names = LocalNames::new(caps(false), std::iter::empty());
        let rel = Rel::parse("A/b.txt").expect("rel");
        assert_eq!(names.server_of(&rel), "/A/b.txt");
        assert_eq!(names.local_of("/A/b.txt"), Ok(rel));
    }

    #[test]
    fn aliases_map_both_ways_and_are_forgotten() {
        let mut names = LocalNames::new(caps(true), std::iter::empty());
        let local = Rel::parse("readme (case conflict).md").expect("rel");
        names.note("/README.md", &Rel::parse("README.md").expect("rel"));
        names.note("/readme.md", &local);
        assert_eq!(names.local_of("/readme.md"), Ok(local.clone()));
        assert_eq!(names.server_of(&local), "/readme.md");
        assert_eq!(names.server_of(&Rel::parse("README.md").expect("rel")), "/README.md");
        // The same name in another Unicode form is the same file; another case is a rename.
        names.note("/caf\u{e9}.txt", &Rel::parse("caf\u{e9}.txt").expect("rel"));
        assert_eq!(names.server_of(&Rel::parse("cafe\u{301}.txt").expect("rel")), "/caf\u{e9}.txt");
        assert_eq!(names.server_of(&Rel::parse("Caf\u{e9}.txt").expect("rel")), "/Caf\u{e9}.txt");
        names.forget("/readme.md");
        assert_eq!(names.local_of("/readme.md"), Ok(Rel::parse("readme.md").expect("rel")));
    }
}
