"""Exact values of the image sandbox's helpers (`sandbox/imagebox.py`, issue 43): the image's
user by Docker's rules at their edges (short entries, bad numbers, empty home) and the refusals'
words, the shell of ``Entrypoint`` + ``Cmd``, ``python3`` on the image's PATH, small reads of
the image's files, the fds received with the request, a user namespace of the sandbox's own
(maps and owner), and the image's Python worker (`PYTHON_LOOP`) run frame by frame."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
import pytest_asyncio
from _cpu_helpers import action, allot
from test_cpu_image_user import BASE, COUNT, _import, _rootfs

from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError
from arl_tangram.managers.cpu.sandbox import imagebox
from arl_tangram.managers.cpu.sandbox.imagebox import resolve_user, shell_argv


def test_constants() -> None:
    assert imagebox.LAYER_DIR == "/sandbox/layer" and imagebox.ROOT_DIR == "/sandbox/root"
    assert imagebox.PYTHONS == ("/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3")
    assert {"bash", "sh", "dash", "zsh", "ash", "ksh", "mksh"} == imagebox.SHELLS


def test_entries_skip_blank_lines_and_comments() -> None:
    assert imagebox._entries("a:b\n\n#c:d\n e:f\nx") == [["a", "b"], [" e", "f"], ["x"]]


PW = (
    "short:x:5:5:home:/h\n"  # six fields: ignored
    "bad:x:7a:8:bad:/b:/bin/sh\n"  # a uid that is not a number
    "badg:x:9:g:bg:/bg:/bin/sh\n"  # a gid that is not a number
    "nohome:x:11:12:nh::/bin/sh\n"
    "12:x:13:14:num:/num:/bin/sh\n"
)  # a user *named* 12
GR = "g2:x\nok:x:33:\nbadnum:x:3a:\n"


def test_resolve_user_edges() -> None:
    with pytest.raises(ValueError) as e:
        resolve_user("short", PW, GR)
    assert str(e.value) == "User 'short': no user 'short' in the image's /etc/passwd"
    with pytest.raises(ValueError) as e:
        resolve_user("bad", PW, GR)
    assert str(e.value) == "User 'bad': no user 'bad' in the image's /etc/passwd"
    with pytest.raises(ValueError):
        resolve_user("badg", PW, GR)
    assert resolve_user("nohome", PW, GR) == (11, 12, "/")
    assert resolve_user("12", PW, GR) == (13, 14, "/num")  # a name first
    assert resolve_user("13", PW, GR) == (13, 14, "/num")  # then a uid
    assert resolve_user("5", PW, GR) == (5, 0, "/")  # the short entry's uid is not looked at
    assert resolve_user("root", "", "") == (0, 0, "/root")
    assert resolve_user("", "", "") == (0, 0, "/root")
    assert resolve_user(None, "", "") == (0, 0, "/root")  # type: ignore[arg-type]
    assert resolve_user(":ok", PW, GR) == (0, 33, "/root")
    assert resolve_user("nohome:", PW, GR) == (11, 12, "/")  # an empty group: the user's gid
    with pytest.raises(ValueError) as e:
        resolve_user("nohome:g2", PW, GR)  # two fields: not an entry
    assert str(e.value) == "User 'nohome:g2': no group 'g2' in the image's /etc/group"
    with pytest.raises(ValueError) as e:
        resolve_user("nohome:badnum", PW, GR)
    assert str(e.value) == "User 'nohome:badnum': no group 'badnum' in the image's /etc/group"
    with pytest.raises(ValueError) as e:
        resolve_user("nobody", PW, GR)
    assert str(e.value) == "User 'nobody': no user 'nobody' in the image's /etc/passwd"


def test_resolve_user_takes_the_first_entry() -> None:
    pw = "a:x:1:2:a:/a:/bin/sh\na:x:3:4:a:/a2:/bin/sh\nb:x:1:9:b:/b:/bin/sh\n"
    assert resolve_user("a", pw, "") == (1, 2, "/a")
    assert resolve_user("1", pw, "") == (1, 2, "/a")
    gr = "g:x:5:\ng:x:6:\n"
    assert resolve_user("a:g", pw, gr) == (1, 5, "/a")
    # a group entry of three fields (no member list, no trailing colon) is an entry
    assert resolve_user("a:g", pw, "g:x:7") == (1, 7, "/a")


def test_on_path() -> None:
    assert imagebox._on_path({}) == []
    assert imagebox._on_path({"Env": None}) == []
    assert imagebox._on_path({"Env": ["A=1", "PATH=/venv/bin:rel:/usr/bin:", "PATH=/x"]}) == [
        "/venv/bin/python3",
        "/usr/bin/python3",
    ]
    assert imagebox._on_path({"Env": ["PATHX=/a", "A=PATH=/b"]}) == []
    # split at the first "=": a value may hold one
    assert imagebox._on_path({"Env": ["PATH=/x=y:/usr/bin"]}) == [
        "/x=y/python3",
        "/usr/bin/python3",
    ]


@pytest.mark.parametrize(
    ("config", "want"),
    [
        ({}, None),
        ({"Cmd": ["/usr/bin/zsh"]}, ["/usr/bin/zsh"]),
        ({"Cmd": ["ksh", "-l", "-i"]}, ["ksh", "-l", "-i"]),
        ({"Cmd": ["bash", "-c", "echo"]}, None),
        ({"Cmd": ["bash", "-c"]}, None),
        ({"Cmd": ["bash", "script.sh"]}, None),
        ({"Cmd": ["python3"]}, None),
        ({"Entrypoint": ["/entry.sh"], "Cmd": ["bash"]}, ["/entry.sh", "bash"]),
        ({"Entrypoint": ["/bin/sh"]}, ["/bin/sh"]),
        ({"Entrypoint": ["/bin/sh", "-e"], "Cmd": None}, ["/bin/sh", "-e"]),
        ({"Entrypoint": ["/bin/bash"], "Cmd": ["run.py"]}, None),
        ({"Entrypoint": [], "Cmd": [1]}, None),
        ({"Cmd": ["mksh"]}, ["mksh"]),
        ({"Cmd": ["ash", "--"]}, ["ash", "--"]),
    ],
)
def test_shell_argv_edges(config, want) -> None:
    assert shell_argv(config) == want


def test_read_small(tmp_path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abc\xffdef")
    assert imagebox._read_small(str(f)) == "abc\ufffddef"
    assert imagebox._read_small(str(f), 3) == "abc"
    assert imagebox._read_small(str(tmp_path / "absent")) == ""
    assert imagebox._read_small(str(tmp_path)) == ""  # a directory
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert imagebox._read_small(str(fifo)) == ""  # not opened for long, not read
    big = tmp_path / "big"
    big.write_bytes(b"x" * ((1 << 20) + 5))
    assert len(imagebox._read_small(str(big))) == 1 << 20
    before = set(os.listdir("/proc/self/fd"))
    imagebox._read_small(str(f))
    imagebox._read_small(str(fifo))
    assert set(os.listdir("/proc/self/fd")) == before


def test_read_small_takes_no_controlling_terminal() -> None:
    """A terminal the image's /etc/passwd names is opened ``O_NOCTTY``: the init, a session
    leader without a controlling terminal, does not take it as one (and reads nothing)."""
    master, slave = os.openpty()
    name = os.ttyname(slave)
    pid = os.fork()
    if pid == 0:  # (a session leader without a controlling terminal, as the init is)
        code = 1
        try:
            os.setsid()
            got = imagebox._read_small(name)
            try:
                os.close(os.open("/dev/tty", os.O_RDWR))
                code = 2  # the terminal became ours
            except OSError:
                code = 0 if got == "" else 3
        finally:
            os._exit(code)
    try:
        _, st = os.waitpid(pid, 0)
    finally:
        os.close(slave)
        os.close(master)
    assert os.waitstatus_to_exitcode(st) == 0


def _send(n: int) -> tuple[socket.socket, list[int]]:
    a, b = socket.socketpair()
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(n)]
    socket.send_fds(a, [b"x"], fds)
    for fd in fds:
        os.close(fd)
    a.close()
    return b, fds


def test_recv_fds_takes_the_count_it_expects() -> None:
    b, _ = _send(2)
    got = imagebox._recv_fds(b.fileno(), 2)
    assert len(got) == 2 and all(not os.get_inheritable(x) for x in got)
    assert all(os.readlink(f"/proc/self/fd/{x}") == "/dev/null" for x in got)
    assert b.fileno() >= 0  # its own dup was closed, not ours
    os.fstat(b.fileno())
    for x in got:
        os.close(x)
    b.close()
    b, _ = _send(3)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        imagebox._recv_fds(b.fileno(), 2)
    assert str(e.value) == (
        "image: expected 2 fds (the layers directory, the writable layer, "
        "the user namespace), got 3"
    )
    assert set(os.listdir("/proc/self/fd")) == before  # the three closed again
    b.close()


def test_recv_fds_waits_for_the_fds() -> None:
    """The fds may come after `enter` is called (and the fd be non-blocking): it waits."""
    import threading

    a, b = socket.socketpair()
    b.setblocking(False)
    fd = os.open("/dev/null", os.O_RDONLY)
    t = threading.Timer(0.2, lambda: socket.send_fds(a, [b"x"], [fd]))
    t.start()
    try:
        got = imagebox._recv_fds(b.fileno(), 1)
    finally:
        t.join()
        os.close(fd)
        a.close()
        b.close()
    assert len(got) == 1 and os.readlink(f"/proc/self/fd/{got[0]}") == "/dev/null"
    os.close(got[0])


def test_recv_fds_reads_at_most_three() -> None:
    """A fourth fd sent is not taken (the message's room is for three): the count refused is
    the three received, and they are closed again."""
    b, _ = _send(4)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        imagebox._recv_fds(b.fileno(), 2)
    assert str(e.value).endswith("the user namespace), got 3")
    assert set(os.listdir("/proc/self/fd")) == before
    b.close()


@pytest.mark.needs_root
def test_own_userns_child_exits_0_and_is_reaped(monkeypatch) -> None:
    """The helper child exits with status 0 (``os._exit``, never back into the caller's code)
    and is reaped before `own_userns` returns; the caller never takes the child's way out (this
    test runs before the others that call it in this process: such an exit there would end the
    test process with status 0)."""
    real_exit, me = os._exit, os.getpid()
    forked, reaped = [], []

    def fork():
        pid = os.fork()
        forked.append(pid)
        return pid

    def waitpid(pid, options):
        reaped.append(os.waitpid(pid, options))
        return reaped[-1]

    fake = _Proxy(
        os,
        fork=fork,
        waitpid=waitpid,
        _exit=lambda code: (
            real_exit(code if type(code) is int else 99)
            if os.getpid() != me
            else pytest.fail("the caller took the child's way out")
        ),
    )
    monkeypatch.setattr(imagebox, "os", fake)
    fd = imagebox.own_userns(100000, 10, 4321)
    os.close(fd)
    (pid,) = forked
    assert reaped == [(pid, 0)]  # (status 0)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_own_userns_maps_and_owner() -> None:
    fd = imagebox.own_userns(100000, 65536, 4321)
    try:
        assert not os.get_inheritable(fd)
        owner = struct.unpack("I", fcntl.ioctl(fd, 0xB704, b"\0" * 4))[0]  # NS_GET_OWNER_UID
        assert owner == 4321
        probe = (
            "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = int(sys.argv[1])\nassert libc.setns(fd, 0x10000000) == 0, ctypes.get_errno()\n"
            "print(open('/proc/self/uid_map').read().split(), open('/proc/self/gid_map').read().split())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(fd)], pass_fds=(fd,), capture_output=True, text=True
        )
        assert out.stdout.strip() == ("['0', '100000', '65536'] ['0', '100000', '65536']"), (
            out.stderr
        )
    finally:
        os.close(fd)


@pytest.mark.needs_root
def test_own_userns_returns_in_the_caller_only() -> None:
    """Run in a fresh process: the caller gets the fd and goes on, alone (the child says
    nothing and never returns)."""
    code = (
        "from arl_tangram.managers.cpu.sandbox import imagebox\n"
        "fd = imagebox.own_userns(100000, 10, 4321)\nprint('fd', fd > 2)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (0, "fd True\n", "")


@pytest.mark.needs_root
def test_own_userns_refused_says_eperm(monkeypatch) -> None:
    from arl_tangram.managers.cpu import _linux

    def no(flags):
        raise OSError(1, "no")

    monkeypatch.setattr(_linux, "unshare", no)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        imagebox.own_userns(100000, 10, 4321)
    assert e.value.errno == 1 and e.value.strerror == "cannot make the sandbox's user namespace"
    assert set(os.listdir("/proc/self/fd")) == before


def _frame(obj) -> bytes:
    b = json.dumps(obj).encode()
    return len(b).to_bytes(4, "big") + b


def test_the_image_python_worker_protocol(tmp_path) -> None:
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    hi_r, hi_w = fcntl.fcntl(req_r, fcntl.F_DUPFD, 50), fcntl.fcntl(rep_w, fcntl.F_DUPFD, 50)
    head = f"import os\nos.dup2({hi_r}, 3)\nos.dup2({hi_w}, 4)\n"
    p = subprocess.Popen(
        [sys.executable, "-c", head + imagebox.PYTHON_LOOP],
        pass_fds=(hi_r, hi_w),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    for fd in (req_r, rep_w, hi_r, hi_w):
        os.close(fd)

    def rc() -> dict:
        n = int.from_bytes(os.read(rep_r, 4), "big")
        return json.loads(os.read(rep_r, n))

    os.write(req_w, _frame({"code": "x = 2\nx * 21"}))
    assert rc() == {"rc": 0}
    os.write(req_w, _frame({"code": "None"}))
    assert rc() == {"rc": 0}
    os.write(req_w, _frame({"code": "import os, sys\nprint(sys.path[0] == os.getcwd(), __name__)"}))
    assert rc() == {"rc": 0}
    os.write(req_w, _frame({"code": "import sys\nsys.exit(3)"}))
    assert rc() == {"rc": 3}
    os.write(req_w, _frame({"code": "raise SystemExit('x')"}))
    assert rc() == {"rc": 1}
    os.write(req_w, _frame({"code": "raise SystemExit()"}))
    assert rc() == {"rc": 0}
    os.write(req_w, _frame({"code": "1/0"}))
    assert rc() == {"rc": 1}
    os.write(
        req_w,
        _frame(
            {"code": "import os\nos.cpu_count(), os.environ['T53']", "cpus": 3, "env": {"T53": "v"}}
        ),
    )
    assert rc() == {"rc": 0}
    os.write(req_w, _frame({"code": "x"}))  # the namespace is kept between frames
    assert rc() == {"rc": 0}
    os.close(req_w)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0
    assert out.decode().splitlines() == ["42", "True __main__", "(3, 'v')", "2"]
    assert err.decode() == (
        'Traceback (most recent call last):\n  File "<session>", line 1, in <module>\n'
        "ZeroDivisionError: division by zero\n"
    )
    os.close(rep_r)


class _Reached(Exception):
    """`enter` got to a step that makes something (a directory, a mount)."""


def _enter_until_refused(req: dict, n_fds: int, monkeypatch) -> BaseException:
    """`enter` in this process up to its first refusal (no mount made: the fds are counted,
    the ids read and the layer names checked first), ``n_fds`` fds of /dev/null sent with the
    request; every fd it received is closed again."""
    monkeypatch.chdir("/")  # (`enter` moves to / on its way out)
    # nothing is made on this host, whatever a mutant does: the first step that would is refused
    from arl_tangram.managers.cpu import _linux

    def reached(*args):
        raise _Reached(args)

    monkeypatch.setattr(os, "mkdir", reached)
    for name in ("mount", "move_mount", "idmap_mount", "pivot_root", "umount2", "setns"):
        monkeypatch.setattr(_linux, name, reached)
    got = _watch_recv(monkeypatch)
    b, _ = _send(n_fds)
    try:
        with pytest.raises(Exception) as e:  # (the type: asserted by the caller)
            imagebox.enter(req, b.fileno())
    finally:
        b.close()
    _all_closed(got)
    return e.value


def _watch_recv(monkeypatch) -> list[int]:
    """The fds `enter` receives (recorded as `_recv_fds` returns them)."""
    got: list[int] = []
    recv = imagebox._recv_fds

    def watch(fd: int, n: int) -> list[int]:
        fds = recv(fd, n)
        got.extend(fds)
        return fds

    monkeypatch.setattr(imagebox, "_recv_fds", watch)
    return got


def _all_closed(fds: list[int]) -> None:
    """None of ``fds`` (each a /dev/null) is open any more (a number taken again since is some
    other file: the image user test's manager runs alongside)."""
    for fd in fds:
        with contextlib.suppress(FileNotFoundError):
            assert os.readlink(f"/proc/self/fd/{fd}") != "/dev/null", fd


BAD = {"uid": 5, "gid": 6, "layer_mb": 8, "layers": ["ok", "a.b", "x:y"]}


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        ({}, 1),
        ({"layer": "disk"}, 2),
        ({"layer": "tmpfs"}, 1),
        ({"userns": {"base": 100000, "count": 65536}}, 2),
        ({"layer": "disk", "userns": {"base": 100000, "count": 65536}}, 3),
        ({"userns": {"base": 100000, "count": 65536, "owner": 7}}, 1),
        ({"layer": "disk", "userns": {"base": 100000, "count": 65536, "owner": 7}}, 2),
    ],
)
def test_enter_takes_the_fds_its_request_names(extra, want, monkeypatch) -> None:
    """The layers directory, the disk layer's mount (``layer: disk``) and the node's user
    namespace (``userns`` without an ``owner``: with one, the init makes its own) come with the
    request: any other count is refused before anything is mounted (at most 3 are read)."""
    sent = 3 if want < 3 else 2
    err = _enter_until_refused({**BAD, **extra}, sent, monkeypatch)
    assert type(err) is OSError and str(err) == (
        f"image: expected {want} fds (the layers directory, the writable layer, "
        f"the user namespace), got {sent}"
    )


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"layer": "disk"},
        {"userns": {"base": 100000, "count": 65536}},
        {"layer": "disk", "userns": {"base": 100000, "count": 65536}},
    ],
)
@pytest.mark.parametrize("bad", ["x:y", "x/y", "x,y", ".x", ".."])
def test_enter_refuses_a_bad_layer_name_before_mounting(extra, bad, monkeypatch) -> None:
    """Names relative to the layers directory, joined into overlayfs' ``lowerdir`` (``:`` and
    ``,`` are its separators): a path, a separator or a leading dot is refused, naming it; a
    good name before it passes (the fds it got are closed, the namespace's too)."""
    n = (2 if extra.get("layer") == "disk" else 1) + (1 if "userns" in extra else 0)
    err = _enter_until_refused({**BAD, **extra, "layers": ["ok", "a.b", bad, "z"]}, n, monkeypatch)
    assert type(err) is ValueError and str(err) == f"bad layer name {bad!r}"
    assert os.getcwd() == "/"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("uid", None, TypeError), ("gid", "x", ValueError), ("layers", None, TypeError)],
)
def test_enter_refuses_a_request_without_ids_or_layers(field, value, error, monkeypatch) -> None:
    err = _enter_until_refused({**BAD, "layers": ["ok"], field: value}, 1, monkeypatch)
    assert type(err) is error


@pytest.mark.parametrize(
    "extra",
    [{}, {"layer": "disk"}, {"layer": "disk", "userns": {"base": 100000, "count": 65536}}],
)
def test_enter_with_good_names_goes_on_to_make_the_layer(extra, monkeypatch) -> None:
    n = (2 if extra.get("layer") == "disk" else 1) + (1 if "userns" in extra else 0)
    err = _enter_until_refused({**BAD, **extra, "layers": ["ok", "a.b", "z"]}, n, monkeypatch)
    assert type(err) is _Reached and err.args == (("/sandbox/layer", 0o700),)


@pytest.fixture(scope="module")
def layout():
    """The image user tests' image (`test_cpu_image_user.py`), removed afterwards."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="tangram-imagebox-values-")
    try:
        yield d, imagekit.pack_layer(_rootfs(d), os.path.join(d, "root.tar"))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mgr():
    """A manager with the image user tests' id range; its work root removed afterwards."""
    import shutil
    import tempfile

    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

    root = tempfile.mkdtemp(prefix="tangram-imagebox-values-w-")
    m = CpuManager(
        CpuManagerConfig(
            work_root=root, warm_min=1, warm_max=4, image_id_base=BASE, image_id_count=COUNT
        )
    )
    try:
        await m.start()
        yield m
    finally:
        await m.aclose()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.needs_root
@pytest.mark.asyncio(loop_scope="module")
async def test_enter_group_by_name_ids_in_range_and_a_file_at_workdir(mgr, layout) -> None:
    """In a sandbox (the image user tests' manager and image, `test_cpu_image_user.py`): a
    ``User`` whose group is a name of the image's /etc/group; a uid or a gid past the node's
    range refused, naming them; an image whose /workdir is a file gets the directory anyway."""
    code = "import os\nprint(os.getuid(), os.getgid(), os.getcwd(), os.path.isdir('/workdir'))"
    img = _import(mgr, layout, "by-group-name", {"User": "nobody:nogroup"})
    r = await mgr.run(action(code, image=img), allot())
    assert r.run_result is not None and r.run_result.stdout == "65534 65534 /workdir True\n"
    for user, ids in (("70000", "70000:0"), ("0:70000", "0:70000"), ("65536", "65536:0")):
        img = _import(mgr, layout, f"far-{user.replace(':', '-')}", {"User": user})
        with pytest.raises(ImageError) as e:
            await mgr.open_session("far", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
        assert f"User '{user}': ids {ids} are outside the node's range of {COUNT}" in str(e.value)
    d, tar = layout
    # /workdir and /tmp files, /proc gone (a whiteout): each made a directory again
    extra = [("workdir", b"x"), ("tmp", b"x"), (".wh.proc", None)]
    top = imagekit.pack_layer("", os.path.join(d, "workdir-file.tar"), extra=extra)
    if not mgr.images.has("workdir-file"):
        oci = imagekit.write_oci_layout(os.path.join(d, "workdir-file"), [tar, top], {})
        mgr.images.import_path(oci, "workdir-file")
    more = (
        "\nst = os.stat('/tmp')\nprint(oct(st.st_mode), st.st_uid)\n"
        "print([ln.split() for ln in open('/proc/1/status') if ln[:4] in ('Uid:', 'Gid:')])"
    )
    r = await mgr.run(action(code + more, image="workdir-file"), allot())
    assert r.run_result is not None, r.to_dict()
    lines = r.run_result.stdout.splitlines()
    assert lines == [  # (the init, PID 1: root inside, every id of it)
        "0 0 /workdir True",
        "0o41777 0",
        str([["Uid:", "0", "0", "0", "0"], ["Gid:", "0", "0", "0", "0"]]),
    ], r.to_dict()


@pytest.mark.parametrize("on_disk", [False, True])
def test_enter_makes_the_writable_layer(on_disk, monkeypatch) -> None:
    """The layer's directory (0700), then the node's disk layer moved there (the fd after the
    layers directory's) or a tmpfs of ``layer_mb`` MiB mounted (nosuid, nodev, 0700): the
    calls' exact arguments, in this process (the directory recorded, not made)."""
    from arl_tangram.managers.cpu import _linux

    made = []
    monkeypatch.chdir("/")
    monkeypatch.setattr(os, "mkdir", lambda *a: made.append(a))

    def reached(name):
        def f(*args):
            raise _Reached(name, args)

        return f

    for name in ("mount", "move_mount", "idmap_mount", "pivot_root", "umount2", "setns"):
        monkeypatch.setattr(_linux, name, reached(name))
    got = _watch_recv(monkeypatch)
    b, _ = _send(2 if on_disk else 1)
    req = {**BAD, "layers": ["ok"], "layer_mb": 12, **({"layer": "disk"} if on_disk else {})}
    try:
        with pytest.raises(_Reached) as e:
            imagebox.enter(req, b.fileno())
    finally:
        b.close()
    assert len(got) == (2 if on_disk else 1)
    _all_closed(got)
    assert made == [("/sandbox/layer", 0o700)]
    name, args = e.value.args
    if on_disk:
        assert (name, args) == ("move_mount", (got[1], "/sandbox/layer"))
    else:
        assert (name, args) == (
            "mount",
            (
                "tmpfs",
                "/sandbox/layer",
                "tmpfs",
                _linux.MS_NOSUID | _linux.MS_NODEV,
                "size=12m,mode=0700",
            ),
        )


class _Proxy:
    """A module with some of its functions replaced (the rest, and its constants, the real
    module's)."""

    def __init__(self, real, **over):
        self._real = real
        self.__dict__.update(over)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _enter_recorded(
    req: dict, n_fds: int, fs: dict, monkeypatch, runnable="/usr/bin/python3", cwd_error=False
):
    """`enter` run in this process with every call that makes, mounts, changes ids or reads
    the image stubbed and recorded in order: ``fs`` says what the image holds at the paths it
    asks about ("dir", "link" to a directory, "file"; absent: nothing). Returns (the reply or
    the exception, the calls, the fds received, the namespace fd made, if any)."""
    from arl_tangram.managers.cpu import _linux
    from arl_tangram.managers.cpu.sandbox import child

    calls: list[tuple] = []

    def rec(name, ret=None):
        def f(*a, **k):
            calls.append((name, *a, *k.items()))
            return ret

        return f

    def close(fd):
        calls.append(("close", fd))
        os.close(fd)

    path = _Proxy(
        os.path,
        isdir=lambda p: fs.get(p) in ("dir", "link"),
        islink=lambda p: fs.get(p) == "link",
        lexists=lambda p: p in fs,
    )

    def stat(p):
        calls.append(("stat", p))
        if cwd_error:
            raise NotADirectoryError(20, "Not a directory")

    fake_os = _Proxy(
        os,
        stat=stat,
        path=path,
        close=close,
        access=lambda p, mode: calls.append(("access", p, mode)) or p == runnable,
        **{
            n: rec(n)
            for n in (
                "mkdir",
                "chown",
                "chmod",
                "chdir",
                "fchdir",
                "unlink",
                "makedirs",
                "setgroups",
                "setresgid",
                "setresuid",
            )
        },
    )
    lx = _Proxy(
        _linux,
        **{
            n: rec(n)
            for n in (
                "mount",
                "move_mount",
                "idmap_mount",
                "pivot_root",
                "umount2",
                "setns",
                "die_with_parent",
            )
        },
    )
    made: list[int] = []

    def own_userns(*a):
        calls.append(("own_userns", *a))
        made.append(os.open("/dev/null", os.O_RDONLY))
        return made[0]

    texts = {"/etc/passwd": "app:x:1000:1000::/home/app:/bin/sh\n", "/etc/group": "staff:x:50:\n"}
    ticks = iter([10.0, 10.0000012345])
    monkeypatch.setattr(imagebox, "os", fake_os)
    monkeypatch.setattr(imagebox, "_linux", lx)
    monkeypatch.setattr(imagebox, "signal", _Proxy(signal, signal=rec("signal")))
    monkeypatch.setattr(imagebox, "time", _Proxy(time, perf_counter=lambda: next(ticks)))
    monkeypatch.setattr(imagebox, "own_userns", own_userns)
    monkeypatch.setattr(
        imagebox, "_read_small", lambda p: calls.append(("read", p)) or texts.get(p, "")
    )
    monkeypatch.setattr(imagebox, "python", None)
    monkeypatch.setattr(imagebox, "SHELL", None)
    monkeypatch.setattr(child, "CWD", None)
    got = _watch_recv(monkeypatch)
    b, _ = _send(n_fds)
    try:
        try:
            out = imagebox.enter(req, b.fileno())
        except Exception as e:  # (the caller asserts which)
            out = e
    finally:
        b.close()
    _all_closed(got + made)
    return out, calls, got, made


NOSUID = 2 | 4  # MS_NOSUID | MS_NODEV


def _layer_calls(upper_owner: tuple) -> list[tuple]:
    return [
        ("mkdir", "/sandbox/layer/upper", 0o755),
        *([("chown", "/sandbox/layer/upper", *upper_owner)] if upper_owner else []),
        ("mkdir", "/sandbox/layer/work", 0o700),
        ("mkdir", "/sandbox/root", 0o755),
    ]


def _pivot_calls() -> list[tuple]:
    return [
        ("mount", "proc", "/sandbox/root/proc", "proc", NOSUID | 8),  # | MS_NOEXEC
        ("mount", "/dev", "/sandbox/root/dev", None, 4096 | 16384),  # MS_BIND | MS_REC
        ("chdir", "/sandbox/root"),
        ("pivot_root", ".", "."),
        ("umount2", ".", 2),  # MNT_DETACH
        ("chdir", "/"),
    ]


@pytest.mark.parametrize("own", [False, True])
def test_enter_in_a_user_namespace_calls_and_reply(own, monkeypatch) -> None:
    """With the node's user namespace (lent, or made here with an owner): the tmpfs layer, the
    overlay of the layers top first, /proc made (missing) and /dev made again (a link), /tmp
    kept (a directory), the pivot, the namespace joined as root, the image's user and group
    by name, /workdir made again (a file) and owned by them, the image's WorkingDir made and
    normalised, python3 from its Env PATH (absolute entries, first runnable), its bash: each
    call's exact arguments, in order, and the reply."""
    owner = {"owner": 4242} if own else {}
    req = {
        "uid": 5,
        "gid": 6,
        "layer_mb": 12,
        "layers": ["top", "base"],
        "userns": {"base": 100000, "count": 65536, **owner},
        "config": {
            "User": "app:staff",
            "WorkingDir": "srv//x/",
            "Env": ["A=1", "PATH=/venv/bin:rel:/usr/bin"],
            "Entrypoint": ["/bin/bash"],
        },
    }
    fs = {"/sandbox/root/dev": "link", "/sandbox/root/tmp": "dir", "/workdir": "file"}
    out, calls, got, made = _enter_recorded(req, 1 if own else 2, fs, monkeypatch)
    layers = got[0]
    ns = made[0] if own else got[1]
    assert out == {
        "ok": True,
        "enter_s": 1e-06,
        "python": "/usr/bin/python3",
        "uid": 1000,
        "gid": 50,
        "home": "/home/app",
        "cwd": "/srv/x",
        "shell": ["/bin/bash"],
        "userns": True,
    }, out
    assert (imagebox.python, imagebox.SHELL) == ("/usr/bin/python3", ["/bin/bash"])
    from arl_tangram.managers.cpu.sandbox import child

    assert child.CWD == "/srv/x"
    pre = [("own_userns", 100000, 65536, 4242), ("idmap_mount", layers, ns)] if own else []
    assert calls == [
        *pre,
        ("mkdir", "/sandbox/layer", 0o700),
        ("mount", "tmpfs", "/sandbox/layer", "tmpfs", NOSUID, "size=12m,mode=0700"),
        *_layer_calls((100000, 100000)),
        ("fchdir", layers),
        (
            "mount",
            "overlay",
            "/sandbox/root",
            "overlay",
            NOSUID,
            "lowerdir=top:base,upperdir=/sandbox/layer/upper,workdir=/sandbox/layer/work",
        ),
        ("chdir", "/"),
        ("close", layers),
        ("mkdir", "/sandbox/root/proc", 0o555),
        ("chmod", "/sandbox/root/proc", 0o555),
        ("chown", "/sandbox/root/proc", 100000, 100000),
        ("unlink", "/sandbox/root/dev"),
        ("mkdir", "/sandbox/root/dev", 0o755),
        ("chmod", "/sandbox/root/dev", 0o755),
        ("chown", "/sandbox/root/dev", 100000, 100000),
        *_pivot_calls(),
        ("setns", ns, 0x10000000),  # CLONE_NEWUSER
        ("setgroups", []),
        ("setresgid", 0, 0, 0),
        ("setresuid", 0, 0, 0),
        ("die_with_parent",),
        ("signal", signal.SIGINT, signal.SIG_IGN),
        ("read", "/etc/passwd"),
        ("read", "/etc/group"),
        ("unlink", "/workdir"),
        ("mkdir", "/workdir", 0o755),
        ("chown", "/workdir", 1000, 50),
        ("close", ns),
        ("makedirs", "/srv/x", 0o755, ("exist_ok", True)),
        ("stat", "/srv/x/."),
        ("access", "/venv/bin/python3", os.X_OK),
        ("access", "/usr/bin/python3", os.X_OK),
    ]


def test_enter_on_the_disk_layer_without_a_namespace_calls_and_reply(monkeypatch) -> None:
    """The node's disk layer moved in (the fd after the layers directory's) and made 0700,
    nothing chowned but /workdir (to the request's ids), /proc and /tmp made (missing) without an
    owner, /dev kept, no config: /workdir the cwd, the first runnable of the usual pythons,
    the default shell, no home."""
    req = {"uid": 5, "gid": 6, "layer": "disk", "layers": ["only"]}
    fs = {"/sandbox/root/dev": "dir", "/workdir": "dir"}
    out, calls, got, _ = _enter_recorded(req, 2, fs, monkeypatch)
    assert out == {
        "ok": True,
        "enter_s": 1e-06,
        "python": "/usr/bin/python3",
        "uid": 5,
        "gid": 6,
        "home": None,
        "cwd": "/workdir",
        "shell": None,
        "userns": False,
    }, out
    assert calls == [
        ("mkdir", "/sandbox/layer", 0o700),
        ("move_mount", got[1], "/sandbox/layer"),
        ("chmod", "/sandbox/layer", 0o700),
        *_layer_calls(()),
        ("fchdir", got[0]),
        (
            "mount",
            "overlay",
            "/sandbox/root",
            "overlay",
            NOSUID,
            "lowerdir=only,upperdir=/sandbox/layer/upper,workdir=/sandbox/layer/work",
        ),
        ("chdir", "/"),
        ("close", got[0]),
        ("close", got[1]),
        ("mkdir", "/sandbox/root/proc", 0o555),
        ("chmod", "/sandbox/root/proc", 0o555),
        ("mkdir", "/sandbox/root/tmp", 0o1777),
        ("chmod", "/sandbox/root/tmp", 0o1777),
        *_pivot_calls(),
        ("chown", "/workdir", 5, 6),
        ("access", "/usr/local/bin/python3", os.X_OK),
        ("access", "/usr/bin/python3", os.X_OK),
    ]


def test_enter_refuses_a_gid_at_the_end_of_the_range(monkeypatch) -> None:
    """A gid equal to the namespace's count is outside it (the last id is count - 1); the
    namespace's fd is closed on the way out."""
    req = {
        "uid": 5,
        "gid": 6,
        "layer_mb": 12,
        "layers": ["top"],
        "userns": {"base": 100000, "count": 2000},
        "config": {"User": "0:2000"},
    }
    fs = {"/sandbox/root/dev": "dir", "/sandbox/root/proc": "dir", "/sandbox/root/tmp": "dir"}
    out, calls, got, _ = _enter_recorded(req, 2, fs, monkeypatch)
    assert type(out) is ValueError
    assert str(out) == "User '0:2000': ids 0:2000 are outside the node's range of 2000"
    assert calls[-1] == ("close", got[1])


def test_enter_in_a_user_namespace_without_a_user_is_root(monkeypatch) -> None:
    """No ``User`` in the image's config: root inside (the image's /etc/passwd has none: its
    home is /root)."""
    req = {
        "uid": 5,
        "gid": 6,
        "layer_mb": 12,
        "layers": ["top"],
        "userns": {"base": 100000, "count": 65536},
    }
    fs = {"/sandbox/root/dev": "dir", "/sandbox/root/proc": "dir", "/sandbox/root/tmp": "dir"}
    out, calls, _, _ = _enter_recorded(req, 2, fs, monkeypatch)
    assert isinstance(out, dict), out
    assert (out["uid"], out["gid"], out["home"], out["cwd"]) == (0, 0, "/root", "/workdir")
    assert ("chown", "/workdir", 0, 0) in calls


def test_enter_without_a_runnable_python(monkeypatch) -> None:
    """No python3 the image can run: ``python`` is None (every candidate tried, in order)."""
    req = {"uid": 5, "gid": 6, "layer_mb": 12, "layers": ["top"]}
    fs = {"/sandbox/root/dev": "dir", "/sandbox/root/proc": "dir", "/sandbox/root/tmp": "dir"}
    out, calls, _, _ = _enter_recorded(req, 1, fs, monkeypatch, runnable=None)
    assert isinstance(out, dict) and out["python"] is None, out
    assert imagebox.python is None
    assert [c[1] for c in calls if c[0] == "access"] == list(imagebox.PYTHONS)


def test_enter_falls_back_to_workdir_when_the_working_dir_is_not_one(monkeypatch) -> None:
    """The image's ``WorkingDir`` cannot be made a directory (a file on its way): /workdir."""
    req = {"uid": 5, "gid": 6, "layer_mb": 12, "layers": ["top"], "config": {"WorkingDir": "/f/x"}}
    fs = {"/sandbox/root/dev": "dir", "/sandbox/root/proc": "dir", "/sandbox/root/tmp": "dir"}
    out, calls, _, _ = _enter_recorded(req, 1, fs, monkeypatch, cwd_error=True)
    assert isinstance(out, dict) and out["cwd"] == "/workdir", out
    from arl_tangram.managers.cpu.sandbox import child

    assert child.CWD == "/workdir"
    assert ("stat", "/f/x/.") in calls
