"""What a node's image calls answer on Ray (`ray_agent.NodeAgent.image_*`): a typed value, or
a `RemoteError`, a picklable value naming the error's kind, which the driver raises again as
the same class (`unwrap`). No class name travels as a string."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar

from ...core.errors import ImageError, ImageInUse, ImagesUnsupported, ImageTooLarge, InvalidAction

T = TypeVar("T")


class ErrorKind(enum.Enum):
    """The errors a node's image call may answer with (anything else is an ImageError)."""

    IMAGE = "image"
    IN_USE = "in_use"
    TOO_LARGE = "too_large"
    UNSUPPORTED = "unsupported"
    INVALID = "invalid"


# most specific first: ImageInUse and ImageTooLarge are ImageErrors
_KINDS: tuple[tuple[type[Exception], ErrorKind], ...] = (
    (ImageInUse, ErrorKind.IN_USE),
    (ImageTooLarge, ErrorKind.TOO_LARGE),
    (ImagesUnsupported, ErrorKind.UNSUPPORTED),
    (InvalidAction, ErrorKind.INVALID),
)


@dataclass(frozen=True, slots=True)
class RemoteError:
    """An image call's failure on a node: its kind and its message."""

    kind: ErrorKind
    message: str

    @classmethod
    def of(cls, exc: Exception) -> RemoteError:
        kind = next((k for c, k in _KINDS if isinstance(exc, c)), ErrorKind.IMAGE)
        return cls(kind, str(exc))

    def error(self, node: str) -> Exception:
        """The exception to raise on the driver, its message prefixed with ``node``."""
        msg = f"node {node}: {self.message}"
        if self.kind is ErrorKind.IN_USE:
            return ImageInUse(msg)
        if self.kind is ErrorKind.TOO_LARGE:
            return ImageTooLarge(msg)
        if self.kind is ErrorKind.UNSUPPORTED:
            return ImagesUnsupported(msg)
        if self.kind is ErrorKind.INVALID:
            return InvalidAction("name", msg)
        return ImageError(msg)


def unwrap(got: T | RemoteError, node: str) -> T:
    """``got``, a node's answer; its error raised (`RemoteError.error`) when it is one."""
    if isinstance(got, RemoteError):
        raise got.error(node)
    return got


@dataclass(frozen=True, slots=True)
class PeersSet:
    """A node told which nodes hold an image (`NodeImages.set_peers`)."""

    held: bool  # the node's cache holds it already
    peers: tuple[str, ...]  # the other nodes it may pull it from

    def to_dict(self) -> dict[str, Any]:
        return {"held": self.held, "peers": list(self.peers)}


@dataclass(frozen=True, slots=True)
class Fetched:
    """What waiting for an image cost its first user (`NodeImages.ensure`): nothing when it
    was held (or unknown here); else the seconds waited and, for a pull, what travelled."""

    import_s: float | None = None
    pull: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return self.import_s is not None

    def to_dict(self) -> dict[str, Any]:
        """``{}``, or ``image_import_s`` and, for a pull, ``image_pull``: the wire's keys."""
        out: dict[str, Any] = {}
        if self.import_s is not None:
            out["image_import_s"] = self.import_s
        if self.pull:
            out["image_pull"] = self.pull
        return out


def in_use(name: str, count: int, node: str) -> ImageInUse:
    """The error of removing ``name`` while ``count`` sessions/actions on ``node`` use it."""
    return ImageInUse(f"image {name!r} is in use by {count} session(s)/action(s) on node "
                      f"{node}; close them first")
