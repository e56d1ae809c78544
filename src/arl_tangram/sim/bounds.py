"""The optimum every comparison is shown against: lower bounds on the average ACT.

Bounds, each valid on its own, and the largest of them is shown:

(a) Each action alone (`action_bound`): what no scheduler on the same cluster could beat for
    that action -- no queueing, no cold start, no model load, its best allotment:
    - a CPU action: its work at the speed of its largest useful allotment (its elastic maximum,
      capped by the largest node's capacity in that dimension); a rigid action: its work;
    - a reward or judge action: a batch of one on a resident, idle instance (``alpha + work``);
    - any action: at most its timeout (a run ends it there).
    Computed from the trajectories alone (`bound`), it says nothing about contention.

(b) Contention (`ReleaseLog`): a pool of C cores is one machine of speed C. Every action needs
    at least its least core-seconds there, whatever allotment a scheduler gives it (`cpu_charge`:
    an elastic action's ``work_s`` -- Speedup.factor is linear up to one unit and Amdahl past it,
    so k / factor(k) is 1 up to one unit and grows past it; a rigid action of demand d cores,
    ``d x work_s``), and preemptive shortest-remaining-processing-time on that one machine
    minimises the sum of completion times for given release times (Schrage 1968), fractional
    sharing included; so its sum of flow times lower-bounds any schedule's sum of ACT on the
    same releases. The GPU side likewise: an instance of a model on ``devices`` GPUs serves a
    batch of at most ``max_batch`` items in ``alpha + sum(work)``, so each item costs at least
    ``devices x (alpha / max_batch + work)`` GPU-seconds of the pool's GPUs (`gpu_charge`).

(c) Batch starts (`batch_wait_sum`): a reward or judge action also waits for a batch to
    start. A batch of a model on ``devices`` GPUs takes at least ``alpha``, so all the batches of
    that model started within any window of length ``alpha`` are running together at its end:
    at most ``m`` of them, ``m`` the instances of the model the GPU nodes can hold at once
    (``sum over nodes of floor(gpus / devices)``, at most ``max_instances``; other models'
    instances left out, which only loosens it). Cut time into windows of length ``alpha`` (any
    phase); in each, at most ``m`` batch starts serve the actions released there, and an action
    not served in its window waits at least until the window's end. The least total wait of
    such a choice is a small dynamic program (starts at release times); each phase gives a valid bound, and the largest of a few phases is taken. An
    action's completion is then at least its wait plus ``alpha + work``, plus the work of the
    others in its batch (a batch of n takes ``alpha`` plus all n works, for each of its n): a
    start that serves n of a window's actions costs them at least ``(n - 1)`` times the sum of
    the window's n smallest works, which depends only on n, so the program stays exact (two
    actions swapped between starts change no wait). Where arrivals are
    sparse this is (a); where they crowd an instance's ``alpha`` it adds the wait no scheduler
    avoids with static batches (continuous batching, which a batch of the simulator does not
    model, would avoid it).

(d) Judge engines (`sim.engine_bound`, ``max_seqs > 0``): an engine's sequences share their
    instance, so work per second needs sequences in flight, and every one in flight is an
    action present; a dynamic program over the run's busy periods finds the least integral of
    the actions present that the releases, the instances' most work per second at each number
    in flight, and each action's time alone allow. For the GPU pool it replaces the engines'
    actions' part of (a) (it is never below it).

The simulator and the replay are closed loop: an action is submitted a generation time after
its predecessor finished, so release times depend on the schedule, and a relaxation on the
releases of an idealised run (every action at its bound) is NOT a lower bound -- a scheduler
could delay a trajectory and so lower the contention its others meet. The sound form, used
here, takes a run's own release (submit) times: (b) on them lower-bounds THAT run's sum of
ACT. A run's bound (`RunBound`) is, per pool, the larger of (a) and (b) over that run's counted
actions, summed over the pools, plus for each action that timed out its timeout (a run that
ends an action at its timeout ran it that long; its work is out of the relaxation) and nothing
for an action that failed without running its work. Two facts of the run enter besides the
releases: which actions timed out or failed, and the CPU allotment of a rigid action started on
less CPU than it demands (the simulator lets such an action run its first CFS periods' quota at
full speed, `sim.executor.cfs_speed`, so it may cost less than ``d x work_s`` of its slice).

The step's bound replays each trajectory closed-loop with every action at its bound (a) (its
generation times unchanged): the longest trajectory, plus the training phase.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.actions import Status
from ..core.cluster import ClusterSpec
from ..core.resources import CPU, GPU
from .engine_bound import Job, engine_flow_bound
from .executor import cfs_speed
from .trace import SimAction, Trajectory


def least_prefill(act: SimAction, cluster: ClusterSpec, prefix: int | None) -> float:
    """Seconds of prefill no instance saves a judge engine's action (``prefill_s > 0``): its
    prompt tokens beyond ``prefix``, the prompt of its trajectory's previous request to the same
    model (the longest prefix any cache can hold for it: trajectories share none); None: 0."""
    model = cluster.model(act.model) if act.model is not None else None
    tokens = act.hints.prompt_tokens
    if model is None or prefix is None or not tokens or model.prefill_s <= 0.0:
        return 0.0
    return model.prefill_s * max(0, tokens - prefix)


def action_bound(act: SimAction, cluster: ClusterSpec, largest: Mapping[str, float],
                 prefix: int | None = None) -> float:
    """Lower bound of one action's completion time (seconds): never past its timeout, where
    every scheduler ends it. ``prefix``: see `least_prefill`."""
    if act.model is not None:
        model = cluster.model(act.model)
        # a judge engine (max_seqs > 0, sim/engine_model.py): alone, its work and no batch cost,
        # plus the prefill of what no cache holds
        b = (model.alpha if model is not None and model.max_seqs <= 0 else 0.0) + act.work_s
        b += least_prefill(act, cluster, prefix)
    else:
        el = act.elasticity
        if el is None:
            b = act.work_s
        else:  # (a fixed width, min == max, runs at its width's speed too)
            k = min(el.max, largest.get(el.dim, el.max))
            b = act.work_s / el.speedup.factor(max(k, el.min))
    t = act.timeout_s
    return t if 0.0 < t < b else b


def cpu_charge(act: SimAction, allotment: Mapping[str, float] | None = None) -> float:
    """The least core-seconds any run of ``act`` to its end takes of the CPU pool.

    - elastic along ``cpu`` (any width, ``min == max`` too): ``work_s`` -- the work is given at
      one core, and k / factor(k) is 1 at and below one core (a fractional slice runs
      proportionally slower) and grows past it (Amdahl), so no allotment does it for less (the
      static baselines' slices can start an action below its minimum, so the minimum does not
      raise this);
    - elastic along another dimension: 0 (its CPU allotment does not set its speed);
    - rigid, demand ``d`` cores: ``d x work_s``; where the run's ``allotment`` gave it a
      fraction ``v`` of ``d``, what its slice held for as long as the simulator runs it there
      (its first CFS periods at full speed, `cfs_speed`): ``d v work_s / cfs_speed(work_s, v)``.
    """
    el = act.elasticity
    if el is not None:
        return act.work_s if el.dim == CPU else 0.0
    need = act.demand.get(CPU)
    if need <= 0.0:
        return 0.0
    got = allotment.get(CPU, need) if allotment is not None else need
    if got >= need:
        return need * act.work_s
    v = got / need
    return got * act.work_s / cfs_speed(act.work_s, v) if v > 0.0 else 0.0


def gpu_charge(act: SimAction, cluster: ClusterSpec, prefix: int | None = None) -> float:
    """The least GPU-seconds a reward or judge action takes of the GPU pool: an instance on
    ``devices`` GPUs runs a batch of at most ``max_batch`` items in ``alpha + sum(work)``, so
    the batch's GPU-seconds cover ``devices x (alpha / max_batch + work)`` for each item."""
    model = cluster.model(act.model) if act.model is not None else None
    if model is None:
        return 0.0
    if model.max_seqs > 0:  # a judge engine: at most K = max_seqs sequences share an instance,
        # each at (alpha + beta) / (alpha + beta K) of its speed alone (sim/engine_model.py),
        # so an item's work costs at least work x (alpha + beta K) / (K (alpha + beta)); its
        # prefill holds the whole instance (`least_prefill`)
        k, a, b = model.max_seqs, model.alpha, model.beta
        share = (a + b * k) / (k * (a + b)) if a + b > 0 else 1.0 / k
        return model.devices * (act.work_s * share + least_prefill(act, cluster, prefix))
    return model.devices * (model.alpha / model.max_batch + act.work_s)


def srpt_flow_sum(jobs: Sequence[tuple[float, float]]) -> float:
    """Sum of flow times (completion - release) of preemptive shortest-remaining-processing-
    time on one machine of unit speed; ``jobs`` are (release, processing time) pairs in any
    order. A heap of remaining times: each release preempts at most once, O(n log n)."""
    order = sorted(jobs)
    heap: list[tuple[float, int, float]] = []  # (remaining, index, release)
    n, i, t, total = len(order), 0, 0.0, 0.0
    while i < n or heap:
        if not heap and order[i][0] > t:
            t = order[i][0]
        while i < n and order[i][0] <= t:
            r, p = order[i]
            heapq.heappush(heap, (p, i, r))
            i += 1
        rem, k, r = heap[0]
        nxt = order[i][0] if i < n else math.inf
        if t + rem <= nxt:
            heapq.heappop(heap)
            t += rem
            total += t - r
        else:  # runs until the next release, which may preempt it
            heapq.heapreplace(heap, (rem - (nxt - t), k, r))
            t = nxt
    return total


def _window_wait(rel: np.ndarray, end: float, m: int, works: np.ndarray | None = None) -> float:
    """Least total wait of the sorted releases ``rel`` (all before ``end``) for at most ``m``
    batch starts placed in the window, each action served by the first start at or after its
    release, and those after the last start waiting until ``end``. With ``works`` (the
    window's actions' works, any order), a start serving n of them also costs ``(n - 1)``
    times the sum of the n smallest (each waits for the others' work in its batch).

    Starts can be taken at release times (moving a start back to the latest release it serves
    shortens every wait). ``f[c][j]``: the least wait of actions ``0..j`` with the ``c``-th start
    at ``rel[j]``; a start at ``rel[j]`` after one at ``rel[i]`` costs the actions ``i+1..j``
    ``sum(rel[j] - rel[l])``. O(m n^2) in numpy rows."""
    n = len(rel)
    if n == 0:
        return 0.0
    pre = np.concatenate(([0.0], np.cumsum(rel)))  # pre[k] = sum of rel[:k]
    idx = np.arange(n)
    # together[k]: what k actions served by one start cost each other (0 without works)
    together = np.zeros(n + 1)
    if works is not None:
        together[1:] = np.arange(n) * np.cumsum(np.sort(works))
    # tail[j]: what the actions after a last start at rel[j] wait, until the window's end
    tail = (n - 1 - idx) * end - (pre[n] - pre[idx + 1])
    best = float(n * end - pre[n])  # no start at all
    f = idx * rel - pre[idx] + together[idx + 1]  # one start, at rel[j], serving actions 0..j
    best = min(best, float(np.min(f + tail)))
    for _ in range(1, min(m, n)):
        g = np.full(n, np.inf)
        for j in range(1, n):
            i = idx[:j]
            g[j] = np.min(f[:j] + (j - i) * rel[j] - (pre[j + 1] - pre[i + 1]) + together[j - i])
        f = g
        best = min(best, float(np.min(f + tail)))
    return best


def batch_wait_sum(releases: Sequence[float], alpha: float, m: int, phases: int = 8,
                   works: Sequence[float] | None = None) -> float:
    """A lower bound on the total time the actions released at ``releases`` wait for their
    batch to start, on at most ``m`` concurrent instances whose batches take ``alpha`` or
    more (bound (c) of the module doc): the largest over ``phases`` window grids. With
    ``works`` (each action's, in the order of ``releases``), the wait for the others' work in
    one's batch counts too."""
    if alpha <= 0.0 or m <= 0 or not releases:
        return 0.0
    order = np.argsort(np.asarray(releases, dtype=float), kind="stable")
    rel = np.asarray(releases, dtype=float)[order]
    wk = np.asarray(works, dtype=float)[order] if works is not None else None
    top = 0.0
    for p in range(phases):
        origin = rel[0] - alpha * p / phases
        cut = np.floor((rel - origin) / alpha)
        total = 0.0
        for k in np.unique(cut):
            sel = cut == k
            total += _window_wait(rel[sel], origin + (k + 1) * alpha, m,
                                  wk[sel] if wk is not None else None)
        top = max(top, total)
    return top


def model_slots(cluster: ClusterSpec) -> dict[str, int]:
    """Per model, the most instances the cluster's GPU nodes can hold at once (its
    ``max_instances`` at most), whatever else runs there."""
    out: dict[str, int] = {}
    for m in cluster.models:
        fit = sum(int(n.capacity.get(GPU) // m.devices) for n in cluster.nodes)
        out[m.name] = min(fit, m.max_instances)
    return out


@dataclass(frozen=True, slots=True)
class RunBound:
    """A lower bound on one run's average ACT, on that run's own release times (module doc)."""

    count: int  # counted actions of the run (succeeded, failed, timed out): the ACT's count
    alone_s: float  # sum of (a): each action alone (timed out: its timeout; failed unrun: 0)
    srpt_s: float  # sum of (b): SRPT per pool on the run's releases (timed out: its timeout)
    bound_s: float  # per pool the larger of the bounds, summed over the pools: the bound
    wait_s: float = 0.0  # (c)'s least waits for a batch start, over the model actions
    engine_s: float = 0.0  # (d): the judge engines' actions' sum (`sim.engine_bound`)

    def _avg(self, s: float) -> float:
        return s / self.count if self.count else 0.0

    @property
    def act_avg(self) -> float:
        return self._avg(self.bound_s)

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "act_avg": self.act_avg, "alone_act_avg": self._avg(self.alone_s),
                "srpt_act_avg": self._avg(self.srpt_s), "batch_wait_avg": self._avg(self.wait_s),
                "engine_act_avg": self._avg(self.engine_s)}


_COUNTED = (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT)


class ReleaseLog:
    """What a run's bound needs of each counted action, recorded as the run delivers it: its
    release, its bound alone and its charge on its pool (CPU or GPU)."""

    __slots__ = ("_cluster", "_count", "_cpu", "_engine", "_engine_a", "_fixed", "_gpu", "_largest",
                 "_pools", "_released", "_works")

    def __init__(self, cluster: ClusterSpec) -> None:
        self._cluster = cluster
        cap = cluster.total_capacity()
        self._pools = (cap.get(CPU), cap.get(GPU))  # one machine of speed C per pool
        self._largest = largest_node(cluster)
        self._cpu: list[tuple[float, float, float]] = []  # (release, charge, alone)
        self._gpu: list[tuple[float, float, float]] = []
        self._released: dict[str, list[float]] = {}  # model -> releases of its actions
        self._works: dict[str, list[float]] = {}  # model -> their works (same order)
        self._engine: dict[str, list[Job]] = {}  # judge engine -> (release, finish, work), (d)
        self._engine_a = 0.0  # (a) of those actions
        self._fixed = 0.0  # timeouts of the actions that timed out
        self._count = 0

    def record(self, act: SimAction, status: Status, submit: float, finish: float | None,
               allotment: Mapping[str, float] | None = None, *, ran: bool = True,
               prefix: int | None = None) -> None:
        """One delivered action (ignored unless counted in ACT, as `ActRecorder` counts).
        ``ran``: a failed action did its work (the simulator: its truth ``fails``); one that
        failed before it ran (an instance unloaded, a sandbox error) counts nothing.
        ``prefix``: its trajectory's previous prompt to the model (`least_prefill`)."""
        if status not in _COUNTED or finish is None:
            return
        self._count += 1
        if status is Status.TIMED_OUT:
            self._fixed += act.timeout_s
            return
        if status is Status.FAILED and not ran:
            return
        alone = action_bound(act, self._cluster, self._largest, prefix)
        if act.model is not None:
            self._gpu.append((submit, gpu_charge(act, self._cluster, prefix), alone))
            self._released.setdefault(act.model, []).append(submit)
            self._works.setdefault(act.model, []).append(act.work_s)
            model = self._cluster.model(act.model)
            if model is not None and model.max_seqs > 0:
                self._engine.setdefault(act.model, []).append((submit, finish, act.work_s))
                self._engine_a += alone
        else:
            self._cpu.append((submit, cpu_charge(act, allotment), alone))

    def bound(self) -> RunBound:
        alone = srpt = best = self._fixed
        slots = model_slots(self._cluster)
        wait = engine = 0.0
        for name, jobs in self._engine.items():
            model = self._cluster.model(name)
            assert model is not None
            engine += engine_flow_bound(jobs, model, slots.get(name, 0))
        for name, rel in self._released.items():
            model = self._cluster.model(name)
            if model is not None and model.max_seqs <= 0:  # (an engine's actions join at once)
                wait += batch_wait_sum(rel, model.alpha, slots.get(name, 0),
                                       works=self._works[name])
        for jobs, speed, w, d in zip((self._cpu, self._gpu), self._pools, (0.0, wait),
                                     (0.0, engine), strict=True):
            a = sum(j[2] for j in jobs)
            b = srpt_flow_sum([(r, c / speed) for r, c, _ in jobs]) if speed > 0 and jobs else 0.0
            e = a - self._engine_a + d if d > 0.0 else 0.0  # (d) in place of the engines' (a)
            alone, srpt, best = alone + a, srpt + b, best + max(a + w, b, e)
        return RunBound(self._count, alone, srpt, best, wait, engine)


def previous_prompt(steps: Sequence[tuple[float, SimAction]], i: int) -> int:
    """The prompt tokens of the last request before step ``i`` of a trajectory to the same
    model as step ``i``'s (0: none)."""
    model = steps[i][1].model
    for j in range(i - 1, -1, -1):
        act = steps[j][1]
        if act.model == model and act.hints.prompt_tokens:
            return act.hints.prompt_tokens
    return 0


def largest_node(cluster: ClusterSpec) -> dict[str, float]:
    """Per dimension, the largest capacity of one node (an elastic action's useful maximum)."""
    largest: dict[str, float] = {}
    for n in cluster.nodes:
        for k, v in n.capacity.items():
            largest[k] = max(largest.get(k, 0.0), v)
    return largest


@dataclass(frozen=True, slots=True)
class Bound:
    """The optimum of a run: ACT statistics of the per-action bounds and the step bound."""

    act: Mapping[str, float]  # count, avg, p50, p99 of the per-action bounds (a) (seconds)
    step_s: tuple[float, ...]  # per RL step: the longest trajectory at its bounds + training

    @property
    def step_avg_s(self) -> float:
        return sum(self.step_s) / len(self.step_s) if self.step_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"act": dict(self.act), "step_s": list(self.step_s), "step_avg_s": self.step_avg_s}


def table_bound(opt: Bound, runs: Mapping[str, Any]) -> tuple[float, str | None]:
    """The bound of a table of runs: the lowest of their own bounds (each run's ``bound``,
    a `RunBound.as_dict`; stalled runs and runs without one left out), so that no run in the
    table has an average ACT below it; with none, each action alone. (value, whose run)."""
    found = [(r.bound["act_avg"], name) for name, r in runs.items()
             if getattr(r, "bound", None) and not getattr(r, "stalled", False)]
    if not found:
        return float(opt.act["avg"]), None
    v, name = min(found)
    return float(v), name


def bound(batches: Iterable[Sequence[Trajectory]], cluster: ClusterSpec, train_s: float) -> Bound:
    """The optimum (a) of replaying ``batches`` (one per RL step) on ``cluster``."""
    largest = largest_node(cluster)
    acts: list[float] = []
    steps: list[float] = []
    for batch in batches:
        longest = 0.0
        for traj in batch:
            t = traj.start
            for i, (gen, act) in enumerate(traj.steps):
                b = action_bound(act, cluster, largest, previous_prompt(traj.steps, i))
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
