"""The ctypes bindings (issue 43, mutation testing of managers/cpu/_linux.py): each wrapper's
exact arguments to libc and its error text, with a recording stand-in for libc (no namespace,
mount or filter is made); the /proc helpers on this process where they are harmless."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

import pytest

from arl_tangram.managers.cpu import _linux as L

pytestmark = pytest.mark.timeout(5)


def _v(a: Any) -> Any:
    if isinstance(a, ctypes._SimpleCData):
        return (type(a).__name__, a.value)
    if isinstance(a, ctypes.Array):
        return ("buf", bytes(a))
    return a


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.rc: dict[str, int] = {}
        self.err = errno.EPERM

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any) -> int:
            self.calls.append((name, [_v(a) for a in args]))
            rc = self.rc.get(name, 0)
            if rc != 0:
                ctypes.set_errno(self.err)
            return rc

        return call


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> _Libc:
    fake = _Libc()
    monkeypatch.setattr(L, "_libc", fake)
    return fake


def _fails(libc: _Libc, name: str, err: int = errno.EPERM, rc: int = -1) -> None:
    libc.rc[name] = rc
    libc.err = err


def test_constants() -> None:
    assert (L.SYS_PIVOT_ROOT, L.SYS_OPEN_TREE, L.SYS_MOVE_MOUNT) == (155, 428, 429)
    assert (L.SYS_FSOPEN, L.SYS_FSCONFIG, L.SYS_FSMOUNT, L.SYS_MOUNT_SETATTR) == (
        430,
        431,
        432,
        442,
    )
    assert L._INT_MAX == 2**31 - 1 and L.PR_SET_NAME == 15
    assert (L.PROT_READ, L.PROT_WRITE, L.PROT_EXEC) == (1, 2, 4)
    assert L._libc is not None


def test_int() -> None:
    assert L._int(0) == 0 and L._int(2**31 - 1) == 2**31 - 1
    for bad in (-1, 2**31):
        with pytest.raises(OverflowError) as ei:
            L._int(bad)
        assert str(ei.value) == f"{bad!r} does not fit a C int"


def test_check() -> None:
    L._check(0, "x")
    ctypes.set_errno(errno.ENOENT)
    with pytest.raises(OSError) as ei:
        L._check(-1, "what(1)")
    assert ei.value.errno == errno.ENOENT
    assert ei.value.strerror == f"what(1): {os.strerror(errno.ENOENT)}"
    ctypes.set_errno(errno.EBUSY)
    with pytest.raises(OSError) as ei:
        L._check(5, "w")
    assert ei.value.errno == errno.EBUSY


def test_unshare_setns(libc: _Libc) -> None:
    L.unshare(0x20000000)
    L.setns(7, 0x40000000)
    assert libc.calls == [("unshare", [0x20000000]), ("setns", [7, 0x40000000])]
    _fails(libc, "unshare")
    with pytest.raises(OSError) as ei:
        L.unshare(0x20)
    assert ei.value.errno == errno.EPERM
    assert ei.value.strerror == f"unshare(0x20): {os.strerror(errno.EPERM)}"
    _fails(libc, "setns", errno.EINVAL, 1)
    with pytest.raises(OSError) as ei:
        L.setns(3, 0x8)
    assert ei.value.strerror == f"setns(3, 0x8): {os.strerror(errno.EINVAL)}"
    with pytest.raises(OverflowError):
        L.unshare(-1)


def test_enc_and_mount(libc: _Libc) -> None:
    assert L._enc(None) is None and L._enc("ä") == "ä".encode()
    L.mount("src", "/t", "tmpfs", 4096, "size=1m")
    L.mount(None, "/t", None)
    assert libc.calls == [
        ("mount", [b"src", b"/t", b"tmpfs", 4096, b"size=1m"]),
        ("mount", [None, b"/t", None, 0, None]),
    ]
    _fails(libc, "mount", errno.EBUSY)
    with pytest.raises(OSError) as ei:
        L.mount("a", "/b", "c", 0x21, "d")
    assert ei.value.errno == errno.EBUSY
    assert ei.value.strerror == f"mount('a', '/b', 'c', 0x21, 'd'): {os.strerror(errno.EBUSY)}"
    _fails(libc, "mount", errno.EBUSY, 1)
    with pytest.raises(OSError):
        L.mount("a", "/b", "c")


def test_syscall(libc: _Libc) -> None:
    libc.rc["syscall"] = 5
    assert L.syscall(39, 1, b"x") == 5
    assert libc.calls == [("syscall", [("c_long", 39), 1, b"x"])]
    libc.rc["syscall"] = 0
    assert L.syscall(1) == 0
    _fails(libc, "syscall", errno.ENOSYS)
    with pytest.raises(OSError) as ei:
        L.syscall(999)
    assert ei.value.errno == errno.ENOSYS and ei.value.strerror == os.strerror(errno.ENOSYS)


def test_syscall_real() -> None:
    assert L.syscall(39) == os.getpid()  # getpid on x86_64
    with pytest.raises(OSError) as ei:
        L.syscall(L.SYS_PIVOT_ROOT, b"/nonexistent-a", b"/nonexistent-b")
    assert ei.value.errno in (errno.ENOENT, errno.EPERM, errno.EINVAL)


def test_umount2_pivot_root(libc: _Libc) -> None:
    L.umount2("/m", 2)
    L.umount2("/n")
    L.pivot_root("/new", "/new/old")
    assert libc.calls == [
        ("umount2", [b"/m", ("c_int", 2)]),
        ("umount2", [b"/n", ("c_int", 0)]),
        ("syscall", [("c_long", 155), b"/new", b"/new/old"]),
    ]
    _fails(libc, "umount2", errno.EINVAL)
    with pytest.raises(OSError) as ei:
        L.umount2("/m")
    assert ei.value.strerror == f"umount2('/m'): {os.strerror(errno.EINVAL)}"
    _fails(libc, "syscall", errno.EBUSY)
    with pytest.raises(OSError) as ei:
        L.pivot_root("/a", "/b")
    assert ei.value.strerror == f"pivot_root('/a', '/b'): {os.strerror(errno.EBUSY)}"


def test_move_mount_idmap(libc: _Libc) -> None:
    L.move_mount(9, "/t")
    L.idmap_mount(4, 11)
    (n1, a1), (n2, a2) = libc.calls
    assert (n1, a1) == ("syscall", [("c_long", 429), 9, b"", ("c_int", -100), b"/t", ("c_uint", 4)])
    assert n2 == "syscall" and a2[:4] == [("c_long", 442), 4, b"", ("c_uint", 0x9000)]
    assert a2[4] == ("buf", struct.pack("=QQQQ", 0x00100000, 0, 0, 11))
    assert a2[5] == (type(ctypes.c_size_t(0)).__name__, 32)
    _fails(libc, "syscall", errno.EINVAL)
    with pytest.raises(OSError) as ei:
        L.move_mount(9, "/t")
    assert ei.value.strerror == f"move_mount(9, '/t'): {os.strerror(errno.EINVAL)}"
    with pytest.raises(OSError) as ei:
        L.idmap_mount(4, 11)
    assert ei.value.strerror == f"mount_setattr(MOUNT_ATTR_IDMAP): {os.strerror(errno.EINVAL)}"


def test_sethostname_prctl(libc: _Libc) -> None:
    L.sethostname("box")
    libc.rc["prctl"] = 3
    assert L.prctl(36, 1) == 3
    libc.rc["prctl"] = 0
    assert L.prctl(38) == 0
    assert libc.calls == [
        ("sethostname", [b"box", 3]),
        ("prctl", [36, 1, 0, 0, 0]),
        ("prctl", [38, 0, 0, 0, 0]),
    ]
    _fails(libc, "sethostname")
    with pytest.raises(OSError) as ei:
        L.sethostname("h")
    assert ei.value.strerror == f"sethostname('h'): {os.strerror(errno.EPERM)}"
    _fails(libc, "prctl", errno.EINVAL)
    with pytest.raises(OSError) as ei:
        L.prctl(1, 9)
    assert ei.value.strerror == f"prctl(1, 9): {os.strerror(errno.EINVAL)}"


def test_set_name_and_wrappers(libc: _Libc) -> None:
    L.set_name("tangram-reaper-and-more")
    L.set_no_new_privs()
    L.die_with_parent()
    L.install_filter("PROG")
    assert libc.calls == [
        (
            "prctl",
            [
                ("c_int", 15),
                ("buf", b"tangram-reaper-\0"),
                ("c_ulong", 0),
                ("c_ulong", 0),
                ("c_ulong", 0),
            ],
        ),
        ("prctl", [38, 1, 0, 0, 0]),
        ("prctl", [1, 9, 0, 0, 0]),
        ("prctl", [22, 2, "PROG", 0, 0]),
    ]
    _fails(libc, "prctl", errno.EACCES)
    with pytest.raises(OSError) as ei:
        L.set_name("n")
    assert ei.value.strerror == f"prctl(PR_SET_NAME, 'n'): {os.strerror(errno.EACCES)}"
    with pytest.raises(OSError) as ei:
        L.install_filter(None)
    assert ei.value.strerror == f"prctl(PR_SET_SECCOMP): {os.strerror(errno.EACCES)}"
    _fails(libc, "prctl", errno.EACCES, 1)
    with pytest.raises(OSError):
        L.install_filter(None)


def test_set_name_real() -> None:
    import threading

    out: list[str] = []

    def run() -> None:
        L.set_name("tangram-test-thread-x")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            out.append(f.read().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out == ["tangram-test-th"]


def test_write_proc(tmp_path: Any) -> None:
    p = tmp_path / "f"
    p.write_text("")
    assert L.write_proc(str(p), b"abc") is True and p.read_bytes() == b"abc"
    assert L.write_proc(str(tmp_path / "none"), b"x") is False
    assert L.write_proc("/proc/self/stat", b"x") is False  # read-only
    before = len(os.listdir("/proc/self/fd"))
    L.write_proc("/proc/self/stat", b"x")
    L.write_proc(str(p), b"y")
    assert len(os.listdir("/proc/self/fd")) == before


def test_scrub_exec_strings_in_a_child(tmp_path: Any) -> None:
    out = tmp_path / "out"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            L.scrub_exec_strings(b"tangram-x")
            with open("/proc/self/cmdline", "rb") as f:
                cmd = f.read()
            with open("/proc/self/environ", "rb") as f:
                env = f.read()
            out.write_bytes(
                cmd[:9] + b"|" + bytes([max(cmd[9:] or b"\0")]) + b"|" + bytes([max(env or b"\0")])
            )
        finally:
            os._exit(0)
    os.close(w)
    os.close(r)
    os.waitpid(pid, 0)
    got = out.read_bytes()
    assert got == b"tangram-x|\0|\0"


def test_share_file_ptes_counts() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            n = L.share_file_ptes()
            os.write(w, str(n).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    n = int(os.read(r, 64) or b"-1")
    os.close(r)
    assert n > 0


# --- /proc helpers with stand-ins --------------------------------------------------------------


class _MemLibc(_Libc):
    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.fail_at = fail_at

    def __getattr__(self, name: str) -> Any:
        if name == "mprotect":

            def mprotect(addr: Any, size: Any, prot: Any) -> int:
                self.calls.append(("mprotect", [addr.value, size.value, prot.value]))
                return -1 if addr.value == self.fail_at else 0

            return mprotect
        return super().__getattr__(name)


def _maps_open(monkeypatch: pytest.MonkeyPatch, path: str, text: Any) -> None:
    import builtins
    import io

    real = builtins.open

    def fake(p: Any, *a: Any, **kw: Any) -> Any:
        if p == path:
            return io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
        return real(p, *a, **kw)

    monkeypatch.setattr(L, "open", fake, raising=False)


def test_share_file_ptes_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    bufs = [ctypes.create_string_buffer(b"\x07" * 64) for _ in range(10)]
    at = [ctypes.addressof(b) for b in bufs]

    def line(i: int, perms: str, inode: str = "1234", path: str = "/usr/lib/x.so") -> str:
        return f"{at[i]:x}-{at[i] + 64:x} {perms} 00001000 08:01 {inode}    {path}"

    maps = (
        "\n".join(
            [
                line(0, "r-xp"),  # code: shared
                line(1, "r-xp", inode="0"),  # anonymous
                line(2, "r-xs"),  # a shared mapping
                line(3, "rw-p"),  # writable
                line(4, "r-xp", path="[vdso]"),
                line(5, "--xp"),  # not readable
                line(6, "r--p"),  # read-only data: shared too
                f"{at[7]:x}-{at[7] + 64:x} r-xp 00000000 00:00 0",  # five fields
                line(8, "r-xp"),  # mprotect refused
            ]
        )
        + "\n"
    )
    _maps_open(monkeypatch, "/proc/self/maps", maps)
    fake = _MemLibc(fail_at=at[8])
    monkeypatch.setattr(L, "_libc", fake)
    assert L.share_file_ptes() == 2
    assert fake.calls == [
        ("mprotect", [at[0], 64, 7]),
        ("mprotect", [at[0], 64, 5]),
        ("mprotect", [at[6], 64, 3]),
        ("mprotect", [at[6], 64, 1]),
        ("mprotect", [at[8], 64, 7]),
    ]
    assert bufs[0].raw == b"\x07" * 64 + b"\0"  # the byte written back as it was


def _stat(arg: int, arg_end: int, env: int, env_end: int) -> bytes:
    fields = ["S"] + ["0"] * 44 + [str(arg), str(arg_end), str(env), str(env_end), "0"]
    return ("1234 (py) thon) " + " ".join(fields) + "\n").encode()


def test_scrub_exec_strings_values(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ctypes.create_string_buffer(b"python\0-c\0code\0", 16)
    env = ctypes.create_string_buffer(b"A=1\0B=22\0", 10)
    a, e = ctypes.addressof(argv), ctypes.addressof(env)
    _maps_open(monkeypatch, "/proc/self/stat", _stat(a, a + 16, e, e + 10))
    fake = _Libc()
    monkeypatch.setattr(L, "_libc", fake)
    L.scrub_exec_strings(b"tangram")
    assert argv.raw == b"tangram" + b"\0" * 9
    assert env.raw == b"\0" * 10
    assert fake.calls == [
        ("prctl", [35, 9, ("c_ulong", a + 8), 0, 0]),
        ("prctl", [35, 11, ("c_ulong", e), 0, 0]),
    ]


def test_scrub_exec_strings_long_title_and_empty_env(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ctypes.create_string_buffer(b"abcdefgh", 8)
    a = ctypes.addressof(argv)
    e = a + 100
    _maps_open(monkeypatch, "/proc/self/stat", _stat(a, a + 8, e, e))
    fake = _Libc()
    monkeypatch.setattr(L, "_libc", fake)
    L.scrub_exec_strings(b"0123456789")
    assert argv.raw == b"0123456\0"  # at most n - 1 bytes: the last stays NUL
    assert fake.calls == [
        ("prctl", [35, 9, ("c_ulong", a + 8), 0, 0]),
        ("prctl", [35, 11, ("c_ulong", e), 0, 0]),
    ]


# --- the edges left by mutation testing (helper-59) ---------------------------------------------


def test_idmap_mount_refuses_a_negative_namespace_fd(libc: _Libc) -> None:
    with pytest.raises(struct.error):  # packed unsigned: no syscall with a -1 fd
        L.idmap_mount(4, -1)
    assert libc.calls == []


def test_share_file_ptes_unreadable_refused_and_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    bufs = [ctypes.create_string_buffer(b"\x07" * 64) for _ in range(4)]
    at = [ctypes.addressof(b) for b in bufs]

    def line(i: int, perms: str, path: str = "/usr/lib/x.so") -> str:
        return f"{at[i]:x}-{at[i] + 64:x} {perms} 00001000 08:01 1234    {path}"

    maps = "\n".join(
        [
            line(0, "---p"),  # no access at all: left alone
            line(1, "r-xp"),  # mprotect refused: the next ones are still done
            line(2, "r-xp", path="/opt/my lib/y.so"),  # a path with a space
            line(3, "r--p"),
        ]
    )
    _maps_open(monkeypatch, "/proc/self/maps", maps + "\n")
    fake = _MemLibc(fail_at=at[1])
    monkeypatch.setattr(L, "_libc", fake)
    assert L.share_file_ptes() == 2
    assert fake.calls == [
        ("mprotect", [at[1], 64, 7]),
        ("mprotect", [at[2], 64, 7]),
        ("mprotect", [at[2], 64, 5]),
        ("mprotect", [at[3], 64, 3]),
        ("mprotect", [at[3], 64, 1]),
    ]


def test_scrub_exec_strings_one_byte_and_empty_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    # an argument range of one byte is zeroed (no room for the title); an empty argument range
    # does not stop the environment's scrub
    argv = ctypes.create_string_buffer(b"QZZ", 3)
    env = ctypes.create_string_buffer(b"A=1\0", 4)
    a, e = ctypes.addressof(argv), ctypes.addressof(env)
    _maps_open(monkeypatch, "/proc/self/stat", _stat(a, a + 1, e, e + 4))
    monkeypatch.setattr(L, "_libc", _Libc())
    L.scrub_exec_strings(b"T")
    assert (argv.raw, env.raw) == (b"\0ZZ", b"\0" * 4)
    argv = ctypes.create_string_buffer(b"QZZ", 3)
    env = ctypes.create_string_buffer(b"A=1\0", 4)
    a, e = ctypes.addressof(argv), ctypes.addressof(env)
    _maps_open(monkeypatch, "/proc/self/stat", _stat(a, a, e, e + 4))
    L.scrub_exec_strings(b"T")
    assert (argv.raw, env.raw) == (b"QZZ", b"\0" * 4)


def test_scrub_exec_strings_writes_nothing_past_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ctypes.create_string_buffer(b"abcdefgh" + b"Z" * 8, 16)
    a = ctypes.addressof(argv)
    _maps_open(monkeypatch, "/proc/self/stat", _stat(a, a + 8, a + 100, a + 100))
    monkeypatch.setattr(L, "_libc", _Libc())
    L.scrub_exec_strings(b"0123456789abcdef")
    assert argv.raw == b"0123456\0" + b"Z" * 8
