"""The simulator replays trajectories closed-loop and measures what happened (fake scheduler)."""

import pytest

from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.simulator import SimConfig, Simulator, group_by_step
from arl_tangram.sim.trace import SessionDef, SimAction, Trajectory

from .fakes import FakeFifo

CLUSTER = ClusterSpec((NodeSpec("n0", Resources(cpu=2, memory_mb=4096, gpu=1, gpu_memory_mb=2000)),),
                      (ModelSpec("rm", alpha=1.0, beta=0.5, load_s=4.0, memory_mb=1000),))


def code(work, cold=0.0):
    return SimAction(ActionKind.CODE, work, Resources(cpu=1), cold_start_s=cold)


def run(batches, *, train_s=0.0, cluster=CLUSTER, fake=None):
    fake = fake or FakeFifo(cluster)
    sim = Simulator(cluster, fake, SimConfig(train_s=train_s, tick_s=1.0))
    return sim.run(batches), fake


def arrivals(fake):
    return {e.action.id: e.time for e in fake.handled if isinstance(e, E.ActionArrived)}


def test_next_action_arrives_after_delivery_plus_generation():
    traj = Trajectory("t", "x", ((2.0, code(3.0)), (5.0, code(1.0)), (0.5, code(1.0))))
    report, fake = run([[traj]])
    arr = arrivals(fake)
    assert arr == {"t#0": 2.0, "t#1": 2.0 + 3.0 + 5.0, "t#2": 10.0 + 1.0 + 0.5}
    assert report.actions == 3 and report.by_status == {"succeeded": 3}
    assert report.act["avg"] == pytest.approx((3 + 1 + 1) / 3)
    assert report.step_s == (pytest.approx(12.5),)


def test_queueing_shows_in_act_and_rl_steps_have_a_training_phase_without_arrivals():
    batch0 = [Trajectory(f"a{i}", "x", ((1.0, code(4.0)),)) for i in range(3)]  # 3 on 2 cores
    batch1 = [Trajectory("b0", "x", ((1.0, code(1.0)),), rl_step=1)]
    report, fake = run([batch0, batch1], train_s=10.0)
    acts = sorted(r for r in report.act_samples)
    assert acts == [pytest.approx(1.0), pytest.approx(4.0), pytest.approx(4.0), pytest.approx(8.0)]
    assert report.step_s[0] == pytest.approx(9.0 + 10.0)  # rollout ends at 9, then training
    arr = arrivals(fake)
    assert arr["b0#0"] == pytest.approx(19.0 + 1.0)  # the next rollout starts after training
    assert report.step_s[1] == pytest.approx(2.0 + 10.0)
    assert report.makespan_s == pytest.approx(31.0 - 1.0)


def test_sessions_are_requested_once_and_closed_at_trajectory_end():
    sess = {"repo": SessionDef(Resources(memory_mb=1000), cold_start_s=2.0)}
    acts = tuple((1.0, SimAction(ActionKind.TOOL, 1.0, Resources(cpu=1), session="repo")) for _ in range(3))
    report, fake = run([[Trajectory("t", "swe", acts, sessions=sess)]])
    kinds = [type(e).__name__ for e in fake.handled if not isinstance(e, E.Tick)]
    assert kinds.count("SessionRequested") == 1 and kinds.count("SessionClosed") == 1
    assert kinds.index("SessionRequested") < kinds.index("ActionArrived")
    assert kinds[-1] == "SessionClosed"
    # first action waits for the session sandbox (2 s); later ones find it ready
    assert sorted(report.act_samples) == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(3.0)]
    assert report.held_idle["memory_mb"] > 0  # the session's memory held during generation


def test_model_actions_pay_the_load_once_then_batch_latency():
    acts = tuple((1.0, SimAction(ActionKind.REWARD, 0.5, Resources(), model="rm")) for _ in range(2))
    report, _ = run([[Trajectory("t", "rm", acts)]])
    assert sorted(report.act_samples) == [pytest.approx(1.5), pytest.approx(4.0 + 1.5)]
    assert report.act_by_kind["reward"]["count"] == 2
    assert report.utilization["gpu"] > 0


def test_utilization_counts_executing_work_only():
    traj = Trajectory("t", "x", ((10.0, code(10.0, cold=5.0)),))
    report, _ = run([[traj]])
    # makespan: first arrival at 10 -> end at 25 = 15 s, on 2 cores; busy 1 core x 10 s
    assert report.makespan_s == pytest.approx(15.0)
    assert report.utilization["cpu"] == pytest.approx(10.0 / 30.0, rel=0.05)
    assert report.cold_starts == 1


def test_same_input_same_report():
    def batches():
        return [[Trajectory(f"t{i}", "x", ((0.5 * i, code(1.0 + i)),) * 2) for i in range(5)]]

    a, _ = run(batches())
    b, _ = run(batches())
    assert a.as_dict() | {"wall_s": 0} == b.as_dict() | {"wall_s": 0}


def test_group_by_step_orders_batches():
    ts = [Trajectory("a", "x", ((0.0, code(1)),), rl_step=1), Trajectory("b", "x", ((0.0, code(1)),))]
    assert [[t.id for t in b] for b in group_by_step(ts)] == [["b"], ["a"]]


def test_config_validation_names_field_and_value():
    with pytest.raises(ValueError, match=r"tick_s.*-1"):
        SimConfig(tick_s=-1)
    with pytest.raises(ValueError, match="train_s"):
        SimConfig(train_s=float("nan"))
