"""Bound (c) of sim/bounds.py: the least wait for a batch start on m instances whose batches take
alpha or more. Checked against brute force, on hand-computed cases, and as a bound on runs."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.bounds import _window_wait, batch_wait_sum, model_slots
from arl_tangram.sim.runner import run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import get_workload


def _brute(rel: list[float], end: float, m: int) -> float:
    best = float("inf")
    for k in range(min(m, len(rel)) + 1):
        for starts in itertools.combinations(rel, k):
            best = min(best, sum(min([s for s in starts if s >= r], default=end) - r for r in rel))
    return best


def test_window_wait_is_the_least_over_every_choice_of_starts() -> None:
    rng = random.Random(7)
    for _ in range(200):
        rel = sorted(rng.uniform(0.0, 8.0) for _ in range(rng.randint(1, 7)))
        m = rng.randint(1, 4)
        assert _window_wait(np.asarray(rel), 8.0, m) == pytest.approx(_brute(rel, 8.0, m))


def test_hand_computed_waits() -> None:
    # one instance, batches of 8 s, eight actions a second apart: the best single start in the
    # window is at t=3 (waits 3+2+1+0), the other four wait for the window's end (4+3+2+1)
    assert batch_wait_sum([0, 1, 2, 3, 4, 5, 6, 7], 8.0, 1, phases=1) == pytest.approx(16.0)
    # as many instances as actions: nobody waits
    assert batch_wait_sum([0, 1, 2, 3, 4, 5, 6, 7], 8.0, 8) == 0.0
    # two actions together wait nothing on one instance (one batch takes both)
    assert batch_wait_sum([5.0, 5.0], 8.0, 1) == 0.0
    assert batch_wait_sum([], 8.0, 1) == 0.0


def test_slots_count_whole_instances_per_node() -> None:
    judge = ModelSpec(name="j", kind="judge", devices=2, max_instances=8)
    small = ModelSpec(name="s", devices=1, max_instances=3)
    nodes = tuple(NodeSpec(f"g{i}", Resources(cpu=8, gpu=3), pool="gpu") for i in range(2))
    # 3 GPUs hold one 2-GPU instance (not 1.5): two nodes hold 2; the 1-GPU model is capped at 3
    assert model_slots(ClusterSpec(nodes, (judge, small))) == {"j": 2, "s": 3}


@pytest.mark.parametrize("policy", ["tangram", "fifo", "static-pool:max"])
def test_the_bound_stays_below_the_runs_it_bounds(policy: str) -> None:
    w = get_workload("genrm-judge")
    n = 128
    cluster = w.cluster(n)
    report = run_policy(cluster, lambda: w.batches(0, n, 1), policy, workload="genrm-judge",
                        config=SimConfig(train_s=w.train_s))
    b = report.bound
    assert b is not None and b["count"] == report.act["count"]
    assert b["batch_wait_avg"] > 0.0  # arrivals crowd the instances: (c) adds a wait
    assert b["alone_act_avg"] < b["act_avg"] <= report.act["avg"]
