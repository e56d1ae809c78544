"""The warm pool with fakes (issue 43, mutation testing): exact values of a sandbox's limits and
kill, the slots' limits and reuse, the pool's target and deficit, takes, refills, cold spawns,
the fork server's loss and the close. No sandbox starts: the fork server, the cgroup tree, the
connections, the pidfds (pipes: written to when the fake SIGKILL lands) and the clock are fakes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import types
from typing import Any

import pytest

from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.managers.cpu.host import pool as P

# a mutant that hangs the loop fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)

MIB = 1 << 20


class _Slot:
    made = 0

    def __init__(
        self,
        name: str = "",
        *,
        cpu: float = -1.0,
        memory: int = -1,
        weight: float = -1.0,
        pids: int = -1,
    ) -> None:
        _Slot.made += 1
        self.name = name or f"slot{_Slot.made}"
        self.cpu, self.memory, self.weight, self.pids = cpu, memory, weight, pids
        self.peak_sticky = False
        self.charged = 0
        self.charged_error: BaseException | None = None
        self.empty: list[Any] = []  # is_empty's answers, in order (then True)
        self.writes: list[tuple[str, Any]] = []
        self.added: list[int] = []
        self.removed = 0
        self.closed = 0
        self.fail_on: str | None = None

    def _w(self, what: str, v: Any) -> None:
        if self.fail_on == what:
            raise OSError(f"cannot {what}")
        self.writes.append((what, v))

    def set_pids(self, n: int) -> None:
        self._w("pids", n)
        self.pids = n

    def set_cpu(self, c: float) -> None:
        self._w("cpu", c)
        self.cpu = c

    def set_memory(self, m: int) -> None:
        self._w("memory", m)
        self.memory = m

    def set_weight(self, w: float) -> None:
        self._w("weight", w)
        self.weight = w

    def reset_stats(self) -> None:
        self._w("reset", None)

    def add(self, pid: int) -> None:
        self._w("add", pid)
        self.added.append(pid)

    def is_empty(self) -> bool:
        if self.empty:
            v = self.empty.pop(0)
            if isinstance(v, BaseException):
                raise v
            return v
        return True

    def charged_bytes(self) -> int:
        if self.charged_error is not None:
            raise self.charged_error
        return self.charged

    def remove(self) -> None:
        self.removed += 1

    def close(self) -> None:
        self.closed += 1


class _Tree:
    def __init__(self, version: str | None = "v2") -> None:
        self.version = version
        self.slots: list[_Slot] = []

    def new_slot(self) -> _Slot:
        s = _Slot()
        self.slots.append(s)
        return s


class _Conn:
    def __init__(self, sock: Any = None, loop: Any = None) -> None:
        self.sock = sock
        self.requests: list[tuple[Any, Any]] = []
        self.reply: Any = {"ok": True}
        self.closed = 0

    async def request(self, msg: Any, timeout: Any = None) -> Any:
        self.requests.append((msg, timeout))
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply

    def close(self) -> None:
        self.closed += 1
        if self.sock is not None:
            self.sock.close()


class _Kernel:
    """Fake pidfds (a pipe's read end per sandbox: "exited" once written to) and SIGKILL."""

    def __init__(self) -> None:
        self.w: dict[int, int] = {}
        self.signals: list[tuple[int, int]] = []
        self.kill_error: BaseException | None = None
        self.open_error: dict[int, BaseException] = {}
        self.pool: Any = None
        self.auto_exit = True  # a killed direct sandbox's exit report comes from the fork server

    def pidfd_open(self, pid: int, flags: int = 0) -> int:
        if pid in self.open_error:
            raise self.open_error[pid]
        r, w = os.pipe()
        self.w[r] = w
        return r

    def exit(self, fd: int) -> None:
        os.write(self.w[fd], b"x")

    def send(self, fd: int, sig: int, *a: Any) -> None:
        self.signals.append((fd, sig))
        if self.kill_error is not None:
            raise self.kill_error
        if fd in self.w:
            with contextlib.suppress(OSError):
                os.write(self.w[fd], b"x")
        pool = self.pool
        if pool is not None and self.auto_exit:
            for pid, sb in list(pool.by_pid.items()):
                if sb.pidfd == fd:
                    pool.loop.call_soon(pool._exit_code, pid, -9)

    def cleanup(self) -> None:
        for r, w in self.w.items():
            for fd in (r, w):
                with contextlib.suppress(OSError):
                    os.close(fd)


class _Zygote:
    def __init__(self) -> None:
        self.on_exit: Any = None
        self.adopt: Any = None
        self.on_broken: Any = None
        self.attached: list[Any] = []
        self.calls: list[tuple[int, bool, Any]] = []
        self.given: list[list[int]] = []
        self.next_pid = 100
        self.direct = False
        self.fail: list[Any] = []  # per spawn call: None, an exception to raise, or a list
        self.hold: asyncio.Event | None = None  # spawn waits for it
        self.uid = 5000

    def attach(self, loop: Any) -> None:
        self.attached.append(loop)

    def give_ids(self, uids: list[int]) -> None:
        self.given.append(list(uids))

    async def spawn(self, n: int = 1, warm: bool = True, join: Any = None) -> list[Any]:
        self.calls.append((n, warm, join))
        plan = self.fail.pop(0) if self.fail else None
        if isinstance(plan, BaseException):
            raise plan
        if self.hold is not None:
            await self.hold.wait()
        out: list[Any] = []
        for i in range(n):
            if isinstance(plan, list) and plan[i] is not None:
                out.append(plan[i])
                continue
            self.next_pid += 1
            a, b = __import__("socket").socketpair()
            b.close()
            outs = list(os.pipe()) if self.direct else []
            if outs:
                os.close(outs[1])
                outs = [outs[0]]
            out.append(self.adopt(self.next_pid, a, outs, self.uid + self.next_pid))
        return out


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch):
    k = _Kernel()
    monkeypatch.setattr(os, "pidfd_open", k.pidfd_open)
    monkeypatch.setattr(signal, "pidfd_send_signal", k.send)
    monkeypatch.setattr(P, "Conn", _Conn)
    yield k
    k.cleanup()


class _Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t


def _pool(
    kernel: _Kernel,
    *,
    tree: Any = "v2",
    warm_min: int = 0,
    warm_max: int = 8,
    pids_max: int = 77,
    default_cpu: float = 1.5,
    default_mem: int = 256 * MIB,
    self_join: bool = False,
    direct: bool = True,
    zygote: Any = None,
) -> P.WarmPool:
    z = zygote or _Zygote()
    cg = _Tree(tree) if isinstance(tree, str) or tree is None else tree
    if tree is None:
        cg = None
    p = P.WarmPool(
        z,
        cg,
        warm_min=warm_min,
        warm_max=warm_max,
        pids_max=pids_max,
        default_cpu=default_cpu,
        default_mem=default_mem,
        self_join=self_join,
        direct=direct,
    )
    kernel.pool = p
    return p


def _sb(kernel: _Kernel, pid: int = 7, slot: Any = None, **kw: Any) -> P.Sandbox:
    return P.Sandbox(pid=pid, conn=_Conn(), pidfd=kernel.pidfd_open(pid), slot=slot, **kw)


async def _spin(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# --- constants -------------------------------------------------------------------------------


def test_constants() -> None:
    assert P.WARMING_WEIGHT == 0.25
    assert P.MAX_BATCH == 64
    assert P.WARM_RATE_PER_CORE == 100.0
    assert P.KEEP_MEMORY_MIN == 64 * MIB
    assert P.LEFTOVER_MAX == MIB
    assert P._REFILL_DELAY_S == 0.002
    assert P.FILL_PIPELINE == 2


# --- Sandbox ---------------------------------------------------------------------------------


def test_sandbox_defaults(kernel: _Kernel) -> None:
    sb = P.Sandbox(pid=3, conn=_Conn(), pidfd=-1, slot=None)
    assert (sb.cpu, sb.memory, sb.dead, sb.exited, sb.released, sb.watched) == (
        0.0,
        0,
        False,
        False,
        False,
        False,
    )
    assert (sb.weight, sb.outs, sb.uid, sb.exit_rc, sb.kept, sb.maker) == (
        1.0,
        (),
        -1,
        None,
        False,
        None,
    )
    assert isinstance(sb.created, float)


def test_sandbox_running_reads_its_pidfd() -> None:
    # A real process's pidfd: not readable while it runs, readable once it has ended.
    proc = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(proc.pid)
    try:
        sb = P.Sandbox(pid=proc.pid, conn=_Conn(), pidfd=pidfd, slot=None)
        assert sb.running() is True
        proc.kill()
        proc.wait()
        assert sb.running() is False
        sb2 = P.Sandbox(pid=proc.pid, conn=_Conn(), pidfd=-1, slot=None, exited=True)
        assert sb2.running() is False  # (exited: its pidfd is closed, never polled)
    finally:
        os.close(pidfd)


async def test_sandbox_request_passes_message_and_timeout(kernel: _Kernel) -> None:
    sb = _sb(kernel)
    sb.conn.reply = {"ok": 1}
    assert await sb.request({"op": "x"}, 2.5) == {"ok": 1}
    assert await sb.request(b"raw") == {"ok": 1}
    assert sb.conn.requests == [({"op": "x"}, 2.5), (b"raw", None)]


def test_set_limits_writes_only_what_differs(kernel: _Kernel) -> None:
    slot = _Slot(cpu=1.0, memory=100, weight=1.0)
    sb = _sb(kernel, slot=slot)
    sb.set_limits(1.0, 100, 1.0)
    assert slot.writes == []
    assert (sb.cpu, sb.memory, sb.weight) == (1.0, 100, 1.0)
    sb.set_limits(1.0 + 5e-10, 100)
    assert slot.writes == []
    assert sb.cpu == 1.0 + 5e-10
    sb.set_limits(1.0 + 2e-9, 101, 0.25)
    assert slot.writes == [("weight", 0.25), ("cpu", 1.0 + 2e-9), ("memory", 101)]
    assert (sb.cpu, sb.memory, sb.weight) == (1.0 + 2e-9, 101, 0.25)
    slot.writes.clear()
    sb.set_limits(0.5, 101, 0.25)  # lower
    assert slot.writes == [("cpu", 0.5)]


def test_set_limits_without_slot_changes_nothing(kernel: _Kernel) -> None:
    sb = _sb(kernel)
    sb.set_limits(2.0, 5, 0.5)
    assert (sb.cpu, sb.memory, sb.weight) == (0.0, 0, 1.0)


def test_kill_signals_once_and_closes(kernel: _Kernel) -> None:
    sb = _sb(kernel)
    sb.kill()
    assert kernel.signals == [(sb.pidfd, signal.SIGKILL)]
    assert sb.dead is True and sb.conn.closed == 1
    sb.kill()
    assert kernel.signals == [(sb.pidfd, signal.SIGKILL)] and sb.conn.closed == 1


def test_kill_of_exited_sends_no_signal_and_swallows_oserror(kernel: _Kernel) -> None:
    sb = _sb(kernel, exited=True)
    sb.kill()
    assert kernel.signals == [] and sb.dead and sb.conn.closed == 1
    kernel.kill_error = ProcessLookupError()
    sb2 = _sb(kernel)
    sb2.kill()
    assert sb2.dead and sb2.conn.closed == 1 and len(kernel.signals) == 1


# --- construction, hooks ---------------------------------------------------------------------


async def test_init_values(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(
        kernel, zygote=z, warm_min=2, warm_max=9, pids_max=33, default_cpu=0.5, default_mem=123
    )
    assert (p.warm_min, p.warm_max, p.pids_max, p.default_cpu, p.default_mem) == (
        2,
        9,
        33,
        0.5,
        123,
    )
    assert p.self_join is False and p.direct is True
    assert list(p.ready) == [] and p.free_slots == [] and p.sched_target is None
    assert p.arrivals.maxlen == 4096 and p.live == set() and p.closed is False
    assert p._kick is None and p._filler is None and p._cold == [] and p._cold_task is None
    assert list(p._takers) == [] and p._filling == 0 and p._backoff is False
    assert p.spawn_s == 0.005
    assert p.warm_rate_max == 100.0 * (os.cpu_count() or 1)
    assert p.by_pid == {} and p.up.is_set() and p.down is None and p.on_broken is None
    assert p.orphan_ids == set()
    assert p.loop is asyncio.get_running_loop()
    assert not p._wake.is_set()
    assert z.on_exit == p._exit_code and z.adopt == p._adopt and z.on_broken == p._zygote_broken
    assert z.attached == [p.loop] and p.zygote is z
    assert p._cg_thread._max_workers == 1
    assert p._cg_thread._thread_name_prefix == "tangram-cgroup"
    p._cg_thread.shutdown()


async def test_self_join_only_on_v1(kernel: _Kernel) -> None:
    assert _pool(kernel, tree="v1", self_join=True).self_join is True
    assert _pool(kernel, tree="v2", self_join=True).self_join is False
    assert _pool(kernel, tree=None, self_join=True).self_join is False
    assert _pool(kernel, tree="v1", self_join=False).self_join is False
    assert _pool(kernel, direct=False).direct is False


async def test_attach_zygote_rewires(kernel: _Kernel) -> None:
    p = _pool(kernel)
    z2 = _Zygote()
    p.attach_zygote(z2)
    assert p.zygote is z2 and z2.attached == [p.loop]
    assert z2.on_exit == p._exit_code and z2.adopt == p._adopt
    assert z2.on_broken == p._zygote_broken


async def test_wait_up(kernel: _Kernel) -> None:
    p = _pool(kernel)
    await p.wait_up()
    p.down = "gone for good"
    with pytest.raises(BrokenError, match=r"^gone for good$"):
        await p.wait_up()
    p.closed = True
    with pytest.raises(ClosedError, match=r"^the CPU manager is closed$"):
        await p.wait_up()
    p.up.clear()
    p.closed, p.down = False, None
    t = asyncio.ensure_future(p.wait_up())
    await _spin()
    assert not t.done()
    p.up.set()
    await t


async def test_zygote_broken(kernel: _Kernel) -> None:
    p = _pool(kernel)
    calls: list[int] = []
    p.on_broken = lambda: calls.append(1)
    kept = _sb(kernel, pid=1, kept=True, uid=11)
    kept_gone = _sb(kernel, pid=2, kept=True, uid=12, exited=True)
    kept_noid = _sb(kernel, pid=3, kept=True, uid=-1)
    kept_zero = _sb(kernel, pid=4, kept=True, uid=0)
    plain = _sb(kernel, pid=5, uid=13)
    direct = _sb(kernel, pid=6, uid=14)
    p.by_pid[6] = direct
    ready = _sb(kernel, pid=8)
    p.live |= {kept, kept_gone, kept_noid, kept_zero, plain, direct, ready}
    p.ready.append(ready)
    p._zygote_broken()
    assert not p.up.is_set()
    assert p.orphan_ids == {11, 0}
    assert direct.watched is True and p.by_pid == {}
    assert list(p.ready) == [] and ready.dead and ready.released
    assert calls == [1]
    p.loop.remove_reader(direct.pidfd)


async def test_zygote_broken_when_closed_keeps_up(kernel: _Kernel) -> None:
    p = _pool(kernel)
    p.closed = True
    p._zygote_broken()
    assert p.up.is_set()


async def test_watch_all_skips_exited_and_watched(kernel: _Kernel) -> None:
    p = _pool(kernel)
    a, b, c = _sb(kernel, pid=1), _sb(kernel, pid=2, exited=True), _sb(kernel, pid=3)
    c.watched = True
    p.by_pid.update({1: a, 2: b, 3: c})
    seen: list[Any] = []
    orig = p._watch
    p._watch = lambda sb: (seen.append(sb), orig(sb))  # type: ignore[method-assign]
    p._watch_all()
    assert seen == [a] and p.by_pid == {}
    p.loop.remove_reader(a.pidfd)


# --- rate and target -------------------------------------------------------------------------


async def test_rate_window_is_two_seconds(kernel: _Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(100.0)
    monkeypatch.setattr(P, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    p = _pool(kernel)
    p.arrivals.extend([97.0, 97.999, 98.0, 99.0, 99.5, 100.0])
    assert p.rate() == 2.0  # 98.0 .. 100.0: 4 in 2 s
    assert list(p.arrivals) == [98.0, 99.0, 99.5, 100.0]
    p.arrivals.clear()
    assert p.rate() == 0.0
    p.arrivals.append(100.0)
    assert p.rate() == 0.5


async def test_target(kernel: _Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _pool(kernel, warm_min=1, warm_max=20)
    rates = iter([0.0])
    monkeypatch.setattr(p, "rate", lambda: next(rates))
    assert p.target() == 1
    # ceil(rate * max(spawn_s, 0.002) * 4)
    for rate, spawn_s, want in [
        (100.0, 0.01, 4),
        (101.0, 0.01, 5),
        (100.0, 0.001, 1),
        (1000.0, 0.001, 8),
        (1000.0, 0.0021, 9),
        (0.0, 0.01, 1),
        (1000.0, 0.01, 20),
        (499.0, 0.005, 10),
    ]:
        rates = iter([rate])
        p.spawn_s = spawn_s
        assert p.target() == want, (rate, spawn_s)
    p.sched_target = 3
    rates = iter([1000.0])
    assert p.target() == 3  # the scheduler's target replaces the demand
    p.sched_target = 0
    rates = iter([1000.0])
    assert p.target() == 1  # at least warm_min
    p.sched_target = 50
    rates = iter([0.0])
    assert p.target() == 20  # at most warm_max


# --- slots -----------------------------------------------------------------------------------


async def test_place_limits_and_move(kernel: _Kernel) -> None:
    p = _pool(kernel, pids_max=77, default_cpu=1.5, default_mem=256 * MIB)
    new, roomy, small, same = (
        _Slot(),
        _Slot(memory=64 * MIB, pids=77, cpu=1.5, weight=0.25),
        _Slot(memory=64 * MIB - 1),
        _Slot(pids=77),
    )
    sbs = [_sb(kernel, pid=i, slot=s) for i, s in enumerate([new, roomy, small, same], 1)]
    assert p._place(sbs) == []
    assert new.writes == [
        ("pids", 77),
        ("weight", 0.25),
        ("cpu", 1.5),
        ("memory", 256 * MIB),
        ("reset", None),
        ("add", 1),
    ]
    assert roomy.writes == [("reset", None), ("add", 2)]
    assert sbs[1].memory == 64 * MIB and sbs[1].cpu == 1.5 and sbs[1].weight == 0.25
    assert small.writes[0] == ("pids", 77)
    assert ("memory", 256 * MIB) in small.writes
    assert ("pids", 77) not in same.writes


async def test_place_direct_cold_gets_full_weight(kernel: _Kernel) -> None:
    p = _pool(kernel)
    a, b, c = _Slot(), _Slot(), _Slot()
    sa = _sb(kernel, pid=1, slot=a, outs=(5,))
    sb_ = _sb(kernel, pid=2, slot=b, outs=(6,))
    sc = _sb(kernel, pid=3, slot=c)
    assert p._place([sa], warm=False) == []
    assert p._place([sb_], warm=True) == []
    assert p._place([sc], warm=False) == []
    assert ("weight", 1.0) in a.writes
    assert ("weight", 0.25) in b.writes
    assert ("weight", 0.25) in c.writes


async def test_place_collects_errors_and_goes_on(kernel: _Kernel) -> None:
    p = _pool(kernel)
    a, b, c = _Slot(), _Slot(), _Slot()
    a.fail_on = "add"
    c.fail_on = "pids"
    errs = p._place([_sb(kernel, 1, a), _sb(kernel, 2, b), _sb(kernel, 3, c), _sb(kernel, 4)])
    assert [i for i, _ in errs] == [0, 2, 3]
    assert str(errs[0][1]) == "cannot add" and str(errs[1][1]) == "cannot pids"
    assert isinstance(errs[2][1], AssertionError)
    assert b.added == [2]


async def test_ready_slot(kernel: _Kernel) -> None:
    p = _pool(kernel, pids_max=9, default_cpu=2.0, default_mem=300 * MIB)
    s = _Slot()
    p._ready_slot(s, 0.25)
    assert s.writes == [
        ("pids", 9),
        ("weight", 0.25),
        ("cpu", 2.0),
        ("memory", 300 * MIB),
        ("reset", None),
    ]
    s.writes.clear()
    p._ready_slot(s, 0.25)
    assert s.writes == [("reset", None)]
    s2 = _Slot(pids=9, weight=1.0, cpu=2.0 + 5e-10, memory=64 * MIB)
    p._ready_slot(s2, 1.0)
    assert s2.writes == [("reset", None)]
    s3 = _Slot(pids=9, weight=1.0, cpu=2.0 + 2e-9, memory=64 * MIB - 1)
    p._ready_slot(s3, 1.0)
    assert s3.writes == [("cpu", 2.0), ("memory", 300 * MIB), ("reset", None)]


async def test_free_keeps_or_retires(kernel: _Kernel) -> None:
    p = _pool(kernel)
    ok, edge, big, sticky, bad, bad2 = _Slot(), _Slot(), _Slot(), _Slot(), _Slot(), _Slot()
    edge.charged = MIB
    big.charged = MIB + 1
    sticky.peak_sticky = True
    bad.charged_error = OSError("x")
    bad2.charged_error = ValueError("x")
    for s in (ok, edge, big, sticky, bad, bad2):
        p._free(s)
    assert p.free_slots == [ok, edge]
    assert [s.removed for s in (ok, edge, big, sticky, bad, bad2)] == [0, 0, 1, 1, 1, 1]


async def test_put_back_empty_at_once_else_recycled(kernel: _Kernel) -> None:
    p = _pool(kernel)
    a = _Slot()
    p._put_back(a)
    assert p.free_slots == [a] and not p._tasks
    b = _Slot()
    b.empty = [False, False, True]
    p._put_back(b)
    assert len(p._tasks) == 1 and p.free_slots == [a]
    await asyncio.sleep(0.02)
    assert p.free_slots == [a, b] and not p._tasks and b.empty == []
    c = _Slot()
    c.empty = [OSError("gone")]
    p._put_back(c)
    assert len(p._tasks) == 1
    await asyncio.sleep(0.01)
    assert p.free_slots == [a, b, c] and not p._tasks


async def test_recycle_polls_fast_then_slow_then_gives_up(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pool(kernel)
    sleeps: list[float] = []
    me, real_sleep = asyncio.current_task(), asyncio.sleep

    async def fake_sleep(s: float) -> None:
        # (asyncio.sleep is the module's, shared: other tasks of the loop sleep for real, uncounted)
        if asyncio.current_task() is me:
            sleeps.append(s)
        else:
            await real_sleep(s)

    monkeypatch.setattr(P.asyncio, "sleep", fake_sleep)
    s = _Slot()
    s.empty = [False] * 3000
    await p._recycle(s)
    assert len(sleeps) == 2000
    assert sleeps[:50] == [0.001] * 50 and sleeps[50:] == [0.01] * 1950
    assert s.removed == 1 and p.free_slots == []
    sleeps.clear()
    s2 = _Slot()
    s2.empty = [False] * 1999 + [True]
    await p._recycle(s2)
    assert p.free_slots == [s2] and s2.removed == 0 and len(sleeps) == 1999
    s3 = _Slot()
    s3.empty = [False, OSError("gone")]
    await p._recycle(s3)
    assert s3.removed == 0 and p.free_slots == [s2]
    s4 = _Slot()
    s4.empty = [False] * 2000
    s4.remove = lambda: (_ for _ in ()).throw(OSError("busy"))  # type: ignore[method-assign]
    await p._recycle(s4)  # swallowed


# --- adopt, exits ----------------------------------------------------------------------------


async def test_adopt_plain_is_watched(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    import socket

    a, b = socket.socketpair()
    sb = p._adopt(42, a, [], 901)
    assert isinstance(sb, P.Sandbox)
    assert (sb.pid, sb.uid, sb.slot, sb.maker, sb.outs, sb.exit_rc) == (42, 901, None, z, (), None)
    assert sb.conn.sock is a and sb.watched is True and sb in p.live and p.by_pid == {}
    kernel.exit(sb.pidfd)
    await _spin()
    assert sb.exited is True and sb.watched is False
    b.close()
    a.close()


async def test_adopt_direct_waits_for_exit_report(kernel: _Kernel) -> None:
    p = _pool(kernel)
    import socket

    a, b = socket.socketpair()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    sb = p._adopt(43, a, [r1, r2], 7)
    assert isinstance(sb, P.Sandbox)
    assert sb.outs == (r1, r2) and p.by_pid == {43: sb} and sb.watched is False
    assert os.get_blocking(r1) is False and os.get_blocking(r2) is False
    assert isinstance(sb.exit_rc, asyncio.Future) and not sb.exit_rc.done()
    p._exit_code(43, 3)
    assert sb.exit_rc.result() == 3 and sb.exited and p.by_pid == {}
    p._exit_code(43, 4)  # unknown now: nothing
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    b.close()


async def test_adopt_failure_closes_everything(kernel: _Kernel) -> None:
    p = _pool(kernel)
    import socket

    a, b = socket.socketpair()
    r1, w1 = os.pipe()
    kernel.open_error[44] = ProcessLookupError("no such process")
    got = p._adopt(44, a, [r1], 7)
    assert isinstance(got, ProcessLookupError)
    assert a.fileno() == -1
    with pytest.raises(OSError):
        os.fstat(r1)
    assert p.live == set()
    os.close(w1)
    b.close()


async def test_exited_sets_minus_nine_and_frees_orphan_id(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    sb = _sb(kernel, pid=9, uid=55)
    sb.exit_rc = p.loop.create_future()
    p.orphan_ids = {55, 56}
    p._watch(sb)
    p._exited(sb)
    assert sb.exit_rc.result() == -9 and sb.exited and not sb.watched
    assert p.orphan_ids == {56} and z.given == [[55]]
    with pytest.raises(OSError):
        os.fstat(sb.pidfd)
    sb2 = _sb(kernel, pid=10, uid=57)
    sb2.exit_rc = p.loop.create_future()
    sb2.exit_rc.set_result(0)
    p._exited(sb2)
    assert sb2.exit_rc.result() == 0 and z.given == [[55]]


async def test_exit_code_of_already_exited(kernel: _Kernel) -> None:
    p = _pool(kernel)
    sb = _sb(kernel, pid=9, exited=True)
    p.by_pid[9] = sb
    p._exit_code(9, 1)  # no exit_rc, already exited: nothing more (its pidfd not closed again)
    os.fstat(sb.pidfd)


async def test_recycle_needs_exited_and_released_and_live(kernel: _Kernel) -> None:
    p = _pool(kernel)
    s = _Slot()
    sb = _sb(kernel, slot=s)
    p.live.add(sb)
    sb.exited = True
    p._maybe_recycle(sb)
    assert sb in p.live and p.free_slots == []
    sb.exited, sb.released = False, True
    p._maybe_recycle(sb)
    assert sb in p.live and p.free_slots == []
    sb.exited = True
    p._maybe_recycle(sb)
    assert sb not in p.live and p.free_slots == [s]
    p._maybe_recycle(sb)  # not live any more: nothing twice
    assert p.free_slots == [s]
    sb2 = _sb(kernel)
    sb2.exited = sb2.released = True
    p.live.add(sb2)
    p._maybe_recycle(sb2)
    assert sb2 not in p.live


# --- release ---------------------------------------------------------------------------------


async def test_release_kills_closes_outs_and_kicks_once(kernel: _Kernel) -> None:
    p = _pool(kernel)
    r, w = os.pipe()
    sb = _sb(kernel, outs=(r, 12345))
    p.release(sb)
    assert sb.dead and sb.released and sb.outs == ()
    with pytest.raises(OSError):
        os.fstat(r)
    assert p._kick is not None
    assert abs(p._kick.when() - p.loop.time() - 0.002) < 0.002
    kick = p._kick
    p.release(_sb(kernel))
    assert p._kick is kick
    assert not p._wake.is_set()
    await asyncio.sleep(0.01)
    assert p._kick is None and p._wake.is_set()
    os.close(w)


async def test_release_when_closed_does_not_kick(kernel: _Kernel) -> None:
    p = _pool(kernel)
    p.closed = True
    p.release(_sb(kernel))
    assert p._kick is None
    p.closed = False
    p.release(_sb(kernel))
    p.closed = True
    await asyncio.sleep(0.01)
    assert p._kick is None and not p._wake.is_set()


# --- deficit ---------------------------------------------------------------------------------


async def test_deficit(kernel: _Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _pool(kernel)
    tgt = [8]
    monkeypatch.setattr(p, "target", lambda: tgt[0])
    for ready, filling, takers, target, want in [
        (0, 0, 0, 8, 8),
        (4, 0, 0, 8, 4),
        (5, 0, 0, 8, 0),
        (4, 1, 0, 8, 0),
        (4, 1, 1, 8, 4),
        (8, 0, 0, 8, 0),
        (9, 0, 0, 8, 0),
        (1, 0, 0, 2, 1),
        (2, 0, 0, 3, 0),
        (0, 0, 0, 0, 0),
        (9, 0, 0, 16, 7),
        (12, 0, 0, 16, 4),
        (13, 0, 0, 16, 0),
        (6, 0, 0, 10, 4),
        (7, 0, 0, 10, 0),
        (3, 0, 0, 5, 0),
        (2, 0, 0, 5, 3),
    ]:
        p.ready = __import__("collections").deque([object()] * ready)  # type: ignore[misc]
        p._filling = filling
        p._takers = __import__("collections").deque([object()] * takers)  # type: ignore[misc]
        tgt[0] = target
        assert p._deficit() == want, (ready, filling, takers, target)
    p.ready.clear()
    p._takers.clear()
    p._filling = 0
    p.up.clear()
    tgt[0] = 8
    assert p._deficit() == 0


# --- spawning --------------------------------------------------------------------------------


async def test_spawn_placed_moves_into_slots(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, pids_max=5)
    reused = _Slot(memory=128 * MIB)
    p.free_slots.append(reused)
    got = await p.spawn_many(2, prepare=False, warm=True)
    assert z.calls == [(2, True, None)]
    assert [sb.slot for sb in got] == [reused, p.cgroups.slots[0]]
    assert reused.added == [got[0].pid] and p.cgroups.slots[0].added == [got[1].pid]
    assert got[0].memory == 128 * MIB and got[1].memory == 256 * MIB
    assert p.free_slots == []


async def test_spawn_placed_failed_move_releases(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    bad = _Slot()
    bad.fail_on = "add"
    p.free_slots.append(bad)
    err = RuntimeError("no fork")
    z.fail = [[None, err, None]]
    got = await p.spawn_many(3, prepare=False)
    assert isinstance(got[0], OSError) and str(got[0]) == "cannot add"
    assert got[1] is err and isinstance(got[2], P.Sandbox)
    assert len(p.cgroups.slots) == 1


async def test_spawn_placed_without_cgroups(kernel: _Kernel) -> None:
    for tree in (None, _Tree(None)):
        z = _Zygote()
        p = _pool(kernel, zygote=z, tree=tree)
        got = await p.spawn_many(1, prepare=False)
        assert got[0].slot is None


async def test_spawn_many_prepare_and_estimate(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock(10.0)
    monkeypatch.setattr(P, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    z = _Zygote()
    p = _pool(kernel, zygote=z)

    orig = z.spawn

    async def slow_spawn(n: int, warm: bool = True, join: Any = None) -> list[Any]:
        clock.t += 0.105
        return await orig(n, warm, join)

    z.spawn = slow_spawn  # type: ignore[method-assign]
    got = await p.spawn_many(3, prepare=True)
    assert all(isinstance(sb, P.Sandbox) for sb in got)
    assert [sb.conn.requests for sb in got] == [[({"op": "prepare"}, 30.0)]] * 3
    assert p.spawn_s == pytest.approx(0.8 * 0.005 + 0.2 * 0.105)
    # failures: no sandbox, the estimate stays
    z.fail = [[RuntimeError("x")]]
    before = p.spawn_s
    got = await p.spawn_many(1, prepare=False)
    assert isinstance(got[0], RuntimeError) and p.spawn_s == before


async def test_spawn_many_prepare_failures(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    monkeypatch.setattr(P, "Conn", _Conn)
    orig = p._adopt
    replies = iter([{"ok": True}, {"ok": False, "error": "e"}, EOFError("eof"), {}])

    def adopt(*a: Any) -> Any:
        sb = orig(*a)
        sb.conn.reply = next(replies)
        return sb

    z.adopt = adopt
    got = await p.spawn_many(4, prepare=True)
    assert isinstance(got[0], P.Sandbox)
    assert [type(x) for x in got[1:]] == [BrokenError] * 3
    assert str(got[1]) == "sandbox setup failed: {'ok': False, 'error': 'e'}"
    assert str(got[2]) == "sandbox setup failed: eof"
    assert str(got[3]) == "sandbox setup failed: {}"
    dead = [sb for sb in p.live if sb is not got[0]]
    assert all(sb.released for sb in dead) and len(dead) == 3


async def test_spawn_many_prepare_skips_direct(kernel: _Kernel) -> None:
    z = _Zygote()
    z.direct = True
    p = _pool(kernel, zygote=z)
    got = await p.spawn_many(2, prepare=True)
    assert [sb.conn.requests for sb in got] == [[], []]
    for sb in got:
        assert sb.outs and sb.exit_rc is not None


async def test_spawn_joined(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(
        kernel,
        zygote=z,
        tree="v1",
        self_join=True,
        pids_max=4,
        default_cpu=1.0,
        default_mem=100 * MIB,
    )
    reused = _Slot("reused", memory=80 * MIB, weight=0.25, cpu=1.0, pids=4)
    p.free_slots.append(reused)
    err = RuntimeError("no")
    z.fail = [[None, err]]
    got = await p.spawn_many(2, prepare=False, warm=True)
    new = p.cgroups.slots[0]
    assert z.calls == [(2, True, ["reused", new.name])]
    assert got[0].slot is reused and got[1] is err
    assert (got[0].cpu, got[0].memory, got[0].weight) == (1.0, 80 * MIB, 0.25)
    assert reused.writes == [("reset", None)]
    assert new.writes == [
        ("pids", 4),
        ("weight", 0.25),
        ("cpu", 1.0),
        ("memory", 100 * MIB),
        ("reset", None),
    ]
    assert p.free_slots == [new]  # its sandbox did not come: back (empty)
    assert reused.added == []  # the init moves itself


async def test_spawn_joined_weights(kernel: _Kernel) -> None:
    for direct, warm, want in [(True, False, 1.0), (True, True, 0.25), (False, False, 0.25)]:
        z = _Zygote()
        p = _pool(kernel, zygote=z, tree="v1", self_join=True, direct=direct)
        got = await p.spawn_many(1, prepare=False, warm=warm)
        assert got[0].weight == want and got[0].slot.weight == want
        assert z.calls[0][1] is warm


async def test_spawn_joined_slot_error(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree="v1", self_join=True)
    good, bad = _Slot("g"), _Slot("b")
    bad.fail_on = "pids"
    p.free_slots[:] = [bad, good]  # pop: good first, then bad
    got = await p.spawn_many(3, prepare=False)
    assert z.calls == []
    assert len(got) == 3 and all(isinstance(e, OSError) and str(e) == "cannot pids" for e in got)
    assert got[0] is got[1] is got[2]
    assert sorted(s.name for s in p.free_slots) == ["b", "g"]


async def test_spawn_joined_cancelled_frees_empty_slots(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree="v1", self_join=True)
    t = asyncio.ensure_future(p.spawn_many(3, prepare=False))
    await _spin()
    a, b, c = p.cgroups.slots
    b.empty = [False]
    c.empty = [OSError("x")]
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert p.free_slots == [a]


async def test_spawn_cold_groups(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    ts = [asyncio.ensure_future(p.spawn()) for _ in range(3)]
    got = await asyncio.gather(*ts)
    assert z.calls == [(3, False, None)]  # asked for together: one request
    assert len({sb.pid for sb in got}) == 3


async def test_spawn_cold_batches_of_64(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None)
    first = asyncio.ensure_future(p.spawn())
    await _spin()
    ts = [asyncio.ensure_future(p.spawn()) for _ in range(70)]
    await _spin()
    z.hold.set()
    await asyncio.gather(first, *ts)
    assert [c[0] for c in z.calls] == [1, 64, 6]


async def test_spawn_cold_skips_cancelled_and_releases_unclaimed(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None)
    first = asyncio.ensure_future(p.spawn())
    await _spin()
    a = asyncio.ensure_future(p.spawn())
    b = asyncio.ensure_future(p.spawn())
    await _spin()
    a.cancel()
    await _spin()
    z.hold.set()
    await first
    await b
    assert [c[0] for c in z.calls] == [1, 1]
    # a taker that goes away while its spawn is in flight: the sandbox is released
    z.hold = asyncio.Event()
    c = asyncio.ensure_future(p.spawn())
    await _spin()
    c.cancel()
    await _spin()
    z.hold.set()
    await _spin(10)
    made = max(p.live | {sb for sb in []}, key=lambda s: s.pid, default=None)
    assert z.calls[-1][0] == 1
    assert made is None or made.released or made.pid != z.next_pid


async def test_spawn_cold_error_goes_to_each(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None)
    first = asyncio.ensure_future(p.spawn())
    await _spin()
    ts = [asyncio.ensure_future(p.spawn()) for _ in range(2)]
    await _spin()
    z.fail = [RuntimeError("fork server gone")]
    z.hold.set()
    await first
    for t in ts:
        with pytest.raises(RuntimeError, match=r"^fork server gone$"):
            await t
    assert p._cold == []


async def test_spawn_returned_error_is_raised(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    e = BrokenError("spawn failed")
    z.fail = [[e], [e]]
    with pytest.raises(BrokenError, match=r"^spawn failed$"):
        await p.spawn()
    with pytest.raises(BrokenError, match=r"^spawn failed$"):
        await p.spawn(prepare=True)
    assert z.calls == [(1, False, None), (1, True, None)]


async def test_spawn_prepare_goes_alone(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    sb = await p.spawn(prepare=True)
    assert sb.conn.requests == [({"op": "prepare"}, 30.0)]
    assert z.calls == [(1, True, None)] and p._cold_task is None


async def test_spawn_waits_for_the_fork_server(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p.up.clear()
    t = asyncio.ensure_future(p.spawn())
    await _spin()
    assert z.calls == []
    p.up.set()
    await t
    assert z.calls == [(1, False, None)]


# --- take and refills ------------------------------------------------------------------------


async def test_take_closed(kernel: _Kernel) -> None:
    p = _pool(kernel)
    p.closed = True
    with pytest.raises(ClosedError, match=r"^the CPU manager is closed$"):
        await p.take()
    assert list(p.arrivals) == []


async def test_take_from_ready_skips_dead_and_wakes(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock(50.0)
    monkeypatch.setattr(P, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    z = _Zygote()
    p = _pool(kernel, zygote=z, warm_min=4)
    dead, a, b = _sb(kernel, 1, dead=True), _sb(kernel, 2), _sb(kernel, 3)
    p.ready.extend([dead, a, b])
    assert await p.take() is a
    assert list(p.arrivals) == [50.0] and not p._wake.is_set()  # 2 * 3 > 4
    assert list(p.ready) == [b]


async def test_take_wake_threshold(kernel: _Kernel) -> None:
    p = _pool(kernel, warm_min=4, warm_max=4)
    p.ready.extend([_sb(kernel, i) for i in range(3)])
    await p.take()  # 2 * 3 > 4: no wake (refilled after the action)
    assert not p._wake.is_set()
    await p.take()  # 2 * 2 <= 4: wake
    assert p._wake.is_set()


async def test_take_cold_when_empty(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    sb = await p.take()
    assert isinstance(sb, P.Sandbox) and z.calls == [(1, False, None)]


async def test_take_waits_for_refill_in_flight(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p._filling = 1
    t = asyncio.ensure_future(p.take())
    await _spin()
    assert len(p._takers) == 1 and not t.done()
    sb = _sb(kernel, 3)
    p._filling = 0
    p._hand_out([sb])
    assert await t is sb
    assert z.calls == []


async def test_take_after_short_refill_spawns(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p._filling = 2
    t1 = asyncio.ensure_future(p.take())
    t2 = asyncio.ensure_future(p.take())
    await _spin()
    assert len(p._takers) == 2
    p._filling = 0
    p._hand_out([])
    a, b = await t1, await t2
    assert isinstance(a, P.Sandbox) and isinstance(b, P.Sandbox)
    assert sum(c[0] for c in z.calls) == 2


async def test_take_no_wait_when_takers_cover_the_batch(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p._filling = 1
    p._takers.append(p.loop.create_future())
    sb = await p.take()
    assert isinstance(sb, P.Sandbox) and len(p._takers) == 1


async def test_take_closed_while_waiting_for_refill(kernel: _Kernel) -> None:
    p = _pool(kernel)
    p._filling = 1
    t = asyncio.ensure_future(p.take())
    await _spin()
    p.closed = True
    p._filling = 0
    p._hand_out([])
    with pytest.raises(ClosedError, match=r"^the CPU manager is closed$"):
        await t


async def test_wait_for_refill_cancelled_keeps_handed_sandbox(kernel: _Kernel) -> None:
    p = _pool(kernel)
    t = asyncio.ensure_future(p._wait_for_refill())
    await _spin()
    fut = p._takers[0]
    sb = _sb(kernel, 1)
    fut.set_result(sb)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert list(p.ready) == [sb]
    t2 = asyncio.ensure_future(p._wait_for_refill())
    await _spin()
    p._takers[-1].set_result(None)
    t2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t2
    assert list(p.ready) == [sb]
    t3 = asyncio.ensure_future(p._wait_for_refill())
    await _spin()
    t3.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t3
    assert list(p.ready) == [sb]


async def test_hand_out(kernel: _Kernel) -> None:
    p = _pool(kernel)
    f1, f2, f3 = (p.loop.create_future() for _ in range(3))
    f1.cancel()
    p._takers.extend([f1, f2, f3])
    a, b, c = _sb(kernel, 1), _sb(kernel, 2), _sb(kernel, 3)
    p._filling = 1
    p._hand_out([a])
    assert f2.result() is a and list(p._takers) == [f3] and not f3.done()
    p._filling = 0
    p._hand_out([b, c])
    assert f3.result() is b and list(p.ready) == [c]
    f4, f5 = p.loop.create_future(), p.loop.create_future()
    f5.cancel()
    p._takers.extend([f4, f5])
    p._hand_out([])
    assert f4.result() is None and list(p._takers) == []
    f6 = p.loop.create_future()
    p._takers.append(f6)
    p._filling = 2
    p._hand_out([])
    assert not f6.done() and list(p._takers) == [f6]


async def test_refill_hands_out_and_backs_off(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p._filling = 2
    await p._refill(2, True)
    assert p._filling == 0 and len(p.ready) == 2 and z.calls == [(2, True, None)]
    assert p._wake.is_set() and p._backoff is False
    p._wake.clear()
    sleeps: list[float] = []
    real_sleep, me = asyncio.sleep, asyncio.current_task()

    async def fake_sleep(s: float) -> None:
        if asyncio.current_task() is not me:  # (the module's asyncio is shared: others sleep)
            await real_sleep(s)
            return
        sleeps.append(s)
        assert p._backoff is True
        await real_sleep(0)

    monkeypatch.setattr(P.asyncio, "sleep", fake_sleep)
    z.fail = [[None, RuntimeError("x")]]
    p._filling = 2
    await p._refill(2, False)
    assert sleeps == [0.05] and p._backoff is False and p._wake.is_set()
    assert p._filling == 0 and len(p.ready) == 3 and z.calls[-1] == (2, False, None)
    z.fail = [RuntimeError("gone")]
    p._filling = 1
    await p._refill(1, True)
    assert sleeps == [0.05, 0.05] and p._filling == 0 and len(p.ready) == 3


async def test_fill_loop_fills_to_target_then_trims(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None, warm_min=3, warm_max=20)
    p.start()
    await asyncio.sleep(0.02)
    assert len(p.ready) == 3 and z.calls == [(3, False, None)]  # drained: not warmed
    p.warm_min = 10
    p._wake.set()
    await asyncio.sleep(0.02)
    assert len(p.ready) == 10 and z.calls[1] == (7, False, None)  # 2 * 3 < 7
    p.warm_min = 19
    p._wake.set()
    await asyncio.sleep(0.02)
    # at most 8 (2 * 10 >= 8: warmed); then 1 missing of 19 with 18 ready: not worth a batch
    assert len(p.ready) == 18 and z.calls[2:] == [(8, True, None)]
    p.warm_min = 2
    p._wake.set()
    await asyncio.sleep(0.02)
    assert len(p.ready) == 2
    await p.aclose()
    assert p._filler.done()


async def test_fill_loop_does_not_warm_past_the_rate(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None, warm_min=2, warm_max=20)
    p.ready.extend([_sb(kernel, i) for i in range(1)])
    p.warm_rate_max = 0.0
    p.start()
    await asyncio.sleep(0.02)
    assert z.calls == [(1, False, None)]
    await p.aclose()


async def test_fill_loop_pipeline_of_two(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None, warm_min=20, warm_max=20)
    p.start()
    await asyncio.sleep(0.01)
    assert z.calls == [(8, False, None), (8, False, None)] and p._filling == 16
    z.hold.set()
    await asyncio.sleep(0.02)
    # (the batches' wake comes before they leave the pipeline: the next look is the 0.5 s one)
    assert [c[0] for c in z.calls] == [8, 8]
    await asyncio.sleep(0.6)
    assert [c[0] for c in z.calls] == [8, 8, 4]
    await p.aclose()


async def test_fill_loop_waits_while_backing_off(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None, warm_min=2, warm_max=2)
    p._backoff = True
    p.start()
    await asyncio.sleep(0.01)
    assert z.calls == []
    p._backoff = False
    p._wake.set()
    await asyncio.sleep(0.01)
    assert z.calls == [(2, False, None)]
    await p.aclose()


async def test_fill_loop_times_out_its_wait(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None, warm_min=0, warm_max=4)
    p.start()
    await asyncio.sleep(0.01)
    assert z.calls == []
    p.warm_min = 1  # no wake: the loop looks again within 0.5 s
    await asyncio.sleep(0.6)
    assert z.calls == [(1, False, None)]
    await p.aclose()


async def test_fill_loop_close_cancels_batches(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None, warm_min=2, warm_max=2)
    p.start()
    await asyncio.sleep(0.01)
    assert z.calls == [(2, False, None)]
    await p.aclose()
    assert p._filling == 0 and p._filler.done()


# --- close -----------------------------------------------------------------------------------


async def test_aclose(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    sb = await p.spawn_many(1, prepare=False)
    sb = sb[0]
    ready = (await p.spawn_many(1, prepare=False))[0]
    p.ready.append(ready)
    free = _Slot()
    p.free_slots.append(free)
    p.release(_sb(kernel, 99))
    assert p._kick is not None
    p.up.clear()
    taker = p.loop.create_future()
    p._takers.append(taker)
    cold = p.loop.create_future()
    p._cold.append(cold)
    await p.aclose()
    assert p.closed and p.up.is_set() and p._kick is None and p._wake.is_set()
    assert taker.result() is None and cold.cancelled()
    assert sb.released and ready.released and list(p.ready) == [] and p.live == set()
    assert free.removed == 1
    assert sorted(p.free_slots, key=id) == []
    assert sb.slot.removed == 1 and sb.slot.closed == 0  # recycled, then removed


async def test_aclose_closes_slots_still_dying(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z)
    sb = (await p.spawn_many(1, prepare=False))[0]
    kernel.kill_error = OSError("x")  # the kill lands nowhere: it never exits
    real_sleep = asyncio.sleep
    sleeps: list[float] = []

    async def fast_sleep(s: float) -> None:
        # (the pool's own sleeps only: `asyncio.sleep` is global, and other tests' tasks left
        # on a shared loop sleep through it too)
        if sys._getframe(1).f_code.co_filename == P.__file__:
            sleeps.append(s)
        await real_sleep(0)

    monkeypatch.setattr(P.asyncio, "sleep", fast_sleep)
    await p.aclose()
    assert sleeps == [0.01] * 300
    assert sb.slot.closed == 1 and sb in p.live


async def test_aclose_waits_for_recycling(kernel: _Kernel) -> None:
    p = _pool(kernel)
    s = _Slot()
    s.empty = [False, False]
    p._put_back(s)
    await p.aclose()
    assert not p._tasks and s.removed == 1  # freed by the recycle, then removed by the close


# --- edges found by mutation testing ---------------------------------------------------------


def test_set_limits_cpu_edge_is_strict(kernel: _Kernel) -> None:
    slot = _Slot(cpu=0.0, memory=1, weight=1.0)
    sb = _sb(kernel, slot=slot)
    sb.set_limits(1e-9, 1)  # a difference of exactly 1e-9: not written
    assert slot.writes == []


async def test_ready_slot_cpu_edge_is_strict(kernel: _Kernel) -> None:
    p = _pool(kernel, pids_max=1, default_cpu=1e-9, default_mem=64 * MIB)
    s = _Slot(cpu=0.0, pids=1, weight=0.25, memory=64 * MIB)
    p._ready_slot(s, 0.25)
    assert s.writes == [("reset", None)]


async def test_init_defaults_and_no_cpu_count(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(P.os, "cpu_count", lambda: None)
    p = P.WarmPool(
        _Zygote(), _Tree("v1"), warm_min=0, warm_max=1, pids_max=1, default_cpu=1.0, default_mem=1
    )
    assert p.self_join is False and p.direct is True
    assert p.warm_rate_max == 100.0


async def test_zygote_broken_keeps_earlier_orphans(kernel: _Kernel) -> None:
    p = _pool(kernel)
    p.orphan_ids = {99}
    kept = _sb(kernel, pid=1, kept=True, uid=11)
    p.live.add(kept)
    p._zygote_broken()
    assert p.orphan_ids == {99, 11}


async def test_start_names_the_task(kernel: _Kernel) -> None:
    p = _pool(kernel, tree=None)
    p.start()
    assert p._filler.get_name() == "cpu-warm-pool"
    await p.aclose()


async def test_spawn_cold_serves_past_a_cancelled_batch(kernel: _Kernel) -> None:
    z = _Zygote()
    z.hold = asyncio.Event()
    p = _pool(kernel, zygote=z, tree=None)
    first = asyncio.ensure_future(p.spawn())
    await _spin()
    gone = [asyncio.ensure_future(p.spawn()) for _ in range(64)]
    last = asyncio.ensure_future(p.spawn())
    await _spin()
    for t in gone:
        t.cancel()
    await _spin()
    z.hold.set()
    await first
    sb = await asyncio.wait_for(last, 2)
    assert isinstance(sb, P.Sandbox) and sb.conn.requests == []  # cold: not prepared
    assert [c[0] for c in z.calls] == [1, 1]


async def test_place_default_is_warm(kernel: _Kernel) -> None:
    p = _pool(kernel)
    s = _Slot()
    assert p._place([_sb(kernel, pid=1, slot=s, outs=(5,))]) == []
    assert ("weight", 0.25) in s.writes


async def test_spawn_placed_passes_warm_and_uses_the_cgroup_thread(kernel: _Kernel) -> None:
    import threading

    for warm, weight in ((True, 0.25), (False, 1.0)):
        z = _Zygote()
        z.direct = True
        p = _pool(kernel, zygote=z)
        threads: list[str] = []
        orig = _Slot.add

        def add(self: _Slot, pid: int, threads: list[str] = threads, orig: Any = orig) -> None:
            threads.append(threading.current_thread().name)
            orig(self, pid)

        _Slot.add = add  # type: ignore[method-assign]
        try:
            got = await p.spawn_many(1, prepare=False, warm=warm)
        finally:
            _Slot.add = orig  # type: ignore[method-assign]
        assert got[0].slot.weight == weight
        assert threads == ["tangram-cgroup_0"]
        p._cg_thread.shutdown()


async def test_adopt_with_the_real_connection(
    kernel: _Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from arl_tangram.managers.cpu.host.client import Conn

    monkeypatch.setattr(P, "Conn", Conn)
    p = _pool(kernel)
    a, b = socket.socketpair()
    sb = p._adopt(42, a, [], 1)
    assert isinstance(sb.conn, Conn) and sb.conn._loop is p.loop
    sb.conn.close()
    b.close()


async def test_fill_loop_warms_at_exactly_half(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None, warm_min=12, warm_max=20)
    p.ready.extend([_sb(kernel, i) for i in range(4)])
    p.start()
    await asyncio.sleep(0.02)
    assert z.calls[0] == (8, True, None)  # 2 * 4 >= 8
    await p.aclose()


async def test_refill_prepares(kernel: _Kernel) -> None:
    z = _Zygote()
    p = _pool(kernel, zygote=z, tree=None)
    p._filling = 1
    await p._refill(1, True)
    assert [sb.conn.requests for sb in p.ready] == [[({"op": "prepare"}, 30.0)]]


async def test_aclose_twice(kernel: _Kernel) -> None:
    p = _pool(kernel)
    await p.aclose()
    await p.aclose()  # the cgroup thread is shut down: its RuntimeError swallowed
    assert p.closed
