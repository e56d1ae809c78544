"""The core on CPU actions: feed events, compare the commands that come back."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, elastic, of, starts

from arl_tangram.core import POLICIES, Core, CoreConfig
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, Status, WorkHints
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.errors import IllegalTransition
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources


def test_exports() -> None:
    import arl_tangram.core as core

    assert set(core.__all__) >= {"Core", "CoreConfig", "POLICIES", "DurationEstimator", "CoreView"}
    for name in core.__all__:
        assert hasattr(core, name)
    assert POLICIES == ("tangram", "trajectory-bound", "task-isolated", "fifo", "static-pool")


@pytest.mark.parametrize("policy", POLICIES)
def test_start_run_finish_delivers_once_with_times(policy: str) -> None:
    d = Driver([cpu_node("n0")], policy=policy)
    out = d.at(1.0).arrive(act("a", trajectory="t"))
    (s,) = of(out, cmd.StartAction)
    assert s.node == "n0" and s.allotment["cpu"] == 1
    assert d.status("a") is Status.STARTING
    d.at(1.5).started("a", "n0")
    assert d.status("a") is Status.RUNNING
    out = d.at(3.0).finish("a", run_s=1.5, output={"ok": 1})
    (dl,) = of(out, cmd.Deliver)
    r = dl.result
    assert (r.status, r.submit_time, r.start_time, r.finish_time) == (Status.SUCCEEDED, 1.0, 1.5, 3.0)
    assert r.node == "n0" and r.allotment["cpu"] == 1 and r.attempts == 1 and r.output == {"ok": 1}
    assert r.act == 2.0
    assert d.core.view().nodes[0].used.get("cpu") == 0
    assert any("RUNNING->SUCCEEDED" in line for line in d.core.story("a"))
    # a late duplicate finish is ignored
    assert d.finish("a") == []


@pytest.mark.parametrize("policy", POLICIES)
def test_impossible_action_rejected_at_once(policy: str) -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=1024)], policy=policy)
    out = d.arrive(act("big", cpu=1, mem=4096))
    (dl,) = of(out, cmd.Deliver)
    assert dl.result.status is Status.REJECTED and "memory_mb" in dl.result.reason
    if policy in ("tangram", "fifo"):
        (dl,) = of(d.arrive(act("wide", cpu=8)), cmd.Deliver)
        assert dl.result.status is Status.REJECTED and "cpu" in dl.result.reason


def test_fifo_queues_in_arrival_order_and_backfills() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="fifo")
    d.arrive(act("a", cpu=2))
    d.arrive(act("big", cpu=2), act("b", cpu=1), act("c", cpu=1))
    assert d.status("big") is Status.QUEUED
    out = d.finish("a")
    assert list(starts(out)) == ["big"]
    out = d.finish("big")
    assert list(starts(out)) == ["b", "c"]


def test_fifo_backfills_smaller_shape_when_head_blocked() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="fifo")
    d.arrive(act("a", cpu=1))
    out = d.arrive(act("big", cpu=2), act("small", cpu=1))
    assert list(starts(out)) == ["small"]


def test_tangram_orders_shortest_expected_work_first() -> None:
    from arl_tangram.core.actions import WorkHints

    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d.arrive(act("blocker"))
    d.arrive(act("long", hints=WorkHints(expected_s=100)), act("short", hints=WorkHints(expected_s=1)))
    out = d.finish("blocker")
    assert list(starts(out)) == ["short"]


def test_aging_serves_old_action_first_and_reserves_a_node() -> None:
    from arl_tangram.core.actions import WorkHints

    d = Driver([cpu_node("n0", cpu=2)], policy="tangram", aging_s=10.0)
    d.arrive(act("x", cpu=1), act("y", cpu=1))
    d.arrive(act("big", cpu=2, hints=WorkHints(expected_s=1000)))
    # short actions keep arriving; without aging `big` would starve behind them
    d.at(5).arrive(act("s1", hints=WorkHints(expected_s=1)))
    out = d.at(6).finish("x")
    assert list(starts(out)) == ["s1"]  # not aged yet: short first
    d.at(11).arrive(act("s2", hints=WorkHints(expected_s=1)))  # big is aged now: n0 is held
    assert d.status("s2") is Status.QUEUED
    d.at(12).finish("y")
    assert d.status("big") is Status.QUEUED
    out = d.at(13).finish("s1")
    assert list(starts(out)) == ["big"]
    assert any("aged" in line for line in d.core.story("big"))


@pytest.mark.parametrize("policy", POLICIES)
def test_cancel_pending_and_running(policy: str) -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy=policy, trajectories=1)
    d.arrive(act("a", trajectory="t"), act("b", trajectory="t"))
    out = d(ev.CancelRequested(1.0, "b"))
    (dl,) = of(out, cmd.Deliver)
    assert dl.result.status is Status.CANCELLED and not of(out, cmd.CancelAction)
    out = d(ev.CancelRequested(1.0, "a"))
    assert of(out, cmd.CancelAction)[0].node == "n0"
    assert of(out, cmd.Deliver)[0].result.status is Status.CANCELLED
    assert d.finish("a") == []  # the late finish of a cancelled action is ignored
    assert d(ev.CancelRequested(2.0, "a")) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_node_lost_requeues_idempotent_and_loses_others(policy: str) -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy=policy, trajectories=2)
    d.arrive(act("i", cpu=2, trajectory="t1"), act("j", cpu=2, idempotent=False, trajectory="t2"))
    node_of = {a: d.core.actions[a].node for a in ("i", "j")}
    lost = node_of["i"]
    d.arrive(act("k", cpu=2, idempotent=False, trajectory="t1"))
    out = d(ev.NodeLost(1.0, lost))
    dl = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert "i" not in dl and d.status("i") in (Status.QUEUED, Status.STARTING)
    if node_of["j"] == lost:
        assert dl["j"].status is Status.NODE_LOST
    d.core.validate()
    # the node comes back: the requeued action runs again and counts its attempts
    d(ev.NodeAdded(2.0, cpu_node(lost, cpu=2)))
    other = [a for a in ("j", "k") if a in d.core.actions and d.core.actions[a].node]
    for a in other:
        d.finish(a)
    d.core.validate()
    rec = d.core.actions.get("i")
    if rec is not None and rec.status is Status.STARTING:
        out = d.finish("i")
        assert of(out, cmd.Deliver)[0].result.attempts == 2


def test_node_added_gives_capacity() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="fifo")
    d.arrive(act("a"), act("b"))
    out = d(ev.NodeAdded(1.0, cpu_node("n1", cpu=1)))
    assert starts(out)["b"].node == "n1"


def test_elastic_expansion_keeps_reserve_and_resizes() -> None:
    d = Driver([cpu_node("n0", cpu=10)], policy="tangram", reserve_fraction=0.2)
    out = d.arrive(elastic("e", 1, 16))
    (s,) = of(out, cmd.StartAction)
    assert s.allotment["cpu"] == 8  # started bigger: 10 minus a 20% reserve
    out = d.arrive(elastic("f", 1, 16))
    assert starts(out)["f"].allotment["cpu"] == 1  # only the reserve was left
    out = d.finish("e")
    (rz,) = of(out, cmd.ResizeAction)
    assert rz.action_id == "f" and rz.allotment["cpu"] == 8


def test_fifo_never_expands() -> None:
    d = Driver([cpu_node("n0", cpu=10)], policy="fifo")
    out = d.arrive(elastic("e", 1, 16))
    assert starts(out)["e"].allotment["cpu"] == 1


def test_elastic_spare_goes_to_greatest_marginal_gain() -> None:
    from arl_tangram.core.actions import WorkHints

    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", reserve_fraction=0.0)
    d.arrive(act("hold", cpu=4))
    d.arrive(elastic("par", 1, 2, p=1.0, hints=WorkHints(expected_s=10)),
             elastic("ser", 1, 2, p=0.1, hints=WorkHints(expected_s=10)))
    d.arrive(act("one", cpu=1))
    out = d.finish("hold")  # 4 free: par 1 + ser 1 + one 1, one spare cpu left
    s = starts(out)
    assert s["par"].allotment["cpu"] == 2 and s["ser"].allotment["cpu"] == 1


def test_illegal_transition_carries_story() -> None:
    rec = ActionRecord(act("a"), 0.0, 1)
    rec.move(Status.QUEUED, 0.0, "x")
    with pytest.raises(IllegalTransition) as ei:
        rec.move(Status.PENDING, 1.0, "y")
    assert "PENDING->QUEUED" in str(ei.value)


def test_unknown_event_type_is_an_error() -> None:
    core = Core(ClusterSpec((cpu_node("n0"),)))
    with pytest.raises(TypeError):
        core.handle(ev.Event(0.0))


def test_config_errors_name_field_and_value() -> None:
    with pytest.raises(ValueError, match=r"policy.*'nope'"):
        CoreConfig(policy="nope")
    with pytest.raises(ValueError, match=r"aging_s.*-1"):
        CoreConfig(aging_s=-1)
    with pytest.raises(ValueError, match=r"task_shares\['a'\].*0"):
        CoreConfig(task_shares={"a": 0})
    with pytest.raises(ValueError, match="trajectories"):
        CoreConfig(trajectories=0)
    with pytest.raises(ValueError, match="reserve_fraction"):
        CoreConfig(reserve_fraction=1.0)
    with pytest.raises(ValueError, match=r"aging_min_s: must be <= aging_s \(0\.2\), got 0\.5"):
        CoreConfig(aging_s=0.2)  # (the default aging_min_s, 0.5: the aging rule has no range)
    assert CoreConfig(aging_s=0.5).aging_min_s == 0.5


def test_view_reports_state() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="fifo")
    d.arrive(act("a"), act("b"))
    v = d.core.view()
    assert v.policy == "fifo" and v.queued == 1 and v.counts["STARTING"] == 1
    assert v.nodes[0].free == Resources(memory_mb=8192 - 256)
    d(ev.WarmPoolReport(1.0, "n0", "python", 3))
    assert d.core.view().nodes[0].warm == {"python": 3}


def test_short_actions_are_admitted_by_their_measured_cpu_use() -> None:
    """A trivial action measured at 0.2 core is charged 0.25 of a node (x1.25, in 0.05 steps):
    eight run at once on two cores, each still limited to its one-core quota; a long action,
    an unmeasured kind and a static policy are charged their demand."""
    from arl_tangram.core.actions import WorkHints

    d = Driver([cpu_node("n0", cpu=2)], policy="tangram", short_action_s=1.0)
    for i in range(4):  # four measured runs: 10 ms of CPU over 50 ms
        d.arrive(act(f"w{i}", hints=WorkHints(expected_s=0.05)))
        d.finish(f"w{i}", run_s=0.05, cpu_s=0.01)
    out = d.arrive(*(act(f"a{i}", hints=WorkHints(expected_s=0.05)) for i in range(9)))
    s = starts(out)
    assert sorted(s) == [f"a{i}" for i in range(8)]  # the ninth waits: 8 x 0.25 = 2 cores
    assert all(c.allotment["cpu"] == 1 for c in s.values())  # the quota is the demand
    assert d.core.nodes["n0"].used["cpu"] == pytest.approx(2.0)
    out = d.finish("a0", run_s=0.05, cpu_s=0.01)
    assert "a8" in starts(out)
    assert d.result("a0").allotment["cpu"] == 1  # reported as it ran
    out = d.arrive(act("long", hints=WorkHints(expected_s=30.0)), act("other", tag="rust"))
    assert not starts(out)  # charged a whole core each: no room left
    static = Driver([cpu_node("n0", cpu=2)], policy="static-pool", short_action_s=1.0)
    for i in range(4):
        static.arrive(act(f"w{i}", hints=WorkHints(expected_s=0.05)))
        static.finish(f"w{i}", run_s=0.05, cpu_s=0.01)
    out = static.arrive(*(act(f"a{i}", hints=WorkHints(expected_s=0.05)) for i in range(4)))
    assert len(starts(out)) == 2


def test_actions_of_the_same_work_stay_in_arrival_order_as_the_estimate_drifts() -> None:
    # x1 queues with x's estimate at 4 s; the estimate then falls to 10 ms (the estimator
    # learns), so x2 would rank two octaves lower and overtake x1 -- under sustained load that
    # kept earlier requests waiting until they aged (a p99 of aging_min_s). Same work: FIFO.
    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d.arrive(act("x0", kind=ActionKind.CODE))
    d.at(10.0).finish("x0", run_s=10.0)
    d.arrive(act("blocker", kind=ActionKind.TEST))
    d.arrive(act("x1", kind=ActionKind.CODE))
    est = d.core.estimator
    key, units = est.work_of(d.core.actions["x1"].spec)
    for _ in range(200):
        est.observe_work(key, units, 0.01, 1.0)
    d.arrive(act("x2", kind=ActionKind.CODE))
    assert d.core.actions["x2"].est < d.core.actions["x1"].est / 4
    out = d.at(10.2).finish("blocker")  # (before x2's aging deadline, 0.5 s)
    assert list(starts(out)) == ["x1"]
    # work of another size still goes by its estimate (shortest first)
    d.arrive(act("big", kind=ActionKind.CODE, hints=WorkHints(expected_s=100)),
             act("small", kind=ActionKind.CODE, hints=WorkHints(expected_s=0.001)))
    out = d.at(10.3).finish("x1")
    assert list(starts(out)) == ["small"]
    out = d.at(10.35).finish("small")
    assert list(starts(out)) == ["x2"]
    out = d.at(10.4).finish("x2")
    assert list(starts(out)) == ["big"]
