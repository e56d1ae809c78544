"""The virtual executor answers commands after the simulator's true durations."""

import pytest

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, Status
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.executor import VirtualExecutor
from arl_tangram.sim.loop import EventLoop
from arl_tangram.sim.metrics import UsageMeter
from arl_tangram.sim.trace import SimAction

CLUSTER = ClusterSpec(
    (NodeSpec("n0", Resources(cpu=8, memory_mb=8192, gpu=2, gpu_memory_mb=20000)),),
    (ModelSpec("rm", alpha=0.5, beta=0.1, load_s=10.0, swap_s=2.0),),
)


def make(truth):
    loop = EventLoop()
    events: list[E.Event] = []
    usage = UsageMeter(CLUSTER.total_capacity(), lambda: loop.now)
    ex = VirtualExecutor(
        loop,
        CLUSTER,
        truth,
        events.append,
        usage=usage,
        session_cold_start={"s1": 3.0},
        warm_cold_start_s=0.25,
    )
    return loop, ex, events, usage


def elastic_spec(aid="a", p=1.0):
    return ActionSpec(
        aid,
        ActionKind.TEST,
        Resources(cpu=1, memory_mb=100),
        Elasticity(1, 8, speedup=Speedup(p)),
        timeout_s=1000,
    )


def test_cold_start_then_work_divided_by_speedup():
    truth = {"a": SimAction(ActionKind.TEST, work_s=8.0, cold_start_s=1.5)}
    loop, ex, events, _ = make(truth)
    ex.execute(C.StartAction(elastic_spec(), "n0", Resources(cpu=4, memory_mb=100), warm=False))
    loop.run()
    started, finished = events
    assert isinstance(started, E.ActionStarted) and started.time == pytest.approx(1.5)
    assert started.cold_start_s == pytest.approx(1.5)
    assert isinstance(finished, E.ActionFinished) and finished.status is Status.SUCCEEDED
    assert finished.time == pytest.approx(1.5 + 8.0 / 4)
    assert ex.cold_starts == 1


def test_resize_recomputes_the_remaining_work():
    truth = {"a": SimAction(ActionKind.TEST, work_s=8.0, cold_start_s=0.0)}
    loop, ex, events, _ = make(truth)
    ex.execute(C.StartAction(elastic_spec(), "n0", Resources(cpu=1, memory_mb=100), warm=False))
    loop.run(until=2.0)  # 2 s of 8 done at speed 1
    ex.execute(C.ResizeAction("a", "n0", Resources(cpu=3, memory_mb=100)))
    loop.run()
    finished = [e for e in events if isinstance(e, E.ActionFinished)]
    assert len(finished) == 1  # the stale finish of the first allotment is dropped
    assert finished[0].time == pytest.approx(2.0 + 6.0 / 3)


def test_warm_pool_sandboxes_skip_the_cold_start_and_refill():
    truth = {"a": SimAction(ActionKind.CODE, work_s=1.0, cold_start_s=5.0)}
    loop, ex, events, _ = make(truth)
    ex.execute(C.ResizeWarmPool("n0", "python", 1))
    loop.run()
    assert [type(e) for e in events] == [E.WarmPoolReport]
    assert events[0].time == pytest.approx(0.25) and events[0].warm == 1
    spec = ActionSpec("a", ActionKind.CODE, Resources(cpu=1), tag="python")
    ex.execute(C.StartAction(spec, "n0", Resources(cpu=1), warm=True))
    loop.run()
    started = next(e for e in events if isinstance(e, E.ActionStarted))
    assert started.time == pytest.approx(0.25) and started.cold_start_s == 0.0
    assert ex.warm_starts == 1 and ex.cold_starts == 0
    reports = [e for e in events if isinstance(e, E.WarmPoolReport)]
    assert reports[-1].warm == 1  # refilled after use


def test_session_actions_wait_for_the_session_sandbox_only_once():
    truth = {
        "a": SimAction(ActionKind.TOOL, 1.0, cold_start_s=9.0),
        "b": SimAction(ActionKind.TOOL, 1.0, cold_start_s=9.0),
    }
    loop, ex, events, _ = make(truth)
    ex.execute(C.OpenSession("s1", "n0", Resources(memory_mb=500), 60.0))
    spec_a = ActionSpec("a", ActionKind.TOOL, Resources(cpu=1), session="s1")
    ex.execute(C.StartAction(spec_a, "n0", Resources(cpu=1)))
    loop.run()
    spec_b = ActionSpec("b", ActionKind.TOOL, Resources(cpu=1), session="s1")
    ex.execute(C.StartAction(spec_b, "n0", Resources(cpu=1)))
    loop.run()
    starts = [e for e in events if isinstance(e, E.ActionStarted)]
    assert starts[0].time == pytest.approx(3.0)  # the session's sandbox took 3 s to create
    assert starts[1].cold_start_s == 0.0 and starts[1].time == pytest.approx(4.0)


def test_timeout_ends_a_long_action_at_its_limit():
    truth = {"a": SimAction(ActionKind.CODE, work_s=100.0, cold_start_s=0.0)}
    loop, ex, events, _ = make(truth)
    spec = ActionSpec("a", ActionKind.CODE, Resources(cpu=1), timeout_s=5.0)
    ex.execute(C.StartAction(spec, "n0", Resources(cpu=1)))
    loop.run()
    fin = events[-1]
    assert fin.status is Status.TIMED_OUT and fin.time == pytest.approx(5.0)


def test_cancel_drops_the_run_without_a_report():
    truth = {"a": SimAction(ActionKind.CODE, work_s=10.0, cold_start_s=0.0)}
    loop, ex, events, usage = make(truth)
    ex.execute(
        C.StartAction(ActionSpec("a", ActionKind.CODE, Resources(cpu=2)), "n0", Resources(cpu=2))
    )
    loop.run(until=1.0)
    ex.execute(C.CancelAction("a", "n0"))
    loop.run()
    assert [type(e) for e in events] == [E.ActionStarted]
    assert usage.busy["cpu"] == 0.0 and usage.held["cpu"] == 0.0


def test_model_load_swap_and_batch_latency():
    truth = {
        "x": SimAction(ActionKind.REWARD, 0.1, model="rm"),
        "y": SimAction(ActionKind.REWARD, 0.3, model="rm", fails=True),
    }
    loop, ex, events, _ = make(truth)
    ex.execute(C.LoadModel("i0", "rm", "n0", (0,)))
    xs = tuple(ActionSpec(a, ActionKind.REWARD, Resources(), model="rm") for a in ("x", "y"))
    ex.execute(C.RunBatch("b0", "i0", "n0", "rm", xs))  # queued until the load completes
    loop.run()
    loaded, batch = events
    assert isinstance(loaded, E.ModelLoaded) and loaded.time == pytest.approx(10.0)
    assert isinstance(batch, E.BatchFinished)
    assert batch.time == pytest.approx(10.0 + 0.5 + 0.1 + 0.3)
    assert set(batch.outputs) == {"x"} and set(batch.failed) == {"y"}
    ex.execute(C.UnloadModel("i0", "n0", park=True))
    ex.execute(C.LoadModel("i1", "rm", "n0", (1,), from_host=True))
    loop.run()
    assert isinstance(events[-2], E.ModelUnloaded) and events[-2].parked
    assert events[-1].time - events[-2].time == pytest.approx(2.0)


def test_usage_integrates_busy_and_held_resources():
    truth = {"a": SimAction(ActionKind.CODE, work_s=4.0, cold_start_s=2.0)}
    loop, ex, _events, usage = make(truth)
    ex.execute(
        C.StartAction(
            ActionSpec("a", ActionKind.CODE, Resources(cpu=2)), "n0", Resources(cpu=2), warm=False
        )
    )
    loop.run()
    util, idle = usage.totals()
    # 6 s elapsed on 8 cores: busy 2 cores x 4 s, held-but-idle 2 cores x 2 s of cold start.
    assert util["cpu"] == pytest.approx(8.0 / 48.0)
    assert idle["cpu"] == pytest.approx(4.0 / 48.0)


def test_unloading_fails_batches_still_queued_on_the_instance():
    truth = {"x": SimAction(ActionKind.REWARD, 0.1, model="rm")}
    loop, ex, events, _ = make(truth)
    ex.execute(C.LoadModel("i0", "rm", "n0", (0,)))
    x = ActionSpec("x", ActionKind.REWARD, Resources(), model="rm")
    ex.execute(C.RunBatch("b0", "i0", "n0", "rm", (x,)))
    ex.execute(C.UnloadModel("i0", "n0"))
    loop.run()
    batch = next(e for e in events if isinstance(e, E.BatchFinished))
    assert batch.failed == {"x": "instance unloaded"} and not batch.outputs


def test_sim_package_exports_what_it_declares():
    import arl_tangram.sim as sim

    assert sorted(sim.__all__) == sorted(n for n in sim.__all__ if hasattr(sim, n))
    assert {"Simulator", "SimConfig", "load_trace", "get_workload", "run_policy"} <= set(
        sim.__all__
    )


def test_the_simulators_start_shortcut_is_the_executors_own_handler():
    # Simulator._emit runs StartAction through VirtualExecutor._start directly (its commonest
    # command): that must be what `execute` would dispatch it to.
    from arl_tangram.core import commands as C
    from arl_tangram.sim.executor import _HANDLERS, VirtualExecutor

    assert _HANDLERS[C.StartAction] is VirtualExecutor._start


def test_fast_warm_pool_report_is_the_dataclass_built_normally():
    from arl_tangram.core import events as E
    from arl_tangram.sim.executor import make_warm_report

    fast, ref = (
        make_warm_report(2.5, "cpu-0", "python", 3),
        E.WarmPoolReport(2.5, "cpu-0", "python", 3),
    )
    assert type(fast) is E.WarmPoolReport and fast == ref and repr(fast) == repr(ref)


def _finish_on(node, spec, work_s, cpus, resize_at=None, resize_to=1.0):
    """When ``spec`` (``work_s`` of work) finishes alone on ``node`` started at ``cpus``."""
    loop = EventLoop()
    events: list[E.Event] = []
    ex = VirtualExecutor(
        loop,
        ClusterSpec((node,)),
        {spec.id: SimAction(spec.kind, work_s=work_s, cold_start_s=0.0)},
        events.append,
    )
    ex.execute(C.StartAction(spec, node.name, Resources(cpu=cpus, memory_mb=100), warm=False))
    if resize_at is not None:
        loop.run(until=resize_at)
        ex.execute(C.ResizeAction(spec.id, node.name, Resources(cpu=resize_to, memory_mb=100)))
    loop.run()
    return next(e.time for e in events if isinstance(e, E.ActionFinished))


def test_a_wide_start_pays_the_nodes_parallel_start_once():
    node = NodeSpec(
        "n",
        Resources(cpu=4, memory_mb=4096),
        parallel_speedup=((2.0, 1.5),),
        parallel_start_s=((2.0, 0.25),),
        dispatch_s={"test": 0.5},
    )
    el = ActionSpec(
        "a",
        ActionKind.TEST,
        Resources(cpu=1, memory_mb=100),
        Elasticity(1, 4, speedup=Speedup(1.0)),
        timeout_s=1000,
    )
    # on 2 cores: the dispatch, then the start, then 3 s of work at 1.5x
    assert _finish_on(node, el, 3.0, 2.0) == pytest.approx(0.5 + 0.25 + 2.0)
    # on 3 cores (past the last point: a worker more than at 2, 0.25 s each; 1.5x efficiency)
    assert _finish_on(node, el, 3.0, 3.0) == pytest.approx(0.5 + 0.5 + 3.0 / 2.25)
    # on one core, then grown: its workers started while it had one, nothing to pay
    assert _finish_on(node, el, 3.0, 1.0) == pytest.approx(0.5 + 3.0)
    assert _finish_on(node, el, 3.0, 1.0, resize_at=1.5, resize_to=2.0) == pytest.approx(
        1.5 + 2.0 / 1.5
    )
    # nothing parallel (p = 0), or a rigid action on 2 cores: no workers to start
    serial = ActionSpec(
        "a",
        ActionKind.TEST,
        Resources(cpu=1, memory_mb=100),
        Elasticity(1, 4, speedup=Speedup(0.0)),
        timeout_s=1000,
    )
    assert _finish_on(node, serial, 3.0, 2.0) == pytest.approx(0.5 + 3.0 / 0.75)
    rigid = ActionSpec("a", ActionKind.TEST, Resources(cpu=2, memory_mb=100), timeout_s=1000)
    assert _finish_on(node, rigid, 3.0, 2.0) == pytest.approx(0.5 + 3.0 / 0.75)
    # an elastic action along another dimension: not a CPU's workers
    other = ActionSpec(
        "a",
        ActionKind.TEST,
        Resources(cpu=2, memory_mb=100),
        Elasticity(1, 4, dim="memory_mb", speedup=Speedup(1.0)),
        timeout_s=1000,
    )
    no_start = NodeSpec(
        "n",
        Resources(cpu=4, memory_mb=4096),
        parallel_speedup=((2.0, 1.5),),
        dispatch_s={"test": 0.5},
    )
    assert _finish_on(node, other, 3.0, 2.0) == _finish_on(no_start, other, 3.0, 2.0)
    # the start alone measured on a node (no speedup, no dispatch) is still applied
    bare = NodeSpec("n", Resources(cpu=4, memory_mb=4096), parallel_start_s=((2.0, 0.25),))
    assert _finish_on(bare, el, 3.0, 2.0) == pytest.approx(0.25 + 1.5)


def _forward_run(device_cores, rigid_cpus, devices=(0,), work=1.0, cpu=2):
    """A batch of one 0.3 s reward (alpha 0.1) on a 2-core node with a measured speedup, beside
    ``rigid_cpus`` rigid 1-core actions of ``work`` s each; (the batch's event, the actions'
    finish times)."""
    node = NodeSpec(
        "n",
        Resources(cpu=cpu, memory_mb=4096, gpu=2, gpu_memory_mb=8192),
        parallel_speedup=((2.0, 1.6),),
        device_cores=device_cores,
    )
    loop = EventLoop()
    events: list[E.Event] = []
    truth = {"r": SimAction(ActionKind.REWARD, 0.3, model="rm")}
    truth |= {
        f"t{i}": SimAction(ActionKind.TEST, work, cold_start_s=0.0) for i in range(rigid_cpus)
    }
    ex = VirtualExecutor(
        loop,
        ClusterSpec((node,), (ModelSpec("rm", alpha=0.1, beta=0.0, load_s=0.0),)),
        truth,
        events.append,
    )
    for i in range(rigid_cpus):
        spec = ActionSpec(f"t{i}", ActionKind.TEST, Resources(cpu=1, memory_mb=100), timeout_s=100)
        ex.execute(C.StartAction(spec, "n", Resources(cpu=1, memory_mb=100), warm=True))
    ex.execute(C.LoadModel("i0", "rm", "n", devices))
    loop.run(until=0.0)
    ex.execute(
        C.RunBatch(
            "b0", "i0", "n", "rm", (ActionSpec("r", ActionKind.REWARD, Resources(), model="rm"),)
        )
    )
    loop.run()
    (batch,) = [e for e in events if isinstance(e, E.BatchFinished)]  # one, never a stale one
    ends = sorted(e.time for e in events if isinstance(e, E.ActionFinished))
    return batch, ends


def test_a_forward_on_cpu_backed_devices_shares_the_nodes_processor():
    # no sandbox beside it: one busy core, the forward's own latency
    batch, _ = _forward_run(1.0, 0)
    assert batch.time == pytest.approx(0.4) and batch.latency_s == pytest.approx(0.4)
    # two 1-core tests beside it: 3 busy cores on a 2-core node that gives 1.6 of them, so
    # every run goes at 1.6 / 3 while the forward lasts (0.4 / (1.6/3) = 0.75 s), then the
    # tests alone at 1.6 / 2 = 0.8: they had done 0.4 s of work, 0.6 s left -> 0.75 s more
    batch, ends = _forward_run(1.0, 2)
    assert batch.time == pytest.approx(0.75) and batch.latency_s == pytest.approx(0.75)
    assert ends == pytest.approx([1.5, 1.5])
    # an instance of two devices: 2 cores of forward, 4 busy -> 1.6 / 4 each
    batch, ends = _forward_run(1.0, 2, devices=(0, 1))
    assert batch.latency_s == pytest.approx(0.4 / 0.4)
    assert ends == pytest.approx([1.0 + 0.6 / 0.8] * 2)
    # a 0.1 s test ends during the forward: 2 busy at 0.8 until 0.125, then the forward alone
    # (its end first planned at the shared speed is stale: 0.1 done, 0.3 left at 1.0)
    batch, ends = _forward_run(1.0, 1, work=0.1)
    assert ends == pytest.approx([0.125]) and batch.time == pytest.approx(0.425)
    # a node that states no CPU capacity: its measured speedup, unbounded (2 cores at 0.8)
    batch, _ = _forward_run(2.0, 0, cpu=0)
    assert batch.latency_s == pytest.approx(0.5)
    # devices of their own (GPUs): the forward takes nothing from the tests
    batch, ends = _forward_run(0.0, 2)
    assert batch.latency_s == pytest.approx(0.4) and ends == pytest.approx([1.25, 1.25])


def test_a_batch_is_reported_its_kinds_measured_engine_cost_after_its_forward():
    def batch_of(dispatch, device_cores=0.0):
        node = NodeSpec(
            "n",
            Resources(cpu=2, memory_mb=4096, gpu=1, gpu_memory_mb=8192),
            parallel_speedup=((2.0, 1.6),),
            dispatch_s=dispatch,
            device_cores=device_cores,
        )
        loop = EventLoop()
        events: list[E.Event] = []
        model = ModelSpec("rm", alpha=0.1, beta=0.0, load_s=0.0)
        truth = {a: SimAction(ActionKind.REWARD, 0.2, model="rm") for a in ("r", "s")}
        ex = VirtualExecutor(loop, ClusterSpec((node,), (model,)), truth, events.append)
        ex.execute(C.LoadModel("i0", "rm", "n", (0,)))
        loop.run(until=0.0)
        for b, a in (("b0", "r"), ("b1", "s")):  # two batches queued: one after the other
            spec = ActionSpec(a, ActionKind.REWARD, Resources(), model="rm")
            ex.execute(C.RunBatch(b, "i0", "n", "rm", (spec,)))
        loop.run()
        return [(e.time, e.latency_s) for e in events if isinstance(e, E.BatchFinished)]

    # the reward kind's 0.05 s after each forward of 0.3 s; the latency reported: the forward's
    got = batch_of({"default": 0.004, "reward": 0.05})
    assert got == [pytest.approx((0.35, 0.3)), pytest.approx((0.70, 0.3))]
    # the same on CPU-backed devices (the forward alone on the node: its own speed)
    got = batch_of({"default": 0.004, "reward": 0.05}, device_cores=1.0)
    assert got == [pytest.approx((0.35, 0.3)), pytest.approx((0.70, 0.3))]
    # a default, or another kind's cost, is not a model's: nothing added
    assert batch_of({"default": 0.004, "judge": 0.05}) == [
        pytest.approx((0.3, 0.3)),
        pytest.approx((0.6, 0.3)),
    ]
