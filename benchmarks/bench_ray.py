"""Dispatch cost of the Ray executor: no-op actions through long-lived NodeAgents vs plain Ray.

Measures, in one run on one local multi-node Ray cluster (``ray.cluster_utils.Cluster``):
  1. throughput: N no-op actions through `RayExecutor` (batched actor calls to one NodeAgent per
     node, results streamed back by long-poll) vs N plain Ray tasks (one ``@ray.remote`` task
     per action, submitted at once, awaited together);
  2. latency: one action at a time, round trip through `RayExecutor` vs `LocalExecutor` (same
     no-op host in this process) vs one plain Ray task.

The host is the in-package `EchoHost` (an action finishes as soon as it starts), so the figures
are the transport's, not a sandbox's. Figures are noisy on a small shared machine.

    .venv/bin/python benchmarks/bench_ray.py [--actions 5000] [--nodes 2] [--latency 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # all nodes on 127.0.0.1

from ray.cluster_utils import Cluster

import ray
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.commands import StartAction
from arl_tangram.core.events import ActionFinished, Event
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.executor import Executor
from arl_tangram.runtime.local import LocalExecutor
from arl_tangram.runtime.ray_agent import AgentSetup, EchoHost
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

MB = 2**20


@ray.remote
def noop_task(i: int) -> int:
    return i


class Waiter:
    """``emit`` that counts ActionFinished events and wakes whoever waits for a count."""

    def __init__(self) -> None:
        self.done = 0
        self._target = 0
        self._fut: asyncio.Future[None] | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, ActionFinished):
            self.done += 1
            if self._fut is not None and self.done >= self._target and not self._fut.done():
                self._fut.set_result(None)

    async def until(self, target: int) -> None:
        if self.done >= target:
            return
        self._target, self._fut = target, asyncio.get_running_loop().create_future()
        await self._fut


def commands(prefix: str, n: int, nodes: list[str]) -> list[StartAction]:
    one = Resources(cpu=1)
    return [StartAction(ActionSpec(f"{prefix}{i}"), nodes[i % len(nodes)], one) for i in range(n)]


async def executor_throughput(ex: Executor, w: Waiter, nodes: list[str], n: int, burst: int) -> float:
    cmds = commands("t", n, nodes)
    base = w.done
    t0 = time.perf_counter()
    for i in range(0, n, burst):
        await ex.submit(cmds[i:i + burst])
        await asyncio.sleep(0)  # the engine submits once per turn of its loop
    await w.until(base + n)
    return n / (time.perf_counter() - t0)


async def ray_tasks_throughput(n: int) -> float:
    t0 = time.perf_counter()
    refs = [noop_task.remote(i) for i in range(n)]
    await asyncio.gather(*refs)
    return n / (time.perf_counter() - t0)


async def executor_latency(ex: Executor, w: Waiter, node: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        base = w.done
        t0 = time.perf_counter()
        await ex.submit([StartAction(ActionSpec(f"l{i}-{id(ex)}"), node, Resources(cpu=1))])
        await w.until(base + 1)
        out.append(time.perf_counter() - t0)
    return out


async def ray_task_latency(n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await noop_task.remote(i)
        out.append(time.perf_counter() - t0)
    return out


def ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": 1e3 * statistics.median(xs), "p90_ms": 1e3 * xs[int(0.9 * (len(xs) - 1))],
            "mean_ms": 1e3 * statistics.fmean(xs)}


async def run(args: argparse.Namespace) -> dict[str, object]:
    ray_ex = RayExecutor(RayExecutorConfig(poll_wait_s=1.0), host_factory=EchoHost)
    rw = Waiter()
    nodes = [s.name for s in await ray_ex.start(rw)]
    local_host = EchoHost(AgentSetup(name="local", ray_node_id="-"), lambda e: None)
    local_ex = LocalExecutor(hosts=[local_host])  # type: ignore[list-item]
    lw = Waiter()
    local_host._emit = lw  # the host reports to the local executor's emit
    await local_ex.start(lw)
    try:
        await executor_throughput(ray_ex, rw, nodes, 500, args.burst)  # warm up agents
        await ray_tasks_throughput(200)  # warm up Ray's worker pool
        ex_rates, task_rates = [], []
        for _ in range(args.rounds):
            ex_rates.append(await executor_throughput(ray_ex, rw, nodes, args.actions, args.burst))
            task_rates.append(await ray_tasks_throughput(args.actions))
        lat_ray = await executor_latency(ray_ex, rw, nodes[-1], args.latency)
        lat_local = await executor_latency(local_ex, lw, "local", args.latency)
        lat_task = await ray_task_latency(args.latency)
    finally:
        await ray_ex.aclose()
        await local_ex.aclose()
    ex_best, task_best = max(ex_rates), max(task_rates)
    return {
        "nodes": len(nodes), "actions": args.actions, "burst": args.burst, "rounds": args.rounds,
        "ray_executor_actions_per_s": ex_rates, "ray_tasks_per_s": task_rates,
        "throughput_ratio_best": ex_best / task_best,
        "throughput_ratio_median": statistics.median(ex_rates) / statistics.median(task_rates),
        "latency_ray_executor": ms(lat_ray), "latency_local_executor": ms(lat_local),
        "latency_ray_task": ms(lat_task),
        "added_latency_vs_local_p50_ms": 1e3 * (statistics.median(lat_ray) - statistics.median(lat_local)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actions", type=int, default=5000, help="actions per throughput round")
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds (each: executor, then tasks)")
    ap.add_argument("--burst", type=int, default=256, help="commands per executor.submit call")
    ap.add_argument("--nodes", type=int, default=2, help="Ray nodes (head included)")
    ap.add_argument("--latency", type=int, default=200, help="sequential actions for latency")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 * MB})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=2, object_store_memory=100 * MB)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        out = asyncio.run(run(args))
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"nodes={out['nodes']} actions/round={out['actions']} burst={out['burst']} (machine: {os.cpu_count()} cores, shared)")
    print("throughput, actions/s (per round):")
    print("  ray executor  ", " ".join(f"{x:8.0f}" for x in out["ray_executor_actions_per_s"]))
    print("  plain ray task", " ".join(f"{x:8.0f}" for x in out["ray_tasks_per_s"]))
    print(f"  ratio best {out['throughput_ratio_best']:.2f}x, median {out['throughput_ratio_median']:.2f}x (goal >= 3x)")
    print("latency of one action alone (p50 / p90 ms):")
    for key in ("latency_ray_executor", "latency_local_executor", "latency_ray_task"):
        d = out[key]
        print(f"  {key[8:]:15s} {d['p50_ms']:7.3f} / {d['p90_ms']:7.3f}")
    print(f"  added by Ray vs local (p50): {out['added_latency_vs_local_p50_ms']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
