"""An event the core raises on never leaves its action behind (issue 35, H2): the real engine
over the real core, fed an action whose hint the core cannot convert to a float (the mechanism
of the review's `overflow_hints.py`: ``basis_of`` raises OverflowError on arrival). Before the
fix the engine logged "core failed" and the action stayed queued for ever, holding
``max_pending`` and its tenant's quota; a cancel of it was refused by the core as well."""

from __future__ import annotations

import asyncio
import dataclasses

from fakes import FakeExecutor

from arl_tangram.api.tenancy import QuotaExceeded, Tenancy
from arl_tangram.core.actions import ActionSpec, Status, WorkHints
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import Engine, EngineConfig, Overloaded, make_core

HUGE = 10**400  # valid JSON, and no float can hold it


def _poisoned(aid: str) -> ActionSpec:
    """An action whose ``hints.tokens`` is HUGE: built the way an unchecked edge would hand it
    to the engine (WorkHints refuses the value itself now, so it is set past the check)."""
    hints = WorkHints()
    object.__setattr__(hints, "tokens", HUGE)
    return ActionSpec(id=aid, demand=Resources(cpu=1, memory_mb=64), hints=hints,
                      payload={"sleep": 0})


def _ok(aid: str) -> ActionSpec:
    return ActionSpec(id=aid, demand=Resources(cpu=1, memory_mb=64), payload={"sleep": 0})


async def _engine(**kw: object) -> Engine:
    eng = Engine(FakeExecutor(cpu=2), EngineConfig(tick_s=0.05, **kw), core_factory=make_core)
    return await eng.start()


def test_the_core_really_raises_on_this_action() -> None:
    """The premise: the real core raises on the poisoned arrival (so the engine path below is
    the one the review hit, not a made-up one)."""
    from arl_tangram.core import events as E
    from arl_tangram.core.cluster import NodeSpec

    core = make_core(EngineConfig(), [NodeSpec("n", Resources(cpu=2, memory_mb=4096))])
    try:
        core.handle(E.ActionArrived(0.0, _poisoned("p")))
    except OverflowError:
        return
    raise AssertionError("the core took an action it cannot hold")


async def test_an_action_the_core_cannot_take_ends_rejected_with_the_reason() -> None:
    eng = await _engine(max_pending=1)
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token="a" * 16,
                                              max_concurrent_actions=1),),
                        limits=LimitsConfig(max_pending=1))
    tenancy = Tenancy(eng, cfg)
    bad = _poisoned("bad")
    tenancy.admit("alice", (bad,))
    (aid,) = eng.submit_nowait(bad)
    tenancy.started("alice", (bad,))
    waiter = asyncio.ensure_future(eng.result(aid))  # a client waiting with no deadline
    res = await asyncio.wait_for(waiter, 10)  # (bounded: before the fix it never resolves)
    assert res is not None
    assert res.status is Status.REJECTED
    assert res.reason.startswith("the scheduler could not take this event (OverflowError: ")
    assert eng.status(aid) is Status.REJECTED
    assert await eng.cancel(aid) is False  # finished: nothing left to cancel
    st = eng.stats()
    assert (st["queue_length"], st["running_total"]) == (0, 0)
    assert st["finished"]["code"] == {"rejected": 1}
    # max_pending=1 and alice's max_concurrent_actions=1 are free again: the next action of
    # hers is admitted and runs
    good = _ok("good")
    tenancy.admit("alice", (good,))
    (gid,) = eng.submit_nowait(good)
    tenancy.started("alice", (good,))
    done = await eng.result(gid, wait=10)
    assert done is not None and done.status is Status.SUCCEEDED
    await eng.aclose()


async def test_quota_and_pending_are_held_only_while_the_action_lives() -> None:
    """The counter-check of the test above: a live action does hold both (so their release
    above is the failure path's doing, not a limit that never bit)."""
    eng = await _engine(max_pending=1)
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token="a" * 16,
                                              max_concurrent_actions=1),),
                        limits=LimitsConfig(max_pending=1))
    tenancy = Tenancy(eng, cfg)
    slow = dataclasses.replace(_ok("slow"), payload={"sleep": 30})
    tenancy.admit("alice", (slow,))
    eng.submit_nowait(slow)
    tenancy.started("alice", (slow,))
    try:
        tenancy.admit("alice", (_ok("x"),))
    except QuotaExceeded as exc:
        assert "1 actions unfinished" in str(exc)
    else:
        raise AssertionError("the quota did not bite")
    try:
        eng.submit_nowait(_ok("y"))
    except Overloaded as exc:
        assert str(exc).startswith("1 actions pending (max_pending=1)")
    else:
        raise AssertionError("max_pending did not bite")
    await eng.aclose()


async def test_a_batch_keeps_the_actions_the_core_could_take() -> None:
    """One request, one ActionsArrived: the core raises on the second of three; the first and
    third run, the second ends rejected."""
    eng = await _engine()
    ids = eng.submit_nowait([_ok("a"), _poisoned("b"), _ok("c")])
    assert ids == ["a", "b", "c"]
    got = {i: await eng.result(i, wait=10) for i in ids}
    assert {i: (r.status if r else None) for i, r in got.items()} == {
        "a": Status.SUCCEEDED, "b": Status.REJECTED, "c": Status.SUCCEEDED}
    assert got["b"] is not None and "OverflowError" in got["b"].reason
    st = eng.stats()
    assert (st["queue_length"], st["running_total"]) == (0, 0)
    await eng.aclose()


class _RaisesOn:
    """The real core, but raising on one event type for one action id (the test's seam: the
    real core raises on such events only through bugs)."""

    def __init__(self, core: object, event: type, action_id: str) -> None:
        self.core, self.event, self.action_id = core, event, action_id

    def handle(self, ev: object) -> list[object]:
        if isinstance(ev, self.event) and getattr(ev, "action_id", None) == self.action_id:
            raise RuntimeError("boom")
        return self.core.handle(ev)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self.core, name)


async def _engine_raising_on(event: type, action_id: str) -> Engine:
    def factory(config: EngineConfig, nodes: object) -> object:
        return _RaisesOn(make_core(config, nodes), event, action_id)  # type: ignore[arg-type]

    eng = Engine(FakeExecutor(cpu=2), EngineConfig(tick_s=0.05),
                 core_factory=factory)  # type: ignore[arg-type]
    return await eng.start()


async def test_a_finish_the_core_cannot_take_ends_failed_and_frees_the_node() -> None:
    from arl_tangram.core import events as E

    eng = await _engine_raising_on(E.ActionFinished, "fin")
    whole = Resources(cpu=2, memory_mb=64)  # the node's every core
    (fid,) = eng.submit_nowait(ActionSpec(id="fin", demand=whole, payload={"sleep": 0}))
    res = await asyncio.wait_for(eng.result(fid), 10)
    assert res is not None and res.status is Status.FAILED
    assert res.reason == "the scheduler could not take this event (RuntimeError: boom)"
    # the core was told to forget it: its cores are free for the next one
    (nid,) = eng.submit_nowait(ActionSpec(id="next", demand=whole, payload={"sleep": 0}))
    nxt = await eng.result(nid, wait=10)
    assert nxt is not None and nxt.status is Status.SUCCEEDED
    await eng.aclose()


async def test_a_cancel_the_core_cannot_take_still_cancels() -> None:
    from arl_tangram.core import events as E

    eng = await _engine_raising_on(E.CancelRequested, "stuck")
    (sid,) = eng.submit_nowait(ActionSpec(id="stuck", demand=Resources(cpu=1, memory_mb=64),
                                          payload={"sleep": 30}))
    for _ in range(1000):
        if eng.status(sid) is Status.RUNNING:
            break
        await asyncio.sleep(0.01)
    assert eng.status(sid) is Status.RUNNING
    waiter = asyncio.ensure_future(eng.result(sid))
    assert await eng.cancel(sid) is True
    res = await asyncio.wait_for(waiter, 10)
    assert res is not None and res.status is Status.CANCELLED
    assert res.reason == ("cancelled by request; the scheduler could not take this event "
                          "(RuntimeError: boom)")
    assert eng.stats()["running_total"] == 0
    await eng.aclose()


class _RaisesOnSession(_RaisesOn):
    def handle(self, ev: object) -> list[object]:
        from arl_tangram.core import events as E

        if isinstance(ev, E.SessionRequested) and ev.session_id == self.action_id:
            raise RuntimeError("boom")
        return self.core.handle(ev)  # type: ignore[attr-defined,no-any-return]


async def test_a_session_the_core_cannot_open_is_not_left_open() -> None:
    """Not counted against limits.max_sessions (nor its tenant's) for ever: it leaves the
    engine's count, and an action naming it is told why."""
    from arl_tangram.core import events as E

    def factory(config: EngineConfig, nodes: object) -> object:
        return _RaisesOnSession(make_core(config, nodes), E.SessionRequested, "bad")  # type: ignore[arg-type]

    eng = Engine(FakeExecutor(cpu=2), EngineConfig(tick_s=0.05),
                 core_factory=factory)  # type: ignore[arg-type]
    await eng.start()
    ok = await eng.open_session("good")
    assert await eng.open_session("bad") == "bad"
    for _ in range(1000):  # (the engine's loop handles the request)
        if not eng.has_session("bad"):
            break
        await asyncio.sleep(0.01)
    assert (eng.has_session("bad"), eng.has_session(ok), eng.session_count()) == (False, True, 1)
    assert eng.session_gone("bad") == ("session 'bad' could not be opened: the scheduler could "
                                       "not take this event (RuntimeError: boom)")
    assert await eng.close_session("bad") is False
    await eng.aclose()
