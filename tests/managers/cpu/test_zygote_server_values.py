"""Exact values of the fork server's pure parts (`zygote/server.py`, issue 43), in the test
process or a fork of it: where a host path appears inside a sandbox, the sandbox view that
`build_root` makes (read-only binds and their flags, masked secrets, the hidden paths, the
minimal /dev and its links, the root itself read-only), the pool of sandbox ids and network
namespaces, the type-cache warm-up's names, and the configuration's first message."""

from __future__ import annotations

import json
import os
import socket
import sys
import types

import pytest

from arl_tangram.managers.cpu import _linux
from arl_tangram.managers.cpu.zygote import server


def test_sandbox_path() -> None:
    assert server.RELOCATED == "/.tangram-ro"
    assert server.sandbox_path("/tmp/venv") == "/.tangram-ro/tmp/venv"
    assert server.sandbox_path("/tmp") == "/tmp"  # (only what lies under it)
    assert server.sandbox_path("/usr/tmp/x") == "/usr/tmp/x"
    assert server.sandbox_path("/tmpx/a") == "/tmpx/a"


def test_constants() -> None:
    assert server._RO == (
        _linux.MS_BIND | _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV
    )
    assert server._MASK_FILES == (
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/shadow-",
        "/etc/gshadow-",
        "/etc/sudoers",
    )
    assert server._MASK_DIRS == ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
    assert server._DEVICES == ("null", "zero", "full", "random", "urandom")
    assert server.TITLE == b"tangram-sandbox" and server.BIND_NOW == "LD_BIND_NOW"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _mounts() -> dict[str, tuple[set[str], str, str, str]]:
    """mount point -> (per-mount options, fs type, source, super options)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts = left.split()
            fstype, source, sopts = right.split()[:3]
            out[parts[4].replace("\\040", " ")] = (set(parts[5].split(",")), fstype, source, sopts)
    return out


@pytest.mark.needs_root
def test_build_root_makes_the_sandbox_view(tmp_path) -> None:
    ro_tmp = tmp_path / "venv"  # a read-only path under /tmp: bound at its relocated path
    ro_tmp.mkdir()
    (ro_tmp / "f").write_text("v")
    tools = tmp_path / "tools"  # two files bound alone, side by side (one directory made)
    tools.mkdir()
    (tools / "a").write_text("A")
    (tools / "b").write_text("B")
    hide_dir = "/etc/ssl/certs"
    hide_file = "/etc/hostname"
    root = str(tmp_path / "root")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _linux.unshare(_linux.CLONE_NEWNS)
            _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
            server.build_root(
                root,
                [
                    "/usr",
                    "/bin",
                    "/etc",
                    "/etc/passwd",
                    str(ro_tmp),
                    "/nonexistent-t53",
                    str(tools / "a"),
                    str(tools / "b"),
                ],
                hidden=[hide_dir, hide_file, "/nonexistent-h53"],
            )
            m = _mounts()
            facts = {
                "mounts": {
                    k[len(root) :] or "/": [sorted(v[0]), v[1], v[3], v[2]]
                    for k, v in m.items()
                    if k == root or k.startswith(root + "/")
                },
                "dev": sorted(os.listdir(root + "/dev")),
                "links": {
                    n: os.readlink(f"{root}/dev/{n}")
                    for n in ("fd", "stdin", "stdout", "stderr", "shm")
                },
                "dirs": [
                    os.path.isdir(f"{root}/{d}") for d in ("proc", "tmp", "workdir", "sandbox")
                ],
                "shadow": _read(root + "/etc/shadow") if os.path.exists("/etc/shadow") else "",
                "hostname": _read(root + hide_file),
                "certs": os.listdir(root + hide_dir) if os.path.isdir(hide_dir) else [],
                "venv": _read(root + "/.tangram-ro" + str(ro_tmp) + "/f"),
                "tools": sorted(os.listdir(root + "/.tangram-ro" + str(tools))),
                "tool_a": _read(root + "/.tangram-ro" + str(tools / "a")),
                "tool_b": _read(root + "/.tangram-ro" + str(tools / "b")),
                "bin": os.readlink(root + "/bin") if os.path.islink("/bin") else None,
                "root_mode": oct(os.stat(root).st_mode & 0o777),
                "dev_mode": oct(os.stat(root + "/dev").st_mode & 0o777),
            }
            os.write(w, json.dumps(facts).encode())
        except BaseException:
            import traceback

            os.write(w, json.dumps({"error": traceback.format_exc()}).encode())
        os._exit(0)
    os.close(w)
    buf = b""
    while chunk := os.read(r, 1 << 16):
        buf += chunk
    os.close(r)
    os.waitpid(pid, 0)
    facts = json.loads(buf)
    assert "error" not in facts, facts
    mounts = facts["mounts"]
    sources = {k: v.pop() for k, v in mounts.items()}  # (each mount's source)
    assert sources["/"] == sources["/dev"] == "tmpfs"
    for d in server._MASK_DIRS:
        if os.path.isdir(d):
            assert sources[d] == "tmpfs", d
    if os.path.isdir(hide_dir):
        assert sources[hide_dir] == "tmpfs" and "size=4k" in mounts[hide_dir][2]
    opts, fstype, sopts = mounts["/"]
    assert fstype == "tmpfs" and {"ro", "nosuid", "nodev"} <= set(opts)
    assert "size=4096k" in sopts and "mode=755" in sopts
    for p in ("/usr", "/etc", "/.tangram-ro" + str(ro_tmp)):
        opts, _, _ = mounts[p]
        assert {"ro", "nosuid", "nodev"} <= set(opts), (p, opts)
    assert "/etc/passwd" not in mounts  # inside an earlier bind (shorter paths first)
    assert str(ro_tmp) not in mounts and "/nonexistent-t53" not in mounts
    if os.path.exists("/etc/shadow"):
        assert facts["shadow"] == "" and mounts["/etc/shadow"][1] != "tmpfs"
    for d in server._MASK_DIRS:
        if os.path.isdir(d):
            opts, fstype, sopts = mounts[d]
            assert fstype == "tmpfs" and "ro" in opts and "size=4k" in sopts
    if os.path.isdir(hide_dir):
        assert (
            facts["certs"] == [] and mounts[hide_dir][1] == "tmpfs" and "ro" in mounts[hide_dir][0]
        )
    assert facts["hostname"] == "" and hide_file in mounts
    opts, fstype, sopts = mounts["/dev"]
    assert fstype == "tmpfs" and {"ro", "nosuid", "noexec"} <= set(opts) and "size=64k" in sopts
    assert "nodev" not in opts
    assert facts["dev"] == sorted(
        ["null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr", "shm"]
    )
    for n in server._DEVICES:
        opts, _, _ = mounts["/dev/" + n]
        assert {"nosuid", "noexec"} <= set(opts) and "ro" not in opts, (n, opts)
    assert facts["links"] == {
        "fd": "/proc/self/fd",
        "stdin": "/proc/self/fd/0",
        "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2",
        "shm": "/tmp",
    }
    assert facts["dirs"] == [True] * 4
    assert facts["venv"] == "v"
    assert (facts["tools"], facts["tool_a"], facts["tool_b"]) == (["a", "b"], "A", "B")
    for f in ("a", "b"):
        opts, _, _ = mounts["/.tangram-ro" + str(tools / f)]
        assert {"ro", "nosuid", "nodev"} <= set(opts), (f, opts)
    if os.path.islink("/bin"):
        assert facts["bin"] == os.readlink("/bin")
    assert facts["root_mode"] == "0o755" and facts["dev_mode"] == "0o755"


def test_ids_pool_order_and_refusal(tmp_path) -> None:
    procfd = os.open("/proc", os.O_RDONLY)
    try:
        ns = server.Namespaces(procfd, [100, 6], busy=[104, 101], held=[102])
        assert list(ns.ids) == [100, 103, 105, 101, 104] and ns.held == {102} and ns.per_sandbox
        assert ns.free == type(ns.free)() and ns.lent == {} and ns.made == 0 and ns.direct == set()
        assert ns.take_id(7) == 100
        ns.give_id(55)
        assert ns.ids[0] == 55
        ns.give_ids([102, 300])
        assert list(ns.ids)[-1] == 102 and ns.held == set() and 300 not in ns.ids
        for _ in range(len(ns.ids)):
            ns.take_id(7)
        with pytest.raises(OSError) as e:
            ns.take_id(7)
        assert (
            e.value.errno == 11 and e.value.strerror == "every sandbox id of this manager is in use"
        )
        ns.id_of[4242] = 103
        ns.lent[4242] = 77
        ns.reaped(4242)
        assert list(ns.ids) == [103] and list(ns.free) == [77] and ns.lent == {} and ns.id_of == {}
        ns.reaped(1)  # not a sandbox of ours: nothing
        assert list(ns.ids) == [103] and list(ns.free) == [77]
        shared = server.Namespaces(procfd)
        assert not shared.per_sandbox and list(shared.ids) == [] and shared.take_id(9) == 9
        shared.give_id(5)
        assert list(shared.ids) == []
        assert os.readlink(f"/proc/self/fd/{ns.home_pid}").startswith("pid:[")
        assert os.readlink(f"/proc/self/fd/{ns.home_net}").startswith("net:[")
        for x in (ns, shared):
            os.close(x.home_pid)
            os.close(x.home_net)
    finally:
        os.close(procfd)


@pytest.mark.needs_root
def test_net_namespaces_are_made_then_reused(tmp_path) -> None:
    procfd = os.open("/proc", os.O_RDONLY)
    ns = server.Namespaces(procfd)
    home = os.readlink("/proc/thread-self/ns/net")
    try:
        a = ns.take_net()
        assert ns.made == 1 and os.readlink("/proc/thread-self/ns/net") == home
        assert os.readlink(f"/proc/self/fd/{a}") != home
        ns.lent[9] = a
        ns.reaped(9)
        assert ns.take_net() == a and ns.made == 1
        b = ns.take_net()
        assert b != a and ns.made == 2
        os.close(a)
        os.close(b)
    finally:
        os.close(ns.home_pid)
        os.close(ns.home_net)
        os.close(procfd)


def test_warm_type_cache_names(monkeypatch) -> None:
    m = types.ModuleType("t53mod")
    m.os = os
    m.sys = sys
    exec(
        "def f():\n    return os.getpid() + len(sys.argv) + os.nonexistent_t53\n"
        "class C:\n    def g(self):\n        def inner():\n            return os.sep\n        return inner\n",
        m.__dict__,
    )
    m.C.__module__ = "t53mod"
    names = server.warm_type_cache((m,))
    assert names == frozenset({"getpid", "argv", "sep", "sys"})  # (os.sys: a module's name too)
    assert server._functions(m) == [m.f, m.C.g]
    other = type("D", (), {"h": lambda self: 1})
    other.__module__ = "elsewhere"
    m.D = other
    assert server._functions(m) == [m.f, m.C.g]


def test_preload_ignores_what_fails(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    server._preload(["json", "no_such_module_t53", "colorsys"])
    assert "no_such_module_t53" not in sys.modules and "colorsys" in sys.modules


def test_receive_config(tmp_path) -> None:
    a, b = socket.socketpair()
    d = os.open(str(tmp_path), os.O_RDONLY)
    extra = os.open("/dev/null", os.O_RDONLY)
    socket.send_fds(a, [json.dumps({"root": "r", "x": 1}).encode()], [d, extra])
    cwd = os.getcwd()
    try:
        cfg = server._receive_config(b)
        assert os.getcwd() == str(tmp_path)
    finally:
        os.chdir(cwd)
    assert cfg["root"] == "r" and cfg["x"] == 1 and len(cfg["cg_dirs"]) == 1
    assert os.readlink(f"/proc/self/fd/{cfg['cg_dirs'][0]}") == "/dev/null"
    os.close(cfg["cg_dirs"][0])
    os.close(extra)
    a.sendall(b"{}")
    with pytest.raises(OSError) as e:
        server._receive_config(b)
    assert str(e.value) == "fork server: no root directory descriptor with the configuration"
    a.close()
    b.close()


def test_bind_now_is_a_no_op_once_bound(monkeypatch) -> None:
    monkeypatch.setenv("LD_BIND_NOW", "1")
    called = []
    monkeypatch.setattr(server.os, "execve", lambda *a: called.append(a))
    server.bind_now()
    assert called == []
    monkeypatch.setenv("LD_BIND_NOW", "0")
    monkeypatch.setattr(_linux, "prctl", lambda *a: called.append(("prctl", a)))
    server.bind_now()
    assert called[0] == ("prctl", (_linux.PR_SET_PDEATHSIG, 9))
    exe, argv, env = called[1]
    assert exe == sys.executable and argv == [sys.executable, *sys.orig_argv[1:]]
    assert env["LD_BIND_NOW"] == "1"


class _Exited(Exception):
    pass


def _serve_until_eof(monkeypatch, msgs: list[bytes], cfg: dict, spawn) -> list[bytes]:
    """`_serve` in this process: ``msgs`` from the manager, then EOF (the loop's end); the
    replies it sent, one message each."""

    def exit_(code: int):
        raise _Exited(code)

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for m in msgs:
        b.send(m)
    b.shutdown(socket.SHUT_WR)
    monkeypatch.setattr(server.os, "_exit", exit_)
    monkeypatch.setattr(server, "_on_sigchld", None)
    monkeypatch.setattr(server, "spawn", spawn)
    import signal
    import threading

    out: list[bytes] = []

    def read() -> None:  # (as the manager does: a full socket would block the replies)
        while m := b.recv(1 << 16):
            out.append(m)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    old = signal.getsignal(signal.SIGCHLD)
    try:
        with pytest.raises(_Exited) as e:
            server._serve(a, cfg, ns := _FakeNs())
        assert e.value.args == (0,)
    finally:
        signal.signal(signal.SIGCHLD, old)
        a.close()
    t.join(10)
    assert not t.is_alive()
    b.close()
    _serve_until_eof.ns = ns  # type: ignore[attr-defined]
    return out


class _FakeNs:
    def __init__(self) -> None:
        self.given: list[list[int]] = []

    def give_ids(self, uids: list[int]) -> None:
        self.given.append(uids)


def test_serve_takes_held_ids_back_without_a_reply(monkeypatch) -> None:
    calls = []
    got = _serve_until_eof(
        monkeypatch,
        [
            b'{"op":"ids","free":[7,"8"]}',
            b'{"op":"ids","free":["x"]}',
            b'{"op":"ids","free":[1',
            b'{"op":"ids","free":[null]}',  # (TypeErrors: ignored too)
            b'{"op":"ids","free":3}',
        ],
        {"cg_dirs": []},
        lambda *a: calls.append(a),
    )
    assert got == [] and calls == []  # (bad ones ignored: neither is a spawn)
    assert _serve_until_eof.ns.given == [[7, 8]]  # type: ignore[attr-defined]


def test_serve_spawns_what_is_asked_and_refuses_a_bad_join(monkeypatch) -> None:
    calls = []

    def spawn(cfg, ns, n, join):
        calls.append((cfg, ns, n, join))
        return [(4000 + i, *_pair_fd(), 9) for i in range(n)][:1] + [OSError(11, "busy")] * (n - 1)

    cfg = {"cg_dirs": [5], "uid": 1}
    got = _serve_until_eof(
        monkeypatch,
        [
            b'{"n":2,"join":["s1","s22"],"cfg":{"direct":true}}',
            b'{"n":1,"join":["t1"]}',
            b'{"n":2,"join":["s1"]}',
            b'{"n":1,"join":["s"]}',
            b'{"n":1,"join":[3]}',
            b'{"n":0}',
            b'{"n":99}',
            b"not json",
        ],
        cfg,
        spawn,
    )
    ns = _serve_until_eof.ns  # type: ignore[attr-defined]
    assert [(c[0], c[1] is ns, c[2], c[3]) for c in calls] == [
        ({"cg_dirs": [5], "uid": 1, "direct": True}, True, 2, ["s1", "s22"]),
        (cfg, True, 1, None),
        (cfg, True, 64, None),
    ]
    assert got == [
        b'{"pid":4000,"uid":9}',
        b'{"error": "BlockingIOError: [Errno 11] busy"}',
        b'{"error": "ValueError: bad join: [\'t1\']"}',
        b'{"error": "ValueError: bad join: [\'s1\']"}',
        b'{"error": "ValueError: bad join: [\'s1\']"}',
        b'{"error": "ValueError: bad join: [\'s\']"}',
        b'{"error": "ValueError: bad join: [3]"}',
        b'{"pid":4000,"uid":9}',
        b'{"pid":4000,"uid":9}',
        *[b'{"error": "BlockingIOError: [Errno 11] busy"}'] * 63,
        b'{"error": "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"}',
    ]
    no_cg = _serve_until_eof(monkeypatch, [b'{"join":["s1"]}'], {"cg_dirs": []}, spawn)
    assert no_cg == [b'{"error": "ValueError: bad join: [\'s1\']"}']


def _pair_fd() -> tuple[int, list[int]]:
    a, b = socket.socketpair()
    b.close()
    return a.detach(), []


def test_reap_reports_a_direct_sandbox_exit(monkeypatch) -> None:
    import signal

    reaped = []

    class Ns:
        direct: set[int] = set()

        def reaped(self, pid: int) -> None:
            reaped.append(pid)

    ns = Ns()
    pids = []
    for how in ("exit3", "kill", "exit0"):
        pid = os.fork()
        if pid == 0:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3 if how == "exit3" else 0)
        pids.append(pid)
    ns.direct = {pids[0], pids[1]}  # the third is not direct: no report
    for p in pids:  # (ended, not reaped yet)
        os.waitid(os.P_PID, p, os.WEXITED | os.WNOWAIT)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        server._reap(ns, a)  # type: ignore[arg-type]
        assert sorted(reaped) == sorted(pids) and ns.direct == set()
        b.setblocking(False)
        got = set()
        for _ in range(2):
            got.add(b.recv(100))
        assert got == {
            b'{"exit":%d,"rc":3}' % pids[0],
            b'{"exit":%d,"rc":-9}' % pids[1],
        }
        with pytest.raises(BlockingIOError):
            b.recv(100)
        server._reap(ns, a)  # no child left: returns
    finally:
        a.close()
        b.close()


@pytest.mark.needs_root
def test_kit_opens_the_slot_tasks_files(tmp_path, monkeypatch) -> None:
    for h in ("h1", "h2"):
        (tmp_path / h / "s3").mkdir(parents=True)
        (tmp_path / h / "s3" / "tasks").write_text("")
    dirs = [os.open(str(tmp_path / h), os.O_RDONLY) for h in ("h1", "h2")]
    procfd = os.open("/proc", os.O_RDONLY)
    ns = server.Namespaces(procfd, [100, 2])
    monkeypatch.setattr(ns, "take_net", lambda: 99)
    try:
        ours, theirs, pipes, net, cg, uid = server._kit(
            {"cg_dirs": dirs, "uid": 7, "direct": True}, ns, "s3"
        )
        assert (net, uid, len(pipes), len(cg)) == (99, 100, 2, 2)
        assert [os.readlink(f"/proc/self/fd/{fd}") for fd in cg] == [
            str(tmp_path / h / "s3" / "tasks") for h in ("h1", "h2")
        ]
        assert all(not os.get_inheritable(fd) for fd in cg)
        import fcntl

        for _, w in pipes:
            assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == 1 << 20
        s = socket.socket(fileno=ours)
        assert (s.family, s.type) == (socket.AF_UNIX, socket.SOCK_STREAM)
        s.close()
        for fd in (theirs, *cg, *[x for p in pipes for x in p]):
            os.close(fd)
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(FileNotFoundError):
            server._kit({"cg_dirs": dirs, "uid": 7}, ns, "s4")
        assert set(os.listdir("/proc/self/fd")) == before and list(ns.ids) == [101]
        (tmp_path / "h1" / "s5").mkdir()  # the first hierarchy's file opened, not the second's
        (tmp_path / "h1" / "s5" / "tasks").write_text("")
        with pytest.raises(FileNotFoundError):
            server._kit({"cg_dirs": dirs, "uid": 7}, ns, "s5")
        assert set(os.listdir("/proc/self/fd")) == before and list(ns.ids) == [101]
        _, theirs, pipes, _, cg, uid = server._kit({"cg_dirs": dirs, "uid": 7}, ns)
        assert (pipes, cg, uid) == ([], (), 101)
        os.close(theirs)
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError) as e:  # no id left: the slot's files closed again
            server._kit({"cg_dirs": dirs, "uid": 7}, ns, "s3")
        assert e.value.errno == 11 and set(os.listdir("/proc/self/fd")) == before
    finally:
        for fd in (*dirs, procfd, ns.home_pid, ns.home_net):
            os.close(fd)


def test_fork_server_says_why_it_could_not_start(tmp_path) -> None:
    """Its first message: the error of a start that failed (here no directory fd came with
    the configuration), and it exits 1."""
    import subprocess

    a, b = socket.socketpair()
    env = {**os.environ, "LD_BIND_NOW": "1"}
    p = subprocess.Popen(
        [sys.executable, "-P", "-m", "arl_tangram.managers.cpu.zygote.server", str(b.fileno())],
        pass_fds=(b.fileno(),),
        env=env,
        cwd="/",
    )
    b.close()
    a.sendall(b'{"root":"r"}')
    a.settimeout(30)
    hello = a.recv(1 << 16)
    assert p.wait(timeout=30) == 1
    a.close()
    assert json.loads(hello) == {
        "ok": False,
        "error": "OSError: fork server: no root directory descriptor with the configuration",
    }


def test_bind_now_gives_up_quietly_when_it_cannot_restart(monkeypatch) -> None:
    """A failed `prctl` or `execve` is not worth failing the start for: `bind_now` returns,
    and the interpreter goes on with lazy binding (a failed `prctl` skips the restart)."""
    monkeypatch.setenv("LD_BIND_NOW", "0")
    calls = []

    def fail(*a):
        calls.append(a[0])
        raise OSError(8, "Exec format error")

    monkeypatch.setattr(_linux, "prctl", lambda *a: calls.append("prctl"))
    monkeypatch.setattr(server.os, "execve", fail)
    assert server.bind_now() is None
    assert calls == ["prctl", sys.executable]
    calls.clear()
    monkeypatch.setattr(_linux, "prctl", fail)
    assert server.bind_now() is None
    assert calls == [_linux.PR_SET_PDEATHSIG]  # (no restart without the death signal)


def test_reap_returns_while_a_child_still_runs() -> None:
    """`waitpid(-1, WNOHANG)` reads 0 while a child lives and none has ended: `_reap` returns
    (it runs in a signal handler: it must never wait), reporting nothing."""
    seen = []

    class Ns:
        direct: set[int] = set()

        def reaped(self, pid: int) -> None:
            assert pid != 0, "reaped pid 0"
            seen.append(pid)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        server._reap(Ns(), None)  # type: ignore[arg-type]
        assert pid not in seen and 0 not in seen
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def test_spawn_bookkeeping_of_forks_and_failed_kits(monkeypatch) -> None:
    """`spawn`'s order and bookkeeping: per kit made, its fork's pid (lent its namespace and
    id, direct with pipes) or the fork's error (namespace and id given back first in line, our
    ends closed); then one error per kit that could not be made; every end the sandbox takes
    closed here."""
    import collections

    procfd = os.open("/proc", os.O_RDONLY)
    ns = server.Namespaces(procfd, [100, 4])
    made: list[tuple] = []
    asked = []

    def kit(cfg, ns_, slot):
        asked.append(slot)
        if len(made) == 2:
            raise OSError(11, "no kit")
        a, b = socket.socketpair()
        pipes = [os.pipe(), os.pipe()]
        cg_r, cg_w = os.pipe()
        os.close(cg_r)
        k = (a.detach(), b.detach(), pipes, 900 + len(made), (cg_w,), ns_.take_id(7))
        made.append(k)
        return k

    forks = []

    def fork_all(cfg, ns_, kits):
        forks.append((cfg, ns_, list(kits)))
        return [5001, OSError(1, "no fork")]

    monkeypatch.setattr(server, "_kit", kit)
    monkeypatch.setattr(server, "_fork_all", fork_all)

    def is_open(fd: int) -> bool:
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True

    try:
        cfg = {"uid": 7}
        got = server.spawn(cfg, ns, 4, ["s1", "s2", "s3", "s4"])
        assert asked == ["s1", "s2", "s3"]
        assert forks == [(cfg, ns, made)]
        (ours0, theirs0, pipes0, _, cg0, _), (ours1, theirs1, pipes1, _, cg1, _) = made
        assert len(got) == 4
        assert got[0] == (5001, ours0, [pipes0[0][0], pipes0[1][0]], 100)
        assert isinstance(got[1], OSError) and got[1].args == (1, "no fork")
        assert all(isinstance(e, OSError) and e.args == (11, "no kit") for e in got[2:])
        assert ns.lent == {5001: 900} and ns.id_of == {5001: 100} and ns.direct == {5001}
        assert ns.free == collections.deque([901]) and list(ns.ids) == [101, 102, 103]
        assert is_open(ours0) and all(is_open(r) for r, _ in pipes0)
        assert not any(is_open(fd) for fd in (theirs0, theirs1, ours1, *cg0, *cg1))
        assert not any(is_open(w) for _, w in pipes0)
        assert not any(is_open(fd) for p in pipes1 for fd in p)  # (its fork failed: all closed)
        os.close(ours0)
        for r, _ in pipes0:
            os.close(r)
        # no join: no slot asked for
        made.clear()
        asked.clear()
        monkeypatch.setattr(server, "_fork_all", lambda cfg, ns_, kits: [6001, 6002])
        got = server.spawn(cfg, ns, 2)
        assert asked == [None, None] and [g[0] for g in got] == [6001, 6002]  # type: ignore[index]
        assert ns.direct == {5001, 6001, 6002}
        for g in got:
            os.close(g[1])  # type: ignore[index]
            for r in g[2]:  # type: ignore[index]
                os.close(r)
    finally:
        os.close(ns.home_pid)
        os.close(ns.home_net)
        os.close(procfd)


def _main_in_process(monkeypatch, cfg: dict, fail: str | None = None, fast: bool = True):
    """`main` in this process, each step it calls recorded (in order) instead of run; the
    hello message it sent, its calls, and the exit status it asked for (None: it served)."""
    import fcntl

    from arl_tangram.managers.cpu.sandbox import child, init

    calls: list[tuple] = []

    def rec(name, ret=None):
        def f(*a, **k):
            calls.append((name, *a))
            if name == fail:
                raise OSError(5, f"{name} failed")
            return ret

        return f

    class Fast:
        def configure(self, *a):
            calls.append(("configure", *a))

    class Exited(Exception):
        pass

    def exit_(code):
        raise Exited(code)

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    monkeypatch.setattr(sys, "argv", ["server", str(a.detach())])
    held: list[socket.socket] = []  # (main's control socket, kept to be closed here)

    def sock(fileno):
        held.append(socket.socket(fileno=fileno))
        return held[-1]

    monkeypatch.setattr(server, "socket", types.SimpleNamespace(socket=sock))
    monkeypatch.setattr(server, "_receive_config", lambda ctl: dict(cfg, cg_dirs=cfg["cg_dirs"]))
    monkeypatch.setattr(server, "_forget_start", rec("forget_start"))
    monkeypatch.setattr(_linux, "prctl", rec("prctl"))
    monkeypatch.setattr(_linux, "set_name", rec("set_name"))
    monkeypatch.setattr(server.os, "nice", rec("nice"))
    monkeypatch.setattr(_linux, "unshare", rec("unshare"))
    monkeypatch.setattr(_linux, "mount", rec("mount"))
    monkeypatch.setattr(server, "Namespaces", rec("Namespaces", "NS"))
    monkeypatch.setattr(server, "build_root", rec("build_root"))
    filt = types.SimpleNamespace(denied=("ptrace", "bpf"))
    monkeypatch.setattr(server.seccomp, "build_apart", rec("build_apart", filt))
    monkeypatch.setattr(child, "FILTER", None)
    monkeypatch.setattr(child, "FAST", None)
    monkeypatch.setattr(child, "filter_bpf", lambda: b"BPF")
    monkeypatch.setattr(server, "_compiled", rec("compiled", Fast() if fast else None))
    monkeypatch.setattr(child, "set_base_env", rec("set_base_env"))
    monkeypatch.setattr(server, "_preload", rec("preload"))
    monkeypatch.setattr(init, "rehearse", rec("rehearse"))
    monkeypatch.setattr(
        server, "gc", types.SimpleNamespace(collect=rec("collect"), freeze=rec("freeze"))
    )
    monkeypatch.setattr(_linux, "share_file_ptes", rec("share_file_ptes"))
    monkeypatch.setattr(server, "enter_root", rec("enter_root"))
    monkeypatch.setattr(server, "warm_type_cache", rec("warm_type_cache"))
    monkeypatch.setattr(server, "_serve", rec("serve"))
    monkeypatch.setattr(server.os, "_exit", exit_)
    code = None
    try:
        server.main()
    except Exited as e:
        code = e.args[0]
    assert len(held) == 1 and held[0].fileno() == int(sys.argv[1])
    held[0].close()
    b.settimeout(5)
    hello = json.loads(b.recv(1 << 16))
    assert b.recv(1 << 16) == b""  # (one message)
    fixed = [c for c in calls if c[0] != "Namespaces"]
    ns_calls = []
    for c in calls:
        if c[0] == "Namespaces":
            ns_calls.append((os.readlink(f"/proc/self/fd/{c[1]}"), *c[2:]))
            assert fcntl.fcntl(c[1], fcntl.F_GETFL) & os.O_DIRECTORY
            os.close(c[1])
    b.close()
    return hello, fixed, ns_calls, code, child.FILTER, child.FAST


def test_main_starts_in_order_and_says_what_it_has(monkeypatch) -> None:
    from arl_tangram.managers.cpu.sandbox import child, init

    monkeypatch.setenv("LD_BIND_NOW", "1")
    cfg = {
        "cg_dirs": [7],
        "root": "r",
        "ro_paths": ["/usr"],
        "hidden_paths": ["/etc/x"],
        "ids": [100, 8],
        "ids_busy": [101],
        "ids_held": [102],
        "hostname": "hn",
        "env": {"A": "1"},
        "preload": ["json"],
        "direct": True,
        "share_code_ptes": True,
        "uid": 5,
    }
    hello, calls, ns_calls, code, filt, fast = _main_in_process(monkeypatch, cfg)
    assert "LD_BIND_NOW" not in os.environ
    assert code is None
    assert hello == {
        "ok": True,
        "bind_now": True,
        "filter": ["ptrace", "bpf"],
        "compiled_setup": True,
        "cgroup_join": True,
    }
    assert ns_calls == [("/proc", [100, 8], [101], [102])]
    assert filt.denied == ("ptrace", "bpf") and fast is not None
    full = {**cfg, "hostname_b": b"hn"}
    assert calls == [
        ("forget_start",),
        ("prctl", _linux.PR_SET_PDEATHSIG, 9),
        ("set_name", "tangram-zygote"),
        ("nice", 5),
        ("unshare", _linux.CLONE_NEWNS),
        ("mount", None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE),
        ("build_root", "r", ["/usr"], ["/etc/x"]),
        ("build_apart",),
        ("compiled",),
        (
            "configure",
            _linux.raw_signal.signal,
            _linux.CHILD_DEFAULT_SIGNALS,
            child.code_failed,
            init.WORKDIR_SLASH.encode(),
            b"BPF",
            init.SANDBOX_DIR.encode(),
        ),
        ("set_base_env", {"A": "1"}),
        ("preload", ["json"]),
        ("rehearse", full),
        ("collect",),
        ("freeze",),
        ("share_file_ptes",),
        ("enter_root", "r"),
        ("prctl", _linux.PR_SET_CHILD_SUBREAPER, 1),
        (
            "warm_type_cache",
            (server, init, server.proc, child, _linux, server.wire, server.prepared),
        ),
        ("serve", calls[-1][1], full, "NS"),
    ]
    assert isinstance(calls[-1][1], socket.socket)  # (its control socket: checked there)


def test_main_without_the_options_and_when_it_fails(monkeypatch) -> None:
    monkeypatch.delenv("LD_BIND_NOW", raising=False)
    cfg = {
        "cg_dirs": [],
        "root": "r",
        "ro_paths": [],
        "hostname": "h",
        "preload": [],
        "syscall_filter": False,
        "compiled_setup": False,
        "uid": 5,
    }
    hello, calls, ns_calls, code, filt, fast = _main_in_process(monkeypatch, cfg, fast=False)
    assert code is None and filt is None and fast is None
    assert hello == {"ok": True, "bind_now": False, "compiled_setup": False, "cgroup_join": False}
    assert ns_calls == [("/proc", None, None, None)]
    names = [c[0] for c in calls]
    assert names == [
        "forget_start", "prctl", "set_name", "nice", "unshare", "mount", "build_root",
        "preload", "collect", "freeze", "enter_root", "prctl", "warm_type_cache", "serve",
    ]  # fmt: skip
    assert calls[6] == ("build_root", "r", [], ())
    # compiled set-up asked for, not built: none; the filter's error said
    cfg2 = {**cfg, "syscall_filter": True, "compiled_setup": True}
    hello, calls, _, code, filt, fast = _main_in_process(
        monkeypatch, cfg2, fail="build_apart", fast=False
    )
    assert code is None and filt is None and fast is None
    assert hello == {
        "ok": True,
        "bind_now": False,
        "filter_error": "[Errno 5] build_apart failed",
        "compiled_setup": False,
        "cgroup_join": False,
    }
    assert [c[0] for c in calls][7:9] == ["build_apart", "compiled"]
    # a step that fails: said, and it exits 1 without serving
    hello, calls, _, code, _, _ = _main_in_process(monkeypatch, cfg, fail="build_root")
    assert code == 1 and hello == {"ok": False, "error": "OSError: [Errno 5] build_root failed"}
    assert [c[0] for c in calls][-1] == "build_root"


def test_init_serve_takes_its_ids_from_its_work_dir(tmp_path, monkeypatch) -> None:
    """With ids of its own the init serves as the owner of its work dir (the id `take_id`
    lent it), else as the configured ones; fd 3 and the first request passed on; whatever
    happens, it exits 1 after (a failure printed)."""
    from arl_tangram.managers.cpu.sandbox import child, init

    wd = tmp_path / "wd"
    wd.mkdir()
    os.chown(wd, 1234, 2345)
    monkeypatch.setattr(child, "WORKDIR", str(wd))
    served = []

    class Exited(Exception):
        pass

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(server.os, "_exit", exit_)
    monkeypatch.setattr(init, "serve", lambda fd, cfg, first: served.append((fd, dict(cfg), first)))
    for ids, want in (([100, 8], (1234, 2345)), (None, (5, 6))):
        served.clear()
        with pytest.raises(Exited) as e:
            server._init_serve({"ids": ids, "uid": 5, "gid": 6}, b"first")
        assert e.value.args == (1,)
        assert served == [(3, {"ids": ids, "uid": want[0], "gid": want[1]}, b"first")]
    with pytest.raises(Exited):
        server._init_serve({"uid": 5, "gid": 6})
    assert served[-1] == (3, {"uid": 5, "gid": 6}, None)

    def boom(fd, cfg, first):
        raise RuntimeError("t65 boom")

    monkeypatch.setattr(init, "serve", boom)
    import io

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with pytest.raises(Exited) as e:
        server._init_serve({"uid": 5, "gid": 6})
    assert e.value.args == (1,) and "RuntimeError: t65 boom" in err.getvalue()


def test_relocate_import_paths(monkeypatch) -> None:
    """`sys.path` and every imported package's list `__path__` follow host paths under /tmp
    to where they appear in the root; the finders' cache is emptied."""
    monkeypatch.setattr(sys, "path", ["/tmp/venv/lib", "/usr/lib/python3", "/tmp"])
    pkg = types.ModuleType("t65pkg")
    pkg.__path__ = ["/tmp/src/t65pkg", "/opt/t65pkg"]  # type: ignore[attr-defined]
    other = types.ModuleType("t65other")
    other.__path__ = ("/tmp/src/t65other",)  # type: ignore[attr-defined]  (not a list: left)
    monkeypatch.setitem(sys.modules, "t65pkg", pkg)
    monkeypatch.setitem(sys.modules, "t65other", other)
    sys.path_importer_cache["/t65/finder"] = None  # type: ignore[assignment]
    server.relocate_import_paths()
    assert sys.path == ["/.tangram-ro/tmp/venv/lib", "/usr/lib/python3", "/tmp"]
    assert pkg.__path__ == ["/.tangram-ro/tmp/src/t65pkg", "/opt/t65pkg"]  # type: ignore[attr-defined]
    assert other.__path__ == ("/tmp/src/t65other",)  # type: ignore[attr-defined]
    assert sys.path_importer_cache == {}


def test_serve_exits_0_when_the_manager_is_gone(monkeypatch) -> None:
    """A reply that cannot be sent (the manager closed its end): the fork server exits 0."""

    class Exited(Exception):
        pass

    def exit_(code: int):
        raise Exited(code)

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.send(b'{"n":1}')
    b.close()
    monkeypatch.setattr(server.os, "_exit", exit_)
    monkeypatch.setattr(server, "_on_sigchld", None)
    asked = []
    monkeypatch.setattr(
        server, "spawn", lambda cfg, ns, n, join: asked.append(n) or [OSError(11, "busy")]
    )
    import signal

    old = signal.getsignal(signal.SIGCHLD)
    try:
        with pytest.raises(Exited) as e:
            server._serve(a, {"cg_dirs": []}, _FakeNs())  # type: ignore[arg-type]
        assert e.value.args == (0,) and asked == [1]  # (the request read, its reply failed)
        a.close()
        with pytest.raises(Exited) as e:  # a control socket that cannot be read: exit 0 too
            server._serve(a, {"cg_dirs": []}, _FakeNs())  # type: ignore[arg-type]
        assert e.value.args == (0,) and asked == [1]
    finally:
        signal.signal(signal.SIGCHLD, old)
        a.close()


def test_init_moves_itself_first_and_exits_1_when_its_set_up_fails() -> None:
    """`_init` (a sandbox init's set-up, the non-compiled path), in a fork: it writes 0 to each
    slot's `tasks` file first (it moves itself), and a step that fails (here the network
    namespace: /dev/null) is printed and ends it with status 1, before anything is served."""
    cg_r, cg_w = os.pipe()
    err_r, err_w = os.pipe()
    sa, sb = socket.socketpair()
    null = os.open("/dev/null", os.O_RDONLY)  # (not a namespace: setns refuses it)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            sys.stderr = open(err_w, "w", buffering=1)  # noqa: SIM115  (line by line)
            server._init({"workdir_mb": 1, "hostname": "h"}, sb.fileno(), null, [], (cg_w,), 5, 6)
        finally:
            os._exit(99)
    os.close(cg_w)
    os.close(err_w)
    os.close(null)
    sb.close()
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 1
        assert os.read(cg_r, 100) == b"0"
        err = b""
        while chunk := os.read(err_r, 65536):
            err += chunk
        assert err.startswith(b"Traceback") and b"OSError: [Errno 22]" in err
    finally:
        os.close(cg_r)
        os.close(err_r)
        sa.close()


def _init_fds(direct: bool) -> tuple[list[int], tuple, bytes, bytes]:
    """`_init` in a fork up to `init.become` (recorded, then the child exits): the fds it
    left open, become's arguments, and (direct) what fds 4 and 5 lead to; its mount, IPC and
    UTS namespaces are new (its PID namespace is the fork's)."""
    from arl_tangram.managers.cpu.sandbox import init

    sa, sb = socket.socketpair()
    pipes = [os.pipe(), os.pipe()] if direct else []
    net = os.open("/proc/self/ns/net", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            null = os.open("/dev/null", os.O_RDONLY)
            for fd in (4, 5, 6):  # (taken, as in the fork server: closed unless they are ours)
                if fd not in (sb.fileno(), net, *[x for p in pipes for x in p]):
                    os.dup2(null, fd)
            if direct and 4 not in (sb.fileno(), net, *[x for p in pipes for x in p]):
                os.close(4)  # (free: the copies made before the moves must not land there)

            def become(*a):
                fds = []
                for fd in range(4096):  # (fstat: no fd of its own, unlike listdir)
                    try:
                        os.fstat(fd)
                    except OSError:
                        continue
                    fds.append(fd)
                if direct:
                    os.write(4, b"out")
                    os.write(5, b"err")
                nss = [os.readlink(f"/proc/self/ns/{k}") for k in ("mnt", "ipc", "uts", "pid")]
                os.write(3, json.dumps([fds, a, nss]).encode())
                os._exit(0)

            init.become = become
            server._init({"workdir_mb": 3, "hostname": "hx"}, sb.fileno(), net, pipes, (), 5, 6)
        finally:
            os._exit(99)
    sb.close()
    os.close(net)
    for _, w in pipes:
        os.close(w)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        sa.settimeout(10)
        fds, args, nss = json.loads(sa.recv(1 << 16))
        ours = [os.readlink(f"/proc/self/ns/{k}") for k in ("mnt", "ipc", "uts", "pid")]
        assert [a == b for a, b in zip(nss, ours, strict=True)] == [False, False, False, True]
        outs = tuple(os.read(r, 100) for r, _ in pipes)
        return fds, tuple(args), *(outs or (b"", b""))  # type: ignore[return-value]
    finally:
        sa.close()
        for r, _ in pipes:
            os.close(r)


@pytest.mark.needs_root
def test_init_keeps_only_its_own_fds() -> None:
    """After `_init`'s set-up only fds 0-3 stay open (3: its control socket), and with direct
    pipes 4 (stdout) and 5 (stderr): fork-server fds at 4 and 5 are closed in a non-direct one."""
    fds, args, out, err = _init_fds(direct=False)
    assert fds == [0, 1, 2, 3]
    assert args == (3, 5, 6, "hx") and (out, err) == (b"", b"")
    fds, args, out, err = _init_fds(direct=True)
    assert fds == [0, 1, 2, 3, 4, 5]
    assert (out, err) == (b"out", b"err")


def test_fork_all_compiled_gets_each_sandbox_set_up(monkeypatch) -> None:
    """The compiled loop (`_fastpath.fork_all`) is given, per kit, exactly what `_init` would
    use, and ``take`` only for a direct sandbox that does not warm; in a child it returns its
    index (served without a first request) or its first request (served with it)."""
    from arl_tangram.managers.cpu.sandbox import child

    got_args = []
    answer: list = [[7001, 7002]]

    class Fast:
        def fork_all(self, *a):
            got_args.append(a)
            return answer[0]

    class Served(Exception):
        pass

    def serve(cfg, first=None):
        raise Served(cfg, first)

    monkeypatch.setattr(child, "FAST", Fast())
    monkeypatch.setattr(server, "_init_serve", serve)
    ns = types.SimpleNamespace(home_pid=41, per_sandbox=True)
    kits = [
        (10, 11, [(12, 13), (14, 15)], 16, (17, 18), 100),
        (20, 21, [], 26, (), 101),
    ]
    cfg = {"workdir_mb": 64, "gid": 6, "hostname_b": b"hb", "direct": True}
    assert server._fork_all(cfg, ns, kits) == [7001, 7002]  # type: ignore[arg-type]
    setups = [
        ((17, 18), 11, 16, 13, 15, 64, 100, 100, b"hb", b"/sandbox", b"/workdir"),
        ((), 21, 26, -1, -1, 64, 101, 101, b"hb", b"/sandbox", b"/workdir"),
    ]
    assert got_args == [(2, 41, setups, True)]
    ns.per_sandbox = False
    got_args.clear()
    for extra, take in (({"warm_direct": True}, False), ({"direct": False}, False)):
        server._fork_all({**cfg, **extra}, ns, kits[1:])  # type: ignore[arg-type]
        assert got_args.pop() == (
            1, 41, [((), 21, 26, -1, -1, 64, 101, 6, b"hb", b"/sandbox", b"/workdir")], take
        )  # fmt: skip
    for answer[0], first in ((1, None), (b"req", b"req")):
        with pytest.raises(Served) as e:
            server._fork_all(cfg, ns, kits[1:])  # type: ignore[arg-type]
        assert e.value.args == (cfg, first)


@pytest.mark.needs_root
def test_fork_all_in_python_forks_each_init_in_a_new_pid_namespace(monkeypatch) -> None:
    """Without the compiled loop: one fork per kit, each PID 1 of a new PID namespace, running
    `_init` with the kit's parts and its gid (its uid with ids of its own); this process's
    next children are in its own PID namespace again."""
    from arl_tangram.managers.cpu.sandbox import child

    monkeypatch.setattr(child, "FAST", None)

    def init_(cfg, sock, net, pipes, cg, uid, gid):
        os.write(sock, json.dumps([os.getpid(), net, pipes, list(cg), uid, gid]).encode())
        os._exit(0)

    monkeypatch.setattr(server, "_init", init_)
    procfd = os.open("/proc", os.O_RDONLY)
    home = os.open("/proc/self/ns/pid", os.O_RDONLY)
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for per, want_gid in ((True, 100), (False, 6)):
            ns = types.SimpleNamespace(home_pid=home, per_sandbox=per)
            kits = [(0, pairs[0][1].fileno(), [], 55, (), 100)]
            pids = server._fork_all({"gid": 6}, ns, kits)  # type: ignore[arg-type]
            assert len(pids) == 1 and isinstance(pids[0], int)
            _, status = os.waitpid(pids[0], 0)
            assert os.waitstatus_to_exitcode(status) == 0
            pairs[0][0].settimeout(10)
            assert json.loads(pairs[0][0].recv(1000)) == [1, 55, [], [], 100, want_gid]
            assert os.readlink("/proc/self/ns/pid_for_children") == os.readlink("/proc/self/ns/pid")
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        os.close(home)
        os.close(procfd)


def test_reap_goes_on_when_the_manager_is_gone() -> None:
    """A direct sandbox's exit report that cannot be sent (the manager closed its end) is
    dropped: `_reap` (a signal handler) still reaps and returns, raising nothing."""
    reaped = []

    class Ns:
        direct: set[int] = set()

        def reaped(self, pid: int) -> None:
            reaped.append(pid)

    pid = os.fork()
    if pid == 0:
        os._exit(3)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    ns = Ns()
    ns.direct = {pid}
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.close()
    try:
        server._reap(ns, a)  # type: ignore[arg-type]
        assert pid in reaped and ns.direct == set()
    finally:
        a.close()


@pytest.mark.needs_root
def test_build_root_with_a_mount_point_among_the_read_only_paths(tmp_path) -> None:
    """A read-only path that is one of the root's own mount points (/proc here) is bound
    there, and the root is still made (its empty mount points: made where missing)."""
    root = str(tmp_path / "root")
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            _linux.unshare(_linux.CLONE_NEWNS)
            _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
            server.build_root(root, ["/proc"])
            code = 0 if os.path.ismount(root + "/proc") and os.path.isdir(root + "/tmp") else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_fork_all_in_python_gives_a_failed_fork_its_error(monkeypatch) -> None:
    """Without the compiled loop, a kit whose PID namespace or fork fails gets the error as
    its result (and the loop goes on to the next kit)."""
    from arl_tangram.managers.cpu.sandbox import child

    monkeypatch.setattr(child, "FAST", None)
    err = OSError(1, "no new pid namespace")

    def unshare(flags):
        raise err

    monkeypatch.setattr(_linux, "unshare", unshare)
    ns = types.SimpleNamespace(home_pid=-1, per_sandbox=False)
    kits = [(0, 1, [], 2, (), 3), (0, 1, [], 2, (), 4)]
    assert server._fork_all({"gid": 6}, ns, kits) == [err, err]  # type: ignore[arg-type]
