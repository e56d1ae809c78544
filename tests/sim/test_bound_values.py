"""The optimum's VALUE on hand-computed traces (issue 27, audit B1/B3): not only "below every
policy" (a looser bound always passes that) but exactly what the bound's definition gives --
each action alone at its best allotment (capped by the largest node and the timeout), the step
bound with its generation times, and the SRPT relaxation on a pool's capacity."""

from __future__ import annotations

import warnings

import pytest

from arl_tangram.core.actions import ActionKind, Elasticity, Speedup, Status
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.bounds import Bound, ReleaseLog, bound, table_bound
from arl_tangram.sim.trace import SimAction, Trajectory

MEM = 32768


def _cluster(*cpus: float, models: tuple[ModelSpec, ...] = ()) -> ClusterSpec:
    return ClusterSpec(tuple(NodeSpec(f"n{i}", Resources(cpu=c, memory_mb=MEM))
                             for i, c in enumerate(cpus)), models)


def _elastic(work: float, lo: float, hi: float, p: float, timeout: float = 600.0) -> SimAction:
    return SimAction(ActionKind.TEST, work, Resources(cpu=lo, memory_mb=256),
                     Elasticity(lo, hi, speedup=Speedup(p)), timeout_s=timeout, cold_start_s=0.0)


def _rigid(work: float, cpu: float = 1, timeout: float = 600.0) -> SimAction:
    return SimAction(ActionKind.CODE, work, Resources(cpu=cpu, memory_mb=256), timeout_s=timeout,
                     cold_start_s=0.0)


def _one(act: SimAction, cluster: ClusterSpec) -> float:
    b = bound([[Trajectory("t", "x", ((0.0, act),))]], cluster, train_s=0.0)
    assert b.act["count"] == 1
    return float(b.act["avg"])


def test_an_elastic_action_alone_is_capped_by_the_largest_node() -> None:
    # 8 s of perfectly parallel work (p = 1: s(k) = k), elastic to 8 cores; the largest node
    # has 4: alone it takes 8 / 4 = 2 s, not 8 / 8 = 1 s (no node gives it 8 cores)
    c = _cluster(2, 4)
    assert _one(_elastic(8.0, 1, 8, 1.0), c) == pytest.approx(2.0)
    # with a node of 8 the cap is its own maximum: 1 s; with 16, still 1 s
    assert _one(_elastic(8.0, 1, 8, 1.0), _cluster(8)) == pytest.approx(1.0)
    assert _one(_elastic(8.0, 1, 8, 1.0), _cluster(16, 2)) == pytest.approx(1.0)


def test_each_action_alone_at_its_best_allotment() -> None:
    model = ModelSpec("rm", alpha=0.5)
    c = _cluster(2, 4, models=(model,))
    # Amdahl p = 0.5 on 2 cores: s(2) = 1 / (0.5 + 0.25) = 4/3, so 3 s of work takes 2.25 s
    assert _one(_elastic(3.0, 1, 2, 0.5), c) == pytest.approx(2.25)
    # a rigid action: its work, whatever its demand
    assert _one(_rigid(1.5, cpu=2), c) == pytest.approx(1.5)
    # a reward action: a batch of one on a resident instance, alpha + work
    rm = SimAction(ActionKind.REWARD, 0.25, Resources(), model="rm", cold_start_s=0.0)
    assert _one(rm, c) == pytest.approx(0.75)
    # never past the timeout
    assert _one(_rigid(10.0, timeout=4.0), c) == pytest.approx(4.0)
    # the per-action average of a run of all four: (2.25 + 1.5 + 0.75 + 4) / 4
    trajs = [Trajectory(f"t{i}", "x", ((0.0, a),)) for i, a in
             enumerate([_elastic(3.0, 1, 2, 0.5), _rigid(1.5, cpu=2), rm, _rigid(10.0, timeout=4.0)])]
    b = bound([trajs], c, train_s=0.0)
    assert b.act["count"] == 4 and b.act["avg"] == pytest.approx(8.5 / 4)


def test_the_step_bound_adds_the_generation_times_and_training() -> None:
    c = _cluster(2, 4)
    # trajectory a: starts at 0.5; generates 1 s, runs the 8 s elastic action (2 s at 4 cores),
    # generates 2 s, runs a 1.5 s rigid one: 0.5 + 1 + 2 + 2 + 1.5 = 7 s
    a = Trajectory("a", "x", ((1.0, _elastic(8.0, 1, 8, 1.0)), (2.0, _rigid(1.5))), start=0.5)
    # trajectory b: 4 s of generation, a 1 s action: 5 s
    b = Trajectory("b", "x", ((4.0, _rigid(1.0)),))
    # step 2: only b, started at 3: 8 s
    b2 = Trajectory("b2", "x", ((4.0, _rigid(1.0)),), start=3.0, rl_step=1)
    got = bound([[a, b], [b2]], c, train_s=3.0)
    assert got.step_s == pytest.approx((7.0 + 3.0, 8.0 + 3.0))
    assert got.step_avg_s == pytest.approx(10.5)


def test_the_contention_bound_is_srpt_on_the_pools_capacity() -> None:
    # one 2-core node: a pool of speed 2. Four rigid 1-core actions of 1 s each, released at 0:
    # least core-seconds 1 each, 0.5 s each on the pool; SRPT ends them at 0.5, 1, 1.5, 2:
    # sum 5 s, above the 4 s of each alone, so the bound is 5 s (1.25 s per action).
    log = ReleaseLog(_cluster(2))
    for _ in range(4):
        log.record(_rigid(1.0), Status.SUCCEEDED, submit=0.0, finish=9.0)
    rb = log.bound()
    assert (rb.count, rb.alone_s, rb.srpt_s, rb.bound_s) == (4, pytest.approx(4.0),
                                                             pytest.approx(5.0), pytest.approx(5.0))
    assert rb.act_avg == pytest.approx(1.25)


def test_srpt_serves_a_late_short_action_first_and_charges_rigid_width() -> None:
    # pool of 2 cores. A: rigid 2 cores x 2 s = 4 core-s (2 s on the pool) at 0; B: elastic
    # 1..2, 1 s of work = 1 core-s (0.5 s on the pool) at 1. SRPT: A runs 0..1 (1 s left), B
    # preempts (0.5 < 1) and ends at 1.5 (flow 0.5), A ends at 2.5 (flow 2.5): 3.0 s.
    # Alone: A 2 s, B 1 / s(2) with p = 1: 0.5 s -> 2.5 s. The bound: max(2.5, 3.0) = 3.0 s.
    log = ReleaseLog(_cluster(2))
    log.record(_rigid(2.0, cpu=2), Status.SUCCEEDED, submit=0.0, finish=9.0)
    log.record(_elastic(1.0, 1, 2, 1.0), Status.SUCCEEDED, submit=1.0, finish=9.0)
    rb = log.bound()
    assert rb.alone_s == pytest.approx(2.5)
    assert rb.srpt_s == pytest.approx(3.0)
    assert rb.bound_s == pytest.approx(3.0)
    # a timed-out action counts its timeout, outside the relaxation
    log.record(_rigid(50.0, timeout=7.0), Status.TIMED_OUT, submit=0.0, finish=7.0)
    rb = log.bound()
    assert rb.count == 3 and rb.bound_s == pytest.approx(10.0)


class _Run:
    """A run's report as `table_bound` reads it: its own bound, and whether it stalled."""

    def __init__(self, act_avg: float | None, stalled: bool = False) -> None:
        self.bound = None if act_avg is None else {"act_avg": act_avg}
        self.stalled = stalled


class _BareRun:  # a report without a `stalled` field: a finished run
    bound = {"act_avg": 2.0}


class _NoBoundRun:  # a report without a `bound` field at all
    stalled = False


def test_a_table_is_bounded_by_the_lowest_bound_of_its_finished_runs() -> None:
    opt = Bound({"count": 2, "avg": 3.0, "p50": 3.0, "p99": 3.0}, (5.0, 7.0))
    runs = {"a": _Run(4.0), "b": _Run(3.5), "stalled": _Run(1.0, stalled=True),
            "none": _Run(None), "nobound": _NoBoundRun()}
    # the lowest of the finished runs' own bounds, and whose; a stalled run never lowers it
    assert table_bound(opt, runs) == (3.5, "b")
    assert table_bound(opt, {**runs, "bare": _BareRun()}) == (2.0, "bare")
    # no finished run with a bound: each action alone (the per-action average)
    assert table_bound(opt, {k: runs[k] for k in ("stalled", "none", "nobound")}) == (3.0, None)
    assert table_bound(opt, {}) == (3.0, None)


def test_the_bounds_report_their_values_under_their_names() -> None:
    opt = Bound({"count": 2, "avg": 3.0, "p50": 3.0, "p99": 3.5}, (5.0, 7.0))
    assert opt.as_dict() == {"act": {"count": 2, "avg": 3.0, "p50": 3.0, "p99": 3.5},
                             "step_s": [5.0, 7.0], "step_avg_s": 6.0}
    assert Bound({"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0}, ()).step_avg_s == 0.0
    log = ReleaseLog(_cluster(2))
    for _ in range(4):
        log.record(_rigid(1.0), Status.SUCCEEDED, submit=0.0, finish=9.0)
    d = log.bound().as_dict()
    assert d["count"] == 4
    assert d["act_avg"] == pytest.approx(1.25)
    assert d["alone_act_avg"] == pytest.approx(1.0)
    assert d["srpt_act_avg"] == pytest.approx(1.25)
    assert d["batch_wait_avg"] == 0.0  # no model actions
    empty = ReleaseLog(_cluster(2)).bound()
    assert empty.count == 0 and empty.act_avg == 0.0 and empty.as_dict()["alone_act_avg"] == 0.0


def test_the_per_action_summary_and_short_steps() -> None:
    c = _cluster(4)
    # five rigid actions of 1..5 s, one per trajectory: avg 3, p50 3, p99 4.96 (linear between
    # the 4th and 5th of five sorted values: 4 + 0.96 x 1)
    trajs = [Trajectory(f"t{i}", "x", ((0.0, _rigid(float(w))),)) for i, w in enumerate(range(1, 6))]
    b = bound([trajs], c, train_s=0.0)
    assert b.act == pytest.approx({"count": 5, "avg": 3.0, "p50": 3.0, "p99": 4.96})
    # a step shorter than a second: its own length (0.25 s of generation + 0.5 s), nothing more
    short = Trajectory("s", "x", ((0.25, _rigid(0.5)),))
    assert bound([[short]], c, train_s=0.0).step_s == pytest.approx((0.75,))
    # no action at all: zeros, and no step
    none = bound([], c, train_s=1.0)
    assert none.act == {"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0} and none.step_s == ()


def test_each_action_charges_its_least_core_or_gpu_seconds() -> None:
    from arl_tangram.sim.bounds import cpu_charge, gpu_charge

    # elastic along cpu: its work at one core, whatever its minimum (not min x work)
    wide = _elastic(3.0, 2, 4, 0.9)
    assert cpu_charge(wide) == pytest.approx(3.0)
    assert cpu_charge(wide, {"cpu": 4}) == pytest.approx(3.0)
    # elastic along another dimension: its CPU does not set its speed
    other = SimAction(ActionKind.CUSTOM, 3.0, Resources(cpu=1, memory_mb=256, gpu=1),
                      Elasticity(1, 2, dim="gpu"), cold_start_s=0.0)
    assert cpu_charge(other) == 0.0
    # rigid: demand x work; no CPU demand: nothing; an allotment without a CPU entry: demand
    assert cpu_charge(_rigid(2.0, cpu=2)) == pytest.approx(4.0)
    assert cpu_charge(_rigid(2.0, cpu=2), {"memory_mb": 256}) == pytest.approx(4.0)
    assert cpu_charge(_rigid(2.0, cpu=2), {"cpu": 2}) == pytest.approx(4.0)
    no_cpu = SimAction(ActionKind.CODE, 2.0, Resources(memory_mb=256), cold_start_s=0.0)
    assert cpu_charge(no_cpu) == 0.0 and cpu_charge(no_cpu, {"cpu": 0.5}) == 0.0
    # started on no CPU at all: it held none
    assert cpu_charge(_rigid(2.0, cpu=2), {"cpu": 0.0}) == 0.0
    # GPU: devices x (alpha / max_batch + work) for a known model; nothing otherwise
    c = _cluster(2, models=(ModelSpec("rm", alpha=0.5, max_batch=10, devices=2),))
    rm = SimAction(ActionKind.REWARD, 0.25, Resources(), model="rm", cold_start_s=0.0)
    assert gpu_charge(rm, c) == pytest.approx(2 * (0.05 + 0.25))
    ghost = SimAction(ActionKind.REWARD, 0.25, Resources(), model="nope", cold_start_s=0.0)
    assert gpu_charge(ghost, c) == 0.0 and gpu_charge(_rigid(1.0), c) == 0.0


def test_srpt_preempts_a_job_that_started_after_an_idle_gap() -> None:
    from arl_tangram.sim.bounds import srpt_flow_sum

    # 1 s at 0 (done at 1); idle; 3 s at 2, preempted at 3 by 1 s (done at 4), resumes, done
    # at 6: flows 1 + 1 + 4
    assert srpt_flow_sum([(0.0, 1.0), (2.0, 3.0), (3.0, 1.0)]) == pytest.approx(6.0)


def test_a_failed_action_counts_its_work_unless_told_it_never_ran() -> None:
    log = ReleaseLog(_cluster(2))
    log.record(_rigid(2.0), Status.FAILED, submit=0.0, finish=2.0)  # (ran by default)
    log.record(_rigid(3.0), Status.FAILED, submit=0.0, finish=0.1, ran=False)
    rb = log.bound()
    assert rb.count == 2 and rb.alone_s == pytest.approx(2.0)


def test_batch_starts_bound_by_hand() -> None:
    from arl_tangram.sim.bounds import batch_wait_sum

    # one instance, batches of alpha = 1 s: releases at 0 and 0.5 share a window of 1 s, where
    # one start serves only one of them at once: the other waits 0.5 s; two instances: none
    assert batch_wait_sum([0.0, 0.5], 1.0, 1) == pytest.approx(0.5)
    assert batch_wait_sum([0.0, 0.5], 1.0, 2) == 0.0
    # three releases 0.25 apart: one start (at 0.5) makes the first two wait 0.5 + 0.25; with
    # two starts only one of them waits 0.25
    assert batch_wait_sum([0.5, 0.0, 0.25], 1.0, 1) == pytest.approx(0.75)
    assert batch_wait_sum([0.0, 0.25, 0.5], 1.0, 2) == pytest.approx(0.25)
    assert batch_wait_sum([3.0, 3.5], 1.0, 1) == pytest.approx(0.5)  # only differences count
    assert batch_wait_sum([], 1.0, 1) == 0.0
    assert batch_wait_sum([0.0, 0.5], 1.0, 0) == 0.0
    with warnings.catch_warnings():  # no batch time: no wait, computed without a 0/0
        warnings.simplefilter("error")
        assert batch_wait_sum([0.0, 0.5], 0.0, 1) == 0.0
        assert batch_wait_sum([0.0, 0.25, 0.5], 0.0, 1) == 0.0


def test_batch_starts_bound_takes_the_best_of_eight_window_phases() -> None:
    from arl_tangram.sim.bounds import batch_wait_sum

    # releases 0, 0.75, 1.25, alpha = 1 s, one instance; windows of 1 s start at -theta + k,
    # theta = p/8 of alpha (the grid through the first release, shifted back p/8):
    # theta = 0:   [0, 1) holds 0 and 0.75: one start serves one, the other waits
    #              min(0.75, 1 - 0.75) = 0.25; [1, 2) holds 1.25 alone: 0          -> 0.25
    # theta = 1/8: [-1/8, 7/8) holds 0 and 0.75: min(0.75, 7/8 - 0.75) = 0.125     -> 0.125
    # theta = 2/8: 0 alone; [3/4, 7/4) holds 0.75 and 1.25: min(0.5, 7/4 - 1.25)  -> 0.5
    # theta = 3/8..5/8: the same pair, min(0.5, 2 - theta - 1.25) = 0.375, 0.25, 0.125
    # theta = 6/8, 7/8: each release alone                                         -> 0
    assert batch_wait_sum([0.0, 0.75, 1.25], 1.0, 1) == pytest.approx(0.5)
    # one phase: only the grid through the first release
    assert batch_wait_sum([0.0, 0.75, 1.25], 1.0, 1, phases=1) == pytest.approx(0.25)
    # only the differences count: the same releases 10 s later (and scaled by alpha = 2 s)
    assert batch_wait_sum([10.0, 10.75, 11.25], 1.0, 1) == pytest.approx(0.5)
    assert batch_wait_sum([0.0, 1.5, 2.5], 2.0, 1) == pytest.approx(1.0)


def test_a_run_bound_adds_each_models_batch_wait() -> None:
    gpu = NodeSpec("g", Resources(cpu=4, memory_mb=MEM, gpu=1, gpu_memory_mb=16000))
    models = (ModelSpec("a", alpha=1.0, max_batch=8), ModelSpec("b", alpha=1.0, max_batch=8))
    log = ReleaseLog(ClusterSpec((gpu,), models))
    for name in ("a", "b"):
        for t in (0.0, 0.5):
            log.record(SimAction(ActionKind.REWARD, 0.0, Resources(), model=name,
                                 cold_start_s=0.0), Status.SUCCEEDED, submit=t, finish=5.0)
    rb = log.bound()
    # one slot per model (1 GPU, 1 device each): 0.5 s of wait for each model's pair
    assert rb.wait_s == pytest.approx(1.0)
    assert rb.as_dict()["batch_wait_avg"] == pytest.approx(0.25)
    # each alone: alpha + work = 1 s; with the waits: 4 + 1 = 5 s
    assert rb.alone_s == pytest.approx(4.0) and rb.bound_s == pytest.approx(5.0)


def test_action_bound_edges() -> None:
    c = _cluster(2, 4)
    # a reward action naming a model the cluster does not serve: its work alone
    ghost = SimAction(ActionKind.REWARD, 0.25, Resources(), model="nope", cold_start_s=0.0)
    assert _one(ghost, c) == pytest.approx(0.25)
    # elastic along a dimension no node has: its maximum (nothing caps it)
    other = SimAction(ActionKind.CUSTOM, 4.0, Resources(cpu=1, memory_mb=256, gpu=1),
                      Elasticity(1, 2, dim="gpu", speedup=Speedup(1.0)), cold_start_s=0.0)
    assert _one(other, c) == pytest.approx(2.0)
    # a timeout under a second caps too; a timeout of 0 means none
    assert _one(_rigid(2.0, timeout=0.5), c) == pytest.approx(0.5)
    assert _one(_rigid(2.0, timeout=0.0), c) == pytest.approx(2.0)
    # a node smaller than one core: an elastic action from a quarter core runs at half a core
    # there (linear below one unit): 2 s of work take 4 s
    small = _cluster(0.5)
    assert _one(_elastic(2.0, 0.25, 4, 1.0), small) == pytest.approx(4.0)


def test_the_gpu_pools_contention_and_a_cluster_without_gpus() -> None:
    # one GPU, batches of one: four 1 s reward actions at once queue behind each other:
    # SRPT flows 1.01 x (1 + 2 + 3 + 4) = 10.1 s, above alone (4 x 1.01 s)
    gpu = NodeSpec("g", Resources(cpu=4, memory_mb=MEM, gpu=1, gpu_memory_mb=16000))
    c = ClusterSpec((gpu,), (ModelSpec("rm", alpha=0.01, max_batch=1),))
    log = ReleaseLog(c)
    for _ in range(4):
        log.record(SimAction(ActionKind.REWARD, 1.0, Resources(), model="rm", cold_start_s=0.0),
                   Status.SUCCEEDED, submit=0.0, finish=9.0)
    rb = log.bound()
    assert rb.alone_s == pytest.approx(4.04) and rb.srpt_s == pytest.approx(10.1)
    assert rb.bound_s == pytest.approx(10.1)
    # reward actions recorded on a cluster without GPUs: each alone, no contention term
    cpu_only = ReleaseLog(_cluster(2, models=(ModelSpec("rm", alpha=0.5),)))
    cpu_only.record(SimAction(ActionKind.REWARD, 1.0, Resources(), model="rm", cold_start_s=0.0),
                    Status.SUCCEEDED, submit=0.0, finish=9.0)
    assert cpu_only.bound().bound_s == pytest.approx(1.5)
