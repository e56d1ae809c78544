"""The manager side of a direct action (`host/direct.py`) with a fake sandbox (issue 43, mutation
testing): which requests go direct, the capped output and its truncation flag, the reply's exact
shape, the exit code from the report or from the fork server, the time limit and its kill. No
sandbox starts: the sandbox is a fake whose output pipes are real pipes."""

from __future__ import annotations

import asyncio
import fcntl
import os
from typing import Any

import pytest

from arl_tangram.managers.cpu import wire
from arl_tangram.managers.cpu.host import direct as dr


def test_constants() -> None:
    assert dr._EXIT_WAIT_S == 2.0
    assert dr._LAZY_S == 0.02


def _req(**kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "op": "run",
        "lang": {"name": "python", "file": "main.py", "compile": None, "run": None, "inproc": True},
        "code": "print(1)",
        "stdin": "",
        "env": {"A": "1"},
        "files": {},
        "limits": {
            "output": 8,
            "uid": 1000,
            "gid": 1000,
            "cpu_s": 5,
            "fsize": 1 << 20,
            "nofile": 64,
            "cpus": 1.0,
        },
        "run_timeout": 3,
        "cases": None,
        "fetch_files": [],
    }
    r.update(kw)
    return r


def test_eligible() -> None:
    assert dr.eligible(_req()) is True
    assert dr.eligible(_req(op="compile")) is False
    assert dr.eligible(_req(lang={"name": "c", "file": "main.c", "inproc": False})) is False
    assert dr.eligible(_req(lang={"name": "c", "file": "main.c"})) is False
    assert (
        dr.eligible(_req(lang={"name": "py", "file": "m.py", "inproc": True, "compile": ["x"]}))
        is False
    )
    assert dr.eligible(_req(cases=[])) is False
    assert dr.eligible(_req(fetch_files=["out.txt"])) is False
    r = _req()
    del r["cases"], r["fetch_files"]
    assert dr.eligible(r) is True


class _Loop:
    def __init__(self) -> None:
        self.added: list[tuple[int, Any]] = []
        self.removed: list[int] = []

    def add_reader(self, fd: int, cb: Any) -> None:
        self.added.append((fd, cb))

    def remove_reader(self, fd: int) -> None:
        self.removed.append(fd)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    return r, w


def test_output_caps_and_flags() -> None:
    loop = _Loop()
    r, w = _pipe()
    try:
        o = dr._Output(loop, r, 4)  # type: ignore[arg-type]
        assert (o.buf, o.truncated, o.watched, o.cap, o.fd) == (bytearray(), False, False, 4, r)
        os.write(w, b"abc")
        o.drain()
        assert o.buf == b"abc" and o.truncated is False and o.fd == r
        os.write(w, b"d")
        o.drain()
        assert o.buf == b"abcd" and o.truncated is False  # exactly the cap: whole
        os.write(w, b"e")
        o.drain()
        assert o.buf == b"abcd" and o.truncated is True
        os.close(w)
        w = -1
        o.drain()  # end of file: stopped
        assert o.fd == -1 and loop.removed == []  # (never watched: no reader to remove)
        o.drain()
        o.watch()
        assert loop.added == [] and o.watched is False
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_output_reads_everything_available() -> None:
    loop = _Loop()
    r, w = _pipe()
    try:
        o = dr._Output(loop, r, 1 << 20)  # type: ignore[arg-type]
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: room for more than one read of 64 KiB
        data = bytes(range(256)) * 800
        os.write(w, data[:60000])
        os.write(w, data[60000:])
        o.drain()
        assert bytes(o.buf) == data and o.truncated is False
        small = dr._Output(loop, r, 0)  # type: ignore[arg-type]
        os.write(w, b"x")
        small.drain()
        assert small.buf == b"" and small.truncated is True
        big = dr._Output(loop, r, 3)  # type: ignore[arg-type]
        os.write(w, b"0123456")
        big.drain()
        assert big.buf == b"012" and big.truncated is True
    finally:
        os.close(r)
        os.close(w)


def test_output_on_a_broken_fd_stops() -> None:
    loop = _Loop()
    r, w = _pipe()
    os.close(r)
    os.close(w)
    o = dr._Output(loop, r, 4)  # type: ignore[arg-type]
    o.watched = True
    o.drain()  # (EBADF: as at the end)
    assert o.fd == -1 and loop.removed == [r] and o.buf == b""


def test_watch_once_and_stop() -> None:
    loop = _Loop()
    o = dr._Output(loop, 7, 4)  # type: ignore[arg-type]
    o.watch()
    o.watch()
    assert loop.added == [(7, o.drain)] and o.watched is True
    o.stop()
    assert loop.removed == [7] and o.fd == -1
    o.stop()
    assert loop.removed == [7]
    e = dr._Output(loop, 0, 4)  # type: ignore[arg-type]
    e.watch()  # (fd 0 is a fd)
    assert loop.added[-1] == (0, e.drain)
    a, b = dr._Output(loop, 11, 1), dr._Output(loop, 12, 1)  # type: ignore[arg-type]
    dr._watch(a, b)
    assert loop.added[-2:] == [(11, a.drain), (12, b.drain)]


class _Sb:
    def __init__(
        self,
        reply: Any = None,
        exc: BaseException | None = None,
        writes: tuple[bytes, bytes] = (b"", b""),
        delay: float = 0.0,
    ) -> None:
        self.o, self.e = _pipe(), _pipe()
        self.outs = (self.o[0], self.e[0])
        self.reply, self.exc, self.writes, self.delay = reply, exc, writes, delay
        self.sent: list[tuple[Any, float]] = []
        self.killed = 0
        self.exit_rc: asyncio.Future[int | None] | None = None
        self.dead = False
        self.alive = False  # what `running` answers: its PID 1 has not ended

    async def request(self, frame: Any, timeout: float) -> Any:
        self.sent.append((frame, timeout))
        os.write(self.o[1], self.writes[0])
        os.write(self.e[1], self.writes[1])
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.exc is not None:
            raise self.exc
        return self.reply

    def running(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.killed += 1

    def close(self) -> None:
        for fd in (*self.o, *self.e):
            os.close(fd)


async def _run(
    sb: _Sb,
    req: dict[str, Any] | None = None,
    budget: float = 10.0,
    base_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    try:
        return await dr.exchange(sb, req or _req(), budget, base_env)  # type: ignore[arg-type]
    finally:
        sb.close()


def _ok(run: dict[str, Any]) -> dict[str, Any]:
    return {"compile_result": None, "run_result": run, "cases": None, "files": {}}


async def test_a_run_with_its_exit_report() -> None:
    sb = _Sb({"rc": 3}, writes=(b"hello\n", b"warn \xff"))
    got = await _run(sb)
    t = got["run_result"]["execution_time"]
    assert isinstance(t, float) and 0 <= t < 1
    assert got == _ok(
        {
            "status": "Finished",
            "execution_time": t,
            "return_code": 3,
            "stdout": "hello\n",
            "stderr": "warn \ufffd",
            "truncated": False,
        }
    )
    ((frame, timeout),) = sb.sent
    assert frame == {**_req(), "direct": True} and timeout == 3.0
    assert sb.killed == 0


async def test_the_time_given_is_the_smaller_of_budget_and_limit() -> None:
    sb = _Sb({"rc": 0})
    await _run(sb, budget=1.5)
    assert sb.sent[0][1] == 1.5 and isinstance(sb.sent[0][1], float)
    sb = _Sb({"rc": 0})
    await _run(sb, _req(run_timeout=2), budget=9.0)
    assert sb.sent[0][1] == 2.0 and isinstance(sb.sent[0][1], float)


async def test_the_compact_frame_with_the_sandboxes_own_environment() -> None:
    sb = _Sb({"rc": 0})
    await _run(sb, base_env={"A": "1"})
    assert sb.sent[0][0] == wire.encode_direct(_req(), {"A": "1"})
    assert isinstance(sb.sent[0][0], bytes)


async def test_truncated_output_is_flagged() -> None:
    sb = _Sb({"rc": 0}, writes=(b"0123456789", b""))
    got = await _run(sb)
    assert got["run_result"]["stdout"] == "01234567" and got["run_result"]["truncated"] is True
    sb = _Sb({"rc": 0}, writes=(b"", b"abcdefghij"))
    got = await _run(sb)
    assert got["run_result"]["stderr"] == "abcdefgh" and got["run_result"]["truncated"] is True
    assert got["run_result"]["stdout"] == ""


async def test_output_is_watched_after_a_short_while(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    class _Rec(dr._Output):
        __slots__ = ()

        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            made.append(self)

    monkeypatch.setattr(dr, "_Output", _Rec)
    seen: list[tuple[bool, ...]] = []
    sb = _Sb({"rc": 0})
    real = sb.request

    async def request(frame: Any, timeout: float) -> Any:
        await asyncio.sleep(0)
        seen.append(tuple(o.watched for o in made))
        await asyncio.sleep(0.2)
        seen.append(tuple(o.watched for o in made))
        return await real(frame, timeout)

    sb.request = request  # type: ignore[method-assign]
    await _run(sb)
    assert seen == [(False, False), (True, True)]
    assert [o.cap for o in made] == [8, 8] and [o.fd for o in made] == [-1, -1]

    made.clear()
    quick = _Sb({"rc": 0})
    await _run(quick)
    await asyncio.sleep(0.05)  # (the lazy watch was cancelled: never watched)
    assert [o.watched for o in made] == [False, False]


async def test_a_bad_exit_report_asks_the_fork_server() -> None:
    for reply in ({"rc": True}, {"rc": "0"}, {}, {"rc": 1.0}):
        sb = _Sb(reply)
        sb.exit_rc = asyncio.get_running_loop().create_future()
        sb.exit_rc.set_result(-11)
        got = await _run(sb)
        assert got["run_result"]["return_code"] == -11, reply
        assert got["run_result"]["status"] == "Finished"


async def test_a_silent_death_waits_for_the_exit_status() -> None:
    for exc in (OSError("pipe"), EOFError(), ValueError("frame")):
        sb = _Sb(exc=exc, writes=(b"partial", b""))
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        sb.exit_rc = fut
        asyncio.get_running_loop().call_later(0.05, fut.set_result, 137)
        got = await _run(sb)
        assert got == _ok(
            {
                "status": "Finished",
                "execution_time": got["run_result"]["execution_time"],
                "return_code": 137,
                "stdout": "partial",
                "stderr": "",
                "truncated": False,
            }
        )
        assert sb.killed == 0


async def test_no_exit_status_within_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dr, "_EXIT_WAIT_S", 0.05)
    loop = asyncio.get_running_loop()
    sb = _Sb(exc=OSError("pipe"))
    sb.exit_rc = loop.create_future()
    t0 = loop.time()
    got = await _run(sb, budget=0.3)  # waited to its limit (0.3 s), not only `_EXIT_WAIT_S`
    assert 0.3 <= loop.time() - t0 < 2.0
    assert got == {"error": "sandbox broke: the action's process ended without an exit status"}
    assert not sb.exit_rc.cancelled()  # (shielded: the pool still gets it)
    assert sb.killed == 0  # (ended: nothing to kill)
    sb2 = _Sb(exc=OSError("pipe"))  # no fork server status to ask for
    got = await _run(sb2)
    assert got == {"error": "sandbox broke: the action's process ended without an exit status"}


async def test_a_late_exit_status_within_the_limit_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loaded fork server reaps late (it blocks SIGCHLD while it spawns a refill batch): the
    # status still counts while the action's limit lasts, however short `_EXIT_WAIT_S` is.
    monkeypatch.setattr(dr, "_EXIT_WAIT_S", 0.01)
    sb = _Sb(exc=EOFError(), writes=(b"before\n", b""))
    sb.exit_rc = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, sb.exit_rc.set_result, -11)
    got = await _run(sb, budget=1.0)
    assert got["run_result"]["status"] == "Finished" and got["run_result"]["return_code"] == -11
    assert got["run_result"]["stdout"] == "before\n" and sb.killed == 0


async def test_a_broken_report_running_past_its_limit_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dr, "_EXIT_WAIT_S", 0.01)
    loop = asyncio.get_running_loop()
    sb = _Sb(exc=EOFError(), writes=(b"so far", b""))
    sb.alive = True  # it closed its report socket and runs on
    sb.exit_rc = loop.create_future()
    t0 = loop.time()
    got = await _run(sb, budget=0.2)
    assert sb.killed == 1 and loop.time() - t0 >= 0.2
    run = got["run_result"]
    assert (run["status"], run["return_code"], run["stdout"]) == ("TimeLimitExceeded", -9, "so far")
    assert run["execution_time"] >= 0.2


async def test_a_dead_sandbox_gives_its_status_only_when_known() -> None:
    sb = _Sb(exc=OSError("pipe"))
    sb.dead = True
    sb.exit_rc = asyncio.get_running_loop().create_future()
    got = await _run(sb)  # not waited for
    assert "error" in got
    sb = _Sb(exc=OSError("pipe"))
    sb.dead = True
    sb.exit_rc = asyncio.get_running_loop().create_future()
    sb.exit_rc.set_result(2)
    got = await _run(sb)
    assert got["run_result"]["return_code"] == 2


async def test_the_time_limit_kills() -> None:
    sb = _Sb(exc=TimeoutError(), writes=(b"so far", b""))
    got = await _run(sb)
    assert sb.killed == 1
    assert got == _ok(
        {
            "status": "TimeLimitExceeded",
            "execution_time": got["run_result"]["execution_time"],
            "return_code": None,
            "stdout": "so far",
            "stderr": "",
            "truncated": False,
        }
    )
    sb = _Sb(exc=TimeoutError())
    sb.exit_rc = asyncio.get_running_loop().create_future()
    got = await _run(sb)  # not yet reaped: killed by us
    assert got["run_result"]["return_code"] == -9 and sb.killed == 1
    assert got["run_result"]["status"] == "TimeLimitExceeded"
    sb = _Sb(exc=TimeoutError())
    sb.exit_rc = asyncio.get_running_loop().create_future()
    sb.exit_rc.set_result(-6)
    got = await _run(sb)  # reaped already: its own status
    assert got["run_result"]["return_code"] == -6


async def test_execution_time_is_measured() -> None:
    sb = _Sb({"rc": 0}, delay=0.1)
    got = await _run(sb)
    t = got["run_result"]["execution_time"]
    assert 0.1 <= t < 1.0 and t == round(t, 6)


async def test_undecodable_stdout_is_replaced() -> None:
    sb = _Sb({"rc": 0}, writes=(b"a\xffb", b"c\xfe"))
    got = await _run(sb)
    assert got["run_result"]["stdout"] == "a\ufffdb" and got["run_result"]["stderr"] == "c\ufffd"


async def test_a_killed_sandbox_is_not_waited_for() -> None:
    loop = asyncio.get_running_loop()
    sb = _Sb(exc=TimeoutError())
    sb.exit_rc = loop.create_future()
    t0 = loop.time()
    got = await _run(sb)
    assert loop.time() - t0 < 1.0  # (not the 2 s wait for a silent death's status)
    assert got["run_result"]["return_code"] == -9
