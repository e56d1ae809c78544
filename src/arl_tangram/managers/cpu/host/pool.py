"""Manager side of sandboxes: sandbox handles and the warm pool (channels: `client.py`).

Invariant: a sandbox handed out by `WarmPool.take` is fresh (it never ran an action), in its
own cgroup slot with stats reset (and, when warm, with its action's child forked in advance) --
on cgroup v1 its init moves itself there before it reads anything (`self_join`), so it may be
handed out a moment before, but runs nothing outside it;
a sandbox given back with `release` is killed at once, and its slot is reused only once the
sandbox is dead (every process of its PID namespace is gone: its init's pidfd fired, or, for a
direct sandbox, the fork server reaped its init) *and* released, and the cgroup is seen empty;
the limits a reused slot keeps are rewritten where the next sandbox's differ, its counters
always reset. All I/O is non-blocking and driven by the event loop's reader callbacks (no thread
hop, no per-action task); replenishing runs off the critical path, and sandboxes asked for at
once (cold takes) are forked together; a take that finds the pool empty while a refill batch is
in flight gets one of that batch (it comes first). Everything here must be used from the one
event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import math
import os
import select
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.errors import BrokenError, ClosedError

from .cgroups import CgroupTree, Slot
from .client import Conn, Zygote
from .tasks import cancel_and_wait

WARMING_WEIGHT = 0.25  # CPU weight of a sandbox being prepared, relative to a running action
MAX_BATCH = 64  # sandboxes per fork-server request (the fork server serves no more)
# Above this many actions per second per core, refills do not warm (direct) sandboxes: warming
# takes a sandbox's first-touch page faults before its action rather than during it (latency),
# but costs ~0.3 ms of CPU more per sandbox in all, which a saturated node cannot spare.
WARM_RATE_PER_CORE = 100.0
KEEP_MEMORY_MIN = 64 << 20  # a reused slot's memory limit at least this big is kept (`_place`)
# A slot still charged with more than this once empty (page cache of files its occupant read
# first) is not reused: the next action's peak memory and limit would include it (`WarmPool._free`)
LEFTOVER_MAX = 1 << 20
_REFILL_DELAY_S = 0.002  # after a release, the refill waits this long (see `release`)
FILL_PIPELINE = 2  # refill batches in flight at once (`WarmPool._fill_loop`)


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
    watched: bool = False  # its pidfd is on the event loop (else the fork server reports its end)
    weight: float = 1.0  # CPU weight of its slot, relative to a normal task
    # direct sandboxes only: our read ends of its stdout/stderr pipes, and its PID 1's exit code
    outs: tuple[int, ...] = ()
    # the host uid (and gid, the same number) its code runs as: its own while it lives
    # (`host/ids.py`; the fork server lends it), or the one every sandbox shares without ids
    uid: int = -1
    exit_rc: asyncio.Future[int] | None = None
    # a session's: its init does not die with the fork server (`init` op "keep"; issue 41)
    kept: bool = False
    maker: Zygote | None = None  # the fork server that made it

    async def request(self, msg: Mapping[str, Any] | bytes,
                      timeout: float | None = None) -> dict[str, Any]:
        return await self.conn.request(msg, timeout)

    def set_limits(self, cpu: float, memory: int, weight: float = 1.0) -> None:
        """Write what differs from what the slot has in force (a reused slot keeps its values)."""
        slot = self.slot
        if slot is None:
            return
        if weight != slot.weight:
            slot.set_weight(weight)
        if abs(cpu - slot.cpu) > 1e-9:
            slot.set_cpu(cpu)
        if memory != slot.memory:
            slot.set_memory(memory)
        self.cpu, self.memory, self.weight = cpu, memory, weight

    def running(self) -> bool:
        """Its PID 1 has not ended yet (its pidfd is not readable)."""
        if self.exited:
            return False
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return not ready

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            if not self.exited:
                try:  # noqa: SIM105  (no context manager: this runs once per action)
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except OSError:
                    pass
            self.conn.close()


class WarmPool:
    """Fresh sandboxes kept ready; sized by the scheduler's target and recent arrivals."""

    def __init__(self, zygote: Zygote, cgroups: CgroupTree | None, *, warm_min: int,
                 warm_max: int, pids_max: int, default_cpu: float, default_mem: int,
                 self_join: bool = False, direct: bool = True) -> None:
        self.zygote, self.cgroups = zygote, cgroups
        self.warm_min, self.warm_max = warm_min, warm_max
        self.pids_max, self.default_cpu, self.default_mem = pids_max, default_cpu, default_mem
        # sandboxes move themselves into their slots (`Zygote.spawn`'s ``join``; cgroup v1):
        # slots are chosen and readied before the fork, no move goes through the cgroup thread
        self.self_join = self_join and cgroups is not None and cgroups.version == "v1"
        self.direct = direct  # sandboxes are direct ones (`Sandbox.outs`; `_ready_slot`)
        self.ready: collections.deque[Sandbox] = collections.deque()
        self.free_slots: list[Slot] = []
        self.sched_target: int | None = None
        self.arrivals: collections.deque[float] = collections.deque(maxlen=4096)
        self.live: set[Sandbox] = set()
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._kick: asyncio.TimerHandle | None = None  # a pending wake after a release
        self._filler: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._cold: list[asyncio.Future[Sandbox | BaseException]] = []  # waiting for a spawn
        self._cold_task: asyncio.Task[None] | None = None
        # takes waiting for the refill batch in flight (`take`), and how many it brings
        self._takers: collections.deque[asyncio.Future[Sandbox | None]] = collections.deque()
        self._filling = 0  # sandboxes in refill batches in flight
        self._backoff = False  # a refill came short: the next waits a little
        self.spawn_s = 0.005  # running estimate of one spawn's latency
        self.warm_rate_max = WARM_RATE_PER_CORE * (os.cpu_count() or 1)
        self._cg_thread = concurrent.futures.ThreadPoolExecutor(1, "tangram-cgroup")
        self.by_pid: dict[int, Sandbox] = {}  # direct sandboxes, until their exit code is in
        # the fork server is up (set) or being restarted (clear: takes and spawns wait);
        # ``down`` says why the node gave up restarting it (takes then fail at once)
        self.up = asyncio.Event()
        self.up.set()
        self.down: str | None = None
        self.on_broken: Any = None  # the owner's hook, called once the fork server is gone
        # ids of kept sandboxes that outlived a fork server: the next one must not lend them
        # while they live (`ids_held`), and is given each back once its sandbox is gone
        self.orphan_ids: set[int] = set()
        self.attach_zygote(zygote)

    def attach_zygote(self, zygote: Zygote) -> None:
        """Serve spawns from ``zygote`` (at start, and each time the fork server is restarted)."""
        self.zygote = zygote
        zygote.on_exit = self._exit_code
        zygote.adopt = self._adopt
        zygote.on_broken = self._zygote_broken
        zygote.attach(self.loop)

    def _zygote_broken(self) -> None:
        """The fork server is gone: its sandboxes' ends come from their pidfds now; the warm
        ones (its children: they die with it) are dropped; takes wait until a new one is in."""
        if not self.closed:
            self.up.clear()
        self.orphan_ids |= {sb.uid for sb in self.live if sb.kept and not sb.exited and sb.uid >= 0}
        self._watch_all()
        while self.ready:
            self.release(self.ready.popleft())
        if self.on_broken is not None:
            self.on_broken()

    async def wait_up(self) -> None:
        """Until the fork server is up; `BrokenError` when the node gave up restarting it."""
        if not self.up.is_set():
            await self.up.wait()
        if self.closed:
            raise ClosedError("the CPU manager is closed")
        if self.down is not None:
            raise BrokenError(self.down)

    def start(self) -> None:
        self._filler = asyncio.create_task(self._fill_loop(), name="cpu-warm-pool")

    def rate(self) -> float:
        """Actions taken per second, over the last 2 s."""
        now = time.monotonic()
        while self.arrivals and self.arrivals[0] < now - 2.0:
            self.arrivals.popleft()
        return len(self.arrivals) / 2.0

    def target(self) -> int:
        rate = self.rate()
        by_demand = math.ceil(rate * max(self.spawn_s, 0.002) * 4)
        want = max(self.warm_min, by_demand if self.sched_target is None else self.sched_target)
        return min(self.warm_max, want)

    async def spawn(self, prepare: bool = False) -> Sandbox:
        """A new sandbox in its own cgroup slot; ``prepare``: fork its action's child now.

        Unprepared spawns are grouped: those asked for while a group is being made go together
        in the next one (one request to the fork server, one cgroup batch), so under load they
        cost what the warm pool's batches cost; alone, one goes at once. While the fork server
        is being restarted, it waits for the new one."""
        await self.wait_up()
        if prepare:
            got = (await self.spawn_many(1, prepare))[0]
        else:
            fut: asyncio.Future[Sandbox | BaseException] = self.loop.create_future()
            self._cold.append(fut)
            if self._cold_task is None or self._cold_task.done():
                self._cold_task = self.loop.create_task(self._spawn_cold())
            got = await fut
        if isinstance(got, BaseException):
            raise got
        return got

    async def _spawn_cold(self) -> None:
        while self._cold:
            futs = [f for f in self._cold[:MAX_BATCH] if not f.done()]
            del self._cold[:MAX_BATCH]
            if not futs:
                continue
            try:
                got = await self.spawn_many(len(futs), prepare=False, warm=False)
            except BaseException as e:
                got = [e] * len(futs)
                if not isinstance(e, Exception):
                    for f in futs:
                        f.cancel()
                    raise
            for f, sb in zip(futs, got, strict=True):
                if not f.done():
                    f.set_result(sb)
                elif isinstance(sb, Sandbox):  # its taker went away
                    self.release(sb)

    async def spawn_many(self, n: int, prepare: bool,
                         warm: bool = True) -> list[Sandbox | BaseException]:
        """``n`` new sandboxes, forked together and placed in their cgroups in one batch
        (``warm``: see `Zygote.spawn`)."""
        t0 = time.monotonic()
        if self.self_join:
            got = await self._spawn_joined(n, warm)
        else:
            got = await self._spawn_placed(n, warm)
        if prepare:  # only now, in the slot: the child inherits the cgroup
            # (a direct sandbox forks no child in advance and warms itself unasked)
            live = [sb for sb in got if isinstance(sb, Sandbox) and not sb.outs]
            replies = await asyncio.gather(*(sb.request({"op": "prepare"}, 30.0) for sb in live),
                                           return_exceptions=True)
            for sb, r in zip(live, replies, strict=True):
                if isinstance(r, BaseException) or not r.get("ok"):
                    self.release(sb)
                    got[got.index(sb)] = BrokenError(f"sandbox setup failed: {r}")
        if any(isinstance(sb, Sandbox) for sb in got):
            self.spawn_s = 0.8 * self.spawn_s + 0.2 * (time.monotonic() - t0)
        return got

    def _place(self, sbs: list[Sandbox], warm: bool = True) -> list[tuple[int, BaseException]]:
        """(Worker thread.) Limits, then the move; returns (index, error) of failures. A direct
        sandbox that does not warm uses no CPU until its action: it gets a running action's
        weight at once (not the warming weight, rewritten when the action starts)."""
        errs = []
        for i, sb in enumerate(sbs):
            try:
                assert sb.slot is not None
                if sb.slot.pids != self.pids_max:
                    sb.slot.set_pids(self.pids_max)
                # a reused slot keeps its last action's memory limit while the sandbox warms
                # (our code only), if roomy: the next action most likely asks for the same, and
                # then nothing is written twice (a new slot gets the default)
                mem = sb.slot.memory if sb.slot.memory >= KEEP_MEMORY_MIN else self.default_mem
                sb.set_limits(self.default_cpu, mem,
                              1.0 if sb.outs and not warm else WARMING_WEIGHT)
                sb.slot.reset_stats()
                sb.slot.add(sb.pid)
            except BaseException as e:
                errs.append((i, e))
        return errs

    async def _spawn_placed(self, n: int, warm: bool) -> list[Sandbox | BaseException]:
        """Fork, then move each new sandbox into its slot from the cgroup thread (`_place`)."""
        got: list[Any] = await self.zygote.spawn(n, warm)
        sbs = [sb for sb in got if isinstance(sb, Sandbox)]
        if sbs and self.cgroups is not None and self.cgroups.version is not None:
            for sb in sbs:
                sb.slot = self.free_slots.pop() if self.free_slots else self.cgroups.new_slot()
            # Moving a task into a v1 cgroup waits for an RCU grace period (~ms under load):
            # done in a thread, batched, never on the event loop.
            errs = await self.loop.run_in_executor(self._cg_thread, self._place, sbs, warm)
            for i, e in errs:
                self.release(got[got.index(sbs[i])])
                got[got.index(sbs[i])] = e
        return got

    async def _spawn_joined(self, n: int, warm: bool) -> list[Sandbox | BaseException]:
        """Slots first (limits written, counters reset: a few writes on kept fds, on the loop),
        then the forks: each init moves itself into its slot before anything else (`zygote._init`),
        so nothing waits for the cgroup move's grace period. A slot whose sandbox did not come
        goes back (once empty)."""
        assert self.cgroups is not None
        slots: list[Slot] = []
        weight = 1.0 if self.direct and not warm else WARMING_WEIGHT
        try:
            for _ in range(n):
                slot = self.free_slots.pop() if self.free_slots else self.cgroups.new_slot()
                slots.append(slot)
                self._ready_slot(slot, weight)
        except OSError as e:
            for slot in slots:
                self._put_back(slot)
            return [e] * n
        try:
            got: list[Any] = await self.zygote.spawn(n, warm, [s.name for s in slots])
        except BaseException:  # (cancelled: closing) what is empty goes back, the rest stays
            for slot in slots:  # to the tree's removal
                with contextlib.suppress(OSError):
                    if slot.is_empty():
                        self._free(slot)
            raise
        for slot, sb in zip(slots, got, strict=True):
            if isinstance(sb, Sandbox):
                sb.slot = slot
                sb.cpu, sb.memory, sb.weight = slot.cpu, slot.memory, slot.weight
            else:
                self._put_back(slot)
        return got

    def _ready_slot(self, slot: Slot, weight: float) -> None:
        """What `_place` writes before its move: pids limit, the default CPU quota, a roomy
        memory limit (a reused slot keeps its last one), the weight; counters reset."""
        if slot.pids != self.pids_max:
            slot.set_pids(self.pids_max)
        mem = slot.memory if slot.memory >= KEEP_MEMORY_MIN else self.default_mem
        if weight != slot.weight:
            slot.set_weight(weight)
        if abs(self.default_cpu - slot.cpu) > 1e-9:
            slot.set_cpu(self.default_cpu)
        if mem != slot.memory:
            slot.set_memory(mem)
        slot.reset_stats()

    def _put_back(self, slot: Slot) -> None:
        """A slot no sandbox uses any more (its sandbox ended, or never came: its init may have
        moved in before it ended): freed now if empty, else once the kernel is done with it."""
        try:
            empty = slot.is_empty()
        except OSError:
            empty = False
        if empty:
            self._free(slot)
            return
        t = self.loop.create_task(self._recycle(slot))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _adopt(self, pid: int, sock: socket.socket, outs: list[int],
               uid: int) -> Sandbox | OSError:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            sock.close()
            for fd in outs:
                os.close(fd)
            return e
        sb = Sandbox(pid=pid, conn=Conn(sock, self.loop), pidfd=pidfd, slot=None, uid=uid,
                     maker=self.zygote)
        if outs:  # direct: the fork server reports its end (with the exit status)
            for fd in outs:
                os.set_blocking(fd, False)
            sb.outs, sb.exit_rc = tuple(outs), self.loop.create_future()
            self.by_pid[pid] = sb
        else:
            self._watch(sb)
        self.live.add(sb)
        return sb

    def _watch(self, sb: Sandbox) -> None:
        sb.watched = True
        self.loop.add_reader(sb.pidfd, self._exited, sb)

    def _watch_all(self) -> None:
        """The fork server is gone, and with it the reports of direct sandboxes' ends."""
        for sb in list(self.by_pid.values()):
            if not sb.exited and not sb.watched:
                self._watch(sb)
        self.by_pid.clear()

    def _exit_code(self, pid: int, rc: int) -> None:
        """The fork server reaped a direct sandbox's PID 1: every process of its PID namespace
        is gone (the kernel ends them all before a namespace's init is done exiting)."""
        sb = self.by_pid.pop(pid, None)
        if sb is None:  # (never before its spawn's reply: the fork server sends them in order,
            return  # and the reply is adopted, `_adopt`, as it is read)
        if sb.exit_rc is not None and not sb.exit_rc.done():
            sb.exit_rc.set_result(rc)
        if not sb.exited:
            self._exited(sb)

    def _exited(self, sb: Sandbox) -> None:
        if sb.exit_rc is not None and not sb.exit_rc.done():
            # (a direct sandbox whose fork server died first: no exit report will come; its
            # init was killed with the fork server, PDEATHSIG)
            sb.exit_rc.set_result(-9)
        if sb.watched:
            self.loop.remove_reader(sb.pidfd)
            sb.watched = False
        os.close(sb.pidfd)
        sb.exited = True  # its reply, if any, is still readable; then the connection sees EOF
        if sb.uid in self.orphan_ids:  # (a session that outlived its fork server: its id is free)
            self.orphan_ids.discard(sb.uid)
            self.zygote.give_ids([sb.uid])
        self._maybe_recycle(sb)

    async def take(self) -> Sandbox:
        if self.closed:
            raise ClosedError("the CPU manager is closed")
        await self.wait_up()
        self.arrivals.append(time.monotonic())
        if 2 * len(self.ready) <= self.target():  # else refill after the action (`release`),
            self._wake.set()  # so the refill's forks do not compete with it for the CPU
        while self.ready:
            sb = self.ready.popleft()
            if not sb.dead:
                return sb
        if self._filling > len(self._takers):
            # A refill batch is on its way: one of it comes sooner than a sandbox spawned now
            # would (the fork server and the cgroup thread serve in order), at no extra cost.
            got = await self._wait_for_refill()
            if got is not None:
                return got
            if self.closed:
                raise ClosedError("the CPU manager is closed")
        return await self.spawn()  # cold: the init forks the child itself, in the slot

    async def _wait_for_refill(self) -> Sandbox | None:
        """A sandbox of the refill batch in flight; None when the batch came short."""
        fut: asyncio.Future[Sandbox | None] = self.loop.create_future()
        self._takers.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:  # handed one just as the taker was cancelled: keep it
            if fut.done() and not fut.cancelled() and (sb := fut.result()) is not None:
                self.ready.appendleft(sb)
            raise

    def _hand_out(self, sbs: list[Sandbox]) -> None:
        """A refill's sandboxes: to the takes waiting for them first, the rest to the pool.
        Takes still waiting once no batch is in flight spawn their own (`take`)."""
        for sb in sbs:
            while self._takers and self._takers[0].done():
                self._takers.popleft()  # (cancelled)
            if self._takers:
                self._takers.popleft().set_result(sb)
            else:
                self.ready.append(sb)
        if not self._filling:
            while self._takers:
                fut = self._takers.popleft()
                if not fut.done():
                    fut.set_result(None)

    def release(self, sb: Sandbox) -> None:
        sb.kill()
        sb.released = True
        for fd in sb.outs:  # (the caller has removed its readers)
            try:  # noqa: SIM105
                os.close(fd)
            except OSError:
                pass
        sb.outs = ()
        self._maybe_recycle(sb)
        if not self.closed and self._kick is None:
            # Refill *after* whoever waits for this action's result has run: a timer, not an
            # immediate wake (the fill loop would run first). A drained pool is woken by
            # `take` at once, so this never starves it; one timer serves many releases.
            self._kick = self.loop.call_later(_REFILL_DELAY_S, self._kicked)

    def _kicked(self) -> None:
        self._kick = None
        if not self.closed:
            self._wake.set()

    def _maybe_recycle(self, sb: Sandbox) -> None:
        if not (sb.exited and sb.released) or sb not in self.live:
            return
        self.live.discard(sb)
        if sb.slot is not None:
            self._put_back(sb.slot)

    async def _recycle(self, slot: Slot) -> None:
        for i in range(2000):
            try:
                empty = slot.is_empty()
            except OSError:  # (removed meanwhile: the pool is closing, or the tree went)
                return
            if empty:
                self._free(slot)
                return
            await asyncio.sleep(0.001 if i < 50 else 0.01)
        with contextlib.suppress(OSError):
            slot.remove()  # still busy after ~20 s: leave it, never reuse

    def _free(self, slot: Slot) -> None:
        """An empty slot: back to the free list, or retired (removed; a later spawn makes a new
        one) when it would carry something of its last occupant into the next: memory still
        charged to it (page cache of files the occupant read first stays charged to the cgroup
        that read it, after every process is gone: the next action's peak memory started at it,
        and its memory limit had that much less room), or a peak counter this kernel cannot
        reset (cgroup v2 before Linux 6.12)."""
        try:
            keep = not slot.peak_sticky and slot.charged_bytes() <= LEFTOVER_MAX
        except (OSError, ValueError):
            keep = False
        if keep:
            self.free_slots.append(slot)
        else:
            slot.remove()  # (rmdir: what is still charged stays with the removed cgroup)

    def _deficit(self) -> int:
        """How many to spawn now. Refills come in batches (while at least half the target is
        ready, wait until a batch of 4 is missing): one batch shares one cgroup-move grace
        period and disturbs one action in flight rather than one per spawn disturbing each.
        Sandboxes of batches in flight that no take waits for count as ready."""
        if not self.up.is_set():
            return 0  # (the fork server is being restarted: refilled once it is up)
        target = self.target()
        ready = len(self.ready) + self._filling - len(self._takers)  # (coming, not yet claimed)
        missing = target - ready
        if missing <= 0:
            return 0
        return missing if 2 * ready <= target or missing >= min(4, target) else 0

    async def _fill_loop(self) -> None:
        """Keeps up to `FILL_PIPELINE` refill batches in flight: the fork server forks one while
        the cgroup thread places the one before (each stage also waits: fork replies, RCU)."""
        batches: set[asyncio.Task[None]] = set()
        try:
            while not self.closed:
                self._wake.clear()
                while (not self.closed and not self._backoff and len(batches) < FILL_PIPELINE
                       and self._deficit() > 0):
                    n = min(8, self._deficit())  # a batch of spawns in flight
                    # warm them only while the pool holds up (drained, they are taken at once)
                    # and actions come slowly enough that the CPU warming takes is spare
                    warm = 2 * len(self.ready) >= n and self.rate() < self.warm_rate_max
                    self._filling += n
                    t = self.loop.create_task(self._refill(n, warm))
                    batches.add(t)
                    t.add_done_callback(batches.discard)
                if not batches:
                    while len(self.ready) > self.target():
                        self.release(self.ready.pop())
                with contextlib.suppress(TimeoutError):  # (not wait_for: in 3.11 it can swallow
                    async with asyncio.timeout(0.5):  # a cancellation: the loop would not end)
                        await self._wake.wait()
        finally:
            for t in batches:
                t.cancel()
            if batches:
                await asyncio.gather(*batches, return_exceptions=True)

    async def _refill(self, n: int, warm: bool) -> None:
        """One refill batch: to waiting takes, then to the pool; a short one pauses refills."""
        try:
            got: list[Any] = await self.spawn_many(n, prepare=True, warm=warm)
        except Exception as e:  # (the fork server is gone, ...): as if none came
            got = [e]
        finally:
            self._filling -= n
        ok = [sb for sb in got if isinstance(sb, Sandbox)]
        self._hand_out(ok)
        if len(ok) < n:
            self._backoff = True
            try:
                await asyncio.sleep(0.05)
            finally:
                self._backoff = False
        self._wake.set()

    async def aclose(self) -> None:
        self.closed = True
        self.up.set()  # (takes waiting for a restart: the pool is closed)
        self._wake.set()
        if self._kick is not None:
            self._kick.cancel()
            self._kick = None
        for t in (self._filler, self._cold_task):
            await cancel_and_wait(t)
        for f in self._cold:
            f.cancel()
        self._hand_out([])  # (takes waiting for a refill: the pool is closed)
        for sb in list(self.live):
            self.release(sb)
        self.ready.clear()
        for _ in range(300):  # the kernel tears the namespaces down; slots follow
            if not self.live:
                break
            await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # a placement still running in the cgroup thread uses its slots' kept fds: let it end
        # (the thread is FIFO) before any slot closes them
        with contextlib.suppress(RuntimeError):
            await self.loop.run_in_executor(self._cg_thread, _nothing)
        for slot in self.free_slots:
            slot.remove()
        self.free_slots.clear()
        for sb in self.live:  # (still dying: the cgroup tree's close removes their dirs)
            if sb.slot is not None:
                sb.slot.close()
        self._cg_thread.shutdown(wait=False)


def _nothing() -> None:
    pass
