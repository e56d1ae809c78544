"""The simulator honours the core's `WakeAt` (issue 37): provider calls leave at the token
bucket's pace to the exact virtual time, not at the simulator's Tick (1 s)."""

from __future__ import annotations

import pytest

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import ActionKind
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.providers import ProviderLimits
from arl_tangram.core.resources import Resources
from arl_tangram.sim.simulator import Simulator
from arl_tangram.sim.trace import SimAction, Trajectory


def test_twenty_calls_at_ten_per_second_leave_every_tenth_of_a_second() -> None:
    cluster = ClusterSpec((NodeSpec("n0", Resources(cpu=4, memory_mb=8192), pool="cpu"),), ())
    core = Core(cluster, CoreConfig(providers=(
        ProviderLimits(name="p", rate=10.0, burst=1.0, concurrency=100),)))
    call = SimAction(kind=ActionKind.SEARCH, tag="p", demand=Resources(), work_s=0.5)
    trajs = [Trajectory(f"t{i}", "search", ((0.0, call),)) for i in range(20)]
    report = Simulator(cluster, core).run([trajs])
    assert report.by_status == {"succeeded": 20}
    # the k-th call leaves at k/10 s and answers 0.5 s later: ACTs 0.5, 0.6, ..., 2.4
    assert report.act["avg"] == pytest.approx(sum(0.5 + k / 10 for k in range(20)) / 20)
    assert report.act["count"] == 20
