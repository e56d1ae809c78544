"""A session head that cannot start for CPU is left out of the pass (`SchedulingPass
._short_of_cpu`, issue 40): on a crowded node each of its hundreds of waiting session heads was
tried on every event of the node. The rule must change no decision: its exact answers (the
arithmetic of `try_place`'s `fits` and `reclaim` for a rigid head, `width_on`'s minimum for an
elastic one), the one side effect of a failed try it keeps (the node's elastic actions asked
to grow into its free CPU), where it is off, and crowded simulated RL steps whose whole event
streams are the same with it and without it."""

from __future__ import annotations

import hashlib

import pytest
from core_helpers import Driver, cpu_node, elastic

from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup
from arl_tangram.core.commands import StartAction
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources
from arl_tangram.core.scheduling import SchedulingPass


def _node(cpu: float, lenders: int, policy: str = "tangram", **cfg: object) -> Driver:
    """Session ``s`` on one node of ``cpu`` cores, and ``lenders`` elastic actions (1..4 cores,
    10 s) of the shared pool started there (those that fit)."""
    d = Driver([cpu_node("n0", cpu=cpu, mem=1 << 20)], policy=policy, session_ttl_s=1e6, **cfg)
    d.at(0.0)(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    for c in d.at(0.1).arrive(*(elastic(f"e{i}", 1, 4) for i in range(lenders))):
        if isinstance(c, StartAction):
            d.started(c.action.id, c.node)
    return d


def _short(
    d: Driver,
    cpu: float = 0.0,
    lo: float = 0.0,
    hi: float = 0.0,
    *,
    sid: str = "s",
    dim: str = "cpu",
    partition: str | None = None,
) -> bool:
    """`_short_of_cpu` for a head of session ``sid``: rigid of ``cpu`` cores, or elastic
    ``lo``..``hi`` (in ``dim``) where ``hi`` > 0 (a record as its queue holds it, not tried)."""
    el = Elasticity(lo, hi, dim=dim, speedup=Speedup(0.9)) if hi else None
    demand = Resources(
        cpu=max(cpu, lo if dim == "cpu" else 1.0), memory_mb=64 + (lo if dim != "cpu" else 0)
    )
    spec = ActionSpec("h", kind=ActionKind.TEST, demand=demand, elasticity=el, session=sid)
    rec = ActionRecord(spec, d.t, 10_000)
    rec.partition = partition  # (a partitioned policy's slice)
    return d.core.scheduling._short_of_cpu(rec, sid)


def test_the_node_the_cases_read() -> None:
    d = _node(8, 4)
    node = d.core.st.nodes["n0"]
    assert {a: r.allotment.get("cpu") for a, r in node.elastic.items()} == {"e0": 4.0, "e1": 4.0}
    assert (node.free.get("cpu"), d.core.elastic.lendable(node, 0.0)) == (0.0, 6.0)
    assert d.core.st.sessions["s"].node == "n0"


@pytest.mark.parametrize(
    ("cpu", "short"),
    [(7.0, True), (6.0, False), (6.0 + 5e-10, False), (6.0 + 3e-9, True), (0.5, False)],
)
def test_a_rigid_head_is_short_where_reclaim_could_not_make_room(cpu: float, short: bool) -> None:
    # free 0, lendable 6: reclaim makes room for 6 (and within its tolerance), not for more
    assert _short(_node(8, 4), cpu) is short


def test_a_rigid_head_that_fits_the_free_cpu_is_not_short() -> None:
    d = _node(10, 2)  # e0, e1 at 4: 2 cores free, 6 lendable
    assert (
        d.core.st.nodes["n0"].free.get("cpu"),
        d.core.elastic.lendable(d.core.st.nodes["n0"], 0.0),
    ) == (2.0, 6.0)
    assert [_short(d, c) for c in (2.0, 8.0, 8.0 + 3e-9)] == [False, False, True]


@pytest.mark.parametrize(
    ("lo", "short"), [(7.0, True), (6.0, False), (6.0 - 5e-10, False), (1.0, False)]
)
def test_an_elastic_head_is_short_below_its_minimum(lo: float, short: bool) -> None:
    d = _node(8, 4)
    assert _short(d, lo=lo, hi=8.0) is short
    assert d.core.st.expand_at == set()  # (no free CPU: no one is asked to grow)


def test_an_elastic_head_left_out_asks_the_node_to_grow_into_its_free_cpu() -> None:
    d = _node(10, 2)  # 2 free + 6 lendable
    d.core.st.expand_at.clear()
    assert _short(d, lo=8.0, hi=10.0) is False and d.core.st.expand_at == set()
    assert _short(d, lo=9.0, hi=10.0) is True and d.core.st.expand_at == {"n0"}


def test_where_the_rule_is_off() -> None:
    assert _short(_node(8, 4, policy="fifo"), 7.0) is False  # (no lending: tried as before)
    assert _short(_node(8, 4, reserve_fraction=0.25), 7.0) is False
    d = _node(8, 4)
    assert _short(d, 7.0, partition="p") is False
    assert _short(d, 7.0, sid="nobody") is False
    assert (
        _short(d, lo=7.0, hi=8.0, dim="memory_mb") is False
    )  # (a width in memory: `width_on`'s own path)


def test_a_session_without_a_node_is_not_short() -> None:
    d = _node(8, 4)
    d.at(0.3)(
        ev.SessionRequested(0.3, "big", Resources(memory_mb=2 << 20))
    )  # (no node has that memory)
    assert d.core.st.sessions["big"].node is None
    assert _short(d, 7.0, sid="big") is False


def _stream(workload: str, nodes: int, trajectories: int, cpu: float) -> tuple[str, int]:
    """A hash of every event the core was handed in one simulated step of ``workload`` on
    ``nodes`` nodes of ``cpu`` cores (sessions of 128 MB: hundreds of them a node), and the
    heads the rule left out."""
    from dataclasses import replace

    from arl_tangram.core.cluster import ClusterSpec, NodeSpec
    from arl_tangram.sim.runner import make_core, run_policy
    from arl_tangram.sim.simulator import SimConfig
    from arl_tangram.sim.workloads import get_workload

    w = get_workload(workload)
    cluster = ClusterSpec(
        tuple(
            NodeSpec(f"cpu-{i}", Resources(cpu=cpu, memory_mb=786_432), pool="cpu")
            for i in range(nodes)
        )
    )

    def batches():
        for b in w.batches(0, trajectories, 1):
            yield [
                replace(
                    t,
                    sessions={
                        k: replace(s, demand=s.demand.with_amount("memory_mb", 128))
                        for k, s in t.sessions.items()
                    },
                )
                for t in b
            ]

    h = hashlib.sha256()
    left = [0]
    real = SchedulingPass._short_of_cpu

    def counted(self: SchedulingPass, rec: ActionRecord, sid: str) -> bool:
        got = real(self, rec, sid)
        left[0] += got
        return got

    SchedulingPass._short_of_cpu = counted  # type: ignore[method-assign]
    try:

        def recorded(*a: object, **k: object):
            core = make_core(*a, **k)
            handle = core.handle

            def seen(e: ev.Event):
                h.update(repr(e).encode())
                return handle(e)

            core.handle = seen  # type: ignore[method-assign]
            return core

        run_policy(
            cluster,
            batches,
            "tangram",
            workload=workload,
            config=SimConfig(train_s=w.train_s),
            core_factory=recorded,
        )
    finally:
        SchedulingPass._short_of_cpu = real  # type: ignore[method-assign]
    return h.hexdigest(), left[0]


@pytest.mark.pure_core
def test_crowded_simulated_steps_decide_the_same_with_the_rule_and_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_rule, left = _stream("swe-agent", 1, 120, 24)
    monkeypatch.setattr(SchedulingPass, "_short_of_cpu", lambda self, rec, sid: False)
    without, none = _stream("swe-agent", 1, 120, 24)
    assert left > 0 and none == 0  # (the rule left heads out, and then none)
    assert with_rule == without
