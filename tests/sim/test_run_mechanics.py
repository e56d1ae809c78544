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


def _core(w):
    from arl_tangram.sim.runner import make_core

    return make_core(w.cluster(4), "tangram", 4, None)


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
    assert gc.isenabled()
    for policy in ("tangram", "trajectory-bound"):
        assert _report(policy, gc_tuning=True) == _report(policy, gc_tuning=False)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen
    assert gc.isenabled()
    gc.disable()  # a caller's disabled collector stays disabled
    try:
        _report("tangram", gc_tuning=True)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_off_during_a_run_and_a_tick_frees_cycles_past_the_valve(monkeypatch):
    import weakref

    import arl_tangram.sim.simulator as simulator

    class Cyclic:
        def __init__(self) -> None:
            self.me = self

    seen: list[tuple[bool, int]] = []
    made: list[weakref.ref] = []

    def make_cycles() -> None:  # a callback of the run that leaves reference cycles behind
        seen.append((gc.isenabled(), sum(r() is not None for r in made)))
        made.extend(weakref.ref(Cyclic()) for _ in range(500))

    def look() -> None:
        seen.append((gc.isenabled(), sum(r() is not None for r in made)))

    w = get_workload("mixed")
    monkeypatch.setattr(simulator, "GC_VALVE", 10**12)  # no valve: the cycles stay
    sim = simulator.Simulator(w.cluster(4), _core(w), SimConfig(train_s=w.train_s), policy="tangram")
    sim.loop.at(1.0, make_cycles)
    sim.loop.at(30.0, look)
    sim.run(w.batches(3, 4, 1))
    assert seen == [(False, 0), (False, 500)]

    seen.clear()
    made.clear()
    monkeypatch.setattr(simulator, "GC_VALVE", 100)  # a tick (every tick_s) collects them
    sim = simulator.Simulator(w.cluster(4), _core(w), SimConfig(train_s=w.train_s), policy="tangram")
    sim.loop.at(1.0, make_cycles)
    sim.loop.at(30.0, look)
    sim.run(w.batches(3, 4, 1))
    assert seen == [(False, 0), (False, 0)]
    assert gc.isenabled()
