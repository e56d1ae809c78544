"""Exact values of `core.elastic`'s remaining corners (issue 43, mutation testing), hand-computed
on small nodes: tenants' use through expansion and reclaim (fair mode), the lender of a rigid
head (`lender`, in either set order), `plan` and `width_on` (limits, steps, the shortcut's
conditions, measured speedups, the reserve, overdue heads), `_candidates`' warm scan, `choose`'s
pricing (measured cores, warm kinds, resident sandboxes, a width below one core, when a full
width frees elsewhere), `_warm_sooner`, `free_at`, `expand` / `expand_node` (changed nodes only,
name order, growth below one core, the growable set), `reclaim` to a start's floor, and the
work left from learned runs; and a memory-elastic action, which never started under tangram (a
defect this file found, fixed: `test_elastic_other_dims.py`)."""

from __future__ import annotations

import math

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources

W10 = WorkHints(expected_s=10.0)

# ---- fair mode: a tenant's use follows its elastic action's width -------------------------------


def test_a_tenants_use_follows_expansion_and_reclaim() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", tenant_shares={"t1": 1.0, "t2": 1.0})
    out = d.arrive(act("r", cpu=2, tenant="t2", hints=WorkHints(expected_s=5.0)))
    out += d.arrive(elastic("a", 1, 4, p=0.9, tenant="t1", hints=W10))
    assert cpu_commands(out) == [("start", "r", 2.0), ("start", "a", 2.0)]
    use = d.core.st.tenant_use
    assert use == {"t1": {"cpu": 2.0, "memory_mb": 256.0}, "t2": {"cpu": 2.0, "memory_mb": 256.0}}
    out = d.at(1.0).finish("r")  # a grows into r's 2 cores, one step at a time
    assert cpu_commands(out) == [("resize", "a", 4.0)]
    assert use == {"t1": {"cpu": 4.0, "memory_mb": 256.0}, "t2": {"cpu": 0.0, "memory_mb": 0.0}}
    out = d.at(2.0).arrive(act("q", cpu=3, tenant="t2", hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "a", 1.0), ("start", "q", 3.0)]  # a lends 3
    assert use == {"t1": {"cpu": 1.0, "memory_mb": 256.0}, "t2": {"cpu": 3.0, "memory_mb": 256.0}}


# ---- lender -------------------------------------------------------------------------------------


def _lenders(names: tuple[str, str] = ("n0", "n1")) -> Driver:
    """On the first node a at 3 (1..3) and a rigid f at 1: no CPU free, 2 lent; on the second
    b at 2 (1..2): 2 free, 1 lent."""
    d = Driver([cpu_node(names[0], cpu=4), cpu_node(names[1], cpu=4)], policy="tangram")
    out = d.arrive(elastic("a", 1, 3, p=0.9, hints=W10))
    out += d.arrive(elastic("b", 1, 2, p=0.9, hints=W10))
    out += d.arrive(act("f", cpu=1, hints=WorkHints(expected_s=100.0)))
    assert cpu_commands(out) == [("start", "a", 3.0), ("start", "b", 2.0), ("start", "f", 1.0)]
    acts = d.core.actions
    assert (acts["a"].node, acts["b"].node, acts["f"].node) == (names[0], names[0 + 1], names[0])
    return d


def test_the_node_that_lends_more_but_cannot_cover_the_head_is_passed_over() -> None:
    # the first lends 2 with nothing free (2 < 3); the second 1 with 2 free (3): the second
    d = _lenders()
    out = d.at(0.5).arrive(act("r", cpu=3, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "b", 1.0), ("start", "r", 3.0)]
    assert d.core.actions["r"].node == "n1"


def _head(cpu: float, seq: int = 99) -> ActionRecord:
    return ActionRecord(act("r", cpu=cpu, hints=WorkHints(expected_s=1.0)), 0.5, seq)


def test_a_reserved_node_lends_nothing() -> None:
    d = _lenders()
    el = d.core.elastic
    d.core.st.reserved["n1"] = "x"
    assert el.lender(_head(3)) is None
    assert d.core.actions["b"].width == 2.0  # (nothing shrank)
    del d.core.st.reserved["n1"]
    assert el.lender(_head(3)) is d.core.nodes["n1"]
    assert d.core.actions["b"].width == 1.0


def _first_first() -> tuple[Driver, tuple[str, str]]:
    """`_lenders` on names for which the set of elastic nodes yields the first node first."""
    for i in range(64):
        names = (f"p{i}", f"q{i}")
        d = _lenders(names)
        if next(iter(d.core.st.elastic_nodes)) == names[0]:
            return d, names
    raise AssertionError("no order with the first node first")


def test_a_node_passed_over_first_does_not_end_the_search() -> None:
    d, names = _first_first()
    assert d.core.elastic.lender(_head(3)) is d.core.nodes[names[1]]  # past the first: 2 + 0 < 3
    d, names = _first_first()
    d.core.st.reserved[names[0]] = "x"
    assert d.core.elastic.lender(_head(1)) is d.core.nodes[names[1]]  # past a reserved first


def test_what_a_head_is_charged_is_what_the_lender_makes_room_for() -> None:
    d = _lenders()
    head = _head(3)
    head.charge = Resources(cpu=2, memory_mb=256)  # (admitted by its measured use)
    assert d.core.elastic.lender(head) is d.core.nodes["n1"]
    assert d.core.actions["b"].width == 2.0  # 2 free there: nothing shrinks


def _pair(amax: float, bmax: float, first: int) -> tuple[Driver, tuple[str, str]]:
    """a (1..amax) on the first node and b (1..bmax) on the second, 4 cores each, on names for
    which the set of elastic nodes yields node ``first`` (0 or 1) first."""
    for i in range(64):
        names = (f"p{i}", f"q{i}")
        d = Driver([cpu_node(names[0], cpu=4), cpu_node(names[1], cpu=4)], policy="tangram")
        out = d.arrive(elastic("a", 1, amax, p=0.9, hints=W10))
        out += d.arrive(elastic("b", 1, bmax, p=0.9, hints=W10))
        assert cpu_commands(out) == [("start", "a", amax), ("start", "b", bmax)]
        assert (d.core.actions["a"].node, d.core.actions["b"].node) == names
        if next(iter(d.core.st.elastic_nodes)) == names[first]:
            d.at(0.5).tick()  # (an event after the starts: calls below resize, not restart)
            return d, names
    raise AssertionError("no such order")


def test_the_lender_is_the_node_that_lends_the_most_in_either_order() -> None:
    for first in (0, 1):
        # the second name lends 3 (b at 4), the first 2 (a at 3, 1 free): the second
        d, names = _pair(3, 4, first)
        assert d.core.elastic.lender(_head(2)) is d.core.nodes[names[1]]
        assert (d.core.actions["a"].width, d.core.actions["b"].width) == (3.0, 2.0)
        # the first name lends 3, the second 2: the first
        d, names = _pair(4, 3, first)
        assert d.core.elastic.lender(_head(2)) is d.core.nodes[names[0]]
        assert (d.core.actions["a"].width, d.core.actions["b"].width) == (2.0, 3.0)
        # a tie (3 each): the first name, whichever comes first
        d, names = _pair(4, 4, first)
        assert d.core.elastic.lender(_head(2)) is d.core.nodes[names[0]]
        assert (d.core.actions["a"].width, d.core.actions["b"].width) == (2.0, 4.0)


# ---- plan and width_on on small nodes, by hand ---------------------------------------------------


def _h(lo: float, hi: float, x: float = 10.0, t: float = 0.0, seq: int = 99) -> ActionRecord:
    """A queued elastic head (1..hi, p = 0.9) of expected work ``x``, submitted at ``t``."""
    rec = ActionRecord(elastic("h", lo, hi, p=0.9, hints=WorkHints(expected_s=x)), t, seq)
    rec.est = x
    return rec


def test_plan_on_an_empty_node_and_behind_a_queue() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    # alone: at its maximum, never more than it uses, nor past the node
    assert el.plan(_h(1, 2), n0, 0) == (2, 2)
    assert el.plan(_h(1, 2.5), n0, 0) == (2.5, 2.5)  # (not whole cores: no speedup measured)
    assert el.plan(_h(1, 8), n0, 0) == (4.0, 4.0)
    assert el.plan(_h(2, 4), n0, 0) == (4.0, 4.0)
    # with 1 or 3 like it queued behind (x = 10, p = 0.9): four lanes of 1 core
    assert el.plan(_h(1, 2.5), n0, 1) == (1.0, 1.0)
    assert el.plan(_h(1, 2.5), n0, 3) == (1.0, 1.0)


def test_plan_where_the_node_holds_less_than_the_minimum() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.arrive(act("f", cpu=3, hints=WorkHints(expected_s=100.0)))  # 1 core free
    assert el.plan(_h(2, 4), n0, 0) == (0.0, 0.0)  # wait: no width and no floor
    assert el.plan(_h(1, 4), n0, 0) == (1.0, 1.0)  # exactly its minimum: it starts


def test_plan_rounds_widths_to_the_step() -> None:
    # 3 cores, step 2: one lane of 3 rounds down to 2 (and step 0.5 keeps 3)
    d = Driver([cpu_node("n0", cpu=3)], policy="tangram", elastic_step=2.0)
    assert d.core.elastic.plan(_h(1, 4), d.core.nodes["n0"], 0) == (2.0, 2.0)
    d = Driver([cpu_node("n0", cpu=3)], policy="tangram", elastic_step=0.5)
    assert d.core.elastic.plan(_h(1, 4), d.core.nodes["n0"], 0) == (3.0, 3.0)


def test_plan_beside_two_equal_runs_and_when_a_full_width_frees_elsewhere() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(elastic("a", 1, 2, p=0.9, hints=W10), elastic("b", 1, 2, p=0.9, hints=W10))
    assert cpu_commands(out) == [("start", "a", 2.0), ("start", "b", 2.0)]
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.at(1.0).tick()
    # a and b have the same work left (a tie in the runs' order); the head waits for one
    assert el.plan(_h(1, 4, t=1.0), n0, 0) == (0.0, 0.0)
    assert el.width_on(_h(1, 4, t=1.0), n0, 0) == (0.0, 0.0)
    # one run a (1..2) at 2 with 100 s of work: a head of 10 s starts at 2 beside it ...
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=100.0)))
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.at(1.0).tick()
    assert el.plan(_h(1, 2, t=1.0), n0, 0) == (2, 2)
    assert el.width_on(_h(1, 2, t=1.0), n0, 0, 5.0) == (2, 2)
    # ... but where its full width frees elsewhere at once, starting here gains nothing: the
    # plan waits (a tie goes to fewer lanes), and the 2 cores a cannot take it takes as they are
    assert el.plan(_h(1, 2, t=1.0), n0, 0, 0.0) == (0.0, 0.0)
    assert el.width_on(_h(1, 2, t=1.0), n0, 0, 0.0) == (2, 0.0)


def test_an_overdue_head_takes_what_it_can_get() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.at(100.0).tick()  # heads submitted at 0 with 10 s of work are overdue
    assert el.width_on(_h(1, 2), n0, 0) == (2, 0.0)
    assert el.width_on(_h(1, 8), n0, 0) == (4.0, 0.0)
    # a (0.5..4) holds all 4 cores: it lends 3.5 (down to its minimum), 3 down to 1 core
    spec = ActionSpec(
        "a", kind=ActionKind.TEST, demand=Resources(cpu=0.5, memory_mb=256),
        elasticity=Elasticity(0.5, 4, speedup=Speedup(0.9)),
        hints=WorkHints(expected_s=1000.0),
    )  # fmt: skip
    assert cpu_commands(d.arrive(spec)) == [("start", "a", 4.0)]
    assert (el.lendable(n0, 0.0), el.lendable(n0, 1.0)) == (3.5, 3.0)
    assert el.width_on(_h(3.5, 4), n0, 0) == (3.5, 0.0)  # its minimum, lent
    assert el.width_on(_h(3.6, 4), n0, 0) == (0.0, 0.0)
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("f", cpu=4, hints=WorkHints(expected_s=1000.0)))
    d.at(100.0).tick()
    assert d.core.elastic.width_on(_h(1, 2), d.core.nodes["n0"], 0) == (0.0, 0.0)


def test_the_reserve_bounds_a_start_from_above_its_minimum() -> None:
    # 8 cores, reserve 2: 6 to start on
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram", reserve_fraction=0.25)
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert el.width_on(_h(1, 4), n0, 0) == (4, 4)
    assert el.width_on(_h(1, 8), n0, 0) == (6.0, 8.0)
    assert el.width_on(_h(3, 8), n0, 0) == (6.0, 8.0)


def test_plan_beside_runs_of_equal_work_but_other_ranges() -> None:
    # a (1..2) and b (1..3) at 2 each on 4 cores, started together: the same work left, so
    # their order in the plan is by work alone (their ranges are not ordered)
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(elastic("a", 1, 2, p=0.9, hints=W10), elastic("b", 1, 3, p=0.9, hints=W10))
    assert cpu_commands(out) == [("start", "a", 2.0), ("start", "b", 2.0)]
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.at(1.0).tick()
    a, b = d.core.actions["a"], d.core.actions["b"]
    assert el.remaining(a) == el.remaining(b) == 10.0 - 1.0 / (0.1 + 0.9 / 2)
    assert el.plan(_h(1, 4, t=1.0), n0, 0) == (0.0, 0.0)


def test_the_shortcut_is_taken_only_where_nothing_frees_elsewhere() -> None:
    # 5 cores, a (1..2) at 2 with 100 s: a head (1..2) of 10 s fits at its maximum beside it
    # (the shortcut: start now); with its full width free elsewhere at once, a tie: it waits
    d = Driver([cpu_node("n0", cpu=5)], policy="tangram")
    d.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=100.0)))
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    d.at(1.0).tick()
    assert el.plan(_h(1, 2, t=1.0), n0, 0) == (2, 2)
    assert el.plan(_h(1, 2, t=1.0), n0, 0, 0.0) == (0.0, 0.0)


def _measured(cap: float, w: float = 2) -> Driver:
    """A node of ``cap`` cores measured at 1.2 on 2, 1.6 on 4; r0 (1..w, 5 s) runs there from
    0; now 0.5."""
    spec = NodeSpec(
        "m0", Resources(cpu=cap, memory_mb=8192), pool="cpu",
        parallel_speedup=((2.0, 1.2), (4.0, 1.6)),
    )  # fmt: skip
    d = Driver([spec], policy="tangram")
    d.arrive(elastic("r0", 1, w, p=0.9, hints=WorkHints(expected_s=5.0)))
    d.at(0.5).tick()
    return d


def test_plan_weighs_a_measured_speedup_on_its_exact_path() -> None:
    # 4 cores: beside r0 a head (1..4) of 1 s with one like it behind starts at 1 core (the
    # node's busy cores deliver less each: wider is not worth it); unmeasured it would be 2
    d = _measured(4)
    assert d.core.elastic.plan(_h(1, 4, x=1.0, t=0.5), d.core.nodes["m0"], 1) == (1.0, 1.0)
    # 8 cores: a head (1..2) of 10 s, alone in the queue, waits for r0 (unmeasured, there is
    # room for both at their maximum: it would start at 2)
    d = _measured(8)
    assert d.core.elastic.plan(_h(1, 2, x=10.0, t=0.5), d.core.nodes["m0"], 0) == (0.0, 0.0)


# ---- _candidates: the most free, then the warm ------------------------------------------------


def _four(enough: int, warm: tuple[str, ...]) -> Driver:
    """n0..n3 of 6, 5, 4 and 3 cores, all free; ``warm`` warm for tests, in that order."""
    d = Driver(
        [cpu_node(f"n{i}", cpu=6 - i) for i in range(4)], policy="tangram", fit_candidates=enough
    )
    for name in warm:
        d(ev.WarmPoolReport(0.0, name, "test", 1))
    return d


def _names(d: Driver, rec: ActionRecord) -> tuple[list[str], list[str] | None]:
    cands, ws = d.core.elastic._candidates(rec)
    return [n.name for n in cands], (None if ws is None else list(ws))


def test_one_candidate_by_free_cpu_then_one_warm() -> None:
    d = _four(1, ())
    assert _names(d, _h(1, 4)) == (["n0"], None)
    d.core.st.reserved["n0"] = "x"  # (held for an aged action)
    assert _names(d, _h(1, 4)) == (["n1"], None)
    # n0 (already a candidate), n2 and n3 warm: n2 is the one warm candidate
    d = _four(1, ("n0", "n2", "n3"))
    assert _names(d, _h(1, 4)) == (["n0", "n2"], ["n0", "n2", "n3"])
    d.core.st.reserved["n2"] = "x"
    assert _names(d, _h(1, 4)) == (["n0", "n3"], ["n0", "n2", "n3"])


def test_warm_candidates_need_the_heads_minimum_free() -> None:
    # two of each; n2 (4 free) and n3 (3) warm: a minimum of 4 takes n2 only, 3.5 n2 only
    d = _four(2, ("n2", "n3"))
    assert _names(d, _h(3, 4)) == (["n0", "n1", "n2", "n3"], ["n2", "n3"])
    assert _names(d, _h(4, 4)) == (["n0", "n1", "n2"], ["n2", "n3"])
    assert _names(d, _h(3.5, 4)) == (["n0", "n1", "n2"], ["n2", "n3"])


def test_the_warm_scan_stops_at_enough() -> None:
    # one by free CPU (n0); n1, n2, n3 warm: two of them
    d = _four(2, ("n1", "n2", "n3"))
    d.core.st.reserved["n0"] = "x"
    assert _names(d, _h(1, 4)) == (["n1", "n2", "n3"], ["n1", "n2", "n3"])
    del d.core.st.reserved["n0"]
    assert _names(d, _h(1, 4)) == (["n0", "n1", "n2", "n3"], ["n1", "n2", "n3"])
    d = Driver([cpu_node(f"n{i}", cpu=6 - i) for i in range(5)], policy="tangram", fit_candidates=2)
    for name in ("n2", "n3", "n4"):
        d(ev.WarmPoolReport(0.0, name, "test", 1))
    assert _names(d, _h(1, 4)) == (["n0", "n1", "n2", "n3"], ["n2", "n3", "n4"])


def test_one_candidate_among_nodes_of_equal_free_cpu() -> None:
    d = Driver([cpu_node(f"n{i}", cpu=4) for i in range(3)], policy="tangram", fit_candidates=1)
    names, ws = _names(d, _h(1, 4))
    assert len(names) == 1 and names[0] in ("n0", "n1", "n2") and ws is None


def test_the_warm_scan_looks_at_64_warm_nodes() -> None:
    # a (8 cores) the candidate by free CPU; w0..w64 warm, w0..w63 held for aged actions: the
    # 65th warm node is past the scan
    nodes = [cpu_node("a", cpu=8)] + [cpu_node(f"w{i}", cpu=4) for i in range(65)]
    d = Driver(nodes, policy="tangram", fit_candidates=1)
    for i in range(65):
        d(ev.WarmPoolReport(0.0, f"w{i}", "test", 1))
    for i in range(64):
        d.core.st.reserved[f"w{i}"] = "x"
    names, ws = _names(d, _h(1, 4))
    assert names == ["a"] and ws is not None and len(ws) == 65
    del d.core.st.reserved["w63"]
    assert _names(d, _h(1, 4))[0] == ["a", "w63"]


# ---- choose ---------------------------------------------------------------------------------------


def _choice(d: Driver, rec: ActionRecord) -> tuple[str | None, float, float, list[str]]:
    node, width, floor, cands = d.core.elastic.choose(rec)
    return (None if node is None else node.name), width, floor, [n.name for n in cands]


def _m0_n1(points: tuple[tuple[float, float], ...], hold: bool = False) -> Driver:
    """m0 (4 cores, measured ``points``) and n1 (2 cores), both cold (0.5 s); with ``hold`` a
    rigid f (1 core, 100 s) first; now 0.5."""
    spec = NodeSpec(
        "m0", Resources(cpu=4, memory_mb=8192), pool="cpu", parallel_speedup=points
    )  # fmt: skip
    d = Driver([spec, cpu_node("n1", cpu=2)], policy="tangram", sandbox_cold_s=0.5)
    if hold:
        d.arrive(act("f", cpu=1, hints=WorkHints(expected_s=100.0)))
    d.at(0.5).tick()
    return d


def test_choose_prices_a_measured_nodes_busy_cores() -> None:
    # m0 at 4 cores delivers 1.6 / 4 = 0.4 of each: 0.5 + 1 / (s(4) 0.4) = 1.3125 s; n1 at 2:
    # 0.5 + 1 / s(2) = 1.05 s (s(k) = 1 / (0.1 + 0.9 / k))
    d = _m0_n1(((2.0, 1.2), (4.0, 1.6)))
    assert _choice(d, _h(1, 4, x=1.0, t=0.5)) == ("n1", 2.0, 2.0, ["m0", "n1"])
    # measured 3.0 on 4: 0.75 of each: 0.5 + 1 / (s(4) 0.75) = 0.933 s, sooner than n1
    d = _m0_n1(((2.0, 1.8), (4.0, 3.0), (8.0, 4.0), (16.0, 5.0)))
    assert _choice(d, _h(1, 4, x=1.0, t=0.5)) == ("m0", 4.0, 4.0, ["m0", "n1"])
    # f holds one of n1's cores: 0.5 + 1 / s(1) = 1.5 s there; m0 still 1.3125
    d = _m0_n1(((2.0, 1.2), (4.0, 1.6)), hold=True)
    assert d.core.actions["f"].node == "n1"
    assert _choice(d, _h(1, 4, x=1.0, t=0.5)) == ("m0", 4.0, 4.0, ["m0", "n1"])


def test_choose_counts_warm_only_for_the_heads_own_kind() -> None:
    # n0 (4 cores) with one executor warm for tests, n1 (8) warm for python only: warm on n0
    # 1 / s(4) = 0.325 s, cold on n1 0.5 + 1 / s(8) = 0.7128 s
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=8)], policy="tangram", sandbox_cold_s=0.5)
    d(ev.WarmPoolReport(0.0, "n0", "test", 1))
    d(ev.WarmPoolReport(0.0, "n1", "python", 2))
    assert _choice(d, _h(1, 8, x=1.0)) == ("n0", 4.0, 4.0, ["n1", "n0"])


def test_choose_waits_with_width_zero_where_no_node_can_start() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("f", cpu=4, hints=WorkHints(expected_s=100.0)))
    assert _choice(d, _h(1, 4)) == (None, 0.0, 0.0, ["n0"])


def test_choose_waits_with_width_minus_one_for_a_warm_node() -> None:
    # n0 warm for tests, held 0.45 s; n1 cold (0.5 s) and empty: a test of 1 s waits for n0
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=4)], policy="tangram", sandbox_cold_s=0.5)
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d.arrive(act("h", cpu=4, hints=WorkHints(expected_s=0.45)))
    assert d.core.actions["h"].node == "n0"
    assert _choice(d, _h(1, 4, x=1.0)) == (None, -1.0, 0.0, ["n1", "n0"])


def test_without_a_cold_start_a_head_never_waits_for_a_warm_node() -> None:
    # n1 (1 core, no cold start) takes 1 s; n0 (warm, 4 cores) frees in 0.1 s: 0.1 + 1 / s(4)
    # = 0.425 s would be sooner, but a start costs nothing anywhere: it starts on n1 now
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=1)], policy="tangram", sandbox_cold_s=0.0)
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d.arrive(act("h", cpu=4, hints=WorkHints(expected_s=0.1)))
    assert d.core.actions["h"].node == "n0"
    assert _choice(d, _h(1, 4, x=1.0)) == ("n1", 1.0, 1.0, ["n1", "n0"])


def test_choose_tells_each_node_when_a_full_width_frees_on_the_others() -> None:
    # n0 (5 cores) runs a (1..2, 100 s) at 2; n1 (2 cores) empty: a head (1..2) of 10 s could
    # start at its maximum on n1 at once, so on n0 the plan waits and the head takes the 2
    # cores a cannot (floor 0); the tie in time goes to n0, the first
    d = Driver([cpu_node("n0", cpu=5), cpu_node("n1", cpu=2, mem=16384)], policy="tangram")
    d.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=100.0)))
    assert _choice(d, _h(1, 2)) == ("n0", 2, 0.0, ["n0", "n1"])
    # g (2 cores, 1 s) on n1: its full width frees in 1 s, and n0's plan starts now (floor 2)
    d.arrive(act("g", cpu=2, mem=10000, hints=WorkHints(expected_s=1.0)))
    assert d.core.actions["g"].node == "n1"
    assert _choice(d, _h(1, 2)) == ("n0", 2, 2, ["n0", "n1"])


def test_choose_prices_a_width_below_one_core_at_its_speed() -> None:
    # n0 (1 core, cold 0.5 s): 0.5 + 1 / s(1) = 1.5 s; n1 (0.5 core, warm): 1 / 0.5 = 2 s
    d = Driver([cpu_node("n0", cpu=1), cpu_node("n1", cpu=0.5)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n1", "test", 1))
    assert _choice(d, _h(0.5, 4, x=1.0)) == ("n0", 1.0, 1.0, ["n0", "n1"])


# ---- expand_node ----------------------------------------------------------------------------------


def test_an_action_at_its_maximum_leaves_the_growable_set_at_the_next_expansion() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(
        act("r", cpu=2, hints=WorkHints(expected_s=1.0)), elastic("a", 1, 3, p=0.9, hints=W10)
    )
    assert cpu_commands(out) == [("start", "r", 2.0), ("start", "a", 2.0)]
    growable = d.core.placer.growable
    assert cpu_commands(d.at(1.0).finish("r")) == [("resize", "a", 3.0)]
    assert growable == {"n0": {"a": None}}  # (met below its maximum in that pass)
    assert cpu_commands(d.at(1.5).arrive(act("q", cpu=1, hints=WorkHints(expected_s=1.0)))) == [
        ("start", "q", 1.0)
    ]
    assert cpu_commands(d.at(2.0).finish("q")) == []  # 1 core spare: a is at its maximum
    assert growable == {"n0": {}}


def test_without_spare_cpu_above_the_reserve_expansion_looks_at_no_action() -> None:
    # 4 cores, reserve 1 (a quarter, and r's minimum): r 1 and a 2 leave exactly the reserve
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", reserve_fraction=0.25)
    out = d.arrive(
        act("r", cpu=1, hints=WorkHints(expected_s=100.0)), elastic("a", 1, 2, p=0.9, hints=W10)
    )
    assert cpu_commands(out) == [("start", "r", 1.0), ("start", "a", 2.0)]
    assert d.core.nodes["n0"].free.get("cpu") == 1.0
    assert d.core.placer.growable == {"n0": {"a": None}}  # (a at its maximum, not yet met)


def test_a_node_whose_last_elastic_action_ended_leaves_the_elastic_nodes() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(
        act("r", cpu=1, hints=WorkHints(expected_s=100.0)), elastic("a", 1, 3, p=0.9, hints=W10)
    )
    assert cpu_commands(out) == [("start", "r", 1.0), ("start", "a", 3.0)]
    assert d.core.st.elastic_nodes == {"n0"}
    assert cpu_commands(d.at(1.0).finish("a")) == []
    assert d.core.st.elastic_nodes == set()
    assert d.core.placer.growable == {"n0": {}}


def test_growth_stops_at_a_maximum_between_steps() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(
        act("r", cpu=2, hints=WorkHints(expected_s=1.0)), elastic("a", 1, 2.5, p=0.9, hints=W10)
    )
    assert cpu_commands(out) == [("start", "r", 2.0), ("start", "a", 2.0)]
    assert cpu_commands(d.at(1.0).finish("r")) == [("resize", "a", 2.5)]
    assert d.core.nodes["n0"].free.get("cpu") == 1.5


def test_an_action_that_gains_nothing_from_width_does_not_undo_the_others_growth() -> None:
    # 6 cores: r 4 (1 s); a (1..3, p = 0.9, 5 s) and b (1..3, p = 0, 50 s) at 1 each; when r
    # ends a (least work left) grows to 3, b gains nothing from a core: it stays at 1
    d = Driver([cpu_node("n0", cpu=6)], policy="tangram")
    out = d.arrive(
        act("r", cpu=4, hints=WorkHints(expected_s=1.0)),
        elastic("a", 1, 3, p=0.9, hints=WorkHints(expected_s=5.0)),
        elastic("b", 1, 3, p=0.0, hints=WorkHints(expected_s=50.0)),
    )
    assert cpu_commands(out) == [
        ("start", "r", 4.0), ("start", "a", 2.0), ("resize", "a", 1.0), ("start", "b", 1.0)
    ]  # fmt: skip
    assert cpu_commands(d.at(1.0).finish("r")) == [("resize", "a", 3.0)]
    assert (d.core.actions["a"].width, d.core.actions["b"].width) == (3.0, 1.0)


# ---- a defect, fixed: an action stretching memory never started in the shared pool (tangram) -----


def test_a_memory_elastic_action_starts_on_an_empty_node() -> None:
    # fifo and task-isolated start it at its minimum at once; tangram's width_on compared the
    # node's 4 free cores with its minimum of 256 (MB) and waited, overdue or not, forever
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    spec = ActionSpec(
        "m", kind=ActionKind.TEST, demand=Resources(cpu=1, memory_mb=256),
        elasticity=Elasticity(256, 1024, dim="memory_mb", speedup=Speedup(0.5)), hints=W10,
    )  # fmt: skip
    out = d.arrive(spec) + d.at(100.0).tick()
    assert [c.action.id for c in out if isinstance(c, cmd.StartAction)] == ["m"]


@pytest.mark.parametrize(("p", "grown"), [(0.9, 2.0), (0.0, 1.5)])
def test_an_action_below_one_core_grows(p: float, grown: float) -> None:
    # 2 cores: r 1.5 (1 s), a (0.5..2) starts at 0.5; when r ends a grows: to 2 with p = 0.9 (a
    # step from 0.5 to 1.5 speeds it from 0.5 to s(1.5) = 1.15), to 1.5 only with p = 0 (its
    # speed from 0.5 to 1, and a core more adds no speed)
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    out = d.arrive(act("r", cpu=1.5, hints=WorkHints(expected_s=1.0)))
    spec = ActionSpec(
        "a", kind=ActionKind.TEST, demand=Resources(cpu=0.5, memory_mb=256),
        elasticity=Elasticity(0.5, 2, speedup=Speedup(p)), hints=W10,
    )  # fmt: skip
    out += d.arrive(spec)
    assert cpu_commands(out) == [("start", "r", 1.5), ("start", "a", 0.5)]
    assert cpu_commands(d.at(1.0).finish("r")) == [("resize", "a", grown)]


def test_a_lender_shrinks_an_action_to_its_minimum_below_one_core() -> None:
    # a (0.5..4) at 4 lends 3.5: a rigid head of 3.5 cores takes them
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    spec = ActionSpec(
        "a", kind=ActionKind.TEST, demand=Resources(cpu=0.5, memory_mb=256),
        elasticity=Elasticity(0.5, 4, speedup=Speedup(0.9)), hints=WorkHints(expected_s=100.0),
    )  # fmt: skip
    assert cpu_commands(d.arrive(spec)) == [("start", "a", 4.0)]
    out = d.at(0.5).arrive(act("r", cpu=3.5, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "a", 0.5), ("start", "r", 3.5)]


def test_a_reclaim_takes_the_most_work_first_to_its_minimum_then_the_next() -> None:
    # a (1..2, 100 s) and b (1..2, 10 s) at 2 each on 4 cores: a rigid head of 3 takes a's one
    # spare core, then b's
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(
        elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=100.0)),
        elastic("b", 1, 2, p=0.9, hints=WorkHints(expected_s=10.0)),
    )
    assert cpu_commands(out) == [("start", "a", 2.0), ("start", "b", 2.0)]
    out = d.at(0.5).arrive(act("r", cpu=2, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "a", 1.0), ("resize", "b", 1.0), ("start", "r", 2.0)]


def test_expansion_passes_over_a_reserved_node_to_the_next() -> None:
    # r0 on n0 and r1 on n1 (2 cores, 1 s each; r1 fits only n1's memory); a on n0 and b on
    # n1 (1..4); reserve a quarter (1 core): a at 2, b at 1 (n1 keeps 1 free)
    d = Driver(
        [cpu_node("n0", cpu=4), cpu_node("n1", cpu=4, mem=16384)],
        policy="tangram", reserve_fraction=0.25,
    )  # fmt: skip
    d.arrive(
        act("r0", cpu=2, hints=WorkHints(expected_s=1.0)),
        act("r1", cpu=2, mem=10000, hints=WorkHints(expected_s=1.0)),
        elastic("a", 1, 4, p=0.9, hints=W10),
        elastic("b", 1, 4, p=0.9, hints=W10),
    )
    acts = d.core.actions
    assert [(k, acts[k].node, acts[k].width) for k in ("r0", "r1", "a", "b")] == [
        ("r0", "n0", 0.0), ("r1", "n1", 0.0), ("a", "n0", 2.0), ("b", "n1", 1.0)
    ]  # fmt: skip
    el, st = d.core.elastic, d.core.st
    el.largest_min_cpu = 100.0  # (a reserve of the whole node while r0 and r1 end: no growth)
    d.at(1.0).finish("r0")
    d.at(1.0).finish("r1")
    assert (acts["a"].width, acts["b"].width) == (2.0, 1.0)
    el.largest_min_cpu = 0.0
    st.reserved["n0"] = "x"  # (held for an aged action: no expansion there)
    st.expand_at.update(("n0", "n1"))
    el.expand()
    assert (acts["a"].width, acts["b"].width) == (2.0, 3.0)  # n1 keeps its reserve of 1
    # (n0 reserved is no room elsewhere: n1's reserve stays 1)


def test_a_start_shrinks_the_others_only_down_to_its_own_width() -> None:
    # 6 cores: a (1..3, 100 s) and b (1..3, 50 s) at 3 each; h (1..4, 1 s) starts at 2 with
    # floor 2: a (the most work) gives one core down to 2, then b one (not a two, to 1)
    d = Driver([cpu_node("n0", cpu=6)], policy="tangram")
    out = d.arrive(
        elastic("a", 1, 3, p=0.9, hints=WorkHints(expected_s=100.0)),
        elastic("b", 1, 3, p=0.9, hints=WorkHints(expected_s=50.0)),
    )
    assert cpu_commands(out) == [("start", "a", 3.0), ("start", "b", 3.0)]
    out = d.at(0.5).arrive(elastic("h", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "a", 2.0), ("resize", "b", 2.0), ("start", "h", 2.0)]


# ---- free_at, _warm_sooner -------------------------------------------------------------------------


def test_free_at_counts_every_running_action_by_its_cores_and_speed() -> None:
    # 2 cores: four rigid actions of half a core, 1, 2, 3 and 4 s
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    for i in range(4):
        d.arrive(act(f"r{i}", cpu=0.5, hints=WorkHints(expected_s=float(i + 1))))
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert [el.free_at(n0, w) for w in (0.5, 1.0, 1.5, 2.0, 2.5)] == [1.0, 2.0, 3.0, 4.0, math.inf]
    # an elastic action at half a core runs at half speed: 10 s of work end in 20 s
    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d.arrive(act("r", cpu=0.5, hints=WorkHints(expected_s=100.0)))
    spec = ActionSpec(
        "a", kind=ActionKind.TEST, demand=Resources(cpu=0.5, memory_mb=256),
        elasticity=Elasticity(0.5, 4, speedup=Speedup(0.9)), hints=W10,
    )  # fmt: skip
    assert cpu_commands(d.arrive(spec)) == [("start", "a", 0.5)]
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert (el.free_at(n0, 0.5), el.free_at(n0, 1.0)) == (20.0, 100.0)


def test_a_warm_node_whose_elastic_action_could_take_its_free_cores_is_weighed() -> None:
    # n0 (4 cores, warm) runs b (1..8, 0.2 s) at 4: nothing free, b could take 4 more; n1 (4,
    # cold) empty. A test of 1 s: cold on n1 0.5 + 1 / s(4) = 0.825 s; on n0 after b's
    # 0.2 / s(4) = 0.065 s, then 0.325: it waits for n0
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=4, mem=16384)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d.arrive(act("g", cpu=4, mem=10000, hints=WorkHints(expected_s=1.0)))  # (n1 busy meanwhile)
    d.arrive(elastic("b", 1, 8, p=0.9, hints=WorkHints(expected_s=0.2)))
    assert (d.core.actions["g"].node, d.core.actions["b"].node) == ("n1", "n0")
    assert d.core.actions["b"].width == 4.0
    d.at(1.0).finish("g")
    assert _choice(d, _h(1, 4, x=1.0, t=1.0)) == (None, -1.0, 0.0, ["n1", "n0"])


def test_a_warm_node_below_one_core_is_priced_at_its_speed() -> None:
    # w (half a core, warm) held 0.1 s; n1 (1 core, cold): a test (0.5..4) of 1 s: cold on n1
    # 0.5 + 1 = 1.5 s; on w 0.1 + 1 / 0.5 = 2.1 s: it starts on n1
    d = Driver([cpu_node("n1", cpu=1), cpu_node("w", cpu=0.5)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "w", "test", 1))
    d.arrive(act("r", cpu=0.5, hints=WorkHints(expected_s=0.1)))
    assert d.core.actions["r"].node == "w"
    assert _choice(d, _h(0.5, 4, x=1.0)) == ("n1", 1.0, 1.0, ["n1", "w"])


def test_the_warm_wait_looks_at_64_warm_nodes() -> None:
    # a (8 cores, cold) empty: 0.5 + 1 / s(8) = 0.71 s; w0..w64 warm and busy, w0..w63 held for
    # aged actions: w64 frees in 0.1 s (0.425 s in all) but is past the scan: it starts on a
    nodes = [cpu_node("a", cpu=8, mem=4096)] + [cpu_node(f"w{i}", cpu=4) for i in range(65)]
    d = Driver(nodes, policy="tangram", fit_candidates=1)
    for i in range(65):
        d(ev.WarmPoolReport(0.0, f"w{i}", "test", 1))
        d.arrive(act(f"r{i}", cpu=4, mem=6000, hints=WorkHints(expected_s=0.1)))
        assert d.core.actions[f"r{i}"].node == f"w{i}"
    for i in range(64):
        d.core.st.reserved[f"w{i}"] = "x"
    assert _choice(d, _h(1, 8, x=1.0)) == ("a", 8.0, 8.0, ["a"])


def test_choose_for_a_head_not_in_the_queue_weighs_no_one_behind_it() -> None:
    # one node of 5 cores, a (1..2, 100 s) at 2: a head (1..2) of 10 s, not queued, starts at
    # 2 beside a (floor 2), as `plan` says with no one behind
    d = Driver([cpu_node("n0", cpu=5)], policy="tangram")
    d.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=100.0)))
    d.at(1.0).tick()
    assert _choice(d, _h(1, 2, t=1.0)) == ("n0", 2, 2, ["n0"])


def test_where_sandboxes_stay_resident_no_node_pays_a_cold_start() -> None:
    # n0 (4 cores) warm for tests, n1 (8) not: resident, n1's 1 / s(8) = 0.21 s beats n0's
    # 1 / s(4) = 0.325 s (with a cold start of 0.5 s n1 would lose)
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=8)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "test", 1))
    assert _choice(d, _h(1, 8, x=1.0)) == ("n0", 4.0, 4.0, ["n1", "n0"])
    d.core.st.resident = True  # (a policy whose sandboxes stay resident)
    assert _choice(d, _h(1, 8, x=1.0)) == ("n1", 8.0, 8.0, ["n1", "n0"])


def test_expansion_runs_only_on_the_nodes_an_event_changed() -> None:
    # reserve a quarter and g's 4 cores: n0 keeps 4 while n1 is full (g, 1 s), so a (1..4)
    # starts at 1; when g ends n0 is not changed: a stays at 1 until something there changes
    d = Driver(
        [cpu_node("n0", cpu=4), cpu_node("n1", cpu=4, mem=16384)],
        policy="tangram", reserve_fraction=0.25,
    )  # fmt: skip
    d.arrive(act("g", cpu=4, mem=10000, hints=WorkHints(expected_s=1.0)))
    d.arrive(elastic("a", 1, 4, p=0.9, hints=W10))
    assert (d.core.actions["a"].node, d.core.actions["a"].width) == ("n0", 1.0)
    assert cpu_commands(d.at(1.0).finish("g")) == []
    assert d.core.actions["a"].width == 1.0


def test_expansion_goes_over_the_changed_nodes_in_name_order() -> None:
    # p and q (4 cores, reserve 1 each, q holds r1 by its memory): a on p at 2, b on q at 1,
    # their growth held back while r0 and r1 end; then both expand: p first takes its 2 free
    # (q has room for the reserve), q then keeps its reserve: 4 and 3. (Names for which a set
    # yields q first: the order is the names', not the set's.)
    for i in range(64):
        p, q = f"p{i}", f"q{i}"
        if next(iter({p, q})) == q == next(iter({q, p})):  # (in either insertion order)
            break
    d = Driver(
        [cpu_node(p, cpu=4), cpu_node(q, cpu=4, mem=16384)], policy="tangram", reserve_fraction=0.25
    )
    d.arrive(
        act("r0", cpu=2, hints=WorkHints(expected_s=1.0)),
        act("r1", cpu=2, mem=10000, hints=WorkHints(expected_s=1.0)),
        elastic("a", 1, 4, p=0.9, hints=W10),
        elastic("b", 1, 4, p=0.9, hints=W10),
    )
    acts, el = d.core.actions, d.core.elastic
    el.largest_min_cpu = 100.0  # (the whole node as reserve while r0 and r1 end)
    d.at(1.0).finish("r0")
    d.at(1.0).finish("r1")
    assert [(k, acts[k].node, acts[k].width) for k in ("a", "b")] == [("a", p, 2.0), ("b", q, 1.0)]
    el.largest_min_cpu = 0.0
    d.core.st.expand_at.update((p, q))
    el.expand()
    assert (acts["a"].width, acts["b"].width) == (4.0, 3.0)


def _measured_runs(points: tuple[tuple[float, float], ...], widths: tuple[float, ...]) -> Driver:
    """m0 (4 cores, measured ``points``) running r0, r1, ... (1..w, p = 0.9, 5 s, 10 s, ...)
    from 0 (a width of 1 is a fixed one: CPU held by others than the elastic runs); now 0.5."""
    spec = NodeSpec("m0", Resources(cpu=4, memory_mb=8192), pool="cpu", parallel_speedup=points)
    d = Driver([spec], policy="tangram")
    for i, w in enumerate(widths):
        d.arrive(elastic(f"r{i}", 1, w, p=0.9, hints=WorkHints(expected_s=5.0 * (i + 1))))
    d.at(0.5).tick()
    return d


def test_width_on_a_measured_node_beside_others_and_a_width_freeing_elsewhere() -> None:
    pts = ((2.0, 1.2), (4.0, 1.6))
    # r0 (1..2) at 2: a head (1..2) of 1 s, its full width free elsewhere in 2 s: it starts
    # here at 2 (waiting prices the busy cores' efficiency too)
    d = _measured_runs(pts, (2,))
    assert d.core.elastic.width_on(_h(1, 2, x=1.0), d.core.nodes["m0"], 0, 2.0) == (2.0, 2.0)
    # r0 fixed at 1 (the base), r1 (1..3): 1 core now, for a head of 1 s with its full width
    # elsewhere in 2 s, and for one of 10 s with one more like it behind
    d = _measured_runs(pts, (1, 3))
    assert d.core.elastic.width_on(_h(1, 2, x=1.0), d.core.nodes["m0"], 0, 2.0) == (1.0, 1.0)
    d = _measured_runs(pts, (1, 3))
    assert d.core.elastic.width_on(_h(1, 2, x=10.0), d.core.nodes["m0"], 1) == (1.0, 1.0)
    # measured 1.05 on 2 cores: beside r0 (fixed 1) and r1 a head (1..4) of 10 s waits
    d = _measured_runs(((2.0, 1.05),), (1, 3))
    assert d.core.elastic.width_on(_h(1, 4, x=10.0), d.core.nodes["m0"], 0) == (0.0, 0.0)


def test_no_lender_makes_room_for_a_dimension_other_than_cpu() -> None:
    # a head of 3 cores and a GPU: n1 could lend the cores, but has no GPU: nothing shrinks
    d = _lenders()
    spec = ActionSpec(
        "g", demand=Resources(cpu=3, memory_mb=256, gpu=1), hints=WorkHints(expected_s=1.0)
    )
    head = ActionRecord(spec, 0.5, 99)
    assert d.core.elastic.lender(head) is None
    assert d.core.actions["b"].width == 2.0


def test_a_planned_width_that_the_node_cannot_lend_down_to_is_a_wait() -> None:
    # a (3..4, 100 s) holds all 4 cores: a head (2..4) of 1 s is planned 2 cores (floor 2),
    # but a lends only 1 (down to its minimum 3): 1 core is below the head's minimum 2
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    spec = ActionSpec(
        "a", kind=ActionKind.TEST, demand=Resources(cpu=3, memory_mb=256),
        elasticity=Elasticity(3, 4, speedup=Speedup(0.9)), hints=WorkHints(expected_s=100.0),
    )  # fmt: skip
    assert cpu_commands(d.arrive(spec)) == [("start", "a", 4.0)]
    d.at(0.5).tick()
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert el.plan(_h(2, 4, x=1.0, t=0.5), n0, 0) == (2.0, 2.0)
    # (even every lent core back, 1, is below its minimum: a wait without a plan, no floor)
    assert el.width_on(_h(2, 4, x=1.0, t=0.5), n0, 0) == (0.0, 0.0)


def test_a_planned_width_above_what_the_runs_lend_down_to_it_is_a_wait_with_its_floor() -> None:
    # a (3..4) at 4 and b (1..2) at 2 hold all 6 cores, both of 100 s: they would lend 2 down to
    # their minimums (a head's 2 fit), but a head (2..4) of 1 s is planned 2 cores (3 lanes of
    # 2, floor 2), and down to 2 they lend 1 (a's 1 above its 3; b is at 2): below its minimum
    d = Driver([cpu_node("n0", cpu=6)], policy="tangram")
    a = elastic("a", 3, 4, 0.9, hints=WorkHints(expected_s=100.0))
    b = elastic("b", 1, 2, 0.9, hints=WorkHints(expected_s=100.0))
    assert cpu_commands(d.arrive(a, b)) == [("start", "a", 4.0), ("start", "b", 2.0)]
    d.at(0.5).tick()
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert (n0.free["cpu"], el.lendable(n0, 0.0), el.lendable(n0, 2.0)) == (0.0, 2.0, 1.0)
    assert el.plan(_h(2, 4, x=1.0, t=0.5), n0, 0) == (2.0, 2.0)
    assert el.width_on(_h(2, 4, x=1.0, t=0.5), n0, 0) == (0.0, 2.0)


def test_the_work_left_of_a_running_action_is_the_learned_mean_excess() -> None:
    # three tests of the kind ran 1, 2 and 6 s at 1.5 cores (s = s(1.5) = 1 / 0.7): work s, 2s,
    # 6s. x runs at 1.5 from 40: at 41 it did s; of the runs longer than that (2s, 6s) the mean
    # excess is (s + 5s) / 2 = 3s, not its estimate (the median, 2s) less s
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    for i, run_s in enumerate((1.0, 2.0, 6.0)):
        d.at(10.0 * i).arrive(elastic(f"e{i}", 1, 1.5, p=0.9, hints=WorkHints(expected_s=2.0)))
        d.at(10.0 * i + run_s).finish(f"e{i}", run_s=run_s)
    d.at(40.0).arrive(elastic("x", 1, 1.5, p=0.9, hints=WorkHints(expected_s=2.0)))
    d.at(41.0).tick()
    s = 1.0 / (0.1 + 0.9 / 1.5)
    x = d.core.actions["x"]
    assert x.width == 1.5 and x.est == pytest.approx(2.0 * s, rel=1e-12)
    assert d.core.elastic.remaining(x) == pytest.approx(3.0 * s, rel=1e-12)
