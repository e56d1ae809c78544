"""The reaper: what a CPU manager leaves on the host goes when the service dies (issue 41).

Run as ``python -P -m arl_tangram.managers.cpu.reaper.server FD PID`` by the manager (as root,
in a session of its own, so that a signal to the service's process group spares it), with FD one
end of a SOCK_SEQPACKET pair and PID the service's pid. The first message on FD is the
configuration (JSON): ``cgroups`` (the manager's cgroup base directories, one per hierarchy),
``freezer`` (its v1 freezer base, or null), ``layers`` (``[dir, prefix]``: its layer files'
directory and the prefix of their names, or null); ``{"op": "config", ...}`` adds to it later.

Invariant: when the service's pidfd fires (it died: kill -9, a crash, the OOM killer) or the
manager closes FD (it closed), the reaper kills the fork servers it started, thaws every freezer
cgroup of the manager (a frozen task cannot die), kills every process left in the manager's
cgroups until they are empty (retrying, `CLEAN_S` at most), removes them, unlinks the manager's
layer files, and exits: a session's processes, its loop device (it clears itself once the last
mount of the layer, held by the session's mount namespace, is gone), its frozen cgroups and its
layer go within a second or so, without a restart. The manager's processes are found by cgroup,
not by parentage, so a process reparented anywhere is found too.

While the service lives the reaper is also a child subreaper and the parent of the manager's
fork server (``{"op": "zygote", "argv": [...], "env": {...}}`` with the fork server's control
socket as the one fd: it forks and execs it, with that socket as fd 3, and answers
``{"pid": N}``): sandboxes orphaned by a dead fork server (sessions, which do not die with it)
become its children and are reaped here, and the end of each fork server it started is sent to
the manager as ``{"exit": N, "rc": RC}`` (``-signal`` when killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from .. import _linux

CLEAN_S = 8.0  # the most the clean-up retries a cgroup that does not empty
_PAUSE_S = 0.02


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write(value)


def _subdirs(base: str) -> list[str]:
    try:
        return [os.path.join(base, n) for n in os.listdir(base)
                if os.path.isdir(os.path.join(base, n))]
    except OSError:
        return []


def _reap() -> list[tuple[int, int]]:
    """Reap every child that has ended: (pid, rc) each, rc ``-signal`` when killed."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, -os.WTERMSIG(status) if os.WIFSIGNALED(status)
                    else os.WEXITSTATUS(status)))


def clean(cfg: dict[str, Any], zygotes: set[int], limit_s: float = CLEAN_S) -> list[str]:
    """Kill and remove what the manager left (see the module's invariant): the directories
    still there after ``limit_s`` (empty when all went)."""
    for pid in zygotes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    bases = [b for b in cfg.get("cgroups") or () if isinstance(b, str)]
    freezer = cfg.get("freezer")
    deadline = time.monotonic() + limit_s
    while True:
        fz = _subdirs(freezer) if isinstance(freezer, str) else []
        slots = [d for b in bases for d in _subdirs(b)]
        for d in fz:  # v1: a frozen task cannot die; thawed first
            _write(f"{d}/freezer.state", "THAWED")
        for d in slots:
            if os.path.exists(f"{d}/cgroup.freeze"):  # (v2: the slot is the freezer)
                _write(f"{d}/cgroup.freeze", "0")
        left = []
        for d in fz + slots:
            for p in _read(f"{d}/cgroup.procs").split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(p), signal.SIGKILL)
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        _reap()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(_PAUSE_S)
    for b in ([freezer] if isinstance(freezer, str) else []) + bases:
        try:
            os.rmdir(b)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(b)
    layers = cfg.get("layers")
    if isinstance(layers, list) and len(layers) == 2:
        d, prefix = layers
        with contextlib.suppress(OSError):
            for n in os.listdir(d):
                if n.startswith(prefix) and n.endswith(".ext4"):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(d, n))
    return left


def _start_zygote(msg: dict[str, Any], fds: list[int], ctl: int) -> dict[str, Any]:
    """Fork and exec a fork server (``msg["argv"]``, ``msg["env"]``) with ``fds[0]`` as its
    fd 3, in ``/``, stdin and stdout on /dev/null, stderr ours."""
    if len(fds) != 1 or not isinstance(msg.get("argv"), list) or not isinstance(msg.get("env"), dict):
        for fd in fds:
            os.close(fd)
        return {"error": "bad zygote request"}
    argv = [str(a) for a in msg["argv"]]
    env = {str(k): str(v) for k, v in msg["env"].items()}
    try:
        pid = os.fork()
    except OSError as e:
        os.close(fds[0])
        return {"error": f"fork: {e}"}
    if pid == 0:
        try:
            for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD):
                signal.signal(s, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            high = os.dup(fds[0])
            os.dup2(high, 3)  # (inheritable)
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.closerange(4, 1 << 16)
            os.chdir("/")
            os.execve(argv[0], argv, env)
        except BaseException:
            pass
        os._exit(127)
    os.close(fds[0])
    return {"pid": pid}


def serve(ctl: socket.socket, parent: int) -> None:
    cfg: dict[str, Any] = {}
    msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 4)
    for fd in fds:
        os.close(fd)
    if msg:
        cfg = json.loads(msg)
    try:
        pidfd = os.pidfd_open(parent)
    except OSError:
        pidfd = -1
    zygotes: set[int] = set()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(w)
    if not msg or pidfd < 0 or os.getppid() != parent:  # (the service is gone already)
        clean(cfg, zygotes)
        return
    poll = select.poll()
    for fd in (ctl.fileno(), pidfd, r):
        poll.register(fd, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poll.poll()}
        except InterruptedError:
            continue
        if r in ready:
            with contextlib.suppress(OSError):
                os.read(r, 4096)
        for pid, rc in _reap():
            if pid in zygotes:
                zygotes.discard(pid)
                with contextlib.suppress(OSError):
                    ctl.send(json.dumps({"exit": pid, "rc": rc}).encode())
        if pidfd in ready:
            break  # the service died
        if ctl.fileno() in ready:
            try:
                msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 4)
            except OSError:
                msg, fds = b"", []
            if not msg:
                break  # the manager closed (or died)
            try:
                req = json.loads(msg)
            except ValueError:
                req = {}
            if req.get("op") == "zygote":
                reply = _start_zygote(req, fds, ctl.fileno())
                if "pid" in reply:
                    zygotes.add(int(reply["pid"]))
            elif req.get("op") == "config":  # (what the manager made after it started us)
                for fd in fds:
                    os.close(fd)
                cfg.update({k: v for k, v in req.items() if k != "op"})
                reply = {"ok": True}
            else:
                for fd in fds:
                    os.close(fd)
                reply = {"error": f"unknown op {req.get('op')!r}"}
            with contextlib.suppress(OSError):
                ctl.send(json.dumps(reply).encode())
    clean(cfg, zygotes)


def main() -> None:
    _linux.set_name("tangram-reaper")
    # the service's terminal, or a stop sent to every process of its unit (systemd's default
    # SIGTERM to the whole control group): it ends by itself once the service is gone, after
    # cleaning; SIGKILL still ends it
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
    ctl = socket.socket(fileno=int(sys.argv[1]))
    serve(ctl, int(sys.argv[2]))
    _reap()
    os._exit(0)


if __name__ == "__main__":
    main()
