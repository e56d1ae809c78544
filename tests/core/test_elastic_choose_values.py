"""Exact values of `core.elastic`'s placement side (issue 43, mutation testing): the reserve
expansion leaves (`reserve_of`, `room_elsewhere`), the lender of a rigid head (`lender`), the work
left of a running action (`remaining`), the node-wide gain on a measured node (`node_gain`) and
where an elastic head starts (`choose`, `_candidates`, `_warm_sooner`), hand-computed."""

from __future__ import annotations

import math

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic

from arl_tangram.core import events as ev
from arl_tangram.core.actions import WorkHints
from arl_tangram.core.resources import Resources

# ---- reserve_of, room_elsewhere -------------------------------------------------------------


def test_the_reserve_is_a_fraction_of_the_node_and_at_least_the_largest_minimum() -> None:
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram", reserve_fraction=0.25)
    el, n0 = d.core.elastic, d.core.nodes["n0"]
    assert el.reserve_of(n0, "cpu") == 2.0
    assert el.reserve_of(n0, "memory_mb") == 2048.0
    d.arrive(act("a", cpu=3))
    assert el.largest_min_cpu == 3.0
    assert el.reserve_of(n0, "cpu") == 3.0
    assert el.reserve_of(n0, "memory_mb") == 2048.0  # (only CPU follows the arrivals)
    d.arrive(act("b", cpu=2))
    assert el.largest_min_cpu == 3.0
    el.largest_min_cpu = 2.0  # equal to the fraction's: 2
    assert el.reserve_of(n0, "cpu") == 2.0
    el.largest_min_cpu = 8.0  # the whole node
    assert el.reserve_of(n0, "cpu") == 8.0
    el.largest_min_cpu = 12.0  # never more than the node
    assert el.reserve_of(n0, "cpu") == 8.0
    none = Driver([cpu_node("n0", cpu=8)], policy="tangram", reserve_fraction=0.0)
    none.arrive(act("a", cpu=3))
    assert none.core.elastic.reserve_of(none.core.nodes["n0"], "cpu") == 0.0


def test_a_node_without_sessions_keeps_no_reserve_while_another_has_it_free() -> None:
    d = Driver(
        [cpu_node("n0", cpu=8), cpu_node("n1", cpu=8)], policy="tangram", reserve_fraction=0.25
    )
    el, n0, n1 = d.core.elastic, d.core.nodes["n0"], d.core.nodes["n1"]
    assert el.reserve_of(n0, "cpu") == 0.0 and el.reserve_of(n1, "cpu") == 0.0
    d.arrive(act("r", cpu=6))  # on n0: 2 free there
    assert d.core.actions["r"].node == "n0"
    assert el.reserve_of(n1, "cpu") == 6.0  # n0 has 2 free, not 6
    assert el.reserve_of(n0, "cpu") == 0.0  # n1 has 8
    assert el.room_elsewhere("n1", 2.0) is True
    assert el.room_elsewhere("n1", 2.5) is False
    assert el.room_elsewhere("n0", 8.0) is True
    d.core.st.reserved["n1"] = "x"  # a node held for an aged action is no room
    assert el.room_elsewhere("n0", 1.0) is False
    assert el.reserve_of(n0, "cpu") == 6.0
    del d.core.st.reserved["n1"]
    # a node with a session keeps its own reserve
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256), node="n0"))
    assert d.core.st.sessions["s"].node == "n0"
    assert el.reserve_of(n0, "cpu") == 6.0


# ---- lender ---------------------------------------------------------------------------------


def _two(bmax: float, names: tuple[str, str] = ("n0", "n1"), caps: tuple[float, float] = (4, 4)):
    d = Driver([cpu_node(names[0], cpu=caps[0]), cpu_node(names[1], cpu=caps[1])], policy="tangram")
    out = d.arrive(elastic("a", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    out += d.arrive(elastic("b", 1, bmax, p=0.9, hints=WorkHints(expected_s=10.0)))
    return d, cpu_commands(out)


def test_the_node_that_lent_the_most_lends_to_a_rigid_head() -> None:
    d, got = _two(3)
    assert got == [("start", "a", 4.0), ("start", "b", 3.0)]
    assert (d.core.actions["a"].node, d.core.actions["b"].node) == ("n0", "n1")
    # n0 lent 3 (a above its minimum), n1 2 and has 1 free: n0 lends
    out = d.at(0.5).arrive(act("r", cpu=3, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "a", 1.0), ("start", "r", 3.0)]
    assert d.core.actions["r"].node == "n0"


@pytest.mark.parametrize("names", [("n0", "n1"), ("n1", "n0")])
def test_a_tie_between_lenders_goes_to_the_first_name(names) -> None:
    d, got = _two(4, names)
    assert got == [("start", "a", 4.0), ("start", "b", 4.0)]
    on_n0 = "a" if d.core.actions["a"].node == "n0" else "b"
    out = d.at(0.5).arrive(act("r", cpu=3, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", on_n0, 1.0), ("start", "r", 3.0)]
    assert d.core.actions["r"].node == "n0"


def test_a_lender_needs_what_it_lends_and_its_free_cpu_to_cover_the_head() -> None:
    # n0 holds a rigid f (3 of 4), n1 b at 3 and a at 4 (7 of 8): n1 lends 2 + 3
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=8)], policy="tangram")
    out = d.arrive(act("f", cpu=3, hints=WorkHints(expected_s=100.0)))
    out += d.arrive(elastic("b", 1, 3, p=0.9, hints=WorkHints(expected_s=10.0)))
    out += d.arrive(elastic("a", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    assert cpu_commands(out) == [("start", "f", 3.0), ("start", "b", 3.0), ("start", "a", 4.0)]
    assert {k: r.node for k, r in d.core.actions.items()} == {"f": "n0", "b": "n1", "a": "n1"}
    out = d.at(0.5).arrive(act("r", cpu=6, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("resize", "b", 1.0), ("resize", "a", 1.0), ("start", "r", 6.0)]
    assert d.core.actions["r"].node == "n1"
    # more than any node can give: nothing shrinks, the head waits
    f, _ = _two(3)
    out = f.at(0.5).arrive(act("r", cpu=4, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == []
    assert f.core.actions["r"].node is None
    assert (f.core.actions["a"].width, f.core.actions["b"].width) == (4.0, 3.0)


# ---- remaining, node_gain -------------------------------------------------------------------


def test_the_work_left_of_a_running_action() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    out = d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    assert cpu_commands(out) == [("start", "e", 4.0)]
    el, rec = d.core.elastic, d.core.actions["e"]
    assert el.remaining(rec) == 10.0
    s4 = 1.0 / (0.1 + 0.9 / 4)
    d.at(1.0).tick()
    assert el.remaining(rec) == pytest.approx(10.0 - s4, rel=1e-12)
    assert el.remaining(rec) == pytest.approx(10.0 - s4, rel=1e-12)  # (memo: the same)
    est = d.core.st.estimator
    assert (rec.left_done, rec.left, rec.left_version) == (pytest.approx(s4),
                                                           pytest.approx(10.0 - s4), est.version)
    d.at(4.0).tick()  # the same state of the estimator, more work done (4 x s4 > 10): read
    assert el.remaining(rec) == 1e-9  # anew, and never below 1e-9
    # the estimator learns the key at this same instant, with the same work done: read anew
    for run_s in (2.0, 3.0, 7.0):
        est.observe_work(rec.ekey, rec.units, run_s, 1.0)
    done = rec.left_done
    learned = est.remaining_work(rec.ekey, rec.units, done)
    assert learned is not None and learned > 1e-3
    assert el.remaining(rec) == learned
    assert (rec.left_done, rec.left, rec.left_version) == (done, learned, est.version)
    d.at(4.0).finish("e", run_s=4.0)


def test_the_gain_over_a_node_with_a_measured_speedup() -> None:
    """8 cores that give 1 + 3.5 (k - 1) / 7 effective ones; 7 allotted (b 1, a 4, c 2) and z
    (no CPU): a's 0.5 more makes each core deliver 4.25 / 7.5 instead of 4 / 7."""
    from arl_tangram.core.cluster import NodeSpec

    spec = NodeSpec(
        "n0", Resources(cpu=8, memory_mb=8192), pool="cpu", parallel_speedup=((8.0, 4.5),)
    )
    d = Driver([spec], policy="tangram")
    out = d.arrive(act("b", cpu=1, hints=WorkHints(expected_s=4.0)))
    out += d.arrive(act("z", cpu=0, hints=WorkHints(expected_s=4.0)))
    out += d.arrive(elastic("a", 1, 4, p=1.0, weight=3.0, hints=WorkHints(expected_s=10.0)))
    out += d.arrive(elastic("c", 1, 2, p=1.0, weight=2.0, hints=WorkHints(expected_s=3.0)))
    assert cpu_commands(out) == [
        ("start", "b", 1.0),
        ("start", "z", 0.0),
        ("start", "a", 4.0),
        ("start", "c", 2.0),
    ]
    node, el, a = d.core.nodes["n0"], d.core.elastic, d.core.actions["a"]
    e0, e1 = 4.0 / 7.0, 4.25 / 7.5
    own = 10.0 * (1.0 / (4.0 * e0) - 1.0 / (4.5 * e1)) * 3.0
    others = 4.0 / e0 * (e0 / e1 - 1.0) + 3.0 / (2.0 * e0) * (e0 / e1 - 1.0) * 2.0
    assert el.node_gain(node, a, 0.5) == pytest.approx(own - others, rel=1e-12)
    # at a full node the efficiency no longer falls (past the last point): a's own gain only
    e8 = 4.5 / 8.0
    assert el.node_gain(node, a, 1.0) == pytest.approx(
        10.0 * (1.0 / (4.0 * e0) - 1.0 / (5.0 * e8)) * 3.0
        - 4.0 / e0 * (e0 / e8 - 1.0)
        - 3.0 / (2.0 * e0) * (e0 / e8 - 1.0) * 2.0,
        rel=1e-12,
    )


# ---- choose: a cold start now, or a wait for a warm node (`_warm_sooner`) -------------------


def _warm_case(
    hold_s: float,
    x: float = 1.0,
    cold: float = 0.5,
    cap0: float = 4,
    hcpu: float = 4,
    hmem: float = 256,
    reserve: bool = False,
):
    """n0 (warm for tests) held by h for ``hold_s``; n1 (4 cores, cold) empty; then a test
    e (1..4, p = 0.9, ``x`` s of work) arrives: its starts as (id, node, cpu, warm)."""
    from arl_tangram.core import commands as cmd

    d = Driver(
        [cpu_node("n0", cpu=cap0), cpu_node("n1", cpu=4)], policy="tangram", sandbox_cold_s=cold
    )
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d.arrive(act("h", cpu=hcpu, mem=hmem, hints=WorkHints(expected_s=hold_s)))
    assert d.core.actions["h"].node == "n0"
    if reserve:
        d.core.st.reserved["n0"] = "someone"
    out = d.at(0.0).arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=x)))
    got = [
        (c.action.id, c.node, c.allotment["cpu"], c.warm)
        for c in out
        if isinstance(c, cmd.StartAction)
    ]
    return d, got


def test_a_test_waits_for_a_warm_node_that_finishes_it_before_a_cold_start() -> None:
    # cold on n1: 0.5 + 1 / s(4); warm on n0: h's 0.45 left, then 1 / s(4)
    d, got = _warm_case(0.45)
    assert got == []
    assert d.core.actions["e"].status.name == "QUEUED"
    from arl_tangram.core import commands as cmd

    out = d.at(0.45).finish("h", run_s=0.45)
    assert [
        (c.action.id, c.node, c.allotment["cpu"], c.warm)
        for c in out
        if isinstance(c, cmd.StartAction)
    ] == [("e", "n0", 4.0, True)]


@pytest.mark.parametrize(
    "case",
    [
        {"hold_s": 0.5},  # the same finish: no wait
        {"hold_s": 0.45, "cold": 0.0},  # no cold start to avoid
        {"hold_s": 0.45, "cap0": 2, "hcpu": 2},  # 2 cores there: 0.45 + 0.55 > 0.5 + 0.325
        {"hold_s": 0.45, "hmem": 8000},  # its memory does not fit there
        {"hold_s": 0.45, "hcpu": 3},  # it could start there now (narrow): not waited for
        {"hold_s": 0.45, "reserve": True},  # held for an aged action
    ],
)
def test_a_cold_start_now_where_waiting_does_not_pay(case) -> None:
    _, got = _warm_case(**case)
    assert got == [("e", "n1", 4.0, False)]


def test_the_warm_nodes_width_is_at_most_its_capacity() -> None:
    # 0.1 s of work: cold 0.5 + 0.1 / s(4) = 0.5325; n0's 2 cores: 0.45 + 0.1 / s(2) = 0.505
    _, got = _warm_case(0.45, x=0.1, cap0=2, hcpu=2)
    assert got == []


def test_the_gain_of_one_core_on_a_full_measured_node() -> None:
    """b holds 7 of 8 cores; a starts at 1: each core delivers 4.5 / 8 there (and past it)."""
    from arl_tangram.core.cluster import NodeSpec

    spec = NodeSpec(
        "n0", Resources(cpu=8, memory_mb=8192), pool="cpu", parallel_speedup=((8.0, 4.5),)
    )
    d = Driver([spec], policy="tangram")
    out = d.arrive(act("b", cpu=7, hints=WorkHints(expected_s=40.0)))
    out += d.arrive(elastic("a", 1, 4, p=1.0, hints=WorkHints(expected_s=10.0)))
    assert cpu_commands(out) == [("start", "b", 7.0), ("start", "a", 1.0)]
    e8 = 4.5 / 8.0
    got = d.core.elastic.node_gain(d.core.nodes["n0"], d.core.actions["a"], 0.5)
    assert got == pytest.approx(10.0 * (1.0 / e8 - 1.0 / (1.5 * e8)), rel=1e-12)


def test_a_warm_node_of_more_cores_than_the_maximum_is_priced_at_the_maximum() -> None:
    # n0 (8 cores, warm) held 0.5 s: 0.5 + 1 / s(4) is no sooner than n1's cold 0.5 + 1 / s(4)
    d = Driver([cpu_node("n0", cpu=8), cpu_node("n1", cpu=4)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d.arrive(act("h", cpu=8, hints=WorkHints(expected_s=0.5)))
    out = d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(out) == [("start", "e", 4.0)]
    assert d.core.actions["e"].node == "n1"


def test_the_scan_of_warm_nodes_goes_past_one_that_cannot_take_it() -> None:
    # n0 warm but its memory full, n1 warm and held 0.45 s, n2 cold: e waits for n1
    d = Driver(
        [cpu_node("n0", cpu=4), cpu_node("n1", cpu=4), cpu_node("n2", cpu=4)], policy="tangram"
    )
    d(ev.WarmPoolReport(0.0, "n0", "test", 2))
    d(ev.WarmPoolReport(0.0, "n1", "test", 2))
    d.arrive(act("m", cpu=4, mem=8000, hints=WorkHints(expected_s=0.45)))
    d.arrive(act("h", cpu=4, hints=WorkHints(expected_s=0.45)))
    assert (d.core.actions["m"].node, d.core.actions["h"].node) == ("n0", "n1")
    assert cpu_commands(d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))) == []


def test_a_small_node_reserves_its_fraction_before_any_arrival() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram", reserve_fraction=0.25)
    assert d.core.elastic.largest_min_cpu == 0.0
    assert d.core.elastic.reserve_of(d.core.nodes["n0"], "cpu") == 0.5


def test_the_candidates_are_the_few_with_the_most_free_cpu() -> None:
    d = Driver([cpu_node(f"n{i}", cpu=4 + i) for i in range(6)], policy="tangram")
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=9)))  # (n5: 9 cores, all held)
    d.arrive(elastic("q", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert d.core.actions["q"].node == "n4"  # the most free
    cands, ws = d.core.elastic._candidates(d.core.actions["q"])
    assert [n.name for n in cands] == ["n3", "n2", "n1", "n0"]  # fit_candidates = 4
    assert ws is None


def test_the_first_two_nodes_to_free_a_full_width() -> None:
    """n0 (4) held 2 s; n1 (8) half for 1 s, half for 5 s; n2 (2) held 1.5 s; n3 (4) held 1 s:
    4 cores free at 2, 1, (2 at) 1.5 and 1."""
    d = Driver(
        [
            cpu_node("n0", cpu=4),
            cpu_node("n1", cpu=8),
            cpu_node("n2", cpu=2),
            cpu_node("n3", cpu=4),
        ],
        policy="tangram",
    )
    for aid, cpu, s in (("k", 2, 1.5), ("h", 4, 2.0), ("m", 4, 1.0), ("g", 4, 1.0), ("g2", 4, 5.0)):
        d.arrive(act(aid, cpu=cpu, hints=WorkHints(expected_s=s)))
    assert {k: r.node for k, r in d.core.actions.items()} == {
        "k": "n2",
        "h": "n0",
        "m": "n3",
        "g": "n1",
        "g2": "n1",
    }
    el, nodes = d.core.elastic, d.core.nodes
    n = [nodes[f"n{i}"] for i in range(4)]
    assert el._first_two_full(n, 4.0) == (1.0, 1.0, "n1")  # (a tie: the first)
    assert el._first_two_full(n[:3], 4.0) == (1.0, 1.5, "n1")
    assert el._first_two_full(n[:2], 4.0) == (1.0, 2.0, "n1")
    assert el._first_two_full([n[0], n[2]], 8.0) == (1.5, 2.0, "n2")
    assert el._first_two_full(n[:1], 4.0) == (math.inf, math.inf, "")
    assert el._first_two_full([], 4.0) == (math.inf, math.inf, "")


def test_a_head_that_would_start_narrow_waits_for_a_full_width_off_the_candidates() -> None:
    """Six full 4-core nodes: five run 40 s of work, n5 one 1 s (at 4 cores, speed 1 / (0.1 +
    0.9 / 4): 0.325 s). The candidates are four full nodes (n0-n3), each expected to free its
    four cores in ~13 s; sharing n0 (q at 2, a0 shrunk to 2) beats waiting that long, but n5,
    not a candidate, frees them in 0.225 s from q's arrival: q waits for it (issue 39:
    grpo-siblings' long tests shared a node while a short one's node was about to free)."""
    d = Driver([cpu_node(f"n{i}", cpu=4) for i in range(6)], policy="tangram")
    for i in range(6):
        d.arrive(elastic(f"a{i}", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0 if i == 5 else 40.0)))
    assert {k: (r.node, r.width) for k, r in d.core.actions.items()} == {
        f"a{i}": (f"n{i}", 4.0) for i in range(6)
    }
    assert cpu_commands(d.at(0.1).arrive(elastic("q", 1, 4, p=0.9, hints=WorkHints(expected_s=8.0)))) == []
    el, q = d.core.elastic, d.core.actions["q"]
    cands = el._candidates(q)[0]
    assert [n.name for n in cands] == ["n0", "n1", "n2", "n3"]
    assert el._first_two_full(cands, 4.0)[2] == "n0"  # (all four alike: the first)
    first, second, node = el._first_two_full(el._all_fitting(q), 4.0)
    assert node == "n5" and first == pytest.approx(0.225)
    assert second == pytest.approx(40.0 * 0.325 - 0.1)
    # only the candidates' own first full width in view: q starts at 2 on n0
    assert el._fastest(q, cands, 0, 8.0, *el._first_two_full(cands, 4.0))[0:3:2] == (
        d.core.nodes["n0"],
        2.0,
    )
    out = d.at(0.325).finish("a5")
    assert cpu_commands(out) == [("start", "q", 4.0)]
    assert (q.node, q.width) == ("n5", 4.0)


def test_an_elastic_head_goes_to_the_node_warm_for_its_own_kind() -> None:
    # n0 warm for python only, n1 with one executor warm for tests: n1 saves the cold start
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=4)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "python", 2))
    d(ev.WarmPoolReport(0.0, "n1", "test", 1))
    d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert d.core.actions["e"].node == "n1"
    d.arrive(elastic("f", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert d.core.actions["f"].node == "n0"  # (the other: n1 has no core free)


def test_resizes_of_an_action_not_yet_started_rewrite_its_start() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n", cpu=10)], policy="tangram")
    d.arrive(
        elastic("a", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)),
        elastic("b", 1, 4, p=0.9, hints=WorkHints(expected_s=2.0)),
    )
    st, node = d.core.st, d.core.nodes["n"]
    a, b = d.core.actions["a"], d.core.actions["b"]
    st.out.clear()
    st.start_index.clear()
    old = cmd.StartAction(a.spec, "n", Resources(cpu=1, memory_mb=256), True, "c0")
    st.out.append(old)
    st.start_index["a"] = 0
    st.now, st.cause = 7.0, "c1"
    d.core.elastic.emit_resizes(node, [a, b])
    assert st.out == [
        cmd.StartAction(a.spec, "n", a.allotment, True, "c0"),
        cmd.ResizeAction("b", "n", b.allotment, cause="c1"),
    ]
    assert a.story[-4:] == (7.0, "cpu", a.width, "c1")
    assert b.story[-4:] == (7.0, "cpu", b.width, "c1")


def test_a_waiting_head_marks_the_candidates_with_free_cpu_for_expansion() -> None:
    from arl_tangram.core.cluster import NodeSpec

    # "m" offers no CPU at all (its free has no CPU entry) but is a candidate: only n0 has
    # free CPU (half a core), too little for q's minimum of 4, so q waits (width 0.0, not for
    # a warm node) and n0 is where to expand
    nodes = [cpu_node("n0", cpu=8), NodeSpec("m", Resources(memory_mb=8192), pool="cpu")]
    d = Driver(nodes, policy="tangram")
    d.core.handle(ev.ActionArrived(0.0, act("b0", cpu=7.5)))
    d.arrive(elastic("q", 4, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    rec = d.core.actions["q"]
    assert rec.node is None
    assert [n.name for n in d.core.elastic.choose(rec)[3]] == ["n0", "m"]
    d.core.st.expand_at.clear()
    assert rec.queue_key is not None
    assert d.core.elastic.place(rec) is False
    assert d.core.st.expand_at == {"n0"}
    assert d.core.placer.warm_waiters == {}


def test_a_queued_elastic_action_is_overdue_from_the_instant_its_run_at_max_is_waited() -> None:
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram")
    d.core.handle(ev.ActionArrived(0.0, act("b0", cpu=6)))
    d.arrive(elastic("q", 4, 4, p=1.0, hints=WorkHints(expected_s=4.0)))
    rec = d.core.actions["q"]
    due = d.core.queues.overdue_from(rec)
    assert due > 0.0
    d.at(due).arrive(act("x", cpu=1))
    assert rec.node is None and d.core.st.now == due
    assert d.core.elastic.overdue(rec) is True


def test_a_head_waiting_for_a_warm_node_is_noted_by_its_queue() -> None:
    d, got = _warm_case(0.45)
    assert got == []
    key = d.core.actions["e"].queue_key
    assert key is not None
    assert d.core.placer.warm_waiters == {key: None}


def test_the_work_left_adds_the_run_since_the_last_retime_to_the_work_done_before() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    el, rec = d.core.elastic, d.core.actions["e"]
    s4 = 1.0 / (0.1 + 0.9 / 4)
    d.at(1.0).tick()
    el.retime(rec)  # (as before a resize: 1 s at s4 done, counted from t = 1)
    assert (rec.done, rec.since) == (pytest.approx(s4, rel=1e-12), 1.0)
    d.at(2.0).tick()
    assert el.remaining(rec) == pytest.approx(10.0 - 2 * s4, rel=1e-12)
    el.retime(rec)  # (the work done before is kept, the last second added)
    assert (rec.done, rec.since) == (pytest.approx(2 * s4, rel=1e-12), 2.0)


def test_a_reserve_under_one_core_is_raised_to_the_largest_minimum() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", reserve_fraction=0.2)
    node = d.core.st.nodes["n0"]
    assert d.core.elastic.reserve_of(node, "cpu") == pytest.approx(0.8)
    d.arrive(elastic("e", 2, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    assert d.core.elastic.largest_min_cpu == 2.0
    assert d.core.elastic.reserve_of(node, "cpu") == 2.0


def test_an_elastic_action_of_a_session_starts_warm_in_its_sandbox() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n0", cpu=8)], policy="tangram")
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=256)))
    out = d.at(0.1).arrive(elastic("e", 1, 4, p=0.9, session="s", hints=WorkHints(expected_s=1.0)))
    starts = [(c.action.id, c.node, c.warm) for c in out if isinstance(c, cmd.StartAction)]
    assert starts == [("e", "n0", True)]


def test_a_node_without_a_dimension_reserves_none_of_it() -> None:
    from arl_tangram.core.cluster import NodeSpec

    nodes = [cpu_node("n0", cpu=4), NodeSpec("m", Resources(memory_mb=8192), pool="cpu")]
    d = Driver(nodes, policy="tangram", reserve_fraction=0.25)
    el, st = d.core.elastic, d.core.st
    assert el.reserve_of(st.nodes["m"], "cpu") == 0.0
    assert el.reserve_of(st.nodes["n0"], "gpu") == 0.0
    assert el.reserve_of(st.nodes["n0"], "memory_mb") == 2048.0
