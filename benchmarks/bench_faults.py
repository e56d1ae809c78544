"""Fault recovery of a real `tangram serve`: its sandbox fork server killed (SIGKILL) under load,
or (``--case model-worker``) a reward-model instance's worker stopped mid-batch.

N clients (default 8; the issue's acceptance runs 32) post `/run_code` continuously on their own
keep-alive connections. After ``--warmup`` seconds the fork server (`tangram-zygote`, a child
of the CPU manager's reaper, itself the service's child) is killed with SIGKILL; `GET /v1/health` is polled every 10 ms. The
run goes on for ``--after`` seconds past the moment the node is ready again. Printed:

- in-flight failures: requests submitted before the node was ready again that did not succeed
  (those running in the killed fork server's sandboxes, and any that could not wait);
- seconds until ready: from the kill to the first `GET /v1/health` 200 after it;
- failures after recovery: requests submitted after that moment that did not succeed (0 wanted);
- whether the old fork server is left a zombie, and the restarts `/v1/cluster` counts.

    .venv/bin/python benchmarks/bench_faults.py                # 8 clients
    .venv/bin/python benchmarks/bench_faults.py --clients 32   # the acceptance figure
    .venv/bin/python benchmarks/bench_faults.py --sessions 32  # + 32 sessions' state kept

``--sessions N`` (fork-server case): N sessions are opened first, each holding a Python and a
bash variable; after recovery each one's state is read back, and "sessions lost" counts those
that did not come back as set (issue 41: 0 wanted; the run fails otherwise).

``--case model-worker``: the service (this script, ``--serve-models``, in a child process: the
engine and `create_app` under uvicorn, as `tangram serve` runs them) serves a tiny reward model
built from a config (`build_tiny_models`) on one CPU-backed device, so ONE instance, whose model
lives in a process of its own (a child of the service's model fork server); N clients post one
reward action each (``POST /v1/actions``, ``wait``) continuously. After ``--warmup`` seconds the
fault (``--fault``): ``segv`` (default) or ``kill``: this script sends SIGSEGV / SIGKILL (an OOM
kill) to the instance's process, found from outside in /proc (the fork server's child);
``hang``: the model's next forward holds (its forward hook takes a file this script writes) past
its 1 s ``forward_timeout_s``, and the service kills it. Printed as above, plus the actions of
the dead batch that were requeued and scored on the replacement (``attempts`` 2), and the death
counted in `/v1/cluster`. Goal: ready again within 2 s of the fault (of the deadline, for hang).

    .venv/bin/python benchmarks/bench_faults.py --case model-worker --clients 32
    .venv/bin/python benchmarks/bench_faults.py --case model-worker --fault hang

``--case session-worker``: every client opens its own session (`POST /v1/sessions`) and runs
bash turns in it (``sleep 0.05; echo ok``, ``wait``) continuously. After ``--warmup`` seconds
every session's bash worker (the `/bin/bash --noprofile --norc` processes among the service's
descendants) is killed with SIGKILL at once. Printed as above: the turns in flight fail saying
the session process ended, the node never stops being ready (the first 200 after the kill), and
every turn after it succeeds on a fresh worker of the same session (its state lost, as said).

    .venv/bin/python benchmarks/bench_faults.py --case session-worker --clients 32

Needs root (real sandboxes). Exit status 1 when a request after recovery failed, the node was not
ready again within 2 s, or the old fork server was left a zombie (or, for a model worker, no
instance's process was found).
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
    """The service's fork server: the nearest of its descendants named for it (a child of the
    CPU manager's reaper since issue 41; its sandboxes, forks of it, lie deeper)."""
    level = [pid]
    while level:
        for c in (kids := [k for p in level for k in children(p)]):
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f, open(f"/proc/{c}/comm", "rb") as g:
                    if b"zygote" in f.read() + g.read():
                        return c
            except OSError:
                pass
        level = kids
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
    ap.add_argument("--case", choices=("fork-server", "model-worker", "session-worker"),
                    default="fork-server",
                    help="what dies: the sandbox fork server (SIGKILL), or a model instance's "
                         "worker mid-batch")
    ap.add_argument("--sessions", type=int, default=0,
                    help="fork-server case: this many sessions opened first, each holding a "
                         "Python and a bash variable; after recovery each one's state is read "
                         "back (issue 41: a session lost fails the run)")
    ap.add_argument("--fault", choices=("segv", "kill", "hang"), default="segv",
                    help="model-worker case: SIGSEGV or SIGKILL to the instance's process, or "
                         "its forward held past its 1 s deadline")
    ap.add_argument("--serve-models", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_models:
        return serve_models(args.serve_models, args.arm)

    proc = None
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (the service's stderr, read at the end)
        "w+", prefix="bench-faults-", suffix=".log", delete=False)
    if args.url:
        port = int(args.url.rsplit(":", 1)[1].strip("/"))
        spid = args.pid
    else:
        port = free_port()
        args.arm = os.path.join(tempfile.mkdtemp(prefix="bench-faults-arm-"), "hang")
        cmd = ([sys.executable, "-m", "arl_tangram.cli.main", "serve", "--no-models", "--port",
                str(port), "--log-level", "warning"] if args.case != "model-worker" else
               [sys.executable, os.path.abspath(__file__), "--serve-models", str(port),
                "--arm", args.arm])
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
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
        if args.case == "model-worker":
            return run_models(args, port, spid, log.name)
        if args.case == "session-worker":
            return run_sessions(args, port, spid)
        return run(args, port, spid, log.name)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def turn(port: int, sid: str, code: str, language: str) -> str:
    """One tool action in session ``sid`` (``wait``): its stdout, or what went wrong."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/v1/actions", json.dumps({
            "kind": "tool", "session": sid, "wait": True,
            "payload": {"code": code, "language": language}}).encode(),
            {"content-type": "application/json"})
        r = c.getresponse()
        got = json.loads(r.read())
    finally:
        c.close()
    res = (got.get("results") or [{}])[0]
    if r.status != 200 or res.get("status") != "succeeded":
        return f"http {r.status} {res.get('status')}: {(res.get('reason') or got.get('detail') or '')[:70]}"
    return str(((res.get("output") or {}).get("run_result") or {}).get("stdout"))


def open_sessions(port: int, n: int) -> list[str]:
    """``n`` sessions, session i holding ``x = i * 7`` (Python) and ``V=v<i>`` (bash)."""
    sids = []
    for i in range(n):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("POST", "/v1/sessions", b"{}", {"content-type": "application/json"})
            r = c.getresponse()
            got = json.loads(r.read())
        finally:
            c.close()
        if r.status != 201:
            raise RuntimeError(f"session {i} not opened: http {r.status} {got}")
        sid = got["session_id"]
        for code, lang in ((f"x = {i} * 7", "python"), (f"export V=v{i}", "bash")):
            out = turn(port, sid, code, lang)
            if out.startswith("http "):
                raise RuntimeError(f"session {i}: {out}")
        sids.append(sid)
    return sids


def sessions_lost(port: int, sids: list[str]) -> list[str]:
    """Each session's state read back: what did not come back as set."""
    lost = []
    for i, sid in enumerate(sids):
        got = (turn(port, sid, "print(x)", "python"), turn(port, sid, "echo $V", "bash"))
        if got != (f"{i * 7}\n", f"v{i}\n"):
            lost.append(f"{sid}: {got}")
    return lost


def run(args: argparse.Namespace, port: int, spid: int, log_path: str) -> int:
    events: list[tuple[float, str]] = []  # (submit time, outcome)
    lock = threading.Lock()
    stop = threading.Event()
    body = json.dumps({"code": args.code, "run_timeout": 10}).encode()
    sids = open_sessions(port, args.sessions)

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
    lost = sessions_lost(port, sids)
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
    if sids:
        print(f"sessions lost                 {len(lost)} of {len(sids)}")
    for k, n in collections.Counter(inflight + failed_after + lost).most_common(5):
        print(f"  {n:6d} x {k}")
    for ln in log_lines[:4]:
        print(f"  log: {ln}")
    ok = not failed_after and ready_s <= 2.0 and not zombie and not lost
    return 0 if ok else 1


# ---- every session's worker killed mid-turn ------------------------------------------------------


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def bash_workers(spid: int) -> list[int]:
    """The service's session bash workers: its descendants running `bash --noprofile --norc`."""
    out = []
    for p in descendants(spid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read() == b"/bin/bash\0--noprofile\0--norc\0":
                    out.append(p)
        except OSError:
            pass
    return out


def run_sessions(args: argparse.Namespace, port: int, spid: int) -> int:
    events: list[tuple[float, str]] = []  # (submit time, outcome)
    lock = threading.Lock()
    stop = threading.Event()
    opened = threading.Barrier(args.clients + 1)

    def post(conn: http.client.HTTPConnection, path: str, body: dict) -> tuple[int, dict]:
        conn.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, {"detail": data[:90].decode("utf-8", "replace")}

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        code, got = post(conn, "/v1/sessions", {})
        opened.wait()
        if code != 201:
            with lock:
                events.append((time.monotonic(), f"session not opened: http {code}"))
            return
        turn = {"kind": "tool", "session": got["session_id"], "wait": True,
                "payload": {"code": "sleep 0.05; echo ok", "language": "bash"}}
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                code, got = post(conn, "/v1/actions", turn)
                res = (got.get("results") or [{}])[0]
                out = ((res.get("output") or {}).get("run_result") or {}).get("stdout")
                k = ("ok" if code == 200 and res.get("status") == "succeeded" and out == "ok\n"
                     else f"http {code} {res.get('status')}: {(res.get('reason') or got.get('detail') or '')[:70]}")
            except Exception as e:  # (every outcome is tallied)
                k = f"{type(e).__name__}: {str(e)[:60]}"
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                time.sleep(0.05)
            with lock:
                events.append((t0, k))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    opened.wait()
    time.sleep(args.warmup)
    victims = bash_workers(spid)
    if not victims:
        stop.set()
        print("no session worker found among the service's descendants", file=sys.stderr)
        return 2
    t_kill = time.monotonic()
    for p in victims:
        os.kill(p, signal.SIGKILL)
    t_ready = None
    down = 0
    while time.monotonic() - t_kill < 30:
        try:
            code = get(port, "/v1/health")[0]
        except OSError:
            code = 0
        if code == 200:
            t_ready = time.monotonic()
            break
        down += 1
        time.sleep(0.01)
    if t_ready is None:
        stop.set()
        print("not ready again within 30 s", file=sys.stderr)
        return 1
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(70)
    during = [k for t0, k in events if t0 < t_kill + 0.001]  # submitted before the kill
    inflight = [k for k in during if k != "ok"]
    after = [k for t0, k in events if t0 >= t_kill + 0.5]  # well after: fresh workers
    failed_after = [k for k in after if k != "ok"]
    between = [k for t0, k in events if t_kill + 0.001 <= t0 < t_kill + 0.5 and k != "ok"]
    _, stats = get(port, "/v1/stats")
    print(f"clients (sessions)            {args.clients}")
    print(f"session workers killed        {len(victims)}")
    print(f"turns submitted before kill   {len(during)} ({during.count('ok')} ok)")
    print(f"in-flight failures            {len(inflight)}")
    print(f"health answers not 200        {down}  (ready {t_ready - t_kill:.3f} s after the kill)")
    print(f"failures in the next 0.5 s    {len(between)}  (turns that reached a killed worker)")
    print(f"turns after                   {len(after)}")
    print(f"failures after                {len(failed_after)}")
    print(f"sessions open at the end      {stats.get('sessions')}")
    for k, n in collections.Counter(inflight + between + failed_after).most_common(5):
        print(f"  {n:6d} x {k}")
    ok = not failed_after and down == 0 and len(inflight) + len(between) <= len(victims)
    return 0 if ok else 1


# ---- a model instance's process killed (or hung) mid-batch -------------------------------------


class HoldWhenArmed:
    """tiny-rm's factory (it runs in the instance's process): a forward that finds the file
    ``arm`` takes it and holds for 120 s (past its deadline: the service kills the process)."""

    def __init__(self, path: str, arm: str) -> None:
        self.path, self.arm = path, arm

    def __call__(self) -> tuple:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        model.register_forward_pre_hook(self._hold)
        return model, AutoTokenizer.from_pretrained(self.path)

    def _hold(self, _m: object, _a: object) -> None:
        try:
            os.unlink(self.arm)
        except FileNotFoundError:
            return
        time.sleep(120)


def serve_models(port: int, arm: str | None) -> int:
    """The service for ``--case model-worker``: tiny-rm on one CPU-backed device, its forward
    deadline 1 s; a forward holds once the file ``arm`` exists."""
    import asyncio
    import dataclasses

    import uvicorn

    from arl_tangram.api.app import create_app
    from arl_tangram.api.transport import http_protocol
    from arl_tangram.managers.gpu import build_tiny_models, tiny_model_specs
    from arl_tangram.managers.gpu.config import GpuManagerConfig
    from arl_tangram.runtime.build import build_engine
    from arl_tangram.runtime.config import NodeConfig, ServiceConfig

    paths = build_tiny_models(tempfile.mkdtemp(prefix="bench-faults-models-"))
    spec = next(s for s in tiny_model_specs(paths) if s.name == "tiny-rm")
    factories = {"tiny-rm": HoldWhenArmed(str(spec.path), arm)} if arm else None
    spec = dataclasses.replace(spec, path=None if arm else spec.path)
    cfg = ServiceConfig(nodes=(NodeConfig(gpu=GpuManagerConfig(device="cpu", cpu_devices=1,
                                                               forward_timeout_s=1.0)),),
                        models=(spec,), port=port)
    eng = build_engine(cfg, gpu_factories=factories)
    app = create_app(eng, cfg, manage_engine=True)

    async def main() -> None:
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False,
                                               http=http_protocol()))
        await server.serve()

    asyncio.run(main())
    return 0


def model_processes(spid: int) -> list[int]:
    """The instances' processes under the service ``spid``: children of its model fork server
    (a child of the service whose command line runs multiprocessing's forkserver)."""
    def cmdline(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    servers = [p for p in children(spid) if "multiprocessing.forkserver" in cmdline(p)]
    return [c for s in servers for c in children(s)]


def _model_deaths(port: int) -> int:
    nodes = get(port, "/v1/cluster")[1].get("nodes", [])
    return sum(int((n.get("gpu_health") or {}).get("model_worker_deaths", 0)) for n in nodes)


def run_models(args: argparse.Namespace, port: int, spid: int, log_path: str) -> int:
    deadline = time.monotonic() + 120  # the instance loaded (prewarm)
    while not [i for i in get(port, "/v1/cluster")[1].get("instances", [])
               if i.get("state") == "ready"]:
        if time.monotonic() > deadline:
            print("no model instance became ready", file=sys.stderr)
            return 2
        time.sleep(0.1)
    events: list[tuple[float, str, int]] = []  # (submit time, outcome, attempts)
    lock = threading.Lock()
    stop = threading.Event()
    seq = iter(range(10**9))

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while not stop.is_set():
            t0 = time.monotonic()
            body = json.dumps({"kind": "reward", "model": "tiny-rm", "wait": True, "wait_s": 60,
                               "payload": {"query": f"What is 2 + {next(seq)}?"}}).encode()
            attempts = 0
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=70)
                conn.request("POST", "/v1/actions", body, {"content-type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status == 200:
                    (res,) = json.loads(data)["results"]
                    attempts = int(res.get("attempts") or 0)
                    k = "ok" if res.get("status") == "succeeded" else \
                        f"{res.get('status')}: {(res.get('reason') or '')[:90]}"
                else:
                    k = f"http {r.status}: {data[:90]!r}"
            except Exception as e:  # (every outcome is tallied)
                k = f"{type(e).__name__}: {str(e)[:60]}"
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
            with lock:
                events.append((t0, k, attempts))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    victims = model_processes(spid)
    t_kill = time.monotonic()
    if args.fault == "hang":
        with open(args.arm, "w"):
            pass
    for pid in victims if args.fault != "hang" else ():
        os.kill(pid, signal.SIGSEGV if args.fault == "segv" else signal.SIGKILL)
    seen_down = died = False
    t_ready = None
    while time.monotonic() - t_kill < 30:
        # (a probe's 503 window may fall between two probes: a 200 asked after the death was
        # counted is after the recovery too)
        died = died or _model_deaths(port) > 0
        try:
            code = get(port, "/v1/health")[0]
        except OSError:
            code = 0
        if code != 200:
            seen_down = True
        elif seen_down or died:
            t_ready = time.monotonic()
            break
        time.sleep(0.005)
    if t_ready is None:
        stop.set()
        print("not ready again within 30 s", file=sys.stderr)
        return 1
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(70)
    _, cluster = get(port, "/v1/cluster")
    health = [n.get("gpu_health", {}) for n in cluster.get("nodes", [])]
    with open(log_path) as f:
        reload_s = [ln.split("ready again ", 1)[1].split(" s", 1)[0] for ln in f
                    if "ready again" in ln]
    with open(log_path) as f:
        log_lines = [ln.rstrip() for ln in f if "died" in ln or "ready again" in ln]
    stopped = len(victims) == 1 and bool(health) and health[0].get("model_worker_deaths") == 1

    before = [k for t0, k, _ in events if t0 < t_kill]
    during = [k for t0, k, _ in events if t_kill <= t0 < t_ready]
    after = [k for t0, k, _ in events if t0 >= t_ready]
    inflight = [k for t0, k, _ in events if t0 < t_ready and k != "ok"]
    requeued = [k for _, k, n in events if n >= 2]
    failed_after = [k for k in after if k != "ok"]
    ready_s = t_ready - t_kill - (1.0 if args.fault == "hang" else 0.0)
    print(f"case                          model-worker, fault {args.fault} "
          f"(tiny-rm, one instance, CPU; its process {victims})")
    print(f"clients                       {args.clients}")
    print(f"requests before the fault     {len(before)} ({before.count('ok')} ok)")
    print(f"requests fault..ready         {len(during)} ({during.count('ok')} ok)")
    print(f"in-flight failures            {len(inflight)}")
    print(f"requeued, scored once after   {len(requeued)} ({requeued.count('ok')} ok)")
    print(f"seconds until ready           {ready_s:.3f}  (after the fault"
          f"{', less the 1 s deadline' if args.fault == 'hang' else ''}; 503 seen: {seen_down}; "
          f"death -> replacement loaded, the service's log: {', '.join(reload_s) or '-'} s)")
    print(f"requests after recovery       {len(after)}")
    print(f"failures after recovery       {len(failed_after)}")
    print(f"model worker health           {json.dumps(health)}")
    for k, n in collections.Counter(inflight + failed_after).most_common(5):
        print(f"  {n:6d} x {k}")
    for ln in log_lines[:4]:
        print(f"  log: {ln[:200]}")
    ok = stopped and not failed_after and ready_s <= 2.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
