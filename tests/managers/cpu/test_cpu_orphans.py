"""A killed fork server takes its sandboxes with it (warm ones included): nothing is orphaned."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time

import pytest
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_sandboxes_die_with_the_fork_server() -> None:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                    sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    warm_min=3, warm_max=3))
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    try:
        zpid = m.fork.zygote.proc.pid
        # one running action (its uid already dropped) and whatever the warm pool holds
        run = asyncio.create_task(m.run(action("import time\ntime.sleep(60)"), allot()))
        deadline = time.monotonic() + 10
        while len(_descendants(zpid)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        kids = _descendants(zpid)  # the fork server's sandboxes and what runs in them
        assert len(kids) >= 2, kids
        os.kill(zpid, signal.SIGKILL)  # as when the service is killed -9
        deadline = time.monotonic() + 5
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not any(_alive(k) for k in kids), [k for k in kids if _alive(k)]
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
    finally:
        await m.aclose()
