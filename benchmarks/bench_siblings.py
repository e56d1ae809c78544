"""Estimates from siblings (issue 39, item 5), in simulation: tangram on `grpo-siblings`
(code-rl's answers in GRPO groups of 16, per-test times correlated with rho 0.5 within a group)
with the trajectories naming their siblings, and the same trajectories naming none (what the
estimator knew before). Per case: tangram's average ACT both ways, the ratio (without / with:
above 1 the sibling estimates help), the bound on the run with siblings (`sim.bounds`), and
the estimator's error on the tests (mean |log2(actual / predicted)|) both ways.

    .venv/bin/python benchmarks/bench_siblings.py                 # seeds 0,1; the cases below
    .venv/bin/python benchmarks/bench_siblings.py --seeds 0 --rho 0.8
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.sim.runner import make_core, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import Trajectory
from arl_tangram.sim.workloads import (
    SiblingCode,
    Workload,
    cpu_nodes,
    get_workload,
    with_load,
    without_siblings,
)

# (label, load, CPU cores: None for the workload's own cluster, one core per trajectory)
CASES: tuple[tuple[str, float, float | None], ...] = (
    ("x1", 1.0, None), ("x4", 4.0, None), ("x16", 16.0, None),
    ("@4n", 1.0, 32.0), ("@2n", 1.0, 16.0), ("@2n x4", 4.0, 16.0), ("@1n", 1.0, 8.0),
    ("@1n x4", 4.0, 8.0))


def _error(core: Any) -> float:
    errs = core.estimator.errors() if hasattr(core, "estimator") else core.st.estimator.errors()
    rows = [e for k, e in errs.items() if k.startswith("test")]
    return rows[0]["mean_abs_log2"] if rows else float("nan")


def run_case(w: Workload, seed: int, load: float, cores: float | None) -> dict[str, Any]:
    n = w.trajectories
    cluster = ClusterSpec(tuple(cpu_nodes("cpu", cores))) if cores else w.cluster(n)
    grouped = with_load(lambda: w.batches(seed, n, w.steps), load)

    def plain() -> Iterator[list[Trajectory]]:
        for b in grouped():
            yield without_siblings(b)

    out: dict[str, Any] = {}
    for name, batches in (("with", grouped), ("without", plain)):
        cores_made: list[Any] = []

        def factory(*a: Any, _keep: list[Any] = cores_made, **kw: Any) -> Any:
            core = make_core(*a, **kw)
            _keep.append(core)
            return core

        batches_fn: Callable[[], Iterable[Sequence[Trajectory]]] = batches
        r = run_policy(cluster, batches_fn, "tangram", seed=seed, workload=w.name,
                       config=SimConfig(train_s=w.train_s), core_factory=factory)
        out[name] = {"act": r.act["avg"], "bound": (r.bound or {}).get("act_avg"),
                     "err": _error(cores_made[0])}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--rho", type=float, default=None, help="the correlation (default: the workload's)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    w = get_workload("grpo-siblings")
    if a.rho is not None:
        w = Workload(w.name, w.description, ((SiblingCode(a.rho), 1.0),), w.cluster,
                     w.trajectories, w.steps, w.train_s)
    rows = []
    print(f"{'case':<14}{'with':>9}{'without':>9}{'ratio':>8}{'bound':>9}{'x_bound':>9}"
          f"{'err_with':>10}{'err_w/o':>9}")
    for seed in (int(s) for s in a.seeds.split(",")):
        for label, load, cores in CASES:
            r = run_case(w, seed, load, cores)
            ratio = r["without"]["act"] / r["with"]["act"]
            bound = r["with"]["bound"] or float("nan")
            rows.append({"case": f"{label}/s{seed}", "ratio": ratio, **r})
            print(f"{label + '/s' + str(seed):<14}{r['with']['act']:>9.3f}{r['without']['act']:>9.3f}"
                  f"{ratio:>8.3f}{bound:>9.3f}{r['with']['act'] / bound:>9.3f}"
                  f"{r['with']['err']:>10.3f}{r['without']['err']:>9.3f}")
    worst = min(x["ratio"] for x in rows)
    best = max(x["ratio"] for x in rows)
    print(f"without/with: worst {worst:.3f}, best {best:.3f} over {len(rows)} cases")
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
