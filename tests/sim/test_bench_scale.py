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


def test_spread_runs_each_larger_count_on_more_smaller_nodes_at_the_first_counts_load_per_node(
        capsys: pytest.CaptureFixture[str]) -> None:
    bs = load_benchmark("bench_scale")
    argv = ["--nodes", "1", "--trajectories", "8,24", "--no-memory", "--spread", "--same-contention",
            "--node-scale", "0.5", "--json"]
    assert bs.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    got = [(r["trajectories"], r["nodes"], r["node_cpu"], r.get("spread_of"), r.get("same_contention_of"))
           for r in rows]
    # 24 on 1 x 96 cores: spread over 3 nodes of 32 cores (8 a node, as the first count's, at
    # 24's trajectories per core), then the first count on 1 x 32 (same contention)
    assert got == [(8, 1, 96, None, None), (24, 1, 96, None, None), (24, 3, 32, 1, None),
                   (8, 1, 32, None, 24)]
    first, crowded, spread, peer = rows
    assert crowded["sim_actions_ratio_to_spread"] == crowded["sim_actions_per_s"] / spread["sim_actions_per_s"]
    assert crowded["sim_actions_ratio_to_same_contention"] == (
        crowded["sim_actions_per_s"] / peer["sim_actions_per_s"])
    assert spread["actions"] == crowded["actions"]  # (the same step's actions, spread)
    assert "sim_actions_ratio_to_spread" not in first and "sim_actions_ratio_to_spread" not in spread


def test_repeats_run_every_configuration_in_interleaved_passes_and_keep_each_ones_best(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bs = load_benchmark("bench_scale")
    order: list[tuple[int, float, bool]] = []
    speed = iter([10.0, 30.0, 20.0,  # pass 1: first, crowded, peer (simulate actions/s)
                  12.0, 24.0, 40.0])  # pass 2

    def fake(workload, nodes, trajectories, *, memory, session_mb=None, scale=1.0, max_wall=None):
        order.append((trajectories, scale, memory))
        s = next(speed)
        return {"workload": workload, "nodes": nodes, "trajectories": trajectories, "scale": scale,
                "node_cpu": 192 * scale, "actions": 1, "sim_wall_s": 1.0, "sim_actions_per_s": s,
                "sim_actions_per_cpu_s": s, "sim_own_s": 0.5, "core_decisions_per_s": 100.0 - s,
                "core_p50_us": s, "core_p99_us": 2 * s}

    monkeypatch.setattr(bs, "run_one", fake)
    argv = ["--nodes", "1", "--trajectories", "8,24", "--same-contention", "--repeats", "2",
            "--json"]
    assert bs.main(argv) == 0
    # all three, then all three again; the memory pass only in the first
    assert order == [(8, 1.0, True), (24, 1.0, True), (8, 1 / 3, False),
                     (8, 1.0, False), (24, 1.0, False), (8, 1 / 3, False)]
    first, crowded, peer = json.loads(capsys.readouterr().out)["rows"]
    assert [r["sim_actions_per_s"] for r in (first, crowded, peer)] == [12.0, 30.0, 40.0]
    # each run's core replay is its own best: the slower simulate's, where it was faster
    assert [(r["core_decisions_per_s"], r["core_p99_us"]) for r in (first, crowded, peer)] == [
        (90.0, 20.0), (76.0, 48.0), (80.0, 40.0)]
    assert crowded["sim_actions_ratio_to_same_contention"] == 30.0 / 40.0
    assert (first["sim_actions_ratio_to_first"], crowded["sim_actions_ratio_to_first"],
            peer["sim_actions_ratio_to_first"]) == (1.0, 30.0 / 12.0, 40.0 / 12.0)
    assert peer["same_contention_of"] == 24 and {r["repeats"] for r in (first, crowded, peer)} == {2}
    with pytest.raises(SystemExit):
        bs.main(["--repeats", "0"])


def test_max_wall_cuts_a_run_and_reports_the_events_it_got_to() -> None:
    bs = load_benchmark("bench_scale")
    whole = bs.run_one("swe-agent", 1, 8, memory=False, scale=0.5)
    assert whole["cut_at_s"] is None
    assert whole["events"] > 100
    cut = bs.run_one("swe-agent", 1, 8, memory=False, scale=0.5, max_wall=0.0)
    # past its deadline from the start: the first event is handled, the second raises `Cut`
    assert cut["events"] == 1
    assert cut["cut_at_s"] is not None and cut["cut_at_s"] >= 0.0
    assert cut["actions"] == 0  # (nothing finished in one event)
    longer = bs.run_one("swe-agent", 1, 8, memory=False, scale=0.5, max_wall=3600.0)
    assert (longer["cut_at_s"], longer["events"], longer["actions"]) == (
        None, whole["events"], whole["actions"])


def test_a_cut_row_counts_the_actions_finished_in_its_events(monkeypatch: pytest.MonkeyPatch) -> None:
    bs = load_benchmark("bench_scale")
    from arl_tangram.core.events import ActionFinished
    handle = bs.Recorder.handle
    kept: list[object] = []

    def cut_at_300(self, event):  # the deadline, met at a known event
        if len(self.events) == 300:
            kept.extend(self.events)
            raise bs.Cut
        return handle(self, event)

    monkeypatch.setattr(bs.Recorder, "handle", cut_at_300)
    row = bs.run_one("swe-agent", 1, 8, memory=False, scale=0.5)
    finished = sum(type(e) is ActionFinished for e in kept)
    assert finished > 0
    assert (row["events"], row["actions"]) == (300, finished)
    assert row["cut_at_s"] == row["sim_wall_s"]


def test_the_recorder_raises_cut_past_its_deadline_and_keeps_that_event_out() -> None:
    bs = load_benchmark("bench_scale")
    rec = bs.Recorder(core=None, deadline=-1.0)
    rec.events.append(object())
    with pytest.raises(bs.Cut):
        rec.handle(object())
    assert len(rec.events) == 1  # (the event that found the deadline passed is not kept)
