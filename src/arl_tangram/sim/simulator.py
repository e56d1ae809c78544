"""The simulator: replays trajectories closed-loop against a scheduler core in virtual time.

Invariant: the core under test is driven exactly as the engine drives it in production: events
in (with the virtual time they happened), commands out, commands executed by an executor that
reports back with events. The core sees an action only when its trajectory issues it: the next
action of a trajectory arrives only after the previous one was delivered plus its generation time
(closed loop). An RL step is the rollout of one batch of trajectories followed by a training
phase during which nothing arrives; the next step starts when training ends.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..core import commands as C
from ..core import events as E
from ..core.actions import ActionResult, Status
from ..core.build import make_arrived, make_spec
from ..core.cluster import ClusterSpec
from ..core.images import warm_key
from ..core.protocol import Scheduler  # what the simulator drives: the Core or a fake
from .bounds import ReleaseLog, previous_prompt
from .executor import VirtualExecutor
from .loop import ARRIVAL, FLUSH, TICK, EventLoop
from .metrics import ActRecorder, SimReport, UsageMeter, build_report
from .trace import DEFAULT_COLD_START_S, SimAction, Trajectory


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """How the simulator runs (not what it runs: that is the workload)."""

    tick_s: float = 1.0  # virtual seconds between Tick events (aging, TTLs, scale-in)
    train_s: float = 0.0  # training phase after each rollout: no arrivals meanwhile
    stall_s: float = 3600.0  # stop, marked stalled, after this long without progress
    horizon_s: float = math.inf  # hard limit on virtual time
    warm_cold_start_s: float = DEFAULT_COLD_START_S  # TRUE start time of a warm-pool sandbox
    series_points: int = 600  # at most this many utilization samples kept for plots
    # During `run` (and the report's bound): freeze what exists (gc.freeze) and keep the cyclic
    # collector off; a tick runs one young collection once GC_VALVE tracked objects born since
    # the last are still alive. A run makes no reference cycles (every collection of a tuned run
    # of swe-agent at 2,000 and 20,000 trajectories found 0 objects to free, issue 24) while
    # the collector rescanned its millions of live objects for nothing (~9% of a 20,000-
    # trajectory run); the valve bounds what a cycle could hold. This changes collector time,
    # never what is simulated. False: leave the collector alone.
    gc_tuning: bool = True

    def __post_init__(self) -> None:
        for name in ("tick_s", "stall_s", "horizon_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"SimConfig.{name} must be > 0, got {v!r}")
        for name in ("train_s", "warm_cold_start_s"):
            v = getattr(self, name)
            if not v >= 0 or math.isinf(v):
                raise ValueError(f"SimConfig.{name} must be a finite number >= 0, got {v!r}")
        if self.series_points < 2:
            raise ValueError(f"SimConfig.series_points must be >= 2, got {self.series_points!r}")


# Events that show progress. Exact types (a set lookup, not `isinstance`): every event `_emit`
# sees is built here or in the executor, of exactly these classes.
_PROGRESS = frozenset((E.ActionStarted, E.BatchFinished))
_DELIVER = C.Deliver
_START = C.StartAction


class _Live:
    """A trajectory being replayed: which step it is at, which sessions it opened."""

    __slots__ = ("index", "opened", "traj")

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.index = 0
        self.opened: set[str] = set()


class Simulator:
    """One simulation run: a cluster, a scheduler, trajectories in RL steps -> `SimReport`."""

    def __init__(self, cluster: ClusterSpec, scheduler: Scheduler, config: SimConfig | None = None,
                 *, policy: str = "?", workload: str = "?", seed: int = 0,
                 reserved: Callable[[Iterable[Trajectory]], Mapping[str, float]] | None = None,
                 ) -> None:
        self.cluster = cluster
        self.core = scheduler
        self.config = config or SimConfig()
        self.labels = (policy, workload, seed)
        self.reserved = reserved  # live trajectories -> resources a static policy holds for them
        self.loop = EventLoop()
        clock = self.loop.clock
        self.usage = UsageMeter(cluster.total_capacity(), clock.now,
                                series_points=self.config.series_points)
        self.truth: dict[str, object] = {}
        self.session_cold: dict[str, float] = {}
        self.executor = VirtualExecutor(
            self.loop, cluster, self.truth, self._emit, usage=self.usage,  # type: ignore[arg-type]
            session_cold_start=self.session_cold, warm_cold_start_s=self.config.warm_cold_start_s)
        self.acts = ActRecorder()
        self.releases = ReleaseLog(cluster)  # what this run's bound needs (`sim.bounds`)
        self.live: dict[str, _Live] = {}  # trajectory id -> state
        self.owner: dict[str, tuple[_Live, str]] = {}  # action id -> (trajectory, kind)
        self.steps: list[float] = []
        self.events = 0
        self._step_start = 0.0
        self._last_progress = 0.0
        self._done = False
        self._stalled = False
        self._first_arrival: float | None = None
        self._end: float | None = None
        self._iter: Iterator[Sequence[Trajectory]] = iter(())
        self._together: list[object] = []  # model actions submitted at this instant (`_flush`)
        # provider calls (issue 37): answers kept this long (0: no cache), query -> when answered
        self.cache_ttl_s = 0.0
        self.answered: dict[str, float] = {}
        self.cache_hits = 0
        self.calls_log: list[tuple[float, float, str]] = []  # (release, true latency, query)

    # ---- event plumbing ----------------------------------------------------------------------
    def _emit(self, event: E.Event) -> None:
        self.events += 1
        if type(event) in _PROGRESS:
            self._last_progress = event.time
        cmds = self.core.handle(event)
        if cmds:
            executor = self.executor
            for cmd in cmds:
                if type(cmd) is _DELIVER:
                    self._deliver(cmd.result)
                elif type(cmd) is _START:  # `executor.execute(cmd)`, dispatched here: one per action
                    executor._start(cmd)
                else:
                    executor.execute(cmd)

    def _later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        loop = self.loop
        loop.push(loop.clock._now + delay, ARRIVAL, fn, args)

    # ---- RL steps ----------------------------------------------------------------------------
    def _next_step(self) -> None:
        batch = next(self._iter, None)
        if batch is None:
            self._done = True
            self._end = self.loop.now
            self.usage.freeze()
            return
        self._step_start = self.loop.now
        if not batch:
            self.steps.append(self.config.train_s)
            self._later(self.config.train_s, self._next_step)
            return
        for traj in batch:
            live = _Live(traj)
            if traj.id in self.live:
                raise ValueError(f"trajectory id {traj.id!r} is replayed twice at once")
            self.live[traj.id] = live
            self._later(traj.start + traj.steps[0][0], self._submit, live)

    def _trajectory_done(self, live: _Live) -> None:
        traj = live.traj
        del self.live[traj.id]
        for name in sorted(live.opened) if live.opened else ():
            self._later(0.0, self._emit_now, E.SessionClosed, traj.session_id(name), "trajectory ended")
        if not self.live:
            rollout = self.loop.now - self._step_start
            self.steps.append(rollout + self.config.train_s)
            self._later(self.config.train_s, self._next_step)

    def _emit_now(self, cls: type, *args: object) -> None:
        self._emit(cls(self.loop.now, *args))

    # ---- trajectories ------------------------------------------------------------------------
    def _submit(self, live: _Live) -> None:
        traj = live.traj
        now = self.loop.clock._now
        if self._first_arrival is None:
            self._first_arrival = now
            self.usage.restart()
        act = traj.steps[live.index][1]
        sid = None
        if act.session is not None:
            sid = traj.session_id(act.session)
            if act.session not in live.opened:
                live.opened.add(act.session)
                sdef = traj.sessions.get(act.session)
                demand = sdef.demand if sdef else None
                ttl = sdef.ttl_s if sdef else 3600.0
                self.session_cold[sid] = sdef.cold_start_s if sdef else DEFAULT_COLD_START_S
                wkey = warm_key(sdef.image) if sdef is not None and sdef.image else None
                req = E.SessionRequested(now, sid, demand, ttl, None, traj.id, traj.task, wkey) \
                    if demand is not None else \
                    E.SessionRequested(now, sid, ttl_s=ttl, trajectory=traj.id, task=traj.task)
                self._emit(req)
        aid = f"{traj.id}#{live.index}"
        # `act.spec(aid, task=traj.task, trajectory=traj.id, session_id=sid,
        # siblings=traj.siblings)`, inlined
        spec = make_spec(aid, act.kind, act.demand, act.elasticity, act.hints, traj.task, traj.id,
                         sid, act.model, act.tag, act.timeout_s, act.weight, True,
                         {} if act.query is None else self._query_payload(act, now), None,
                         traj.siblings)
        self.truth[aid] = act
        self.owner[aid] = (live, str(act.kind))  # StrEnum: its value
        if act.model is not None:  # scored together with whatever else arrives now
            if not self._together:
                self.loop.push(now, FLUSH, self._flush, ())
            self._together.append(spec)
            return
        self._emit(make_arrived(now, spec))  # E.ActionArrived(now, spec)

    def _query_payload(self, act: SimAction, now: float) -> dict[str, object]:
        """A provider call's payload (issue 37): its coalescing key, and the cache's answer when
        the same query was answered within ``cache_ttl_s`` (the front door's cache: the core
        then answers it at arrival, with no token, slot or call)."""
        query = act.query or ""
        self.calls_log.append((now, act.work_s, query))
        got = self.answered.get(query)
        if got is not None and now - got <= self.cache_ttl_s:
            self.cache_hits += 1
            return {"coalesce": query, "cached": {"cached": True}}
        return {"coalesce": query}

    def _flush(self) -> None:
        """Model actions that arrived at one instant reach the core as one request (a reward
        service receives a GRPO group's answers together: "request-in, batch-out")."""
        specs, self._together = self._together, []
        now = self.loop.clock._now
        if len(specs) == 1:
            self._emit(make_arrived(now, specs[0]))
        else:
            self._emit(E.ActionsArrived(now, tuple(specs)))  # type: ignore[arg-type]

    def _deliver(self, result: ActionResult) -> None:
        owner = self.owner.pop(result.id, None)
        if owner is None:
            return  # not ours (or delivered twice: the core's invariant tests catch that)
        act = self.truth.pop(result.id, None)
        live, kind = owner
        self._last_progress = self.loop.clock._now
        self.acts.record(result, kind, live.traj.task)
        if self.cache_ttl_s > 0 and isinstance(act, SimAction) and act.query is not None \
                and result.status is Status.SUCCEEDED:
            self.answered.setdefault(act.query, self.loop.clock._now)
        if isinstance(act, SimAction):  # (FAILED: only a true failure ran its work)
            prefix = (previous_prompt(live.traj.steps, live.index)
                      if act.hints.prompt_tokens else None)
            self.releases.record(act, result.status, result.submit_time, result.finish_time,
                                 result.allotment, ran=act.fails, prefix=prefix)
        live.index += 1
        steps = live.traj.steps
        if live.index < len(steps):
            gen = steps[live.index][0]  # `self._later(gen, self._submit, live)`, inlined
            if gen < 0:
                raise ValueError(f"delay must be >= 0, got {gen}")
            loop = self.loop
            loop.push(loop.clock._now + gen, ARRIVAL, self._submit, (live,))
        else:
            self._trajectory_done(live)

    # ---- ticks -------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = self.loop.now
        self._emit(E.Tick(now))
        if self.reserved is not None:
            self.usage.set_reserved(self.reserved(lv.traj for lv in self.live.values()))
        self.usage.sample()
        if self.config.gc_tuning and gc.get_count()[0] > GC_VALVE:
            gc.collect(0)  # (the collector is off during a run: `SimConfig.gc_tuning`)
        if self._done and not self.live:
            return
        if self.live and now - self._last_progress > self.config.stall_s:
            self._stalled = True
            self.loop.halt()
            return
        if now >= self.config.horizon_s:
            self._stalled = bool(self.live)
            if self._stalled:
                self.loop.halt()
            return
        self.loop.after(self.config.tick_s, self._tick, priority=TICK)

    # ---- run ---------------------------------------------------------------------------------
    def run(self, batches: Iterable[Sequence[Trajectory]]) -> SimReport:
        """Replay ``batches`` (one per RL step, produced lazily) to the end; report what happened."""
        wall = time.perf_counter()
        self._iter = iter(batches)
        # Set-up, as a trainer does before step 1: the models the core loads at its first
        # event are loaded, and the warm pools it fills then are ready, before the first
        # trajectory starts (reported apart, `setup_s`), as a static stack's resident
        # sandboxes are.
        self._emit(E.Tick(0.0))
        setup = max((i.model.load_s for i in self.executor.instances.values()), default=0.0)
        if any(p.starting for p in self.executor.pools.values()):
            setup = max(setup, self.config.warm_cold_start_s)
        self.loop.at(setup, self._next_step, priority=ARRIVAL)
        self.loop.at(0.0, self._tick, priority=TICK)
        with gc_tuned(self.config.gc_tuning):
            self.loop.run()  # `_tick` halts it when the run stalls
            bound = self.releases.bound().as_dict()
        policy, workload, seed = self.labels
        start = self._first_arrival or 0.0
        end = self._end if self._end is not None else self.loop.now
        return build_report(
            policy=policy, workload=workload, seed=seed, acts=self.acts, usage=self.usage,
            steps=self.steps, makespan=max(0.0, end - start), cold=self.executor.cold_starts,
            warm=self.executor.warm_starts, stalled=self._stalled,
            wall_s=time.perf_counter() - wall, events=self.events, setup_s=setup,
            stall=self._stall_state() if self._stalled else None, bound=bound)

    def _stall_state(self) -> dict[str, object]:
        """What was left when the run stopped: enough to see where the work got stuck."""
        runs = self.executor.runs
        busy = {r.node for r in runs.values()}
        names = [n.name for n in self.cluster.nodes]
        out: dict[str, object] = {
            "time_s": self.loop.now, "steps_done": len(self.steps),
            "live_trajectories": len(self.live), "undelivered_actions": len(self.owner),
            "running_actions": len(runs), "idle_nodes": sum(1 for n in names if n not in busy),
            "nodes": len(names), "open_sessions": len(self.executor.sessions)}
        view = getattr(self.core, "view", None)
        if view is not None:  # the core's own account (a test fake may have none)
            v = view()
            out["queued_by_kind"] = dict(v.queued_by_kind)
            out["pending_sessions"] = sum(1 for x in v.sessions if x.node is None)
            out["nodes_with_free_cpu"] = sum(1 for n in v.nodes if n.free.get("cpu", 0.0) >= 1.0)
        return out


GC_VALVE = 4_000_000  # tracked objects born and alive since the last young collection


@contextmanager
def gc_tuned(on: bool) -> Iterator[None]:
    """Run the body with the collector tuned for a simulation (see `SimConfig.gc_tuning`);
    nested, the outer one's set-up holds."""
    if not on:
        yield
        return
    was_on = gc.isenabled()
    freeze = gc.get_freeze_count() == 0  # someone else's freeze is theirs to undo: keep out
    if freeze:
        gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if freeze:  # what the run made joins the old generation, not the young one that the
            gc.freeze()  # next collection would rescan whole: a full collection frees it later
            gc.unfreeze()
        if was_on:
            gc.enable()


def group_by_step(trajectories: Iterable[Trajectory]) -> list[list[Trajectory]]:
    """Batches of a trace in RL-step order (trajectories keep their file order inside a step)."""
    by: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by.setdefault(t.rl_step, []).append(t)
    if not by:
        return []
    return [by.get(i, []) for i in range(max(by) + 1)]
