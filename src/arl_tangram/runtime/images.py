"""Environment images at the runtime layer (issue 17): the session-open command that names an
image, and image import / list / remove over an executor's nodes.

Invariant: the core does not know images; it knows warm state. The engine asks for a session
in an image with ``SessionRequested(warm_key="image:NAME")``, so the core prefers a node whose
`NodeHost` reported that image held (``WarmPoolReport``), and attaches the image to the core's
`OpenSession` (`ImageOpenSession`, a subclass, so everything that handles an `OpenSession`
handles it) on its way to the node, whose CPU manager mounts it. Imports:
- a local executor imports at once on every node (or the one named), so the core's choice of
  node finds the image there;
- on Ray (an executor with ``image_call``), an import records the image's source path on every
  node's agent (a path every node can read: a shared file system); a node imports it on first
  use, and reports it held from then on.
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


def warm_key(image: str) -> str:
    """The core's warm-state key of a node holding ``image``."""
    return f"image:{image}"


class ImagesUnsupported(Exception):
    """This executor's nodes keep no image cache reachable from here."""


def _remote(executor: Any) -> bool:
    return callable(getattr(executor, "image_call", None))


def _hosts(executor: Any, node: str | None) -> list[Any]:
    hosts = getattr(executor, "hosts", None)
    if not isinstance(hosts, dict):
        raise ImagesUnsupported("this executor's nodes keep no image cache reachable from here")
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


def raise_remote(err: dict[str, Any]) -> None:
    """Re-raise an image error a remote node answered with (`NodeAgent.image_op`)."""
    from ..managers.cpu.images.store import ImageError, ImageInUse

    kind, msg = err.get("type"), str(err.get("error"))
    if kind == "ImageInUse":
        raise ImageInUse(msg)
    if kind == "ImagesUnsupported":
        raise ImagesUnsupported(msg)
    if kind == "InvalidAction":
        raise InvalidAction("name", msg)
    raise ImageError(msg)


async def import_image(executor: Any, path: str, name: str,
                       node: str | None = None) -> dict[str, Any]:
    """Import ``path`` as ``name`` on every node (or ``node``); ImageError on a bad archive.
    On Ray: record the source on every node (each imports it on first use); ImageError when
    some node cannot read the path."""
    if _remote(executor):
        from ..managers.cpu.images.store import check_name

        check_name(name)
        got = await executor.image_call("source", (name, path), node)
        if node is None:  # nodes that join later learn it too
            executor.image_sources[name] = path
        return {"name": name, "lazy": True, "nodes": got}
    out = {}
    for h in _hosts(executor, node):
        if hasattr(h, "import_image"):  # (a NodeHost: it reports the image held)
            img = await h.import_image(path, name)
        else:
            img = await asyncio.to_thread(_store(h).import_path, path, name)
        out[h.name] = img.to_dict()
    return {"name": name, "nodes": out}


def list_images(executor: Any, node: str | None = None) -> dict[str, Any]:
    """Per node, the images its cache holds (on Ray: as of the last refresh of node info,
    at most ``membership_interval_s`` old) with ``in_use``."""
    if _remote(executor):
        info = executor.node_info()
        if node is not None and node not in info:
            raise InvalidAction("node", f"unknown node {node!r}")
        return {"nodes": {n: list(d.get("images") or []) for n, d in info.items()
                          if node is None or n == node},
                "sources": dict(executor.image_sources)}
    out: dict[str, list[dict[str, Any]]] = {}
    for h in _hosts(executor, node):
        store = _store(h)
        out[h.name] = [{**i.to_dict(), "in_use": store.users(i.name)}
                       for i in store.list_images()]
    return {"nodes": out}


async def remove_image(executor: Any, name: str, node: str | None = None) -> dict[str, Any]:
    """Remove ``name`` where it is; ImageInUse (nothing removed anywhere) when any node uses
    it, ImageError when no node has it."""
    from ..managers.cpu.images.store import ImageError, ImageInUse

    if _remote(executor):
        users = await executor.image_call("users", (name,), node)
        known = name in executor.image_sources
        for n, count in users.items():  # refuse before touching any node
            if count:
                raise ImageInUse(f"image {name!r} is in use by {count} session(s)/action(s) on "
                                 f"node {n}; close them first")
        removed = await executor.image_call("remove", (name,), node)
        if node is None:
            executor.image_sources.pop(name, None)
        held = sorted(n for n, ok in removed.items() if ok)
        if not held and not known:
            raise ImageError(f"no image {name!r}")
        return {"name": name, "removed": held}
    hosts = [h for h in _hosts(executor, node) if _store(h).has(name)]
    if not hosts:
        raise ImageError(f"no image {name!r}")
    for h in hosts:  # refuse before touching any node
        n = _store(h).users(name)
        if n:
            raise ImageInUse(f"image {name!r} is in use by {n} session(s)/action(s) on node "
                             f"{h.name}; close them first")
    for h in hosts:
        if hasattr(h, "remove_image"):  # (a NodeHost: it reports the image gone)
            await asyncio.to_thread(h.remove_image, name)
        else:
            await asyncio.to_thread(_store(h).remove, name)
    return {"name": name, "removed": [h.name for h in hosts]}


def has_image(executor: Any, name: str) -> bool | None:
    """Whether some node holds ``name`` (on Ray: or can import it on first use); None when
    this executor cannot tell."""
    if _remote(executor):
        if name in executor.image_sources:
            return True
        return any(any(i.get("name") == name for i in d.get("images") or [])
                   for d in executor.node_info().values())
    try:
        return any(_store(h).has(name) for h in _hosts(executor, None))
    except (ImagesUnsupported, ValueError):
        return None
