"""Cgroup slots (`managers/cpu/host/cgroups.py`): every limit written is read back from the
kernel's files and asserted exactly (issue 43).

On cgroup v1 (this host; each test makes its own cgroups and removes them): CPU quota
(``cpu.cfs_quota_us``: cores x 100 000 µs, at least 1000), CPU weight (``cpu.shares``: 1024 x
fraction, at least 2), memory (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``
equal, raised and lowered), ``pids.max``; the counters (CPU time, peak memory, OOM kills, pids)
a process in the slot moves, their resets, reclaim, emptiness; a manager's tree (its paths, the
directory's weight of one task per core, slots ``s1``, ``s2``..., removal). cgroup v2's files are
plain files here (this host's v2 has no controllers): what is written to each, as the kernel
would read it. The stale-tree clean-up's choices (which trees are a dead manager's, what is
retried, what is left and logged) on plain directories.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.host import cgroups
from arl_tangram.managers.cpu.host.cgroups import CgroupTree, Slot, squeezed_cpus

MiB = 1 << 20
V1 = "/sys/fs/cgroup"
CTRLS = ("cpu", "cpuacct", "memory", "pids")


def _r(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _v1_ok() -> bool:
    return (
        os.geteuid() == 0
        and all(os.path.isdir(f"{V1}/{c}") for c in CTRLS)
        and os.path.exists(f"{V1}/memory/memory.memsw.limit_in_bytes")
    )


needs_v1 = pytest.mark.skipif(
    not _v1_ok(),
    reason="needs root and cgroup v1 cpu, cpuacct, memory (with swap accounting), pids",
)


@pytest.fixture
def v1() -> Iterator[Slot]:
    """A slot of real v1 cgroups, one per controller, removed after the test."""
    name = f"t39-{uuid.uuid4().hex[:8]}"
    dirs = {c: f"{V1}/{c}/{name}" for c in CTRLS}
    for d in dirs.values():
        os.mkdir(d)
    slot = Slot(name, "v1", dirs)
    try:
        yield slot
    finally:
        for fd in slot._fds.values():  # (not `slot.close()`: a mutant of it must not leak these)
            with contextlib.suppress(OSError):
                os.close(fd)
        for d in dirs.values():
            with contextlib.suppress(FileNotFoundError):
                for p in _r(f"{d}/cgroup.procs").split():
                    with contextlib.suppress(OSError):
                        os.kill(int(p), signal.SIGKILL)
            for _ in range(200):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _child(code: str) -> subprocess.Popen[bytes]:
    """A Python child that waits for a line on stdin before running ``code``."""
    return subprocess.Popen(
        [sys.executable, "-S", "-c", "import sys\nsys.stdin.readline()\n" + code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def _go(p: subprocess.Popen[bytes]) -> bytes:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()
    return p.stdout.readline()


def _end(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        p.kill()
    p.wait()
    for f in (p.stdin, p.stdout):
        if f is not None:
            f.close()


# --- limits, v1 ------------------------------------------------------------------------------


@needs_v1
def test_v1_cpu_quota_is_cores_times_the_period(v1: Slot) -> None:
    cpu = v1.dirs["cpu"]
    assert _r(f"{cpu}/cpu.cfs_period_us") == "100000"
    for cores, quota in (
        (1.0, 100_000),
        (2.5, 250_000),
        (0.25, 25_000),
        (0.01, 1000),
        (0.0104, 1040),
        (0.001, 1000),
        (0.0, 1000),
    ):
        v1.set_cpu(cores)
        assert int(_r(f"{cpu}/cpu.cfs_quota_us")) == quota, cores
        assert v1.cpu == cores
    assert set(v1._fds) == {f"w:{cpu}/cpu.cfs_quota_us"}  # one fd kept, reused


@needs_v1
def test_v1_weight_memory_and_pids(v1: Slot) -> None:
    cpu, mem, pids = v1.dirs["cpu"], v1.dirs["memory"], v1.dirs["pids"]
    for fraction, shares in (
        (1.0, 1024),
        (0.25, 256),
        (3.0, 3072),
        (0.0019, 2),
        (0.0, 2),
        (0.0029, 2),
        (0.003, 3),
    ):
        v1.set_weight(fraction)
        assert int(_r(f"{cpu}/cpu.shares")) == shares, fraction
        assert v1.weight == fraction
    for limit in (256 * MiB, 512 * MiB, 64 * MiB, 300 * MiB):  # up, down, up
        v1.set_memory(limit)
        assert int(_r(f"{mem}/memory.limit_in_bytes")) == limit
        assert int(_r(f"{mem}/memory.memsw.limit_in_bytes")) == limit
        assert v1.memory == limit
    for n in (64, 1, 4096):
        v1.set_pids(n)
        assert _r(f"{pids}/pids.max") == str(n)
        assert v1.pids == n


@needs_v1
def test_v1_memory_without_swap_accounting(v1: Slot, monkeypatch: pytest.MonkeyPatch) -> None:
    mem = v1.dirs["memory"]
    sw = f"{mem}/memory.memsw.limit_in_bytes"
    before = _r(sw)
    real = os.path.exists
    monkeypatch.setattr(cgroups.os.path, "exists", lambda p: p != sw and real(p))
    v1.set_memory(128 * MiB)
    assert int(_r(f"{mem}/memory.limit_in_bytes")) == 128 * MiB
    assert _r(sw) == before  # (not written: as where the kernel has no memsw)
    assert v1.memory == 128 * MiB


@needs_v1
def test_v1_a_failed_memory_write_leaves_the_limit_unknown(v1: Slot) -> None:
    v1.set_memory(64 * MiB)
    with pytest.raises(OSError):
        v1.set_memory(-5)  # (the kernel refuses it in both orders)
    assert v1.memory == -1


# --- limits, v2 (plain files) ----------------------------------------------------------------


def _v2(
    d: Path,
    files: tuple[str, ...] = ("cpu.max", "cpu.weight", "memory.max", "memory.swap.max", "pids.max"),
) -> Slot:
    for f in files:
        (d / f).write_text("")
    return Slot("s", "v2", dict.fromkeys(("cpu", "memory", "pids"), str(d)))


@pytest.mark.parametrize("cores,quota", [(1.0, 100_000), (2.5, 250_000), (0.001, 1000)])
def test_v2_cpu_max_is_quota_and_period(tmp_path: Path, cores: float, quota: int) -> None:
    s = _v2(tmp_path)
    try:
        s.set_cpu(cores)
        assert (tmp_path / "cpu.max").read_text() == f"{quota} 100000"
        assert s.cpu == cores
        s.set_weight(0.001)
        assert (tmp_path / "cpu.weight").read_text() == "1"
        s.set_weight(0.019)
        assert (tmp_path / "cpu.weight").read_text() == "1"
        s.set_pids(7)
        assert (tmp_path / "pids.max").read_text() == "7"
    finally:
        s.close()


def test_v2_memory_without_a_swap_file(tmp_path: Path) -> None:
    s = _v2(tmp_path, ("memory.max",))
    try:
        s.set_memory(5 * MiB)
        assert (tmp_path / "memory.max").read_text() == str(5 * MiB)
        assert not (tmp_path / "memory.swap.max").exists()
        assert s.memory == 5 * MiB
    finally:
        s.close()


def test_v2_counters_from_plain_files(tmp_path: Path) -> None:
    for f, text in (
        ("cpu.stat", "nr_periods 3\nusage_usec 2500\nuser_usec 2000\n"),
        ("memory.current", "8192\n"),
        ("memory.peak", "12288\n"),
        ("memory.events", "low 0\noom 3\noom_kill 2\noom_group_kill 9\n"),
    ):
        (tmp_path / f).write_text(text)
    s = _v2(tmp_path)
    try:
        assert s._cpu_ns() == 2_500_000
        assert s.charged_bytes() == 8192
        assert s.oom_kills(raw=True) == 2
        s.oom_base = 1
        assert s.oom_kills() == 1
        assert s.oom_kills(raw=True) == 2  # (raw: the kernel's count, no base taken off)
        s.cpu_base_ns = 500_000
        assert s.cpu_seconds() == 0.002
        assert s.peak_memory_mb() == 12288 / MiB
        s.peak_sticky = True
        assert s.peak_memory_mb() == 12288 / MiB
        (tmp_path / "cpu.stat").write_text("nr_periods 3\n")
        s.close()
        assert s._cpu_ns() == 0
        (tmp_path / "memory.peak").write_text("x")
        s.close()
        assert s.peak_memory_mb() is None
    finally:
        s.close()


def test_v2_reset_stats_and_samples(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 7\n")
    (tmp_path / "memory.current").write_text("100\n")
    (tmp_path / "memory.peak").write_text("300\n")
    (tmp_path / "memory.events").write_text("oom_kill 4\n")
    s = _v2(tmp_path)
    try:
        s.reset_stats()  # (a plain file takes "reset": the kernel >= 6.12 would reset it)
        assert not s.peak_sticky
        assert (tmp_path / "memory.peak").read_text() == "reset\n"
        assert (s.cpu_base_ns, s.oom_base) == (7000, 4)
        s.reset_stats()  # again: the base is the kernel's count, not what is new since
        assert (s.cpu_base_ns, s.oom_base) == (7000, 4)
        # the first sample starts from now: the peak is what is charged
        assert s.memory_sample() == (100, 100)
        (tmp_path / "memory.peak").write_text("500\n")
        assert s.memory_sample() == (100, 500)
        assert (tmp_path / "memory.peak").read_text() == "reset\n"  # reset, on its own fd
        (tmp_path / "memory.peak").write_text("50\n")
        assert s.memory_sample() == (100, 100)
        assert (tmp_path / "memory.peak").read_text() == "reset\n"
        (tmp_path / "memory.peak").write_text("junk\n")
        assert s.memory_sample() == (100, 100)
        assert s.reclaim() == 0
        assert (tmp_path / "memory.reclaim").exists() is False  # (no file: suppressed)
        (tmp_path / "memory.reclaim").write_text("")
        assert s.reclaim() == 0
        assert (tmp_path / "memory.reclaim").read_text() == "100"
    finally:
        s.close()


def test_v2_sticky_peak_is_read_not_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 1\n")
    (tmp_path / "memory.current").write_text("100\n")
    (tmp_path / "memory.peak").write_text("300\n")
    s = _v2(tmp_path)
    real = os.pwrite

    def pwrite(fd: int, data: bytes, off: int) -> int:
        if data == b"reset\n":
            raise OSError(22, "Invalid argument")  # (a kernel < 6.12)
        return real(fd, data, off)

    monkeypatch.setattr(cgroups.os, "pwrite", pwrite)
    try:
        s.reset_stats()
        assert s.peak_sticky
        assert (s.cpu_base_ns, s.oom_base) == (1000, 0)  # (no memory.events: 0)
        assert s.memory_sample() == (100, 100)  # the first read: no change known yet
        assert s.sampled_peak == 300
        assert s.memory_sample() == (100, 100)  # unchanged: what is charged now
        (tmp_path / "memory.peak").write_text("400\n")
        assert s.memory_sample() == (100, 400)  # changed since: reached since
        (tmp_path / "memory.peak").write_text("40\n")
        assert s.memory_sample() == (100, 100)
        assert (tmp_path / "memory.peak").read_text() == "40\n"  # never reset
        (tmp_path / "memory.peak").write_text("0\n")
        assert s.memory_sample() == (100, 100)
        assert s.sampled_peak == 0
        (tmp_path / "memory.peak").write_text("400\n")
        assert s.memory_sample() == (100, 400)  # (changed since a peak of 0: counts too)
    finally:
        s.close()


# --- counters, v1 ----------------------------------------------------------------------------


@needs_v1
def test_v1_counters_of_a_process_in_the_slot(v1: Slot) -> None:
    mem, cpuacct = v1.dirs["memory"], v1.dirs["cpuacct"]
    assert v1.is_empty()
    p = _child(
        "import time\nb = bytearray(48 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "t = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
        "sys.stdout.write('ok\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
    )
    try:
        v1.add(p.pid)
        assert not v1.partial
        for d in set(v1.dirs.values()):
            assert _r(f"{d}/cgroup.procs").split() == [str(p.pid)], d
        assert not v1.is_empty()
        v1.reset_stats()
        assert int(_r(f"{cpuacct}/cpuacct.usage")) < 50_000_000
        assert v1.cpu_base_ns == 0 and v1.oom_base == 0
        assert _go(p) == b"ok\n"
        assert 0.15 < v1.cpu_seconds() < 5
        assert v1._cpu_ns() == int(_r(f"{cpuacct}/cpuacct.usage"))
        peak = v1.peak_memory_mb()
        assert peak is not None and 48 <= peak < 200
        assert peak == int(_r(f"{mem}/memory.max_usage_in_bytes")) / MiB
        charged = v1.charged_bytes()
        assert charged == int(_r(f"{mem}/memory.usage_in_bytes")) and charged >= 48 * MiB
        cur, top = v1.memory_sample()  # the first: no change known yet
        assert top == cur and v1.sampled_peak == int(_r(f"{mem}/memory.max_usage_in_bytes"))
        assert v1.oom_kills(raw=True) == 0 and v1.oom_kills() == 0
        v1.pids = -1
        v1.partial = True  # (read every hierarchy's procs)
        assert not v1.is_empty()
        v1.partial = False
        assert not v1.is_empty()
        assert _r(f"{v1.dirs['pids']}/pids.current") == "1"
    finally:
        _end(p)
    for _ in range(200):
        if v1.is_empty():
            break
        time.sleep(0.01)
    assert v1.is_empty()
    v1.partial = True
    assert v1.is_empty()


@needs_v1
def test_v1_reset_zeroes_the_counters(v1: Slot) -> None:
    mem, cpuacct = v1.dirs["memory"], v1.dirs["cpuacct"]
    p = _child(
        "b = bytearray(24 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "sys.stdout.write('ok\\n'); sys.stdout.flush()\n"
    )
    try:
        v1.add(p.pid)
        assert _go(p) == b"ok\n"
        p.wait()
    finally:
        _end(p)
    assert int(_r(f"{cpuacct}/cpuacct.usage")) > 0
    assert int(_r(f"{mem}/memory.max_usage_in_bytes")) >= 24 * MiB
    v1.reset_stats()
    assert _r(f"{cpuacct}/cpuacct.usage") == "0"
    assert int(_r(f"{mem}/memory.max_usage_in_bytes")) == int(_r(f"{mem}/memory.usage_in_bytes"))


@needs_v1
def test_v1_an_oom_kill_is_counted_from_the_reset(v1: Slot) -> None:
    v1.set_memory(32 * MiB)
    v1.reset_stats()
    assert v1.oom_base == 0
    for expect in (1, 2):
        p = _child("b = bytearray(128 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n")
        try:
            v1.add(p.pid)
            _go(p)
            assert p.wait(timeout=30) == -signal.SIGKILL
        finally:
            _end(p)
        assert v1.oom_kills() == expect
        assert v1.oom_kills(raw=True) == expect
    v1.reset_stats()
    assert v1.oom_base == 2 and v1.oom_kills() == 0


@needs_v1
def test_v1_reclaim_frees_page_cache_and_puts_the_limit_back(v1: Slot, tmp_path: Path) -> None:
    mem = v1.dirs["memory"]
    v1.set_memory(256 * MiB)
    f = tmp_path / "cache"
    p = _child(
        f"fd = __import__('os').open({str(f)!r}, 0o102)\n"  # (O_RDWR | O_CREAT)
        "__import__('os').write(fd, b'x' * (16 << 20))\n"
        "sys.stdout.write('ok\\n'); sys.stdout.flush()\n"
    )
    try:
        v1.add(p.pid)
        assert _go(p) == b"ok\n"
        p.wait()
    finally:
        _end(p)
    before = v1.charged_bytes()
    assert before >= 16 * MiB  # (the file's pages, charged to the slot)
    got = v1.reclaim()
    after = v1.charged_bytes()
    assert got >= 12 * MiB and after <= before - got + 1 * MiB
    assert int(_r(f"{mem}/memory.limit_in_bytes")) == 256 * MiB
    v1.memory = -1  # unknown: read back from the kernel first
    assert v1.reclaim() >= 0
    assert int(_r(f"{mem}/memory.limit_in_bytes")) == 256 * MiB


@needs_v1
def test_v1_remove_deletes_each_directory_and_closes_the_fds(v1: Slot) -> None:
    v1.set_pids(5)
    fds = list(v1._fds.values())
    assert len(fds) == 1
    v1.remove()
    assert v1._fds == {}
    with pytest.raises(OSError):
        os.fstat(fds[0])
    for d in v1.dirs.values():
        assert not os.path.exists(d)
    v1.remove()  # (again: nothing left, no error)
    v1.close()


def test_close_ignores_an_fd_already_closed(tmp_path: Path) -> None:
    s = _v2(tmp_path)
    s.set_pids(1)
    s.set_cpu(1.0)
    for fd in s._fds.values():
        os.close(fd)
    s.close()
    assert s._fds == {}


def test_add_writes_each_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "_FAST", None)
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "cgroup.procs").write_text("")
    s = Slot("s", "v1", {"cpu": str(a), "cpuacct": str(a), "memory": str(b), "pids": str(b)})
    s.add(4242)
    assert (a / "cgroup.procs").read_text() == "4242"
    assert (b / "cgroup.procs").read_text() == "4242"
    assert not s.partial
    (b / "cgroup.procs").unlink()
    with pytest.raises(OSError):
        s.add(7)
    assert s.partial  # a move that failed part-way


# --- the tree --------------------------------------------------------------------------------


@needs_v1
def test_a_v1_tree_its_paths_weight_and_slots() -> None:
    own = cgroups._own_paths()
    t = CgroupTree()
    try:
        assert t.version == "v1" and t.problem == ""
        assert t.tag.startswith(f"tangram-{os.getpid()}")
        want = {c: f"{V1}/{c}{own.get(c, '/').rstrip('/')}/{t.tag}" for c in CTRLS}
        assert t.bases == want
        assert t.stale_parents == [f"{V1}/{c}{own.get(c, '/')}" for c in CTRLS]
        assert t.join_dirs() == sorted(want.values())
        assert _r(f"{want['cpu']}/cpu.shares") == str(1024 * (os.cpu_count() or 1))
        s1, s2 = t.new_slot(), t.new_slot()
        assert (s1.name, s2.name) == ("s1", "s2")
        assert s1.version == "v1"
        assert s1.dirs == {c: f"{want[c]}/s1" for c in CTRLS}
        assert all(os.path.isdir(d) for d in s2.dirs.values())
        assert t.memory_bytes() == int(_r(f"{want['memory']}/memory.usage_in_bytes"))
    finally:
        t.close()
    assert not any(os.path.exists(b) for b in want.values())


@needs_v1
def test_a_v1_tree_of_a_lower_weight_reads_it_back_from_the_kernel() -> None:
    """`CpuManagerConfig.sandbox_weight` 1/16: the tree's cpu.shares is 64 per core, so the
    service's own processes (1024 each) win a contended CPU from busy sandboxes."""
    t = CgroupTree(1 / 16)
    try:
        assert _r(f"{t.bases['cpu']}/cpu.shares") == str(64 * (os.cpu_count() or 1))
    finally:
        t.close()


@needs_v1
def test_close_kills_what_is_left_and_removes_the_tree() -> None:
    t = CgroupTree()
    s = t.new_slot()
    p = subprocess.Popen(["sleep", "60"])
    try:
        s.add(p.pid)
        t.close(wait_s=5.0)
        assert p.wait(timeout=5) == -signal.SIGKILL
    finally:
        _end(p)
    assert not any(os.path.exists(b) for b in t.bases.values())


def test_trees_of_one_process_are_numbered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "_TREES", itertools.count())
    monkeypatch.setattr(cgroups, "_mounts", lambda: [])
    monkeypatch.setattr(cgroups, "_own_paths", dict)
    a, b = CgroupTree(), CgroupTree()
    assert (a.tag, b.tag) == (f"tangram-{os.getpid()}", f"tangram-{os.getpid()}.1")
    assert a.version is None
    assert a.problem == (
        "cannot create cgroups: no cgroup v1 controllers ['cpu', 'cpuacct', "
        "'memory', 'pids'] and no cgroup v2 with cpu,memory,pids"
    )
    with pytest.raises(OSError, match=r"^cannot create cgroups: no cgroup v1"):
        a.new_slot()
    assert a.join_dirs() == [] and a.memory_bytes() == 0
    a.problem = ""
    with pytest.raises(OSError, match=r"^cgroups unavailable$"):
        a.new_slot()


@pytest.mark.parametrize(("mine", "weight", "per_task"), [(True, 1.0, 100), (False, 1.0, 100),
                                                         (True, 1 / 16, 6), (True, 0.001, 1)])  # fmt: skip
def test_a_v2_tree_on_plain_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mine: bool, weight: float, per_task: int
) -> None:
    m = tmp_path / "unified"
    other = tmp_path / "v2-without-cpu"
    parent = m / "mine" if mine else m
    parent_s = f"{m}/mine" if mine else f"{m}/"  # (no own v2 path: the mount's root, "/")
    (parent / "tangram-1.7").mkdir(parents=True)
    dead = _dead_pid()
    (parent / f"tangram-{dead}" / "s1").mkdir(parents=True)  # a dead manager's: removed
    other.mkdir()
    (other / "cgroup.controllers").write_text("memory pids io\n")
    (m / "cgroup.controllers").write_text("pids memory cpu\n")  # (exactly the three)
    (parent / "cgroup.subtree_control").write_text("")
    base = parent / f"tangram-{os.getpid()}.5"
    base.mkdir()
    (base / "cgroup.subtree_control").write_text("")
    (base / "cpu.weight").write_text("")
    (base / "memory.current").write_text("12345\n")
    monkeypatch.setattr(cgroups, "_TREES", itertools.count(5))
    monkeypatch.setattr(
        cgroups,
        "_mounts",
        lambda: [
            ("cgroup", str(tmp_path / "v1cpu"), {"rw", "cpu"}),  # (v1 lacks the others)
            ("cgroup2", str(other), {"rw"}),
            ("cgroup2", str(m), {"rw"}),
        ],
    )
    own = {"": "/mine", "cpu": "/x"} if mine else {"cpu": "/x"}
    monkeypatch.setattr(cgroups, "_own_paths", lambda: own)
    t = CgroupTree(weight) if weight != 1.0 else CgroupTree()
    assert t.problem == "" and t.weight == weight
    assert t.version == "v2"
    assert t.bases == dict.fromkeys(CTRLS, os.path.join(parent_s, base.name))
    assert t.stale_parents == [parent_s]
    assert not (parent / f"tangram-{dead}").exists()
    assert (parent / "tangram-1.7").is_dir()  # (pid 1 lives)
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (base / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (base / "cpu.weight").read_text() == str(per_task * (os.cpu_count() or 1))
    assert t.join_dirs() == []
    assert t.memory_bytes() == 12345
    s = t.new_slot()
    assert s.dirs == dict.fromkeys(CTRLS, os.path.join(parent_s, base.name, "s1"))
    assert s.version == "v2" and (base / "s1").is_dir()
    (base / "memory.current").write_text("junk")
    assert t.memory_bytes() == 0


def test_a_v2_tree_of_the_least_weight_on_one_core_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cpu.weight 1 (the kernel's least) is written too: no weight is taken as already there."""
    monkeypatch.setattr(cgroups.os, "cpu_count", lambda: 1)
    test_a_v2_tree_on_plain_files(tmp_path, monkeypatch, True, 0.001, 1)


@pytest.mark.parametrize(("weight", "per_task"), [(1.0, 1024), (1 / 16, 64), (0.0001, 2)])
def test_a_v1_tree_on_plain_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight: float, per_task: int
) -> None:
    mounts = [("cgroup", str(tmp_path / c), {"rw", c}) for c in CTRLS]
    monkeypatch.setattr(cgroups, "_TREES", itertools.count(3))
    monkeypatch.setattr(cgroups, "_mounts", lambda: mounts)
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"memory": "/m/n"})
    tag = f"tangram-{os.getpid()}.3"
    (tmp_path / "cpu" / tag).mkdir(parents=True)
    dead = _dead_pid()
    stale = [
        tmp_path / "cpu" / f"tangram-{dead}" / "s1",
        tmp_path / "memory" / "m" / "n" / f"tangram-{dead}" / "s1",
    ]
    for d in stale:
        d.mkdir(parents=True)
    (tmp_path / "cpu" / tag / "cpu.shares").write_text("")
    t = CgroupTree(weight) if weight != 1.0 else CgroupTree()
    assert t.version == "v1"
    assert not any(d.parent.exists() for d in stale)  # a dead manager's trees removed at start
    assert t.bases == {
        "cpu": f"{tmp_path}/cpu/{tag}",
        "cpuacct": f"{tmp_path}/cpuacct/{tag}",
        "memory": f"{tmp_path}/memory/m/n/{tag}",
        "pids": f"{tmp_path}/pids/{tag}",
    }
    assert t.stale_parents == [
        f"{tmp_path}/cpu/",
        f"{tmp_path}/cpuacct/",
        f"{tmp_path}/memory/m/n",
        f"{tmp_path}/pids/",
    ]
    assert (tmp_path / "cpu" / tag / "cpu.shares").read_text() == str(
        per_task * (os.cpu_count() or 1)
    )
    assert t.join_dirs() == sorted(t.bases.values())
    (tmp_path / "cpu" / tag / "cpu.shares").unlink()  # (a plain directory: rmdir wants it empty)
    t.close(wait_s=0)
    assert not any(os.path.exists(b) for b in t.bases.values())


def _bare_tree(cpu_dir: Path, version: str | None, weight: float = 1.0) -> CgroupTree:
    """A tree of ``version`` whose cpu base is ``cpu_dir`` (no mounts looked at)."""
    t = CgroupTree.__new__(CgroupTree)
    t.weight, t.version, t.bases, t._written_weight = weight, version, {"cpu": str(cpu_dir)}, 0
    return t


def test_weigh_without_the_file_is_silent(tmp_path: Path) -> None:
    t = _bare_tree(tmp_path / "missing", "v1")
    t.set_cores(None)  # (no error)
    assert t._written_weight == 0  # (not written: tried again at the next change)


@pytest.mark.parametrize(
    ("version", "weight", "cores", "want"),
    [
        ("v1", 1.0, None, 2048),
        ("v1", 1.0, 0.75, 768),
        ("v1", 1.0, 0.0, 2),
        ("v1", 1.0, 5.0, 2048),
        ("v1", 1 / 16, 1.5, 96),
        ("v1", 0.0001, 1.0, 2),
        ("v2", 1.0, None, 200),
        ("v2", 1.0, 0.75, 75),
        ("v2", 1.0, 0.0, 1),
        ("v2", 1 / 16, 1.0, 6),
        ("v2", 1.0, 0.004, 1),
    ],
)
def test_the_tree_weighs_cores_of_busy_tasks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    weight: float,
    cores: float | None,
    want: int,
) -> None:
    """`set_cores`: ``cores`` busy tasks' weight (a task's rounded first: 1024 / 100 times the
    tree's `weight`), at most the machine's cores (here 2), at least the kernel's least (2 / 1);
    ``None``: one task per core."""
    monkeypatch.setattr(cgroups.os, "cpu_count", lambda: 2)
    name = "cpu.shares" if version == "v1" else "cpu.weight"
    f = tmp_path / name
    f.write_text("")
    t = _bare_tree(tmp_path, version, weight)
    t.set_cores(cores)
    assert f.read_text() == str(want)
    f.write_text("kept")
    t.set_cores(cores)  # (the same value: not written again)
    assert f.read_text() == "kept"


def test_a_tree_without_cgroups_weighs_nothing(tmp_path: Path) -> None:
    t = _bare_tree(tmp_path, None)
    t.set_cores(1.0)
    assert list(tmp_path.iterdir()) == [] and t._written_weight == 0


def test_mounts_and_own_paths_as_the_kernel_lists_them() -> None:
    want = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, where, kind, opts = line.split()[:4]
            if kind in ("cgroup", "cgroup2"):
                want.append((kind, where, set(opts.split(","))))
    assert cgroups._mounts() == want
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _n, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
    assert cgroups._own_paths() == own
    if _v1_ok():
        assert ("cgroup", f"{V1}/cpu", {"rw", "relatime", "cpu"}) in want
        assert cgroups._own_paths()[""] == own[""]


# --- stale trees (plain directories) ---------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_trees_are_dead_managers_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead, live = _dead_pid(), os.getpid()
    names = [
        f"tangram-{dead}",
        f"tangram-{dead}.3",
        f"tangram-{dead}-sessions",
        f"tangram-{dead}.2-sessions",  # (a freezer tree of sessions: never a slot tree)
        f"tangram-{live}",
        f"tangram-{live}.1",
        "tangram-x1",
        f"other-{dead}",
        "tangram-",
    ]
    for n in names:
        (tmp_path / n).mkdir()
    got = cgroups._stale_trees(str(tmp_path))
    assert sorted(got) == [f"{tmp_path}/tangram-{dead}", f"{tmp_path}/tangram-{dead}.3"]
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        assert cgroups._stale_trees(str(tmp_path / "none")) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"stale cgroups: cannot list {tmp_path}/none: [Errno 2] No such file or directory: "
        f"'{tmp_path}/none'"
    ]


def test_kill_procs_kills_each_listed_pid(tmp_path: Path) -> None:
    a, b = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "cgroup.procs").write_text(f"{a.pid}\nnot-a-pid\n{b.pid}\n")
        cgroups._kill_procs(str(tmp_path))
        assert a.wait(timeout=5) == -signal.SIGKILL
        assert b.wait(timeout=5) == -signal.SIGKILL
    finally:
        _end(a)
        _end(b)
    cgroups._kill_procs(str(tmp_path / "none"))  # (no file: nothing)


def test_remove_stale_retries_and_reports_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    tree = tmp_path / f"tangram-{dead}"
    for s in ("s1", "s2", "s3", "s4", "s5"):
        (tree / s).mkdir(parents=True)
    (tree / "s2" / "cgroup.procs").write_text("")  # busy (a file: rmdir fails) until round 2
    (tree / "s5" / "cgroup.procs").write_text("")  # busy, then gone (another removed it)
    (tree / "s3" / "cgroup.procs").write_text("")  # busy for good
    (tree / "notes").write_text("")  # (a file of the tree: not a slot)
    (tmp_path / f"tangram-{os.getpid()}" / "s1").mkdir(parents=True)  # alive: left alone
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        with contextlib.suppress(FileNotFoundError):
            (tree / "s2" / "cgroup.procs").unlink()
            (tree / "s5" / "cgroup.procs").unlink()
            (tree / "s5").rmdir()

    monkeypatch.setattr(cgroups.time, "sleep", sleep)
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        left = cgroups._remove_stale(str(tmp_path), rounds=3, pause_s=0.125)
    assert left == [str(tree), str(tree / "s3")]
    assert sleeps == [0.125, 0.125]  # between rounds, not after the last
    assert sorted(os.listdir(tree)) == ["notes", "s3"]
    assert os.path.isdir(tmp_path / f"tangram-{os.getpid()}" / "s1")
    msgs = [r.getMessage() for r in caplog.records]  # (in the order found)
    assert msgs == [
        f"stale cgroup {tree / 's3'} (of a dead manager) not removed yet: [Errno 39] "
        f"Directory not empty: '{tree / 's3'}'",
        f"stale cgroup {tree} (of a dead manager) not removed yet: [Errno 39] "
        f"Directory not empty: '{tree}'",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_remove_stale_with_no_rounds_tries_once_and_removes_a_clean_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _dead_pid()
    tree, other = tmp_path / f"tangram-{dead}.2", tmp_path / f"tangram-{dead}.3"
    for s in ("s1", "s2"):
        (tree / s).mkdir(parents=True)
        (other / s).mkdir(parents=True)
    monkeypatch.setattr(cgroups.time, "sleep", lambda s: pytest.fail("no pause"))
    assert cgroups._remove_stale(str(tmp_path), rounds=0) == []
    assert os.listdir(tmp_path) == []  # both trees, every slot of each
    busy = tmp_path / f"tangram-{dead}" / "s1"
    busy.mkdir(parents=True)
    (busy / "x").write_text("")
    assert cgroups._remove_stale(str(tmp_path), rounds=1) == [str(busy.parent), str(busy)]


def test_tree_remove_stale_looks_under_each_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups, "_mounts", lambda: [])
    t = CgroupTree()
    dead = _dead_pid()
    for p in ("a", "b"):
        (tmp_path / p / f"tangram-{dead}" / "s1" / "busy").mkdir(parents=True)
    t.stale_parents = [str(tmp_path / "a"), str(tmp_path / "b")]
    sleeps: list[float] = []
    monkeypatch.setattr(cgroups.time, "sleep", sleeps.append)
    left = t.remove_stale(rounds=2, pause_s=0.5)
    assert left == [
        f"{tmp_path}/a/tangram-{dead}",
        f"{tmp_path}/a/tangram-{dead}/s1",
        f"{tmp_path}/b/tangram-{dead}",
        f"{tmp_path}/b/tangram-{dead}/s1",
    ]
    assert sleeps == [0.5, 0.5]


def test_close_retries_until_its_deadline_then_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cgroups, "_mounts", lambda: [])
    t = CgroupTree()
    base = tmp_path / "base"
    (base / "s1").mkdir(parents=True)
    (base / "s2").mkdir()
    (base / "notes").write_text("")  # (a file: never a slot; it keeps the base)
    sleeper = subprocess.Popen(["sleep", "60"])
    (base / "s2" / "cgroup.procs").write_text(f"{sleeper.pid}\n")  # busy: its process killed
    gone, clean = tmp_path / "a-gone", tmp_path / "z-clean"  # (sorted: before and after it)
    clean.mkdir()
    t.bases = {"cpu": str(base), "cpuacct": str(gone), "memory": str(clean), "pids": str(base)}
    clock = iter([100.0, 100.0, 100.4, 100.5, 100.51])
    monkeypatch.setattr(cgroups.time, "monotonic", lambda: next(clock))
    sleeps: list[float] = []
    monkeypatch.setattr(cgroups.time, "sleep", sleeps.append)
    try:
        with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
            t.close(wait_s=0.5)
        slept = list(sleeps)  # (time.sleep is the module's: Popen.wait sleeps too)
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
    finally:
        _end(sleeper)
    # the deadline is 100.0 + 0.5: retried at 100.0, 100.4 and at the deadline itself; 100.51 past
    assert slept == [0.02, 0.02, 0.02]
    assert sorted(os.listdir(base)) == ["notes", "s2"]
    assert not clean.exists()  # the bases after one gone and one left are still removed
    assert [r.getMessage() for r in caplog.records] == [
        f"cgroup {base} not removed at close: [Errno 39] Directory not empty: '{base}' "
        "(the next start of a manager removes it)"
    ]


def test_a_v1_slot_whose_files_are_missing(tmp_path: Path) -> None:
    """Where a counter cannot be read or reset: nothing raised, the answer says so."""
    for c in CTRLS:
        (tmp_path / c).mkdir()
    s = Slot("s", "v1", {c: str(tmp_path / c) for c in CTRLS})
    try:
        s.reset_stats()
        assert (s.cpu_base_ns, s.oom_base, s.peak_sticky) == (0, 0, False)
        assert s.peak_memory_mb() is None
        assert s.oom_kills() == 0
        for c in CTRLS:
            (tmp_path / c / "cgroup.procs").write_text("")
        assert s.is_empty()  # (no pids.current: every cgroup.procs read)
        (tmp_path / "memory" / "cgroup.procs").write_text("123\n")
        assert not s.is_empty()
        (tmp_path / "pids" / "pids.current").write_text("0\n")
        assert s.is_empty()  # the pids counter answers for all
        (tmp_path / "pids" / "pids.current").write_text("junk\n")
        s.close()
        assert not s.is_empty()  # (unreadable: the procs files)
        del s.dirs["pids"]
        (tmp_path / "memory" / "cgroup.procs").write_text("")
        assert s.is_empty()
    finally:
        s.close()


def test_defaults_of_the_stale_clean_up_and_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _dead_pid()
    busy = tmp_path / f"tangram-{dead}" / "s1"
    (busy / "x").mkdir(parents=True)
    sleeps: list[float] = []
    monkeypatch.setattr(cgroups.time, "sleep", sleeps.append)
    assert cgroups._remove_stale(str(tmp_path)) == [str(busy.parent), str(busy)]
    assert sleeps == []  # one round by default
    assert cgroups._remove_stale(str(tmp_path), rounds=2) == [str(busy.parent), str(busy)]
    assert sleeps == [0.05]
    sleeps.clear()
    monkeypatch.setattr(cgroups, "_mounts", lambda: [])
    t = CgroupTree()
    t.stale_parents = [str(tmp_path)]
    assert t.remove_stale() == [str(busy.parent), str(busy)]
    assert sleeps == [0.05] * 39  # 40 rounds, 0.05 s apart
    sleeps.clear()
    t.bases = {"cpu": str(busy.parent)}
    clock = iter([10.0, 11.0, 12.0, 12.01])
    monkeypatch.setattr(cgroups.time, "monotonic", lambda: next(clock))
    t.close()  # 2 s by default: retried at 11.0 and 12.0, given up at 12.01
    assert sleeps == [0.02, 0.02]


def test_remove_stale_kills_what_is_in_a_busy_slot(tmp_path: Path) -> None:
    dead = _dead_pid()
    slot = tmp_path / f"tangram-{dead}" / "s1"
    slot.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (slot / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        assert cgroups._remove_stale(str(tmp_path)) == [str(slot.parent), str(slot)]
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
    finally:
        _end(sleeper)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_v2_peak_is_read_on_the_fd_it_was_reset_on(tmp_path: Path) -> None:
    """memory.peak resets per open file: the per-action peak is read on the fd `reset_stats`
    reset (kept as "rw:peak"), never on a new one; a sticky peak is read on a plain read fd."""
    (tmp_path / "cpu.stat").write_text("usage_usec 1\n")
    (tmp_path / "memory.peak").write_text("2097152\n")
    s = _v2(tmp_path)
    try:
        assert s.peak_memory_mb() == 2.0
        fd = s._fds["rw:peak"]
        s.reset_stats()
        n = _open_fds()
        (tmp_path / "memory.peak").write_text("1048576\n")
        assert s.peak_memory_mb() == 1.0
        assert s.peak_memory_mb() == 1.0
        assert s._fds["rw:peak"] == fd and _open_fds() == n  # the same fd, no new one
        assert [k for k in s._fds if k.endswith("peak")] == ["rw:peak"]
        s.peak_sticky = True
        assert s.peak_memory_mb() == 1.0
        assert f"r:{tmp_path}/memory.peak" in s._fds
    finally:
        s.close()


def test_own_paths_parses_each_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "cgroup"
    fake.write_text(
        "12:cpu,cpuacct:/a:b:c\n"  # (colons in a path are the path's)
        "4:memory:/boX\n"
        "3:pids:/sp \n"  # (trailing space: the path's)
        "1:name=systemd:/\n"
        "0::/top\n"
    )
    real = open
    monkeypatch.setattr(
        cgroups,
        "open",
        lambda p, *a: real(fake if p == "/proc/self/cgroup" else p, *a),
        raising=False,
    )
    assert cgroups._own_paths() == {
        "cpu": "/a:b:c",
        "cpuacct": "/a:b:c",
        "memory": "/boX",
        "pids": "/sp ",
        "name=systemd": "/",
        "": "/top",
    }


def test_kill_procs_goes_on_past_a_pid_already_gone(tmp_path: Path) -> None:
    gone = _dead_pid()
    a = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "cgroup.procs").write_text(f"{gone}\n{a.pid}\n")
        cgroups._kill_procs(str(tmp_path))
        assert a.wait(timeout=5) == -signal.SIGKILL
    finally:
        _end(a)


def test_a_stale_tree_that_cannot_be_listed_is_logged_and_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    odd = tmp_path / f"tangram-{dead}"
    odd.write_text("")  # (not a directory)
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        assert cgroups._remove_stale(str(tmp_path)) == [str(odd)]
    assert [r.getMessage() for r in caplog.records] == [
        f"stale cgroups: cannot list {odd}: [Errno 20] Not a directory: '{odd}'",
        f"stale cgroup {odd} (of a dead manager) not removed yet: [Errno 20] Not a directory: "
        f"'{odd}'",
    ]


def test_weigh_with_an_unknown_cpu_count_is_one_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "cpu.shares"
    f.write_text("")
    monkeypatch.setattr(cgroups.os, "cpu_count", lambda: None)
    _bare_tree(tmp_path, "v1").set_cores(None)
    assert f.read_text() == "1024"
    _bare_tree(tmp_path, "v1").set_cores(3.0)  # (at most the one core assumed)
    assert f.read_text() == "1024"


@pytest.mark.parametrize("rounds", [0, 1])
def test_one_round_tries_each_busy_slot_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int
) -> None:
    dead = _dead_pid()
    busy = tmp_path / f"tangram-{dead}" / "s1"
    (busy / "x").mkdir(parents=True)
    killed: list[str] = []
    monkeypatch.setattr(cgroups, "_kill_procs", killed.append)
    assert cgroups._remove_stale(str(tmp_path), rounds=rounds) == [str(busy.parent), str(busy)]
    assert killed == [str(busy)]


def test_a_slot_gone_before_its_first_removal_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _dead_pid()
    tree = tmp_path / f"tangram-{dead}"
    for s in ("s1", "s2"):
        (tree / s).mkdir(parents=True)
    real = os.rmdir

    def rmdir(p: str) -> None:
        if p.endswith("/s1"):  # (another manager's clean-up got there first)
            real(p)
        real(p)

    monkeypatch.setattr(cgroups.os, "rmdir", rmdir)
    assert cgroups._remove_stale(str(tmp_path)) == []
    assert not tree.exists()


def test_control_files_are_opened_once_and_kept(tmp_path: Path) -> None:
    """Each control file written or read for every action stays open: one fd each, under
    "w:<path>" / "r:<path>", reused (no new fd on the next write or read), closed by `close`."""
    (tmp_path / "memory.current").write_text("4096\n")
    s = _v2(tmp_path)
    try:
        s.set_pids(3)
        s.set_cpu(1.0)
        assert s.charged_bytes() == 4096
        assert set(s._fds) == {
            f"w:{tmp_path}/pids.max",
            f"w:{tmp_path}/cpu.max",
            f"r:{tmp_path}/memory.current",
        }
        fds = dict(s._fds)
        n = _open_fds()
        for k in (4, 5, 6):
            s.set_pids(k)
            s.set_cpu(k / 2)
            (tmp_path / "memory.current").write_text(f"{k}\n")
            assert s.charged_bytes() == k
        assert s._fds == fds and _open_fds() == n
        assert (tmp_path / "pids.max").read_text() == "6"
        assert (tmp_path / "cpu.max").read_text() == "300000 100000"
        assert fcntl.fcntl(fds[f"w:{tmp_path}/pids.max"], fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(fds[f"w:{tmp_path}/pids.max"], fcntl.F_GETFL) & os.O_ACCMODE == (
            os.O_WRONLY
        )
        r = fds[f"r:{tmp_path}/memory.current"]
        assert fcntl.fcntl(r, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(r, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    finally:
        s.close()
    assert s._fds == {} and _open_fds() == n - 3


def test_v1_reset_zeroes_the_cpu_counter_and_takes_no_base(tmp_path: Path) -> None:
    for c in CTRLS:
        (tmp_path / c).mkdir()
    (tmp_path / "cpuacct" / "cpuacct.usage").write_text("123456\n")  # (a plain file)
    s = Slot("s", "v1", {c: str(tmp_path / c) for c in CTRLS})
    try:
        s.reset_stats()
        assert (tmp_path / "cpuacct" / "cpuacct.usage").read_text() == "023456\n"  # "0" written
        assert s.cpu_base_ns == 0  # v1 zeroes the counter: its base is 0, never read back
    finally:
        s.close()


def test_the_squeezed_share_the_last_cpus_their_quotas_need() -> None:
    four = [0, 1, 2, 3]
    assert squeezed_cpus(four, 0.5) == [3]
    assert squeezed_cpus(four, 1.0) == [3]  # (whole: no second CPU for rounding)
    assert squeezed_cpus(four, 1.0 + 1e-12) == [3]
    assert squeezed_cpus(four, 1.25) == [2, 3]
    assert squeezed_cpus(four, 3.0) == [1, 2, 3]
    assert squeezed_cpus(four, 3.5) is None  # (no CPU left free of them: no confinement)
    assert squeezed_cpus(four, 0.0) == [3]  # (at least one)
    assert squeezed_cpus([0, 1], 1.0) == [1]
    assert squeezed_cpus([0, 1], 1.5) is None
    assert squeezed_cpus([5], 0.25) is None


def test_pin_sets_each_listed_thread_and_skips_the_gone(tmp_path: Path) -> None:
    """`pin` reads the slot's threads (v1 ``tasks``, v2 ``cgroup.threads``), sets each one's
    CPUs, skips one that ended (and a line that is no thread), and counts what it pinned; a
    slot whose files are gone pins nothing."""
    cpus = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for version, name in (("v1", "tasks"), ("v2", "cgroup.threads")):
            d = tmp_path / version
            d.mkdir()
            (d / name).write_text(f"{child.pid}\n999999999\nx\n")
            slot = Slot(name="s1", version=version, dirs={"cpu": str(d)})
            assert cgroups.pin(slot, {cpus[-1]}) == 1
            assert os.sched_getaffinity(child.pid) == {cpus[-1]}
            assert cgroups.pin(slot, set(cpus)) == 1
            assert os.sched_getaffinity(child.pid) == set(cpus)
        gone = Slot(name="s9", version="v1", dirs={"cpu": str(tmp_path / "gone")})
        assert cgroups.pin(gone, {cpus[-1]}) == 0
    finally:
        child.kill()
        child.wait()
