"""The core on a judge engine (``ModelSpec.max_seqs > 0``, issue 38): batches join running ones
up to the instance's sequences; a dead engine's batches in flight are requeued once."""

from __future__ import annotations

from core_helpers import Driver, gpu_node, of, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import ModelSpec

ENGINE = ModelSpec("gj", kind="genjudge", memory_mb=8000, alpha=0.5, beta=0.01, max_batch=8,
                   max_instances=1, load_s=5.0, max_seqs=12)


def _ready(d: Driver) -> str:
    (ld,) = of(d.tick(), cmd.LoadModel)
    d(ev.ModelLoaded(1.0, ld.instance_id))
    return ld.instance_id


def test_batches_join_running_ones_up_to_max_seqs() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [ENGINE], policy="tangram", model_prewarm=False)
    iid = _ready(d)
    (b1,) = of(d.arrive(reward("a0", "gj")), cmd.RunBatch)  # alone: starts at once, no knee wait
    assert [a.id for a in b1.actions] == ["a0"] and b1.instance_id == iid
    # a0 runs; a group arriving together joins the instance while it does, max_batch (8) at a
    # time, then one at a time; arrivals one by one join one by one
    out = d(ev.ActionsArrived(0.0, tuple(reward(f"b{i}", "gj") for i in range(9))))
    batches = of(out, cmd.RunBatch)
    assert [[a.id for a in b.actions] for b in batches] == [[f"b{i}" for i in range(8)], ["b8"]]
    (b2,) = of(d.arrive(reward("b9", "gj")), cmd.RunBatch)
    assert [a.id for a in b2.actions] == ["b9"]
    # 11 in flight: one sequence free; of a group of two, one joins, one waits
    out = d(ev.ActionsArrived(0.0, (reward("c0", "gj"), reward("c1", "gj"))))
    (b3,) = of(out, cmd.RunBatch)
    assert [a.id for a in b3.actions] == ["c0"]
    assert d.status("c1") is Status.QUEUED
    (view,) = d.core.view().instances
    assert (view.state, view.queue) == ("busy", 12)
    # the first batch (a0) ends first: its sequence is free, c1 joins
    out = d(ev.BatchFinished(2.0, b1.batch_id, iid, outputs={"a0": 1.0}))
    (b4,) = of(out, cmd.RunBatch)
    assert [a.id for a in b4.actions] == ["c1"]
    res = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert res["a0"].status is Status.SUCCEEDED and res["a0"].output == 1.0
    # a later batch ends before the primary one: its actions are delivered, the rest run on
    out = d(ev.BatchFinished(3.0, b3.batch_id, iid, outputs={"c0": 1.0}))
    assert {c.result.id for c in of(out, cmd.Deliver)} == {"c0"}
    (view,) = d.core.view().instances
    assert view.queue == 11  # b0..b9 and c1
    assert not of(out, cmd.RunBatch)  # nothing queued


def test_dead_engine_requeues_every_batch_in_flight_once() -> None:
    d = Driver([gpu_node("g0", gpus=1)], [ENGINE], policy="tangram", model_prewarm=False)
    iid = _ready(d)
    of(d.arrive(reward("a0", "gj")), cmd.RunBatch)
    of(d.arrive(*[reward(f"b{i}", "gj") for i in range(3)]), cmd.RunBatch)
    out = d(ev.ModelUnloaded(2.0, iid, False, "engine process exited with -9"))
    (ld,) = of(out, cmd.LoadModel)  # a replacement at once
    assert not of(out, cmd.Deliver)  # requeued, not failed
    assert all(d.status(a) is Status.QUEUED for a in ("a0", "b0", "b1", "b2"))
    out = d(ev.ModelLoaded(3.0, ld.instance_id))
    (b,) = of(out, cmd.RunBatch)  # all four at once on the replacement
    assert sorted(a.id for a in b.actions) == ["a0", "b0", "b1", "b2"]
    # the replacement dies too: requeued only once, so they fail now, with the reason
    out = d(ev.ModelUnloaded(4.0, ld.instance_id, False, "engine hung"))
    res = {c.result.id: c.result for c in of(out, cmd.Deliver)}
    assert sorted(res) == ["a0", "b0", "b1", "b2"]
    assert all(r.status is Status.FAILED and "engine hung" in r.reason for r in res.values())


def test_max_seqs_zero_keeps_one_batch_per_instance() -> None:
    one = ModelSpec("gj", kind="genjudge", memory_mb=8000, alpha=0.5, beta=0.01, max_batch=8,
                    max_instances=1, load_s=5.0)
    d = Driver([gpu_node("g0", gpus=1)], [one], policy="tangram", model_prewarm=False)
    _ready(d)
    assert len(of(d.arrive(reward("a0", "gj")), cmd.RunBatch)) == 1
    assert not of(d.arrive(reward("a1", "gj")), cmd.RunBatch)
    assert d.status("a1") is Status.QUEUED


def test_two_judges_on_one_device_the_idle_one_unloaded_and_reloaded_on_demand() -> None:
    """On a CPU node a judge engine is not parked (its manager answers parked=False): the core
    unloads the idle judge for the one that has work, and loads it again cold when its own work
    comes back, charging the load time the manager measured."""
    a = ModelSpec("ja", kind="genjudge", memory_mb=8000, load_s=30.0, max_seqs=8, max_instances=1)
    b = ModelSpec("jb", kind="genjudge", memory_mb=8000, load_s=30.0, max_seqs=8, max_instances=1)
    d = Driver([gpu_node("g0", gpus=1, per_dev=10000)], [a, b], policy="tangram",
               model_prewarm=False)
    (ld,) = of(d.arrive(reward("x0", "ja")), cmd.LoadModel)
    assert ld.model == "ja"
    (run,) = of(d(ev.ModelLoaded(1.0, ld.instance_id, load_s=41.5)), cmd.RunBatch)
    d(ev.BatchFinished(2.0, run.batch_id, ld.instance_id, outputs={"x0": 1.0}))
    out = d.at(3.0).arrive(reward("y0", "jb"))  # jb has none: ja (idle) makes room
    (un,) = of(out, cmd.UnloadModel)
    (ld_b,) = of(out, cmd.LoadModel)  # in the same pass, on the device ja leaves
    assert (un.instance_id, un.park) == (ld.instance_id, True)
    assert (ld_b.model, ld_b.devices, ld_b.from_host) == ("jb", (0,), False)
    d(ev.ModelUnloaded(4.0, un.instance_id, False))  # not parked: the engine process ended
    (rb,) = of(d(ev.ModelLoaded(50.0, ld_b.instance_id, load_s=45.0)), cmd.RunBatch)
    d(ev.BatchFinished(51.0, rb.batch_id, ld_b.instance_id, outputs={"y0": 0.0}))
    out = d.at(60.0).arrive(reward("x1", "ja"))  # ja's work is back: jb, idle, goes
    (un2,) = of(out, cmd.UnloadModel)
    (ld_a,) = of(out, cmd.LoadModel)
    assert un2.instance_id == ld_b.instance_id
    assert (ld_a.model, ld_a.from_host) == ("ja", False)  # nothing was parked: a cold load
    d(ev.ModelUnloaded(61.0, un2.instance_id, False))
    (ra,) = of(d(ev.ModelLoaded(100.0, ld_a.instance_id, load_s=39.0)), cmd.RunBatch)
    assert [x.id for x in ra.actions] == ["x1"]


def test_queued_actions_join_the_least_loaded_engine_levelling_them() -> None:
    """Several instances: each batch goes to the one with the fewest sequences in flight, just
    large enough to level it with the next one (its sequences run fastest there)."""
    two = ModelSpec("gj", kind="genjudge", memory_mb=8000, alpha=0.5, beta=0.01, max_batch=8,
                    max_instances=2, load_s=5.0, max_seqs=12)
    d = Driver([gpu_node("g0", gpus=2)], [two], policy="tangram", model_prewarm=True)
    for ld in of(d.tick(), cmd.LoadModel):
        d(ev.ModelLoaded(1.0, ld.instance_id))
    assert len(d.core.view().instances) == 2
    out = d(ev.ActionsArrived(1.0, tuple(reward(f"a{i}", "gj") for i in range(5))))
    got = [(b.instance_id, [a.id for a in b.actions]) for b in of(out, cmd.RunBatch)]
    assert got == [("gj#1", ["a0"]), ("gj#2", ["a1", "a2"]), ("gj#1", ["a3", "a4"])]
    assert {v.id: v.queue for v in d.core.view().instances} == {"gj#1": 3, "gj#2": 2}
    (b,) = of(d.arrive(reward("b0", "gj")), cmd.RunBatch)
    assert b.instance_id == "gj#2"
