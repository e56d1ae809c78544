"""The CPU manager's facade with fakes (issue 43, mutation testing of host/manager.py): exact
values of the fork server's configuration, the image user's report, health, the close's order,
the reports, one-shot runs (pooled, in an image), the take's retries, the lost-sandbox verdict,
the CPU weight of a squeezed action, resizes, cancels, the reply's result and `build_result`.
No sandbox starts: the pool, the fork server's supervisor, sandboxes and stores are fakes."""

from __future__ import annotations

import asyncio
import os
import types
from typing import Any

import pytest

from arl_tangram.core.errors import BrokenError, InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import CommandRunStatus, RunResult, RunStatus, StageResult, Timeouts
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host import manager as M
from arl_tangram.managers.cpu.host import overlay
from arl_tangram.managers.cpu.images.store import ImageError

MIB = 1 << 20

# a mutant that hangs fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)


class _Slot:
    def __init__(self) -> None:
        self.stats: Any = (1.23456789, 12.5, 0)

    def cpu_seconds(self) -> float:
        if isinstance(self.stats, BaseException):
            raise self.stats
        return self.stats[0]

    def peak_memory_mb(self) -> float:
        return self.stats[1]

    def oom_kills(self) -> int:
        return self.stats[2]


class _Maker:
    def __init__(self, exited: bool) -> None:
        self._e = exited

    def exited(self) -> bool:
        return self._e


class _Sb:
    def __init__(self, pid: int = 77, uid: int = -1, slot: Any = None) -> None:
        self.pid, self.uid, self.slot = pid, uid, slot
        self.outs: tuple[int, ...] = ()
        self.dead = False
        self.kept = False
        self.maker: Any = None
        self.memory = 99
        self.limits: list[tuple[float, int, float]] = []
        self.limit_error: BaseException | None = None
        self.requests: list[tuple[Any, Any]] = []
        self.reply: Any = {"run_result": {"status": "Finished", "return_code": 0}}
        self.killed = 0

    def set_limits(self, cpu: float, memory: int, weight: float = 1.0) -> None:
        if self.limit_error is not None:
            raise self.limit_error
        self.limits.append((cpu, memory, weight))

    async def request(self, msg: Any, timeout: Any = None) -> Any:
        self.requests.append((msg, timeout))
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply

    def kill(self) -> None:
        self.killed += 1


class _Pool:
    def __init__(self) -> None:
        self.released: list[Any] = []
        self.ready: list[Any] = []
        self.sched_target: Any = None
        self._wake = asyncio.Event()
        self.up = asyncio.Event()
        self.up.set()
        self.down: Any = None
        self.takes: list[str] = []
        self.errors: list[Any] = []
        self.closed = 0
        self.on_take: Any = None

    def release(self, sb: Any) -> None:
        self.released.append(sb)

    async def _get(self, how: str) -> Any:
        self.takes.append(how)
        if self.on_take is not None:
            self.on_take()
        if self.errors:
            e = self.errors.pop(0)
            if e is not None:
                raise e
        return _Sb(pid=len(self.takes))

    async def take(self) -> Any:
        return await self._get("take")

    async def spawn(self) -> Any:
        return await self._get("spawn")

    async def aclose(self) -> None:
        self.closed += 1


class _Fork:
    def __init__(self, log: list[str] | None = None) -> None:
        self.gen = 0
        self.ids: Any = None
        self.not_ready: Any = None
        self.deaths = 2
        self.restarts = 1
        self.log = log if log is not None else []

    async def stop(self) -> None:
        self.log.append("fork.stop")

    def close_fork_server(self) -> None:
        self.log.append("fork.close_fork_server")

    def close_ids(self) -> None:
        self.log.append("fork.close_ids")

    async def close_reaper(self) -> None:
        self.log.append("fork.close_reaper")


def _mgr(**kw: Any) -> tuple[M.CpuManager, _Pool]:
    m = M.CpuManager(CpuManagerConfig(**kw))
    pool = _Pool()
    m._pool = pool  # type: ignore[assignment]
    m.fork = _Fork()  # type: ignore[assignment]
    m._host = "node1"
    return m, pool


def _req(**kw: Any) -> dict[str, Any]:
    r = {
        "op": "run",
        "quota": 1.5,
        "cases": None,
        "compile_timeout": 3.0,
        "run_timeout": 4.0,
        "limits": {"cpus": 2, "uid": 65534, "gid": 65534},
        "lang": {"inproc": False, "compile": None, "run": []},
        "env": {},
    }
    r.update(kw)
    return r


# --- helpers and construction ----------------------------------------------------------------


def test_constants() -> None:
    assert M.POOL_KEY == "sandbox" and M.TAKE_RETRIES == 3


def test_inside() -> None:
    ro = ["/usr/", "/opt/x", "/"]
    assert M._inside(["/usr", "/usr/lib/a", "/usrx", "/opt/x/y", "/opt/xy", "/etc"], ro[:2]) == [
        "/usr",
        "/usr/lib/a",
        "/opt/x/y",
    ]
    assert M._inside(["/etc/a"], ["/"]) == ["/etc/a"]
    assert M._inside(["/a"], []) == []


def test_raise_open_files(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    calls: list[Any] = []
    lim = [(1024, 4096)]
    monkeypatch.setattr(
        resource, "getrlimit", lambda which: (calls.append(("get", which)), lim[0])[1]
    )
    monkeypatch.setattr(resource, "setrlimit", lambda which, v: calls.append(("set", which, v)))
    M._raise_open_files()
    assert calls == [("get", resource.RLIMIT_NOFILE), ("set", resource.RLIMIT_NOFILE, (4096, 4096))]
    calls.clear()
    lim[0] = (4096, 4096)
    M._raise_open_files()
    assert calls == [("get", resource.RLIMIT_NOFILE)]

    def refuse(which: int, v: Any) -> None:
        raise ValueError("no")

    lim[0] = (1, 2)
    monkeypatch.setattr(resource, "setrlimit", refuse)
    M._raise_open_files()  # swallowed
    monkeypatch.setattr(resource, "setrlimit", lambda w, v: (_ for _ in ()).throw(OSError()))
    M._raise_open_files()


def test_init_defaults() -> None:
    m = M.CpuManager()
    assert isinstance(m.config, CpuManagerConfig)
    assert m.sessions.config is m.config and m.sessions.host is m
    assert m.fork.config is m.config
    assert (m._langs, m._report, m._cgroups, m._pool) == ({}, {}, None, None)
    assert (m._running, m._quota, m._started, m._cancelled) == ({}, {}, {}, set())
    assert m._closed is False and m._env == {} and m._base_env is None
    assert (m.images, m.layers, m.userns, m._freezers, m._own_userns) == (
        None,
        None,
        None,
        None,
        False,
    )
    import socket

    assert m._host == socket.gethostname()
    cfg = CpuManagerConfig(warm_min=3)
    assert M.CpuManager(cfg).config is cfg


def test_fork_server_config(tmp_path: Any) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    cfg = CpuManagerConfig(
        extra_ro_paths=(str(tmp_path),),
        hidden_paths=(str(tmp_path / "link"), "/nowhere/else"),
        sandbox_uid=1234,
        sandbox_gid=4321,
        hostname="box",
        max_open_files=77,
        workdir_max_mb=99,
        preload_modules=("os", "re"),
    )
    m = M.CpuManager(cfg)
    m._langs = {
        "a": types.SimpleNamespace(ro_paths=["/la"], compile=None, run=None),  # type: ignore[dict-item]
        "b": types.SimpleNamespace(ro_paths=["/lb1", "/lb2"], compile=None, run=None),
    }
    z = m._fork_server_config()
    ro = [*M.isolation.SYSTEM_RO_PATHS, str(tmp_path), "/la", "/lb1", "/lb2"]
    assert z == {
        "root": "rootfs",
        "ro_paths": ro,
        "hidden_paths": [str(real)],
        "syscall_filter": cfg.syscall_filter,
        "preload": ["os", "re"],
        "workdir_mb": 99,
        "uid": 1234,
        "gid": 4321,
        "hostname": "box",
        "nofile": 77,
        "direct": cfg.direct_python,
        "share_code_ptes": cfg.share_code_ptes,
        "warm_direct": cfg.warm_direct,
        "compiled_setup": cfg.compiled_setup,
        "env": M.payload.env_for(cfg.default_cpus, m._langs),
    }
    cfg2 = CpuManagerConfig(
        syscall_filter=False,
        direct_python=False,
        share_code_ptes=True,
        warm_direct=False,
        compiled_setup=False,
    )
    z2 = M.CpuManager(cfg2)._fork_server_config()
    assert (
        z2["syscall_filter"],
        z2["direct"],
        z2["share_code_ptes"],
        z2["warm_direct"],
        z2["compiled_setup"],
    ) == (False, False, True, False, False)


# --- the image user --------------------------------------------------------------------------


class _Ns:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def idmap(self, fd: int) -> None:
        self.log.append(("idmap", fd))

    def close(self) -> None:
        self.log.append("close")

    def describe(self, how: str) -> str:
        return f"described: {how}"


def _userns_env(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    *,
    make_errors: list[Any],
    tree_error: Any = None,
) -> list[Any]:
    log: list[Any] = []

    def make(base: int, count: int, owner: int = -1) -> _Ns:
        log.append(("make", base, count, owner))
        e = make_errors.pop(0) if make_errors else None
        if e is not None:
            raise e
        return _Ns(log)

    def open_tree_clone(path: str) -> int:
        log.append(("tree", path))
        if tree_error is not None:
            raise tree_error
        import os

        return os.open("/dev/null", os.O_RDONLY)

    monkeypatch.setattr(M.userns, "make", make)
    monkeypatch.setattr(M.overlay, "open_tree_clone", open_tree_clone)
    return log


def _images_at(path: str) -> Any:
    return types.SimpleNamespace(layers_dir=path)


def test_make_userns_off() -> None:
    m, _ = _mgr(image_userns=False, sandbox_uid=1234)
    assert m._make_userns() == "sandbox uid 1234 (image_userns=False)"
    m.fork.ids = types.SimpleNamespace(first=100, count=10)
    assert m._make_userns() == "the sandbox's own uid (of 100-109) (image_userns=False)"


def test_make_userns_shared(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    log = _userns_env(monkeypatch, tmp_path, make_errors=[])
    m, _ = _mgr(image_id_base=100000, image_id_count=300)
    m.images = _images_at(str(tmp_path / "a" / "b"))  # type: ignore[assignment]
    assert m._make_userns() == "described: one namespace for every image sandbox (no sandbox ids)"
    assert log[0] == ("make", 100000, 300, -1)
    assert log[1] == ("tree", str(tmp_path))  # the nearest parent that exists
    assert log[2][0] == "idmap" and len(log) == 3
    assert isinstance(m.userns, _Ns) and m._own_userns is False


def test_make_userns_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    log = _userns_env(monkeypatch, tmp_path, make_errors=[])
    m, _ = _mgr(image_id_base=100000, image_id_count=300)
    m.fork.ids = types.SimpleNamespace(first=100, count=10)
    m.images = _images_at(str(tmp_path))  # type: ignore[assignment]
    assert m._make_userns() == (
        "described: one namespace per image sandbox, owned by its own sandbox id"
    )
    assert log[1] == ("tree", str(tmp_path))
    assert log[3:] == [("make", 100000, 300, 100), "close"]
    assert m._own_userns is True


def test_make_userns_own_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger=M.log.name)
    _userns_env(monkeypatch, tmp_path, make_errors=[None, OSError("EPERM")])
    m, _ = _mgr()
    m._own_userns = True
    m.fork.ids = types.SimpleNamespace(first=100, count=10)
    m.images = _images_at(str(tmp_path))  # type: ignore[assignment]
    assert m._make_userns() == (
        "described: one namespace for every image sandbox: an "
        "unprivileged id cannot make one here (EPERM)"
    )
    assert m._own_userns is False and m.userns is not None
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            M.log.name,
            "WARNING",
            "CPU manager: image sandboxes share the node's user namespace: EPERM",
        )
    ]


def test_make_userns_failures(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    _userns_env(monkeypatch, tmp_path, make_errors=[OSError("no ns")])
    m, _ = _mgr(sandbox_uid=9)
    m.images = _images_at(str(tmp_path))  # type: ignore[assignment]
    assert m._make_userns() == "sandbox uid 9 (no user namespace: no ns)"
    assert m.userns is None
    log = _userns_env(monkeypatch, tmp_path, make_errors=[], tree_error=OSError("no idmap"))
    assert m._make_userns() == "sandbox uid 9 (no idmapped mount of the image cache: no idmap)"
    assert log[-1] == "close" and m.userns is None


# --- health, close, reports ------------------------------------------------------------------


def test_health() -> None:
    m, pool = _mgr()
    assert m.health() == {
        "ready": True,
        "reason": "",
        "down": False,
        "fork_server_deaths": 2,
        "fork_server_restarts": 1,
    }
    m.fork.not_ready = "restarting the fork server"
    assert m.health() == {
        "ready": False,
        "reason": "restarting the fork server",
        "down": False,
        "fork_server_deaths": 2,
        "fork_server_restarts": 1,
    }
    pool.down = "gave up"
    assert m.health()["down"] is True
    m._closed = True
    assert m.health()["ready"] is False
    assert m.health()["reason"] == "the CPU manager is not running"
    m2, _ = _mgr()
    m2._pool = None
    h = m2.health()
    assert (h["ready"], h["reason"], h["down"]) == (False, "the CPU manager is not running", False)


async def test_aclose_order() -> None:
    m, pool = _mgr()
    log: list[str] = []
    m.fork = _Fork(log)  # type: ignore[assignment]

    class _C:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            log.append(self.name)

    orig_pool_close = pool.aclose

    async def pool_close() -> None:
        log.append("pool")
        await orig_pool_close()

    pool.aclose = pool_close  # type: ignore[method-assign]
    orig_sessions = m.sessions.aclose

    async def sessions_close() -> None:
        assert m.sessions.closed is True
        log.append("sessions")
        await orig_sessions()

    m.sessions.aclose = sessions_close  # type: ignore[method-assign]
    m._freezers, m.layers, m.userns, m._cgroups = (  # type: ignore[assignment]
        _C("freezers"),
        _C("layers"),
        _C("userns"),
        _C("cgroups"),
    )
    await m.aclose()
    assert m._closed is True and m.userns is None
    assert log == [
        "fork.stop",
        "sessions",
        "pool",
        "fork.close_fork_server",
        "freezers",
        "layers",
        "userns",
        "cgroups",
        "fork.close_ids",
        "fork.close_reaper",
    ]
    m2, _ = _mgr()
    m2._pool = None
    await m2.aclose()  # nothing of it started


def test_reports() -> None:
    m, pool = _mgr()
    m._report = {"a": True}
    r = m.isolation_report()
    assert r == {"a": True} and r is not m._report
    m._langs = {
        "z": types.SimpleNamespace(description="Z 1"),  # type: ignore[dict-item]
        "a": types.SimpleNamespace(description="A 2"),
    }
    assert list(m.languages().items()) == [("a", "A 2"), ("z", "Z 1")]
    pool.ready = [1, 2, 3]
    assert m.warm_state() == {"sandbox": 3}
    m.set_warm_target("python", 7)
    assert pool.sched_target == 7 and pool._wake.is_set()
    m.set_warm_target("x", -3)
    assert pool.sched_target == 0
    m.set_warm_target("x", 2.9)  # type: ignore[arg-type]
    assert pool.sched_target == 2
    m._pool = None
    assert m.warm_state() == {"sandbox": 0}
    m.set_warm_target("x", 1)


# --- run -------------------------------------------------------------------------------------


def _payload(
    monkeypatch: pytest.MonkeyPatch,
    req: dict[str, Any],
    mem: int = 64 * MIB,
    code: Any = None,
    error: Any = None,
) -> list[Any]:
    seen: list[Any] = []
    code = code or types.SimpleNamespace(image=None, layer_mb=None)

    def request_of(action: Any) -> Any:
        if error is not None:
            raise error
        return code

    def build_request(action: Any, allot: Any, langs: Any, cfg: Any, env: Any, c: Any) -> Any:
        seen.append(("build", action, allot, langs, cfg, env, c))
        return dict(req)

    def memory_bytes(c: Any, allot: Any, cfg: Any) -> int:
        seen.append(("mem", c, allot, cfg))
        return mem

    monkeypatch.setattr(M.payload, "request_of", request_of)
    monkeypatch.setattr(M.payload, "build_request", build_request)
    monkeypatch.setattr(M.payload, "memory_bytes", memory_bytes)
    return seen


def _act(aid: str = "a1", session: Any = None) -> Any:
    return types.SimpleNamespace(id=aid, session=session)


async def test_run_not_running() -> None:
    m, _ = _mgr()
    m._closed = True
    r = await m.run(_act(), Resources())
    assert r == RunResult.sandbox_error("the CPU manager is not running")
    m2, _ = _mgr()
    m2._pool = None
    assert (await m2.run(_act(), Resources())).message == "the CPU manager is not running"


async def test_run_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _mgr()
    _payload(monkeypatch, _req(), error=InvalidAction("payload.code", "missing"))
    r = await m.run(_act(), Resources())
    assert r == RunResult.sandbox_error("payload.code: missing")
    assert m._quota == {} and m._started == {}


async def test_run_pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    m, pool = _mgr(workdir_max_mb=256)
    seen = _payload(monkeypatch, _req(quota=1.5), mem=300 * MIB)
    got: list[Any] = []

    async def exchange(aid: str, sb: Any, req: Any, mem: int) -> Any:
        got.append((aid, sb, req, mem, dict(m._quota), dict(m._started)))
        return RunResult(status=RunStatus.Success)

    m.exchange = exchange  # type: ignore[method-assign]
    allot = Resources(cpu=1.5)
    r = await m.run(_act("a1"), allot)
    assert r.status == RunStatus.Success
    assert seen[0] == ("build", seen[0][1], allot, m._langs, m.config, m._env, seen[0][6])
    aid, sb, req, mem, q, st = got[0]
    assert (aid, mem, q, st) == ("a1", 300 * MIB, {"a1": 1.5}, {"a1": 1.5})
    assert req["tmpfs_mb"] == 150 and pool.released == [sb] and pool.takes == ["take"]
    assert m._quota == {} and m._started == {}
    # at the cap: no tmpfs_mb of its own
    _payload(monkeypatch, _req(), mem=512 * MIB)
    await m.run(_act("a2"), allot)
    assert "tmpfs_mb" not in got[1][2]
    _payload(monkeypatch, _req(), mem=510 * MIB)
    await m.run(_act("a3"), allot)
    assert got[2][2]["tmpfs_mb"] == 255


async def test_run_pooled_own_ids_and_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    m, pool = _mgr()
    _payload(monkeypatch, _req(), mem=512 * MIB)
    got: list[Any] = []

    async def exchange(aid: str, sb: Any, req: Any, mem: int) -> Any:
        got.append(req)
        return RunResult(status=RunStatus.Success)

    m.exchange = exchange  # type: ignore[method-assign]
    orig = pool._get

    async def take_own(how: str) -> Any:
        sb = await orig(how)
        sb.uid = 3001
        return sb

    pool._get = take_own  # type: ignore[method-assign]
    await m.run(_act(), Resources())
    assert got[0]["limits"]["uid"] == 3001 and got[0]["limits"]["gid"] == 3001
    pool._get = orig  # type: ignore[method-assign]
    pool.errors = [RuntimeError("pool gone")]
    r = await m.run(_act(), Resources())
    assert r == RunResult.sandbox_error("no sandbox: pool gone")


async def test_run_dispatch_session_and_image(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _mgr()
    _payload(monkeypatch, _req(op="session"))
    seen: list[Any] = []

    async def in_session(action: Any, req: Any) -> Any:
        seen.append(("session", req["op"], dict(m._quota)))
        return RunResult(status=RunStatus.Success, message="s")

    m._run_in_session = in_session  # type: ignore[method-assign]
    assert (await m.run(_act("x"), Resources())).message == "s"
    assert seen == [("session", "session", {"x": 1.5})] and m._quota == {}
    code = types.SimpleNamespace(image="img", layer_mb=None)
    _payload(monkeypatch, _req(), code=code, mem=5)

    async def in_image(action: Any, req: Any, mem: int, c: Any) -> Any:
        seen.append(("image", mem, c))
        return RunResult(status=RunStatus.Success, message="i")

    m._run_in_image = in_image  # type: ignore[method-assign]
    assert (await m.run(_act("y"), Resources())).message == "i"
    assert seen[-1] == ("image", 5, code)


async def test_run_in_session_delegates() -> None:
    m, _ = _mgr()
    called: list[Any] = []

    async def run(a: Any, r: Any) -> Any:
        called.append((a, r))
        return "res"

    m.sessions.run = run  # type: ignore[method-assign]
    assert await m._run_in_session("A", "R") == "res" and called == [("A", "R")]  # type: ignore[arg-type]


# --- take_sandbox ----------------------------------------------------------------------------


async def test_take_sandbox_retries_only_when_the_fork_server_changed() -> None:
    m, pool = _mgr()
    sb = await m.take_sandbox()
    assert pool.takes == ["take"] and isinstance(sb, _Sb)
    await m.take_sandbox(spawn=True)
    assert pool.takes[-1] == "spawn"
    # the same fork server, up: no retry
    pool.takes.clear()
    pool.errors = [BrokenError("x")]
    with pytest.raises(BrokenError):
        await m.take_sandbox()
    assert pool.takes == ["take"]
    # a restart meanwhile (gen changed): asked again
    pool.takes.clear()
    pool.errors = [BrokenError("x"), None]
    pool.on_take = lambda: setattr(m.fork, "gen", m.fork.gen + 1)
    await m.take_sandbox()
    assert pool.takes == ["take", "take"]
    # the pool is down (restarting): asked again; at most TAKE_RETRIES more times
    pool.on_take = None
    pool.takes.clear()
    pool.up.clear()
    pool.errors = [BrokenError("x")] * 5
    with pytest.raises(BrokenError):
        await m.take_sandbox()
    assert pool.takes == ["take"] * 4
    pool.takes.clear()
    pool.errors = [BrokenError("x")] * 3 + [None]
    await m.take_sandbox(spawn=True)
    assert pool.takes == ["spawn"] * 4
    # closed: no retry
    pool.takes.clear()
    m._closed = True
    pool.errors = [BrokenError("x"), None]
    with pytest.raises(BrokenError):
        await m.take_sandbox()
    assert pool.takes == ["take"]
    # other errors: not retried
    m._closed = False
    pool.takes.clear()
    pool.errors = [RuntimeError("y"), None]
    with pytest.raises(RuntimeError):
        await m.take_sandbox()
    assert pool.takes == ["take"]


# --- lost, weight, quota ---------------------------------------------------------------------


def test_lost() -> None:
    m, _ = _mgr()
    failed = RunResult(status=RunStatus.Failed, message="m", executor_pod_name="p", cpu_time=1.0)
    sb = _Sb()
    sb.maker = _Maker(True)
    r = m._lost(failed, sb)  # type: ignore[arg-type]
    assert r.status == RunStatus.SandboxError
    assert r.message == (
        "the sandbox fork server died while the action ran (its sandbox died "
        "with it; the fork server is restarted)"
    )
    assert r.executor_pod_name == "p" and r.cpu_time == 1.0
    ok = RunResult(status=RunStatus.Success)
    assert m._lost(ok, sb) is ok  # type: ignore[arg-type]
    sb.kept = True
    assert m._lost(failed, sb) is failed  # type: ignore[arg-type]
    sb.kept = False
    sb.maker = _Maker(False)
    assert m._lost(failed, sb) is failed  # type: ignore[arg-type]
    sb.maker = None
    assert m._lost(failed, sb) is failed  # type: ignore[arg-type]
    sb.maker = _Maker(True)
    m._closed = True
    assert m._lost(failed, sb) is failed  # type: ignore[arg-type]


def test_weight_of() -> None:
    m, _ = _mgr(squeezed_weight=0.1)
    assert m.weight_of("a", 2.0) == 1.0  # unknown: its own start
    m._started["a"] = 2.0
    assert m.weight_of("a", 2.0) == 1.0
    assert m.weight_of("a", 2.0 - 5e-10) == 1.0
    assert m.weight_of("a", 2.0 - 2e-9) == 0.1
    assert m.weight_of("a", 1.0) == 0.1
    assert m.weight_of("a", 3.0) == 1.0
    assert m.weight_of("a", 2.0) == 1.0  # grown back: a normal task's again
    assert m.weight_of("b", 1.0) == 1.0  # (not started here)


def test_reconfine_pins_the_squeezed_to_the_last_cpus_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_reconfine` on four CPUs (the pins recorded, not made): each newly squeezed action is
    pinned once; when their quotas need another CPU every confined one is pinned again to the
    new set; grown back, it goes back to every CPU; none squeezed, nothing is pinned."""
    m, _ = _mgr()
    m._cgroups = object()  # type: ignore[assignment]
    pins: list[tuple[str, set[int]]] = []
    monkeypatch.setattr(M.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(M, "pin", lambda slot, cpus: pins.append((slot, set(cpus))))
    a, b = _Sb(slot="slot-a"), _Sb(slot="slot-b")
    m._running.update(a=a, b=b)  # type: ignore[dict-item]
    m._started.update(a=1.0, b=1.0)
    m._quota.update(a=0.5, b=1.0)
    m._reconfine()
    assert (pins, m._pinned, set(m._confined)) == ([("slot-a", {3})], (3,), {"a"})
    m._quota["b"] = 0.5  # (1.0 core squeezed: the same CPU)
    m._reconfine()
    assert (pins[1:], m._pinned) == ([("slot-b", {3})], (3,))
    m._quota["b"] = 0.75  # (1.25 cores: two CPUs, both pinned again)
    m._reconfine()
    assert (sorted(pins[2:]), m._pinned) == ([("slot-a", {2, 3}), ("slot-b", {2, 3})], (2, 3))
    m._quota["a"] = 1.0  # (a grown back: every CPU; b alone needs one)
    m._reconfine()
    assert (pins[4:], m._pinned, set(m._confined)) == (
        [("slot-a", {0, 1, 2, 3}), ("slot-b", {3})], (3,), {"b"})
    m._quota["b"] = 1.0
    m._reconfine()
    assert (pins[6:], m._pinned, m._confined) == ([("slot-b", {0, 1, 2, 3})], (), {})
    m._reconfine()
    assert len(pins) == 7


def test_quota_of() -> None:
    m, _ = _mgr()
    assert m.quota_of("a", 1.25) == 1.25
    m._quota["a"] = 0.5
    assert m.quota_of("a", 1.25) == 0.5


# --- exchange and results --------------------------------------------------------------------


async def test_exchange_registers_and_results(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _mgr(squeezed_weight=0.3)
    sb = _Sb(pid=42, slot=_Slot())
    seen: list[Any] = []
    orig = sb.request

    async def req(msg: Any, timeout: Any = None) -> Any:
        seen.append((dict(m._running), timeout))
        return await orig(msg, timeout)

    sb.request = req  # type: ignore[method-assign]
    m._quota["a"] = 0.75
    m._started["a"] = 1.0
    m._cancelled.add("a")
    r = await m.exchange(
        "a",
        sb,
        _req(cases=[{}, {}], compile_timeout=3.0, run_timeout=4.0, limits={"cpus": 2}),
        100 * MIB,
    )
    assert seen[0][0] == {"a": sb}
    assert seen[0][1] == Timeouts(3.0, 4.0, None).reply_budget_s(3, 2) == 3.0 + 10.0 + 4.0 * 2
    assert sb.limits == [(0.75, 100 * MIB, 0.3)]
    assert m._running == {} and m._cancelled == set()
    assert r.status == RunStatus.SandboxError and r.message == "cancelled"  # cancelled meanwhile
    assert r.executor_pod_name == "node1/sandbox-42"
    assert (r.cpu_time, r.peak_memory_mb, r.memory_exceeded) == (1.234568, 12.5, False)


async def test_exchange_quota_default_total_and_lost() -> None:
    m, _ = _mgr()
    sb = _Sb(pid=5)
    sb.maker = _Maker(True)
    sb.reply = {"run_result": {"status": "Finished", "return_code": 1}}
    r = await m.exchange("b", sb, _req(quota=2.5, total_timeout=1.5), 7)
    assert sb.limits == [(2.5, 7, 1.0)]
    assert sb.requests[0][1] == 1.5 + 10.0
    assert r.status == RunStatus.SandboxError and r.message.startswith("the sandbox fork server")
    assert (r.cpu_time, r.peak_memory_mb) == (None, None)


async def test_exchange_errors() -> None:
    m, _ = _mgr()
    sb = _Sb(pid=6)
    sb.limit_error = OSError("EBUSY")
    r = await m._exchange("c", sb, _req(), 1)
    assert r == RunResult.sandbox_error("cannot set limits: EBUSY", "node1/sandbox-6")
    assert sb.requests == []
    for e, text in [
        (OSError("o"), "OSError: o"),
        (EOFError("e"), "EOFError: e"),
        (
            asyncio.IncompleteReadError(b"", 4),
            "IncompleteReadError: 0 bytes read on a total of 4 expected bytes",
        ),
        (ValueError("v"), "ValueError: v"),
        (TimeoutError("t"), "TimeoutError: t"),
    ]:
        sb = _Sb(pid=6)
        sb.reply = e
        r = await m._exchange("c", sb, _req(), 1)
        assert r.status == RunStatus.SandboxError and r.message == f"sandbox broke: {text}"
    sb = _Sb(pid=6)
    sb.reply = RuntimeError("other")
    with pytest.raises(RuntimeError):
        await m._exchange("c", sb, _req(), 1)


async def test_exchange_direct_path(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _mgr()
    m._base_env = {"E": "1"}
    calls: list[Any] = []

    async def dexchange(sb: Any, req: Any, budget: float, env: Any) -> Any:
        calls.append((sb, budget, env))
        return {"run_result": {"status": "Finished", "return_code": 0}}

    monkeypatch.setattr(M.direct, "exchange", dexchange)
    sb = _Sb(pid=8)
    sb.outs = (5, 6)
    req = _req(lang={"inproc": True, "compile": None, "run": []})
    r = await m._exchange("d", sb, req, 1)
    assert r.status == RunStatus.Success and calls == [(sb, 3.0 + 10.0 + 4.0, {"E": "1"})]
    assert sb.requests == []
    r = await m._exchange("d", sb, _req(), 1)  # not eligible: the init's request
    assert len(calls) == 1 and len(sb.requests) == 1
    sb.outs = ()
    await m._exchange("d", sb, req, 1)  # no pipes: the request
    assert len(calls) == 1 and len(sb.requests) == 2


def test_result_variants() -> None:
    m, _ = _mgr()
    sb = _Sb(slot=_Slot())
    sb.slot.stats = (2.0, 3.0, 1)
    r = m._result("x", {"error": "init died"}, sb, "pod")  # type: ignore[arg-type]
    assert r == RunResult(
        status=RunStatus.SandboxError,
        message="init died",
        executor_pod_name="pod",
        cpu_time=2.0,
        peak_memory_mb=3.0,
        memory_exceeded=True,
    )
    sb.slot.stats = OSError("gone")
    r = m._result("x", {"error": 5}, sb, "pod")  # type: ignore[arg-type]
    assert r.message == "5" and r.cpu_time is None and r.memory_exceeded is False
    sb.slot.stats = ValueError("bad")
    r = m._result("x", {"run_result": {"status": "Finished", "return_code": 0}}, sb, "p")  # type: ignore[arg-type]
    assert r.status == RunStatus.Success and r.cpu_time is None


async def test_cancel() -> None:
    m, _ = _mgr()
    await m.cancel("nope")
    assert m._cancelled == set()
    sb = _Sb()
    m._running["a"] = sb  # type: ignore[assignment]
    await m.cancel("a")
    assert m._cancelled == {"a"} and sb.killed == 1


async def test_resize() -> None:
    m, _ = _mgr(squeezed_weight=0.5)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError) as ei:
            await m.resize("a", {"cpu": bad})  # type: ignore[arg-type]
        assert str(ei.value) == f"resize of a: allotment cpu must be a positive number, got {bad!r}"
    with pytest.raises(ValueError, match=r"got 0\.0$"):
        await m.resize("a", Resources())
    assert await m.resize("a", Resources(cpu=1)) == "dropped"
    m._quota["a"] = 2.0
    m._started["a"] = 2.0
    assert await m.resize("a", Resources(cpu=1)) == "deferred" and m._quota["a"] == 1.0
    sb = _Sb(slot=_Slot())
    sb.memory = 123
    m._running["a"] = sb  # type: ignore[assignment]
    assert await m.resize("a", Resources(cpu=1.5)) == "applied"
    assert sb.limits == [(1.5, 123, 0.5)] and m._quota["a"] == 1.5
    sb.limit_error = OSError("x")
    assert await m.resize("a", Resources(cpu=3)) == "dropped"
    sb.limit_error = None
    sb.dead = True
    assert await m.resize("a", Resources(cpu=3)) == "dropped"
    sb.dead = False
    sb.slot = None
    assert await m.resize("a", Resources(cpu=3)) == "dropped"
    assert len(sb.limits) == 1


# --- images ----------------------------------------------------------------------------------


class _Images:
    def __init__(self) -> None:
        self.acquired: list[str] = []
        self.released: list[str] = []
        self.error: Any = None
        self.layers_dir = "/nonexistent-layers"

    def acquire(self, name: str) -> Any:
        self.acquired.append(name)
        if self.error is not None:
            raise self.error
        return types.SimpleNamespace(name=name, config={})

    def release(self, name: str) -> None:
        self.released.append(name)


class _Layers:
    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.taken: list[Any] = []
        self.given: list[Any] = []
        self.error: Any = None

    def take(self, mb: int, owner: Any = None) -> Any:
        self.taken.append((mb, owner))
        if self.error is not None:
            raise self.error
        closed: list[int] = []
        return types.SimpleNamespace(
            mb=mb + 1, fd=-1, close=lambda: closed.append(1), closed=closed
        )

    def give_back(self, mb: int, owner: Any = None) -> None:
        self.given.append((mb, owner))


async def test_run_in_image_values(monkeypatch: pytest.MonkeyPatch) -> None:
    m, pool = _mgr(image_layer_mb=600)
    m.images = _Images()  # type: ignore[assignment]
    m.layers = _Layers()  # type: ignore[assignment]
    entered: list[Any] = []

    async def enter(sb: Any, img: Any, mb: int, owner: Any = None) -> Any:
        entered.append((sb, img.name, mb, owner))
        return 601, overlay.Inside(python="/ipy")

    m.enter_image = enter  # type: ignore[method-assign]
    got: list[Any] = []

    async def exchange(aid: str, sb: Any, req: Any, mem: int) -> Any:
        got.append((aid, sb, req, mem))
        return RunResult(status=RunStatus.Success)

    m.exchange = exchange  # type: ignore[method-assign]
    seen: list[Any] = []

    def image_request(req: Any, img: Any, inside: Any, layer_mb: Any) -> Any:
        seen.append((req["limits"]["uid"], img.name, inside, layer_mb))
        return {**req, "in_image": True}

    monkeypatch.setattr(M.overlay, "image_request", image_request)
    code = types.SimpleNamespace(image="py", layer_mb=None)
    r = await m._run_in_image(_act("a"), _req(), 9, code)  # type: ignore[arg-type]
    assert r.status == RunStatus.Success
    sb = got[0][1]
    assert pool.takes == ["spawn"] and entered == [(sb, "py", 600, None)]
    assert seen == [(65534, "py", overlay.Inside(python="/ipy"), 600)]
    assert got[0][0] == "a" and got[0][2]["in_image"] is True and got[0][3] == 9
    assert pool.released == [sb] and m.layers.given == [(601, None)]
    assert m.images.released == ["py"]
    code = types.SimpleNamespace(image="py", layer_mb=50)
    await m._run_in_image(_act("a"), _req(), 9, code)  # type: ignore[arg-type]
    assert entered[-1][2] == 50 and seen[-1][3] == 50


async def test_run_in_image_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    m, pool = _mgr()
    code = types.SimpleNamespace(image="py", layer_mb=None)
    r = await m._run_in_image(_act(), _req(), 1, code)  # type: ignore[arg-type]
    assert r == RunResult.sandbox_error("payload.image: must be the name of an image")
    m.images = _Images()  # type: ignore[assignment]
    r = await m._run_in_image(_act(), _req(), 1, types.SimpleNamespace(image=3, layer_mb=None))  # type: ignore[arg-type]
    assert r.message == "payload.image: must be the name of an image"
    m.images.error = ImageError("unknown image 'py'")
    r = await m._run_in_image(_act(), _req(), 1, code)  # type: ignore[arg-type]
    assert r == RunResult.sandbox_error("payload.image: unknown image 'py'")
    assert m.images.released == [] and pool.takes == []
    m.images.error = None
    pool.errors = [RuntimeError("no fork")]
    r = await m._run_in_image(_act(), _req(), 1, code)  # type: ignore[arg-type]
    assert r == RunResult.sandbox_error("image 'py': RuntimeError: no fork")
    assert m.images.released == ["py"] and pool.released == []

    async def enter_fails(sb: Any, img: Any, mb: int, owner: Any = None) -> Any:
        raise ImageError("cannot enter image 'py': ENOSPC")

    m.enter_image = enter_fails  # type: ignore[method-assign]
    m.layers = _Layers()  # type: ignore[assignment]
    r = await m._run_in_image(_act(), _req(), 1, code)  # type: ignore[arg-type]
    assert r == RunResult.sandbox_error("cannot enter image 'py': ENOSPC")
    assert len(pool.released) == 1 and m.layers.given == [] and m.images.released == ["py"] * 2


async def test_enter_image(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _mgr(sandbox_gid=4444)
    m.images = _Images()  # type: ignore[assignment]
    m.layers = _Layers()  # type: ignore[assignment]
    m.userns = "NS"  # type: ignore[assignment]
    calls: list[Any] = []
    reply: list[Any] = [{"ok": True, "python": "/p", "cwd": "/w"}]

    async def enter(
        sb: Any,
        store: Any,
        img: Any,
        layer_mb: int,
        uid: int,
        gid: int,
        layer: Any = None,
        timeout: float = 30.0,
        userns: Any = None,
        owner: int = -1,
    ) -> Any:
        calls.append((store, img.name, layer_mb, uid, gid, layer, userns, owner))
        if isinstance(reply[0], BaseException):
            raise reply[0]
        return reply[0]

    monkeypatch.setattr(M.overlay, "enter_image", enter)
    sb = _Sb(uid=3000)
    img = types.SimpleNamespace(name="py")
    held, inside = await m.enter_image(sb, img, 100, "alice")  # type: ignore[arg-type]
    assert held == 101 and inside == overlay.Inside(python="/p", cwd="/w")
    layer = calls[0][5]
    assert calls[0] == (m.images, "py", 100, 3000, 4444, layer, "NS", -1)
    assert layer.closed == [1] and m.layers.taken == [(100, "alice")] and m.layers.given == []
    m.fork.ids = types.SimpleNamespace(first=1, count=1)
    m._own_userns = True
    await m.enter_image(sb, img, 100)  # type: ignore[arg-type]
    assert calls[1][4] == 3000 and calls[1][7] == 3000
    reply[0] = {"error": "ENOSPC"}
    with pytest.raises(ImageError, match=r"^cannot enter image 'py': ENOSPC$"):
        await m.enter_image(sb, img, 100, "bob")  # type: ignore[arg-type]
    assert m.layers.given == [(101, "bob")]
    reply[0] = OSError("x")
    with pytest.raises(OSError):
        await m.enter_image(sb, img, 10, "c")  # type: ignore[arg-type]
    assert m.layers.given[-1] == (11, "c") and calls[-1][5].closed == [1]
    # no disk layers: a tmpfs, nothing held
    m.layers = _Layers(available=False)  # type: ignore[assignment]
    reply[0] = {"ok": True}
    held, _ = await m.enter_image(sb, img, 10)  # type: ignore[arg-type]
    assert held == 0 and calls[-1][5] is None and m.layers.taken == []
    m.layers = None
    reply[0] = {"error": "e"}
    with pytest.raises(ImageError):
        await m.enter_image(sb, img, 10)  # type: ignore[arg-type]


def test_gid() -> None:
    m, _ = _mgr(sandbox_gid=4444)
    sb = _Sb(uid=3000)
    assert m._gid(sb) == 4444  # type: ignore[arg-type]
    m.fork.ids = types.SimpleNamespace(first=1, count=1)
    assert m._gid(sb) == 3000  # type: ignore[arg-type]


# --- sessions' delegations -------------------------------------------------------------------


async def test_session_delegations() -> None:
    m, _ = _mgr()
    log: list[Any] = []

    async def aopen(*a: Any) -> None:
        log.append(("open", a))

    async def aclose(sid: str) -> None:
        log.append(("close", sid))

    async def reclaim(sid: str) -> int:
        log.append(("reclaim", sid))
        return 11

    async def reclaim_idle(n: int) -> int:
        log.append(("idle", n))
        return 22

    m.sessions.open = aopen  # type: ignore[method-assign]
    m.sessions.close = aclose  # type: ignore[method-assign]
    m.sessions.reclaim = reclaim  # type: ignore[method-assign]
    m.sessions.reclaim_idle = reclaim_idle  # type: ignore[method-assign]
    m.sessions.memory_use = lambda: ({"s": (1, 2)}, 3)  # type: ignore[method-assign]
    d = Resources(cpu=1)
    await m.open_session("s", d, 5.0, "img", 7, "own")
    await m.close_session("s")
    assert await m.reclaim_session("s") == 11 and await m.reclaim_idle(99) == 22
    assert log == [
        ("open", ("s", d, 5.0, "img", 7, "own")),
        ("close", "s"),
        ("reclaim", "s"),
        ("idle", 99),
    ]
    assert m.memory_use() == ({"s": (1, 2)}, 3)
    m.sessions.by_id = {"b": 1, "a": 2}  # type: ignore[dict-item]
    assert m.session_ids() == ["a", "b"] and m.has_session("a") and not m.has_session("c")
    reserved: list[Any] = []
    m.layers = types.SimpleNamespace(reserve=reserved.append)  # type: ignore[assignment]
    m.set_layer_reservations({"t": 5})
    assert reserved == [{"t": 5}]
    m.layers = None
    m.set_layer_reservations({"t": 5})


# --- build_result ----------------------------------------------------------------------------


def _stage(status: str = "Finished", rc: int | None = 0, **kw: Any) -> dict[str, Any]:
    return {"status": status, "return_code": rc, **kw}


def test_build_result_plain() -> None:
    r = M.build_result({"run_result": _stage(stdout="hi")}, "pod", {"cpu_time": 1.0})
    assert r == RunResult(
        status=RunStatus.Success,
        message="",
        run_result=StageResult(CommandRunStatus.Finished, None, 0, "hi"),
        executor_pod_name="pod",
        files={},
        output_truncated=False,
        cases=None,
        timeout_s_exceeded=False,
        cpu_time=1.0,
    )
    r = M.build_result({"run_result": _stage(rc=1)}, "pod", {})
    assert r.status == RunStatus.Failed and r.message == ""
    r = M.build_result({}, "pod", {})
    assert r.status == RunStatus.Failed and r.run_result is None and r.compile_result is None


def test_build_result_compile_failed_and_truncated() -> None:
    r = M.build_result(
        {"compile_result": _stage(rc=1, truncated=True), "run_result": _stage()}, "p", {}
    )
    assert r.status == RunStatus.Failed and r.message == "compile failed"
    assert r.output_truncated is True and r.compile_result.return_code == 1
    r = M.build_result({"compile_result": _stage(), "run_result": _stage(truncated=True)}, "p", {})
    assert r.status == RunStatus.Success and r.output_truncated is True


def test_build_result_cases() -> None:
    reply = {
        "cases": [
            {"index": 0, "passed": True, "run_result": _stage()},
            {"index": "1", "passed": 0, "run_result": _stage(rc=1, truncated=True)},
            {"index": 2, "passed": False, "skipped": 1},
        ]
    }
    r = M.build_result(reply, "p", {})
    assert r.status == RunStatus.Failed and r.message == "1/3 cases passed"
    assert r.cases[1].index == 1 and r.cases[1].passed is False
    assert r.cases[2].run is None and r.cases[2].skipped is True and r.cases[0].skipped is False
    assert r.output_truncated is True
    r = M.build_result({"cases": [{"index": 0, "passed": True}]}, "p", {})
    assert r.status == RunStatus.Success and r.message == "1/1 cases passed"
    r = M.build_result({"cases": []}, "p", {})
    assert r.status == RunStatus.Success and r.message == "0/0 cases passed" and r.cases == ()


def test_build_result_messages() -> None:
    r = M.build_result({"run_result": _stage(rc=137)}, "p", {"memory_exceeded": True})
    assert r.message == "memory limit exceeded" and r.memory_exceeded is True
    r = M.build_result({"cases": [{"index": 0, "passed": False}]}, "p", {"memory_exceeded": True})
    assert r.message == "memory limit exceeded; 0/1 cases passed"
    kill = (
        "killed by SIGKILL, not by a limit of the sandbox (from outside it, or by the "
        "program itself)"
    )
    r = M.build_result({"run_result": _stage(rc=-9)}, "p", {})
    assert r.message == kill and r.status == RunStatus.Failed
    r = M.build_result(
        {"run_result": _stage(rc=-9), "cases": [{"index": 0, "passed": True}]}, "p", {}
    )
    assert r.message == f"{kill}; 1/1 cases passed"
    r = M.build_result({"run_result": _stage("TimeLimitExceeded", rc=-9)}, "p", {})
    assert r.message == ""
    r = M.build_result({"run_result": _stage(rc=-15)}, "p", {})
    assert r.message == ""
    r = M.build_result({"run_result": _stage(), "message": "note"}, "p", {})
    assert r.message == "note" and r.status == RunStatus.Success
    r = M.build_result(
        {"run_result": _stage(rc=1), "compile_result": _stage(rc=2), "message": "note"}, "p", {}
    )
    assert r.message == "compile failed; note"
    r = M.build_result({"run_result": _stage(), "timed_out": "2 of 3 cases ran"}, "p", {})
    assert r.status == RunStatus.Failed and r.message == "2 of 3 cases ran"
    assert r.timeout_s_exceeded is True
    r = M.build_result({"run_result": _stage(), "message": "m", "timed_out": "t"}, "p", {})
    assert r.message == "m; t"
    r = M.build_result({"run_result": _stage(), "timed_out": ""}, "p", {})
    assert r.status == RunStatus.Success and r.timeout_s_exceeded is False
    r = M.build_result({"run_result": _stage(), "files": {"a": "QQ=="}}, "p", {})
    assert r.files == {"a": "QQ=="}
    r = M.build_result({"run_result": _stage(), "files": None}, "p", {})
    assert r.files == {}


# --- start -----------------------------------------------------------------------------------


class _Tree:
    made: list[Any] = []

    def __init__(self, weight: float) -> None:
        _Tree.made.append(self)
        self.weight = weight
        self.bases = {"cpu": "/cg/a", "memory": "/cg/b", "pids": "/cg/a"}
        self.stale: list[str] = []
        self.log: list[Any] = []

    def join_dirs(self) -> list[str]:
        return ["/cg/join"]

    def remove_stale(self) -> list[str]:
        return self.stale

    def close(self) -> None:
        self.log.append("close")


class _StartFork:
    def __init__(self, hello: dict[str, Any]) -> None:
        self.hello = hello
        self.log: list[Any] = []
        self.ids: Any = None
        self.zygote = "ZYGOTE"
        self.claim_error: Any = None
        self.gen, self.not_ready, self.deaths, self.restarts = 0, None, 0, 0

    def start_reaper(self, bases: list[str]) -> None:
        self.log.append(("start_reaper", bases))

    async def claim_ids(self) -> None:
        self.log.append("claim_ids")
        if self.claim_error is not None:
            raise self.claim_error
        self.ids = types.SimpleNamespace(first=7000, count=100)

    async def start(self, zcfg: dict[str, Any], join: list[str]) -> dict[str, Any]:
        self.log.append(("start", dict(zcfg), join))
        return self.hello

    def supervise(self, pool: Any) -> None:
        self.log.append(("supervise", pool))

    def configure_reaper(self, **kw: Any) -> None:
        self.log.append(("configure_reaper", kw))

    async def stop(self) -> None:
        self.log.append("stop")

    def close_fork_server(self) -> None:
        pass

    def close_ids(self) -> None:
        pass

    async def close_reaper(self) -> None:
        pass


class _StartPool:
    def __init__(self, zygote: Any, cgroups: Any, **kw: Any) -> None:
        self.args = (zygote, cgroups, kw)
        self.started = 0
        self.ready: list[Any] = []

    def start(self) -> None:
        self.started += 1

    async def aclose(self) -> None:
        pass


def _start_env(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    hello: dict[str, Any],
    missing: list[str] | None = None,
    **cfg: Any,
) -> tuple[M.CpuManager, list[Any]]:
    log: list[Any] = []
    monkeypatch.setattr(M, "_raise_open_files", lambda: log.append("nofile"))

    async def detect() -> Any:
        return {
            "python": types.SimpleNamespace(
                ro_paths=[], compile=None, run=None, description="Python"
            )
        }

    monkeypatch.setattr(M.languages, "detect", detect)
    _Tree.made = []
    monkeypatch.setattr(M, "CgroupTree", _Tree)
    monkeypatch.setattr(M, "WarmPool", _StartPool)

    async def probe(pool: Any, h: Any, cg: Any, c: Any) -> Any:
        log.append(("probe", h))
        return "PROBE"

    monkeypatch.setattr(M.isolation, "probe", probe)
    monkeypatch.setattr(
        M.isolation, "report", lambda h, p, cg, c: (log.append(("report", p)), {"r": True})[1]
    )
    monkeypatch.setattr(M.isolation, "missing", lambda rep: list(missing or []))
    monkeypatch.setattr(
        M.overlay, "FreezerTree", lambda cg: types.SimpleNamespace(base="/fz/base", cg=cg)
    )
    m = M.CpuManager(CpuManagerConfig(work_root=str(tmp_path), **cfg))
    m.fork = _StartFork(hello)  # type: ignore[assignment]

    async def start_images() -> None:
        log.append("images")

    m._start_images = start_images  # type: ignore[method-assign]
    m.sessions.start = lambda p, c, f: log.append(("sessions", p, c, f))  # type: ignore[method-assign]
    return m, log


async def test_start_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hello = {"ok": True, "compiled_setup": True, "cgroup_join": 1}
    m, log = _start_env(
        monkeypatch,
        tmp_path,
        hello,
        sandbox_weight=0.5,
        warm_min=1,
        warm_max=5,
        pids_max=99,
        default_cpus=1.5,
        default_memory_mb=300,
        direct_python=False,
    )
    _Tree.made = []
    m.layers = types.SimpleNamespace(dir="/l", prefix="p-")  # type: ignore[assignment]
    caplog.set_level("ERROR")
    orig_tree = _Tree.__init__

    def tree_init(self: Any, weight: float) -> None:
        orig_tree(self, weight)
        self.stale = [f"/stale/{i}" for i in range(10)]

    monkeypatch.setattr(_Tree, "__init__", tree_init)
    await m.start()
    tree = _Tree.made[0]
    fork = m.fork
    assert log[0] == "nofile" and tree.weight == 0.5
    assert fork.log[0] == ("start_reaper", ["/cg/a", "/cg/b"])
    assert fork.log[1] == "claim_ids"
    name, zcfg, join = fork.log[2]
    assert name == "start" and join == ["/cg/join"] and zcfg["ids"] == [7000, 100]
    assert zcfg == {**m._fork_server_config(), "ids": [7000, 100]}
    assert os.path.isdir(os.path.join(str(tmp_path), "rootfs"))
    assert m._base_env == zcfg["env"]
    pool = m._pool
    assert pool.args == (
        "ZYGOTE",
        tree,
        {
            "warm_min": 1,
            "warm_max": 5,
            "pids_max": 99,
            "default_cpu": 1.5,
            "default_mem": 300 << 20,
            "self_join": True,
            "direct": False,
        },
    )
    assert fork.log[3] == ("supervise", pool) and pool.started == 1
    assert ("probe", hello) in log and ("report", "PROBE") in log
    assert m._report == {"r": True} and "images" in log
    assert m._freezers.base == "/fz/base" and m._freezers.cg is tree
    assert fork.log[4] == ("configure_reaper", {"freezer": "/fz/base", "layers": ["/l", "p-"]})
    assert log[-1] == ("sessions", pool, tree, m._freezers)
    assert caplog.messages == [
        "CPU manager: 10 stale cgroup(s) of dead managers left: "
        + ", ".join(f"/stale/{i}" for i in range(8))
    ]


async def test_start_options_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hello = {"ok": True}
    m, _log = _start_env(
        monkeypatch,
        tmp_path,
        hello,
        sandbox_id_count=0,
        cgroup_self_join=False,
        freeze_sessions=False,
    )
    caplog.set_level("ERROR")
    await m.start()
    fork = m.fork
    assert "claim_ids" not in fork.log
    _, zcfg, join = fork.log[1]
    assert "ids" not in zcfg and join == []
    assert m._base_env is None and m._pool.args[2]["self_join"] is False
    assert m._freezers is None
    assert fork.log[-1] == ("configure_reaper", {"freezer": None, "layers": None})
    assert caplog.messages == []


async def test_start_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from arl_tangram.core.errors import IsolationUnavailable

    m, log = _start_env(monkeypatch, tmp_path, {"ok": True}, missing=["seccomp", "netns"])
    closed: list[int] = []

    async def aclose() -> None:
        closed.append(1)

    m.aclose = aclose  # type: ignore[method-assign]
    with pytest.raises(IsolationUnavailable) as ei:
        await m.start()
    assert str(ei.value) == (
        "sandbox isolation incomplete, missing: seccomp, netns (set "
        "allow_reduced_isolation=True to run anyway)"
    )
    assert closed == [1] and m._pool.started == 0
    m, log = _start_env(
        monkeypatch, tmp_path, {"ok": True}, missing=["seccomp"], allow_reduced_isolation=True
    )
    await m.start()
    assert m._pool.started == 1
    m, log = _start_env(monkeypatch, tmp_path, {"ok": False, "error": "no userns"})
    m.aclose = aclose  # type: ignore[method-assign]
    with pytest.raises(IsolationUnavailable, match=r"^sandbox fork server failed: no userns$"):
        await m.start()
    assert closed == [1, 1] and ("report", None) in log
    assert not any(e[0] == "probe" for e in log if isinstance(e, tuple))
    m, log = _start_env(monkeypatch, tmp_path, {"ok": True})
    m.fork.claim_error = OSError("no ids left")
    m.aclose = aclose  # type: ignore[method-assign]
    with pytest.raises(IsolationUnavailable, match=r"^sandbox ids: no ids left$") as ei:
        await m.start()
    assert ei.value.__suppress_context__ and closed == [1, 1, 1]
    m.fork.claim_error = ValueError("bad range")
    with pytest.raises(IsolationUnavailable, match=r"^sandbox ids: bad range$"):
        await m.start()


async def test_start_images(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    made: list[Any] = []

    class _Store:
        def __init__(self, d: str, limits: Any, **kw: Any) -> None:
            made.append(("store", d, limits, kw))

    class _LS:
        def __init__(self, d: str, mb: int, budget: int, warm: int) -> None:
            made.append(("layers", d, mb, budget, warm))
            self.available = True
            self.problem = ""
            self.reserved: list[Any] = []

        def reserve(self, r: dict[str, int]) -> None:
            self.reserved.append(r)

    monkeypatch.setattr(M, "ImageStore", _Store)
    monkeypatch.setattr(M, "LayerStore", _LS)
    cfg = dict(
        work_root=str(tmp_path),
        image_tenant_max_mb=3,
        image_store_max_mb=4,
        image_layer_mb=50,
        layer_budget_mb=60,
        layers_warm=1,
        layer_reservations={"t": 5},
    )
    m = M.CpuManager(CpuManagerConfig(**cfg))
    m._make_userns = lambda: "ns report"  # type: ignore[method-assign]
    await m._start_images()
    c = m.config
    assert made[0] == (
        "store",
        c.image_cache_dir(),
        c.image_limits(),
        {"owner_max_bytes": 3 << 20, "max_total_bytes": 4 << 20},
    )
    assert made[1] == ("layers", M.layers.default_dir(str(tmp_path)), 50, 60, 1)
    assert m.layers.reserved == [{"t": 5}]
    assert m._report == {"image_user": "ns report", "image_layer": "disk"}
    made.clear()
    m = M.CpuManager(
        CpuManagerConfig(**{**cfg, "layers_dir": str(tmp_path / "L"), "layer_reservations": {}})
    )
    m._make_userns = lambda: "u"  # type: ignore[method-assign]
    await m._start_images()
    assert made[1][1] == str(tmp_path / "L") and m.layers.reserved == []
    m.layers.available = False
    m.layers.problem = "no loop devices"
    await m._start_images()
    m.layers.available = False
    m.layers.problem = "no loop devices"
    m._report = {}
    m2 = M.CpuManager(CpuManagerConfig(**{**cfg, "layers_on_disk": False}))
    m2._make_userns = lambda: "u"  # type: ignore[method-assign]
    await m2._start_images()
    assert m2.layers is None
    assert m2._report["image_layer"] == "memory (layers_on_disk=False)"

    class _LSoff(_LS):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            self.available = False
            self.problem = "no loop devices"

    monkeypatch.setattr(M, "LayerStore", _LSoff)
    m3 = M.CpuManager(CpuManagerConfig(**cfg))
    m3._make_userns = lambda: "u"  # type: ignore[method-assign]
    await m3._start_images()
    assert m3._report["image_layer"] == "memory (no loop devices)"
