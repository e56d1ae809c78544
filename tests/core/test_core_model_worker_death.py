"""The core when a model instance dies under it (issue 25: supervision of model workers): an
unsolicited ``ModelUnloaded`` with a reason drops the instance, requeues its batch in flight once
(``model_worker_retries``), fails it the next time, and loads a replacement at once."""

from __future__ import annotations

import pytest
from core_helpers import Driver, gpu_node, of, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.config import CoreConfig

RM = ModelSpec("rm", memory_mb=8000, alpha=0.04, beta=0.01, max_batch=16, max_instances=1,
               load_s=10.0, swap_s=1.0)
DIED = "the worker of model instance X died mid-batch: WorkerKilled"


def _started(d: Driver, *aids: str) -> tuple[cmd.LoadModel, cmd.RunBatch]:
    (ld,) = of(d.arrive(*[reward(a) for a in aids]), cmd.LoadModel)
    (b,) = of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    return ld, b


@pytest.mark.parametrize("policy", ["tangram", "fifo", "static-pool"])
def test_dead_instance_requeues_its_batch_once_and_is_replaced(policy: str) -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy=policy, model_prewarm=False)
    ld, b = _started(d, "a", "b")
    out = d(ev.ModelUnloaded(2.0, ld.instance_id, False, DIED))
    assert not of(out, cmd.Deliver)  # nothing lost: both wait for the replacement
    assert d.status("a") is Status.QUEUED and d.status("b") is Status.QUEUED
    (ld2,) = of(out, cmd.LoadModel)  # loaded again at once, on the devices the dead one freed
    assert ld2.instance_id != ld.instance_id and ld2.devices == ld.devices
    assert not of(out, cmd.UnloadModel)  # (the node dropped it already)
    # the dead batch's late BatchFinished (its failure) changes nothing
    late = d(ev.BatchFinished(2.1, b.batch_id, ld.instance_id, failed={"a": DIED, "b": DIED}))
    assert not of(late, cmd.Deliver)
    (b2,) = of(d(ev.ModelLoaded(3.0, ld2.instance_id)), cmd.RunBatch)
    assert sorted(a.id for a in b2.actions) == ["a", "b"]
    out = d(ev.BatchFinished(4.0, b2.batch_id, ld2.instance_id, outputs={"a": 1.0, "b": 2.0}))
    res = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert res["a"].status is Status.SUCCEEDED and res["a"].output == 1.0
    assert res["a"].attempts == 2 and res["b"].attempts == 2  # each scored once, run twice
    assert [i.id for i in d.core.view().instances] == [ld2.instance_id]


def test_second_death_of_the_same_batch_fails_it_with_the_reason() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_prewarm=False)
    ld, _ = _started(d, "a")
    (ld2,) = of(d(ev.ModelUnloaded(2.0, ld.instance_id, False, DIED)), cmd.LoadModel)
    of(d(ev.ModelLoaded(3.0, ld2.instance_id)), cmd.RunBatch)
    out = d(ev.ModelUnloaded(4.0, ld2.instance_id, False, DIED))
    (dl,) = of(out, cmd.Deliver)
    assert dl.result.status is Status.FAILED
    assert "died mid-batch" in dl.result.reason and "tried 2 times" in dl.result.reason
    assert len(of(out, cmd.LoadModel)) == 1  # still replaced: the next actions are served


def test_no_retry_configured_and_non_idempotent_fail_at_once() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_prewarm=False,
               model_worker_retries=0)
    ld, _ = _started(d, "a")
    (dl,) = of(d(ev.ModelUnloaded(2.0, ld.instance_id, False, DIED)), cmd.Deliver)
    assert dl.result.status is Status.FAILED and DIED in dl.result.reason
    d2 = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_prewarm=False)
    (ld,) = of(d2.arrive(reward("n", idempotent=False)), cmd.LoadModel)
    of(d2(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    (dl,) = of(d2(ev.ModelUnloaded(2.0, ld.instance_id, False, DIED)), cmd.Deliver)
    assert dl.result.status is Status.FAILED


def test_idle_instance_death_is_replaced_and_an_asked_unload_is_not() -> None:
    d = Driver([gpu_node("g0", gpus=2)], [RM], policy="tangram", model_prewarm=False)
    (ld,) = of(d.tick(), cmd.LoadModel)  # the warm minimum
    d(ev.ModelLoaded(1.0, ld.instance_id))
    (ld2,) = of(d(ev.ModelUnloaded(2.0, ld.instance_id, False, DIED)), cmd.LoadModel)
    assert ld2.model == "rm"
    d(ev.ModelLoaded(3.0, ld2.instance_id))
    # a ModelUnloaded without a reason for an instance the core did not unload (its manager
    # evicted it) is dropped, not replaced: only a death is
    assert not of(d(ev.ModelUnloaded(4.0, ld2.instance_id, True)), cmd.LoadModel)


def test_config_validates_retries() -> None:
    with pytest.raises(ValueError, match="model_worker_retries"):
        CoreConfig(model_worker_retries=-1)


def test_a_model_whose_instances_keep_dying_fails_its_queue_and_reloads_on_the_next_arrival() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_prewarm=False,
               max_load_failures=3, model_worker_retries=5)
    ld, _ = _started(d, "a", "b")
    for death in range(1, 4):
        out = d(ev.ModelUnloaded(1.0 + death, ld.instance_id, False, DIED))
        if death < 3:  # replaced, and the batch requeued
            assert not of(out, cmd.Deliver)
            (ld,) = of(out, cmd.LoadModel)
            of(d(ev.ModelLoaded(1.5 + death, ld.instance_id)), cmd.RunBatch)
    # the third death with no batch scored between: no replacement, its queue fails
    assert not of(out, cmd.LoadModel)
    assert {i: d.result(i).status for i in "ab"} == {"a": Status.FAILED, "b": Status.FAILED}
    assert d.result("a").reason == f"model rm: 3 instances died with no batch scored between: {DIED}"
    assert d.core.view().instances == ()
    (ld,) = of(d.arrive(reward("c")), cmd.LoadModel)  # the next arrival loads it again
    (b,) = of(d(ev.ModelLoaded(9.0, ld.instance_id)), cmd.RunBatch)
    (dl,) = of(d(ev.BatchFinished(10.0, b.batch_id, ld.instance_id, outputs={"c": 1.0})),
               cmd.Deliver)
    assert dl.result.status is Status.SUCCEEDED


def test_a_scored_batch_resets_the_count_of_deaths() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [RM], policy="tangram", model_prewarm=False,
               max_load_failures=2)
    ld, b = _started(d, "a")
    d(ev.BatchFinished(1.5, b.batch_id, ld.instance_id, outputs={"a": 1.0}))
    for t in (2.0, 4.0):
        (b,) = of(d.arrive(reward(f"x{t}")), cmd.RunBatch)
        out = d(ev.ModelUnloaded(t, ld.instance_id, False, DIED))
        (ld,) = of(out, cmd.LoadModel)  # one death since the last score: replaced
        (b,) = of(d(ev.ModelLoaded(t + 0.5, ld.instance_id)), cmd.RunBatch)
        d(ev.BatchFinished(t + 1.0, b.batch_id, ld.instance_id, outputs={f"x{t}": 1.0}))
        assert d.result(f"x{t}").status is Status.SUCCEEDED


def test_the_cores_instances_asked_one_by_one() -> None:
    """`Core.instance` and `Core.instances_of` (what the engine asks instead of keeping a copy:
    issue 36, item 3) show what `Core.view` shows, by id."""
    d = Driver([gpu_node("g0", gpus=2)], [RM], policy="tangram", model_prewarm=False)
    (ld,) = of(d.arrive(reward("a")), cmd.LoadModel)
    got = d.core.instance(ld.instance_id)
    assert got == d.core.view().instances[0]
    assert (got.model, got.node, got.state, got.queue) == ("rm", "g0", "loading", 0)
    assert d.core.instances_of("rm") == [got]
    assert d.core.instance("nope") is None and d.core.instances_of("other") == []
    d(ev.ModelUnloaded(1.0, ld.instance_id, False, DIED))
    assert d.core.instance(ld.instance_id) is None
    assert [i.id for i in d.core.instances_of("rm")] == [i.id for i in d.core.view().instances]
