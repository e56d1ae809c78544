"""A tiny discrete-event driver for fair-share tests: arrivals at given times, each started
action finishes after its own run time at full quota; a ResizeAction (lent CPU taken back:
core/lending.py) changes its speed to its new CPU quota over the one it started with from
then on (a one-core action at 0.5 runs at half speed); a WakeAt (a CPU hold's end) comes back
as a Wake at its time. Returns the start order, each action's times, and the resizes."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core import commands as C
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.resources import Resources


@dataclass
class Run:
    starts: list[str] = field(default_factory=list)  # action ids in StartAction order
    start: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    submit: dict[str, float] = field(default_factory=dict)
    stream: list[str] = field(default_factory=list)  # repr of every event's commands
    resizes: list[tuple[float, str, float]] = field(default_factory=list)  # (time, id, cpu)

    def act(self, ids: list[str]) -> float:
        """Mean ACT (finish - submit) of ``ids``."""
        return sum(self.finish[i] - self.submit[i] for i in ids) / len(ids)


def simulate(nodes: list[NodeSpec], arrivals: list[tuple[float, ActionSpec, float]],
             validate: bool = True, sessions: tuple[tuple[str, Resources], ...] = (),
             **cfg: object) -> Run:
    """``arrivals``: (time, spec, run seconds). Finishes at the same time go in start order.
    ``sessions`` (id, demand) are opened first, at time 0, in order."""
    core = Core(ClusterSpec(tuple(nodes)), CoreConfig(**cfg))  # type: ignore[arg-type]
    run = Run()
    for sid, demand in sessions:
        run.stream.append(repr(core.handle(ev.SessionRequested(0.0, sid, demand))))
    runs = {s.id: d for _, s, d in arrivals}
    # (time, kind 0 finish / 1 arrival / 2 wake, seq, payload)
    q: list[tuple[float, int, int, object]] = []
    seq = 0
    # running: id -> [work left at full quota, speed, since, full quota]; ends: id -> the seq
    # of its live finish entry (older entries are stale: its speed changed)
    running: dict[str, list[float]] = {}
    ends: dict[str, int] = {}
    for t, spec, _ in arrivals:
        heapq.heappush(q, (t, 1, seq, spec))
        seq += 1
    while q:
        t, kind, n, x = heapq.heappop(q)
        if kind == 0 and ends.get(str(x)) != n:
            continue
        if kind == 1:
            assert isinstance(x, ActionSpec)
            run.submit[x.id] = t
            out = core.handle(ev.ActionArrived(t, x))
        elif kind == 2:
            out = core.handle(ev.Wake(t))
        else:
            assert isinstance(x, str)
            del running[x], ends[x]
            run.finish[x] = t
            out = core.handle(ev.ActionFinished(t, x, status=Status.SUCCEEDED, run_s=runs[x]))
        if validate:
            core.validate()
        run.stream.append(repr(out))
        for c in out:
            if isinstance(c, C.WakeAt):
                heapq.heappush(q, (max(c.time, t), 2, seq, None))
                seq += 1
            elif isinstance(c, C.StartAction):
                aid = c.action.id
                run.starts.append(aid)
                run.start[aid] = t
                cpu = c.allotment.get("cpu")
                running[aid] = [runs[aid], 1.0, t, cpu]
                ends[aid] = seq
                heapq.heappush(q, (t + runs[aid], 0, seq, aid))
                seq += 1
            elif isinstance(c, C.ResizeAction):
                r = running[c.action_id]
                r[0] -= (t - r[2]) * r[1]
                r[1], r[2] = c.allotment.get("cpu") / r[3], t
                run.resizes.append((t, c.action_id, c.allotment.get("cpu")))
                ends[c.action_id] = seq
                heapq.heappush(q, (t + r[0] / r[1], 0, seq, c.action_id))
                seq += 1
    return run
