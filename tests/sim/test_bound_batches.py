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


def _brute_together(rel: list[float], works: list[float], end: float, m: int) -> float:
    """Every choice of at most m starts and of a start (at or after its release) or none for
    each action; a start serving n actions costs them (n - 1) x the n smallest works."""
    small = sorted(works)
    best = float("inf")
    for k in range(min(m, len(rel)) + 1):
        for starts in itertools.combinations(rel, k):
            choices = [[s for s in starts if s >= r] + [None] for r in rel]
            for pick in itertools.product(*choices):
                cost = sum((end if s is None else s) - r for s, r in zip(pick, rel, strict=True))
                for s in starts:
                    n = sum(1 for x in pick if x == s)
                    cost += (n - 1) * sum(small[:n]) if n else 0.0
                best = min(best, cost)
    return best


def test_window_wait_with_works_is_the_least_over_every_choice_of_starts_and_actions() -> None:
    rng = random.Random(11)
    for _ in range(150):
        n = rng.randint(1, 5)
        rel = sorted(rng.uniform(0.0, 8.0) for _ in range(n))
        works = [rng.uniform(0.0, 3.0) for _ in range(n)]
        m = rng.randint(1, 3)
        got = _window_wait(np.asarray(rel), 8.0, m, np.asarray(works))
        assert got == pytest.approx(_brute_together(rel, works, 8.0, m))


def test_hand_computed_waits_with_the_others_work() -> None:
    # two actions at once on one instance: one batch serves both, each waits for the other's
    # work (3 + 1 = 4), less than one of them waiting for the window's end (8 s)
    assert batch_wait_sum([5.0, 5.0], 8.0, 1, phases=1, works=[1.0, 3.0]) == pytest.approx(4.0)
    # two instances: each its own batch, nothing to wait for
    assert batch_wait_sum([5.0, 5.0], 8.0, 2, phases=1, works=[1.0, 3.0]) == 0.0
    # works follow their releases when these come unsorted: the window [0, 8) holds the
    # actions of works 0.1 and 0.2 (one start at 0.5: waits 0.5 + 0.2 + 0.1), [8, 16) the one
    # of work 10 alone (nothing)
    assert batch_wait_sum([8.5, 0.0, 0.5], 8.0, 1, phases=1,
                          works=[10.0, 0.1, 0.2]) == pytest.approx(0.8)


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
