"""Moving one layer of the image store to another node's store (issue 26, item 3).

Runs in: the service process (or a Ray NodeAgent), in worker threads; never in the fork server or
a sandbox.
Invariant: a layer travels as a plain tar stream in OCI form, and is unpacked on the receiving
node by the same safe extractor as an imported archive (`extract.unpack`), under the same key,
so what a peer sends can never write outside the receiver's ``layers/<key>``. The sender packs
the layer's directory back into a tar (an overlay whiteout, the 0/0 character device, becomes
``.wh.NAME``; a directory with ``trusted.overlay.opaque`` gets a ``.wh..wh..opq`` entry; owners
numeric, hard links as links), in a thread of its own that runs at most one chunk ahead of the
reader, so the sender holds at most a few chunks in memory, whatever the layer's size. The
receiver spools the chunks to a file in its store's ``tmp/`` (disk, not memory), hashing them;
the sha256 of the whole stream, which the sender reports at the end, must match before the
layer is unpacked (a stream cut or altered in transit is refused). The key stays the layer's
content address from its import (the digest of the archive's blob); the stream's own digest
only checks the transfer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import stat
import tarfile
import tempfile
import threading
from typing import Any

from arl_tangram.core.errors import ImageError

from .extract import OPQ, WH, Budget, unpack

CHUNK_BYTES = 64 << 20  # one piece of a layer on the wire


class _Stopped(Exception):
    """The reader closed the stream: the packing thread ends."""


_END = object()


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _marker(tf: tarfile.TarFile, name: str) -> None:
    ti = tarfile.TarInfo(name)
    ti.mode, ti.size = 0o644, 0
    tf.addfile(ti)


def pack_into(root: str, tf: tarfile.TarFile) -> None:
    """Write the layer directory ``root`` into ``tf`` in OCI form (whiteouts as ``.wh.``
    entries, opaque directories as ``.wh..wh..opq``), sorted, owners numeric."""
    for top, dirs, files in os.walk(root):
        dirs.sort()
        rel_top = os.path.relpath(top, root)
        prefix = "" if rel_top == "." else rel_top + "/"
        if _opaque(top):
            _marker(tf, prefix + OPQ)
        for n in sorted(dirs) + sorted(files):
            full = os.path.join(top, n)
            st = os.lstat(full)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # an overlay whiteout
                _marker(tf, prefix + WH + n)
                continue
            ti = tf.gettarinfo(full, arcname=prefix + n)
            ti.uname = ti.gname = ""
            if ti.isreg():
                with open(full, "rb") as f:
                    tf.addfile(ti, f)
            else:
                tf.addfile(ti)


class LayerStream:
    """The layer directory ``root`` as a tar stream, read in chunks of ``chunk_bytes``
    (`next`; ``b""`` at the end, then `digest` and `size` are the whole stream's). The packing
    runs in a daemon thread, blocked while one chunk waits unread; `close` stops it."""

    def __init__(self, root: str, chunk_bytes: int = CHUNK_BYTES) -> None:
        if not os.path.isdir(root):
            raise ImageError(f"no layer {os.path.basename(root)!r} on this node")
        self.root, self.chunk = root, max(1 << 16, int(chunk_bytes))
        self.size, self.done = 0, False
        self._h = hashlib.sha256()
        self._buf = bytearray()
        self._q: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tangram-layer-out", daemon=True)
        self._thread.start()

    @property
    def digest(self) -> str:
        return "sha256:" + self._h.hexdigest()

    # (the packing thread's side: tarfile writes here)
    def write(self, b: bytes) -> int:
        if self._stop.is_set():
            raise _Stopped
        self._buf += b
        while len(self._buf) >= self.chunk:
            piece = bytes(self._buf[: self.chunk])
            del self._buf[: self.chunk]
            self._put(piece)
        return len(b)

    def _put(self, item: Any) -> None:
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                self._q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            with tarfile.open(fileobj=self, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
                pack_into(self.root, tf)
            if self._buf:
                self._put(bytes(self._buf))
                self._buf.clear()
            self._put(_END)
        except _Stopped:
            return
        except BaseException as e:  # (handed to the reader)
            with contextlib.suppress(_Stopped):
                self._put(e)

    # (the reader's side)
    def next(self) -> bytes:
        """The next chunk; ``b""`` once the stream is whole. ImageError when packing failed."""
        if self.done:
            return b""
        item = self._q.get()
        if item is _END:
            self.done = True
            self._thread.join()
            return b""
        if isinstance(item, BaseException):
            self.done = True
            raise ImageError(f"cannot pack layer {os.path.basename(self.root)}: {item}")
        self._h.update(item)
        self.size += len(item)
        return bytes(item)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._q.get_nowait()
        self._thread.join(timeout=5)


class LayerSpool:
    """The receiving side of one layer: chunks written to a file in ``tmp_dir`` (`write`),
    hashed as they come; `finish` checks the stream's digest and unpacks it to ``target``."""

    def __init__(self, tmp_dir: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="pull-", suffix=".tar", dir=tmp_dir)
        self._f = os.fdopen(fd, "wb")
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._h.update(chunk)
        self._f.write(chunk)
        self.size += len(chunk)

    def finish(self, tmp_dir: str, target: str, digest: str, where: str,
               budget: Budget) -> None:
        try:
            self._f.close()
            got = "sha256:" + self._h.hexdigest()
            if got != digest:
                raise ImageError(f"{where}: the layer stream arrived altered or cut "
                                 f"({self.size} bytes, {got}; the sender sent {digest})")
            with open(self.path, "rb") as f:
                unpack(f, tmp_dir, target, where, None, budget)
        finally:
            self.discard()

    def close(self) -> None:
        """All written (the file is whole on disk)."""
        self._f.close()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


__all__ = ["CHUNK_BYTES", "LayerSpool", "LayerStream", "pack_into"]
