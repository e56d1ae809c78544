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


# Callbacks are kept in buckets of `BUCKET_S` of virtual time (a calendar queue, Brown 1988): a
# heap of the bucket numbers to come, a list per bucket, and a heap of the current bucket only.
# The order is the one heap's, ``(time, priority, seq)``: a bucket holds a time interval, earlier
# buckets earlier times, and the current bucket is heapified whole before its first pop. What it
# buys at scale: with 20,000 trajectories' callbacks pending, one heap's pops walk 15 levels of
# tuples spread over memory; the current bucket holds the next few hundred (issue 24).
BUCKET_S = 0.25
_INV = 1.0 / BUCKET_S
_FAR = 1 << 62  # the bucket of callbacks at (or near) infinity

Entry = tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]


class EventLoop:
    """Callbacks ``(time, priority, seq, callback, args)`` in time order; `run` pops until empty
    or ``until``."""

    __slots__ = ("_buckets", "_count", "_cur", "_halted", "_heap", "_later", "_seq", "clock")

    def __init__(self, start: float = 0.0) -> None:
        self.clock = VirtualClock(start)
        self._heap: list[Entry] = []  # the current bucket's callbacks, a heap
        self._cur = -_FAR  # the current bucket's number
        self._buckets: dict[int, list[Entry]] = {}  # later buckets' callbacks, unordered
        self._later: list[int] = []  # the numbers of `_buckets`, a heap
        self._seq = 0  # callbacks scheduled so far
        self._count = 0  # callbacks scheduled, not yet run
        self._halted = False  # set by `halt`: `run` returns after the running callback

    @property
    def now(self) -> float:
        return self.clock._now

    @property
    def processed(self) -> int:
        """Callbacks run so far: every scheduled one that is no longer waiting."""
        return self._seq - self._count

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
        self._count += 1
        b = int(time * _INV) if time < 1e15 else _FAR  # (monotone in time, also below zero)
        if b <= self._cur:
            heapq.heappush(self._heap, (time, priority, self._seq, callback, args))
            return
        got = self._buckets.get(b)
        if got is None:
            self._buckets[b] = [(time, priority, self._seq, callback, args)]
            heapq.heappush(self._later, b)
        else:
            got.append((time, priority, self._seq, callback, args))

    def _turn(self) -> bool:
        """Make the next non-empty bucket the current one; False when none is left."""
        if not self._later:
            return False
        b = heapq.heappop(self._later)
        heap = self._heap = self._buckets.pop(b)
        heapq.heapify(heap)
        self._cur = b
        return True

    def after(self, delay: float, callback: Callable[..., Any], *args: Any, priority: int = 1) -> None:
        """Run ``callback(*args)`` ``delay`` seconds of virtual time from now."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.at(self.clock._now + delay, callback, *args, priority=priority)

    def __len__(self) -> int:
        return self._count

    def peek(self) -> float | None:
        """Time of the next callback, or None when nothing is scheduled."""
        if not self._heap and not self._turn():
            return None
        return self._heap[0][0]

    def step(self) -> bool:
        """Run the next callback; False when there is none."""
        if not self._heap and not self._turn():
            return False
        time, _prio, _seq, callback, args = heapq.heappop(self._heap)
        self._count -= 1
        self.clock._advance(time)
        callback(*args)
        return True

    def halt(self) -> None:
        """Make `run` return once the callback now running is done (a cheap `stop`)."""
        self._halted = True

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Run callbacks until none is left, time would pass ``until``, ``stop()``, or a
        callback calls `halt`."""
        pop = heapq.heappop
        clock = self.clock
        self._halted = False
        while True:
            heap = self._heap
            if not heap:
                if not self._turn():
                    return
                heap = self._heap
            if until is not None and heap[0][0] > until:
                clock._advance(until)
                return
            while heap:  # the current bucket (a callback may add to it, never to one before)
                if until is not None and heap[0][0] > until:
                    break
                time, _prio, _seq, callback, args = pop(heap)
                self._count -= 1
                clock._now = time  # bucket and heap order guarantee monotonic time
                callback(*args)
                if self._halted or (stop is not None and stop()):
                    return
