"""The fork server's crash counter forgets crashes older than its window (issue 43): a node whose
fork server dies now and then (each death more than `fork_server_crash_window_s` after the one
before) is restarted every time and never marked down; `fork_server_max_crashes` deaths within
the window mark it down.
The supervisor's clock is a fake the test moves (no waiting for a window)."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host import supervisor as supervisor_mod

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


class _Clock:
    """`time` as the fork server's supervisor sees it: its monotonic clock runs ``offset`` ahead."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest_asyncio.fixture()
async def m(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[CpuManager, _Clock]]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    clock = _Clock()
    monkeypatch.setattr(supervisor_mod, "time", clock)
    mgr = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                      sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                      warm_min=1, warm_max=2, fork_server_max_crashes=2,
                                      fork_server_crash_window_s=100.0,
                                      fork_server_restart_backoff_s=0.01,
                                      fork_server_down_retry_s=600.0))
    try:
        await mgr.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    yield mgr, clock
    await mgr.aclose()


async def _until(cond: Any, timeout: float) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout} s")


async def _kill_and_wait(mgr: CpuManager, restarts: int) -> None:
    await _until(lambda: mgr.health()["ready"] and mgr.fork.zygote is not None
                 and mgr.fork.zygote.gone is None, 10)
    assert mgr.fork.zygote is not None
    os.kill(mgr.fork.zygote.proc.pid, signal.SIGKILL)
    await _until(lambda: mgr.fork.restarts == restarts or mgr.health()["down"], 10)


async def test_crashes_further_apart_than_the_window_never_mark_the_node_down(
        m: tuple[CpuManager, _Clock]) -> None:
    mgr, clock = m
    for i in range(4):
        await _kill_and_wait(mgr, i + 1)
        assert mgr.fork.restarts == i + 1 and not mgr.health()["down"], mgr.health()
        clock.offset += 100.5  # the next death comes past the window
    r = await mgr.run(action("print(1)"), allot())
    assert r.status == "Success", r
    # two deaths within the window: down
    await _kill_and_wait(mgr, 5)
    assert mgr.fork.restarts == 5
    await _kill_and_wait(mgr, 6)
    await _until(lambda: mgr.health()["down"], 5)
    h = mgr.health()
    assert "died 2 times within 100 s: node marked down" in h["reason"], h
    assert mgr.fork.restarts == 5
