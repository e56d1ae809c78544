"""`Engine.wait_open` (issue 41, M3: POST /v1/sessions answers with what the node did), with a
fake node that reports opens as told: None once the node opened the session, the node's reason
when it could not (the session gone from the engine's count), `OPENING` when the core has no
node with room for it (at once), when the node is slow past the timeout, and at once None for
an executor whose nodes do not report opens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from fakes import FakeExecutor

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.engine import EXPIRED, OPENING, Engine, EngineConfig
from arl_tangram.runtime.executor import SessionOpened


class _Reporting(FakeExecutor):
    """Opens sessions as ``answer`` says: "ok" (reports the open), a reason (reports the
    node's failure as SessionClosed), or "silent" (says nothing)."""

    reports_session_open = True

    def __init__(self) -> None:
        super().__init__(cpu=2, memory_mb=4096)
        self.answer = "ok"

    async def submit(self, commands: Sequence[C.Command]) -> None:
        await super().submit(commands)
        assert self.emit is not None
        for c in commands:
            if isinstance(c, C.OpenSession) and self.answer != "silent":
                if self.answer == "ok":
                    self.emit(SessionOpened(time.monotonic(), c.session_id, c.node))
                else:
                    self.emit(E.SessionClosed(time.monotonic(), c.session_id, self.answer))


async def test_wait_open_answers_with_what_the_node_did() -> None:
    ex = _Reporting()
    eng = Engine(ex, EngineConfig(tick_s=0.05))
    await eng.start()
    try:
        sid = await eng.open_session("ok", demand=Resources(memory_mb=256))
        assert await eng.wait_open(sid, 5.0) is None
        ex.answer = "could not open: ImageError: the node's layer budget is spent"
        sid = await eng.open_session("bad", demand=Resources(memory_mb=256))
        assert await eng.wait_open(sid, 5.0) == (
            "session 'bad' is not open: could not open: ImageError: the node's layer budget "
            "is spent")
        assert eng.session_count() == 1  # ("bad" left the count)
        ex.answer = "silent"
        sid = await eng.open_session("slow", demand=Resources(memory_mb=256))
        assert await eng.wait_open(sid, 0.05) is OPENING
        # no node has room: answered at once (3 cores of a 2-core node)
        sid = await eng.open_session("big", demand=Resources(cpu=3, memory_mb=256))
        assert await asyncio.wait_for(eng.wait_open(sid, 30.0), 5.0) is OPENING  # (no wait)
    finally:
        await eng.aclose()


async def test_without_reported_opens_a_session_counts_as_open() -> None:
    ex = FakeExecutor()
    eng = Engine(ex, EngineConfig(tick_s=0.05))
    await eng.start()
    try:
        sid = await eng.open_session("s", demand=Resources(memory_mb=256))
        assert await asyncio.wait_for(eng.wait_open(sid, 30.0), 1.0) is None
    finally:
        await eng.aclose()


async def test_a_session_still_opening_when_the_engine_closes_is_told_so() -> None:
    ex = _Reporting()
    ex.answer = "silent"
    eng = Engine(ex, EngineConfig(tick_s=0.05))
    await eng.start()
    sid = await eng.open_session("s", demand=Resources(memory_mb=256))
    waiting = asyncio.ensure_future(eng.wait_open(sid, 30.0))
    await asyncio.sleep(0.05)
    await eng.aclose()
    assert await asyncio.wait_for(waiting, 5.0) == "the engine closed before it opened"


async def test_answers_nobody_read_are_forgotten_past_max_results_oldest_first() -> None:
    ex = _Reporting()
    eng = Engine(ex, EngineConfig(tick_s=0.05, max_results=1))
    await eng.start()
    try:
        for sid in ("a", "b"):  # opened, their answers never read
            await eng.open_session(sid, demand=Resources(memory_mb=64))
            fut = eng._opening[sid]
            for _ in range(1000):  # (until the engine has handled the node's answer)
                if fut.done():
                    break
                await asyncio.sleep(0.01)
        assert list(eng._opening) == ["b"]  # ("a" answered and forgotten: one kept)
        ex.answer = "silent"
        for sid in ("c", "d"):  # (forgetting happens as one is opened: nothing to wait for)
            await eng.open_session(sid, demand=Resources(memory_mb=64))
        # "b" answered, forgotten; "c" still waits for its node: kept, and "d" behind it
        assert list(eng._opening) == ["c", "d"]
    finally:
        await eng.aclose()


async def test_a_session_whose_ttl_passes_before_its_node_opens_it_is_told_expired() -> None:
    """(The schemathesis run of CI: ``ttl_s`` tiny, the core's TTL close came before the
    node's report, and the open was answered as the node's failure: a 503.)"""
    ex = _Reporting()
    ex.answer = "silent"  # (the node never reports: the TTL passes first)
    eng = Engine(ex, EngineConfig(tick_s=0.05))
    await eng.start()
    try:
        sid = await eng.open_session("brief", demand=Resources(memory_mb=256), ttl_s=0.05)
        assert await asyncio.wait_for(eng.wait_open(sid, 30.0), 5.0) is EXPIRED
        assert eng.session_count() == 0
        assert eng.session_gone(sid) == ("session 'brief' is not open: it expired (no action "
                                         "for its ttl_s); its state is gone (open a new session)")
    finally:
        await eng.aclose()
