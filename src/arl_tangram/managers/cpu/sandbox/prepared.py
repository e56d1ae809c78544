"""Inside a sandbox: the action's child forked in advance, waiting for its job.

Invariant: a prepared child runs only our code until its job arrives; it waits as uid 0 of the
sandbox (so a warm sandbox holds no process of the sandbox uid), and before any of the job's code
runs it applies the job's rlimits, drops to the sandbox uid/gid and sets no_new_privs (see
`child.final_drop`). What it can do in advance (fork, session, fds, OOM score, job-independent
rlimits, groups, gid, and the copy-on-write faults of compiling and running Python) it does while
the sandbox is warm, off the action's critical path.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import marshal
import os
import resource
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from . import child
from .child import Job, Limits


@dataclass(slots=True)
class Prepared:
    """A child forked in advance (set up, still root of the sandbox), blocked reading its job."""

    pid: int
    ctl: int  # our end of its control socket: the job goes out, its exit code comes back
    fds: tuple[int, int, int]  # our ends: stdin (write), stdout (read), stderr (read)

    def hand_over(self, job: Job, limits: Limits) -> tuple[int, ...] | None:
        """Give ``job`` to the child: (pidfd, stdin_w, stdout_r, stderr_r, control socket), or
        None when it is gone (the caller forks a child instead)."""
        return _hand_over(job, limits, self)


def prepare(limits: Limits) -> Prepared:
    """Fork a child that does the costly part of `child.setup` now and waits for a job on fd 3.

    It waits as root of the sandbox (only our code runs in it until then), so a warm sandbox has
    no process of the sandbox uid; when the job arrives it applies the job's rlimits and drops to
    the sandbox uid/gid with no_new_privs (a handful of syscalls) before any untrusted code runs.
    """
    a, b = socket.socketpair()
    ctl_w, ctl_r = a.detach(), b.detach()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            hi = [fcntl.fcntl(fd, fcntl.F_DUPFD, 300) for fd in (ctl_r, in_r, out_w, err_w)]
            os.dup2(hi[0], 3)
            child.detach((hi[1], hi[2], hi[3]), keep=1)
            child.pre_drop(limits)
            warm_child()
            job, lim, status = _read_job(3, limits)
        except BaseException:
            os._exit(0)  # unused (the sandbox went away) or broken: the init falls back to fork
        child.exec_job(job, lim, status)
    for fd in (ctl_r, in_r, out_w, err_w):
        os.close(fd)
    for fd in (out_r, err_r):  # room for a whole typical output: no wake-up per write
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    return Prepared(pid, ctl_w, (in_w, out_r, err_r))


def warm_child() -> None:
    """Take now, while idle, the copy-on-write faults the job's path would take (compiling and
    running code, reading the job), so that the action itself pays only for its own code."""
    glb: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile("x = [i for i in range(3)]\ny = {'a': str(x)}\nz = len(y)\n", "w", "exec"), glb)
    msg = marshal.loads(marshal.dumps({"argv": None, "python": [("", "")], "env": {"A": "1"},
                                       "cpu_s": 1, "fsize": 1, "nofile": 1, "cpus": 1.0}))
    Job(argv=msg["argv"], python=msg["python"], env=msg["env"])
    print("", end="", file=sys.stdout)  # the print path, without output
    print("", end="", file=sys.stderr)


def _read_job(fd: int, base: Limits) -> tuple[Job, Limits, tuple[int, int]]:
    hdr = _read_exact(fd, 4)
    msg = marshal.loads(_read_exact(fd, int.from_bytes(hdr, "big")))  # from the init: trusted
    # out of the code's way, not exec'd; below the open-files limit `pre_drop` set (F_DUPFD
    # refuses a start at or above it: with `max_open_files` <= 900 the child would exit)
    status = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(4, min(900, base.nofile - 1)))
    os.close(fd)
    lim = Limits(uid=base.uid, gid=base.gid, cpu_s=msg["cpu_s"], fsize=min(msg["fsize"], base.fsize),
                 nofile=min(msg["nofile"], base.nofile), output=0, cpus=msg["cpus"])
    if (lim.fsize, lim.nofile) != (base.fsize, base.nofile):
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.fsize, lim.fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim.nofile, lim.nofile))
    child.final_drop(lim)
    job = Job(argv=msg["argv"], python=msg["python"], env=msg["env"])
    return job, lim, (status, os.fstat(status).st_ino)


def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        b = os.read(fd, n - len(buf))
        if not b:
            raise EOFError
        buf += b
    return buf


def _hand_over(job: Job, limits: Limits, prep: Prepared) -> tuple[int, ...] | None:
    blob = marshal.dumps({"argv": job.argv, "python": job.python, "env": job.env,
                          "cpu_s": limits.cpu_s, "fsize": limits.fsize, "nofile": limits.nofile,
                          "cpus": limits.cpus})
    job.started = time.monotonic()
    try:
        pidfd = os.pidfd_open(prep.pid)
        os.write(prep.ctl, len(blob).to_bytes(4, "big") + blob[:60000])
        view = memoryview(blob)[60000:]
        while view:  # the child reads it whole before running anything
            view = view[os.write(prep.ctl, view):]
    except OSError:
        child.killpg(prep.pid)
        for fd in (prep.ctl, *prep.fds):
            os.close(fd)
        return None
    job.pid = prep.pid
    for fd in (*prep.fds, prep.ctl):
        os.set_blocking(fd, False)
    return (pidfd, *prep.fds, prep.ctl)
