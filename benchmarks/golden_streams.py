"""Golden command streams: a guard for behaviour-preserving (speed) work on the scheduler core.

Hashes the whole event -> commands stream (``repr`` of each event and of the commands the core
returns for it) of seeded, deterministic runs:

- every built-in workload under every policy, simulated (``<workload> <policy>``);
- one bigger tool-math step under tangram (``tool-math-big tangram``);
- ``--cycles`` steady-state cycles of `bench_core.py` per policy (``bench_core <policy>``).

A change that must not alter scheduling decisions (or any command a core emits) must leave every
hash unchanged. Record before the change, check after it:

    .venv/bin/python benchmarks/golden_streams.py --record /tmp/golden.txt
    .venv/bin/python benchmarks/golden_streams.py --check /tmp/golden.txt   # exit 1 on a difference

Each line is ``<case> <hash> [<events> <mean action time>]``; ``--only SUBSTR`` runs the cases
whose name contains SUBSTR (a check then compares only those). Takes ~15 s of CPU in full.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_core, next to this file

from arl_tangram.core import Core
from arl_tangram.sim.runner import make_core, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import WORKLOADS, get_workload

POLICIES = ("tangram", "fifo", "task-isolated", "trajectory-bound", "static-pool:4")  # simulated
CORE_POLICIES = ("tangram", "fifo", "task-isolated", "trajectory-bound", "static-pool")  # bench_core


class _Recorder:
    """Wraps a core: hashes every event it handles and the commands it returns."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.hash = hashlib.sha256()
        self.events = 0

    def handle(self, event: Any) -> Any:
        out = self.core.handle(event)
        self.hash.update(repr(event).encode())
        self.hash.update(repr(out).encode())
        self.events += 1
        return out


def simulated(workload: str, policy: str, trajectories: int | None = None,
              steps: int | None = None) -> str:
    """``<hash> <events> <mean action time>`` of one seeded simulated run."""
    w = get_workload(workload)
    n = trajectories or w.trajectories
    cluster = w.cluster(n)
    recs: list[_Recorder] = []

    def factory(*args: Any, **kw: Any) -> _Recorder:
        rec = _Recorder(make_core(*args, **kw))
        recs.append(rec)
        return rec

    rep = run_policy(cluster, lambda: w.batches(0, n, steps), policy, workload=workload,
                     config=SimConfig(train_s=w.train_s), core_factory=factory)
    return f"{recs[0].hash.hexdigest()[:16]} {recs[0].events} {rep.act['avg']}"


def bench_core_stream(policy: str, cycles: int) -> str:
    """Hash of `bench_core.run`'s stream (1,000 nodes, 10,000 pending, ``cycles`` cycles)."""
    import bench_core

    h = hashlib.sha256()
    orig = Core.handle

    def handle(self: Core, event: Any) -> Any:
        out = orig(self, event)
        h.update(repr(event).encode())
        h.update(repr(out).encode())
        return out

    Core.handle = handle  # type: ignore[method-assign]
    try:
        bench_core.run(policy, 1000, 10000, cycles)
    finally:
        Core.handle = orig  # type: ignore[method-assign]
    return h.hexdigest()[:16]


def cases(cycles: int) -> Iterator[tuple[str, Callable[[], str]]]:
    for workload in WORKLOADS:
        for policy in POLICIES:
            yield f"{workload} {policy}", lambda w=workload, p=policy: simulated(w, p)
    yield "tool-math-big tangram", lambda: simulated("tool-math", "tangram", 1024, 1)
    if cycles > 0:
        for policy in CORE_POLICIES:
            yield f"bench_core {policy}", lambda p=policy: bench_core_stream(p, cycles)


def _split(line: str) -> tuple[str, str]:
    """``(case, result)`` of one recorded line (a case name is two words)."""
    words = line.split()
    return " ".join(words[:2]), " ".join(words[2:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--record", metavar="FILE", help="write the hashes to FILE")
    mode.add_argument("--check", metavar="FILE", help="compare with FILE; exit 1 on any difference")
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--cycles", type=int, default=3000, help="bench_core cycles per policy (0: none)")
    args = ap.parse_args(argv)
    want: dict[str, str] = {}
    if args.check:
        with open(args.check) as f:
            want = dict(_split(x) for x in f if x.strip() and not x.startswith("#"))
    t0 = time.process_time()
    lines, bad = [], 0
    for name, fn in cases(args.cycles):
        if args.only not in name:
            continue
        got = fn()
        lines.append(f"{name} {got}")
        verdict = ""
        if args.check:
            if name not in want:
                verdict = "  (not in the record)"
            elif want[name] != got:
                verdict = f"  DIFFERS (recorded {want[name]})"
                bad += 1
            else:
                verdict = "  ok"
        print(f"{name} {got}{verdict}", flush=True)
    if args.record:
        with open(args.record, "w") as f:
            f.write("".join(x + "\n" for x in lines))
    print(f"# {len(lines)} cases, {time.process_time() - t0:.1f}s CPU"
          + (f"; {bad} differ" if args.check else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
