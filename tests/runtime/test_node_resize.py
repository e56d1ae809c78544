"""Resizes on one NodeHost with a real CPU manager (issue 22, item 1): a resize that comes while
the action still waits for its session to open is the allotment it starts with (deferred), one
of a running action rewrites its sandbox's quota (applied), one of an action that has ended is
dropped; ``info()["resizes"]`` counts each."""

from __future__ import annotations

import asyncio

import pytest

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.runtime.node import NodeHost

pytestmark = pytest.mark.needs_root

_SEEN = "import os, time\nprint(os.cpu_count(), os.environ['TANGRAM_CPUS'])\ntime.sleep(0.3)\n"


def _elastic(aid: str, session: str | None = None) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TOOL if session else ActionKind.CODE, session=session,
                      demand=Resources(cpu=1, memory_mb=256), elasticity=Elasticity(1, 2),
                      payload={"code": _SEEN})


async def _finished(events: list[E.Event], aid: str) -> E.ActionFinished:
    for _ in range(1000):
        for ev in events:
            if isinstance(ev, E.ActionFinished) and ev.action_id == aid:
                return ev
        await asyncio.sleep(0.01)
    raise AssertionError(f"{aid} did not finish")


async def test_resizes_before_during_and_after_an_action(tmp_path) -> None:
    events: list[E.Event] = []
    host = NodeHost("n1", emit=events.append, capacity=Resources(cpu=2, memory_mb=4096),
                    cpu_config=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1))
    await host.start()
    try:
        one, two = Resources(cpu=1, memory_mb=256), Resources(cpu=2, memory_mb=256)
        # in one breath: the session opens, its action starts at one core, and is resized to
        # two while it waits for the open: it runs with two
        a = _elastic("a", session="s")
        host.submit(C.OpenSession("s", "n1", one, 60.0))
        host.submit(C.StartAction(a, "n1", one))
        host.submit(C.ResizeAction("a", "n1", two))
        ev = await _finished(events, "a")
        assert ev.output["run_result"]["stdout"].split() == ["2", "2"], ev
        assert host.cpu.sessions.by_id["s"].cpu == 2.0  # its quota while it ran
        assert host.info()["resizes"] == {"applied": 0, "deferred": 1, "dropped": 0}
        # a running action: its sandbox's quota is rewritten
        b = _elastic("b")
        host.submit(C.StartAction(b, "n1", one))
        for _ in range(1000):
            if "b" in host.cpu._running:
                break
            await asyncio.sleep(0.005)
        host.submit(C.ResizeAction("b", "n1", two))
        await _finished(events, "b")
        # ended: nothing to resize
        host.submit(C.ResizeAction("b", "n1", one))
        for _ in range(100):
            if sum(host.actions.resizes.values()) == 3:
                break
            await asyncio.sleep(0.01)
        assert host.info()["resizes"] == {"applied": 1, "deferred": 1, "dropped": 1}
    finally:
        await host.aclose()
