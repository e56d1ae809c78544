"""Load test of `/run_code`: ARL-Tangram vs a naive one-subprocess-per-request server.

Both servers run in their own processes on this machine; the same client drives each in turn:
``--concurrency`` connections for ``--duration`` seconds, then ``--sequential`` one-at-a-time
requests. The load generator is `wrk` (C, Debian package ``wrk``) when it is installed: an
asyncio + httpx client spends ~8 ms of CPU per request, which on 2 cores starves the servers it
measures; without wrk the httpx client is used (``--client httpx`` forces it). Every response
body is checked for ``"status":"Success"``; anything else counts as an error. The naive baseline is what SandboxFusion's default mode does: a
FastAPI route that calls ``subprocess.run([python, -c, code])`` per request, no isolation.
Figures are measured, never asserted; on a shared 2-core machine they are noisy.

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


def start(kind: str, port: int) -> subprocess.Popen:
    if kind == "tangram":
        cmd = [sys.executable, "-m", "arl_tangram.cli.main", "serve", "--no-models",
               "--port", str(port), "--log-level", "warning"]
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


def load_wrk(url: str, concurrency: int, duration: float) -> dict:
    """Closed-loop load with wrk: ``concurrency`` connections on 2 threads."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT)
    try:
        subprocess.run(["wrk", "-t1", "-c1", "-d1s", "-s", f.name, f"{url}/run_code"],
                       capture_output=True, check=True)  # warm up
        out = subprocess.run(["wrk", "-t2", f"-c{concurrency}", f"-d{duration:g}s",
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
    proc = start(kind, port)
    try:
        wait_up(url, proc)
        if args.client == "wrk":
            out = load_wrk(url, args.concurrency, args.duration)
        else:
            out = asyncio.run(load(url, args.concurrency, args.duration))
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
    ap.add_argument("--serve-naive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_naive:
        import uvicorn

        uvicorn.run(naive_app(), host="127.0.0.1", port=args.serve_naive, log_level="warning",
                    access_log=False)
        return 0
    print(f"/run_code print(1): {args.concurrency} clients ({args.client}) x {args.duration:g} s, "
          f"then {args.sequential} sequential; cores: {len(os.sched_getaffinity(0))}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'server':<10}{'requests':>10}{'errors':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'seq p50 ms':>12}")
    for kind in [args.only] if args.only else ["tangram", "naive"]:
        r = bench(kind, args)
        print(f"{kind:<10}{r['requests']:>10}{r['errors']:>8}{r['rps']:>9.1f}{r['p50_ms']:>9.1f}"
              f"{r['p99_ms']:>9.1f}{r['seq_p50_ms']:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
