"""Fault recovery of a real `tangram serve`: its sandbox fork server killed (SIGKILL) under load.

N clients (default 8; the issue's acceptance runs 32) post `/run_code` continuously on their own
keep-alive connections. After ``--warmup`` seconds the fork server (`tangram-zygote`, the
service's child process) is killed with SIGKILL; `GET /v1/health` is polled every 10 ms. The
run goes on for ``--after`` seconds past the moment the node is ready again. Printed:

- in-flight failures: requests submitted before the node was ready again that did not succeed
  (those running in the killed fork server's sandboxes, and any that could not wait);
- seconds until ready: from the kill to the first `GET /v1/health` 200 after it;
- failures after recovery: requests submitted after that moment that did not succeed (0 wanted);
- whether the old fork server is left a zombie, and the restarts `/v1/cluster` counts.

    .venv/bin/python benchmarks/bench_faults.py                # 8 clients
    .venv/bin/python benchmarks/bench_faults.py --clients 32   # the acceptance figure

Needs root (real sandboxes). Exit status 1 when a request after recovery failed, the node was not
ready again within 2 s, or the old fork server was left a zombie.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def fork_server_of(pid: int) -> int | None:
    for c in children(pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f, open(f"/proc/{c}/comm", "rb") as g:
                if b"zygote" in f.read() + g.read():
                    return c
        except OSError:
            pass
    return None


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except OSError:
        return None


def get(port: int, path: str) -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {}
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the kill")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of load after recovery")
    ap.add_argument("--code", default="import time; time.sleep(0.05); print(1)")
    ap.add_argument("--url", help="an already running service (its fork server must be a child "
                                  "of --pid); default: start `tangram serve --no-models`")
    ap.add_argument("--pid", type=int, help="with --url: the service's pid")
    args = ap.parse_args()

    proc = None
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (the service's stderr, read at the end)
        "w+", prefix="bench-faults-", suffix=".log", delete=False)
    if args.url:
        port = int(args.url.rsplit(":", 1)[1].strip("/"))
        spid = args.pid
    else:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "arl_tangram.cli.main", "serve",
                                 "--no-models", "--port", str(port), "--log-level", "warning"],
                                stdout=subprocess.DEVNULL, stderr=log)
        spid = proc.pid
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if get(port, "/v1/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                log.seek(0)
                print("service did not come up:\n" + log.read(), file=sys.stderr)
                return 2
            time.sleep(0.2)
        assert spid is not None, "--pid is needed with --url"
        return run(args, port, spid, log.name)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run(args: argparse.Namespace, port: int, spid: int, log_path: str) -> int:
    events: list[tuple[float, str]] = []  # (submit time, outcome)
    lock = threading.Lock()
    stop = threading.Event()
    body = json.dumps({"code": args.code, "run_timeout": 10}).encode()

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("POST", "/run_code", body, {"content-type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status == 200:
                    d = json.loads(data)
                    k = "ok" if d.get("status") == "Success" else \
                        f"{d.get('status')}: {(d.get('message') or '')[:90]}"
                else:
                    k = f"http {r.status}: {data[:90]!r}"
            except Exception as e:  # (every outcome is tallied)
                k = f"{type(e).__name__}: {str(e)[:60]}"
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
            with lock:
                events.append((t0, k))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    zpid = fork_server_of(spid)
    if zpid is None:
        stop.set()
        print("no fork server found among the service's children", file=sys.stderr)
        return 2
    t_kill = time.monotonic()
    os.kill(zpid, signal.SIGKILL)
    seen_down = False
    t_ready = None
    while time.monotonic() - t_kill < 30:
        try:
            code = get(port, "/v1/health")[0]
        except OSError:
            code = 0
        if code != 200:
            seen_down = True
        elif seen_down or time.monotonic() - t_kill > 0.5:
            t_ready = time.monotonic()
            break
        time.sleep(0.01)
    if t_ready is None:
        stop.set()
        print("not ready again within 30 s", file=sys.stderr)
        return 1
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(70)
    zombie = state(zpid) == "Z"
    _, cluster = get(port, "/v1/cluster")
    health = [n.get("cpu_health", {}) for n in cluster.get("nodes", [])]

    before = [k for t0, k in events if t0 < t_kill]
    during = [k for t0, k in events if t_kill <= t0 < t_ready]
    after = [k for t0, k in events if t0 >= t_ready]
    inflight = [k for t0, k in events if t0 < t_ready and k != "ok"]
    failed_after = [k for k in after if k != "ok"]
    ready_s = t_ready - t_kill
    with open(log_path) as f:
        log_lines = [ln.rstrip() for ln in f if "fork server" in ln]
    print(f"clients                       {args.clients}")
    print(f"requests before the kill      {len(before)} ({before.count('ok')} ok)")
    print(f"requests kill..ready          {len(during)} ({during.count('ok')} ok)")
    print(f"in-flight failures            {len(inflight)}")
    print(f"seconds until ready           {ready_s:.3f}  (503 seen: {seen_down})")
    print(f"requests after recovery       {len(after)}")
    print(f"failures after recovery       {len(failed_after)}")
    print(f"old fork server a zombie      {zombie}")
    print(f"fork server health            {json.dumps(health)}")
    for k, n in collections.Counter(inflight + failed_after).most_common(5):
        print(f"  {n:6d} x {k}")
    for ln in log_lines[:4]:
        print(f"  log: {ln}")
    ok = not failed_after and ready_s <= 2.0 and not zombie
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
