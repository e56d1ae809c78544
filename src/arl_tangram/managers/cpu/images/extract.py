"""Safe extraction of one image layer (a tar stream) into a directory of the image store.

Runs in: the service process (worker threads), for `store.ImageStore` (imports, uploads, and
layers pulled from another node: `transfer.LayerSpool`).
Invariant: nothing outside the destination is ever written, and no path is ever resolved
through a symlink. Every file-system operation is relative to a directory descriptor opened
under the destination one component at a time with ``O_NOFOLLOW | O_DIRECTORY`` (`Root.walk`),
so a component that is (or has meanwhile become) a symlink stops the walk instead of leading
out; modes, owners and times are set on descriptors (``fchmod``, ``fchown``, ``futimens``) or
with ``AT_SYMLINK_NOFOLLOW``, never by path. Each member passes small named checks first
(`safe_rel`: no ``..``, no absolute path, no NUL; `check_type`: no device node, FIFO, sparse
member or unknown type; `check_link`: a symlink stays inside the image, a hard link names a
regular file of this layer) and a bad archive raises `ImageError` with the reason. A member that
replaces an earlier one removes it first, as containerd and Docker do (a directory over a
directory merges). OCI whiteouts become overlay whiteouts (a 0/0 character device) and opaque
directories the ``trusted.overlay.opaque`` xattr, so stacking layers as overlay lower
directories applies them.

What a layer may expand to is bounded by a `Budget` (bytes, entries, the decompression ratio,
and the free space left on the cache's file system); passing a bound raises `ImageTooLarge`
at once, and the half-unpacked layer is removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Any

from arl_tangram.core.errors import ImageError, ImageTooLarge

WH = ".wh."
OPQ = ".wh..wh..opq"
CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """Bounds on what one import may expand to (node config ``cpu:`` ``image_*``; defaults
    sized for SWE images: a few GB and up to ~200k files each, docs/config.md)."""

    max_bytes: int = 16 << 30  # bytes of regular files one image may unpack to
    max_files: int = 300_000  # entries (files, directories, links) one image may unpack to
    max_ratio: float = 200.0  # unpacked tar bytes per compressed byte, past `ratio_slack`
    ratio_slack: int = 64 << 20  # the first bytes of a stream are not held to the ratio
    max_meta_bytes: int = 8 << 20  # a manifest, index or config read into memory
    min_free_bytes: int = 2 << 30  # free space the cache's file system always keeps
    min_free_inodes: int = 100_000  # free inodes it always keeps

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_files", "ratio_slack", "max_meta_bytes",
                     "min_free_bytes", "min_free_inodes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"image limit {name} must be an integer >= 0, got {v!r}")
        if not isinstance(self.max_ratio, int | float) or not self.max_ratio >= 1:
            raise ValueError(f"image limit max_ratio must be a number >= 1, got "
                             f"{self.max_ratio!r}")


class Budget:
    """What one import may still write (shared by its layers): bytes and entries left, and
    the free-space floor of the file system at ``fs_path``, checked every 64 MiB / 4096
    entries. `charge` raises `ImageTooLarge` naming the bound."""

    def __init__(self, limits: ImageLimits, fs_path: str, *, max_bytes: int | None = None,
                 why: str = "") -> None:
        self.limits, self.fs_path = limits, fs_path
        self.bytes_left = limits.max_bytes if max_bytes is None else min(max_bytes,
                                                                          limits.max_bytes)
        self.files_left = limits.max_files
        self.why = why or f"image_max_mb: {limits.max_bytes >> 20} MiB"
        self._since_check = 0

    def charge(self, nbytes: int, files: int, where: str) -> None:
        if nbytes > self.bytes_left:
            raise ImageTooLarge(f"{where}: the image unpacks to more than it may "
                                f"({self.why})")
        if files > self.files_left:
            raise ImageTooLarge(f"{where}: the image has more entries than it may "
                                f"(image_max_files: {self.limits.max_files})")
        self.bytes_left -= nbytes
        self.files_left -= files
        self._since_check += nbytes + files * 16384
        if self._since_check >= 64 << 20:
            self._since_check = 0
            self.check_free(where)

    def check_free(self, where: str) -> None:
        st = os.statvfs(self.fs_path)
        if st.f_bavail * st.f_frsize < self.limits.min_free_bytes:
            raise ImageTooLarge(f"{where}: the image cache's file system is nearly full "
                                f"(it keeps {self.limits.min_free_bytes >> 20} MiB free)")
        if st.f_files and st.f_favail < self.limits.min_free_inodes:
            raise ImageTooLarge(f"{where}: the image cache's file system is nearly out of "
                                f"inodes (it keeps {self.limits.min_free_inodes} free)")


def unpack(f: IO[bytes], tmp_dir: str, target: str, where: str, expect: str | None,
           budget: Budget) -> None:
    """Unpack the layer tar stream ``f`` (gzip/bzip2/xz or plain) to ``target``, through a
    private temporary directory under ``tmp_dir``; ``expect``: the stream's sha256 digest;
    ``budget``: what it may expand to (default limits when None)."""
    budget.check_free(where)
    work = tempfile.mkdtemp(prefix="layer-", dir=tmp_dir)
    dest = os.path.join(work, "root")
    os.mkdir(dest, 0o755)
    hf: Any = Hashing(f) if expect else f
    try:
        packed = Counted(hf)
        raw = Ratio(decompressed(packed), packed, budget.limits, where)
        try:
            tf = tarfile.open(fileobj=raw, mode="r|")  # noqa: SIM115
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ImageError(f"{where}: not a readable tar layer: {e}") from None
        with tf, Root(dest, where) as root:
            extract_all(tf, root, where, budget)
        while raw.read(CHUNK):  # to the end: a cut compressed stream raises here
            pass
        if expect:
            assert isinstance(hf, Hashing)
            hf.drain()
            got = "sha256:" + hf.h.hexdigest()
            if got != expect:
                raise ImageError(f"{where}: digest mismatch: got {got} (truncated or "
                                 "altered blob)")
        try:
            os.rename(dest, target)
        except OSError:
            if not os.path.isdir(target):  # (else: another import made it meanwhile)
                raise
    except (tarfile.TarError, EOFError, OSError, zlib_error(), lzma_error()) as e:
        if isinstance(e, OSError) and e.errno is not None:  # (EOFError is not an OSError)
            raise ImageError(f"{where}: cannot unpack: {e.strerror}") from None
        raise ImageError(f"{where}: truncated or corrupt archive: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def zlib_error() -> type[BaseException]:
    import zlib
    return zlib.error


def lzma_error() -> type[BaseException]:
    import lzma
    return lzma.LZMAError


def decompressed(f: Any) -> Any:
    """``f`` decompressed by its magic (gzip, bzip2, xz) or as it is; the decompressors raise
    EOFError on a stream cut short, so reading it to the end checks it is whole."""
    import bz2
    import gzip
    import lzma

    b = f if hasattr(f, "peek") else io.BufferedReader(f, 1 << 16)
    head = b.peek(6)[:6]
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=b, mode="rb")
    if head[:3] == b"BZh":
        return bz2.BZ2File(b)
    if head == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(b)
    if head[:4] == b"\x28\xb5\x2f\xfd":
        raise ImageError("zstd-compressed layers are not supported here")
    return b


class Hashing(io.RawIOBase):
    """A read-only stream that hashes what passes through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h = f, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        self.h.update(data)
        b[: len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


class Counted(io.RawIOBase):
    """A read-only stream that counts the bytes read through it (the packed side)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.n = f, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        b[: len(data)] = data
        self.n += len(data)
        return len(data)


class Ratio(io.RawIOBase):
    """The unpacked stream, refused (`ImageTooLarge`) once it holds more than
    ``limits.max_ratio`` times the packed bytes read so far (past ``limits.ratio_slack``):
    a decompression bomb stops within its first few hundred MB, whatever its size."""

    def __init__(self, f: Any, packed: Counted, limits: ImageLimits, where: str) -> None:
        self.f, self.packed, self.limits, self.where, self.n = f, packed, limits, where, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        b[: len(data)] = data
        self.n += len(data)
        if self.n > self.limits.ratio_slack and \
                self.n > self.limits.max_ratio * max(self.packed.n, 1):
            raise ImageTooLarge(f"{self.where}: the layer expands more than "
                                f"{self.limits.max_ratio:g} times its packed size (a "
                                "decompression bomb?)")
        return len(data)


# ---- names and member checks ------------------------------------------------------------------

def safe_rel(name: str, where: str) -> str:
    """The member's path relative to the layer root, or ImageError for ``..`` / absolute."""
    if "\x00" in name:
        raise ImageError(f"{where}: entry {name!r} has a NUL byte")
    if name.startswith("/"):
        raise ImageError(f"{where}: entry {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ImageError(f"{where}: entry {name!r} leaves the image (path traversal '..')")
    return "/".join(parts)


def link_inside(rel: str, target: str) -> bool:
    """Does a symlink at ``rel`` with ``target`` stay inside the image root? An absolute target
    names a path of the image itself (it is resolved in the sandbox's root), so only ``..``
    that climbs above the root leaves it."""
    base = [] if target.startswith("/") else rel.split("/")[:-1]
    depth = len(base)
    for p in target.split("/"):
        if p in ("", "."):
            continue
        depth = depth - 1 if p == ".." else depth + 1
        if depth < 0:
            return False
    return True


def check_type(m: tarfile.TarInfo, where: str) -> None:
    """Only regular files, directories, symlinks and hard links (no device node, no FIFO, no
    sparse member: its declared size is not what it holds)."""
    if m.ischr() or m.isblk():
        raise ImageError(f"{where}: entry {m.name!r} is a device node (refused)")
    if m.isfifo():
        raise ImageError(f"{where}: entry {m.name!r} is a FIFO (refused)")
    if m.issparse():
        raise ImageTooLarge(f"{where}: entry {m.name!r} is a sparse file of {m.size} bytes "
                            "(refused: it would expand past what the archive holds)")
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        raise ImageError(f"{where}: entry {m.name!r} has an unsupported type {m.type!r}")


def check_link(m: tarfile.TarInfo, rel: str, where: str) -> None:
    """A symlink stays inside the image (a hard link's target is checked where it is made)."""
    if m.issym() and not link_inside(rel, m.linkname):
        raise ImageError(f"{where}: symlink {m.name!r} -> {m.linkname!r} points outside "
                         "the image")


# ---- the destination, by descriptors ------------------------------------------------------------

class Root:
    """The destination directory as a descriptor; every path under it is reached with
    `walk`, one component at a time, never through a symlink."""

    def __init__(self, dest: str, where: str) -> None:
        self.fd = os.open(dest, _DIR_FLAGS)
        self.where = where

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def walk(self, parts: list[str], name: str, *, create: bool,
             budget: Budget | None = None) -> int:
        """A new descriptor of the directory ``parts`` under the root (made, mode 0755, when
        missing and ``create``; FileNotFoundError when missing otherwise); ImageError when a
        component is a symlink or not a directory (``name``: the entry, for the message)."""
        fd = os.dup(self.fd)
        try:
            for i, p in enumerate(parts):
                try:
                    nfd = os.open(p, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    if budget is not None:
                        budget.charge(0, 1, self.where)
                    os.mkdir(p, 0o755, dir_fd=fd)
                    nfd = os.open(p, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    at = "/".join(parts[: i + 1])
                    if stat.S_ISLNK(os.lstat(p, dir_fd=fd).st_mode):
                        raise ImageError(f"{self.where}: entry {name!r} would be written "
                                         f"through the symlink {at!r}") from None
                    raise ImageError(f"{self.where}: entry {name!r} is under a "
                                     f"non-directory {at!r}") from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise


def _lstat(base: str, dfd: int) -> os.stat_result | None:
    try:
        return os.lstat(base, dir_fd=dfd)
    except FileNotFoundError:
        return None


def _remove(base: str, dfd: int, st: os.stat_result) -> None:
    """Remove the entry ``base`` of directory ``dfd`` (a directory with all it holds: the
    descriptor-based rmtree, which never follows a link)."""
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(base, dir_fd=dfd)
    else:
        os.unlink(base, dir_fd=dfd)


def _owner(fd: int, uid: int, gid: int) -> None:
    """Set the owner (root only; elsewhere the extracting user's own is kept, as tar does)."""
    with contextlib.suppress(PermissionError):
        os.fchown(fd, uid, gid)


def _file(tf: tarfile.TarFile, m: tarfile.TarInfo, base: str, dfd: int, budget: Budget,
          where: str) -> None:
    """A regular file, its data copied in chunks; setuid/setgid dropped (the mount is nosuid
    anyway)."""
    budget.charge(m.size, 1, where)
    fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    try:
        src = tf.extractfile(m)
        assert src is not None
        left = m.size
        while left > 0:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                raise ImageError(f"{where}: truncated or corrupt archive: entry {m.name!r} "
                                 "is cut short")
            _write_all(fd, chunk)
            left -= len(chunk)
        _owner(fd, m.uid, m.gid)
        os.fchmod(fd, m.mode & 0o1777)
        os.utime(fd, (m.mtime, m.mtime))
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _hardlink(m: tarfile.TarInfo, root: Root, base: str, dfd: int, budget: Budget,
              where: str) -> None:
    """A hard link to a regular file of this layer, made without following any link."""
    lrel = safe_rel(m.linkname, where)
    lparts = lrel.split("/")
    if not lrel:
        raise ImageError(f"{where}: hard link {m.name!r} -> {m.linkname!r} names no regular "
                         "file of this layer")
    try:
        sfd = root.walk(lparts[:-1], m.linkname, create=False)
    except FileNotFoundError:
        sfd = -1
    try:
        st = _lstat(lparts[-1], sfd) if sfd >= 0 else None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ImageError(f"{where}: hard link {m.name!r} -> {m.linkname!r} names no "
                             "regular file of this layer")
        budget.charge(0, 1, where)
        os.link(lparts[-1], base, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
    finally:
        if sfd >= 0:
            os.close(sfd)


def extract_all(tf: tarfile.TarFile, root: Root, where: str, budget: Budget) -> None:
    """Extract every member of ``tf`` under ``root`` after its checks; whiteouts and opaque
    directories after the layer's own entries, directory attributes last. The stream's member
    list is dropped as it goes (a layer of a million entries is not held in memory)."""
    opaque: list[str] = []
    whiteouts: list[str] = []
    dirs: dict[str, tuple[int, int, int, int]] = {}  # rel -> mode, uid, gid, mtime (the last)
    while True:
        m = tf.next()
        if m is None:
            break
        tf.members.clear()  # type: ignore[attr-defined]  # (stream mode keeps them all)
        rel = safe_rel(m.name, where)
        if not rel:
            continue
        parts = rel.split("/")
        base = parts[-1]
        if base == OPQ:
            opaque.append("/".join(parts[:-1]))
            continue
        if base.startswith(WH):
            if base[len(WH):] in ("", ".", ".."):
                raise ImageError(f"{where}: whiteout {m.name!r} names nothing")
            whiteouts.append("/".join([*parts[:-1], base[len(WH):]]))
            continue
        check_type(m, where)
        check_link(m, rel, where)
        dfd = root.walk(parts[:-1], m.name, create=True, budget=budget)
        try:
            old = _lstat(base, dfd)
            if old is not None and not (m.isdir() and stat.S_ISDIR(old.st_mode)):
                _remove(base, dfd, old)  # a later entry replaces an earlier one
                old = None
            if m.isdir():
                if old is None:
                    budget.charge(0, 1, where)
                    os.mkdir(base, 0o700, dir_fd=dfd)
                dirs[rel] = (m.mode & 0o7777, m.uid, m.gid, int(m.mtime))
            elif m.issym():
                budget.charge(0, 1, where)
                os.symlink(m.linkname, base, dir_fd=dfd)
                with contextlib.suppress(PermissionError):
                    os.chown(base, m.uid, m.gid, dir_fd=dfd, follow_symlinks=False)
                os.utime(base, (m.mtime, m.mtime), dir_fd=dfd, follow_symlinks=False)
            elif m.islnk():
                _hardlink(m, root, base, dfd, budget, where)
            else:
                _file(tf, m, base, dfd, budget, where)
        finally:
            os.close(dfd)
    _whiteouts(root, whiteouts, budget, where)
    _opaque(root, opaque, budget)
    _dir_attrs(root, dirs)


def _whiteouts(root: Root, rels: list[str], budget: Budget, where: str) -> None:
    """Each OCI whiteout as an overlay whiteout: a 0/0 character device."""
    for rel in rels:
        parts = rel.split("/")
        dfd = root.walk(parts[:-1], rel, create=True, budget=budget)
        try:
            old = _lstat(parts[-1], dfd)
            if old is not None:
                _remove(parts[-1], dfd, old)
            budget.charge(0, 1, where)
            os.mknod(parts[-1], stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=dfd)
        finally:
            os.close(dfd)


def _opaque(root: Root, rels: list[str], budget: Budget) -> None:
    """Each opaque marker as the ``trusted.overlay.opaque`` xattr of its directory."""
    for rel in rels:
        fd = root.walk(rel.split("/") if rel else [], f"{rel}/{OPQ}" if rel else OPQ,
                       create=True, budget=budget)
        try:
            os.setxattr(fd, "trusted.overlay.opaque", b"y")
        finally:
            os.close(fd)


def _dir_attrs(root: Root, dirs: dict[str, tuple[int, int, int, int]]) -> None:
    """Directory modes, owners and times last (a read-only directory is filled by then, and
    entries made in a directory no longer move its time; a directory's last entry wins), set on
    a descriptor of the directory itself: one that a later entry replaced with a symlink or a
    file is no longer a directory, and is skipped."""
    for rel, (mode, uid, gid, mtime) in dirs.items():
        try:
            fd = root.walk(rel.split("/"), rel, create=False)
        except (ImageError, FileNotFoundError):
            continue
        try:
            _owner(fd, uid, gid)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
