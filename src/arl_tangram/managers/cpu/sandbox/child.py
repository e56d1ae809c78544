"""Inside a sandbox: the steps every child takes before the action's code, and the job it runs.

Runs in: a child of a sandbox's init (or of a session worker), forked from the init; the fork
server sets `FAST`, `FILTER` and `BASE_ENV` once before any fork. Shared by `proc` (children
forked on demand), `prepared` (children forked in advance) and `session_worker`; the compiled
twin of `detach`, `fast_drop`, `exec_job` + `exec_python` is `zygote/_fastpath.c` (a change
here must be made there too).
Invariant: every child drops to the sandbox uid/gid with no_new_privs, its own session and
process group, rlimits and an OOM score of 1000 *before* any untrusted code runs; the syscall
filter is installed last (`final_drop`).
"""

from __future__ import annotations

import atexit  # (imported here, in the fork server: not once per sandbox)
import builtins
import contextlib
import errno
import os
import resource
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from .. import _linux

WORKDIR = "/workdir"
# Where every child starts: the work directory, or in an image its ``WorkingDir`` (set by the
# init in `imagebox.enter`, before it forks any child).
CWD = WORKDIR
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


def setup(limits: Limits, fds: tuple[int, int, int], keep: int = 0) -> None:
    """Become an unprivileged, limited child; fds 0-2 from ``fds``, fds 3..3+keep kept."""
    if FAST is not None:
        FAST.detach(fds[0], fds[1], fds[2], keep)
        default_signals()
        fast_drop(limits)
        return
    detach(fds, keep)
    drop_privileges(limits)


def default_signals() -> None:
    for sig in _linux.CHILD_DEFAULT_SIGNALS:
        _linux.raw_signal.signal(sig, _linux.SIG_DFL)


def filter_bpf() -> bytes | None:
    """The syscall filter's BPF program, for the compiled path (None: no filter)."""
    return FILTER.bpf if FILTER is not None else None


def fast_drop(limits: Limits) -> None:
    """(`FAST` only.) The OOM score and cwd of `detach`, then `drop_privileges`, in C."""
    FAST.drop(b"/workdir" if CWD is WORKDIR else CWD.encode(), b"1000", limits.fsize,
              limits.nofile, limits.gid, limits.cpu_s, limits.uid,
              FILTER.bpf if FILTER is not None else None)


def detach(fds: tuple[int, int, int], keep: int) -> None:
    """The privilege-free part of the set-up: own session, fds, signals, OOM score, cwd."""
    os.setsid()
    for i, fd in enumerate(fds):
        if fd != i:
            os.dup2(fd, i)
    os.closerange(3 + keep, 1 << 16)
    default_signals()
    _linux.write_proc("/proc/self/oom_score_adj", b"1000")
    os.chdir(CWD)


def drop_privileges(limits: Limits) -> None:
    """rlimits, then the sandbox uid/gid with no groups and no_new_privs (cheap syscalls)."""
    pre_drop(limits)
    final_drop(limits)


def pre_drop(limits: Limits) -> None:
    """The part that does not depend on the job: no core, file size, open files, no groups,
    the sandbox gid (uid stays 0: still our code only)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize, limits.fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
    os.setgroups([])
    os.setresgid(limits.gid, limits.gid, limits.gid)
    _linux.die_with_parent()  # (cleared by the gid change)


def final_drop(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    # its own cgroup namespace, rooted at its slot (placed by now): /proc/self/cgroup shows "/",
    # not the manager's cgroup path and pid ("tangram-<pid>/s7")
    _linux.unshare(_linux.CLONE_NEWCGROUP)
    os.setresuid(limits.uid, limits.uid, limits.uid)
    _linux.die_with_parent()  # (cleared by the uid change)
    _linux.set_no_new_privs()
    if FILTER is not None:  # last: the syscall filter (docs/sandbox.md, "Syscall filter")
        _linux.install_filter(FILTER.ref)


def exec_python(job: Job, limits: Limits) -> int:
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
        rc = code_failed(e, e.__traceback__.tb_next if e.__traceback__ else None)
    return rc


def code_failed(e: BaseException, tb: Any) -> int:
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


def run_child(job: Job, limits: Limits, fds: tuple[int, int, int]) -> None:
    try:
        setup(limits, fds)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: cannot start: {e}\n".encode())
        os._exit(127)
    exec_job(job, limits)


def exec_job(job: Job, limits: Limits, status: tuple[int, int] | None = None,
              framed: bool = False) -> None:
    """Run ``job`` in this (already limited, unprivileged) child; never returns.

    ``status`` (fd, inode): where a prepared child reports its exit code *before* exiting, so
    the init need not wait for the kernel to tear this address space down (~1 ms)."""
    rc = 127
    try:
        if job.argv is not None:
            os.execve(job.argv[0], job.argv, job.env)
        rc = exec_python(job, limits)
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
            report(status, rc, framed)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: cannot start: {e}\n".encode())
    os._exit(rc)


def report(status: tuple[int, int], rc: int, framed: bool = False) -> None:
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


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as e:
        if e.errno not in (errno.ESRCH, errno.EPERM):
            raise
