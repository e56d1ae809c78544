"""Exact values of the core's own bookkeeping (core/core.py; issue 43's mutation check): use-based
admission (`_charge`, `_learn_use`), static-pool's fixed width (`_at_fixed`), the history and
counters, rejection reasons (`_impossible`), finish statuses and notes, hand-computed."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, elastic, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status, WorkHints
from arl_tangram.core.resources import Resources

S = Status


def _short(aid: str):
    return act(aid, hints=WorkHints(expected_s=0.05))


def _measured(d: Driver, uses: list[float]) -> None:
    """One finished short action per use (cores: cpu_s over a 1 s run)."""
    for i, u in enumerate(uses):
        aid = f"m{len(d.core.history)}-{i}"
        d.arrive(_short(aid))
        d.finish(aid, run_s=1.0, cpu_s=u)


@pytest.mark.parametrize(
    ("use", "charged"),
    [
        (0.2, 0.25),  # x1.25 = 0.25: 1/4 of the demand
        (0.01, 0.125),  # at the floor: 1/8
        (0.3, 0.5),  # 0.375 -> 1/2
        (0.4, 0.5),  # exactly 1/2
        (0.79, 1.0),  # 0.9875 -> below 1, rounds to 1: no charge
        (0.8, 1.0),  # 1.0: no charge
    ],
)
def test_a_short_action_is_charged_its_measured_use_over_a_power_of_two(use, charged) -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [use] * 4)
    assert d.core._use_mean == {"code": pytest.approx(use)}
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=4)))  # (keeps "a" queued)
    d.arrive(_short("a"))
    rec = d.core.actions["a"]
    assert rec.cpu == charged
    if charged < 1.0:
        assert rec.charge == Resources(cpu=charged, memory_mb=256)
        assert rec.shape == (("cpu", charged), ("memory_mb", 256.0))
    else:
        assert rec.charge is None
        assert rec.shape == (("cpu", 1.0), ("memory_mb", 256.0))


def test_the_charge_needs_four_samples_and_keeps_the_last_32() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 3)
    assert d.core._use_mean == {}
    d.arrive(_short("three"))
    assert d.core.actions["three"].cpu == 1.0 and d.core.actions["three"].charge is None
    d.finish("three", run_s=1.0, cpu_s=0.2)  # the fourth sample
    assert d.core._use_mean == {"code": pytest.approx(0.2)}
    # a first sample of 20 cores, then 32 of 0.16: only the last 32 count
    e = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(e, [20.0] + [0.16] * 32)
    assert e.core._use_samples["code"] == [pytest.approx(0.16)] * 32
    assert e.core._use_mean["code"] == pytest.approx(0.16)
    e.arrive(_short("a"))
    assert e.core.actions["a"].cpu == 0.25  # 0.2 -> 1/4


def test_use_is_cpu_seconds_over_run_seconds_and_only_successes_count() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    for i in range(4):
        d.arrive(_short(f"w{i}"))
        d.finish(f"w{i}", run_s=0.5, cpu_s=0.05)  # 0.1 core
    d.arrive(_short("f"))
    d.finish("f", status=S.FAILED, run_s=0.5, cpu_s=5.0)  # a failure teaches nothing
    d.arrive(_short("z"))
    d.finish("z", run_s=0.0, cpu_s=5.0)  # no run time: nothing
    assert d.core._use_samples == {"code": [pytest.approx(0.1)] * 4}


def test_only_short_rigid_one_shot_cpu_actions_are_charged_by_use() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 4)
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=4)))
    # (the runs taught 1 s per 0.05 expected: "edge" is estimated at exactly short_action_s)
    d.arrive(act("long", hints=WorkHints(expected_s=0.06)))  # 1.2 s: longer
    d.arrive(act("edge", hints=WorkHints(expected_s=0.05)))
    assert (d.core.actions["long"].est, d.core.actions["edge"].est) == (pytest.approx(1.2), 1.0)
    d.arrive(act("zero", cpu=0, hints=WorkHints(expected_s=0.05)))
    a = d.core.actions
    assert a["long"].cpu == 1.0 and a["long"].charge is None
    assert a["edge"].cpu == 0.25
    assert a["zero"].charge is None
    # a policy that does not admit by use
    f = Driver([cpu_node("n0", cpu=4)], policy="static-pool", short_action_s=1.0)
    _measured(f, [0.2] * 4)
    assert f.core._use_samples == {}
    z = Driver([cpu_node("n0", cpu=4)], policy="tangram")  # short_action_s 0: none
    _measured(z, [0.2] * 4)
    assert z.core._use_samples == {}


@pytest.mark.parametrize(
    ("static_k", "cap", "width"),
    [(2.0, 8, 2.0), (None, 3, 3.0), (0.5, 8, 1.0), (10.0, 2, 2.0), (None, 8, 4.0), (3.0, 8, 3.0)],
)
def test_static_pool_runs_an_elastic_action_at_its_fixed_width(static_k, cap, width) -> None:
    d = Driver([cpu_node("n0", cpu=cap)], policy="static-pool", static_k=static_k)
    s = starts(d.arrive(elastic("e", lo=1, hi=4)))
    assert s["e"].allotment == Resources(cpu=width, memory_mb=256)
    el = d.core.actions["e"].spec.elasticity
    assert (el.min, el.max, el.dim) == (width, width, "cpu")
    assert el.speedup.parallel_fraction == 0.9
    assert type(el.min) is float


def test_the_history_keeps_the_newest_and_the_counters_count() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", history=2)
    for aid in ("a", "b", "c"):
        d.arrive(act(aid))
        d.finish(aid)
    d.arrive(act("x", cpu=9))  # rejected at once
    assert list(d.core.history) == ["c", "x"]
    assert d.core.status("a") is None and d.core.story("a") == []
    assert d.core.status("c") is S.SUCCEEDED and d.core.status("x") is S.REJECTED
    assert d.core.story("c")[-1] == "t=0 STARTING->SUCCEEDED (cause ActionFinished:c)"
    assert (d.core.arrived, d.core.delivered) == (4, 4)
    assert d.core.terminal == {S.SUCCEEDED: 3, S.REJECTED: 1}
    assert d.core.seq == 4
    d.arrive(act("a"))  # an id delivered before arrives again: a new action
    assert d.core.status("a") is S.STARTING and d.core.actions["a"].seq == 5


def test_a_duplicate_arrival_is_noted_and_ignored() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("a"))
    out = d.arrive(act("a", cpu=2))
    assert out == []
    assert d.core.arrived == 1 and d.core.seq == 1
    assert d.core.actions["a"].spec.demand == Resources(cpu=1, memory_mb=256)
    assert d.core.story("a")[-1] == "t=0 duplicate arrival ignored (cause a)"


def test_rejection_reasons() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d.arrive(act("big", cpu=3))
    r = d.result("big")
    assert r.status is S.REJECTED
    assert r.reason == (
        "no node can ever satisfy demand Resources(cpu=3, memory_mb=256) "
        "(largest capacities {'cpu': 2.0, 'memory_mb': 8192.0})"
    )
    # a session's first action: the session's own demand is added
    d.arrive(act("s2", cpu=2, mem=8000, session="q"))
    assert d.result("s2").reason == (
        "no node can ever satisfy demand Resources(cpu=2, memory_mb=8256) "
        "(largest capacities {'cpu': 2.0, 'memory_mb': 8192.0})"
    )
    d.arrive(act("s3", cpu=2, mem=7936, session="q2"))  # 7936 + 256 = 8192: fits
    assert "s3" not in d.delivered
    # an open session: what its node can offer besides what the session holds
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d(ev.SessionRequested(0.0, "z", demand=Resources(cpu=1, memory_mb=256)))
    d.arrive(act("z1", cpu=2, session="z"))
    assert d.result("z1").status is S.REJECTED
    assert d.result("z1").reason == (
        "demand Resources(cpu=2, memory_mb=256) exceeds what session "
        "z's node n0 can offer: short {'cpu': 1.0}"
    )
    d.arrive(act("z2", cpu=1, mem=8192 - 256, session="z"))  # exactly what is left
    assert "z2" not in d.delivered


def test_finish_statuses_and_notes() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("a"), act("b"), act("c"), act("t"))
    d.finish("a", status=S.RUNNING)
    assert d.result("a").status is S.FAILED
    assert d.result("a").reason == "executor reported non-terminal status RUNNING"
    d.finish("b", status=S.REJECTED)
    assert d.result("b").status is S.FAILED and d.result("b").reason == ""
    d.finish("t", status=S.TIMED_OUT, reason="slow")
    assert d.result("t").status is S.TIMED_OUT and d.result("t").reason == "slow"
    d.at(1.0)(ev.ActionStarted(1.0, "c", "n0", cold_start_s=1.234))
    assert d.core.status("c") is S.RUNNING
    assert d.core.story("c")[-2:] == [
        "t=1 STARTING->RUNNING (cause ActionStarted:c)",
        "t=1 cold start 1.23s (cause ActionStarted:c)",
    ]
    assert d.core.actions["c"].start_time == 1.0
    d.at(3.5).finish("c")
    r = d.result("c")
    assert (r.submit_time, r.start_time, r.finish_time) == (0.0, 1.0, 3.5)
    d(ev.ActionStarted(4.0, "c", "n0"))  # stale: ignored
    assert d.core.status("c") is S.SUCCEEDED


def test_a_lost_node_requeues_idempotent_actions_and_loses_the_rest() -> None:
    from core_helpers import cpu_commands

    d = Driver([cpu_node("n0", cpu=3), cpu_node("n1", cpu=1)], policy="tangram")
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256), node="n0"))
    out = d.arrive(
        act("i", idempotent=True),
        act("o", idempotent=False),
        act("q", cpu=1, session="s"),
        act("w", cpu=1),
        act("x", cpu=1, session="s"),
    )
    assert cpu_commands(out) == [
        ("start", "i", 1.0),
        ("start", "o", 1.0),
        ("start", "q", 1.0),
        ("start", "w", 1.0),
    ]
    assert cpu_commands(d.at(1.0)(ev.NodeLost(1.0, "n0", reason="gone"))) == []
    assert {k: r.status for k, r in d.core.actions.items()} == {"i": S.QUEUED, "w": S.STARTING}
    assert d.core.story("i")[-2:] == [
        "t=1 STARTING->QUEUED (cause NodeLost:n0)",
        "t=1 requeued: node n0 lost: gone (cause NodeLost:n0)",
    ]
    for aid in ("o", "q"):  # running there: lost, as they ran
        r = d.result(aid)
        assert (r.status, r.reason, r.node) == (S.NODE_LOST, "node n0 lost: gone", "n0")
        assert r.allotment == Resources(cpu=1, memory_mb=256) and r.finish_time == 1.0
    r = d.result("x")  # queued in the session: lost with it
    assert (r.status, r.reason, r.node) == (
        S.NODE_LOST,
        "session s closed: node n0 lost: gone",
        None,
    )
    n0 = d.core.nodes["n0"]
    assert (n0.alive, n0.running, n0.elastic, d.core.st.sessions) == (False, set(), {}, {})
    assert d.at(2.0)(ev.NodeLost(2.0, "n0", reason="again")) == []  # (already lost)
    assert d.core.terminal == {S.NODE_LOST: 3}
    out = d.at(2.0)(ev.NodeAdded(2.0, cpu_node("n0", cpu=3)))
    assert cpu_commands(out) == [("start", "i", 1.0)]
    assert d.core.actions["i"].attempts == 2
    assert d.at(2.5)(ev.NodeAdded(2.5, cpu_node("n0", cpu=5))) == []  # (alive: ignored)
    assert d.core.nodes["n0"].cap["cpu"] == 3.0


def test_a_cancel_stops_a_running_action_on_its_node_and_a_queued_one_in_place() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d.arrive(act("a"), act("b"), act("c"))
    out = d.at(0.5)(ev.CancelRequested(0.5, "c"))  # queued: no CancelAction
    assert [type(c).__name__ for c in out] == ["Deliver"]
    assert d.result("c").status is S.CANCELLED and d.result("c").reason == "cancelled by request"
    out = d(ev.CancelRequested(0.5, "a"))
    assert out[0] == cmd.CancelAction("a", "n0", cause="CancelRequested:a")
    r = d.result("a")
    assert (r.status, r.reason, r.start_time, r.finish_time, r.node) == (
        S.CANCELLED,
        "cancelled by request",
        0.0,
        0.5,
        "n0",
    )
    assert list(starts(out)) == ["b"]  # its core went back to the node
    assert d(ev.CancelRequested(0.6, "nobody")) == []
    assert d.core.terminal == {S.CANCELLED: 2}


def test_closing_a_session_cancels_its_queued_actions() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    d.arrive(act("r", session="s"), act("q", session="s"))
    out = d.at(1.0)(ev.SessionClosed(1.0, "s"))
    assert out[0] == cmd.CloseSession("s", "n0", "closed by client", cause="SessionClosed:s")
    r = d.result("q")
    assert (r.status, r.reason) == (S.CANCELLED, "session s closed: closed by client")
    assert d.core.status("r") is S.STARTING  # (running: it ends on its own)
    d(ev.SessionRequested(1.0, "t", demand=Resources(memory_mb=256)))
    d.arrive(act("u", session="t", cpu=0.5))
    d.at(2.0)(ev.SessionClosed(2.0, "t", reason="bye"))
    assert d.result("u").reason == "session t closed: bye"
    assert d(ev.SessionClosed(3.0, "t")) == []  # (closed already)
