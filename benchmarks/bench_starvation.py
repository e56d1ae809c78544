"""No starvation (issue 22, item 4): under a stream of 32 clients sending Python `/run_code`, a
lone action of another language must finish within 1 s plus its own run, and never be shed.

The service runs in its own process (`tangram serve`, as `bench_service.py` starts it). A child
process keeps ``--clients`` connections busy with trivial Python `/run_code` for the whole test
(wrk when installed, as `scripts/bench-deps.sh` installs it; else httpx, which on 2 cores
cannot load the service enough to make it queue: the result then says little); after the stream has run ``--warmup`` seconds (so the
scheduler has a history of Python and none of the probes' languages: the case where ordering by
expected work used to starve them), each probe (bash ``echo hi``; nodejs ``console.log(1)``
where node is installed) is sent ``--probes`` times, one at a time, a second apart. Once the
stream is over, each probe runs alone three times on the same service: its own run, the median.
Printed per probe: its latency under the stream, the excess over its own run, and its status;
the goal is an excess <= 1 s for every probe and no 504.

    .venv/bin/python benchmarks/bench_starvation.py
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
from bench_service import WRK_SCRIPT, free_port, load, start, wait_up

PROBES = {"bash": {"code": "echo hi", "language": "bash"},
          "nodejs": {"code": "console.log(1)", "language": "nodejs"}}


def _httpx_stream(url: str, clients: int) -> None:  # (a child process, terminated at the end)
    asyncio.run(load(url, clients, 3600.0))


def _stream(url: str, clients: int) -> Callable[[], None]:
    """Start the Python stream; returns what stops it. wrk (C, 2 threads) when installed: an
    httpx client on 2 cores spends so much CPU per request that the service never queues."""
    if shutil.which("wrk"):
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
            f.write(WRK_SCRIPT)
        proc = subprocess.Popen(["wrk", "-t2", f"-c{clients}", "-d3600s", "--timeout", "60s",
                                 "-s", f.name, f"{url}/run_code"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def stop_wrk() -> None:
            proc.terminate()
            proc.wait(timeout=30)
            os.unlink(f.name)
        return stop_wrk
    child = mp.get_context("fork").Process(target=_httpx_stream, args=(url, clients))
    child.start()

    def stop_child() -> None:
        child.terminate()
        child.join(timeout=30)
    return stop_child


def _once(c: httpx.Client, body: dict) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    r = c.post("/run_code", json=body, timeout=120)
    dt = time.perf_counter() - t0
    status = r.json().get("status", "?") if r.status_code == 200 else f"HTTP {r.status_code}"
    return dt, r.status_code, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of stream before probing")
    ap.add_argument("--probes", type=int, default=5, help="probes per language")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start("tangram", port)
    try:
        wait_up(url, proc)
        with httpx.Client(base_url=url) as c:
            langs = [k for k in PROBES if k == "bash" or shutil.which("node")]
            stop = _stream(url, args.clients)
            time.sleep(args.warmup)
            got: list[tuple[int, str, float, int, str]] = []
            for i in range(args.probes):  # the first of each: a kind the service never ran
                for k in langs:
                    dt, code, status = _once(c, PROBES[k])
                    got.append((i, k, dt, code, status))
                    time.sleep(1.0)
            stats = c.get("/v1/stats").json()
            stop()
            time.sleep(2.0)  # (the stream's last requests drain)
            # each probe's own run: alone on the same service once the stream is over
            alone = {k: statistics.median(_once(c, PROBES[k])[0] for _ in range(3)) for k in langs}
        for k in langs:
            print(f"{k} alone: {1000 * alone[k]:.1f} ms", flush=True)
        worst, shed = 0.0, 0
        for i, k, dt, code, status in got:
            excess = dt - alone[k]
            worst = max(worst, excess)
            shed += code == 504
            print(f"probe {i + 1} {k}{' (first of its kind)' if i == 0 else ''}: {1000 * dt:.0f} ms "
                  f"under {args.clients} clients (+{1000 * excess:.0f} ms over alone), {status}")
        print(f"worst excess over its own run: {1000 * worst:.0f} ms; shed: {shed}; goal "
              f"(<= 1000 ms, none shed): {'met' if worst <= 1.0 and not shed else 'NOT met'}")
        print("estimator (scored per kind):", stats.get("estimator"))
        return 0 if worst <= 1.0 and not shed else 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
