"""`benchmarks/bench_scale.py`'s clusters and its comparison rows: the node sizes it builds
(``--node-scale``) and the peer run ``--same-contention`` sets beside each larger count (the
first count on nodes scaled down to the larger count's trajectories per core)."""

from __future__ import annotations

import json

import pytest

from .benchmark_module import load_benchmark


def test_cluster_for_scales_cores_and_memory_of_every_cpu_node() -> None:
    bs = load_benchmark("bench_scale")
    plain = bs.cluster_for("swe-agent", 3, 10)
    third = bs.cluster_for("swe-agent", 3, 10, 1 / 3)
    cpu = [n for n in plain.nodes if n.pool == "cpu"]
    assert [n.name for n in cpu] == ["cpu-0", "cpu-1", "cpu-2"]
    assert {(n.capacity.get("cpu"), n.capacity.get("memory_mb")) for n in cpu} == {(192, 786_432)}
    assert {(n.capacity.get("cpu"), n.capacity.get("memory_mb"))
            for n in third.nodes if n.pool == "cpu"} == {(64, 262_144)}


def test_same_contention_runs_the_first_count_at_each_larger_counts_cores_per_trajectory(
        capsys: pytest.CaptureFixture[str]) -> None:
    bs = load_benchmark("bench_scale")
    argv = ["--nodes", "1", "--trajectories", "8,24", "--no-memory", "--same-contention",
            "--node-scale", "0.5", "--json"]
    assert bs.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    got = [(r["trajectories"], r["node_cpu"], r.get("same_contention_of")) for r in rows]
    assert got == [(8, 96, None), (24, 96, None), (8, 32, 24)]  # 24 on 96 cores ~ 8 on 32
    first, crowded, peer = rows
    assert crowded["sim_actions_ratio_to_same_contention"] == (
        crowded["sim_actions_per_s"] / peer["sim_actions_per_s"])
    assert peer["sim_actions_ratio_to_first"] == peer["sim_actions_per_s"] / first["sim_actions_per_s"]
    assert "sim_actions_ratio_to_same_contention" not in first
