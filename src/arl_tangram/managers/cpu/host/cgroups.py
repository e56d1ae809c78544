"""Cgroup slots for sandboxes, on cgroup v1 or v2 (detected at run time).

Invariant: a `Slot` is a set of leaf cgroups (one per controller on v1, one on v2) under this
manager's own ``tangram-<pid>`` directory; a slot is reused only once it is empty (no process
left), so limits written for one action never apply to another's processes. Nothing here blocks
for long: every operation is a few small file writes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field

try:  # the compiled helpers (setup.py builds them; without, the same writes from Python)
    import arl_tangram.managers.cpu.zygote._fastpath as _FAST
except ImportError:
    _FAST = None

log = logging.getLogger(__name__)

CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")
_PERIOD_US = 100_000


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[2] in ("cgroup", "cgroup2"):
                out.append((parts[2], parts[1], set(parts[3].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
    return own


def _stale_trees(parent: str) -> list[str]:
    """The ``tangram-<pid>`` trees under ``parent`` whose manager's pid is gone."""
    try:
        names = os.listdir(parent)
    except OSError as e:
        log.warning("stale cgroups: cannot list %s: %s", parent, e)
        return []
    out = []
    for name in names:
        pid = name[len("tangram-"):].split(".")[0]  # tangram-<pid> or tangram-<pid>.<k>
        if name.startswith("tangram-") and pid.isdigit() and not name.endswith("-sessions") \
                and not os.path.exists(f"/proc/{pid}"):
            out.append(os.path.join(parent, name))
    return out


def _kill_procs(d: str) -> None:
    """SIGKILL what is still in a dead manager's slot (its sandboxes' processes: nothing else is
    ever put there). A frozen one dies once thawed (`overlay._thaw_stale`)."""
    try:
        pids = _read(f"{d}/cgroup.procs").split()
    except OSError:
        return
    for p in pids:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(p), signal.SIGKILL)


def _remove_stale(parent: str, rounds: int = 1, pause_s: float = 0.05) -> list[str]:
    """Remove the ``tangram-<pid>`` trees left under ``parent`` by managers that were killed
    (their pid is gone). Every slot is tried, a busy one never stops the rest: what is still in
    it is killed and its removal tried again, up to ``rounds`` times ``pause_s`` apart. Returns
    the directories still left (each logged at WARNING); a tree whose pid lives is left alone."""
    trees = _stale_trees(parent)
    todo: list[str] = []
    for base in trees:
        try:
            todo += [os.path.join(base, c) for c in sorted(os.listdir(base))
                     if os.path.isdir(os.path.join(base, c))]
        except OSError as e:
            log.warning("stale cgroups: cannot list %s: %s", base, e)
    errors: dict[str, OSError] = {}
    for r in range(max(1, rounds)):
        left = []
        for d in todo:
            try:
                os.rmdir(d)  # fails (EBUSY) while a process is in it
                errors.pop(d, None)
            except FileNotFoundError:
                errors.pop(d, None)
            except OSError as e:
                errors[d] = e
                _kill_procs(d)
                left.append(d)
        todo = left
        if not todo:
            break
        if r + 1 < rounds:
            time.sleep(pause_s)
    for base in trees:
        try:
            os.rmdir(base)
        except FileNotFoundError:
            pass
        except OSError as e:
            errors[base] = e
    for d, err in errors.items():
        log.warning("stale cgroup %s (of a dead manager) not removed yet: %s", d, err)
    return sorted(errors)


@dataclass(slots=True)
class Slot:
    """The cgroup(s) one sandbox lives in.

    The control files written or read for every action stay open (`_fds`), and the limits last
    written are remembered (`cpu`, `memory`, `weight`, `pids`; -1: unknown), so that a reused
    slot is rewritten only where a value changes. Only this manager writes these files (the
    cgroup file system is not visible in a sandbox), so what it remembers is what is in force.
    """

    name: str
    version: str
    dirs: dict[str, str]  # controller -> directory (v2: every controller -> the same one)
    cpu_base_ns: int = 0
    oom_base: int = 0
    cpu: float = -1.0  # CPU quota in cores, as last written
    memory: int = -1  # memory limit in bytes, as last written
    weight: float = -1.0  # CPU weight relative to a normal task, as last written
    pids: int = -1  # pids.max, as last written
    # v2 only: this kernel cannot reset memory.peak (< 6.12), so each occupant needs a new slot
    peak_sticky: bool = False
    # a move into the slot failed part-way (some hierarchies hold the process, others not):
    # `is_empty` then reads every hierarchy's cgroup.procs, not the pids counter alone
    partial: bool = False
    sampled_peak: int = -1  # the peak `memory_sample` read last (where it cannot reset it)
    _fds: dict[str, int] = field(default_factory=dict)  # "w:path"/"r:path" -> open fd

    def _put(self, path: str, value: str) -> None:
        fd = self._fds.get("w:" + path)
        if fd is None:
            fd = self._fds["w:" + path] = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        os.pwrite(fd, value.encode(), 0)

    def _get(self, path: str) -> str:
        fd = self._fds.get("r:" + path)
        if fd is None:
            fd = self._fds["r:" + path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, 1 << 16, 0).decode()

    def add(self, pid: int) -> None:
        self.partial = True
        dirs = sorted(set(self.dirs.values()))
        if _FAST is not None:  # one release of the GIL for all (see `_fastpath.write_each`)
            _FAST.write_each([(f"{d}/cgroup.procs".encode(), b"%d" % pid) for d in dirs])
        else:
            for d in dirs:
                _write(f"{d}/cgroup.procs", str(pid))
        self.partial = False

    def set_cpu(self, cores: float) -> None:
        quota = max(1000, int(cores * _PERIOD_US))
        if self.version == "v1":
            self._put(f"{self.dirs['cpu']}/cpu.cfs_quota_us", str(quota))
        else:
            self._put(f"{self.dirs['cpu']}/cpu.max", f"{quota} {_PERIOD_US}")
        self.cpu = cores

    def set_weight(self, fraction: float) -> None:
        """CPU weight relative to a normal task (1.0); warming sandboxes get less than a running
        action, so that refilling the pool does not slow the actions in flight."""
        if self.version == "v1":
            self._put(f"{self.dirs['cpu']}/cpu.shares", str(max(2, int(1024 * fraction))))
        else:
            self._put(f"{self.dirs['cpu']}/cpu.weight", str(max(1, int(100 * fraction))))
        self.weight = fraction

    def set_memory(self, limit_bytes: int) -> None:
        d = self.dirs["memory"]
        self.memory = -1  # unknown until every write below went through
        if self.version == "v2":
            self._put(f"{d}/memory.max", str(limit_bytes))
            with contextlib.suppress(OSError):
                self._put(f"{d}/memory.swap.max", "0")
            self.memory = limit_bytes
            return
        sw = f"{d}/memory.memsw.limit_in_bytes"
        has_sw = ("w:" + sw) in self._fds or os.path.exists(sw)
        try:
            self._put(f"{d}/memory.limit_in_bytes", str(limit_bytes))
            if has_sw:
                self._put(sw, str(limit_bytes))
        except OSError:  # raising the limit: memsw must go first
            if has_sw:
                self._put(sw, str(limit_bytes))
            self._put(f"{d}/memory.limit_in_bytes", str(limit_bytes))
        self.memory = limit_bytes

    def set_pids(self, n: int) -> None:
        self._put(f"{self.dirs['pids']}/pids.max", str(n))
        self.pids = n

    def reset_stats(self) -> None:
        """Start counting CPU time, peak memory and OOM kills from now. (The peak starts from
        what is charged now: a slot is reused only with next to nothing charged, see
        `charged_bytes`.)"""
        if self.version == "v1":
            with contextlib.suppress(OSError):
                self._put(f"{self.dirs['cpuacct']}/cpuacct.usage", "0")
            with contextlib.suppress(OSError):
                self._put(f"{self.dirs['memory']}/memory.max_usage_in_bytes", "0")
        else:  # memory.peak resets per open file (Linux >= 6.12): written and read on one fd
            try:
                os.pwrite(self._peak_fd(), b"reset\n", 0)
            except OSError:
                self.peak_sticky = True  # (then `peak_memory_mb` reads the slot's lifetime peak)
        self.cpu_base_ns = self._cpu_ns() if self.version == "v2" else 0
        self.oom_base = self.oom_kills(raw=True)

    def _peak_fd(self) -> int:
        fd = self._fds.get("rw:peak")
        if fd is None:
            path = f"{self.dirs['memory']}/memory.peak"
            fd = self._fds["rw:peak"] = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        return fd

    def charged_bytes(self) -> int:
        """Memory still charged to this slot: with no process left in it, what earlier
        occupants left behind (page cache of files they read first, kernel objects)."""
        d = self.dirs["memory"]
        path = f"{d}/memory.usage_in_bytes" if self.version == "v1" else f"{d}/memory.current"
        return int(self._get(path))

    def memory_sample(self) -> tuple[int, int]:
        """(bytes charged now, the most charged since the last sample): what the node host
        reports of a session (issue 26, `events.MemoryReport`), so that a burst between two
        samples counts. v2 (Linux >= 6.12) reads the peak on a memory.peak fd of its own, reset
        at each sample (resets are per open file: the per-action peak of `reset_stats` is not
        disturbed). Elsewhere (v1's memory.max_usage_in_bytes, reset at each action's start, or
        a v2 peak that cannot be reset) the peak is read, never reset: when it changed since
        the last sample it was reached since then; else the peak is what is charged now."""
        cur = self.charged_bytes()
        d = self.dirs["memory"]
        try:
            if self.version == "v2" and not self.peak_sticky:
                fd = self._fds.get("rw:sample-peak")
                if fd is None:  # first sample: from now on (a new fd reads the lifetime peak)
                    fd = os.open(f"{d}/memory.peak", os.O_RDWR | os.O_CLOEXEC)
                    self._fds["rw:sample-peak"] = fd
                    peak = cur
                else:
                    peak = int(os.pread(fd, 64, 0))
                os.pwrite(fd, b"reset\n", 0)
                return cur, max(cur, peak)
            top = int(self._get(f"{d}/memory.max_usage_in_bytes" if self.version == "v1"
                                else f"{d}/memory.peak"))
        except (OSError, ValueError):
            return cur, cur
        last, self.sampled_peak = self.sampled_peak, top
        return cur, max(cur, top) if last >= 0 and top != last else cur

    def reclaim(self) -> int:
        """Make the kernel reclaim what it can of this slot's memory now (page cache of files
        its processes wrote or read; without swap, never their own anonymous memory or a
        tmpfs), its limit unchanged after: the bytes charged before less those after. v2
        writes memory.reclaim; v1 lowers memory.limit_in_bytes to one page, which reclaims
        until nothing more goes and then fails with EBUSY (it never OOM-kills), and puts the
        limit back. For a frozen session's slot (`CpuManager.reclaim_session`): nothing in it
        allocates meanwhile."""
        before = self.charged_bytes()
        d = self.dirs["memory"]
        if self.version == "v2":
            with contextlib.suppress(OSError):  # (EAGAIN: not all of it could go)
                self._put(f"{d}/memory.reclaim", str(before))
        else:
            limit = self.memory if self.memory > 0 else int(self._get(
                f"{d}/memory.limit_in_bytes"))
            try:
                self._put(f"{d}/memory.limit_in_bytes", "4096")
            except OSError:  # EBUSY: reclaimed what it could
                pass
            finally:
                self._put(f"{d}/memory.limit_in_bytes", str(limit))
        return max(0, before - self.charged_bytes())

    def _cpu_ns(self) -> int:
        if self.version == "v1":
            return int(self._get(f"{self.dirs['cpuacct']}/cpuacct.usage"))
        for line in self._get(f"{self.dirs['cpu']}/cpu.stat").splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1]) * 1000
        return 0

    def cpu_seconds(self) -> float:
        return (self._cpu_ns() - self.cpu_base_ns) / 1e9

    def peak_memory_mb(self) -> float | None:
        d = self.dirs["memory"]
        try:
            if self.version == "v1":
                return int(self._get(f"{d}/memory.max_usage_in_bytes")) / (1 << 20)
            if not self.peak_sticky:
                return int(os.pread(self._peak_fd(), 64, 0)) / (1 << 20)
            return int(self._get(f"{d}/memory.peak")) / (1 << 20)
        except (OSError, ValueError):
            return None

    def oom_kills(self, raw: bool = False) -> int:
        d = self.dirs["memory"]
        path = f"{d}/memory.oom_control" if self.version == "v1" else f"{d}/memory.events"
        n = 0
        with contextlib.suppress(OSError):
            for line in self._get(path).splitlines():
                if line.startswith("oom_kill "):
                    n = int(line.split()[1])
        return n if raw else n - self.oom_base

    def is_empty(self) -> bool:
        """No process left in the slot. Every process in it was moved into all its hierarchies
        at once (`add`, or its init's own move before any action code ran, which ends the
        sandbox if it fails) or forked there, and nothing an action runs can move itself, so where
        every move went through, the pids controller's count (one read of a kept fd) answers
        for all; it counts a task until it is reaped, so it is never 0 while cgroup.procs is not."""
        if not self.partial and "pids" in self.dirs:
            try:
                return int(self._get(f"{self.dirs['pids']}/pids.current")) == 0
            except (OSError, ValueError):
                pass
        return all(not _read(f"{d}/cgroup.procs").strip() for d in set(self.dirs.values()))

    def close(self) -> None:
        """Close the control files kept open (the slot stays usable: they reopen on use)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def remove(self) -> None:
        self.close()
        for d in set(self.dirs.values()):
            with contextlib.suppress(OSError):
                os.rmdir(d)


_TREES = itertools.count()  # trees made in this process


class CgroupTree:
    """This manager's cgroup directory and the slots under it."""

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight  # the tree's CPU weight in busy tasks per core (`_weigh`)
        self.version: str | None = None
        self.bases: dict[str, str] = {}
        self.problem = ""
        self._count = 0
        self._written_weight = 0  # the tree's weight as last written (`set_cores`)
        self.stale_parents: list[str] = []  # where `_remove_stale` looked (`remove_stale`)
        # Its own directory: several managers in one process (the nodes of a local executor)
        # must never share slots, whose limits each writes.
        k = next(_TREES)
        self.tag = f"tangram-{os.getpid()}" + (f".{k}" if k else "")
        try:
            self._setup()
        except OSError as e:
            self.version, self.problem = None, f"cannot create cgroups: {e}"

    def _setup(self) -> None:
        mounts, own = _mounts(), _own_paths()
        tag = self.tag
        v1 = {c: m for kind, m, opts in mounts if kind == "cgroup" for c in CONTROLLERS if c in opts}
        if all(c in v1 for c in CONTROLLERS):
            for c in CONTROLLERS:
                self.stale_parents.append(v1[c] + own.get(c, "/"))
                _remove_stale(v1[c] + own.get(c, "/"))
                base = os.path.join(v1[c] + own.get(c, "/"), tag)
                os.makedirs(base, exist_ok=True)
                self.bases[c] = base
            self.version = "v1"
            self.set_cores(None)
            return
        v2 = [m for kind, m, _ in mounts if kind == "cgroup2"]
        for m in v2:
            avail = set(_read(f"{m}/cgroup.controllers").split())
            if {"cpu", "memory", "pids"} <= avail:
                parent = m + own.get("", "/")
                self.stale_parents.append(parent)
                _remove_stale(parent)
                _write(f"{parent}/cgroup.subtree_control", "+cpu +memory +pids")
                base = os.path.join(parent, tag)
                os.makedirs(base, exist_ok=True)
                _write(f"{base}/cgroup.subtree_control", "+cpu +memory +pids")
                self.bases = dict.fromkeys(CONTROLLERS, base)
                self.version = "v2"
                self.set_cores(None)
                return
        missing = [c for c in CONTROLLERS if c not in v1]
        raise OSError(f"no cgroup v1 controllers {missing} and no cgroup v2 with cpu,memory,pids")

    def set_cores(self, cores: float | None) -> None:
        """The tree's CPU weight: that of ``cores`` busy tasks (times `weight`); ``None``: one
        per core of the machine, so that N concurrent sandboxes compete for CPU like N plain
        processes would, not like one. Each slot's CPU quota still caps what one action gets.
        Written only when it changes; the kernel's least weight at 0 cores."""
        n = (os.cpu_count() or 1) if cores is None else min(cores, os.cpu_count() or 1)
        if self.version == "v1":  # (cpu.shares: a task 1024, the least 2)
            name, task, least = "cpu.shares", 1024, 2
        elif self.version == "v2":  # (cpu.weight: a task 100, the least 1)
            name, task, least = "cpu.weight", 100, 1
        else:
            return
        path = f"{self.bases['cpu']}/{name}"
        # (a task's weight rounded first: the same per core whatever the number of cores)
        value = max(least, round(max(least, round(task * self.weight)) * n))
        if value != self._written_weight:
            with contextlib.suppress(OSError):
                _write(path, str(value))
                self._written_weight = value

    def remove_stale(self, rounds: int = 40, pause_s: float = 0.05) -> list[str]:
        """Again (blocking: run it in a thread), once the dead managers' frozen sessions are
        thawed (`overlay.FreezerTree`): the stale slots still left, retried ``rounds`` times."""
        left: list[str] = []
        for parent in self.stale_parents:
            left += _remove_stale(parent, rounds, pause_s)
        return left

    def join_dirs(self) -> list[str]:
        """cgroup v1: the base directory of each hierarchy, in the order a sandbox that moves
        itself into its slot writes them (the slot is ``<base>/<slot name>``, its file `tasks`:
        a thread writing 0 there moves itself without the global lock a move of another
        process takes). Empty where that does not apply (v2: no `tasks` file; no cgroups)."""
        if self.version != "v1":
            return []
        return sorted(set(self.bases.values()))

    def memory_bytes(self) -> int:
        """Memory charged to all of this manager's sandboxes now (0 where unreadable)."""
        base = self.bases.get("memory")
        if base is None:
            return 0
        name = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        try:
            return int(_read(f"{base}/{name}"))
        except (OSError, ValueError):
            return 0

    def new_slot(self) -> Slot:
        if self.version is None:
            raise OSError(self.problem or "cgroups unavailable")
        self._count += 1
        name = f"s{self._count}"
        dirs = {}
        for c, base in self.bases.items():
            d = os.path.join(base, name)
            os.makedirs(d, exist_ok=True)
            dirs[c] = d
        return Slot(name=name, version=self.version, dirs=dirs)

    def close(self, wait_s: float = 2.0) -> None:
        """Remove every slot and the base; retries while the kernel finishes dying tasks."""
        deadline = time.monotonic() + wait_s
        for base in sorted(set(self.bases.values())):
            while True:
                with contextlib.suppress(OSError):
                    for entry in os.listdir(base):
                        d = os.path.join(base, entry)
                        if os.path.isdir(d):
                            try:
                                os.rmdir(d)
                            except FileNotFoundError:
                                pass
                            except OSError:
                                _kill_procs(d)  # (a sandbox's process still dying: hurried)
                try:
                    os.rmdir(base)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        log.warning("cgroup %s not removed at close: %s (the next start of a "
                                    "manager removes it)", base, e)
                        break
                    time.sleep(0.02)


def squeezed_cpus(allowed: list[int], cores: float) -> list[int] | None:
    """The CPUs the squeezed actions of a node share, whose quotas sum to ``cores``: the last
    ``ceil(cores)`` (at least one) of the ``allowed`` ones, so that the rest are whole CPUs the
    others run on without them; None (no confinement) where that leaves no CPU free of them."""
    k = max(1, math.ceil(cores - 1e-9))
    return allowed[-k:] if k < len(allowed) else None


def pin(slot: Slot, cpus: set[int]) -> int:
    """Every thread of ``slot`` now runs on ``cpus`` only (`sched_setaffinity` per thread: no
    cgroup lock, a few microseconds each); how many were pinned. One that ended meanwhile is
    skipped; its later children and threads inherit the mask."""
    name = "tasks" if slot.version == "v1" else "cgroup.threads"
    try:
        tids = _read(f"{slot.dirs['cpu']}/{name}").split()
    except OSError:
        return 0
    n = 0
    for t in tids:
        try:
            os.sched_setaffinity(int(t), cpus)
            n += 1
        except (OSError, ValueError):  # (ESRCH: it ended)
            pass
    return n
