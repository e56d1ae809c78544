"""Environment images at the runtime layer (issue 17): the session-open command that names an
image, and image import / list / remove over an executor's nodes.

Invariant: the core knows nothing of images (it places a session by its demand); the engine
attaches the image a client asked for to the core's `OpenSession` (`ImageOpenSession`, a
subclass, so everything that handles an `OpenSession` handles it) on its way to the node, whose
CPU manager mounts it. Imports go to every node of a local executor (or the one named), so the
core's choice of node finds the image there; an executor without image support (Ray, for now)
answers `ImagesUnsupported`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..core import commands as C
from ..core.errors import InvalidAction


@dataclass(frozen=True, slots=True)
class ImageOpenSession(C.OpenSession):
    image: str | None = None
    layer_mb: int | None = None


def with_image(cmd: C.OpenSession, image: str, layer_mb: int | None) -> ImageOpenSession:
    return ImageOpenSession(session_id=cmd.session_id, node=cmd.node, demand=cmd.demand,
                            ttl_s=cmd.ttl_s, cause=cmd.cause, image=image, layer_mb=layer_mb)


class ImagesUnsupported(Exception):
    """This executor's nodes keep no image cache reachable from here."""


def _hosts(executor: Any, node: str | None) -> list[Any]:
    hosts = getattr(executor, "hosts", None)
    if not isinstance(hosts, dict):
        raise ImagesUnsupported("images are managed per node by the local executor only "
                                "(on Ray: not yet)")
    if node is not None:
        if node not in hosts:
            raise InvalidAction("node", f"unknown node {node!r}")
        return [hosts[node]]
    return list(hosts.values())


def _store(host: Any) -> Any:
    store = getattr(getattr(host, "cpu", None), "images", None)
    if store is None:
        raise ImagesUnsupported(f"node {host.name}: no CPU manager with an image cache")
    return store


async def import_image(executor: Any, path: str, name: str,
                       node: str | None = None) -> dict[str, Any]:
    """Import ``path`` as ``name`` on every node (or ``node``); ImageError on a bad archive."""
    out = {}
    for h in _hosts(executor, node):
        img = await asyncio.to_thread(_store(h).import_path, path, name)
        out[h.name] = img.to_dict()
    return {"name": name, "nodes": out}


def list_images(executor: Any, node: str | None = None) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {}
    for h in _hosts(executor, node):
        store = _store(h)
        out[h.name] = [{**i.to_dict(), "in_use": store.users(i.name)}
                       for i in store.list_images()]
    return {"nodes": out}


async def remove_image(executor: Any, name: str, node: str | None = None) -> dict[str, Any]:
    """Remove ``name`` where it is; ImageInUse (nothing removed anywhere) when any node uses
    it, ImageError when no node has it."""
    hosts = [h for h in _hosts(executor, node) if _store(h).has(name)]
    if not hosts:
        from ..managers.cpu.images import ImageError

        raise ImageError(f"no image {name!r}")
    for h in hosts:  # refuse before touching any node
        n = _store(h).users(name)
        if n:
            from ..managers.cpu.images import ImageInUse

            raise ImageInUse(f"image {name!r} is in use by {n} session(s)/action(s) on node "
                             f"{h.name}; close them first")
    for h in hosts:
        await asyncio.to_thread(_store(h).remove, name)
    return {"name": name, "removed": [h.name for h in hosts]}


def has_image(executor: Any, name: str) -> bool | None:
    """Whether some node holds ``name``; None when this executor cannot tell."""
    try:
        return any(_store(h).has(name) for h in _hosts(executor, None))
    except (ImagesUnsupported, ValueError):
        return None
