"""The reaper's server in-process (issue 43, mutation testing of reaper/server.py): exact values
of its file helpers, the reaping of children and their statuses, the clean-up (kills by cgroup,
thaws, retries, removals, layer files; plain directories stand in for cgroups, the kills are
recorded), the fork server's start (a real fork and exec of a stand-in), and `serve`'s protocol
on a real SEQPACKET pair (config, zygote, config updates, unknown ops, exit reports, the end)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import types
from typing import Any

import pytest

from arl_tangram.managers.cpu.reaper import server as R

# a mutant that hangs fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)


def test_constants() -> None:
    assert R.CLEAN_S == 8.0 and R._PAUSE_S == 0.02


def test_read_write_subdirs(tmp_path: Any) -> None:
    p = tmp_path / "f"
    R._write(str(p), "abc")
    assert p.read_text() == "abc" and R._read(str(p)) == "abc"
    R._write(str(p), "x")
    assert R._read(str(p)) == "x"  # truncated, not appended
    assert R._read(str(tmp_path / "none")) == ""
    R._write(str(tmp_path / "no" / "dir"), "x")  # swallowed
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    assert sorted(R._subdirs(str(tmp_path))) == [str(tmp_path / "d1"), str(tmp_path / "d2")]
    assert R._subdirs(str(tmp_path / "none")) == []


def _child(code: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            exec(code)
        finally:
            os._exit(0)
    return pid


def test_reap_statuses() -> None:
    """`_reap` waits for any child: run in a fork of its own, whose only children are these
    (the test process may hold other tests' children, which `waitpid(-1)` would reap too)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _reap_statuses()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _reap_statuses() -> None:
    a = _child("os._exit(3)")
    b = _child("os.kill(os.getpid(), 9)")
    c = _child("os._exit(0)")
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        got += R._reap()
        time.sleep(0.01)
    assert sorted(got) == sorted([(a, 3), (b, -9), (c, 0)])
    assert R._reap() == []  # none left: ChildProcessError
    d = _child("import time; time.sleep(5)")
    assert R._reap() == []  # running: WNOHANG gives 0
    os.kill(d, signal.SIGKILL)
    os.waitpid(d, 0)


# --- clean -----------------------------------------------------------------------------------


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        got.append((pid, sig))
        if pid == 666:
            raise ProcessLookupError

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(R, "_reap", lambda: [])
    return got


def _cg(base: Any, name: str, procs: str = "", freeze: bool = False) -> Any:
    d = base / name
    d.mkdir(parents=True)
    (d / "cgroup.procs").write_text(procs)
    if freeze:
        (d / "cgroup.freeze").write_text("1")
    return d


def _plain_rmdir(monkeypatch: pytest.MonkeyPatch, busy: set[str] | None = None) -> list[str]:
    """rmdir of a stand-in cgroup: its files go first (a cgroup's vanish with it)."""
    real = os.rmdir
    seen: list[str] = []
    busy = busy if busy is not None else set()

    def rmdir(p: str) -> None:
        seen.append(p)
        if p in busy:
            raise OSError(16, "Device or resource busy")
        if os.path.isdir(p):
            for n in os.listdir(p):
                q = os.path.join(p, n)
                if os.path.isfile(q):
                    os.unlink(q)
        real(p)

    monkeypatch.setattr(os, "rmdir", rmdir)
    return seen


def test_clean_everything(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]) -> None:
    cpu, mem, fzb = tmp_path / "cpu", tmp_path / "mem", tmp_path / "fz"
    s1 = _cg(cpu, "s1", "11 12\n", freeze=True)
    _cg(mem, "s1", "666 x\n")
    f1 = _cg(fzb, "f1", "13")
    (f1 / "freezer.state").write_text("FROZEN")
    writes: list[Any] = []
    real_write = R._write

    def rec(path: str, value: str) -> None:
        writes.append((os.path.relpath(path, tmp_path), value))
        real_write(path, value)

    monkeypatch.setattr(R, "_write", rec)
    layers = tmp_path / "layers"
    layers.mkdir()
    for n in ("tangram-1-a.ext4", "tangram-1-b.ext4", "tangram-1-c.img", "other.ext4"):
        (layers / n).write_text("")
    (layers / "tangram-1-dir.ext4").mkdir()
    _plain_rmdir(monkeypatch)
    left = R.clean(
        {
            "cgroups": [str(cpu), str(mem), 5],
            "freezer": str(fzb),
            "layers": [str(layers), "tangram-1-"],
        },
        {101, 102},
    )
    assert left == []
    assert sorted(kills) == sorted([(101, 9), (102, 9), (13, 9), (11, 9), (12, 9), (666, 9)])
    assert writes == [("fz/f1/freezer.state", "THAWED"), ("cpu/s1/cgroup.freeze", "0")]
    assert not s1.exists() and not cpu.exists() and not mem.exists() and not fzb.exists()
    assert sorted(os.listdir(layers)) == ["other.ext4", "tangram-1-c.img", "tangram-1-dir.ext4"]


def test_clean_order_of_kills(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    cpu, fzb = tmp_path / "cpu", tmp_path / "fz"
    _cg(cpu, "s1", "21")
    _cg(fzb, "f1", "22")
    _plain_rmdir(monkeypatch)
    R.clean({"cgroups": [str(cpu)], "freezer": str(fzb)}, {20})
    assert kills == [(20, 9), (22, 9), (21, 9)]  # fork servers, freezers, then slots


def test_clean_retries_until_the_deadline(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    cpu = tmp_path / "cpu"
    s1 = _cg(cpu, "s1", "31")
    seen = _plain_rmdir(monkeypatch, busy={str(s1)})
    t = [100.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        t[0] += 1.0

    monkeypatch.setattr(R, "time", types.SimpleNamespace(monotonic=lambda: t[0], sleep=sleep))
    reaps: list[int] = []
    monkeypatch.setattr(R, "_reap", lambda: reaps.append(1) or [])
    left = R.clean({"cgroups": [str(cpu)]}, set(), limit_s=3.0)
    # deadline 103: looks at 100, 101, 102, 103 (not past it), 104 (past): five rounds
    assert sleeps == [0.02] * 4 and len(reaps) == 5
    assert seen.count(str(s1)) == 5
    assert left == [str(s1), str(cpu)]  # the slot, then its base (not empty)
    assert kills == [(31, 9)] * 5


def test_clean_default_limit(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    cpu = tmp_path / "cpu"
    s1 = _cg(cpu, "s1")
    _plain_rmdir(monkeypatch, busy={str(s1)})
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += 1.0

    monkeypatch.setattr(R, "time", types.SimpleNamespace(monotonic=lambda: t[0], sleep=sleep))
    R.clean({"cgroups": [str(cpu)]}, set())
    assert t[0] == 9.0  # rounds at 0..9: past 8.0 only at 9


def test_clean_nothing_and_oddities(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    assert R.clean({}, set()) == []
    assert R.clean({"cgroups": None, "freezer": 3, "layers": "x"}, set()) == []
    layers = tmp_path / "layers"
    layers.mkdir()
    (layers / "p-a.ext4").write_text("")
    R.clean({"layers": [str(layers), "p-", "extra"]}, set())
    R.clean({"layers": [str(layers)]}, set())
    assert os.listdir(layers) == ["p-a.ext4"]
    R.clean({"layers": [str(tmp_path / "none"), "p-"]}, set())  # swallowed
    gone = tmp_path / "gone"
    seen = _plain_rmdir(monkeypatch)
    assert R.clean({"cgroups": [str(gone)], "freezer": str(tmp_path / "gonefz")}, set()) == []
    assert seen == [str(tmp_path / "gonefz"), str(gone)]  # freezer base first


def test_clean_a_slot_that_went_meanwhile(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    cpu = tmp_path / "cpu"
    s1 = _cg(cpu, "s1")

    real = os.rmdir

    def rmdir(p: str) -> None:
        if p == str(s1):
            os.unlink(s1 / "cgroup.procs")
            real(p)
            raise FileNotFoundError(p)
        real(p)

    monkeypatch.setattr(os, "rmdir", rmdir)
    assert R.clean({"cgroups": [str(cpu)]}, set()) == []


# --- the fork server's start -----------------------------------------------------------------


def test_start_zygote_refusals() -> None:
    r, w = os.pipe()
    assert R._start_zygote({"argv": ["x"], "env": {}}, [r, w], -1) == {
        "error": "bad zygote request"
    }
    for fd in (r, w):
        with pytest.raises(OSError):
            os.fstat(fd)
    for msg in ({"argv": "x", "env": {}}, {"argv": ["x"], "env": []}, {"env": {}}, {"argv": []}):
        r, w = os.pipe()
        assert R._start_zygote(msg, [r], -1) == {"error": "bad zygote request"}
        with pytest.raises(OSError):
            os.fstat(r)
        os.close(w)
    assert R._start_zygote({"argv": ["x"], "env": {}}, [], -1) == {"error": "bad zygote request"}


def test_start_zygote_fork_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", fork)
    r, w = os.pipe()
    got = R._start_zygote({"argv": ["x"], "env": {}}, [r], -1)
    assert got == {"error": "fork: [Errno 11] Resource temporarily unavailable"}
    with pytest.raises(OSError):
        os.fstat(r)
    os.close(w)


def test_start_zygote_execs_with_fd3(tmp_path: Any) -> None:
    out = tmp_path / "out.json"
    script = (
        "import json, os, sys\n"
        "st = os.fstat(3)\n"
        "fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
        "json.dump({'argv': sys.argv, 'env': {k: v for k, v in os.environ.items() if k != 'LC_CTYPE'},"
        " 'cwd': os.getcwd(), 'fds': fds, 'stdin': os.readlink('/proc/self/fd/0'),"
        " 'stdout': os.readlink('/proc/self/fd/1'), 'sock': os.get_inheritable(3),"
        " 'sigint': str(__import__('signal').getsignal(2))},"
        f" open({str(out)!r}, 'w'))\n"
        "os.write(3, b'hi')\n"
    )
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    extra = os.open("/dev/null", os.O_RDONLY)  # (inheritable: closed in the child by closerange)
    os.set_inheritable(extra, True)
    try:
        got = R._start_zygote(
            {"argv": [sys.executable, "-c", script, 7], "env": {"A": 1, "PATH": "/usr/bin"}},
            [os.dup(b.fileno())],
            -1,
        )
    finally:
        signal.signal(signal.SIGINT, old)
    pid = got["pid"]
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    d = json.loads(out.read_text())
    assert d["argv"] == ["-c", "7"]
    assert d["env"] == {"A": "1", "PATH": "/usr/bin"}
    assert d["cwd"] == "/" and d["stdin"] == "/dev/null" and d["stdout"] == "/dev/null"
    assert d["fds"] == [0, 1, 2, 3, 4]  # (4: the listing's own directory fd)
    assert d["sock"] is True
    assert d["sigint"] == "<built-in function default_int_handler>"  # (SIG_IGN would stay)
    a.settimeout(2)
    assert a.recv(16) == b"hi"
    os.close(extra)
    a.close()
    b.close()


def test_start_zygote_exec_failure_exits_127() -> None:
    r, w = os.pipe()
    got = R._start_zygote({"argv": ["/nonexistent/zygote"], "env": {}}, [r], -1)
    _, status = os.waitpid(got["pid"], 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 127
    with pytest.raises(OSError):
        os.fstat(r)
    os.close(w)


# --- serve -----------------------------------------------------------------------------------


class _Serve:
    """`serve` in this (main) thread; the manager's side of its socket in a thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, parent: int | None = None) -> None:
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.cleaned: list[Any] = []
        monkeypatch.setattr(R, "clean", lambda cfg, z: self.cleaned.append((dict(cfg), set(z))))
        self.parent = os.getppid() if parent is None else parent
        self.old = signal.getsignal(signal.SIGCHLD)

    def run(self, script: Any) -> None:
        th = threading.Thread(target=script, args=(self.ours,), daemon=True)
        th.start()
        try:
            R.serve(self.theirs, self.parent)
        finally:
            signal.signal(signal.SIGCHLD, self.old)
            signal.set_wakeup_fd(-1)
            th.join(10)
            self.ours.close()
            self.theirs.close()


def _ask(sock: socket.socket, msg: Any, fds: list[int] | None = None) -> Any:
    data = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
    socket.send_fds(sock, [data], fds or [])
    sock.settimeout(10)
    return json.loads(sock.recv(1 << 16))


def test_serve_protocol(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    sv = _Serve(monkeypatch)
    seen: dict[str, Any] = {}

    def script(s: socket.socket) -> None:
        r, w = os.pipe()
        socket.send_fds(s, [json.dumps({"cgroups": ["/a"], "freezer": None}).encode()], [r])
        os.close(r)
        seen["unknown"] = _ask(s, {"op": "nope"}, [w])
        seen["noop"] = _ask(s, b"not json")
        seen["config"] = _ask(s, {"op": "config", "freezer": "/fz", "layers": ["/l", "p"]}, [w])
        os.close(w)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seen["zygote"] = _ask(
            s,
            {"op": "zygote", "argv": [sys.executable, "-c", "import os; os._exit(5)"], "env": {}},
            [b.fileno()],
        )
        b.close()
        a.close()
        seen["exit"] = json.loads(s.recv(1 << 16))
        seen["bad"] = _ask(s, {"op": "zygote", "argv": "x", "env": {}})
        s.shutdown(socket.SHUT_WR)

    sv.run(script)
    assert seen["unknown"] == {"error": "unknown op 'nope'"}
    assert seen["noop"] == {"error": "unknown op None"}
    assert seen["config"] == {"ok": True}
    pid = seen["zygote"]["pid"]
    assert seen["exit"] == {"exit": pid, "rc": 5}
    assert seen["bad"] == {"error": "bad zygote request"}
    assert sv.cleaned == [({"cgroups": ["/a"], "freezer": "/fz", "layers": ["/l", "p"]}, set())]


def test_serve_kills_live_zygotes_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    sv = _Serve(monkeypatch)
    seen: dict[str, Any] = {}

    def script(s: socket.socket) -> None:
        socket.send_fds(s, [b'{"cgroups": []}'], [])
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seen["z"] = _ask(
            s,
            {
                "op": "zygote",
                "argv": [sys.executable, "-c", "import time; time.sleep(30)"],
                "env": {},
            },
            [b.fileno()],
        )
        b.close()
        a.close()
        s.close()

    sv.run(script)
    pid = seen["z"]["pid"]
    assert sv.cleaned == [({"cgroups": []}, {pid})]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_serve_service_already_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    for parent, first in ((os.getpid(), b'{"x": 1}'), (999_999_999, b'{"x": 1}'), (None, b"")):
        sv = _Serve(monkeypatch, parent)

        def script(s: socket.socket, first: bytes = first) -> None:
            if first:
                s.send(first)
            else:
                s.shutdown(socket.SHUT_WR)

        sv.run(script)
        assert sv.cleaned == [({"x": 1} if first else {}, set())]


def test_serve_ends_when_the_service_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    # the service: a child of ours that exits; serve checks its parent is the service, so the
    # parent check is pointed at our own parent and the pidfd at the child
    child = _child("import time; time.sleep(0.3)")
    real_open = os.pidfd_open
    monkeypatch.setattr(os, "pidfd_open", lambda pid, *a: real_open(child))
    sv = _Serve(monkeypatch)
    seen: dict[str, Any] = {}

    def script(s: socket.socket) -> None:
        s.send(b'{"cgroups": ["/c"]}')
        seen["ok"] = _ask(s, {"op": "config", "freezer": None})

    t0 = time.monotonic()
    sv.run(script)
    assert seen["ok"] == {"ok": True}
    assert sv.cleaned == [({"cgroups": ["/c"], "freezer": None}, set())]
    assert time.monotonic() - t0 < 5
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)


def test_main(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(R._linux, "set_name", lambda n: calls.append(("name", n)))
    monkeypatch.setattr(R._linux, "prctl", lambda *a: calls.append(("prctl", *a)))
    monkeypatch.setattr(
        R, "serve", lambda ctl, parent: calls.append(("serve", ctl.fileno(), parent))
    )
    monkeypatch.setattr(R, "_reap", lambda: calls.append("reap"))
    monkeypatch.setattr(R.os, "_exit", lambda rc: calls.append(("exit", rc)))
    sigs: list[Any] = []
    monkeypatch.setattr(R.signal, "signal", lambda s, h: sigs.append((s, h)))
    a, b = socket.socketpair()
    monkeypatch.setattr(sys, "argv", ["reaper", str(a.fileno()), "4242"])
    R.main()
    assert calls == [
        ("name", "tangram-reaper"),
        ("prctl", R._linux.PR_SET_CHILD_SUBREAPER, 1),
        ("serve", a.fileno(), 4242),
        "reap",
        ("exit", 0),
    ]
    assert sigs == [
        (signal.SIGINT, signal.SIG_IGN),
        (signal.SIGHUP, signal.SIG_IGN),
        (signal.SIGTERM, signal.SIG_IGN),
    ]
    b.close()
    with contextlib.suppress(OSError):
        a.close()


# --- edges found by mutation testing ---------------------------------------------------------


def test_clean_a_gone_fork_server(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kills: list[Any]
) -> None:
    assert R.clean({}, {666}) == []  # its kill fails (gone already): swallowed
    assert kills == [(666, 9)]


def test_start_zygote_stdin_is_dev_null(tmp_path: Any) -> None:
    out = tmp_path / "in"
    script = f"import os; open({str(out)!r}, 'w').write(os.readlink('/proc/self/fd/0'))"
    r, w = os.pipe()
    saved = os.dup(0)
    os.dup2(r, 0)  # (ours: a pipe; the fork server's must not be)
    try:
        got = R._start_zygote({"argv": [sys.executable, "-c", script], "env": {}}, [os.dup(w)], -1)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    os.waitpid(got["pid"], 0)
    assert out.read_text() == "/dev/null"
    os.close(r)
    os.close(w)


# --- helper-66: serve's edges, and the real reaper process -----------------------------------


def test_serve_without_a_pidfd_cleans_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pidfd of the service (pidfd_open failed): the service is taken as gone, cleaned at
    once, no poll loop (a pidfd of +1 would poll stdout instead)."""

    def pidfd_open(pid: int, *a: Any) -> int:
        raise OSError(3, "No such process")

    polls: list[Any] = []
    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
    monkeypatch.setattr(R.select, "poll", lambda: polls.append(1))
    sv = _Serve(monkeypatch)

    def script(s: socket.socket) -> None:
        s.send(b'{"cgroups": ["/p"]}')
        s.shutdown(socket.SHUT_WR)

    sv.run(script)
    assert polls == []
    assert sv.cleaned == [({"cgroups": ["/p"]}, set())]


def test_serve_reads_its_wakeup_pipe_only_after_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    pipes: list[tuple[int, int]] = []
    real_pipe2, real_read = os.pipe2, os.read

    def pipe2(flags: int) -> tuple[int, int]:
        p = real_pipe2(flags)
        pipes.append(p)
        return p

    reads: list[int] = []

    def read(fd: int, n: int) -> bytes:
        if pipes and fd == pipes[0][0]:
            reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "pipe2", pipe2)
    monkeypatch.setattr(os, "read", read)
    sv = _Serve(monkeypatch)
    seen: dict[str, Any] = {}

    def script(s: socket.socket) -> None:
        s.send(b'{"cgroups": []}')
        seen["a"] = _ask(s, {"op": "config", "freezer": None})
        seen["b"] = _ask(s, {"op": "config", "layers": None})
        s.shutdown(socket.SHUT_WR)

    sv.run(script)
    assert seen == {"a": {"ok": True}, "b": {"ok": True}}
    assert reads == []  # (no signal came: the pipe was never readable)


class _SendFails(socket.socket):
    """The reaper's end of the socket, whose every send fails (the manager went meanwhile)."""

    sent: list[bytes]

    def send(self, data: Any, *a: Any) -> int:
        self.sent.append(bytes(data))
        raise BrokenPipeError(32, "Broken pipe")


def test_serve_swallows_send_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    sv = _Serve(monkeypatch)
    theirs = _SendFails(fileno=os.dup(sv.theirs.fileno()))
    theirs.sent = []
    sv.theirs.close()
    sv.theirs = theirs

    def script(s: socket.socket) -> None:
        s.send(b'{"cgroups": []}')
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(
            s,
            [json.dumps({"op": "zygote", "argv": ["/bin/sh", "-c", "exit 0"], "env": {}}).encode()],
            [b.fileno()],
        )
        b.close()
        a.close()
        deadline = time.monotonic() + 2  # (a mutant that raises at the first send: 1 only)
        while len(theirs.sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.shutdown(socket.SHUT_WR)

    sv.run(script)
    pid = json.loads(theirs.sent[0])["pid"]
    assert [json.loads(m) for m in theirs.sent] == [{"pid": pid}, {"exit": pid, "rc": 0}]
    assert sv.cleaned == [({"cgroups": []}, set())]  # (the fork server ended: not killed)


def test_serve_ends_when_its_socket_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receive error on the control socket (after the configuration) is the manager's end:
    serve cleans with what it had and returns, reading nothing more."""
    real = socket.recv_fds
    calls: list[int] = []

    def recv_fds(sock: Any, *a: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(sock, *a)

    monkeypatch.setattr(socket, "recv_fds", recv_fds)
    sv = _Serve(monkeypatch)

    def script(s: socket.socket) -> None:
        s.send(b'{"cgroups": ["/r"]}')
        s.send(json.dumps({"op": "config", "freezer": "/f"}).encode())
        s.shutdown(socket.SHUT_WR)

    sv.run(script)
    assert sv.cleaned == [({"cgroups": ["/r"]}, set())]
    assert len(calls) == 2


def test_the_real_reaper_process(tmp_path: Any) -> None:
    """`python -m ...reaper.server` as the manager starts it (host/reaper.py): configured, starts
    a fork server and reports its end, cleans the layer files at the close and exits 0."""
    from arl_tangram.managers.cpu.host import reaper as rp

    (tmp_path / "p1.ext4").write_text("x")
    (tmp_path / "p2.img").write_text("x")
    (tmp_path / "q1.ext4").write_text("x")
    r = rp.Reaper({"cgroups": []})
    try:
        r.configure(layers=[str(tmp_path), "p"])
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = r.start_zygote(["/bin/sh", "-c", "exit 5"], {}, b.fileno())
        a.close()
        b.close()
        assert r.exit_status(pid, 4.0) == 5
    finally:
        r.close(4.0)
    assert r.proc.returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["p2.img", "q1.ext4"]


def test_start_zygote_closes_inheritable_fds_from_4(tmp_path: Any) -> None:
    """An inheritable fd at exactly 4, and one far above, are closed in the fork server (only
    0-3 cross the exec)."""
    out = tmp_path / "fds"
    script = (
        "import os\n"
        "fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
        f"open({str(out)!r}, 'w').write(repr(fds))\n"
    )
    saved, was = None, False
    with contextlib.suppress(OSError):
        saved, was = os.dup(4), os.get_inheritable(4)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 4, inheritable=True)
    high = os.dup2(null, 1000, inheritable=True)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        got = R._start_zygote(
            {"argv": [sys.executable, "-c", script], "env": {}}, [os.dup(b.fileno())], -1
        )
    finally:
        if saved is None:
            os.close(4)
        else:
            os.dup2(saved, 4, inheritable=was)
            os.close(saved)
        os.close(high)
        os.close(null)
    _, status = os.waitpid(got["pid"], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.read_text() == "[0, 1, 2, 3, 4]"  # (4: the listing's own directory fd)
    a.close()
    b.close()
