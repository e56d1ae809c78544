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

Here: the store (import, list, acquire/release, remove; between nodes: a layer out as a stream,
a layer in from a spool, a pulled image's record once all its layers are here). The archive
readers are `archives`, the safe extractor `extract`, a layer's transfer `transfer`; the
image-name rule is `core.images`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from arl_tangram.core.errors import ImageError, ImageInUse, ImageTooLarge
from arl_tangram.core.images import NAME_RE, check_name

from . import archives, extract, transfer
from .extract import Budget, ImageLimits

__all__ = ["NAME_RE", "Image", "ImageError", "ImageInUse", "ImageLimits", "ImageStore",
           "ImageTooLarge", "check_name"]

OWNER_SEP = "+"  # "<tenant>+<name>": a tenant's own image (api.tenancy); no separator: shared


def owner_of(name: str) -> str:
    """Whose total an image counts in: the part of its name before the first ``+``, or ""."""
    owner, sep, _ = name.partition(OWNER_SEP)
    return owner if sep else ""


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
    layer_sizes: list[int] = field(default_factory=list)  # bytes of each layer, as ``layers``

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "layers": list(self.layers),
                "config": self.config, "source": self.source, "format": self.fmt,
                "size": self.size, "imported_at": self.imported_at, "import_s": self.import_s,
                "layer_sizes": list(self.layer_sizes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Image:
        return cls(name=d["name"], digest=d["digest"], layers=list(d["layers"]),
                   config=dict(d.get("config") or {}), source=d.get("source", ""),
                   fmt=d.get("format", ""), size=int(d.get("size", 0)),
                   imported_at=float(d.get("imported_at", 0.0)),
                   import_s=float(d.get("import_s", 0.0)),
                   layer_sizes=[int(x) for x in d.get("layer_sizes") or ()])


class ImageStore:
    """The cache under ``root``: ``layers/``, ``images/``, ``tmp/``. Thread-safe for imports
    (one lock around the index); the in-use counts are kept by whoever mounts images."""

    def __init__(self, root: str, limits: ImageLimits | None = None, *,
                 owner_max_bytes: int = 0, max_total_bytes: int = 0) -> None:
        """``limits``: what one import may expand to; ``owner_max_bytes``: the most the images
        of one owner (a tenant, or the shared ones) may hold together; ``max_total_bytes``:
        the most the layers of the cache may hold (0: no such cap)."""
        self.limits = limits or ImageLimits()
        self.owner_max_bytes, self.max_total_bytes = owner_max_bytes, max_total_bytes
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

    def _drop_unused(self, keys: list[str]) -> None:
        """Remove the layers ``keys`` that no image record names."""
        with self._lock:
            keep = {k for other in self.list_images() for k in other.layers}
            for k in set(keys) - keep:
                self._rmtree(self.layer_path(k))

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
        job = _Import(self, self.budget_for(name))
        try:
            fmt, (layers, config) = archives.read(path, job)
        except BaseException:
            self._drop_unused(job.made)  # nothing of a refused import stays
            raise
        digest = "sha256:" + hashlib.sha256(
            json.dumps([layers, config], sort_keys=True).encode()).hexdigest()
        sizes = [_du(self.layer_path(k)) for k in layers]
        img = Image(name=name, digest=digest, layers=layers, config=config, source=path,
                    fmt=fmt, size=sum(sizes), import_s=round(time.perf_counter() - t0, 6),
                    layer_sizes=sizes)
        self._write_record(img)
        return img

    def _write_record(self, img: Image) -> None:
        """Record ``img`` (its layers are in the cache), replacing an unused older version."""
        with self._lock:
            self._check_unused(img.name, "it cannot be replaced now")
            missing = [k for k in img.layers if not self.has_layer(k)]
            if missing:  # (removed meanwhile with the last image that used it)
                raise ImageError(f"image {img.name!r}: layer(s) {', '.join(missing)} missing")
            old = self.get(img.name) if self.has(img.name) else None
            tmp = self._record(img.name) + ".tmp"
            with open(tmp, "w") as f:
                json.dump(img.to_dict(), f)
            os.replace(tmp, self._record(img.name))
            if old is not None:  # layers only the replaced version used
                keep = {k for other in self.list_images() for k in other.layers}
                for k in set(old.layers) - keep:
                    self._rmtree(self.layer_path(k))

    # ---- between nodes (issue 26): `transfer` moves the layers, this records the image --------
    def open_layer(self, key: str, chunk_bytes: int = transfer.CHUNK_BYTES) -> transfer.LayerStream:
        """Layer ``key`` as a tar stream read in chunks (the sending side of a pull)."""
        return transfer.LayerStream(self.layer_path(check_layer_key(key)), chunk_bytes)

    def new_spool(self) -> transfer.LayerSpool:
        """Where the chunks of one layer a peer sends are written (the receiving side)."""
        self._ensure()
        return transfer.LayerSpool(self.tmp_dir)

    def finish_layer(self, spool: transfer.LayerSpool, key: str, digest: str, where: str) -> None:
        """Unpack a whole spooled layer to ``layers/<key>`` (its stream digest checked), within
        the limits of one import."""
        spool.finish(self.tmp_dir, self.layer_path(check_layer_key(key)), digest, where,
                     Budget(self.limits, self.tmp_dir))

    def add_pulled(self, record: dict[str, Any], source: str, pull_s: float) -> Image:
        """Record an image a peer described (``record``: its `Image.to_dict`) once every
        layer it names is in this cache."""
        img = Image.from_dict(record)
        check_name(img.name)
        for k in img.layers:
            check_layer_key(k)
        img.source, img.imported_at, img.import_s = source, time.time(), round(pull_s, 6)
        if len(img.layer_sizes) != len(img.layers):
            img.layer_sizes = [_du(self.layer_path(k)) for k in img.layers]
        self._write_record(img)
        return img

    # ---- bounds --------------------------------------------------------------------------
    def budget_for(self, name: str) -> Budget:
        """What importing ``name`` may write: the per-image limits, what its owner's images
        leave of ``owner_max_bytes`` (the version it replaces not counted) and what the cache's
        layers leave of ``max_total_bytes``."""
        cap, why = self.limits.max_bytes, f"image_max_mb: {self.limits.max_bytes >> 20} MiB"
        images = self.list_images() if self.owner_max_bytes or self.max_total_bytes else []
        if self.owner_max_bytes:
            owner = owner_of(name)
            used = sum(i.size for i in images if owner_of(i.name) == owner and i.name != name)
            if self.owner_max_bytes - used < cap:
                cap = max(self.owner_max_bytes - used, 0)
                who = f"tenant {owner!r}'s images" if owner else "the shared images"
                why = f"{who} may hold {self.owner_max_bytes >> 20} MiB in all " \
                      "(image_tenant_max_mb)"
        if self.max_total_bytes:
            sizes = {k: n for i in images for k, n in zip(i.layers, i.layer_sizes, strict=False)}
            if self.max_total_bytes - sum(sizes.values()) < cap:
                cap = max(self.max_total_bytes - sum(sizes.values()), 0)
                why = f"the cache may hold {self.max_total_bytes >> 20} MiB (image_store_max_mb)"
        return Budget(self.limits, self.tmp_dir, max_bytes=cap, why=why)

    # ---- the layer sink of the archive readers ----------------------------------------------
    def has_layer(self, key: str) -> bool:
        return os.path.isdir(self.layer_path(key))


class _Import:
    """One import into ``store``: the readers' `archives.LayerSink`, charging ``budget``."""

    def __init__(self, store: ImageStore, budget: Budget) -> None:
        self.store, self.budget, self.tmp_dir = store, budget, store.tmp_dir
        self.made: list[str] = []  # layers this import unpacked

    def has_layer(self, key: str) -> bool:
        return self.store.has_layer(key)

    def unpack_layer(self, f: IO[bytes], key: str, where: str, expect: str | None = None) -> None:
        """Unpack the layer tar stream ``f`` (gzip/bzip2/xz or plain) to ``layers/<key>``."""
        extract.unpack(f, self.tmp_dir, self.store.layer_path(key), where, expect, self.budget)
        self.made.append(key)


_LAYER_KEY = re.compile(r"sha256-[0-9a-f]{64}")


def check_layer_key(key: str) -> str:
    """``key`` when it is a layer key (``sha256-<64 hex>``: a peer names layers too), else
    ImageError."""
    if not isinstance(key, str) or not _LAYER_KEY.fullmatch(key):
        raise ImageError(f"not a layer key: {key!r}")
    return key


def _du(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for n in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, n))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total
