"""Small builders for core tests: clusters, actions, and a driver that records commands."""

from __future__ import annotations

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, Status, WorkHints
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources


def cpu_node(name: str, cpu: float = 4, mem: float = 8192) -> NodeSpec:
    return NodeSpec(name, Resources(cpu=cpu, memory_mb=mem), pool="cpu")


def gpu_node(name: str, gpus: int = 4, domains=None, per_dev: float = 16000) -> NodeSpec:
    cap = Resources(cpu=16, memory_mb=65536, gpu=gpus, gpu_memory_mb=per_dev * gpus)
    return NodeSpec(name, cap, pool="gpu", gpu_domains=tuple(tuple(d) for d in (domains or ())))


def act(aid: str, cpu: float = 1, mem: float = 256, **kw) -> ActionSpec:
    return ActionSpec(aid, demand=Resources(cpu=cpu, memory_mb=mem), **kw)


def elastic(aid: str, lo: float = 1, hi: float = 4, p: float = 0.9, **kw) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TEST, demand=Resources(cpu=lo, memory_mb=256),
                      elasticity=Elasticity(lo, hi, speedup=Speedup(p)), **kw)


def reward(aid: str, model: str = "rm", **kw) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.REWARD, model=model, demand=Resources(),
                      hints=WorkHints(tokens=100), **kw)


class Driver:
    """Feeds events to a core, validates after each, keeps every command and delivery."""

    def __init__(self, nodes, models=(), **cfg) -> None:
        self.core = Core(ClusterSpec(tuple(nodes), tuple(models)), CoreConfig(**cfg))
        self.t = 0.0
        self.log: list[cmd.Command] = []
        self.delivered: dict[str, cmd.Deliver] = {}

    def __call__(self, event: ev.Event) -> list[cmd.Command]:
        out = self.core.handle(event)
        for c in out:
            if isinstance(c, cmd.Deliver):
                assert c.result.id not in self.delivered, f"second Deliver for {c.result.id}"
                self.delivered[c.result.id] = c
        self.log.extend(out)
        self.core.validate()
        return out

    def at(self, t: float) -> Driver:
        self.t = t
        return self

    def arrive(self, *specs: ActionSpec) -> list[cmd.Command]:
        out: list[cmd.Command] = []
        for s in specs:
            out += self(ev.ActionArrived(self.t, s))
        return out

    def finish(self, aid: str, status: Status = Status.SUCCEEDED, run_s: float | None = None, **kw):
        return self(ev.ActionFinished(self.t, aid, status=status, run_s=run_s, **kw))

    def started(self, aid: str, node: str = "?") -> list[cmd.Command]:
        return self(ev.ActionStarted(self.t, aid, node))

    def tick(self) -> list[cmd.Command]:
        return self(ev.Tick(self.t))

    def status(self, aid: str) -> Status | None:
        return self.core.status(aid)

    def result(self, aid: str):
        return self.delivered[aid].result


def of(cmds, kind):
    return [c for c in cmds if isinstance(c, kind)]


def starts(cmds) -> dict[str, cmd.StartAction]:
    return {c.action.id: c for c in of(cmds, cmd.StartAction)}


def cpu_commands(out) -> list[tuple[str, str, float]]:
    """Starts and resizes as (kind, action id, cpu quota), in order; nothing else."""
    got = []
    for c in out:
        if isinstance(c, cmd.StartAction):
            got.append(("start", c.action.id, c.allotment.get("cpu")))
        elif isinstance(c, cmd.ResizeAction):
            got.append(("resize", c.action_id, c.allotment.get("cpu")))
    return got


def models(*specs: ModelSpec) -> tuple[ModelSpec, ...]:
    return specs
