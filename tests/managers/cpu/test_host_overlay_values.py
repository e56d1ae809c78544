"""Images and frozen sessions, manager side (issue 43, mutation testing of host/overlay.py):
exact values of open_tree's call, the freezer hierarchy's discovery, a freezer's files (plain
files stand in for cgroup control files), the stale sessions' thaw, the freezer tree, the
switch's figures, a slot's pids, what an init reports, `enter_image`'s message and fds, and the
request adjusted to an image. No sandbox starts; no cgroup is touched."""

from __future__ import annotations

import asyncio
import ctypes
import io
import os
import socket
import types
from typing import Any

import pytest

from arl_tangram.managers.cpu.host import overlay as O

# a mutant that hangs fails its test here, not at mutmut's much longer timeout
pytestmark = pytest.mark.timeout(5)


def _ctype_value(v: Any) -> Any:
    return v.value if isinstance(v, ctypes._SimpleCData) else v


# --- open_tree_clone -------------------------------------------------------------------------


def test_open_tree_clone_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def syscall(nr: int, *args: Any) -> int:
        calls.append((nr, [_ctype_value(a) for a in args]))
        return 42

    monkeypatch.setattr(O._linux, "syscall", syscall)
    assert O.open_tree_clone("/some/dir") == 42
    assert calls == [(428, [-100, b"/some/dir", 1 | os.O_CLOEXEC])]
    assert isinstance(calls[0][1][0], int)

    def fail(nr: int, *args: Any) -> int:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(O._linux, "syscall", fail)
    with pytest.raises(OSError) as ei:
        O.open_tree_clone("/x")
    assert ei.value.errno == 1 and ei.value.strerror == "open_tree(/x): Operation not permitted"
    assert ei.value.__suppress_context__


def test_constants() -> None:
    assert O._FROZEN_WAIT_S == 0.5 and O._OPEN_TREE_CLONE == 1


# --- the freezer hierarchy -------------------------------------------------------------------


def _fake_open(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    real = open

    def fake(path: Any, *a: Any, **kw: Any) -> Any:
        if path in files:
            return io.StringIO(files[path])
        return real(path, *a, **kw)

    monkeypatch.setattr(O, "open", fake, raising=False)


def test_freezer_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_open(
        monkeypatch,
        {
            "/proc/self/mounts": (
                "proc /proc proc rw 0 0\n"
                "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu,cpuacct 0 0\n"
                "short line cgroup\n"
                "cgroup /sys/fs/cgroup/xfreezer cgroup2 rw,freezer 0 0\n"
                "cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,freezer 0 0\n"
                "cgroup /sys/fs/cgroup/other cgroup rw,freezer 0 0\n"
            )
        },
    )
    assert O._freezer_mount() == "/sys/fs/cgroup/freezer"
    _fake_open(
        monkeypatch,
        {"/proc/self/mounts": "cgroup /a cgroup rw,freezerx 0 0\ncgroup /b cgroup rw 0 0\n"},
    )
    assert O._freezer_mount() is None
    _fake_open(monkeypatch, {"/proc/self/mounts": "cgroup /c cgroup freezer\n"})
    assert O._freezer_mount() == "/c"  # four fields are enough
    _fake_open(monkeypatch, {"/proc/self/mounts": "cgroup /c cgroup\n"})
    assert O._freezer_mount() is None


def test_own_freezer_path(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_open(
        monkeypatch,
        {
            "/proc/self/cgroup": (
                "12:cpu,cpuacct:/a\n5:xfreezer:/b\n7:blkio,freezer:/user.slice/x:y\n3:freezer:/z\n"
            )
        },
    )
    assert O._own_freezer_path() == "/user.slice/x:y"
    _fake_open(monkeypatch, {"/proc/self/cgroup": "0::/only/v2\n"})
    assert O._own_freezer_path() == "/"


# --- a freezer -------------------------------------------------------------------------------


def _freezer_dir(tmp_path: Any, version: str, state: str = "") -> str:
    d = tmp_path / f"fz-{version}"
    d.mkdir()
    if version == "v1":
        (d / "freezer.state").write_text(state or "THAWED\n")
    else:
        (d / "cgroup.freeze").write_text("0")
        (d / "cgroup.events").write_text(state or "populated 1\nfrozen 0\n")
    (d / "cgroup.procs").write_text("")
    return str(d)


def test_freezer_v1(tmp_path: Any) -> None:
    d = _freezer_dir(tmp_path, "v1")
    fz = O.Freezer(d, "v1", own=True)
    assert (fz.dir, fz.version, fz.own, fz.frozen) == (d, "v1", True, False)
    assert fz.freeze() is True and fz.frozen is True
    with open(f"{d}/freezer.state", "rb") as f:
        assert f.read() == b"FROZEN\n"  # pwrite at 0: the rest of the stand-in file stays
    fz.thaw()
    assert fz.frozen is False
    with open(f"{d}/freezer.state", "rb") as f:
        assert f.read() == b"THAWED\n"
    fz.add([5, 6])
    with open(f"{d}/cgroup.procs") as f:
        assert f.read() == "6"  # one write per pid (the last stays in a plain file)
    fz.close()
    fz.close()  # twice: swallowed


def test_freezer_v1_state_must_be_exact(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _freezer_dir(tmp_path, "v1")
    fz = O.Freezer(d, "v1", own=True)
    with open(f"{d}/freezer.state", "w") as f:
        f.write("  FROZEN \n")
    assert fz._state_frozen() is True
    with open(f"{d}/freezer.state", "w") as f:
        f.write("FREEZING")
    assert fz._state_frozen() is False
    fz.close()


def test_freezer_v2_waits_then_gives_up(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _freezer_dir(tmp_path, "v2")
    fz = O.Freezer(d, "v2", own=False)
    t = [100.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        t[0] += 0.125

    monkeypatch.setattr(O, "time", types.SimpleNamespace(monotonic=lambda: t[0], sleep=sleep))
    assert fz.freeze() is False and fz.frozen is True
    with open(f"{d}/cgroup.freeze", "rb") as f:
        assert f.read() == b"1"
    assert sleeps == [0.0002] * 4  # until 100.5
    fz.add([1])  # not its own cgroup: nothing written
    with open(f"{d}/cgroup.procs") as f:
        assert f.read() == ""
    fz.thaw()
    with open(f"{d}/cgroup.freeze", "rb") as f:
        assert f.read() == b"0"
    fz.close()


def test_freezer_v2_frozen_during_the_wait(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _freezer_dir(tmp_path, "v2")
    fz = O.Freezer(d, "v2", own=False)
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += 0.1
        if t[0] > 0.25:
            with open(f"{d}/cgroup.events", "w") as f:
                f.write("populated 1\nfrozen 1\n")

    monkeypatch.setattr(O, "time", types.SimpleNamespace(monotonic=lambda: t[0], sleep=sleep))
    assert fz.freeze() is True
    assert abs(t[0] - 0.3) < 1e-9
    fz.close()


def test_freezer_v2_reads_events(tmp_path: Any) -> None:
    d = _freezer_dir(tmp_path, "v2", "populated 1\nfrozen 1\n")
    fz = O.Freezer(d, "v2", own=False)
    assert fz._state_frozen() is True and fz.freeze() is True
    fz.close()


# --- stale sessions --------------------------------------------------------------------------


def test_thaw_stale(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[Any] = []
    import signal

    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    dead = 999_999_999
    assert not os.path.exists(f"/proc/{dead}")
    stale = tmp_path / f"tangram-{dead}-sessions"
    stale.mkdir()
    f1 = stale / "f1"
    f1.mkdir()
    (f1 / "freezer.state").write_text("FROZEN")
    (f1 / "cgroup.procs").write_text("11 12\n")
    (stale / "a-file").write_text("")
    stale2 = tmp_path / f"tangram-{dead}.3-sessions"
    stale2.mkdir()
    alive = tmp_path / f"tangram-{os.getpid()}-sessions"
    alive.mkdir()
    (alive / "f1").mkdir()
    other = tmp_path / "other-sessions"
    other.mkdir()
    odd = tmp_path / "tangram-abc-sessions"
    odd.mkdir()
    nots = tmp_path / f"tangram-{dead}"
    nots.mkdir()
    rmdirs: list[str] = []
    real_rmdir = os.rmdir

    def rmdir(p: str) -> None:
        rmdirs.append(p)
        if p.endswith("/f1"):  # a plain directory holds files: the stand-in's rmdir
            for n in os.listdir(p):
                os.unlink(os.path.join(p, n))
        real_rmdir(p)

    monkeypatch.setattr(os, "rmdir", rmdir)
    O._thaw_stale(str(tmp_path))
    assert (f1 / "freezer.state").exists() is False
    assert sorted(killed) == [(11, signal.SIGKILL), (12, signal.SIGKILL)]
    assert not stale.exists() or (stale / "a-file").exists()
    assert not stale2.exists()
    assert alive.exists() and other.exists() and odd.exists() and nots.exists()
    assert str(f1) in rmdirs


def test_thaw_stale_writes_thawed_and_retries(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = 999_999_998
    stale = tmp_path / f"tangram-{dead}-sessions"
    f1 = stale / "f1"
    f1.mkdir(parents=True)
    (f1 / "freezer.state").write_text("FROZEN")
    (f1 / "cgroup.procs").write_text("5\n")
    killed: list[Any] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    seen: list[str] = []
    sleeps: list[float] = []
    tries = [0]

    def rmdir(p: str) -> None:
        if p == str(f1):
            seen.append((f1 / "freezer.state").read_text())
            tries[0] += 1
            raise OSError("busy")
        raise OSError("not empty")

    monkeypatch.setattr(os, "rmdir", rmdir)
    monkeypatch.setattr(O, "time", types.SimpleNamespace(sleep=sleeps.append))
    O._thaw_stale(str(tmp_path))
    assert seen[0] == "THAWED" and tries[0] == 20 and sleeps == [0.05] * 20
    assert killed == [5]
    O._thaw_stale(str(tmp_path / "missing"))  # swallowed


# --- the freezer tree ------------------------------------------------------------------------


def test_freezer_tree_v2_and_none(tmp_path: Any) -> None:
    t = O.FreezerTree(types.SimpleNamespace(version="v2"))  # type: ignore[arg-type]
    assert (t.version, t.base, t.problem, t._n, t.available) == ("v2", None, "", 0, True)
    assert t.new(None) is None
    d = _freezer_dir(tmp_path, "v2")
    fz = t.new(types.SimpleNamespace(dirs={"cpu": d}))  # type: ignore[arg-type]
    assert isinstance(fz, O.Freezer) and (fz.dir, fz.version, fz.own) == (d, "v2", False)
    fz.close()
    t.close()  # no base: nothing
    n = O.FreezerTree(None)
    assert (n.version, n.problem, n.available) == (None, "no cgroups", False)
    assert n.new(None) is None
    n2 = O.FreezerTree(types.SimpleNamespace(version=None))  # type: ignore[arg-type]
    assert n2.problem == "no cgroups"


def test_freezer_tree_v1(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mnt = tmp_path / "freezer"
    (mnt / "own").mkdir(parents=True)
    stale: list[str] = []
    monkeypatch.setattr(O, "_freezer_mount", lambda: str(mnt))
    monkeypatch.setattr(O, "_own_freezer_path", lambda: "/own")
    monkeypatch.setattr(O, "_thaw_stale", stale.append)
    t = O.FreezerTree(types.SimpleNamespace(version="v1", tag="tangram-77"))  # type: ignore[arg-type]
    assert stale == [f"{mnt}/own"]
    assert t.base == f"{mnt}/own/tangram-77-sessions" and os.path.isdir(t.base)
    assert t.version == "v1" and t.problem == "" and t.available
    made = []
    for i in (1, 2):
        d = f"{t.base}/f{i}"
        os.makedirs(d)
        with open(f"{d}/freezer.state", "w") as f:
            f.write("THAWED")
        fz = t.new(None)
        assert isinstance(fz, O.Freezer) and (fz.dir, fz.version, fz.own) == (d, "v1", True)
        made.append(fz)
    assert t._n == 2
    for fz in made:
        fz.close()


def test_freezer_tree_v1_problems(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(O, "_freezer_mount", lambda: None)
    t = O.FreezerTree(types.SimpleNamespace(version="v1", tag="t"))  # type: ignore[arg-type]
    assert (t.version, t.problem, t.base, t.available) == (
        None,
        "no cgroup v1 freezer hierarchy mounted",
        None,
        False,
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(O, "_freezer_mount", lambda: str(blocker))
    monkeypatch.setattr(O, "_own_freezer_path", lambda: "")
    monkeypatch.setattr(O, "_thaw_stale", lambda p: None)
    t = O.FreezerTree(types.SimpleNamespace(version="v1", tag="t"))  # type: ignore[arg-type]
    assert t.version is None and t.problem.startswith("cannot create freezer cgroups: ")
    assert "Not a directory" in t.problem
    assert t.new(None) is None


def test_freezer_tree_drop_and_rmdir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.new_event_loop()
    later: list[Any] = []

    class _L:
        def call_later(self, d: float, cb: Any, *a: Any) -> None:
            later.append((d, cb, a))

    monkeypatch.setattr(O.asyncio, "get_event_loop", lambda: _L())
    t = O.FreezerTree(types.SimpleNamespace(version="v2"))  # type: ignore[arg-type]
    d = _freezer_dir(tmp_path, "v1", "FROZEN")
    fz = O.Freezer(d, "v1", own=True)
    fz.frozen = True
    t.drop(fz)
    with open(f"{d}/freezer.state", "rb") as f:
        assert f.read() == b"THAWED"
    assert fz.frozen is False
    assert later == [(0.05, t._rmdir, (d, 200))]
    with pytest.raises(OSError):
        os.fstat(fz._w)
    later.clear()
    d2 = _freezer_dir(tmp_path, "v2")
    fz2 = O.Freezer(d2, "v2", own=False)
    fz2.close()
    t.drop(fz2)  # thaw fails (closed): swallowed; not its own: no rmdir
    assert later == []
    # _rmdir: gone, removed, busy (tried again), out of tries
    empty = tmp_path / "empty"
    empty.mkdir()
    t._rmdir(str(empty), 3)
    assert not empty.exists() and later == []
    t._rmdir(str(tmp_path / "never"), 3)
    assert later == []
    t._rmdir(d2, 3)  # not empty
    assert later == [(0.1, t._rmdir, (d2, 2))]
    later.clear()
    t._rmdir(d2, 0)
    assert later == []
    loop.close()


def test_freezer_tree_close(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t = O.FreezerTree(types.SimpleNamespace(version="v2"))  # type: ignore[arg-type]
    base = tmp_path / "base"
    (base / "f1").mkdir(parents=True)
    (base / "a-file").write_text("")
    t.base = str(base)
    writes: list[Any] = []
    real_open = open

    def fake_open(p: str, mode: str = "r", *a: Any) -> Any:
        if p.endswith("freezer.state"):
            writes.append((p, mode))
            return io.StringIO()
        return real_open(p, mode, *a)

    monkeypatch.setattr(O, "open", fake_open, raising=False)
    sleeps: list[float] = []
    monkeypatch.setattr(O, "time", types.SimpleNamespace(sleep=sleeps.append))
    t.close()  # a-file keeps base busy: 20 tries
    assert writes[0] == (f"{base}/f1/freezer.state", "w")
    assert not (base / "f1").exists() and base.exists()
    assert sleeps == [0.05] * 20
    (base / "a-file").unlink()
    sleeps.clear()
    t.close()
    assert not base.exists() and sleeps == []


# --- switch, pids, inside --------------------------------------------------------------------


def test_session_switch() -> None:
    sw = O.SessionSwitch()
    assert (sw.thaw_s, sw.requota_s, sw.freeze_s, sw.frozen, sw.total_s) == (
        0.0,
        0.0,
        0.0,
        True,
        0.0,
    )
    sw = O.SessionSwitch(0.00123456, 0.0021000123, 0.0031000057, False)
    assert sw.total_s == pytest.approx(0.006434578)
    assert sw.to_dict() == {
        "thaw_ms": 1.2346,
        "requota_ms": 2.1,
        "freeze_ms": 3.1,
        "total_ms": 6.4346,
        "frozen": False,
    }


def test_slot_pids(tmp_path: Any) -> None:
    assert O.slot_pids(None) == []
    p, c, m = tmp_path / "p", tmp_path / "c", tmp_path / "m"
    for d, text in ((p, "1 2\n"), (c, "3\n"), (m, "4 5")):
        d.mkdir()
        (d / "cgroup.procs").write_text(text)
    S = types.SimpleNamespace
    assert O.slot_pids(S(dirs={"cpu": str(c), "pids": str(p)})) == [1, 2]  # type: ignore[arg-type]
    assert O.slot_pids(S(dirs={"memory": str(m), "cpu": str(c)})) == [3]  # type: ignore[arg-type]
    assert O.slot_pids(S(dirs={"memory": str(m)})) == [4, 5]  # type: ignore[arg-type]
    assert O.slot_pids(S(dirs={"memory": str(m), "pids": ""})) == [4, 5]  # type: ignore[arg-type]
    assert O.slot_pids(S(dirs={"pids": str(tmp_path / "none")})) == []  # type: ignore[arg-type]


def test_inside_of() -> None:
    assert O.Inside() == O.Inside(None, None, None, None, "/workdir")
    assert O.Inside.of({}) == O.Inside()
    assert O.Inside.of({"python": "/p", "uid": 5, "gid": 6, "home": "/h", "cwd": "/w"}) == O.Inside(
        python="/p", cwd="/w"
    )
    assert O.Inside.of({"userns": 1, "uid": "5", "gid": "6", "home": "/h", "cwd": ""}) == O.Inside(
        uid=5, gid=6, home="/h", cwd="/workdir"
    )
    got = O.Inside.of({"userns": True, "uid": 0, "gid": 0, "home": ""})
    assert got == O.Inside(uid=0, gid=0, home=None)


# --- enter_image -----------------------------------------------------------------------------


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock


class _Sb:
    def __init__(self, sock: socket.socket, reply: Any, instant: bool = False) -> None:
        self.conn = _Conn(sock)
        self.reply = reply
        self.instant = instant
        self.requests: list[Any] = []

    async def request(self, msg: Any, timeout: Any = None) -> Any:
        self.requests.append((msg, timeout))
        if not self.instant:
            await asyncio.sleep(0.01)
        return self.reply


def _store(tmp_path: Any) -> Any:
    return types.SimpleNamespace(
        layers_dir=str(tmp_path), layer_paths=lambda img: ["/x/layers/aa", "/x/layers/bb"]
    )


def _img() -> Any:
    return types.SimpleNamespace(
        name="py",
        config={
            "User": "u",
            "WorkingDir": "/app",
            "Entrypoint": ["e"],
            "Cmd": ["c"],
            "Env": ["A=1"],
            "Labels": {"x": "y"},
        },
    )


async def test_enter_image_message_and_fds(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []

    def clone(path: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        opened.append(fd)
        return fd

    monkeypatch.setattr(O, "open_tree_clone", clone)
    a, b = socket.socketpair()
    sb = _Sb(a, {"ok": True})
    got = await O.enter_image(sb, _store(tmp_path), _img(), 100.7, 1000, 1001)  # type: ignore[arg-type]
    assert got == {"ok": True}
    msg, timeout = sb.requests[0]
    assert timeout == 30.0
    assert msg == {
        "op": "image",
        "layers": ["aa", "bb"],
        "layer_mb": 100,
        "uid": 1000,
        "gid": 1001,
        "layer": "memory",
        "config": {
            "User": "u",
            "WorkingDir": "/app",
            "Entrypoint": ["e"],
            "Cmd": ["c"],
            "Env": ["A=1"],
        },
        "userns": None,
    }
    with pytest.raises(OSError):
        os.fstat(opened[0])  # ours closed after
    data, fds, _, _ = socket.recv_fds(b, 16, 8)
    assert data == b"\0" and len(fds) == 1
    assert os.readlink(f"/proc/self/fd/{fds[0]}") == str(tmp_path)
    for f in fds:
        os.close(f)
    a.close()
    b.close()


async def test_enter_image_with_layer_and_userns(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(O, "open_tree_clone", lambda p: os.open(p, os.O_RDONLY))
    lay = tmp_path / "layer"
    lay.mkdir()
    nsf = tmp_path / "ns"
    nsf.mkdir()
    layer = types.SimpleNamespace(fd=os.open(str(lay), os.O_RDONLY))
    mapped: list[int] = []
    ns = types.SimpleNamespace(
        fd=os.open(str(nsf), os.O_RDONLY), base=100000, count=65536, idmap=mapped.append
    )
    a, b = socket.socketpair()
    sb = _Sb(a, {"ok": True})
    await O.enter_image(sb, _store(tmp_path), _img(), 5, 1, 2, layer, 7.5, ns)  # type: ignore[arg-type]
    msg, timeout = sb.requests[0]
    assert timeout == 7.5 and msg["layer"] == "disk"
    assert msg["userns"] == {"base": 100000, "count": 65536}
    assert len(mapped) == 1
    _, fds, _, _ = socket.recv_fds(b, 16, 8)
    assert [os.readlink(f"/proc/self/fd/{f}") for f in fds] == [str(tmp_path), str(lay), str(nsf)]
    for f in fds:
        os.close(f)
    # with an owner: the init makes its own namespace; the node's is not lent, nothing idmapped
    sb = _Sb(a, {"ok": True})
    await O.enter_image(sb, _store(tmp_path), _img(), 5, 1, 2, layer, userns=ns, owner=0)  # type: ignore[arg-type]
    assert sb.requests[0][0]["userns"] == {"base": 100000, "count": 65536, "owner": 0}
    assert len(mapped) == 1
    _, fds, _, _ = socket.recv_fds(b, 16, 8)
    assert [os.readlink(f"/proc/self/fd/{f}") for f in fds] == [str(tmp_path), str(lay)]
    for f in fds:
        os.close(f)
    sb = _Sb(a, {"ok": True})
    await O.enter_image(sb, _store(tmp_path), _img(), 5, 1, 2, None, userns=ns, owner=-1)  # type: ignore[arg-type]
    assert "owner" not in sb.requests[0][0]["userns"] and len(mapped) == 2
    _, fds, _, _ = socket.recv_fds(b, 16, 8)
    assert len(fds) == 2
    for f in (*fds, layer.fd, ns.fd):
        os.close(f)
    a.close()
    b.close()


async def test_enter_image_early_reply_sends_no_fds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(O, "open_tree_clone", lambda p: os.open(p, os.O_RDONLY))
    a, b = socket.socketpair()
    sb = _Sb(a, {"error": "no such image"}, instant=True)
    img = types.SimpleNamespace(name="x", config={})
    got = await O.enter_image(sb, _store(tmp_path), img, 1, 1, 1)  # type: ignore[arg-type]
    assert got == {"error": "no such image"} and sb.requests[0][0]["config"] == {}
    b.setblocking(False)
    with pytest.raises(BlockingIOError):
        b.recv(16)
    a.close()
    b.close()


async def test_enter_image_retries_a_full_socket(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(O, "open_tree_clone", lambda p: os.open(p, os.O_RDONLY))
    sends: list[Any] = []
    real = socket.send_fds

    def send_fds(sock: Any, bufs: Any, fds: Any) -> int:
        sends.append(len(fds))
        if len(sends) < 3:
            raise BlockingIOError
        return real(sock, bufs, fds)

    monkeypatch.setattr(O.socket, "send_fds", send_fds)
    sleeps: list[float] = []
    real_sleep, me = asyncio.sleep, asyncio.current_task()

    async def sleep(s: float) -> None:
        if asyncio.current_task() is not me:  # (the module's asyncio is shared: others sleep)
            await real_sleep(s)
            return
        sleeps.append(s)
        await real_sleep(0)

    monkeypatch.setattr(O.asyncio, "sleep", sleep)
    a, b = socket.socketpair()
    sb = _Sb(a, {"ok": True})
    sb.instant = False

    async def request(msg: Any, timeout: Any = None) -> Any:
        for _ in range(10):
            await real_sleep(0)
        return {"ok": True}

    sb.request = request  # type: ignore[method-assign]
    await O.enter_image(sb, _store(tmp_path), _img(), 1, 1, 1)  # type: ignore[arg-type]
    assert sends == [1, 1, 1] and sleeps == [0, 0.001, 0.001]
    _, fds, _, _ = socket.recv_fds(b, 16, 8)
    for f in fds:
        os.close(f)
    a.close()
    b.close()


# --- the request in an image -----------------------------------------------------------------


def test_image_env() -> None:
    img = types.SimpleNamespace(
        config={"Env": ["PATH=/img/bin", "A=1=2", "NOEQ", "TANGRAM_X=y", "HOME=/root", 5]}
    )
    out = O.image_env({"HOME": "/workdir", "B": "b"}, img, "/home/u")  # type: ignore[arg-type]
    assert out == {"HOME": "/root", "B": "b", "PATH": "/img/bin", "A": "1=2"}
    out = O.image_env({"HOME": "/workdir"}, types.SimpleNamespace(config={}), "/home/u")  # type: ignore[arg-type]
    assert out == {
        "HOME": "/home/u",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    env = {"HOME": "/workdir"}
    out = O.image_env(env, types.SimpleNamespace(config={"Env": None}))  # type: ignore[arg-type]
    assert out["HOME"] == "/workdir" and env == {"HOME": "/workdir"}
    out = O.image_env({}, types.SimpleNamespace(config={"Env": ["E="]}), "")  # type: ignore[arg-type]
    assert out == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "E": ""}


def test_in_workdir() -> None:
    assert O._in_workdir("./main") == "/workdir/main"
    assert O._in_workdir("{file}") == "/workdir/{file}"
    assert O._in_workdir("{stem}.class") == "/workdir/{stem}.class"
    assert O._in_workdir("-O2") == "-O2"
    assert O._in_workdir("/usr/bin/gcc") == "/usr/bin/gcc"
    assert O._in_workdir("x{file}") == "x{file}"


def _req(**lang: Any) -> dict[str, Any]:
    base = {"inproc": False, "compile": None, "run": ["./main"]}
    base.update(lang)
    return {
        "env": {"HOME": "/workdir"},
        "direct": True,
        "lang": base,
        "limits": {"uid": 1, "gid": 2, "fsize": 3},
        "op": "run",
    }


def test_image_request_python_and_cwd() -> None:
    img = types.SimpleNamespace(config={})
    req = _req(inproc=True, run=None)
    out = O.image_request(req, img, None, None)  # type: ignore[arg-type]
    assert out["lang"] == {"inproc": False, "compile": None, "run": ["python3", "{file}"]}
    assert "direct" not in out and req["direct"] is True and req["lang"]["inproc"] is True
    assert out["limits"] is req["limits"] and out["op"] == "run"
    out = O.image_request(req, img, O.Inside(python="/usr/bin/python3.11"), None)  # type: ignore[arg-type]
    assert out["lang"]["run"] == [*["python3.11", "{file}"][:0], "/usr/bin/python3.11", "{file}"]
    out = O.image_request(req, img, O.Inside(python="/p", cwd="/app"), None)  # type: ignore[arg-type]
    assert out["lang"]["run"] == ["/p", "/workdir/{file}"]
    req2 = _req(compile=["gcc", "{file}", "-o", "./main"], run=["./main", "x"])
    out = O.image_request(req2, img, O.Inside(cwd="/app"), None)  # type: ignore[arg-type]
    assert out["lang"]["compile"] == ["gcc", "/workdir/{file}", "-o", "/workdir/main"]
    assert out["lang"]["run"] == ["/workdir/main", "x"]
    assert req2["lang"]["run"] == ["./main", "x"]
    out = O.image_request(req2, img, O.Inside(), None)  # type: ignore[arg-type]
    assert out["lang"]["compile"] == ["gcc", "{file}", "-o", "./main"]
    out = O.image_request(_req(compile=[], run=[]), img, O.Inside(cwd="/app"), None)  # type: ignore[arg-type]
    assert out["lang"]["compile"] == [] and out["lang"]["run"] == []
    assert out["env"]["PATH"].startswith("/usr/local/sbin")


def test_image_request_limits() -> None:
    img = types.SimpleNamespace(config={})
    req = _req()
    out = O.image_request(req, img, O.Inside(), 7)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 1, "gid": 2, "fsize": 7 << 20}
    assert req["limits"] == {"uid": 1, "gid": 2, "fsize": 3}
    out = O.image_request(req, img, O.Inside(uid=0, gid=0, home="/root"), None)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 0, "gid": 0, "fsize": 3}
    assert out["env"]["HOME"] == "/root"
    out = O.image_request(req, img, O.Inside(uid=5, gid=None), 0)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 1, "gid": 2, "fsize": 3} and out["limits"] is not req["limits"]
    out = O.image_request(req, img, O.Inside(uid=5, gid=6), 2.9)  # type: ignore[arg-type]
    assert out["limits"] == {"uid": 5, "gid": 6, "fsize": 2 << 20}


# --- edges found by mutation testing ---------------------------------------------------------


def test_thaw_stale_edges(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []

    def kill(pid: int, sig: int) -> None:
        killed.append(pid)
        raise ProcessLookupError  # (gone already: swallowed)

    monkeypatch.setattr(os, "kill", kill)
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: sorted(real_listdir(p)))
    real_rmdir = os.rmdir

    def rmdir(p: str) -> None:
        for n in real_listdir(p) if os.path.isdir(p) else ():
            q = os.path.join(p, n)
            if os.path.isfile(q):
                os.unlink(q)
        real_rmdir(p)

    monkeypatch.setattr(os, "rmdir", rmdir)
    stale = tmp_path / "tangram-199999999-sessions"  # (a pid whose first digit names a live one)
    for n in ("f1", "f2"):
        (stale / n).mkdir(parents=True)
        (stale / n / "cgroup.procs").write_text("5 6\n")
    (stale / "a-file").write_text("")
    bad = tmp_path / "tangram-199999998-sessions" / "f1"
    (bad / "freezer.state").mkdir(parents=True)  # thawing it fails: swallowed
    odd = tmp_path / "tangram-199999997abcdefghi"  # not "-sessions": never touched
    odd.mkdir()
    O._thaw_stale(str(tmp_path))
    assert not (stale / "f1").exists() and not (stale / "f2").exists()
    assert killed == [5, 6, 5, 6]
    assert odd.exists()


def test_freezer_tree_v1_base_exists(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mnt = tmp_path / "freezer"
    (mnt / "own" / "t-sessions").mkdir(parents=True)
    monkeypatch.setattr(O, "_freezer_mount", lambda: str(mnt))
    monkeypatch.setattr(O, "_own_freezer_path", lambda: "/own")
    monkeypatch.setattr(O, "_thaw_stale", lambda p: None)
    t = O.FreezerTree(types.SimpleNamespace(version="v1", tag="t"))  # type: ignore[arg-type]
    assert t.available and t.problem == "" and t.base == f"{mnt}/own/t-sessions"


def test_rmdir_last_try(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    later: list[Any] = []

    class _L:
        def call_later(self, d: float, cb: Any, *a: Any) -> None:
            later.append((d, a))

    monkeypatch.setattr(O.asyncio, "get_event_loop", lambda: _L())
    t = O.FreezerTree(types.SimpleNamespace(version="v2"))  # type: ignore[arg-type]
    d = tmp_path / "busy"
    d.mkdir()
    (d / "x").write_text("")
    t._rmdir(str(d), 1)
    assert later == [(0.1, (str(d), 0))]


def test_own_freezer_path_keeps_its_last_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_open(monkeypatch, {"/proc/self/cgroup": "7:freezer:/a/X\n"})
    assert O._own_freezer_path() == "/a/X"


def test_freezer_tree_close_text_and_busy_child(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = O.FreezerTree(types.SimpleNamespace(version="v2"))  # type: ignore[arg-type]
    base = tmp_path / "base"
    (base / "f1").mkdir(parents=True)
    (base / "f2").mkdir()
    (base / "f2" / "x").write_text("")  # not empty: its rmdir fails (swallowed)
    t.base = str(base)
    written: list[str] = []
    real_open = open

    class _W(io.StringIO):
        def close(self) -> None:
            written.append(self.getvalue())
            super().close()

    def fake_open(p: str, mode: str = "r", *a: Any) -> Any:
        if p.endswith("freezer.state"):
            return _W()
        return real_open(p, mode, *a)

    monkeypatch.setattr(O, "open", fake_open, raising=False)
    monkeypatch.setattr(O, "time", types.SimpleNamespace(sleep=lambda s: None))
    t.close()
    assert written[:2] == ["THAWED", "THAWED"]
    assert not (base / "f1").exists() and (base / "f2").exists()


async def test_enter_image_idmaps_the_clone(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(O, "open_tree_clone", lambda p: os.open(p, os.O_RDONLY))
    mapped: list[str] = []
    nsd = tmp_path / "ns"
    nsd.mkdir()
    ns = types.SimpleNamespace(
        fd=os.open(str(nsd), os.O_RDONLY),
        base=1,
        count=2,
        idmap=lambda fd: mapped.append(os.readlink(f"/proc/self/fd/{fd}")),
    )
    img = _img()
    store = types.SimpleNamespace(
        layers_dir=str(tmp_path), layer_paths=lambda i: ["/x/layers/cc"] if i is img else ["/wrong"]
    )
    a, b = socket.socketpair()
    sb = _Sb(a, {"ok": True})
    await O.enter_image(sb, store, img, 1, 1, 1, userns=ns)  # type: ignore[arg-type]
    assert mapped == [str(tmp_path)] and sb.requests[0][0]["layers"] == ["cc"]
    _, fds, _, _ = socket.recv_fds(b, 16, 8)
    for f in (*fds, ns.fd):
        os.close(f)
    a.close()
    b.close()


def test_image_request_without_direct() -> None:
    req = _req()
    del req["direct"]
    out = O.image_request(req, types.SimpleNamespace(config={}), None, None)  # type: ignore[arg-type]
    assert "direct" not in out
