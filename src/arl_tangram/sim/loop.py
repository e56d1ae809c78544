"""A discrete-event loop: a virtual clock and a heap of timed callbacks.

Invariant: callbacks run in order of ``(time, priority, seq)``; ``seq`` is a counter assigned at
scheduling, so two callbacks at the same time and priority run in the order they were scheduled
and a run is fully deterministic. The clock only moves forward, and only to the time of the
callback about to run. Nothing here knows about actions or the core (SimPy's `Environment`,
shrunk to what the simulator needs).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

# Priorities for callbacks at the same instant: executor reports first, then arrivals, then the
# flush of model actions that arrived together, then ticks. Reporting completions before
# arrivals lets the core see freed capacity before new demand.
REPORT = 0
ARRIVAL = 1
FLUSH = 2
TICK = 3


class VirtualClock:
    """The `Clock` of a simulation: time is whatever the loop says it is."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def _advance(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time cannot go back: {t} < {self._now}")
        self._now = t


class EventLoop:
    """Heap of ``(time, priority, seq, callback, args)``; `run` pops until empty or ``until``."""

    __slots__ = ("_halted", "_heap", "_seq", "clock")

    def __init__(self, start: float = 0.0) -> None:
        self.clock = VirtualClock(start)
        self._heap: list[tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0  # callbacks scheduled so far
        self._halted = False  # set by `halt`: `run` returns after the running callback

    @property
    def now(self) -> float:
        return self.clock._now

    @property
    def processed(self) -> int:
        """Callbacks run so far: every scheduled one that is no longer in the heap."""
        return self._seq - len(self._heap)

    def at(self, time: float, callback: Callable[..., Any], *args: Any, priority: int = 1) -> None:
        """Run ``callback(*args)`` at virtual ``time`` (never earlier than now)."""
        self.push(time, priority, callback, args)

    def push(self, time: float, priority: int, callback: Callable[..., Any], args: tuple[Any, ...],
             ) -> None:
        """`at` with every argument positional and ``args`` as one tuple (the hot paths' form)."""
        now = self.clock._now
        if time < now:
            time = now
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., Any], *args: Any, priority: int = 1) -> None:
        """Run ``callback(*args)`` ``delay`` seconds of virtual time from now."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.at(self.clock._now + delay, callback, *args, priority=priority)

    def __len__(self) -> int:
        return len(self._heap)

    def peek(self) -> float | None:
        """Time of the next callback, or None when nothing is scheduled."""
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the next callback; False when there is none."""
        if not self._heap:
            return False
        time, _prio, _seq, callback, args = heapq.heappop(self._heap)
        self.clock._advance(time)
        callback(*args)
        return True

    def halt(self) -> None:
        """Make `run` return once the callback now running is done (a cheap `stop`)."""
        self._halted = True

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Run callbacks until the heap is empty, time would pass ``until``, ``stop()``, or
        a callback calls `halt`."""
        heap = self._heap
        pop = heapq.heappop
        clock = self.clock
        self._halted = False
        if until is not None or stop is not None:
            while heap:
                if until is not None and heap[0][0] > until:
                    clock._advance(until)
                    return
                time, _prio, _seq, callback, args = pop(heap)
                clock._now = time  # heap order guarantees monotonic time
                callback(*args)
                if self._halted or (stop is not None and stop()):
                    return
            return
        while heap:  # the same loop without ``until`` and ``stop`` (a simulation's run)
            time, _prio, _seq, callback, args = pop(heap)
            clock._now = time
            callback(*args)
            if self._halted:
                return
