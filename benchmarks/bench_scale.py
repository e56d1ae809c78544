"""Scale: what one decision of the core costs as the concurrent trajectories grow (issue 24).

For each cluster (``N`` nodes x 192 cores / 768 GB, DSec's node size; a workload with models also
gets its own GPU nodes) and each count of concurrent trajectories (one RL step of the workload,
every trajectory at once), three measurements:

1. **simulate**: `sim.runner.run_policy` under ``tangram`` as ``tangram simulate --steps 1`` runs
   it, timed end to end: actions/s and events/s. The core is wrapped by a recorder that keeps
   every event it is handed (and the time spent in ``handle``, so the simulator's own share is the
   rest). Its CPU time too (``sim_actions_per_cpu_s``): on a machine shared with other work, what
   the run itself cost.
2. **core alone**: a fresh core of the same configuration is handed the recorded events again,
   in order. The core is deterministic in its events, so it takes the same decisions; what is
   timed is ``Core.handle`` alone: events (decisions) per second, and p50 / p99 of one call.
3. **memory**: the core's own memory per trajectory: ``tracemalloc`` over a second replay
   (slower, so apart from the timing), the peak of what the core allocated, per trajectory.

The column "vs first" divides the simulate actions/s of each count by that of the smallest count
on the same cluster: how the cost of an action grows with the trajectories (the issue's goal:
>= 0.8 from 2k to 20k). With ``--same-load``, each larger count also runs on as many more nodes
as keeps the smallest count's trajectories per node (20,000 on 1,600 nodes beside 2,000 on 160):
the same work per action (tests/core/test_scale_work.py counts it), but ten times the state, so
what that row loses against the first is what the machine's caches cost at that size, not the
core; the column "vs same load" divides a count's rate by that row's, taken right after it: what
the load per node costs (the scans that grow with a node's actions). Goals (issue 24), with the compiled core: >= 20,000 decisions/s for
the core alone, p99 of one decision <= 1 ms, simulate >= 10,000 actions/s, at 20,000 swe-agent
trajectories on 160 x 192 cores.

    .venv/bin/python benchmarks/bench_scale.py                     # 16 nodes, 2k and 6k (minutes)
    .venv/bin/python benchmarks/bench_scale.py --nodes 16,160 --trajectories 2000,6000,20000,50000
        [--workloads swe-agent,mixed] [--no-memory] [--same-load] [--repeats N] [--json]
    .venv/bin/python benchmarks/bench_scale.py --nodes 2 --trajectories 400,6400 --session-mb 128
        # issue 40's crowded node: 3,200 sessions a node (DSec's density) against 200

With ``--same-contention``, each larger count is also set beside the first count on nodes
scaled down to the larger count's trajectories per core and per GB (2,000 on 16 x 64 cores
beside 6,000 on 16 x 192): both clusters equally oversubscribed, so the column "vs same
contention" is what three times the actions per node costs at one contention. The plain "vs
first" compares two regimes: 2,000 trajectories leave DSec's 16 nodes spare capacity (no
action is resized), 6,000 oversubscribe them (every action waits, grows or is shrunk: more
decisions per action, whatever a decision costs). ``--node-scale F`` makes every CPU node F
times DSec's size (6,000 on 16 x 576 cores: the crowded count's actions per node at the
sparse count's contention).

With ``--spread``, each larger count also runs spread over as many more nodes as keeps the
first count's trajectories per node, each node scaled down to the larger count's trajectories
per core (6,400 on 32 x 12 cores beside 6,400 on 2 x 192): the same actions at the same
contention, a sixteenth of them a node. The column "vs spread" is what the load per node costs
apart from the size of the whole, which "vs same contention" counts too (sixteen times the
trajectories in all: longer heaps, bigger tables, the machine's caches).

``--repeats N`` runs every configuration N times in interleaved passes (all of them, then all
again) and keeps each one's fastest simulate and fastest core replay: this VM's speed drifts
25-40% within minutes, and a crowded run and its peer taken a minute apart read that drift as
a ratio (three single runs of 16 x 6,000 against its peer read 0.85, 0.72 and 0.54 within ten
minutes on 2026-12-01); the best of each, taken side by side, is the figure the machine allows.

``--session-mb`` gives every session that much memory: swe-agent's 2 GB sessions fill a 768 GB
node at ~375, so DSec's 3,200 a node needs small (paused, shared-base) ones.

``--max-wall S`` cuts each simulation after S seconds (the 3,200-a-node step ran past 15
minutes on 2026-12-01): its row, marked "(cut)", is of the events it got to (``actions``: those
finished by then; the core replay on those events). Its actions/s is of the step's start, not
of the whole step; its core figures (decisions/s, p50, p99) are per decision, as a whole run's.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from arl_tangram.core import FORM
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.events import ActionFinished
from arl_tangram.core.resources import Resources
from arl_tangram.sim.runner import make_core, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import Trajectory
from arl_tangram.sim.workloads import get_workload

NODE_CPU, NODE_MEMORY_MB = 192, 786_432  # DSec's node size (issue 24)


class Cut(Exception):
    """A simulation stopped at ``--max-wall``: its recorded events are what it got to."""


@dataclass
class Recorder:
    """Wraps a core: keeps every event it is handed and the time spent in ``handle``; past
    ``deadline`` (a `time.perf_counter` reading), the next event raises `Cut` unhandled."""

    core: Any
    events: list[Any] = field(default_factory=list)
    handle_s: float = 0.0
    deadline: float = math.inf

    def handle(self, event: Any) -> list[Any]:
        if self.events and time.perf_counter() > self.deadline:
            raise Cut
        self.events.append(event)
        t0 = time.perf_counter()
        out = self.core.handle(event)
        self.handle_s += time.perf_counter() - t0
        return out

    def __getattr__(self, name: str) -> Any:  # the simulator may read the core's state
        return getattr(self.core, name)


def cluster_for(workload: str, nodes: int, trajectories: int, scale: float = 1.0) -> ClusterSpec:
    """``nodes`` CPU nodes of DSec's size (times ``scale``: its cores and memory), plus the
    workload's own non-CPU nodes and models."""
    own = get_workload(workload).cluster(trajectories)
    size = Resources(cpu=round(NODE_CPU * scale), memory_mb=round(NODE_MEMORY_MB * scale))
    cpu = tuple(NodeSpec(f"cpu-{i}", size, pool="cpu") for i in range(nodes))
    others = tuple(n for n in own.nodes if n.pool != "cpu" and n.capacity.get("gpu") > 0)
    return ClusterSpec(cpu + others, own.models)


def with_session_mb(batch: list[Trajectory], mb: float) -> list[Trajectory]:
    """``batch`` with every session holding ``mb`` of memory (its other demands kept)."""
    return [replace(t, sessions={k: replace(d, demand=d.demand.with_amount("memory_mb", mb))
                                 for k, d in t.sessions.items()}) for t in batch]


def run_one(workload: str, nodes: int, trajectories: int, *, memory: bool,
            session_mb: float | None = None, scale: float = 1.0,
            max_wall: float | None = None) -> dict[str, Any]:
    """One configuration's row. ``max_wall``: the simulation is cut after that many seconds
    (``cut_at_s`` in the row); its figures, and the core replay's, are then of the events it
    got to, and ``actions`` counts the actions finished by then."""
    w = get_workload(workload)
    cluster = cluster_for(workload, nodes, trajectories, scale)
    if session_mb is None:
        batches = lambda: w.batches(0, trajectories, 1)  # noqa: E731
    else:
        batches = lambda: (with_session_mb(b, session_mb) for b in w.batches(0, trajectories, 1))  # noqa: E731
    made: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    recorders: list[Recorder] = []

    def recording(*args: Any, **kw: Any) -> Recorder:
        made.append((args, kw))
        recorders.append(Recorder(make_core(*args, **kw), deadline=deadline))
        return recorders[-1]

    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    deadline = math.inf if max_wall is None else t0 + max_wall
    cut = False
    try:
        report = run_policy(cluster, batches, "tangram", workload=workload,
                            config=SimConfig(train_s=w.train_s), core_factory=recording)
    except Cut:
        cut = True
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rec = recorders[0]
    events = rec.events
    actions = sum(type(e) is ActionFinished for e in events) if cut else int(report.act["count"])

    # the core alone, on the same events
    args, kw = made[0]
    core = make_core(*args, **kw)
    lat = []
    handle = core.handle
    clock = time.perf_counter_ns
    gc.collect()
    t1 = time.perf_counter()
    for e in events:
        s = clock()
        handle(e)
        lat.append(clock() - s)
    core_wall = time.perf_counter() - t1
    lat.sort()
    row = {
        "workload": workload, "nodes": nodes, "trajectories": trajectories, "scale": scale,
        "actions": actions, "cut_at_s": wall if cut else None,
        "session_mb": session_mb, "node_cpu": cluster.nodes[0].capacity.get("cpu"),
        "events": len(events), "sim_wall_s": wall, "sim_actions_per_s": actions / wall,
        "sim_events_per_s": len(events) / wall, "sim_own_s": wall - rec.handle_s,
        "sim_cpu_s": cpu, "sim_actions_per_cpu_s": actions / cpu,  # (what other load takes off)
        "core_decisions_per_s": len(events) / core_wall,
        "core_p50_us": lat[len(lat) // 2] / 1e3, "core_p99_us": lat[int(0.99 * (len(lat) - 1))] / 1e3,
        "core_max_us": lat[-1] / 1e3, "core_mean_us": statistics.fmean(lat) / 1e3,
    }
    del core, lat
    if memory:
        core = make_core(*args, **kw)
        gc.collect()
        tracemalloc.start()
        for e in events:
            core.handle(e)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row["core_kb_per_trajectory"] = peak / 1024 / trajectories
        del core
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="16", help="CPU node counts, comma-separated")
    p.add_argument("--trajectories", default="2000,6000", help="concurrent trajectories, comma-separated")
    p.add_argument("--workloads", default="swe-agent")
    p.add_argument("--no-memory", action="store_true", help="skip the (slower) memory pass")
    p.add_argument("--same-load", action="store_true",
                   help="also run each larger count at the first count's trajectories per node")
    p.add_argument("--session-mb", type=float, default=None,
                   help="every session holds this much memory (default: the workload's; DSec's "
                        "density, 3,200 sessions a node: --nodes 2 --trajectories 400,6400 "
                        "--session-mb 128)")
    p.add_argument("--same-contention", action="store_true",
                   help="also run the first count on nodes scaled down to each larger count's "
                        "trajectories per core (2,000 on 16 x 64 cores beside 6,000 on 16 x 192): "
                        "the load per node apart from the contention")
    p.add_argument("--spread", action="store_true",
                   help="also run each larger count spread over as many more nodes, each scaled "
                        "down, as keeps the first count's trajectories per node at the larger "
                        "count's trajectories per core (6,400 on 32 x 12 cores beside 6,400 on 2 x "
                        "192): the same actions at the same contention, the load per node apart "
                        "from the cluster's size")
    p.add_argument("--node-scale", type=float, default=1.0,
                   help="every CPU node this many times DSec's size (cores and memory)")
    p.add_argument("--max-wall", type=float, default=None,
                   help="cut each simulation after this many seconds: its row (marked 'cut') has "
                        "the figures of the events it got to (the 3,200-a-node case ran past 15 "
                        "minutes on 2026-12-01)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every configuration this many times, in interleaved passes (all of "
                        "them, then all again), and keep each one's fastest simulate and fastest "
                        "core replay: what this VM's drift of speed within minutes takes off a "
                        "ratio of two runs taken minutes apart")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats must be at least 1, got {a.repeats}")
    print(f"core: {FORM}", file=sys.stderr)
    # every configuration, in order: (key, run_one's arguments, what it stands beside)
    jobs: list[tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]] = []
    for wl in a.workloads.split(","):
        for nodes in (int(x) for x in a.nodes.split(",")):
            counts = [int(x) for x in a.trajectories.split(",")]
            for n in counts:
                jobs.append(((wl, nodes, n, a.node_scale),
                             dict(workload=wl, nodes=nodes, trajectories=n, memory=not a.no_memory,
                                  session_mb=a.session_mb, scale=a.node_scale, max_wall=a.max_wall),
                             {"first": (wl, nodes, counts[0], a.node_scale)}))
                if n == counts[0]:
                    continue
                if a.same_load:
                    wide = nodes * n // counts[0]  # the first count's load per node
                    jobs.append(((wl, wide, n, 1.0),
                                 dict(workload=wl, nodes=wide, trajectories=n, memory=False,
                                      session_mb=a.session_mb, max_wall=a.max_wall),
                                 {"first": (wl, nodes, counts[0], a.node_scale), "same_load_of": nodes,
                                  "of": (wl, nodes, n, a.node_scale)}))
                if a.spread:
                    wide = nodes * n // counts[0]  # the first count's trajectories per node
                    small = counts[0] / n * a.node_scale  # on nodes at n's trajectories per core
                    jobs.append(((wl, wide, n, small),
                                 dict(workload=wl, nodes=wide, trajectories=n, memory=False,
                                      session_mb=a.session_mb, scale=small, max_wall=a.max_wall),
                                 {"first": (wl, nodes, counts[0], a.node_scale), "spread_of": nodes,
                                  "of": (wl, nodes, n, a.node_scale)}))
                if a.same_contention:
                    small = counts[0] / n * a.node_scale  # n's trajectories per core
                    jobs.append(((wl, nodes, counts[0], small),
                                 dict(workload=wl, nodes=nodes, trajectories=counts[0], memory=False,
                                      session_mb=a.session_mb, scale=small, max_wall=a.max_wall),
                                 {"first": (wl, nodes, counts[0], a.node_scale),
                                  "same_contention_of": n, "of": (wl, nodes, n, a.node_scale)}))
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    runs = {key: kw for key, kw, _ in jobs}  # (each configuration once a pass)
    for rep in range(a.repeats):
        for key, kw in runs.items():
            got = run_one(**{**kw, "memory": kw["memory"] and rep == 0})  # (memory: not timed)
            got["repeats"] = a.repeats
            _say(got, rep + 1, a.repeats)
            best[key] = got if key not in best else _faster(best[key], got)
    rows = []
    counted: dict[tuple[Any, ...], dict[str, Any]] = {}  # key -> the row of a count itself
    for key, _, rel in jobs:
        row = dict(best[key])
        first = best[rel["first"]]
        row["sim_actions_ratio_to_first"] = row["sim_actions_per_s"] / first["sim_actions_per_s"]
        if "of" not in rel:
            counted[key] = row
        for mark in ("same_load_of", "spread_of", "same_contention_of"):
            if mark in rel:  # (a peer: its count's row came before it)
                row[mark] = rel[mark]
                of = counted[rel["of"]]
                of["sim_actions_ratio_to_" + mark[:-3]] = of["sim_actions_per_s"] / row["sim_actions_per_s"]
        rows.append(row)
    if a.json:
        print(json.dumps({"core": FORM, "rows": rows}, indent=1))
        return 0
    head = ("workload", "nodes", "cores", "traj", "actions", "sim s", "sim act/s", "sim act/CPU s", "sim own s",
            "core dec/s", "p50 us", "p99 us", "KB/traj", "act/s vs first", "vs same load", "vs spread",
            "vs same contention")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        print(" | ".join(str(x) for x in (
            r["workload"], r["nodes"], f"{r['node_cpu']:g}", r["trajectories"],
            f"{r['actions']} (cut)" if r.get("cut_at_s") is not None else r["actions"], f"{r['sim_wall_s']:.1f}",
            f"{r['sim_actions_per_s']:,.0f}", f"{r['sim_actions_per_cpu_s']:,.0f}", f"{r['sim_own_s']:.1f}",
            f"{r['core_decisions_per_s']:,.0f}",
            f"{r['core_p50_us']:.0f}", f"{r['core_p99_us']:.0f}",
            f"{r.get('core_kb_per_trajectory', float('nan')):.1f}", f"{r['sim_actions_ratio_to_first']:.2f}",
            f"{r['sim_actions_ratio_to_same_load']:.2f}" if "sim_actions_ratio_to_same_load" in r
            else "(same load)" if "same_load_of" in r else "-",
            f"{r['sim_actions_ratio_to_spread']:.2f}" if "sim_actions_ratio_to_spread" in r
            else "(spread)" if "spread_of" in r else "-",
            f"{r['sim_actions_ratio_to_same_contention']:.2f}" if "sim_actions_ratio_to_same_contention" in r
            else "(same contention)" if "same_contention_of" in r else "-")))
    return 0


def _faster(kept: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two runs of one configuration: the faster simulate's figures and the faster core
    replay's (they are taken apart: each is its own best), the first run's memory."""
    out = dict(kept if kept["sim_actions_per_s"] >= new["sim_actions_per_s"] else new)
    core = kept if kept["core_decisions_per_s"] >= new["core_decisions_per_s"] else new
    out.update({k: v for k, v in core.items() if k.startswith("core_") and k != "core_kb_per_trajectory"})
    if "core_kb_per_trajectory" in kept:
        out["core_kb_per_trajectory"] = kept["core_kb_per_trajectory"]
    return out


def _say(row: dict[str, Any], rep: int, repeats: int) -> None:
    cut = "" if row.get("cut_at_s") is None else f" (cut at {row['cut_at_s']:.0f} s)"
    print(f"[{rep}/{repeats}] {row['workload']} {row['nodes']} nodes x {row['node_cpu']:g} cores, "
          f"{row['trajectories']} trajectories: "
          f"{row['actions']} actions{cut}, simulate {row['sim_actions_per_s']:,.0f} actions/s, core alone "
          f"{row['core_decisions_per_s']:,.0f} decisions/s, p50 {row['core_p50_us']:.0f} us, "
          f"p99 {row['core_p99_us']:.0f} us", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
