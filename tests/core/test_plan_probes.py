"""`Elastic.width_on`'s probes (issue 40): a head that waited on a node by the lane rule leaves
its expected work there as a hint; at a later instant or state of the node, a session's head
with more work is planned first as if it had the hint's work -- one plan that, if it waits,
answers this head and every head of at least that work on the node as it is now. On a crowded
node the aged heads come oldest first, with less work each: every one of them was planned at
every event."""

from __future__ import annotations

import random

import pytest
from core_helpers import Driver, cpu_node, elastic
from fair_sim import simulate

from arl_tangram.core.actions import WorkHints
from arl_tangram.core.elastic import _HINTS, Elastic
from arl_tangram.core.resources import Resources


def _one_running(cpu: float):
    """Node n0 of ``cpu`` cores running e1 (1-2 cores, parallel fraction 1, 10 s expected) at
    2 cores since t=0, e2 of the same elasticity queued behind it, seen at t=1 with nothing
    remembered: (driver, node, its `Elastic`, e2's record). Planned as a head, e2's record
    stands for a head of its elasticity whose expected work is its ``est``."""
    d = Driver([cpu_node("n0", cpu=cpu, mem=8192)], policy="tangram")
    d.at(0.0).arrive(elastic("e1", 1, 2, 1.0, hints=WorkHints(expected_s=10)))
    d.at(0.0).arrive(elastic("e2", 1, 2, 1.0, hints=WorkHints(expected_s=10)))
    d.at(1.0).tick()
    core = d.core
    node = core.st.nodes["n0"]
    assert list(node.elastic) == ["e1"]
    core.elastic._hints.clear()
    core.elastic._waited.clear()
    return d, node, core.elastic, core.st.actions["e2"]


def _planned(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The ``work`` of each `Elastic.plan` call from now on (-1.0: the head's own)."""
    calls: list[float] = []
    real = Elastic.plan

    def counting(self, rec, node, behind, elsewhere=float("inf"), work=-1.0):
        calls.append(work)
        return real(self, rec, node, behind, elsewhere, work)

    monkeypatch.setattr(Elastic, "plan", counting)
    return calls


@pytest.mark.pure_core
def test_a_head_that_waited_is_the_probe_for_a_larger_one_at_the_next_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 2 cores e1 has 8 s of work left at 2 cores (ends in 4 s). A head of 10 s waits
    (waiting: e1 ends at 4 s, the head at 9: 13; sharing a core each: 8 and 9: 17) and is kept
    as the hint; at the next instant a head of 20 s is answered by one plan at 10 s, which waits, and
    the memo holds 10 s for the node as it is; a head of 5 s (less than the hint) is planned at
    its own work, waits, and joins the hints."""
    d, node, E, rec = _one_running(cpu=2)
    el = rec.spec.elasticity
    calls = _planned(monkeypatch)
    rec.est = 10.0
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert calls == [-1.0] and E._hints == {node: {el: [10.0]}}
    d.at(1.5).tick()  # (a new instant: the memo is forgotten, the hints are not)
    calls.clear()
    rec.est = 20.0
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert calls == [10.0]  # (one plan, at the hint's work)
    assert E._waited == {(node, node.moves, el): 10.0}
    assert E.width_on(rec, node, 0) == (0.0, 0.0) and calls == [10.0]  # (the memo: no plan)
    rec.est = 5.0
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert calls == [10.0, -1.0]  # (less work than every hint: planned as itself)
    assert E._hints == {node: {el: [5.0, 10.0]}}
    assert E._waited == {(node, node.moves, el): 5.0}


@pytest.mark.pure_core
def test_a_probe_that_would_start_is_dropped_and_the_head_is_planned_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hint of 0.5 s would start now (sharing ends it at 0.5 s, e1 at 4.25: 4.75 against
    waiting's 8.25): the node's hints go (3.0 s too), the head of 20 s is planned at its own
    work, waits, and is the hint left."""
    _, node, E, rec = _one_running(cpu=2)
    el = rec.spec.elasticity
    E._hints[node] = {el: [0.5, 3.0]}
    calls = _planned(monkeypatch)
    rec.est = 20.0
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert calls == [0.5, -1.0]  # (one probe: the hints of a node with room go with it)
    assert E._hints == {node: {el: [20.0]}}
    assert E._waited == {(node, node.moves, el): 20.0}


@pytest.mark.pure_core
def test_a_head_with_the_least_hint_s_work_is_planned_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe is for more work than the hint's: at exactly the least hint's work the head is
    planned once, as itself."""
    _, node, E, rec = _one_running(cpu=2)
    el = rec.spec.elasticity
    E._hints[node] = {el: [20.0, 30.0]}
    calls = _planned(monkeypatch)
    rec.est = 20.0
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert calls == [-1.0] and E._hints == {node: {el: [20.0, 30.0]}}


@pytest.mark.pure_core
def test_probes_are_only_for_session_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head with others queued behind it, or a node elsewhere, is planned as itself, and
    leaves no hint (its plan weighs more than its own work)."""
    _, node, E, rec = _one_running(cpu=2)
    el = rec.spec.elasticity
    E._hints[node] = {el: [10.0]}
    calls = _planned(monkeypatch)
    rec.est = 20.0
    assert E.width_on(rec, node, 1) == (0.0, 0.0)
    assert E.width_on(rec, node, 0, 30.0) == (0.0, 0.0)
    assert calls == [-1.0, -1.0]
    assert E._hints == {node: {el: [10.0]}} and E._waited == {}


def test_the_hints_keep_the_least_works_of_the_latest_elasticities() -> None:
    """Per node, the `_HINTS` least works (each once) of each of the `_HINTS` elasticities
    last seen; a new elasticity past that replaces the oldest."""
    assert _HINTS == 4
    _, node, E, rec = _one_running(cpu=2)
    el = rec.spec.elasticity
    for x in (7.0, 3.0, 9.0, 3.0, 5.0, 4.0):
        E._hint(node, el, x)
    assert E._hints == {node: {el: [3.0, 4.0, 5.0, 7.0]}}
    others = [elastic(f"o{i}", 1, 2 + i, 1.0).elasticity for i in range(1, 5)]
    for i, o in enumerate(others):
        E._hint(node, o, float(i))
    assert E._hints == {node: {others[0]: [0.0], others[1]: [1.0], others[2]: [2.0], others[3]: [3.0]}}


def _crowd(seed: int, n_sessions: int = 40, n: int = 300) -> tuple[tuple[tuple[str, Resources], ...], list]:
    """``n_sessions`` sessions on one node, ``n`` elastic tests of three elasticities
    (expected 0.5 to 60 s, running half to twice that), arriving in bursts."""
    rng = random.Random(seed)
    sessions = tuple((f"s{i}", Resources(memory_mb=64)) for i in range(n_sessions))
    kinds = ((1.0, 4.0, 0.9), (1.0, 8.0, 0.95), (0.5, 2.0, 0.8))
    out = []
    t = 0.0
    for i in range(n):
        t += rng.choice((0.0, 0.0, 0.1, 0.5))
        sid = rng.choice(sessions)[0]
        lo, hi, pf = rng.choice(kinds)
        x = rng.choice((0.5, 3.0, 12.0, 60.0))
        spec = elastic(f"x{i}", lo, hi, pf, session=sid, hints=WorkHints(expected_s=x))
        out.append((t, spec, x * rng.choice((0.5, 1.0, 2.0))))
    return sessions, out


_CFG = {"aging_s": 3.0, "aging_min_s": 3.0, "policy": "tangram", "session_ttl_s": 1e6}


def _with_and_without(monkeypatch: pytest.MonkeyPatch, cpu: float, sessions, arrivals):
    """(run with the probes, its plans' works, run without a hint ever kept, its plans')."""
    nodes = [cpu_node("n0", cpu=cpu, mem=8192)]
    calls = _planned(monkeypatch)
    probed = simulate(nodes, arrivals, sessions=sessions, **_CFG)
    with_probes = list(calls)
    calls.clear()
    monkeypatch.setattr(Elastic, "_hint", lambda self, node, el, x: None)
    every = simulate(nodes, arrivals, sessions=sessions, **_CFG)
    return probed, with_probes, every, calls


@pytest.mark.pure_core
@pytest.mark.parametrize("seed", range(4))
def test_probes_decide_as_planning_every_head_on_a_crowded_node(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command stream with the probes is the stream without them (no hint ever kept),
    event for event, and probes were made (here, where few heads wait at once, they save
    no plans: the work-count test of tests/core/test_scale_work.py shows what they save)."""
    sessions, arrivals = _crowd(seed)
    probed, with_probes, every, calls = _with_and_without(monkeypatch, 12, sessions, arrivals)
    assert len(probed.starts) == 300
    assert probed.stream == every.stream
    assert all(w == -1.0 for w in calls)  # (no hint: no probe)
    assert sum(w >= 0.0 for w in with_probes) > 0


@pytest.mark.pure_core
def test_the_flood_where_a_probe_decided_otherwise_now_decides_as_planning_every_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probes assume what the memo does: a head with more work than one that waits waits
    too, which the lane rule does not promise at every state of a node. In this flood (80
    sessions, 16 cores) a probe at a hint of 2.9 s once waited at t=3.1 where the head of
    11.6 s itself would start at one core (mean ACT 1.001x the stream without probes). Since
    a head that waiting cannot widen starts whatever its work, without the memo or a probe
    (`Elastic._no_wider`), the two streams are equal here, event for event, probes made (and
    in the 48 floods of seeds 0-11 at 40 and 80 sessions on 12 and 16 cores, run by hand on
    2026-12-03)."""
    sessions, arrivals = _crowd(2, n_sessions=80, n=400)
    probed, with_probes, every, _ = _with_and_without(monkeypatch, 16, sessions, arrivals)
    assert len(probed.starts) == 400
    assert probed.stream == every.stream
    assert sum(w >= 0.0 for w in with_probes) > 0
