"""The manager's channels (issue 43, mutation testing of host/client.py): a sandbox connection
over a real socketpair (frames out and in, order, partial and oversized frames, EOF, timeouts,
close) and the fork server's client with a stand-in process (a sleeping Python started in its
place: argv, environment, the configuration and fds it is sent, hello, spawn requests and
replies, fd adoption, exit reports, death, EOF, ids given back, close). No sandbox starts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.managers.cpu import wire
from arl_tangram.managers.cpu.host import client as C
from arl_tangram.managers.cpu.host.reaper import zygote_env

# a mutant that hangs fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)


def _frame(obj: Any) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return len(body).to_bytes(4, "big") + body


def _recv_all(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(2)
    out = b""
    while len(out) < n:
        out += sock.recv(n - len(out))
    return out


async def _spin(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
async def pair():
    a, b = socket.socketpair()
    conn = C.Conn(a, asyncio.get_running_loop())
    yield conn, b
    conn.close()
    b.close()


# --- Conn ------------------------------------------------------------------------------------


async def test_conn_sends_frames_and_matches_replies_in_order(pair: Any) -> None:
    conn, peer = pair
    assert conn.sock.getblocking() is False and conn.closed is False
    t1 = asyncio.ensure_future(conn.request({"op": "x", "n": 1}))
    t2 = asyncio.ensure_future(conn.request(b"RAW"))
    await _spin()
    want = wire.encode_request({"op": "x", "n": 1}) + b"RAW"
    assert _recv_all(peer, len(want)) == want
    f1, f2 = _frame({"a": 1}), _frame({"b": 2})
    peer.sendall(f1 + f2[:3])
    await asyncio.sleep(0.01)
    assert await t1 == {"a": 1} and not t2.done()
    peer.sendall(f2[3:7])
    await asyncio.sleep(0.01)
    assert not t2.done()
    peer.sendall(f2[7:])
    assert await t2 == {"b": 2}
    assert len(conn._waiters) == 0 and conn._buf == bytearray()


async def test_conn_big_request_goes_out_whole(pair: Any) -> None:
    conn, peer = pair
    big = b"x" * (4 << 20)
    t = asyncio.ensure_future(conn.request(big))
    got = b""
    peer.setblocking(False)
    while len(got) < len(big):
        try:
            got += peer.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.001)
    assert got == big
    peer.setblocking(True)
    peer.sendall(_frame({"ok": True}))
    assert await t == {"ok": True}


@pytest.mark.parametrize(
    ("data", "error", "text"),
    [
        (b"", EOFError, "sandbox closed its socket"),
        (
            (wire.MAX_FRAME + 1).to_bytes(4, "big"),
            ValueError,
            "unexpected or oversized frame from a sandbox",
        ),
        (_frame(b"[1, 2]"), ValueError, "frame is not an object"),
        (_frame(b"{nope"), ValueError, None),
    ],
)
async def test_conn_bad_input_closes(pair: Any, data: bytes, error: type, text: str | None) -> None:
    conn, peer = pair
    t = asyncio.ensure_future(conn.request({"op": "x"}))
    await _spin()
    if data:
        peer.sendall(data)
    else:
        peer.shutdown(socket.SHUT_WR)
    with pytest.raises(error) as ei:
        await asyncio.wait_for(t, 2)
    if text is not None:
        assert str(ei.value) == text
    assert conn.closed is True and conn.sock.fileno() == -1


async def test_conn_frame_of_max_size_waits(pair: Any) -> None:
    conn, peer = pair
    t = asyncio.ensure_future(conn.request({"op": "x"}))
    await _spin()
    peer.sendall(wire.MAX_FRAME.to_bytes(4, "big") + b"{")
    await asyncio.sleep(0.02)
    assert not t.done() and conn.closed is False
    t.cancel()


async def test_conn_unexpected_frame_closes(pair: Any) -> None:
    conn, peer = pair
    peer.sendall(_frame({"a": 1}))
    await asyncio.sleep(0.02)
    assert conn.closed is True
    with pytest.raises(EOFError, match=r"^sandbox connection closed$"):
        await conn.request({"op": "x"})


async def test_conn_short_header_waits(pair: Any) -> None:
    conn, peer = pair
    t = asyncio.ensure_future(conn.request({"op": "x"}))
    await _spin()
    peer.sendall(b"\0\0\0")
    await asyncio.sleep(0.01)
    assert not t.done() and conn.closed is False
    peer.sendall(b"\x02{}")
    assert await t == {}


async def test_conn_timeout(pair: Any) -> None:
    conn, _peer = pair
    with pytest.raises(TimeoutError, match=r"^no reply within 0\.02 s$"):
        await conn.request({"op": "x"}, 0.02)
    assert conn.closed is False


async def test_conn_reply_cancels_timer(pair: Any) -> None:
    conn, peer = pair
    loop = asyncio.get_running_loop()
    t = asyncio.ensure_future(conn.request({"op": "x"}, 30.0))
    await _spin()
    timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert len(timers) == 1
    peer.sendall(_frame({"ok": 1}))
    assert await t == {"ok": 1}
    assert [h for h in loop._scheduled if not h.cancelled()] == []  # type: ignore[attr-defined]


def test_expire_text() -> None:
    loop = asyncio.new_event_loop()
    try:
        f = loop.create_future()
        C._expire(f, 10.0)
        with pytest.raises(TimeoutError, match=r"^no reply within 10 s$"):
            f.result()
        f2 = loop.create_future()
        f2.set_result(1)
        C._expire(f2, 1.5)
        assert f2.result() == 1
    finally:
        loop.close()


async def test_conn_close_fails_waiters(pair: Any) -> None:
    conn, _peer = pair
    t1 = asyncio.ensure_future(conn.request({"op": "x"}))
    t2 = asyncio.ensure_future(conn.request({"op": "y"}))
    await _spin()
    why = RuntimeError("why")
    conn.close(why)
    with pytest.raises(RuntimeError, match=r"^why$"):
        await t1
    with pytest.raises(RuntimeError, match=r"^why$"):
        await t2
    assert conn.closed and conn.sock.fileno() == -1
    conn.close()  # again: nothing


async def test_conn_close_default_reason(pair: Any) -> None:
    conn, _peer = pair
    t = asyncio.ensure_future(conn.request({"op": "x"}))
    await _spin()
    conn.close()
    with pytest.raises(EOFError, match=r"^sandbox connection closed$"):
        await t
    loop = asyncio.get_running_loop()
    assert not loop.remove_reader(conn.sock.fileno()) if conn.sock.fileno() >= 0 else True


async def test_conn_close_removes_reader() -> None:
    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    conn = C.Conn(a, loop)
    fd = a.fileno()
    conn.close()
    assert loop.remove_reader(fd) is False
    b.close()


async def test_conn_send_error_closes(pair: Any) -> None:
    conn, peer = pair
    peer.close()
    with pytest.raises(OSError) as ei:
        await conn.request({"op": "x"})
    assert not isinstance(ei.value, BlockingIOError)
    assert conn.closed is True


async def test_conn_skips_done_waiter(pair: Any) -> None:
    conn, peer = pair
    t1 = asyncio.ensure_future(conn.request({"op": "x"}))
    t2 = asyncio.ensure_future(conn.request({"op": "y"}))
    await _spin()
    t1.cancel()
    await _spin()
    peer.sendall(_frame({"first": 1}) + _frame({"second": 2}))
    assert await t2 == {"second": 2}


# --- Zygote ----------------------------------------------------------------------------------


class _Started:
    def __init__(self) -> None:
        self.argv: list[str] = []
        self.kw: dict[str, Any] = {}
        self.peer: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.msg = b""
        self.links: list[str] = []
        self.path_fd = False


_REAL_POPEN = subprocess.Popen


def _sleeper() -> subprocess.Popen[bytes]:
    return _REAL_POPEN(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def _zygote(
    tmp_path: Any, dirs: tuple[str, ...] = (), fail: BaseException | None = None, reaper: Any = None
) -> tuple[C.Zygote, _Started]:
    st = _Started()

    def popen(argv: list[str], **kw: Any) -> Any:
        st.argv, st.kw = argv, kw
        st.peer = socket.socket(fileno=os.dup(kw["pass_fds"][0]))
        if fail is not None:
            raise fail
        st.proc = _sleeper()
        return st.proc

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C.subprocess, "Popen", popen)
        z = C.Zygote({"root": "r", "x": 1}, str(tmp_path), dirs, reaper)
    if reaper is not None:
        st.peer = reaper.peer
    # the configuration, first on the control socket (its fds by what they name)
    msg, fds, _, _ = socket.recv_fds(st.peer, 1 << 16, 8)
    st.msg, st.links = msg, [_link(f) for f in fds]
    import fcntl

    st.path_fd = bool(fds) and bool(fcntl.fcntl(fds[0], fcntl.F_GETFL) & os.O_PATH)
    for f in fds:
        os.close(f)
    return z, st


def _cleanup(z: C.Zygote, st: _Started) -> None:
    with contextlib.suppress(Exception):
        z.close()
    if st.peer is not None:
        st.peer.close()
    if st.proc is not None:
        with contextlib.suppress(Exception):
            st.proc.kill()
            st.proc.wait()


def _link(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_zygote_start_values(tmp_path: Any) -> None:
    d1, d2 = tmp_path / "c1", tmp_path / "c2"
    d1.mkdir()
    d2.mkdir()
    z, st = _zygote(tmp_path, (str(d1), str(d2)))
    try:
        fd = st.kw["pass_fds"][0]
        assert st.argv == [
            sys.executable,
            "-P",
            "-m",
            "arl_tangram.managers.cpu.zygote.server",
            str(fd),
        ]
        assert st.kw == {
            "pass_fds": [fd],
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "close_fds": True,
            "env": zygote_env(),
            "cwd": "/",
        }
        assert json.loads(st.msg) == {"root": "r", "x": 1}
        assert st.links == [str(tmp_path), str(d1), str(d2)] and st.path_fd is True
        assert st.peer.type == socket.SOCK_SEQPACKET
        assert z.proc is st.proc and z.hello == {} and len(z._waiters) == 0
        assert (z._loop, z.on_exit, z.on_broken, z.adopt, z.gone, z._pidfd) == (
            None,
            None,
            None,
            None,
            None,
            None,
        )
        with pytest.raises(OSError):
            os.fstat(fd)  # our copy of their end is closed
    finally:
        _cleanup(z, st)


def test_zygote_start_failure_closes_both_ends(tmp_path: Any) -> None:
    before = set(os.listdir("/proc/self/fd"))
    st_holder: list[Any] = []
    with pytest.raises(RuntimeError, match=r"^no exec$"):
        _z, _st = _zygote(tmp_path, fail=RuntimeError("no exec"))
    for s in st_holder:
        s.close()
    after = set(os.listdir("/proc/self/fd"))
    assert len(after - before) <= 1  # only the test's own dup of their end


class _Reaper:
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.peer: socket.socket | None = None
        self.proc = _sleeper()
        self.statuses: list[Any] = []

    def start_zygote(self, argv: list[str], env: dict[str, str], fd: int) -> int:
        self.calls.append((argv, env))
        self.peer = socket.socket(fileno=os.dup(fd))
        return self.proc.pid

    def exit_status(self, pid: int, timeout: float) -> int | None:
        self.statuses.append((pid, timeout))
        return None


def test_zygote_by_the_reaper(tmp_path: Any) -> None:
    r = _Reaper()
    z, st = _zygote(tmp_path, reaper=r)
    try:
        assert r.calls == [
            (
                [sys.executable, "-P", "-m", "arl_tangram.managers.cpu.zygote.server", "3"],
                zygote_env(),
            )
        ]
        assert isinstance(z.proc, C.ReapedProc) and z.proc.pid == r.proc.pid
        assert st.argv == []
        assert z.exit_reason() == "still running" and r.statuses == [(r.proc.pid, 0.5)]
    finally:
        z.proc.returncode = -9  # type: ignore[union-attr]
        _cleanup(z, st)
        r.proc.kill()
        r.proc.wait()
        r.peer.close()


def test_wait_hello(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        st.peer.send(json.dumps({"ok": True, "v": 2}).encode())
        assert z.wait_hello(2) == {"ok": True, "v": 2} and z.hello == {"ok": True, "v": 2}
        assert z.ctl.gettimeout() is None
        assert z.wait_hello(0.05) == {"ok": False, "error": "fork server did not start: timed out"}
        assert z.ctl.gettimeout() is None
        st.peer.close()
        st.peer = None
        assert z.wait_hello(1) == {"ok": False, "error": "fork server exited"}
    finally:
        _cleanup(z, st)


async def _attached(tmp_path: Any) -> tuple[C.Zygote, _Started, list[Any]]:
    z, st = _zygote(tmp_path)
    log: list[Any] = []
    z.on_exit = lambda pid, rc: log.append(("exit", pid, rc))
    z.on_broken = lambda: log.append("broken")

    def adopt(pid: int, sock: socket.socket, outs: list[int], uid: int) -> Any:
        log.append(("adopt", pid, sock.type, sock.family, [_link(f) for f in outs], uid))
        sock.close()
        for f in outs:
            os.close(f)
        return f"sb{pid}"

    z.adopt = adopt
    z.attach(asyncio.get_running_loop())
    return z, st, log


async def test_attach_and_spawn_messages(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        assert z._loop is asyncio.get_running_loop() and z.ctl.getblocking() is False
        assert z._pidfd is not None and z.exited() is False
        t = asyncio.ensure_future(z.spawn(2))
        await _spin()
        assert st.peer.recv(1 << 16) == b'{"op":"spawn","n":2}'
        s1, s2 = socket.socketpair()
        r, w = os.pipe()
        socket.send_fds(st.peer, [json.dumps({"pid": 11, "uid": 501}).encode()], [s1.fileno(), r])
        socket.send_fds(st.peer, [json.dumps({"pid": "12", "uid": "502"}).encode()], [s1.fileno()])
        assert await t == ["sb11", "sb12"]
        assert log[0] == ("adopt", 11, socket.SOCK_STREAM, socket.AF_UNIX, [_link(r)], 501)
        assert log[1] == ("adopt", 12, socket.SOCK_STREAM, socket.AF_UNIX, [], 502)
        t = asyncio.ensure_future(z.spawn(1, warm=False, join=["s-a"]))
        await _spin()
        assert st.peer.recv(1 << 16) == (
            b'{"op":"spawn","n":1,"cfg":{"warm_direct":false},"join":["s-a"]}'
        )
        st.peer.send(json.dumps({"error": "EAGAIN"}).encode())
        got = await t
        assert isinstance(got[0], BrokenError) and str(got[0]) == "sandbox spawn failed: EAGAIN"
        t = asyncio.ensure_future(z.spawn(1, join=["x"]))
        await _spin()
        assert st.peer.recv(1 << 16) == b'{"op":"spawn","n":1,"join":["x"]}'
        st.peer.send(json.dumps({"pid": 1, "uid": 1}).encode())  # no fds
        got = await t
        assert str(got[0]) == "sandbox spawn failed: None"
        t = asyncio.ensure_future(z.spawn(1))
        await _spin()
        st.peer.recv(1 << 16)
        st.peer.send(b"not json")
        got = await t
        assert str(got[0]) == "sandbox spawn failed: bad reply from the fork server"
        for f in (s1, s2):
            f.close()
        os.close(r)
        os.close(w)
    finally:
        _cleanup(z, st)


async def test_spawn_reply_without_adopt_and_error_with_fds(tmp_path: Any) -> None:
    z, st, _log = await _attached(tmp_path)
    try:
        z.adopt = None
        t = asyncio.ensure_future(z.spawn(2))
        await _spin()
        st.peer.recv(1 << 16)
        r, w = os.pipe()
        socket.send_fds(st.peer, [json.dumps({"pid": 1, "uid": 1}).encode()], [r])
        socket.send_fds(st.peer, [json.dumps({"error": "x"}).encode()], [r])
        got = await t
        assert [str(g) for g in got] == ["sandbox spawn failed: None", "sandbox spawn failed: x"]
        before = set(os.listdir("/proc/self/fd"))
        os.close(r)
        os.close(w)
        assert len(before - set(os.listdir("/proc/self/fd"))) == 2  # theirs were closed already
    finally:
        _cleanup(z, st)


async def test_exit_reports_and_unclaimed_replies(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        st.peer.send(b'{"exit": "33", "rc": "-9"}')
        st.peer.send(b'{"exit": 34, "rc": 0}')
        await asyncio.sleep(0.02)
        assert log == [("exit", 33, -9), ("exit", 34, 0)]
        z.on_exit = None
        st.peer.send(b'{"exit": 35, "rc": 0}')
        await asyncio.sleep(0.02)
        # a reply no spawn waits for: its fds closed
        r, w = os.pipe()
        n_before = len(os.listdir("/proc/self/fd"))
        socket.send_fds(st.peer, [b'{"pid": 5, "uid": 5}'], [r])
        await asyncio.sleep(0.02)
        assert len(os.listdir("/proc/self/fd")) == n_before
        # a cancelled spawn's reply: the same
        t = asyncio.ensure_future(z.spawn(1))
        await _spin()
        st.peer.recv(1 << 16)
        t.cancel()
        await _spin()
        socket.send_fds(st.peer, [b'{"pid": 6, "uid": 6}'], [r])
        await asyncio.sleep(0.02)
        assert len(os.listdir("/proc/self/fd")) == n_before
        assert [e for e in log if e[0] == "adopt"] == []
        os.close(r)
        os.close(w)
    finally:
        _cleanup(z, st)


async def test_death_fails_waiters(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        t = asyncio.ensure_future(z.spawn(2))
        await _spin()
        st.proc.send_signal(signal.SIGKILL)
        got = await asyncio.wait_for(t, 5)
        assert [str(g) for g in got] == ["the sandbox fork server died (killed by SIGKILL)"] * 2
        assert z.gone == "the sandbox fork server died (killed by SIGKILL)"
        assert log == ["broken"] and z.on_broken is None and z._pidfd is None
        assert z.exited() is True
        got = await z.spawn(3)
        assert [type(g) for g in got] == [BrokenError] * 3
        assert str(got[0]) == z.gone
    finally:
        _cleanup(z, st)


async def test_control_socket_eof(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        loop = asyncio.get_running_loop()
        later: list[Any] = []
        real = loop.call_later
        monkeypatch.setattr(
            loop, "call_later", lambda d, cb, *a: (later.append((d, cb)), real(d, cb, *a))[1]
        )
        st.peer.close()
        st.peer = None
        await asyncio.sleep(0.02)
        assert [d for d, cb in later if cb == z._closed_socket] == [0.5]
        assert z.gone is None
        z._closed_socket()
        assert z.gone == "the sandbox fork server died (its control socket closed)"
        assert log == ["broken"]
        assert st.proc.wait(5) == -9
        z._closed_socket()  # once gone: nothing
        assert log == ["broken"]
    finally:
        _cleanup(z, st)


async def test_control_socket_eof_without_pidfd(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        z._unwatch()
        assert z._pidfd is None
        assert z.exited() is False
        st.peer.close()
        st.peer = None
        await asyncio.sleep(0.02)
        assert z.gone == "the sandbox fork server died (its control socket closed)"
        assert log == ["broken"]
    finally:
        _cleanup(z, st)


def test_exit_reason_values(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        assert z.exit_reason() == "still running"
        st.proc.kill()
        st.proc.wait()
        assert z.exit_reason() == "killed by SIGKILL"
        st.proc.returncode = -200
        assert z.exit_reason() == "killed by signal 200"
        st.proc.returncode = 3
        assert z.exit_reason() == "exit status 3"
        st.proc.returncode = 0
        assert z.exit_reason() == "exit status 0"
    finally:
        _cleanup(z, st)


def test_exit_reason_waits(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        calls: list[Any] = []

        class _P:
            returncode = None

            def wait(self, t: Any = None) -> int:
                calls.append(t)
                return 7

        z.proc = _P()  # type: ignore[assignment]
        assert z.exit_reason() == "exit status 7" and calls == [0.5]  # (not a Popen: the reaper's)
    finally:
        z.proc = st.proc
        _cleanup(z, st)


async def test_fail_once(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        t = asyncio.ensure_future(z.spawn(1))
        await _spin()
        z._fail(BrokenError("first"))
        z._fail(BrokenError("second"))
        assert z.gone == "first" and log == ["broken"]
        got = await t
        assert str(got[0]) == "first"
    finally:
        _cleanup(z, st)


async def test_spawn_asserts_and_non_exception(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        with pytest.raises(AssertionError, match=r"^Zygote\.attach\(\) first$"):
            await z.spawn(1)
        z.attach(asyncio.get_running_loop())
        for n in (0, 65):
            with pytest.raises(AssertionError, match="at most 64"):
                await z.spawn(n)
        with pytest.raises(AssertionError):
            await z.spawn(2, join=["a"])
        t = asyncio.ensure_future(z.spawn(64))
        await _spin()
        assert st.peer.recv(1 << 16) == b'{"op":"spawn","n":64}'
        z._waiters[0].set_exception(KeyboardInterrupt())
        z._waiters[1].set_exception(ValueError("v"))
        for f in list(z._waiters)[2:]:
            f.set_result(None)
        got = await t
        assert type(got[0]) is BrokenError and str(got[0]) == ""
        assert type(got[1]) is ValueError
    finally:
        _cleanup(z, st)


async def test_spawn_send_error(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        st.peer.close()
        st.peer = None

        def boom(msg: bytes) -> int:
            raise ConnectionResetError("reset")

        z.ctl = _CtlProxy(z.ctl, boom)  # type: ignore[assignment]
        got = await z.spawn(1)
        assert str(got[0]) == "the sandbox fork server is gone: reset" and log == ["broken"]
    finally:
        z.ctl = z.ctl._sock if isinstance(z.ctl, _CtlProxy) else z.ctl  # type: ignore[attr-defined]
        _cleanup(z, st)


class _CtlProxy:
    def __init__(self, sock: socket.socket, send: Any) -> None:
        self._sock = sock
        self.send = send

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


async def test_give_ids(tmp_path: Any) -> None:
    z, st, _log = await _attached(tmp_path)
    try:
        z.give_ids([30, 10, 20])
        assert st.peer.recv(1 << 16) == b'{"op":"ids","free":[10, 20, 30]}'
        z.give_ids([])
        z.gone = "dead"
        z.give_ids([1])
        st.peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            st.peer.recv(1 << 16)
        z.gone = None
        z.ctl.close()
        z.give_ids([1])  # swallowed
    finally:
        _cleanup(z, st)


async def test_close(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    t = asyncio.ensure_future(z.spawn(1))
    await _spin()
    z.close()
    got = await t
    assert type(got[0]) is ClosedError and str(got[0]) == "the CPU manager is closed"
    assert z.gone == "the CPU manager is closed" and log == ["broken"]
    assert z.ctl.fileno() == -1 and z._pidfd is None
    assert st.proc.returncode == -9
    z2, st2 = _zygote(tmp_path)
    z2.close("bye")
    assert z2.gone == "bye" and st2.proc.returncode == -9
    st.peer.close()
    st2.peer.close()


def test_close_wait_timeout(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    waits: list[Any] = []

    class _P:
        returncode = None

        def kill(self) -> None:
            raise OSError("gone")

        def wait(self, t: Any = None) -> int:
            waits.append(t)
            raise subprocess.TimeoutExpired("x", t)

    z.proc = _P()  # type: ignore[assignment]
    z.close()
    assert waits == [5]
    st.proc.kill()
    st.proc.wait()
    st.peer.close()


# --- edges found by mutation testing ---------------------------------------------------------


class _Proxy:
    """A socket whose named methods are replaced (the rest: the socket's)."""

    def __init__(self, sock: socket.socket, **over: Any) -> None:
        self._sock = sock
        self.__dict__.update(over)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def test_conn_recv_error_is_the_reason(pair: Any) -> None:
    conn, _peer = pair
    t = asyncio.ensure_future(conn.request({"op": "x"}))
    await _spin()

    def recv(n: int) -> bytes:
        raise ConnectionResetError("reset by peer")

    conn.sock = _Proxy(conn.sock, recv=recv)
    conn._readable()
    with pytest.raises(ConnectionResetError, match=r"^reset by peer$"):
        await t


async def test_conn_request_waits_for_a_full_socket(pair: Any) -> None:
    conn, peer = pair
    filler = b"f" * 65536
    sent = 0
    for chunk in (filler, b"f"):  # full to the last byte: the request's send finds no room
        while True:
            try:
                sent += conn.sock.send(chunk)
            except BlockingIOError:
                break
    t = asyncio.ensure_future(conn.request({"op": "late"}))
    await _spin()  # its send found no room: the rest waits for the socket
    assert not t.done()
    want = wire.encode_request({"op": "late"})
    got = b""
    peer.setblocking(False)
    while len(got) < sent + len(want):
        try:
            got += peer.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.001)
    assert got[sent:] == want
    peer.setblocking(True)
    peer.sendall(_frame({"ok": 1}))
    assert await t == {"ok": 1}


def test_zygote_refuses_a_file_for_a_directory(tmp_path: Any) -> None:
    f = tmp_path / "file"
    f.write_text("")
    for root, dirs in ((str(f), ()), (str(tmp_path), (str(f),))):
        st = _Started()
        real: list[Any] = []

        def popen(argv: list[str], st: _Started = st, real: list[Any] = real, **kw: Any) -> Any:
            st.peer = socket.socket(fileno=os.dup(kw["pass_fds"][0]))
            real.append(_sleeper())
            return real[-1]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(C.subprocess, "Popen", popen)
            with pytest.raises(NotADirectoryError):
                C.Zygote({"root": "r"}, root, dirs)
        st.peer.close()
        for p in real:
            p.kill()
            p.wait()


def test_wait_hello_default_timeout(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        calls: list[Any] = []
        real = z.ctl
        z.ctl = _Proxy(real, settimeout=calls.append)  # type: ignore[assignment]
        st.peer.send(b'{"ok": true}')
        assert z.wait_hello() == {"ok": True}
        assert calls == [60.0, None]
        z.ctl = real
    finally:
        _cleanup(z, st)


async def test_attach_to_a_reaped_fork_server(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    st.proc.kill()
    st.proc.wait()
    z.attach(asyncio.get_running_loop())
    assert z._pidfd is None and z.exited() is False
    z.close()  # nothing to unwatch
    assert z.gone == "the CPU manager is closed"
    st.peer.close()


async def test_exited_sees_the_pidfd_at_once(tmp_path: Any) -> None:
    z, st, _log = await _attached(tmp_path)
    try:
        t0 = time.monotonic()
        assert z.exited() is False
        assert time.monotonic() - t0 < 0.5  # (a poll, not a wait)
        st.proc.kill()
        st.proc.wait()
        assert z.gone is None and z.exited() is True  # before the loop ran `_died`
    finally:
        _cleanup(z, st)


def test_exit_reason_of_a_running_popen_is_immediate(tmp_path: Any) -> None:
    z, st = _zygote(tmp_path)
    try:
        t0 = time.monotonic()
        assert z.exit_reason() == "still running"
        assert time.monotonic() - t0 < 0.4
    finally:
        _cleanup(z, st)


async def test_unwatch_and_fail_remove_their_readers(tmp_path: Any) -> None:
    z, st, _log = await _attached(tmp_path)
    loop = asyncio.get_running_loop()
    try:
        pidfd, ctl = z._pidfd, z.ctl.fileno()
        z._unwatch()
        assert loop.remove_reader(pidfd) is False and z._pidfd is None
        z._fail(BrokenError("x"))
        assert loop.remove_reader(ctl) is False
        z.close()
        z.close()  # again: the closed socket's reader is not there (swallowed)
    finally:
        _cleanup(z, st)


async def test_unwatch_of_a_closed_pidfd(tmp_path: Any) -> None:
    z, st, _log = await _attached(tmp_path)
    try:
        asyncio.get_running_loop().remove_reader(z._pidfd)
        os.close(z._pidfd)
        z._unwatch()  # EBADF swallowed
        assert z._pidfd is None
    finally:
        _cleanup(z, st)


async def test_closed_socket_kill_error_swallowed(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        real = z.proc

        class _P:
            returncode = None
            pid = real.pid

            def kill(self) -> None:
                raise ProcessLookupError

            def wait(self, t: Any = None) -> int:
                return 0

        z.proc = _P()  # type: ignore[assignment]
        z._closed_socket()
        assert log == ["broken"]
        z.proc = real
    finally:
        _cleanup(z, st)


async def test_control_socket_error_reads_as_eof(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    z, st, _log = await _attached(tmp_path)
    loop = asyncio.get_running_loop()
    try:

        def recv_fds(*a: Any) -> Any:
            raise ConnectionResetError("x")

        monkeypatch.setattr(C.socket, "recv_fds", recv_fds)
        z._readable()
        monkeypatch.undo()
        assert loop.remove_reader(z.ctl.fileno()) is False  # (EOF: its reader removed)
    finally:
        _cleanup(z, st)


async def test_spawn_error_reply_with_fds_is_not_adopted(tmp_path: Any) -> None:
    z, st, log = await _attached(tmp_path)
    try:
        t = asyncio.ensure_future(z.spawn())
        await _spin()
        assert st.peer.recv(1 << 16) == b'{"op":"spawn","n":1}'
        s1, s2 = socket.socketpair()
        socket.send_fds(st.peer, [b'{"error": "no room", "pid": 1, "uid": 1}'], [s1.fileno()])
        got = await t
        assert str(got[0]) == "sandbox spawn failed: no room" and log == []
        # the socket adopted is the one sent
        seen: list[Any] = []
        z.adopt = lambda pid, sock, outs, uid: seen.append(sock.recv(16)) or "sb"
        t = asyncio.ensure_future(z.spawn())
        await _spin()
        st.peer.recv(1 << 16)
        s2.send(b"ping")
        socket.send_fds(st.peer, [b'{"pid": 1, "uid": 1}'], [s1.fileno()])
        assert await t == ["sb"] and seen == [b"ping"]
        s1.close()
        s2.close()
    finally:
        _cleanup(z, st)


async def test_spawn_assert_text_and_a_full_control_socket(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    z, st, _log = await _attached(tmp_path)
    try:
        with pytest.raises(
            AssertionError, match=r"^the fork server makes at most 64 sandboxes per request$"
        ):
            await z.spawn(65)
        loop = asyncio.get_running_loop()
        sent: list[Any] = []

        async def sock_sendall(sock: Any, data: bytes) -> None:
            sent.append((sock, data))

        monkeypatch.setattr(loop, "sock_sendall", sock_sendall)

        def full(msg: bytes) -> int:
            raise BlockingIOError

        real = z.ctl
        z.ctl = _Proxy(real, send=full)  # type: ignore[assignment]
        t = asyncio.ensure_future(z.spawn(1))
        await _spin()
        assert sent == [(z.ctl, b'{"op":"spawn","n":1}')]
        z.ctl = real
        z._fail(BrokenError("end"))
        await t
    finally:
        _cleanup(z, st)
