"""Tenants sharing one cluster (issue 41 item 3): a flood of long actions from one tenant and a
few short ones from another, in virtual time, through the same core the engine runs.

The scenario is the outside review's M1 (`../shared/reviews/reliability-2026-11b.md`,
`fairness.py`): carol submits 100 (then 300) one-second CPU loops at t=0, alice eight
``print(1)`` one second later, on this machine (2 CPUs). A ``print(1)`` action runs 4 ms: the
p50 of a trivial action measured in docs/sandbox.md (3.34-4.91 ms over four rounds of 300).

Three ways to run it (`Mode`):
- ``today``: no shares, no caps: one order for every tenant (the review's configuration);
- ``cap``: each tenant's ``cpu_share`` admission cap (issue 25), the only tool before: at most
  ``cap`` x the cluster's CPUs of a tenant's actions unfinished; a submit beyond gets 429, so
  the client sends its next action the moment one of its own finishes (the best a client can
  do under the cap: a closed loop, no back-off lost);
- ``wait``: the core's fair share without taking lent CPU back (`CoreConfig.lend_floor`
  1.0): a tenant's share comes back only as the lent actions end;
- ``fair``: the core's fair share (`CoreConfig.tenant_shares`), no caps, lent CPU taken back
  at once by lowering the lenders' CPU quotas (`core/lending.py`, default ``lend_floor``).
Each tenant also runs alone (the others' streams left out): the lower bound of its ACT; and
alone on its share of the cores (``cpus x share``): what generalized processor sharing
guarantees it when every tenant is backlogged.

A running action's speed is its CPU quota over its demand (a ResizeAction changes it from
then on; a one-core loop at 0.5 runs at half speed): CFS bandwidth control's average, without
the first period's unthrottled burst (`executor.cfs_speed`), which only favours the squeezed.

Time ties: an action's finish is handled before an arrival at the same instant (the flood's
first actions end at t=1, when alice arrives in the review's timing, so `alice_at` is swept
over one flood action's length as well: where in a flood action's run a short one arrives is
what decides its wait without preemption).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..core import Core, CoreConfig
from ..core import commands as C
from ..core import events as ev
from ..core.actions import ActionSpec, Status
from ..core.cluster import ClusterSpec, NodeSpec
from ..core.resources import Resources

PRINT1_S = 0.004  # a trivial print(1) action's run, p50 (docs/sandbox.md: 3.34-4.91 ms)
MODES = ("today", "cap", "wait", "fair")


@dataclass(frozen=True)
class Stream:
    """``count`` actions of ``tenant``, each ``run_s`` long on one core, submitted at ``at_s``
    (all at once: a burst), of one kind (``tag``: one estimator key, so today's order for them
    is arrival order, as the review's loops and ``print(1)`` had the same key).
    ``sequential``: one at a time instead, each sent when the last one finished (a
    trajectory's tool calls); its ACT counts from its own send."""

    tenant: str
    count: int
    run_s: float
    at_s: float
    tag: str = "python"
    sequential: bool = False


@dataclass
class Outcome:
    """Per tenant: each action's ACT (finish - when its client first sent it: under a cap,
    the 429s' wait counts), and when its last one finished."""

    acts: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    starts: list[str] = field(default_factory=list)
    resizes: int = 0  # ResizeActions run (quotas lowered to take lent CPU back, raised again)

    def mean_act(self, tenant: str) -> float:
        a = self.acts[tenant]
        return sum(a) / len(a)


def m1_streams(flood: int = 300, short: int = 8, alice_at: float = 1.0,
               sequential: bool = False) -> tuple[Stream, Stream]:
    """The review's M1: carol's ``flood`` one-second loops at 0, alice's ``short`` print(1)s
    (``sequential``: one after another, each sent at the last one's answer)."""
    return (Stream("carol", flood, 1.0, 0.0),
            Stream("alice", short, PRINT1_S, alice_at, sequential=sequential))


def run(streams: Sequence[Stream], cpus: float, mode: str,
        shares: Mapping[str, float] | None = None) -> Outcome:
    """Run ``streams`` on one node of ``cpus`` cores (memory ample) under ``mode``; ``shares``:
    each tenant's share (fair: its weight; cap: its ``cpu_share``, a fraction of the CPUs)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    tenants = [s.tenant for s in streams]
    shares = dict(shares) if shares else {t: 1.0 / len(tenants) for t in tenants}
    cfg = (CoreConfig(tenant_shares=shares) if mode == "fair"
           else CoreConfig(tenant_shares=shares, lend_floor=1.0) if mode == "wait"
           else CoreConfig())
    node = NodeSpec("local", Resources(cpu=cpus, memory_mb=1 << 20), pool="cpu")
    core = Core(ClusterSpec((node,)), cfg)
    # cap: at most this many of a tenant's (one-core) actions unfinished at once (a sequential
    # stream's client: one)
    cap = {t: max(1, math.floor(shares[t] * cpus + 1e-9)) if mode == "cap" else 1 << 62
           for t in tenants}
    closed = {s.tenant for s in streams if s.sequential}
    for t in closed:
        cap[t] = 1
    backlog: dict[str, list[ActionSpec]] = {}
    runs: dict[str, float] = {}
    owner: dict[str, str] = {}
    submit: dict[str, float] = {}
    live = dict.fromkeys(tenants, 0)
    out = Outcome(acts={t: [] for t in tenants})
    # (time, 0 finish / 1 arrival / 2 a wake the core asked for, seq, id)
    q: list[tuple[float, int, int, str]] = []
    seq = 0
    for s in streams:
        specs = [ActionSpec(f"{s.tenant}-{i}", demand=Resources(cpu=1, memory_mb=64), tag=s.tag,
                            tenant=s.tenant, timeout_s=3600.0) for i in range(s.count)]
        for sp in specs:
            runs[sp.id] = s.run_s
            owner[sp.id] = s.tenant
            submit[sp.id] = s.at_s  # (its client sends it then; a 429 makes it wait)
        backlog[s.tenant] = specs[::-1]  # (popped from the end: in order)
        heapq.heappush(q, (s.at_s, 1, seq, s.tenant))
        seq += 1
    started: dict[str, bool] = {}
    # running: id -> [work left (s at full speed), speed, since]
    running: dict[str, list[float]] = {}
    ends: dict[str, int] = {}  # id -> the seq of its finish in ``q`` (earlier ones are stale)

    def submit_more(tenant: str, now: float) -> list[C.Command]:
        got: list[C.Command] = []
        todo = backlog[tenant]
        while todo and live[tenant] < cap[tenant]:
            sp = todo.pop()
            live[tenant] += 1
            if tenant in closed:  # (sent now, at its predecessor's answer)
                submit[sp.id] = now
            got += core.handle(ev.ActionArrived(now, sp))
        return got

    def finish_at(aid: str, now: float) -> None:
        nonlocal seq
        r = running[aid]
        ends[aid] = seq
        heapq.heappush(q, (now + r[0] / r[1], 0, seq, aid))
        seq += 1

    while q:
        now, kind, n, x = heapq.heappop(q)
        if kind == 0:
            if ends.get(x) != n:
                continue  # stale: its speed changed since
            del running[x], ends[x]
        if kind == 1:
            started[x] = True
            cmds = submit_more(x, now)
        elif kind == 2:
            cmds = core.handle(ev.Wake(now))
        else:
            t = owner[x]
            live[t] -= 1
            out.acts[t].append(now - submit[x])
            out.last[t] = now
            cmds = core.handle(ev.ActionFinished(now, x, status=Status.SUCCEEDED, run_s=runs[x]))
            if mode == "cap" or t in closed:  # its client sends the next one at once
                cmds += submit_more(t, now)
        for c in cmds:
            if isinstance(c, C.WakeAt):
                heapq.heappush(q, (max(c.time, now), 2, seq, ""))
                seq += 1  # pragma: no mutate (any step keeps the entries' order unique)
            elif isinstance(c, C.StartAction):
                out.starts.append(c.action.id)
                running[c.action.id] = [runs[c.action.id], c.allotment.get("cpu"), now]
                finish_at(c.action.id, now)
            elif isinstance(c, C.ResizeAction) and c.action_id in running:
                r = running[c.action_id]
                r[0] = max(0.0, r[0] - (now - r[2]) * r[1])  # its work up to now, at the old speed
                r[1], r[2] = c.allotment.get("cpu"), now
                out.resizes += 1
                finish_at(c.action_id, now)
    return out
