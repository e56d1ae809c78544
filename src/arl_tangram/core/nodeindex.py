"""An index of alive nodes by free CPU, so placement never scans every node.

Invariant: every alive node is in exactly one bucket, the one of ``level(free cpu)``; `levels`
is the sorted list of non-empty bucket levels. A node with free cpu ``f`` sits in bucket
``floor(f * RES)``, so a demand of ``d`` cpu can only fit in buckets ``>= floor(d * RES)``.
The index is updated by the core after every change of a node's free capacity (`update`).

One node's bucket move may be *held* (`hold`): the core releases an action's allotment and, in
the same event, usually starts the next action on that node, which moves it back. A held node
stays in its bucket until `flush`, which puts it where the moves it held would have put it (at
the end of its final bucket, when any of them changed its level). Any update of another node,
`remove`, and every read (`buckets_from`, `buckets_down`, `from_level`, `max_level`; the core
flushes at the end of each event) flush first, so what a reader sees, order within buckets
included, is exactly what updating at once would have given.

`SpreadIndex` (attached as `FreeIndex.spread` once sessions need it) keeps the same nodes in
`Sessions.spread`'s order (sessions per core, then most free CPU), so a session finds its node
without a scan of every node; the `FreeIndex` touches it at every change of a node's free capacity.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator

from .resources import CPU

RES = 4  # buckets per CPU


def level(free_cpu: float) -> int:
    return int(free_cpu * RES + 1e-9) if free_cpu > 0 else 0


class FreeIndex:
    """Buckets of node names keyed by their free-cpu level."""

    __slots__ = ("_buckets", "_held", "_held_level", "_held_moved", "_level", "levels", "spread")

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, None]] = {}  # insertion-ordered sets
        self._level: dict[str, int] = {}  # (a held node: the level of the bucket it is in)
        self.levels: list[int] = []
        self._held: str | None = None  # the node whose move is held (`hold`), if any
        self._held_level = 0  # its level as of the last update
        self._held_moved = False  # whether an update it held changed its level
        # the same nodes in the order sessions are spread over them, touched at every update
        self.spread: SpreadIndex | None = None

    def __contains__(self, name: str) -> bool:
        return name in self._level

    def __len__(self) -> int:
        return len(self._level)

    def names(self) -> list[str]:
        return list(self._level)

    def update(self, name: str, free: dict[str, float]) -> None:
        spread = self.spread
        if spread is not None:
            spread.dirty[name] = None
        new = level(free.get(CPU, 0.0))
        held = self._held
        if held is not None:
            if held == name:  # held on: only note the level
                if new != self._held_level:
                    self._held_level = new
                    self._held_moved = True
                return
            self.flush()
        old = self._level.get(name)
        if old == new:
            return
        if old is not None:
            self._drop(name, old)
        self._add(name, new)

    def hold(self, name: str, free: dict[str, float]) -> None:
        """`update`, with the bucket move put off until `flush` (see the module docstring)."""
        spread = self.spread
        if spread is not None:
            spread.dirty[name] = None
        held = self._held
        if held != name:
            if held is not None:
                self.flush()
            old = self._level.get(name)
            if old is None:  # not indexed: nothing to hold
                self.update(name, free)
                return
            self._held, self._held_level, self._held_moved = name, old, False
        new = level(free.get(CPU, 0.0))
        if new != self._held_level:
            self._held_level = new
            self._held_moved = True

    def flush(self) -> None:
        """Carry out the held node's move, if any update it held changed its level."""
        name = self._held
        if name is None:
            return
        self._held = None
        if not self._held_moved:
            return
        # to the end of its final bucket, even when that is the one it was in
        self._drop(name, self._level[name])
        self._add(name, self._held_level)

    def remove(self, name: str) -> None:
        spread = self.spread
        if spread is not None:
            spread.dirty[name] = None
        if self._held is not None:
            self.flush()
        old = self._level.pop(name, None)
        if old is not None:
            self._drop(name, old)

    def _drop(self, name: str, lvl: int) -> None:
        b = self._buckets[lvl]
        del b[name]
        if not b:
            del self._buckets[lvl]
            del self.levels[bisect.bisect_left(self.levels, lvl)]

    def _add(self, name: str, lvl: int) -> None:
        self._level[name] = lvl
        b = self._buckets.get(lvl)
        if b is None:
            b = self._buckets[lvl] = {}
            bisect.insort(self.levels, lvl)
        b[name] = None

    def buckets_from(self, cpu: float) -> list[dict[str, None]]:
        """The buckets of nodes whose free cpu may cover ``cpu``, fullest (least free) first."""
        if self._held is not None:
            self.flush()
        levels = self.levels
        lvl = level(cpu)
        if not levels or lvl > levels[-1]:
            return []  # no node has that much free CPU
        buckets = self._buckets
        return [buckets[lv] for lv in levels[bisect.bisect_left(levels, lvl):]]

    def buckets_down(self, cpu: float = 0.0) -> list[dict[str, None]]:
        """The buckets of nodes whose free cpu may cover ``cpu``, emptiest (most free) first."""
        if self._held is not None:
            self.flush()
        levels = self.levels
        buckets = self._buckets
        least = level(cpu)
        out: list[dict[str, None]] = []
        for i in range(len(levels) - 1, -1, -1):
            lv = levels[i]
            if lv < least:
                break
            out.append(buckets[lv])
        return out

    def from_level(self, cpu: float) -> Iterator[str]:
        """Nodes whose free cpu may cover ``cpu``, fullest (least free) first."""
        if self._held is not None:
            self.flush()
        levels = self.levels
        i = bisect.bisect_left(levels, level(cpu))
        buckets = self._buckets
        for lvl in levels[i:]:
            b = buckets.get(lvl)
            if b:
                yield from b  # callers do not update the index while iterating

    def max_level(self) -> int:
        if self._held is not None:
            self.flush()
        return self.levels[-1] if self.levels else -1



class SpreadIndex:
    """The indexed nodes in the order of a rank (`Sessions.spread`: sessions per core with one
    more, then most free CPU, then the name), kept lazily: a change only marks the node
    (`touch`; the `FreeIndex` it is attached to touches every node whose free capacity
    changes); `refresh` gives the marked ones their rank now. ``rank_of`` says a node's rank
    (None: not a candidate, e.g. lost).

    Invariant after `refresh`: `rank` holds every candidate's rank as it is now, and `heap`
    holds an entry ``(*rank, name)`` for each (others are stale: their rank differs from
    `rank`'s, or the node is gone; they are dropped when met, or all at once when the heap
    outgrows the nodes, `_compact`)."""

    __slots__ = ("dirty", "heap", "rank", "rank_of")

    def __init__(self, rank_of: Callable[[str], tuple[float, float] | None]) -> None:
        self.rank_of = rank_of
        self.dirty: dict[str, None] = {}  # nodes whose rank may have changed since `refresh`
        self.rank: dict[str, tuple[float, float]] = {}
        self.heap: list[tuple[float, float, str]] = []

    def __len__(self) -> int:
        return len(self.rank)

    def touch(self, name: str) -> None:
        self.dirty[name] = None

    def refresh(self) -> None:
        dirty = self.dirty
        if not dirty:
            return
        rank, heap, rank_of = self.rank, self.heap, self.rank_of
        for name in dirty:
            new = rank_of(name)
            if new is None:
                rank.pop(name, None)
            elif rank.get(name) != new:
                rank[name] = new
                heapq.heappush(heap, (new[0], new[1], name))
        dirty.clear()
        if len(heap) > 2 * len(rank) + 64:
            self._compact()

    def pop(self) -> str | None:
        """The best ranked node (taken off the heap: `push_back` it), None when none is left;
        stale entries met on the way are dropped. Call `refresh` first."""
        heap, rank = self.heap, self.rank
        while heap:
            a, b, name = heapq.heappop(heap)
            got = rank.get(name)
            if got is not None and got[0] == a and got[1] == b:
                return name
        return None

    def push_back(self, names: list[str]) -> None:
        """Put back what `pop` took (at the ranks they have)."""
        rank, heap = self.rank, self.heap
        for name in names:
            r = rank[name]
            heapq.heappush(heap, (r[0], r[1], name))

    def _compact(self) -> None:
        heap = self.heap = [(r[0], r[1], name) for name, r in self.rank.items()]
        heapq.heapify(heap)
