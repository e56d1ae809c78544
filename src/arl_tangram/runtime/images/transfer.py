"""Images between nodes (issue 26, item 3): the pulling side (`Puller`: only the layers this
cache lacks travel, in chunks, one fetch per layer at a time, from the image's peers in random
order) and the sending side (`LayerServer`: an image's record and its layers as streams of
chunks, idle streams closed), and `HostPeer`, a sending side of this process as a peer.

A pull in flight and the last ones are in ``Puller.transfers`` (so in /v1/cluster), with a log
line at its start and end; what a node sent its peers is ``LayerServer.served``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...core import events as E
from ...core.errors import ImageError
from ...core.images import check_name, warm_key
from ...managers.base import ImageCache
from .peers import ImagePeer

log = logging.getLogger(__name__)

Store = Callable[[], ImageCache]  # the node's cache (ImagesUnsupported: none)


def retrieved(fut: asyncio.Future[Any]) -> None:
    """(a fetch's failure is re-raised to whoever awaits it; none may be left unread)"""
    if not fut.cancelled():
        fut.exception()


class Puller:
    """The receiving side of one node: who holds an image this node may lack (``peers``),
    and the pull of its missing layers from one of them."""

    def __init__(self, node: str, store: Store, emit: Callable[[E.Event], None]) -> None:
        self.node, self._store, self._emit = node, store, emit
        self.peers: dict[str, list[ImagePeer]] = {}  # image -> the nodes known to hold it
        self.chunk_bytes = 64 << 20
        self.transfers: dict[str, dict[str, Any]] = {}  # image -> its last pull's progress
        self._layer_pulls: dict[str, asyncio.Future[bool]] = {}  # layer key -> its pull

    def set(self, name: str, peers: Sequence[ImagePeer]) -> list[ImagePeer]:
        """The nodes known to hold ``name`` (this one left out): the ones kept."""
        check_name(name)
        mine = [p for p in peers if p.name != self.node]
        if mine:
            self.peers[name] = mine
        else:
            self.peers.pop(name, None)
        return mine

    async def pull(self, name: str) -> dict[str, Any]:
        """Pull ``name`` from one of its peers (in random order, the next on failure): only
        the layers this cache lacks travel. Returns ``{"from", "s", "layers_sent",
        "layers_had", "bytes"}``; ImageError naming every peer's failure otherwise."""
        store = self._store()
        peers = list(self.peers.get(name) or ())
        if not peers:
            raise ImageError(f"node {self.node}: no node is known to hold image {name!r}")
        random.shuffle(peers)  # spread the pulls of many nodes over the holders
        errors = []
        for peer in peers:
            try:
                return await self._pull_from(peer, name, store)
            except Exception as exc:
                log.warning("node %s: pulling image %s from node %s failed: %s",
                            self.node, name, peer.name, exc)
                errors.append(f"from node {peer.name}: {exc}")
        raise ImageError(f"node {self.node}: image {name!r} could not be pulled: "
                         + "; ".join(errors))

    async def _pull_from(self, peer: ImagePeer, name: str, store: ImageCache) -> dict[str, Any]:
        t0 = time.monotonic()
        rec = await peer.manifest(name)
        layers = [str(k) for k in rec.get("layers") or ()]
        sizes = [int(x) for x in rec.get("layer_sizes") or ()]
        size_of = dict(zip(layers, sizes, strict=False))
        missing = [k for k in dict.fromkeys(layers) if not store.has_layer(k)]
        prog: dict[str, Any] = {
            "image": name, "state": "pulling", "from": peer.name, "layers": len(layers),
            "layers_had": len(layers) - len(missing), "layers_sent": 0, "bytes": 0,
            "bytes_expected": sum(size_of.get(k, 0) for k in missing),
            "started_at": round(time.time(), 3), "s": 0.0}
        self.transfers.pop(name, None)
        self.transfers[name] = prog
        while len(self.transfers) > 32:
            del self.transfers[next(iter(self.transfers))]
        log.info("node %s: pulling image %s from node %s: %d of %d layers missing "
                 "(%.1f MiB unpacked)", self.node, name, peer.name, len(missing), len(layers),
                 prog["bytes_expected"] / 2**20)
        try:
            for k in missing:
                if await self._pull_layer(peer, k, prog):
                    prog["layers_sent"] += 1
                else:  # another pull here fetched it meanwhile
                    prog["layers_had"] += 1
            await asyncio.to_thread(store.add_pulled, rec, f"node {peer.name}",
                                    time.monotonic() - t0)
        except Exception as exc:
            prog.update(state="failed", error=str(exc), s=round(time.monotonic() - t0, 6))
            raise
        prog.update(state="done", s=round(time.monotonic() - t0, 6))
        log.info("node %s: pulled image %s from node %s in %.2f s: %d layer(s), %d bytes sent, "
                 "%d layer(s) already here", self.node, name, peer.name, prog["s"],
                 prog["layers_sent"], prog["bytes"], prog["layers_had"])
        self._emit(E.WarmPoolReport(time.monotonic(), self.node, warm_key(name), 1))
        return {k: prog[k] for k in ("from", "s", "layers_sent", "layers_had", "bytes")}

    async def _pull_layer(self, peer: ImagePeer, key: str, prog: dict[str, Any]) -> bool:
        """Layer ``key`` from ``peer`` into the cache; False when another pull here fetched
        it meanwhile (one fetch per layer at a time)."""
        fut = self._layer_pulls.get(key)
        if fut is not None:
            await asyncio.shield(fut)
            return False
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(retrieved)
        self._layer_pulls[key] = fut
        try:
            await self._receive_layer(peer, key, prog)
            fut.set_result(True)
            return True
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else ImageError(repr(exc)))
            raise
        finally:
            self._layer_pulls.pop(key, None)

    async def _receive_layer(self, peer: ImagePeer, key: str, prog: dict[str, Any]) -> None:
        store = self._store()
        spool = await asyncio.to_thread(store.new_spool)
        sid: str | None = None
        try:
            sid = await peer.open_layer(key, self.chunk_bytes)
            while chunk := await peer.next_chunk(sid):
                await asyncio.to_thread(spool.write, chunk)
                prog["bytes"] += len(chunk)
            end, sid = await peer.close_layer(sid), None
            await asyncio.to_thread(store.finish_layer, spool, key, str(end.get("digest")),
                                    f"node {peer.name}: layer {key}")
        finally:
            spool.discard()
            if sid is not None:
                with contextlib.suppress(Exception):
                    await peer.close_layer(sid)


class LayerServer:
    """The sending side of one node: a peer pulling an image from this node reads its record
    and its layers, each a stream of chunks; streams idle for 5 minutes are closed."""

    def __init__(self, node: str, store: Store) -> None:
        self.node, self._store = node, store
        self.served = {"layers": 0, "bytes": 0}  # what peers pulled from this node
        self.streams: dict[str, list[Any]] = {}  # stream id -> [LayerStream, last use]
        self._ids = itertools.count(1)

    def manifest(self, name: str) -> dict[str, Any]:
        """The record of ``name`` in this cache (ImageError: not held here)."""
        return dict(self._store().get(name).to_dict())

    async def open(self, key: str, chunk_bytes: int) -> str:
        """Start sending layer ``key`` (a stream id); streams idle for 5 minutes are closed."""
        now = time.monotonic()
        for old in [s for s, (_, t) in self.streams.items() if now - t > 300.0]:
            await self.close(old)
        stream = await asyncio.to_thread(self._store().open_layer, key, int(chunk_bytes))
        sid = f"{key[7:19]}-{next(self._ids)}"
        self.streams[sid] = [stream, now]
        return sid

    async def next(self, sid: str) -> bytes:
        """The stream's next chunk (``b""``: it is whole)."""
        entry = self.streams.get(sid)
        if entry is None:
            raise ImageError(f"node {self.node}: no layer stream {sid!r} (closed or idle)")
        entry[1] = time.monotonic()
        chunk: bytes = await asyncio.to_thread(entry[0].next)
        self.served["bytes"] += len(chunk)
        return chunk

    async def close(self, sid: str) -> dict[str, Any]:
        """End a stream: ``{"digest", "bytes"}`` of what it sent."""
        entry = self.streams.pop(sid, None)
        if entry is None:
            raise ImageError(f"node {self.node}: no layer stream {sid!r} (closed or idle)")
        stream = entry[0]
        await asyncio.to_thread(stream.close)
        if stream.done:
            self.served["layers"] += 1
        return {"digest": stream.digest, "bytes": stream.size}

    async def close_all(self) -> None:
        for sid in list(self.streams):
            with contextlib.suppress(Exception):
                await self.close(sid)


class HostPeer(ImagePeer):
    """A node of this process as a peer, over its sending side (local executors, tests)."""

    def __init__(self, server: LayerServer) -> None:
        self.server, self.name = server, server.node

    async def manifest(self, image: str) -> dict[str, Any]:
        return self.server.manifest(image)

    async def open_layer(self, key: str, chunk_bytes: int) -> str:
        return await self.server.open(key, chunk_bytes)

    async def next_chunk(self, stream: str) -> bytes:
        return await self.server.next(stream)

    async def close_layer(self, stream: str) -> dict[str, Any]:
        return await self.server.close(stream)
