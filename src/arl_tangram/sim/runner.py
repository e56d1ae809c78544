"""Runs a workload under one policy, under all of them (compare), and finds resource savings.

Invariant: every policy of a comparison sees the same trajectories (same workload, same seed,
regenerated for each run) on the same cluster, and gets the strongest honest configuration: a
slice per concurrent trajectory that has CPU work for trajectory-bound, pools in proportion to
each task's measured peak demand for task-isolated, and static-pool at every fixed allotment of
`STATIC_KS` (the best is "best static"). `savings` only ever shrinks the cluster `tangram` runs
on; the baseline keeps the full cluster.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.cluster import ClusterSpec
from ..core.resources import CPU
from .metrics import SimReport
from .simulator import Scheduler, SimConfig, Simulator, gc_tuned
from .trace import Trajectory

Batches = Callable[[], Iterable[Sequence[Trajectory]]]  # a fresh, identical replay each call
BASELINES = ("trajectory-bound", "task-isolated", "fifo", "static-pool")
# The fixed allotments `--compare` tries for static-pool; None: each action's maximum.
STATIC_KS: tuple[float | None, ...] = (1, 2, 4, 8, None)


def static_label(k: float | None) -> str:
    return "static-pool:max" if k is None else f"static-pool:{k:g}"


def policies() -> tuple[str, ...]:
    """Every run of a comparison: each policy, and static-pool at each fixed allotment."""
    from ..core.config import POLICIES

    return tuple(p for p in POLICIES if p != "static-pool") + tuple(static_label(k) for k in STATIC_KS)


def parse_policy(label: str) -> tuple[str, dict[str, Any]]:
    """A run's label -> (core policy, CoreConfig overrides): ``static-pool:4`` is static-pool
    with ``static_k=4``, ``static-pool:max`` (or plain ``static-pool``) at each maximum."""
    from ..core.config import POLICIES

    name, _, arg = label.partition(":")
    if name not in POLICIES or (arg and name != "static-pool"):
        raise KeyError(f"unknown policy {label!r}; known: {', '.join(policies())}")
    if name != "static-pool":
        return name, {}
    if arg in ("", "max"):
        return name, {"static_k": None}
    try:
        k = float(arg)
    except ValueError:
        raise KeyError(f"policy {label!r}: the fixed allotment must be a number or 'max'") from None
    if not k > 0:
        raise KeyError(f"policy {label!r}: the fixed allotment must be > 0")
    return name, {"static_k": k}


def best_static(reports: Mapping[str, SimReport]) -> str | None:
    """The static-pool run with the lowest average ACT (an unstalled one), if any ran."""
    runs = [(r.act["avg"], k) for k, r in reports.items()
            if k.startswith("static-pool") and not r.stalled]
    return min(runs)[1] if runs else None


def uses_cpu(traj: Trajectory) -> bool:
    """Whether a trajectory runs anything on CPU (a static policy gives it a sandbox)."""
    return any(act.model is None for _gen, act in traj.steps)


def measured_task_shares(batch: Sequence[Trajectory], cluster: ClusterSpec) -> dict[str, float]:
    """Each task's peak concurrent CPU demand in ``batch``: the sandboxes it would need never
    to queue, what an operator sizing a pool per task measures.

    Each trajectory is replayed closed-loop with no queueing and no cold start, every action at
    its minimum allotment (a static pool's), and the task's CPU demand of the actions running
    at once is taken at its peak. Tasks with no CPU action get no share (no CPU pool).
    """
    events: dict[str, list[tuple[float, float]]] = {}
    for traj in batch:
        t = traj.start
        for gen, act in traj.steps:
            t += gen
            if act.model is not None:
                continue
            cpu = act.demand.get(CPU)
            speed = 1.0
            el = act.elasticity
            if el is not None:
                speed = el.speedup.factor(el.min) if el.min > 0 else 1.0
            d = act.work_s / speed if speed > 0 else act.work_s
            if cpu > 0:
                ev = events.setdefault(traj.task, [])
                ev.append((t, cpu))
                ev.append((t + d, -cpu))
            t += d
    out: dict[str, float] = {}
    for task, ev in events.items():
        ev.sort()
        level = peak = 0.0
        for _t, c in ev:
            level += c
            peak = max(peak, level)
        if peak > 0:
            out[task] = peak
    return out or {t.task: 1.0 for t in batch}


def _reads_shares(policy: str) -> bool:
    """Whether the policy's core cuts CPU by task (`CoreConfig.task_shares`): task-isolated."""
    from ..core.policies import POLICY_TABLE

    return POLICY_TABLE[parse_policy(policy)[0]].partitioned == "task"


def _reserved(policy: str, cluster: ClusterSpec, n: int, shares: Mapping[str, float],
              ) -> Callable[[Iterable[Trajectory]], Mapping[str, float]] | None:
    """What a static policy holds for live owners, whether they run something or not (CPU):
    a slice per live trajectory that has CPU work, a pool per task that has a live one."""
    cpu = cluster.total_capacity().get(CPU)
    if policy == "trajectory-bound":
        return lambda live: {CPU: cpu * min(1.0, sum(1 for t in live if uses_cpu(t)) / n)}
    if policy == "task-isolated":
        total = sum(shares.values()) or 1.0
        return lambda live: {CPU: cpu * sum(shares.get(t, 0.0) for t in {x.task for x in live}) / total}
    return None


def warm_keys(batch: Sequence[Trajectory]) -> tuple[str, ...]:
    """The warm-pool keys of ``batch``'s one-shot CPU actions (their language or tool): what
    an operator configures a sandbox service with, as a static stack builds its images."""
    keys = {a.tag or a.kind.value for t in batch for _g, a in t.steps
            if a.model is None and a.session is None}
    return tuple(sorted(keys))


def warm_boot(batch: Sequence[Trajectory]) -> dict[str, int]:
    """Per warm key of ``batch``, the trajectories with a one-shot action of that key: the
    sandboxes a static stack provisions before step 1 (one per trajectory), which tangram and
    fifo fill at their first event too (`CoreConfig.warm_boot`)."""
    out: dict[str, int] = {}
    for t in batch:
        for k in {a.tag or a.kind.value for _g, a in t.steps if a.model is None and a.session is None}:
            out[k] = out.get(k, 0) + 1
    return out


def make_core(cluster: ClusterSpec, policy: str, trajectories: int,
              shares: Mapping[str, float] | None, **overrides: Any) -> Scheduler:
    """The core for a run labelled ``policy`` (see `parse_policy`): ``trajectories`` is the
    number of concurrent trajectories with CPU work (trajectory-bound's slices), ``shares``
    each task's measured demand (task-isolated's pools); ``overrides`` are CoreConfig fields
    (`run_policy` passes ``warm_keys``)."""
    from ..core.config import CoreConfig
    from ..core.core import Core

    name, fixed = parse_policy(policy)
    cfg = CoreConfig(policy=name, trajectories=max(1, trajectories),
                     task_shares=dict(shares) if shares else None, **{**fixed, **overrides})
    return Core(cluster, cfg)


def run_policy(cluster: ClusterSpec, batches: Batches, policy: str, *, seed: int = 0,
               workload: str = "?", config: SimConfig | None = None,
               shares_from: Sequence[Trajectory] | None = None,
               core_factory: Callable[..., Scheduler] | None = None) -> SimReport:
    """Simulate ``batches`` on ``cluster`` under ``policy`` (a label of `policies()`).
    ``core_factory`` is called as `make_core` is: ``(cluster, policy, n, shares, warm_keys=)``."""
    parse_policy(policy)  # a bad label fails before anything runs
    with gc_tuned((config or SimConfig()).gc_tuning):  # (sampling the first batch too)
        source: Iterable[Sequence[Trajectory]]
        if shares_from is not None:
            first = list(shares_from)
            source = batches()
        else:  # the first batch, sampled once: measured, then run (not sampled again for the run)
            it = iter(batches())
            head = next(it, None)
            first = list(head) if head is not None else []
            source = it if head is None else itertools.chain((first,), it)
        n = max(1, sum(1 for t in first if uses_cpu(t)))
        # each task's measured demand: what task-isolated's pools are cut by (only it reads them)
        shares = measured_task_shares(first, cluster) if first and _reads_shares(policy) else {}
        core = (core_factory or make_core)(cluster, policy, n, shares, warm_keys=warm_keys(first),
                                           warm_boot=warm_boot(first))
        sim = Simulator(cluster, core, config, policy=policy, workload=workload, seed=seed,
                        reserved=_reserved(parse_policy(policy)[0], cluster, n, shares))
        return sim.run(source)


def compare(cluster: ClusterSpec, batches: Batches, *, seed: int = 0, workload: str = "?",
            config: SimConfig | None = None, names: Sequence[str] | None = None,
            on_report: Callable[[SimReport], None] | None = None) -> dict[str, SimReport]:
    """Every policy on the same trajectories; reports keyed by policy name."""
    first = list(next(iter(batches()), []))
    out: dict[str, SimReport] = {}
    for p in names or policies():
        out[p] = run_policy(cluster, batches, p, seed=seed, workload=workload, config=config,
                            shares_from=first)
        if on_report is not None:
            on_report(out[p])
    return out


def ratios(reports: Mapping[str, SimReport], ours: str = "tangram") -> dict[str, dict[str, float]]:
    """baseline / ours for avg, p50, p99 ACT and step duration (> 1: ours is better)."""
    mine = reports[ours]
    out: dict[str, dict[str, float]] = {}
    for name, r in reports.items():
        if name == ours:
            continue
        out[name] = {
            "act_avg": _ratio(r.act["avg"], mine.act["avg"]),
            "act_p50": _ratio(r.act["p50"], mine.act["p50"]),
            "act_p99": _ratio(r.act["p99"], mine.act["p99"]),
            "step": _ratio(r.step_avg_s, mine.step_avg_s),
        }
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf") if a > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Savings:
    """Smallest scale of the cluster on which ``ours`` matches a baseline on the full cluster."""

    baseline: str  # the baseline policy, on the full cluster
    scale: float | None  # kept fraction of the cluster's nodes; None: not matched at full size
    nodes: Mapping[str, tuple[int, int]]  # pool -> (nodes kept, nodes in full cluster)
    saving: Mapping[str, float]  # dimension -> fraction of capacity saved (cpu, gpu, ...)
    target: Mapping[str, float]  # the baseline's avg ACT and step duration on the full cluster
    achieved: Mapping[str, float]  # ours' avg ACT and step duration on the chosen cluster
    tried: tuple[tuple[float, float, float], ...]  # (scale, ours' avg ACT, ours' step) per run

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "scale": self.scale,
                "nodes": {k: list(v) for k, v in self.nodes.items()},
                "saving": dict(self.saving), "target": dict(self.target),
                "achieved": dict(self.achieved), "tried": [list(t) for t in self.tried]}


def _pool_counts(cluster: ClusterSpec) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in cluster.nodes:
        out[n.pool] = out.get(n.pool, 0) + 1
    return out


def savings(cluster: ClusterSpec, batches: Batches, baseline: SimReport, *, ours: str = "tangram",
            seed: int = 0, workload: str = "?", config: SimConfig | None = None,
            iterations: int = 7) -> Savings:
    """Binary search on the scale: the smallest cluster where ours <= the baseline's ACT and step."""
    first = list(next(iter(batches()), []))
    target = {"act_avg": baseline.act["avg"], "step_avg_s": baseline.step_avg_s}
    tried: list[tuple[float, float, float]] = []
    cache: dict[tuple[int, ...], SimReport] = {}

    def attempt(scale: float) -> tuple[bool, ClusterSpec, SimReport]:
        small = cluster.scaled(scale)
        key = tuple(sorted(_pool_counts(small).values()))
        rep = cache.get(key)
        if rep is None:
            rep = run_policy(small, batches, ours, seed=seed, workload=workload, config=config,
                             shares_from=first)
            cache[key] = rep
            tried.append((scale, rep.act["avg"], rep.step_avg_s))
        ok = (not rep.stalled and rep.act["avg"] <= target["act_avg"] * (1 + 1e-9)
              and rep.step_avg_s <= target["step_avg_s"] * (1 + 1e-9))
        return ok, small, rep

    lo, hi = 0.0, 1.0
    ok, best_cluster, best = attempt(1.0)
    best_scale: float | None = 1.0 if ok else None
    if ok:
        for _ in range(iterations):
            mid = (lo + hi) / 2
            ok_mid, c_mid, r_mid = attempt(mid)
            if ok_mid:
                hi, best_scale, best_cluster, best = mid, mid, c_mid, r_mid
            else:
                lo = mid
    full, kept = _pool_counts(cluster), _pool_counts(best_cluster)
    cap_full, cap_kept = cluster.total_capacity(), best_cluster.total_capacity()
    saving = {d: 1.0 - cap_kept.get(d) / cap_full.get(d) for d in ("cpu", "gpu") if cap_full.get(d) > 0}
    eff = len(best_cluster.nodes) / len(cluster.nodes) if best_scale is not None else None
    return Savings(baseline.policy, eff, {p: (kept.get(p, 0), full[p]) for p in full},
                   saving if best_scale is not None else dict.fromkeys(saving, 0.0), target,
                   {"act_avg": best.act["avg"], "step_avg_s": best.step_avg_s}, tuple(tried))
