"""Routing to judge engines (issue 38): the core's cost rule against the routers RL frameworks
deploy, in simulation, on a workload whose prompts repeat their prefix (`genrm-turns`: a judge
engine answers every turn of a multi-turn agent, reading the trajectory so far).

Every run is the tangram policy on the same trajectories; only `CoreConfig.engine_routing`
differs (docs/core.md, "Routing to judge engines"):

- cost: least marginal delay, the prefix cache weighed (ours);
- sticky: the instance that served the trajectory while it has a free sequence, else the least
  loaded (verl's AsyncLLMServerManager and ROLL's judge router: sticky per trajectory/env);
- least-loaded: fewest sequences in flight (prefix-blind);
- round-robin.

Printed per load: each routing's average and p99 ACT, the bound (`sim.bounds`: the lowest of
the runs' own bounds, so no row is below it; an action alone pays its decode and the prefill of
the prompt tokens beyond its trajectory's previous prompt), each ACT over the bound, and each
routing's ACT over cost's (> 1: cost is better).

    .venv/bin/python benchmarks/bench_routing.py                     # loads 1, 2, 4; seed 0
    .venv/bin/python benchmarks/bench_routing.py --loads 1 --seeds 0,1 --workload genrm-engine
    .venv/bin/python benchmarks/bench_routing.py --workload genrm-engine --loads 4 --max-seqs 16
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import replace

from arl_tangram.core.config import ENGINE_ROUTINGS
from arl_tangram.sim.runner import make_core, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import get_workload, with_load


def run(workload: str, load: float, seed: int, routing: str,
        max_seqs: int = 0) -> tuple[float, float, float]:
    """(ACT avg, ACT p99, the run's bound on its avg ACT) of one seeded run; ``max_seqs`` > 0
    caps the engines' sequences per instance (the rest wait in the core's queue, in its order:
    tangram's is shortest expected first)."""
    w = get_workload(workload)
    n = w.trajectories
    cluster = w.cluster(n)
    if max_seqs > 0:
        cluster = replace(cluster, models=tuple(
            replace(m, max_seqs=max_seqs, max_batch=min(m.max_batch, max_seqs)) if m.max_seqs else m
            for m in cluster.models))
    rep = run_policy(cluster, with_load(lambda: w.batches(seed, n, None), load), "tangram",
                     seed=seed, workload=workload, config=SimConfig(train_s=w.train_s),
                     core_factory=functools.partial(make_core, engine_routing=routing))
    assert rep.bound is not None
    return float(rep.act["avg"]), float(rep.act["p99"]), float(rep.bound["act_avg"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="genrm-turns")
    ap.add_argument("--loads", default="1,2,4", help="load factors (default: 1,2,4)")
    ap.add_argument("--seeds", default="0", help="seeds (default: 0)")
    ap.add_argument("--max-seqs", type=int, default=0,
                    help="cap the engines' sequences per instance (default: the workload's)")
    args = ap.parse_args(argv)
    worst = 0.0
    for seed in (int(s) for s in args.seeds.split(",")):
        for load in (float(x) for x in args.loads.split(",")):
            t0 = time.process_time()
            got = {r: run(args.workload, load, seed, r, args.max_seqs) for r in ENGINE_ROUTINGS}
            floor = min(b for _, _, b in got.values())
            cost = got["cost"][0]
            print(f"{args.workload} seed {seed} load x{load:g}: bound {floor:.3f} s "
                  f"({time.process_time() - t0:.1f}s CPU)")
            print(f"  {'routing':13s} {'ACT avg s':>9s} {'p99 s':>7s} {'x bound':>8s} {'x cost':>7s}")
            for r, (avg, p99, _) in got.items():
                print(f"  {r:13s} {avg:9.3f} {p99:7.2f} {avg / floor:8.3f} {avg / cost:7.3f}")
            worst = max(worst, cost / min(a for a, _, _ in got.values()))
    print(f"# worst cost ACT over the best routing's: {worst:.3f} (<= 1: cost is never behind)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
