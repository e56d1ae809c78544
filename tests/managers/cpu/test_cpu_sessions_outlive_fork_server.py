"""Issue 41, item 4: sessions outlive their fork server. 32 sessions hold state (a Python variable
and a bash variable, frozen between actions), one-shot actions run in the fork server's sandboxes
and one session action is in flight; the fork server is killed with SIGKILL, twice (the second
time while the sessions are the first one's orphans). Only the one-shot actions in flight fail,
saying the fork server died; the session action in flight finishes; every session's next actions
see their state; the orphaned sessions' inits are the reaper's children (a subreaper), not the
host init's; their ids are not lent by the new fork servers while they live and are given back
when they close."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_IDS, TEST_UID, action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

N = 32


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(") ", 1)[1].split()[1])


@pytest_asyncio.fixture()
async def m() -> AsyncIterator[CpuManager]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    mgr = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                      sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                      warm_min=2, warm_max=8, **TEST_IDS))
    try:
        await mgr.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    yield mgr
    await mgr.aclose()


async def _until(cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.01)


def _tool(sid: str, code: str, language: str = "python"):  # type: ignore[no-untyped-def]
    return action(code, kind=ActionKind.TOOL, session=sid, language=language)


async def _kill_fork_server(m: CpuManager) -> None:
    assert m.fork.zygote is not None
    zpid, restarts = m.fork.zygote.proc.pid, m.fork.restarts
    os.kill(zpid, signal.SIGKILL)
    await _until(lambda: m.fork.restarts == restarts + 1 and m.health()["ready"], 15)


async def _check_state(m: CpuManager, sids: list[str]) -> None:
    """Each session's Python and bash state as set (s0's ``x`` incremented once)."""
    assert m.session_ids() == sorted(sids)
    for i, sid in enumerate(sids):
        r = await m.run(_tool(sid, "print(x)"), allot())
        assert r.status == "Success", r
        assert r.run_result is not None and r.run_result.stdout == f"{i * 7 + (i == 0)}\n", r
        r = await m.run(_tool(sid, "echo $V $PWD", "bash"), allot())
        assert r.status == "Success", r
        assert r.run_result is not None and r.run_result.stdout == f"v{i} /tmp\n", r


async def test_32_sessions_keep_their_state_when_the_fork_server_dies(m: CpuManager) -> None:
    sids = [f"s{i}" for i in range(N)]
    for sid in sids:
        await m.open_session(sid, Resources(cpu=0.5, memory_mb=128), 600)
    for i, sid in enumerate(sids):
        r = await m.run(_tool(sid, f"x = {i} * 7"), allot())
        assert r.status == "Success", r
        r = await m.run(_tool(sid, f"export V=v{i}; cd /tmp", "bash"), allot())
        assert r.status == "Success", r
    inits = {sid: m.sessions.by_id[sid].sandbox.pid for sid in sids}
    uids = {m.sessions.by_id[sid].sandbox.uid for sid in sids}
    assert len(uids) == N
    # in flight: 3 one-shot actions in the fork server's sandboxes, 1 action in session s0
    slow = [asyncio.create_task(m.run(action("import time; time.sleep(30)"), allot()))
            for _ in range(3)]
    busy = asyncio.create_task(m.run(_tool("s0", "import time; time.sleep(1.5); x += 1"), allot()))
    await _until(lambda: len(m._running) == 4, 10)
    await asyncio.sleep(0.2)
    await _kill_fork_server(m)
    for r in await asyncio.wait_for(asyncio.gather(*slow), 30):
        assert r.status == "SandboxError" and "fork server died" in r.message, r
    r = await busy
    assert r.status == "Success", r
    await _check_state(m, sids)
    assert m._pool is not None and m._pool.orphan_ids == uids
    reaper = m.fork.watchdog.proc.pid if m.fork.watchdog is not None else -1
    assert {_ppid(p) for p in inits.values()} == {reaper}
    # a second death, the sessions now the first fork server's orphans
    await _kill_fork_server(m)
    await _check_state(m, sids)
    assert {m.sessions.by_id[sid].sandbox.pid for sid in sids} == set(inits.values())
    # one-shot actions of the new fork server never run as a live session's id
    for r in await asyncio.gather(*(m.run(action("import os; print(os.getuid())"), allot())
                                    for _ in range(16))):
        assert r.status == "Success" and r.run_result is not None, r
        assert int(r.run_result.stdout) not in uids, r
    for sid in sids:
        await m.close_session(sid)
    await _until(lambda: not m._pool.orphan_ids, 10)  # type: ignore[union-attr]
    assert m.health()["fork_server_deaths"] == 2 and m.health()["fork_server_restarts"] == 2


async def test_a_killed_reaper_is_replaced_and_sessions_live_on(m: CpuManager) -> None:
    """The reaper killed while the service lives (its fork server dies with it): a new reaper
    and fork server come up, the session keeps its state, one-shot actions run, and the new
    reaper still cleans at close."""
    await m.open_session("k", Resources(cpu=0.5, memory_mb=128), 600)
    r = await m.run(_tool("k", "x = 41"), allot())
    assert r.status == "Success", r
    assert m.fork.watchdog is not None
    old = m.fork.watchdog.proc.pid
    os.kill(old, signal.SIGKILL)
    await _until(lambda: m.fork.restarts == 1 and m.health()["ready"], 15)
    assert m.fork.watchdog is not None and m.fork.watchdog.proc.pid != old
    assert m.fork.zygote is not None and _ppid(m.fork.zygote.proc.pid) == m.fork.watchdog.proc.pid
    r = await m.run(_tool("k", "print(x + 1)"), allot())
    assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "42\n", r
    r = await m.run(action("print(6 * 7)"), allot())
    assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "42\n", r


async def test_an_image_session_outlives_the_fork_server(m: CpuManager, tmp_path) -> None:
    """An image session (its own user namespace, its layer on a loop device, frozen between
    actions) keeps its files, its shell's variables and its background process."""
    from arl_tangram.managers.cpu.images import imagekit

    assert m.images is not None
    await asyncio.to_thread(m.images.import_path,
                            imagekit.host_rootfs(str(tmp_path / "rootfs")), "mini")
    await m.open_session("img", Resources(cpu=0.5, memory_mb=128), 600, image="mini",
                         layer_mb=16)
    r = await m.run(_tool("img", "echo kept > /srv/f; export W=w1; sleep 600 & echo $! > /srv/pid",
                          "bash"), allot())
    assert r.status == "Success", r
    await _kill_fork_server(m)
    r = await m.run(_tool("img", "cat /srv/f; echo $W; kill -0 $(cat /srv/pid) && echo alive",
                          "bash"), allot())
    assert r.status == "Success" and r.run_result is not None, r
    assert r.run_result.stdout == "kept\nw1\nalive\n", r
    await m.close_session("img")
