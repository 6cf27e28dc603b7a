#!/usr/bin/env python3
"""ci_fuse: a case-insensitive, case-preserving FUSE passthrough file system for tests.

    python3 ci_fuse.py BACKING_DIR MOUNTPOINT

Mounts BACKING_DIR at MOUNTPOINT and stays in the foreground until unmounted
(`fusermount3 -u MOUNTPOINT` or `umount MOUNTPOINT`) or sent SIGTERM/SIGINT. Prints one
line once mounted, nothing else on success. It stands in for a folding file system
(macOS APFS/HFS+, Windows NTFS, ext4 `casefold`) on a kernel without CONFIG_UNICODE.

- Names are stored in BACKING_DIR exactly as created. Every path component is looked up
  first exactly, then by NFC + lower case (as the sync client's `names::fold`) among the
  entries of its folder, so `README.md` finds `readme.md`, and `e` U+0301 finds U+00E9.
- Creating a name that folds to an existing entry opens that entry (O_EXCL: EEXIST);
  mkdir/symlink/link/mknod of such a name fail with EEXIST.
- rename: a case-only rename renames the entry to the new spelling; a target folding to
  another entry replaces it (the result takes the new spelling). renameat2:
  RENAME_NOREPLACE fails with EEXIST on any folded match (the entry itself included, as
  ext4 casefold does); RENAME_EXCHANGE is passed to the backing file system.
- Times are passed through in nanoseconds (utimensat/futimens on the backing file).
- A file unlinked (or renamed over) while open is moved by libfuse to `.fuse_hidden*`;
  those wait in BACKING_DIR/.ci_fuse_hidden/ (not listed) until closed, so the folder it
  was in lists and removes as empty and fstat/fchmod/futimens on the open file still work
  (not when it is unlinked under another spelling than it was opened with: ENOENT then).
- Mount options: allow_other, default_permissions, use_ino (the backing inode numbers),
  and 0-second entry/attribute caches so that the kernel never keeps a stale name or
  stale attributes under another spelling.

Needs libfuse3 (apt: fuse3) and mfusepy (pip: mfusepy==3.1.1; FUSE below overrides some
of its methods), a fusepy fork that binds libfuse 3: with libfuse 2 (fusepy) the kernel
answers EINVAL to every renameat2 with flags.
"""
import ctypes
import errno
import os
import shutil
import sys
import threading
import unicodedata

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy picks libfuse2 if it is there
import mfusepy  # noqa: E402

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
HIDDEN = ".ci_fuse_hidden"  # in BACKING_DIR: files unlinked while open, till their release
AT_FDCWD, AT_SYMLINK_NOFOLLOW = -100, 0x100
_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
_libc.futimens.argtypes = [ctypes.c_int, ctypes.c_void_p]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _check(ret):
    if ret != 0:
        raise mfusepy.FuseOSError(ctypes.get_errno())


def fold(name):
    return unicodedata.normalize("NFC", name).lower()


def _exists(path):
    try:
        os.lstat(path)
        return True
    except OSError:
        return False


class CaseFolding:
    """The operations; paths are the mount's, `real` maps them into the backing folder."""

    use_ns = True  # times as integer nanoseconds

    def __init__(self, root, mountpoint):
        self.root, self.mountpoint = root, mountpoint
        self.mutex = threading.RLock()  # serialises changes to names (not "lock": an operation)
        self.attic, self.hidden = os.path.join(root, HIDDEN), {}  # .fuse_hidden* name -> path
        shutil.rmtree(self.attic, ignore_errors=True)  # left by a killed run

    def _find(self, folder, name):
        """The stored name in backing `folder` that `name` folds to, or None."""
        if _exists(os.path.join(folder, name)):
            return name
        want = fold(name)
        try:
            return next((n for n in os.listdir(folder) if fold(n) == want), None)
        except OSError:
            return None

    def real(self, path):
        parts = [p for p in path.split("/") if p]
        if parts and parts[-1] in self.hidden:
            return self.hidden[parts[-1]]
        cur = self.root
        for i, part in enumerate(parts):
            found = self._find(cur, part)
            if found is None:
                return os.path.join(cur, *parts[i:])
            cur = os.path.join(cur, found)
        return cur

    def _new(self, path):
        """The backing path for a new entry `path`; EEXIST if its name folds to one."""
        folder, name = os.path.split(path.rstrip("/"))
        folder = self.real(folder)
        if self._find(folder, name) is not None:
            raise mfusepy.FuseOSError(errno.EEXIST)
        return os.path.join(folder, name)

    @staticmethod
    def _own(real):
        uid, gid, _ = mfusepy.fuse_get_context()
        if os.geteuid() == 0 and (uid, gid) != (0, 0):
            os.lchown(real, uid, gid)

    def init_with_config(self, conn, config):
        print(f"ci_fuse: mounted {self.root} at {self.mountpoint}", flush=True)

    def destroy(self, path):
        shutil.rmtree(self.attic, ignore_errors=True)

    def getattr(self, path, fh=None):
        st = os.fstat(fh) if fh is not None else os.lstat(self.real(path))
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid",
                                             "st_size", "st_blocks", "st_blksize", "st_rdev")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path, amode):
        if not os.access(self.real(path), amode, follow_symlinks=False):
            raise mfusepy.FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        real = self.real(path)
        for dot, where in ((".", real), ("..", os.path.dirname(real))):  # d_ino 0 is skipped
            yield dot, {"st_mode": 0o040000, "st_ino": os.lstat(where).st_ino}, 0
        with os.scandir(real) as entries:
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                if not (path == "/" and e.name == HIDDEN):
                    yield e.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0

    def readlink(self, path):
        return os.readlink(self.real(path))

    def statfs(self, path):
        sv = os.statvfs(self.root)
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_namemax")}

    def open(self, path, flags):
        return os.open(self.real(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_DIRECT))

    def create(self, path, mode, flags):
        flags &= ~os.O_DIRECT
        with self.mutex:
            folder, name = os.path.split(path)
            folder = self.real(folder)
            found = self._find(folder, name)
            if found is not None:  # the kernel asked under another spelling
                if flags & os.O_EXCL:
                    raise mfusepy.FuseOSError(errno.EEXIST)
                return os.open(os.path.join(folder, found), flags & ~os.O_CREAT)
            real = os.path.join(folder, name)
            fd = os.open(real, flags | os.O_CREAT | os.O_EXCL, mode)
            self._own(real)
            return fd

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self.real(path), length)

    def fallocate(self, path, mode, offset, length, fh):
        _check(_libc.fallocate(fh, mode, offset, length))

    def flush(self, path, fh):
        os.close(os.dup(fh))

    def release(self, path, fh):
        os.close(fh)

    def fsync(self, path, datasync, fh):
        (os.fdatasync if datasync else os.fsync)(fh)

    def fsyncdir(self, path, datasync, fh):
        fd = os.open(self.real(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def chmod(self, path, mode, fh=None):
        if fh is not None:
            return os.fchmod(fh, mode)
        real = self.real(path)
        if os.path.islink(real):
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        os.chmod(real, mode)

    def chown(self, path, uid, gid, fh=None):
        if fh is not None:
            os.fchown(fh, uid, gid)
        else:
            os.chown(self.real(path), uid, gid, follow_symlinks=False)

    def utimens(self, path, times, fh=None):
        """`times`: libfuse's struct timespec[2] as is (UTIME_NOW/UTIME_OMIT included)."""
        if fh is not None:
            _check(_libc.futimens(fh, times))
        else:
            _check(_libc.utimensat(AT_FDCWD, os.fsencode(self.real(path)), times, AT_SYMLINK_NOFOLLOW))

    def getxattr(self, path, name, *_):
        return os.getxattr(self.real(path), name, follow_symlinks=False)

    def listxattr(self, path):
        return os.listxattr(self.real(path), follow_symlinks=False)

    def setxattr(self, path, name, value, flags, *_):
        os.setxattr(self.real(path), name, value, flags, follow_symlinks=False)

    def removexattr(self, path, name):
        os.removexattr(self.real(path), name, follow_symlinks=False)

    def mkdir(self, path, mode):
        with self.mutex:
            real = self._new(path)
            os.mkdir(real, mode)
            self._own(real)

    def mknod(self, path, mode, dev):
        with self.mutex:
            real = self._new(path)
            os.mknod(real, mode, dev)
            self._own(real)

    def symlink(self, path, target):
        with self.mutex:
            real = self._new(path)
            os.symlink(target, real)
            self._own(real)

    def link(self, path, existing):
        with self.mutex:
            os.link(self.real(existing), self._new(path), follow_symlinks=False)

    def unlink(self, path):
        with self.mutex:
            os.unlink(self.real(path))
            self.hidden.pop(os.path.basename(path), None)

    def rmdir(self, path):
        with self.mutex:
            os.rmdir(self.real(path))

    def rename(self, old, new, flags=0):
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
            raise mfusepy.FuseOSError(errno.EINVAL)
        with self.mutex:
            src = self.real(old)
            if not _exists(src):
                raise mfusepy.FuseOSError(errno.ENOENT)
            folder, name = os.path.split(new)
            if name.startswith(".fuse_hidden") and not flags:  # libfuse hides an open file
                os.makedirs(self.attic, exist_ok=True)
                self.hidden[name] = os.path.join(self.attic, name)
                return os.rename(src, self.hidden[name])
            folder = self.real(folder)
            found = self._find(folder, name)
            dst, spelled = os.path.join(folder, found or name), os.path.join(folder, name)
            if found is not None and dst == src:  # the same entry: a case-only rename
                if flags & RENAME_NOREPLACE:
                    raise mfusepy.FuseOSError(errno.EEXIST)
                if not flags and found != name:
                    os.rename(src, spelled)
                return
            if flags & RENAME_NOREPLACE and found is not None:
                raise mfusepy.FuseOSError(errno.EEXIST)
            if flags & RENAME_EXCHANGE and found is None:
                raise mfusepy.FuseOSError(errno.ENOENT)
            if flags:
                _check(_libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags))
                return
            os.rename(src, dst)
            if dst != spelled:  # replaced an entry spelled otherwise: take the new spelling
                os.rename(dst, spelled)


class FUSE(mfusepy.FUSE):
    """mfusepy, but passing renameat2's flags, and the open file (if any) to truncate,
    chmod, chown and utimens."""

    def _path(self, path):
        return None if path is None else path.decode(self.encoding, self.errors)

    def rename_fuse_3(self, old, new, flags):
        return self.operations.rename(self._path(old), self._path(new), flags)

    def truncate_fuse_3(self, path, length, fip):
        return self.operations.truncate(self._path(path), length, fip.contents.fh if fip else None)

    def chmod_fuse_3(self, path, mode, fip):
        return self.operations.chmod(self._path(path), mode, fip.contents.fh if fip else None)

    def chown_fuse_3(self, path, uid, gid, fip):
        uid = -1 if uid == mfusepy.c_uid_t(-1).value else uid
        gid = -1 if gid == mfusepy.c_gid_t(-1).value else gid
        return self.operations.chown(self._path(path), uid, gid, fip.contents.fh if fip else None)

    def utimens_fuse_3(self, path, buf, fip):
        return self.operations.utimens(self._path(path), buf, fip.contents.fh if fip else None)


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} BACKING_DIR MOUNTPOINT")
    root, mountpoint = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    if not os.path.isdir(root) or not os.path.isdir(mountpoint):
        sys.exit(f"{sys.argv[0]}: BACKING_DIR and MOUNTPOINT must be folders")
    if mfusepy.fuse_version_major != 3:
        sys.exit(f"{sys.argv[0]}: needs libfuse 3 (apt-get install fuse3)")
    os.umask(0)  # the kernel has applied the caller's umask already
    try:
        FUSE(CaseFolding(root, mountpoint), mountpoint, foreground=True, fsname="ci_fuse", subtype="ci_fuse",
             allow_other=True, default_permissions=True, use_ino=True,
             entry_timeout=0, attr_timeout=0, negative_timeout=0,
             max_idle_threads=10)  # else libfuse 3.14.0 warns about its own default
    except RuntimeError as e:  # fuse_main's status: 8 when SIGTERM/SIGINT/SIGHUP ended it
        if e.args != (8,):
            sys.exit(f"ci_fuse: libfuse failed with status {e.args[0]}")


if __name__ == "__main__":
    main()
