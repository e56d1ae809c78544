"""The CPU manager's session table with fakes (issue 43, mutation testing of host/sessions.py):
exact values of an open (limits, image, layer, keep, freezer), the refused reasons and their cap,
the close's give-backs, the idle reaper, an action in a session (ids, tmpfs, quota, thaw and
freeze, the closing message), reclaim and the memory report. No sandbox starts."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import RunResult, RunStatus
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host import overlay
from arl_tangram.managers.cpu.host import sessions as S
from arl_tangram.managers.cpu.images.layers import LayerError
from arl_tangram.managers.cpu.images.store import ImageError

MIB = 1 << 20

# a mutant that hangs fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.p = 10.0
        self.p_step = 0.0

    def monotonic(self) -> float:
        return self.t

    def perf_counter(self) -> float:
        self.p += self.p_step
        return self.p


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(
        S, "time", types.SimpleNamespace(monotonic=c.monotonic, perf_counter=c.perf_counter)
    )
    return c


class _Slot:
    def __init__(self, dirs: dict[str, str] | None = None) -> None:
        self.dirs = dirs or {"cpu": "/nonexistent-slot"}
        self.resets = 0
        self.sample: Any = (10, 20)
        self.samples = 0
        self.reclaimed: Any = 4096

    def reset_stats(self) -> None:
        self.resets += 1

    def memory_sample(self) -> tuple[int, int]:
        self.samples += 1
        if isinstance(self.sample, BaseException):
            raise self.sample
        return self.sample

    def reclaim(self) -> int:
        if isinstance(self.reclaimed, BaseException):
            raise self.reclaimed
        return self.reclaimed


class _Sb:
    def __init__(self, pid: int = 7, uid: int = -1, slot: Any = None) -> None:
        self.pid, self.uid, self.slot = pid, uid, slot
        self.dead = False
        self.kept = False
        self.limits: list[tuple[float, int]] = []
        self.requests: list[tuple[Any, Any]] = []
        self.reply: Any = {"ok": True}

    def set_limits(self, cpu: float, memory: int, weight: float = 1.0) -> None:
        self.limits.append((cpu, memory))

    async def request(self, msg: Any, timeout: Any = None) -> Any:
        self.requests.append((msg, timeout))
        return self.reply


class _Pool:
    def __init__(self) -> None:
        self.released: list[Any] = []

    def release(self, sb: Any) -> None:
        self.released.append(sb)


class _Img:
    def __init__(self, name: str) -> None:
        self.name = name


class _Images:
    def __init__(self) -> None:
        self.acquired: list[str] = []
        self.released: list[str] = []
        self.none = False

    def acquire(self, name: str) -> Any:
        self.acquired.append(name)
        return None if self.none else _Img(name)

    def release(self, name: str) -> None:
        self.released.append(name)


class _Layers:
    def __init__(self) -> None:
        self.given: list[tuple[int, Any]] = []

    def give_back(self, mb: int, owner: Any) -> None:
        self.given.append((mb, owner))


class _Host:
    def __init__(self) -> None:
        self.images: Any = _Images()
        self.layers: Any = _Layers()
        self.sbs: list[Any] = []
        self.take_error: BaseException | None = None
        self.takes: list[bool] = []
        self.entered: list[tuple[Any, ...]] = []
        self.enter_error: BaseException | None = None
        self.quota: Any = None
        self.quotas: list[tuple[str, float]] = []
        self.exchanges: list[tuple[Any, ...]] = []
        self.result: Any = RunResult(status=RunStatus.Success, message="fine")
        self.on_exchange: Any = None

    async def take_sandbox(self, spawn: bool = False) -> Any:
        self.takes.append(spawn)
        if self.take_error is not None:
            raise self.take_error
        sb = _Sb(pid=30 + len(self.takes), slot=_Slot())
        self.sbs.append(sb)
        return sb

    async def enter_image(self, sb: Any, img: Any, mb: int, owner: Any = None) -> Any:
        self.entered.append((sb, img.name, mb, owner))
        if self.enter_error is not None:
            raise self.enter_error
        return 333, overlay.Inside(python="/py")

    def quota_of(self, action_id: str, default: float) -> float:
        self.quotas.append((action_id, default))
        return default if self.quota is None else self.quota

    async def exchange(self, action_id: str, sb: Any, req: Any, mem: int) -> Any:
        self.exchanges.append((action_id, sb, req, mem))
        if self.on_exchange is not None:
            self.on_exchange()
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class _Freezer:
    def __init__(self, slot: Any) -> None:
        self.slot = slot
        self.frozen = False
        self.log: list[Any] = []
        self.freeze_answer: Any = True

    def add(self, pids: list[int]) -> None:
        self.log.append(("add", pids))

    def freeze(self) -> bool:
        self.log.append("freeze")
        if isinstance(self.freeze_answer, BaseException):
            raise self.freeze_answer
        self.frozen = True
        return self.freeze_answer

    def thaw(self) -> None:
        self.log.append("thaw")
        self.frozen = False


class _Freezers:
    def __init__(self, available: bool = True, give: bool = True) -> None:
        self.available = available
        self.give = give
        self.made: list[_Freezer] = []
        self.dropped: list[_Freezer] = []

    def new(self, slot: Any) -> Any:
        if not self.give:
            return None
        f = _Freezer(slot)
        self.made.append(f)
        return f

    def drop(self, fz: _Freezer) -> None:
        self.dropped.append(fz)


class _Tree:
    def __init__(self, total: int = 0) -> None:
        self.total = total

    def memory_bytes(self) -> int:
        return self.total


def _cfg(**kw: Any) -> CpuManagerConfig:
    return CpuManagerConfig(**kw)


async def _table(
    cfg: CpuManagerConfig | None = None, host: Any = None, freezers: Any = None, tree: Any = None
) -> tuple[S.SessionTable, _Host, _Pool]:
    host = host or _Host()
    t = S.SessionTable(cfg or _cfg(), host)
    pool = _Pool()
    t._pool, t._cgroups, t._freezers = pool, tree, freezers  # (start without the reaper)
    return t, host, pool


def _req(uid: int = 1000, gid: int = 1000, quota: float = 1.0) -> dict[str, Any]:
    return {
        "limits": {"uid": uid, "gid": gid, "fsize": 1},
        "quota": quota,
        "env": {},
        "lang": {"inproc": False, "run": ["x"], "compile": None},
    }


def _action(sid: str = "s1", aid: str = "a1") -> Any:
    return types.SimpleNamespace(id=aid, session=sid)


# --- constants and construction --------------------------------------------------------------


def test_refused_kept() -> None:
    assert S.REFUSED_KEPT == 4096


async def test_table_init_and_start(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg()
    host = _Host()
    t = S.SessionTable(cfg, host)
    assert t.config is cfg and t.host is host and t.by_id == {} and list(t.refused) == []
    assert t.closed is False and t.memory_calls == 0 and t.memory_reads == 0
    assert t._pool is None and t._cgroups is None and t._freezers is None and t._reaper is None
    pool, tree, fz = _Pool(), _Tree(), _Freezers()
    t.start(pool, tree, fz)  # type: ignore[arg-type]
    assert (t._pool, t._cgroups, t._freezers) == (pool, tree, fz)
    assert t._reaper is not None and t._reaper.get_name() == "cpu-session-reaper"
    await t.aclose()
    assert t.closed and t._reaper.done()


def test_session_defaults() -> None:
    s = S.Session(_Sb(), 5.0, 1.0, 2, 3.0, asyncio.Lock())  # type: ignore[arg-type]
    assert (s.image, s.inside, s.freezer, s.layer_mb, s.owner, s.frozen_mem) == (
        None,
        None,
        None,
        0,
        None,
        None,
    )


# --- open ------------------------------------------------------------------------------------


async def test_open_values(clock: _Clock, tmp_path: Any) -> None:
    (tmp_path / "cgroup.procs").write_text("9 3 31\n")
    fz = _Freezers()
    t, host, _ = await _table(freezers=fz)
    await t.open("s1", Resources(cpu=2.5, memory_mb=300), 60, owner="alice")
    s = t.by_id["s1"]
    sb = host.sbs[0]
    assert host.takes == [True]
    assert (s.sandbox, s.ttl_s, s.cpu, s.memory, s.last_used) == (sb, 60.0, 2.5, 300 * MIB, 100.0)
    assert isinstance(s.ttl_s, float) and s.owner == "alice" and s.image is None
    assert sb.limits == [(2.5, 300 * MIB)]
    assert sb.requests == [({"op": "keep"}, 10.0)] and sb.kept is True
    assert s.freezer is fz.made[0] and fz.made[0].slot is sb.slot
    assert fz.made[0].log == [("add", [31]), "freeze"]
    # the slot's pids too, sorted, without duplicates
    sb2_slot = _Slot({"pids": str(tmp_path)})
    host_sb = _Sb(pid=9, slot=sb2_slot)
    host.sbs.clear()

    async def take(spawn: bool = False) -> Any:
        return host_sb

    host.take_sandbox = take  # type: ignore[method-assign]
    await t.open("s2", Resources(), 1.0)
    assert t.by_id["s2"].freezer.log == [("add", [3, 9, 31]), "freeze"]
    s2 = t.by_id["s2"]
    assert (s2.cpu, s2.memory) == (1.0, 512 * MIB)  # the configured defaults
    assert list(t.refused) == []


async def test_open_defaults_from_config() -> None:
    t, host, _ = await _table(_cfg(default_cpus=0.5, default_memory_mb=100))
    await t.open("s", Resources(cpu=0, memory_mb=0), 3)
    s = t.by_id["s"]
    assert (s.cpu, s.memory) == (0.5, 100 * MIB)
    await t.open("s", Resources(cpu=4), 3)  # already open: nothing
    assert host.takes == [True] and t.by_id["s"] is s
    await t.open("u", Resources(memory_mb=1.5), 3)
    assert t.by_id["u"].memory == int(1.5 * MIB)


async def test_open_without_freezer_or_unavailable() -> None:
    for fz in (None, _Freezers(available=False), _Freezers(give=False)):
        t, _host, _ = await _table(freezers=fz)
        await t.open("s", Resources(), 1)
        assert t.by_id["s"].freezer is None
        if fz is not None:
            assert fz.made == []


async def test_open_closed_refused() -> None:
    t, _host, _ = await _table()
    t.closed = True
    with pytest.raises(ClosedError, match=r"^the CPU manager is closed$"):
        await t.open("s", Resources(), 1)
    assert t.refused["s"] == "ClosedError: the CPU manager is closed"
    t2 = S.SessionTable(_cfg(), _Host())
    with pytest.raises(ClosedError):
        await t2.open("s", Resources(), 1)


async def test_open_with_image_and_layer() -> None:
    t, host, pool = await _table(_cfg(image_layer_mb=700))
    await t.open("s", Resources(), 1, image="py:3", owner="bob")
    s = t.by_id["s"]
    assert host.images.acquired == ["py:3"] and s.image.name == "py:3"
    assert host.entered == [(host.sbs[0], "py:3", 700, "bob")]
    assert s.layer_mb == 333 and s.inside == overlay.Inside(python="/py")
    await t.open("u", Resources(), 1, image="py:3", layer_mb=50)
    assert host.entered[-1][2] == 50
    await t.close("s")
    assert host.layers.given == [(333, "bob")] and host.images.released == ["py:3"]
    assert pool.released == [s.sandbox]


async def test_open_image_without_cache() -> None:
    host = _Host()
    host.images = None
    t, _, _ = await _table(host=host)
    with pytest.raises(ImageError, match=r"^no image cache on this node$"):
        await t.open("s", Resources(), 1, image="x")
    assert host.takes == []
    assert t.refused["s"] == "ImageError: no image cache on this node"
    host2 = _Host()
    host2.images.none = True
    t2, _, _ = await _table(host=host2)
    with pytest.raises(ImageError, match=r"^no image cache on this node$"):
        await t2.open("s", Resources(), 1, image="x")
    assert host2.takes == []


async def test_open_take_fails_releases_image() -> None:
    t, host, _ = await _table()
    host.take_error = BrokenError("no sandbox")
    with pytest.raises(BrokenError):
        await t.open("s", Resources(), 1, image="img")
    assert host.images.released == ["img"]
    assert t.refused["s"] == "BrokenError: no sandbox"
    with pytest.raises(BrokenError):
        await t.open("u", Resources(), 1)
    assert host.images.released == ["img"]


async def test_open_layer_error_becomes_image_error() -> None:
    t, host, pool = await _table()
    host.enter_error = LayerError("disk full")
    with pytest.raises(ImageError, match=r"^disk full$") as ei:
        await t.open("s", Resources(), 1, image="img", owner="o")
    assert ei.value.__cause__ is None and ei.value.__suppress_context__
    assert t.by_id == {} and pool.released == [host.sbs[0]]
    assert host.images.released == ["img"] and host.layers.given == []


async def test_open_keep_refused_closes() -> None:
    t, host, pool = await _table()
    orig = host.take_sandbox

    async def take(spawn: bool = False) -> Any:
        sb = await orig(spawn)
        sb.reply = {"ok": False, "error": "no prctl"}
        return sb

    host.take_sandbox = take  # type: ignore[method-assign]
    with pytest.raises(BrokenError, match=r"^session 's9': its sandbox: no prctl$"):
        await t.open("s9", Resources(), 1)
    assert host.sbs[0].kept is False and pool.released == [host.sbs[0]] and t.by_id == {}
    assert t.refused["s9"] == "BrokenError: session 's9': its sandbox: no prctl"


async def test_refused_cap_and_forget_on_success() -> None:
    t, _host, _ = await _table()
    for i in range(S.REFUSED_KEPT):
        t.refused[f"x{i}"] = "r"
    t.closed = True
    with pytest.raises(ClosedError):
        await t.open("new", Resources(), 1)
    assert len(t.refused) == S.REFUSED_KEPT and "x0" not in t.refused and "x1" in t.refused
    assert next(reversed(t.refused)) == "new"
    t.closed = False
    await t.open("new", Resources(), 1)
    assert "new" not in t.refused and len(t.refused) == S.REFUSED_KEPT - 1


# --- close and reaping -----------------------------------------------------------------------


async def test_close_gives_everything_back() -> None:
    fz = _Freezers()
    t, host, pool = await _table(freezers=fz)
    await t.open("s", Resources(), 1)
    s = t.by_id["s"]
    await t.close("s")
    assert fz.dropped == [s.freezer] and pool.released == [s.sandbox]
    assert host.layers.given == [] and host.images.released == []
    await t.close("s")  # unknown: nothing
    assert pool.released == [s.sandbox]


async def test_close_without_pool_layers_images() -> None:
    host = _Host()
    t, _, _ = await _table(host=host)
    await t.open("s", Resources(), 1, image="i")
    host.layers = None
    host.images = None
    t._pool = None
    await t.close("s")
    assert t.by_id == {}


async def test_aclose_closes_each() -> None:
    t, _host, pool = await _table()
    await t.open("a", Resources(), 1)
    await t.open("b", Resources(), 1)
    await t.aclose()
    assert t.closed and t.by_id == {} and len(pool.released) == 2


async def test_reaper(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    t, _host, _pool = await _table(_cfg(session_reap_interval_s=0.25))
    await t.open("old", Resources(), 10)
    await t.open("edge", Resources(), 10)
    await t.open("busy", Resources(), 10)
    t.by_id["old"].last_used = 89.9
    t.by_id["edge"].last_used = 90.0
    t.by_id["busy"].last_used = 0.0
    await t.by_id["busy"].lock.acquire()
    sleeps: list[float] = []
    rounds = [0]
    real_sleep, me = asyncio.sleep, asyncio.current_task()

    async def fake_sleep(s: float) -> None:
        if asyncio.current_task() is not me:  # (the module's asyncio is shared: others sleep)
            await real_sleep(s)
            return
        sleeps.append(s)
        rounds[0] += 1
        if rounds[0] > 1:
            raise asyncio.CancelledError

    monkeypatch.setattr(S.asyncio, "sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await t._reap()
    assert sleeps == [0.25, 0.25]
    assert sorted(t.by_id) == ["busy", "edge"]


# --- run -------------------------------------------------------------------------------------


async def test_run_not_open() -> None:
    t, _host, _ = await _table()
    r = await t.run(_action("zz"), _req())
    assert r.status == RunStatus.SandboxError
    assert r.message == "session 'zz' is not open on this node"
    t.refused["zz"] = "ImageError: nope"
    r = await t.run(_action("zz"), _req())
    assert r.message == (
        "session 'zz' is not open on this node: it could not be opened (ImageError: nope)"
    )
    t.refused["zz"] = ""
    r = await t.run(_action("zz"), _req())
    assert r.message == "session 'zz' is not open on this node"


async def test_run_without_freezer(clock: _Clock) -> None:
    t, host, pool = await _table(_cfg(workdir_max_mb=256))
    await t.open("s1", Resources(cpu=1, memory_mb=300), 10)
    s = t.by_id["s1"]
    s.sandbox.uid = 4242
    host.quota = 0.75

    def during() -> None:
        assert s.lock.locked()
        clock.t = 150.0

    host.on_exchange = during
    clock.t = 120.0
    r = await t.run(_action("s1", "act"), _req(quota=2.0))
    assert r is host.result and r.session_switch is None
    aid, sb, req, mem = host.exchanges[0]
    assert (aid, sb, mem) == ("act", s.sandbox, 300 * MIB)
    assert req["limits"] == {"uid": 4242, "gid": 4242, "fsize": 1}
    assert req["tmpfs_mb"] == 150
    assert host.quotas == [("act", 2.0)] and s.cpu == 0.75
    assert s.sandbox.slot.resets == 1 and s.last_used == 150.0
    assert pool.released == []


async def test_run_tmpfs_only_below_the_cap() -> None:
    t, host, _ = await _table(_cfg(workdir_max_mb=256))
    await t.open("s", Resources(memory_mb=512), 10)
    await t.run(_action("s"), _req())
    assert "tmpfs_mb" not in host.exchanges[0][2]  # 256 == the cap: the request's own
    await t.open("u", Resources(memory_mb=510), 10)
    await t.run(_action("u"), _req())
    assert host.exchanges[1][2]["tmpfs_mb"] == 255


async def test_run_in_image(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def image_request(req: Any, img: Any, inside: Any, layer_mb: Any) -> Any:
        seen.append((req, img, inside, layer_mb))
        return {**req, "imaged": True}

    monkeypatch.setattr(S.overlay, "image_request", image_request)
    t, host, _ = await _table(_cfg(workdir_max_mb=256))
    await t.open("s", Resources(memory_mb=100), 10, image="i")
    s = t.by_id["s"]
    await t.run(_action("s"), _req())
    assert seen[0][1] is s.image and seen[0][2] is s.inside and seen[0][3] is None
    assert host.exchanges[0][2]["imaged"] is True and "tmpfs_mb" not in host.exchanges[0][2]


async def test_run_thaws_and_freezes(clock: _Clock) -> None:
    fz = _Freezers()
    t, host, _ = await _table(freezers=fz)
    await t.open("s", Resources(cpu=1, memory_mb=64), 10)
    s = t.by_id["s"]
    f = s.freezer
    f.log.clear()
    s.sandbox.limits.clear()
    s.frozen_mem = 5
    host.quota = 3.0
    clock.p_step = 0.001
    r = await t.run(_action("s"), _req())
    assert f.log == ["thaw", "freeze"]
    assert s.sandbox.limits == [(3.0, 64 * MIB)] and s.frozen_mem is None
    assert r.session_switch == {
        "thaw_ms": 1.0,
        "requota_ms": 1.0,
        "freeze_ms": 1.0,
        "total_ms": 3.0,
        "frozen": True,
    }
    assert r.status == RunStatus.Success and r.message == "fine"


async def test_freeze_failures() -> None:
    sb = _Sb()
    s = S.Session(sb, 1, 1, 1, 0, asyncio.Lock())  # type: ignore[arg-type]
    S.SessionTable._freeze(s, overlay.SessionSwitch())  # no freezer: nothing
    f = _Freezer(None)
    s.freezer = f  # type: ignore[assignment]
    S.SessionTable._freeze(s, None)
    assert f.log == []
    sb.dead = True
    S.SessionTable._freeze(s, overlay.SessionSwitch())
    assert f.log == []
    sb.dead = False
    sw = overlay.SessionSwitch()
    f.freeze_answer = False
    S.SessionTable._freeze(s, sw)
    assert sw.frozen is False and f.log == ["freeze"]
    sw = overlay.SessionSwitch()
    f.freeze_answer = OSError("x")
    S.SessionTable._freeze(s, sw)
    assert sw.frozen is False
    assert S.SessionTable._thaw(S.Session(sb, 1, 1, 1, 0, asyncio.Lock())) is None  # type: ignore[arg-type]


async def test_run_sandbox_error_closes(clock: _Clock) -> None:
    t, host, pool = await _table()
    await t.open("s", Resources(), 10)
    host.result = RunResult.sandbox_error("init died")
    r = await t.run(_action("s"), _req())
    assert r.status == RunStatus.SandboxError
    assert r.message == (
        "the session's sandbox ended (init died); session 's' is closed, its "
        "state lost: open a new one"
    )
    assert t.by_id == {} and len(pool.released) == 1
    await t.open("u", Resources(), 10)
    host.result = RunResult.sandbox_error("the session is gone")
    r = await t.run(_action("u"), _req())
    assert r.message == "the session is gone" and "u" not in t.by_id


async def test_run_dead_sandbox_closes_keeps_message() -> None:
    t, host, _pool = await _table()
    await t.open("s", Resources(), 10)
    s = t.by_id["s"]
    host.on_exchange = lambda: setattr(s.sandbox, "dead", True)
    r = await t.run(_action("s"), _req())
    assert r is host.result and r.message == "fine" and t.by_id == {}


async def test_run_exchange_raises_still_freezes(clock: _Clock) -> None:
    fz = _Freezers()
    t, host, _ = await _table(freezers=fz)
    await t.open("s", Resources(), 10)
    s = t.by_id["s"]
    s.freezer.log.clear()
    host.result = RuntimeError("boom")
    clock.t = 555.0
    with pytest.raises(RuntimeError):
        await t.run(_action("s"), _req())
    assert s.freezer.log == ["thaw", "freeze"] and s.last_used == 555.0 and "s" in t.by_id


async def test_run_without_slot() -> None:
    t, _host, _ = await _table()
    await t.open("s", Resources(), 10)
    t.by_id["s"].sandbox.slot = None
    r = await t.run(_action("s"), _req())
    assert r.status == RunStatus.Success


# --- ids -------------------------------------------------------------------------------------


def test_as_own_ids() -> None:
    req = _req(uid=1000, gid=1001)
    assert S.as_own_ids(_Sb(uid=-1), req) is req  # type: ignore[arg-type]
    assert S.as_own_ids(_Sb(uid=1000), req) is req  # type: ignore[arg-type]
    out = S.as_own_ids(_Sb(uid=0), req)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 0, "gid": 0, "fsize": 1}
    out = S.as_own_ids(_Sb(uid=2001), req)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 2001, "gid": 2001, "fsize": 1}
    assert req["limits"] == {"uid": 1000, "gid": 1001, "fsize": 1}
    assert out["quota"] == 1.0


# --- memory ----------------------------------------------------------------------------------


async def _frozen_table(n: int, refresh: int = 3, tree: Any = None) -> Any:
    fz = _Freezers()
    t, host, _pool = await _table(_cfg(frozen_memory_refresh=refresh), freezers=fz, tree=tree)
    for i in range(n):
        await t.open(f"s{i}", Resources(), 10)
    return t, host, fz


async def test_reclaim(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger=S.log.name)
    t, _host, _fz = await _frozen_table(1)
    s = t.by_id["s0"]
    s.frozen_mem = 7
    s.sandbox.slot.reclaimed = 8192
    assert await t.reclaim("s0") == 8192 and s.frozen_mem is None
    assert await t.reclaim("nope") == 0
    s.frozen_mem = 7
    s.freezer.frozen = False
    assert await t.reclaim("s0") == 0 and s.frozen_mem == 7
    s.freezer.frozen = True
    s.sandbox.dead = True
    assert await t.reclaim("s0") == 0
    s.sandbox.dead = False
    s.sandbox.slot.reclaimed = OSError("x")
    assert await t.reclaim("s0") == 0 and s.frozen_mem == 7
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "arl_tangram.managers.cpu.host.sessions",
            "WARNING",
            "CPU manager: reclaiming session s0: x",
        )
    ]
    s.sandbox.slot.reclaimed = ValueError("x")
    assert await t.reclaim("s0") == 0
    fr = s.freezer
    s.freezer = None
    assert await t.reclaim("s0") == 0
    s.freezer = fr
    s.sandbox.slot.reclaimed = 5
    slot = s.sandbox.slot
    s.sandbox.slot = None
    assert await t.reclaim("s0") == 0
    s.sandbox.slot = slot
    assert await t.reclaim("s0") == 5


async def test_reclaim_idle_order_and_stop() -> None:
    t, _host, _fz = await _frozen_table(5)
    mems = [100, None, 300, 200, 400]
    freed = {"s0": 1, "s1": 2, "s2": 30, "s3": 40, "s4": 500}
    order: list[str] = []
    for i, m in enumerate(mems):
        s = t.by_id[f"s{i}"]
        s.frozen_mem = m
        s.sandbox.slot.reclaimed = freed[f"s{i}"]
    orig = t.reclaim

    async def rec(sid: str) -> int:
        order.append(sid)
        return await orig(sid)

    t.reclaim = rec  # type: ignore[method-assign]
    t.by_id["s3"].freezer.frozen = False
    await t.by_id["s2"].lock.acquire()
    assert await t.reclaim_idle(501) == 501
    assert order == ["s4", "s0"]
    order.clear()
    t.by_id["s2"].lock.release()
    for i, m in enumerate(mems):
        t.by_id[f"s{i}"].frozen_mem = m
    assert await t.reclaim_idle(500) == 500 and order == ["s4"]
    order.clear()
    assert await t.reclaim_idle(0) == 0 and order == []
    t.by_id["s4"].freezer = None
    for i, m in enumerate(mems):
        if t.by_id[f"s{i}"].freezer is not None:
            t.by_id[f"s{i}"].frozen_mem = m
    assert await t.reclaim_idle(10**9) == 30 + 1 + 2
    assert order == ["s2", "s0", "s1"]


async def test_memory_use_refresh_cycle() -> None:
    t, _host, _fz = await _frozen_table(3, refresh=3, tree=_Tree(10_000))
    slots = [t.by_id[f"s{i}"].sandbox.slot for i in range(3)]
    for i, sl in enumerate(slots):
        sl.sample = (100 * (i + 1), 1000 * (i + 1))
    out, other = t.memory_use()  # first: every one read
    assert out == {"s0": (100, 1000), "s1": (200, 2000), "s2": (300, 3000)}
    assert other == 10_000 - 600 and t.memory_calls == 1 and t.memory_reads == 3
    assert [t.by_id[f"s{i}"].frozen_mem for i in range(3)] == [100, 200, 300]
    for i, sl in enumerate(slots):
        sl.sample = (111 * (i + 1), 1111)
    out, _ = t.memory_use()  # call 2: (i + 2) % 3 == 0 for i == 1 only
    assert out == {"s0": (100, 100), "s1": (222, 1111), "s2": (300, 300)}
    assert t.memory_calls == 2 and t.memory_reads == 1
    out, _ = t.memory_use()  # call 3: i == 0
    assert out == {"s0": (111, 1111), "s1": (222, 222), "s2": (300, 300)}
    assert t.memory_reads == 1


async def test_memory_use_every_zero_reads_each_time() -> None:
    t, _host, _fz = await _frozen_table(2, refresh=0)
    t.memory_use()
    out, other = t.memory_use()
    assert t.memory_reads == 2 and other == 0
    assert out == {"s0": (10, 20), "s1": (10, 20)}


async def test_memory_use_not_still() -> None:
    t, _host, _fz = await _frozen_table(4, refresh=3, tree=_Tree(50))
    t.memory_use()
    a, b, c, d = (t.by_id[f"s{i}"] for i in range(4))
    a.freezer.frozen = False  # thawed: read, and no frozen figure kept
    await b.lock.acquire()  # its action runs: read
    c.freezer = None
    d.sandbox.dead = True
    out, other = t.memory_use()
    assert sorted(out) == ["s0", "s1", "s2"] and t.memory_reads == 3
    assert a.frozen_mem is None and b.frozen_mem is None and c.frozen_mem is None
    assert other == 20  # 50 - 3 x 10
    a.sandbox.slot.sample = OSError("x")
    b.sandbox.slot.sample = ValueError("x")
    out, other = t.memory_use()
    assert sorted(out) == ["s2"] and other == 40
    c.sandbox.slot = None
    out, other = t.memory_use()
    assert out == {} and other == 50
    t._cgroups = _Tree(5)
    c.sandbox.slot = _Slot()
    out, other = t.memory_use()
    assert other == 0  # never below 0


async def test_memory_use_frozen_without_figure_reads() -> None:
    t, _host, _fz = await _frozen_table(1, refresh=1000)
    s = t.by_id["s0"]
    out, _ = t.memory_use()
    assert t.memory_reads == 1 and s.frozen_mem == 10
    s.frozen_mem = None
    out, _ = t.memory_use()
    assert t.memory_reads == 1 and s.frozen_mem == 10
    out, _ = t.memory_use()
    assert t.memory_reads == 0 and out == {"s0": (10, 10)}


# --- edges found by mutation testing ---------------------------------------------------------


async def test_close_without_freezer_drops_nothing() -> None:
    fz = _Freezers(give=False)
    t, _host, pool = await _table(freezers=fz)
    await t.open("s", Resources(), 1)
    await t.close("s")
    assert fz.dropped == [] and len(pool.released) == 1


async def test_run_marks_use_when_it_takes_the_lock(clock: _Clock) -> None:
    t, host, _ = await _table()
    await t.open("s", Resources(), 10)
    s = t.by_id["s"]
    seen: list[Any] = []
    host.on_exchange = lambda: seen.append(s.last_used)
    clock.t = 321.0
    await t.run(_action("s"), _req())
    assert seen == [321.0]


async def test_reclaim_idle_none_counts_as_zero() -> None:
    t, _host, _fz = await _frozen_table(0)
    fz = t._freezers
    for sid in ("a", "z"):
        await t.open(sid, Resources(), 10)
    t.by_id["z"].frozen_mem = None
    t.by_id["a"].frozen_mem = 1
    t.by_id["z"].sandbox.slot.reclaimed = 50
    t.by_id["a"].sandbox.slot.reclaimed = 7
    assert fz is not None
    assert await t.reclaim_idle(1) == 7  # "a" (1 byte) before "z" (unknown: 0)


async def test_memory_use_goes_on_past_a_dead_one() -> None:
    t, _host, _fz = await _frozen_table(2, refresh=0)
    t.by_id["s0"].sandbox.dead = True
    out, _ = t.memory_use()
    assert out == {"s1": (10, 20)}


async def test_memory_use_without_cgroups_is_zero() -> None:
    t, _host, _pool = await _table()
    assert t.memory_use() == ({}, 0)
