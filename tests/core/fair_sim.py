"""A tiny discrete-event driver for fair-share tests: arrivals at given times, each started
action finishes after its own run time; returns the start order and each action's times."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core import commands as C
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec, NodeSpec


@dataclass
class Run:
    starts: list[str] = field(default_factory=list)  # action ids in StartAction order
    start: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    submit: dict[str, float] = field(default_factory=dict)
    stream: list[str] = field(default_factory=list)  # repr of every event's commands

    def act(self, ids: list[str]) -> float:
        """Mean ACT (finish - submit) of ``ids``."""
        return sum(self.finish[i] - self.submit[i] for i in ids) / len(ids)


def simulate(nodes: list[NodeSpec], arrivals: list[tuple[float, ActionSpec, float]],
             validate: bool = True, **cfg: object) -> Run:
    """``arrivals``: (time, spec, run seconds). Finishes at the same time go in start order."""
    core = Core(ClusterSpec(tuple(nodes)), CoreConfig(**cfg))  # type: ignore[arg-type]
    run = Run()
    runs = {s.id: d for _, s, d in arrivals}
    q: list[tuple[float, int, int, object]] = []  # (time, kind 0 finish / 1 arrival, seq, payload)
    seq = 0
    for t, spec, _ in arrivals:
        heapq.heappush(q, (t, 1, seq, spec))
        seq += 1
    while q:
        t, kind, _, x = heapq.heappop(q)
        if kind == 1:
            assert isinstance(x, ActionSpec)
            run.submit[x.id] = t
            out = core.handle(ev.ActionArrived(t, x))
        else:
            assert isinstance(x, str)
            run.finish[x] = t
            out = core.handle(ev.ActionFinished(t, x, status=Status.SUCCEEDED, run_s=runs[x]))
        if validate:
            core.validate()
        run.stream.append(repr(out))
        for c in out:
            if isinstance(c, C.StartAction):
                aid = c.action.id
                run.starts.append(aid)
                run.start[aid] = t
                heapq.heappush(q, (t + runs[aid], 0, seq, aid))
                seq += 1
    return run
