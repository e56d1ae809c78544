"""Dynamic batching: concurrent single-action requests for one instance merge into batches.

Invariant: every submitted request gets exactly one answer (its output, or an exception), in
whatever batch it landed; a batch never exceeds the instance's current knee size; requests are
served in arrival order per instance. One batch per instance runs at a time, so the requests
that arrive while it runs form the next batch (the queue itself is the batching window).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from ...core.actions import ActionSpec
from ...core.errors import BrokenError, ClosedError
from ...kinds import Outcome
from .config import BatchOutcome

RunFn = Callable[[str, list[ActionSpec]], Awaitable[BatchOutcome]]


class DynamicBatcher:
    """Per-instance queues feeding ``run(instance_id, actions)``."""

    def __init__(self, run: RunFn, knee: Callable[[str], int], wait_s: float) -> None:
        self._run, self._knee, self._wait_s = run, knee, wait_s
        self._queues: dict[str, list[tuple[ActionSpec, asyncio.Future[Outcome]]]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self.batch_sizes: list[int] = []  # sizes of the batches run, in order (for reports)

    async def submit(self, instance_id: str, action: ActionSpec) -> Outcome:
        """Score one action on ``instance_id``; returns its output or raises BrokenError."""
        if self._closed:
            raise ClosedError("the GPU manager's batcher is closed")
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(instance_id, []).append((action, fut))
        self._wakeups.setdefault(instance_id, asyncio.Event()).set()
        if instance_id not in self._tasks:
            self._tasks[instance_id] = asyncio.create_task(self._loop(instance_id))
        return await fut

    async def _loop(self, iid: str) -> None:
        wake = self._wakeups[iid]
        while True:
            await wake.wait()
            wake.clear()
            queue = self._queues.get(iid, [])
            if not queue:
                continue
            knee = max(1, self._knee(iid))
            if len(queue) < knee and self._wait_s > 0:
                await asyncio.sleep(self._wait_s)
            take, self._queues[iid] = queue[:knee], queue[knee:]
            if self._queues[iid]:
                wake.set()
            await self._serve(iid, take)

    async def _serve(
        self, iid: str, take: list[tuple[ActionSpec, asyncio.Future[Outcome]]]
    ) -> None:
        self.batch_sizes.append(len(take))
        try:
            outcome = await self._run(iid, [a for a, _ in take])
        except Exception as exc:  # the whole batch failed: every waiter learns why
            for _, fut in take:
                if not fut.done():
                    fut.set_exception(
                        exc if isinstance(exc, BrokenError) else BrokenError(str(exc))
                    )
            return
        for action, fut in take:
            if fut.done():
                continue
            if action.id in outcome.outputs:
                fut.set_result(outcome.outputs[action.id])
            else:
                reason = outcome.failed.get(action.id, "no output for this action")
                fut.set_exception(BrokenError(f"action {action.id}: {reason}"))

    def drop(self, instance_id: str, reason: str) -> None:
        """Fail the queued requests of an instance (it was unloaded) and stop its loop."""
        for _, fut in self._queues.pop(instance_id, []):
            if not fut.done():
                fut.set_exception(BrokenError(reason))
        task = self._tasks.pop(instance_id, None)
        self._wakeups.pop(instance_id, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for iid in list(self._queues):
            self.drop(iid, "the GPU manager was closed")
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
