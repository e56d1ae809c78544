"""Simulator throughput: actions simulated per second of real time, through the real core.

Goal (issue 2): 1,000,000 actions simulated in <= 120 s. The workload is `tool-math` (short
python tool calls between generations, ~3.5 actions per trajectory), scaled up to large RL
batches on a cluster sized by the workload's own rule. The baseline, measured in the same run on
the same trajectories, is the same simulator driving a null scheduler (start every action at
once, no accounting): its rate is the simulator's own ceiling, so the ratio says how much of the
time the scheduler core takes. Both runs use the simulator's defaults, garbage-collector tuning
during the run included (`SimConfig.gc_tuning`, as `tangram simulate` runs).

    python benchmarks/bench_sim.py                 # 1,000,000 actions
    python benchmarks/bench_sim.py --actions 50000 # quick run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import Status
from arl_tangram.core.build import make_deliver, make_result, make_start
from arl_tangram.sim.runner import run_policy
from arl_tangram.sim.simulator import SimConfig, Simulator
from arl_tangram.sim.workloads import get_workload

ACTIONS_PER_TRAJ = 3.5  # tool-math: 1 + Poisson(2.5) calls


class NullScheduler:
    """Starts every action at once on one node; delivers on finish. No capacity, no order."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.meta: dict[str, tuple[object, float, float | None]] = {}

    def handle(self, event: E.Event) -> list[C.Command]:
        # Commands built as the core builds them (core.build), so that this stand-in costs as
        # little as it can and the baseline measures the simulator itself.
        t = type(event)
        if t is E.ActionArrived:
            a = event.action  # type: ignore[attr-defined]
            self.meta[a.id] = (a, event.time, None)
            # C.StartAction(a, self.node, a.demand, warm=False)
            return [make_start(a, self.node, a.demand, False, "")]
        if t is E.ActionStarted:
            aid = event.action_id  # type: ignore[attr-defined]
            a, sub, _ = self.meta[aid]
            self.meta[aid] = (a, sub, event.time)
            return []
        if t is E.ActionFinished:
            aid = event.action_id  # type: ignore[attr-defined]
            _a, sub, start = self.meta.pop(aid)
            # C.Deliver(ActionResult(aid, Status.SUCCEEDED, sub, start, event.time))
            return [make_deliver(make_result(aid, Status.SUCCEEDED, sub, start, event.time, None,
                                             None, None, "", 1), "")]
        return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actions", type=int, default=1_000_000, help="actions to simulate (approx.)")
    p.add_argument("--batch", type=int, default=2048, help="trajectories per RL step")
    p.add_argument("--policy", default="tangram", help="core policy for the full run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    w = get_workload("tool-math")
    steps = max(1, round(args.actions / ACTIONS_PER_TRAJ / args.batch))
    cluster = w.cluster(args.batch)
    cfg = SimConfig(train_s=w.train_s)

    def batches():  # type: ignore[no-untyped-def]
        return w.batches(args.seed, args.batch, steps)

    print(f"tool-math: {steps} RL steps x {args.batch} trajectories on {len(cluster.nodes)} nodes")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f" on {os.cpu_count()} CPUs (above ~0 means other processes share the cores)")
    t0, c0 = time.perf_counter(), time.process_time()
    null = Simulator(cluster, NullScheduler(cluster.nodes[0].name), cfg).run(batches())
    t_null, c_null = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    full = run_policy(cluster, batches, args.policy, workload="tool-math", config=cfg)
    t_full, c_full = time.perf_counter() - t0, time.process_time() - c0
    r_null, r_full = null.actions / t_null, full.actions / t_full
    print(f"CPU time of this process: baseline {c_null:.1f} s, full {c_full:.1f} s "
          f"(wall above CPU means other processes shared the cores)")
    print(f"CPU time per action: baseline {1e6 * c_null / null.actions:.1f} us, "
          f"full {1e6 * c_full / full.actions:.1f} us")
    print(f"baseline (null scheduler): {null.actions:,} actions in {t_null:.1f} s = {r_null:,.0f} actions/s")
    print(f"simulator + core ({args.policy}): {full.actions:,} actions in {t_full:.1f} s = "
          f"{r_full:,.0f} actions/s ({full.events:,} core events, stalled={full.stalled})")
    print(f"ratio full/baseline throughput: {r_full / r_null:.2f} "
          f"(the core takes {100 * (1 - r_full / r_null):.0f}% of the time)")
    scaled = 1_000_000 / r_full
    print(f"1,000,000 actions at the CPU-time rate: {1_000_000 * c_full / full.actions:.0f} s")
    goal = "met" if scaled <= 120 else "NOT met"
    print(f"1,000,000 actions at this rate: {scaled:.0f} s (goal <= 120 s: {goal})")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
