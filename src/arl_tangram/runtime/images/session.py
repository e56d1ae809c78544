"""A session's environment image: the engine's attachment to its request, carried opaque by
the core to the node on its `OpenSession`."""

from __future__ import annotations

from dataclasses import dataclass

from ...core import commands as C


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
