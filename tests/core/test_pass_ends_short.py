"""A pass ends once every head left would fail (`scheduling._ShortNodes`, issue 40).

A crowded node's pass tried each of its thousands of waiting sessions to start one or none
(201 tries an event for 0.32 starts at 1,600 sessions on one node). `_ShortNodes` keeps, per
node, the session heads left in the pass's heap and the least CPU one needs, and ends the pass
when a non-aged head is popped, no other entry is left, and no node with heads left has that
much CPU free or lendable. These tests pin when it answers yes and no, and that a pass it ends
starts what the full pass starts (the golden streams and `bench_scale`'s crowded streams hash
the same with it: docs/core.md, "One node, many sessions").
"""

from __future__ import annotations

import random

import pytest
from core_helpers import Driver, act, cpu_node, elastic, starts
from fair_sim import simulate

from arl_tangram.core import events as ev
from arl_tangram.core.actions import WorkHints
from arl_tangram.core.queues import AGED
from arl_tangram.core.resources import Resources
from arl_tangram.core.scheduling import _NO_GROUP, SchedulingPass, _ShortNodes

LONG = WorkHints(expected_s=100)


def _crowded(cpu: float = 2) -> Driver:
    """One node of ``cpu`` cores, four sessions; a0 (2 cores, s0) runs, a1 (1 core, s1) and a2
    (2 cores, s2) wait."""
    d = Driver([cpu_node("n0", cpu=cpu, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i in range(4):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=256)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=cpu, session="s0", hints=LONG)))
    assert starts(d.at(0.2).arrive(act("a1", cpu=1, session="s1", hints=LONG),
                                   act("a2", cpu=2, session="s2", hints=LONG))) == {}
    return d


def _tries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the heads `SchedulingPass.try_place` is asked to place from here, in order."""
    tried: list[str] = []
    real = SchedulingPass.try_place

    def counting(self, rec, key):
        tried.append(rec.spec.id)
        return real(self, rec, key)

    monkeypatch.setattr(SchedulingPass, "try_place", counting)
    return tried


def _short(d: Driver, *aids: str, aged: bool = False) -> _ShortNodes:
    short = _ShortNodes(d.core.scheduling)
    recs = d.core.st.actions
    for aid in aids:
        short.add(recs[aid].queue_key, recs[aid], _NO_GROUP, aged)
    return short


def test_heads_are_counted_per_node_with_their_least_need() -> None:
    d = _crowded()
    short = _short(d, "a1", "a2", aged=True)
    assert (short.others, short.left, short.elastic_left, short.aged_left, short.need) == (
        0, {"n0": 2}, {}, {"n0": 2}, {"n0": 1.0})
    assert short.all_short(False)  # n0 full (0 free, nothing lendable): 1 core is more than it has
    assert not short.moved and (short.short, short.reserved) == (True, False)
    assert not short.all_short(True)  # an aged head's failure would reserve n0: tried
    d.core.st.reserved["n0"] = "a1"
    assert not short.all_short(True)  # (nothing moved: the answer kept, the node not weighed again)
    short.moved = True
    assert short.all_short(True)  # reserved: its failure would change nothing
    recs = d.core.st.actions
    short.remove(recs["a1"].queue_key, recs["a1"], _NO_GROUP, True)
    assert short.left == {"n0": 1} and short.need == {"n0": 1.0}  # (a lower bound: kept)
    assert short.aged_left == {"n0": 1} and not short.moved
    short.remove(recs["a2"].queue_key, recs["a2"], _NO_GROUP, True)
    assert short.left == {"n0": 0} and short.aged_left == {"n0": 0} and short.moved  # (a node fewer to weigh)


def test_the_last_aged_head_of_a_node_popped_lets_an_aged_pop_end_the_pass() -> None:
    """n0 not reserved: while a1 (aged) is left, an aged pop goes on; once a1 is popped and
    only a2 (not aged) is left there, n0 need not be reserved (a2's failure marks nothing)."""
    d = _crowded()
    recs = d.core.st.actions
    short = _short(d, "a1", aged=True)
    short.add(recs["a2"].queue_key, recs["a2"], _NO_GROUP, False)
    assert (short.left, short.aged_left) == ({"n0": 2}, {"n0": 1})
    assert not short.all_short(True)
    short.remove(recs["a1"].queue_key, recs["a1"], _NO_GROUP, True)
    assert (short.left, short.aged_left, short.moved) == ({"n0": 1}, {"n0": 0}, True)
    assert short.all_short(True)


def test_free_cpu_that_one_head_needs_keeps_the_pass_going() -> None:
    d = _crowded(cpu=3)  # a0 takes 3 of 3
    node = d.core.st.nodes["n0"]
    short = _short(d, "a1", "a2")
    node.free["cpu"] = 1.0 - 1e-6  # (behind the core's back)
    assert not short.all_short(False)  # at the margin: 1 - 1e-6 + 1e-6 >= 1
    short.moved = True
    node.free["cpu"] = 1.0 - 2e-6
    assert short.all_short(False)


def test_another_entry_left_keeps_the_pass_going() -> None:
    d = _crowded()
    short = _short(d, "a1")
    d.at(0.3).arrive(act("p0", cpu=1, hints=LONG))  # a shared-pool head: it waits too
    rec = d.core.st.actions["p0"]
    short.add(rec.queue_key, rec, _NO_GROUP, False)
    assert short.others == 1 and short.left == {"n0": 1}
    assert not short.all_short(False)
    short.remove(rec.queue_key, rec, _NO_GROUP, False)
    assert short.others == 0 and short.moved
    assert short.all_short(False)
    a1 = d.core.st.actions["a1"]
    short.add(a1.queue_key, a1, 0, False)  # a parked group's entry counts as another
    assert short.others == 1 and short.left == {"n0": 1}


def test_a_waiting_elastic_head_with_cpu_free_keeps_the_pass_going() -> None:
    """Its try would mark the node for expansion (`SchedulingPass.try_place`)."""
    d = Driver([cpu_node("n0", cpu=3, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i in range(2):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=256)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=2.5, session="s0", hints=LONG)))
    d.at(0.2).arrive(elastic("e1", 1, 4, 0.9, session="s1", hints=LONG))
    rec = d.core.st.actions["e1"]
    node = d.core.st.nodes["n0"]
    if rec.allotment is None:  # (waiting: the case this test is for)
        short = _short(d, "e1")
        assert (short.elastic_left, short.need) == ({"n0": 1}, {"n0": 1.0})
        assert node.free.get("cpu", 0.0) == 0.5
        assert "n0" in d.core.st.expand_at  # (e1's failed try marked its node)
        assert short.all_short(False)  # so another failed try changes nothing
        d.core.st.expand_at.clear()
        short.moved = True
        assert not short.all_short(False)  # unmarked: a try would mark it
        node.free["cpu"] = 0.0
        short.moved = True
        assert short.all_short(False)
    else:  # the lane rule started it at 0.5 core short of its minimum: cannot be
        raise AssertionError(f"e1 started at {rec.allotment}")


def test_an_aged_head_is_still_tried_and_reserves_its_node() -> None:
    """Aged heads come first and are tried before the pass can end: a crowded node's first
    blocked aged head still holds the node for itself."""
    d = _crowded()
    d.at(1e4).tick()  # (past their `aging_after`)
    q = d.core.queues
    for aid in ("a1", "a2"):
        rec = d.core.st.actions[aid]
        assert q.head(rec.queue_key)[1][0] == AGED
    d.at(1e4 + 1).arrive(act("x", cpu=1, hints=LONG))  # another pass: n0 still full
    assert d.core.st.reserved == {"n0": "a1"}


def test_a_pass_it_ends_starts_what_the_full_pass_starts() -> None:
    """a0 (2 cores) ends: a1 (1 core, first) starts; a2 (2 cores) and a3 (1 core) cannot, and
    the pass ends before trying them; a3 starts when a1 ends."""
    d = _crowded()
    assert starts(d.at(0.3).arrive(act("a3", cpu=1, session="s3", hints=LONG))) == {}
    assert set(starts(d.at(0.4).finish("a0"))) == {"a1", "a3"}
    assert set(starts(d.at(0.5).finish("a1"))) == set()  # a2 needs 2: a3 holds 1 of 2
    assert set(starts(d.at(0.6).finish("a3"))) == {"a2"}


def test_what_the_node_s_elastic_actions_lend_counts_as_free() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i in range(2):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=256)))
    d.at(0.1).arrive(elastic("e0", 0.5, 4, 1.0, session="s0", hints=LONG))
    assert d.core.st.actions["e0"].width == 4.0  # alone: its maximum
    assert starts(d.at(0.2).arrive(act("r1", cpu=4, session="s1", hints=LONG))) == {}  # e0 lends 3.5
    short = _short(d, "r1")
    node = d.core.st.nodes["n0"]
    assert (node.free["cpu"], d.core.elastic.lendable(node, 0.0), short.need) == (0.0, 3.5, {"n0": 4.0})
    assert short.all_short(False)
    short.need["n0"] = 3.5  # a head that 3.5 lent cores would fit (lent down to its minimum, 0.5)
    short.moved = True
    assert not short.all_short(False)
    short.need["n0"] = 4.0
    short.moved = True
    node.alive = False  # (behind the core's back: a node lost is weighed by the full pass)
    assert not short.all_short(False)


def test_needs_of_heads_without_cpu_and_of_another_dimension_are_zero() -> None:
    """A rigid head with no CPU demand, and an elastic one that stretches in memory, need no
    CPU: their node never ends a pass early."""
    from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity
    d = _crowded()
    free_mb = d.core.st.nodes["n0"].free["memory_mb"]
    d.at(0.3).arrive(ActionSpec("m0", demand=Resources(memory_mb=free_mb + 1), session="s3", hints=LONG))
    assert d.core.st.actions["m0"].allotment is None  # (its memory is not free)
    short = _short(d, "m0")
    assert short.need == {"n0": 0.0}
    spec = ActionSpec("x0", kind=ActionKind.TEST, demand=Resources(cpu=2, memory_mb=256),
                      elasticity=Elasticity(256, 1024, dim="memory_mb"), session="s1", hints=LONG)
    d.at(0.4).arrive(spec)
    x0 = d.core.st.actions["x0"]
    assert x0.elastic and not x0.el_cpu
    short = _short(d, "x0")
    assert (short.need, short.elastic_left) == ({"n0": 0.0}, {"n0": 1})
    assert not short.all_short(False)
    short.remove(x0.queue_key, x0, _NO_GROUP, False)
    assert short.elastic_left == {"n0": 0} and short.left == {"n0": 0}


def test_a_node_with_no_heads_left_is_not_weighed() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=4096), cpu_node("n1", cpu=8, mem=8192)],
               policy="tangram", session_ttl_s=1e6)
    for i in range(4):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=2048)))
    assert {name: sorted(n.sessions) for name, n in d.core.st.nodes.items()} == {
        "n0": ["s3"], "n1": ["s0", "s1", "s2"]}
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=8, session="s0", hints=LONG)))
    assert starts(d.at(0.2).arrive(act("a1", cpu=1, session="s1", hints=LONG))) == {}  # n1 full
    assert "b0" in starts(d.at(0.3).arrive(act("b0", cpu=1, session="s3", hints=LONG)))
    assert starts(d.at(0.4).arrive(act("b1", cpu=2, session="s3", hints=LONG))) == {}  # 1 free
    recs = d.core.st.actions
    short = _short(d, "a1", "b1", aged=True)
    short.need["n0"] = 1.0  # (as if a 1-core head had been counted there and taken: a lower bound)
    assert not short.all_short(False)  # n0: 1 free, 1 needed
    short.remove(recs["b1"].queue_key, recs["b1"], _NO_GROUP, True)
    assert short.left == {"n1": 1, "n0": 0} and short.moved
    assert short.all_short(False)  # only n1 is weighed: full
    assert not short.all_short(True)  # (n1 not reserved: an aged head's try would reserve it)
    d.core.st.reserved["n1"] = "a1"
    short.moved = True
    assert short.all_short(True)  # only n1 must be reserved: n0 has no heads left


def test_a_session_s_next_head_joins_the_count_after_a_start() -> None:
    """a0 ends: a1 starts and its session's next head, a1b, goes on the pass's heap (counted);
    a1b then starts on the core a1 left."""
    d = _crowded()
    assert starts(d.at(0.3).arrive(act("a1b", cpu=1, session="s1", hints=LONG))) == {}
    assert set(starts(d.at(0.4).finish("a0"))) == {"a1", "a1b"}


@pytest.mark.pure_core
def test_only_the_first_aged_head_of_a_full_node_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six sessions' heads aged on a full node; b (1 core) ends: a1 starts on its core, a2 is
    tried and reserves the node; the four behind it would fail and change nothing (the node
    reserved, no CPU): not tried."""
    d = Driver([cpu_node("n0", cpu=3, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i in range(7):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=256)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=2, session="s0", hints=LONG)))
    assert "b" in starts(d.at(0.1).arrive(act("b", cpu=1, session="s0", hints=LONG)))
    d.at(0.2).arrive(*(act(f"a{i}", cpu=1, session=f"s{i}", hints=LONG) for i in range(1, 7)))
    d.at(1e4).tick()  # (past their `aging_after`: each session's head aged)
    tried = _tries(monkeypatch)
    assert set(starts(d.at(1e4 + 1).finish("b"))) == {"a1"}
    assert tried == ["a1", "a2"]
    assert d.core.st.reserved == {"n0": "a2"}
    tried.clear()
    _full_passes(monkeypatch)
    assert starts(d.at(1e4 + 2).finish("a0")).keys() == {"a2", "a3"}
    assert tried == ["a2", "a3", "a4", "a5", "a6"]  # (each tried: a4-a6 fail on the full node)


def _two_full_nodes() -> Driver:
    """n0 and n1, 3 cores each, full (a0 + b on n0, c0 on n1); five 1-core heads waiting on
    each, n0's (a2, a4, ..., a10) older than n1's (a3, a5, ..., a11), all aged by a tick."""
    d = Driver([cpu_node("n0", cpu=3, mem=4096), cpu_node("n1", cpu=3, mem=4096)],
               policy="tangram", session_ttl_s=1e6)
    for i in range(12):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=512)))
    assert {name: sorted(n.sessions, key=lambda s: int(s[1:])) for name, n in d.core.st.nodes.items()} == {
        "n0": ["s0", "s2", "s4", "s6", "s8", "s10"], "n1": ["s1", "s3", "s5", "s7", "s9", "s11"]}
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=2, session="s0", hints=LONG)))
    assert "b" in starts(d.at(0.1).arrive(act("b", cpu=1, session="s0", hints=LONG)))
    assert "c0" in starts(d.at(0.1).arrive(act("c0", cpu=3, session="s1", hints=LONG)))
    d.at(0.2).arrive(*(act(f"a{i}", cpu=1, session=f"s{i}", hints=LONG) for i in range(2, 12, 2)))
    d.at(0.3).arrive(*(act(f"a{i}", cpu=1, session=f"s{i}", hints=LONG) for i in range(3, 12, 2)))
    return d


@pytest.mark.pure_core
@pytest.mark.parametrize("mode", ["settled", "all_short only", "full"])
def test_a_reserved_full_node_s_aged_heads_are_passed_over_not_tried(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick ages every head: a2 (n0's oldest) fails and reserves n0; n0's four other aged
    heads would fail and change nothing, but the pass could not end (n1, with aged heads left,
    not reserved yet): they were each tried before a3 reserved n1. `settled` passes them over;
    the reservations and what starts next are the same in every form."""
    d = _two_full_nodes()
    tried = _tries(monkeypatch)
    if mode == "all_short only":
        monkeypatch.setattr(_ShortNodes, "settled", lambda self, key, rec, g, aged: None)
    elif mode == "full":
        _full_passes(monkeypatch)
    d.at(1e4).tick()
    assert tried == {"settled": ["a2", "a3"],
                     "all_short only": ["a2", "a4", "a6", "a8", "a10", "a3"],
                     "full": ["a2", "a4", "a6", "a8", "a10", "a3", "a5", "a7", "a9", "a11"]}[mode]
    assert d.core.st.reserved == {"n0": "a2", "n1": "a3"}
    assert set(starts(d.at(1e4 + 1).finish("b"))) == {"a2"}
    assert d.core.st.reserved == {"n0": "a4"}


def test_a_started_head_s_aged_successor_counts_as_aged() -> None:
    """s2 runs b and holds a2 and a2b, both aged; b ends: n0's stream hands the pass a2, which
    starts on b's core (its reservation of n0 goes with it), then a2b, its session's next head
    (an end touches no queue: not by its key), aged on a full node not reserved: the pass must
    try it (it reserves n0), not end at it."""
    d = Driver([cpu_node("n0", cpu=3, mem=4096)], policy="tangram", session_ttl_s=1e6)
    for i in range(3):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=512)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=2, session="s0", hints=LONG)))
    assert "b" in starts(d.at(0.1).arrive(act("b", cpu=1, session="s2", hints=LONG)))
    d.at(0.2).arrive(act("a2", cpu=1, session="s2", hints=LONG), act("a2b", cpu=1, session="s2", hints=LONG))
    d.at(1e4).tick()
    assert d.core.st.reserved == {"n0": "a2"}
    assert set(starts(d.at(1e4 + 1).finish("b"))) == {"a2"}
    assert d.core.st.reserved == {"n0": "a2b"}


def test_settled_answers_a_short_node_once_reserved_for_an_aged_head_and_keeps_it() -> None:
    d = _two_full_nodes()
    recs = d.core.st.actions
    short = _short(d, "a2", "a4", "a3", aged=True)
    a2, a4, a3 = recs["a2"], recs["a4"], recs["a3"]
    assert short.settled(a2.queue_key, a2, _NO_GROUP, True) is None  # its try reserves n0
    assert short.settled(a2.queue_key, a2, _NO_GROUP, False) == "n0"  # (not aged: nothing to mark)
    assert short.done == {"n0"}
    assert short.settled(a4.queue_key, a4, _NO_GROUP, True) == "n0"  # (kept for the pass)
    d.core.st.nodes["n1"].free["cpu"] = 1.0  # (behind the core's back: a3 would fit)
    d.core.st.reserved["n1"] = "a3"
    assert short.settled(a3.queue_key, a3, _NO_GROUP, True) is None
    d.core.st.nodes["n1"].free["cpu"] = 1.0 - 2e-6
    assert short.settled(a3.queue_key, a3, _NO_GROUP, True) == "n1"
    assert short.settled(a3.queue_key, a3, 0, True) is None  # a parked group's entry: another
    assert short.done == {"n0", "n1"}


def _full_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass from here tries every head it has (neither ends early nor passes a node)."""
    monkeypatch.setattr(_ShortNodes, "all_short", lambda self, aged: False)
    monkeypatch.setattr(_ShortNodes, "settled", lambda self, key, rec, g, aged: None)


def _session_flood(seed: int) -> tuple[tuple[tuple[str, Resources], ...], list]:
    rng = random.Random(seed)
    sessions = tuple((f"s{i}", Resources(memory_mb=rng.choice((128, 512)))) for i in range(16))
    out = []
    t = 0.0
    for i in range(160):
        t += rng.choice((0.0, 0.0, 0.05, 0.3, 1.0))
        sid = rng.choice(sessions)[0]
        hints = WorkHints(expected_s=rng.choice((0.5, 2.0, 8.0)))
        if rng.random() < 0.4:
            spec = elastic(f"x{i}", rng.choice((0.5, 1.0)), rng.choice((2.0, 4.0)), 0.9,
                           session=sid, hints=hints)
        else:
            spec = act(f"x{i}", cpu=rng.choice((0.5, 1.0, 2.0, 3.0)), session=sid, hints=hints)
        out.append((t, spec, rng.choice((0.2, 1.0, 3.0, 6.0))))
    return sessions, out


@pytest.mark.pure_core
@pytest.mark.parametrize("seed", range(4))
def test_passes_it_ends_decide_as_full_passes_on_a_session_flood(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen sessions on two nodes, rigid and elastic heads, aging at 4 s: the command stream
    with the pass's early end is the full pass's, event for event, and the end saves tries."""
    nodes = [cpu_node("n0", cpu=4, mem=8192), cpu_node("n1", cpu=3, mem=8192)]
    cfg = {"aging_s": 4.0, "aging_min_s": 4.0, "policy": "tangram", "session_ttl_s": 1e6}
    tried = _tries(monkeypatch)
    sessions, arrivals = _session_flood(seed)
    cut = simulate(nodes, arrivals, sessions=sessions, **cfg)
    cut_tries = len(tried)
    tried.clear()
    _full_passes(monkeypatch)
    full = simulate(nodes, arrivals, sessions=sessions, **cfg)
    assert len(cut.starts) == 160
    assert cut.stream == full.stream
    assert cut_tries < len(tried)
