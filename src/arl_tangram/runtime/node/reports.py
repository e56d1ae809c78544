"""What a node tells the core unasked, on its own clock (`Reporters`): how many warm sandboxes
wait here (WarmPoolReport, on every change) and what each open session's sandbox uses
(MemoryReport, memory that follows use: issue 26)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from ...core import events as E
from .seat import Seat

log = logging.getLogger(__name__)


def window_peak(w: collections.deque[tuple[float, float]], now: float, top: float,
                span: float) -> float:
    """``top`` sampled at ``now`` into ``w``; the highest sample of the last ``span`` seconds.

    ``w`` keeps only the samples that can still be a later answer, each higher than every
    later one (a monotonic queue: the first is the highest), so a session whose figure holds
    (a frozen idle one, issue 40) keeps one sample and costs O(1) a report, not the window's
    length (20 at 10 s / 0.5 s)."""
    while w and w[-1][1] <= top:
        w.pop()
    w.append((now, top))
    while w[0][0] < now - span:
        w.popleft()
    return w[0][1]


class Reporters:
    """The warm and the memory reporter of one node, and their settings."""

    def __init__(self, seat: Seat) -> None:
        self.seat = seat
        self.warm_report_s = 0.05  # how often warm sandboxes are counted and reported on change
        # every `memory_report_s` the open sessions' memory is read (their cgroups'
        # memory.current and memory.peak) and reported to the core (MemoryReport) with each
        # one's highest over the last `memory_window_s`
        self.memory_report_s = 0.5
        self.memory_window_s = 10.0
        # measured use above this x the node's memory: idle (frozen) sessions' page cache is
        # reclaimed before the report (`CpuManager.reclaim_idle`), below the core's watermark
        # (0.9, which evicts), so the core evicts only for what they cannot give back
        self.memory_reclaim_at = 0.85
        self.memory_last: dict[str, Any] = {}  # the last report, for info()
        self.memory_mb = 0.0  # the node's memory (`NodeHost.start` sets it from its spec)

    async def warm(self) -> None:
        """Tell the core how many warm sandboxes wait here (WarmPoolReport), on every change.

        The CPU manager's warm sandboxes serve every language, so each language is reported
        with the same count; the core uses it to prefer this node and to count warm starts.
        """
        seat = self.seat
        try:
            keys = tuple(seat.cpu.languages())
        except Exception:
            return
        last = -1
        while not seat.closed:
            try:
                n = sum(seat.cpu.warm_state().values())
            except Exception:
                return
            if n != last:
                now = time.monotonic()
                for key in keys:
                    seat.emit(E.WarmPoolReport(now, seat.name, key, n))
                last = n
            await asyncio.sleep(self.warm_report_s)

    async def memory(self) -> None:
        """Tell the core what each open session's sandbox uses (MemoryReport), every
        `memory_report_s` while a session is open: its memory now and its highest over the
        last `memory_window_s` (the peak between two samples from its cgroup's memory.peak, so
        a burst between them counts), and what the other sandboxes use now."""
        seat = self.seat
        window: dict[str, collections.deque[tuple[float, float]]] = {}
        mb = float(1 << 20)
        while not seat.closed:
            await asyncio.sleep(self.memory_report_s)
            try:
                use, other = seat.cpu.memory_use()
            except Exception as exc:  # (a manager that cannot tell: nothing reported)
                log.warning("node %s: memory use unreadable: %s; not reported", seat.name, exc)
                return
            use, other = await self._reclaim_if_short(use, other)
            now = time.monotonic()
            for sid in [s for s in window if s not in use]:
                del window[sid]
            if not use:
                continue
            current: dict[str, float] = {}
            peak: dict[str, float] = {}
            for sid, (cur, top) in use.items():
                w = window.setdefault(sid, collections.deque())
                current[sid] = round(cur / mb, 3)
                peak[sid] = round(window_peak(w, now, top / mb, self.memory_window_s), 3)
            self.memory_last = {"sessions_mb": round(sum(current.values()), 1),
                                "other_mb": round(other / mb, 1)}
            seat.emit(E.MemoryReport(now, seat.name, current, peak, round(other / mb, 3)))

    async def _reclaim_if_short(self, use: dict[str, tuple[int, int]], other: int
                                ) -> tuple[dict[str, tuple[int, int]], int]:
        """Above `memory_reclaim_at` of the node's memory: idle sessions' page cache
        reclaimed down to it (their state kept, frozen), and the use read again."""
        cap = self.memory_mb
        used = other + sum(cur for cur, _ in use.values())
        if not cap or used <= self.memory_reclaim_at * cap * (1 << 20):
            return use, other
        try:
            freed = await self.seat.cpu.reclaim_idle(
                int(used - self.memory_reclaim_at * cap * (1 << 20)))
            if freed:
                log.info("node %s: short of memory: %d MB of idle sessions' page cache "
                         "reclaimed", self.seat.name, freed >> 20)
                return self.seat.cpu.memory_use()
        except Exception as exc:
            log.warning("node %s: reclaiming idle sessions' memory: %s", self.seat.name, exc)
        return use, other
