"""Elastic widths on a node whose measured parallel speedup is poor (issue 22).

`tangram calibrate` measures how much faster fully parallel work runs on k cores than on one
(`NodeSpec.parallel_speedup`): ~1.8 on two quiet cores, ~1.0 on a loaded VM or two hyperthreads
of one core. There a second core adds nothing and slows every action on the node, so tangram
starts an elastic action narrow and does not grow it; where the node scales, nothing changes.
"""

from __future__ import annotations

from core_helpers import Driver, act, elastic, of, starts

from arl_tangram.core import commands as cmd
from arl_tangram.core.actions import WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources


def _node(speedup: float | None) -> NodeSpec:
    pts = ((2.0, speedup),) if speedup is not None else ()
    return NodeSpec("n0", Resources(cpu=2, memory_mb=8192), pool="cpu", parallel_speedup=pts)


def _test(aid: str):
    return elastic(aid, 1, 2, p=0.9, hints=WorkHints(expected_s=1.0))


def test_a_lone_test_starts_at_the_width_the_node_really_gives() -> None:
    for speedup, width in ((None, 2), (1.8, 2), (1.0, 1), (1.05, 1)):
        d = Driver([_node(speedup)], policy="tangram")
        out = d.at(0.0).arrive(_test("a"))
        assert starts(out)["a"].allotment["cpu"] == width, speedup


def test_no_growth_into_a_core_that_slows_the_node_down() -> None:
    """A test started narrow while a tool held the other core: when the tool ends, it grows
    where the node scales and stays at one core where it does not."""
    for speedup, grown in ((None, [("a", 2)]), (1.8, [("a", 2)]), (1.0, [])):
        d = Driver([_node(speedup)], policy="tangram")
        d.at(0.0).arrive(act("tool", hints=WorkHints(expected_s=0.5)))
        out = d.at(0.01).arrive(_test("a"))
        assert starts(out)["a"].allotment["cpu"] == 1, speedup
        out = d.at(0.5).finish("tool", run_s=0.5)
        got = [(r.action_id, r.allotment["cpu"]) for r in of(out, cmd.ResizeAction)]
        assert got == grown, speedup


def test_an_overdue_test_is_not_started_wider_than_useful() -> None:
    d = Driver([_node(1.0)], policy="tangram")
    d.at(0.0).arrive(act("hold", cpu=2, hints=WorkHints(expected_s=0.1)))
    d.at(0.0).arrive(_test("a"))
    out = d.at(5.0).finish("hold", run_s=5.0)  # a waited 5 s for a 1 s run: overdue
    assert starts(out)["a"].allotment["cpu"] == 1
