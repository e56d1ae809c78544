"""When a queued action ages (is served ahead of every non-aged one): `aging_relative` times its
expected run, at least `aging_min_s`, at most `aging_s`, and at most half its own timeout unless
that is below `aging_min_s` (CoreConfig's documented rule; issue 27, mutation testing of
core/queues.py)."""

from __future__ import annotations

import pytest

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources


@pytest.mark.parametrize(("est", "timeout", "after"), [
    (0.001, 600.0, 2.0),  # 10 x 0.001 = 0.01 s: raised to aging_min_s
    (0.5, 600.0, 5.0),  # 10 x 0.5 s, between the bounds
    (10.0, 600.0, 30.0),  # 100 s: capped at aging_s
    (10.0, 40.0, 20.0),  # half its timeout (20 s) is below aging_s
    (0.5, 6.0, 3.0),  # half its timeout caps the 5 s
    (10.0, 3.0, 2.0),  # half its timeout (1.5 s) is below aging_min_s: aging_min_s wins
    (0.001, 3.0, 2.0),
])
def test_aging_after(est: float, timeout: float, after: float) -> None:
    cluster = ClusterSpec((NodeSpec("n0", Resources(cpu=4, memory_mb=256)),))
    core = Core(cluster, CoreConfig(aging_s=30.0, aging_min_s=2.0, aging_relative=10.0))
    rec = ActionRecord(ActionSpec("a", demand=Resources(cpu=1, memory_mb=64), timeout_s=timeout),
                       0.0, 1)
    rec.est = est
    assert core.queues.aging_after(rec) == pytest.approx(after)
