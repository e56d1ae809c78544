"""The fork server's supervisor with fakes (issue 43, mutation testing): exact values of its
start, the crash counter and its window, the restart back-off and its cap, the node marked down
and tried again, the new fork server handed to the pool, and its stop. No sandbox starts: the
fork server, the reaper, the host ids, the clock and the sleeps are fakes."""

from __future__ import annotations

import asyncio
import logging
import types
from typing import Any

import pytest

from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host import supervisor as sup

WHERE = "/var/tmp/tangram-sup-test"


class _Proc:
    def __init__(self, pid: int = 4242, rc: int | None = None) -> None:
        self.pid = pid
        self.returncode = rc
        self.killed = 0
        self.waits: list[Any] = []
        self.kill_error: BaseException | None = None
        self.wait_error: BaseException | None = None

    def kill(self) -> None:
        self.killed += 1
        if self.kill_error is not None:
            raise self.kill_error

    def wait(self, timeout: Any = None) -> int:
        self.waits.append(timeout)
        if self.wait_error is not None:
            raise self.wait_error
        return 0

    def poll(self) -> int | None:
        return self.returncode


class _Zygote:
    made: list[tuple[Any, ...]] = []
    fail: list[BaseException | None] = []
    hello: dict[str, Any] = {"ok": True}

    def __init__(self, *args: Any) -> None:
        _Zygote.made.append(args)
        if _Zygote.fail:
            e = _Zygote.fail.pop(0)
            if e is not None:
                raise e
        self.args = args
        self.proc = _Proc(pid=1000 + len(_Zygote.made))
        self.gone: str | None = None
        self.on_broken: Any = "hook"
        self.closed: list[tuple[Any, ...]] = []
        self.hello_waits: list[tuple[Any, ...]] = []
        self.given: list[list[int]] = []

    def wait_hello(self, *a: Any) -> dict[str, Any]:
        self.hello_waits.append(a)
        return dict(_Zygote.hello)

    def close(self, *a: Any) -> None:
        self.closed.append(a)

    def give_ids(self, ids: list[int]) -> None:
        self.given.append(ids)


class _Reaper:
    made: list[dict[str, Any]] = []
    fail: list[BaseException | None] = []
    configure_error: BaseException | None = None

    def __init__(self, wcfg: dict[str, Any]) -> None:
        _Reaper.made.append(dict(wcfg))
        if _Reaper.fail:
            e = _Reaper.fail.pop(0)
            if e is not None:
                raise e
        self.wcfg = wcfg
        self.proc = _Proc(pid=77)
        self.configured: list[dict[str, Any]] = []
        self.closed = 0

    def configure(self, **kw: Any) -> None:
        self.configured.append(kw)
        if _Reaper.configure_error is not None:
            raise _Reaper.configure_error

    def close(self) -> None:
        self.closed += 1


class _Block:
    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class _Ids:
    def __init__(self) -> None:
        self.claims: list[tuple[int, int]] = []
        self.in_use_calls: list[tuple[int, int]] = []
        self.in_use: set[int] = {9, 3, 5}

    def claim(self, base: int, count: int) -> _Block:
        self.claims.append((base, count))
        return _Block(base, count)

    def uids_in_use(self, first: int, count: int) -> set[int]:
        self.in_use_calls.append((first, count))
        return set(self.in_use)


class _Pool:
    def __init__(self) -> None:
        self.on_broken: Any = None
        self.down: str | None = "old reason"
        self.up = asyncio.Event()
        self._wake = asyncio.Event()
        self.orphan_ids: set[int] = set()
        self.attached: list[Any] = []

    def attach_zygote(self, z: Any) -> None:
        self.attached.append(z)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    _Zygote.made, _Zygote.fail, _Zygote.hello = [], [], {"ok": True}
    _Reaper.made, _Reaper.fail, _Reaper.configure_error = [], [], None
    fake_ids = _Ids()
    clock = _Clock()
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s: float) -> None:
        sleeps.append(s)
        await real_sleep(0)

    fake_asyncio = types.SimpleNamespace(
        sleep=sleep, to_thread=asyncio.to_thread, create_task=asyncio.create_task
    )
    monkeypatch.setattr(sup, "Zygote", _Zygote)
    monkeypatch.setattr(sup, "Reaper", _Reaper)
    monkeypatch.setattr(sup, "ids", fake_ids)
    monkeypatch.setattr(sup, "time", clock)
    monkeypatch.setattr(sup, "asyncio", fake_asyncio)
    return types.SimpleNamespace(ids=fake_ids, clock=clock, sleeps=sleeps)


def _config(**kw: Any) -> CpuManagerConfig:
    base: dict[str, Any] = dict(
        work_root=WHERE,
        sandbox_id_base=1 << 20,
        sandbox_id_count=64,
        fork_server_max_crashes=3,
        fork_server_crash_window_s=60.0,
        fork_server_restart_backoff_s=0.5,
        fork_server_down_retry_s=7.0,
    )
    base.update(kw)
    return CpuManagerConfig(**base)


def test_the_cap_on_the_back_off() -> None:
    assert sup.RESTART_BACKOFF_MAX_S == 5.0


def test_a_new_supervisor_holds_nothing() -> None:
    cfg = _config()
    s = sup.ForkServerSupervisor(cfg)
    assert s.config is cfg
    assert (s.zygote, s.watchdog, s.ids, s.gen, s.not_ready, s.restarts, s.deaths) == (
        None,
        None,
        None,
        0,
        None,
        0,
        0,
    )
    assert s._wcfg == {} and s._zcfg == {} and s._join_dirs == []
    assert s._pool is None and s._restarter is None and s._stopped is False
    assert list(s._crashes) == []


def test_start_reaper_and_configure(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    s.start_reaper(["/cg/a", "/cg/b"])
    assert _Reaper.made == [{"cgroups": ["/cg/a", "/cg/b"]}]
    w = s.watchdog
    assert isinstance(w, _Reaper)
    s.configure_reaper(freezer="/fz", layers=["l1"])
    assert w.configured == [{"cgroups": ["/cg/a", "/cg/b"], "freezer": "/fz", "layers": ["l1"]}]
    assert s._wcfg == {"cgroups": ["/cg/a", "/cg/b"], "freezer": "/fz", "layers": ["l1"]}
    _Reaper.configure_error = OSError("pipe gone")
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        s.configure_reaper(more=1)
    assert s.watchdog is w
    assert any(r.getMessage() == "CPU manager: the reaper: pipe gone" for r in caplog.records)


def test_no_reaper_when_it_cannot_start(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    _Reaper.fail = [OSError("no fork")]
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        s.start_reaper(["/cg"])
    assert s.watchdog is None
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        m.startswith("CPU manager: no reaper (a killed service leaves its sessions")
        and m.endswith(": no fork")
        for m in msgs
    ), msgs
    s.configure_reaper(freezer="/fz")  # no reaper: only remembered
    assert s._wcfg == {"cgroups": ["/cg"], "freezer": "/fz"}


async def test_claim_ids_uses_the_configured_block(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    await s.claim_ids()
    assert env.ids.claims == [(1 << 20, 64)]
    assert isinstance(s.ids, _Block) and (s.ids.first, s.ids.count) == (1 << 20, 64)


async def test_start_under_the_reaper(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    s.start_reaper([])
    w = s.watchdog
    _Zygote.hello = {"ok": True, "pid": 5}
    dirs = ["/j1"]
    hello = await s.start({"a": 1}, dirs)
    assert hello == {"ok": True, "pid": 5}
    assert _Zygote.made == [({"a": 1}, WHERE, ["/j1"], w)]
    assert s.gen == 1 and s.zygote is not None and s.zygote.hello_waits == [()]
    assert s._zcfg == {"a": 1} and s._join_dirs == ["/j1"] and s._join_dirs is not dirs


async def test_start_without_reaper_raises(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    _Zygote.fail = [OSError("boom")]
    with pytest.raises(OSError, match="boom"):
        await s.start({}, [])
    assert s.gen == 0 and s.zygote is None


async def test_start_falls_back_when_the_reaper_cannot_start_it(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    s.start_reaper([])
    w = s.watchdog
    assert isinstance(w, _Reaper)
    _Zygote.fail = [OSError("reaper broke")]
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        await s.start({"z": 2}, ["/d"])
    assert w.closed == 1 and s.watchdog is None
    assert _Zygote.made[1] == ({"z": 2}, WHERE, ["/d"])
    assert s.gen == 1
    assert any(
        r.getMessage() == "CPU manager: the reaper cannot start the fork server "
        "(reaper broke); running without it"
        for r in caplog.records
    )


def test_supervise_hooks_the_pool() -> None:
    s = sup.ForkServerSupervisor(_config())
    pool = _Pool()
    s.supervise(pool)  # type: ignore[arg-type]
    assert s._pool is pool and pool.on_broken == s.died


def test_crash_window_counts_and_forgets(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(
        _config(fork_server_max_crashes=3, fork_server_crash_window_s=60.0)
    )
    c = env.clock
    assert s._down_for() is None
    c.now += 60.0  # exactly the window after: still counted
    assert s._down_for() is None
    assert len(s._crashes) == 2
    c.now += 0.5
    # the first is now 60.5 s old: forgotten
    assert s._down_for() is None
    assert list(s._crashes) == [1060.0, 1060.5]
    assert s._down_for() == ("the sandbox fork server died 3 times within 60 s: node marked down")
    assert s._down_for() == ("the sandbox fork server died 4 times within 60 s: node marked down")


def test_crash_window_forgets_every_old_crash(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config(fork_server_max_crashes=2, fork_server_crash_window_s=1.5))
    s._crashes.extend([1.0, 2.0, 3.0])
    assert s._down_for() is None
    assert list(s._crashes) == [1000.0]
    env.clock.now += 1.5
    assert s._down_for() == ("the sandbox fork server died 2 times within 1.5 s: node marked down")


def test_died_counts_and_starts_one_restart(
    env: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    made: list[Any] = []

    class _Task:
        def __init__(self, done: bool) -> None:
            self._done = done

        def done(self) -> bool:
            return self._done

    def create_task(coro: Any, name: str = "") -> _Task:
        coro.close()
        made.append(name)
        return _Task(False)

    monkeypatch.setattr(sup.asyncio, "create_task", create_task)
    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        s.died()
    assert s.deaths == 1
    assert s.not_ready == "the sandbox fork server died; restarting it"
    assert made == ["cpu-zygote-restart"]
    assert any(
        r.getMessage() == "CPU manager: the sandbox fork server died (pid ?); restarting it"
        for r in caplog.records
    )
    s.died()  # one already running: no second
    assert made == ["cpu-zygote-restart"] and s.deaths == 2
    s._restarter = _Task(True)  # type: ignore[assignment]
    z = _Zygote()
    z.gone = "fork server: socket closed"
    s.zygote = z  # type: ignore[assignment]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        s.died()
    assert made == ["cpu-zygote-restart"] * 2 and s.deaths == 3
    assert s.not_ready == "fork server: socket closed; restarting it"
    assert any(
        r.getMessage() == f"CPU manager: fork server: socket closed (pid {z.proc.pid}); "
        "restarting it"
        for r in caplog.records
    )
    z.gone = None
    s._restarter = _Task(True)  # type: ignore[assignment]
    s.died()
    assert s.not_ready == "the sandbox fork server died; restarting it"
    s._stopped = True
    s.died()
    assert s.deaths == 4 and len(made) == 3


async def test_reap_old(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    await s._reap_old()  # none: nothing
    z = _Zygote()
    s.zygote = z  # type: ignore[assignment]
    await s._reap_old()
    assert z.on_broken is None and z.proc.killed == 1 and z.proc.waits == [5]
    assert z.closed == [("the sandbox fork server died",)]
    z2 = _Zygote()
    z2.proc.kill_error = OSError("gone")
    z2.proc.wait_error = RuntimeError("timeout")
    s.zygote = z2  # type: ignore[assignment]
    await s._reap_old()
    assert z2.closed == [("the sandbox fork server died",)]


async def test_start_new_hands_the_fork_server_to_the_pool(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    await s.claim_ids()
    s._zcfg, s._join_dirs = {"k": 1}, ["/j"]
    s.gen, s.not_ready = 1, "dead"
    pool = _Pool()
    pool.orphan_ids = {11, 4}
    assert await s._start_new(pool) is True  # type: ignore[arg-type]
    z = s.zygote
    assert isinstance(z, _Zygote)
    assert env.ids.in_use_calls == [(1 << 20, 64)]
    assert s._zcfg == {"k": 1, "ids_busy": [3, 5, 9], "ids_held": [4, 11]}
    assert _Zygote.made == [(s._zcfg, WHERE, ["/j"], None)]
    assert z.hello_waits == [(10.0,)]
    assert s.gen == 2 and s.restarts == 1 and s.not_ready is None
    assert pool.attached == [z] and z.given == [[]]
    assert pool.down is None and pool.up.is_set() and pool._wake.is_set()


async def test_start_new_gives_back_ids_of_sessions_that_ended(
    env: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sup.ForkServerSupervisor(_config())
    await s.claim_ids()
    pool = _Pool()
    pool.orphan_ids = {11, 4, 20}

    def hello(self: _Zygote, *a: Any) -> dict[str, Any]:
        pool.orphan_ids.discard(11)  # a session ended while the fork server started
        pool.orphan_ids.discard(4)
        return {"ok": True}

    monkeypatch.setattr(_Zygote, "wait_hello", hello)
    assert await s._start_new(pool) is True  # type: ignore[arg-type]
    assert s.zygote is not None and s.zygote.given == [[4, 11]]  # type: ignore[attr-defined]


async def test_start_new_without_ids(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    pool = _Pool()
    pool.orphan_ids = {3}
    assert await s._start_new(pool) is True  # type: ignore[arg-type]
    assert s._zcfg == {} and env.ids.in_use_calls == []
    assert s.zygote is not None and s.zygote.given == [[]]  # type: ignore[attr-defined]


async def test_start_new_fails(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    s.zygote = _Zygote()  # type: ignore[assignment]
    pool = _Pool()
    _Zygote.fail = [OSError("EAGAIN")]
    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        assert await s._start_new(pool) is False  # type: ignore[arg-type]
    assert s.zygote is None
    assert any(
        r.getMessage() == "CPU manager: cannot start the sandbox fork server: EAGAIN"
        for r in caplog.records
    )
    _Zygote.hello = {"ok": False, "error": "bad seccomp"}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        assert await s._start_new(pool) is False  # type: ignore[arg-type]
    assert any(
        r.getMessage() == "CPU manager: the new sandbox fork server failed: bad seccomp"
        for r in caplog.records
    )
    assert s.gen == 0 and s.restarts == 0 and pool.attached == [] and pool.down == "old reason"
    assert not pool.up.is_set()
    _Zygote.hello = {}
    assert await s._start_new(pool) is False  # type: ignore[arg-type]


async def test_start_new_when_stopped_meanwhile(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    s._stopped = True
    pool = _Pool()
    assert await s._start_new(pool) is True  # type: ignore[arg-type]
    z = s.zygote
    assert isinstance(z, _Zygote) and z.closed == [()]
    assert s.gen == 0 and s.restarts == 0 and pool.attached == []


async def test_start_new_replaces_a_dead_reaper(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    s.start_reaper(["/cg"])
    old = s.watchdog
    assert isinstance(old, _Reaper)
    pool = _Pool()
    assert await s._start_new(pool) is True  # type: ignore[arg-type]
    assert s.watchdog is old and len(_Reaper.made) == 1  # alive: kept
    old.proc.returncode = -9
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        assert await s._start_new(pool) is True  # type: ignore[arg-type]
    new = s.watchdog
    assert isinstance(new, _Reaper) and new is not old
    assert _Reaper.made == [{"cgroups": ["/cg"]}] * 2
    assert _Zygote.made[-1][3] is new
    assert any(
        r.getMessage() == "CPU manager: the reaper died (-9); starting a new one"
        for r in caplog.records
    )
    new.proc.returncode = 0
    _Reaper.fail = [OSError("no more")]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        assert await s._start_new(pool) is True  # type: ignore[arg-type]
    assert s.watchdog is None and _Zygote.made[-1][3] is None
    assert any(r.getMessage() == "CPU manager: no reaper: no more" for r in caplog.records)


def _restart_env(s: sup.ForkServerSupervisor, outcomes: list[bool]) -> tuple[_Pool, list[str]]:
    pool = _Pool()
    s._pool = pool  # type: ignore[assignment]
    calls: list[str] = []

    async def reap() -> None:
        calls.append("reap")

    async def start_new(p: Any) -> bool:
        assert p is pool
        calls.append(f"start up={pool.up.is_set()} down={pool.down}")
        return outcomes.pop(0)

    s._reap_old = reap  # type: ignore[method-assign]
    s._start_new = start_new  # type: ignore[method-assign]
    return pool, calls


async def test_restart_backs_off_doubling_up_to_the_cap(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(
        _config(fork_server_max_crashes=100, fork_server_restart_backoff_s=0.5)
    )
    _, calls = _restart_env(s, [True])
    await s._restart()  # the first death of the window: no wait
    assert env.sleeps == [] and calls == ["reap", "start up=False down=old reason"]
    for _ in range(6):
        _restart_env(s, [True])
        await s._restart()
    assert env.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


async def test_restart_tries_again_until_one_comes_up(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(
        _config(fork_server_max_crashes=100, fork_server_restart_backoff_s=0.25)
    )
    _, calls = _restart_env(s, [False, False, True])
    await s._restart()
    assert calls.count("reap") == 3 and len(calls) == 6
    assert env.sleeps == [0.25, 0.5] and len(s._crashes) == 3


async def test_restart_marks_the_node_down_then_tries_again(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(
        _config(
            fork_server_max_crashes=2,
            fork_server_restart_backoff_s=0.5,
            fork_server_down_retry_s=7.0,
        )
    )
    s._crashes.append(env.clock.now)
    pool, calls = _restart_env(s, [True])
    seen: list[tuple[Any, ...]] = []

    async def sleep(t: float) -> None:
        seen.append((t, pool.down, pool.up.is_set(), s.not_ready))

    sup.asyncio.sleep = sleep  # type: ignore[attr-defined]
    await s._restart()
    why = "the sandbox fork server died 2 times within 60 s: node marked down"
    assert seen == [(7.0, why, True, why)]
    assert list(s._crashes) == []
    assert calls == ["reap", "start up=False down=None"]


async def test_restart_stopped_while_down(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config(fork_server_max_crashes=1))
    pool, calls = _restart_env(s, [True])

    async def sleep(t: float) -> None:
        s._stopped = True

    sup.asyncio.sleep = sleep  # type: ignore[attr-defined]
    await s._restart()
    assert calls == ["reap"]
    assert pool.up.is_set() and pool.down is not None


async def test_restart_stopped_during_back_off(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config(fork_server_max_crashes=100))
    s._crashes.append(env.clock.now)
    _, calls = _restart_env(s, [True])

    async def sleep(t: float) -> None:
        s._stopped = True

    sup.asyncio.sleep = sleep  # type: ignore[attr-defined]
    await s._restart()
    assert calls == ["reap"]


async def test_restart_when_stopped_does_nothing(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    _, calls = _restart_env(s, [True])
    s._stopped = True
    await s._restart()
    assert calls == []


async def test_stop_cancels_the_restart_and_closes(env: types.SimpleNamespace) -> None:
    s = sup.ForkServerSupervisor(_config())
    ev = asyncio.Event()

    async def forever() -> None:
        await ev.wait()

    task = asyncio.create_task(forever())
    s._restarter = task
    await s.stop()
    assert s._stopped is True and task.cancelled()
    s.close_fork_server()  # none: nothing
    z = _Zygote()
    s.zygote = z  # type: ignore[assignment]
    s.close_fork_server()
    assert z.closed == [()]
    s.close_ids()  # none: nothing
    await s.claim_ids()
    b = s.ids
    assert isinstance(b, _Block)
    s.close_ids()
    assert b.closed == 1 and s.ids is None
    await s.close_reaper()  # none: nothing
    s.start_reaper([])
    w = s.watchdog
    assert isinstance(w, _Reaper)
    await s.close_reaper()
    assert w.closed == 1 and s.watchdog is None


async def test_the_down_log_names_the_reason_and_the_retry(
    env: types.SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config(fork_server_max_crashes=1, fork_server_down_retry_s=7.5))
    _restart_env(s, [True])
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        await s._restart()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "CPU manager: the sandbox fork server died 1 times within 60 s: node marked down; "
        "trying again in 7.5 s"
    ]


async def test_each_restart_counts_and_logs_its_time(
    env: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = sup.ForkServerSupervisor(_config())
    pool = _Pool()

    def hello(self: _Zygote, *a: Any) -> dict[str, Any]:
        env.clock.now += 1.25
        return {"ok": True}

    monkeypatch.setattr(_Zygote, "wait_hello", hello)
    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        assert await s._start_new(pool) is True  # type: ignore[arg-type]
        assert await s._start_new(pool) is True  # type: ignore[arg-type]
    assert s.restarts == 2 and s.gen == 2
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "CPU manager: sandbox fork server restarted (pid 1001) in 1.250 s",
        "CPU manager: sandbox fork server restarted (pid 1002) in 1.250 s",
    ]
