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
                ["/usr", "/bin", "/etc", "/etc/passwd", str(ro_tmp), "/nonexistent-t53"],
                hidden=[hide_dir, hide_file, "/nonexistent-h53"],
            )
            m = _mounts()
            facts = {
                "mounts": {
                    k[len(root) :] or "/": [sorted(v[0]), v[1], v[3]]
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


def test_preload_ignores_what_fails() -> None:
    server._preload(["json", "no_such_module_t53"])
    assert "no_such_module_t53" not in sys.modules


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
