"""Inside a sandbox: start untrusted children and drive them (I/O caps, wall-clock limits).

Runs in the sandbox's init (PID 1 of its PID namespace, root in a private mount namespace).
Invariant: every child drops to the sandbox uid/gid with no_new_privs, its own session and
process group, rlimits and an OOM score of 1000 *before* any untrusted code runs (a `Prepared`
child does all that in advance and only lowers its rlimits to the job's); a child that
outlives its wall-clock limit has its whole process group killed. Output beyond the cap is read
and dropped, and the truncation is reported.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from typing import Any

from . import child
from .child import Job, Limits
from .prepared import Prepared

_GRACE_S = 0.05  # after exit, how long to wait for descendants still holding the pipes
_LAZY_S = 0.005  # a prepared child's output is first read at its report or after this long


def _spawn(job: Job, limits: Limits) -> tuple[int, int, int, int]:
    """Fork the child; returns (pidfd, stdin_w, stdout_r, stderr_r)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job.started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child.run_child(job, limits, (in_r, out_w, err_w))
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    job.pid = pid
    for fd in (in_w, out_r, err_r):
        os.set_blocking(fd, False)
    return os.pidfd_open(pid), in_w, out_r, err_r


class Driver:
    """Runs jobs, at most ``parallel`` at a time, multiplexing their pipes with one selector."""

    def __init__(self, limits: Limits, parallel: int = 1, prepared: Prepared | None = None,
                 deadline: float = float("inf")) -> None:
        self.limits, self.parallel = limits, max(1, parallel)
        self.prepared = prepared  # used for the first job started, if any
        # (monotonic) when every job must be over: the action's own `timeout_s`, which bounds
        # the jobs together (each job's own timeout still bounds it alone)
        self.deadline = deadline
        self.cut = False  # the deadline stopped the run: a job killed at it, or left unstarted
        self.sel = selectors.DefaultSelector()
        self.live: dict[int, dict[str, Any]] = {}  # pid -> state

    def run(self, jobs: list[Job], stop_on_failure: Any = None) -> None:
        """Run every job to completion; stop starting new ones once ``stop_on_failure(job)``,
        or once the deadline has passed (those left are not started: ``done`` stays False, and
        the live ones are killed at it, `TimeLimitExceeded`)."""
        queue = list(jobs)
        stopped = False
        try:
            while queue or self.live:
                while queue and not stopped and len(self.live) < self.parallel:
                    if time.monotonic() >= self.deadline:
                        self.cut, stopped = True, True
                        break
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
              "deadline": min(job.started + job.timeout, self.deadline), "ctl": ctl, "rc": b"",
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
                self.cut = self.cut or now >= self.deadline
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
        child.killpg(job.pid)
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
        child.killpg(job.pid)  # leftovers of its process group

    def _kill(self, st: dict[str, Any], status: str) -> None:
        job: Job = st["job"]
        if status and not job.status:
            job.status = status
        child.killpg(job.pid)
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
