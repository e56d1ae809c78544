"""The kernel's wake-up latency beside busy loops (issue 41: is a tenant's hand-over slow
because a woken process waits behind another tenant's loop?). A sleeper sleeps 1 ms, 600
times, and records how late it wakes, beside no loop, two busy loops at a normal weight, and
two at ``SCHED_IDLE``; rounds alternate the modes. Run as any user; nothing else running.

    .venv/bin/python benchmarks/bench_wakeup.py [--rounds 3] [--sleeps 600]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def late(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        time.sleep(0.001)
        out.append(time.perf_counter() - t - 0.001)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleeps", type=int, default=600)
    args = ap.parse_args()
    for r in range(args.rounds):
        for mode in ("none", "normal", "sched_idle"):
            loops = (
                []
                if mode == "none"
                else [
                    subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)
                ]
            )
            try:
                for p in loops:
                    if mode == "sched_idle":
                        os.sched_setscheduler(p.pid, os.SCHED_IDLE, os.sched_param(0))
                time.sleep(0.3)
                d = late(args.sleeps)
                n = len(d)
                print(
                    f"round {r + 1} {mode:>10}: late by p50 {d[n // 2] * 1e3:.3f} ms, "
                    f"p90 {d[int(n * 0.9)] * 1e3:.3f}, p99 {d[int(n * 0.99)] * 1e3:.3f}, "
                    f"mean {sum(d) / n * 1e3:.3f}",
                    flush=True,
                )
            finally:
                for p in loops:
                    p.kill()
                    p.wait()


if __name__ == "__main__":
    main()
