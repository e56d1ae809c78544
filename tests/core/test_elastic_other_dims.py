"""Elastic actions whose width is not CPU (`Elasticity.dim`, e.g. ``memory_mb``) under the
elastic policy: the lane rule weighs cores, so such an action starts at its minimum where its
whole demand fits and expansion grows it; where a node's measured parallel speedup prices the
cores it would busy, those are its CPU demand, not its width."""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node

from arl_tangram.core import checks
from arl_tangram.core import commands as cmd
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources


def _mem_elastic(aid: str, lo: float = 256, hi: float = 1024) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TEST, demand=Resources(cpu=1, memory_mb=lo),
                      elasticity=Elasticity(lo, hi, dim="memory_mb", speedup=Speedup(0.5)),
                      hints=WorkHints(expected_s=10.0))


def _starts(out: list[cmd.Command]) -> list[tuple[str, str, float, float]]:
    return [(c.action.id, c.node, c.allotment.get("cpu"), c.allotment.get("memory_mb"))
            for c in out if isinstance(c, cmd.StartAction)]


def test_a_memory_elastic_action_starts_at_once_and_grows_to_its_maximum() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram")
    assert _starts(d.arrive(_mem_elastic("m"))) == [("m", "n0", 1.0, 1024.0)]


def test_a_memory_elastic_action_takes_what_memory_is_left_and_waits_for_its_minimum() -> None:
    # 1,000 MB: the first gets its 256 and grows to all of it (its 1,024 not reached); the
    # second's 256 is not free: it waits though 3 cores are, and starts when the first ends
    d = Driver([cpu_node("n0", cpu=4, mem=1000)], policy="tangram")
    assert _starts(d.arrive(_mem_elastic("a"))) == [("a", "n0", 1.0, 1000.0)]
    assert _starts(d.arrive(_mem_elastic("b"))) == []
    assert _starts(d.at(1.0).finish("a")) == [("b", "n0", 1.0, 1000.0)]


def test_the_node_speedup_prices_its_cpu_demand_not_its_width() -> None:
    # n0: 8 cores whose second busy core adds nothing measured past 2 (efficiency 0.5 from 2
    # busy cores on); n1: 4 ideal cores. One CPU busy on n0 runs at full efficiency, so both
    # nodes finish it alike and the first candidate (the most free CPU: n0) wins; weighing its
    # 256 MB as cores would have priced n0 at half speed and sent it to n1; and it grows there
    # (its memory busies no core: no loss for the node's other work to weigh)
    slow = NodeSpec("n0", Resources(cpu=8, memory_mb=8192), pool="cpu",
                    parallel_speedup=((2.0, 1.0),))
    d = Driver([slow, cpu_node("n1", cpu=4)], policy="tangram")
    assert _starts(d.arrive(_mem_elastic("m"))) == [("m", "n0", 1.0, 1024.0)]


def test_a_memory_elastic_action_waits_for_its_cpu_demand() -> None:
    # its width is memory, its CPU demand rigid: on a node whose one core a rigid action holds
    # it waits though its memory fits, and starts when the core frees
    d = Driver([cpu_node("n0", cpu=1, mem=8192)], policy="tangram")
    d.arrive(act("r", cpu=1, hints=WorkHints(expected_s=1.0)))
    assert _starts(d.arrive(_mem_elastic("m"))) == []
    assert _starts(d.at(1.0).finish("r")) == [("m", "n0", 1.0, 1024.0)]


def test_validate_counts_a_memory_elastic_head_idle_only_where_its_demand_fits() -> None:
    d = Driver([cpu_node("n0", cpu=1, mem=8192)], policy="tangram")
    d.arrive(act("r", cpu=1, hints=WorkHints(expected_s=1.0)))
    d.arrive(_mem_elastic("m"))
    core = d.core
    node, rec = core.st.nodes["n0"], core.actions["m"]
    assert checks._idle_for(core, rec, node) is False  # (its core is held)
    core.st.nodes["n0"].give({"cpu": 1.0})  # (as if the core were free: then it would be idle)
    assert checks._idle_for(core, rec, node) is True
    core.st.nodes["n0"].take({"cpu": 1.0})
