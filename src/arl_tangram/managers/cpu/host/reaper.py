"""Manager side of the reaper (`reaper.server`): start it, have it start fork servers, close it.

Invariant: a manager that has started holds one reaper for its whole life; it knows the
manager's cgroup trees and layer files from its start, so whatever kills the service, they go
within `reaper.server.CLEAN_S` without a restart. Only `Reaper.close` (the manager's own close,
after it has removed what it could) ends it while the service lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any


def zygote_env() -> dict[str, str]:
    """The fork server's (and the reaper's) environment: nothing of the service's own (tokens,
    configuration).

    In-process Python actions are forks of the fork server, and /proc/self/environ shows the
    environment its interpreter was started with, whatever os.environ says later.
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.environ.get("PYTHONPATH"):  # where the package itself is found when not installed
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


class Reaper:
    """The reaper process and its control socket (SOCK_SEQPACKET). Thread-safe: the fork
    server is started from the event loop's thread and waited for from worker threads."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "arl_tangram.managers.cpu.reaper.server",
             str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            close_fds=True, env=zygote_env(), cwd="/", start_new_session=True)
        theirs.close()
        self.ctl = ours
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}  # fork server pid -> its exit status (as the reaper saw)
        self.gone = False  # its socket closed: it died (its fork servers with it, PDEATHSIG)
        ours.send(json.dumps(cfg).encode())

    def _recv(self, timeout: float) -> dict[str, Any] | None:
        """One message (None: none within ``timeout``, or the reaper is gone); exit reports are
        kept in `_exits`. Call with the lock held."""
        if self.gone:
            return None
        r, _, _ = select.select([self.ctl], [], [], max(0.0, timeout))
        if not r:
            return None
        try:
            msg = self.ctl.recv(1 << 16)
        except OSError:
            msg = b""
        if not msg:
            self.gone = True
            return None
        out: dict[str, Any] = json.loads(msg)
        if "exit" in out:
            self._exits[int(out["exit"])] = int(out["rc"])
        return out

    def configure(self, **cfg: Any) -> None:
        """Add to what the reaper cleans (`reaper.server`: ``freezer``, ``layers``)."""
        with self._lock:
            try:
                self.ctl.send(json.dumps({"op": "config", **cfg}).encode())
            except OSError as e:
                raise OSError(e.errno, f"the reaper is gone: {e}") from None
            deadline = time.monotonic() + 10.0
            while True:
                msg = self._recv(deadline - time.monotonic())
                if msg is None:
                    raise OSError("the reaper did not answer")
                if "ok" in msg:
                    return

    def start_zygote(self, argv: list[str], env: dict[str, str], fd: int) -> int:
        """Have the reaper fork and exec a fork server (``argv``, ``env``; ``fd`` becomes its
        fd 3): its pid. OSError when the reaper cannot."""
        with self._lock:
            try:
                socket.send_fds(self.ctl, [json.dumps({"op": "zygote", "argv": argv,
                                                       "env": env}).encode()], [fd])
            except OSError as e:
                raise OSError(e.errno, f"the reaper is gone: {e}") from None
            deadline = time.monotonic() + 10.0
            while True:
                msg = self._recv(deadline - time.monotonic())
                if msg is None:
                    raise OSError("the reaper did not start the fork server")
                if "pid" in msg:
                    return int(msg["pid"])
                if "error" in msg:
                    raise OSError(f"the reaper could not start the fork server: {msg['error']}")

    def exit_status(self, pid: int, timeout: float = 0.0) -> int | None:
        """How fork server ``pid`` ended (``-signal`` when killed), once the reaper has reaped
        it; None while it runs (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while pid not in self._exits:
                if self.gone:
                    return -int(signal.SIGKILL)  # (it died with the reaper: PDEATHSIG)
                if self._recv(deadline - time.monotonic()) is None \
                        and time.monotonic() >= deadline:
                    return None
            return self._exits[pid]

    def close(self, timeout: float = 15.0) -> None:
        """Blocking (run it in a thread): the manager is done; the reaper cleans what is left
        (nothing, after a clean close) and exits, reaped here."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ReapedProc:
    """A fork server the reaper started, with the part of `subprocess.Popen` the fork server's
    client uses (`pid`, `kill`, `wait`, `returncode`)."""

    def __init__(self, reaper: Reaper, pid: int) -> None:
        self.reaper, self.pid = reaper, pid
        self.returncode: int | None = None
        try:  # (signals go by pidfd: once reaped, its pid may be another process's)
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            self._pidfd = -1

    def kill(self) -> None:
        if self.returncode is None and self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            rc = self.reaper.exit_status(self.pid, 3600.0 if timeout is None else timeout)
            if rc is None:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            self.returncode = rc
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
        return self.returncode
