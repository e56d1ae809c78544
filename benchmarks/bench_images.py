"""Environment images (issue 17): what sessions in an image cost on this machine.

``.venv/bin/python benchmarks/bench_images.py [--opens 40] [--actions 200] [--idle 100]``
prints, from one run:
- first import of the test image (the SWE example's OCI layout, examples/swe_image.py; built
  once per machine) into an empty cache, and a second import (layers already there);
- session open from the cached image: p50/p99 of ``CpuManager.open_session(image=...)`` (fresh
  sandbox, writable layer (on the node's disk: `layers.py`; ``--layer-mb``, 256 by default),
  overlay mount, pivot, into the freezer and frozen), and open + the first bash action;
- per session action: thaw + re-quota + freeze p50/p99 (the action's allotment alternates
  between 1 and 0.5 cores, so every action rewrites the quota), and a trivial action's latency;
- ``--idle`` idle sessions held at once (each ran one bash action, so its shell is up): memory
  per session (the memory cgroups' charge, and the proportional set size of its processes);
- the same image under ``crun`` (and ``podman run`` when installed; scripts/bench-deps.sh
  installs both): container run of /bin/true, exec into a running container, pause + resume,
  and memory per idle container, measured in this run. crun gets the image read-only (one
  shared read-only overlay of the layers, tmpfs /tmp): no per-container writable layer, which
  favours it;
- ``--bursts N`` (issue 26, memory that follows use): N sessions of the image with a 512 MB cap
  each, through the engine (the core's admission), on a node given a third of the caps' sum as
  its memory (by caps, fewer than a third of them would open); each runs pytest-like bursts
  (touching 150-200 MB for a moment, then freeing it), two at a time, in turns. Printed: how
  many opened against how many the caps allow, the bursts that failed, the evictions, and the
  sessions' largest charge (what the node counted for them) against their caps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from arl_tangram.core.actions import ActionKind, ActionSpec  # noqa: E402
from arl_tangram.core.resources import Resources  # noqa: E402
from arl_tangram.managers.cpu import (  # noqa: E402
    CpuManager,
    CpuManagerConfig,
    _linux,
)
from arl_tangram.managers.cpu.images.store import ImageStore  # noqa: E402

IMAGE = "swe"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def _pss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def _mem_available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


_n = 0


def tool(sid: str, code: str, cpu: float) -> tuple[ActionSpec, Resources]:
    global _n
    _n += 1
    return (ActionSpec(id=f"b{_n}", kind=ActionKind.TOOL, session=sid,
                       payload={"code": code, "language": "bash"}),
            Resources(cpu=cpu, memory_mb=256))


async def bench_bursts(n: int, layout: str, work: str, cap_mb: int = 512) -> int:
    """``--bursts``: n image sessions of ``cap_mb`` each on a node of a third of their caps."""
    import httpx

    from arl_tangram.api.app import create_app
    from arl_tangram.runtime.build import build_engine
    from arl_tangram.runtime.config import NodeConfig, ServiceConfig

    node_mb = -(-n * cap_mb // 3)  # (rounded up: the caps fit 3x its memory exactly)
    room_mb = 1024  # (the room a session's action keeps on its node, `session_action_demand`)
    by_caps = max(0, (node_mb - room_mb) // cap_mb)
    cfg = ServiceConfig(nodes=(NodeConfig(capacity=Resources(cpu=2, memory_mb=node_mb), gpu=None,
                                          cpu=CpuManagerConfig(work_root=work, warm_min=1,
                                                                   images_dir=os.path.join(work, "images"),
                                                                   image_layer_mb=64)),),
                        scheduler={"session_memory_overcommit": 3.0})
    eng = build_engine(cfg)
    await eng.start()
    app = create_app(eng, cfg, any_image_path=True)
    burst = "python3 -c \"b = b'x' * ({mb} << 20); del b; print('ok')\""
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     timeout=300) as c:
            r = await c.post("/v1/images", json={"path": layout, "name": IMAGE})
            assert r.status_code == 201, r.text
            t = time.perf_counter()
            sids = []
            for _ in range(n):
                r = await c.post("/v1/sessions", json={"image": IMAGE,
                                                       "demand": {"memory_mb": cap_mb}})
                assert r.status_code == 201, r.text
                sids.append(r.json()["session_id"])

            def opened() -> int:
                st = eng.core.st.sessions  # type: ignore[attr-defined]
                return sum(1 for s in sids if s in st and st[s].node is not None)

            while opened() < n and time.perf_counter() - t < 120:
                await asyncio.sleep(0.1)
            print(f"sessions: {n} of {cap_mb} MB caps ({n * cap_mb} MB) on a node of {node_mb} MB "
                  f"(by caps {by_caps} would open); open: {opened()} after "
                  f"{time.perf_counter() - t:.1f} s")
            failed, done = [], 0
            for rnd in range(2):
                for i in range(0, n, 2):
                    got = await asyncio.gather(*(
                        c.post("/v1/actions", json={
                            "kind": "tool", "session": s, "wait": True, "timeout_s": 120,
                            "payload": {"code": burst.format(mb=150 + 50 * rnd),
                                        "language": "bash"}}) for s in sids[i:i + 2]))
                    for r in got:
                        res = r.json()["results"][0] if r.status_code == 200 else {}
                        out = ((res.get("output") or {}).get("run_result") or {}).get("stdout")
                        done += 1
                        if res.get("status") != "succeeded" or out != "ok\n":
                            failed.append(r.text[:200])
            await asyncio.sleep(1.5)  # (a memory report after the last burst)
            st = eng.core.st.sessions  # type: ignore[attr-defined]
            charges = [st[s].charge.get("memory_mb") for s in sids if s in st]
            peaks = [st[s].peak_mb for s in sids if s in st]
            stats = (await c.get("/v1/stats")).json()
            print(f"bursts (150-200 MB each, two at a time): {done}, failed {len(failed)}; "
                  f"evictions {stats.get('session_evictions')}; after them, each session charged "
                  f"{min(charges):.0f}-{max(charges):.0f} MB of its {cap_mb} MB cap (its "
                  f"measured peak {min(peaks):.0f}-{max(peaks):.0f} MB)")
            for f in failed[:3]:
                print(f"  failed: {f}")
            return 0 if not failed and opened() == n else 1
    finally:
        await eng.aclose()


async def bench_tangram(args: argparse.Namespace, layout: str, work: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cache = os.path.join(work, "images")
    t = time.perf_counter()
    ImageStore(cache).import_path(layout, IMAGE)
    out["import_first_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ImageStore(cache).import_path(layout, IMAGE)
    out["import_again_s"] = time.perf_counter() - t
    # writable layers of 256 MiB (the SWE task writes a few MB): sparse on disk, but the node's
    # layer budget counts full caps, and 100 idle sessions of the default 1 GiB would not fit
    # this machine's disk budget
    m = CpuManager(CpuManagerConfig(work_root=work, images_dir=cache, warm_min=0, warm_max=2,
                                    pids_max=64, image_layer_mb=args.layer_mb,
                                    layers_on_disk=not args.memory_layers))
    await m.start()
    out["layer_backing"] = m.isolation_report()["image_layer"]
    try:
        dem = Resources(cpu=1, memory_mb=256)
        opens, firsts = [], []
        for i in range(args.opens):
            t = time.perf_counter()
            await m.open_session(f"o{i}", dem, 600, image=IMAGE)
            t1 = time.perf_counter()
            r = await m.run(*tool(f"o{i}", "true", 1))
            t2 = time.perf_counter()
            assert r.status == "Success", r
            opens.append(t1 - t)
            firsts.append(t2 - t)
            await m.close_session(f"o{i}")
            await asyncio.sleep(0.01)
        out["open_p50_s"], out["open_p99_s"] = pct(opens, 50), pct(opens, 99)
        out["open_first_action_p50_s"] = pct(firsts, 50)
        await m.open_session("sw", dem, 600, image=IMAGE)
        sw: dict[str, list[float]] = {"total": [], "thaw": [], "requota": [], "freeze": []}
        lat = []
        for i in range(args.actions):
            t = time.perf_counter()
            r = await m.run(*tool("sw", "true", 1.0 if i % 2 else 0.5))
            lat.append(time.perf_counter() - t)
            assert r.status == "Success" and r.session_switch is not None, r
            for k in sw:
                sw[k].append(r.session_switch[f"{k}_ms"] / 1e3)
        await m.close_session("sw")
        for k, v in sw.items():
            out[f"switch_{k}_p50_s"] = pct(v, 50)
        out["switch_total_p99_s"] = pct(sw["total"], 99)
        out["action_p50_s"] = pct(lat, 50)
        # idle sessions
        await asyncio.sleep(0.5)
        avail0 = _mem_available_kb()
        for i in range(args.idle):
            await m.open_session(f"i{i}", dem, 600, image=IMAGE)
            r = await m.run(*tool(f"i{i}", "cd /testbed && x=1", 1))
            assert r.status == "Success", r
        await asyncio.sleep(1.0)
        avail1 = _mem_available_kb()
        charged, pids = 0, []
        from arl_tangram.managers.cpu.host.overlay import slot_pids

        for i in range(args.idle):
            slot = m.sessions.by_id[f"i{i}"].sandbox.slot
            assert slot is not None
            charged += slot.charged_bytes()
            pids += slot_pids(slot)
        out["idle_sessions"] = args.idle
        out["idle_charged_mb_each"] = charged / args.idle / 2**20
        out["idle_pss_mb_each"] = _pss_kb(pids) / args.idle / 1024
        out["idle_memavailable_mb_each"] = (avail0 - avail1) / args.idle / 1024
        out["idle_procs_each"] = len(pids) / args.idle
        for i in range(args.idle):
            await m.close_session(f"i{i}")
    finally:
        await m.aclose()
    return out


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def _detached(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """`crun run -d`: the container keeps the stdio it is given, so give it no pipe (a pipe
    would never reach EOF and `_run` would wait for ever); its errors go through a file."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                           text=True)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, p.returncode, "", err.read())


def bench_crun(args: argparse.Namespace, work: str) -> dict[str, float] | str:
    crun = shutil.which("crun")
    if crun is None:
        return "crun not installed (scripts/bench-deps.sh installs it)"
    store = ImageStore(os.path.join(work, "images"))
    img = store.get(IMAGE)
    rootfs = os.path.join(work, "crun-rootfs")
    os.makedirs(rootfs, exist_ok=True)
    # the mount points crun needs on a read-only root (an image built without device nodes
    # has no /dev): a top layer of empty directories
    skel = os.path.join(work, "crun-skel")
    for d in ("dev", "proc", "sys", "tmp"):
        os.makedirs(os.path.join(skel, d), exist_ok=True)
    _linux.mount("overlay", rootfs, "overlay", _linux.MS_RDONLY,
                 "lowerdir=" + ":".join([skel, *store.layer_paths(img)]))
    bundle = os.path.join(work, "bundle")
    os.makedirs(bundle, exist_ok=True)
    state = os.path.join(work, "crun-state")
    out: dict[str, float] = {}
    try:
        _run([crun, "spec"], cwd=bundle, check=True)
        with open(os.path.join(bundle, "config.json")) as f:
            spec = json.load(f)
        spec["root"] = {"path": rootfs, "readonly": True}
        spec["process"]["terminal"] = False
        spec["process"]["user"] = {"uid": 65534, "gid": 65534}
        spec["process"]["cwd"] = "/"
        spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                               "options": ["nosuid", "nodev", "size=64m"]})
        spec["linux"].pop("resources", None)

        def write(args_: list[str]) -> None:
            spec["process"]["args"] = args_
            with open(os.path.join(bundle, "config.json"), "w") as f:
                json.dump(spec, f)

        base = [crun, "--root", state, "--cgroup-manager=disabled"]  # (no cgroup: cheaper)
        write(["/bin/true"])
        runs = []
        for i in range(args.crun_runs):
            t = time.perf_counter()
            p = _run([*base, "run", "--bundle", bundle, f"t{i}"])
            runs.append(time.perf_counter() - t)
            if p.returncode != 0:
                return f"crun run failed: {p.stderr.strip()[:300]}"
        out["crun_run_true_p50_s"] = pct(runs, 50)
        write(["/bin/bash", "-c", "sleep infinity & wait"])
        # pause/resume is the cgroup freezer: this container gets cgroups (cgroupfs)
        svc = [crun, "--root", state, "--cgroup-manager=cgroupfs"]
        p = _detached([*svc, "run", "-d", "--bundle", bundle, "svc"])
        if p.returncode != 0:
            return f"crun run -d failed: {p.stderr.strip()[:300]}"
        ex, pr = [], []
        for _ in range(args.crun_runs):
            t = time.perf_counter()
            _run([*svc, "exec", "svc", "/bin/true"], check=True)
            ex.append(time.perf_counter() - t)
            t = time.perf_counter()
            _run([*svc, "pause", "svc"], check=True)
            _run([*svc, "resume", "svc"], check=True)
            pr.append(time.perf_counter() - t)
        out["crun_exec_true_p50_s"] = pct(ex, 50)
        out["crun_pause_resume_p50_s"] = pct(pr, 50)
        _run([*svc, "delete", "-f", "svc"])
        avail0 = _mem_available_kb()
        pids = []
        for i in range(args.idle):
            p = _detached([*base, "run", "-d", "--bundle", bundle, f"idle{i}"])
            if p.returncode != 0:
                return f"crun run -d failed: {p.stderr.strip()[:300]}"
            st = json.loads(_run([*base, "state", f"idle{i}"]).stdout)
            pids.append(int(st["pid"]))
            try:
                with open(f"/proc/{st['pid']}/task/{st['pid']}/children") as f:
                    pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
        time.sleep(1.0)
        out["crun_idle_memavailable_mb_each"] = (avail0 - _mem_available_kb()) / args.idle / 1024
        out["crun_idle_pss_mb_each"] = _pss_kb(pids) / args.idle / 1024
        return out
    finally:
        for i in range(args.idle):
            _run([crun, "--root", state, "--cgroup-manager=disabled", "delete", "-f", f"idle{i}"])
        _run([crun, "--root", state, "--cgroup-manager=cgroupfs", "delete", "-f", "svc"])
        for _ in range(20):
            try:
                _linux.umount2(rootfs, 0)
                break
            except OSError:
                time.sleep(0.1)


def bench_podman(args: argparse.Namespace, layout: str) -> dict[str, float] | str:
    podman = shutil.which("podman")
    if podman is None:
        return "podman not installed (scripts/bench-deps.sh installs it)"
    out: dict[str, float] = {}
    t = time.perf_counter()
    p = _run([podman, "pull", "-q", f"oci:{layout}:swe-example"])
    out["podman_pull_oci_s"] = time.perf_counter() - t
    if p.returncode != 0:
        return f"podman pull failed: {p.stderr.strip()[:300]}"
    ref = p.stdout.strip().splitlines()[-1]
    runs = []
    for _ in range(args.podman_runs):
        t = time.perf_counter()
        q = _run([podman, "run", "--rm", "--pull=never", "--network", "none", "--cgroups=disabled",
                  # podman's default limits (nproc, nofile) exceed what this VM's root may set
                  # (setrlimit EPERM): ask for limits any container of the test can live with
                  "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", ref, "/bin/true"])
        runs.append(time.perf_counter() - t)
        if q.returncode != 0:
            return f"podman run failed: {q.stderr.strip()[:300]}"
    out["podman_run_true_p50_s"] = pct(runs, 50)
    _run([podman, "rmi", "-f", ref])
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--opens", type=int, default=40)
    ap.add_argument("--actions", type=int, default=200)
    ap.add_argument("--idle", type=int, default=100)
    ap.add_argument("--layer-mb", type=int, default=256, help="each session's writable layer")
    ap.add_argument("--memory-layers", action="store_true",
                    help="writable layers in tmpfs (the fallback) instead of on the disk")
    ap.add_argument("--crun-runs", type=int, default=20)
    ap.add_argument("--podman-runs", type=int, default=5)
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--bursts", type=int, default=0, metavar="N",
                    help="only the memory-by-use run, with N sessions (module doc)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (sandboxes, overlay mounts)", file=sys.stderr)
        return 2
    import swe_image

    layout = swe_image.build(say=lambda m: print(m, file=sys.stderr))
    print(f"load average at start: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}")
    work = tempfile.mkdtemp(prefix="bench-images-")
    if args.bursts:
        try:
            return await bench_bursts(args.bursts, layout, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    try:
        r = await bench_tangram(args, layout, work)
        print(f"test image: {layout}")
        print(f"  first import {r['import_first_s']:.2f} s; again (layers cached) "
              f"{r['import_again_s']:.2f} s")
        print(f"writable layers: {r['layer_backing']}, {args.layer_mb} MiB each")
        print(f"session open from the cached image: p50 {ms(r['open_p50_s'])}, p99 "
              f"{ms(r['open_p99_s'])} (goal <= 20 ms); open + first bash action p50 "
              f"{ms(r['open_first_action_p50_s'])}")
        print(f"per session action: thaw + re-quota + freeze p50 {ms(r['switch_total_p50_s'])}"
              f" (thaw {ms(r['switch_thaw_p50_s'])}, re-quota {ms(r['switch_requota_p50_s'])},"
              f" freeze {ms(r['switch_freeze_p50_s'])}), p99 {ms(r['switch_total_p99_s'])}"
              f" (goal <= 1 ms p50); trivial action p50 {ms(r['action_p50_s'])}")
        print(f"{r['idle_sessions']} idle sessions held at once: per session "
              f"{r['idle_charged_mb_each']:.2f} MB charged to its memory cgroup, "
              f"{r['idle_pss_mb_each']:.2f} MB PSS of its {r['idle_procs_each']:.1f} "
              f"processes, {r['idle_memavailable_mb_each']:.2f} MB of MemAvailable")
        if not args.no_baselines:
            c = bench_crun(args, work)
            if isinstance(c, str):
                print(f"crun: {c}")
            else:
                print(f"crun (same image, read-only root): run /bin/true p50 "
                      f"{ms(c['crun_run_true_p50_s'])}; exec /bin/true p50 "
                      f"{ms(c['crun_exec_true_p50_s'])}; pause + resume p50 "
                      f"{ms(c['crun_pause_resume_p50_s'])}; {args.idle} idle containers: "
                      f"{c['crun_idle_pss_mb_each']:.2f} MB PSS, "
                      f"{c['crun_idle_memavailable_mb_each']:.2f} MB of MemAvailable each")
            pm = bench_podman(args, layout)
            if isinstance(pm, str):
                print(f"podman: {pm}")
            else:
                print(f"podman: pull from the OCI layout {pm['podman_pull_oci_s']:.2f} s; "
                      f"podman run --rm /bin/true p50 {ms(pm['podman_run_true_p50_s'])}")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
