"""`core/modelsched.py`'s model planner with exact values (issue 43 item 2: mutation testing):
arrival rates, failure counts, a lost node's instances and parked weights under static
provisioning, the stagger hold's bounds, and short seeded walks with models (every invariant
after each event: `Core.validate`, the commands' sanity)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import test_core_stateful as sm
from core_helpers import Driver, gpu_node, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import ModelSpec

RM = ModelSpec(
    "rm", memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=4, load_s=1.0
)


def _planner(**cfg: object):
    d = Driver([gpu_node("g0", gpus=2), gpu_node("g1", gpus=2)], (RM,), **cfg)
    return d, d.core.planner


def _ticked(nodes: list, models: tuple) -> Driver:
    """A tangram core with ``models`` on ``nodes``, none kept or prewarmed, at its first tick."""
    d = Driver(nodes, models, policy="tangram", model_min_instances=0, model_prewarm=False)
    d.at(0.0).tick()
    return d


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
    p.note_arrival("rm", 0.0)
    p.note_arrival("rm", 10.0)
    assert list(p.arrivals["rm"]) == [0.0, 10.0]  # (exactly the window: kept)
    p.arrivals.pop("rm")
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


# ---- eviction: which node, which instances (evict_for, victims, yield_devices) --------------


def _m(name: str, **kw: object) -> ModelSpec:
    base = dict(memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=1, load_s=1.0)
    base.update(kw)
    return ModelSpec(
        name, swap_s=kw.pop("swap_s", 0.5), **{k: v for k, v in base.items() if k != "swap_s"}
    )


def _ready(d: Driver, node: str, m: ModelSpec, t: float) -> str:
    """Launch an instance of ``m`` on ``node``'s first free device, ready (last used) at ``t``."""
    p = d.core.planner
    ns = d.core.st.nodes[node]
    inst = p.launch(m, ns, (min(ns.dev_free),), False)
    d.at(t)(ev.ModelLoaded(t, inst.id, ok=True))
    return inst.id


def _evict_setup(ta: float, tb: float, b_max: int = 1, third: float | None = None):
    """Nodes g0, g1 (g2) of one GPU each, a on g0 ready at ``ta``, b on g1 at ``tb`` (and b on
    g2 at ``third``), nothing of c: c's first action evicts on one node."""
    a, b, c = _m("a"), _m("b", max_instances=b_max), _m("c")
    nodes = [gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)] + (
        [gpu_node("g2", gpus=1)] if third is not None else []
    )
    d = Driver(nodes, (a, b, c), policy="tangram", model_min_instances=0, model_prewarm=False)
    d.at(0.0).tick()
    ids = [_ready(d, "g0", a, ta), _ready(d, "g1", b, tb)]
    if third is not None:
        ids.append(_ready(d, "g2", b, third))
    return d, ids


def test_a_starving_model_evicts_the_least_recently_used_then_the_first_node() -> None:
    d, _ = _evict_setup(1.0, 1.0)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "a#1", "g0", True, "evicted for model c"),
        ("load", "c#3", "c", "g0", (0,), False, "ActionArrived:r0"),
    ]
    d, _ = _evict_setup(2.0, 1.0)  # b was used longer ago: g1
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "b#2", "g1", True, "evicted for model c"),
        ("load", "c#3", "c", "g1", (0,), False, "ActionArrived:r0"),
    ]
    assert d.core.planner.parked == {("g1", "b"): 1}


def test_eviction_prefers_a_model_that_keeps_another_instance() -> None:
    """a (its only instance, used longest ago) on g0; b on g1 and g2, both used at 1.0: c
    takes b's on g1 (the first node of the equal ones), not a's last instance."""
    d, _ = _evict_setup(0.5, 1.0, b_max=2, third=1.0)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "b#2", "g1", True, "evicted for model c"),
        ("load", "c#4", "c", "g1", (0,), False, "ActionArrived:r0"),
    ]


def test_eviction_skips_a_lost_node_and_counts_free_devices_and_every_victims() -> None:
    a, b, c = _m("a"), _m("b"), _m("c")
    d = _ticked([gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)], (a, b, c))
    _ready(d, "g1", a, 1.0)
    d.at(2.0)(ev.NodeLost(2.0, "g0", reason="gone"))
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "a#1", "g1", True, "evicted for model c"),
        ("load", "c#2", "c", "g1", (0,), False, "ActionArrived:r0"),
    ]
    c2 = _m("c", devices=2)
    # one free device and one idle instance make room for a model of two devices
    d = _ticked([gpu_node("g0", gpus=2)], (a, b, c2))
    _ready(d, "g0", a, 1.0)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "a#1", "g0", True, "evicted for model c"),
        ("load", "c#2", "c", "g0", (0, 1), False, "ActionArrived:r0"),
    ]
    # two idle instances, both parked for it (b used before a)
    d = _ticked([gpu_node("g0", gpus=2)], (a, b, c2))
    _ready(d, "g0", a, 1.0)
    _ready(d, "g0", b, 0.5)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "b#2", "g0", True, "evicted for model c"),
        ("unload", "a#1", "g0", True, "evicted for model c"),
        ("load", "c#3", "c", "g0", (0, 1), False, "ActionArrived:r0"),
    ]


def test_victims_skip_a_loading_instance_and_take_a_model_with_more_replicas_first() -> None:
    a, b, c = _m("a"), _m("b", max_instances=2), _m("c")
    d = _ticked([gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)], (a, b, c))
    d.core.planner.launch(b, d.core.st.nodes["g1"], (0,), False)  # still loading: no victim
    _ready(d, "g0", a, 1.0)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "a#2", "g0", True, "evicted for model c"),
        ("load", "c#3", "c", "g0", (0,), False, "ActionArrived:r0"),
    ]
    # g0: a (its only one, older) and b; g1: b. b's on g0 goes (more replicas first)
    d = _ticked([gpu_node("g0", gpus=2), gpu_node("g1", gpus=1)], (a, b, c))
    _ready(d, "g0", a, 0.5)
    _ready(d, "g0", b, 1.0)
    _ready(d, "g1", b, 1.0)
    assert _models(d.at(5.0).arrive(reward("r0", model="c"))) == [
        ("unload", "b#2", "g0", True, "evicted for model c"),
        ("load", "c#4", "c", "g0", (1,), False, "ActionArrived:r0"),
    ]


def test_scaling_out_by_eviction_parks_a_replica_idle_for_its_swap_time() -> None:
    """a's one instance is busy and its queue's drain (one knee batch, 2 s) exceeds a load
    (1 s): a scales out by parking one of b's two idle instances, one idle for exactly its
    swap time (0.5 s) -- the other, used 0.4 s ago, stays."""
    a = _m("a", alpha=1.0, beta=0.25, max_instances=2)
    b = _m("b", max_instances=2)
    d = Driver(
        [gpu_node("g0", gpus=1), gpu_node("g1", gpus=1), gpu_node("g2", gpus=1)],
        (a, b),
        policy="tangram",
        model_min_instances=0,
        model_prewarm=False,
        stagger_batches=False,
    )
    d.at(0.0).tick()
    _ready(d, "g0", a, 0.0)
    _ready(d, "g1", b, 4.5)
    _ready(d, "g2", b, 4.6)
    assert _models(d.at(4.8).arrive(reward("r0", model="a"))) == [
        ("batch", "b1", "a#1", "g0", "a", ("r0",), "ActionArrived:r0")
    ]
    assert _models(d.at(5.0).arrive(reward("r1", model="a"))) == [
        ("unload", "b#2", "g1", True, "evicted for model a"),
        ("load", "a#4", "a", "g1", (0,), False, "ActionArrived:r1"),
    ]


# ---- instances that end under the core (unloaded) --------------------------------------------


def _one(m: ModelSpec, gpus: int = 1, **cfg: object) -> Driver:
    d = Driver(
        [gpu_node("g0", gpus=gpus)],
        (m,),
        policy="tangram",
        model_min_instances=0,
        model_prewarm=False,
        stagger_batches=False,
        **cfg,
    )
    d.at(0.0).tick()
    return d


def test_an_instance_its_manager_parks_counts_as_parked_weights() -> None:
    a = _m("a")
    d = _one(a)
    _ready(d, "g0", a, 1.0)
    assert _models(d.at(2.0)(ev.ModelUnloaded(2.0, "a#1", parked=True))) == []
    p = d.core.planner
    assert p.parked == {("g0", "a"): 1} and p.instances == {}
    _ready(d, "g0", a, 3.0)  # (not from host: the count stays)
    assert _models(d.at(4.0)(ev.ModelUnloaded(4.0, "a#2", parked=True))) == []
    assert p.parked == {("g0", "a"): 2}


def test_weights_the_core_parked_that_did_not_stay_are_not_counted() -> None:
    d, _ = _evict_setup(1.0, 2.0)
    p = d.core.planner
    d.at(5.0).arrive(reward("r0", model="c"))
    assert p.parked == {("g0", "a"): 1}
    d.at(5.1)(ev.ModelUnloaded(5.1, "a#1", parked=False))
    assert p.parked == {("g0", "a"): 0} and p.unparking == {}
    d.at(6.0).arrive(reward("r1", model="b"))  # (b is idle: it runs)
    d.at(6.1)(ev.ModelUnloaded(6.1, "zz#9", parked=False))  # unknown: nothing
    assert p.parked == {("g0", "a"): 0}
    # parked, then the node is lost, then the unload's answer: nothing to take back
    d, _ = _evict_setup(1.0, 2.0)
    p = d.core.planner
    d.at(5.0).arrive(reward("r0", model="c"))
    d.at(5.1)(ev.NodeLost(5.1, "g0"))
    d.at(5.2)(ev.ModelUnloaded(5.2, "a#1", parked=False))
    # (c, starving again, parked b on g1)
    assert p.parked == {("g1", "b"): 1} and p.unparking == {"b#2": ("g1", "b")}


def test_a_dead_instance_is_replaced_and_three_deaths_fail_the_queue() -> None:
    a = _m("a", max_instances=2)
    d = _one(a, model_worker_retries=5)
    p = d.core.planner
    _ready(d, "g0", a, 0.5)
    d.at(1.0).arrive(reward("r0", model="a"))
    assert _models(d.at(2.0)(ev.ModelUnloaded(2.0, "a#1", reason="oom"))) == [
        ("load", "a#2", "a", "g0", (0,), False, "ModelUnloaded:a#1"),
    ]
    assert p.worker_deaths == {"a": 1} and d.status("r0") is Status.QUEUED
    assert p.batches == {}  # (its batch in flight is gone)
    assert p.parked == {}
    d.at(3.0)(ev.ModelLoaded(3.0, "a#2", ok=True))
    d.at(3.5)(ev.ModelUnloaded(3.5, "a#2", reason="oom"))
    assert p.worker_deaths == {"a": 2}
    d.at(4.0)(ev.ModelLoaded(4.0, "a#3", ok=True))
    d.at(4.5)(ev.ModelUnloaded(4.5, "a#3", reason="oom"))
    assert p.worker_deaths == {"a": 0}
    assert d.status("r0") is Status.FAILED
    assert d.result("r0").reason == "model a: 3 instances died with no batch scored between: oom"
    assert p.instances == {}


# ---- the max_batch_wait_s hold, released by a Tick ---------------------------------------------


def test_a_batch_below_the_knee_waits_max_batch_wait_s_for_more() -> None:
    a = _m("a")  # knee 4
    d = _one(a, max_batch_wait_s=1.0)
    iid = _ready(d, "g0", a, 0.5)
    assert _models(d.at(2.0).arrive(reward("r0", model="a"))) == []  # held
    assert _models(d.at(2.5).tick()) == []  # 0.5 s < 1 s: still held
    assert _models(d.at(3.0).tick()) == [("batch", "b1", iid, "g0", "a", ("r0",), "Tick@3")]
    rec = d.core.st.actions["r0"]
    assert rec.story[-4:] == (3.0, Status.QUEUED._value_, Status.RUNNING._value_, "Tick@3")
    assert rec.allotment == d.core.planner.instances[iid].holding()
    assert (rec.attempts, rec.start_time, rec.batch, rec.node) == (1, 3.0, "b1", "g0")
    # a full knee starts at once
    out = d.at(3.5)(ev.ActionsArrived(3.5, tuple(reward(f"s{i}", model="a") for i in range(4))))
    assert _models(out) == []  # (the instance is busy)
    out = d.at(4.0)(ev.BatchFinished(4.0, "b1", iid, outputs={"r0": 1.0}))
    assert _models(out) == [
        ("batch", "b2", iid, "g0", "a", ("s0", "s1", "s2", "s3"), "BatchFinished:b1")
    ]


# ---- idle instances past model_idle_s (scale_in) --------------------------------------------


def test_instances_idle_past_model_idle_s_are_parked_down_to_the_minimum() -> None:
    a, b = _m("a", max_instances=2), _m("b", max_instances=4)
    d = Driver(
        [gpu_node("g0", gpus=6)],
        (a, b),
        policy="tangram",
        model_min_instances=1,
        model_prewarm=False,
        model_idle_s=10.0,
        stagger_batches=False,
    )
    d.at(0.0).tick()  # a#1, b#2: the minimum
    p = d.core.planner
    d.at(0.0)(ev.ModelLoaded(0.0, "a#1", ok=True))
    d.at(0.0)(ev.ModelLoaded(0.0, "b#2", ok=True))
    _ready(d, "g0", a, 2.0)  # a#3
    _ready(d, "g0", b, 2.0)  # b#4
    _ready(d, "g0", b, 3.0)  # b#5
    _ready(d, "g0", b, 5.0)  # b#6
    # in id order: a#1 idle 12 s goes, a#3 is a's last, b#2 (12 s) and b#4 (exactly 10 s) go,
    # b#5 (9 s) and b#6 (7 s) stay
    assert _models(d.at(12.0).tick()) == [
        ("unload", "a#1", "g0", True, "idle 12s"),
        ("unload", "b#2", "g0", True, "idle 12s"),
        ("unload", "b#4", "g0", True, "idle 10s"),
    ]
    assert sorted(p.instances) == ["a#3", "b#5", "b#6"]


# ---- judge engines (max_seqs > 0): fill_engines, route_each, route ----------------------------


def _engines(routing: str, n: int = 3, max_seqs: int = 2, **kw: object) -> Driver:
    e = _m("e", max_seqs=max_seqs, max_instances=n, **kw)
    d = Driver(
        [gpu_node("g0", gpus=n)],
        (e,),
        policy="tangram",
        model_min_instances=0,
        model_prewarm=False,
        engine_routing=routing,
    )
    d.at(0.0).tick()
    for _ in range(n):
        _ready(d, "g0", e, 0.5)
    return d


def _group(d: Driver, t: float, *ids: str) -> list:
    return _models(d.at(t)(ev.ActionsArrived(t, tuple(reward(i, model="e") for i in ids))))


def test_round_robin_engines_take_one_batch_each_in_first_pick_order() -> None:
    d = _engines("round-robin")
    p = d.core.planner
    c = "ActionArrived:r3"
    assert _group(d, 1.0, "r0", "r1", "r2", "r3") == [
        ("batch", "b1", "e#1", "g0", "e", ("r0", "r3"), c),
        ("batch", "b2", "e#2", "g0", "e", ("r1",), c),
        ("batch", "b3", "e#3", "g0", "e", ("r2",), c),
    ]
    assert p.rr == {"e": 1} and p.batch_seq == 3 and p.last_start == {"e": 1.0}
    rec = d.core.st.actions["r3"]
    assert rec.story[-4:] == (1.0, Status.QUEUED._value_, Status.RUNNING._value_, c)
    assert rec.allotment == p.instances["e#1"].holding()
    assert (rec.attempts, rec.start_time, rec.batch, rec.node) == (1, 1.0, "b1", "g0")
    # e#1 is full: r4 goes to e#2, r5 to e#3 (round-robin), r6 finds every one full
    assert _group(d, 2.0, "r4", "r5", "r6") == [
        ("batch", "b4", "e#2", "g0", "e", ("r4",), "ActionArrived:r6"),
        ("batch", "b5", "e#3", "g0", "e", ("r5",), "ActionArrived:r6"),
    ]
    assert p.rr == {"e": 0} and p.last_start == {"e": 2.0}
    assert p.instances["e#2"].batch == ("b2", ("r1",)) and p.instances["e#2"].more == {
        "b4": ("r4",)
    }
    # a batch of the ones in flight comes back: r6 joins e#2 at once
    out = d.at(3.0)(ev.BatchFinished(3.0, "b4", "e#2", outputs={"r4": 1.0}))
    assert _models(out) == [("batch", "b6", "e#2", "g0", "e", ("r6",), "BatchFinished:b4")]
    assert p.instances["e#2"].last_used == 3.0
    assert p.instances["e#2"].batch == ("b2", ("r1",)) and p.instances["e#2"].more == {
        "b6": ("r6",)
    }
    out = d.at(4.0)(ev.BatchFinished(4.0, "b2", "e#2", outputs={"r1": 1.0}))
    assert _models(out) == []
    assert p.instances["e#2"].batch == ("b6", ("r6",)) and p.instances["e#2"].more == {}
    assert p.instances["e#2"].last_used == 4.0
    assert d.core.planner.batch_finished(ev.BatchFinished(4.0, "b2", "e#2")) == ()


def test_least_loaded_engines_level_their_sequences_one_batch_at_a_time() -> None:
    """Each batch just levels its instance with the next least loaded one, plus one: e#3
    (0 in flight, next 1) takes two."""
    d = _engines("least-loaded", max_seqs=4)
    c = "ActionArrived:r5"
    assert _group(d, 1.0, "r0", "r1", "r2", "r3", "r4", "r5") == [
        ("batch", "b1", "e#1", "g0", "e", ("r0",), c),
        ("batch", "b2", "e#2", "g0", "e", ("r1",), c),
        ("batch", "b3", "e#3", "g0", "e", ("r2", "r3"), c),
        ("batch", "b4", "e#1", "g0", "e", ("r4",), c),
        ("batch", "b5", "e#2", "g0", "e", ("r5",), c),
    ]


def _route(
    routing: str,
    loads: list[int],
    prev: tuple[int, int] | None = None,
    tokens=None,
    est: float = 1.0,
    traj: str | None = "t",
    **kw: object,
):
    """Which of three ready engines `route` picks (its index, None: all full) for one action
    of trajectory ``traj`` with ``tokens`` prompt tokens, ``loads`` in flight on each,
    ``prev``: (index, tokens) of the instance that served the trajectory before."""
    from types import SimpleNamespace

    from arl_tangram.core.actions import WorkHints

    d = _engines(routing, **kw)
    p = d.core.planner
    ready = [p.instances[f"e#{i}"] for i in (1, 2, 3)]
    if prev is not None:
        p.prefix["t"] = (ready[prev[0]].id, prev[1])
    spec = dataclasses.replace(
        reward("x", model="e", trajectory=traj), hints=WorkHints(tokens=100, prompt_tokens=tokens)
    )
    rec = SimpleNamespace(spec=spec, est=est)
    load = {inst.id: k for inst, k in zip(ready, loads, strict=True)}
    got = p.route(p.st.models["e"], rec, ready, load, routing)
    return (None if got is None else ready.index(got)), p


# (stand-in records: the compiled core takes only ActionRecords; `pure_core` runs it there on
# the pure one)
@pytest.mark.pure_core
def test_round_robin_skips_full_engines_and_moves_past_the_pick() -> None:
    assert _route("round-robin", [2, 0, 0])[0] == 1
    assert _route("round-robin", [2, 0, 0])[1].rr == {"e": 2}
    assert _route("round-robin", [2, 2, 2])[0] is None


# (stand-in records: the compiled core takes only ActionRecords; `pure_core` runs it there on
# the pure one)
@pytest.mark.pure_core
def test_sticky_keeps_the_trajectorys_engine_while_it_has_room() -> None:
    assert _route("sticky", [0, 1, 0], prev=(1, 10))[0] == 1
    assert _route("sticky", [0, 2, 1], prev=(1, 10))[0] == 0  # full: the least loaded
    assert _route("sticky", [2, 2, 2])[0] is None
    assert _route("sticky", [1, 0, 0])[1].prefix == {"t": ("e#2", 0)}


# (stand-in records: the compiled core takes only ActionRecords; `pure_core` runs it there on
# the pure one)
@pytest.mark.pure_core
def test_cost_routing_weighs_the_prefix_cache_against_the_decode_slowdown() -> None:
    # alpha + beta = 1: T = est; prefill 0.01 s a token, 100 tokens, all cached on e#2 (k=1)
    kw = dict(alpha=0.9, beta=0.1, prefill_s=0.01)
    # e#1 (k=0): 1.0; e#2: 2 * 0.1 * T
    assert _route("cost", [0, 1, 2], prev=(1, 100), tokens=100, est=4.96, **kw)[0] == 1
    assert _route("cost", [0, 1, 2], prev=(1, 100), tokens=100, est=7.5, **kw)[0] == 0
    assert _route("cost", [0, 1, 2], prev=(1, 100), tokens=100, est=5.5, **kw)[0] == 0
    # alpha < beta: T still est / (alpha + beta)
    assert (
        _route(
            "cost",
            [0, 1, 2],
            prev=(1, 100),
            tokens=100,
            est=7.5,
            alpha=0.1,
            beta=0.9,
            prefill_s=0.01,
        )[0]
        == 0
    )
    # alpha = beta = 0: no decode steps; the cached one wins at any load
    assert (
        _route("cost", [0, 1, 2], prev=(1, 100), tokens=100, alpha=0.0, beta=0.0, prefill_s=0.01)[0]
        == 1
    )
    assert _route("cost", [2, 2, 2], prev=(1, 100), tokens=100, **kw)[0] is None
    got, p = _route("cost", [0, 1, 2], prev=(1, 100), **kw)
    assert got == 0 and p.prefix == {"t": ("e#1", 0)}


# (stand-in records: the compiled core takes only ActionRecords; `pure_core` runs it there on
# the pure one)
@pytest.mark.pure_core
def test_the_prefix_memory_moves_a_trajectory_to_the_end_and_keeps_65536() -> None:
    _, p = _route("cost", [0, 0, 0], prev=(1, 10))
    p.prefix["u"] = ("e#3", 5)
    ready = [p.instances[f"e#{i}"] for i in (1, 2, 3)]
    from types import SimpleNamespace

    rec = SimpleNamespace(spec=reward("y", model="e", trajectory="t"), est=1.0)
    p.route(p.st.models["e"], rec, ready, dict.fromkeys(p.instances, 0), "cost")
    assert list(p.prefix) == ["u", "t"]
    p.prefix = {f"k{i}": ("e#1", 0) for i in range(65535)}
    p.route(p.st.models["e"], rec, ready, dict.fromkeys(p.instances, 0), "cost")
    assert len(p.prefix) == 65536 and next(iter(p.prefix)) == "k0"
    rec = SimpleNamespace(spec=reward("z", model="e", trajectory="v"), est=1.0)
    p.route(p.st.models["e"], rec, ready, dict.fromkeys(p.instances, 0), "cost")
    assert len(p.prefix) == 65536 and next(iter(p.prefix)) == "k1"


# ---- whether one more instance pays (worth_instance) ------------------------------------------


def test_worth_instance_compares_the_drain_with_a_load_or_a_swap_in() -> None:
    """knee 4, a knee batch 2 s; load 2 s, swap-in 1 s; one instance (n=1)."""
    a = _m("a", alpha=1.0, beta=0.25, load_s=2.0, swap_s=1.0, max_instances=3)
    d = _one(a, gpus=3)
    p = d.core.planner
    key = ("model", "a")
    assert p.worth_instance(a, 1, False, free=True) is False  # nothing queued (no queue yet)
    p.queues.live[key] = 4  # one knee batch: 2 s
    # not more than a load, but nothing loading or ready absorbs it (scale_out_batches 0)
    assert p.worth_instance(a, 1, False, free=True) is True
    assert p.worth_instance(a, 1, False, free=False) is False  # 2 s is not more than a load
    assert p.worth_instance(a, 1, True, free=False) is True  # more than a swap-in
    assert p.worth_instance(a, 1, None, free=False) is False  # no weights parked anywhere
    p.parked[("g0", "b")] = 1
    p.parked[("g1", "a")] = 0
    assert p.worth_instance(a, 1, None, free=False) is False  # not a's (or none left)
    p.parked[("g1", "a")] = 1
    assert p.worth_instance(a, 1, None, free=False) is True
    p.parked[("g1", "a")] = 2
    assert p.worth_instance(a, 1, None, free=False) is True
    p.queues.live[key] = 5  # two knee batches: 4 s
    assert p.worth_instance(a, 1, False, free=False) is True


def test_worth_instance_on_free_devices_counts_the_backlog_loading_ones_take() -> None:
    """n=2: one ready, one loading; scale_out_batches 1: they absorb 4 * (1 + 1) = 8."""
    a = _m("a", alpha=1.0, beta=0.25, load_s=10.0, swap_s=10.0, max_instances=3)
    d = _one(a, gpus=3, scale_out_batches=1.0)
    p = d.core.planner
    _ready(d, "g0", a, 0.5)
    p.launch(a, d.core.st.nodes["g0"], (1,), False)  # loading
    assert p.queues.live.get(("model", "a"), 0) == 0
    p.queues.live[("model", "a")] = 8
    assert p.worth_instance(a, 2, False, free=True) is False
    p.queues.live[("model", "a")] = 9
    assert p.worth_instance(a, 2, False, free=True) is True


# ---- a GPU action of the shared pool parks idle instances (yield_devices) ---------------------


def _gpu_act(aid: str, gpu: float = 1.0):
    from arl_tangram.core.actions import ActionSpec
    from arl_tangram.core.resources import Resources

    return ActionSpec(aid, demand=Resources(cpu=1, memory_mb=256, gpu=gpu))


def test_a_gpu_action_parks_the_idle_instances_on_the_node_needing_the_fewest() -> None:
    a, b, c = _m("a"), _m("b", max_instances=2), _m("c")
    d = _ticked([gpu_node("g0", gpus=2), gpu_node("g1", gpus=2)], (a, b, c))
    _ready(d, "g0", a, 1.0)
    _ready(d, "g0", b, 2.0)
    _ready(d, "g1", c, 3.0)
    # two GPUs: g1 needs one eviction (one GPU is free there), g0 two
    assert _models(d.at(5.0).arrive(_gpu_act("x", gpu=2.0))) == [
        ("unload", "c#3", "g1", True, "evicted for action x"),
    ]
    assert d.status("x") is Status.RUNNING or d.status("x") is Status.STARTING
    d = _ticked([gpu_node("g0", gpus=2), gpu_node("g1", gpus=2)], (a, b, c))
    _ready(d, "g0", a, 1.0)
    _ready(d, "g0", b, 2.0)
    _ready(d, "g1", b, 0.5)
    _ready(d, "g1", c, 3.0)
    # one GPU: on each node one eviction (b first: more replicas); g1's b was used first
    assert _models(d.at(5.0).arrive(_gpu_act("y", gpu=1.0))) == [
        ("unload", "b#3", "g1", True, "evicted for action y"),
    ]


def test_a_gpu_action_looks_past_a_lost_node() -> None:
    a, b = _m("a"), _m("b")
    d = _ticked([gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)], (a, b))
    _ready(d, "g1", a, 1.0)
    d.at(2.0)(ev.NodeLost(2.0, "g0", reason="gone"))
    assert _models(d.at(5.0).arrive(_gpu_act("x", gpu=1.0))) == [
        ("unload", "a#1", "g1", True, "evicted for action x"),
    ]


def test_a_new_instance_goes_where_its_weights_are_parked() -> None:
    a = _m("a", max_instances=2)
    d = _ticked([gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)], (a,))
    d.core.planner.parked[("g1", "a")] = 1
    assert _models(d.at(1.0).arrive(reward("r0", model="a"))) == [
        ("load", "a#1", "a", "g1", (0,), True, "ActionArrived:r0"),
    ]
    assert d.core.planner.parked == {("g1", "a"): 0}


def test_a_load_that_worked_resets_the_failure_count_to_zero() -> None:
    a = _m("a", max_instances=3)
    d = _one(a, gpus=3)
    p = d.core.planner
    _ready(d, "g0", a, 0.5)
    assert p.load_failures == {"a": 0}
    for t in (1.0, 2.0):
        inst = p.launch(a, d.core.st.nodes["g0"], (min(d.core.st.nodes["g0"].dev_free),), False)
        d.at(t)(ev.ModelLoaded(t, inst.id, ok=False, reason="bad"))
    assert p.load_failures == {"a": 2}


def test_an_engine_action_requeued_from_a_dead_instance_counts_its_second_attempt() -> None:
    d = _engines("round-robin")  # (model_worker_retries 1)
    _group(d, 1.0, "r0")
    assert d.core.st.actions["r0"].attempts == 1
    out = d.at(2.0)(ev.ModelUnloaded(2.0, "e#1", reason="oom"))
    assert _models(out) == [  # (a replacement; round-robin goes on from e#2's turn: e#3)
        ("load", "e#4", "e", "g0", (0,), False, "ModelUnloaded:e#1"),
        ("batch", "b2", "e#3", "g0", "e", ("r0",), "ModelUnloaded:e#1"),
    ]
    assert d.core.st.actions["r0"].attempts == 2


def test_impossible_remembers_each_models_fit_and_repeats_its_reason() -> None:
    big = _m("big", memory_mb=20000.0)
    d = Driver([gpu_node("g0", gpus=1)], (A, big), policy="tangram")
    why = "model big needs 20000 MB per device; node g0 has 16000 MB per device"
    assert d.core.planner.impossible(reward("x", model="a")) == ""
    assert d.core.planner.impossible(reward("y", model="big")) == why
    assert d.core.planner.impossible(reward("z", model="big")) == why  # (remembered unfit)
    assert d.core.planner.impossible(reward("w", model="a")) == ""
