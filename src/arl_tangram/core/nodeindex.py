"""An index of alive nodes by free CPU, so placement never scans every node.

Invariant: every alive node is in exactly one bucket, the one of ``level(free cpu)``; `levels`
is the sorted list of non-empty bucket levels. A node with free cpu ``f`` sits in bucket
``floor(f * RES)``, so a demand of ``d`` cpu can only fit in buckets ``>= floor(d * RES)``.
The index is updated by the core after every change of a node's free capacity (`update`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from .resources import CPU

RES = 4  # buckets per CPU


def level(free_cpu: float) -> int:
    return int(free_cpu * RES + 1e-9) if free_cpu > 0 else 0


class FreeIndex:
    """Buckets of node names keyed by their free-cpu level."""

    __slots__ = ("_buckets", "_level", "levels")

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, None]] = {}  # insertion-ordered sets
        self._level: dict[str, int] = {}
        self.levels: list[int] = []

    def __contains__(self, name: str) -> bool:
        return name in self._level

    def __len__(self) -> int:
        return len(self._level)

    def update(self, name: str, free: dict[str, float]) -> None:
        f = free.get(CPU, 0.0)
        new = int(f * RES + 1e-9) if f > 0 else 0  # level(f), inlined: a hot path
        lv = self._level
        old = lv.get(name)
        if old == new:
            return
        buckets = self._buckets
        if old is not None:  # `_drop(name, old)`, inlined
            ob = buckets[old]
            del ob[name]
            if not ob:
                del buckets[old]
                del self.levels[bisect.bisect_left(self.levels, old)]
        lv[name] = new
        b = buckets.get(new)
        if b is None:
            b = buckets[new] = {}
            bisect.insort(self.levels, new)
        b[name] = None

    def remove(self, name: str) -> None:
        old = self._level.pop(name, None)
        if old is not None:
            self._drop(name, old)

    def _drop(self, name: str, lvl: int) -> None:
        b = self._buckets[lvl]
        del b[name]
        if not b:
            del self._buckets[lvl]
            del self.levels[bisect.bisect_left(self.levels, lvl)]

    def from_level(self, cpu: float) -> Iterator[str]:
        """Nodes whose free cpu may cover ``cpu``, fullest (least free) first."""
        levels = self.levels
        i = bisect.bisect_left(levels, level(cpu))
        buckets = self._buckets
        for lvl in levels[i:]:
            b = buckets.get(lvl)
            if b:
                yield from b  # callers do not update the index while iterating

    def max_level(self) -> int:
        return self.levels[-1] if self.levels else -1
