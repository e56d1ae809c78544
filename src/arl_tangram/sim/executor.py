"""The virtual executor: carries out the core's commands in virtual time and reports events.

Invariant: the executor decides nothing. It answers every command the way a real node would,
after the time the simulator's truth says it takes: StartAction -> ActionStarted (after a cold
start when no warm sandbox or session is ready) -> exactly one ActionFinished after
``work / speed(allotment)`` (re-computed on every ResizeAction), or TIMED_OUT at the action's
timeout; RunBatch -> BatchFinished after ``alpha + sum(work)`` (a judge engine, ``max_seqs > 0``:
its batches share the instance step by step, `engine_model`); LoadModel -> ModelLoaded after
``load_s`` (``swap_s`` from host); ResizeWarmPool -> WarmPoolReport when sandboxes are ready.
Every report goes through the event loop (never re-entrantly into the core), and a report made
stale by a resize or a cancel is dropped by its version number. The executor also keeps the
``busy`` and ``held`` resource vectors that `Metrics` integrates over time. A start the core
marks warm where no warm pool exists is a resident sandbox (the static policies keep one per
trajectory or pool slot for its whole life) and costs nothing; a rigid action on less CPU than
it demands runs proportionally slower (`ActionSpec.speed`), as under a CFS quota.

Two measured figures of a node (`NodeSpec`, written by `tangram calibrate`) make the truth the
machine's rather than ideal (the core sees ``parallel_speedup`` too, as a measured figure of
its spec, for elastic widths: docs/core.md; it never sees the work an action really takes):
- ``parallel_speedup``: the node is a processor shared by its running actions. While the CPU
  allotments of the actions executing on it sum to ``B`` cores, it delivers only
  `NodeSpec.parallel_cores` ``(B)`` of them (what fully parallel work measured on ``B`` cores),
  so each runs at its own speed (`ActionSpec.speed`: Amdahl, or a quota's fraction) times
  ``parallel_cores(B) / B``, recomputed whenever ``B`` changes (a start, a finish, a resize).
  One elastic action alone on two cores gets the measured two-core speedup on its parallel part;
  two rigid one-core actions at once share what two busy cores really give. Up to one busy core
  nothing changes;
- ``dispatch_s``: after its start-up, an action spends its kind's fixed cost before its work
  begins (the runtime's own dispatch, program start and reply), holding its allotment and not
  stretched by it; a resize during it changes only the speed of the work that follows. A model
  batch's BatchFinished comes its kind's cost (``reward``, ``judge``: only where measured for
  that kind, never the default's) after its forward, its reported latency the forward's;
- ``parallel_start_s``: an elastic CPU action with a parallel part that starts on more than one
  core also spends the node's start cost at that width before its work (its workers start one
  after another, so the width is not all in use at once). One that starts on one core and grows
  later pays nothing: its workers were started while it had one core;
- ``device_cores``: the node's model devices are CPU-backed, so a batch's forward runs on the
  node's own processor. It joins the node's shared runs for its ``alpha + sum(work)`` at
  ``device_cores`` per device of its instance: it slows the sandboxes running beside it and is
  slowed by them, and its BatchFinished reports the latency it really took. (The judge engine,
  ``max_seqs > 0``, does not join: its steps are modelled apart, `engine_model`.)
While the busy cores exceed the node's capacity (only a CPU-backed forward takes cores the core
did not allot), the node delivers ``parallel_cores(capacity)`` among them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..core import commands as C
from ..core import events as E
from ..core.actions import ActionKind, ActionSpec, Status
from ..core.build import make_finished, make_started, make_warm_report
from ..core.cluster import ClusterSpec, ModelSpec, NodeSpec
from ..core.records import warm_key
from ..core.resources import CPU, GPU, GPU_MEMORY_MB, Resources
from .engine_model import EngineState, schedule
from .loop import REPORT, EventLoop
from .metrics import BOTH_SUB, BUSY_ADD, HELD_ADD, UsageMeter
from .trace import DEFAULT_COLD_START_S, SimAction

Emit = Callable[[E.Event], None]
_SUCCEEDED, _FAILED, _TIMED_OUT = Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT
_FORWARD = SimAction(ActionKind.REWARD, 0.0, Resources())  # pragma: no mutate (a forward's run: its truth is unused)


def _no_log(_value: object) -> None:
    """The log's appenders without a meter (never called: every use checks ``usage``)."""


# CFS bandwidth control's period (the kernel's default, and the CPU manager's `cpu.max`).
CFS_PERIOD_S = 0.1


def cfs_speed(work: float, s: float) -> float:
    """The average speed of ``work`` (seconds at full speed) under a CFS quota of ``s`` (< 1)
    of what it needs. A throttled cgroup starts with quota in hand: measured on this project's
    sandboxes (2026-11-25, cgroup v1), a quarter-core action ran its first ~45-50 ms of work
    unthrottled (0.023 s of work: 0.92-1.00x its 1-core time; 0.053 s: 1.06-1.10x; 0.10 s:
    2.4-3.1x; 0.25 s: 3.2-3.6x; 0.45 s: 3.7x), and a half-core one its first ~0.1 s: about two
    periods' quota. So: the first ``2 * s * CFS_PERIOD_S`` of work at full speed, the rest at
    ``s`` (a short action barely feels a small slice; a long one runs at the slice's speed)."""
    if s <= 0.0:
        return s
    burst = 2.0 * s * CFS_PERIOD_S
    if work <= burst:
        return 1.0
    return work / (burst + (work - burst) / s)


def _speed(run: _Run, allotment: Resources) -> float:
    """A run's speed at ``allotment``: its spec's, and for a rigid action on a fractional
    slice, the CFS quota's average over its whole work (`cfs_speed`)."""
    v = run.spec.speed(allotment)
    if v < 1.0 and run.spec.elasticity is None:
        return cfs_speed(run.truth.work_s, v)
    return v


@dataclass(slots=True)
class _Run:
    spec: ActionSpec
    truth: SimAction
    node: str
    allotment: Resources
    version: int = 0
    started: bool = False  # past its cold start, executing
    remaining: float = 0.0  # work left (seconds at one unit)
    speed: float = 1.0
    since: float = 0.0  # when `remaining` was last brought up to date
    deadline: float = float("inf")  # start + timeout
    ucode: int = 0  # `UsageMeter.code` of ``allotment`` (with a meter)
    shared: bool = False  # counted in its node's busy cores (`VirtualExecutor._busy`)
    # a model batch's forward on the node's processor (``spec``: its first action), not an
    # action's: called at the forward's end instead of `VirtualExecutor._finished`
    done: Callable[[], None] | None = None


@dataclass(slots=True)
class _Instance:
    model: ModelSpec
    node: str
    devices: tuple[int, ...]
    loaded: bool = False
    busy: bool = False
    queue: deque[C.RunBatch] = field(default_factory=deque)
    engine: EngineState | None = None  # continuous batching (model.max_seqs > 0)

    def footprint(self) -> Resources:
        n = len(self.devices)
        return Resources({GPU: n, GPU_MEMORY_MB: self.model.memory_mb * n})


@dataclass(slots=True)
class _Pool:
    ready: int = 0
    starting: int = 0
    target: int = 0


class VirtualExecutor:
    """Executes commands against the simulator's truth; reports events through the loop."""

    def __init__(
        self,
        loop: EventLoop,
        cluster: ClusterSpec,
        truth: Mapping[str, SimAction],
        emit: Emit,
        *,
        usage: UsageMeter | None = None,
        session_cold_start: Mapping[str, float] | None = None,
        warm_cold_start_s: float = DEFAULT_COLD_START_S,
    ) -> None:
        self.loop = loop
        self.models = {m.name: m for m in cluster.models}
        # nodes with a measured parallel speedup, dispatch or start cost (most specs have none:
        # the hot path then takes `ActionSpec.speed` and no dispatch, as before)
        self.measured: dict[str, NodeSpec] = {
            n.name: n for n in cluster.nodes
            if n.parallel_speedup or n.dispatch_s or n.parallel_start_s}
        # nodes with a measured parallel speedup: the executing runs and their busy cores
        self._busy: dict[str, tuple[dict[str, _Run], list[float]]] = {
            n.name: ({}, [0.0]) for n in cluster.nodes if n.parallel_speedup}
        # the most cores each of those delivers to (a node without CPU capacity: no bound)
        self._cores: dict[str, float] = {
            n.name: n.capacity.get(CPU) or float("inf") for n in cluster.nodes if n.parallel_speedup}
        # nodes with CPU-backed model devices whose forwards share that processor: cores/device
        self._device_cores: dict[str, float] = {
            n.name: n.device_cores for n in cluster.nodes if n.parallel_speedup and n.device_cores}
        self.truth = truth  # action id -> SimAction (the simulator fills it before arrival)
        self.emit = emit
        self.usage = usage  # integrates busy / held resources over virtual time
        # the meter's log, for the three changes of every action (`UsageMeter.recorder`)
        self._log_time: Callable[[float], None] = _no_log
        self._log_entry: Callable[[int], None] = _no_log
        if usage is not None:
            self._log_time, self._log_entry = usage.recorder()
        self.session_cold_start = session_cold_start if session_cold_start is not None else {}
        self.warm_cold_start_s = warm_cold_start_s
        self.runs: dict[str, _Run] = {}
        self.sessions: dict[str, tuple[str, float, Resources]] = {}  # id -> node, ready_at, demand
        self.instances: dict[str, _Instance] = {}
        self.pools: dict[tuple[str, str], _Pool] = {}
        self.cold_starts = 0
        self.warm_starts = 0
        # provider name -> a model of it that answers calls (rate limits, 429s): sim/providers
        self.providers: dict[str, Any] = {}

    # ---- dispatch ----------------------------------------------------------------------------
    def execute(self, cmd: C.Command) -> None:
        handler = _HANDLERS.get(type(cmd))
        if handler is None:
            raise TypeError(f"the virtual executor cannot run {type(cmd).__name__}")
        handler(self, cmd)

    def _report(self, delay: float, event_factory: Callable[[float], E.Event | None]) -> None:
        self.loop.after(max(0.0, delay), self._fire, event_factory, priority=REPORT)

    def _fire(self, event_factory: Callable[[float], E.Event | None]) -> None:
        event = event_factory(self.loop.now)
        if event is not None:  # None: the report went stale (resized, cancelled, unloaded)
            self.emit(event)

    def _usage(self, busy: Resources | None, held: Resources | None, sign: int) -> None:
        if self.usage is not None:
            self.usage.change(busy, held, sign)

    # ---- actions -----------------------------------------------------------------------------
    def _start(self, cmd: C.StartAction) -> None:
        spec = cmd.action
        truth = self.truth.get(spec.id)
        if truth is None:
            raise KeyError(f"action {spec.id}: no truth recorded (the simulator did not submit it)")
        run = _Run(spec, truth, cmd.node, cmd.allotment, remaining=truth.work_s)
        old = self.runs.get(spec.id)
        if old is not None:  # re-run after node loss: the old attempt is gone
            self._release(old)
        self.runs[spec.id] = run
        loop = self.loop
        now = loop.now
        if self.usage is not None:  # `usage.change_at(now, None, cmd.allotment, +1)`, logged
            run.ucode = self.usage.code(cmd.allotment)
            self._log_time(now)
            self._log_entry(run.ucode | HELD_ADD)
        delay = self._startup_delay(spec, cmd.node, cmd.warm, truth)
        # as `_report`, without a closure (this is the hot path): `_began` after ``delay``
        loop.push(now + (delay if delay > 0.0 else 0.0), REPORT, self._began, (run, run.version, delay))

    def _startup_delay(self, spec: ActionSpec, node: str, warm: bool, truth: SimAction) -> float:
        if spec.session is not None:
            sess = self.sessions.get(spec.session)
            if sess is not None and sess[0] == node:
                return max(0.0, sess[1] - self.loop.now)
        if warm:
            key = warm_key(spec)
            pool = self.pools.get((node, key)) if self.pools else None
            if pool is None:  # a resident sandbox (static stacks keep theirs): no start
                self.warm_starts += 1
                return 0.0
            if pool.ready > 0:
                pool.ready -= 1
                self.warm_starts += 1
                self._refill(node, key, pool)
                return 0.0
        self.cold_starts += 1
        return truth.cold_start_s

    def _began(self, run: _Run, version: int, cold: float) -> None:
        """The run's start-up (``cold`` seconds of it) is over: it executes from now on."""
        if self.runs.get(run.spec.id) is not run or run.version != version:
            return  # stale: resized or cancelled meanwhile
        t = self.loop.now
        spec = run.spec
        run.started = True
        run.since = t
        run.deadline = t + spec.timeout_s
        run.speed = _speed(run, run.allotment)  # (a rigid action on a fractional slice: < 1)
        if self.measured and run.node in self.measured:
            node = self.measured[run.node]
            fixed = node.dispatch_for(spec.kind.value)
            el = spec.elasticity
            if node.parallel_start_s and el is not None and el.dim == CPU \
                    and el.speedup.parallel_fraction > 0.0:
                fixed += node.parallel_start_for(run.allotment.get(CPU))
            run.since = t + fixed  # the work begins after it
            if run.node in self._busy:
                self._share(run, +1)  # schedules every run of the node, this one included
        if self.usage is not None:  # `usage.change_at(t, run.allotment, None, +1)`, logged
            self._log_time(t)
            self._log_entry(run.ucode | BUSY_ADD)
        if not run.shared:
            self._schedule_finish(run)
        self.emit(make_started(t, spec.id, run.node, cold))  # E.ActionStarted(...)

    def _share(self, run: _Run, sign: int) -> None:
        """``run`` begins (+1) or stops (-1) executing on a node with a measured parallel
        speedup: every run executing there gets the node's new share, its finish rescheduled."""
        runs, busy = self._busy[run.node]
        if sign > 0:
            runs[run.spec.id] = run
            run.shared = True
        else:
            runs.pop(run.spec.id, None)
            run.shared = False
        busy[0] = max(0.0, busy[0] + sign * run.allotment.get(CPU, 0.0))
        self._reshare(run.node)

    def _reshare(self, node_name: str) -> None:
        runs, busy = self._busy[node_name]
        b = busy[0]
        cores = self._cores[node_name]
        share = self.measured[node_name].parallel_cores(b if b < cores else cores) / b if b > 1.0 else 1.0
        now = self.loop.now
        for r in runs.values():
            if now > r.since:  # bring its work up to date at the old speed
                r.remaining = max(0.0, r.remaining - (now - r.since) * r.speed)
                r.since = now
            r.speed = (_speed(r, r.allotment) if r.done is None else 1.0) * share
            self._schedule_finish(r)

    def _schedule_finish(self, run: _Run) -> None:
        run.version += 1
        end = run.since + (run.remaining / run.speed if run.speed > 0 else float("inf"))
        self.loop.push(end if end < run.deadline else run.deadline, REPORT,
                       self._finished if run.done is None else self._forward_end,
                       (run, run.version))  # min(end, deadline), without the builtin's call

    def _forward_end(self, run: _Run, version: int) -> None:
        """A model batch's forward on the node's shared processor is over."""
        if run.version != version or run.done is None:
            return  # stale: the node's share changed since
        self._share(run, -1)
        run.done()

    def _finished(self, run: _Run, version: int) -> None:
        """The run's work is done, or its time is up."""
        if self.runs.get(run.spec.id) is not run or run.version != version:
            return  # stale: resized or cancelled meanwhile
        t = self.loop.now
        del self.runs[run.spec.id]
        if run.shared:
            self._share(run, -1)
        if self.usage is not None:  # `_release(run)`, inlined: a run that finishes has started
            self._log_time(t)  # `usage.change_at(t, a, a, -1)`, logged
            self._log_entry(run.ucode | BOTH_SUB)
        ran = t - (run.deadline - run.spec.timeout_s)
        done = run.remaining - max(0.0, t - run.since) * run.speed
        # E.ActionFinished(time, action_id, status, output, reason, run_s), built fast (core.build)
        if done > 1e-9 and t >= run.deadline - 1e-12:
            event = make_finished(t, run.spec.id, _TIMED_OUT, None, "timeout", ran)
        elif run.truth.fails:
            event = make_finished(t, run.spec.id, _FAILED, {"exit_code": 1}, "", ran)
        else:
            event = make_finished(t, run.spec.id, _SUCCEEDED, {"exit_code": 0}, "", ran)
        self.emit(event)

    def _release(self, run: _Run) -> None:
        if run.shared:
            self._share(run, -1)
        if self.usage is not None:
            self.usage.change(run.allotment if run.started else None, run.allotment, -1)

    def _resize(self, cmd: C.ResizeAction) -> None:
        run = self.runs.get(cmd.action_id)
        if run is None:
            return  # finished meanwhile: the core will see its ActionFinished
        now = self.loop.now
        if run.started:
            if now > run.since:  # (before it: still in its dispatch, no work done yet)
                run.remaining = max(0.0, run.remaining - (now - run.since) * run.speed)
                run.since = now
            self._usage(run.allotment, run.allotment, -1)
            if run.shared:  # the node's busy cores change: every run there is re-shared
                self._busy[run.node][1][0] += cmd.allotment.get(CPU, 0.0) - run.allotment.get(CPU, 0.0)
                run.allotment = cmd.allotment
                self._usage(run.allotment, run.allotment, +1)
                self._reshare(run.node)
            else:
                run.allotment = cmd.allotment
                run.speed = _speed(run, cmd.allotment)
                self._usage(run.allotment, run.allotment, +1)
                self._schedule_finish(run)
        else:
            self._usage(None, run.allotment, -1)
            run.allotment = cmd.allotment
            self._usage(None, run.allotment, +1)
        if self.usage is not None:
            run.ucode = self.usage.code(run.allotment)

    def _cancel(self, cmd: C.CancelAction) -> None:
        run = self.runs.pop(cmd.action_id, None)
        if run is not None:
            self._release(run)

    # ---- sessions ----------------------------------------------------------------------------
    def _open_session(self, cmd: C.OpenSession) -> None:
        cold = self.session_cold_start.get(cmd.session_id, DEFAULT_COLD_START_S)
        if cold > 0:
            self.cold_starts += 1  # the session's sandbox is created cold
        self.sessions[cmd.session_id] = (cmd.node, self.loop.now + cold, cmd.demand)
        self._usage(None, cmd.demand, +1)

    def _close_session(self, cmd: C.CloseSession) -> None:
        sess = self.sessions.pop(cmd.session_id, None)
        if sess is not None:
            self._usage(None, sess[2], -1)

    # ---- warm pools --------------------------------------------------------------------------
    def _resize_pool(self, cmd: C.ResizeWarmPool) -> None:
        pool = self.pools.setdefault((cmd.node, cmd.key), _Pool())
        pool.target = max(0, cmd.size)
        if pool.ready > pool.target:
            pool.ready = pool.target
            self._report(0.0, partial(self._pool_report, cmd.node, cmd.key, pool))
        self._refill(cmd.node, cmd.key, pool)

    def _refill(self, node: str, key: str, pool: _Pool) -> None:
        loop = self.loop
        d = self.warm_cold_start_s
        while pool.ready + pool.starting < pool.target:
            pool.starting += 1
            # `self._report(d, partial(self._warm_ready, node, key, pool))`, without the partial
            # and the closure (a warm start refills its pool: most actions come here)
            loop.push(loop.now + (d if d > 0.0 else 0.0), REPORT, self._warm_ready,
                      (node, key, pool))

    def _pool_report(self, node: str, key: str, pool: _Pool, t: float) -> E.Event:
        return E.WarmPoolReport(t, node, key, pool.ready)

    def _warm_ready(self, node: str, key: str, pool: _Pool) -> None:
        """A sandbox `_refill` started is ready."""
        pool.starting -= 1
        if pool.ready < pool.target:
            pool.ready += 1
        self.emit(make_warm_report(self.loop.now, node, key, pool.ready))

    # ---- models ------------------------------------------------------------------------------
    def _load(self, cmd: C.LoadModel) -> None:
        model = self.models.get(cmd.model)
        if model is None:
            self._report(0.0, lambda t: E.ModelLoaded(t, cmd.instance_id, ok=False, reason=f"unknown model {cmd.model!r}"))
            return
        inst = _Instance(model, cmd.node, tuple(cmd.devices))
        self.instances[cmd.instance_id] = inst
        self._usage(None, inst.footprint(), +1)
        secs = model.swap_s if cmd.from_host else model.load_s
        self._report(secs, partial(self._loaded, cmd, inst, secs))

    def _loaded(self, cmd: C.LoadModel, inst: _Instance, secs: float, t: float) -> E.Event | None:
        if self.instances.get(cmd.instance_id) is not inst:
            return None
        inst.loaded = True
        self._drain(cmd.instance_id, inst)
        return E.ModelLoaded(t, cmd.instance_id, ok=True, load_s=secs, from_host=cmd.from_host)

    def _unload(self, cmd: C.UnloadModel) -> None:
        inst = self.instances.pop(cmd.instance_id, None)
        if inst is not None:
            self._usage(None, inst.footprint(), -1)
            while inst.queue:  # batches that never ran on it fail (a running one completes)
                q = inst.queue.popleft()
                failed = {a.id: "instance unloaded" for a in q.actions}
                self._report(0.0, partial(self._batch_failed, q, failed))
        self._report(0.0, lambda t: E.ModelUnloaded(t, cmd.instance_id, parked=cmd.park))

    def _run_batch(self, cmd: C.RunBatch) -> None:
        inst = self.instances.get(cmd.instance_id)
        if inst is None:
            failed = {a.id: "instance not loaded" for a in cmd.actions}
            self._report(0.0, partial(self._batch_failed, cmd, failed))
            return
        inst.queue.append(cmd)
        self._drain(cmd.instance_id, inst)

    def _batch_failed(self, cmd: C.RunBatch, failed: dict[str, str], t: float) -> E.Event:
        return E.BatchFinished(t, cmd.batch_id, cmd.instance_id, failed=failed)

    def _drain(self, instance_id: str, inst: _Instance) -> None:
        if inst.model.max_seqs > 0:
            self._engine_join(inst)
            return
        if inst.busy or not inst.loaded or not inst.queue:
            return
        cmd = inst.queue.popleft()
        inst.busy = True
        self._usage(inst.footprint(), None, +1)
        latency = inst.model.alpha + sum(self._work(a) for a in cmd.actions)
        # the engine's own cost of the batch's kind, where measured for it (not the default)
        node = self.measured.get(inst.node)
        extra = node.dispatch_s.get(cmd.actions[0].kind.value, 0.0) if node is not None else 0.0
        cores = self._device_cores.get(inst.node, 0.0) * len(inst.devices)
        if cores > 0.0:  # CPU-backed devices: the forward shares the node's processor
            t0 = self.loop.now
            run = _Run(cmd.actions[0], _FORWARD, inst.node, Resources({CPU: cores}),
                       started=True, remaining=latency, since=t0)
            run.done = lambda: self._report(
                extra, partial(self._batch_done, cmd, inst, self.loop.now - t0))
            self._share(run, +1)  # (schedules its end)
            return
        self._report(latency + extra, partial(self._batch_done, cmd, inst, latency))

    def _engine_join(self, inst: _Instance) -> None:
        """A judge engine: every queued batch joins the sequences in flight at once."""
        if not inst.loaded or not inst.queue:
            return
        st = inst.engine
        if st is None:
            m = inst.model
            st = inst.engine = EngineState(m.alpha, m.beta, last=self.loop.now, prefill_s=m.prefill_s,
                                           cache_tokens=int(m.options.get("prefix_cache_tokens", 0)))
        if not st.remaining:
            self._usage(inst.footprint(), None, +1)
        while inst.queue:
            cmd = inst.queue.popleft()
            st.join(cmd, {a.id: self._work(a) for a in cmd.actions}, self.loop.now)
            for a in cmd.actions:
                st.prefill(a.trajectory, a.hints.prompt_tokens or 0)
        schedule(st, self.loop.now, partial(self._engine_at, inst))

    def _engine_at(self, inst: _Instance, time: float, gen: int) -> None:
        self.loop.at(time, self._engine_wake, inst, gen, priority=REPORT)

    def _engine_wake(self, inst: _Instance, gen: int) -> None:
        st = inst.engine
        if st is None or gen != st.gen:
            return  # stale: sequences joined or left since
        for cmd, latency in st.finish_due(self.loop.now):
            self.emit(self._batch_result(cmd, latency, self.loop.now))
        if not st.remaining:
            self._usage(inst.footprint(), None, -1)
        schedule(st, self.loop.now, partial(self._engine_at, inst))

    def _work(self, spec: ActionSpec) -> float:
        truth = self.truth.get(spec.id)
        if truth is not None:
            return truth.work_s
        model = self.models.get(spec.model or "")
        return model.beta if model is not None else 0.0

    def _batch_done(self, cmd: C.RunBatch, inst: _Instance, latency: float, t: float) -> E.Event:
        inst.busy = False
        self._usage(inst.footprint(), None, -1)
        if self.instances.get(cmd.instance_id) is inst:
            self._drain(cmd.instance_id, inst)
        return self._batch_result(cmd, latency, t)

    def _batch_result(self, cmd: C.RunBatch, latency: float, t: float) -> E.Event:
        outputs: dict[str, object] = {}
        failed: dict[str, str] = {}
        for a in cmd.actions:
            truth = self.truth.get(a.id)
            if truth is not None and truth.fails:
                failed[a.id] = "scoring failed"
            else:
                outputs[a.id] = {"score": 0.0}
        return E.BatchFinished(t, cmd.batch_id, cmd.instance_id, outputs, failed, latency_s=latency)


def _call_provider(self: VirtualExecutor, cmd: C.CallProvider) -> None:
    """A provider call (issue 37): answered after the truth's ``work_s`` (the provider's
    latency), or by the simulator's provider model when it has one (`providers`)."""
    model = self.providers.get(cmd.provider) if self.providers else None
    if model is not None:
        model.call(self, cmd)
        return
    truth = self.truth.get(cmd.action.id)
    latency = truth.work_s if truth is not None else 0.0
    aid = cmd.action.id
    self._report(latency, lambda t: make_finished(t, aid, _SUCCEEDED, {"provider": cmd.provider},
                                                  "", latency))


def _wake_at(self: VirtualExecutor, cmd: C.WakeAt) -> None:
    """The core asked to be woken at ``cmd.time`` (a provider's next token)."""
    self.loop.at(max(cmd.time, self.loop.now), self._fire, E.Wake, priority=REPORT)


_HANDLERS: dict[type, Callable[[VirtualExecutor, object], None]] = {
    C.CallProvider: _call_provider,  # type: ignore[dict-item]
    C.WakeAt: _wake_at,  # type: ignore[dict-item]
    C.StartAction: VirtualExecutor._start,  # type: ignore[dict-item]
    C.ResizeAction: VirtualExecutor._resize,  # type: ignore[dict-item]
    C.CancelAction: VirtualExecutor._cancel,  # type: ignore[dict-item]
    C.OpenSession: VirtualExecutor._open_session,  # type: ignore[dict-item]
    C.CloseSession: VirtualExecutor._close_session,  # type: ignore[dict-item]
    C.ResizeWarmPool: VirtualExecutor._resize_pool,  # type: ignore[dict-item]
    C.LoadModel: VirtualExecutor._load,  # type: ignore[dict-item]
    C.UnloadModel: VirtualExecutor._unload,  # type: ignore[dict-item]
    C.RunBatch: VirtualExecutor._run_batch,  # type: ignore[dict-item]
}
