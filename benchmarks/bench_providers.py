"""A burst of search calls against a rate-limited provider on loopback (issue 37's acceptance).

The provider (`managers/api/testing.py`) is a real HTTP server that admits ``--rate`` requests/s
with a burst of ``--server-burst`` and ``--concurrency`` at once, and answers 429 without
headers past either; each answer takes ``--latency`` s. ``--calls`` distinct queries arrive
at once from ``--trajectories`` trajectories. Modes:

- ``tangram``: the service's path: `ProviderFront` -> the core (token bucket at the provider's
  rate, burst ``--burst``, slots = its concurrency, SRPT order) -> `ApiManager` (httpx).
- ``semaphore``: verl's search tool / ASearcher: one asyncio.Semaphore per process, sized to the
  provider's concurrency (the strongest honest size), no pacing; a 429 goes back to the caller
  (verl does not retry it).
- ``semaphore-retry``: the same, retrying a 429 with jittered exponential backoff until it
  succeeds (SkyRL's Brave tool retries a 429 forever).
- ``static-split``: each trajectory owns rate/T requests/s (a token bucket of burst 1, the
  slices' first tokens interleaved j/rate apart) and one slot for its life: the best static
  split of the limits.

Prints, per mode: calls answered, 429s that reached callers, 429s the provider sent,
throughput (answers over the time from the first send to the last answer), average ACT
(finish - submit), and beside them the bound: each call's earliest finish under the provider's
own limits (the k-th call starts no earlier than max((k - burst + 1) / rate, floor(k / c) x L)),
averaged.

    .venv/bin/python benchmarks/bench_providers.py                 # 2,000 calls, 50/s, 16
    .venv/bin/python benchmarks/bench_providers.py --calls 500 --modes tangram,semaphore
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from arl_tangram.core import commands as C
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.managers.api import parse_providers
from arl_tangram.managers.api.testing import ProviderServer
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.executor import Emit, Executor
from arl_tangram.runtime.providers import ProviderFront, attach_api, scheduler_providers

MODES = ("tangram", "semaphore", "semaphore-retry", "static-split")


class _IdleNode(Executor):
    async def start(self, emit: Emit) -> list[NodeSpec]:
        return [NodeSpec("n0", Resources(cpu=1, memory_mb=1024))]

    async def submit(self, commands: Sequence[C.Command]) -> None:
        pass

    def node_info(self) -> dict[str, dict[str, Any]]:
        return {}

    async def aclose(self) -> None:
        pass


def bound(n: int, rate: float, burst: float, conc: int, latency: float) -> float:
    return statistics.fmean(max(max(0.0, (k - burst + 1) / rate), (k // conc) * latency) + latency
                            for k in range(n))


async def run_tangram(a: argparse.Namespace, url: str) -> list[tuple[float, float, bool, bool]]:
    cfgs = parse_providers([{"name": "p", "kind": "search", "base_url": url, "cache_ttl_s": 0,
                             "limits": {"rate_per_s": a.rate, "burst": a.burst,
                                        "concurrency": a.concurrency, "max_attempts": 50}}], env={})
    engine = Engine(_IdleNode(), EngineConfig(core=CoreConfig(**scheduler_providers(cfgs))))
    await engine.start()
    api = attach_api(engine, cfgs)
    front = ProviderFront(engine, api)

    async def one(i: int) -> tuple[float, float, bool, bool]:
        t0 = time.monotonic()
        r = await front.call("search", "p", {"query": f"q{i}"}, trajectory=f"t{i % a.trajectories}",
                             timeout_s=600)
        return t0, time.monotonic(), r.status is Status.SUCCEEDED, "429" in r.reason

    try:
        return list(await asyncio.gather(*(one(i) for i in range(a.calls))))
    finally:
        await engine.aclose()
        await api.aclose()


async def run_baseline(a: argparse.Namespace, url: str, mode: str) -> list[tuple[float, float, bool, bool]]:
    limits = httpx.Limits(max_connections=a.concurrency * 4, max_keepalive_connections=a.concurrency * 4)
    async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:
        sem = asyncio.Semaphore(a.concurrency)
        T = a.trajectories
        slots = [asyncio.Lock() for _ in range(T)]
        t_start = time.monotonic()  # static split: each trajectory's bucket (burst 1), the
        next_free = [t_start + j / a.rate for j in range(T)]  # slices' first tokens interleaved

        async def post(i: int) -> int:
            r = await client.post(f"{url}/search", json={"q": f"q{i}"})
            return r.status_code

        async def one(i: int) -> tuple[float, float, bool, bool]:
            t0 = time.monotonic()
            if mode == "static-split":
                j = i % T
                async with slots[j]:
                    while True:
                        now = time.monotonic()
                        start = max(now, next_free[j])
                        next_free[j] = start + T / a.rate
                        await asyncio.sleep(start - now)
                        code = await post(i)
                        if code != 429:
                            break
                return t0, time.monotonic(), code == 200, False
            tries = 0
            while True:
                async with sem:
                    code = await post(i)
                if code != 429 or mode == "semaphore":
                    return t0, time.monotonic(), code == 200, code == 429
                tries += 1
                await asyncio.sleep(random.uniform(0, min(8.0, 0.25 * 2 ** tries)))

        return list(await asyncio.gather(*(one(i) for i in range(a.calls))))


async def main_async(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    b = bound(a.calls, a.rate, a.server_burst, a.concurrency, a.latency)
    for mode in a.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (modes: {', '.join(MODES)})")
        async with ProviderServer(rate=a.rate, burst=a.server_burst, concurrency=a.concurrency,
                                  latency_s=a.latency) as srv:
            t0 = time.monotonic()
            got = await (run_tangram(a, srv.url) if mode == "tangram" else run_baseline(a, srv.url, mode))
            first = min(x[0] for x in got)
            last = max(srv.answer_times) if srv.answer_times else time.monotonic()
            ok = sum(1 for x in got if x[2])
            rows.append({
                "mode": mode, "calls": a.calls, "answered": ok,
                "429s_to_callers": sum(1 for x in got if x[3]), "provider_429s": srv.rejected,
                "provider_requests": srv.requests,
                "throughput_per_s": round(srv.answered / max(1e-9, last - first), 2),
                "act_avg_s": round(statistics.fmean(x[1] - x[0] for x in got), 3),
                "bound_act_avg_s": round(b, 3), "wall_s": round(time.monotonic() - t0, 1),
                "max_in_flight": srv.max_in_flight,
            })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rate", type=float, default=50.0, help="the provider's requests/s")
    p.add_argument("--server-burst", type=float, default=50.0, help="the provider's burst")
    p.add_argument("--burst", type=float, default=10.0, help="tangram's bucket burst")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--latency", type=float, default=0.2, help="seconds per answer")
    p.add_argument("--trajectories", type=int, default=100)
    p.add_argument("--modes", default=",".join(MODES))
    a = p.parse_args(argv)
    rows = asyncio.run(main_async(a))
    print(f"{'mode':<16} {'answered':>8} {'429->caller':>11} {'429 sent':>8} {'req/s':>7} "
          f"{'ACT avg':>8} {'bound':>7}")
    for r in rows:
        print(f"{r['mode']:<16} {r['answered']:>8} {r['429s_to_callers']:>11} {r['provider_429s']:>8} "
              f"{r['throughput_per_s']:>7} {r['act_avg_s']:>8} {r['bound_act_avg_s']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
