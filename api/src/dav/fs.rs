//! [`RaftFs`] as `dav-server` sees it: each call located ([`RaftFs::locate`]), judged (a
//! change needs a writable place), then served from the state machine or proposed.

use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, FsError, FsFuture, FsResult, FsStream, GuardedFileSystem, OpenOptions,
    ReadDirMeta,
};
use futures_util::{stream, FutureExt as _};
use raftbox_storage::files::FolderEntry;

use super::file::{spool_error, Reader, Writer};
use super::{
    file_path, folder_of, fs_error, is_marker, Entry, Meta, Place, RaftFs, LISTING_ENTRIES_MAX, SHARED_FOLDER,
};
use crate::auth::Principal;
use crate::routes::LISTING_WORK_MAX;
use crate::spool::Spool;

/// Pages of one folder listing read, at most (a folder of many deleted files answers 507
/// rather than costing a read of every one).
const LISTING_PAGES_MAX: usize = 4;

impl RaftFs {
    /// The entries of the folder `path` of a namespace: live files (the folder marker left
    /// out) and folders with a live file under them; 507 past [`LISTING_ENTRIES_MAX`].
    fn entries(&self, namespace_id: &str, path: &str) -> FsResult<Vec<Entry>> {
        let folder = folder_of(path);
        let sm = self.state.node.state();
        let mut entries = Vec::new();
        let mut after: Option<String> = None;
        // What telling live subfolders from deleted ones may cost, for the whole listing; and
        // pages of the folder itself (each at most LISTING_WORK_MAX records, deleted or not).
        let mut budget = LISTING_WORK_MAX;
        let mut pages = 0;
        loop {
            pages += 1;
            if pages > LISTING_PAGES_MAX {
                return Err(FsError::InsufficientStorage);
            }
            let page = sm
                .list_folder(namespace_id, &folder, after.as_deref(), LISTING_ENTRIES_MAX, LISTING_WORK_MAX)
                .map_err(|e| fs_error(e.into()))?;
            for entry in page.entries {
                match entry {
                    FolderEntry::Folder { name } => {
                        if self.live_under(namespace_id, &format!("{folder}{name}"), &mut budget)? {
                            entries.push(Entry { name, meta: Meta::folder() });
                        }
                    }
                    FolderEntry::File { name, .. } if name == super::FOLDER_MARKER => {}
                    FolderEntry::File { name, file, version } => {
                        entries.push(Entry { name, meta: Meta::file(&file, &version) })
                    }
                }
            }
            if entries.len() > LISTING_ENTRIES_MAX {
                return Err(FsError::InsufficientStorage);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(entries),
            }
        }
    }
}

impl GuardedFileSystem<Principal> for RaftFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
        principal: &'a Principal,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        async move {
            if !options.write {
                let Place::Files { namespace_id, path, .. } = self.locate(principal, path).await? else {
                    return Err(FsError::Forbidden);
                };
                let sm = self.state.node.state();
                let (file, version) = match sm.file_at(&namespace_id, &path).map_err(|e| fs_error(e.into()))? {
                    Some((file, version)) if !file.deleted && !is_marker(&path) => (file, version),
                    _ => return Err(FsError::NotFound),
                };
                let mut chunks = Vec::with_capacity(version.chunks.len());
                for hash in &version.chunks {
                    let size = sm.chunk(hash).map_err(|e| fs_error(e.into()))?.ok_or(FsError::GeneralFailure)?.size;
                    chunks.push((*hash, size));
                }
                let meta = Meta::file(&file, &version);
                let reader = Reader { state: self.state.clone(), meta, chunks, position: 0, block: None };
                return Ok(Box::new(reader) as Box<dyn DavFile>);
            }
            let (namespace_id, path) = self.locate_writable(principal, path).await?;
            if path == "/" || is_marker(&path) {
                return Err(FsError::Forbidden);
            }
            let existing = self.lookup(&namespace_id, &path)?;
            if !options.truncate {
                // A partial PUT (Content-Range) of an existing file is not done (it would
                // commit its piece as the whole file); a LOCK of an unmapped URL makes an
                // empty file (RFC 4918 7.3), here and now.
                if existing.is_some() || !(options.create || options.create_new) {
                    return Err(FsError::NotImplemented);
                }
                self.parent_exists(&namespace_id, &path)?;
                let commit = Self::empty_commit(principal, &namespace_id, file_path(&path)?, 0);
                let (file_id, version) = self.commit(raftbox_storage::Command::CommitFile(Box::new(commit))).await?;
                let writer = Writer {
                    fs: self.clone(),
                    principal: principal.clone(),
                    namespace_id,
                    path: file_path(&path)?,
                    base_version: 0,
                    spool: None,
                    written: 0,
                    expected: Some(0),
                    executable: false,
                    committed: Some((file_id, version, 0, 0)),
                };
                return Ok(Box::new(writer) as Box<dyn DavFile>);
            }
            match existing {
                Some(meta) if meta.dir => return Err(FsError::Forbidden),
                Some(_) if options.create_new => return Err(FsError::Exists),
                None if !options.create && !options.create_new => return Err(FsError::NotFound),
                _ => {}
            }
            self.parent_exists(&namespace_id, &path)?;
            // Spooled bytes are bounded by what the caller may store, before any is written.
            let spool = Spool::open(&self.state, principal, options.size).await.map_err(spool_error)?;
            let current = self.state.node.state().file_at(&namespace_id, &path).map_err(|e| fs_error(e.into()))?;
            let (base_version, executable) = current
                .filter(|(file, _)| !file.deleted)
                .map_or((0, false), |(file, version)| (file.current_version, version.executable));
            let writer = Writer {
                fs: self.clone(),
                principal: principal.clone(),
                namespace_id,
                path: file_path(&path)?,
                base_version,
                spool: Some(spool),
                written: 0,
                expected: options.size,
                executable,
                committed: None,
            };
            Ok(Box::new(writer) as Box<dyn DavFile>)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
        principal: &'a Principal,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        async move {
            let personal = principal.user.namespace_id.clone();
            let mut entries = match self.locate(principal, path).await? {
                Place::Shares => {
                    let mut entries: Vec<Entry> = self
                        .shares(principal)?
                        .into_iter()
                        .map(|share| Entry { name: share.name, meta: Meta::folder() })
                        .collect();
                    entries.extend(self.entries(&personal, &format!("/{SHARED_FOLDER}"))?);
                    entries
                }
                Place::Files { namespace_id, path, .. } => {
                    let mut entries = self.entries(&namespace_id, &path)?;
                    // The personal root shows `Shared` while there is a shared folder.
                    let root = namespace_id == personal && path == "/";
                    if root && !entries.iter().any(|e| e.name == SHARED_FOLDER) && !self.shares(principal)?.is_empty() {
                        entries.push(Entry { name: SHARED_FOLDER.to_string(), meta: Meta::folder() });
                    }
                    entries
                }
            };
            entries.truncate(LISTING_ENTRIES_MAX);
            let boxed: Vec<FsResult<Box<dyn DavDirEntry>>> =
                entries.into_iter().map(|e| Ok(Box::new(e) as Box<dyn DavDirEntry>)).collect();
            let stream: FsStream<Box<dyn DavDirEntry>> = Box::pin(stream::iter(boxed));
            Ok(stream)
        }
        .boxed()
    }

    fn metadata<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, Box<dyn DavMetaData>> {
        async move {
            let found = match self.locate(principal, path).await? {
                Place::Shares => Some(Meta::folder()),
                Place::Files { path, .. } if is_marker(&path) => None,
                Place::Files { namespace_id, path, .. } => self.lookup(&namespace_id, &path)?,
            };
            found.map(|meta| Box::new(meta) as Box<dyn DavMetaData>).ok_or(FsError::NotFound)
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (namespace_id, path) = match self.locate(principal, path).await? {
                Place::Shares => return Err(FsError::Exists),
                Place::Files { namespace_id, path, writable: true } => (namespace_id, path),
                Place::Files { .. } => return Err(FsError::Forbidden),
            };
            if self.lookup(&namespace_id, &path)?.is_some() {
                return Err(FsError::Exists);
            }
            self.parent_exists(&namespace_id, &path)?;
            let marker = file_path(&format!("{path}/{}", super::FOLDER_MARKER))?;
            let commit = Self::empty_commit(principal, &namespace_id, marker, 0);
            self.commit(raftbox_storage::Command::CommitFile(Box::new(commit))).await.map(|_| ())
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (namespace_id, path) = self.locate_writable(principal, path).await?;
            // A namespace's root (the personal one, a shared folder's) is not WebDAV's to remove.
            if path == "/" {
                return Err(FsError::Forbidden);
            }
            for (file, base) in self.files_under(&namespace_id, &path)? {
                self.delete_file(principal, &namespace_id, &file, base).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (namespace_id, path) = self.locate_writable(principal, path).await?;
            match self.current_version(&namespace_id, &path)? {
                0 => Err(FsError::NotFound),
                base => self.delete_file(principal, &namespace_id, &path, base).await,
            }
        }
        .boxed()
    }

    fn rename<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let (from_namespace, from) = self.locate_writable(principal, from).await?;
            let (to_namespace, to) = self.locate_writable(principal, to).await?;
            let same = from_namespace == to_namespace;
            if from == "/" || to == "/" || (same && to.starts_with(&folder_of(&from))) {
                return Err(FsError::Forbidden);
            }
            self.parent_exists(&to_namespace, &to)?;
            let files = match self.lookup(&from_namespace, &from)? {
                None => return Err(FsError::NotFound),
                Some(meta) if !meta.dir => vec![(from.clone(), self.current_version(&from_namespace, &from)?)],
                Some(_) => self.files_under(&from_namespace, &from)?,
            };
            for (file, base) in files {
                let target = format!("{to}{}", &file[from.len()..]);
                if same {
                    self.move_file(principal, &from_namespace, &file, &target, base).await?;
                } else {
                    // Between namespaces: the copy first, so a failure part-way loses nothing.
                    self.copy_file(principal, (&from_namespace, &file), (&to_namespace, &target)).await?;
                    self.delete_file(principal, &from_namespace, &file, base).await?;
                }
            }
            Ok(())
        }
        .boxed()
    }

    fn copy<'a>(&'a self, from: &'a DavPath, to: &'a DavPath, principal: &'a Principal) -> FsFuture<'a, ()> {
        async move {
            let Place::Files { namespace_id: from_namespace, path: from, .. } = self.locate(principal, from).await?
            else {
                return Err(FsError::Forbidden);
            };
            let (to_namespace, to) = self.locate_writable(principal, to).await?;
            self.copy_file(principal, (&from_namespace, &from), (&to_namespace, &to)).await
        }
        .boxed()
    }

    fn get_quota<'a>(&'a self, principal: &'a Principal) -> FsFuture<'a, (u64, Option<u64>)> {
        async move {
            let used = self.state.node.state().stored_bytes(&principal.user.id).map_err(|e| fs_error(e.into()))?;
            let quota = (!principal.user.admin).then(|| self.state.limits.get().quotas.stored_bytes_per_user);
            Ok((used, quota))
        }
        .boxed()
    }
}
