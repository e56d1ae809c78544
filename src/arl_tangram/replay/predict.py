"""The simulator's prediction of a replay, from the calibrated spec, and how far off it was.

Invariant: the simulator runs the same trace, under the same policy label, on the same cluster
spec, with the core built by the same `sim.runner.make_core`. The only changes to the trace are
the measured costs of this machine, put where the simulator reads its truth (its inputs, never a
fudge factor on its outputs):
- each action's ``cold_start_s`` := the measured sandbox cold start, each session's
  ``cold_start_s`` := the measured session open (the trace's figures describe other machines);
- (the engine's measured cost per action and the machine's parallel speedup are node fields of
  the spec, ``dispatch_s`` and ``parallel_speedup``, which the virtual executor applies itself;
  a spec written before they existed, with ``calibration.dispatch_s``, gets it as the node's);
- each model action's ``work_s`` := its model's measured ``beta`` (a real model scores the
  replay's texts in the time it takes, not in the trace's figure; alpha is in the spec); on a
  judge engine (``max_seqs > 0``) its generated tokens (``hints.tokens``, what the replay asks
  the engine for) x the measured decode step alone, ``alpha + beta`` (`sim.engine_model`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.cluster import ClusterSpec
from ..sim.trace import SimAction, Trajectory


def measured_trace(steps: Sequence[Sequence[Trajectory]], cluster: ClusterSpec,
                   cal: Mapping[str, Any]) -> list[list[Trajectory]]:
    """``steps`` with this machine's measured costs in place of the trace's (see module doc)."""
    cold = cal.get("cold_start_s")
    sess_cold = cal.get("session_open_s")
    betas = {m.name: m.beta for m in cluster.models}
    steps_alone = {m.name: m.alpha + m.beta for m in cluster.models if m.max_seqs > 0}

    def action(a: SimAction) -> SimAction:
        kw: dict[str, Any] = {}
        if cold is not None:
            kw["cold_start_s"] = float(cold)
        if a.kind.uses_model and a.model in steps_alone and a.hints.tokens:
            kw["work_s"] = a.hints.tokens * steps_alone[a.model]
        elif a.kind.uses_model and a.model in betas:
            kw["work_s"] = betas[a.model]
        return dataclasses.replace(a, **kw)

    out = []
    for batch in steps:
        nb = []
        for t in batch:
            sessions = {n: s if sess_cold is None else
                        dataclasses.replace(s, cold_start_s=float(sess_cold))
                        for n, s in t.sessions.items()}  # (its demand, TTL and image kept)
            st = tuple((g, action(a)) for g, a in t.steps)
            nb.append(dataclasses.replace(t, steps=st, sessions=sessions))
        out.append(nb)
    return out


def measured_cluster(cluster: ClusterSpec, cal: Mapping[str, Any]) -> ClusterSpec:
    """``cluster``; from a spec of before the node fields, ``calibration.dispatch_s`` moved onto
    every node as its ``dispatch_s``."""
    old = cal.get("dispatch_s")
    if not isinstance(old, Mapping) or any(n.dispatch_s for n in cluster.nodes):
        return cluster
    from .calibrate import dispatch_by_kind

    d = dispatch_by_kind({str(k): float(v) for k, v in old.items()})
    return dataclasses.replace(cluster, nodes=tuple(dataclasses.replace(n, dispatch_s=d)
                                                    for n in cluster.nodes))


def predict(cluster: ClusterSpec, steps: Sequence[Sequence[Trajectory]], policy: str,
            cal: Mapping[str, Any], *, train_s: float = 0.0, tick_s: float = 0.5,
            label: str = "?") -> Any:
    """The simulator's `SimReport` for ``policy`` on the measured form of ``steps``."""
    from ..sim.runner import run_policy
    from ..sim.simulator import SimConfig

    cluster = measured_cluster(cluster, cal)
    m = measured_trace(steps, cluster, cal)
    cold = cal.get("cold_start_s")
    cfg = SimConfig(train_s=train_s, tick_s=tick_s,
                    warm_cold_start_s=float(cold) if cold is not None else 0.57)
    first = list(steps[0]) if steps else []
    return run_policy(cluster, lambda: m, policy, workload=label, config=cfg, shares_from=first)


def optimum(cluster: ClusterSpec, steps: Sequence[Sequence[Trajectory]], cal: Mapping[str, Any],
            train_s: float = 0.0) -> float:
    """The average ACT of the optimum (`sim.bounds`: each action alone at its best allotment,
    no queueing, no start-up) on the measured form of ``steps``: a lower bound of every
    predicted ACT, shown beside the measured ones of the same run (which can fall below it
    where the machine runs faster than its calibration said)."""
    from ..sim.bounds import bound

    cluster = measured_cluster(cluster, cal)
    return float(bound(measured_trace(steps, cluster, cal), cluster, train_s).act["avg"])


def run_bound(cluster: ClusterSpec, steps: Sequence[Sequence[Trajectory]], cal: Mapping[str, Any],
              report: Any) -> dict[str, Any]:
    """The bound (`sim.bounds.RunBound`) of a real run on its own release times: its counted
    actions (``report.releases``), in the calibrated trace's terms (`measured_trace`), rigid
    actions at their whole demand (a real slice's CFS burst uses real cores), a failed action
    as one that may not have run (0). A measurement can fall below it where the machine ran
    faster than its calibration said."""
    from ..core.actions import Status
    from ..sim.bounds import ReleaseLog

    cluster = measured_cluster(cluster, cal)
    acts = {t.id: t.steps for batch in measured_trace(steps, cluster, cal) for t in batch}
    log = ReleaseLog(cluster)
    for tid, i, submit, status in report.releases:
        st = Status.__members__.get(status.upper())
        if st is not None:
            log.record(acts[tid][i][1], st, submit, submit, ran=False)
    return log.bound().as_dict()


def err(measured: float, predicted: float) -> float:
    """Relative error of the prediction: (predicted - measured) / measured."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / measured


def fidelity(real: Mapping[str, Any], sim: Mapping[str, Any], ours: str = "tangram",
             ) -> dict[str, Any]:
    """Per policy: measured vs predicted avg/p50/p99 ACT and step, the errors, and the
    measured vs predicted baseline/ours ratios (avg ACT and step)."""
    rows: dict[str, Any] = {}
    for p, r in real.items():
        s = sim.get(p)
        if s is None:
            continue
        row: dict[str, Any] = {}
        for key in ("avg", "p50", "p99"):
            row[f"act_{key}"] = {"measured": r.act[key], "predicted": s.act[key],
                                 "error": err(r.act[key], s.act[key])}
        row["step"] = {"measured": r.step_avg_s, "predicted": s.step_avg_s,
                       "error": err(r.step_avg_s, s.step_avg_s)}
        row["utilization_cpu"] = {"measured": r.cpu_utilization,
                                  "predicted": s.utilization.get("cpu", 0.0)}
        rows[p] = row
    ratios: dict[str, Any] = {}
    if ours in real and ours in sim:
        for p in rows:
            if p == ours:
                continue
            for key, get_r, get_s in (
                ("act_avg", lambda x: x.act["avg"], lambda x: x.act["avg"]),
                ("step", lambda x: x.step_avg_s, lambda x: x.step_avg_s),
            ):
                mr = _ratio(get_r(real[p]), get_r(real[ours]))
                pr = _ratio(get_s(sim[p]), get_s(sim[ours]))
                ratios.setdefault(p, {})[key] = {"measured": mr, "predicted": pr, "error": err(mr, pr)}
    return {"policies": rows, "ratios": ratios}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf
