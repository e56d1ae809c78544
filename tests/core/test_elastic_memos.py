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
from arl_tangram.core.resources import CPU


def _fresh(node, floor: float = 0.0) -> tuple[float, float]:
    absorb = lend = 0.0
    for rec in node.elastic.values():
        el = rec.spec.elasticity
        if el.dim != CPU:
            continue
        absorb += el.max - rec.allotment.get(CPU)
        extra = rec.allotment.get(CPU) - min(max(floor, el.min), el.max)  # (`_floor_of`)
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



# the probes' common part, run in a pure core (`_floor_of` is a Python call there): a node of
# ``n`` cores filled with elastic actions, and the floors a call reads
_PROBE_SETUP = r"""
import json, sys
sys.path.insert(0, "tests/core")
from core_helpers import Driver, cpu_node, elastic
from arl_tangram.core.commands import StartAction
from arl_tangram.core.resources import Resources

def filled(n):
    d = Driver([cpu_node("n0", cpu=n, mem=1 << 20)])
    for c in d.arrive(*(elastic(f"e{i}", 1, 4) for i in range(n))):
        if isinstance(c, StartAction):
            d.started(c.action.id, c.node)
    return d, d.core.st.nodes["n0"]

def counting(call):
    count = [0]
    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "_floor_of":
            count[0] += 1
    sys.setprofile(hook)
    try:
        got = call()
    finally:
        sys.setprofile(None)
    return got, count[0]
"""


def _probe(body: str) -> list:
    """The last line printed by ``body`` after `_PROBE_SETUP`, in a pure core, as JSON."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, ARL_TANGRAM_PURE="1")
    out = subprocess.run([sys.executable, "-c", _PROBE_SETUP + body], env=env,
                         capture_output=True, text=True, check=True, timeout=300)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


_RECLAIM_PROBE = r"""
def floors_read(n):
    # elastic actions fill an n-core node; a head needs more than it could ever lend
    d, node = filled(n)
    moves, lend = node.moves, d.core.elastic.lendable(node, 0.0)
    assert node.free.get("cpu") == 0 and 0 < lend < n
    got, floors = counting(lambda: [d.core.elastic.reclaim(node, Resources(cpu=c))
                                    for c in [n] * 5 + [lend + 0.5] * 5])
    still = node.moves - moves
    # exactly what the node can lend: made (every lender at its floor, the node's CPU free)
    made = d.core.elastic.reclaim(node, Resources(cpu=lend))
    return got, floors, still, len(node.elastic), [made, node.free.get("cpu"), lend]

print(json.dumps([floors_read(20), floors_read(160)]))
"""


def test_a_reclaim_that_cannot_make_room_does_not_walk_the_node() -> None:
    """`Elastic.reclaim` on a crowded node that cannot make room (issue 40: each waiting head
    of a pass asked it, each a walk over the node's hundreds of elastic runs): ten asks answer
    False (for all the node's CPU, and for half a core more than its runs lend), shrink nothing
    (the node's moves unchanged), and read no run's floor -- the node's
    `lendable` sum, kept per move, answers (the walk read 10 floors a call on the 20-core
    node's 10 runs, 2 cores each, and 80 on the 160-core node's 80). Counted in the pure core (`_floor_of` is a Python
    call there). Asked for exactly what the runs hold above their minimums, it makes room.
    """
    small, large = _probe(_RECLAIM_PROBE)
    assert small[0] == large[0] == [False] * 10
    assert (small[1], large[1]) == (0, 0)
    assert (small[2], large[2]) == (0, 0)
    assert (small[3], large[3]) == (10, 80)
    assert small[4] == [True, 10.0, 10.0] and large[4] == [True, 80.0, 80.0]


_ONE_WALK_PROBE = r"""
def floors_read(n):
    d, node = filled(n)
    d.core.elastic._lends.clear()  # (a state of the node not summed yet)
    moves = node.moves
    made, floors = counting(lambda: d.core.elastic.reclaim(node, Resources(cpu=1)))
    return made, floors, node.moves - moves, len(node.elastic), node.free.get("cpu")

print(json.dumps([floors_read(20), floors_read(160)]))
"""


def test_a_reclaim_that_makes_room_walks_the_node_once() -> None:
    """A reclaim on a node state whose `lendable` sum is not kept yet (issue 40: every
    successful reclaim moves the node, so the next one is such) reads each elastic run's floor
    once -- the walk that sums what the runs lend also collects the lenders -- then one floor
    per core taken back: 10 + 1 on the 20-core node's 10 runs, 80 + 1 on the 160-core node's 80
    (two walks read 21 and 161). One core made free, in one move. Counted in the pure core."""
    small, large = _probe(_ONE_WALK_PROBE)
    assert small == [True, 11, 1, 10, 1.0]
    assert large == [True, 81, 1, 80, 1.0]
