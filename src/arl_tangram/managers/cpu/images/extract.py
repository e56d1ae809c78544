"""Safe extraction of one image layer (a tar stream) into a directory of the image store.

Runs in: the service process (worker threads), for `store.ImageStore`.
Invariant: nothing outside the destination is ever written. Each member passes small named
checks before it is extracted (`safe_rel`: no ``..``, no absolute path, no NUL; `check_parents`:
never written through a symlink or under a non-directory; `check_type`: no device node, FIFO or
unknown type; `check_link`: a symlink stays inside the image, a hard link names a regular file
of this layer) and a bad archive raises `ImageError` with the reason. OCI whiteouts become
overlay whiteouts (a 0/0 character device) and opaque directories the
``trusted.overlay.opaque`` xattr, so stacking layers as overlay lower directories applies them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from typing import IO, Any

from arl_tangram.core.errors import ImageError

WH = ".wh."
OPQ = ".wh..wh..opq"


def unpack(f: IO[bytes], tmp_dir: str, target: str, where: str, expect: str | None = None) -> None:
    """Unpack the layer tar stream ``f`` (gzip/bzip2/xz or plain) to ``target``, through a
    private temporary directory under ``tmp_dir``; ``expect``: the stream's sha256 digest."""
    work = tempfile.mkdtemp(prefix="layer-", dir=tmp_dir)
    dest = os.path.join(work, "root")
    os.mkdir(dest, 0o755)
    hf: Any = Hashing(f) if expect else f
    try:
        raw = decompressed(hf)
        try:
            tf = tarfile.open(fileobj=raw, mode="r|")  # noqa: SIM115
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ImageError(f"{where}: not a readable tar layer: {e}") from None
        with tf:
            extract_all(tf, dest, where)
        while raw.read(1 << 20):  # to the end: a cut compressed stream raises here
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
        if isinstance(e, OSError) and not isinstance(e, EOFError) and e.errno is not None:
            raise ImageError(f"{where}: cannot unpack: {e}") from None
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
        while self.read(1 << 20):
            pass


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


def check_parents(dest: str, rel: str, where: str, name: str) -> None:
    """No component above the entry may be a symlink (writing through it would leave dest)."""
    cur = dest
    for p in rel.split("/")[:-1]:
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise ImageError(f"{where}: entry {name!r} would be written through the symlink "
                             f"{os.path.relpath(cur, dest)!r}")
        if not stat.S_ISDIR(st.st_mode):
            raise ImageError(f"{where}: entry {name!r} is under a non-directory")


def check_type(m: tarfile.TarInfo, where: str) -> None:
    """Only regular files, directories, symlinks and hard links (no device node, no FIFO)."""
    if m.ischr() or m.isblk():
        raise ImageError(f"{where}: entry {m.name!r} is a device node (refused)")
    if m.isfifo():
        raise ImageError(f"{where}: entry {m.name!r} is a FIFO (refused)")
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        raise ImageError(f"{where}: entry {m.name!r} has an unsupported type {m.type!r}")


def check_link(m: tarfile.TarInfo, rel: str, dest: str, where: str) -> None:
    """A symlink stays inside the image; a hard link names a regular file of this layer."""
    if m.issym() and not link_inside(rel, m.linkname):
        raise ImageError(f"{where}: symlink {m.name!r} -> {m.linkname!r} points outside "
                         "the image")
    if m.islnk():
        lrel = safe_rel(m.linkname, where)
        check_parents(dest, lrel, where, m.linkname)
        src = os.path.join(dest, lrel)
        if not os.path.lexists(src) or os.path.isdir(src) or os.path.islink(src):
            raise ImageError(f"{where}: hard link {m.name!r} -> {m.linkname!r} names no "
                             "regular file of this layer")


def _remove(target: str) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    else:
        os.unlink(target)


def _make_room(m: tarfile.TarInfo, target: str) -> None:
    """A later entry replaces an earlier one (a directory over a directory merges)."""
    if os.path.lexists(target) and not (m.isdir() and os.path.isdir(target)
                                        and not os.path.islink(target)):
        _remove(target)


def _plain_member(m: tarfile.TarInfo, rel: str, where: str) -> tarfile.TarInfo:
    """``m`` named ``rel``, its link target checked, setuid/setgid dropped on files (the
    mount is nosuid anyway)."""
    m = m.replace(name=rel, mode=m.mode & 0o1777 if not m.isdir() else m.mode & 0o7777,
                  deep=False)
    if m.islnk():
        m = m.replace(linkname=safe_rel(m.linkname, where), deep=False)
    return m


def extract_all(tf: tarfile.TarFile, dest: str, where: str) -> None:
    """Extract every member of ``tf`` under ``dest`` after its checks; whiteouts and opaque
    directories after the layer's own entries, directory attributes last."""
    opaque: list[str] = []
    whiteouts: list[str] = []
    dirs: list[tarfile.TarInfo] = []
    for m in tf:
        rel = safe_rel(m.name, where)
        if not rel:
            continue
        check_parents(dest, rel, where, m.name)
        parent, _, base = rel.rpartition("/")
        if base == OPQ:
            opaque.append(parent)
            continue
        if base.startswith(WH):
            whiteouts.append((parent + "/" if parent else "") + base[len(WH):])
            continue
        check_type(m, where)
        check_link(m, rel, dest, where)
        _make_room(m, os.path.join(dest, rel))
        m = _plain_member(m, rel, where)
        if m.isdir():
            dirs.append(m)
        tf.extract(m, dest, set_attrs=not m.isdir(), numeric_owner=True,
                   filter="fully_trusted")
    _whiteouts(dest, whiteouts, where)
    _opaque(dest, opaque)
    _dir_attrs(dest, dirs)


def _whiteouts(dest: str, rels: list[str], where: str) -> None:
    """Each OCI whiteout as an overlay whiteout: a 0/0 character device."""
    for rel in rels:
        target = os.path.join(dest, rel)
        check_parents(dest, rel, where, rel)
        if os.path.lexists(target):
            _remove(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _opaque(dest: str, rels: list[str]) -> None:
    for rel in rels:
        d = os.path.join(dest, rel) if rel else dest
        os.makedirs(d, exist_ok=True)
        os.setxattr(d, "trusted.overlay.opaque", b"y", follow_symlinks=False)


def _dir_attrs(dest: str, dirs: list[tarfile.TarInfo]) -> None:
    """Directory modes, owners and times last (a read-only directory is filled by then)."""
    for m in reversed(dirs):
        path = os.path.join(dest, m.name)
        with contextlib.suppress(OSError):
            os.lchown(path, m.uid, m.gid)
            os.chmod(path, m.mode & 0o7777)
            os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)
