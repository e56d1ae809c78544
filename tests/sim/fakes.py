"""A tiny greedy FIFO scheduler that speaks the core's event/command protocol (tests only).

It lets the simulator be tested without the real core: actions start on the first node where
their minimum allotment fits, sessions are pinned to the first node, each model gets one
instance loaded on first use and every action is its own batch.
"""

from __future__ import annotations

from collections import deque

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionResult, ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.resources import Resources


class FakeFifo:
    def __init__(self, cluster: ClusterSpec, *, warm: bool = False) -> None:
        self.free = {n.name: n.capacity for n in cluster.nodes}
        self.first = cluster.nodes[0].name
        self.pending: deque[ActionSpec] = deque()
        self.running: dict[str, tuple[ActionSpec, str, Resources, float, float | None]] = {}
        self.sessions: dict[str, str] = {}
        self.instances: dict[str, str] = {}  # model -> instance id
        self.loaded: set[str] = set()
        self.batches: dict[str, tuple[ActionSpec, float]] = {}
        self.warm = warm
        self.handled: list[E.Event] = []
        self.out: list[C.Command] = []
        self.submit: dict[str, float] = {}

    def handle(self, event: E.Event) -> list[C.Command]:
        self.handled.append(event)
        self.out = []
        t = event.time
        if isinstance(event, E.ActionArrived):
            self.submit[event.action.id] = t
            self.pending.append(event.action)
        elif isinstance(event, E.SessionRequested):
            self.sessions[event.session_id] = self.first
            self.out.append(C.OpenSession(event.session_id, self.first, event.demand, event.ttl_s))
        elif isinstance(event, E.SessionClosed):
            node = self.sessions.pop(event.session_id, None)
            if node:
                self.out.append(C.CloseSession(event.session_id, node))
        elif isinstance(event, E.ActionStarted):
            spec, node, allot, _s, _st = self.running[event.action_id]
            self.running[event.action_id] = (spec, node, allot, _s, t)
        elif isinstance(event, E.ActionFinished):
            spec, node, allot, _s, st = self.running.pop(event.action_id)
            self.free[node] = self.free[node] + allot
            self._deliver(spec, event.status, st, t, node)
        elif isinstance(event, E.ModelLoaded):
            self.loaded.add(event.instance_id)
        elif isinstance(event, E.BatchFinished):
            spec, st = self.batches.pop(event.batch_id)
            status = Status.FAILED if spec.id in event.failed else Status.SUCCEEDED
            self._deliver(spec, status, st, t, self.first)
        elif isinstance(event, E.Tick) and self.warm:
            for n in self.free:
                self.out.append(C.ResizeWarmPool(n, "python", 2))
        self._place(t)
        return self.out

    def _deliver(self, spec, status, start, t, node) -> None:
        self.out.append(C.Deliver(ActionResult(spec.id, status, self.submit.pop(spec.id), start, t, node)))

    def _place(self, t: float) -> None:
        keep: deque[ActionSpec] = deque()
        while self.pending:
            a = self.pending.popleft()
            if a.kind.uses_model:
                if not self._model(a, t):
                    keep.append(a)
                continue
            nodes = [self.sessions[a.session]] if a.session in self.sessions else list(self.free)
            for n in nodes:
                if a.demand.fits_in(self.free[n]):
                    self.free[n] = self.free[n] - a.demand
                    self.running[a.id] = (a, n, a.demand, t, None)
                    self.out.append(C.StartAction(a, n, a.demand, warm=self.warm))
                    break
            else:
                keep.append(a)
        self.pending = keep

    def _model(self, a: ActionSpec, t: float) -> bool:
        inst = self.instances.get(a.model)
        if inst is None:
            inst = f"{a.model}-0"
            self.instances[a.model] = inst
            self.out.append(C.LoadModel(inst, a.model, self.first, (0,)))
            return False
        if inst not in self.loaded:
            return False
        self.batches[f"b-{a.id}"] = (a, t)
        self.out.append(C.RunBatch(f"b-{a.id}", inst, self.first, a.model, (a,)))
        return True
