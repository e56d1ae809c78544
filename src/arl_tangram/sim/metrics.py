"""What a simulation measured: ACT statistics, RL step durations, utilization, idle holdings.

Invariant: every figure here is computed from what happened in virtual time (results the core
delivered, resources the executor held); nothing is estimated or copied from a configuration.
``busy`` resources do work (an executing action's allotment, a model instance running a batch);
``held`` resources are unavailable to others (busy ones, plus sandboxes still starting, open
sessions, resident model instances, and slices a policy reserves for a trajectory). Held-idle is
``held - busy``. Utilization and held-idle are time integrals divided by capacity x makespan.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.actions import ActionResult, Status
from ..core.resources import Resources

REPORT_DIMS = ("cpu", "memory_mb", "gpu", "gpu_memory_mb")


class UsageMeter:
    """Integrates busy and held resource vectors over virtual time (piecewise constant).

    Each reported dimension keeps one list ``[busy, held, reserved, busy_int, held_int]``: the
    executor changes the meter three times per action and every change first integrates the
    segment that ends, so its arithmetic indexes these lists by constant position (about half
    the cost of the dict operations it replaces). `busy`, `held`, `reserved`, `busy_int` and
    `held_int` read them as dicts.
    """

    def __init__(self, capacity: Mapping[str, float], now: Callable[[], float], *,
                 series_points: int = 600) -> None:
        self.capacity = {d: float(capacity.get(d, 0.0)) for d in REPORT_DIMS if capacity.get(d, 0.0) > 0}
        self._now = now
        # dimension -> [busy, held, reserved (policy slices), busy integral, held integral]
        self._dims: dict[str, list[float]] = {d: [0.0, 0.0, 0.0, 0.0, 0.0] for d in self.capacity}
        self._all = tuple(self._dims.values())  # the same lists, in `capacity` order
        self._last = now()
        self.start = self._last
        self.series: list[tuple[float, dict[str, float]]] = []  # (t, busy fraction per dim)
        self._series_points = series_points
        self._frozen = False

    def _column(self, i: int) -> dict[str, float]:
        return {d: v[i] for d, v in self._dims.items()}

    @property
    def busy(self) -> dict[str, float]:
        return self._column(0)

    @property
    def held(self) -> dict[str, float]:
        return self._column(1)

    @property
    def reserved(self) -> dict[str, float]:
        return self._column(2)

    @property
    def busy_int(self) -> dict[str, float]:
        return self._column(3)

    @property
    def held_int(self) -> dict[str, float]:
        return self._column(4)

    def restart(self) -> None:
        """Measure from now on (the first arrival): earlier idle time is not the workload's."""
        self._accrue()
        self.start = self._last
        for v in self._all:
            v[3] = v[4] = 0.0

    def freeze(self) -> None:
        """Stop measuring (the last RL step ended); later changes are not integrated."""
        self._accrue()
        self._frozen = True

    def _accrue(self) -> None:
        if not self._frozen:
            self._accrue_to(self._now())

    def _accrue_to(self, t: float) -> None:
        dt = t - self._last
        if dt > 0:
            for v in self._all:  # [busy, held, reserved, busy_int, held_int]
                v[3] += v[0] * dt
                h = v[1]
                r = v[2]
                v[4] += (h if h > r else r) * dt
            self._last = t

    def change(self, busy: Mapping[str, float] | None, held: Mapping[str, float] | None, sign: int) -> None:
        """Add (sign=+1) or remove (sign=-1) ``busy`` and ``held`` amounts from now on."""
        self.change_at(self._now(), busy, held, sign)

    def change_at(self, t: float, busy: Mapping[str, float] | None, held: Mapping[str, float] | None,
                  sign: int) -> None:
        """`change` for a caller that knows the time ``t`` is now (the executor, per action)."""
        if t != self._last and not self._frozen:
            # `self._accrue_to(t)`, inlined: three changes per action come here
            # (tests/sim/test_metrics.py holds the two equal)
            dt = t - self._last
            if dt > 0:
                for v in self._all:  # [busy, held, reserved, busy_int, held_int]
                    v[3] += v[0] * dt
                    h = v[1]
                    r = v[2]
                    v[4] += (h if h > r else r) * dt
                self._last = t
        dims = self._dims
        if busy is held and busy is not None:  # a started run ends: one pass for both
            for d, x in (busy._d if type(busy) is Resources else busy).items():
                acc = dims.get(d)
                if acc is not None:
                    y = sign * x
                    acc[0] += y
                    acc[1] += y
            return
        if busy is not None:
            for d, x in (busy._d if type(busy) is Resources else busy).items():
                acc = dims.get(d)
                if acc is not None:
                    acc[0] += sign * x
        if held is not None:
            for d, x in (held._d if type(held) is Resources else held).items():
                acc = dims.get(d)
                if acc is not None:
                    acc[1] += sign * x

    def set_reserved(self, reserved: Mapping[str, float]) -> None:
        """Resources a policy holds for owners that are not running anything (static slices)."""
        self._accrue()
        for d, v in self._dims.items():
            v[2] = float(reserved.get(d, 0.0))

    def sample(self) -> None:
        t = self._now()
        dims = self._dims
        self.series.append((t, {d: dims[d][0] / c for d, c in self.capacity.items()}))

    def totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """(utilization, held-idle) per dimension as fractions of capacity x elapsed time."""
        self._accrue()
        span = self._last - self.start
        util: dict[str, float] = {}
        idle: dict[str, float] = {}
        for d, cap in self.capacity.items():
            denom = cap * span
            _b, _h, _r, busy_int, held_int = self._dims[d]
            util[d] = busy_int / denom if denom > 0 else 0.0
            idle[d] = max(0.0, held_int - busy_int) / denom if denom > 0 else 0.0
        return util, idle

    def thinned_series(self) -> list[tuple[float, dict[str, float]]]:
        s = self.series
        if len(s) <= self._series_points:
            return list(s)
        step = math.ceil(len(s) / self._series_points)
        return s[::step]


def _summary(values: array) -> dict[str, float]:
    if not values:
        return {"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0}
    a = np.frombuffer(values, dtype=np.float64)
    p50, p99 = np.percentile(a, [50, 99])
    return {"count": len(a), "avg": float(a.mean()), "p50": float(p50), "p99": float(p99)}


class ActRecorder:
    """Collects the ACT of every delivered action, overall and per kind and per task."""

    _COUNTED = (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT)

    def __init__(self) -> None:
        self.all = array("d")
        self.queue = array("d")
        self.by_kind: dict[str, array] = {}
        self.by_task: dict[str, array] = {}
        self.by_status: dict[Status, int] = {}

    def record(self, result: ActionResult, kind: str, task: str) -> None:
        status = result.status
        self.by_status[status] = self.by_status.get(status, 0) + 1
        fin = result.finish_time
        if status not in self._COUNTED or fin is None:
            return
        act = fin - result.submit_time
        self.all.append(act)
        arr = self.by_kind.get(kind)
        if arr is None:
            arr = self.by_kind[kind] = array("d")
        arr.append(act)
        arr = self.by_task.get(task)
        if arr is None:
            arr = self.by_task[task] = array("d")
        arr.append(act)
        if result.start_time is not None:
            self.queue.append(result.start_time - result.submit_time)

    @property
    def delivered(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True, slots=True)
class SimReport:
    """The outcome of one simulation run. `as_dict` has stable keys (the --json contract)."""

    policy: str  # scheduling policy that ran
    workload: str  # workload name or trace path
    seed: int  # seed of the workload's random generator
    actions: int  # actions delivered (any terminal status)
    by_status: Mapping[str, int]  # delivered actions per terminal status
    act: Mapping[str, float]  # ACT over executed actions: count, avg, p50, p99 (seconds)
    act_by_kind: Mapping[str, Mapping[str, float]]  # the same per action kind
    act_by_task: Mapping[str, Mapping[str, float]]  # the same per task
    queue_avg_s: float  # mean time from submit to start
    step_s: tuple[float, ...]  # duration of each RL step (rollout + training phase)
    makespan_s: float  # virtual time from the first arrival to the end of the last step
    utilization: Mapping[str, float]  # busy fraction of capacity per dimension
    held_idle: Mapping[str, float]  # held-but-unused fraction of capacity per dimension
    capacity: Mapping[str, float]  # the cluster's total capacity per dimension
    cold_starts: int  # sandbox cold starts the executor paid
    warm_starts: int  # starts served from a warm pool
    stalled: bool  # the run stopped with work left that could not progress
    wall_s: float  # real seconds the simulation took
    events: int  # events the core handled
    act_samples: Any = field(default=None, repr=False, compare=False)  # numpy array, for plots
    series: Any = field(default=None, repr=False, compare=False)  # [(t, {dim: busy frac})]

    @property
    def step_avg_s(self) -> float:
        return sum(self.step_s) / len(self.step_s) if self.step_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "workload": self.workload,
            "seed": self.seed,
            "actions": self.actions,
            "by_status": dict(sorted(self.by_status.items())),
            "act": dict(self.act),
            "act_by_kind": {k: dict(v) for k, v in sorted(self.act_by_kind.items())},
            "act_by_task": {k: dict(v) for k, v in sorted(self.act_by_task.items())},
            "queue_avg_s": self.queue_avg_s,
            "step_s": list(self.step_s),
            "step_avg_s": self.step_avg_s,
            "makespan_s": self.makespan_s,
            "utilization": dict(self.utilization),
            "held_idle": dict(self.held_idle),
            "capacity": dict(self.capacity),
            "cold_starts": self.cold_starts,
            "warm_starts": self.warm_starts,
            "stalled": self.stalled,
            "wall_s": self.wall_s,
            "events": self.events,
        }


def build_report(*, policy: str, workload: str, seed: int, acts: ActRecorder, usage: UsageMeter,
                 steps: list[float], makespan: float, cold: int, warm: int, stalled: bool,
                 wall_s: float, events: int) -> SimReport:
    util, idle = usage.totals()
    q = np.frombuffer(acts.queue, dtype=np.float64) if acts.queue else np.zeros(0)
    return SimReport(
        policy=policy, workload=workload, seed=seed, actions=acts.delivered,
        by_status={s.name.lower(): n for s, n in acts.by_status.items()}, act=_summary(acts.all),
        act_by_kind={k: _summary(v) for k, v in acts.by_kind.items()},
        act_by_task={k: _summary(v) for k, v in acts.by_task.items()},
        queue_avg_s=float(q.mean()) if len(q) else 0.0, step_s=tuple(steps), makespan_s=makespan,
        utilization=util, held_idle=idle, capacity=dict(usage.capacity), cold_starts=cold,
        warm_starts=warm, stalled=stalled, wall_s=wall_s, events=events,
        act_samples=np.frombuffer(acts.all, dtype=np.float64).copy(),
        series=usage.thinned_series(),
    )
