"""Exact values of `core.elastic`'s pure parts (issue 43, mutation testing): the fluid model's
sums and join times on hand-computed cases, the lane counts tried and chosen, the floor of a
reclaim, the node's efficiency and an action's useful width."""

from __future__ import annotations

import math

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic

from arl_tangram.core import elastic as E
from arl_tangram.core.actions import ActionSpec, Elasticity, Speedup, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources


def _el(lo: float, hi: float, p: float) -> Elasticity:
    return Elasticity(lo, hi, speedup=Speedup(p))


def _near(got: tuple[float, float], want: tuple[float, float]) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-12)
    if math.isinf(want[1]):
        assert got[1] == math.inf
    else:
        assert got[1] == pytest.approx(want[1], rel=1e-12, abs=1e-12)


# ---- the fluid model, one class ----------------------------------------------------------


def test_two_equal_jobs_side_by_side_on_two_cores() -> None:
    # each at one core, speed 1: both end at t = 1; the first queued started at once
    _near(E._fluid_one(2.0, 2, [1.0, 1.0], 0, 2.0, 0.5), (2.0, 0.0))
    el = _el(1, 2, 0.5)
    _near(E._fluid(2.0, 2, [(1.0, el), (1.0, el)], 0), (2.0, 0.0))


def test_two_equal_jobs_one_after_the_other_and_the_join_time() -> None:
    # at 2 cores s(2) = 1 / (0.5 + 0.25) = 4/3: ends at 0.75 and 1.5; the queued one joins at 0.75
    _near(E._fluid_one(2.0, 1, [1.0, 1.0], 1, 2.0, 0.5), (2.25, 0.75))
    el = _el(1, 2, 0.5)
    _near(E._fluid(2.0, 1, [(1.0, el), (1.0, el)], 1), (2.25, 0.75))
    # lanes below the running ones: never fewer than they (both run)
    _near(E._fluid(2.0, 1, [(1.0, el), (1.0, el)], 2), (2.0, math.inf))


def test_a_shorter_job_ends_and_the_other_widens() -> None:
    # both at 1 core (speed 1): t = 1; then the other at 2 cores (4/3) does its 2 left in 1.5
    _near(E._fluid_one(2.0, 2, [1.0, 3.0], 2, 2.0, 0.5), (3.5, math.inf))
    _near(E._fluid_one(2.0, 2, [3.0, 1.0], 0, 2.0, 0.5), (3.5, 0.0))


def test_a_class_capped_at_its_maximum() -> None:
    # 4 cores, two jobs of maximum 1.5: each runs at 1.5, s = 1 / (0.5 + 0.5/1.5) = 1.2
    _near(E._fluid_one(4.0, 2, [1.2, 2.4], 2, 1.5, 0.5), (3.0, math.inf))
    el = _el(1, 1.5, 0.5)
    _near(E._fluid(4.0, 2, [(1.2, el), (2.4, el)], 2), (3.0, math.inf))
    # a maximum below one core: speed = width
    _near(E._fluid_one(4.0, 1, [1.0], 0, 0.5, 0.5), (2.0, 0.0))


def test_a_width_of_zero_never_ends() -> None:
    got = E._fluid_one(0.0, 1, [1.0], 0, 1.0, 0.5)
    assert got[0] == math.inf and got[1] == 0.0


def test_three_jobs_two_lanes_the_third_joins_when_the_first_ends() -> None:
    # 2 cores, p = 0.5: two at 1 core; the first ends at 1, the third joins then (join 1);
    # the second (2 left) and the third (1) share, one core each: the third ends at 2; the
    # second, 1 left, alone at 2 cores (4/3) ends at 2.75; sum 1 + 2 + 2.75
    _near(E._fluid_one(2.0, 2, [1.0, 3.0, 1.0], 2, 2.0, 0.5), (5.75, 1.0))


# ---- the fluid model, two classes (water filling) -----------------------------------------


def test_two_classes_water_filling() -> None:
    a = _el(1, 1, 0.0)  # one core at most
    b = _el(1, 4, 1.0)  # linear: s(k) = k
    # 4 cores: a takes 1 (its maximum), b the other 3 (speed 3); a ends at 1 (b did 3 of 6),
    # then b alone at 4 does its 3 left in 0.75: 1 + 1.75
    _near(E._fluid(4.0, 2, [(1.0, a), (6.0, b)], 2), (2.75, math.inf))
    # the order of the jobs does not matter; b first in the list
    _near(E._fluid(4.0, 2, [(6.0, b), (1.0, a)], 2), (2.75, math.inf))


def test_two_classes_with_a_queued_job() -> None:
    a = _el(1, 1, 0.0)
    b = _el(1, 4, 1.0)
    # a (1) ends at 1 and a queued a (2) joins; b has 3 left at 3 cores: ends at 2 (sum 3);
    # the queued a has 1 left at its maximum 1: ends at 3 (sum 6)
    _near(E._fluid(4.0, 2, [(1.0, a), (6.0, b), (2.0, a)], 2), (6.0, 1.0))
    # on the classes directly, as `_best_lanes` calls it
    _near(E._fluid_on(4.0, 2, [1.0, 6.0, 2.0], [0, 1, 0], [1.0, 4.0], [0.0, 1.0], 2), (6.0, 1.0))
    _near(
        E._fluid_k(4.0, 2, [1.0, 6.0, 2.0], [0, 1, 0], [1.0, 4.0], [0.0, 1.0], 2, None, 0.0),
        (6.0, 1.0),
    )


def test_two_classes_sharing_equally_below_their_maximums() -> None:
    a = _el(1, 3, 1.0)
    b = _el(1, 4, 1.0)
    # 4 cores, both below their maximums: 2 each (speed 2); a (2) ends at 1; b (6) did 2, then
    # alone at 4: 4 left in 1 -> ends at 2; sum 3
    _near(E._fluid(4.0, 2, [(2.0, a), (6.0, b)], 0), (3.0, 0.0))


def test_two_classes_with_a_serial_class_above_one_core() -> None:
    a = _el(1, 2, 0.5)  # s(2) = 4/3
    b = _el(1, 8, 1.0)
    # 8 cores: a at 2 (4/3), b at 6 (6); a (4/3) ends at 1, b (12) did 6, alone at 8: 0.75
    _near(E._fluid(8.0, 2, [(4.0 / 3.0, a), (12.0, b)], 2), (2.75, math.inf))


def test_zero_capacity_with_two_classes_never_ends() -> None:
    a = _el(1, 1, 0.0)
    b = _el(1, 4, 1.0)
    got = E._fluid(0.0, 2, [(1.0, a), (1.0, b)], 0)
    assert got[0] == math.inf and got[1] == 0.0


def test_the_classes_of_jobs() -> None:
    a = _el(1, 2, 0.5)
    a2 = _el(1, 2, 0.5)  # equal, another object: the same class
    b = _el(1, 4, 0.5)
    assert E._classes([(1.0, a), (2.0, b), (3.0, a2), (4.0, a)]) == (
        [0, 1, 0, 0],
        [2.0, 4.0],
        [0.5, 0.5],
    )
    works, cls, tops, pfs, widest = E._kinds_of([(1.0, a), (2.0, b), (3.0, a2)])
    assert (works, cls, tops, pfs, widest) == (
        [1.0, 2.0, 3.0],
        [0, 1, 0],
        [2.0, 4.0],
        [0.5, 0.5],
        8.0,
    )
    assert E._class_index([2.0, 4.0], [0.5, 0.5], 4.0, 0.5) == 1
    assert E._class_index([2.0, 4.0], [0.5, 0.5], 4.0, 0.9) == -1
    assert E._class_index([2.0, 4.0], [0.5, 0.5], 2.0, 0.5) == 0


def test_measured_speedup_caps_and_slows_every_class() -> None:
    spec = NodeSpec("m", Resources(cpu=4), parallel_speedup=((2.0, 1.6), (3.0, 1.6)))
    b = _el(1, 4, 1.0)
    # useful width of b there: 2 (a third core adds nothing); one job at 2 cores, efficiency
    # 0.8: speed 1.6, 1.6 of work ends at 1
    _near(E._fluid(4.0, 1, [(1.6, b)], 0, spec, 0.0), (1.0, 0.0))
    cls, tops, pfs = E._classes([(1.0, b)], spec, 0.0)
    assert (cls, tops, pfs) == ([0], [2.0], [1.0])


# ---- lanes -------------------------------------------------------------------------------


def test_lane_tries() -> None:
    assert E._lane_tries(8.0, 8.0, 1.0, 0) == [1, 2, 4, 8]
    assert E._lane_tries(8.0, 8.0, 1.0, 1) == [1, 2, 4, 8]
    assert E._lane_tries(6.0, 4.0, 1.5, 1) == [1, 2, 3]
    assert E._lane_tries(3.0, 3.0, 0.75, 0) == [1, 2, 4]
    assert E._lane_tries(8.0, 2.0, 1.0, 0) == [1, 4, 8]
    assert E._lane_tries(8.0, 2.0, 1.0, 3) == [3, 4, 8]
    assert E._lane_tries(2.0, 2.0, 2.0, 1) == [1]  # no lane more: the minimum fills the node
    assert E._lane_tries(4.0, 4.0, 4.0, 0) == [1]


@pytest.mark.parametrize("classed", [False, True])
def test_best_lanes_on_two_cores_with_equal_jobs_waiting(classed: bool) -> None:
    """s(2) = 1/0.55 (p = 0.9): n equal jobs one after another at 2 cores cost n(n+1)/2 / s(2),
    two at a time at one core 2(1 + ... + n/2): 12 jobs share (42 < 42.9), 4 do not (6 > 5.5)."""
    el = _el(1, 2, 0.9)
    kinds = E._kinds_of([]) if classed else None
    assert E._best_lanes(2.0, 2.0, 1.0, [], 1.0, el, 11, math.inf, None, 0.0, kinds) == 2
    assert E._best_lanes(2.0, 2.0, 1.0, [], 1.0, el, 3, math.inf, None, 0.0, kinds) == 1


@pytest.mark.parametrize("classed", [False, True])
def test_best_lanes_with_a_long_run_and_a_full_width_elsewhere(classed: bool) -> None:
    """A run of 10 on 2 cores and a newcomer of 1: waiting costs 5.5 + 6.05 = 11.55, sharing
    1 + 5.95 = 6.95 (shares: 2 lanes). With a full width elsewhere in 0.1 (before its turn
    here at 5.5), waiting costs 5.5 + 0.1 + 0.55 = 6.15: it waits (1 lane, the run's)."""
    el = _el(1, 2, 0.9)
    runs = [(10.0, el)]
    kinds = E._kinds_of(runs) if classed else None
    assert E._best_lanes(2.0, 2.0, 1.0, runs, 1.0, el, 0, math.inf, None, 0.0, kinds) == 2
    assert E._best_lanes(2.0, 2.0, 1.0, runs, 1.0, el, 0, 0.1, None, 0.0, kinds) == 1
    # elsewhere later than its turn here (5.5): no matter
    assert E._best_lanes(2.0, 2.0, 1.0, runs, 1.0, el, 0, 6.0, None, 0.0, kinds) == 2
    # one queued behind it: waiting costs the run and that one (5.5 + 6.05) + 0.1 + 0.55 =
    # 12.2, sharing 1 + 2 + 6.4 = 9.4: it shares
    assert E._best_lanes(2.0, 2.0, 1.0, runs, 1.0, el, 1, 0.1, None, 0.0, kinds) == 2


def test_best_lanes_with_another_class_queued() -> None:
    run = _el(1, 2, 0.9)
    new = _el(1, 4, 0.9)  # another class than the run's
    runs = [(10.0, run)]
    for kinds in (None, E._kinds_of(runs)):
        assert E._best_lanes(4.0, 4.0, 1.0, runs, 1.0, new, 0, math.inf, None, 0.0, kinds) == 2
        assert E._best_lanes(4.0, 4.0, 1.0, runs, 1.0, new, 0, 0.01, None, 0.0, kinds) == 1


def test_best_lanes_on_a_full_node_waits() -> None:
    el = _el(2, 2, 0.9)
    runs = [(1.0, el)]
    assert E._best_lanes(2.0, 2.0, 2.0, runs, 1.0, el, 0, math.inf, None, 0.0, None) == 1
    assert E._best_lanes(2.0, 2.0, 2.0, [], 1.0, el, 0, math.inf, None, 0.0, None) == 1


def test_lanes_all_at_max() -> None:
    el = _el(1, 2, 0.9)
    # 8 cores hold the run and the newcomer at their maximums: the first count above 1 run
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(1.0, el)], 1.0, el) == 2
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(1.0, el)], 1.0, el, E._kinds_of([(1.0, el)])) == 2
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], 1.0, el) == 1
    assert E._lanes_all_at_max(4.0001, 2.0, 1.0, [(1.0, el)], 1.0, el) == 2
    assert E._lanes_all_at_max(4.0, 2.0, 1.0, [(1.0, el)], 1.0, el) == -1  # at the capacity
    # not sure: over the capacity, an unknown work, a run that has (nearly) ended
    assert E._lanes_all_at_max(3.0, 2.0, 1.0, [(1.0, el)], 1.0, el) == -1
    assert E._lanes_all_at_max(3.0, 2.0, 1.0, [(1.0, el)], 1.0, el, E._kinds_of([(1.0, el)])) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], math.inf, el) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], -1.0, el) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 0.0, [], 1.0, el) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(1e-9, el)], 1.0, el) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(math.inf, el)], 1.0, el) == -1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(-1.0, el)], 1.0, el) == -1
    # the best lanes agree where it is sure
    assert E._best_lanes(8.0, 2.0, 1.0, [(1.0, el)], 1.0, el, 0, math.inf, None, 0.0) == 2


# ---- floors, efficiency, useful width ------------------------------------------------------


def test_floor_of() -> None:
    rec = ActionRecord(elastic("e", 1, 4, 0.9), 0.0, 0)
    assert E._floor_of(rec, 0.0) == 1.0
    assert E._floor_of(rec, 1.0) == 1.0
    assert E._floor_of(rec, 2.5) == 2.5
    assert E._floor_of(rec, 4.0) == 4.0
    assert E._floor_of(rec, 5.0) == 4.0


def test_a_record_keeps_its_elasticity_for_the_walks() -> None:
    """`ActionRecord.el_min`, `el_max`, `el_cpu`: the range the lane rule's walks read, and
    whether it stretches in CPU (issue 40: read without the spec's attribute lookups)."""
    def kept(spec: ActionSpec) -> tuple[float, float, bool]:
        rec = ActionRecord(spec, 0.0, 0)
        return rec.el_min, rec.el_max, rec.el_cpu

    assert kept(elastic("e", 2, 6, 0.9)) == (2.0, 6.0, True)
    assert kept(elastic("f", 3, 3, 0.9)) == (3.0, 3.0, True)  # (a fixed width: not elastic)
    gpu = ActionSpec("g", demand=Resources(cpu=1, gpu=1),
                     elasticity=Elasticity(1, 4, dim="gpu", speedup=Speedup(0.9)))
    assert kept(gpu) == (1.0, 4.0, False)
    assert kept(act("a", cpu=2)) == (0.0, 0.0, False)


def test_efficiency() -> None:
    spec = NodeSpec("m", Resources(cpu=4), parallel_speedup=((2.0, 1.6),))
    assert E._efficiency(spec, 0.5) == 1.0
    assert E._efficiency(spec, 1.0) == 1.0
    assert E._efficiency(spec, 2.0) == pytest.approx(0.8, rel=1e-12)
    assert E._efficiency(spec, 1.5) == pytest.approx(1.3 / 1.5, rel=1e-12)
    assert E._efficiency(cpu_node("n"), 4.0) == 1.0


def test_useful_width() -> None:
    flat = NodeSpec("m", Resources(cpu=4), parallel_speedup=((2.0, 1.6), (3.0, 1.6)))
    steep = NodeSpec("m", Resources(cpu=4), parallel_speedup=((2.0, 1.6), (4.0, 2.0)))
    lin = _el(1, 4, 1.0)
    assert E._useful(lin, flat, 0.0, 4.0) == 2.0  # a third core adds nothing
    assert E._useful(lin, steep, 0.0, 4.0) == 4.0  # 1 < 1.6 < 1.8 < 2.0
    assert E._useful(lin, steep, 0.0, 3.0) == 3.0  # up to ``top``
    assert E._useful(lin, steep, 0.0, 1.5) == 1.0  # no whole core more fits
    assert E._useful(_el(1.5, 4, 1.0), flat, 0.0, 4.0) == 2.0  # from its minimum 1.5 (v 1.3)
    assert E._useful(lin, steep, 0.0, 2.0 - 1e-10) == 2.0  # (the tolerance)


# ---- reclaim's order and floors; absorb, lendable, free_at ----------------------------------


def _three() -> Driver:
    """10 cores: a (1..4, 10 s) at 3, b (1..4, 2 s) at 4, c (2..3, 5 s) at 3; none free."""
    d = Driver([cpu_node("n", cpu=10)], policy="tangram")
    out = d.at(0.0).arrive(
        elastic("a", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)),
        elastic("b", 1, 4, p=0.9, hints=WorkHints(expected_s=2.0)),
        elastic("c", 2, 3, p=0.9, hints=WorkHints(expected_s=5.0)),
    )
    assert cpu_commands(out) == [
        ("start", "a", 4.0),
        ("start", "b", 4.0),
        ("resize", "a", 3.0),
        ("start", "c", 3.0),
    ]
    return d


@pytest.mark.parametrize(
    ("need", "want"),
    [
        (1.0, [("resize", "a", 2.0), ("start", "r", 1.0)]),
        (2.0, [("resize", "a", 1.0), ("start", "r", 2.0)]),
        (
            3.5,
            [("resize", "a", 1.0), ("resize", "c", 2.0), ("resize", "b", 3.5), ("start", "r", 3.5)],
        ),
        (
            4.0,
            [("resize", "a", 1.0), ("resize", "c", 2.0), ("resize", "b", 3.0), ("start", "r", 4.0)],
        ),
        (
            6.0,
            [("resize", "a", 1.0), ("resize", "c", 2.0), ("resize", "b", 1.0), ("start", "r", 6.0)],
        ),
        (7.0, []),  # 6 lendable: nothing shrinks
    ],
)
def test_a_rigid_arrival_reclaims_the_most_work_left_first_one_step_at_a_time(need, want) -> None:
    d = _three()
    assert (
        cpu_commands(d.at(0.5).arrive(act("r", cpu=need, hints=WorkHints(expected_s=1.0)))) == want
    )


def _direct() -> tuple[Driver, object]:
    d = _three()
    d.core.st.start_index.clear()  # (the starts went out with their event)
    d.core.st.out.clear()
    return d, d.core.st.nodes["n"]


@pytest.mark.parametrize(
    ("need", "floor", "ok", "want", "free"),
    [
        (4.0, 2.0, True, [("resize", "a", 2.0), ("resize", "c", 2.0), ("resize", "b", 2.0)], 4.0),
        (2.0, 2.5, True, [("resize", "a", 2.5), ("resize", "c", 2.5), ("resize", "b", 3.0)], 2.0),
        (5.0, 2.0, False, [], 0.0),  # above 2: a 1, b 2, c 1
        (1.0, 3.5, False, [], 0.0),  # above 3.5: b's 0.5 (a below it, c's range ends at 3)
        (0.5, 3.5, True, [("resize", "b", 3.5)], 0.5),
        (0.5, 0.0, True, [("resize", "a", 2.5)], 0.5),
        (0.0, 0.0, True, [], 0.0),  # nothing lacks
    ],
)
def test_reclaim_down_to_a_floor(need, floor, ok, want, free) -> None:
    d, node = _direct()
    assert d.core.elastic.reclaim(node, Resources(cpu=need), floor) is ok
    assert cpu_commands(d.core.st.out) == want
    assert node.free["cpu"] == free
    # the index of nodes by free CPU follows
    if free > 0.0:
        assert any("n" in b for b in d.core.st.index.buckets_down(free))


def test_a_reclaim_short_by_the_kept_sum_answers_false_without_a_move() -> None:
    d, node = _direct()
    assert d.core.elastic.lendable(node, 2.0) == 4.0  # (kept for this state of the node)
    moves = node.moves
    assert d.core.elastic.reclaim(node, Resources(cpu=5.0), 2.0) is False
    assert (node.moves, cpu_commands(d.core.st.out), node.free["cpu"]) == (moves, [], 0.0)
    # the sum is kept per floor: at 0.0 (6 lendable) the same ask makes room
    assert d.core.elastic.reclaim(node, Resources(cpu=5.0), 0.0) is True
    assert node.free["cpu"] == 5.0


def test_reclaim_of_another_dimension_fails_and_a_free_fit_needs_nothing() -> None:
    d, node = _direct()
    assert d.core.elastic.reclaim(node, Resources(cpu=1.0, memory_mb=1e9)) is False
    assert d.core.elastic.reclaim(node, Resources(memory_mb=100.0)) is True
    assert cpu_commands(d.core.st.out) == []


def test_absorb_lendable_and_free_at() -> None:
    d, node = _direct()
    el = d.core.elastic
    assert el.absorb(node) == 1.0  # a can take 1 more; b and c are at their maximums
    assert el.lendable(node, 0.0) == 6.0  # above the minimums: 2 + 3 + 1
    assert el.lendable(node, 2.0) == 4.0  # above 2: 1 + 2 + 1
    assert el.lendable(node, 3.5) == 0.5  # b's
    # b ends first: 2 s of work at 4 cores (s(4) = 1 / (0.1 + 0.225))
    s4 = 1.0 / (0.1 + 0.9 / 4)
    assert el.free_at(node, 0.0) == 0.0
    assert el.free_at(node, 1.0) == pytest.approx(2.0 / s4, rel=1e-12)
    assert el.free_at(node, 4.0) == pytest.approx(2.0 / s4, rel=1e-12)
    s3 = 1.0 / (0.1 + 0.9 / 3)
    assert el.free_at(node, 4.5) == pytest.approx(5.0 / s3, rel=1e-12)  # then c (5 s at 3)
    assert el.free_at(node, 10.0) == pytest.approx(10.0 / s3, rel=1e-12)  # a last
    assert el.free_at(node, 10.5) == math.inf


def test_lane_tries_never_below_the_runs_and_one_more_where_halving_skips_it() -> None:
    assert E._lane_tries(8.0, 8.0, 1.0, 3) == [3, 4, 8]  # 1 and 2 (widths 8, 4): below the runs
    assert E._lane_tries(5.0, 5.0, 1.0, 4) == [4, 5]  # 5 only as one more than the 4 running


def test_lanes_all_at_max_edges() -> None:
    el = _el(1, 2, 0.9)
    serial = _el(1, 2, 0.0)  # s(2) = 1: no faster at its maximum, still sure
    s = el.speedup.factor(2.0)
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], 0.5, el) == 1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], 0.0, el) == 1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [], 1.0, serial) == 1
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(1.0, serial)], 1.0, el) == 2
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(0.5, el)], 1.0, el) == 2
    # the margin: the first run's end (d) must exceed 1e-6 x 2 x (1 + cost + d), cost = the
    # newcomer's x / s(2) + d: with x = 1e7 (cost 5.5e6), d = 20 clears it, d = 10 does not
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(20.0 * s, el)], 1e7, el) == 2
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(10.0 * s, el)], 1e7, el) == -1
    # d = 15 clears 1e-6 x 2 x 5.5e6 = 11 (not 1e-6 x 3 x 5.5e6 = 16.5)
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(15.0 * s, el)], 1e7, el) == 2
    # d = 10 and 1 + cost + d = 5e6 + 0.5: just short (the run's d counted in the cost)
    assert E._lanes_all_at_max(8.0, 2.0, 1.0, [(10.0 * s, el)], (5e6 - 10.5) * s, el) == -1


def test_efficiency_and_useful_width_with_cores_held_by_others() -> None:
    spec = NodeSpec("m", Resources(cpu=4), parallel_speedup=((2.0, 1.6),))
    assert E._efficiency(spec, 0.0) == 1.0  # (no division by no cores)
    steep = NodeSpec("m", Resources(cpu=8), parallel_speedup=((2.0, 1.6), (4.0, 2.0)))
    # 2 cores held: at 1 core 0.6 (1.8 / 3), at 2 1.0, at 3 1.5, at 4 2.0
    assert E._useful(_el(1, 4, 1.0), steep, 2.0, 4.0) == 4.0
