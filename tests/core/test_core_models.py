"""The core on reward models: batching, routing, scaling, swap-in, failures, topology."""

from __future__ import annotations

import pytest
from core_helpers import Driver, gpu_node, of, reward, starts

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.resources import Resources

RM = ModelSpec("rm", memory_mb=8000, alpha=0.04, beta=0.01, max_batch=16, max_instances=4,
               load_s=10.0, swap_s=1.0)  # knee = 4*0.04/0.01 = 16


def test_load_on_demand_then_batch_up_to_knee() -> None:
    small = ModelSpec("small", memory_mb=1000, alpha=0.02, beta=0.01, max_batch=64)  # knee 8
    d = Driver([gpu_node("g0", gpus=1)], [small], policy="tangram")
    out = d.arrive(*[reward(f"r{i}", "small") for i in range(10)])
    (load,) = of(out, cmd.LoadModel)
    assert load.node == "g0" and load.devices == (0,) and not load.from_host
    out = d(ev.ModelLoaded(1.0, load.instance_id))
    (b,) = of(out, cmd.RunBatch)
    assert [a.id for a in b.actions] == [f"r{i}" for i in range(8)]
    assert d.status("r0") is Status.RUNNING and d.status("r9") is Status.QUEUED
    out = d(ev.BatchFinished(2.0, b.batch_id, load.instance_id,
                             outputs={f"r{i}": 0.5 for i in range(7)}, failed={"r7": "oom"}))
    res = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert res["r0"].status is Status.SUCCEEDED and res["r0"].output == 0.5
    assert res["r7"].status is Status.FAILED and res["r7"].reason == "oom"
    (b2,) = of(out, cmd.RunBatch)
    assert [a.id for a in b2.actions] == ["r8", "r9"]


@pytest.mark.parametrize("policy", ["tangram", "fifo", "task-isolated", "trajectory-bound"])
def test_unknown_or_unplaceable_model_rejected(policy: str) -> None:
    huge = ModelSpec("huge", devices=8, memory_mb=1000)
    d = Driver([gpu_node("g0", gpus=4)], [RM, huge], policy=policy)
    (dl,) = of(d.arrive(reward("x", "nope")), cmd.Deliver)
    assert dl.result.status is Status.REJECTED and "nope" in dl.result.reason
    (dl,) = of(d.arrive(reward("y", "huge")), cmd.Deliver)
    assert dl.result.status is Status.REJECTED and "8 devices" in dl.result.reason


def test_multi_gpu_instance_stays_in_one_nvlink_domain() -> None:
    tp2 = ModelSpec("tp2", devices=2, memory_mb=8000, max_instances=4, load_s=0.0)
    d = Driver([gpu_node("g0", gpus=4, domains=[[0, 2], [1, 3]])], [tp2], policy="tangram")
    out = d.arrive(*[reward(f"r{i}", "tp2") for i in range(200)])
    loads = of(out, cmd.LoadModel)
    assert {ld.devices for ld in loads} <= {(0, 2), (1, 3)}
    assert len(loads) == 2  # load_s = 0: scale out while waits exceed it, until devices run out


def test_scale_out_when_waits_grow_and_not_when_small() -> None:
    rm = ModelSpec("rm", memory_mb=8000, alpha=0.04, beta=0.01, max_batch=16, load_s=2.0)
    d = Driver([gpu_node("g0", gpus=4)], [rm], policy="tangram", model_min_instances=0,
               scale_out_batches=1.0, model_prewarm=False)
    out = d.arrive(reward("a"))
    assert len(of(out, cmd.LoadModel)) == 1
    out = d.arrive(*[reward(f"r{i}") for i in range(10)])
    assert not of(out, cmd.LoadModel)  # 11 queued: one batch (0.2s) < load 2s
    out = d.arrive(*[reward(f"q{i}") for i in range(16 * 12)])
    assert of(out, cmd.LoadModel)  # ~12 batches of 0.2s = 2.4s > 2s load


def test_scales_out_onto_free_devices_on_any_backlog_and_preloads_minimum() -> None:
    d = Driver([gpu_node("g0", gpus=4)], [RM], policy="tangram", model_prewarm=False)
    (ld,) = of(d.tick(), cmd.LoadModel)  # the warm minimum is loaded at the first event
    d(ev.ModelLoaded(1.0, ld.instance_id))
    out = d.arrive(reward("r0"))
    assert len(of(out, cmd.RunBatch)) == 1 and not of(out, cmd.LoadModel)
    (_,) = of(d.arrive(reward("r1")), cmd.LoadModel)  # it waits: scale out onto a free device
    out = d.arrive(*[reward(f"q{i}") for i in range(10)])
    assert not of(out, cmd.LoadModel)  # 11 queued: the loading instance will take a batch of 16
    out = d.arrive(*[reward(f"z{i}") for i in range(40)])
    assert len(of(out, cmd.LoadModel)) == 2  # up to max_instances (4), then no more
    assert len(d.core.view().instances) == 4


def test_idle_scale_in_parks_then_swaps_back_in() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_idle_s=30,
               model_min_instances=0)
    (load,) = of(d.arrive(reward("a")), cmd.LoadModel)
    (b,) = of(d(ev.ModelLoaded(1.0, load.instance_id)), cmd.RunBatch)
    d(ev.BatchFinished(2.0, b.batch_id, load.instance_id, outputs={"a": 1.0}))
    assert not of(d.at(20).tick(), cmd.UnloadModel)
    (un,) = of(d.at(40).tick(), cmd.UnloadModel)
    assert un.park and un.instance_id == load.instance_id
    d(ev.ModelUnloaded(40.0, un.instance_id, parked=True))
    assert d.core.view().parked == {"g0/rm": 1}
    (load2,) = of(d.at(50).arrive(reward("b")), cmd.LoadModel)
    assert load2.from_host


def test_failed_load_retries_then_fails_queue() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="fifo", max_load_failures=2)
    (ld,) = of(d.arrive(reward("a"), reward("b")), cmd.LoadModel)
    out = d(ev.ModelLoaded(1.0, ld.instance_id, ok=False, reason="disk"))
    (ld2,) = of(out, cmd.LoadModel)  # devices freed, tried again
    out = d(ev.ModelLoaded(2.0, ld2.instance_id, ok=False, reason="disk"))
    res = [c.result for c in of(out, cmd.Deliver)]
    assert {r.id for r in res} == {"a", "b"} and all(r.status is Status.FAILED for r in res)
    assert "disk" in res[0].reason


def test_evicts_idle_instance_of_other_model() -> None:
    other = ModelSpec("other", memory_mb=8000)
    d = Driver([gpu_node("g0", gpus=1)], [RM, other], policy="tangram", model_min_instances=0,
               model_prewarm=False)
    (ld,) = of(d.arrive(reward("a")), cmd.LoadModel)
    (b,) = of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    out = d.arrive(reward("o", "other"))
    assert not of(out, cmd.LoadModel)  # rm is busy
    out = d(ev.BatchFinished(2.0, b.batch_id, ld.instance_id, outputs={"a": 1}))
    (un,) = of(out, cmd.UnloadModel)
    (ld2,) = of(out, cmd.LoadModel)
    assert un.instance_id == ld.instance_id and ld2.model == "other"


def test_static_policies_load_fixed_set_up_front_and_never_scale() -> None:
    d = Driver([gpu_node("g0", gpus=4)], [RM], policy="trajectory-bound", trajectories=4)
    out = d.arrive(reward("a"))
    loads = of(out, cmd.LoadModel)
    assert len(loads) == 4  # max_instances of rm, one per device
    for ld in loads:
        d(ev.ModelLoaded(1.0, ld.instance_id))
    d.at(1000).tick()
    assert not of(d.log, cmd.UnloadModel)


def test_node_lost_requeues_batch_and_drops_instances() -> None:
    d = Driver([gpu_node("g0", gpus=1), gpu_node("g1", gpus=1)], [RM], policy="fifo",
               model_min_instances=0, model_prewarm=False)
    (ld,) = of(d.arrive(reward("a")), cmd.LoadModel)
    d.arrive(reward("n", idempotent=False))
    (b,) = of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    out = d(ev.NodeLost(2.0, ld.node))
    res = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert res["n"].status is Status.NODE_LOST and "a" not in res
    (ld2,) = of(out, cmd.LoadModel)
    assert ld2.node != ld.node
    assert d(ev.BatchFinished(3.0, b.batch_id, ld.instance_id, outputs={"a": 1})) == []
    (b2,) = of(d(ev.ModelLoaded(3.0, ld2.instance_id)), cmd.RunBatch)
    out = d(ev.BatchFinished(4.0, b2.batch_id, ld2.instance_id, outputs={"a": 1}))
    assert of(out, cmd.Deliver)[0].result.attempts == 2


def test_cancel_inside_batch_ignores_late_output() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram")
    (ld,) = of(d.arrive(reward("a"), reward("b")), cmd.LoadModel)
    (b,) = of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    out = d(ev.CancelRequested(1.5, "a"))
    assert of(out, cmd.Deliver)[0].result.status is Status.CANCELLED
    out = d(ev.BatchFinished(2.0, b.batch_id, ld.instance_id, outputs={"a": 1, "b": 2}))
    assert [c.result.id for c in of(out, cmd.Deliver)] == ["b"]


@pytest.mark.parametrize("policy", ["tangram", "fifo"])
def test_prewarm_fills_free_devices_and_idle_instances_stay(policy: str) -> None:
    d = Driver([gpu_node("g0", gpus=4), gpu_node("g1", gpus=1)], [RM], policy=policy)
    loads = of(d.tick(), cmd.LoadModel)
    assert len(loads) == 4  # max_instances of rm, though nothing is queued yet
    for ld in loads:
        d(ev.ModelLoaded(1.0, ld.instance_id))
    out = d.at(1.5).arrive(reward("a"))
    assert len(of(out, cmd.RunBatch)) == 1 and not of(out, cmd.LoadModel)
    assert not of(d.at(10_000).tick(), cmd.UnloadModel)  # nothing else needs the devices
    assert len(d.core.view().instances) == 4


JUDGE = ModelSpec("judge", memory_mb=8000, alpha=8.0, beta=0.08, max_batch=64, max_instances=4,
                  load_s=10.0, swap_s=1.0)  # knee 64, a knee batch takes 13.12 s


def _loaded(d: Driver) -> list[cmd.LoadModel]:
    loads = of(d.tick(), cmd.LoadModel)
    for ld in loads:
        d(ev.ModelLoaded(1.0, ld.instance_id))
    return loads


def test_lazy_eviction_only_when_the_wait_pays_and_keeps_the_idle_models_last_instance() -> None:
    d = Driver([gpu_node("g0", gpus=4)], [RM, JUDGE], policy="tangram")
    loads = _loaded(d)
    assert sorted(ld.model for ld in loads) == ["judge", "judge", "rm", "rm"]  # round-robin
    out = d.at(100).arrive(*[reward(f"j{i}", "judge") for i in range(2 + 64)])
    assert len(of(out, cmd.RunBatch)) == 2  # each idle judge takes a batch at once
    assert not of(out, cmd.UnloadModel)  # 64 queued: a 13.1 s batch over 2 = 6.6 s < 10 s load
    out = d.arrive(reward("k", "judge"))
    (un,) = of(out, cmd.UnloadModel)  # 65 queued: 13.1 s > 10 s: park one rm, load a judge
    (ld,) = of(out, cmd.LoadModel)
    assert un.park and un.instance_id.startswith("rm#") and ld.model == "judge"
    d(ev.ModelUnloaded(100.0, un.instance_id, parked=True))
    out = d.arrive(*[reward(f"m{i}", "judge") for i in range(64 * 4)])
    assert not of(out, cmd.UnloadModel)  # the last rm instance stays: rm has none else
    assert sum(i.model == "rm" for i in d.core.view().instances) == 1


def test_recently_used_instance_is_not_evicted_for_a_model_that_has_one() -> None:
    d = Driver([gpu_node("g0", gpus=4)], [RM, JUDGE], policy="tangram")
    _loaded(d)
    for b in of(d.at(100).arrive(reward("r0"), reward("r1")), cmd.RunBatch):
        d.at(100.5)(ev.BatchFinished(100.5, b.batch_id, b.instance_id, outputs={a.id: 1 for a in b.actions}))
    out = d.arrive(*[reward(f"j{i}", "judge") for i in range(2 + 64 * 3)])
    assert not of(out, cmd.UnloadModel)  # both rm instances were used less than a swap ago
    (un,) = of(d.at(102).arrive(reward("k", "judge")), cmd.UnloadModel)
    assert un.instance_id.startswith("rm#")


def test_model_with_no_instance_takes_the_last_instance_of_an_idle_model() -> None:
    other = ModelSpec("other", memory_mb=8000)
    d = Driver([gpu_node("g0", gpus=1)], [RM, other], policy="tangram")
    (ld,) = _loaded(d)
    assert ld.model == "other"  # the warm minimum, by name
    out = d.at(2.0).arrive(reward("a"))
    (un,) = of(out, cmd.UnloadModel)
    (ld2,) = of(out, cmd.LoadModel)
    assert un.instance_id == ld.instance_id and ld2.model == "rm"


def test_gpu_action_gets_the_devices_of_an_idle_instance_never_a_busy_one() -> None:
    d = Driver([gpu_node("g0", gpus=2)], [RM], policy="tangram")
    assert len(_loaded(d)) == 2  # both devices hold an rm instance
    gpu = Resources(cpu=1, memory_mb=256, gpu=1, gpu_memory_mb=8000)
    out = d.at(5).arrive(reward("r0"), ActionSpec("g1", demand=gpu))
    (b,) = of(out, cmd.RunBatch)
    (un,) = of(out, cmd.UnloadModel)
    assert un.park and un.instance_id != b.instance_id
    assert "g1" in starts(out) and d.status("g1") is Status.STARTING
    out = d.arrive(ActionSpec("g2", demand=gpu))
    assert not of(out, cmd.UnloadModel) and d.status("g2") is Status.QUEUED  # rm is busy
    out = d.at(6)(ev.BatchFinished(6.0, b.batch_id, b.instance_id, outputs={"r0": 1}))
    (un2,) = of(out, cmd.UnloadModel)
    assert un2.instance_id == b.instance_id and "g2" in starts(out)


def test_actions_submitted_together_are_scored_in_one_batch() -> None:
    """request-in, batch-out: a GRPO group's answers reach the core as one ActionsArrived and
    leave in one RunBatch; arriving one event at a time, the first would go alone."""
    def run(together: bool) -> list[int]:
        d = Driver([gpu_node("g0", gpus=1)], [ModelSpec("rm", memory_mb=8000, alpha=1.0, beta=0.01)],
                   policy="tangram")
        d.tick()  # boots the model's instance
        inst = next(iter(d.core.planner.instances))
        d(ev.ModelLoaded(d.t, inst, ok=True))
        specs = [reward(f"r{i}") for i in range(3)]
        if together:
            out = d(ev.ActionsArrived(d.t, tuple(specs)))
        else:
            out = [c for s in specs for c in d.arrive(s)]
        return [len(c.actions) for c in out if isinstance(c, cmd.RunBatch)]

    assert run(together=True) == [3]
    assert run(together=False) == [1]
