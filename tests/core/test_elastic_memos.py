"""The node sums `Elastic.absorb` and `Elastic.lendable(node, 0.0)` are kept per node as of its
`NodeState.moves` (issue 40: on a crowded node each waiting head read them over every elastic
action there, at every event). They read only the node's elastic actions' allotments, which
change only with a take or a give of the node, which counts a move: a random walk of arrivals,
starts, growth, reclaims and ends checks, after every event, each sum kept against the same
sum taken afresh (the same additions in the same order: equal to the last bit)."""

from __future__ import annotations

import random

from core_helpers import Driver, act, cpu_node, elastic

from arl_tangram.core.commands import ResizeAction, StartAction
from arl_tangram.core.elastic import _floor_of
from arl_tangram.core.resources import CPU


def _fresh(node, floor: float = 0.0) -> tuple[float, float]:
    absorb = lend = 0.0
    for rec in node.elastic.values():
        el = rec.spec.elasticity
        if el.dim != CPU:
            continue
        absorb += el.max - rec.allotment.get(CPU)
        extra = rec.allotment.get(CPU) - _floor_of(el, floor)
        if extra > 0.0:
            lend += extra
    return absorb, lend


def test_the_node_sums_kept_per_move_equal_fresh_ones_after_every_event() -> None:
    rng = random.Random(43)
    d = Driver([cpu_node("n0", cpu=8), cpu_node("n1", cpu=6)])
    running: list[str] = []
    checked = moved = 0
    for i in range(400):
        d.at(0.5 * i)
        if running and rng.random() < 0.45:
            out = d.finish(running.pop(rng.randrange(len(running))), run_s=rng.uniform(0.1, 3.0))
        elif rng.random() < 0.6:
            out = d.arrive(elastic(f"e{i}", 1, rng.choice([2, 4, 8]), rng.choice([0.6, 0.9])))
        else:
            out = d.arrive(act(f"r{i}", cpu=rng.choice([1, 2, 3])))
        for c in out:
            if isinstance(c, StartAction):
                d.started(c.action.id, c.node)
                running.append(c.action.id)
            moved += isinstance(c, ResizeAction)
        for node in d.core.st.nodes.values():
            want = _fresh(node)
            assert d.core.elastic.absorb(node) == want[0], (i, node.name)
            assert d.core.elastic.lendable(node, 0.0) == want[1], (i, node.name)
            # (asked twice: the second answer is the kept one; other floors kept apart)
            assert d.core.elastic.absorb(node) == want[0], (i, node.name)
            for floor in (2.0, 0.0, 1.5, 2.0):
                assert d.core.elastic.lendable(node, floor) == _fresh(node, floor)[1], (i, floor)
            checked += 1
    assert checked == 800
    assert moved > 0  # (elastic actions grew or lent: their allotments changed under the sums)

