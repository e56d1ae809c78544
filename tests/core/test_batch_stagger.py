"""Staggered batch starts (`ModelPlanner.staggered`): instances of a model with a slow batch
spread their starts ``alpha / n`` apart where arrivals come often enough; they start at once
for a full batch, a lone instance or sparse arrivals."""

from __future__ import annotations

from core_helpers import Driver, gpu_node, of, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import ModelSpec

# 8 s batches, two instances on two GPUs; knee = 4 * 8 / 0.08 = 400, capped at 64
JUDGE = ModelSpec("judge", kind="judge", memory_mb=8000, alpha=8.0, beta=0.08, max_batch=64,
                  max_instances=2, load_s=0.0)


def _ready(d: Driver) -> list[str]:
    """Boot the two instances (prewarm fills the devices) and report them loaded."""
    loads = of(d.tick(), cmd.LoadModel)
    assert len(loads) == 2
    for ld in loads:
        d(ev.ModelLoaded(d.t, ld.instance_id))
    return [ld.instance_id for ld in loads]


def _batches(out: list[cmd.Command]) -> list[tuple[str, ...]]:
    return [tuple(a.id for a in b.actions) for b in of(out, cmd.RunBatch)]


def test_frequent_arrivals_spread_the_two_instances_starts_half_a_batch_apart() -> None:
    d = Driver([gpu_node("g0", gpus=2)], [JUDGE], policy="tangram")
    _ready(d.at(0.0))
    starts: list[tuple[float, tuple[str, ...]]] = []
    for i in range(17):  # one arrival every 0.5 s, from t=1 to t=9
        out = d.at(1.0 + 0.5 * i).arrive(reward(f"j{i}", "judge"))
        starts += [(d.t, b) for b in _batches(out)]
    # the first starts at once; the second instance, idle all along, waits until
    # alpha / 2 = 4 s after it (arrivals every 0.5 s: one is sure to come back in time)
    assert starts[0] == (1.0, ("j0",))
    assert starts[1][0] == 5.0 and starts[1][1] == tuple(f"j{i}" for i in range(1, 9))


def test_without_stagger_the_idle_instance_takes_the_next_arrival_at_once() -> None:
    d = Driver([gpu_node("g0", gpus=2)], [JUDGE], policy="tangram", stagger_batches=False)
    _ready(d.at(0.0))
    assert _batches(d.at(1.0).arrive(reward("j0", "judge"))) == [("j0",)]
    assert _batches(d.at(1.5).arrive(reward("j1", "judge"))) == [("j1",)]


def test_sparse_arrivals_start_at_once() -> None:
    d = Driver([gpu_node("g0", gpus=2)], [JUDGE], policy="tangram")
    _ready(d.at(0.0))
    for i, t in enumerate((1.0, 20.0, 40.0)):  # each long after the last start: no hold
        out = d.at(t).arrive(reward(f"j{i}", "judge"))
        assert _batches(out) == [(f"j{i}",)]
        (b,) = of(out, cmd.RunBatch)
        if i < 2:  # done 8 s later; the last one still runs, on one of the two instances
            d.at(t + 8.0)(ev.BatchFinished(t + 8.0, b.batch_id, b.instance_id, outputs={f"j{i}": 1.0}))
    # 1 s after the last start, within the gap (4 s), but the model's arrivals come once per
    # ~13 s, far less than once per gap: waiting would only delay it
    assert _batches(d.at(41.0).arrive(reward("j3", "judge"))) == [("j3",)]


def test_a_lone_instance_never_holds() -> None:
    one = ModelSpec("judge", kind="judge", memory_mb=8000, alpha=8.0, beta=0.08, max_batch=64,
                    max_instances=1, load_s=0.0)
    d = Driver([gpu_node("g0", gpus=2)], [one], policy="tangram")
    (ld,) = of(d.at(0.0).tick(), cmd.LoadModel)
    d(ev.ModelLoaded(0.0, ld.instance_id))
    assert _batches(d.at(1.0).arrive(reward("j0", "judge"))) == [("j0",)]


def test_a_full_batch_starts_at_once() -> None:
    small_knee = ModelSpec("judge", kind="judge", memory_mb=8000, alpha=8.0, beta=0.08,
                           max_batch=4, max_instances=2, load_s=0.0)  # knee 4
    d = Driver([gpu_node("g0", gpus=2)], [small_knee], policy="tangram")
    _ready(d.at(0.0))
    for i in range(8):  # two a second: often enough to hold a batch below the knee
        d.at(1.0 + 0.5 * i).arrive(reward(f"a{i}", "judge"))
    # the first instance took a0 at t=1; the second holds until t=5, unless a batch is full:
    # a{1..4} make one at t=3
    assert d.status("a1") is Status.RUNNING and d.status("a4") is Status.RUNNING
