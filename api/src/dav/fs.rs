//! [`RaftFs`] as `dav-server` sees it: each call located ([`RaftFs::locate`]), judged (a
//! change needs a writable place), then served from the state machine or proposed.

use axum::http::StatusCode;
use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, DavProp, FsError, FsFuture, FsResult, FsStream, GuardedFileSystem, OpenOptions,
    ReadDirMeta,
};
use futures_util::{stream, FutureExt as _};
use raftbox_storage::files::FolderEntry;
use raftbox_storage::props::{PropChange, PropPatch};
use raftbox_storage::{Command, Outcome, Rejection};

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
    /// The live file at `path` (not a folder, not a marker), or 404.
    async fn live_file(&self, principal: &Principal, path: &DavPath) -> FsResult<raftbox_storage::records::FileRecord> {
        let Place::Files { namespace_id, path, .. } = self.locate(principal, path).await? else {
            return Err(FsError::NotFound);
        };
        if is_marker(&path) {
            return Err(FsError::NotFound);
        }
        match self.state.node.state().file_at(&namespace_id, &path).map_err(|e| fs_error(e.into()))? {
            Some((file, _)) if !file.deleted => Ok(file),
            _ => Err(FsError::NotFound),
        }
    }

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
            self.fence.check(&namespace_id, &path)?;
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
            self.fence.check(&namespace_id, &path)?;
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
            self.fence.check(&from_namespace, &from)?;
            self.fence.check(&to_namespace, &to)?;
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
            self.fence.check(&to_namespace, &to)?;
            self.copy_file(principal, (&from_namespace, &from), (&to_namespace, &to)).await
        }
        .boxed()
    }

    fn have_props<'a>(
        &'a self,
        path: &'a DavPath,
        principal: &'a Principal,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        // Files hold dead properties; folders (implicit, or a marker) do not.
        async move { self.live_file(principal, path).await.is_ok() }.boxed()
    }

    fn patch_props<'a>(
        &'a self,
        path: &'a DavPath,
        patch: Vec<(bool, DavProp)>,
        principal: &'a Principal,
    ) -> FsFuture<'a, Vec<(StatusCode, DavProp)>> {
        async move {
            let (namespace_id, at) = self.locate_writable(principal, path).await?;
            let changes = patch
                .iter()
                .map(|(set, prop)| PropChange {
                    namespace: prop.namespace.clone().unwrap_or_default(),
                    name: prop.name.clone(),
                    xml: set.then(|| String::from_utf8_lossy(prop.xml.as_deref().unwrap_or_default()).into_owned()),
                })
                .collect();
            let patch_command =
                PropPatch { namespace_id, path: file_path(&at)?, actor_user_id: principal.user.id.clone(), changes };
            let outcome = self.state.node.write(Command::PatchProps(Box::new(patch_command))).await;
            self.wrote().await;
            let status = match outcome.map_err(|e| fs_error(e.into()))? {
                Outcome::Done => StatusCode::OK,
                Outcome::Rejected(Rejection::LimitReached(_)) => StatusCode::INSUFFICIENT_STORAGE,
                Outcome::Rejected(Rejection::Forbidden(_)) => StatusCode::FORBIDDEN,
                Outcome::Rejected(Rejection::NotFound(_)) => return Err(FsError::NotFound),
                other => {
                    tracing::warn!(?other, "webdav: unexpected outcome of a property patch");
                    return Err(FsError::GeneralFailure);
                }
            };
            let answered = patch.into_iter().map(|(_, prop)| (status, DavProp { xml: None, ..prop })).collect();
            Ok(answered)
        }
        .boxed()
    }

    fn get_props<'a>(
        &'a self,
        path: &'a DavPath,
        do_content: bool,
        principal: &'a Principal,
    ) -> FsFuture<'a, Vec<DavProp>> {
        async move {
            let file = self.live_file(principal, path).await?;
            let props = self.state.node.state().dead_props(&file.id).map_err(|e| fs_error(e.into()))?;
            Ok(props
                .props
                .into_iter()
                .map(|prop| DavProp {
                    name: prop.name,
                    prefix: None,
                    namespace: (!prop.namespace.is_empty()).then_some(prop.namespace),
                    xml: do_content.then(|| prop.xml.into_bytes()),
                })
                .collect())
        }
        .boxed()
    }

    fn get_prop<'a>(&'a self, path: &'a DavPath, prop: DavProp, principal: &'a Principal) -> FsFuture<'a, Vec<u8>> {
        async move {
            let file = self.live_file(principal, path).await?;
            let props = self.state.node.state().dead_props(&file.id).map_err(|e| fs_error(e.into()))?;
            let namespace = prop.namespace.unwrap_or_default();
            props
                .props
                .into_iter()
                .find(|found| found.namespace == namespace && found.name == prop.name)
                .map(|found| found.xml.into_bytes())
                .ok_or(FsError::NotFound)
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
