"""The manager side of the reaper (`host/reaper.py`) with the test as the reaper (issue 43,
mutation testing): the fork server's environment, the reaper's command line, the control
socket's messages and answers, the exit statuses and the time limits, exactly. No reaper or fork
server starts: `subprocess.Popen` is a fake and the control socket's other end is the test's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from arl_tangram.managers.cpu.host import reaper as rp


def test_zygote_env_keeps_only_path_lang_and_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "x")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert _env(rp.zygote_env()) == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    monkeypatch.setenv("PYTHONPATH", "")
    assert _env(rp.zygote_env()) == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    monkeypatch.setenv("PYTHONPATH", "/src:/more")
    assert _env(rp.zygote_env()) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/src:/more",
    }


def _env(env: dict[str, str]) -> dict[str, str]:
    # (under `make mutation` the copy's fork server environment also carries MUTANT_UNDER_TEST)
    return {k: v for k, v in env.items() if k != "MUTANT_UNDER_TEST"}


class _Popen:
    def __init__(self, argv: list[str], **kw: Any) -> None:
        self.argv, self.kw = argv, kw
        self.waits: list[Any] = []
        self.killed = 0
        self.timeout_first = False

    def wait(self, timeout: Any = None) -> int:
        self.waits.append(timeout)
        if self.timeout_first and len(self.waits) == 1:
            raise subprocess.TimeoutExpired("reaper", timeout)
        return 0

    def kill(self) -> None:
        self.killed += 1


def test_the_reaper_is_started_with_its_socket_and_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[_Popen] = []

    dups: list[int] = []

    def popen(argv: list[str], **kw: Any) -> _Popen:
        p = _Popen(argv, **kw)
        made.append(p)
        dups.append(os.dup(int(argv[4])))  # (the reaper's end stays open)
        return p

    monkeypatch.setattr(rp.subprocess, "Popen", popen)
    monkeypatch.setenv("PYTHONPATH", "/pp")
    r = rp.Reaper({"cgroups": ["/cg/x"]})
    try:
        (p,) = made
        fd = int(p.argv[4])
        assert p.argv == [
            sys.executable,
            "-P",
            "-m",
            "arl_tangram.managers.cpu.reaper.server",
            str(fd),
            str(os.getpid()),
        ]
        assert p.kw == {
            "pass_fds": [fd],
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "close_fds": True,
            "env": p.kw["env"],
            "cwd": "/",
            "start_new_session": True,
        }
        assert _env(p.kw["env"]) == {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONPATH": "/pp",
        }
        with pytest.raises(OSError):  # their end is closed here
            os.fstat(fd)
        assert r.ctl.type == socket.SOCK_SEQPACKET and r.ctl.family == socket.AF_UNIX
        assert r.gone is False and r._exits == {}
        assert isinstance(r._lock, type(threading.Lock()))
        assert r.proc is p
    finally:
        r.ctl.close()
        for d in dups:
            os.close(d)


def _reaper() -> tuple[rp.Reaper, socket.socket, _Popen]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r = rp.Reaper.__new__(rp.Reaper)
    p = _Popen([])
    r.proc = p  # type: ignore[assignment]
    r.ctl = ours
    r._lock = threading.Lock()
    r._exits = {}
    r.gone = False
    return r, theirs, p


def _send(s: socket.socket, msg: dict[str, Any]) -> None:
    s.send(json.dumps(msg).encode())


def test_the_first_message_is_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    # the reaper's end, read here: the Popen fake gets the inherited fd's number only
    def popen(argv: list[str], **kw: Any) -> _Popen:
        fd = int(argv[4])
        popen.dup = os.dup(fd)  # type: ignore[attr-defined]
        return _Popen(argv, **kw)

    monkeypatch.setattr(rp.subprocess, "Popen", popen)
    r = rp.Reaper({"cgroups": ["/a"], "n": 1})
    theirs = socket.socket(fileno=popen.dup)  # type: ignore[attr-defined]
    try:
        assert json.loads(theirs.recv(1 << 16)) == {"cgroups": ["/a"], "n": 1}
    finally:
        theirs.close()
        r.ctl.close()


def test_recv_records_exits_and_sees_the_reaper_go() -> None:
    r, theirs, _ = _reaper()
    try:
        assert r._recv(0.0) is None and r.gone is False
        assert r._recv(-5.0) is None  # (a past deadline: no wait, no error)
        _send(theirs, {"exit": "12", "rc": "-9"})
        assert r._recv(1.0) == {"exit": "12", "rc": "-9"}
        assert r._exits == {12: -9}
        _send(theirs, {"ok": True})
        assert r._recv(1.0) == {"ok": True} and r._exits == {12: -9}
        big = {"x": "y" * 60000}
        _send(theirs, big)
        assert r._recv(1.0) == big
        theirs.close()
        assert r._recv(1.0) is None and r.gone is True
        assert r._recv(1.0) is None
    finally:
        r.ctl.close()


def test_recv_when_the_socket_fails() -> None:
    r, theirs, _ = _reaper()

    class _Broken:
        def __init__(self, real: socket.socket) -> None:
            self.real = real

        def fileno(self) -> int:
            return self.real.fileno()

        def recv(self, n: int) -> bytes:
            raise OSError("reset")

    try:
        _send(theirs, {"ok": 1})
        r.ctl = _Broken(r.ctl)  # type: ignore[assignment]
        assert r._recv(1.0) is None and r.gone is True
    finally:
        r.ctl.real.close()  # type: ignore[attr-defined]
        theirs.close()


def _answer(
    theirs: socket.socket, answers: list[dict[str, Any]], got: list[Any], fds: bool = False
) -> threading.Thread:
    def run() -> None:
        if fds:
            msg, rfds, _, _ = socket.recv_fds(theirs, 1 << 16, 4)
            got.append((json.loads(msg), len(rfds)))
            for f in rfds:
                os.close(f)
        else:
            got.append(json.loads(theirs.recv(1 << 16)))
        for a in answers:
            _send(theirs, a)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_configure_sends_and_waits_for_ok() -> None:
    r, theirs, _ = _reaper()
    got: list[Any] = []
    try:
        t = _answer(theirs, [{"exit": 7, "rc": 0}, {"other": 1}, {"ok": True}], got)
        r.configure(freezer="/fz", layers=["a"])
        t.join()
        assert r._recv(0.0) is None  # (everything up to the ok was read)
        assert got == [{"op": "config", "freezer": "/fz", "layers": ["a"]}]
        assert r._exits == {7: 0}
    finally:
        r.ctl.close()
        theirs.close()


def test_configure_with_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    r, theirs, _ = _reaper()
    waits: list[float] = []
    clock = [100.0]

    def recv(timeout: float) -> None:
        waits.append(timeout)
        return None

    monkeypatch.setattr(rp.time, "monotonic", lambda: clock[0])
    r._recv = recv  # type: ignore[method-assign]
    try:
        with pytest.raises(OSError, match=r"^the reaper did not answer$"):
            r.configure(a=1)
        assert waits == [10.0]
        with pytest.raises(OSError, match=r"^the reaper did not start the fork server$"):
            r.start_zygote(["x"], {}, theirs.fileno())
        assert waits == [10.0, 10.0]
    finally:
        r.ctl.close()
        theirs.close()


def test_configure_and_start_when_the_reaper_is_gone() -> None:
    r, theirs, _ = _reaper()
    theirs.close()
    try:
        with pytest.raises(OSError, match=r"^\[Errno \d+\] the reaper is gone: ") as e:
            r.configure(a=1)
        assert e.value.errno is not None and e.value.errno > 0
        with pytest.raises(OSError, match=r"^\[Errno \d+\] the reaper is gone: ") as e2:
            r.start_zygote(["x"], {}, 0)
        assert e2.value.errno is not None and e2.value.errno > 0
    finally:
        r.ctl.close()


def test_configure_times_out_when_the_reaper_goes() -> None:
    r, theirs, _ = _reaper()
    try:

        def run() -> None:
            theirs.recv(1 << 16)
            theirs.shutdown(socket.SHUT_RDWR)

        t = threading.Thread(target=run)
        t.start()
        t0 = time.monotonic()
        with pytest.raises(OSError, match=r"^the reaper did not answer$"):
            r.configure(a=1)
        t.join()
        assert time.monotonic() - t0 < 5.0 and r.gone is True
    finally:
        r.ctl.close()
        theirs.close()


def test_start_zygote_passes_the_fd_and_returns_the_pid() -> None:
    r, theirs, _ = _reaper()
    got: list[Any] = []
    rfd, wfd = os.pipe()
    try:
        t = _answer(theirs, [{"exit": 3, "rc": 1}, {"ok": 1}, {"pid": "4321"}], got, fds=True)
        assert r.start_zygote(["/py", "-m", "z"], {"A": "b"}, rfd) == 4321
        t.join()
        assert got == [({"op": "zygote", "argv": ["/py", "-m", "z"], "env": {"A": "b"}}, 1)]
        assert r._exits == {3: 1}
        t = _answer(theirs, [{"error": "ENOMEM"}], got, fds=True)
        with pytest.raises(OSError, match=r"^the reaper could not start the fork server: ENOMEM$"):
            r.start_zygote(["/py"], {}, rfd)
        t.join()
    finally:
        os.close(rfd)
        os.close(wfd)
        r.ctl.close()
        theirs.close()


def test_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    r, theirs, _ = _reaper()
    try:
        r._exits[5] = 3
        assert r.exit_status(5) == 3
        t0 = time.monotonic()
        assert r.exit_status(6) is None
        assert r.exit_status(6, 0.2) is None
        assert time.monotonic() - t0 >= 0.2
        _send(theirs, {"exit": 6, "rc": -15})
        assert r.exit_status(6, 5.0) == -15
        _send(theirs, {"ok": 1})
        threading.Timer(0.1, _send, (theirs, {"exit": 8, "rc": 0})).start()
        assert r.exit_status(8, 5.0) == 0
        r.gone = True
        assert r.exit_status(9, 5.0) == -int(signal.SIGKILL) == -9
        assert r.exit_status(5) == 3
    finally:
        r.ctl.close()
        theirs.close()


def test_exit_status_waits_until_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    r, theirs, _ = _reaper()
    clock = [50.0]
    waits: list[float] = []

    def recv(timeout: float) -> None:
        waits.append(timeout)
        clock[0] += 1.0
        return None

    monkeypatch.setattr(rp.time, "monotonic", lambda: clock[0])
    r._recv = recv  # type: ignore[method-assign]
    try:
        assert r.exit_status(1, 3.0) is None
        assert waits == [3.0, 2.0, 1.0]
    finally:
        r.ctl.close()
        theirs.close()


def test_close_waits_and_kills_when_it_hangs() -> None:
    r, theirs, p = _reaper()
    r.close()
    assert p.waits == [15.0] and p.killed == 0 and r.ctl.fileno() == -1
    r.close(2.5)  # (closed twice: no error)
    r2, theirs2, p2 = _reaper()
    p2.timeout_first = True
    r2.close(1.0)
    assert p2.waits == [1.0, None] and p2.killed == 1
    theirs.close()
    theirs2.close()


def test_reaped_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    class _R:
        rc: int | None = 0

        def exit_status(self, pid: int, timeout: float) -> int | None:
            calls.append((pid, timeout))
            return self.rc

    rr = _R()
    opened: list[int] = []
    closed: list[int] = []
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(rp.os, "pidfd_open", lambda pid: opened.append(pid) or 99)
    monkeypatch.setattr(rp.os, "close", lambda fd: closed.append(fd))
    monkeypatch.setattr(rp.signal, "pidfd_send_signal", lambda fd, sig: sent.append((fd, sig)))
    p = rp.ReapedProc(rr, 1234)  # type: ignore[arg-type]
    assert (p.reaper, p.pid, p.returncode, p._pidfd) == (rr, 1234, None, 99)
    assert opened == [1234]
    p.kill()
    assert sent == [(99, signal.SIGKILL)]
    rr.rc = None
    with pytest.raises(subprocess.TimeoutExpired) as e:
        p.wait(2.0)
    assert e.value.cmd == "fork server 1234" and e.value.timeout == 2.0
    with pytest.raises(subprocess.TimeoutExpired) as e:
        p.wait(0)
    assert e.value.timeout == 0.0
    assert calls == [(1234, 2.0), (1234, 0)]
    rr.rc = -9
    assert p.wait() == -9
    assert calls[-1] == (1234, 3600.0)
    assert p.returncode == -9 and closed == [99] and p._pidfd == -1
    assert p.wait(1.0) == -9 and len(calls) == 3 and closed == [99]
    p.kill()  # reaped: no signal
    assert sent == [(99, signal.SIGKILL)]


def test_reaped_proc_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError("ESRCH")

    sent: list[Any] = []
    closed: list[int] = []
    monkeypatch.setattr(rp.os, "pidfd_open", no_pidfd)
    monkeypatch.setattr(rp.signal, "pidfd_send_signal", lambda fd, sig: sent.append(fd))
    monkeypatch.setattr(rp.os, "close", lambda fd: closed.append(fd))

    class _R:
        def exit_status(self, pid: int, timeout: float) -> int:
            return 0

    p = rp.ReapedProc(_R(), 5)  # type: ignore[arg-type]
    assert p._pidfd == -1
    p.kill()
    assert sent == []
    assert p.wait() == 0 and closed == []


def test_reaped_proc_kill_error_is_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []

    def fail(fd: int, sig: int) -> None:
        sent.append(fd)
        raise ProcessLookupError("gone")

    monkeypatch.setattr(rp.os, "pidfd_open", lambda pid: 0)
    monkeypatch.setattr(rp.signal, "pidfd_send_signal", fail)
    p = rp.ReapedProc(object(), 5)  # type: ignore[arg-type]
    assert p._pidfd == 0
    p.kill()  # (fd 0 counts as a pidfd)
    assert sent == [0]


def test_exit_status_does_not_wait_by_default() -> None:
    r, theirs, _ = _reaper()
    try:
        t0 = time.monotonic()
        assert r.exit_status(6) is None
        assert time.monotonic() - t0 < 0.5
    finally:
        r.ctl.close()
        theirs.close()


def test_reaped_proc_closes_pidfd_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[int] = []
    monkeypatch.setattr(rp.os, "pidfd_open", lambda pid: 0)
    monkeypatch.setattr(rp.os, "close", lambda fd: closed.append(fd))

    class _R:
        def exit_status(self, pid: int, timeout: float) -> int:
            return 1

    p = rp.ReapedProc(_R(), 5)  # type: ignore[arg-type]
    assert p.wait() == 1 and closed == [0] and p._pidfd == -1
