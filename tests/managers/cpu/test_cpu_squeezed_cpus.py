# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""Squeezed actions on CPUs of their own (issue 41, `CpuManagerConfig.squeezed_cpus`), read
back from the kernel: while lent CPU is taken back from running actions, every thread of
theirs runs on the last ceil(their quotas) CPUs of the manager's, so the other CPUs are left to
the owed tenant and to the service's own processes; grown back or ended, they run on every CPU
again. What a squeezed process forks later runs where it does."""

from __future__ import annotations

import asyncio
import os

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import allot, registered

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host.pool import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

_n = iter(range(1 << 30))
_SLEEP = "import time\ntime.sleep(20)\n"


def _spec(code: str, session: str | None = None) -> ActionSpec:
    return ActionSpec(id=f"q{next(_n)}", kind=ActionKind.CODE if session is None else ActionKind.TOOL,
                      session=session, demand=Resources(cpu=1, memory_mb=256),
                      payload={"code": code})


def _cpus(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0-3,6") as a tuple of CPUs."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def _allowed(sb: Sandbox) -> set[tuple[int, ...]]:
    """The CPUs each thread of ``sb``'s slot may run on (/proc), as a set of CPU tuples."""
    assert sb.slot is not None
    name = "tasks" if sb.slot.version == "v1" else "cgroup.threads"
    with open(f"{sb.slot.dirs['cpu']}/{name}") as f:
        tids = f.read().split()
    assert tids, "the sandbox has no process"
    out = set()
    for t in tids:
        with open(f"/proc/{t}/status") as f:
            line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
        out.add(_cpus(line.split(":", 1)[1]))
    return out


@pytest.fixture(scope="module")
async def two_cpus() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("confinement needs two CPUs or more")  # (the project's machines have 2)
    return cpus


async def test_squeezed_loops_share_the_last_cpu_and_come_back(mgr: CpuManager, two_cpus: list[int]) -> None:
    every, last = tuple(two_cpus), (two_cpus[-1],)
    assert mgr.config.squeezed_cpus is True
    a, b = _spec(_SLEEP), _spec(_SLEEP)
    runs = [asyncio.create_task(mgr.run(x, allot(cpu=1))) for x in (a, b)]
    sa, sb = await registered(mgr, a.id), await registered(mgr, b.id)
    assert _allowed(sa) == _allowed(sb) == {every}
    # a squeezed: it alone on the last CPU; b, unsqueezed, keeps every CPU
    assert await mgr.resize(a.id, allot(cpu=0.5)) == "applied"
    assert (_allowed(sa), _allowed(sb)) == ({last}, {every})
    assert set(mgr._confined) == {a.id} and mgr._pinned == last
    # both squeezed, 1.0 core in all: one CPU for both
    assert await mgr.resize(b.id, allot(cpu=0.5)) == "applied"
    assert (_allowed(sa), _allowed(sb)) == ({last}, {last})
    # a grows back: every CPU again; b stays
    assert await mgr.resize(a.id, allot(cpu=1)) == "applied"
    assert (_allowed(sa), _allowed(sb)) == ({every}, {last})
    assert set(mgr._confined) == {b.id}
    # b ends squeezed: nothing confined is left
    await mgr.cancel(b.id)
    await runs[1]
    assert mgr._confined == {} and mgr._pinned == ()
    await mgr.cancel(a.id)
    await runs[0]


async def test_squeezed_past_all_but_one_cpu_nothing_is_pinned(mgr: CpuManager, two_cpus: list[int]) -> None:
    """Two loops squeezed to 0.75 each (1.5 cores): no CPU would be left free of them on two,
    so neither is pinned (quota and weight alone)."""
    if len(two_cpus) != 2:
        pytest.skip("the counts below are those of two CPUs")
    a, b = _spec(_SLEEP), _spec(_SLEEP)
    runs = [asyncio.create_task(mgr.run(x, allot(cpu=1))) for x in (a, b)]
    sa, sb = await registered(mgr, a.id), await registered(mgr, b.id)
    assert await mgr.resize(a.id, allot(cpu=0.5)) == "applied"
    assert _allowed(sa) == {(two_cpus[-1],)}
    assert await mgr.resize(b.id, allot(cpu=1.0 - 1e-6)) == "applied"  # (1.5 cores squeezed)
    assert (_allowed(sa), _allowed(sb)) == ({tuple(two_cpus)}, {tuple(two_cpus)})
    assert mgr._confined == {} and mgr._pinned == ()
    for x in (a, b):
        await mgr.cancel(x.id)
    await asyncio.gather(*runs)


async def test_what_a_squeezed_action_forks_later_runs_where_it_does(mgr: CpuManager, two_cpus: list[int]) -> None:
    code = ("import os, subprocess, sys, time\nfor _ in range(2000):\n"
            "    if len(os.sched_getaffinity(0)) == 1:\n        break\n    time.sleep(0.005)\n"
            "print(sorted(os.sched_getaffinity(0)))\n"
            "sys.stdout.flush()\n"
            "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])\n")
    a = _spec(code)
    run = asyncio.create_task(mgr.run(a, allot(cpu=1)))
    await registered(mgr, a.id)
    assert await mgr.resize(a.id, allot(cpu=0.5)) == "applied"
    r = await run
    assert r.run_result is not None, r
    assert r.run_result.stdout.splitlines() == [str([two_cpus[-1]])] * 2, r.run_result


async def test_a_session_outlives_its_squeezed_action_on_every_cpu(mgr: CpuManager, two_cpus: list[int]) -> None:
    """A session's sandbox squeezed during one of its actions runs on every CPU again once
    that action ends (its next action, and its idle time, are not confined)."""
    await mgr.open_session("sq", Resources(cpu=1, memory_mb=256), ttl_s=60)
    try:
        a = _spec("import time\ntime.sleep(1.5)\n", session="sq")
        run = asyncio.create_task(mgr.run(a, allot(cpu=1)))
        sb = await registered(mgr, a.id)
        assert await mgr.resize(a.id, allot(cpu=0.5)) == "applied"
        assert _allowed(sb) == {(two_cpus[-1],)}
        r = await run
        assert r.status == "Success", r
        assert mgr._confined == {}
        assert _allowed(sb) == {tuple(two_cpus)}
    finally:
        await mgr.close_session("sq")


async def test_a_squeeze_before_its_sandbox_is_pinned_when_it_registers(mgr: CpuManager, two_cpus: list[int]) -> None:
    """A resize that comes while the action waits for its sandbox (here behind its session's
    running action) is applied when it registers: squeezed, it starts pinned."""
    await mgr.open_session("sd", Resources(cpu=1, memory_mb=256), ttl_s=60)
    try:
        first = _spec("import time\ntime.sleep(1)\n", session="sd")
        second = _spec("import time\ntime.sleep(1.5)\n", session="sd")
        t1 = asyncio.create_task(mgr.run(first, allot(cpu=1)))
        await registered(mgr, first.id)
        t2 = asyncio.create_task(mgr.run(second, allot(cpu=1)))
        await asyncio.sleep(0.05)
        assert second.id not in mgr._running
        assert await mgr.resize(second.id, allot(cpu=0.5)) == "deferred"
        assert mgr._confined == {}
        assert (await t1).status == "Success"
        sb = await registered(mgr, second.id)
        for _ in range(200):  # (pinned right after its limits are set)
            if second.id in mgr._confined:
                break
            await asyncio.sleep(0.005)
        assert set(mgr._confined) == {second.id} and mgr._pinned == (two_cpus[-1],)
        assert _allowed(sb) == {(two_cpus[-1],)}
        assert (await t2).status == "Success"
        assert mgr._confined == {} and _allowed(sb) == {tuple(two_cpus)}
    finally:
        await mgr.close_session("sd")


async def test_two_managers_of_one_process_never_pin_to_the_same_cpus(two_cpus: list[int]) -> None:
    """A local executor's nodes share the machine's CPUs: the second manager's squeezed action
    is not pinned onto the CPU the first pinned its own to (nor onto the last one left), so
    neither gets less than its quota for the other's sake; once the first's ends, it is."""
    if len(two_cpus) != 2:
        pytest.skip("the counts below are those of two CPUs")
    m1, m2 = CpuManager(CpuManagerConfig(warm_min=0)), CpuManager(CpuManagerConfig(warm_min=0))
    await m1.start()
    await m2.start()
    try:
        a, b = _spec(_SLEEP), _spec(_SLEEP)
        ra = asyncio.create_task(m1.run(a, allot(cpu=1)))
        rb = asyncio.create_task(m2.run(b, allot(cpu=1)))
        sa, sb = await registered(m1, a.id), await registered(m2, b.id)
        assert await m1.resize(a.id, allot(cpu=0.5)) == "applied"
        assert await m2.resize(b.id, allot(cpu=0.5)) == "applied"
        assert (m1._pinned, m2._pinned) == ((two_cpus[-1],), ())
        assert (_allowed(sa), _allowed(sb)) == ({(two_cpus[-1],)}, {tuple(two_cpus)})
        await m1.cancel(a.id)
        await ra
        assert m1._pinned == ()
        assert await m2.resize(b.id, allot(cpu=0.4)) == "applied"  # (its next change: pinned)
        assert m2._pinned == (two_cpus[-1],) and _allowed(sb) == {(two_cpus[-1],)}
        await m2.cancel(b.id)
        await rb
    finally:
        await m1.aclose()
        await m2.aclose()


async def test_off_nothing_moves(two_cpus: list[int]) -> None:
    m = CpuManager(CpuManagerConfig(warm_min=0, squeezed_cpus=False))
    await m.start()
    try:
        a = _spec(_SLEEP)
        run = asyncio.create_task(m.run(a, allot(cpu=1)))
        sa = await registered(m, a.id)
        assert await m.resize(a.id, allot(cpu=0.5)) == "applied"
        assert _allowed(sa) == {tuple(two_cpus)}
        assert m._confined == {}
        await m.cancel(a.id)
        await run
    finally:
        await m.aclose()
