"""An in-test executor: one node, actions "run" by sleeping ``payload['sleep']`` seconds; and
`forgotten`, the wait for an engine to expire a result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.engine import Engine, UnknownAction
from arl_tangram.runtime.executor import Emit, Executor


class FakeExecutor(Executor):
    def __init__(self, cpu: float = 2, memory_mb: float = 4096) -> None:
        self.spec = NodeSpec("fake", Resources(cpu=cpu, memory_mb=memory_mb))
        self.emit: Emit | None = None
        self.commands: list[C.Command] = []
        self.runs: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    async def start(self, emit: Emit) -> list[NodeSpec]:
        self.emit = emit
        return [self.spec]

    async def submit(self, commands: Sequence[C.Command]) -> None:
        for c in commands:
            self.commands.append(c)
            if isinstance(c, C.StartAction):
                t = asyncio.get_running_loop().create_task(self._run(c))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)

    async def _run(self, c: C.StartAction) -> None:
        assert self.emit is not None
        a = c.action
        self.runs[a.id] = self.runs.get(a.id, 0) + 1
        self.emit(E.ActionStarted(time.monotonic(), a.id, c.node))
        try:
            await asyncio.sleep(float(a.payload.get("sleep", 0)))
        except asyncio.CancelledError:
            self.emit(E.ActionFinished(time.monotonic(), a.id, Status.CANCELLED, None, "closed"))
            raise
        status = Status.FAILED if a.payload.get("fail") else Status.SUCCEEDED
        self.emit(E.ActionFinished(time.monotonic(), a.id, status, {"echo": dict(a.payload)}))

    def node_info(self) -> dict[str, dict[str, Any]]:
        return {"fake": {"warm_pools": {"python": 1}, "languages": ["python"]}}

    async def aclose(self) -> None:
        self.closed = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class FakeCore:
    """A minimal FIFO core, used only until/unless the real one imports (sessions ignored)."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        from collections import deque

        self.node = nodes[0]
        self.free = nodes[0].capacity
        self.queue: deque[Any] = deque()
        self.live: dict[str, Any] = {}

    def handle(self, ev: E.Event) -> list[C.Command]:
        from arl_tangram.core.actions import ActionResult

        out: list[C.Command] = []
        if isinstance(ev, E.ActionArrived):
            self.live[ev.action.id] = [ev.action, ev.time, None]
            self.queue.append(ev.action.id)
        elif isinstance(ev, E.ActionStarted) and ev.action_id in self.live:
            self.live[ev.action_id][2] = ev.time
        elif isinstance(ev, E.ActionFinished) and ev.action_id in self.live:
            a, t0, ts = self.live.pop(ev.action_id)
            self.free = self.free + a.demand
            out.append(C.Deliver(ActionResult(a.id, ev.status, t0, ts, ev.time, self.node.name,
                                              a.demand, ev.output, ev.reason)))
        elif isinstance(ev, E.CancelRequested) and ev.action_id in self.queue:
            self.queue.remove(ev.action_id)
            a, t0, _ = self.live.pop(ev.action_id)
            out.append(C.Deliver(ActionResult(a.id, Status.CANCELLED, t0, None, ev.time)))
        while self.queue and self.live[self.queue[0]][0].demand.fits_in(self.free):
            a = self.live[self.queue.popleft()][0]
            self.free = self.free - a.demand
            out.append(C.StartAction(a, self.node.name, a.demand))
        return out


def core_factory(config: Any, nodes: Sequence[NodeSpec]) -> Any:
    """The real core when it imports, else FakeCore."""
    try:
        from arl_tangram.runtime.engine import make_core

        return make_core(config, nodes)
    except ImportError:
        return FakeCore(nodes)


async def forgotten(eng: Engine, aid: str) -> None:
    """Wait (bounded) until the engine has expired ``aid``'s result: proof that an expiry pass
    ran at the clock's current time."""
    for _ in range(4000):
        try:
            eng.peek(aid)
        except UnknownAction:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"result {aid} never expired")


def scripted_memory_use(seat: Any, reads: Iterable[tuple[dict[str, tuple[int, int]], int]],
                        ) -> Callable[[], tuple[dict[str, tuple[int, int]], int]]:
    """A CPU manager's ``memory_use`` answering ``reads`` in turn, then closing ``seat`` (the
    node's memory reporter stops) and answering nothing."""
    it = iter(reads)

    def use() -> tuple[dict[str, tuple[int, int]], int]:
        try:
            return next(it)
        except StopIteration:
            seat.closed = True
            return {}, 0
    return use
