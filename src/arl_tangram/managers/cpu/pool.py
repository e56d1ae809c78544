"""Manager side of sandboxes: the fork-server client, sandbox handles and the warm pool.

Invariant: a sandbox handed out by `WarmPool.take` is fresh (it never ran an action), already in
its own cgroup slot with stats reset (and, when warm, with its action's child forked in advance);
a sandbox given back with `release` is killed at once, and its slot is reused only once the
sandbox is dead (its init's pidfd fired, which the kernel signals only after every process of its
PID namespace is gone) *and* released, and the cgroup is seen empty. All I/O is non-blocking and
driven by the event loop's reader callbacks (no thread hop, no per-action task); replenishing runs
off the critical path. Everything here must be used from the one event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.errors import BrokenError, ClosedError

from . import wire
from .cgroups import CgroupTree, Slot

WARMING_WEIGHT = 0.25  # CPU weight of a sandbox being prepared, relative to a running action


class Conn:
    """Length-prefixed JSON request/reply over a non-blocking socket, one reply per request."""

    __slots__ = ("_buf", "_loop", "_waiters", "closed", "sock")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self.sock, self._loop, self._buf = sock, loop, bytearray()
        self._waiters: collections.deque[asyncio.Future[dict[str, Any]]] = collections.deque()
        self.closed = False
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self.close(e)
        if not data:
            return self.close(EOFError("sandbox closed its socket"))
        buf = self._buf
        buf += data
        while len(buf) >= 4:
            n = int.from_bytes(buf[:4], "big")
            if n > wire.MAX_FRAME or not self._waiters:
                return self.close(ValueError("unexpected or oversized frame from a sandbox"))
            if len(buf) < 4 + n:
                return
            try:
                msg = json.loads(bytes(buf[4:4 + n]))
                if not isinstance(msg, dict):
                    raise ValueError("frame is not an object")
            except ValueError as e:
                return self.close(e)
            del buf[:4 + n]
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(msg)

    async def request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if self.closed:
            raise EOFError("sandbox connection closed")
        fut = self._loop.create_future()
        self._waiters.append(fut)
        data = wire.encode(msg)
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self.close(e)
            n = len(data)
        if n < len(data):
            await self._loop.sock_sendall(self.sock, data[n:])
        timer = None if timeout is None else self._loop.call_later(
            timeout, _expire, fut, timeout)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()

    def close(self, why: BaseException | None = None) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(why or EOFError("sandbox connection closed"))


def _expire(fut: asyncio.Future[Any], timeout: float) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"no reply within {timeout:g} s"))


def _zygote_env() -> dict[str, str]:
    """The fork server's environment: nothing of the service's own (tokens, configuration).

    In-process Python actions are forks of the fork server, and /proc/self/environ shows the
    environment its interpreter was started with, whatever os.environ says later.
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.environ.get("PYTHONPATH"):  # where the package itself is found when not installed
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


class Zygote:
    """The fork server process and its control socket (a SOCK_SEQPACKET, one spawn per message)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arl_tangram.managers.cpu.zygote", str(theirs.fileno()),
             json.dumps(cfg)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, close_fds=True, env=_zygote_env())
        theirs.close()
        self.ctl = ours
        self.hello: dict[str, Any] = {}
        self._waiters: collections.deque[asyncio.Future[tuple[dict[str, Any], list[int]]]] = \
            collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_exit: Any = None  # (pid, rc) of a direct sandbox's PID 1, from the fork server

    def wait_hello(self, timeout: float = 60.0) -> dict[str, Any]:
        """Blocking (run it in a thread); the first message of the fork server."""
        self.ctl.settimeout(timeout)
        try:
            msg = self.ctl.recv(1 << 16)
        except OSError as e:
            msg = json.dumps({"ok": False, "error": f"fork server did not start: {e}"}).encode()
        self.ctl.settimeout(None)
        self.hello = json.loads(msg) if msg else {"ok": False, "error": "fork server exited"}
        return self.hello

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.ctl.setblocking(False)
        loop.add_reader(self.ctl.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg, fds = b"", []
        if not msg:
            self._fail(BrokenError("the sandbox fork server exited"))
            return
        try:
            reply = json.loads(msg)
        except ValueError:
            reply = {"error": "bad reply from the fork server"}
        if "exit" in reply:  # not a spawn reply: a direct sandbox's exit status
            if self.on_exit is not None:
                self.on_exit(int(reply["exit"]), int(reply["rc"]))
            return
        fut = self._waiters.popleft() if self._waiters else None
        if fut is None or fut.done():  # its spawn was cancelled: the init exits on EOF
            for fd in fds:
                os.close(fd)
            return
        fut.set_result((reply, fds))

    def _fail(self, e: BaseException) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.ctl.fileno())
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(e)

    async def spawn(self) -> tuple[int, socket.socket, list[int]]:
        assert self._loop is not None, "Zygote.attach() first"
        fut = self._loop.create_future()
        self._waiters.append(fut)
        try:
            self.ctl.send(b'{"op":"spawn"}')
        except BlockingIOError:
            await self._loop.sock_sendall(self.ctl, b'{"op":"spawn"}')
        except OSError as e:
            self._fail(BrokenError(f"the sandbox fork server is gone: {e}"))
        reply, fds = await fut
        if "error" in reply or not fds:
            for fd in fds:
                os.close(fd)
            raise BrokenError(f"sandbox spawn failed: {reply.get('error')}")
        return int(reply["pid"]), socket.socket(fileno=fds[0]), fds[1:]

    def close(self) -> None:
        self._fail(ClosedError("the CPU manager is closed"))
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@dataclass(slots=True, eq=False)
class Sandbox:
    """One live sandbox: its init's host pid (and pidfd), its connection and its cgroup slot."""

    pid: int
    conn: Conn
    pidfd: int
    slot: Slot | None
    created: float = field(default_factory=time.monotonic)
    cpu: float = 0.0  # current CPU quota in cores
    memory: int = 0  # current memory limit in bytes
    dead: bool = False  # killed or released: never hand it out
    exited: bool = False  # its init is gone (so is every process of its PID namespace)
    released: bool = False
    weight: float = 1.0  # CPU weight of its slot, relative to a normal task
    # direct sandboxes only: our read ends of its stdout/stderr pipes, and its PID 1's exit code
    outs: tuple[int, ...] = ()
    exit_rc: asyncio.Future[int] | None = None

    async def request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return await self.conn.request(msg, timeout)

    def set_limits(self, cpu: float, memory: int, weight: float = 1.0) -> None:
        if self.slot is None:
            return
        if weight != self.weight:
            self.slot.set_weight(weight)
            self.weight = weight
        if abs(cpu - self.cpu) > 1e-9:
            self.slot.set_cpu(cpu)
            self.cpu = cpu
        if memory != self.memory:
            self.slot.set_memory(memory)
            self.memory = memory

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            if not self.exited:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            self.conn.close()


class WarmPool:
    """Fresh sandboxes kept ready; sized by the scheduler's target and recent arrivals."""

    def __init__(self, zygote: Zygote, cgroups: CgroupTree | None, *, warm_min: int,
                 warm_max: int, pids_max: int, default_cpu: float, default_mem: int) -> None:
        self.zygote, self.cgroups = zygote, cgroups
        self.warm_min, self.warm_max = warm_min, warm_max
        self.pids_max, self.default_cpu, self.default_mem = pids_max, default_cpu, default_mem
        self.ready: collections.deque[Sandbox] = collections.deque()
        self.free_slots: list[Slot] = []
        self.sched_target: int | None = None
        self.arrivals: collections.deque[float] = collections.deque(maxlen=4096)
        self.live: set[Sandbox] = set()
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.spawn_s = 0.005  # running estimate of one spawn's latency
        self._cg_thread = concurrent.futures.ThreadPoolExecutor(1, "tangram-cgroup")
        self.by_pid: dict[int, Sandbox] = {}  # direct sandboxes, until their exit code is in
        zygote.on_exit = self._exit_code
        zygote.attach(self.loop)

    def start(self) -> None:
        self._filler = asyncio.create_task(self._fill_loop(), name="cpu-warm-pool")

    def target(self) -> int:
        now = time.monotonic()
        while self.arrivals and self.arrivals[0] < now - 2.0:
            self.arrivals.popleft()
        rate = len(self.arrivals) / 2.0
        by_demand = math.ceil(rate * max(self.spawn_s, 0.002) * 4)
        want = max(self.warm_min, by_demand if self.sched_target is None else self.sched_target)
        return min(self.warm_max, want)

    async def spawn(self, prepare: bool = False) -> Sandbox:
        """A new sandbox in its own cgroup slot; ``prepare``: fork its action's child now."""
        got = (await self.spawn_many(1, prepare))[0]
        if isinstance(got, BaseException):
            raise got
        return got

    async def spawn_many(self, n: int, prepare: bool) -> list[Sandbox | BaseException]:
        """``n`` new sandboxes, forked together and placed in their cgroups in one batch."""
        t0 = time.monotonic()
        got: list[Any] = list(await asyncio.gather(*(self._fork() for _ in range(n)),
                                                   return_exceptions=True))
        sbs = [sb for sb in got if isinstance(sb, Sandbox)]
        if sbs and self.cgroups is not None and self.cgroups.version is not None:
            for sb in sbs:
                sb.slot = self.free_slots.pop() if self.free_slots else self.cgroups.new_slot()
            # Moving a task into a v1 cgroup waits for an RCU grace period (~ms under load):
            # done in a thread, batched, never on the event loop.
            errs = await self.loop.run_in_executor(self._cg_thread, self._place, sbs)
            for i, e in errs:
                self.release(got[got.index(sbs[i])])
                got[got.index(sbs[i])] = e
        if prepare:  # only now, in the slot: the child inherits the cgroup
            live = [sb for sb in got if isinstance(sb, Sandbox)]
            replies = await asyncio.gather(*(sb.request({"op": "prepare"}, 30.0) for sb in live),
                                           return_exceptions=True)
            for sb, r in zip(live, replies, strict=True):
                if isinstance(r, BaseException) or not r.get("ok"):
                    self.release(sb)
                    got[got.index(sb)] = BrokenError(f"sandbox setup failed: {r}")
        if sbs:
            self.spawn_s = 0.8 * self.spawn_s + 0.2 * (time.monotonic() - t0)
        return got

    def _place(self, sbs: list[Sandbox]) -> list[tuple[int, BaseException]]:
        """(Worker thread.) Limits, then the move; returns (index, error) of failures."""
        errs = []
        for i, sb in enumerate(sbs):
            try:
                assert sb.slot is not None
                sb.slot.set_pids(self.pids_max)
                sb.weight = 0.0  # unknown (a reused slot): written below
                sb.set_limits(self.default_cpu, self.default_mem, WARMING_WEIGHT)
                sb.slot.reset_stats()
                sb.slot.add(sb.pid)
            except BaseException as e:
                errs.append((i, e))
        return errs

    async def _fork(self) -> Sandbox:
        pid, sock, outs = await self.zygote.spawn()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            sock.close()
            for fd in outs:
                os.close(fd)
            raise
        sb = Sandbox(pid=pid, conn=Conn(sock, self.loop), pidfd=pidfd, slot=None)
        if outs:
            for fd in outs:
                os.set_blocking(fd, False)
            sb.outs, sb.exit_rc = tuple(outs), self.loop.create_future()
            self.by_pid[pid] = sb
        self.live.add(sb)
        self.loop.add_reader(pidfd, self._exited, sb)
        return sb

    def _exit_code(self, pid: int, rc: int) -> None:
        sb = self.by_pid.pop(pid, None)
        if sb is not None and sb.exit_rc is not None and not sb.exit_rc.done():
            sb.exit_rc.set_result(rc)

    def _exited(self, sb: Sandbox) -> None:
        self.loop.remove_reader(sb.pidfd)
        os.close(sb.pidfd)
        sb.exited = True  # its reply, if any, is still readable; then the connection sees EOF
        self._maybe_recycle(sb)

    async def take(self) -> Sandbox:
        if self.closed:
            raise ClosedError("the CPU manager is closed")
        self.arrivals.append(time.monotonic())
        if 2 * len(self.ready) <= self.target():  # else refill after the action (`release`),
            self._wake.set()  # so the refill's forks do not compete with it for the CPU
        while self.ready:
            sb = self.ready.popleft()
            if not sb.dead:
                return sb
        return await self.spawn()  # cold: the init forks the child itself, in the slot

    def release(self, sb: Sandbox) -> None:
        sb.kill()
        sb.released = True
        for fd in sb.outs:  # (the caller has removed its readers)
            with contextlib.suppress(OSError):
                os.close(fd)
        sb.outs = ()
        self._maybe_recycle(sb)
        if not self.closed:
            self._wake.set()

    def _maybe_recycle(self, sb: Sandbox) -> None:
        if not (sb.exited and sb.released) or sb not in self.live:
            return
        self.live.discard(sb)
        if sb.slot is None:
            return
        slot = sb.slot
        try:
            empty = slot.is_empty()
        except OSError:
            empty = False
        if empty:
            self.free_slots.append(slot)
            return
        t = self.loop.create_task(self._recycle(slot))  # rare: wait until the kernel is done
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _recycle(self, slot: Slot) -> None:
        for i in range(2000):
            if slot.is_empty():
                self.free_slots.append(slot)
                return
            await asyncio.sleep(0.001 if i < 50 else 0.01)
        slot.remove()  # still busy after ~20 s: leave it, never reuse

    def _deficit(self) -> int:
        """How many to spawn now. Refills come in batches (while at least half the target is
        ready, wait until a batch of 4 is missing): one batch shares one cgroup-move grace
        period and disturbs one action in flight rather than one per spawn disturbing each."""
        target, ready = self.target(), len(self.ready)
        missing = target - ready
        if missing <= 0:
            return 0
        return missing if 2 * ready <= target or missing >= min(4, target) else 0

    async def _fill_loop(self) -> None:
        while not self.closed:
            self._wake.clear()
            while not self.closed and self._deficit() > 0:
                n = min(8, self._deficit())  # a batch of spawns in flight
                got = await self.spawn_many(n, prepare=True)
                ok = [sb for sb in got if isinstance(sb, Sandbox)]
                self.ready.extend(ok)
                if len(ok) < n:
                    await asyncio.sleep(0.05)
                    break
            while len(self.ready) > self.target():
                self.release(self.ready.pop())
            with contextlib.suppress(TimeoutError):  # (not wait_for: in 3.11 it can swallow a
                async with asyncio.timeout(0.5):  # cancellation, and the loop would never end)
                    await self._wake.wait()

    async def aclose(self) -> None:
        self.closed = True
        self._wake.set()
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(BaseException):
                await self._filler
        for sb in list(self.live):
            self.release(sb)
        self.ready.clear()
        for _ in range(300):  # the kernel tears the namespaces down; slots follow
            if not self.live:
                break
            await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self.free_slots:
            slot.remove()
        self.free_slots.clear()
        self._cg_thread.shutdown(wait=False)
