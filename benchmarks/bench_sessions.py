"""A crowded node for real (issue 40, items 2 and 3): many concurrent sessions on one node.

Opens ``--sessions`` sessions (``--image-fraction`` of them in a small image made of this
machine's programs, `imagekit.host_rootfs`, each over a writable layer of ``--layer-mb`` MiB) on
one CPU manager hosted by a real `NodeHost` (whose memory reporter reads every session every
0.5 s, as in service), holds them open and idle (frozen between actions), runs ``--bursts``
bursts of ``--burst`` actions (5% of the sessions) in random sessions (each appends a line to a
file of its session and counts the lines: the count checks the session's state), then closes
everything. Prints:

- open latency p50/p99 at 0, 500 and 1,000 open (the ``--window`` opens from each mark; the
  last mark's are opened past the crowd and closed again);
- memory per idle session: PSS (``/proc/<pid>/smaps_rollup``) of each session's processes
  (its cgroup's ``cgroup.procs``), mean and p50/p99 by kind;
- action latency p50/p99 under the crowd, and failed actions;
- CPU (per cent of one core, ``/proc/<pid>/stat`` utime+stime over ``--idle-s``) of the
  fork server, the reaper and the manager's own process (the manager, the node host's
  reporters, the event loop: everything in this process) while every session idles;
- ``uptime``'s load beside each figure (this machine is shared).

``--frozen-memory-refresh 0`` reads every session at every memory report (the behaviour before
issue 40's item 3) to measure the difference. Loopback only; everything it opens it closes.
Needs root. Run: ``.venv/bin/python benchmarks/bench_sessions.py`` (1,000 sessions: minutes;
``--quick``: 100 sessions, seconds). Through the engine at 1,000, its admission wants smaller
caps than its defaults admit on 24 GiB: ``--engine --memory-mb 64 --floor-mb 8``
(docs/measurements/crowded-node.md). SIGTERM or ^C closes what it opened before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host import overlay
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.node import NodeHost

_ids = itertools.count()
TICK = os.sysconf("SC_CLK_TCK")


def load() -> str:
    with open("/proc/loadavg") as f:
        return "load " + " ".join(f.read().split()[:3])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (this process, all its threads)


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sh(sid: str, code: str) -> ActionSpec:
    return ActionSpec(id=f"s{next(_ids)}", kind=ActionKind.TOOL, session=sid,
                      payload={"code": code, "language": "bash"})


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--image-fraction", type=float, default=0.5)
    ap.add_argument("--layer-mb", type=int, default=8)
    ap.add_argument("--memory-mb", type=int, default=256, help="each session's cap")
    ap.add_argument("--concurrency", type=int, default=4, help="opens in flight at once")
    ap.add_argument("--window", type=int, default=20, help="opens timed at each mark")
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--burst", type=int, default=None,
                    help="actions per burst, all at once (default: 5%% of the sessions)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="CPU measured over this window")
    ap.add_argument("--frozen-memory-refresh", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="gives up past this")
    ap.add_argument("--engine", action="store_true",
                    help="through a real engine (core + local executor + node host): the "
                         "core's admission by measured memory decides where and whether each "
                         "session opens, and the manager's CPU includes the core's")
    ap.add_argument("--floor-mb", type=float, default=None,
                    help="--engine: the core's session_memory_floor_mb (default: its default)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run: 100 sessions, 10 timed at each mark, 5 s idle")
    a = ap.parse_args()
    if a.quick:
        a.sessions, a.window, a.idle_s = 100, 10, 5.0
    if a.burst is None:
        a.burst = max(1, a.sessions // 20)
    if os.geteuid() != 0:
        print("needs root (namespaces, cgroups)", file=sys.stderr)
        return 2
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = tempfile.mkdtemp(prefix="tangram-bench-sessions-", dir="/var/tmp")
    uid = 62000 + os.getpid() % 1000
    cpu = dict(work_root=root, sandbox_uid=uid, sandbox_gid=uid, warm_min=2, warm_max=8,
               images_dir=os.path.join(root, "images"), layers_dir=os.path.join(root, "layers"),
               image_layer_mb=a.layer_mb, layers_warm=0,
               layer_budget_mb=a.layer_mb * (a.sessions + a.window + 8),
               sandbox_id_base=(1 << 28) + (os.getpid() % 1000) * 8192, sandbox_id_count=8192,
               frozen_memory_refresh=a.frozen_memory_refresh)
    crowd: Crowd = ViaEngine(a, cpu) if a.engine else Direct(cpu)
    print(f"# {a.sessions} sessions, {a.image_fraction:.0%} in an image (layer {a.layer_mb} MiB),"
          f" cap {a.memory_mb} MB each; frozen_memory_refresh={a.frozen_memory_refresh}; "
          f"{'through the engine' if a.engine else 'on the manager and its node host'}; "
          f"{os.cpu_count()} cores; {load()}", flush=True)
    opened: dict[str, str] = {}  # sid -> kind
    # SIGTERM and SIGINT cancel the run: every session it opened is closed all the same
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await asyncio.wait_for(run(a, crowd, opened, root), a.timeout_s)
    except asyncio.CancelledError:
        print("interrupted: closing what was opened", flush=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        t = time.perf_counter()
        for sid in list(opened):
            await crowd.close(sid)
        await asyncio.sleep(0.5)  # (the fork server reaps what ended)
        fork = getattr(getattr(crowd, "mgr", None), "fork", None)
        if fork is not None:  # must stay 0: a fork server that died (4563a05's RecursionError)
            print(f"fork server deaths during the run: {fork.deaths}", flush=True)
        await crowd.aclose()
        shutil.rmtree(root, ignore_errors=True)
        print(f"closed {len(opened)} sessions and the manager in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    return 0


class Crowd:
    """The sessions' node: the manager under its node host, or a whole engine."""

    mgr: CpuManager
    reports = 0  # memory reports the node host sent

    async def start(self) -> None:
        raise NotImplementedError

    async def import_image(self, path: str, name: str) -> None:
        raise NotImplementedError

    async def open(self, sid: str, demand: Resources, image: str | None, layer_mb: int | None
                   ) -> None:
        raise NotImplementedError

    async def act(self, sid: str, code: str, demand: Resources) -> tuple[bool, str, str]:
        raise NotImplementedError

    async def close(self, sid: str) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class Direct(Crowd):
    def __init__(self, cpu: dict[str, Any]) -> None:
        self.mgr = CpuManager(CpuManagerConfig(**cpu))

        def emit(ev: Any) -> None:
            if type(ev).__name__ == "MemoryReport":
                self.reports += 1

        self.node = NodeHost("crowd", emit=emit, cpu_manager=self.mgr)

    async def start(self) -> None:
        await self.node.start()

    async def import_image(self, path: str, name: str) -> None:
        assert self.mgr.images is not None
        await asyncio.to_thread(self.mgr.images.import_path, path, name)

    async def open(self, sid: str, demand: Resources, image: str | None, layer_mb: int | None
                   ) -> None:
        await self.mgr.open_session(sid, demand, ttl_s=3600.0, image=image, layer_mb=layer_mb)

    async def act(self, sid: str, code: str, demand: Resources) -> tuple[bool, str, str]:
        r = await self.mgr.run(sh(sid, code), demand)
        return (r.status == "Success", r.run_result.stdout if r.run_result else "",
                r.message)

    async def close(self, sid: str) -> None:
        await self.mgr.close_session(sid)

    async def aclose(self) -> None:
        await self.node.aclose()
        await self.mgr.aclose()


class ViaEngine(Crowd):
    def __init__(self, a: argparse.Namespace, cpu: dict[str, Any]) -> None:
        from arl_tangram.runtime.build import build_engine
        from arl_tangram.runtime.config import NodeConfig, ServiceConfig

        sched = {} if a.floor_mb is None else {"session_memory_floor_mb": a.floor_mb}
        self.eng = build_engine(ServiceConfig(nodes=(NodeConfig(name="crowd", cpu=CpuManagerConfig(**cpu),
                                                                gpu=None),), scheduler=sched))

    async def start(self) -> None:
        await self.eng.start()
        self.host = self.eng._executor.hosts["crowd"]  # type: ignore[attr-defined]
        self.mgr = self.host.cpu

    async def import_image(self, path: str, name: str) -> None:
        await self.host.images.import_(path, name)

    async def open(self, sid: str, demand: Resources, image: str | None, layer_mb: int | None
                   ) -> None:
        # memory only: the core holds a session's demand on its node for its whole life (CPU
        # is an action's), charged by measured use once reported (docs/core.md)
        await self.eng.open_session(sid, demand=Resources(memory_mb=demand.get("memory_mb")),
                                    ttl_s=3600.0, image=image, layer_mb=layer_mb)
        t = time.monotonic()
        # placed by the core, then opened by the node (its sandbox in the image)
        while not self.mgr.has_session(sid) or sid in self.host.sessions.opening:
            why = self.eng.session_gone(sid)
            if why is not None or not self.eng.has_session(sid):
                raise RuntimeError(why or "closed")
            if time.monotonic() - t > 30.0:
                raise TimeoutError("not open after 30 s (the core found no room for it)")
            await asyncio.sleep(0.002)

    async def act(self, sid: str, code: str, demand: Resources) -> tuple[bool, str, str]:
        res = await self.eng.run(sh(sid, code))
        out = res.output
        stdout = (out.run_result.stdout if getattr(out, "run_result", None) else
                  (out or {}).get("run_result", {}).get("stdout", "") if isinstance(out, dict)
                  else "")
        return res.status.name == "SUCCEEDED", stdout, res.reason

    async def close(self, sid: str) -> None:
        await self.eng.close_session(sid)

    async def aclose(self) -> None:
        await self.eng.aclose()

    @property
    def reports(self) -> int:  # type: ignore[override]
        core = self.eng.core
        mem = getattr(core, "memory", None)
        return int(getattr(mem, "reports", 0))


async def run(a: argparse.Namespace, crowd: Crowd, opened: dict[str, str], root: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    await crowd.start()
    mgr = crowd.mgr
    rootfs = imagekit.host_rootfs(os.path.join(root, "mini-rootfs"))
    img = f"bench-mini-{os.getpid()}"
    await crowd.import_image(rootfs, img)
    print(f"# isolation: image_layer={mgr._report.get('image_layer')}", flush=True)
    n_img = round(a.sessions * a.image_fraction)
    f = n_img / max(1, a.sessions)  # spread evenly: the image ones among the plain ones
    kinds = ["image" if int((i + 1) * f) > int(i * f) else "plain" for i in range(a.sessions)]
    demand = Resources(cpu=1, memory_mb=a.memory_mb)
    lat: list[tuple[int, float, str]] = []  # (open before it, seconds, kind)
    failed: list[str] = []
    sem = asyncio.Semaphore(a.concurrency)

    async def open_one(sid: str, kind: str) -> None:
        async with sem:
            before = len(opened)
            t = time.perf_counter()
            try:
                await crowd.open(sid, demand, img if kind == "image" else None,
                                 a.layer_mb if kind == "image" else None)
            except Exception as e:
                failed.append(f"{sid}: {type(e).__name__}: {e}")
                return
            lat.append((before, time.perf_counter() - t, kind))
            opened[sid] = kind

    t0 = time.perf_counter()
    marks = {0, a.sessions // 2}
    i = 0
    while i < a.sessions:
        # timed windows open one at a time (no queueing behind the semaphore in the figure)
        if any(m <= i < m + a.window for m in marks):
            await open_one(f"c{i}", kinds[i])
            i += 1
            continue
        j = min(a.sessions, min([m for m in marks if m > i] or [a.sessions]))
        await asyncio.gather(*(open_one(f"c{k}", kinds[k]) for k in range(i, j)))
        if j // 100 != i // 100 or j == a.sessions:
            print(f"  {len(opened)} open, {len(failed)} failed, {time.perf_counter() - t0:.0f} s,"
                  f" {load()}", flush=True)
        i = j
        if failed and len(failed) > 20:
            break
    for k in range(a.window):  # at the full crowd: opened and closed again
        await open_one(f"x{k}", "image" if k % 2 == 0 else "plain")
    for k in range(a.window):
        if f"x{k}" in opened:
            await crowd.close(f"x{k}")
            del opened[f"x{k}"]
    print(f"opened {len(opened)} of {a.sessions} in {time.perf_counter() - t0:.0f} s, "
          f"{len(failed)} failed{': ' + failed[0] if failed else ''} ({load()})")
    for m in [*sorted(marks), a.sessions]:
        xs = [s for b, s, _ in lat if m <= b < m + a.window] if m < a.sessions else \
            [s for b, s, _ in lat if b >= a.sessions]
        by = {k: [s for b, s, kk in lat if kk == k and (m <= b < m + a.window if m < a.sessions
                                                         else b >= a.sessions)]
              for k in ("plain", "image")}
        print(f"open at {m:5d} open: p50 {pct(xs, .5):6.1f} ms  p99 {pct(xs, .99):6.1f} ms "
              f"(plain p50 {pct(by['plain'], .5):.1f}, image p50 {pct(by['image'], .5):.1f};"
              f" n={len(xs)})")

    # memory per idle session (PSS of its processes), every session frozen
    await asyncio.sleep(1.0)
    per: dict[str, list[int]] = {"plain": [], "image": []}
    for sid, kind in opened.items():
        s = mgr.sessions.by_id.get(sid)
        if s is None:
            continue
        pids = overlay.slot_pids(s.sandbox.slot) or [s.sandbox.pid]
        per[kind].append(sum(pss_kb(p) for p in pids))
    allk = per["plain"] + per["image"]
    print(f"PSS per idle session: mean {sum(allk) / max(1, len(allk)) / 1024:.2f} MiB, "
          + ", ".join(f"{k} mean {sum(v) / max(1, len(v)) / 1024:.2f} p50 "
                      f"{pct([x / 1e3 for x in v], .5) / 1024:.2f} p99 "
                      f"{pct([x / 1e3 for x in v], .99) / 1024:.2f} MiB (n={len(v)})"
                      for k, v in per.items() if v) + f" ({load()})")
    print(f"  all sessions together: {sum(allk) / 1024 / 1024:.2f} GiB PSS; this process holds "
          f"{len(os.listdir('/proc/self/fd'))} fds (RLIMIT_NOFILE raised to {hard})", flush=True)

    # idle CPU: the fork server, the reaper, this process (manager + node host + loop)
    procs = {"manager (this process)": os.getpid()}
    if mgr.fork.zygote is not None:
        procs["fork server"] = mgr.fork.zygote.proc.pid
    if mgr.fork.watchdog is not None:
        procs["reaper"] = mgr.fork.watchdog.proc.pid
    table, reads = mgr.sessions, [0]
    sample = table.memory_use

    def counted() -> tuple[dict[str, tuple[int, int]], int]:  # (no poll of its counter)
        out = sample()
        reads[0] += table.memory_reads
        return out

    table.memory_use = counted  # type: ignore[method-assign]
    ticks0 = {who: cpu_ticks(p) for who, p in procs.items()}
    r0 = crowd.reports
    t = time.perf_counter()
    await asyncio.sleep(a.idle_s)
    dt = time.perf_counter() - t
    ticks1 = {who: cpu_ticks(p) for who, p in procs.items()}
    table.memory_use = sample  # type: ignore[method-assign]
    print(f"idle CPU over {dt:.0f} s with {len(opened)} idle sessions "
          f"({crowd.reports - r0} memory reports, {reads[0]} session cgroup reads; {load()}):")
    for who in procs:
        print(f"  {who:24s} {100 * (ticks1[who] - ticks0[who]) / TICK / dt:5.1f} % of a core")

    # bursts of actions in random sessions: each appends a line to its file and counts them
    rng = random.Random(40)
    sids = sorted(opened)
    lines: dict[str, int] = {}
    alat: list[float] = []
    bad: list[str] = []

    async def act(sid: str) -> None:
        t = time.perf_counter()
        ok, out, msg = await crowd.act(sid, "echo x >> bench-state; wc -l < bench-state",
                                       Resources(cpu=1, memory_mb=a.memory_mb))
        alat.append(time.perf_counter() - t)
        lines[sid] = lines.get(sid, 0) + 1
        if not ok or out.strip() != str(lines[sid]):
            bad.append(f"{sid}: {msg!r} {out!r} (want {lines[sid]})")

    for b in range(a.bursts):
        pick = rng.sample(sids, min(a.burst, len(sids)))
        t = time.perf_counter()
        await asyncio.gather(*(act(s) for s in pick))
        print(f"  burst {b + 1}: {len(pick)} actions at once in {time.perf_counter() - t:.2f} s"
              f" ({load()})", flush=True)
        await asyncio.sleep(2.0)
    print(f"actions under the crowd: p50 {pct(alat, .5):.1f} ms  p99 {pct(alat, .99):.1f} ms, "
          f"{len(bad)} failed of {len(alat)}{': ' + bad[0] if bad else ''} ({load()})",
          flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
