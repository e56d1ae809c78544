"""Core throughput: actions arriving, placed and finished per second through the pure core.

Setup: 1,000 nodes of 8 CPUs / 32 GB, filled with running actions, and 10,000 actions pending.
Then, in a steady state, each cycle is one ActionFinished (which frees a slot, so the core places
the next pending action: a StartAction) and one ActionArrived (the queue stays at 10,000).
So every cycle is one action arriving, one placed and one finished. Demands are mixed (1, 2 or
4 CPUs, elastic test suites) with work hints, as in the built-in workloads.

Prints actions/s per policy and the ratio against `fifo` measured in the same run. The goal
(issue 2) is >= 20,000 actions/s on one core for `tangram`.

    .venv/bin/python benchmarks/bench_core.py [--cycles N] [--nodes N] [--pending N]
"""

from __future__ import annotations

import argparse
import random
import time

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, WorkHints
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.commands import StartAction
from arl_tangram.core.events import ActionArrived, ActionFinished, ActionStarted
from arl_tangram.core.resources import Resources


def make_actions(n: int, seed: int) -> list[ActionSpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.5:
            spec = ActionSpec(f"a{i}", kind=ActionKind.CODE, demand=Resources(cpu=1, memory_mb=512),
                              hints=WorkHints(expected_s=rng.uniform(0.1, 5)), trajectory=f"t{i % 512}")
        elif r < 0.8:
            spec = ActionSpec(f"a{i}", kind=ActionKind.TOOL, demand=Resources(cpu=2, memory_mb=1024),
                              tag="python", trajectory=f"t{i % 512}")
        else:
            spec = ActionSpec(f"a{i}", kind=ActionKind.TEST, demand=Resources(cpu=4, memory_mb=2048),
                              elasticity=Elasticity(4, 8, speedup=Speedup(0.8)),
                              hints=WorkHints(test_count=rng.randint(5, 50)), trajectory=f"t{i % 512}")
        out.append(spec)
    return out


def run(policy: str, nodes: int, pending: int, cycles: int, seed: int = 1) -> float:
    cluster = ClusterSpec(tuple(NodeSpec(f"n{i}", Resources(cpu=8, memory_mb=32768)) for i in range(nodes)))
    core = Core(cluster, CoreConfig(policy=policy, trajectories=512, aging_s=1e9))
    specs = make_actions(pending * 2 + cycles + nodes * 8, seed)
    it = iter(specs)
    running: list[str] = []
    t = 0.0

    def feed(cmds: list) -> None:
        for c in cmds:
            if isinstance(c, StartAction):
                running.append(c.action.id)

    # fill the cluster and the queue
    while len(core.actions) - len(running) < pending:
        t += 1e-4
        feed(core.handle(ActionArrived(t, next(it))))
    for aid in running:
        core.handle(ActionStarted(t, aid, "?"))
    rng = random.Random(seed)
    start = time.perf_counter()
    for _ in range(cycles):
        t += 1e-4
        j = rng.randrange(len(running))
        aid = running[j]
        running[j] = running[-1]
        running.pop()
        feed(core.handle(ActionFinished(t, aid, run_s=1.0)))
        feed(core.handle(ActionArrived(t, next(it))))
    elapsed = time.perf_counter() - start
    queued = len(core.actions) - len(running)
    assert queued >= pending * 0.5, f"queue drained ({queued}); the benchmark measures nothing"
    return cycles / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=50_000)
    args = ap.parse_args()
    results = {}
    for policy in ("fifo", "tangram", "task-isolated", "trajectory-bound"):
        results[policy] = run(policy, args.nodes, args.pending, args.cycles)
        print(f"{policy:>17}: {results[policy]:>10,.0f} actions/s (arrive + place + finish)")
    base = results["fifo"]
    print(f"tangram / fifo = {results['tangram'] / base:.2f}x; goal >= 20,000 actions/s for tangram:"
          f" {'met' if results['tangram'] >= 20_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
