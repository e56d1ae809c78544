"""A node's content-addressed cache of environment images (issue 17).

Invariant: nothing outside ``root`` is ever written. A layer is unpacked once, into a private
temporary directory inside the cache, checked member by member, and only then renamed to
``layers/<digest>``, where every image that has that layer shares it; an image is a small JSON
record (``images/<name>.json``) naming its layers bottom-up and its config. A bad archive
(truncated, a path with ``..`` or absolute, an entry written through a symlink, a link that
leaves the layer, a device node, a digest that does not match) raises `ImageError` with the
reason, and its temporary directory is removed. No registry is contacted: images come from an
OCI image layout (directory or archive, as ``skopeo copy`` / ``podman save --format
oci-archive`` write them), a docker-archive (``docker save``), or a root file system as a
tarball or a directory.

Layers are kept ready for overlayfs: an OCI whiteout ``.wh.NAME`` becomes the overlay whiteout
(a 0/0 character device ``NAME``) and ``.wh..wh..opq`` the ``trusted.overlay.opaque`` xattr of
its directory, so stacking the layers as overlay lower directories applies them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from arl_tangram.core.errors import ImageError, ImageInUse
from arl_tangram.core.images import NAME_RE, check_name

__all__ = ["NAME_RE", "Image", "ImageError", "ImageInUse", "ImageStore", "check_name"]

_WH = ".wh."
_OPQ = ".wh..wh..opq"
_MEDIA_INDEX = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(slots=True)
class Image:
    name: str
    digest: str  # sha256 of its layer digests and config, in order
    layers: list[str]  # layer keys ("sha256-<hex>"), bottom first
    config: dict[str, Any]  # Env, WorkingDir, User, Cmd... (the OCI config's "config")
    source: str
    fmt: str
    size: int  # bytes of its unpacked layers
    imported_at: float = field(default_factory=time.time)
    import_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "layers": list(self.layers),
                "config": self.config, "source": self.source, "format": self.fmt,
                "size": self.size, "imported_at": self.imported_at, "import_s": self.import_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Image:
        return cls(name=d["name"], digest=d["digest"], layers=list(d["layers"]),
                   config=dict(d.get("config") or {}), source=d.get("source", ""),
                   fmt=d.get("format", ""), size=int(d.get("size", 0)),
                   imported_at=float(d.get("imported_at", 0.0)),
                   import_s=float(d.get("import_s", 0.0)))


class ImageStore:
    """The cache under ``root``: ``layers/``, ``images/``, ``tmp/``. Thread-safe for imports
    (one lock around the index); the in-use counts are kept by whoever mounts images."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.layers_dir = os.path.join(self.root, "layers")
        self.images_dir = os.path.join(self.root, "images")
        self.tmp_dir = os.path.join(self.root, "tmp")
        self._lock = threading.RLock()
        self._users: dict[str, int] = {}
        # while an image has users here, a shared flock on its record: another process (the
        # CLI on this node's cache) cannot remove or replace it either
        self._held: dict[str, int] = {}
        if os.path.isdir(self.tmp_dir):
            for left in os.listdir(self.tmp_dir):  # an import killed part-way
                shutil.rmtree(os.path.join(self.tmp_dir, left), ignore_errors=True)

    def _ensure(self) -> None:
        """The cache's directories (made at the first import, not before)."""
        for d in (self.root, self.layers_dir, self.images_dir, self.tmp_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)

    # ---- index --------------------------------------------------------------------------
    def _record(self, name: str) -> str:
        return os.path.join(self.images_dir, check_name(name) + ".json")

    def get(self, name: str) -> Image:
        try:
            with open(self._record(name)) as f:
                return Image.from_dict(json.load(f))
        except FileNotFoundError:
            raise ImageError(f"no image {name!r} on this node") from None

    def list_images(self) -> list[Image]:
        out: list[Image] = []
        if not os.path.isdir(self.images_dir):
            return out
        for fn in sorted(os.listdir(self.images_dir)):
            if fn.endswith(".json"):
                with contextlib.suppress(ImageError, OSError, ValueError, KeyError):
                    out.append(self.get(fn[:-5]))
        return out

    def has(self, name: str) -> bool:
        return os.path.exists(self._record(name))

    def layer_path(self, key: str) -> str:
        return os.path.join(self.layers_dir, key)

    def layer_paths(self, image: Image) -> list[str]:
        """Overlay lower directories, TOP first (overlayfs's order)."""
        return [self.layer_path(k) for k in reversed(image.layers)]

    # ---- users --------------------------------------------------------------------------
    def acquire(self, name: str) -> Image:
        with self._lock:
            img = self.get(name)
            if name not in self._held:
                fd = os.open(self._record(name), os.O_RDONLY | os.O_CLOEXEC)
                fcntl.flock(fd, fcntl.LOCK_SH)
                self._held[name] = fd
            self._users[name] = self._users.get(name, 0) + 1
            return img

    def release(self, name: str) -> None:
        with self._lock:
            n = self._users.get(name, 0) - 1
            if n > 0:
                self._users[name] = n
            else:
                self._users.pop(name, None)
                fd = self._held.pop(name, None)
                if fd is not None:
                    os.close(fd)

    def _check_unused(self, name: str, what: str) -> None:
        """ImageInUse when users here or in another process hold ``name``."""
        n = self._users.get(name, 0)
        if n:
            raise ImageInUse(f"image {name!r} is in use by {n} session(s)/action(s) on "
                             f"this node; {what}")
        try:
            fd = os.open(self._record(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ImageInUse(f"image {name!r} is in use by a running service on this node; "
                             f"{what}") from None
        finally:
            os.close(fd)

    def users(self, name: str) -> int:
        return self._users.get(name, 0)

    # ---- remove -------------------------------------------------------------------------
    def remove(self, name: str) -> Image:
        with self._lock:
            img = self.get(name)
            self._check_unused(name, "close them first")
            os.unlink(self._record(name))
            keep = {k for other in self.list_images() for k in other.layers}
            for k in set(img.layers) - keep:
                self._rmtree(self.layer_path(k))
            return img

    def _rmtree(self, path: str) -> None:
        """Remove ``path`` (inside the cache) by renaming it into tmp/ first, so a half-removed
        layer is never seen under its digest."""
        if not os.path.lexists(path):
            return
        dst = tempfile.mkdtemp(prefix="rm-", dir=self.tmp_dir)
        os.rename(path, os.path.join(dst, "x"))
        shutil.rmtree(dst, ignore_errors=True)

    # ---- import -------------------------------------------------------------------------
    def import_path(self, path: str, name: str, *, replace: bool = True) -> Image:
        """Import ``path`` (OCI layout dir or archive, docker-archive, rootfs tar or dir)."""
        check_name(name)
        self._ensure()
        t0 = time.perf_counter()
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise ImageError(f"{path}: no such file or directory")
        with self._lock:
            if not replace and self.has(name):
                raise ImageError(f"image {name!r} exists")
            self._check_unused(name, "it cannot be replaced now")
        if os.path.isdir(path):
            if os.path.exists(os.path.join(path, "oci-layout")):
                fmt, (layers, config) = "oci-dir", self._from_oci(_DirSource(path))
            else:
                fmt, (layers, config) = "rootfs-dir", self._from_rootfs_dir(path)
        else:
            fmt, (layers, config) = self._from_file(path)
        digest = "sha256:" + hashlib.sha256(
            json.dumps([layers, config], sort_keys=True).encode()).hexdigest()
        size = sum(_du(self.layer_path(k)) for k in layers)
        img = Image(name=name, digest=digest, layers=layers, config=config, source=path,
                    fmt=fmt, size=size, import_s=round(time.perf_counter() - t0, 6))
        with self._lock:
            self._check_unused(name, "it cannot be replaced now")
            old = self.get(name) if self.has(name) else None
            tmp = self._record(name) + ".tmp"
            with open(tmp, "w") as f:
                json.dump(img.to_dict(), f)
            os.replace(tmp, self._record(name))
            if old is not None:  # layers only the replaced version used
                keep = {k for other in self.list_images() for k in other.layers}
                for k in set(old.layers) - keep:
                    self._rmtree(self.layer_path(k))
        return img

    def _from_file(self, path: str) -> tuple[str, tuple[list[str], dict[str, Any]]]:
        try:
            tf = tarfile.open(path, "r:*")  # noqa: SIM115
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ImageError(f"{path}: not a readable tar archive: {e}") from None
        with tf:
            try:
                names = {_norm_member(m.name) for m in _members(tf, path)}
            except ImageError:
                names = set()
            if "oci-layout" in names and "index.json" in names and tf.fileobj is not None \
                    and _plain_tar(path):
                return "oci-archive", self._from_oci(_TarSource(tf, path))
            if "manifest.json" in names and _plain_tar(path):
                return "docker-archive", self._from_docker(_TarSource(tf, path))
        return "rootfs-tar", self._from_rootfs_tar(path)

    def _from_rootfs_tar(self, path: str) -> tuple[list[str], dict[str, Any]]:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        key = "sha256-" + h.hexdigest()
        if not os.path.isdir(self.layer_path(key)):
            with open(path, "rb") as f:
                self._unpack(f, key, path)
        return [key], {}

    def _from_rootfs_dir(self, path: str) -> tuple[list[str], dict[str, Any]]:
        """A directory: packed into a tar inside the cache (symlinks kept as links, never
        followed), then imported as a root file-system tarball."""
        fd, tmp = tempfile.mkstemp(prefix="dir-", suffix=".tar", dir=self.tmp_dir)
        os.close(fd)
        try:
            with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
                for top, dirs, files in os.walk(path):
                    dirs.sort()
                    for n in sorted(dirs) + sorted(files):
                        full = os.path.join(top, n)
                        rel = os.path.relpath(full, path)
                        ti = tf.gettarinfo(full, arcname=rel)
                        ti.mtime = int(ti.mtime)
                        if ti.isreg():
                            with open(full, "rb") as f:
                                tf.addfile(ti, f)
                        else:
                            tf.addfile(ti)
            return self._from_rootfs_tar(tmp)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _from_oci(self, src: _Source) -> tuple[list[str], dict[str, Any]]:
        try:
            layout = json.loads(src.read("oci-layout"))
            index = json.loads(src.read("index.json"))
        except (ValueError, KeyError) as e:
            raise ImageError(f"{src.where}: not an OCI image layout: {e}") from None
        if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
            raise ImageError(f"{src.where}: oci-layout has no imageLayoutVersion")
        desc = _pick(index, src.where)
        for _ in range(4):  # nested indexes (a multi-platform image)
            if desc.get("mediaType") not in _MEDIA_INDEX:
                break
            desc = _pick(json.loads(src.blob(desc["digest"], verify=True)), src.where)
        manifest = json.loads(src.blob(desc["digest"], verify=True))
        config = json.loads(src.blob(manifest["config"]["digest"], verify=True))
        layers = []
        for ld in manifest.get("layers") or ():
            key = _key(ld["digest"])
            if not os.path.isdir(self.layer_path(key)):
                with src.open_blob(ld["digest"]) as f:
                    self._unpack(f, key, f"{src.where}:{ld['digest']}", expect=ld["digest"])
            layers.append(key)
        return layers, _runtime_config(config)

    def _from_docker(self, src: _TarSource) -> tuple[list[str], dict[str, Any]]:
        try:
            manifest = json.loads(src.read("manifest.json"))
            entry = manifest[0]
            config = json.loads(src.read(entry["Config"]))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ImageError(f"{src.where}: bad docker-archive manifest.json: {e}") from None
        layers = []
        for lp in entry.get("Layers") or ():
            with src.open_member(lp) as f:  # digest: sha256 of the layer tar (its diff_id)
                h = hashlib.sha256()
                spool = tempfile.TemporaryFile(dir=self.tmp_dir)  # noqa: SIM115
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    spool.write(chunk)
            key = "sha256-" + h.hexdigest()
            with spool:
                if not os.path.isdir(self.layer_path(key)):
                    spool.seek(0)
                    self._unpack(spool, key, f"{src.where}:{lp}")
            layers.append(key)
        return layers, _runtime_config(config)

    # ---- the one unpacker ---------------------------------------------------------------
    def _unpack(self, f: IO[bytes], key: str, where: str, expect: str | None = None) -> None:
        """Unpack the layer tar stream ``f`` (gzip/bzip2/xz or plain) to ``layers/<key>``."""
        work = tempfile.mkdtemp(prefix="layer-", dir=self.tmp_dir)
        dest = os.path.join(work, "root")
        os.mkdir(dest, 0o755)
        hf: Any = _Hashing(f) if expect else f
        try:
            raw = _decompressed(hf)
            try:
                tf = tarfile.open(fileobj=raw, mode="r|")  # noqa: SIM115
            except (tarfile.TarError, OSError, EOFError) as e:
                raise ImageError(f"{where}: not a readable tar layer: {e}") from None
            with tf:
                _extract_all(tf, dest, where)
            while raw.read(1 << 20):  # to the end: a cut compressed stream raises here
                pass
            if expect:
                assert isinstance(hf, _Hashing)
                hf.drain()
                got = "sha256:" + hf.h.hexdigest()
                if got != expect:
                    raise ImageError(f"{where}: digest mismatch: got {got} (truncated or "
                                     "altered blob)")
            target = self.layer_path(key)
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


# ---- sources of OCI layouts ------------------------------------------------------------------

class _Source:
    where: str

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def open_blob(self, digest: str) -> IO[bytes]:
        raise NotImplementedError

    def blob(self, digest: str, verify: bool = False) -> bytes:
        with self.open_blob(digest) as f:
            data = f.read()
        if verify and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ImageError(f"{self.where}: blob {digest} does not match its digest")
        return data


def _blob_rel(digest: str) -> str:
    algo, _, hexd = str(digest).partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        raise ImageError(f"unsupported or malformed digest {digest!r}")
    return f"blobs/sha256/{hexd}"


def _key(digest: str) -> str:
    _blob_rel(digest)
    return digest.replace(":", "-")


class _DirSource(_Source):
    def __init__(self, path: str) -> None:
        self.path = path
        self.where = path

    def _open(self, rel: str) -> IO[bytes]:
        full = os.path.join(self.path, rel)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise ImageError(f"{self.where}: {rel}: {e.strerror}") from None
        return os.fdopen(fd, "rb")

    def read(self, rel: str) -> bytes:
        with self._open(rel) as f:
            return f.read()

    def open_blob(self, digest: str) -> IO[bytes]:
        return self._open(_blob_rel(digest))


class _TarSource(_Source):
    def __init__(self, tf: tarfile.TarFile, path: str) -> None:
        self.tf, self.where = tf, path
        self.by_name = {_norm_member(m.name): m for m in tf.getmembers()}

    def open_member(self, rel: str) -> IO[bytes]:
        m = self.by_name.get(_norm_member(rel))
        for _ in range(8):  # (docker-archive layers may be symlinks to blobs)
            if m is None or not m.issym():
                break
            m = self.by_name.get(_norm_member(os.path.join(os.path.dirname(m.name),
                                                           m.linkname)))
        if m is None or not m.isreg():
            raise ImageError(f"{self.where}: {rel} missing from the archive")
        f = self.tf.extractfile(m)
        assert f is not None
        return f

    def read(self, rel: str) -> bytes:
        with self.open_member(rel) as f:
            return f.read()

    def open_blob(self, digest: str) -> IO[bytes]:
        return self.open_member(_blob_rel(digest))


def _pick(index: Any, where: str) -> dict[str, Any]:
    mans = index.get("manifests") if isinstance(index, dict) else None
    if not mans:
        raise ImageError(f"{where}: index lists no manifest")
    for m in mans:  # this machine's platform first
        p = m.get("platform") or {}
        if p.get("os", "linux") == "linux" and p.get("architecture", "amd64") in ("amd64",):
            return dict(m)
    return dict(mans[0])


def _runtime_config(config: Any) -> dict[str, Any]:
    c = (config or {}).get("config") or {} if isinstance(config, dict) else {}
    return {k: c[k] for k in ("Env", "WorkingDir", "User", "Cmd", "Entrypoint") if c.get(k)}


# ---- safe extraction ---------------------------------------------------------------------------

def _norm_member(name: str) -> str:
    n = name
    while n.startswith("./"):
        n = n[2:]
    return n.rstrip("/")


def _members(tf: tarfile.TarFile, where: str) -> Iterator[tarfile.TarInfo]:
    try:
        yield from tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ImageError(f"{where}: truncated or corrupt archive: {e}") from None


def _plain_tar(path: str) -> bool:
    """OCI/docker archives are read by random access: plain (uncompressed) tars only."""
    with open(path, "rb") as f:
        head = f.read(6)
    return not (head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head == b"\xfd7zXZ\x00")


def zlib_error() -> type[BaseException]:
    import zlib
    return zlib.error


def lzma_error() -> type[BaseException]:
    import lzma
    return lzma.LZMAError


def _decompressed(f: Any) -> Any:
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


class _Hashing(io.RawIOBase):
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


def _safe_rel(name: str, where: str) -> str:
    """The member's path relative to the layer root, or ImageError for ``..`` / absolute."""
    if "\x00" in name:
        raise ImageError(f"{where}: entry {name!r} has a NUL byte")
    if name.startswith("/"):
        raise ImageError(f"{where}: entry {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ImageError(f"{where}: entry {name!r} leaves the image (path traversal '..')")
    return "/".join(parts)


def _link_inside(rel: str, target: str) -> bool:
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


def _check_parents(dest: str, rel: str, where: str, name: str) -> None:
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


def _extract_all(tf: tarfile.TarFile, dest: str, where: str) -> None:
    opaque: list[str] = []
    whiteouts: list[str] = []
    dirs: list[tarfile.TarInfo] = []
    for m in tf:
        rel = _safe_rel(m.name, where)
        if not rel:
            continue
        _check_parents(dest, rel, where, m.name)
        base = rel.rsplit("/", 1)[-1]
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if base == _OPQ:
            opaque.append(parent)
            continue
        if base.startswith(_WH):
            whiteouts.append((parent + "/" if parent else "") + base[len(_WH):])
            continue
        if m.ischr() or m.isblk():
            raise ImageError(f"{where}: entry {m.name!r} is a device node (refused)")
        if m.isfifo():
            raise ImageError(f"{where}: entry {m.name!r} is a FIFO (refused)")
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise ImageError(f"{where}: entry {m.name!r} has an unsupported type {m.type!r}")
        if m.issym() and not _link_inside(rel, m.linkname):
            raise ImageError(f"{where}: symlink {m.name!r} -> {m.linkname!r} points outside "
                             "the image")
        if m.islnk():
            lrel = _safe_rel(m.linkname, where)
            _check_parents(dest, lrel, where, m.linkname)
            src = os.path.join(dest, lrel)
            if not os.path.lexists(src) or os.path.isdir(src) or os.path.islink(src):
                raise ImageError(f"{where}: hard link {m.name!r} -> {m.linkname!r} names no "
                                 "regular file of this layer")
        target = os.path.join(dest, rel)
        if os.path.lexists(target) and not (m.isdir() and os.path.isdir(target)
                                            and not os.path.islink(target)):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        m = m.replace(name=rel, mode=m.mode & 0o1777 if not m.isdir() else m.mode & 0o7777,
                      deep=False)  # setuid/setgid dropped on files (the mount is nosuid anyway)
        if m.islnk():
            m = m.replace(linkname=_safe_rel(m.linkname, where), deep=False)
        if m.isdir():
            dirs.append(m)
        tf.extract(m, dest, set_attrs=not m.isdir(), numeric_owner=True,
                   filter="fully_trusted")
    for rel in whiteouts:  # after the layer's own entries: overlay whiteouts
        target = os.path.join(dest, rel)
        _check_parents(dest, rel, where, rel)
        if os.path.lexists(target):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
    for rel in opaque:
        d = os.path.join(dest, rel) if rel else dest
        os.makedirs(d, exist_ok=True)
        os.setxattr(d, "trusted.overlay.opaque", b"y", follow_symlinks=False)
    for m in reversed(dirs):  # directory modes/owners/times last (a read-only dir is filled)
        path = os.path.join(dest, m.name)
        with contextlib.suppress(OSError):
            os.lchown(path, m.uid, m.gid)
            os.chmod(path, m.mode & 0o7777)
            os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)


def _du(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for n in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, n))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total
