"""Inside a sandbox: the persistent workers of a session (a Python interpreter, a bash shell).

Invariant: a worker is an untrusted child (sandbox uid, no_new_privs, rlimits) that keeps its
state between exchanges; the sandbox init talks to it only through pipes, enforces the wall-clock
limit of each exchange, and on a timeout or a crash kills its process group and forgets it (the
next exchange starts a fresh worker, and the result says the state was lost). Each exchange's
code is shown the cores of the action it belongs to (`Worker.show`: os.cpu_count() in Python,
the `CPU_VARS` in the environment), which may differ from the worker's first action.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import fcntl
import os
import secrets
import selectors
import shlex
import signal
import sys
import time
import traceback
from typing import Any

from .. import wire
from . import child, imagebox

# The environment that tells code its cores (`payload.env_for`); set again, in a session, for
# each action whose cores differ from the last one's.
CPU_VARS = ("TANGRAM_CPUS", "OMP_NUM_THREADS")

_BASH_PRELUDE = (
    "__tangram_run() { local __tangram_c; __tangram_c=$(cat); eval \"$__tangram_c\" </dev/null;"
    " printf '%d\\n' $? >&3; }\n"
)


def _python_loop() -> None:
    """The Python worker: exec each request in one persistent namespace; echo a last expression."""
    glb: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    sys.path[0:1] = [child.WORKDIR]
    while True:
        try:
            req = wire.read_frame_fd(3)
        except EOFError:
            os._exit(0)
        if "cpus" in req:  # this action's cores (`Worker.show`)
            _show_cpus(int(req["cpus"]), req["env"])
        rc = 0
        try:
            tree = ast.parse(req["code"], "<session>", "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<session>", "exec", dont_inherit=True), glb)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<session>", "eval",
                                     dont_inherit=True), glb)
                if value is not None:
                    print(repr(value))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            tb = e.__traceback__.tb_next if e.__traceback__ else None
            traceback.print_exception(type(e), e, tb)
            rc = 1
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                s.flush()
        wire.write_frame_fd(4, {"rc": rc})


def _show_cpus(n: int, env: dict[str, str]) -> None:
    setattr(os, "cpu_count", lambda: n)  # noqa: B010  (what the code sees, as in `proc`)
    os.environ.update(env)


class Worker:
    """One persistent child and the pipes to it."""

    def __init__(self, lang: str, limits: child.Limits, env: dict[str, str]) -> None:
        self.lang = lang
        self.shown: tuple[int, dict[str, str]] | None = None  # the cores its code was last shown
        self._show: tuple[int, dict[str, str]] | None = None  # ... and to show with the next send
        ctl_r, ctl_w = os.pipe()  # init -> worker (python requests / bash stdin)
        done_r, done_w = os.pipe()  # worker -> init (completion)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200) for fd in (ctl_r, done_w)]
        try:
            pid = os.fork()
        except OSError:  # (EAGAIN: the sandbox's pids.max) nothing of it is left open
            for fd in (ctl_r, ctl_w, done_r, done_w, out_r, out_w, err_r, err_w, *hi):
                os.close(fd)
            raise
        if pid == 0:
            self._child(lang, limits, env, hi, out_w, err_w)
        for fd in (ctl_r, done_w, out_w, err_w, *hi):
            os.close(fd)
        # (our child, not reaped yet: the pidfd names it, and only it, from now on)
        self.pidfd = os.pidfd_open(pid)
        self.pid, self.ctl, self.done, self.out, self.err = pid, ctl_w, done_r, out_r, err_r
        for fd in (done_r, out_r, err_r):
            os.set_blocking(fd, False)
        if lang == "bash":
            os.write(self.ctl, _BASH_PRELUDE.encode())

    @staticmethod
    def _child(lang: str, limits: child.Limits, env: dict[str, str], hi: list[int],
               out_w: int, err_w: int) -> None:
        try:
            out_w, err_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 300) for fd in (out_w, err_w))
            if lang == "bash":
                os.dup2(hi[0], 0)
                os.dup2(hi[1], 3)
                child.setup(limits, (0, out_w, err_w), keep=1)
                if imagebox.SHELL:  # the image's Entrypoint + Cmd, which start a shell
                    os.execvpe(imagebox.SHELL[0], imagebox.SHELL, env)
                os.execve("/bin/bash", ["/bin/bash", "--noprofile", "--norc"], env)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(hi[0], 3)
            os.dup2(hi[1], 4)
            child.setup(limits, (null, out_w, err_w), keep=2)
            if imagebox.python:  # in an image: its own python3 runs the same loop
                os.execve(imagebox.python, [imagebox.python, "-u", "-c", imagebox.PYTHON_LOOP],
                          env)
            os.environ.clear()
            os.environ.update(env)
            _python_loop()
        except BaseException as e:
            os.write(2, f"session worker failed: {e}\n".encode())
        os._exit(127)

    def show(self, cpus: float, env: dict[str, str]) -> None:
        """Show the next exchange's code ``cpus`` cores (its action's `limits.cpus`) and those
        of ``env``'s `CPU_VARS`; sent only where they differ from what the worker has."""
        shown = (max(1, int(cpus + 0.999)), {k: env[k] for k in CPU_VARS if k in env})
        self._show = None if shown == self.shown else shown
        self.shown = shown

    def send(self, code: str) -> None:
        show, self._show = self._show, None
        if self.lang == "bash":
            tag = "__TANGRAM_EOF_" + secrets.token_hex(8)
            env = show[1] if show is not None else {}
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            pre = f"export {exports}\n" if exports else ""
            data = f"{pre}__tangram_run <<'{tag}'\n{code}\n{tag}\n".encode()
        else:
            msg: dict[str, Any] = {"code": code}
            if show is not None:
                msg["cpus"], msg["env"] = show
            data = wire.encode(msg)
        view = memoryview(data)
        while view:  # the worker reads it whole before running, so a blocking write is fine
            view = view[os.write(self.ctl, view):]

    def kill(self) -> None:
        """Kill the worker and what it started, reap it, close its pipes.

        Through the pidfd taken at its fork: init's `_reap_all` reaps any child that ends between
        two requests, and a reaped worker's pid may name another process of the sandbox (another
        language's worker); then neither that pid nor a group of it is signalled. A second call
        does nothing (its fds, closed by the first, may be others' by then)."""
        if self.pidfd == -1:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # reaped already
        else:
            # Its pid is still its own (a zombie at least), so a group of that pid is the one it
            # made. Before its `setsid` (in `child.setup`) there is none: the kill above is what
            # ends a worker that would block reading its requests.
            child.killpg(self.pid)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
        for fd in (self.pidfd, self.ctl, self.done, self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pidfd = -1


# Why a session's worker could not start: the sandbox's process limit (cgroup pids.max) is
# reached, held by processes earlier actions of the session left running (background jobs).
PIDS_FULL = ("the sandbox's process limit is reached: processes earlier actions of this session "
             "left running hold it; stop them (the bash session's `kill`) or open a new session")


def no_worker(lang: str) -> dict[str, Any]:
    """The stage result of an exchange whose worker could not be forked (EAGAIN)."""
    return _stage("Error", time.monotonic(), None, b"",
                  f"could not start the {lang} session process: {PIDS_FULL}\n".encode(), False)


def exchange(w: Worker, code: str, timeout: float, cap: int) -> tuple[dict[str, Any], bool]:
    """Run one request in the worker; returns (stage result, worker still alive)."""
    t0 = time.monotonic()
    try:
        w.send(code)
    except OSError:
        return _stage("Error", t0, None, b"", b"session worker is gone\n", False), False
    bufs = {w.out: bytearray(), w.err: bytearray()}
    done = bytearray()
    truncated, rc, alive = False, None, True
    with selectors.DefaultSelector() as sel:
        for fd in (w.out, w.err, w.done):
            sel.register(fd, selectors.EVENT_READ)
        deadline = t0 + timeout
        while rc is None:
            left = deadline - time.monotonic()
            if left <= 0:
                w.kill()
                truncated |= _drain(bufs, cap)  # (written before the deadline, not read yet)
                return _stage("TimeLimitExceeded", t0, -signal.SIGKILL, *_outs(bufs),
                              truncated), False
            for key, _ in sel.select(left):
                data = _read(key.fd)
                if data is None:
                    sel.unregister(key.fd)
                    if key.fd == w.done:
                        alive, rc = False, -1
                elif key.fd == w.done:
                    done += data
                    rc = _parse_done(w.lang, done)
                elif data:
                    buf = bufs[key.fd]
                    room = cap - len(buf)
                    truncated |= room < len(data)
                    buf += data[: max(room, 0)]
    truncated |= _drain(bufs, cap)  # what was written before the completion mark is in the pipe
    if not alive:
        w.kill()
    return _stage("Finished", t0, rc, *_outs(bufs), truncated), alive


def _drain(bufs: dict[int, bytearray], cap: int) -> bool:
    """Move what is still in each output pipe into its buffer, up to ``cap``; whether any of it
    was cut."""
    cut = False
    for fd, buf in bufs.items():
        data = _read(fd) or b""
        cut |= len(data) > cap - len(buf)
        buf += data[: max(cap - len(buf), 0)]
    return cut


def _parse_done(lang: str, done: bytearray) -> int | None:
    if lang == "bash":
        if b"\n" not in done:
            return None
        return int(done.split(b"\n", 1)[0] or b"1")
    if len(done) < 4:
        return None
    n = int.from_bytes(done[:4], "big")
    if len(done) < 4 + n:
        return None
    import json

    return int(json.loads(bytes(done[4 : 4 + n]))["rc"])


def _read(fd: int) -> bytes | None:
    """What the pipe has now; None at end of file with nothing read."""
    out = bytearray()
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            return bytes(out)
        if not data:
            return bytes(out) if out else None
        out += data
        if len(data) < (1 << 16):
            return bytes(out)


def _outs(bufs: dict[int, bytearray]) -> tuple[bytes, bytes]:
    out, err = bufs.values()
    return bytes(out), bytes(err)


def _stage(status: str, t0: float, rc: int | None, out: bytes, err: bytes,
           truncated: bool) -> dict[str, Any]:
    return {"status": status, "execution_time": round(time.monotonic() - t0, 6),
            "return_code": rc, "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"), "truncated": truncated}
