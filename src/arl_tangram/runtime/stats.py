"""Bookkeeping the engine keeps for /v1/stats, /v1/cluster and /metrics.

Invariant: everything here is derived from the events the engine fed the core and the commands
the core returned; it never decides anything and never blocks. Memory is bounded: ACT samples
per kind are a fixed-size window, histograms are fixed buckets.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ..core.actions import ActionResult, ActionSpec
from ..core.resources import Resources

# Upper bounds (seconds) of the ACT histogram buckets; +Inf is implicit.
ACT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0, 60.0, 120.0, 300.0)


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_xs:
        return math.nan
    k = max(0, min(len(sorted_xs) - 1, math.ceil(q / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[k]


@dataclass(slots=True)
class KindStats:
    """ACT figures of one action kind."""

    window: deque[float]  # recent ACTs (seconds)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(ACT_BUCKETS) + 1))
    act_sum: float = 0.0
    count: int = 0

    def add(self, act: float) -> None:
        self.window.append(act)
        self.act_sum += act
        self.count += 1
        for i, ub in enumerate(ACT_BUCKETS):
            if act <= ub:
                self.buckets[i] += 1
                return
        self.buckets[-1] += 1

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.window)
        pct = {f"p{q}": _num(percentile(xs, q)) for q in (50, 90, 99)}
        mean = sum(xs) / len(xs) if xs else math.nan
        return {"count": self.count, "window": len(xs), "mean": _num(mean), **pct,
                "max": _num(xs[-1] if xs else math.nan)}


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


@dataclass(slots=True)
class Live:
    """An unfinished action as the engine sees it."""

    spec: ActionSpec
    submit_time: float
    started: bool = False
    node: str | None = None
    allotment: Resources | None = None


class StatsBook:
    """Counters, ACT windows and per-node use."""

    def __init__(self, window: int = 10_000) -> None:
        self._window = window
        self.kinds: dict[str, KindStats] = {}
        self.finished: Counter[tuple[str, str]] = Counter()  # (kind, status) -> count
        self.submitted: Counter[str] = Counter()
        self.warm_hits = 0
        self.warm_misses = 0
        self.model_loads = 0  # cold loads that succeeded
        self.model_swaps = 0  # swap-ins of parked weights that succeeded
        self.model_load_failures = 0
        self.shed = 0  # submits refused for overload
        self.session_evictions = 0  # sessions evicted: their node ran short of memory (issue 26)

    def on_finished(self, spec_kind: str, result: ActionResult) -> None:
        self.finished[(spec_kind, result.status.name.lower())] += 1
        act = result.act
        if act is not None and act >= 0:
            ks = self.kinds.get(spec_kind)
            if ks is None:
                ks = self.kinds[spec_kind] = KindStats(deque(maxlen=self._window))
            ks.add(act)

    def act_summary(self) -> dict[str, Any]:
        return {k: ks.summary() for k, ks in sorted(self.kinds.items())}
