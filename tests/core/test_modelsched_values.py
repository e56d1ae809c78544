"""`core/modelsched.py`'s model planner with exact values (issue 43 item 2: mutation testing):
arrival rates, failure counts, a lost node's instances and parked weights under static
provisioning, the stagger hold's bounds, and short seeded walks with models (every invariant
after each event: `Core.validate`, the commands' sanity)."""

from __future__ import annotations

import random

import pytest
import test_core_stateful as sm
from core_helpers import Driver, gpu_node, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.cluster import ModelSpec

RM = ModelSpec(
    "rm", memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=4, load_s=1.0
)


def _planner(**cfg: object):
    d = Driver([gpu_node("g0", gpus=2), gpu_node("g1", gpus=2)], (RM,), **cfg)
    return d, d.core.planner


def test_arrival_rate_is_arrivals_over_the_span_between_first_and_last() -> None:
    _, p = _planner()
    assert p.arrival_rate("rm") == 0.0  # none yet
    p.note_arrival("rm", 1.0)
    assert p.arrival_rate("rm") == 0.0  # one
    p.note_arrival("rm", 1.0)
    assert p.arrival_rate("rm") == 0.0  # two at one instant: no span
    p.note_arrival("rm", 2.0)
    p.note_arrival("rm", 5.0)
    assert p.arrival_rate("rm") == pytest.approx(3 / 4.0)  # 3 gaps over 4 s
    assert list(p.arrivals["rm"]) == [1.0, 1.0, 2.0, 5.0]


def test_arrivals_older_than_the_window_are_dropped() -> None:
    _, p = _planner(rate_window_s=10.0)
    for t in (0.0, 5.0, 10.0, 10.5):
        p.note_arrival("rm", t)
    assert list(p.arrivals["rm"]) == [5.0, 10.0, 10.5]  # 0.0 < 10.5 - 10
    assert p.arrival_rate("rm") == pytest.approx(2 / 5.5)


def test_a_failed_queue_counts_its_next_failure_from_one() -> None:
    _, p = _planner()
    p.load_failures["rm"] = 2
    p.failures_reset("rm")
    assert p.load_failures == {"rm": 0}


def test_a_lost_node_drops_its_instances_targets_and_parked_weights() -> None:
    d, p = _planner(policy="static-pool")
    d.at(0.0).tick()
    assert p.static_target == {"rm": 4}
    assert sorted(p.instances) == ["rm#1", "rm#2", "rm#3", "rm#4"]
    p.parked[("g0", "rm")] = 1
    p.parked[("g1", "rm")] = 2
    d.at(1.0)(ev.NodeLost(1.0, "g0", reason="gone"))
    assert p.static_target == {"rm": 2}
    assert sorted(p.instances) == ["rm#3", "rm#4"]
    assert p.parked == {("g1", "rm"): 2}


def _stagger(alpha: float, gap_rate: float) -> bool:
    """Two ready instances of a model of ``alpha``, its last start just now, arrivals at
    ``gap_rate`` per stagger gap (alpha / 2): whether an idle instance holds its batch."""
    m = ModelSpec(
        "sm", memory_mb=8000, alpha=alpha, beta=0.0, max_batch=4, max_instances=2, load_s=1.0
    )
    d = Driver([gpu_node("g0", gpus=2)], (m,), model_min_instances=2, stagger_batches=True)
    d.at(0.0).tick()
    p = d.core.planner
    for iid in sorted(p.instances):
        d.at(0.0)(ev.ModelLoaded(0.0, iid, ok=True))
    gap = alpha / 2
    p.last_start["sm"] = d.core.st.now = 1.0
    p.arrivals.pop("sm", None)
    p.note_arrival("sm", 0.0)
    p.note_arrival("sm", gap / gap_rate)  # one gap of 1/rate: rate * gap == gap_rate
    return p.staggered(m)


def test_the_stagger_hold_needs_arrivals_at_least_once_per_gap() -> None:
    assert _stagger(2.0, 1.0) is True  # exactly one arrival per gap: held
    assert _stagger(2.0, 1.5) is True
    assert _stagger(2.0, 0.5) is False
    assert _stagger(0.5, 1.0) is True  # (an alpha below one second holds too)


@pytest.mark.parametrize("policy", ["tangram", "fifo", "static-pool"])
def test_short_seeded_walks_with_models_keep_every_invariant(policy: str) -> None:
    """test_core_stateful's walks, shorter and heavier on models: rewards of both models (and
    one not in the cluster), loads that fail, batches that finish, ticks past the idle time,
    lost and returning nodes; `Core.validate` and the commands' sanity after each event, and
    everything drains at the end."""
    for seed in range(8):
        rng = random.Random(seed)
        m = sm._machine(policy)()
        data = sm._Draw(rng)
        for _ in range(80):
            r = rng.randrange(10)
            if r < 2:
                m.arrive_cpu(sm._random_kw(rng), rng.choice([0.0, 0.5, 3.0]))
            elif r < 4:
                m.arrive_reward(rng.choice(["rm", "rm", "tp2", "nope"]), rng.random() < 0.5)
            elif r == 4:
                m.start_one(data)
            elif r == 5:
                m.finish_one(data, rng.choice(sm.FIN), rng.choice([0.1, 2.0]))
            elif r == 6:
                m.lose_node(rng.choice(["c0", "g0"])) if rng.random() < 0.3 else (
                    m.add_back() if m.lost else None
                )
            elif r == 7:
                m.model_loaded(data, rng.random() < 0.8)
            elif r == 8:
                m.batch_finished(data)
            else:
                m.tick(rng.choice([1.0, 25.0]))
            m.commands_are_sane()
        m.teardown()


def test_a_reward_with_its_model_loaded_runs_as_one_batch() -> None:
    d, p = _planner(model_min_instances=1)
    d.at(0.0).tick()
    iid = sorted(p.instances)[0]
    d.at(0.1)(ev.ModelLoaded(0.1, iid, ok=True))
    d.at(0.2).arrive(reward("r0"))
    assert p.batches == {"b1": (iid, ("r0",))}
    assert p.last_start == {"rm": 0.2}


A = ModelSpec(
    "a", memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=1, load_s=1.0, swap_s=0.5
)
B = ModelSpec(
    "b", memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=1, load_s=1.0, swap_s=0.5
)


def _models(out: list) -> list:
    """The model commands of ``out``: loads, unloads, batches (ids and actions)."""
    got = []
    for c in out:
        if isinstance(c, cmd.LoadModel):
            got.append(("load", c.instance_id, c.model, c.node, c.devices, c.from_host, c.cause))
        elif isinstance(c, cmd.UnloadModel):
            got.append(("unload", c.instance_id, c.node, c.park, c.cause))
        elif isinstance(c, cmd.RunBatch):
            got.append(
                (
                    "batch",
                    c.batch_id,
                    c.instance_id,
                    c.node,
                    c.model,
                    tuple(a.id for a in c.actions),
                    c.cause,
                )
            )
    return got


def test_one_device_two_models_swap_in_turn_with_parked_weights() -> None:
    """One GPU, models a and b: a is loaded at the first event (the warm minimum); b's first
    action parks a (b has no instance: starving) and cold-loads b; a's next action, once b's
    batch is back, parks b and swaps a's parked weights back in."""
    d = Driver([gpu_node("g0", gpus=1)], (A, B), policy="tangram", model_min_instances=1)
    p = d.core.planner
    assert _models(d.at(0.0).tick()) == [("load", "a#1", "a", "g0", (0,), False, "Tick@0")]
    assert _models(d.at(0.1)(ev.ModelLoaded(0.1, "a#1", ok=True))) == []
    assert _models(d.at(5.0).arrive(reward("r0", model="b"))) == [
        ("unload", "a#1", "g0", True, "evicted for model b"),
        ("load", "b#2", "b", "g0", (0,), False, "ActionArrived:r0"),
    ]
    assert p.parked == {("g0", "a"): 1} and p.unparking == {"a#1": ("g0", "a")}
    assert _models(d.at(5.1)(ev.ModelUnloaded(5.1, "a#1", parked=True))) == []
    assert p.parked == {("g0", "a"): 1} and p.unparking == {}
    assert _models(d.at(6.0)(ev.ModelLoaded(6.0, "b#2", ok=True))) == [
        ("batch", "b1", "b#2", "g0", "b", ("r0",), "ModelLoaded:b#2")
    ]
    assert _models(d.at(7.0).arrive(reward("r1", model="a"))) == []  # b is busy
    assert _models(d.at(7.5)(ev.BatchFinished(7.5, "b1", "b#2", outputs={"r0": 1.0}))) == [
        ("unload", "b#2", "g0", True, "evicted for model a"),
        ("load", "a#3", "a", "g0", (0,), True, "BatchFinished:b1"),
    ]
    assert p.parked == {("g0", "a"): 0, ("g0", "b"): 1}
    d.at(7.6)(ev.ModelUnloaded(7.6, "b#2", parked=True))
    assert _models(d.at(8.0)(ev.ModelLoaded(8.0, "a#3", ok=True))) == [
        ("batch", "b2", "a#3", "g0", "a", ("r1",), "ModelLoaded:a#3")
    ]
    assert p.batches == {"b2": ("a#3", ("r1",))}
    assert p.last_start == {"b": 6.0, "a": 8.0}
    assert p.instance_seq == 3 and p.batch_seq == 2


def test_impossible_names_the_missing_model_and_static_provisioning_without_one() -> None:
    d = Driver([gpu_node("g0", gpus=1)], (A, B), policy="tangram")
    assert d.core.planner.impossible(reward("x", model="zz")) == (
        "model 'zz' is not in the cluster spec"
    )
    assert d.core.planner.impossible(reward("x", model="a")) == ""
    s = Driver([gpu_node("g0", gpus=1)], (A, B), policy="static-pool")
    s.at(0.0).tick()
    assert s.core.planner.static_target == {"a": 1}
    assert s.core.planner.impossible(reward("y", model="b")) == (
        "static provisioning has no instance of model b (no devices left for it)"
    )
    assert s.core.planner.impossible(reward("y", model="a")) == ""
