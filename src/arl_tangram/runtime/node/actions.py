"""The action path of a node: `StartAction` (a CPU action: after its session's open, after its
image's fetch, on the CPU manager), `ResizeAction` and `CancelAction`.

Resizes of a CPU action are never lost while it runs: one that comes before the action reaches
the CPU manager (its session still opening, its image importing) becomes the allotment it
starts with; the manager keeps one that comes before the action's sandbox is registered and
sets it then. ``resizes`` counts them: ``applied`` (a running sandbox's quota rewritten),
``deferred`` (kept until the action's sandbox registers) and ``dropped`` (the action had ended
here, or never came).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from ...core import commands as C
from ...core import events as E
from ...core.actions import ActionSpec, Status
from ...core.errors import InvalidAction
from ...core.resources import Resources
from ...kinds import CodeRequest, code_request
from ..images import NodeImages
from .dispatch import Run
from .seat import Seat
from .sessions import SessionPath

log = logging.getLogger(__name__)


class ActionPath:
    """Runs a node's CPU actions on its CPU manager; resizes and cancels them."""

    def __init__(self, seat: Seat, images: NodeImages, sessions: SessionPath) -> None:
        self.seat, self.images, self.sessions = seat, images, sessions
        # CPU actions started here and not yet handed to the CPU manager -> their allotment,
        # which a resize meanwhile replaces (`_resize`)
        self.handing: dict[str, Resources] = {}
        self.resizes = {"applied": 0, "deferred": 0, "dropped": 0}  # ResizeActions, by outcome

    def start(self, cmd: C.StartAction) -> Run:
        if not cmd.action.kind.uses_model:
            self.handing[cmd.action.id] = cmd.allotment
        return self._start(cmd)

    def resize(self, cmd: C.ResizeAction) -> Run:
        return self._resize(cmd)

    def cancel(self, cmd: C.CancelAction) -> Run:
        return self._cancel(cmd)

    async def _resize(self, cmd: C.ResizeAction) -> None:
        if cmd.action_id in self.handing:  # not at the CPU manager yet: it starts with this
            self.handing[cmd.action_id] = cmd.allotment
            outcome = "deferred"
        else:
            try:
                outcome = await self.seat.cpu.resize(cmd.action_id, cmd.allotment)
            except Exception as exc:
                log.warning("node %s: resize of %s: %s", self.seat.name, cmd.action_id, exc)
                outcome = "dropped"
        self.resizes[outcome if outcome in self.resizes else "dropped"] += 1

    async def _start(self, cmd: C.StartAction) -> None:
        try:
            await self._run(cmd)
        finally:
            self.handing.pop(cmd.action.id, None)  # (one that never reached the manager)

    async def _run(self, cmd: C.StartAction) -> None:
        seat, a = self.seat, cmd.action
        if a.session:  # the session's OpenSession may have come in the same breath
            await self.sessions.wait_open(a.session)
        note = self.sessions.take_note(a.session) if a.session else {}
        seat.emit(E.ActionStarted(time.monotonic(), a.id, seat.name))
        t0 = time.monotonic()
        try:
            if a.kind.uses_model:
                raise RuntimeError(f"{a.kind.value} actions run in batches (RunBatch), not alone")
            a, code = typed(a)
            image = code.image if code is not None and a.session is None else None
            if image is not None and self.images.known():
                note = (await self.images.ensure(image)).to_dict()
            # handed over: from here the CPU manager takes its resizes (no await in between)
            rr = await seat.cpu.run(a, self.handing.pop(a.id, cmd.allotment))
            if note:
                rr = dataclasses.replace(rr, image_fetch=note)
            seat.emit(E.ActionFinished(time.monotonic(), a.id, rr.action_status, rr, rr.reason,
                                       time.monotonic() - t0, rr.cpu_time))
            if a.session and not seat.cpu.has_session(a.session):
                # the manager closed it (its sandbox died): the core and the engine learn it
                # now, rather than routing the next action to a session that is gone
                seat.emit(E.SessionClosed(time.monotonic(), a.session,
                                          f"closed by node {seat.name}: {rr.reason}"))
        except asyncio.CancelledError:
            seat.emit(E.ActionFinished(time.monotonic(), a.id, Status.CANCELLED, None,
                                       "node shut down", time.monotonic() - t0))
            raise
        except Exception as exc:
            log.exception("node %s: action %s broke", seat.name, a.id)
            seat.emit(E.ActionFinished(time.monotonic(), a.id, Status.FAILED, None,
                                       f"{type(exc).__name__}: {exc}", time.monotonic() - t0))

    async def _cancel(self, cmd: C.CancelAction) -> None:
        try:
            await self.seat.cpu.cancel(cmd.action_id)
        except Exception as exc:
            log.debug("node %s: cancel %s: %s", self.seat.name, cmd.action_id, exc)


def typed(a: ActionSpec) -> tuple[ActionSpec, CodeRequest | None]:
    """``a`` with its payload typed, and that request: parsed here, once, when it came as a
    plain mapping (`kinds.code_request`); ``a`` as it is and None when the payload is not a
    valid request (the CPU manager reports why)."""
    if isinstance(a.payload, CodeRequest):
        return a, a.payload
    try:
        req = code_request(a.kind, a.payload)
    except InvalidAction:
        return a, None
    return dataclasses.replace(a, payload=req), req
