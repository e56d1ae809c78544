"""Inside a sandbox: start untrusted children and drive them (I/O caps, wall-clock limits).

Runs in the sandbox's init (PID 1 of its PID namespace, root in a private mount namespace).
Invariant: every child drops to the sandbox uid/gid with no_new_privs, its own session and
process group, rlimits and an OOM score of 1000 *before* any untrusted code runs (a `Prepared`
child does all that in advance and only lowers its rlimits to the job's); a child that
outlives its wall-clock limit has its whole process group killed. Output beyond the cap is read
and dropped, and the truncation is reported.
"""

from __future__ import annotations

import atexit  # (imported here, in the fork server: not once per sandbox)
import builtins
import contextlib
import errno
import os
import resource
import selectors
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _linux

if TYPE_CHECKING:
    from .prepared import Prepared

WORKDIR = "/workdir"
# The environment the fork server installed in itself (`set_base_env`), hence the one every
# sandbox starts with: a job whose environment is this one needs no change to `os.environ`.
BASE_ENV: dict[str, str] | None = None
# The syscall filter every action's process installs last (`seccomp.Program`, built once by the
# fork server; None: none, which the start-up probe reports as missing isolation).
FILTER: Any = None
# The compiled set-up path (the `_fastpath` extension), set by the fork server where it is built
# and enabled (`CpuManagerConfig.compiled_setup`); None: the Python functions below.
FAST: Any = None


def set_base_env(env: dict[str, str]) -> None:
    """(Fork server, at start.) Make ``env`` this process's environment, and remember it."""
    global BASE_ENV
    os.environ.clear()
    os.environ.update(env)
    BASE_ENV = dict(env)
_GRACE_S = 0.05  # after exit, how long to wait for descendants still holding the pipes
_LAZY_S = 0.005  # a prepared child's output is first read at its report or after this long


@dataclass(slots=True, kw_only=True)
class Limits:
    uid: int
    gid: int
    cpu_s: int  # RLIMIT_CPU
    fsize: int  # RLIMIT_FSIZE (bytes)
    nofile: int
    output: int  # per stream, bytes
    cpus: float = 1.0


@dataclass(slots=True, kw_only=True)
class Job:
    """One child to run: either argv (exec) or Python source run in the forked interpreter."""

    argv: list[str] | None = None
    python: list[tuple[str, str]] | None = None  # [(source, filename)] executed in order
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    # filled while running
    pid: int = 0
    status: str = ""
    return_code: int | None = None
    started: float = 0.0
    elapsed: float | None = None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    done: bool = False

    def result(self) -> dict[str, Any]:
        return {"status": self.status, "execution_time": self.elapsed,
                "return_code": self.return_code,
                "stdout": self.out.decode("utf-8", "replace"),
                "stderr": self.err.decode("utf-8", "replace"), "truncated": self.truncated}


def _child_setup(limits: Limits, fds: tuple[int, int, int], keep: int = 0) -> None:
    """Become an unprivileged, limited child; fds 0-2 from ``fds``, fds 3..3+keep kept."""
    if FAST is not None:
        FAST.detach(fds[0], fds[1], fds[2], keep)
        _default_signals()
        _fast_drop(limits)
        return
    _child_detach(fds, keep)
    _drop_privileges(limits)


def _default_signals() -> None:
    for sig in _linux.CHILD_DEFAULT_SIGNALS:
        _linux.raw_signal.signal(sig, _linux.SIG_DFL)


def filter_bpf() -> bytes | None:
    """The syscall filter's BPF program, for the compiled path (None: no filter)."""
    return FILTER.bpf if FILTER is not None else None


def _fast_drop(limits: Limits) -> None:
    """(`FAST` only.) The OOM score and cwd of `_child_detach`, then `_drop_privileges`, in C."""
    FAST.drop(b"/workdir", b"1000", limits.fsize, limits.nofile, limits.gid, limits.cpu_s,
              limits.uid, FILTER.bpf if FILTER is not None else None)


def _child_detach(fds: tuple[int, int, int], keep: int) -> None:
    """The privilege-free part of the set-up: own session, fds, signals, OOM score, cwd."""
    os.setsid()
    for i, fd in enumerate(fds):
        if fd != i:
            os.dup2(fd, i)
    os.closerange(3 + keep, 1 << 16)
    _default_signals()
    _linux.write_proc("/proc/self/oom_score_adj", b"1000")
    os.chdir(WORKDIR)


def _drop_privileges(limits: Limits) -> None:
    """rlimits, then the sandbox uid/gid with no groups and no_new_privs (cheap syscalls)."""
    _pre_drop(limits)
    _final_drop(limits)


def _pre_drop(limits: Limits) -> None:
    """The part that does not depend on the job: no core, file size, open files, no groups,
    the sandbox gid (uid stays 0: still our code only)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize, limits.fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
    os.setgroups([])
    os.setresgid(limits.gid, limits.gid, limits.gid)
    _linux.die_with_parent()  # (cleared by the gid change)


def _final_drop(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    # its own cgroup namespace, rooted at its slot (placed by now): /proc/self/cgroup shows "/",
    # not the manager's cgroup path and pid ("tangram-<pid>/s7")
    _linux.unshare(_linux.CLONE_NEWCGROUP)
    os.setresuid(limits.uid, limits.uid, limits.uid)
    _linux.die_with_parent()  # (cleared by the uid change)
    _linux.set_no_new_privs()
    if FILTER is not None:  # last: the syscall filter (docs/sandbox.md, "Syscall filter")
        _linux.install_filter(FILTER.ref)


def _child_python(job: Job, limits: Limits) -> int:
    # (random is reseeded by its own at-fork hook in every child: no two actions share a state)
    if job.env is not BASE_ENV and job.env != BASE_ENV:  # (setting it, or even comparing
        # the two, writes pages: ~60 copy-on-write faults in a fresh fork)
        os.environ.clear()
        os.environ.update(job.env)
    ncpu = max(1, int(limits.cpus + 0.999))
    setattr(os, "cpu_count", lambda: ncpu)  # noqa: B010  (what the code sees)
    glb: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    sys.path[0:1] = [WORKDIR]
    rc = 0
    try:
        for src, filename in job.python or ():
            sys.argv = [filename]
            glb["__file__"] = filename
            # (dont_inherit: not this module's `from __future__ import annotations`; the code
            # runs as `python main.py` would run it)
            exec(compile(src, filename, "exec", dont_inherit=True), glb)
    except BaseException as e:  # (our frame is not the code's: left out of the traceback)
        rc = _code_failed(e, e.__traceback__.tb_next if e.__traceback__ else None)
    return rc


def _code_failed(e: BaseException, tb: Any) -> int:
    """The exit code of Python code that raised ``e``, which is printed as the interpreter
    would print it (with traceback ``tb``). Also called by `_fastpath.direct_take`."""
    if isinstance(e, SystemExit):
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    traceback.print_exception(type(e), e, tb)
    return 1


def _run_child(job: Job, limits: Limits, fds: tuple[int, int, int]) -> None:
    try:
        _child_setup(limits, fds)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: cannot start: {e}\n".encode())
        os._exit(127)
    _exec_job(job, limits)


def _exec_job(job: Job, limits: Limits, status: tuple[int, int] | None = None,
              framed: bool = False) -> None:
    """Run ``job`` in this (already limited, unprivileged) child; never returns.

    ``status`` (fd, inode): where a prepared child reports its exit code *before* exiting, so
    the init need not wait for the kernel to tear this address space down (~1 ms)."""
    rc = 127
    try:
        if job.argv is not None:
            os.execve(job.argv[0], job.argv, job.env)
        rc = _child_python(job, limits)
        try:  # what interpreter shutdown does, only where the code set it up (an import of
            # threading costs ~600 copy-on-write page faults; the fork server does not hold it)
            if "threading" in sys.modules:
                sys.modules["threading"]._shutdown()  # join non-daemon threads
            if atexit._ncallbacks():
                atexit._run_exitfuncs()
        except BaseException:
            pass
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                rc = rc or 120
        if status is not None:
            _report(status, rc, framed)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: cannot start: {e}\n".encode())
    os._exit(rc)


def _report(status: tuple[int, int], rc: int, framed: bool = False) -> None:
    """Send the exit code (output already flushed), if the status socket is still ours (the code
    may have closed it and reused the number). The init then drains the pipes and is done: one
    wake-up, and no wait for the kernel to tear this address space down (~1 ms)."""
    fd, ino = status
    try:
        if os.fstat(fd).st_ino == ino:
            body = b'{"rc":%d}' % (rc & 0xFF) if framed else b""  # framed: to the manager
            os.write(fd, len(body).to_bytes(4, "big") + body if framed
                     else (rc & 0xFF).to_bytes(4, "big"))
    except OSError:
        pass


def _spawn(job: Job, limits: Limits) -> tuple[int, int, int, int]:
    """Fork the child; returns (pidfd, stdin_w, stdout_r, stderr_r)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job.started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _run_child(job, limits, (in_r, out_w, err_w))
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    job.pid = pid
    for fd in (in_w, out_r, err_r):
        os.set_blocking(fd, False)
    return os.pidfd_open(pid), in_w, out_r, err_r


class Driver:
    """Runs jobs, at most ``parallel`` at a time, multiplexing their pipes with one selector."""

    def __init__(self, limits: Limits, parallel: int = 1, prepared: Prepared | None = None) -> None:
        self.limits, self.parallel = limits, max(1, parallel)
        self.prepared = prepared  # used for the first job started, if any
        self.sel = selectors.DefaultSelector()
        self.live: dict[int, dict[str, Any]] = {}  # pid -> state

    def run(self, jobs: list[Job], stop_on_failure: Any = None) -> None:
        """Run every job to completion; stop starting new ones once ``stop_on_failure(job)``."""
        queue = list(jobs)
        stopped = False
        try:
            while queue or self.live:
                while queue and not stopped and len(self.live) < self.parallel:
                    self._start(queue.pop(0))
                if stopped:
                    queue.clear()
                if not self.live:
                    continue
                for job in self._step():
                    if stop_on_failure is not None and stop_on_failure(job):
                        stopped = True
                if stopped:
                    for st in list(self.live.values()):
                        self._kill(st, "Skipped")
        finally:
            for st in list(self.live.values()):
                self._kill(st, "")
            self.sel.close()

    def _start(self, job: Job) -> None:
        got = None
        if self.prepared is not None:
            got, self.prepared = self.prepared.hand_over(job, self.limits), None
        pidfd, in_w, out_r, err_r, ctl = got or (*_spawn(job, self.limits), -1)
        st = {"job": job, "pidfd": pidfd, "in": in_w, "stdin": memoryview(job.stdin),
              "open": {out_r, err_r}, "out": out_r, "err": err_r, "exited_at": None,
              "deadline": job.started + job.timeout, "ctl": ctl, "rc": b"",
              "lazy_until": job.started + _LAZY_S if ctl >= 0 else 0.0}
        self.live[job.pid] = st
        if ctl >= 0:
            self.sel.register(ctl, selectors.EVENT_READ, (st, "status"))
        self.sel.register(pidfd, selectors.EVENT_READ, (st, "exit"))
        if not st["lazy_until"]:
            self._watch_pipes(st)
        if job.stdin:
            self.sel.register(in_w, selectors.EVENT_WRITE, (st, "in"))
        else:
            os.close(in_w)
            st["in"] = -1

    def _watch_pipes(self, st: dict[str, Any]) -> None:
        """Read the output as it comes from now on (a prepared child's short job is read once,
        when it reports its exit code: a wake-up per write would preempt it on a busy core)."""
        st["lazy_until"] = 0.0
        for fd, what in ((st["out"], "out"), (st["err"], "err")):
            if fd in st["open"]:
                self.sel.register(fd, selectors.EVENT_READ, (st, what))

    def _step(self) -> list[Job]:
        now = time.monotonic()
        wake = min(self._wake_time(st) for st in self.live.values())
        for key, _ in self.sel.select(max(0.0, wake - now)):
            st, what = key.data
            if st["job"].done:
                continue
            if what == "exit":
                self._reap(st)
            elif what == "status":
                self._status(st)
            elif what == "in":
                self._feed(st)
            else:
                self._read(st, key.fd, what)
        finished = []
        now = time.monotonic()
        for st in list(self.live.values()):
            job = st["job"]
            if st["lazy_until"] and now >= st["lazy_until"]:
                self._watch_pipes(st)
            if st["exited_at"] is None and len(st["rc"]) == 4:
                self._reported(st)
            elif st["exited_at"] is None and now >= st["deadline"]:
                self._kill(st, "TimeLimitExceeded")
            elif st["exited_at"] is not None and (not st["open"] or now >= st["exited_at"] + _GRACE_S):
                self._finish(st)
            if job.done:
                finished.append(job)
        return finished

    def _status(self, st: dict[str, Any]) -> None:
        try:
            data = os.read(st["ctl"], 8)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        st["rc"] += data
        if not data or len(st["rc"]) >= 4:
            self._close_ctl(st)

    def _close_ctl(self, st: dict[str, Any]) -> None:
        if st["ctl"] >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(st["ctl"])
            os.close(st["ctl"])
            st["ctl"] = -1

    def _reported(self, st: dict[str, Any]) -> None:
        """The child sent its exit code and closed its output: done, without waiting for the
        kernel to finish its exit; anything of its process group still running is killed."""
        job: Job = st["job"]
        job.elapsed = round(time.monotonic() - job.started, 6)
        job.return_code = int.from_bytes(st["rc"][:4], "big")
        job.status = job.status or "Finished"
        st["exited_at"] = time.monotonic()
        if st["pidfd"] >= 0:
            self.sel.unregister(st["pidfd"])
            os.close(st["pidfd"])
            st["pidfd"] = -1
        _killpg(job.pid)
        for fd, what in ((st["out"], "out"), (st["err"], "err")):  # flushed before the report
            while fd in st["open"] and self._read(st, fd, what) == 1 << 16:
                pass
        self._finish(st)

    def _wake_time(self, st: dict[str, Any]) -> float:
        if st["exited_at"] is not None:
            return st["exited_at"] + _GRACE_S
        return min(st["deadline"], st["lazy_until"] or st["deadline"])

    def _feed(self, st: dict[str, Any]) -> None:
        try:
            n = os.write(st["in"], st["stdin"][:65536])
            st["stdin"] = st["stdin"][n:]
        except BlockingIOError:
            return
        except OSError:
            st["stdin"] = st["stdin"][:0]
        if not st["stdin"]:
            self.sel.unregister(st["in"])
            os.close(st["in"])
            st["in"] = -1

    def _read(self, st: dict[str, Any], fd: int, what: str) -> int:
        """Read one chunk; returns its size (0 at end of file or when nothing is there)."""
        job: Job = st["job"]
        buf = job.out if what == "out" else job.err
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            os.close(fd)
            st["open"].discard(fd)
            return 0
        room = self.limits.output - len(buf)
        if room < len(data):
            job.truncated = True
        if room > 0:
            buf += data[:room]
        return len(data)

    def _reap(self, st: dict[str, Any]) -> None:
        job: Job = st["job"]
        try:
            pid, status, _ru = os.wait4(job.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = job.pid, 0
        if pid == 0:
            return
        job.elapsed = round(time.monotonic() - job.started, 6)
        if os.WIFSIGNALED(status):
            job.return_code = -os.WTERMSIG(status)
        else:
            job.return_code = os.WEXITSTATUS(status)
        if not job.status:
            job.status = "Finished"
        st["exited_at"] = time.monotonic()
        if st["lazy_until"]:
            self._watch_pipes(st)  # collect the rest as it comes (and the EOFs)
        self.sel.unregister(st["pidfd"])
        os.close(st["pidfd"])
        st["pidfd"] = -1
        _killpg(job.pid)  # leftovers of its process group

    def _kill(self, st: dict[str, Any], status: str) -> None:
        job: Job = st["job"]
        if status and not job.status:
            job.status = status
        _killpg(job.pid)
        if st["pidfd"] >= 0:
            with contextlib.suppress(OSError):
                os.kill(job.pid, signal.SIGKILL)
            os.waitid(os.P_PIDFD, st["pidfd"], os.WEXITED | os.WNOWAIT)
            self._reap(st)
        if status == "TimeLimitExceeded":
            job.status = status
        self._finish(st)

    def _finish(self, st: dict[str, Any]) -> None:
        job: Job = st["job"]
        for fd in list(st["open"]) + ([st["in"]] if st["in"] >= 0 else []):
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            os.close(fd)
        st["open"].clear()
        st["in"] = -1
        self._close_ctl(st)
        if not job.status:
            job.status = "Finished"
        job.done = True
        self.live.pop(job.pid, None)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as e:
        if e.errno not in (errno.ESRCH, errno.EPERM):
            raise
