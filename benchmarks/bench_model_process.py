"""What a batch costs through the model process's boundary (issue 41 item 5), in one run:

- **process**: `GpuManager.run_batch` on an instance whose model lives in its own process (the
  payloads pickled down a pipe, the scores back);
- **thread** (the baseline, the old path): the same model, loaded the same way (`cold_load`,
  `Scorer`), scored by `Scorer.score` on a worker thread of this process through
  ``run_in_executor`` -- what `GpuManager.run_batch` did before instances became processes.

Both alternate batch by batch (same load on the machine), on one CPU-backed device with the
same thread budget (``--threads``). Printed per path: p50 and p90 wall latency of a batch of
``--batch`` reward actions seen by the caller, p50 of the forward itself (the latency the cost
model gets), and the ratio process/thread of the p50s. Also printed: the seconds from a SIGSEGV
of the instance's process to a replacement scoring (death noticed + new process + load).

    .venv/bin/python benchmarks/bench_model_process.py [--batch 8] [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    tiny_model_specs,
)
from arl_tangram.managers.gpu.scoring import Scorer, cold_load


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = build_tiny_models(tempfile.mkdtemp(prefix="bench-model-process-"))
    spec = next(s for s in tiny_model_specs(paths) if s.name == "tiny-rm")
    cfg = GpuManagerConfig(device="cpu", cpu_devices=1, threads_per_device=args.threads)
    mgr = GpuManager(cfg, [spec])
    await mgr.load("p", "tiny-rm", (0,))
    model, tok = cold_load(spec, None, torch.device("cpu"))
    scorer = Scorer(spec, model, tok, max_length=cfg.max_length, max_tokens=cfg.max_batch_tokens)
    pool = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()

    def thread_path(payloads: list[dict]) -> tuple[list, float]:
        t0 = time.perf_counter()
        outs = scorer.score(payloads)
        return outs, time.perf_counter() - t0

    acts = [ActionSpec(f"a{i}", kind=ActionKind.REWARD, model="tiny-rm",
                       payload={"query": f"What is {i} + {i}? The answer is {2 * i}."})
            for i in range(args.batch)]
    payloads = [a.payload for a in acts]
    wall: dict[str, list[float]] = {"process": [], "thread": []}
    fwd: dict[str, list[float]] = {"process": [], "thread": []}
    same = True
    for r in range(args.rounds + 10):  # the first 10 rounds warm both paths up
        t0 = time.perf_counter()
        out = await mgr.run_batch("p", acts)
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs, lat = await loop.run_in_executor(pool, thread_path, payloads)
        tt = time.perf_counter() - t0
        if r >= 10:
            wall["process"].append(tp)
            wall["thread"].append(tt)
            fwd["process"].append(out.latency_s)
            fwd["thread"].append(lat)
        same = same and all(abs(out.outputs[a.id]["score"] - o["score"]) < 1e-6
                            for a, o in zip(acts, outs, strict=True))
    print(f"batch of {args.batch} tiny-rm reward actions, {args.rounds} rounds, "
          f"{args.threads} thread(s), CPU")
    print(f"{'path':8s} {'p50 wall ms':>12s} {'p90 wall ms':>12s} {'p50 forward ms':>15s}")
    for k in ("thread", "process"):
        print(f"{k:8s} {1e3 * pct(wall[k], 0.5):12.3f} {1e3 * pct(wall[k], 0.9):12.3f} "
              f"{1e3 * pct(fwd[k], 0.5):15.3f}")
    p_t, p_p = pct(wall["thread"], 0.5), pct(wall["process"], 0.5)
    print(f"process/thread p50 wall   {p_p / p_t:.3f}  (+{1e3 * (p_p - p_t):.3f} ms per batch)")
    print(f"same scores both paths    {same}")

    # a SIGSEGV of the instance's process -> a replacement scoring
    pid = mgr.worker_pid("p")
    assert pid is not None
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGSEGV)
    try:
        await mgr.run_batch("p", acts)
    except BrokenError as exc:  # (ModelWorkerDied; "not loaded" if it was noticed idle first)
        t_dead = time.perf_counter() - t0
        print(f"death noticed             {t_dead:.3f} s  ({exc})")
    await mgr.load("q", "tiny-rm", (0,))
    out = await mgr.run_batch("q", acts)
    t_back = time.perf_counter() - t0
    print(f"SIGSEGV -> replacement scored  {t_back:.3f} s  (goal 2 s; {out.batch_size} scored)")
    await mgr.aclose()
    pool.shutdown()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
