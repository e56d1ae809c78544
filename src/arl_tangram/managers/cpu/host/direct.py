"""Manager side of a direct action: a trivial one-shot Python action run by its sandbox's PID 1.

Invariant: the sandbox's reply to a direct request is the action's own word (its code ran in that
process), so only its exit code is taken from it, as an int; the manager itself reads stdout and
stderr from the pipes (capped, truncation flagged), enforces the wall-clock limit by SIGKILL from
the host (which ends the PID namespace and everything in it) and, when the process ended its
report without a word, takes the exit status the fork server reaped (or, still running at its
limit, kills it). The caller releases the sandbox after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from .. import wire
from .payload import SandboxRequest
from .pool import Sandbox

# after a silent death, how long at least to wait for the fork server's exit status (`_wait`)
_EXIT_WAIT_S = 2.0
# Output is first read at the exit report or after this long, whichever is first (the fork
# server gives the pipes 1 MiB each, so a writer rarely waits for it).
_LAZY_S = 0.02


def eligible(req: SandboxRequest) -> bool:
    """A request the direct path can run: one Python run stage, nothing to fetch after it."""
    lang = req["lang"]
    return (req["op"] == "run" and bool(lang.get("inproc")) and not lang.get("compile")
            and req.get("cases") is None and not req.get("fetch_files"))


class _Output:
    """One stream's pipe, capped; read as it comes once `watch` is called (a short action's
    output is read once, at its exit report: no wake-up per write)."""

    __slots__ = ("buf", "cap", "fd", "loop", "truncated", "watched")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: int) -> None:
        self.loop, self.fd, self.cap = loop, fd, cap
        self.buf, self.truncated, self.watched = bytearray(), False, False

    def watch(self) -> None:
        if self.fd >= 0 and not self.watched:
            self.watched = True
            self.loop.add_reader(self.fd, self.drain)

    def drain(self) -> None:
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                return self.stop()
            room = self.cap - len(self.buf)
            if room < len(data):
                self.truncated = True
            if room > 0:
                self.buf += data[:room]

    def stop(self) -> None:
        if self.fd >= 0 and self.watched:
            self.loop.remove_reader(self.fd)
        self.fd = -1  # (the pool closes it with the sandbox)


def _watch(out: _Output, err: _Output) -> None:
    out.watch()
    err.watch()


async def exchange(sb: Sandbox, req: SandboxRequest, budget: float,
                   base_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``req`` (see `eligible`) in ``sb``; the reply in the sandbox's wire shape.
    ``base_env``: the sandboxes' own environment (the fork server's); a request with it and no
    extra files goes in the compact form (`wire.encode_direct`), which the compiled set-up path
    takes up to the action's code without decoding a request in Python."""
    loop = asyncio.get_running_loop()
    limit = int(req["limits"]["output"])
    out, err = (_Output(loop, fd, limit) for fd in sb.outs)
    lazy = loop.call_later(_LAZY_S, _watch, out, err)
    try:
        status, rc, elapsed = await _wait(sb, req, budget, base_env)
        lazy.cancel()
        for o in (out, err):
            o.drain()  # what it wrote before its report (or its death)
    finally:
        lazy.cancel()
        out.stop()
        err.stop()
    if rc is None and status == "Finished":
        return {"error": "sandbox broke: the action's process ended without an exit status"}
    run = {"status": status, "execution_time": elapsed, "return_code": rc,
           "stdout": out.buf.decode("utf-8", "replace"),
           "stderr": err.buf.decode("utf-8", "replace"),
           "truncated": out.truncated or err.truncated}
    return {"compile_result": None, "run_result": run, "cases": None, "files": {}}


async def _wait(sb: Sandbox, req: SandboxRequest, budget: float,
                base_env: dict[str, str] | None) -> tuple[str, int | None, float]:
    """Send the request, wait for the exit report (or the death); (status, exit code, seconds)."""
    status, rc = "Finished", None
    limit = min(budget, float(req["run_timeout"]))
    t0 = time.monotonic()
    try:
        frame = wire.encode_direct(req, base_env)
        reply = await sb.request(frame or {**req, "direct": True}, limit)
        rc = reply.get("rc")
        if not isinstance(rc, int) or isinstance(rc, bool):
            raise ValueError("bad exit report")
    except TimeoutError:
        status = "TimeLimitExceeded"
        sb.kill()
    except (OSError, EOFError, ValueError):
        rc = None  # died without a word (a signal, or it broke its report): ask the fork server
    elapsed = round(time.monotonic() - t0, 6)
    if rc is None and sb.exit_rc is not None:
        if status != "TimeLimitExceeded" and not sb.dead:
            # As long as its time limit leaves, and at least `_EXIT_WAIT_S`: a death's status
            # comes when the fork server next reaps (later on a loaded host: a fixed 2 s once
            # turned a segfault into a sandbox error), and a process that only broke its report
            # runs on until it ends or its limit does.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(_EXIT_WAIT_S, limit - elapsed)):
                    rc = await asyncio.shield(sb.exit_rc)
            if rc is None and sb.running():  # past its limit, still going: ours to end
                status = "TimeLimitExceeded"
                sb.kill()
                elapsed = round(time.monotonic() - t0, 6)
        elif sb.exit_rc.done():
            rc = sb.exit_rc.result()
        if rc is None and status == "TimeLimitExceeded":
            rc = -9  # we killed it
    return status, rc, elapsed
