"""Exact values of the writable layers (`images/layers.py`, issue 43): the loop device's flags,
the file system mkfs makes and the kernel mounts, the mount's flags, the store's budget and
reservations by the MiB, its warm pool, and the pure helpers (`fs_type`, `default_dir`,
`_mkfs`, `_sweep`, `prefix`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
from _cpu_helpers import layer_loops

from arl_tangram.managers.cpu.images import layers
from arl_tangram.managers.cpu.images.layers import Layer, LayerError, LayerStore

pytestmark = pytest.mark.needs_root

MiB = 1 << 20


@pytest.fixture
def tmp_disk():
    d = tempfile.mkdtemp(prefix="tangram-layers-v-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _wait_ready(st: LayerStore, n: int) -> None:
    deadline = time.monotonic() + 10
    while (len(st._ready) < n or st._refilling) and time.monotonic() < deadline:
        time.sleep(0.01)


# ---- the layer itself ------------------------------------------------------------------------


def test_a_layer_is_ext4_without_journal_or_reserve_on_an_autoclear_direct_io_loop(
    tmp_disk,
) -> None:
    st = LayerStore(tmp_disk, 8, warm=0)
    assert st.problem == "" and st.available
    lay = st.take(8)
    try:
        assert lay.mb == 8 and lay.fd >= 0
        loops = layer_loops(tmp_disk)
        assert list(loops.values()) == [8]  # the backing file: exactly the cap
        (name,) = loops
        with open(f"/sys/block/{name}/loop/autoclear") as f:
            assert f.read().strip() == "1"
        with open(f"/sys/block/{name}/loop/dio") as f:
            assert f.read().strip() == "1"
        import fcntl

        dfd = os.open(f"/dev/{name}", os.O_RDONLY)
        try:  # LOOP_GET_STATUS64: the labels and init words we set, all zero
            st64 = fcntl.ioctl(dfd, 0x4C05, bytes(232))
        finally:
            os.close(dfd)
        assert st64[44:52] == bytes(8) and st64[56:232] == bytes(176)
        assert int.from_bytes(st64[52:56], "little") & 4  # autoclear
        info = subprocess.run(
            ["dumpe2fs", "-h", f"/dev/{name}"], capture_output=True, text=True
        ).stdout
        feats = next(x for x in info.splitlines() if x.startswith("Filesystem features:"))
        assert "has_journal" not in feats.split()
        assert "Reserved block count:     0" in info
        assert "Block count:              8192" in info  # 8 MiB of 1 KiB blocks
        with open(f"/proc/fs/ext4/{name}/options") as f:
            opts = f.read().split()
        assert "noinit_itable" in opts and "rw" in opts
        flags = os.fstatvfs(lay.fd).f_flag
        assert flags & os.ST_NOSUID and flags & os.ST_NODEV
        assert not flags & os.ST_RDONLY and not flags & os.ST_NOEXEC
        assert os.get_inheritable(lay.fd) is False
        assert os.listdir(tmp_disk) == []  # the backing file is unlinked
        # a write past the cap fails inside the layer
        fd = os.open("big", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=lay.fd)
        try:
            with pytest.raises(OSError) as e:
                for _ in range(16):
                    os.write(fd, bytes(MiB))
            assert e.value.errno == 28
        finally:
            os.close(fd)
    finally:
        lay.close()
        st.give_back(8)
        st.close()
    assert lay.fd == -1
    lay.close()  # twice: nothing to do
    assert lay.fd == -1
    deadline = time.monotonic() + 5
    while layer_loops(tmp_disk) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert layer_loops(tmp_disk) == {}


def test_layer_close_forgets_an_fd_already_closed() -> None:
    r, w = os.pipe()
    os.close(w)
    lay = Layer(r, 4)
    os.close(r)
    lay.close()  # EBADF swallowed
    assert lay.fd == -1


def test_the_loop_is_configured_without_direct_io_where_the_disk_refuses_it(monkeypatch) -> None:
    seen = []

    def ioctl(dev, req, arg):
        flags = int.from_bytes(arg[8 + 52 : 8 + 56], "little")
        seen.append((dev, req, len(arg), int.from_bytes(arg[:4], "little"), flags))
        if flags & 16:
            raise OSError(22, "EINVAL")
        return 0

    monkeypatch.setattr(layers.fcntl, "ioctl", ioctl)
    assert layers._loop_configure(7, 9) is True
    # struct loop_config: fd, block_size, loop_info64 (232 bytes), reserved[8] (64): 304 bytes
    assert seen == [(7, 0x4C0A, 304, 9, 4 | 16), (7, 0x4C0A, 304, 9, 4)]


def test_a_loop_taken_first_by_another_is_no_error_and_a_refusal_without_direct_io_is(
    monkeypatch,
) -> None:
    calls = []

    def busy(dev, req, arg):
        calls.append(1)
        raise OSError(16, "EBUSY")

    monkeypatch.setattr(layers.fcntl, "ioctl", busy)
    assert layers._loop_configure(3, 4) is False
    assert calls == [1]

    def refuse(dev, req, arg):
        raise OSError(22, "EINVAL")

    monkeypatch.setattr(layers.fcntl, "ioctl", refuse)
    with pytest.raises(OSError) as e:
        layers._loop_configure(3, 4)
    assert e.value.errno == 22


def test_loop_attach_tries_sixteen_free_devices_then_says_ebusy(monkeypatch, tmp_disk) -> None:
    path = os.path.join(tmp_disk, "b")
    with open(path, "wb") as f:
        f.truncate(MiB)
    tries = []
    monkeypatch.setattr(layers, "_loop_configure", lambda dev, backing: tries.append(dev) or False)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        layers._loop_attach(path)
    assert e.value.errno == 16 and e.value.strerror == "no free loop device (16 tries)"
    assert len(tries) == 16
    assert set(os.listdir("/proc/self/fd")) == before  # every device and the backing closed


def test_loop_attach_closes_the_device_when_configuring_raises(monkeypatch, tmp_disk) -> None:
    path = os.path.join(tmp_disk, "b")
    with open(path, "wb") as f:
        f.truncate(MiB)

    def boom(dev, backing):
        raise OSError(5, "EIO")

    monkeypatch.setattr(layers, "_loop_configure", boom)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        layers._loop_attach(path)
    assert e.value.errno == 5
    assert set(os.listdir("/proc/self/fd")) == before


def test_the_attached_fd_is_close_on_exec(tmp_disk) -> None:
    path = os.path.join(tmp_disk, "b")
    with open(path, "wb") as f:
        f.truncate(4 * MiB)
    dev = layers._loop_attach(path)
    try:
        assert os.get_inheritable(dev) is False
        assert os.readlink(f"/proc/self/fd/{dev}").startswith("/dev/loop")
    finally:
        os.close(dev)
        os.unlink(path)


# ---- where layers go -------------------------------------------------------------------------


def _mountinfo(monkeypatch, text: str) -> None:
    import builtins
    import io

    real = builtins.open

    def fake(p, *a, **k):
        if p == "/proc/self/mountinfo":
            return io.StringIO(text)
        return real(p, *a, **k)

    monkeypatch.setattr(builtins, "open", fake)
    monkeypatch.setattr(layers.os.path, "realpath", lambda p: p)


MI = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "23 22 0:5 / /srv rw - xfs /dev/sdb rw\n"
    "24 23 0:6 / /srv/my\\040dir rw - tmpfs tmpfs rw\n"
    "25 23 0:7 / /srv/a rw - btrfs /dev/sdc rw\n"
)


def test_fs_type_takes_the_longest_mount_point_above_the_path(monkeypatch) -> None:
    _mountinfo(monkeypatch, MI)
    assert layers.fs_type("/srv/my dir/x") == "tmpfs"  # "\040" read as a space
    assert layers.fs_type("/srv/my dir") == "tmpfs"  # the mount point itself
    assert layers.fs_type("/srv/my dirx") == "xfs"  # a prefix of the name is not inside
    assert layers.fs_type("/srv/a") == "btrfs"
    assert layers.fs_type("/srv") == "xfs"
    assert layers.fs_type("/srvx") == "ext4"
    assert layers.fs_type("/") == "ext4"
    # the order of the lines does not matter: the longest wins
    _mountinfo(monkeypatch, "".join(reversed(MI.splitlines(True))))
    assert layers.fs_type("/srv/my dir/x") == "tmpfs"
    assert layers.fs_type("/srv/b") == "xfs"


def test_fs_type_of_a_bad_table_is_empty(monkeypatch) -> None:
    _mountinfo(monkeypatch, "22 1 8:1 /\n")
    assert layers.fs_type("/x") == ""
    _mountinfo(monkeypatch, "22 1 8:1 / /x rw - \n")  # no type after the separator
    assert layers.fs_type("/x") == ""


def test_fs_type_of_an_unreadable_table_is_empty(monkeypatch) -> None:
    import builtins

    real = builtins.open

    def fake(p, *a, **k):
        if p == "/proc/self/mountinfo":
            raise PermissionError(13, "no")
        return real(p, *a, **k)

    monkeypatch.setattr(builtins, "open", fake)
    assert layers.fs_type("/") == ""


def test_fs_type_resolves_links_and_the_real_table() -> None:
    d = tempfile.mkdtemp(prefix="tangram-layers-v-", dir="/dev/shm")
    link = tempfile.mktemp(prefix="tangram-layers-l-", dir="/var/tmp")
    os.symlink(d, link)
    try:
        assert layers.fs_type(link) == "tmpfs"
        assert layers.default_dir(link) == "/var/tmp/arl-tangram/layers"
    finally:
        os.unlink(link)
        os.rmdir(d)


def test_default_dir_by_file_system(monkeypatch) -> None:
    for kind, want in (
        ("tmpfs", layers.FALLBACK_DIR),
        ("ramfs", layers.FALLBACK_DIR),
        ("ext4", "/w/layers"),
        ("", "/w/layers"),
    ):
        monkeypatch.setattr(layers, "fs_type", lambda p, k=kind: k)
        assert layers.default_dir("/w") == want
    assert layers.FALLBACK_DIR == "/var/tmp/arl-tangram/layers"
    assert layers.MEMORY_FS == ("tmpfs", "ramfs")
    assert layers.MIN_LAYER_MB == 4


def test_mkfs_is_found_on_path_else_in_sbin(monkeypatch) -> None:
    monkeypatch.setattr(
        layers.shutil, "which", lambda n: "/opt/x/mkfs.ext4" if n == "mkfs.ext4" else None
    )
    assert layers._mkfs() == "/opt/x/mkfs.ext4"
    monkeypatch.setattr(layers.shutil, "which", lambda n: None)
    asked = []

    def access(p, mode):
        asked.append((p, mode))
        return p == "/sbin/mkfs.ext4"

    monkeypatch.setattr(layers.os, "access", access)
    assert layers._mkfs() == "/sbin/mkfs.ext4"
    assert asked == [("/usr/sbin/mkfs.ext4", os.X_OK), ("/sbin/mkfs.ext4", os.X_OK)]
    monkeypatch.setattr(layers.os, "access", lambda p, mode: p == "/usr/sbin/mkfs.ext4")
    assert layers._mkfs() == "/usr/sbin/mkfs.ext4"
    monkeypatch.setattr(layers.os, "access", lambda p, mode: False)
    assert layers._mkfs() is None


# ---- the store -------------------------------------------------------------------------------


def _bare(
    monkeypatch, d: str, budget: int = 0, *, free: int = 0, total: int = 0, warm: int = 2
) -> LayerStore:
    """A store whose probe makes no layer (an in-memory stand-in)."""
    monkeypatch.setattr(LayerStore, "_probe", lambda self: "")
    if total:
        monkeypatch.setattr(
            layers.shutil, "disk_usage", lambda p: SimpleNamespace(free=free, total=total)
        )
    return LayerStore(d, 16, budget, warm=warm)


def test_the_default_budget_is_the_free_space_less_a_tenth_of_the_disk(
    monkeypatch, tmp_disk
) -> None:
    st = _bare(monkeypatch, tmp_disk, free=600 * MiB + 5, total=1000 * MiB)
    assert st.budget_mb == 500
    st = _bare(monkeypatch, tmp_disk, free=100 * MiB + MiB - 1, total=10 * MiB)
    assert st.budget_mb == 99  # (100 MiB + 1 MiB - 1 - 1 MiB) >> 20
    st = _bare(monkeypatch, tmp_disk, free=50 * MiB, total=1000 * MiB)
    assert st.budget_mb == 0  # never negative
    st = _bare(monkeypatch, tmp_disk, 77, free=50 * MiB, total=1000 * MiB)
    assert st.budget_mb == 77  # a budget given wins
    assert (st.dir, st.default_mb, st.warm, st.used_mb, st.problem) == (tmp_disk, 16, 2, 0, "")
    assert st.reserved == {} and st.held == {}


def test_the_layer_directory_is_made_0700(monkeypatch, tmp_disk) -> None:
    d = os.path.join(tmp_disk, "a", "b")
    st = _bare(monkeypatch, d)
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert st.problem == ""


def test_a_directory_that_cannot_be_made_is_the_problem_and_no_budget(
    monkeypatch, tmp_disk
) -> None:
    f = os.path.join(tmp_disk, "file")
    open(f, "w").close()
    d = os.path.join(f, "sub")
    st = _bare(monkeypatch, d)
    assert st.problem.startswith(f"layer directory {d}: [Errno 20] Not a directory")
    assert st.budget_mb == 0 and st.available is False
    with pytest.raises(LayerError) as e:
        st.take(16)
    assert str(e.value) == f"no disk layers on this node: {st.problem}"


def test_a_directory_in_memory_is_named_with_its_file_system(monkeypatch) -> None:
    d = tempfile.mkdtemp(prefix="tangram-layers-v-", dir="/dev/shm")
    try:
        st = LayerStore(d, 16, warm=0)
        assert st.problem == f"layer directory {d} is on tmpfs (memory)"
        assert st._ready == []
    finally:
        os.rmdir(d)


def test_the_probe_says_what_is_missing(monkeypatch, tmp_disk) -> None:
    monkeypatch.setattr(layers, "_mkfs", lambda: None)
    st = LayerStore(tmp_disk, 16, warm=0)
    assert st.problem == "mkfs.ext4 not found (install e2fsprogs)"
    monkeypatch.undo()
    real = os.path.exists
    monkeypatch.setattr(layers.os.path, "exists", lambda p: p != "/dev/loop-control" and real(p))
    st = LayerStore(tmp_disk, 16, warm=0)
    assert st.problem == "no /dev/loop-control (loop devices)"
    monkeypatch.undo()

    def bad(self, mb):
        raise subprocess.CalledProcessError(1, ["mkfs"])

    monkeypatch.setattr(LayerStore, "_make", bad)
    st = LayerStore(tmp_disk, 16, warm=0)
    assert (
        st.problem
        == "cannot make a disk layer: Command '['mkfs']' returned non-zero exit status 1."
    )
    monkeypatch.undo()
    st = LayerStore(tmp_disk, 16, warm=0)
    try:
        assert st.problem == "" and [x.mb for x in st._ready] == [16]  # the probe's ready layer
    finally:
        st.close()
    assert st._ready == []


def test_sweep_removes_only_backing_files_of_dead_processes(monkeypatch, tmp_disk) -> None:
    dead = 4_000_000  # above pid_max
    names = [
        f"{dead}-ab-0.ext4",
        f"{os.getpid()}-ab-1.ext4",
        f"{dead}-ab-2.img",
        "x-ab-3.ext4",
        f"{dead}.ext4",
    ]
    for n in names:
        open(os.path.join(tmp_disk, n), "w").close()
    _bare(monkeypatch, tmp_disk)
    assert sorted(os.listdir(tmp_disk)) == sorted(names[1:])  # "<dead>.ext4": no "<pid>-"


def test_prefix_names_the_process_and_the_store(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk)
    assert st.prefix == f"{os.getpid()}-{id(st):x}-"


def test_make_names_its_backing_file_with_the_prefix_and_a_count(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, warm=0)
    made = []

    def run(argv, **kw):
        made.append((argv, kw, os.path.getsize(argv[-1])))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(layers.subprocess, "run", run)
    monkeypatch.setattr(layers, "_loop_attach", lambda p: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(layers, "_fsmount_ext4", lambda dev: 99)
    a = st._make(5)
    b = st._make(6)
    assert (a.fd, a.mb, b.mb) == (99, 5, 6)
    (argv0, kw0, size0), (argv1, _, size1) = made
    assert argv0 == [
        st._mkfs,
        "-q",
        "-F",
        "-O",
        "^has_journal",
        "-m",
        "0",
        "-E",
        "lazy_itable_init=1,nodiscard",
        os.path.join(tmp_disk, f"{st.prefix}0.ext4"),
    ]
    assert argv1[-1] == os.path.join(tmp_disk, f"{st.prefix}1.ext4")
    assert kw0 == {"check": True, "capture_output": True, "timeout": 60}
    assert (size0, size1) == (5 * MiB, 6 * MiB)
    assert os.listdir(tmp_disk) == []


def test_reserve_keeps_positive_shares_and_refuses_more_than_the_budget(
    monkeypatch, tmp_disk
) -> None:
    st = _bare(monkeypatch, tmp_disk, 100)
    st.reserve({"a": 60, "b": 0, 7: "40", "c": -3})
    assert st.reserved == {"a": 60, "7": 40}
    with pytest.raises(ValueError) as e:
        st.reserve({"a": 60, "b": 41})
    assert str(e.value) == (
        "layer reservations of 101 MiB in all exceed the node's layer budget of 100 MiB"
    )
    assert st.reserved == {"a": 60, "7": 40}
    st.reserve({"a": 100})
    assert st.reserved == {"a": 100}


def _fake_make(monkeypatch) -> list[int]:
    made: list[int] = []

    def make(self, mb):
        made.append(mb)
        return Layer(-1, mb)

    monkeypatch.setattr(LayerStore, "_make", make)
    return made


def test_take_counts_each_owner_and_keeps_reservations_of_others(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 100, warm=0)
    made = _fake_make(monkeypatch)
    st.reserve({"a": 30, "b": 20})
    assert st._kept_for_others("a") == 20 and st._kept_for_others("c") == 50
    assert st._kept_for_others(None) == 50
    x = st.take(40, "c")  # 40 + 50 kept <= 100
    assert (x.mb, st.used_mb, st.held) == (40, 40, {"c": 40})
    with pytest.raises(LayerError) as e:
        st.take(11, "c")  # 40 + 50 + 11 > 100
    assert str(e.value) == (
        "the node's layer budget is spent: 40 of 100 MiB held by open layers, "
        "50 MiB kept for other tenants below their reservation, 11 MiB asked"
    )
    st.take(10, "c")  # exactly the budget
    assert (st.used_mb, st.held) == (50, {"c": 50})
    st.take(25, "a")
    assert st._kept_for_others("b") == 5 and st._kept_for_others("c") == 25
    st.take(5, "a")
    assert st._kept_for_others("c") == 20 and st.held == {"c": 50, "a": 30}
    with pytest.raises(LayerError) as e:
        st.take(6, "a")  # past its reservation: b's 20 stay kept
    assert str(e.value) == (
        "the node's layer budget is spent: 80 of 100 MiB held by open layers, "
        "20 MiB kept for other tenants below their reservation, 6 MiB asked"
    )
    st.take(20, "b")  # a is at its reservation: nothing kept from b
    assert st._kept_for_others("b") == 0 and st.used_mb == 100
    with pytest.raises(LayerError) as e:
        st.take(4)
    assert (
        str(e.value)
        == "the node's layer budget is spent: 100 of 100 MiB held by open layers, 4 MiB asked"
    )
    assert made == [40, 10, 25, 5, 20]
    st.give_back(5, "a")
    assert st.held == {"c": 50, "a": 25, "b": 20}
    st.give_back(25, "a")
    assert st.held == {"c": 50, "b": 20} and st.used_mb == 70
    st.give_back(10, "c")
    assert st.held == {"c": 40, "b": 20} and st.used_mb == 60
    st.give_back(10, "zz")  # an owner with nothing held
    assert st.held == {"c": 40, "b": 20} and st.used_mb == 50
    st.give_back(50)
    assert st.used_mb == 0 and st.held == {"c": 40, "b": 20}
    st.give_back(40, "c")
    assert st.used_mb == 0 and st.held == {"b": 20}


def test_take_sizes_and_the_budget_edge(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 20, warm=0)
    made = _fake_make(monkeypatch)
    assert st.take().mb == 16  # the store's default
    assert st.held == {}
    with pytest.raises(LayerError) as e:
        st.take(0)  # 0: the default, 16 more: over
    assert str(e.value).endswith("16 of 20 MiB held by open layers, 16 MiB asked")
    assert st.take(4).mb == 4  # 16 + 4 == 20: fits
    with pytest.raises(LayerError) as e:
        st.take(3)
    assert str(e.value) == "layer_mb must be at least 4, got 3"
    assert made == [16, 4] and st.used_mb == 20


def test_a_layer_that_cannot_be_made_is_given_back_and_named(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 100, warm=0)

    def bad(self, mb):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LayerStore, "_make", bad)
    with pytest.raises(LayerError) as e:
        st.take(8, "t")
    assert str(e.value) == "cannot make a 8 MiB disk layer: [Errno 28] No space left on device"
    assert isinstance(e.value.__cause__, OSError)
    assert st.used_mb == 0 and st.held == {}


def test_a_ready_layer_of_the_size_is_handed_out_first(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 100, warm=0)
    made = _fake_make(monkeypatch)
    r8, r16 = Layer(-1, 8), Layer(-1, 16)
    st._ready = [r8, r16]
    assert st.take(16) is r16 and st._ready == [r8]
    assert st.take(12).mb == 12 and made == [12]
    assert st.take(8) is r8 and st._ready == []


def test_refill_keeps_warm_ready_layers_of_the_default_size(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=3)
    made = _fake_make(monkeypatch)
    names = []
    real = threading.Thread

    def thread(*a, **k):
        names.append((k.get("name"), k.get("daemon")))
        return real(*a, **k)

    monkeypatch.setattr(layers.threading, "Thread", thread)
    st.take(8)
    _wait_ready(st, 3)
    assert [x.mb for x in st._ready] == [16, 16, 16] and made == [8, 16, 16, 16]
    assert names == [("tangram-layers", True)]
    assert st._refilling is False
    st.refill()  # full: no thread
    assert names == [("tangram-layers", True)]
    st.take(16)
    _wait_ready(st, 3)
    assert len(st._ready) == 3 and made == [8, 16, 16, 16, 16]
    st.close()
    assert st._ready == [] and st._closed
    st.refill()
    assert len(names) == 2


def test_refill_runs_once_at_a_time(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=2)
    started = []
    monkeypatch.setattr(
        layers.threading, "Thread", lambda **k: SimpleNamespace(start=lambda: started.append(k))
    )
    st.refill()
    st.refill()
    assert len(started) == 1 and st._refilling is True


def test_refill_stops_when_a_layer_cannot_be_made_and_can_run_again(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=2)
    n = []

    def bad(self, mb):
        n.append(mb)
        raise subprocess.SubprocessError("x")

    monkeypatch.setattr(LayerStore, "_make", bad)
    st._refilling = True
    st._refill()
    assert n == [16] and st._refilling is False and st._ready == []


def test_a_refill_finishing_after_close_closes_its_layer(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=2)
    r, w = os.pipe()
    os.close(w)

    def make(self, mb):
        self._closed = True  # the store closes while the layer is made
        return Layer(r, mb)

    monkeypatch.setattr(LayerStore, "_make", make)
    st._refill()
    assert st._ready == [] and st._refilling is False
    with pytest.raises(OSError):
        os.fstat(r)  # closed


def test_a_closed_store_makes_no_more(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=2)
    made = _fake_make(monkeypatch)
    st.close()
    st._refill()
    assert made == [] and st._refilling is False


def test_close_closes_the_ready_layers(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 1000, warm=0)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]
    st._ready = [Layer(fds[0], 16), Layer(fds[1], 16)]
    ready = list(st._ready)
    st.close()
    assert [x.fd for x in ready] == [-1, -1] and st._ready == []
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_fs_type_of_a_path_under_no_mount_point_is_empty(monkeypatch) -> None:
    _mountinfo(monkeypatch, "23 22 0:5 / /srv rw - xfs /dev/sdb rw\n")
    assert layers.fs_type("/other") == ""


def test_fs_type_does_not_strip_more_than_a_slash(monkeypatch) -> None:
    _mountinfo(monkeypatch, MI + "26 23 0:8 / /srv/boX rw - ext2 /dev/sdd rw\n")
    assert layers.fs_type("/srv/bo/f") == "xfs"
    assert layers.fs_type("/srv/boX/f") == "ext2"


def test_fs_type_of_a_covered_mount_point_is_the_top_mount(monkeypatch) -> None:
    """Two mounts on one point: the later (listed last in mountinfo, the visible one) names the
    file system."""
    _mountinfo(monkeypatch, MI + "27 23 0:9 / /srv rw - tmpfs tmpfs rw\n")
    assert layers.fs_type("/srv/x") == "tmpfs"


def test_store_defaults_and_a_budget_of_one(monkeypatch, tmp_disk) -> None:
    monkeypatch.setattr(LayerStore, "_probe", lambda self: "")
    st = LayerStore(tmp_disk, 16)
    assert st.warm == 2 and st.budget_mb > 1
    st = LayerStore(tmp_disk, 16, budget_mb=1)
    assert st.budget_mb == 1


def test_a_reservation_of_one_mib_is_kept(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 10)
    st.reserve({"a": 1})
    assert st.reserved == {"a": 1}


def test_sweep_survives_what_it_cannot_remove(monkeypatch, tmp_disk) -> None:
    os.mkdir(os.path.join(tmp_disk, "4000000-ab-0.ext4"))  # a directory: unlink fails
    st = _bare(monkeypatch, tmp_disk)
    assert st.problem == "" and os.listdir(tmp_disk) == ["4000000-ab-0.ext4"]


def test_give_back_keeps_an_owner_left_with_one_mib(monkeypatch, tmp_disk) -> None:
    st = _bare(monkeypatch, tmp_disk, 100, warm=0)
    _fake_make(monkeypatch)
    st.take(5, "o")
    st.give_back(4, "o")
    assert st.held == {"o": 1} and st.used_mb == 1
