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


# Kinds of a logged change: (busy sign, held sign) by kind, the low _KIND_BITS of an entry.
BUSY_ADD, BUSY_SUB, HELD_ADD, HELD_SUB, BOTH_ADD, BOTH_SUB, MARK = range(7)
_BS = np.array([1.0, -1.0, 0.0, 0.0, 1.0, -1.0, 0.0])
_HS = np.array([0.0, 0.0, 1.0, -1.0, 1.0, -1.0, 0.0])
_KIND_BITS = 3
_LOG_LIMIT = 1 << 16  # logged changes (and remembered vectors) before the log is replayed


class UsageMeter:
    """Integrates busy and held resource vectors over virtual time (piecewise constant).

    Each reported dimension keeps one list ``[busy, held, reserved, busy_int, held_int]``.
    Changes are logged (a time and an int: the code of the vector, `code`, and its kind) and
    replayed in bulk with numpy when anything is read, when the log is full, and before
    `restart`, `freeze` and `set_reserved`. The replay does, float for float, what applying
    each change at once does: at a change whose time is past the last accrual, integrate the
    segment that ends (``busy_int += busy * dt``, ``held_int += max(held, reserved) * dt``),
    then add the change. Sums run in log order (``np.add.accumulate`` is sequential), and a
    change that skips a dimension adds an exact zero to it. tests/sim/test_metrics.py holds
    the meter equal to that plain online form. The executor logs its three changes per
    action straight into the log (`recorder`); everything else goes through `change_at`.
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
        self._series: list[tuple[float, dict[str, float]]] = []  # (t, busy fraction per dim)
        self._series_points = series_points
        self._frozen = False
        self._lt = array("d")  # logged changes: time
        self._le = array("q")  # logged changes: code << _KIND_BITS | kind
        self._samples: list[tuple[float, int]] = []  # (t, changes logged before) not replayed
        self._amounts: list[tuple[float, ...]] = [(0.0,) * len(self._all)]  # code -> vector
        self._codes: dict[tuple[float, ...], int] = {self._amounts[0]: 0}  # vector -> code
        self._by_id: dict[int, int] = {}  # id(vector object) -> code, for objects in `_keep`
        self._keep: list[object] = []  # (holds them alive: their ids stay theirs)

    # ---- logging ---------------------------------------------------------------------------------
    def code(self, res: Mapping[str, float]) -> int:
        """The log code of a resource vector, shifted: ``code(r) | kind`` is a log entry."""
        c = self._by_id.get(id(res))
        if c is None:
            if len(self._keep) >= _LOG_LIMIT or len(self._lt) >= _LOG_LIMIT:
                self._replay()  # (forgets the remembered objects)
            d = res._d if type(res) is Resources else res
            vec = tuple(float(d.get(dim, 0.0)) for dim in self.capacity)
            c = self._codes.get(vec)
            if c is None:
                c = self._codes[vec] = len(self._amounts)
                self._amounts.append(vec)
            c <<= _KIND_BITS
            self._by_id[id(res)] = c
            self._keep.append(res)
        elif len(self._lt) >= _LOG_LIMIT:
            self._replay()
        return c

    def recorder(self) -> tuple[Callable[[float], None], Callable[[int], None]]:
        """``(log_time, log_entry)``: call both, in this order, to log a change at a time
        (``log_entry(code(vector) | kind)``). For a caller that logs a vector's changes
        often and calls `code` before each batch of them (it replays a full log)."""
        return self._lt.append, self._le.append

    def change(self, busy: Mapping[str, float] | None, held: Mapping[str, float] | None, sign: int) -> None:
        """Add (sign=+1) or remove (sign=-1) ``busy`` and ``held`` amounts from now on."""
        self.change_at(self._now(), busy, held, sign)

    def change_at(self, t: float, busy: Mapping[str, float] | None, held: Mapping[str, float] | None,
                  sign: int) -> None:
        """`change` for a caller that knows the time ``t`` is now."""
        if sign not in (1, -1):
            raise ValueError(f"sign must be +1 or -1, got {sign!r}")
        lt, le = self._lt.append, self._le.append
        if busy is held and busy is not None:  # one entry for both
            c = self.code(busy)
            lt(t)
            le(c | (BOTH_ADD if sign > 0 else BOTH_SUB))
            return
        if busy is None and held is None:
            lt(t)
            le(MARK)  # code 0: nothing changes, but time is accrued to t
            return
        if busy is not None:
            c = self.code(busy)
            lt(t)
            le(c | (BUSY_ADD if sign > 0 else BUSY_SUB))
        if held is not None:
            c = self.code(held)
            lt(t)
            le(c | (HELD_ADD if sign > 0 else HELD_SUB))

    def _replay(self) -> None:
        """Apply the logged changes and resolve the samples taken meanwhile; empty the log."""
        lt, le, samples = self._lt, self._le, self._samples
        self._by_id.clear()
        self._keep.clear()
        n = len(lt)
        if not n:
            if samples:
                self._resolve(samples, None)
            return
        times = np.array(lt, dtype=np.float64)
        entries = np.array(le, dtype=np.int64)
        del lt[:], le[:]
        kinds = entries & ((1 << _KIND_BITS) - 1)
        codes = entries >> _KIND_BITS
        bs, hs = _BS[kinds], _HS[kinds]
        amounts = np.array(self._amounts, dtype=np.float64).reshape(len(self._amounts), len(self._all))
        if not self._frozen:
            last = np.empty(n + 1)
            last[0] = self._last
            last[1:] = times
            last = np.maximum.accumulate(last)  # last[k]: the last accrual before change k
            dt = times - last[:-1]
            dt = np.where(dt > 0, dt, 0.0)  # a segment of no length adds an exact zero
            self._last = float(last[-1])
        busy_runs = []
        for j, v in enumerate(self._all):  # [busy, held, reserved, busy_int, held_int]
            col = amounts[:, j][codes]
            b = np.empty(n + 1)
            b[0] = v[0]
            np.multiply(bs, col, out=b[1:])
            b = np.add.accumulate(b)  # b[k]: busy before change k (sequential sums)
            h = np.empty(n + 1)
            h[0] = v[1]
            np.multiply(hs, col, out=h[1:])
            h = np.add.accumulate(h)
            if not self._frozen:
                acc = np.empty(n + 1)
                acc[0] = v[3]
                np.multiply(b[:-1], dt, out=acc[1:])
                v[3] = float(np.add.accumulate(acc)[-1])
                hb, r = h[:-1], v[2]
                acc[0] = v[4]
                np.multiply(np.where(hb > r, hb, r), dt, out=acc[1:])
                v[4] = float(np.add.accumulate(acc)[-1])
            v[0] = float(b[-1])
            v[1] = float(h[-1])
            busy_runs.append(b)
        if samples:
            self._resolve(samples, busy_runs)

    def _resolve(self, samples: list[tuple[float, int]], busy_runs: list[Any] | None) -> None:
        caps = tuple(self.capacity.items())
        for t, k in samples:
            if busy_runs is None:
                fr = {d: v[0] / c for (d, c), v in zip(caps, self._all, strict=True)}
            else:
                fr = {d: float(b[k]) / c for (d, c), b in zip(caps, busy_runs, strict=True)}
            self._series.append((t, fr))
        samples.clear()

    # ---- reading ---------------------------------------------------------------------------------
    def _column(self, i: int) -> dict[str, float]:
        self._replay()
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

    @property
    def series(self) -> list[tuple[float, dict[str, float]]]:
        """(t, busy fraction per dim) at each `sample`."""
        self._replay()
        return self._series

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
        else:
            self._replay()

    def _accrue_to(self, t: float) -> None:
        self._replay()
        dt = t - self._last
        if dt > 0:
            for v in self._all:  # [busy, held, reserved, busy_int, held_int]
                v[3] += v[0] * dt
                h = v[1]
                r = v[2]
                v[4] += (h if h > r else r) * dt
            self._last = t

    def set_reserved(self, reserved: Mapping[str, float]) -> None:
        """Resources a policy holds for owners that are not running anything (static slices)."""
        self._accrue()
        for d, v in self._dims.items():
            v[2] = float(reserved.get(d, 0.0))

    def sample(self) -> None:
        """Note the busy fraction per dimension now (resolved when the log is replayed)."""
        self._samples.append((self._now(), len(self._lt)))
        if len(self._lt) >= _LOG_LIMIT:
            self._replay()

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
    setup_s: float = 0.0  # model loads before the first step (not in any step or ACT)
    stall: Mapping[str, Any] | None = None  # what was left when a stalled run stopped
    # a lower bound on this run's avg ACT on its own release times (`sim.bounds.RunBound`):
    # count, act_avg, and its parts alone_act_avg (each action alone), srpt_act_avg and
    # batch_wait_avg (the least wait for a batch start), engine_act_avg (judge engines: (d))
    bound: Mapping[str, float] | None = None
    act_samples: Any = field(default=None, repr=False, compare=False)  # numpy array, for plots
    series: Any = field(default=None, repr=False, compare=False)  # [(t, {dim: busy frac})]

    @property
    def step_avg_s(self) -> float:
        """Mean duration of the completed RL steps (NaN when none completed)."""
        return sum(self.step_s) / len(self.step_s) if self.step_s else math.nan

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
            "step_avg_s": self.step_avg_s if self.step_s else None,
            "makespan_s": self.makespan_s,
            "utilization": dict(self.utilization),
            "held_idle": dict(self.held_idle),
            "capacity": dict(self.capacity),
            "cold_starts": self.cold_starts,
            "warm_starts": self.warm_starts,
            "stalled": self.stalled,
            "stall": dict(self.stall) if self.stall is not None else None,
            "bound": dict(self.bound) if self.bound is not None else None,
            "setup_s": self.setup_s,
            "wall_s": self.wall_s,
            "events": self.events,
        }


def build_report(*, policy: str, workload: str, seed: int, acts: ActRecorder, usage: UsageMeter,
                 steps: list[float], makespan: float, cold: int, warm: int, stalled: bool,
                 wall_s: float, events: int, setup_s: float = 0.0,
                 stall: Mapping[str, Any] | None = None,
                 bound: Mapping[str, float] | None = None) -> SimReport:
    util, idle = usage.totals()
    q = np.frombuffer(acts.queue, dtype=np.float64) if acts.queue else np.zeros(0)
    return SimReport(
        policy=policy, workload=workload, seed=seed, actions=acts.delivered,
        by_status={s.name.lower(): n for s, n in acts.by_status.items()}, act=_summary(acts.all),
        act_by_kind={k: _summary(v) for k, v in acts.by_kind.items()},
        act_by_task={k: _summary(v) for k, v in acts.by_task.items()},
        queue_avg_s=float(q.mean()) if len(q) else 0.0, step_s=tuple(steps), makespan_s=makespan,
        utilization=util, held_idle=idle, capacity=dict(usage.capacity), cold_starts=cold,
        warm_starts=warm, stalled=stalled, wall_s=wall_s, events=events, setup_s=setup_s,
        stall=stall, bound=bound, act_samples=np.frombuffer(acts.all, dtype=np.float64).copy(),
        series=usage.thinned_series(),
    )
