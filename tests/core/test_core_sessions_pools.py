"""Sessions, warm state, the static baselines' partitions, and the estimator."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, elastic, of, starts

from arl_tangram.core import DurationEstimator
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Status, WorkHints
from arl_tangram.core.policies import split_cpu
from arl_tangram.core.resources import Resources


@pytest.mark.parametrize("policy", ["tangram", "fifo", "task-isolated", "trajectory-bound"])
def test_session_actions_run_only_on_session_node(policy: str) -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy=policy, trajectories=2)
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=512), node="n1"))
    (op,) = of(out, cmd.OpenSession)
    assert op.node == "n1" and op.demand == Resources(memory_mb=512)
    out = d.arrive(act("a", session="s", trajectory="t"), act("b", session="s", trajectory="t"))
    for s in starts(out).values():
        assert s.node == "n1" and s.warm
    d.arrive(act("c", cpu=2, session="s", trajectory="t"))
    assert d.status("c") is Status.QUEUED  # n1 is busy; n0 is free but not its node
    d.finish("a")
    out = d.finish("b")
    assert starts(out)["c"].node == "n1"


def test_implicit_session_and_ttl_expiry() -> None:
    d = Driver([cpu_node("n0")], policy="tangram", session_ttl_s=10)
    out = d.arrive(act("a", session="s"))
    (op,) = of(out, cmd.OpenSession)
    assert starts(out)["a"].node == op.node
    d.at(50).finish("a")
    assert not of(d.at(55).tick(), cmd.CloseSession)
    (cl,) = of(d.at(61).tick(), cmd.CloseSession)
    assert cl.session_id == "s" and "ttl" in cl.reason
    assert d.core.view().sessions == ()


def test_session_closed_cancels_its_queued_actions() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="fifo")
    d.arrive(act("a", session="s"), act("b", session="s"))
    out = d(ev.SessionClosed(1.0, "s"))
    (dl,) = of(out, cmd.Deliver)
    assert dl.result.id == "b" and dl.result.status is Status.CANCELLED
    assert of(out, cmd.CloseSession)
    d.finish("a")  # the running one still finishes normally
    assert d.result("a").status is Status.SUCCEEDED


def test_node_lost_closes_sessions_and_loses_their_actions() -> None:
    d = Driver([cpu_node("n0", cpu=1), cpu_node("n1", cpu=1)], policy="fifo")
    d(ev.SessionRequested(0.0, "s", node="n0"))
    d.arrive(act("a", session="s"), act("b", session="s"))
    out = d(ev.NodeLost(1.0, "n0"))
    res = {c.result.id: c.result.status for c in of(out, cmd.Deliver)}
    assert res == {"a": Status.NODE_LOST, "b": Status.NODE_LOST}
    assert d.core.view().sessions == ()


def test_warm_node_preferred() -> None:
    d = Driver([cpu_node("n0"), cpu_node("n1"), cpu_node("n2")], policy="fifo")
    d(ev.WarmPoolReport(0.0, "n2", "python", 1))
    out = d.arrive(ActionSpec("a", kind=ActionKind.CODE, payload={"language": "python"}))
    s = starts(out)["a"]
    assert s.node == "n2" and s.warm
    out = d.arrive(ActionSpec("b", kind=ActionKind.CODE, payload={"language": "python"}))
    assert not starts(out)["b"].warm  # the one warm executor was used


def test_tangram_sizes_warm_pools_from_arrival_rate() -> None:
    d = Driver([cpu_node("n0", cpu=64), cpu_node("n1", cpu=64)], policy="tangram", sandbox_cold_s=1.0, max_warm_per_node=16,
               rate_window_s=1.0)
    d.tick()
    for i in range(10):
        d.at(i * 0.1).arrive(ActionSpec(f"a{i}", payload={"language": "python"}))
    d.at(1.0).tick()
    sizes = {c.node: c.size for c in of(d.log, cmd.ResizeWarmPool) if c.key == "python"}
    assert sum(sizes.values()) == 20  # 10/s x 1s cold start x 2 (the last target of each node)


def test_a_burst_shorter_than_a_tick_sizes_the_pools_at_once() -> None:
    """Ten arrivals within one cold-start time (0.5 s) ask for 2 x 10 warm sandboxes before
    the next Tick: a pool refills in a cold-start time, a burst does not wait for it."""
    d = Driver([cpu_node("n0", cpu=64), cpu_node("n1", cpu=64)], policy="tangram",
               sandbox_cold_s=0.5, rate_window_s=60.0)
    d.tick()
    for i in range(10):
        d.at(0.01 * i).arrive(ActionSpec(f"a{i}", payload={"language": "python"}))
    sizes = {c.node: c.size for c in of(d.log, cmd.ResizeWarmPool) if c.key == "python"}
    assert sum(sizes.values()) == 20


def test_split_cpu_is_proportional_and_exact() -> None:
    parts = split_cpu([("a", 4), ("b", 4)], {"x": 1, "y": 1, "z": 2})
    tot = {p: sum(q for _, q in pieces) for p, pieces in parts.items()}
    assert tot == pytest.approx({"x": 2, "y": 2, "z": 4})
    assert parts["z"] == [("b", 4.0)]
    per_node: dict[str, float] = {}
    for pieces in parts.values():
        for n, q in pieces:
            per_node[n] = per_node.get(n, 0) + q
    assert per_node == pytest.approx({"a": 4, "b": 4})


def test_trajectory_bound_one_at_a_time_in_its_slice_with_whole_slice() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="trajectory-bound", trajectories=2)
    out = d.arrive(elastic("e1", 1, 8, trajectory="t1"), act("a2", trajectory="t1"))
    s = starts(out)
    assert list(s) == ["e1"] and s["e1"].allotment["cpu"] == 2  # its whole slice: 4 / 2
    out = d.arrive(act("b1", cpu=1, trajectory="t2"))
    assert starts(out)["b1"].allotment["cpu"] == 1
    out = d.arrive(act("c1", trajectory="t3"))  # third trajectory shares slot 0 with t1
    assert not starts(out)
    out = d.finish("e1")
    assert list(starts(out)) == ["a2"]


def test_trajectory_bound_fractional_quota() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="trajectory-bound", trajectories=4)
    out = d.arrive(act("a", cpu=1, trajectory="t"))
    assert starts(out)["a"].allotment["cpu"] == pytest.approx(0.25)


def test_task_isolated_pools_follow_shares_and_do_not_borrow() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="task-isolated", task_shares={"big": 3, "small": 1})
    out = d.arrive(*[act(f"b{i}", task="big") for i in range(4)])
    assert len(starts(out)) == 3
    out = d.arrive(*[act(f"s{i}", task="small") for i in range(2)])
    assert len(starts(out)) == 1  # 1 cpu of its own, though "big" leaves none idle to borrow
    out = d.finish("s0")
    assert list(starts(out)) == ["s1"]


def test_estimator_learns_per_unit_and_quantiles() -> None:
    est = DurationEstimator()
    spec = ActionSpec("t", kind=ActionKind.TEST, hints=WorkHints(test_count=10))
    prior = est.predict(spec)
    assert prior == pytest.approx(0.5)  # 0.05 s per test prior
    for run in (2.0, 2.0, 2.0, 2.0, 6.0):
        est.observe(spec, run)
    assert est.predict(spec) == pytest.approx(2.0)
    assert est.predict(spec, 0.99) == pytest.approx(6.0)
    twenty = ActionSpec("u", kind=ActionKind.TEST, hints=WorkHints(test_count=20))
    assert est.predict(twenty) == pytest.approx(4.0)
    assert est.predict(spec, speed=2.0) == pytest.approx(1.0)
    exp = ActionSpec("e", hints=WorkHints(expected_s=3.0))
    assert est.predict(exp) == pytest.approx(3.0)  # the submitter's estimate is the prior
    assert est.samples("test") == 5


def test_core_feeds_estimator_from_finished_runs() -> None:
    d = Driver([cpu_node("n0")], policy="tangram")
    d.arrive(act("a", hints=WorkHints(test_count=4)))
    d.at(5).finish("a", run_s=4.0)
    assert d.core.estimator.samples("code") == 1


def test_a_session_action_reclaims_cores_a_grown_test_borrowed() -> None:
    """Growth is lent: a test grown to the node's four cores gives one back (a ResizeAction)
    for a shell command of another session that can run only on this node."""
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram", reserve_fraction=0.0)
    for sid in ("s1", "s2"):
        d(ev.SessionRequested(d.t, sid, demand=Resources(memory_mb=256), node="n0"))
    out = d.arrive(elastic("test", 1, 4, p=0.9, session="s1", hints=WorkHints(expected_s=20)))
    assert starts(out)["test"].allotment["cpu"] == 4
    d.started("test", "n0")
    out = d.arrive(act("ls", session="s2", hints=WorkHints(expected_s=0.1)))
    assert "ls" in starts(out)
    resize = of(out, cmd.ResizeAction)
    assert [(r.action_id, r.allotment["cpu"]) for r in resize] == [("test", 3)]
    out = d.finish("ls", run_s=0.1)  # the core lends the core back
    assert [(r.action_id, r.allotment["cpu"]) for r in of(out, cmd.ResizeAction)] == [("test", 4)]


def _opened(out) -> str:
    (op,) = of(out, cmd.OpenSession)
    return op.node


def test_session_warm_key_prefers_node_holding_it() -> None:
    # n1 has more free CPU and fewer sessions per core: the plain spread picks it
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=8)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "image:swe", 1))
    assert _opened(d(ev.SessionRequested(0.0, "plain"))) == "n1"
    assert _opened(d(ev.SessionRequested(0.0, "a", warm_key="image:swe"))) == "n0"
    assert _opened(d(ev.SessionRequested(0.0, "b", warm_key="image:swe"))) == "n0"
    assert _opened(d(ev.SessionRequested(0.0, "c", warm_key="image:other"))) == "n1"
    d(ev.WarmPoolReport(0.0, "n0", "image:swe", 0))  # removed there: the spread decides again
    assert _opened(d(ev.SessionRequested(0.0, "d", warm_key="image:swe"))) == "n1"


def test_session_warm_key_falls_back_when_warm_node_has_no_room() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048), cpu_node("n1", cpu=4, mem=8192)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n0", "image:swe", 1))
    big = Resources(memory_mb=1500)  # with the room kept for an action (1024 MB), n0 cannot hold it
    out = d(ev.SessionRequested(0.0, "a", demand=big, warm_key="image:swe"))
    assert _opened(out) == "n1"  # it pays the import there
    out = d(ev.SessionRequested(0.0, "b", warm_key="image:swe"))
    assert _opened(out) == "n0"


@pytest.mark.parametrize("policy,kw", [("task-isolated", {"task_shares": {"a": 1}}),
                                       ("trajectory-bound", {"trajectories": 1})])
def test_session_warm_key_within_partition(policy: str, kw: dict) -> None:
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=4)], policy=policy, **kw)
    d(ev.WarmPoolReport(0.0, "n1", "image:swe", 1))
    out = d(ev.SessionRequested(0.0, "s", trajectory="t", task="a", warm_key="image:swe"))
    part = next(iter(d.core.partitions.pieces.values()))
    assert [n for n, _ in part] == ["n0", "n1"]  # its slice / pool spans both nodes
    assert _opened(out) == "n1"
