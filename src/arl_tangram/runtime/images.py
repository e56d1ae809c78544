"""Environment images at the runtime layer (issue 17): the session-open command that names an
image, the error of an executor without images, and the errors a remote node answers with.

Invariant: the core does not know images; it knows warm state. The engine asks for a session
in an image with ``SessionRequested(warm_key=core.images.warm_key(NAME))``, so the core prefers
a node whose `NodeHost` reported that image held (``WarmPoolReport``), and attaches the image to
the core's `OpenSession` (`ImageOpenSession`, a subclass, so everything that handles an
`OpenSession` handles it) on its way to the node, whose CPU manager mounts it. Image import /
list / remove are operations of the `Executor` seam (`runtime.executor`):
- a local executor imports at once on every node (or the one named), so the core's choice of
  node finds the image there (`LocalExecutor`);
- on Ray, an import records the image's source path on every node's agent (a path every node
  can read: a shared file system); a node imports it on first use, and reports it held from
  then on (`RayExecutor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import commands as C
from ..core.errors import ImageError, ImageInUse, InvalidAction, TangramError


@dataclass(frozen=True, slots=True)
class ImageOpenSession(C.OpenSession):
    image: str | None = None
    layer_mb: int | None = None


def with_image(cmd: C.OpenSession, image: str, layer_mb: int | None) -> ImageOpenSession:
    return ImageOpenSession(session_id=cmd.session_id, node=cmd.node, demand=cmd.demand,
                            ttl_s=cmd.ttl_s, cause=cmd.cause, image=image, layer_mb=layer_mb)


class ImagesUnsupported(TangramError):
    """This executor's nodes keep no image cache reachable from here."""


def raise_remote(err: dict[str, Any]) -> None:
    """Re-raise an image error a remote node answered with (`NodeAgent.image_op`)."""
    kind, msg = err.get("type"), str(err.get("error"))
    if kind == "ImageInUse":
        raise ImageInUse(msg)
    if kind == "ImagesUnsupported":
        raise ImagesUnsupported(msg)
    if kind == "InvalidAction":
        raise InvalidAction("name", msg)
    raise ImageError(msg)


def in_use(name: str, count: int, node: str) -> ImageInUse:
    """The error of removing ``name`` while ``count`` sessions/actions on ``node`` use it."""
    return ImageInUse(f"image {name!r} is in use by {count} session(s)/action(s) on node "
                      f"{node}; close them first")
