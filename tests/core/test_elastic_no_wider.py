"""Waiting is for a width (`Elastic.plan`, docs/core.md "Waiting is for a width"): a session's
head whose lane at the first end of the node's elastic runs would be no wider than its lane now,
both rounded as started, starts now with one lane more, whatever its work; a head with others
behind it, one that could go elsewhere, or one on a node with a measured speedup is weighed by
the fluid model as before."""

from __future__ import annotations

from core_helpers import Driver, cpu_node, elastic
from test_elastic_rest_values import _h, _measured

from arl_tangram.core.actions import WorkHints
from arl_tangram.core.commands import StartAction
from arl_tangram.core.elastic import _no_wider_later, _rounded


def test_a_lane_is_rounded_to_whole_steps_where_it_spans_one_and_capped_at_the_maximum() -> None:
    assert _rounded(2.5, 1.0, 4.0) == 2.0
    assert _rounded(5.0, 1.0, 4.0) == 4.0
    assert _rounded(0.75, 1.0, 4.0) == 0.75  # (below a step: as it is)
    assert _rounded(1.0, 1.0, 4.0) == 1.0
    assert _rounded(1.7, 0.5, 4.0) == 1.5
    assert _rounded(3.0 - 1e-12, 1.0, 4.0) == 3.0  # (a rounding error of the division kept whole)


def test_waiting_buys_no_width_where_both_lanes_round_alike() -> None:
    # (cap, top, lo, runs, step)
    assert _no_wider_later(151, 4, 1, 150, 1)  # a crowded node: 1 core now, 1 at the next end
    assert _no_wider_later(16, 8, 1, 7, 1)  # 16/8 = 2 now, 16/7 -> 2 later
    assert not _no_wider_later(16, 8, 1, 8, 1)  # 16/9 -> 1 now, 2 later: waiting buys a core
    assert _no_wider_later(20, 4, 1, 1, 1)  # both at its maximum: 4 and 4
    assert not _no_wider_later(20, 4, 1, 0, 1)  # no run to wait for
    assert not _no_wider_later(3, 4, 2, 1, 1)  # 1.5 -> 1 now, under its minimum of 2
    assert not _no_wider_later(3, 4, 1.5, 1, 1)  # 1.5 now, rounded to 1: under 1.5
    assert not _no_wider_later(3, 4, 1.5, 2, 1)  # 1 now and 1 later, both under its 1.5
    assert not _no_wider_later(5, 4, 1, 3, 0.5)  # 1.25 -> 1.0 now, 1.67 -> 1.5 later
    assert _no_wider_later(5, 4, 1, 3, 1)  # in whole cores both 1
    assert not _no_wider_later(1.5, 4, 0.25, 3, 1)  # below a step: 0.375 now, 0.5 later
    assert not _no_wider_later(2.0, 4, 1, 1, 1)  # 1 now, 2 later
    assert not _no_wider_later(2.0, 1.5, 1, 1, 1)  # 1 now, 1.5 later (2, at most its maximum)
    assert _no_wider_later(6.0, 2, 1, 2, 1)  # 2 now, 3 later at most its maximum 2


def _two_runs() -> Driver:
    """Node n0 of 3 cores: r0 (1..2, 100 s) at 2 and r1 (1..2, 101 s) at 1, seen at t=1."""
    d = Driver([cpu_node("n0", cpu=3)], policy="tangram")
    for i in range(2):
        for c in d.at(0.0).arrive(elastic(f"r{i}", 1, 2, hints=WorkHints(expected_s=100.0 + i))):
            if isinstance(c, StartAction):
                d.started(c.action.id, c.node)
    d.at(1.0).tick()
    return d


def test_a_session_head_that_waiting_cannot_widen_starts_whatever_its_work() -> None:
    d = _two_runs()
    n0, el = d.core.nodes["n0"], d.core.elastic
    assert sorted((a, r.width) for a, r in n0.elastic.items()) == [("r0", 2.0), ("r1", 1.0)]
    assert n0.free.get("cpu") == 0.0
    # 3 cores, 2 runs: 1 core now (3/3), 1 at the first end (3/2 -> 1): it starts at 1, taking
    # r0's second core (the floor), even with 1,000 s of work, where the fluid model waits
    assert el.plan(_h(1, 2, x=1000.0, t=1.0), n0, 0) == (1.0, 1.0)
    assert el.plan(_h(1, 2, x=1.0, t=1.0), n0, 0) == (1.0, 1.0)
    # with one like it behind, or a node elsewhere free in 2 s, the model decides: it waits
    assert el.plan(_h(1, 2, x=1000.0, t=1.0), n0, 1) == (0.0, 0.0)
    assert el.plan(_h(1, 2, x=1000.0, t=1.0), n0, 0, 2.0) == (0.0, 0.0)


def test_a_measured_node_weighs_the_head_with_the_model() -> None:
    # 8 cores measured at 1.2 on 2 and 1.6 on 4, r0 (1..2) running: a head of 10 s whose lane
    # would be as wide now as later waits there (one more busy core slows r0 too)
    d = _measured(8)
    assert d.core.elastic.plan(_h(1, 2, x=10.0, t=0.5), d.core.nodes["m0"], 0) == (0.0, 0.0)
    assert not d.core.elastic._no_wider(_h(1, 2).spec.elasticity, d.core.nodes["m0"])
