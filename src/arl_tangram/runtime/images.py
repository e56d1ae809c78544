"""Environment images at the runtime layer (issue 17): the session-open command that names an
image, the error of an executor without images, and the errors a remote node answers with.

Invariant: the core does not know images; it knows warm state. The engine asks for a session
in an image with ``SessionRequested(warm_key=core.images.warm_key(NAME),
attachment=SessionImage(...))``, so the core prefers a node whose `NodeHost` reported that
image held (``WarmPoolReport``) and carries the attachment, opaque to it, on the session's
`OpenSession` to the node, whose CPU manager mounts the image. Image import /
list / remove are operations of the `Executor` seam (`runtime.executor`):
- a local executor imports at once on every node (or the one named), so the core's choice of
  node finds the image there (`LocalExecutor`);
- on Ray, an import reads the path on one node (the one named, else the driver's node, else
  the first that can read it); every other node learns which nodes hold the image (its
  *peers*) and, on first use, pulls the layers it lacks from one of them, content-addressed by
  layer (`NodeHost.pull_image`, over an `ImagePeer`), and reports it held from then on
  (`RayExecutor`). No shared file system is needed.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from ..core import commands as C
from ..core.errors import ImageError, ImageInUse, ImagesUnsupported, ImageTooLarge, InvalidAction


@dataclass(frozen=True, slots=True)
class SessionImage:
    """A session's environment image, attached to its request (`OpenSession.attachment`)."""

    image: str  # the name the node's image cache holds it under
    layer_mb: int | None = None  # its writable layer's cap (None: the node's default)
    owner: str | None = None  # its tenant: whose share of the node's layer budget it takes


def session_image(cmd: C.OpenSession) -> SessionImage | None:
    """The environment image an `OpenSession` carries (None: a plain session)."""
    att = cmd.attachment
    return att if isinstance(att, SessionImage) else None


def raise_remote(err: dict[str, Any]) -> None:
    """Re-raise an image error a remote node answered with (`NodeAgent.image_op`)."""
    kind, msg = err.get("type"), str(err.get("error"))
    if kind == "ImageInUse":
        raise ImageInUse(msg)
    if kind == "ImageTooLarge":
        raise ImageTooLarge(msg)
    if kind == "ImagesUnsupported":
        raise ImagesUnsupported(msg)
    if kind == "InvalidAction":
        raise InvalidAction("name", msg)
    raise ImageError(msg)


class ImagePeer(abc.ABC):
    """Another node's image cache, as a node pulling an image from it sees it: the image's
    record, and each layer as a stream of chunks (``b""`` at the end), whose sha256 and size
    `close_layer` reports. `local.HostPeer` is one in this process; on Ray, `ray_agent.RayPeer`
    calls the peer's NodeAgent (chunks travel as Ray objects)."""

    name: str  # the peer node's name

    @abc.abstractmethod
    async def manifest(self, image: str) -> dict[str, Any]:
        """The image's record (`Image.to_dict`); ImageError when the peer lacks it."""

    @abc.abstractmethod
    async def open_layer(self, key: str, chunk_bytes: int) -> str:
        """Start sending layer ``key`` in chunks of ``chunk_bytes``: a stream id."""

    @abc.abstractmethod
    async def next_chunk(self, stream: str) -> bytes:
        """The stream's next chunk; ``b""`` once it is whole."""

    @abc.abstractmethod
    async def close_layer(self, stream: str) -> dict[str, Any]:
        """End the stream: ``{"digest": "sha256:...", "bytes": n}`` of what was sent."""


def in_use(name: str, count: int, node: str) -> ImageInUse:
    """The error of removing ``name`` while ``count`` sessions/actions on ``node`` use it."""
    return ImageInUse(f"image {name!r} is in use by {count} session(s)/action(s) on node "
                      f"{node}; close them first")
