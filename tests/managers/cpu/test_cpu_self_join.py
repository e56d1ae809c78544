"""cgroup v1: a new sandbox's init moves itself into its slot (issue 16, item 5).

The manager used to write each new sandbox's pid to its slot's `cgroup.procs`; a move of another
process takes the kernel's global threadgroup lock, whose write side waits for an RCU grace
period, and that wait stalled every refill batch (the machine sat ~15 % idle under load). Now
the fork server opens the slot's `tasks` files and the init writes 0 to them first thing.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host.cgroups import CgroupTree, Slot
from arl_tangram.managers.cpu.host.pool import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")


def _v1() -> bool:
    t = CgroupTree()
    try:
        return t.version == "v1"
    finally:
        t.close()


async def _manager(**kw: object) -> CpuManager:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    if not _v1():
        pytest.skip("self-joining needs cgroup v1 (`tasks`)")
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-join-test-"),
                                    sandbox_uid=TEST_UID, sandbox_gid=TEST_UID, warm_min=2,
                                    warm_max=8, **kw))  # type: ignore[arg-type]
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    return m


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def joined() -> AsyncIterator[CpuManager]:
    m = await _manager()
    yield m
    await m.aclose()


def _cgroups_of(pid: int) -> dict[str, str]:
    """controller -> the cgroup path of ``pid`` (host view)."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(","):
                out[c] = path
    return out


async def _in_slot(sb: Sandbox, within_s: float = 3.0) -> bool:
    """The sandbox's init is in its own slot in every hierarchy (it moves itself right after
    its fork: asynchronously to the spawn's reply)."""
    assert sb.slot is not None
    for _ in range(int(within_s / 0.01)):
        cg = _cgroups_of(sb.pid)
        if all(cg.get(c, "").endswith(f"/{sb.slot.name}") for c in CONTROLLERS):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_sandboxes_move_themselves_into_their_slots(joined: CpuManager,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pool = joined._pool
    assert pool is not None and pool.self_join and joined.fork.zygote is not None
    assert joined.fork.zygote.hello.get("cgroup_join") is True

    def refuse(self: Slot, pid: int) -> None:
        raise AssertionError("the manager moved a sandbox into its slot")

    monkeypatch.setattr(Slot, "add", refuse)
    got = await pool.spawn_many(4, prepare=False, warm=False)
    try:
        assert all(isinstance(sb, Sandbox) for sb in got), got
        sbs = [sb for sb in got if isinstance(sb, Sandbox)]
        assert len({sb.slot.name for sb in sbs if sb.slot}) == 4
        for sb in sbs:
            assert await _in_slot(sb), (_cgroups_of(sb.pid), sb.slot)
            assert sb.slot is not None and sb.slot.cpu == pool.default_cpu  # readied before
    finally:
        for sb in got:
            if isinstance(sb, Sandbox):
                pool.release(sb)
    # actions (warm pool and cold spawns alike) run in their slots, with their stats
    rs = await asyncio.gather(*(joined.run(action("print(sum(range(10**5)))"), allot())
                                for _ in range(12)))
    assert all(r.status == "Success" for r in rs), [r.to_dict() for r in rs]
    assert all(r.cpu_time is not None and r.cpu_time > 0 for r in rs)


async def test_a_sandbox_keeps_no_cgroup_descriptor(joined: CpuManager) -> None:
    code = ("import os\nfor fd in os.listdir('/proc/self/fd'):\n"
            "    try: print(fd, os.readlink('/proc/self/fd/' + fd))\n"
            "    except OSError: pass\n")
    r = await joined.run(action(code), allot())
    assert r.status == "Success" and r.run_result is not None, r.to_dict()
    assert "cgroup" not in r.run_result.stdout and "tangram-" not in r.run_result.stdout


async def test_the_fork_server_refuses_a_bad_slot_name(joined: CpuManager) -> None:
    assert joined.fork.zygote is not None
    got = await joined.fork.zygote.spawn(1, False, ["../../x"])
    assert len(got) == 1 and isinstance(got[0], Exception)
    r = await joined.run(action("print(1)"), allot())  # and serves on
    assert r.status == "Success", r.to_dict()


async def test_off_the_manager_moves_them() -> None:
    m = await _manager(cgroup_self_join=False)
    try:
        assert m._pool is not None and not m._pool.self_join
        assert m.fork.zygote is not None and m.fork.zygote.hello.get("cgroup_join") is False
        got = await m._pool.spawn_many(2, prepare=False, warm=False)
        try:
            for sb in got:
                assert isinstance(sb, Sandbox) and await _in_slot(sb, 0.05)  # placed: at once
        finally:
            for sb in got:
                if isinstance(sb, Sandbox):
                    m._pool.release(sb)
    finally:
        await m.aclose()
