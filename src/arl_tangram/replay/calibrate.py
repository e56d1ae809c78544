"""Measures this machine into the cluster spec the simulator should use for it.

Invariant: every figure written is measured here, in this run, through the same managers the
engine uses: the work program's speed inside a real sandbox on a one-core quota (units per
CPU-second), a fresh sandbox's start (cold) and one taken from the warm pool, a session's
open, the engine's own cost of one action (submit -> delivered, zero work, idle engine, per
path: one-shot code, a test with cases, a tool call in a session), and for each model its
cold load, its swap-in from host memory and its batch latency ``alpha + beta * batch``
(least squares over batch sizes 1..16, `managers.gpu.costs.fit_alpha_beta`), and how long a
running elastic action grown from one core to two takes to use them (``resize_delay_s``). Nothing is
assumed; a figure that cannot be measured is left out and said so.

The spec (docs/trace-format.md) has fields for node capacity, the model costs, and the node's
measured ``parallel_speedup`` and ``parallel_start_s`` (fully parallel work on k cores against
one, paired and interleaved runs: the large runs' ratio, and what runs a fifth as long lose
beyond it when their workers start) and ``dispatch_s`` (the engine's cost of a zero-work action per path, as a fixed cost per
action kind), which the simulator's virtual executor applies. The other figures
go in a top-level ``calibration:`` section (`parse_calibration` validates it; `parse_cluster`
leaves it alone): the work program's speed, which replay needs, and the sandbox cold start and
session open, which `tangram replay --predict` puts in each action's and session's
``cold_start_s`` (see `replay.predict`).
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.actions import ActionKind, ActionSpec, Elasticity
from ..core.cluster import ClusterSpec, ModelSpec, NodeSpec
from ..core.config import CoreConfig
from ..core.resources import CPU, GPU, GPU_MEMORY_MB, MEMORY_MB, Resources
from .work import program

Say = Callable[[str], None]

DEFAULT_MODEL_DIR = Path(os.environ.get("TANGRAM_MODEL_DIR", Path.home() / ".cache" / "arl-tangram" / "tiny-models"))
# CPU-backed model devices on a machine without CUDA: one per tiny model (`local_models`), so
# that a static baseline can give every model of a trace its own device, as a static stack
# provisions each reward model it uses (with 2, the static policies had no instance for two of
# the demo's models and rejected their actions).
CPU_DEVICES = 4


def local_models(model_dir: Path = DEFAULT_MODEL_DIR) -> list[ModelSpec]:
    """The tiny models built from configs (offline) plus the packaged MiniLM, if installed."""
    from ..managers.gpu.testing import build_tiny_models, tiny_model_specs

    kinds = {"scalar": model_dir / "scalar", "classifier": model_dir / "classifier",
             "judge": model_dir / "judge"}
    if not all((p / "config.json").exists() for p in kinds.values()):
        model_dir.mkdir(parents=True, exist_ok=True)
        build_tiny_models(model_dir, seed=0)
    return tiny_model_specs({k: str(v) for k, v in kinds.items()})


def _own_s() -> float:
    t = os.times()
    return t.user + t.system


def parallel_core_counts(cores: int | None = None) -> list[int]:
    """Core counts at which calibrate measures the parallel speedup: 2, 4, 8 and the machine's."""
    from .driver import machine_cores

    n = cores if cores is not None else machine_cores()
    return sorted({k for k in (2, 4, 8, n) if 2 <= k <= n})


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


class _Runner:
    """Runs the work program in a fresh sandbox of the CPU manager: (wall s, CPU s) of one run."""

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr
        self.empty_s = 0.0  # median wall time of an empty program's run (`_work_rate` sets it)

    async def __call__(self, units: int, cpus: float, p: float = 0.0,
                       w: int = 1) -> tuple[float, float]:
        a = ActionSpec(id=f"cal-{time.monotonic_ns()}", kind=ActionKind.CODE,
                       payload={"code": program(units, p, w), "language": "python"})
        t0 = time.perf_counter()
        rr = await self.mgr.run(a, Resources(cpu=cpus, memory_mb=512))
        wall = time.perf_counter() - t0
        if rr.status != "Success":
            raise RuntimeError(f"calibration program failed: {rr.message} "
                               f"{rr.run_result.stderr if rr.run_result else ''}")
        return wall, float(rr.cpu_time or 0.0)


_PROBE_UNITS = 3000  # work units of one probe run (a fraction of a second on one core)


async def _cpu_figures(say: Say, repeats: int) -> dict[str, float]:
    """The CPU side: the work program's speed, the quota check, the parallel speedups and the
    sandbox and session starts, each measured through a real `CpuManager`."""
    from ..managers.cpu import CpuManager, CpuManagerConfig

    mgr = CpuManager(CpuManagerConfig())
    await mgr.start()
    out: dict[str, float] = {}
    try:
        await _wait_warm(mgr, 2)
        run = _Runner(mgr)
        await run(200, 1.0)  # first run: page faults, caches
        out.update(await _work_rate(run, repeats, say))
        out.update(await _quarter_core(run))
        out.update(await _parallel_speedups(run, repeats))
        say(_quota_line(out, repeats))
        out.update(await _resize_delay(mgr, out["units_per_s"], say))
        out.update(await _sandbox_starts(mgr, repeats, say))
    finally:
        await mgr.aclose()
    return out


async def _wait_warm(mgr: Any, n: int) -> None:
    """Up to two seconds for the manager's warm pool to hold ``n`` sandboxes."""
    for _ in range(40):
        if sum(mgr.warm_state().values()) >= n:
            return
        await asyncio.sleep(0.05)


async def _work_rate(run: _Runner, repeats: int, say: Say) -> dict[str, float]:
    """Units per CPU-second on a one-core quota: a probe's wall time less an empty run's,
    paired; sets ``run.empty_s``, which the later measurements subtract."""
    rates, walls0 = [], []
    for _ in range(repeats):
        w0, _c0 = await run(0, 1.0)
        wall, _cpu = await run(_PROBE_UNITS, 1.0)
        walls0.append(w0)
        rates.append(_PROBE_UNITS / max(1e-6, wall - w0))
    run.empty_s = _median(walls0)
    units = _median(rates)
    say(f"work program: {units:.0f} units per core-second "
        f"(sandbox run of an empty program {1000 * run.empty_s:.1f} ms)")
    return {"units_per_s": units}


async def _quarter_core(run: _Runner) -> dict[str, float]:
    """How much slower the same work runs on a 0.25-core quota than on one core (the quota check)."""
    wq, _ = await run(_PROBE_UNITS // 4, 0.25)
    w1, _ = await run(_PROBE_UNITS // 4, 1.0)
    return {"quarter_core_slowdown": (wq - run.empty_s) / max(1e-6, w1 - run.empty_s)}


_SMALL_PROBE = _PROBE_UNITS // 5  # the start cost's size of work (~0.1 s on one core)
_SMALL_PAIRS = 3  # small pairs per large pair: the start cost is a few ms of a ~50 ms run


async def _parallel_speedups(run: _Runner, repeats: int) -> dict[str, float]:
    """Fully parallel work (p = 1, k processes) on a k-core quota against the same work in one
    process on one core, paired and interleaved (the machine's speed drifts). The speedup is
    the large pairs' (`_PROBE_UNITS`) ratio of summed times (what durations average to), their
    own ratios its range. Each large pair is followed by small ones (a fifth of the work): a
    small k-core run takes longer than the large pair's ratio says, by what starting the workers
    one after another costs beyond what the large run already paid for it; the median excess is
    ``start_k`` (`NodeSpec.parallel_start_s`), so that ``start_k + time_1 / speedup_k`` is
    the measured time at the small size and start_k more at the large one (about 1%). Also the
    cores other jobs kept busy meanwhile (``other_load_cores``), where /proc/stat reads."""
    from .driver import machine_busy_s

    out: dict[str, float] = {}
    m0, own0, t0, used = machine_busy_s(), _own_s(), time.perf_counter(), 0.0
    for k in parallel_core_counts():
        ratios, excess, sum1, sumk = [], [], 0.0, 0.0
        for _ in range(repeats):
            wk, ck = await run(_PROBE_UNITS, float(k), 1.0, k)
            w1k, c1k = await run(_PROBE_UNITS, 1.0)
            used += ck + c1k
            t1, tk = max(1e-6, w1k - run.empty_s), max(1e-6, wk - run.empty_s)
            sum1 += t1
            sumk += tk
            ratios.append((w1k - run.empty_s) / tk)
            for _ in range(_SMALL_PAIRS):
                sk, csk = await run(_SMALL_PROBE, float(k), 1.0, k)
                s1, cs1 = await run(_SMALL_PROBE, 1.0)
                used += csk + cs1
                excess.append((sk - run.empty_s) - (s1 - run.empty_s) * tk / t1)
        out[f"speedup_{k}"] = min(float(k), sum1 / sumk)
        out[f"speedup_{k}_min"] = min(ratios)
        out[f"speedup_{k}_max"] = max(ratios)
        out[f"start_{k}"] = max(0.0, _median(excess))
    m1 = machine_busy_s()
    if m0 is not None and m1 is not None and out:
        out["other_load_cores"] = max(0.0, (m1 - m0) - used - (_own_s() - own0)) / (
            time.perf_counter() - t0)
    return out


def _quota_line(out: Mapping[str, float], repeats: int) -> str:
    speedups = {int(k.split("_")[1]): v for k, v in out.items()
                if k.startswith("speedup_") and k.count("_") == 1}
    return (f"quota check: 0.25 core runs {out['quarter_core_slowdown']:.2f}x slower than 1 core; "
            + ", ".join(f"fully parallel work on {k} cores {v:.2f}x faster than on one "
                        f"({repeats} pairs: {out[f'speedup_{k}_min']:.2f}-"
                        f"{out[f'speedup_{k}_max']:.2f})"
                        + (f", its start {1000 * out[f'start_{k}']:.1f} ms" if f"start_{k}" in out else "")
                        for k, v in speedups.items())
            + (f"; other jobs kept {out['other_load_cores']:.2f} cores busy meanwhile"
               if "other_load_cores" in out else ""))


def span_start(samples: Sequence[tuple[float, float]], target: float, window: float,
               rising: bool = True) -> float | None:
    """Start of the first span of at least ``window`` seconds, beginning at or after time 0 (a
    resize), whose CPU rate reaches ``target`` cores (``rising``: at least; else at most).
    ``samples``: (seconds since the resize, CPU seconds), in time order; ``window`` > 0. None:
    no such span."""
    for i, (ta, ca) in enumerate(samples):
        if ta < 0:
            continue
        later = [s for s in samples[i:] if s[0] - ta >= window]
        if not later:
            return None
        tb, cb = later[0]
        rate = (cb - ca) / (tb - ta)
        if (rate >= target) if rising else (rate <= target):
            return ta
    return None


def rate_from(samples: Sequence[tuple[float, float]], since: float) -> float | None:
    """Cores used from ``since`` to the last sample; None without two samples there."""
    after = [s for s in samples if s[0] >= since]
    if not after or after[-1][0] <= after[0][0]:
        return None
    return (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])


RESIZE_SPAN_S = 0.1  # the CFS period: over one, a one-core quota cannot show more than one core
_RESIZE_AT_S = 0.2  # the grow comes this long after the action's sandbox registered
_RESIZE_WORK_S = 1.6  # one-core seconds of work of each grown action
_SAMPLE_S = 0.005


def resize_delay(samples: Sequence[tuple[float, float]]) -> float | None:
    """From a grow (1 -> 2 cores) at time 0 to the start of the first `RESIZE_SPAN_S` span at 90 %
    of the rate the action held from 0.3 s after it to its end (what the machine gave two cores
    then; at most 1.8 cores). None where that rate cannot be read or was not above one core."""
    rate = rate_from(samples, 0.3)
    if rate is None or rate <= 1.0:
        return None
    return span_start(samples, 0.9 * min(2.0, rate), RESIZE_SPAN_S)


async def _grown_samples(mgr: Any, a: ActionSpec,
                         task: asyncio.Task[Any]) -> list[tuple[float, float]]:
    """Grow ``a`` (running as ``task``) to two cores `_RESIZE_AT_S` after its sandbox registered;
    (seconds since the resize call, its cgroup's CPU seconds), every `_SAMPLE_S` until it ends."""
    while a.id not in mgr._running and not task.done():
        await asyncio.sleep(0.002)
    sb = mgr._running.get(a.id)
    if sb is None or sb.slot is None:
        return []
    await asyncio.sleep(_RESIZE_AT_S)
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    if await mgr.resize(a.id, Resources(cpu=2, memory_mb=512)) != "applied":
        return []
    while not task.done():
        try:
            samples.append((time.monotonic() - t0, sb.slot.cpu_seconds()))
        except OSError:  # (its cgroup went with it)
            break
        await asyncio.sleep(_SAMPLE_S)
    return samples


async def _resize_delay(mgr: Any, units_per_s: float, say: Say) -> dict[str, float]:
    """Two elastic (1..2 cores) runs of the work program (two workers) started at one core and
    grown to two: the median `resize_delay`, where both read one; nothing on a one-core machine."""
    from .driver import machine_cores

    if machine_cores() < 2:
        return {}
    delays = []
    for i in range(2):
        a = ActionSpec(id=f"cal-grow-{i}-{time.monotonic_ns()}", kind=ActionKind.CODE,
                       elasticity=Elasticity(1, 2), demand=Resources(cpu=1, memory_mb=512),
                       payload={"code": program(round(_RESIZE_WORK_S * units_per_s), 1.0, 2),
                                "language": "python"})
        task = asyncio.create_task(mgr.run(a, Resources(cpu=1, memory_mb=512)))
        samples = await _grown_samples(mgr, a, task)
        rr = await task
        if rr.status != "Success":
            raise RuntimeError(f"calibration program failed: {rr.message}")
        delays.append(resize_delay(samples))
    got = [d for d in delays if d is not None]
    if len(got) < 2:
        say("resize: the grow's delay not measured (the rest of the machine left two cores "
            "no time, or the sandbox was not seen)")
        return {}
    say(f"resize: a running elastic action grown 1 -> 2 cores used them after "
        f"{1000 * _median(got):.1f} ms (2 runs: {', '.join(f'{1000 * d:.1f}' for d in got)})")
    return {"resize_delay_s": _median(got)}


async def _sandbox_starts(mgr: Any, repeats: int, say: Say) -> dict[str, float]:
    """A fresh sandbox's start (cold), one taken from the warm pool (warm), a session's open.
    The manager has no public door to spawn or take one sandbox, so this reads its pool."""
    pool = mgr._pool
    assert pool is not None
    colds, warms, opens = [], [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        sb = await pool.spawn()
        colds.append(time.perf_counter() - t0)
        pool.release(sb)
        await _wait_warm(mgr, 1)
        t0 = time.perf_counter()
        sb = await pool.take()
        warms.append(time.perf_counter() - t0)
        pool.release(sb)
        t0 = time.perf_counter()
        await mgr.open_session(f"cal-{i}", Resources(memory_mb=256), 60.0)
        opens.append(time.perf_counter() - t0)
        await mgr.close_session(f"cal-{i}")
    out = {"cold_start_s": _median(colds), "warm_start_s": _median(warms),
           "session_open_s": _median(opens)}
    say(f"sandbox: cold start {1000 * out['cold_start_s']:.1f} ms, warm take "
        f"{1000 * out['warm_start_s']:.2f} ms, session open {1000 * out['session_open_s']:.1f} ms")
    return out


async def _engine_figures(say: Say, repeats: int) -> dict[str, float]:
    """Submit -> delivered of a zero-work action on an idle embedded engine, per path."""
    from ..runtime.config import NodeConfig
    from ..runtime.engine import Engine, EngineConfig
    from ..runtime.local import LocalExecutor

    eng = Engine(LocalExecutor((NodeConfig(name="cal", gpu=None),)),
                 EngineConfig(core=CoreConfig(policy="fifo")))
    await eng.start()
    out: dict[str, float] = {}
    try:
        await asyncio.sleep(0.5)
        sid = await eng.open_session("cal-s", demand=Resources(memory_mb=256), ttl_s=60)
        await asyncio.sleep(0.2)
        paths = {
            "code": dict(kind=ActionKind.CODE, payload={"code": program(0), "language": "python"}),
            "test": dict(kind=ActionKind.TEST, payload={"code": program(0), "language": "python",
                                                        "cases": [{"stdin": ""}]}),
            "tool_session": dict(kind=ActionKind.TOOL, session=sid,
                                 payload={"code": program(0, session=True), "language": "python"}),
        }
        for name, kw in paths.items():
            acts = []
            for i in range(repeats + 1):
                res = await eng.run(ActionSpec(id=f"cal-{name}-{i}", **kw))  # type: ignore[arg-type]
                if res.status.name != "SUCCEEDED":
                    raise RuntimeError(f"calibration action {name} ended {res.status.name}: {res.reason}")
                if i:  # the first one warms caches
                    acts.append((res.finish_time or 0.0) - res.submit_time)
                await asyncio.sleep(0.1)  # idle engine: a warm sandbox ready again
            out[name] = _median(acts)
        say("engine cost of one zero-work action (submit -> delivered): " + ", ".join(
            f"{k} {1000 * v:.1f} ms" for k, v in out.items()))
    finally:
        await eng.aclose()
    return out


async def _model_figures(models: list[ModelSpec], say: Say,
                         repeats: int) -> tuple[list[ModelSpec], int]:
    """Each model's cold load, swap-in from host memory and batch latency, as its `ModelSpec`;
    and the most intra-op threads a one-device instance's forward ran on (what a forward takes
    of the node's cores where the devices are CPU-backed: `NodeSpec.device_cores`)."""
    from ..managers.gpu import GpuManager, GpuManagerConfig

    mgr = GpuManager(GpuManagerConfig(device="auto", cpu_devices=CPU_DEVICES), models)
    out = []
    threads = 0
    try:
        for m in models:
            # a first load pays the process's one-time costs (imports, lazy modules): not the model's
            await mgr.load(f"{m.name}-w", m.name, (0,))
            await mgr.unload(f"{m.name}-w", park=False)
            loads = await _load_times(mgr, m, max(2, repeats))
            swaps, iid = await _swap_times(mgr, m, max(2, repeats // 2))
            alpha, beta = await _batch_latency(mgr, m, iid)
            threads = max(threads, mgr.worker_threads(iid))
            await mgr.unload(iid, park=False)
            spec = ModelSpec(m.name, m.kind, m.path, m.devices, m.memory_mb, m.dtype,
                             load_s=round(_median(loads), 5), swap_s=round(_median(swaps), 5),
                             alpha=round(alpha, 6), beta=round(beta, 6), max_batch=m.max_batch,
                             max_instances=CPU_DEVICES, host_memory_mb=m.host_memory_mb,
                             options=m.options)
            say(f"model {m.name} ({m.kind}): load {1000 * spec.load_s:.0f} ms, swap-in "
                f"{1000 * spec.swap_s:.1f} ms, batch latency {1000 * spec.alpha:.1f} ms + "
                f"{1000 * spec.beta:.2f} ms x batch")
            out.append(spec)
    finally:
        await mgr.aclose()
    return out, threads


async def _model_dispatch(models: list[ModelSpec], say: Say, repeats: int) -> dict[str, float]:
    """The engine's own cost of a model action, per kind: submit -> delivered of one action
    alone on an idle embedded engine, less its model's measured ``alpha + beta`` (the forward
    and the manager's round trip to its worker): the median of every sample of the kind's
    models (``max(10, 2 x repeats)`` each: single milliseconds, noisy), never below 0. What the
    core, the executor's hand-off and the delivery add (`NodeSpec.dispatch_s` for ``reward``
    and ``judge``)."""
    from ..managers.gpu.config import GpuManagerConfig
    from ..runtime.config import NodeConfig
    from ..runtime.engine import Engine, EngineConfig
    from ..runtime.local import LocalExecutor
    from ..sim.trace import SimAction
    from .driver import action_payload

    gpu = GpuManagerConfig(device="auto", cpu_devices=CPU_DEVICES)
    eng = Engine(LocalExecutor((NodeConfig(name="cal", gpu=gpu),), tuple(models)),
                 EngineConfig(core=CoreConfig(policy="fifo"), models=tuple(models)))
    await eng.start()
    per_kind: dict[str, list[float]] = {}
    try:
        for m in models:
            kind = ActionKind.JUDGE if m.kind == "judge" else ActionKind.REWARD
            act = SimAction(kind, 0.0, Resources(), model=m.name)  # pragma: no mutate (a model action's payload is texts, not work)
            acts = per_kind.setdefault(kind.value, [])
            for i in range(max(10, 2 * repeats) + 1):  # pragma: no mutate (samples: the median's noise)
                res = await eng.run(ActionSpec(id=f"cal-{m.name}-{i}", kind=kind, model=m.name,
                                               payload=action_payload(act, m, 1.0, i, False)))
                if res.status.name != "SUCCEEDED":
                    raise RuntimeError(f"calibration action of {m.name} ended {res.status.name}: "
                                       f"{res.reason}")
                if i:  # the first one loads the model
                    took = (res.finish_time or 0.0) - res.submit_time  # pragma: no mutate (a success has its finish time)
                    acts.append(took - (m.alpha + m.beta))
                await asyncio.sleep(0.05)  # pragma: no mutate (an idle engine between two: any pause)
    finally:
        await eng.aclose()
    out = {k: max(0.0, _median(v)) for k, v in per_kind.items()}
    say("engine cost of one model action beyond its batch latency: " + ", ".join(
        f"{k} {1000 * v:.1f} ms" for k, v in out.items()))
    return out


async def _load_times(mgr: Any, m: ModelSpec, n: int) -> list[float]:
    """``n`` cold loads of ``m`` (each unloaded, not parked, after)."""
    loads = []
    for r in range(n):
        loads.append(await mgr.load(f"{m.name}-c{r}", m.name, (0,)))
        await mgr.unload(f"{m.name}-c{r}", park=False)
    return loads


async def _swap_times(mgr: Any, m: ModelSpec, n: int) -> tuple[list[float], str]:
    """``n`` swap-ins of ``m`` from host memory (each instance parked, then loaded back);
    the times, and the instance left loaded."""
    await mgr.load(f"{m.name}-p", m.name, (0,))
    swaps = []
    for r in range(n):
        await mgr.unload(f"{m.name}-p" if r == 0 else f"{m.name}-s{r - 1}", park=True)
        swaps.append(await mgr.load(f"{m.name}-s{r}", m.name, (0,), from_host=True))
    return swaps, f"{m.name}-s{n - 1}"


async def _batch_latency(mgr: Any, m: ModelSpec, iid: str) -> tuple[float, float]:
    """(alpha, beta) of ``alpha + beta * batch``, least squares over batches of 1..16 on the
    instance ``iid`` (the first batch of each size warms caches and is not counted); the
    model's own figures if the fit fails."""
    from ..managers.gpu.costs import fit_alpha_beta
    from ..sim.trace import SimAction
    from .driver import action_payload

    act = SimAction(ActionKind.REWARD if m.kind != "judge" else ActionKind.JUDGE, 0.0,
                    Resources(), model=m.name)
    samples = []
    for n in (1, 2, 4, 8, 16):
        for r in range(3):
            specs = [ActionSpec(id=f"b{n}-{r}-{i}", kind=act.kind, model=m.name,
                                payload=action_payload(act, m, 1.0, i, False)) for i in range(n)]
            o = await mgr.run_batch(iid, specs)
            if o.failed:
                raise RuntimeError(f"model {m.name}: {next(iter(o.failed.values()))}")
            if r:
                samples.append((n, o.latency_s))
    return fit_alpha_beta(samples, 3) or (m.alpha, m.beta)


async def _judge_engine_figures(model_dir: Path, say: Say) -> ModelSpec:
    """A tiny judge engine's start (load_s) and decode step (alpha + beta x sequences) on the
    real engine (issue 38), as the `ModelSpec` the simulator's engine model reads."""
    from ..managers.gpu.engine_judge import EngineJudgeHost
    from ..managers.gpu.judge_testing import build_tiny_genjudge

    path = model_dir / "genjudge"
    if not (path / "config.json").exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        build_tiny_genjudge(path, hidden=256)
    spec = ModelSpec("tiny-genjudge", kind="genjudge", path=str(path), max_batch=64, max_seqs=64,
                     memory_mb=1024.0, options={"max_tokens": 64, "max_model_len": 1024})
    host = EngineJudgeHost([spec])
    try:
        load_s = await host.load("cal-gj", spec.name, (0,))
        alpha, beta, s1, sk = await host.step_costs("cal-gj", k=32, tokens=64, repeats=5)
    finally:
        await host.aclose()
    say(f"judge engine {spec.name}: start {load_s:.1f} s, decode step {1000 * alpha:.2f} ms + "
        f"{1000 * beta:.3f} ms x sequences (alone {1000 * s1:.2f} ms, 32 at once {1000 * sk:.2f} ms)")
    return ModelSpec(spec.name, "genjudge", spec.path, 1, spec.memory_mb, spec.dtype,
                     load_s=round(load_s, 2), swap_s=round(load_s, 2), alpha=round(alpha, 6),
                     beta=round(beta, 7), max_batch=64, max_instances=CPU_DEVICES,
                     options=spec.options, max_seqs=64)


def calibrate(*, with_models: bool = True, repeats: int = 5, say: Say = print,
              model_dir: Path = DEFAULT_MODEL_DIR, judge_engine: bool = False) -> dict[str, Any]:
    """Measure this machine; returns the spec as plain data (`write_spec` writes it)."""
    from ..runtime.node import machine_capacity

    cap = machine_capacity()
    say(f"machine: {int(cap.get(CPU))} cores, {cap.get(MEMORY_MB):.0f} MB")
    cpu = asyncio.run(_cpu_figures(say, repeats))
    eng = asyncio.run(_engine_figures(say, repeats))
    models: list[ModelSpec] = []
    forward_threads = 0
    models_dispatch: dict[str, float] = {}
    if with_models:
        try:
            models, forward_threads = asyncio.run(_model_figures(local_models(model_dir), say, repeats))
            models_dispatch = asyncio.run(_model_dispatch(models, say, repeats))
        except ImportError as exc:
            say(f"models: not measured ({exc}); install the [gpu] extra")
    if judge_engine:  # (a vLLM start: tens of seconds; `make install` installs the engine)
        models.append(asyncio.run(_judge_engine_figures(model_dir, say)))
    node: dict[str, Any] = {"name": "local", "pool": "default",
                            "capacity": {CPU: int(cap.get(CPU)), MEMORY_MB: int(cap.get(MEMORY_MB))}}
    speedups = {int(k.split("_")[1]): round(v, 3) for k, v in cpu.items()
                if k.startswith("speedup_") and k.count("_") == 1}
    if speedups:
        node["parallel_speedup"] = speedups
        starts = {int(k.split("_")[1]): round(v, 5) for k, v in cpu.items()
                  if k.startswith("start_")}
        if starts:
            node["parallel_start_s"] = starts
    node["dispatch_s"] = dispatch_by_kind(eng)
    if models_dispatch:
        node["dispatch_s"].update({k: round(v, 5) for k, v in models_dispatch.items()})
    if models:
        import torch

        cuda = torch.cuda.is_available()
        ngpu = torch.cuda.device_count() if cuda else CPU_DEVICES
        node["capacity"][GPU] = ngpu
        node["capacity"][GPU_MEMORY_MB] = 4096 * ngpu
        if not cuda and forward_threads:  # CPU-backed devices: forwards run on these cores
            node["device_cores"] = forward_threads
    spec: dict[str, Any] = {"nodes": [node]}
    if models:
        spec["models"] = [_model_dict(m) for m in models]
    spec["calibration"] = {
        "host": platform.node(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "units_per_s": round(cpu["units_per_s"], 1),
        "cold_start_s": round(cpu["cold_start_s"], 5),
        "warm_start_s": round(cpu["warm_start_s"], 6),
        "session_open_s": round(cpu["session_open_s"], 5),
        "quarter_core_slowdown": round(cpu["quarter_core_slowdown"], 3),
    }
    if "other_load_cores" in cpu:
        spec["calibration"]["other_load_cores"] = round(cpu["other_load_cores"], 3)
    if "resize_delay_s" in cpu:
        spec["calibration"]["resize_delay_s"] = round(cpu["resize_delay_s"], 4)
    for k in sorted(speedups):
        spec["calibration"][f"parallel_speedup_range_{k}"] = [
            round(cpu[f"speedup_{k}_min"], 3), round(cpu[f"speedup_{k}_max"], 3)]
    return spec


def dispatch_by_kind(paths: Mapping[str, float]) -> dict[str, float]:
    """The engine's measured cost per path as the node's ``dispatch_s`` per action kind: a test
    (cases) its own path, a tool the tool call in a session, every other kind one-shot code."""
    out: dict[str, float] = {}
    if "code" in paths:
        out["default"] = round(paths["code"], 5)
    if "test" in paths:
        out["test"] = round(paths["test"], 5)
    if "tool_session" in paths:
        out["tool"] = round(paths["tool_session"], 5)
    return out


def _model_dict(m: ModelSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"name": m.name, "kind": m.kind, "path": m.path, "devices": m.devices,
                         "memory_mb": m.memory_mb, "load_s": m.load_s, "swap_s": m.swap_s,
                         "alpha": m.alpha, "beta": m.beta, "max_batch": m.max_batch,
                         "max_instances": m.max_instances}
    if m.options:
        d["options"] = dict(m.options)
    if m.max_seqs:
        d["max_seqs"] = m.max_seqs
    return d


_HEADER = """\
# Measured by `tangram calibrate` on {host} at {when}; every figure below is a measurement.
# Cluster spec format: docs/trace-format.md. The node's parallel_speedup and dispatch_s are
# applied by the simulator's virtual executor. The `calibration:` section (validated by
# `tangram replay`/`demo`, not used by `tangram simulate`) holds the rest: the work program's
# speed for replay; for `--predict`, the sandbox cold start (each action's cold_start_s) and the
# session open (each session's cold_start_s); see docs/fidelity.md.
"""


def write_spec(spec: Mapping[str, Any], path: str | Path) -> None:
    import yaml

    cal = spec.get("calibration", {})
    text = _HEADER.format(host=cal.get("host", "?"), when=cal.get("measured_at", "?"))
    text += yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=None, width=100)
    Path(path).write_text(text)


_CAL_NUMBERS = {"units_per_s", "cold_start_s", "warm_start_s", "session_open_s",
                "quarter_core_slowdown", "other_load_cores", "two_core_speedup",
                "resize_delay_s"}  # (two_core_speedup: files of before)
_CAL_STRINGS = {"host", "measured_at"}


def parse_calibration(data: Any, source: str = "<cluster>") -> dict[str, Any]:
    """The ``calibration:`` section of a parsed spec ({} if it has none), validated: every
    figure a finite number >= 0 (``units_per_s`` > 0), known names only; errors are `SpecError`
    naming ``source:line: calibration.FIELD``."""
    from ..core.errors import SpecError

    cal = data.get("calibration") if isinstance(data, Mapping) else None
    if cal is None:
        return {}
    if not isinstance(cal, Mapping):
        raise SpecError(source, data.get("__line__"), "calibration", "must be a mapping")
    line = cal.get("__line__")
    out: dict[str, Any] = {}
    for k, v in cal.items():
        if k == "__line__":
            continue
        where = f"calibration.{k}"
        if k in _CAL_STRINGS:
            out[k] = str(v)
        elif k in _CAL_NUMBERS:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise SpecError(source, line, where, f"must be a finite number >= 0, got {v!r}")
            if k == "units_per_s" and v <= 0:
                raise SpecError(source, line, where, f"must be > 0, got {v!r}")
            out[k] = float(v)
        elif k.startswith("parallel_speedup_range_"):
            if (not isinstance(v, list) or len(v) != 2 or not all(
                    isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in v)):
                raise SpecError(source, line, where, f"must be [lowest, highest] measured, got {v!r}")
            out[k] = [float(x) for x in v]
        elif k == "dispatch_s":  # files of before: now the node's dispatch_s
            out[k] = {str(a): b for a, b in v.items() if a != "__line__"} if isinstance(v, Mapping) else v
        else:
            raise SpecError(source, line, where, "unknown field (docs/fidelity.md lists them)")
    return out


def read_calibration(path: str | Path) -> dict[str, Any]:
    """The validated ``calibration:`` section of a spec file ({} if it has none)."""
    from ..specfile import read_yaml

    return parse_calibration(read_yaml(path), str(path))


def quick_units_per_s(seconds: float = 0.3) -> float:
    """The work program's speed in this process (when no calibrated spec is given)."""
    units = 200
    src = compile(program(units), "<work>", "exec")
    done, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        exec(src, {"__name__": "__work__"})
        done += units
    return done / (time.process_time() - t0)


def cluster_of(spec: Mapping[str, Any]) -> ClusterSpec:
    from ..core.cluster import parse_cluster

    return parse_cluster(dict(spec), "<calibrated>")


__all__ = [
    "NodeSpec",
    "calibrate",
    "cluster_of",
    "local_models",
    "quick_units_per_s",
    "read_calibration",
    "write_spec",
]
