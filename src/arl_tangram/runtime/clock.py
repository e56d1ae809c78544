"""Clocks: the one place the runtime reads time.

Invariant: the engine stamps every event it feeds the core with ``clock.now()``; nothing else in
the runtime calls ``time`` for scheduling purposes. Tests inject a `ManualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (the origin is arbitrary)."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to (tests)."""

    __slots__ = ("_t",)

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"dt must be >= 0, got {dt}")
        self._t += dt
