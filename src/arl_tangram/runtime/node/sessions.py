"""The session path of a node: `OpenSession` (its image fetched first when it names one) and
`CloseSession`. An action of a session whose open is in flight waits for it (`wait_open`), and
the session's first action reports what the open waited for its image (`take_note`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...core import commands as C
from ...core import events as E
from ..executor import SessionOpened
from ..images import NodeImages, session_image
from .dispatch import Run
from .seat import Seat

log = logging.getLogger(__name__)


class SessionPath:
    """Opens and closes a node's sessions in its CPU manager."""

    def __init__(self, seat: Seat, images: NodeImages) -> None:
        self.seat, self.images = seat, images
        self.opening: dict[str, asyncio.Event] = {}  # sessions whose OpenSession is in flight
        # session -> what its open waited for (``image_import_s``, ``image_pull``), for its
        # first action's result
        self.notes: dict[str, dict[str, Any]] = {}

    def open(self, cmd: C.OpenSession) -> Run:
        self.opening[cmd.session_id] = asyncio.Event()
        return self._open(cmd)

    def close(self, cmd: C.CloseSession) -> Run:
        return self._close(cmd)

    async def wait_open(self, session: str) -> None:
        """Until ``session``'s OpenSession, when one is in flight, has been handled."""
        opening = self.opening.get(session)
        if opening is not None:
            await opening.wait()

    def take_note(self, session: str) -> dict[str, Any]:
        """What ``session``'s open waited for its image (once; ``{}``: nothing)."""
        return self.notes.pop(session, {}) if self.notes else {}

    async def _open(self, cmd: C.OpenSession) -> None:
        seat = self.seat
        try:
            img = session_image(cmd)  # (the engine's attachment, carried by the core)
            if img is not None:
                note = await self.images.ensure(img.image)
                if note:
                    self.notes[cmd.session_id] = note.to_dict()
            if img is None:
                await seat.cpu.open_session(cmd.session_id, cmd.demand, cmd.ttl_s)
            else:
                await seat.cpu.open_session(cmd.session_id, cmd.demand, cmd.ttl_s,
                                            image=img.image, layer_mb=img.layer_mb,
                                            owner=img.owner)
            seat.emit(SessionOpened(time.monotonic(), cmd.session_id, seat.name))
        except Exception as exc:
            seat.emit(E.SessionClosed(time.monotonic(), cmd.session_id,
                                      f"could not open: {type(exc).__name__}: {exc}"))
        finally:
            ev = self.opening.pop(cmd.session_id, None)
            if ev is not None:
                ev.set()

    async def _close(self, cmd: C.CloseSession) -> None:
        await self.wait_open(cmd.session_id)
        self.notes.pop(cmd.session_id, None)
        closing = self.seat.cpu.close_session(cmd.session_id)
        try:
            await closing
        except Exception as exc:
            log.warning("node %s: %s", self.seat.name, exc)
