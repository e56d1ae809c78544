"""The scheduler's acceptance matrix in simulation: tangram against every baseline, the best
static pool included, on every built-in workload, seeds, loads, and the contended clusters of
docs/evidence.md.

For each case it prints tangram's average ACT, the worst ratio of a baseline to tangram
(baseline ACT / tangram ACT: below 1 a baseline wins) and which baseline that is, and
tangram's ACT over the bound on its own run (`sim.bounds`: on its release times, the larger
of each action alone and preemptive SRPT on each pool's total capacity). The summary
line gives the worst ratio over all cases; the goal (issue 22) is >= 0.995 everywhere and
tangram within 1.15x of the bound at default load.

    .venv/bin/python benchmarks/bench_policy.py            # the whole matrix (minutes)
    .venv/bin/python benchmarks/bench_policy.py --quick    # seed 0, loads 1 and 16, contended
    .venv/bin/python benchmarks/bench_policy.py --only code-rl --loads 16 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.sim.bounds import bound
from arl_tangram.sim.runner import best_static, compare
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import WORKLOADS, cpu_nodes, get_workload, gpu_nodes, with_load

LOADS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class Case:
    label: str
    workload: str
    seed: int
    load: float
    cluster: Callable[[int], ClusterSpec] | None = None  # None: the workload's own


def _contended() -> list[tuple[str, str, Callable[[int], ClusterSpec]]]:
    """docs/evidence.md's contended clusters: 8-vCPU nodes, fewer than the sizing rule gives."""
    def cpu(n: int) -> Callable[[int], ClusterSpec]:
        return lambda _t: ClusterSpec(tuple(cpu_nodes("cpu", 8 * n)))

    def mixed(n: int) -> Callable[[int], ClusterSpec]:
        w = get_workload("mixed")
        models = w.cluster(w.trajectories).models
        return lambda _t: ClusterSpec(tuple(cpu_nodes("cpu", 8 * n) if n else ())
                                      + tuple(gpu_nodes("gpu", 4)), models)

    return [("code-rl@4n", "code-rl", cpu(4)), ("code-rl@2n", "code-rl", cpu(2)),
            ("swe-agent@4n", "swe-agent", cpu(4)), ("swe-agent@2n", "swe-agent", cpu(2)),
            ("mixed@6n", "mixed", mixed(6)), ("mixed@0n", "mixed", mixed(0)),
            ("tool-math@2n", "tool-math", cpu(2)), ("tool-math@1n", "tool-math", cpu(1))]


def cases(workloads: Sequence[str], seeds: Sequence[int], loads: Sequence[float],
          contended: bool) -> list[Case]:
    out = [Case(f"{w}/s{s}/x{load:g}", w, s, load) for w in workloads for s in seeds for load in loads]
    if contended:
        out += [Case(f"{label}/s{s}", w, s, 1.0, c) for label, w, c in _contended()
                if w in workloads for s in seeds]
    return out


def run_case(case: Case) -> dict[str, Any]:
    w = get_workload(case.workload)
    n = w.trajectories
    cluster = case.cluster(n) if case.cluster else w.cluster(n)
    batches = with_load(lambda: w.batches(case.seed, n, w.steps), case.load)
    config = SimConfig(train_s=w.train_s)
    t0 = time.perf_counter()
    reports = compare(cluster, batches, seed=case.seed, workload=case.workload, config=config)
    wall = time.perf_counter() - t0
    ours = reports["tangram"].act["avg"]
    # the bound on tangram's own run (its release times: sim.bounds), and each action alone
    run_bound = (reports["tangram"].bound or {}).get("act_avg") or bound(batches(), cluster, w.train_s).act["avg"]
    worst, who = float("inf"), ""
    for name, r in reports.items():
        if name == "tangram":
            continue
        ratio = r.act["avg"] / ours if ours > 0 else 1.0
        if ratio < worst:
            worst, who = ratio, name
    best = best_static(reports)
    tb = reports.get("trajectory-bound")
    return {"case": case.label, "tangram_act": ours, "worst_ratio": worst, "worst_of": who,
            "x_bound": ours / run_bound if run_bound > 0 else 1.0, "bound_act": run_bound,
            "best_static": best, "best_static_ratio": reports[best].act["avg"] / ours if best else None,
            "trajectory_bound_ratio": tb.act["avg"] / ours if tb else None,
            "trajectory_bound_step_ratio": tb.step_avg_s / reports["tangram"].step_avg_s if tb else None,
            "stalled": [k for k, r in reports.items() if r.stalled], "wall_s": wall}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="seed 0, loads 1 and 16, contended")
    p.add_argument("--only", default=None, help="comma-separated workloads (default: all)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS))
    p.add_argument("--no-contended", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    workloads = args.only.split(",") if args.only else list(WORKLOADS)
    seeds = [int(s) for s in args.seeds.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    if args.quick:
        seeds, loads = [0], [1.0, 16.0]
    rows = []
    for case in cases(workloads, seeds, loads, not args.no_contended):
        row = run_case(case)
        rows.append(row)
        if not args.json:
            flag = "  <" if row["worst_ratio"] < 0.995 else ""
            print(f"{row['case']:<24} tangram {row['tangram_act']:8.3f} s  worst baseline/tangram "
                  f"{row['worst_ratio']:6.3f} ({row['worst_of']:<16}) x bound {row['x_bound']:5.2f}"
                  f"  [{row['wall_s']:.0f} s]{flag}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    worst = min(rows, key=lambda r: r["worst_ratio"])
    print(f"worst: {worst['case']} {worst['worst_ratio']:.3f} ({worst['worst_of']}); "
          f"{sum(r['worst_ratio'] < 0.995 for r in rows)} of {len(rows)} cases below 0.995")
    return 0


if __name__ == "__main__":
    sys.exit(main())
