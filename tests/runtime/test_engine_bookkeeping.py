"""The engine's bookkeeping at its edges (issue 27, mutation testing of runtime/engine.py):
idempotency keys of several requests expiring in order while results are still held, the exact
TTL, batches without a key, duplicate ids inside one batch, the counters of sheds and submits,
and `max_results` kept exactly."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from fakes import FakeExecutor, core_factory, forgotten

from arl_tangram.core import commands as C
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.clock import ManualClock
from arl_tangram.runtime.engine import Engine, EngineConfig, Overloaded, UnknownAction


def spec(i: object, sleep: float = 0.0) -> ActionSpec:
    return ActionSpec(id=f"a{i}", demand=Resources(cpu=1, memory_mb=64), payload={"sleep": sleep})


async def _engine(clock: ManualClock | None = None, **kw: object) -> tuple[Engine, FakeExecutor]:
    ex = FakeExecutor(cpu=2)
    eng = Engine(ex, EngineConfig(tick_s=0.005, **kw), clock=clock,  # type: ignore[arg-type]
                 core_factory=core_factory)
    await eng.start()
    return eng, ex


async def test_keys_expire_oldest_first_while_later_results_are_held() -> None:
    clock = ManualClock(1000.0)
    eng, ex = await _engine(clock)  # result_ttl_s 600, idempotency_ttl_s 3600
    try:
        await eng.run(spec("old"), idempotency_key="old")  # key until +3600
        clock.advance(1800.0)
        await eng.run(spec("new"), idempotency_key="new")  # key until +5400
        clock.advance(1500.0)
        await eng.run(spec("probe"))  # result until +3900
        clock.advance(300.0)
        await eng.run(spec("held"))  # result held until +4200: still there at +3601
        clock.advance(301.0)  # t = +3601
        await forgotten(eng, "aprobe")
        assert eng.peek("aheld") is not None
        # the old key is gone although a result is still held; the newer one is kept
        assert await eng.submit(spec("old-2"), idempotency_key="old") == ["aold-2"]
        assert await eng.submit(spec("new-2"), idempotency_key="new") == ["anew"]
        await eng.result("aold-2", wait=5)
        assert ex.runs == {"aold": 1, "anew": 1, "aprobe": 1, "aheld": 1, "aold-2": 1}
    finally:
        await eng.aclose()


async def test_a_key_is_gone_at_exactly_its_ttl() -> None:
    clock = ManualClock(1000.0)
    eng, _ = await _engine(clock)
    try:
        await eng.run(spec(1), idempotency_key="k")
        clock.advance(3000.0)
        await eng.run(spec("probe"))  # its result expires at exactly +3600 too
        clock.advance(600.0)
        await forgotten(eng, "aprobe")
        assert await eng.submit(spec(2), idempotency_key="k") == ["a2"]
    finally:
        await eng.aclose()


async def test_batches_without_a_key_are_never_merged() -> None:
    eng, ex = await _engine()
    try:
        first = await eng.submit([spec(1), spec(2)])
        second = await eng.submit([spec(3), spec(4)])
        assert (first, second) == (["a1", "a2"], ["a3", "a4"])
        for aid in first + second:  # every action of a batch of two runs (one event for both)
            assert (await eng.result(aid, wait=5)) is not None
        assert ex.runs == {"a1": 1, "a2": 1, "a3": 1, "a4": 1}
        assert eng.stats()["submitted"] == {"code": 4}
    finally:
        await eng.aclose()


async def test_a_duplicate_id_inside_one_batch_is_refused_naming_it() -> None:
    eng, ex = await _engine()
    try:
        with pytest.raises(InvalidAction) as err:
            await eng.submit([spec(1), spec(2), spec(1)])
        assert err.value.field == "actions[2].id"
        assert str(err.value) == "actions[2].id: duplicate action id 'a1'"
        await asyncio.sleep(0.05)
        assert ex.runs == {} and eng.stats()["submitted"] == {}
    finally:
        await eng.aclose()


async def test_sheds_are_counted_and_say_why() -> None:
    eng, _ = await _engine(max_pending=1)
    try:
        await eng.submit(spec(1, 5.0))
        with pytest.raises(Overloaded, match=r"^1 actions pending \(max_pending=1\); retry later$"):
            await eng.submit([spec(2), spec(3)])
        with pytest.raises(Overloaded):
            await eng.submit(spec(4))
        assert eng.stats()["shed"] == 3
    finally:
        await eng.aclose()


async def test_exactly_max_results_are_kept() -> None:
    eng, _ = await _engine(max_results=3)
    try:
        for i in range(5):
            await eng.run(spec(i))
        assert [eng.peek(f"a{i}") is not None for i in (2, 3, 4)] == [True] * 3
        for i in (0, 1):
            with pytest.raises(UnknownAction):
                eng.peek(f"a{i}")
    finally:
        await eng.aclose()


@pytest.mark.parametrize("name", ["tick_s", "result_ttl_s", "idempotency_ttl_s"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_periods_must_be_positive(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be > 0, got {value}$"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["max_results", "max_pending", "act_window"])
def test_bounds_must_be_at_least_one(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0$"):
        EngineConfig(**{name: 0})  # type: ignore[arg-type]
    assert getattr(EngineConfig(**{name: 1}), name) == 1  # type: ignore[arg-type]


class _TwiceCore:
    """The real core, but every Deliver it emits is emitted twice (the second one FAILED): a
    scheduler that answers a cancel racing a finish with both."""

    def __init__(self, config: object, nodes: object) -> None:
        self.core = core_factory(config, nodes)

    def handle(self, ev: object) -> list[C.Command]:
        out = list(self.core.handle(ev))
        again = [C.Deliver(dataclasses.replace(c.result, status=Status.FAILED))
                 for c in out if isinstance(c, C.Deliver)]
        return out + again


async def test_a_second_delivery_of_an_action_is_ignored() -> None:
    ex = FakeExecutor(cpu=2)
    eng = Engine(ex, EngineConfig(tick_s=0.005), core_factory=_TwiceCore)  # type: ignore[arg-type]
    await eng.start()
    try:
        for i in range(3):
            res = await asyncio.wait_for(eng.run(spec(i)), 5.0)
            assert res.status is Status.SUCCEEDED  # the first result stands
        await asyncio.sleep(0.05)
        assert [eng.peek(f"a{i}").status for i in range(3)] == [Status.SUCCEEDED] * 3  # type: ignore[union-attr]
        assert eng.stats()["finished"]["code"] == {"succeeded": 3}
    finally:
        await eng.aclose()
