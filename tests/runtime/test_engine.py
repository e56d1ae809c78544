"""The engine over a fake executor: submit, results, idempotency, cancel, bounds, close."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.errors import ClosedError, InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.engine import Engine, EngineConfig, Overloaded, UnknownAction


def spec(i: object, sleep: float = 0.0, **kw: object) -> ActionSpec:
    return ActionSpec(id=f"a{i}", demand=Resources(cpu=1, memory_mb=64), payload={"sleep": sleep},
                      **kw)


async def engine(**kw: object) -> tuple[Engine, FakeExecutor]:
    ex = FakeExecutor(cpu=2)
    eng = Engine(ex, EngineConfig(tick_s=0.05, **kw), core_factory=core_factory)
    await eng.start()
    return eng, ex


async def test_submit_and_results() -> None:
    eng, ex = await engine()
    ids = await eng.submit([spec(i, 0.01) for i in range(5)])
    results = [await eng.result(i, wait=5) for i in ids]
    assert [r.status for r in results] == [Status.SUCCEEDED] * 5
    assert all(r.output == {"echo": {"sleep": 0.01}} for r in results)
    assert all(r.act is not None and r.act >= 0 for r in results)
    st = eng.stats()
    assert st["act"]["code"]["count"] == 5 and st["finished"]["code"]["succeeded"] == 5
    assert st["queue_length"] == 0
    await eng.aclose()
    assert ex.closed


async def test_idempotency_key_runs_once() -> None:
    eng, ex = await engine()
    first = await eng.submit(spec(1, 0.05), idempotency_key="k1")
    again = await eng.submit(spec(2, 0.05), idempotency_key="k1")  # a retry with a new body
    assert first == again == ["a1"]
    await eng.result("a1", wait=5)
    assert ex.runs == {"a1": 1}
    batch = await eng.submit([spec(3), spec(4)], idempotency_key="k2")
    assert await eng.submit([spec(5), spec(6)], idempotency_key="k2") == batch == ["a3", "a4"]
    await eng.aclose()


async def test_duplicate_id_rejected() -> None:
    eng, _ = await engine()
    await eng.submit(spec(1))
    with pytest.raises(InvalidAction):
        await eng.submit(spec(1))
    await eng.aclose()


async def test_result_wait_semantics_and_unknown() -> None:
    eng, _ = await engine()
    (aid,) = await eng.submit(spec(1, 0.3))
    assert await eng.result(aid, wait=0) is None
    assert eng.status(aid) in (Status.QUEUED, Status.RUNNING)
    assert (await eng.result(aid)).status == Status.SUCCEEDED
    with pytest.raises(UnknownAction):
        await eng.result("nope", wait=0)
    await eng.aclose()


async def test_cancel_queued_action() -> None:
    eng, ex = await engine()
    await eng.submit([spec(i, 0.5) for i in range(3)])  # 2 cores: a2 queues
    await asyncio.sleep(0.05)
    assert await eng.cancel("a2") is True
    res = await eng.result("a2", wait=5)
    assert res.status == Status.CANCELLED
    assert "a2" not in ex.runs
    await eng.aclose()


async def test_overload_sheds() -> None:
    eng, _ = await engine(max_pending=3)
    await eng.submit([spec(i, 0.2) for i in range(3)])
    with pytest.raises(Overloaded):
        await eng.submit(spec(9))
    assert eng.stats()["shed"] == 1
    await eng.aclose()


async def test_results_bounded() -> None:
    eng, _ = await engine(max_results=3)
    for i in range(6):
        await eng.run(spec(i))
    with pytest.raises(UnknownAction):
        eng.peek("a0")
    assert eng.peek("a5") is not None
    await eng.aclose()


async def test_aclose_cancels_running_and_refuses_new() -> None:
    eng, _ = await engine()
    (aid,) = await eng.submit(spec(1, 10))
    await asyncio.sleep(0.05)
    waiter = asyncio.ensure_future(eng.result(aid))
    await eng.aclose()
    assert (await waiter).status == Status.CANCELLED
    with pytest.raises(ClosedError):
        await eng.submit(spec(2))


async def test_cluster_view_lists_nodes() -> None:
    eng, _ = await engine()
    cl = eng.cluster_view().to_dict()
    if cl["nodes"]:  # the real core exposes a view
        node = cl["nodes"][0]
        assert node["name"] == "fake" and node["capacity"]["cpu"] == 2
        assert node["warm_pools"] == {"python": 1}
    await eng.aclose()


async def test_result_wait_times_out_and_cancelled_waiters_leave_no_trace() -> None:
    eng, _ = await engine()
    (aid,) = await eng.submit(spec(1, 0.3))
    assert await eng.result(aid, wait=0.02) is None  # unfinished after the wait
    gone = asyncio.ensure_future(eng.result(aid, wait=30))
    kept = asyncio.ensure_future(eng.result(aid))
    await asyncio.sleep(0.01)
    gone.cancel()
    res = await kept
    assert res is not None and res.status == Status.SUCCEEDED
    assert gone.cancelled() and not eng._waiters  # no waiter left behind
    (slow,) = await eng.submit(spec(2, 0.05))
    got = await eng.result(slow, wait=1e300)  # a huge wait is a wait without a timer
    assert got is not None and got.status == Status.SUCCEEDED
    await eng.aclose()


def test_restamp_is_replace_of_time() -> None:
    import dataclasses

    from arl_tangram.core import events as E
    from arl_tangram.runtime.engine import _restamp

    @dataclasses.dataclass(frozen=True, slots=True)
    class Odd(E.Event):  # a field outside __init__: the generic path
        extra: int = dataclasses.field(default=7, init=False)

    evs = [E.ActionFinished(1.0, "a", Status.FAILED, {"x": 1}, "why", 0.5), E.Tick(1.0),
           E.WarmPoolReport(1.0, "n", "python", 3), E.SessionRequested(1.0, "s", ttl_s=9.0),
           Odd(1.0)]
    for ev in evs:
        got = _restamp(ev, 42.0)
        assert got == dataclasses.replace(ev, time=42.0) and type(got) is type(ev)
        assert got.time == 42.0 and ev.time == 1.0
