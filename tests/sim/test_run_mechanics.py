"""How a run is carried out (halting the loop, the collector's tuning) never changes its result."""

import gc

from arl_tangram.sim.loop import EventLoop
from arl_tangram.sim.runner import run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.workloads import get_workload


def test_halt_ends_the_run_after_the_running_callback():
    loop = EventLoop()
    seen = []

    def note(t):
        seen.append(t)
        if t == 2:
            loop.halt()

    for t in range(6):
        loop.at(float(t), note, t)
    loop.run()
    assert seen == [0, 1, 2]
    assert len(loop) == 3 and loop.now == 2.0
    loop.run()  # a new run is not halted by the old request
    assert seen == [0, 1, 2, 3, 4, 5]


def _report(policy, **cfg):
    w = get_workload("mixed")
    cluster = w.cluster(12)
    r = run_policy(cluster, lambda: w.batches(3, 12, 2), policy, workload="mixed",
                   config=SimConfig(train_s=w.train_s, **cfg))
    d = r.as_dict()
    d.pop("wall_s")
    return d, r.series


def test_gc_tuning_changes_nothing_simulated_and_is_undone():
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    for policy in ("tangram", "trajectory-bound"):
        assert _report(policy, gc_tuning=True) == _report(policy, gc_tuning=False)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen
