"""The optimum every comparison is shown against: each action's lower bound, and the step's.

Invariant: a bound is what no scheduler on the same cluster could beat for that action --
no queueing, no cold start, no model load, its best allotment:
- a CPU action: its work at the speed of its largest useful allotment (its elastic maximum,
  capped by the largest node's capacity in that dimension); a rigid action: its work;
- a reward or judge action: a batch of one on a resident, idle instance (``alpha + work``);
- any action: at most its timeout (a run ends it there).
The step's bound replays each trajectory closed-loop with every action at its bound (its
generation times unchanged): the longest trajectory, plus the training phase. Computed from the
trajectories alone, never from a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.cluster import ClusterSpec
from .trace import SimAction, Trajectory


def action_bound(act: SimAction, cluster: ClusterSpec, largest: Mapping[str, float]) -> float:
    """Lower bound of one action's completion time (seconds): never past its timeout, where
    every scheduler ends it."""
    if act.model is not None:
        model = cluster.model(act.model)
        b = (model.alpha if model is not None else 0.0) + act.work_s
    else:
        el = act.elasticity
        if el is None or not el.is_elastic:
            b = act.work_s
        else:
            k = min(el.max, largest.get(el.dim, el.max))
            b = act.work_s / el.speedup.factor(max(k, el.min))
    t = act.timeout_s
    return t if 0.0 < t < b else b


@dataclass(frozen=True, slots=True)
class Bound:
    """The optimum of a run: ACT statistics of the per-action bounds and the step bound."""

    act: Mapping[str, float]  # count, avg, p50, p99 of the per-action bounds (seconds)
    step_s: tuple[float, ...]  # per RL step: the longest trajectory at its bounds + training

    @property
    def step_avg_s(self) -> float:
        return sum(self.step_s) / len(self.step_s) if self.step_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"act": dict(self.act), "step_s": list(self.step_s), "step_avg_s": self.step_avg_s}


def bound(batches: Iterable[Sequence[Trajectory]], cluster: ClusterSpec, train_s: float) -> Bound:
    """The optimum of replaying ``batches`` (one per RL step) on ``cluster``."""
    largest: dict[str, float] = {}
    for n in cluster.nodes:
        for k, v in n.capacity.items():
            largest[k] = max(largest.get(k, 0.0), v)
    acts: list[float] = []
    steps: list[float] = []
    for batch in batches:
        longest = 0.0
        for traj in batch:
            t = traj.start
            for gen, act in traj.steps:
                b = action_bound(act, cluster, largest)
                acts.append(b)
                t += gen + b
            longest = max(longest, t)
        if batch:
            steps.append(longest + train_s)
    a = np.asarray(acts, dtype=float)
    if len(a):
        p50, p99 = np.percentile(a, [50, 99])
        summary = {"count": len(a), "avg": float(a.mean()), "p50": float(p50), "p99": float(p99)}
    else:
        summary = {"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0}
    return Bound(summary, tuple(steps))
