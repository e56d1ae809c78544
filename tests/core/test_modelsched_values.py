"""`core/modelsched.py`'s model planner with exact values (issue 43 item 2: mutation testing):
arrival rates, failure counts, a lost node's instances and parked weights under static
provisioning, the stagger hold's bounds, and short seeded walks with models (every invariant
after each event: `Core.validate`, the commands' sanity)."""

from __future__ import annotations

import random

import pytest
import test_core_stateful as sm
from core_helpers import Driver, gpu_node, reward

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
