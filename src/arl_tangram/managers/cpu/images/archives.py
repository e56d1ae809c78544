"""Readers of the image archives a node imports: OCI image layout (directory or archive),
docker-archive, root file system (tarball or directory). No registry is contacted.

Runs in: the service process (worker threads), for `store.ImageStore`.
Invariant: a reader only reads its source and hands each layer stream to the store
(`LayerSink.unpack_layer`), which extracts it safely (`extract`); it returns the image's layer
keys bottom-up and its runtime config, or raises `ImageError` saying what is wrong.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import tarfile
import tempfile
from typing import IO, Any, Protocol

from arl_tangram.core.errors import ImageError, ImageTooLarge

from .extract import CHUNK, Budget

_MEDIA_INDEX = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")

Layers = tuple[list[str], dict[str, Any]]  # (layer keys bottom-up, runtime config)


class LayerSink(Protocol):
    """Where a reader puts layers: one import into the image store, with its `Budget` (what
    the image may still expand to; its limits also cap what a reader holds in memory)."""

    tmp_dir: str
    budget: Budget

    def has_layer(self, key: str) -> bool: ...

    def unpack_layer(self, f: IO[bytes], key: str, where: str,
                     expect: str | None = None) -> None: ...


def read(path: str, sink: LayerSink) -> tuple[str, Layers]:
    """The format of ``path`` and its layers, unpacked into ``sink``."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "oci-layout")):
            return "oci-dir", from_oci(_DirSource(path, sink), sink)
        return "rootfs-dir", from_rootfs_dir(path, sink)
    return from_file(path, sink)


# An OCI or docker archive holds a few members per layer: a plain tar with more than this many
# before its markers is read as a root file system (its members are never all held in memory).
_MAX_ARCHIVE_MEMBERS = 4096


def from_file(path: str, sink: LayerSink) -> tuple[str, Layers]:
    """A file: an OCI or docker archive (plain tars only: they are read by random access), else
    a root file-system tarball (compressed or not), streamed by the safe extractor."""
    if not _plain_tar(path):
        return "rootfs-tar", from_rootfs_tar(path, sink)
    try:
        tf = tarfile.open(path, "r:")  # noqa: SIM115
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ImageError(f"{path}: not a readable tar archive: {e}") from None
    with tf:
        members = _archive_members(tf)
        if members is not None:
            names = {_norm_member(m.name) for m in members}
            if "oci-layout" in names and "index.json" in names:
                return "oci-archive", from_oci(_TarSource(members, tf, path, sink), sink)
            if "manifest.json" in names:
                return "docker-archive", from_docker(_TarSource(members, tf, path, sink), sink)
    return "rootfs-tar", from_rootfs_tar(path, sink)

def from_rootfs_tar(path: str, sink: LayerSink) -> Layers:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    key = "sha256-" + h.hexdigest()
    if not sink.has_layer(key):
        with open(path, "rb") as f:
            sink.unpack_layer(f, key, path)
    return [key], {}

def from_rootfs_dir(path: str, sink: LayerSink) -> Layers:
    """A directory: packed into a tar inside the cache (symlinks kept as links, never
    followed), then imported as a root file-system tarball."""
    fd, tmp = tempfile.mkstemp(prefix="dir-", suffix=".tar", dir=sink.tmp_dir)
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
        return from_rootfs_tar(tmp, sink)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)

def from_oci(src: _Source, sink: LayerSink) -> Layers:
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
        if not sink.has_layer(key):
            with src.open_blob(ld["digest"]) as f:
                sink.unpack_layer(f, key, f"{src.where}:{ld['digest']}", expect=ld["digest"])
        layers.append(key)
    return layers, _runtime_config(config)

def from_docker(src: _TarSource, sink: LayerSink) -> Layers:
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
            spool = tempfile.TemporaryFile(dir=sink.tmp_dir)  # noqa: SIM115
            cap, n = sink.budget.bytes_left + sink.budget.limits.ratio_slack, 0
            for chunk in iter(lambda: f.read(CHUNK), b""):
                n += len(chunk)
                if n > cap:
                    spool.close()
                    raise ImageTooLarge(f"{src.where}:{lp}: the layer is larger than the image "
                                        "may unpack to")
                h.update(chunk)
                spool.write(chunk)
        key = "sha256-" + h.hexdigest()
        with spool:
            if not sink.has_layer(key):
                spool.seek(0)
                sink.unpack_layer(spool, key, f"{src.where}:{lp}")
        layers.append(key)
    return layers, _runtime_config(config)


# ---- sources of OCI layouts ------------------------------------------------------------------

class _Source:
    where: str
    max_meta: int  # the most bytes `read` and `blob` hold in memory (a manifest, a config)

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def open_blob(self, digest: str) -> IO[bytes]:
        raise NotImplementedError

    def _capped(self, f: IO[bytes], what: str) -> bytes:
        data = f.read(self.max_meta + 1)
        if len(data) > self.max_meta:
            raise ImageTooLarge(f"{self.where}: {what} is larger than {self.max_meta} bytes "
                                "(images.max_meta_bytes)")
        return data

    def blob(self, digest: str, verify: bool = False) -> bytes:
        with self.open_blob(digest) as f:
            data = self._capped(f, f"blob {digest}")
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
    def __init__(self, path: str, sink: LayerSink) -> None:
        self.path = path
        self.where = path
        self.max_meta = sink.budget.limits.max_meta_bytes

    def _open(self, rel: str) -> IO[bytes]:
        full = os.path.join(self.path, rel)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise ImageError(f"{self.where}: {rel}: {e.strerror}") from None
        return os.fdopen(fd, "rb")

    def read(self, rel: str) -> bytes:
        with self._open(rel) as f:
            return self._capped(f, rel)

    def open_blob(self, digest: str) -> IO[bytes]:
        return self._open(_blob_rel(digest))


class _TarSource(_Source):
    def __init__(self, members: list[tarfile.TarInfo], tf: tarfile.TarFile, path: str,
                 sink: LayerSink) -> None:
        self.tf, self.where = tf, path
        self.max_meta = sink.budget.limits.max_meta_bytes
        self.by_name = {_norm_member(m.name): m for m in members}

    def open_member(self, rel: str) -> IO[bytes]:
        m = self.by_name.get(_norm_member(rel))
        for _ in range(8):  # (docker-archive layers may be symlinks: to blobs, to another layer)
            if m is None or not m.issym():
                break
            m = self.by_name.get(_link_target(m))
        if m is None or not m.isreg():
            raise ImageError(f"{self.where}: {rel} missing from the archive")
        if m.issparse():  # (its declared size is not what it holds)
            raise ImageTooLarge(f"{self.where}: {rel} is a sparse member of {m.size} bytes "
                                "(refused: it would expand past what the archive holds)")
        f = self.tf.extractfile(m)
        assert f is not None
        return f

    def read(self, rel: str) -> bytes:
        with self.open_member(rel) as f:
            return self._capped(f, rel)

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


def _link_target(m: tarfile.TarInfo) -> str:
    """The member a symlink member names, resolved lexically inside the archive
    (``id2/layer.tar -> ../id1/layer.tar`` is ``id1/layer.tar``); "" (no member) for an
    absolute target or one above the archive's root."""
    if m.linkname.startswith("/"):
        return ""  # pragma: no mutate (None names no member either: `by_name.get`)
    target = posixpath.normpath(posixpath.join(posixpath.dirname(_norm_member(m.name)), m.linkname))
    return "" if target == ".." or target.startswith("../") else target


def _norm_member(name: str) -> str:
    n = name
    while n.startswith("./"):
        n = n[2:]
    return n.rstrip("/")


def _archive_members(tf: tarfile.TarFile) -> list[tarfile.TarInfo] | None:
    """The members of an OCI or docker archive, or None: more than `_MAX_ARCHIVE_MEMBERS`
    (a root file system) or not a readable tar (the rootfs reader says why)."""
    out: list[tarfile.TarInfo] = []
    try:
        while (m := tf.next()) is not None:
            out.append(m)
            if len(out) > _MAX_ARCHIVE_MEMBERS:
                return None
    except (tarfile.TarError, EOFError, OSError):
        return None
    return out


def _plain_tar(path: str) -> bool:
    """OCI/docker archives are read by random access: plain (uncompressed) tars only."""
    with open(path, "rb") as f:
        head = f.read(6)
    return not (head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head == b"\xfd7zXZ\x00")
