"""The bound under contention (issue 22, item 5): the larger of each action alone and a
preemptive shortest-remaining-first relaxation on each pool's capacity, on a run's own release
times; hand-computed values, timeouts, CFS bursts, and never above any policy's measured ACT."""

from __future__ import annotations

import json

import pytest

from arl_tangram.cli.main import main
from arl_tangram.core.actions import ActionKind, Elasticity, Speedup, Status
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.bounds import ReleaseLog, cpu_charge, gpu_charge, srpt_flow_sum
from arl_tangram.sim.runner import compare, policies, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import SimAction, Trajectory
from arl_tangram.sim.workloads import WORKLOADS, cpu_nodes, get_workload, with_load

CFG = SimConfig(train_s=1.0)


def _cluster(cpu: float, nodes: int = 1) -> ClusterSpec:
    return ClusterSpec(tuple(NodeSpec(f"n{i}", Resources(cpu=cpu, memory_mb=32768)) for i in range(nodes)))


def _test(work: float, hi: float = 2, p: float = 0.9, timeout: float = 600.0) -> SimAction:
    return SimAction(ActionKind.TEST, work, Resources(cpu=1, memory_mb=256),
                     Elasticity(1, hi, speedup=Speedup(p)), timeout_s=timeout, cold_start_s=0.0)


def _together(*acts: SimAction) -> list[list[Trajectory]]:
    return [[Trajectory(f"t{i}", "x", ((1.0, a),)) for i, a in enumerate(acts)]]


def test_srpt_runs_the_shortest_remaining_first_and_preempts_on_release():
    assert srpt_flow_sum([]) == 0.0
    assert srpt_flow_sum([(0.0, 1.0), (0.0, 1.0)]) == 3.0  # 1 + 2
    # a 3 s job at 0, a 1 s job at 1: the short one preempts (done at 2), the long one at 4
    assert srpt_flow_sum([(1.0, 1.0), (0.0, 3.0)]) == 5.0
    # a 1 s job at 5 after an idle gap: flow 1, whatever came before
    assert srpt_flow_sum([(0.0, 2.0), (5.0, 1.0)]) == 3.0


def test_two_equal_elastic_tests_on_two_cores():
    # W = 2 s of work at one core each, 1..2 cores, Amdahl p = 0.9, both submitted at 1 s:
    # alone each takes W / s(2) = 0.55 W; on one machine of speed 2 each costs its least
    # core-seconds, W (at one core), so SRPT ends them at W/2 and W: the bound is 0.75 W = 1.5,
    # above "alone" (1.1) and below the best schedule (one after another at 2 cores: 1.65).
    batches = _together(_test(2.0), _test(2.0))
    for p in ("tangram", "fifo", "static-pool:1", "static-pool:2"):
        r = run_policy(_cluster(2), lambda: batches, p, config=CFG)
        assert r.bound["act_avg"] == pytest.approx(1.5), p
        assert r.bound["alone_act_avg"] == pytest.approx(1.1)
        assert r.act["avg"] >= r.bound["act_avg"] - 1e-12
    best = run_policy(_cluster(2), lambda: batches, "static-pool:2", config=CFG)
    assert best.act["avg"] == pytest.approx(1.65)


def test_a_rigid_and_an_elastic_action_on_two_cores():
    # a rigid action of 2 cores x 1 s (2 core-s) and an elastic test of W = 2 (2 core-s at its
    # cheapest, one core): sizes 1 and 1 on speed 2, SRPT flows 1 and 2,
    # bound 1.5; alone 1 and 1.1 (1.05). Charging the rigid one its work alone (1 core-s) would
    # give 1.0; the best schedule (rigid, then the test at 2 cores) reaches 1.55.
    rigid = SimAction(ActionKind.TOOL, 1.0, Resources(cpu=2, memory_mb=256), cold_start_s=0.0)
    batches = _together(rigid, _test(2.0))
    for p in ("tangram", "fifo", "static-pool:2"):
        r = run_policy(_cluster(2), lambda: batches, p, config=CFG)
        assert r.bound["act_avg"] == pytest.approx(1.5), p
        assert r.bound["alone_act_avg"] == pytest.approx(1.05)
        assert r.act["avg"] >= 1.5 - 1e-12


def test_charges_are_the_least_resource_seconds():
    assert cpu_charge(_test(2.0, hi=8)) == 2.0  # elastic: its work at one core
    rigid = SimAction(ActionKind.CODE, 3.0, Resources(cpu=2))
    assert cpu_charge(rigid) == 6.0
    # on a half of its demand it runs at 0.5 after its first CFS periods (0.1 s at full speed):
    # 0.1 + 2.9 / 0.5 = 5.9 s on 1 core
    assert cpu_charge(rigid, Resources(cpu=1)) == pytest.approx(5.9)
    model = ModelSpec("m", devices=2, alpha=8.0, beta=0.1, max_batch=64)
    cl = ClusterSpec((NodeSpec("g", Resources(cpu=16, gpu=2)),), (model,))
    judge = SimAction(ActionKind.JUDGE, 0.1, Resources(), model="m")
    assert gpu_charge(judge, cl) == pytest.approx(2 * (8.0 / 64 + 0.1))


def test_a_timed_out_action_counts_its_timeout_not_its_work():
    # 64 tests of 10 s (elastic 1..8), timeout 6 s, all at once on 8 cores. At one core each
    # times out after 6 s: ACT 6, 12, ..., 48 (27 on average). Charging their whole work to the
    # relaxation (10 core-s each) would claim 40.6, above what the run did.
    batches = _together(*(_test(10.0, hi=8, timeout=6.0) for _ in range(64)))
    r = run_policy(_cluster(8), lambda: batches, "static-pool:1", config=CFG)
    assert r.by_status == {"timed_out": 64}
    assert r.act["avg"] == pytest.approx(27.0)
    assert r.bound["act_avg"] == pytest.approx(6.0)
    log = ReleaseLog(_cluster(8))
    log.record(_test(10.0, hi=8, timeout=6.0), Status.TIMED_OUT, 0.0, 30.0)
    log.record(_test(10.0, hi=8), Status.FAILED, 0.0, 0.1, ran=False)  # never ran: nothing
    log.record(_test(10.0, hi=8), Status.REJECTED, 0.0, 0.0)  # not in ACT: not counted
    b = log.bound()
    assert (b.count, b.bound_s) == (2, 6.0)


def test_a_short_action_on_a_fractional_slice_is_charged_what_its_slice_held():
    # trajectory-bound gives each of 4 trajectories a quarter of one core; a 0.04 s action
    # runs within its first CFS periods' quota at full speed (0.04 s, `cfs_speed`): the slice
    # held 0.01 core-s, so the relaxation charges that, not 0.04 (which would claim 0.1 on
    # average, above the 0.04 the run measured)
    act = SimAction(ActionKind.CODE, 0.04, Resources(cpu=1, memory_mb=256), cold_start_s=0.0)
    batches = _together(act, act, act, act)
    r = run_policy(_cluster(1), lambda: batches, "trajectory-bound", config=CFG)
    assert r.act["avg"] == pytest.approx(0.04)
    assert r.bound["act_avg"] == pytest.approx(0.04)  # each alone: the larger here
    assert r.bound["srpt_act_avg"] == pytest.approx(0.025)


def _cases() -> list[tuple[str, int, float, ClusterSpec | None]]:
    out: list[tuple[str, int, float, ClusterSpec | None]] = [
        (w, s, 4.0, None) for w in WORKLOADS for s in (0, 1)]
    out += [(w, 0, 8.0, ClusterSpec(tuple(cpu_nodes("cpu", 16))))
            for w in ("code-rl", "swe-agent", "tool-math", "humaneval-tests")]
    return out


@pytest.mark.parametrize(("name", "seed", "load", "cluster"), _cases())
def test_the_bound_never_exceeds_a_policys_measured_act(name, seed, load, cluster):
    w = get_workload(name)
    n = 16
    batches = with_load(lambda: w.batches(seed, n, 1), load)
    reports = compare(cluster or w.cluster(n), batches, seed=seed, config=SimConfig(train_s=w.train_s))
    assert set(reports) == set(policies())
    for p, r in reports.items():
        if r.stalled:
            continue
        assert r.bound["count"] == r.act["count"], p
        assert 0.0 < r.bound["act_avg"] <= r.act["avg"] * (1 + 1e-9), p
        assert r.bound["act_avg"] >= r.bound["alone_act_avg"] - 1e-12
        assert r.bound["act_avg"] >= r.bound["srpt_act_avg"] - 1e-12


def test_cli_shows_each_runs_bound_and_the_tables(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rows = [{"id": f"t{i}", "steps": [[1, {"kind": "test", "work_s": 2, "demand": {"cpu": 1},
                                           "elasticity": {"min": 1, "max": 2, "parallel_fraction": 0.9},
                                           "cold_start_s": 0}]]} for i in range(2)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: n\n    capacity: {cpu: 2, memory_mb: 8000}\n")
    args = ["simulate", "--trace", str(trace), "--cluster", str(cluster), "--compare"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"]["act_avg"] == pytest.approx(1.5)  # the lowest of the runs' bounds
    assert out["bound"]["alone_act_avg"] == pytest.approx(1.1)
    assert out["bound"]["act"]["avg"] == pytest.approx(1.1)  # each action alone, as before
    assert out["reports"]["tangram"]["bound"]["act_avg"] == pytest.approx(1.5)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "bound s" in text and "shortest-remaining-first" in text
