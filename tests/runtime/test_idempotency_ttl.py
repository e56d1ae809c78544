"""Idempotency keys live exactly their TTL (issue 27, audit I2), on a controllable clock: a
retry with the same key just before ``idempotency_ttl_s`` (1 h by default, longer than the
results' ``result_ttl_s``, 10 min) gets the first action's id and runs nothing; just after, the
key is forgotten and the retry is a new action."""

from __future__ import annotations

import asyncio

from fakes import FakeExecutor, core_factory, forgotten

from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.runtime.clock import ManualClock
from arl_tangram.runtime.engine import Engine, EngineConfig, UnknownAction


async def test_keys_live_until_their_ttl_and_are_gone_after() -> None:
    clock = ManualClock(1000.0)
    ex = FakeExecutor()
    cfg = EngineConfig(tick_s=0.005)
    assert (cfg.result_ttl_s, cfg.idempotency_ttl_s) == (600.0, 3600.0)  # the documented defaults
    eng = Engine(ex, cfg, clock=clock, core_factory=core_factory)
    await eng.start()
    try:
        first = await eng.run(ActionSpec("first"), idempotency_key="k")
        assert first.status is Status.SUCCEEDED
        # probes whose results expire (600 s after they finish) at +3599 and at +3601
        clock.advance(2999.0)
        await eng.run(ActionSpec("probe-3599"))
        clock.advance(2.0)
        await eng.run(ActionSpec("probe-3601"))

        clock.advance(598.0)  # t = +3599: 1 s before the key's TTL
        await forgotten(eng, "probe-3599")
        assert await eng.submit(ActionSpec("retry-1"), idempotency_key="k") == ["first"]
        assert "retry-1" not in ex.runs and ex.runs["first"] == 1
        try:
            eng.peek("retry-1")
            raise AssertionError("retry-1 was accepted as an action")
        except UnknownAction:
            pass

        clock.advance(2.0)  # t = +3601: 1 s past it
        await forgotten(eng, "probe-3601")
        assert await eng.submit(ActionSpec("retry-2"), idempotency_key="k") == ["retry-2"]
        res = await eng.result("retry-2")
        assert res is not None and res.status is Status.SUCCEEDED
        assert ex.runs["retry-2"] == 1 and ex.runs["first"] == 1
        # the new action holds the key now, for its own TTL
        assert await eng.submit(ActionSpec("retry-3"), idempotency_key="k") == ["retry-2"]
    finally:
        await eng.aclose()


async def test_a_short_configured_ttl_is_honoured_too() -> None:
    clock = ManualClock(100.0)
    ex = FakeExecutor()
    eng = Engine(ex, EngineConfig(tick_s=0.005, result_ttl_s=50.0, idempotency_ttl_s=20.0),
                 clock=clock, core_factory=core_factory)
    await eng.start()
    try:
        await eng.run(ActionSpec("a"), idempotency_key="k")
        await eng.run(ActionSpec("probe"))
        clock.advance(19.0)
        await asyncio.sleep(0.05)  # (expiry passes at t = 119 find the key alive either way)
        assert await eng.submit(ActionSpec("b"), idempotency_key="k") == ["a"]
        clock.advance(31.0)  # t = 150: the probe's result expires, and the key (at 120) before it
        await forgotten(eng, "probe")
        assert await eng.submit(ActionSpec("c"), idempotency_key="k") == ["c"]
    finally:
        await eng.aclose()


async def test_a_result_finished_at_time_zero_expires_like_any_other() -> None:
    # a finish time of 0.0 is a time, not "unknown": such a result once never expired and held
    # back the expiry of every later one
    clock = ManualClock(0.0)
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.005, result_ttl_s=50.0), clock=clock,
                 core_factory=core_factory)
    await eng.start()
    try:
        await eng.run(ActionSpec("at-zero"))
        clock.advance(10.0)
        await eng.run(ActionSpec("later"))
        clock.advance(60.0)  # both past their TTL
        await forgotten(eng, "at-zero")
        await forgotten(eng, "later")
    finally:
        await eng.aclose()
