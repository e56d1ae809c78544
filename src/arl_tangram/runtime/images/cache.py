"""One node's image cache as its host sees it (`NodeImages`): every image held is reported to
the core as warm state (``WarmPoolReport(node, "image:NAME", 1)``; 0 once removed), so the core
opens an image's sessions where the image already is. An image the cache lacks is fetched on
first use, once, before the session or action that needs it: pulled from a peer node that
holds it (`set_peers`; only the layers this cache lacks travel, `transfer.Puller`), else
imported from its source path when the node knows one (``sources``, `add_source`). What the
first user waited is a `Fetched` (``image_import_s``, and for a pull ``image_pull``: ``from``,
``s``, ``layers_sent``, ``layers_had``, ``bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...core import events as E
from ...core.errors import ImageError, ImagesUnsupported
from ...core.images import check_name, warm_key
from ...managers.base import ImageCache, ImageRecord
from .peers import ImagePeer
from .remote import Fetched, PeersSet
from .transfer import LayerServer, Puller, retrieved

log = logging.getLogger(__name__)


class NodeImages:
    """A node's image cache (the CPU manager's, read through ``cache``), the paths its images
    come from, its peers (``pulls``) and what it sends them (``server``)."""

    def __init__(self, node: str, cache: Callable[[], ImageCache | None],
                 emit: Callable[[E.Event], None], sources: Sequence[tuple[str, str]] = (),
                 eager: Sequence[str] = ()) -> None:
        self.node, self.cache, self._emit = node, cache, emit
        self.sources: dict[str, str] = dict(sources)  # name -> a path this node can read
        self.eager = tuple(eager)  # of those, imported at start
        self._importing: dict[str, asyncio.Future[dict[str, Any] | None]] = {}  # name -> fetch
        self.pulls = Puller(node, self.store, emit)
        self.server = LayerServer(node, self.store)

    def store(self) -> ImageCache:
        """The cache (ImagesUnsupported: none here)."""
        store = self.cache()
        if store is None:
            raise ImagesUnsupported(f"node {self.node}: no CPU manager with an image cache")
        return store

    async def start(self) -> None:
        """Import the eager images, then report every image held (ValueError: one failed)."""
        for name in self.eager:
            path = self.sources.get(name)
            if path is None:
                raise ValueError(f"node {self.node}: images: {name}: no path given")
            try:
                await self.import_(path, name)
            except Exception as exc:
                raise ValueError(f"node {self.node}: images: {name} ({path}): {exc}") from None
        store = self.cache()
        if store is None:
            return
        now = time.monotonic()
        with contextlib.suppress(Exception):
            for img in store.list_images():
                self._emit(E.WarmPoolReport(now, self.node, warm_key(img.name), 1))

    async def import_(self, path: str, name: str) -> ImageRecord:
        """Import ``path`` as ``name`` into this node's cache now; remember the source."""
        store = self.store()
        try:
            img = await asyncio.to_thread(store.import_path, path, name)
        except ImageError as exc:  # (no host path in what a client reads: issue 35, L2)
            raise redacted(exc, path, store.root) from None
        self.sources[name] = path
        self._emit(E.WarmPoolReport(time.monotonic(), self.node, warm_key(name), 1))
        return img

    def add_source(self, name: str, path: str) -> dict[str, Any]:
        """Remember where ``name`` comes from, to import it on first use; the path must be
        readable here (ImageError otherwise)."""
        check_name(name)
        if not os.path.isabs(path) or not os.access(path, os.R_OK):
            raise ImageError(f"{path}: not a readable absolute path on this node")
        self.sources[name] = path
        return {"path": path, "held": bool(self.store().has(name)), "lazy": True}

    def known(self) -> bool:
        """Whether any image may be fetched here (a source or a peer known)."""
        return bool(self.sources or self.pulls.peers)

    async def ensure(self, name: str) -> Fetched:
        """Fetch ``name`` here unless the cache holds it; what the first action that needed it
        reports: nothing when it was held (or nothing is known of it here: the manager reports
        the missing image itself), else the seconds waited and, when it was pulled from a peer,
        the pull. A second user arriving meanwhile waits for the same fetch."""
        store = self.cache()
        if store is None or store.has(name):
            return Fetched()
        if not self.pulls.peers.get(name) and name not in self.sources:
            return Fetched()
        t0 = time.monotonic()
        fut = self._importing.get(name)
        if fut is None:  # the first user fetches; later ones wait for the same fetch
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(retrieved)
            self._importing[name] = fut
            try:
                fut.set_result(await self._fetch(name))
            except Exception as exc:
                fut.set_exception(exc)
            finally:
                self._importing.pop(name, None)
        pulled = await asyncio.shield(fut)
        return Fetched(round(time.monotonic() - t0, 6), pulled or None)

    async def _fetch(self, name: str) -> dict[str, Any] | None:
        """Pull ``name`` from a peer (its stats), else import it from its path (None)."""
        path = self.sources.get(name)
        if self.pulls.peers.get(name):
            try:
                return await self.pulls.pull(name)
            except Exception as exc:
                if path is None or not os.access(path, os.R_OK):
                    raise
                log.warning("%s; importing it from %s instead", exc, path)
        if path is None:
            raise ImageError(f"node {self.node}: no source of image {name!r}")
        await self.import_(path, name)
        return None

    def set_peers(self, name: str, peers: Sequence[ImagePeer]) -> PeersSet:
        """The nodes known to hold ``name``: a first use here pulls it from one of them."""
        mine = self.pulls.set(name, peers)
        store = self.cache()
        return PeersSet(bool(store is not None and store.has(name)), tuple(p.name for p in mine))

    def has(self, name: str) -> bool:
        """Whether this node's cache holds ``name`` (ImagesUnsupported: no cache here)."""
        return bool(self.store().has(name))

    def users(self, name: str) -> int:
        store = self.store()
        return int(store.users(name)) if store.has(name) else 0

    def remove(self, name: str) -> bool:
        """Remove ``name`` from the cache and forget its source; False when not held here.
        ImageInUse while a session or action uses it."""
        self.sources.pop(name, None)
        self.pulls.peers.pop(name, None)
        store = self.store()
        if not store.has(name):
            return False
        store.remove(name)
        self._emit(E.WarmPoolReport(time.monotonic(), self.node, warm_key(name), 0))
        return True

    def list(self) -> list[dict[str, Any]]:
        store = self.store()
        return [{**i.to_dict(), "in_use": store.users(i.name)} for i in store.list_images()]

    def info(self) -> dict[str, Any]:
        """The node's ``info()`` keys of images (none without a cache)."""
        if self.cache() is None:
            return {}
        try:
            images = self.list()
        except Exception:
            images = []
        return {"images": images, "image_sources": dict(self.sources),
                "image_peers": {n: [p.name for p in ps] for n, ps in self.pulls.peers.items()},
                "image_transfers": [dict(t) for t in self.pulls.transfers.values()],
                "image_served": dict(self.server.served)}


def redacted(exc: ImageError, path: str, root: object) -> ImageError:
    """``exc`` with the host paths it may name replaced: the archive's ``path`` by "the
    archive", the image cache's ``root`` (its temporary unpack directories, its layers) by
    "<image cache>"."""
    msg = str(exc)
    if path:
        msg = msg.replace(path, "the archive")
    if isinstance(root, str) and root:
        for r in {root, os.path.realpath(root)}:
            msg = msg.replace(r, "<image cache>")
    if msg != str(exc):
        exc.args = (msg,)  # (the same exception, its class and attributes kept: ImageTooLarge
    return exc             #  stays a 413)
