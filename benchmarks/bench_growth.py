"""Benchmark of elastic growth (issue 22, item 1): does a resize reach the code?

An elastic action (min 1, max 2 cores) runs the replay's work program (all of it parallel, two
workers where the code is shown two cores) from a one-core allotment. ``grown``: resized to two
cores 50 ms after its sandbox registered; prints the workers it forked and the cores its sandbox
used from the resize to its end (cgroup CPU time / wall time). ``narrow``: never resized, next
to a rigid one-core action (one worker) doing the same work: what showing the maximum costs an
action that is not grown. Each line ends with the cores the rest of the machine took meanwhile
(from /proc/stat): a run beside other work measures that work too. Needs root.

What a resize costs (issue 39, item 1): ``resize`` lines, per kind (``python``: the work program,
two workers; ``tests``: an elastic TEST action whose two cases each burn half the work, run side
by side by the case runner), for a grow (1 -> 2 cores) and a shrink (2 -> 1 core) 0.3 s into the
run. ``delay``: from the resize call to the start of the first span after it in which the
sandbox's cgroup burned at the new width (>= 90 % of the rate the baseline below, started at two
cores, had over the same part of its run, at most 1.8 cores, for a grow; <= 110 % of the one-core
baseline's, at least 1.1 cores, for a shrink: the width as this machine gave it then, other work
included), sampled every ~5 ms, over spans of 20 ms and of 100 ms (the CFS period: within
one, a one-core quota lets two workers burst at two cores for 50 ms, so only the 100 ms figure
cannot be met before the quota changes). ``lost``: the resized action's CPU seconds minus those
of the same action started at its final width and never resized (run next to it, alternating);
``wall``: its wall time against that one's. Medians of ``--runs``; each line ends with the
cores the rest of the machine took (the median of the runs).
Run: ``.venv/bin/python benchmarks/bench_growth.py [--runs 3] [--units 40000]
[--resize-units 8000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import NamedTuple

from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.replay.calibrate import rate_from, span_start
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


RESIZE_AT_S = 0.3  # the resize comes this long after the action's sandbox registered
SAMPLE_S = 0.005  # the cgroup's CPU time is read this often after the resize
WATCH_S = 1.0  # ... for this long


reach_delay = span_start  # (the same span rule `tangram calibrate` measures resize_delay_s by)


class Cost(NamedTuple):
    """One resized run and its baseline (the same action started at the final width)."""
    delay20: float | None
    delay100: float | None
    cpu: float
    wall: float
    base_cpu: float
    base_wall: float
    rest: float
    base_rate: float | None  # cores the baseline used over the watched part of its run


def median_or_none(xs: Sequence[float | None]) -> float | None:
    """Median of the figures that exist; None if none does."""
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def _ms(x: float | None) -> str:
    return "never" if x is None else f"{1000 * x:.0f} ms"


def cost_line(kind: str, grow: bool, costs: Sequence[Cost]) -> str:
    """The printed line for one kind and direction: medians of ``costs``."""
    cpu = statistics.median(c.cpu for c in costs)
    base_cpu = statistics.median(c.base_cpu for c in costs)
    lost = statistics.median(c.cpu - c.base_cpu for c in costs)
    wall = statistics.median(c.wall for c in costs)
    base_wall = statistics.median(c.base_wall for c in costs)
    ratio = statistics.median(c.wall / c.base_wall for c in costs)
    rest = statistics.median(c.rest for c in costs)
    rate = median_or_none([c.base_rate for c in costs])
    at = "?" if rate is None else f"{rate:.2f}"
    what = "grow   1->2" if grow else "shrink 2->1"
    return (f"resize {kind:6} {what}: delay {_ms(median_or_none([c.delay20 for c in costs]))}"
            f" (20 ms spans), {_ms(median_or_none([c.delay100 for c in costs]))} (100 ms spans) to"
            f" the width's {at} cores;"
            f" {cpu:.2f} cpu-s vs {base_cpu:.2f} started at {2 if grow else 1}: lost {lost:+.2f}"
            f" cpu-s; wall {wall:.2f} s vs {base_wall:.2f} s = x{ratio:.2f}"
            f" (rest {rest:.2f}, n={len(costs)})")


def resize_work(aid: str, kind: str, units: int) -> ActionSpec:
    """An elastic (1..2 cores) action of ``units`` units, all of it parallel: the work program
    with two workers (``python``), or a TEST action of two cases of half the units each."""
    if kind == "python":
        return ActionSpec(id=aid, demand=ONE, elasticity=Elasticity(1, 2),
                          payload={"code": program(units, 1.0, 2), "run_timeout": 300})
    cases = [{"stdin": "", "expected_stdout": None}] * 2
    return ActionSpec(id=aid, kind=ActionKind.TEST, demand=ONE, elasticity=Elasticity(1, 2),
                      payload={"code": program(units // 2), "cases": cases, "run_timeout": 300})


async def _timed(m: CpuManager, a: ActionSpec, start: Resources,
                 then: Resources | None) -> tuple[float, float, list[tuple[float, float]]]:
    """Run ``a`` at ``start`` (resized to ``then``, if any, RESIZE_AT_S after it registered):
    its CPU seconds, its wall time, and (seconds since the resize call or the time it would
    have come, cgroup CPU seconds) samples."""
    t0 = time.monotonic()
    task = asyncio.create_task(m.run(a, start))
    samples: list[tuple[float, float]] = []
    while a.id not in m._running and not task.done():
        await asyncio.sleep(0.002)
    sb = m._running.get(a.id)
    if sb is not None and sb.slot is not None:
        slot = sb.slot
        t1 = time.monotonic() + RESIZE_AT_S
        while time.monotonic() < t1:  # samples before the resize too (negative times)
            samples.append((time.monotonic() - t1, slot.cpu_seconds()))
            await asyncio.sleep(SAMPLE_S)
        tr = time.monotonic()  # times from the resize call, its own latency included
        if then is not None:
            outcome = await m.resize(a.id, then)
            assert outcome == "applied", outcome
        while not task.done() and time.monotonic() - tr < WATCH_S:
            try:
                samples.append((time.monotonic() - tr, slot.cpu_seconds()))
            except OSError:
                break
            await asyncio.sleep(SAMPLE_S)
    r = await task
    wall = time.monotonic() - t0
    assert r.run_result is not None or r.cases, r
    if r.cases is not None:
        assert all(c.passed for c in r.cases), r
    return r.cpu_time or 0.0, wall, samples


def steady_rate(samples: Sequence[tuple[float, float]]) -> float | None:
    """Cores used from time 0 to the last sample; None without two samples there."""
    return rate_from(samples, 0.0)


def delay_target(grow: bool, rate: float | None) -> float:
    """The rate a resized action must reach (grow: at least; shrink: at most) to be at its new
    width: 90 % of what the baseline at that width used (``rate``), at most 90 % of two cores;
    for a shrink 110 %, at least 110 % of one core. No baseline rate: the width's own."""
    if grow:
        return 0.9 * min(2.0, rate if rate is not None else 2.0)
    return 1.1 * max(1.0, rate if rate is not None else 1.0)


async def resize_cost(m: CpuManager, aid: str, kind: str, units: int, grow: bool) -> Cost:
    """One resized run (grow: 1 -> 2 cores; else 2 -> 1), then the same action started at the
    final width. The delay's target: 90 % (grow) or 110 % (shrink) of the rate the one started
    at the final width had over the same part of its run (what this machine gave that width
    then), and never beyond 90 % of two cores or below 110 % of one."""
    start, final = (ONE, TWO) if grow else (TWO, ONE)
    m0, t0 = machine_busy_s(), time.monotonic()
    cpu, wall, samples = await _timed(m, resize_work(f"{aid}r", kind, units), start, final)
    base_cpu, base_wall, base = await _timed(m, resize_work(f"{aid}b", kind, units), final, None)
    rest = (machine_busy_s() - m0 - cpu - base_cpu) / (time.monotonic() - t0)
    rate = steady_rate(base)
    target = delay_target(grow, rate)
    return Cost(reach_delay(samples, target, 0.02, grow), reach_delay(samples, target, 0.1, grow),
                cpu, wall, base_cpu, base_wall, rest, rate)


async def main(runs: int, units: int, resize_units: int) -> None:
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-growth-")))
    await m.start()
    try:
        for i in range(runs):
            print(await grown(m, f"g{i}", units), flush=True)
        for i in range(runs):
            print(await narrow(m, f"n{i}", units), flush=True)
        for kind in ("python", "tests"):
            costs: dict[bool, list[Cost]] = {True: [], False: []}
            for i in range(runs):  # grow and shrink alternate, each beside its baseline
                for grow in (True, False):
                    costs[grow].append(await resize_cost(m, f"r{kind[0]}{i}{int(grow)}", kind,
                                                         resize_units, grow))
            for grow in (True, False):
                print(cost_line(kind, grow, costs[grow]), flush=True)
    finally:
        await m.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--units", type=int, default=40_000, help="work program units per action")
    ap.add_argument("--resize-units", type=int, default=8_000,
                    help="work program units per action of the resize lines")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.units, args.resize_units))
