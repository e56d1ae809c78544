"""Judge engine throughput (issue 38): N judge requests against ONE instance (a real vLLM engine
process, CPU build; a tiny random Qwen2 built here), one at a time vs all at once, in one run.

Both modes send the same N judge actions through `EngineJudgeHost.run_batch`, the call the node
host makes for each RunBatch: ``serial`` awaits each before sending the next (one sequence in
the engine at a time); ``concurrent`` sends N single-action batches at once, as the core does for
a model with ``max_seqs >= N`` (each arrival a batch that joins the running ones). Reported per
mode: wall seconds, completion tokens generated, tokens/s, p50/p99 latency of a request, and the
concurrent/serial gain in tokens/s -- measured, not assumed. Also the engine's start (load) and
stop (unload) seconds, per event.

    .venv/bin/python benchmarks/bench_judge.py [--requests 64] [--max-tokens 64]
        [--hidden 256] [--layers 2] [--json out.json]

``--two-judges`` measures instead two judge models on ONE CPU-backed device through the real
service (engine, core, node host): requests alternate between them in rounds, the core unloads
the idle judge and loads the one with work (on CPU: its engine process ended and started anew);
per event its measured seconds (what the core is told as ``ModelLoaded.load_s``), and the memory
of each judge's engine process group while loaded and after its unload (gone: 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu.engine_judge import EngineJudgeHost, engine_available
from arl_tangram.managers.gpu.judge_testing import build_tiny_genjudge


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _actions(tag: str, n: int) -> list[ActionSpec]:
    return [ActionSpec(id=f"{tag}{i}", kind=ActionKind.JUDGE, model="gj",
                       payload={"prompt": f"What is {i} times {i + 3}?",
                                "response": f"It is {i * (i + 3)}, since {i} x {i + 3} = "
                                            f"{i * (i + 3)}."})
            for i in range(n)]


async def _one(host: EngineJudgeHost, a: ActionSpec) -> tuple[float, int, bool]:
    t0 = time.perf_counter()
    out = await host.run_batch("gj#1", [a])
    dt = time.perf_counter() - t0
    o = out.outputs.get(a.id)
    return dt, int(o["completion_tokens"]) if o else 0, o is not None


def _summary(mode: str, wall: float, got: list[tuple[float, int, bool]]) -> dict[str, Any]:
    lat = [g[0] for g in got]
    toks = sum(g[1] for g in got)
    return {"mode": mode, "requests": len(got), "ok": sum(g[2] for g in got),
            "wall_s": round(wall, 3), "completion_tokens": toks,
            "tokens_per_s": round(toks / wall, 1), "requests_per_s": round(len(got) / wall, 2),
            "p50_s": round(statistics.median(lat), 4), "p99_s": round(_pct(lat, 0.99), 4)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    path = build_tiny_genjudge(root / "model", hidden=args.hidden, layers=args.layers)
    spec = ModelSpec("gj", kind="genjudge", path=path, max_batch=args.requests,
                     max_seqs=args.requests,
                     options={"max_tokens": args.max_tokens, "max_model_len": 1024,
                              "on_no_verdict": 0.0})
    host = EngineJudgeHost([spec])
    load_s = await host.load("gj#1", "gj", (0,))
    try:
        await host.run_batch("gj#1", _actions("w", 4))  # warm-up
        t0 = time.perf_counter()
        serial = [await _one(host, a) for a in _actions("s", args.requests)]
        serial_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        conc = await asyncio.gather(*(_one(host, a) for a in _actions("c", args.requests)))
        conc_wall = time.perf_counter() - t0
    finally:
        await host.aclose()
    rows = [_summary("serial", serial_wall, serial), _summary("concurrent", conc_wall, list(conc))]
    gain = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"] if rows[0]["tokens_per_s"] else 0.0
    return {"model": {"hidden": args.hidden, "layers": args.layers, "max_tokens": args.max_tokens},
            "rows": rows, "gain_tokens_per_s": round(gain, 2),
            "events": host.events, "load_s": round(load_s, 2)}


def _group_rss_mb(pgid: int) -> float:
    """Resident memory of the live processes of process group ``pgid`` (MB)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            total += int((d / "statm").read_text().split()[1]) * 4096
        except (OSError, ValueError, IndexError):
            continue
    return total / 2**20


async def two_judges(args: argparse.Namespace) -> dict[str, Any]:
    from arl_tangram.managers.cpu import CpuManagerConfig
    from arl_tangram.managers.gpu.config import GpuManagerConfig
    from arl_tangram.runtime.build import build_engine
    from arl_tangram.runtime.config import NodeConfig, ServiceConfig

    root = Path(tempfile.mkdtemp(prefix="bench-judge2-"))
    specs = tuple(
        ModelSpec(name, kind="genjudge", path=build_tiny_genjudge(root / name, seed=i,
                                                                   hidden=args.hidden,
                                                                   layers=args.layers),
                  memory_mb=64.0, load_s=40.0, max_batch=16, max_seqs=16, max_instances=1,
                  options={"max_tokens": 16, "max_model_len": 512, "on_no_verdict": 0.0})
        for i, name in enumerate(("judge-a", "judge-b")))
    cfg = ServiceConfig(models=specs, nodes=(NodeConfig(
        cpu=CpuManagerConfig(work_root=str(root / "w"), warm_min=0),
        gpu=GpuManagerConfig(device="cpu", cpu_devices=1)),))
    engine = build_engine(cfg)
    await engine.start()
    (host,) = engine._executor.hosts.values()  # (a benchmark may look inside)
    judges = host.gpu.engines  # type: ignore[union-attr]
    memory: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    try:
        for r, name in enumerate(["judge-a", "judge-b", "judge-a", "judge-b"]):
            acts = [ActionSpec(id=f"r{r}-{i}", kind=ActionKind.JUDGE, model=name,
                               payload={"prompt": "2+2?", "response": str(i)})
                    for i in range(8)]
            t0 = time.perf_counter()
            engine.submit_nowait(acts)
            res = await asyncio.gather(*(engine.result(a.id) for a in acts))
            wall = time.perf_counter() - t0
            rounds.append({"round": r, "model": name, "ok": sum(x is not None and
                                                               x.status.name == "SUCCEEDED"
                                                               for x in res),
                           "wall_s": round(wall, 2)})
            for iid, info in judges.resident().items():
                memory.append({"round": r, "instance": iid, "model": info["model"],
                               "state": "loaded", "rss_mb": round(_group_rss_mb(info["pid"]), 1)})
            for e in judges.events:
                if e["event"] == "unload" and "pid" in e and not e.get("measured"):
                    e["measured"] = True
                    memory.append({"round": r, "instance": e["instance"], "model": e["model"],
                                   "state": "unloaded", "rss_mb": round(_group_rss_mb(e["pid"]), 1)})
    finally:
        await engine.aclose(grace_s=2.0)
    return {"rounds": rounds, "events": judges.events, "memory": memory}


def main_two(args: argparse.Namespace) -> int:
    out = asyncio.run(two_judges(args))
    print("two judges on one CPU-backed device (real service): rounds of 8 requests")
    for r in out["rounds"]:
        print(f"round {r['round']}: {r['model']:<8} ok {r['ok']}/8  {r['wall_s']:.2f} s")
    for e in out["events"]:
        print(f"event {e['event']:<6} {e['instance']:<10} {e.get('seconds', 0):7.2f} s")
    for m in out["memory"]:
        print(f"memory after round {m['round']}: {m['instance']:<10} {m['state']:<8} "
              f"{m['rss_mb']:8.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--two-judges", action="store_true")
    args = ap.parse_args(argv)
    why = engine_available()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    if args.two_judges:
        return main_two(args)
    out = asyncio.run(bench(args))
    print(f"judge engine: Qwen2 hidden {args.hidden}, {args.layers} layers, random weights; "
          f"max_tokens {args.max_tokens}; {args.requests} requests per mode")
    print(f"{'mode':<11} {'ok':>4} {'wall s':>8} {'tokens':>7} {'tok/s':>8} {'req/s':>7} "
          f"{'p50 s':>7} {'p99 s':>7}")
    for r in out["rows"]:
        print(f"{r['mode']:<11} {r['ok']:>4} {r['wall_s']:>8.2f} {r['completion_tokens']:>7} "
              f"{r['tokens_per_s']:>8.1f} {r['requests_per_s']:>7.2f} {r['p50_s']:>7.3f} "
              f"{r['p99_s']:>7.3f}")
    print(f"continuous batching gain (tokens/s, concurrent / serial): {out['gain_tokens_per_s']}x")
    for e in out["events"]:
        print(f"event {e['event']}: {e['instance']} {e.get('seconds', 0):.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
