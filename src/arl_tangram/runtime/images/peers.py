"""Another node's image cache, as a node pulling an image from it sees it."""

from __future__ import annotations

import abc
from typing import Any


class ImagePeer(abc.ABC):
    """Another node's image cache, as a node pulling an image from it sees it: the image's
    record, and each layer as a stream of chunks (``b""`` at the end), whose sha256 and size
    `close_layer` reports. `transfer.HostPeer` is one in this process; on Ray,
    `ray_agent.RayPeer` calls the peer's NodeAgent (chunks travel as Ray objects)."""

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
