"""A model instance's process: the child that holds one instance's model, and its handle.

Invariant: the service process never holds a model. Each instance's model is built, moved
(park, swap-in) and run in a child process of its own; the parent talks to it over one
`multiprocessing` pipe, one request and one reply at a time: ``load``, ``to`` (park to host
memory or swap in) and ``score`` go in; measured seconds, scores or an error's text come out. A
native crash (SIGSEGV), an OOM kill (SIGKILL) or a hang ends only that child: the parent sees the
pipe's end (EOF) or no reply by a deadline, and reads the exit status for the reason. The child
dies with its parent, the fork server (``PR_SET_PDEATHSIG``), which ends with the service: after
a kill -9 of the service no model process runs on.

Start method: ``forkserver``, with torch, transformers and this package's scoring module preloaded
(`_preload.py`). The fork server is a fresh interpreter (started like ``spawn``: no copy of the
service's threads, event loop, locks or CUDA state); each model process is a fork of it, so a new
or replacement process starts in milliseconds, not the seconds an interpreter, ``import torch`` and
transformers take (20 s on a loaded 2-core machine). Nothing in the fork server touches CUDA; each
process initializes its own.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

_CTX = multiprocessing.get_context("forkserver")
_PRELOAD = ["arl_tangram.managers.gpu._preload"]  # torch, transformers, scoring, this module


def start_fork_server() -> None:
    """Start the fork server (preloading `_preload`) if it is not running; returns at once
    (the first process waits for the preload)."""
    from multiprocessing import forkserver

    _CTX.set_forkserver_preload(_PRELOAD)
    forkserver.ensure_running()

# Device errors after which an instance's state cannot be trusted (sticky CUDA errors). An
# out-of-memory error is the batch's own: the instance stays.
_STICKY = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure",
           "uncorrectable ECC error")


def kills_instance(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by the model) leaves the instance's state untrustworthy."""
    if not isinstance(exc, Exception):
        return True
    if type(exc).__name__ == "AcceleratorError":  # (torch >= 2.8: a CUDA error)
        return True
    msg = str(exc)
    return "out of memory" not in msg and any(m in msg for m in _STICKY)


class WorkerGone(Exception):
    """The child process ended (or closed its pipe); the message says how."""


class WorkerTimeout(Exception):
    """No reply within the deadline."""


class Worker:
    """The parent's handle of one model process (blocking calls: run them off the event loop)."""

    def __init__(self) -> None:
        """Start the process (blocks while the fork server is still preloading: call it off
        the event loop)."""
        start_fork_server()
        self.conn, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=serve, args=(child,), daemon=True, name="tangram-model")
        self.proc.start()
        child.close()  # (so the child's end closing reads as EOF here)
        self.pid: int = int(self.proc.pid or 0)
        self.sentinel: int = self.proc.sentinel

    def call(self, msg: tuple[Any, ...], timeout: float | None = None) -> tuple[Any, ...]:
        """Send one request, return its reply; raises WorkerGone or WorkerTimeout."""
        try:
            self.conn.send(msg)
            if not self.conn.poll(timeout):
                raise WorkerTimeout(f"no reply within {timeout:g} s")
            reply: tuple[Any, ...] = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerGone(self.ended()) from exc
        return reply

    def alive(self) -> bool:
        return self.proc.is_alive()

    def ended(self) -> str:
        """How the process ended, once it has (waits up to 5 s for its exit status)."""
        self.proc.join(5)
        code = self.proc.exitcode
        if code is None:
            return f"process {self.pid} closed its pipe but is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"process {self.pid} was killed by {name}"
        return f"process {self.pid} exited with status {code}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process (SIGKILL by default); does not wait."""
        if self.proc.exitcode is None:
            try:
                import os

                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Kill the process and reap it (blocks until it is gone)."""
        self.kill()
        self.proc.join()
        self.conn.close()


# ---- the child ---------------------------------------------------------------------------------


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(conn: Connection) -> None:
    """The child's loop: one request, one reply, until the pipe closes."""
    _die_with_parent()
    import torch

    state: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = _handle(torch, state, msg)
        except Exception as exc:
            from ...core.errors import BrokenError

            text = f"{type(exc).__name__}: {exc}"
            conn.send(("error", kills_instance(exc), text, isinstance(exc, BrokenError)))
            continue
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: this process ends
            conn.send(("error", True, f"{type(exc).__name__}: {exc}".rstrip(": "), False))
            raise
        conn.send(reply)


def _handle(torch: Any, state: dict[str, Any], msg: tuple[Any, ...]) -> tuple[Any, ...]:
    op = msg[0]
    if op == "score":
        scorer = state["scorer"]
        t0 = time.perf_counter()
        outs = scorer.score(msg[1])
        return ("ok", outs, time.perf_counter() - t0)
    if op == "load":
        _, spec, factory_blob, device, threads, max_length, max_tokens = msg
        from .scoring import Scorer, cold_load

        torch.set_num_threads(threads)
        factory = None
        if factory_blob is not None:
            import cloudpickle

            factory = cloudpickle.loads(factory_blob)
        dev = torch.device(device)
        t0 = time.perf_counter()
        model, tok = cold_load(spec, factory, dev)
        state["scorer"] = Scorer(spec, model, tok, max_length=max_length, max_tokens=max_tokens)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t0
        return ("ok", seconds, _weights_mb(model), torch.get_num_threads())
    if op == "to":  # park (to "cpu", pinned) or swap in (to the device)
        _, device, threads, pin = msg
        model = state["scorer"].model
        dev = torch.device(device)
        t0 = time.perf_counter()
        if threads:
            torch.set_num_threads(threads)
        if next(model.parameters()).device != dev:
            model.to(dev, non_blocking=True)
            if dev.type == "cpu" and pin:
                for t in list(model.parameters()) + list(model.buffers()):
                    t.data = t.data.pin_memory()
                torch.cuda.empty_cache()
            elif dev.type == "cuda":
                torch.cuda.synchronize(dev)
        return ("ok", time.perf_counter() - t0, torch.get_num_threads())
    raise ValueError(f"model process: unknown request {op!r}")


def _weights_mb(model: Any) -> float:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    return float(total) / 2**20
