"""Manager side of sandboxes: the fork-server client, sandbox handles and the warm pool.

Invariant: a sandbox handed out by `WarmPool.take` is fresh (it never ran an action), already in
its own cgroup slot with stats reset; a sandbox given back with `release` is killed at once and
its slot is reused only after the cgroup is empty. Replenishing runs off the critical path, in a
background task; `take` on an empty pool pays one cold spawn.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.errors import BrokenError, ClosedError

from . import wire
from .cgroups import CgroupTree, Slot


class Zygote:
    """The fork server process and its control socket (blocking calls; run them in a thread)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arl_tangram.managers.cpu.zygote", str(theirs.fileno()),
             json.dumps(cfg)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self.ctl = ours
        self.lock = threading.Lock()
        self.hello: dict[str, Any] = {}

    def wait_hello(self, timeout: float = 60.0) -> dict[str, Any]:
        self.ctl.settimeout(timeout)
        try:
            msg = self.ctl.recv(1 << 16)
        except OSError as e:
            msg = json.dumps({"ok": False, "error": f"fork server did not start: {e}"}).encode()
        self.ctl.settimeout(None)
        self.hello = json.loads(msg) if msg else {"ok": False, "error": "fork server exited"}
        return self.hello

    def spawn(self) -> tuple[int, socket.socket]:
        with self.lock:
            self.ctl.sendall(b'{"op":"spawn"}')
            msg, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 1)
        if not msg:
            raise BrokenError("the sandbox fork server exited")
        reply = json.loads(msg)
        if "error" in reply or not fds:
            for fd in fds:
                os.close(fd)
            raise BrokenError(f"sandbox spawn failed: {reply.get('error')}")
        return int(reply["pid"]), socket.socket(fileno=fds[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@dataclass(slots=True, eq=False)
class Sandbox:
    """One live sandbox: its init's host pid, its socket and its cgroup slot."""

    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    slot: Slot | None
    created: float = field(default_factory=time.monotonic)
    cpu: float = 0.0  # current CPU quota in cores
    memory: int = 0  # current memory limit in bytes
    dead: bool = False

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.writer.write(wire.encode(msg))
        await self.writer.drain()
        return await wire.read_frame(self.reader)

    def set_limits(self, cpu: float, memory: int) -> None:
        if self.slot is None:
            return
        if abs(cpu - self.cpu) > 1e-9:
            self.slot.set_cpu(cpu)
            self.cpu = cpu
        if memory != self.memory:
            self.slot.set_memory(memory)
            self.memory = memory

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            self.writer.close()


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
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._recyclers: set[asyncio.Task[None]] = set()
        self.spawn_s = 0.005  # running estimate of one spawn's latency

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

    async def spawn(self) -> Sandbox:
        t0 = time.monotonic()
        pid, sock = await asyncio.to_thread(self.zygote.spawn)
        self.spawn_s = 0.8 * self.spawn_s + 0.2 * (time.monotonic() - t0)
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=wire.MAX_FRAME)
        sb = Sandbox(pid=pid, reader=reader, writer=writer, slot=None)
        self.live.add(sb)
        if self.cgroups is not None and self.cgroups.version is not None:
            try:
                sb.slot = self.free_slots.pop() if self.free_slots else self.cgroups.new_slot()
                sb.slot.set_pids(self.pids_max)
                sb.slot.add(pid)
                sb.set_limits(self.default_cpu, self.default_mem)
                sb.slot.reset_stats()
            except OSError:
                self.release(sb)
                raise
        return sb

    async def take(self) -> Sandbox:
        if self.closed:
            raise ClosedError("the CPU manager is closed")
        self.arrivals.append(time.monotonic())
        self._wake.set()
        while self.ready:
            sb = self.ready.popleft()
            if not sb.dead:
                return sb
        return await self.spawn()

    def release(self, sb: Sandbox) -> None:
        sb.kill()
        self.live.discard(sb)
        if sb.slot is not None:
            t = asyncio.get_running_loop().create_task(self._recycle(sb.slot))
            self._recyclers.add(t)
            t.add_done_callback(self._recyclers.discard)
        self._wake.set()

    async def _recycle(self, slot: Slot) -> None:
        for i in range(2000):
            if slot.is_empty():
                self.free_slots.append(slot)
                return
            await asyncio.sleep(0.001 if i < 50 else 0.01)
        slot.remove()  # still busy after ~20 s: leave it, never reuse

    async def _fill_loop(self) -> None:
        while not self.closed:
            self._wake.clear()
            while not self.closed and len(self.ready) < self.target():
                try:
                    self.ready.append(await self.spawn())
                except Exception:
                    await asyncio.sleep(0.05)
                    break
            while len(self.ready) > self.target():
                self.release(self.ready.pop())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.5)

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
        if self._recyclers:
            await asyncio.gather(*self._recyclers, return_exceptions=True)
        for slot in self.free_slots:
            slot.remove()
        self.free_slots.clear()
