"""Replays a trace on real resources: the real engine, real sandboxes, real models.

Invariants:
- Closed loop, as the simulator (`sim/simulator.py`): a trajectory's first action is submitted
  ``start + gen_s[0]`` after its RL step begins, action *i+1* ``gen_s[i+1]`` seconds (a real
  wait) after action *i* was delivered, whatever its status; its sessions are opened on first
  use and closed when it ends; RL steps run in order, the next one after the last trajectory
  of the previous one ended (plus ``train_s``).
- Every policy runs through the same engine and managers; the core for a policy is built by
  `arl_tangram.sim.runner.make_core` with the settings `tangram simulate` gives it (trajectory
  count for trajectory-bound, measured task shares for task-isolated, the named warm keys and
  their `warm_boot` counts), so both see one config.
- The truth of the trace becomes real work (`actions_payload`): CPU actions run the work
  program (`replay.work`) in their sandbox, ``work_s x units_per_s`` units, its parallel part
  over forked processes; session actions run in their session's sandbox; reward and judge
  actions are scored by the cluster spec's models through the GPU manager. ``cold_start_s``
  and ``fails`` of the trace are the simulator's business and are not acted out here: a real
  sandbox start costs what it costs. A session with an ``image`` opens in that environment
  image (its actions' work program runs with the image's own ``python3``); the images are
  imported from the paths given (``images``) when the engine starts (every node of the
  embedded engine), or, against a running service, through its ``/v1/images``.
- Figures are what the engine measured (ACT = finish - submit on the engine's clock) and what
  the sandboxes' cgroups counted (CPU-seconds consumed), never derived from the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.actions import ActionKind, ActionSpec, Status
from ..core.cluster import ClusterSpec, ModelSpec
from ..core.resources import CPU
from ..sim.trace import SimAction, Trajectory
from .backends import Backend, EmbeddedBackend, HttpBackend
from .work import program, units_for, workers_for

Progress = Callable[[int], None]  # called with the number of actions just delivered (1)

_TEXTS = (
    "def add(a, b):\n    return a + b\n",
    "The answer is 4 because 2 + 2 = 4.",
    "import numpy as np\nprint(np.arange(10).sum())",
    "Reward models score a response to a prompt; judges answer Yes or No.",
)


# ---- what each action really does -------------------------------------------------------------


def action_payload(act: SimAction, model: ModelSpec | None, units_per_s: float, index: int,
                   in_session: bool) -> dict[str, Any]:
    """The payload that makes ``act`` real: the work program, or texts for its model."""
    if act.kind.uses_model:
        text = _TEXTS[index % len(_TEXTS)]
        if model is not None and model.kind == "similarity":
            return {"response": text, "reference": _TEXTS[(index + 1) % len(_TEXTS)]}
        if model is not None and model.kind == "judge":
            return {"prompt": "Is this correct?", "response": text}
        if model is not None and model.kind == "genjudge" and act.hints.tokens:
            # a generative judge on an engine: exactly the trace's tokens generated (its work),
            # through the OpenAI-style completion a judge action may carry (`kinds.JudgeRequest`)
            body = {"prompt": f"Is this correct? {text}", "max_tokens": int(act.hints.tokens),
                    "temperature": 0.0, "ignore_eos": True}
            return {"openai": {"route": "completions", "body": body}}
        return {"query": text}
    el = act.elasticity
    p = el.speedup.parallel_fraction if el is not None else 0.0
    workers = workers_for(el.max if el is not None and el.dim == CPU else None, p)
    code = program(units_for(act.work_s, units_per_s), p, workers, session=in_session)
    payload: dict[str, Any] = {"code": code, "language": "python",
                               "run_timeout": float(act.timeout_s)}
    if act.kind == ActionKind.TEST:
        payload["cases"] = [{"stdin": ""}]
    return payload


# ---- results ----------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    """What one policy did on real resources (the --json contract: `as_dict`)."""

    policy: str
    trace: str
    actions: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    acts: list[float] = field(default_factory=list)  # ACT of every executed action, s
    acts_by_kind: dict[str, list[float]] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)  # rollout + training per RL step
    makespan_s: float = 0.0
    capacity_cpu: float = 0.0
    cpu_seconds: float = 0.0  # CPU time the sandboxes consumed (their cgroups' count)
    cpu_series: list[tuple[float, float]] = field(default_factory=list)  # (t, busy fraction)
    machine_cpu_seconds: float | None = None  # busy CPU of the whole machine (/proc/stat)
    own_cpu_seconds: float = 0.0  # CPU of this process (engine, core, model manager threads)
    session_turns_ok: bool = True  # every session action saw the state its predecessors left
    stats: dict[str, Any] = field(default_factory=dict)  # the engine's counters at the end
    wall_s: float = 0.0
    # per counted action: (trajectory id, its index, seconds from the run's start to its submit,
    # status), what the bound on this run's own release times needs (`replay.predict.run_bound`)
    releases: list[tuple[str, int, float, str]] = field(default_factory=list)

    @staticmethod
    def summary(xs: Sequence[float]) -> dict[str, float]:
        if not xs:
            return {"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0}
        s = sorted(xs)
        return {"count": len(s), "avg": statistics.fmean(s), "p50": _q(s, 0.5), "p99": _q(s, 0.99)}

    @property
    def act(self) -> dict[str, float]:
        return self.summary(self.acts)

    @property
    def step_avg_s(self) -> float:
        return statistics.fmean(self.step_s) if self.step_s else 0.0

    @property
    def other_load(self) -> float | None:
        """Cores busy with work that is neither a sandbox's nor this process's, on average over
        the run (other jobs on a shared machine, the fork server): what the replay competed with."""
        if self.machine_cpu_seconds is None or self.makespan_s <= 0:
            return None
        return max(0.0, self.machine_cpu_seconds - self.cpu_seconds - self.own_cpu_seconds
                   ) / self.makespan_s

    @property
    def cpu_utilization(self) -> float:
        den = self.capacity_cpu * self.makespan_s
        return self.cpu_seconds / den if den > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "trace": self.trace, "actions": self.actions,
                "by_status": dict(sorted(self.by_status.items())), "act": self.act,
                "act_by_kind": {k: self.summary(v) for k, v in sorted(self.acts_by_kind.items())},
                "step_s": list(self.step_s), "step_avg_s": self.step_avg_s,
                "makespan_s": self.makespan_s, "cpu_seconds": self.cpu_seconds,
                "utilization": {"cpu": self.cpu_utilization},
                "own_cpu_seconds": self.own_cpu_seconds, "other_load_cores": self.other_load,
                "session_state_kept": self.session_turns_ok,
                "warm_hits": self.stats.get("warm_hits"), "warm_misses": self.stats.get("warm_misses"),
                "model_loads": self.stats.get("model_loads"), "model_swaps": self.stats.get("model_swaps"),
                "wall_s": self.wall_s}


def _q(s: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``s`` (linear interpolation, as numpy's default)."""
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# ---- the closed loop --------------------------------------------------------------------------


_COUNTED = {"succeeded", "failed", "timed_out"}


async def replay(backend: Backend, steps: Sequence[Sequence[Trajectory]], cluster: ClusterSpec,
                 *, policy: str, trace: str, units_per_s: float, train_s: float = 0.0,
                 progress: Progress | None = None, sample_s: float = 0.25) -> ReplayReport:
    """Replay ``steps`` (one batch of trajectories per RL step) closed-loop on ``backend``."""
    rep = ReplayReport(policy=policy, trace=trace, capacity_cpu=backend.cpu_capacity)
    wall0 = time.perf_counter()
    meter = _CpuMeter(backend, rep, sample_s)
    runner = _TrajectoryRunner(backend, rep, cluster, policy=policy, units_per_s=units_per_s,
                               t0=meter.t0, progress=progress)
    async with meter:
        for batch in steps:
            s0 = time.monotonic()
            if batch:
                await asyncio.gather(*(runner.run(t) for t in batch))
            if train_s > 0:
                await asyncio.sleep(train_s)
            rep.step_s.append(time.monotonic() - s0)
    rep.stats = backend.stats()
    rep.wall_s = time.perf_counter() - wall0
    return rep


class _CpuMeter:
    """The CPU side of a report, over an ``async with`` block: every ``sample_s`` the sandboxes'
    busy fraction of the cluster (``cpu_series``); at the end the makespan, the CPU-seconds of
    the sandboxes, of the whole machine and of this process."""

    def __init__(self, backend: Backend, rep: ReplayReport, sample_s: float) -> None:
        self.backend, self.rep, self.sample_s = backend, rep, sample_s
        self.t0 = time.monotonic()
        self.cpu0 = backend.cpu_ns()
        self.machine0, self.own0 = machine_busy_s(), _own_cpu_s()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _CpuMeter:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        self._finish()

    async def _sample(self) -> None:
        rep, backend = self.rep, self.backend
        last_t, last_c = self.t0, self.cpu0
        while not self._stop.is_set():
            with_timeout = asyncio.create_task(self._stop.wait())
            await asyncio.wait({with_timeout}, timeout=self.sample_s)
            with_timeout.cancel()
            now, c = time.monotonic(), backend.cpu_ns()
            if c is not None and last_c is not None and now > last_t and rep.capacity_cpu > 0:
                rep.cpu_series.append((now - self.t0,
                                       (c - last_c) / 1e9 / (now - last_t) / rep.capacity_cpu))
            last_t, last_c = now, c

    def _finish(self) -> None:
        rep = self.rep
        rep.makespan_s = time.monotonic() - self.t0
        machine1 = machine_busy_s()
        rep.own_cpu_seconds = _own_cpu_s() - self.own0
        if self.machine0 is not None and machine1 is not None:
            rep.machine_cpu_seconds = machine1 - self.machine0
        cpu1 = self.backend.cpu_ns()
        if self.cpu0 is not None and cpu1 is not None:
            rep.cpu_seconds = (cpu1 - self.cpu0) / 1e9


class _TrajectoryRunner:
    """Runs one trajectory closed-loop on the backend (its generation waits, its actions one
    after another, its sessions opened on first use and closed at its end) and counts each
    delivered action into the report."""

    def __init__(self, backend: Backend, rep: ReplayReport, cluster: ClusterSpec, *,
                 policy: str, units_per_s: float, t0: float, progress: Progress | None) -> None:
        self.backend, self.rep, self.policy = backend, rep, policy
        self.models = {m.name: m for m in cluster.models}
        self.units_per_s, self.t0, self.progress = units_per_s, t0, progress

    async def run(self, traj: Trajectory) -> None:
        opened: list[str] = []
        turns: dict[str, int] = {}
        try:
            for i, (gen, act) in enumerate(traj.steps):
                delay = (traj.start + gen) if i == 0 else gen
                if delay > 0:
                    await asyncio.sleep(delay)
                sid = await self._session(traj, act, opened)
                in_session = sid is not None and act.kind == ActionKind.TOOL
                submit = time.monotonic() - self.t0  # (a little before the engine's own submit)
                status, act_s, out = await self.backend.run(self._spec(traj, i, act, sid, in_session))
                self._count(traj, i, act, submit, status, act_s)
                if in_session and sid is not None:
                    turns[sid] = turns.get(sid, 0) + 1
                    if f"turn {turns[sid]}" not in _stdout(out):
                        self.rep.session_turns_ok = False
                if self.progress is not None:
                    self.progress(1)
        finally:
            for sid in opened:
                with contextlib.suppress(Exception):
                    await self.backend.close_session(sid)

    async def _session(self, traj: Trajectory, act: SimAction, opened: list[str]) -> str | None:
        """The session ``act`` runs in (opened now if this is its first use), or None."""
        if act.session is None:
            return None
        sid = traj.session_id(act.session)
        if sid not in opened:
            sdef = traj.sessions.get(act.session)
            await self.backend.open_session(sid, sdef.demand if sdef else None,
                                            sdef.ttl_s if sdef else 3600.0,
                                            sdef.image if sdef else None)
            opened.append(sid)
        return sid

    def _spec(self, traj: Trajectory, i: int, act: SimAction, sid: str | None,
              in_session: bool) -> ActionSpec:
        return ActionSpec(
            id=f"{self.policy}:{traj.id}#{i}", kind=act.kind, demand=act.demand,
            elasticity=act.elasticity, hints=act.hints, task=traj.task,
            trajectory=traj.id, session=sid, model=act.model, tag=act.tag,
            timeout_s=act.timeout_s, weight=act.weight, siblings=traj.siblings,
            payload=action_payload(act, self.models.get(act.model or ""), self.units_per_s, i,
                                   in_session))

    def _count(self, traj: Trajectory, i: int, act: SimAction, submit: float, status: str,
               act_s: float | None) -> None:
        rep = self.rep
        rep.actions += 1
        rep.by_status[status] = rep.by_status.get(status, 0) + 1
        if status in _COUNTED and act_s is not None:
            rep.acts.append(act_s)
            rep.releases.append((traj.id, i, submit, status))
            rep.acts_by_kind.setdefault(act.kind.value, []).append(act_s)


def machine_busy_s() -> float | None:
    """Busy CPU-seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _stdout(out: Any) -> str:
    if isinstance(out, Mapping):
        rr = out.get("run_result")
        if isinstance(rr, Mapping):
            return str(rr.get("stdout") or "")
    return ""


async def replay_policy(cluster: ClusterSpec, steps: Sequence[Sequence[Trajectory]], policy: str,
                        *, trace: str, units_per_s: float, train_s: float = 0.0,
                        url: str | None = None, progress: Progress | None = None,
                        cpu_config: Mapping[str, Any] | None = None,
                        images: Mapping[str, str] | None = None) -> ReplayReport:
    """One policy on a fresh engine (or on the service at ``url``); ``images``: name -> path
    of the environment images the trace's sessions run in."""
    n, shares = core_settings(steps, cluster)
    backend: Any
    if url:
        backend = HttpBackend(url, images=images)
    else:
        backend = EmbeddedBackend(cluster, policy, n, shares, cpu_config=cpu_config,
                                  images=images, core_kw=warm_settings(steps))
    await backend.start()
    try:
        if url:
            policy = backend.policy
        await _settle(backend)
        return await replay(backend, steps, cluster, policy=policy, trace=trace,
                            units_per_s=units_per_s, train_s=train_s, progress=progress)
    finally:
        await backend.aclose()


def warm_settings(steps: Sequence[Sequence[Trajectory]]) -> dict[str, Any]:
    """The warm-pool settings `sim.runner.run_policy` gives every core from the first RL step
    (the one-shot keys, named, and one warm sandbox per trajectory that uses each), so that
    the real core and the predicted one start from the same pools."""
    from ..sim import runner

    first = list(steps[0]) if steps else []
    return {"warm_keys": runner.warm_keys(first), "warm_boot": runner.warm_boot(first)}


def core_settings(steps: Sequence[Sequence[Trajectory]], cluster: ClusterSpec,
                  ) -> tuple[int, dict[str, float]]:
    """What `sim.runner.run_policy` gives the core from the first RL step: the number of
    trajectories with CPU work (trajectory-bound's slices) and the measured task shares
    (task-isolated's pools) -- computed by the runner's own functions."""
    from ..sim import runner

    first = list(steps[0]) if steps else []
    uses = getattr(runner, "uses_cpu", None)
    n = sum(1 for t in first if uses(t)) if uses is not None else len(first)
    return max(1, n), (runner.measured_task_shares(first, cluster) if first else {})


async def _settle(backend: Any, timeout_s: float = 3.0, models_s: float = 600.0) -> None:
    """Let a fresh node's warm pool fill, and the model instances the core loads at its start
    finish loading, before the first arrival (every policy alike): the simulator's set-up
    (`Simulator.run`), which no step or ACT includes."""
    if not isinstance(backend, EmbeddedBackend):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = [sum(h.cpu.warm_state().values()) for h in backend.executor.hosts.values()]
        if all(r >= 2 for r in ready):
            break
        await asyncio.sleep(0.05)
    if not backend.cluster.models:
        return
    # the core places its first instances at its first events (ticks): give it two, then wait
    # out their loads
    await asyncio.sleep(2 * backend.tick_s)
    deadline = time.monotonic() + models_s
    while any(i.state == "loading" for i in backend.engine.cluster_view().instances) \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def warm_process(cluster: ClusterSpec) -> None:
    """Pay this process's one-time costs before any policy runs, so that none of them is charged
    to the first policy: the imports of the model stack and each model kind's first
    construction (lazy modules), by loading every model of the cluster once and dropping it."""
    if not cluster.models:
        return
    try:
        from ..managers.gpu import GpuManager, GpuManagerConfig
    except ImportError:
        return

    async def go() -> None:
        mgr = GpuManager(GpuManagerConfig(device="auto", cpu_devices=1,
                                          cpu_device_memory_mb=1e9), cluster.models)
        try:
            for m in cluster.models:
                if m.devices == 1:
                    await mgr.load(f"warm-{m.name}", m.name, (0,))
                    await mgr.unload(f"warm-{m.name}", park=False)
        finally:
            await mgr.aclose()

    with contextlib.suppress(Exception):
        asyncio.run(go())


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


__all__ = ["EmbeddedBackend", "HttpBackend", "ReplayReport", "Status", "action_payload",
           "machine_cores", "replay", "replay_policy"]
