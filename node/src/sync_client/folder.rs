//! The synced folder on disk, reached only through file descriptors: every path is opened a
//! component at a time from the folder's own descriptor with `O_NOFOLLOW`, so no read, write,
//! rename or delete ever follows a symbolic link, and nothing is ever written outside the
//! folder whatever its subfolders point to. A symbolic link (to a file or a folder), a folder
//! that cannot be read and anything that is not a regular file are skipped by the walk in
//! both directions and reported; files the client knew beneath them are *blind*, neither
//! uploaded nor deleted.
//!
//! A remote version replaces a local file by a swap that is checked afterwards: the new
//! content is written to a temporary name beside the target, fsynced, given the server's
//! mtime and execute bit, and exchanged with the target in one `renameat2(RENAME_EXCHANGE)`.
//! Whatever was at the target at that instant is now under the temporary name: if it is the
//! file the client expected (same inode, size, mtime and ctime), it goes to the trash;
//! otherwise it is an edit made meanwhile, and the two are exchanged back, so the edit stays
//! in place and the new version is discarded. No instant exists at which the target is
//! missing, and a crash at any step leaves both contents on disk (a stray temporary file is
//! moved to the trash at the next start). A new file is renamed in with `RENAME_NOREPLACE`,
//! so a file the user created meanwhile is never replaced.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, RenameFlags, Timespec, Timestamps};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use super::names::{self, Rel, STATE_DIR};
use super::trash::Trash;

/// Racy window on a file system with fine timestamps: a file whose mtime lies this close to
/// the moment it was recorded is hashed again, and one changed this recently is not read yet
/// (it may be mid-write). Kernel timestamps come from a coarse clock (1-10 ms ticks).
const RACY_WINDOW_FINE: Duration = Duration::from_secs(1);
/// The same on a file system that keeps whole seconds (or FAT's two).
const RACY_WINDOW_COARSE: Duration = Duration::from_secs(3);

/// What the client records of a local file to tell it unchanged: a file showing all of these
/// as recorded (and recorded well after its mtime) is unchanged; any difference means it is
/// read and hashed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Meta {
    pub size: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub ino: u64,
    pub dev: u64,
    /// The owner's execute bit.
    pub executable: bool,
}

impl Meta {
    /// Whether `other` is the same file with the same content as far as metadata tells,
    /// ctime aside: a rename sets the ctime, so after one only this comparison holds.
    pub fn same_file(&self, other: &Meta) -> bool {
        (self.ino, self.dev, self.size, self.mtime_ns, self.executable)
            == (other.ino, other.dev, other.size, other.mtime_ns, other.executable)
    }

    pub(crate) fn of(st: &rfs::Stat) -> Meta {
        Meta {
            size: st.st_size as u64,
            mtime_ns: nanos(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime_ns: nanos(st.st_ctime as i64, st.st_ctime_nsec as i64),
            ino: st.st_ino as u64,
            dev: st.st_dev as u64,
            executable: st.st_mode & 0o100 != 0,
        }
    }
}

fn nanos(seconds: i64, nanos: i64) -> u64 {
    u64::try_from(seconds).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(nanos.max(0) as u64)
}

/// The clock, in ns since the epoch.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// What is at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Missing,
    File(Meta),
    Dir,
    /// A symbolic link, device, socket or FIFO: never read, written or replaced.
    Other(&'static str),
    /// A folder on the way is a symbolic link, a file or unreadable.
    Blocked(String),
}

/// What this file system does to names and times (probed at start in `.raftbox/`).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// `A` and `a` are one name here.
    pub folds_case: bool,
    /// Two Unicode forms of one name (`é` composed or not) are one name here.
    pub normalizes: bool,
    pub racy_window_ns: u64,
}

impl Caps {
    /// Whether two different strings can be one name here.
    pub fn folds_names(&self) -> bool {
        self.folds_case || self.normalizes
    }

    /// The key under which this file system sees a name: two names are one name here
    /// exactly when their keys are equal.
    pub fn key(&self, name: &str) -> String {
        match (self.folds_case, self.normalizes) {
            (true, true) => names::fold(name),
            (true, false) => name.to_lowercase(),
            (false, true) => names::nfc(name),
            (false, false) => name.to_string(),
        }
    }
}

/// The names in one folder, by what they are here.
#[derive(Debug, Default)]
pub struct Listing {
    by_key: HashMap<String, Vec<String>>,
}

impl Listing {
    /// The name in the folder that is `name` here, preferring `name` itself.
    pub fn matching(&self, caps: &Caps, name: &str) -> Option<String> {
        let found = self.by_key.get(&caps.key(name))?;
        Some(found.iter().find(|n| *n == name).unwrap_or(&found[0]).clone())
    }
}

/// What a placement did.
enum Placed {
    /// The new version is in place.
    Yes,
    /// Not placed; the temporary file holds only the new version.
    No,
    /// Not placed, and the temporary name is gone (the user's file went back through it).
    Kept,
}

/// The outcome of putting a new version in place.
#[derive(Debug, PartialEq, Eq)]
pub enum Swap {
    /// In place; the file as it is now.
    Done(Meta),
    /// The local file changed (or appeared) meanwhile: left as it is, the new version dropped.
    Changed,
}

/// One walk of the folder.
#[derive(Debug, Default)]
pub struct Walk {
    /// Every regular file not ignored, by its local relative path.
    pub files: HashMap<Rel, Meta>,
    /// Paths the walk could not see into (symbolic links, unreadable folders, special
    /// files), with why: what the client knew there is neither uploaded nor deleted.
    pub blind: Vec<(String, String)>,
    /// Names skipped (not UTF-8, a control character, too long), with why.
    pub skipped: Vec<(String, String)>,
    /// Temporary files of the client's own left by an interrupted download.
    pub strays: Vec<Rel>,
}

impl Walk {
    /// Whether `rel` lies at or under a blind path.
    pub fn is_blind(&self, rel: &str) -> bool {
        self.blind
            .iter()
            .any(|(b, _)| b.is_empty() || rel == b || rel.strip_prefix(b.as_str()).is_some_and(|r| r.starts_with('/')))
    }
}

pub struct Folder {
    path: PathBuf,
    root: OwnedFd,
    pub caps: Caps,
    pub trash: Trash,
    /// Exact names in each folder, read once per pass (only where names fold).
    listings: Mutex<HashMap<String, Arc<Listing>>>,
    /// Folders made by the client since last asked ([`Folder::take_made`]): only those are
    /// ever removed again when they fall empty, never a folder the user made.
    made: Mutex<Vec<String>>,
}

/// An I/O error with the operation and path that met it.
fn io(errno: Errno, what: &str, rel: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::from(errno)).context(format!("{what} {rel}"))
}

fn open_dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl Folder {
    /// The folder at `path` (which must exist), its `.raftbox/` and trash made if missing,
    /// and its file system probed.
    pub fn open(path: &Path, trash_days: u64) -> anyhow::Result<Folder> {
        let root = rfs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(std::io::Error::from)
            .with_context(|| format!("open the folder {}", path.display()))?;
        let state = ensure_dir(&root, STATE_DIR)?;
        let trash = Trash::open(ensure_dir(&state, "trash")?, trash_days);
        let caps = probe(&state)?;
        Ok(Folder {
            path: path.to_path_buf(),
            root,
            caps,
            trash,
            listings: Mutex::new(HashMap::new()),
            made: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `(device, inode)` of the folder's own descriptor.
    pub fn identity(&self) -> anyhow::Result<(u64, u64)> {
        let st = rfs::fstat(&self.root).map_err(std::io::Error::from).context("stat the folder")?;
        Ok((st.st_dev as u64, st.st_ino as u64))
    }

    /// Forgets the folder listings read so far (at the start of a pass).
    pub fn forget_listings(&self) {
        self.listings.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn forget_listing(&self, dir: &str) {
        self.listings.lock().unwrap_or_else(|e| e.into_inner()).remove(dir);
    }

    /// The names in folder `dir` (relative), read once per pass; empty if it cannot be
    /// opened.
    pub fn listing(&self, dir: &str) -> Arc<Listing> {
        if let Some(found) = self.listings.lock().unwrap_or_else(|e| e.into_inner()).get(dir) {
            return found.clone();
        }
        let mut listing = Listing::default();
        for name in self.open_dir(dir, false).ok().map(|fd| read_names(&fd)).unwrap_or_default() {
            listing.by_key.entry(self.caps.key(&name)).or_default().push(name);
        }
        let listing = Arc::new(listing);
        self.listings.lock().unwrap_or_else(|e| e.into_inner()).insert(dir.to_string(), listing.clone());
        listing
    }

    /// Whether the folder held open as `dir_fd` is still the one at `dir` (relative): a
    /// folder moved out during a long download must not receive the new version.
    fn still_at(&self, dir_fd: &OwnedFd, dir: &str) -> anyhow::Result<bool> {
        let held = rfs::fstat(dir_fd).map_err(|e| io(e, "stat", dir))?;
        let Ok(now) = self.open_dir(dir, false) else { return Ok(false) };
        let now = rfs::fstat(&now).map_err(|e| io(e, "stat", dir))?;
        Ok((held.st_dev, held.st_ino) == (now.st_dev, now.st_ino))
    }

    /// The folder `dir` (relative, `""` for the top), opened without following any link;
    /// made (with its parents) when `create`.
    pub fn open_dir(&self, dir: &str, create: bool) -> anyhow::Result<OwnedFd> {
        let mut fd =
            rfs::openat(&self.root, c".", open_dir_flags(), Mode::empty()).map_err(|e| io(e, "open", "the folder"))?;
        let mut walked = String::new();
        for component in dir.split('/').filter(|c| !c.is_empty()) {
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(component);
            fd = match rfs::openat(&fd, component, open_dir_flags(), Mode::empty()) {
                Ok(next) => next,
                Err(Errno::NOENT) if create => {
                    match rfs::mkdirat(&fd, component, Mode::from_raw_mode(0o777)) {
                        Ok(()) => self.made.lock().unwrap_or_else(|e| e.into_inner()).push(walked.clone()),
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(io(e, "create the folder", &walked)),
                    }
                    self.forget_listing(walked.rsplit_once('/').map_or("", |(p, _)| p));
                    rfs::openat(&fd, component, open_dir_flags(), Mode::empty())
                        .map_err(|e| blocked(e, &fd, component, &walked))?
                }
                Err(e) => return Err(blocked(e, &fd, component, &walked)),
            };
        }
        Ok(fd)
    }

    /// The folders made since the last call.
    pub fn take_made(&self) -> Vec<String> {
        std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Why nothing may be written at `rel`, if so: a folder on its way is another file
    /// system mounted inside this folder, or another synced folder (it holds a `.raftbox`).
    /// Such places are blind both ways, as the walk treats them.
    pub fn blind_at(&self, rel: &Rel) -> anyhow::Result<Option<String>> {
        let root = rfs::fstat(&self.root).map_err(|e| io(e, "stat", "the folder"))?;
        let mut fd =
            rfs::openat(&self.root, c".", open_dir_flags(), Mode::empty()).map_err(|e| io(e, "open", "the folder"))?;
        let mut walked = String::new();
        for component in rel.parent().split('/').filter(|c| !c.is_empty()) {
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(component);
            fd = match rfs::openat(&fd, component, open_dir_flags(), Mode::empty()) {
                Ok(next) => next,
                // Missing (made later, in the folder's own file system) or not a folder (the
                // download fails there by itself).
                Err(_) => return Ok(None),
            };
            let st = rfs::fstat(&fd).map_err(|e| io(e, "stat", &walked))?;
            if st.st_dev != root.st_dev {
                return Ok(Some(format!("{walked} is another file system mounted in the folder: not synced")));
            }
            if matches!(node_at(&fd, STATE_DIR)?, Node::Dir) {
                return Ok(Some(format!("{walked} holds another synced folder: not synced here")));
            }
        }
        Ok(None)
    }

    /// Writes the folder marker (`.raftbox/<name>`) durably, never through a link.
    pub fn write_marker(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let state = self.open_dir(STATE_DIR, false)?;
        let temp = format!("{name}.tmp");
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd =
            rfs::openat(&state, temp.as_str(), flags, Mode::from_raw_mode(0o600)).map_err(|e| io(e, "write", name))?;
        let mut file = File::from(fd);
        std::io::Write::write_all(&mut file, text.as_bytes()).with_context(|| format!("write {name}"))?;
        file.sync_all()?;
        rfs::renameat(&state, temp.as_str(), &state, name).map_err(|e| io(e, "write", name))?;
        rfs::fsync(&state).map_err(|e| io(e, "fsync", STATE_DIR))?;
        Ok(())
    }

    /// What is at `rel` (never following a link on the way).
    pub fn node(&self, rel: &Rel) -> anyhow::Result<Node> {
        let dir = match self.open_dir(rel.parent(), false) {
            Ok(dir) => dir,
            Err(e) => return Ok(node_of_error(&e)),
        };
        node_at(&dir, rel.name())
    }

    /// Opens the regular file `rel` for reading (never through a link); its metadata as opened.
    pub fn open_file(&self, rel: &Rel) -> anyhow::Result<(File, Meta)> {
        let dir = self.open_dir(rel.parent(), false)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rfs::openat(&dir, rel.name(), flags, Mode::empty()).map_err(|e| io(e, "open", rel.as_str()))?;
        let st = rfs::fstat(&fd).map_err(|e| io(e, "stat", rel.as_str()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            bail!("{rel} is not a regular file");
        }
        Ok((File::from(fd), Meta::of(&st)))
    }

    /// A new temporary file in folder `dir` (made if missing): its descriptor and name.
    pub fn create_temp(&self, dir: &str) -> anyhow::Result<(OwnedFd, File, String)> {
        let dir_fd = self.open_dir(dir, true)?;
        let name = names::temp_name();
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(&dir_fd, name.as_str(), flags, Mode::from_raw_mode(0o666))
            .map_err(|e| io(e, "create a temporary file in", dir))?;
        Ok((dir_fd, File::from(fd), name))
    }

    /// Gives the finished temporary `file` the server's mtime and execute bit and makes it
    /// durable; its metadata then.
    pub fn finish_temp(file: &File, mtime_ms: u64, executable: bool) -> anyhow::Result<Meta> {
        let st = rfs::fstat(file).map_err(std::io::Error::from)?;
        let mode = st.st_mode & 0o7777;
        let wanted = if executable { mode | ((mode & 0o444) >> 2) } else { mode & !0o111 };
        if wanted != mode {
            rfs::fchmod(file, Mode::from_raw_mode(wanted)).map_err(std::io::Error::from).context("chmod")?;
        }
        let mtime = Timespec { tv_sec: (mtime_ms / 1000) as i64, tv_nsec: ((mtime_ms % 1000) * 1_000_000) as _ };
        let times = Timestamps { last_access: mtime, last_modification: mtime };
        rfs::futimens(file, &times).map_err(std::io::Error::from).context("set the modification time")?;
        file.sync_all().context("fsync")?;
        Ok(Meta::of(&rfs::fstat(file).map_err(std::io::Error::from)?))
    }

    /// Puts the temporary file `temp` (in `dir_fd`, folder `rel`'s parent) in place as `rel`,
    /// if what is there now is `expected` (`None`: nothing). What it replaces goes to the
    /// trash. See the module's comment. Once an exchange has happened, the temporary name
    /// may hold the user's file: it is never unlinked then, whatever fails (left there, it
    /// is a stray, and goes to the trash at the next pass).
    pub fn swap_in(
        &self,
        dir_fd: &OwnedFd,
        temp: &str,
        temp_meta: Meta,
        rel: &Rel,
        expected: Option<Meta>,
        why: &str,
    ) -> anyhow::Result<Swap> {
        self.forget_listing(rel.parent());
        // The temporary name is dropped only while it holds the download itself; anything
        // else found there (the user's file, gone back through it) goes to the trash.
        let drop_temp = || match node_at(dir_fd, temp) {
            Ok(Node::File(there)) if there.ino == temp_meta.ino => {
                let _ = rfs::unlinkat(dir_fd, temp, AtFlags::empty());
            }
            Ok(Node::Missing) => {}
            _ => {
                if let Err(e) = self.trash.put(dir_fd, temp, rel, "put aside while a new version was put in place") {
                    eprintln!("sync: {rel}: a file stays beside it as {temp}: {e:#}");
                }
            }
        };
        if !self.still_at(dir_fd, rel.parent())? {
            drop_temp();
            bail!("the folder of {rel} moved while its new version was downloaded");
        }
        let placed = match expected {
            None => self.put_new(dir_fd, temp, rel),
            Some(expected) => self.replace(dir_fd, temp, rel, expected, why),
        };
        match placed? {
            Placed::No => {
                drop_temp();
                Ok(Swap::Changed)
            }
            Placed::Kept => Ok(Swap::Changed),
            Placed::Yes => {
                rfs::fsync(dir_fd).map_err(|e| io(e, "fsync the folder of", rel.as_str()))?;
                // What is recorded is the file put there, never one the user moved over it
                // in the instant since.
                match node_at(dir_fd, rel.name())? {
                    Node::File(meta) if meta.ino == temp_meta.ino => Ok(Swap::Done(meta)),
                    _ => Ok(Swap::Changed),
                }
            }
        }
    }

    /// A new file where there was none: never over one that appeared meanwhile.
    fn put_new(&self, dir_fd: &OwnedFd, temp: &str, rel: &Rel) -> anyhow::Result<Placed> {
        let name = rel.name();
        match rfs::renameat_with(dir_fd, temp, dir_fd, name, RenameFlags::NOREPLACE) {
            Ok(()) => Ok(Placed::Yes),
            Err(Errno::EXIST) => Ok(Placed::No),
            // No RENAME_NOREPLACE here: a hard link fails on an existing name too.
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                match rfs::linkat(dir_fd, temp, dir_fd, name, AtFlags::empty()) {
                    Ok(()) => {
                        let _ = rfs::unlinkat(dir_fd, temp, AtFlags::empty());
                        Ok(Placed::Yes)
                    }
                    Err(Errno::EXIST) => Ok(Placed::No),
                    Err(e) => Err(io(e, "put in place", rel.as_str())),
                }
            }
            Err(e) => Err(io(e, "put in place", rel.as_str())),
        }
    }

    /// Exchanges `temp` and `rel`; keeps the exchange only if what came out of `rel` is
    /// `expected` (it goes to the trash), else exchanges back.
    fn replace(&self, dir_fd: &OwnedFd, temp: &str, rel: &Rel, expected: Meta, why: &str) -> anyhow::Result<Placed> {
        let name = rel.name();
        if node_at(dir_fd, name)? != Node::File(expected) {
            return Ok(Placed::No);
        }
        match rfs::renameat_with(dir_fd, temp, dir_fd, name, RenameFlags::EXCHANGE) {
            Ok(()) => {}
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return self.replace_without_exchange(dir_fd, temp, rel, expected, why)
            }
            Err(Errno::NOENT) => return Ok(Placed::No),
            Err(e) => return Err(io(e, "exchange", rel.as_str())),
        }
        // From here `temp` holds what was at `rel`: never unlinked.
        let out = node_at(dir_fd, temp);
        if matches!(out, Ok(Node::File(out)) if out.same_file(&expected)) {
            if let Err(e) = self.trash.put(dir_fd, temp, rel, why) {
                eprintln!("sync: {rel}: the replaced version stays beside it as {temp}: {e:#}");
            }
            return Ok(Placed::Yes);
        }
        // Changed in the instant before the exchange: the edit goes back in place, and the
        // new version (now at `temp`) is dropped.
        match rfs::renameat_with(dir_fd, temp, dir_fd, name, RenameFlags::EXCHANGE) {
            Ok(()) => Ok(Placed::No),
            Err(_) => match rfs::renameat_with(dir_fd, temp, dir_fd, name, RenameFlags::NOREPLACE) {
                Ok(()) => Ok(Placed::Kept),
                Err(e) => {
                    eprintln!("sync: {rel}: your edit stays beside it as {temp} (moved to the trash next)");
                    Err(io(e, "put back", rel.as_str()))
                }
            },
        }
    }

    /// Where `RENAME_EXCHANGE` is not supported: the old file is kept in the trash first (a
    /// hard link, so an edit written through an open descriptor lands there too; a copy where
    /// links are not supported), checked to still be at `rel`, then replaced.
    fn replace_without_exchange(
        &self,
        dir_fd: &OwnedFd,
        temp: &str,
        rel: &Rel,
        expected: Meta,
        why: &str,
    ) -> anyhow::Result<Placed> {
        let name = rel.name();
        let id = match self.trash.link(dir_fd, name, rel, why) {
            Ok(id) => id,
            Err(_) => self.trash.copy(dir_fd, name, rel, why)?,
        };
        let kept = self.trash.meta(&id)?;
        let still = matches!(node_at(dir_fd, name)?, Node::File(now) if now.same_file(&expected));
        if !still || !kept.is_some_and(|k| k.size == expected.size) {
            self.trash.discard(&id);
            return Ok(Placed::No);
        }
        rfs::renameat(dir_fd, temp, dir_fd, name).map_err(|e| io(e, "put in place", rel.as_str()))?;
        Ok(Placed::Yes)
    }

    /// Moves `rel` to the trash if it still is `expected`; whether it was.
    pub fn remove(&self, rel: &Rel, expected: Meta, why: &str) -> anyhow::Result<bool> {
        let dir = match self.open_dir(rel.parent(), false) {
            Ok(dir) => dir,
            Err(_) => return Ok(false),
        };
        if node_at(&dir, rel.name())? != Node::File(expected) {
            return Ok(false);
        }
        self.forget_listing(rel.parent());
        let id = self.trash.put(&dir, rel.name(), rel, why)?;
        // Changed in the instant before the move: it goes back (it is an edit).
        if !self.trash.meta(&id)?.is_some_and(|m| m.same_file(&expected)) {
            self.trash.put_back(&id, &dir, rel.name())?;
            return Ok(false);
        }
        rfs::fsync(&dir).map_err(|e| io(e, "fsync the folder of", rel.as_str()))?;
        Ok(true)
    }

    /// Moves a stray temporary file to the trash.
    pub fn trash_stray(&self, rel: &Rel) -> anyhow::Result<()> {
        let dir = self.open_dir(rel.parent(), false)?;
        self.trash.put(&dir, rel.name(), rel, "left by an interrupted download")?;
        Ok(())
    }

    /// Renames `from` to `to` here (a move made on the server) if `from` still is `expected`
    /// and `to` is free; the moved file's metadata, or `None` if it did not happen.
    pub fn rename(&self, from: &Rel, to: &Rel, expected: Meta) -> anyhow::Result<Option<Meta>> {
        let from_dir = self.open_dir(from.parent(), false)?;
        if node_at(&from_dir, from.name())? != Node::File(expected) {
            return Ok(None);
        }
        let to_dir = self.open_dir(to.parent(), true)?;
        self.forget_listing(from.parent());
        self.forget_listing(to.parent());
        // A rename to another spelling of the same name, where names fold: NOREPLACE would
        // refuse it, and only the very same file may be there.
        let same_name = self.caps.folds_names() && self.caps.key(from.as_str()) == self.caps.key(to.as_str());
        let flags = match node_at(&to_dir, to.name())? {
            Node::File(there) if same_name && there.ino == expected.ino => RenameFlags::empty(),
            _ => RenameFlags::NOREPLACE,
        };
        match rfs::renameat_with(&from_dir, from.name(), &to_dir, to.name(), flags) {
            Ok(()) => {}
            Err(Errno::EXIST | Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io(e, "rename", from.as_str())),
        }
        rfs::fsync(&to_dir).map_err(|e| io(e, "fsync the folder of", to.as_str()))?;
        rfs::fsync(&from_dir).map_err(|e| io(e, "fsync the folder of", from.as_str()))?;
        match node_at(&to_dir, to.name())? {
            Node::File(meta) => Ok(Some(meta)),
            _ => Ok(None),
        }
    }

    /// Removes the empty folders from `rel`'s folder up that `made_here` says the client
    /// made (never one the user made, never the top); the ones removed.
    pub fn prune_empty(&self, rel: &Rel, made_here: impl Fn(&str) -> bool) -> Vec<String> {
        let mut removed = Vec::new();
        let mut dir = rel.parent().to_string();
        while !dir.is_empty() && made_here(&dir) {
            let (parent, name) = dir.rsplit_once('/').map_or(("", dir.as_str()), |(p, n)| (p, n));
            let Ok(parent_fd) = self.open_dir(parent, false) else { break };
            if rfs::unlinkat(&parent_fd, name, AtFlags::REMOVEDIR).is_err() {
                break;
            }
            self.forget_listing(parent);
            removed.push(dir.clone());
            dir = parent.to_string();
        }
        removed
    }

    /// Every regular file under the folder that `ignored` (relative path, is a folder) does
    /// not leave alone, with what could not be seen. A folder that cannot be read is blind;
    /// the top one is an error (nothing may be judged from a walk that did not see it).
    pub fn walk(&self, ignored: impl Fn(&str, bool) -> bool) -> anyhow::Result<Walk> {
        let mut walk = Walk::default();
        let root_dev = rfs::fstat(&self.root).map_err(|e| io(e, "stat", "the folder"))?.st_dev as u64;
        // Folders are opened as they are taken from the stack, so a wide tree holds one
        // descriptor at a time, not one per pending folder.
        // Each folder with the (device, inode) it had when found: opened later by its path, it
        // must still be that folder (one renamed during the walk is looked at next pass).
        let mut stack: Vec<(String, Option<(u64, u64)>)> = vec![(String::new(), None)];
        while let Some((prefix, found)) = stack.pop() {
            let top = prefix.is_empty();
            let read = self.open_dir(&prefix, false).and_then(|dir| {
                let st = rfs::fstat(&dir).map_err(|e| io(e, "stat", &prefix))?;
                if found.is_some_and(|f| f != (st.st_dev as u64, st.st_ino as u64)) {
                    bail!("it changed while the folder was walked");
                }
                let entries = rfs::Dir::read_from(&dir).map_err(|e| io(e, "read", &prefix))?;
                Ok((dir, entries))
            });
            let (dir, entries) = match read {
                Ok(found) => found,
                Err(e) if top => return Err(e.context("read the synced folder")),
                Err(e) => {
                    walk.blind.push((prefix, format!("cannot be read: {e:#}")));
                    continue;
                }
            };
            for entry in entries {
                match entry {
                    Ok(entry) => {
                        self.visit(&dir, &prefix, entry.file_name(), root_dev, &ignored, &mut walk, &mut stack)
                    }
                    Err(e) if top => return Err(io(e, "read", "the synced folder")),
                    Err(e) => {
                        walk.blind.push((prefix.clone(), format!("cannot be read: {}", std::io::Error::from(e))));
                        break;
                    }
                }
            }
        }
        // A subfolder found blind after some of its files were listed: none of them counts.
        if walk.blind.iter().any(|(b, _)| !b.is_empty()) {
            let blind = std::mem::take(&mut walk.blind);
            let check = Walk { blind, ..Walk::default() };
            walk.files.retain(|rel, _| !check.is_blind(rel.as_str()));
            walk.strays.retain(|rel| !check.is_blind(rel.as_str()));
            walk.blind = check.blind;
        }
        Ok(walk)
    }

    #[allow(clippy::too_many_arguments)]
    fn visit(
        &self,
        dir: &OwnedFd,
        prefix: &str,
        raw: &CStr,
        root_dev: u64,
        ignored: &impl Fn(&str, bool) -> bool,
        walk: &mut Walk,
        stack: &mut Vec<(String, Option<(u64, u64)>)>,
    ) {
        let bytes = raw.to_bytes();
        if bytes == b"." || bytes == b".." {
            return;
        }
        let joined = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
        let Ok(name) = raw.to_str() else {
            walk.skipped.push((joined(&String::from_utf8_lossy(bytes)), "the name is not UTF-8".into()));
            return;
        };
        let rel = joined(name);
        if self.caps.key(name) == self.caps.key(STATE_DIR) {
            // Another synced folder inside this one: its files are its own client's.
            if !prefix.is_empty() {
                walk.blind.push((prefix.to_string(), "holds another synced folder: not synced here".into()));
            }
            return;
        }
        let st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return,
            Err(e) => {
                walk.blind.push((rel, format!("cannot be read: {}", std::io::Error::from(e))));
                return;
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if ignored(&rel, true) {
                    return;
                }
                if st.st_dev as u64 != root_dev {
                    walk.blind.push((rel, "another file system is mounted here: not synced".into()));
                    return;
                }
                stack.push((rel, Some((st.st_dev as u64, st.st_ino as u64))));
            }
            FileType::RegularFile if names::is_temp_name(name) => {
                if let Ok(rel) = Rel::temp(&rel) {
                    walk.strays.push(rel);
                }
            }
            FileType::RegularFile => {
                if ignored(&rel, false) {
                    return;
                }
                match Rel::parse(&rel) {
                    Ok(parsed) => {
                        walk.files.insert(parsed, Meta::of(&st));
                    }
                    Err(e) => walk.skipped.push((rel, e.to_string())),
                }
            }
            FileType::Symlink => {
                if !ignored(&rel, false) {
                    walk.blind.push((rel, "a symbolic link: not synced in either direction".into()));
                }
            }
            _ => {
                if !ignored(&rel, false) {
                    walk.blind.push((rel, "not a regular file: not synced".into()));
                }
            }
        }
    }
}

fn blocked(errno: Errno, parent: &OwnedFd, component: &str, walked: &str) -> anyhow::Error {
    let why = match errno {
        Errno::LOOP | Errno::NOTDIR => match node_at(parent, component) {
            Ok(Node::Other(what)) => format!("is {what}, not a folder"),
            Ok(Node::File(_)) => "is a file, not a folder".to_string(),
            _ => "is not a folder".to_string(),
        },
        Errno::NOENT => "does not exist".to_string(),
        other => format!("cannot be opened: {}", std::io::Error::from(other)),
    };
    anyhow::Error::new(BlockedError(format!("{walked} {why}")))
}

/// A folder on a path is missing, a link, a file or unreadable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BlockedError(String);

fn node_of_error(error: &anyhow::Error) -> Node {
    match error.downcast_ref::<BlockedError>() {
        Some(BlockedError(why)) if why.ends_with("does not exist") => Node::Missing,
        Some(BlockedError(why)) => Node::Blocked(why.clone()),
        None => Node::Blocked(format!("{error:#}")),
    }
}

/// What is at `name` in `dir` (no link followed).
pub fn node_at(dir: &impl AsFd, name: &str) -> anyhow::Result<Node> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Node::File(Meta::of(&st)),
            FileType::Directory => Node::Dir,
            FileType::Symlink => Node::Other("a symbolic link"),
            _ => Node::Other("not a regular file"),
        }),
        Err(Errno::NOENT) => Ok(Node::Missing),
        Err(e) => Err(io(e, "stat", name)),
    }
}

/// The folder `name` in `parent`, made if missing (never through a link).
pub fn ensure_dir(parent: &impl AsFd, name: &str) -> anyhow::Result<OwnedFd> {
    match rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(io(e, "create", name)),
    }
    rfs::openat(parent, name, open_dir_flags(), Mode::empty()).map_err(|e| io(e, "open", name))
}

fn read_names(dir: &OwnedFd) -> Vec<String> {
    let Ok(entries) = rfs::Dir::read_from(dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// How the file system in `state` (the `.raftbox/` folder) treats names and times.
fn probe(state: &OwnedFd) -> anyhow::Result<Caps> {
    let tag = format!("{:08x}", rand::random::<u32>());
    let upper = format!("CaseProbe-{tag}");
    let composed = format!("probe-\u{e9}-{tag}");
    let mut found = [false; 2];
    let mut coarse = true;
    for name in [&upper, &composed] {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(state, name.as_str(), flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io(e, "create a probe file in", STATE_DIR))?;
        let st = rfs::fstat(&fd).map_err(std::io::Error::from)?;
        coarse &= st.st_mtime_nsec == 0;
    }
    for (i, (made, other)) in
        [(&upper, upper.to_lowercase()), (&composed, format!("probe-e\u{301}-{tag}"))].iter().enumerate()
    {
        found[i] = matches!(rfs::statat(state, other.as_str(), AtFlags::SYMLINK_NOFOLLOW), Ok(_));
        let _ = rfs::unlinkat(state, made.as_str(), AtFlags::empty());
    }
    let window = if coarse { RACY_WINDOW_COARSE } else { RACY_WINDOW_FINE };
    Ok(Caps { folds_case: found[0], normalizes: found[1], racy_window_ns: window.as_nanos() as u64 })
}

#[cfg(test)]
#[path = "folder_tests.rs"]
mod tests;
