"""Benchmark of elastic growth (issue 22, item 1): does a resize reach the code?

An elastic action (min 1, max 2 cores) runs the replay's work program (all of it parallel, two
workers where the code is shown two cores) from a one-core allotment. ``grown``: resized to two
cores 50 ms after its sandbox registered; prints the workers it forked and the cores its sandbox
used from the resize to its end (cgroup CPU time / wall time). ``narrow``: never resized, next
to a rigid one-core action (one worker) doing the same work: what showing the maximum costs an
action that is not grown. Each line ends with the cores the rest of the machine took meanwhile
(from /proc/stat): a run beside other work measures that work too. Needs root.
Run: ``.venv/bin/python benchmarks/bench_growth.py [--runs 3] [--units 40000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from arl_tangram.core.actions import ActionSpec, Elasticity
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.replay.work import program

ONE, TWO = Resources(cpu=1, memory_mb=256), Resources(cpu=2, memory_mb=256)


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy (all processes, and time the hypervisor took)."""
    with open("/proc/stat") as f:
        user, nice, system, _, _, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def work(aid: str, units: int, elastic: bool) -> ActionSpec:
    code = program(units, 1.0, 2 if elastic else 1) + "print(_w)\n"
    return ActionSpec(id=aid, demand=ONE, elasticity=Elasticity(1, 2) if elastic else None,
                      payload={"code": code, "run_timeout": 300})


async def grown(m: CpuManager, aid: str, units: int) -> str:
    a = work(aid, units, elastic=True)
    task = asyncio.create_task(m.run(a, ONE))
    while a.id not in m._running:
        await asyncio.sleep(0.002)
    sb = m._running[a.id]
    assert sb.slot is not None
    await asyncio.sleep(0.05)
    outcome = await m.resize(a.id, TWO)
    t0, c0, m0 = time.monotonic(), sb.slot.cpu_seconds(), machine_busy_s()
    r = await task
    wall, cpu = time.monotonic() - t0, (r.cpu_time or 0.0) - c0
    rest = (machine_busy_s() - m0 - cpu) / wall
    assert r.run_result is not None
    return (f"grown   resize {outcome}, workers {r.run_result.stdout.strip()}: after the resize"
            f" {cpu:.2f} cpu-s in {wall:.2f} s = {cpu / wall:.2f} cores (rest {rest:.2f})")


async def narrow(m: CpuManager, aid: str, units: int) -> str:
    out = []
    t0, m0 = time.monotonic(), machine_busy_s()
    for elastic in (False, True):
        t1 = time.monotonic()
        r = await m.run(work(f"{aid}{'e' if elastic else 'r'}", units, elastic), ONE)
        assert r.run_result is not None
        out.append((r.run_result.stdout.strip(), r.cpu_time or 0.0, time.monotonic() - t1))
    (_, rc, rw), (ew, ec, eww) = out
    rest = (machine_busy_s() - m0 - rc - ec) / (time.monotonic() - t0)
    return (f"narrow  rigid 1 worker {rc:.2f} cpu-s in {rw:.2f} s; elastic {ew} workers at one"
            f" core {ec:.2f} cpu-s in {eww:.2f} s: x{eww / rw:.2f} the wall time (rest {rest:.2f})")


async def main(runs: int, units: int) -> None:
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-growth-")))
    await m.start()
    try:
        for i in range(runs):
            print(await grown(m, f"g{i}", units), flush=True)
        for i in range(runs):
            print(await narrow(m, f"n{i}", units), flush=True)
    finally:
        await m.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--units", type=int, default=40_000, help="work program units per action")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.units))
