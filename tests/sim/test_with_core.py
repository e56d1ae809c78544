"""The simulator driving the real core: every policy, every action delivered exactly once."""

import json

import pytest

from arl_tangram.cli.main import main
from arl_tangram.core.config import POLICIES
from arl_tangram.sim.runner import (
    compare,
    make_core,
    measured_task_shares,
    policies,
    ratios,
    run_policy,
    savings,
)
from arl_tangram.sim.simulator import SimConfig, Simulator
from arl_tangram.sim.workloads import get_workload

W = get_workload("mixed")
CLUSTER = W.cluster(16)


def batches():
    return W.batches(5, 16, 2)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_action_is_delivered_once_and_the_core_stays_valid(policy):
    expected = sum(len(t.steps) for b in batches() for t in b)
    first = next(iter(batches()))
    core = make_core(CLUSTER, policy, 16, measured_task_shares(first, CLUSTER))
    report = Simulator(CLUSTER, core, SimConfig(train_s=30.0)).run(batches())
    core.validate()
    assert not report.stalled
    assert report.actions == expected
    assert sum(report.by_status.values()) == expected
    assert len(report.step_s) == 2 and all(s > 30.0 for s in report.step_s)
    assert 0 < report.utilization["cpu"] <= 1 and 0 <= report.held_idle["cpu"] <= 1
    assert core.view().counts.get("running", 0) == 0


def test_compare_runs_the_same_trajectories_under_every_policy():
    reports = compare(CLUSTER, batches, config=SimConfig(train_s=30.0))
    assert list(reports) == list(policies())
    assert {p.partition(":")[0] for p in reports} == set(POLICIES)
    assert len({r.actions for r in reports.values()}) == 1
    r = ratios(reports)
    assert set(r) == set(policies()) - {"tangram"}
    for name, rr in r.items():
        assert rr["act_avg"] == pytest.approx(reports[name].act["avg"] / reports["tangram"].act["avg"])


def test_savings_finds_a_cluster_no_larger_that_matches_the_target():
    w = get_workload("code-rl")
    cl = w.cluster(32)
    b = lambda: w.batches(0, 32, 1)  # noqa: E731
    base = run_policy(cl, b, "trajectory-bound", config=SimConfig(train_s=10.0))
    s = savings(cl, b, base, config=SimConfig(train_s=10.0), iterations=3)
    assert s.baseline == "trajectory-bound" and s.tried
    if s.scale is not None:
        assert 0 < s.scale <= 1
        assert s.achieved["act_avg"] <= s.target["act_avg"] * (1 + 1e-9)
        assert s.achieved["step_avg_s"] <= s.target["step_avg_s"] * (1 + 1e-9)
        assert s.saving["cpu"] == pytest.approx(1 - s.nodes["cpu"][0] / s.nodes["cpu"][1])


def test_cli_json_has_stable_keys_and_plot_is_written(tmp_path, capsys):
    png = tmp_path / "out.png"
    rc = main(["simulate", "--workload", "tool-math", "--trajectories", "8", "--steps", "1",
               "--compare", "--json", "--plot", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"workload", "seed", "train_s", "load", "bound", "reports", "ratios",
                        "best_static"}
    assert out["best_static"].startswith("static-pool:")
    assert set(out["bound"]) == {"act", "step_s", "step_avg_s", "act_avg", "alone_act_avg", "of"}
    assert out["bound"]["act_avg"] == min(r["bound"]["act_avg"] for r in out["reports"].values())
    rep = out["reports"]["tangram"]
    assert set(rep) == {"policy", "workload", "seed", "actions", "by_status", "act", "act_by_kind",
                        "act_by_task", "queue_avg_s", "step_s", "step_avg_s", "makespan_s",
                        "utilization", "held_idle", "capacity", "cold_starts", "warm_starts",
                        "stalled", "stall", "setup_s", "wall_s", "events", "bound"}
    assert set(rep["bound"]) == {"count", "act_avg", "alone_act_avg", "srpt_act_avg",
                                 "batch_wait_avg", "engine_act_avg"}
    assert set(rep["act"]) == {"count", "avg", "p50", "p99"}
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_cli_trace_errors_exit_2_naming_file_line_field(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: n\n    capacity: {cpu: 4}\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "steps": [[1, {"kind": "code", "work_s": 1}]]}\n'
                     '{"id": "b", "steps": [[1, {"kind": "code", "work_s": -2}]]}\n')
    assert main(["simulate", "--trace", str(trace), "--cluster", str(cluster)]) == 2
    assert f"{trace}:2: steps[0][1].work_s: must be >= 0" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert "--cluster" in capsys.readouterr().err
    cluster.write_text("nodes:\n  - name: n\n    capacity: {cpu: -4}\n")
    assert main(["simulate", "--trace", str(trace), "--cluster", str(cluster)]) == 2
    assert f"{cluster}:2: nodes[0]" in capsys.readouterr().err


def test_cli_trace_runs(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: n\n    count: 2\n    capacity: {cpu: 4, memory_mb: 4096}\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "steps": [[1, {"kind": "code", "work_s": 1}], [2, {"kind": "code", "work_s": 3}]]}\n'
                     '{"id": "b", "step": 1, "steps": [[1, {"kind": "code", "work_s": 2}]]}\n')
    assert main(["simulate", "--trace", str(trace), "--cluster", str(cluster), "--json",
                 "--policy", "fifo"]) == 0
    rep = json.loads(capsys.readouterr().out)["reports"]["fifo"]
    assert rep["actions"] == 3 and len(rep["step_s"]) == 2


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["serve", "--help"], ["demo", "--help"]])
def test_every_help_works(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "usage: tangram" in capsys.readouterr().out
