"""A crowded node (issue 40, items 2 and 3) on real sandboxes: the memory reports sample frozen
sessions (exactly which sessions' cgroups each report reads), and an idle session whose memory
is reclaimed under pressure stays frozen and answers its next action with its state.
The 1,000-session run is benchmarks/bench_sessions.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_IDS, TEST_UID, action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.images import imagekit

pytestmark = [pytest.mark.needs_root, pytest.mark.asyncio(loop_scope="module")]
EVERY = 3  # frozen_memory_refresh of this module's manager


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def crowd() -> AsyncIterator[CpuManager]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    root = tempfile.mkdtemp(prefix="tangram-crowd-test-", dir="/var/tmp")
    m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    warm_min=1, warm_max=2, frozen_memory_refresh=EVERY,
                                    images_dir=f"{root}/images", layers_dir=f"{root}/layers",
                                    image_layer_mb=64, layers_warm=0, **TEST_IDS))
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    try:
        yield m
    finally:
        await m.aclose()
        shutil.rmtree(root, ignore_errors=True)


def sh(m: CpuManager, sid: str, code: str):
    return m.run(action(code, kind=ActionKind.TOOL, session=sid, language="bash"), allot())


def _turn(calls: int, n: int) -> set[int]:
    """The places (open order) of the frozen sessions whose turn call number ``calls`` is."""
    return {i for i in range(n) if (i + calls) % EVERY == 0}


async def test_memory_reports_read_each_frozen_session_once_every_refresh(
        crowd: CpuManager) -> None:
    sids = [f"idle{i}" for i in range(6)]
    for sid in sids:
        await crowd.open_session(sid, Resources(cpu=1, memory_mb=256), ttl_s=600)
    try:
        use, _ = crowd.memory_use()  # the first report after their freeze reads them all
        assert crowd.sessions.memory_reads == 6 and sorted(use) == sorted(sids)
        last = {sid: use[sid][0] for sid in sids}
        for _ in range(2 * EVERY):  # then two of six per report, each once every 3 reports
            c = crowd.sessions.memory_calls + 1
            use, _ = crowd.memory_use()
            assert crowd.sessions.memory_reads == len(_turn(c, 6)) == 2
            for i, sid in enumerate(sids):
                if i in _turn(c, 6):
                    last[sid] = use[sid][0]
                else:  # between its reads: its last figure, as now and as its peak
                    assert use[sid] == (last[sid], last[sid])
        # an action thaws idle4: read on the next report whatever its turn, then sampled again
        r = await sh(crowd, "idle4", "head -c 3000000 /dev/zero > blob; echo ok")
        assert r.status == "Success" and r.run_result.stdout == "ok\n", r
        c = crowd.sessions.memory_calls + 1
        use, _ = crowd.memory_use()
        assert crowd.sessions.memory_reads == len(_turn(c, 6) | {4})
        assert use["idle4"][1] >= use["idle4"][0] >= 3_000_000  # its file in its tmpfs
        kept = use["idle4"][0]
        c = crowd.sessions.memory_calls + 1
        use, _ = crowd.memory_use()
        assert crowd.sessions.memory_reads == len(_turn(c, 6))
        if 4 not in _turn(c, 6):
            assert use["idle4"] == (kept, kept)
        # a closed session is no longer read; the places of the rest move up
        await crowd.close_session("idle0")
        c = crowd.sessions.memory_calls + 1
        use, _ = crowd.memory_use()
        assert "idle0" not in use and crowd.sessions.memory_reads == len(_turn(c, 5))
    finally:
        for sid in sids:
            await crowd.close_session(sid)


async def test_frozen_session_reclaimed_under_pressure_keeps_its_state(
        crowd: CpuManager) -> None:
    assert crowd.images is not None and crowd.layers is not None and crowd.layers.available
    rootfs = imagekit.host_rootfs(tempfile.mkdtemp(prefix="tangram-crowd-rootfs-") + "/r",
                                  (*imagekit.DEFAULT_TOOLS, "md5sum"))
    if not crowd.images.has("crowd-mini"):
        await asyncio.to_thread(crowd.images.import_path, rootfs, "crowd-mini")
    await crowd.open_session("squeezed", Resources(cpu=1, memory_mb=256), ttl_s=600,
                             image="crowd-mini", layer_mb=64)
    try:
        # state: 24 MiB written to its disk layer (page cache charged to it), a shell
        # variable, a directory it moved to and a process it left running
        r = await sh(crowd, "squeezed",
                     "mkdir -p /workdir/w && cd /workdir/w && head -c 25165824 /dev/urandom "
                     "> blob && md5sum blob > blob.md5 && export KEEP=squeezed-42 && "
                     "(exec -a keeper-proc sleep 600 &) && echo ok")
        assert r.status == "Success" and r.run_result.stdout == "ok\n", r
        use, _ = crowd.memory_use()
        before = use["squeezed"][0]
        assert before >= 24 << 20  # the blob's pages are charged to it
        freed = await crowd.reclaim_session("squeezed")  # memory runs short: reclaimed, kept
        assert freed >= 16 << 20
        s = crowd.sessions.by_id["squeezed"]
        assert s.freezer is not None and s.freezer.frozen  # still frozen, not closed
        use, _ = crowd.memory_use()
        assert use["squeezed"][0] <= before - (16 << 20)  # read again after it: what is left
        r = await sh(crowd, "squeezed", "pwd; echo $KEEP; md5sum -c blob.md5; "
                                        "cat /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
                                        "grep -c '^keeper-proc$'")
        assert r.status == "Success", r
        assert r.run_result.stdout.splitlines() == ["/workdir/w", "squeezed-42", "blob: OK", "1"]
        assert r.session_switch is not None and r.session_switch["frozen"]
        # an action's session is not reclaimed meanwhile; an unknown one frees nothing
        assert await crowd.reclaim_session("no-such-session") == 0
    finally:
        await crowd.close_session("squeezed")
        shutil.rmtree(os.path.dirname(rootfs), ignore_errors=True)


async def _image_with(m: CpuManager, tools: tuple[str, ...] = ()) -> str:
    assert m.images is not None
    if not m.images.has("crowd-mini"):
        d = tempfile.mkdtemp(prefix="tangram-crowd-rootfs-")
        try:
            rootfs = imagekit.host_rootfs(d + "/r", (*imagekit.DEFAULT_TOOLS, "md5sum", *tools))
            await asyncio.to_thread(m.images.import_path, rootfs, "crowd-mini")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return "crowd-mini"


async def test_reclaim_idle_takes_the_largest_first_and_stops_when_enough(
        crowd: CpuManager) -> None:
    img = await _image_with(crowd)
    for sid, mib in (("big", 24), ("small", 8)):
        await crowd.open_session(sid, Resources(cpu=1, memory_mb=256), ttl_s=600, image=img,
                                 layer_mb=64)
        r = await sh(crowd, sid, f"head -c {mib << 20} /dev/urandom > /workdir/blob; echo ok")
        assert r.status == "Success" and r.run_result.stdout == "ok\n", r
    try:
        use, _ = crowd.memory_use()
        assert use["big"][0] >= 24 << 20 and use["small"][0] >= 8 << 20
        big = use["big"][0]
        freed = await crowd.reclaim_idle(1)  # one byte short: the largest alone goes
        assert freed >= 16 << 20
        use, _ = crowd.memory_use()
        assert use["big"][0] <= big - (16 << 20)
        assert use["small"][0] >= 8 << 20  # untouched: its blob's pages still charged to it
        r = await sh(crowd, "big", "wc -c < /workdir/blob")
        assert r.run_result.stdout == f"{24 << 20}\n"
    finally:
        await crowd.close_session("big")
        await crowd.close_session("small")


async def test_node_short_of_memory_reclaims_idle_sessions_before_its_report() -> None:
    """A node whose measured use passes `memory_reclaim_at` of its memory reclaims its idle
    sessions' page cache before it reports (the core's watermark, which evicts, then sees what
    is left); the session stays open, frozen, and answers its next action with its state."""
    from arl_tangram.core import events as E
    from arl_tangram.runtime.node import NodeHost

    root = tempfile.mkdtemp(prefix="tangram-crowd-node-", dir="/var/tmp")
    m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID + 1,
                                    sandbox_gid=TEST_UID + 1, warm_min=0, warm_max=1,
                                    images_dir=f"{root}/images", layers_dir=f"{root}/layers",
                                    image_layer_mb=64, layers_warm=0, **TEST_IDS))
    reports: list[E.MemoryReport] = []
    node = NodeHost("short", emit=lambda e: reports.append(e) if isinstance(
        e, E.MemoryReport) else None, capacity=Resources(cpu=2, memory_mb=32), cpu_manager=m)
    node.reports.memory_report_s = 0.05
    try:
        try:
            await node.start()
        except IsolationUnavailable as e:
            pytest.skip(f"isolation unavailable here: {e}")
        img = await _image_with(m)
        await m.open_session("tight", Resources(cpu=1, memory_mb=256), ttl_s=600, image=img,
                             layer_mb=64)
        r = await sh(m, "tight", "cd /workdir && head -c 41943040 /dev/urandom > blob && "
                                 "md5sum blob > blob.md5 && export KEEP=tight-7 && echo ok")
        assert r.status == "Success" and r.run_result.stdout == "ok\n", r
        seen = len(reports)
        while len(reports) < seen + 3:  # reports after the action: reclaimed before each
            await asyncio.sleep(0.05)
        assert all(rep.current_mb["tight"] < 24 for rep in reports[seen:])  # its 40 MiB went
        assert m.has_session("tight")
        s = m.sessions.by_id["tight"]
        assert s.freezer is not None and s.freezer.frozen
        r = await sh(m, "tight", "pwd; echo $KEEP; md5sum -c blob.md5")
        assert r.status == "Success", r
        assert r.run_result.stdout.splitlines() == ["/workdir", "tight-7", "blob: OK"]
    finally:
        await node.aclose()
        await m.aclose()
        shutil.rmtree(root, ignore_errors=True)


async def test_fifty_frozen_idle_sessions_answer_with_their_state(
        crowd: CpuManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """50 sessions open at once (every other in an image), each leaves a file, a variable and a
    working directory, then idles frozen; while they idle each report reads exactly the
    sessions whose turn it is (by id); short of memory, their page cache is reclaimed; and each
    answers its next action, thawed and frozen again, with its state. (The 1,000-session run is benchmarks/bench_sessions.py.)"""
    from arl_tangram.managers.cpu.host.cgroups import Slot

    img = await _image_with(crowd)
    n = 50
    sids = [f"many{i:02d}" for i in range(n)]
    try:
        for k in range(0, n, 10):  # (10 at a time: the warm pool refills meanwhile)
            await asyncio.gather(*(crowd.open_session(
                sid, Resources(cpu=1, memory_mb=256), ttl_s=600,
                image=img if i % 2 else None, layer_mb=8 if i % 2 else None)
                for i, sid in enumerate(sids) if k <= i < k + 10))
        order = [sid for sid in crowd.sessions.by_id if sid in sids]
        assert sorted(order) == sids and list(crowd.sessions.by_id) == order  # only these

        async def leave(i: int, sid: str) -> None:
            r = await sh(crowd, sid, f"mkdir -p w && cd w && echo {sid} > mark && "
                                     f"export KEEP={sid}-{i * 7} && echo ok")
            assert r.status == "Success" and r.run_result.stdout == "ok\n", (sid, r)
            assert r.session_switch is not None and r.session_switch["frozen"]

        await asyncio.gather(*(leave(i, sid) for i, sid in enumerate(sids)))
        assert all(crowd.sessions.by_id[sid].freezer.frozen for sid in sids)  # type: ignore[union-attr]

        read: list[str] = []
        by_slot = {crowd.sessions.by_id[sid].sandbox.slot.name: sid for sid in sids}  # type: ignore[union-attr]
        sample = Slot.memory_sample

        def spy(slot: Slot) -> tuple[int, int]:
            read.append(by_slot[slot.name])
            return sample(slot)

        monkeypatch.setattr(Slot, "memory_sample", spy)
        crowd.memory_use()  # the first report after their actions reads every one
        assert sorted(read) == sids and crowd.sessions.memory_reads == n
        for _ in range(EVERY):  # then each once every EVERY reports, by its place
            read.clear()
            c = crowd.sessions.memory_calls + 1
            crowd.memory_use()
            assert read == [order[i] for i in sorted(_turn(c, n))]
            assert len(read) in (n // EVERY, n // EVERY + 1)
        monkeypatch.undo()
        # memory runs short: every idle one's page cache is reclaimed; none closed, none thawed
        await crowd.reclaim_idle(1 << 40)
        assert [sid for sid in crowd.sessions.by_id if sid in sids] == order
        assert all(crowd.sessions.by_id[sid].freezer.frozen for sid in sids)  # type: ignore[union-attr]

        async def back(i: int, sid: str) -> None:
            r = await sh(crowd, sid, "pwd; cat mark; echo $KEEP")
            assert r.status == "Success", (sid, r)
            assert r.run_result.stdout.splitlines()[1:] == [sid, f"{sid}-{i * 7}"], (sid, r)
            assert r.run_result.stdout.splitlines()[0].endswith("/w"), (sid, r)
            assert r.session_switch is not None and r.session_switch["frozen"]

        await asyncio.gather(*(back(i, sid) for i, sid in enumerate(sids)))
        assert all(crowd.sessions.by_id[sid].freezer.frozen for sid in sids)  # type: ignore[union-attr]
    finally:
        for sid in sids:
            await crowd.close_session(sid)
