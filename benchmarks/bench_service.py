"""Load test of `/run_code`: ARL-Tangram vs a naive one-subprocess-per-request server.

Both servers run in their own processes on this machine; the same client drives each in turn:
``--concurrency`` connections for ``--duration`` seconds, then ``--sequential`` one-at-a-time
requests. The load generator is `wrk` (C, Debian package ``wrk``) when it is installed: an
asyncio + httpx client spends ~8 ms of CPU per request, which on 2 cores starves the servers it
measures; without wrk the httpx client is used (``--client httpx`` forces it). Every response
body is checked for ``"status":"Success"``; anything else counts as an error. The naive baseline is what SandboxFusion's default mode does: a
FastAPI route that calls ``subprocess.run([python, -c, code])`` per request, no isolation.
Figures are measured, never asserted; on a shared 2-core machine they are noisy.

Besides wall-clock figures it prints CPU time per request (from /proc, so it holds up better
on a busy machine): the server process itself (all its threads), the processes below it
(zygote and sandboxes: the sandbox side) and the load generator. The sequential latency is
measured twice: with wrk at one connection (a C client, ~0.03 ms of its own) and with httpx
(a Python client that adds ~0.5 ms). ``--manager-alone`` runs the CPU manager in this process,
no HTTP and no engine, to split the server's CPU into the manager's share and the rest.
It also prints how idle the machine was during the load (/proc/stat) and, from a short extra
load while /v1/stats is sampled, how many actions the scheduler had admitted on average
against the node's CPU capacity (each /run_code action asks for 1 core). ``--config FILE`` passes
a `tangram serve --config` file to the ARL-Tangram server (e.g. another node capacity).

    python benchmarks/bench_service.py --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

TRIVIAL = {"code": "print(1)", "language": "python"}


def naive_app():  # pragma: no cover - runs in the baseline server process
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/run_code")
    def run_code(body: dict) -> dict:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", body["code"]], capture_output=True, text=True,
                           timeout=float(body.get("run_timeout", 10)))
        return {"status": "Success" if p.returncode == 0 else "Failed", "message": "",
                "compile_result": None, "executor_pod_name": None, "files": {},
                "run_result": {"status": "Finished", "execution_time": time.perf_counter() - t0,
                               "return_code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}}

    @app.get("/v1/ping")
    def ping() -> str:
        return "pong"

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_times(pid: int) -> tuple[int, list[float]]:
    """(ppid, [utime, stime, cutime, cstime] in seconds) of one process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    rest = raw[raw.rindex(")") + 2:].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(rest[1]), [int(x) / hz for x in rest[11:15]]


def tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds of ``root`` itself (all threads) and of everything below it: each living
    descendant's own and reaped children's time, plus ``root``'s reaped children."""
    ppid: dict[int, int] = {}
    times: dict[int, list[float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid[int(d)], times[int(d)] = _proc_times(int(d))
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
    kids: dict[int, list[int]] = {}
    for p, pp in ppid.items():
        kids.setdefault(pp, []).append(p)
    own = times.get(root, [0.0] * 4)
    below, stack = own[2] + own[3], list(kids.get(root, ()))
    while stack:
        p = stack.pop()
        below += sum(times[p])
        stack.extend(kids.get(p, ()))
    return own[0] + own[1], below


class CpuMeter:
    """CPU per request between `start` and `stop`: server, sandbox side, client (children)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def start(self) -> None:
        self.t0 = (tree_cpu(self.pid), _children_cpu())

    def stop(self, requests: int) -> dict[str, float]:
        (s0, b0), c0 = self.t0
        (s1, b1), c1 = tree_cpu(self.pid), _children_cpu()
        n = max(requests, 1)
        return {"server_ms": 1000 * (s1 - s0) / n, "sandbox_ms": 1000 * (b1 - b0) / n,
                "client_ms": 1000 * (c1 - c0) / n}


def machine_busy() -> tuple[int, int]:
    """(idle + iowait, all) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def gate_probe(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """The scheduler's admission under load: ``seconds`` of wrk load while /v1/cluster and
    /v1/stats are sampled every 50 ms (not metered: the sampling costs the server some CPU).
    ``used_cpu`` is the mean CPU the core has handed out (1 core per /run_code action, from
    its StartAction until it has seen the ActionFinished); when it sits at the node's capacity,
    admission is the stage everything waits on, and each action holds its core for its whole
    round trip (dispatch, waiting for a sandbox, the sandbox's run, reply, result)."""
    import threading

    done = threading.Event()
    got: list[dict[str, Any]] = []

    def drive() -> None:
        try:
            load_wrk(url, concurrency, seconds, warm=False)
        finally:
            done.set()

    t = threading.Thread(target=drive)
    t.start()
    with httpx.Client(base_url=url, timeout=10) as c:
        time.sleep(min(1.0, seconds / 3))
        while not done.wait(0.05):
            node = c.get("/v1/cluster").json()["nodes"][0]
            got.append({"used": node["used"].get("cpu", 0.0),
                        "queued": c.get("/v1/stats").json()["queue_length"]})
        cap = c.get("/v1/cluster").json()["nodes"][0]["capacity"].get("cpu", 0.0)
    t.join()
    n = max(len(got), 1)
    return {"used_cpu": sum(g["used"] for g in got) / n,
            "queued": sum(g["queued"] for g in got) / n, "capacity_cpu": cap}


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start(kind: str, port: int, config: str | None = None) -> subprocess.Popen:
    if kind == "tangram":
        cmd = [sys.executable, "-m", "arl_tangram.cli.main", "serve", "--no-models",
               "--port", str(port), "--log-level", "warning"]
        if config:
            cmd += ["--config", config]
    else:
        cmd = [sys.executable, __file__, "--serve-naive", str(port)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/v1/ping", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not come up")


async def load(url: str, concurrency: int, duration: float) -> dict:
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    r = await c.post("/run_code", json=TRIVIAL)
                    ok = r.status_code == 200 and r.json()["status"] == "Success"
                except httpx.HTTPError:
                    ok = False
                lat.append(time.perf_counter() - t0)
                errors += not ok

        for _ in range(3):  # warm up
            await c.post("/run_code", json=TRIVIAL)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"requests": len(lat), "errors": errors, "rps": len(lat) / wall,
            "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)]}


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '@BODY@'
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0 end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"status":"Success"', 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format('{"requests": %d, "errors": %d, "secs": %f, "p50_ms": %f, "p99_ms": %f}\\n',
    summary.requests, b + e.connect + e.read + e.write + e.timeout, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
""".replace("@BODY@", json.dumps(TRIVIAL))


def load_wrk(url: str, concurrency: int, duration: float, *, warm: bool = True) -> dict:
    """Closed-loop load with wrk: ``concurrency`` connections (on 2 threads when more than 1)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT)
    try:
        if warm:
            subprocess.run(["wrk", "-t1", "-c1", "-d1s", "-s", f.name, f"{url}/run_code"],
                           capture_output=True, check=True)
        threads = 2 if concurrency > 1 else 1
        out = subprocess.run(["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{duration:g}s",
                              "--timeout", "60s", "-s", f.name, f"{url}/run_code"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    r = json.loads(out.strip().splitlines()[-1])
    r["rps"] = r["requests"] / r.pop("secs")
    return r


def sequential(url: str, n: int) -> float:
    lat = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            c.post("/run_code", json=TRIVIAL).raise_for_status()
            lat.append(time.perf_counter() - t0)
    return 1000 * statistics.median(lat)


def bench(kind: str, args: argparse.Namespace) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(kind, port, args.config)
    meter = CpuMeter(proc.pid)
    try:
        wait_up(url, proc)
        if args.client == "wrk":
            load_wrk(url, 1, 1.0, warm=False)  # warm up (not metered)
            meter.start()
            idle0 = machine_busy()
            out = load_wrk(url, args.concurrency, args.duration, warm=False)
        else:
            meter.start()
            idle0 = machine_busy()
            out = asyncio.run(load(url, args.concurrency, args.duration))
        out["cpu"] = meter.stop(out["requests"])
        idle1 = machine_busy()
        out["idle_pct"] = 100 * (idle1[0] - idle0[0]) / max(1, idle1[1] - idle0[1])
        if kind == "tangram" and args.client == "wrk" and args.gate_probe > 0:
            out["gate"] = gate_probe(url, args.concurrency, args.gate_probe)
        if args.client == "wrk":
            meter.start()
            one = load_wrk(url, 1, args.seq_duration, warm=False)
            out["seq_cpu"] = meter.stop(one["requests"])
            out["seq_wrk_p50_ms"], out["seq_wrk_p99_ms"] = one["p50_ms"], one["p99_ms"]
        out["seq_p50_ms"] = sequential(url, args.sequential)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load per server")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=200, help="sequential requests for p50")
    ap.add_argument("--only", choices=["tangram", "naive"], help="run one server only")
    ap.add_argument("--client", choices=["wrk", "httpx"],
                    default="wrk" if shutil.which("wrk") else "httpx",
                    help="load generator (default: wrk when installed)")
    ap.add_argument("--seq-duration", type=float, default=5.0,
                    help="seconds of one-connection wrk load for the sequential latency")
    ap.add_argument("--gate-probe", type=float, default=4.0, metavar="SECONDS",
                    help="seconds of extra load sampling /v1/stats for the admission figure "
                         "(0: skip)")
    ap.add_argument("--manager-alone", type=int, default=300, metavar="N",
                    help="actions for the in-process CPU manager figure (0: skip)")
    ap.add_argument("--config", help="`tangram serve --config` file for the ARL-Tangram server")
    ap.add_argument("--serve-naive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--manager-only", type=int, metavar="N", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.manager_only:
        print(json.dumps(asyncio.run(_manager_only(args.manager_only, args.concurrency))))
        return 0
    if args.serve_naive:
        import uvicorn

        uvicorn.run(naive_app(), host="127.0.0.1", port=args.serve_naive, log_level="warning",
                    access_log=False)
        return 0
    print(f"/run_code print(1): {args.concurrency} clients ({args.client}) x {args.duration:g} s, "
          f"then sequential ({args.seq_duration:g} s of wrk -c1, {args.sequential} httpx); "
          f"cores: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.2f}; "
          f"HTTP stack: {_http_stack()}")
    print(f"{'server':<10}{'requests':>10}{'errors':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'seq p50 ms':>12}{'(httpx)':>9}  CPU ms/request: server + sandbox side (client)")
    for kind in [args.only] if args.only else ["tangram", "naive"]:
        r = bench(kind, args)
        c = r["cpu"]
        seq = f"{r['seq_wrk_p50_ms']:>12.2f}" if "seq_wrk_p50_ms" in r else f"{'-':>12}"
        print(f"{kind:<10}{r['requests']:>10}{r['errors']:>8}{r['rps']:>9.1f}{r['p50_ms']:>9.1f}"
              f"{r['p99_ms']:>9.1f}{seq}{r['seq_p50_ms']:>9.2f}  load {c['server_ms']:.2f} + "
              f"{c['sandbox_ms']:.2f} ({c['client_ms']:.2f})", end="")
        if "seq_cpu" in r:
            q = r["seq_cpu"]
            print(f"; sequential {q['server_ms']:.2f} + {q['sandbox_ms']:.2f}", end="")
        print(flush=True)
        line = f"  {kind}: machine idle during the load {r['idle_pct']:.1f}%"
        if "gate" in r:
            g = r["gate"]
            line += (f"; admission: {g['used_cpu']:.2f} of {g['capacity_cpu']:g} cpu handed out "
                     f"on average (1 per action), {g['queued']:.1f} actions queued")
        print(line, flush=True)
    if args.manager_alone and args.only != "naive":
        m = json.loads(subprocess.run([sys.executable, __file__, "--manager-only",
                                       str(args.manager_alone)], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1])
        print(f"CPU manager alone (in-process CpuManager.run, no HTTP, no engine), CPU ms/action: "
              f"sequential {m['seq']['server_ms']:.2f} + {m['seq']['sandbox_ms']:.2f}, "
              f"{args.concurrency} concurrent {m['conc']['server_ms']:.2f} + "
              f"{m['conc']['sandbox_ms']:.2f} (in-process + sandbox side)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


def _http_stack() -> str:
    """What `tangram serve` runs on: uvloop and httptools when they import (else asyncio and h11),
    through `arl_tangram.api.transport` (head and body of a response in one write)."""
    import importlib

    def has(name: str) -> bool:
        try:
            importlib.import_module(name)
        except ImportError:
            return False
        return True

    return (f"{'uvloop' if has('uvloop') else 'asyncio'} + "
            f"{'httptools' if has('httptools') else 'h11'}, one write per response")


async def _manager_only(n: int, concurrency: int) -> dict:
    """CPU per action of the CPU manager alone, driven directly (in this process)."""
    from arl_tangram.api.schemas import RunCodeRequest
    from arl_tangram.api.translate import run_code_action
    from arl_tangram.managers.cpu import CpuManager

    mgr = CpuManager()
    await mgr.start()
    meter = CpuMeter(os.getpid())
    try:
        async def one() -> None:
            a = run_code_action(RunCodeRequest(**TRIVIAL).request())
            r = await mgr.run(a, a.demand)
            if r.status != "Success":
                raise RuntimeError(f"manager failed: {r}")

        for _ in range(20):
            await one()
        out = {}
        meter.start()
        for _ in range(n):
            await one()
        out["seq"] = meter.stop(n)
        sem = asyncio.Semaphore(concurrency)

        async def limited() -> None:
            async with sem:
                await one()

        meter.start()
        await asyncio.gather(*(limited() for _ in range(n)))
        out["conc"] = meter.stop(n)
        return out
    finally:
        await mgr.aclose()


if __name__ == "__main__":
    sys.exit(main())
