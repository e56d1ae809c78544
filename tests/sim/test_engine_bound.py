"""Bound (d) (`sim.engine_bound`): a judge engine's actions present while its instances share
their sequences. Pinned on cases whose optimum is known, and below every run it bounds."""

from __future__ import annotations

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.sim.engine_bound import busy_periods, engine_flow_bound
from arl_tangram.sim.runner import run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import get_workload, with_load

# genrm-engine's judge: a step of k sequences takes 5.5 ms + 0.25 ms k
ENGINE = ModelSpec("gj", kind="genjudge", alpha=0.0055, beta=0.00025, max_seqs=64, max_batch=64)


def test_one_action_alone_is_its_work() -> None:
    assert engine_flow_bound([(0.0, 10.0, 7.0)], ENGINE, 1) == pytest.approx(7.0, rel=1e-12)


def test_two_together_lie_between_alone_and_the_optimum() -> None:
    # one instance: sharing (both at 5.75 / 6.0 of their speed alone: 14.61 s in all) beats one
    # after the other (7 + 14 = 21 s); alone both would take 14 s
    got = engine_flow_bound([(0.0, 20.0, 7.0), (0.0, 20.0, 7.0)], ENGINE, 1)
    assert 14.0 <= got <= 2 * 7.0 * 0.006 / 0.00575
    assert got == pytest.approx(14.213815246378534, rel=1e-9)
    # a coarser grid gives a lower bound (256 steps: the value before the default was 512)
    coarse = engine_flow_bound([(0.0, 20.0, 7.0), (0.0, 20.0, 7.0)], ENGINE, 1, steps=256)
    assert coarse == pytest.approx(14.012422360248449, rel=1e-9)


def test_many_at_once_are_slowed_by_their_sharing() -> None:
    # 64 actions of 7 s released together on one instance: all at once each runs at
    # 5.75 / 21.5 of its speed (26.17 s on average); (a) alone says 7 s, (d) 16.56 s
    got = engine_flow_bound([(0.0, 100.0, 7.0)] * 64, ENGINE, 1) / 64
    assert 7.0 < got <= 7.0 * (0.0055 + 64 * 0.00025) / 0.00575
    assert got == pytest.approx(16.592557402061345, rel=1e-9)
    coarse = engine_flow_bound([(0.0, 100.0, 7.0)] * 64, ENGINE, 1, steps=256) / 64
    assert coarse == pytest.approx(16.564662481735738, rel=1e-9)
    # on 8 instances the same 64 share 8 each: (d) falls to what 8 together allow
    eight = engine_flow_bound([(0.0, 100.0, 7.0)] * 64, ENGINE, 8) / 64
    assert 7.0 < eight < got


def test_busy_periods_split_where_nothing_is_present() -> None:
    jobs = [(0.0, 5.0, 1.0), (4.0, 9.0, 1.0), (9.5, 12.0, 1.0), (10.0, 11.0, 1.0)]
    assert busy_periods(jobs) == [jobs[:2], jobs[2:]]


@pytest.mark.parametrize("load", [1.0, 4.0])
def test_below_the_runs_it_bounds(load: float) -> None:
    """genrm-engine, 64 trajectories, one step: (d) is above (a) under contention and below
    the run's ACT."""
    w = get_workload("genrm-engine")
    cluster = w.cluster(64)
    rep = run_policy(cluster, with_load(lambda: w.batches(0, 64, 1), load), "tangram",
                     workload="genrm-engine", config=SimConfig(train_s=w.train_s))
    assert rep.bound is not None
    assert rep.bound["engine_act_avg"] <= rep.act["avg"]
    assert rep.bound["act_avg"] <= rep.act["avg"]
    if load > 1.0:
        assert rep.bound["engine_act_avg"] > rep.bound["alone_act_avg"]
