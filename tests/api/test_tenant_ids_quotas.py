"""Issue 41 items 1 and 2 in-process (the real core, a fake node): a fanned-out request's group
id is an action id, reserved for its tenant (H1); idempotency keys per tenant cannot collide
across tenant names; a session's TTL expiry (the core's own CloseSession), a lost node and a
delivery release what a tenant held, from the engine's events (H3); an action naming an expired
session is told so, also when it raced the expiry inside the engine; TEST cases are bounded at
the edge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind as Kind
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.config import ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

MODELS = (ModelSpec("a", kind="scalar", memory_mb=10), ModelSpec("b", kind="scalar", memory_mb=10))
A, B = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
TA, TAB = "tenant-a-token-0123456789abcdef", "tenant-ab-token-0123456789abcdef"
HA, HB = {"authorization": f"Bearer {A}"}, {"authorization": f"Bearer {B}"}


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    cfg = ServiceConfig(models=MODELS, tenants=(
        TenantConfig(name="alice", token=A, max_sessions=2),
        TenantConfig(name="bob", token=B),
        TenantConfig(name="a", token=TA), TenantConfig(name="ab", token=TAB)))
    ex = FakeExecutor(cpu=2)
    ex.spec = NodeSpec("fake", Resources(cpu=2, memory_mb=4096, gpu=1, gpu_memory_mb=1000))  # (loads never answer)
    eng = Engine(ex, EngineConfig(tick_s=0.05, models=MODELS), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        c.engine = eng  # type: ignore[attr-defined]
        yield c
    await eng.aclose()


def _group(gid: str) -> dict:
    return {"id": gid, "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}


async def test_a_group_id_is_reserved_for_its_tenant(api: httpx.AsyncClient) -> None:
    eng: Engine = api.engine  # type: ignore[attr-defined]
    r = await api.post("/v1/actions", headers=HA, json=_group("alice-grp-X"))
    assert r.status_code == 200 and r.json()["ids"] == ["alice-grp-X"], r.text
    parts = ("alice-grp-X.a", "alice-grp-X.b")  # (no model loads on the fake node: queued)
    # bob takes the group's id for a plain action, or for a group of his: refused as taken
    for body in ({"id": "alice-grp-X", "kind": "custom", "payload": {}}, _group("alice-grp-X")):
        r = await api.post("/v1/actions", headers=HB, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == "actions[0].id"
        assert r.json()["detail"].endswith("duplicate action id 'alice-grp-X'"), r.text
    # he neither reads nor cancels it
    assert (await api.get("/v1/actions/alice-grp-X", headers=HB)).status_code == 404
    assert (await api.delete("/v1/actions/alice-grp-X", headers=HB)).status_code == 404
    assert [eng.status(p) for p in parts] == [Status.QUEUED, Status.QUEUED]
    r = await api.get("/v1/actions/alice-grp-X", headers=HA)
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    # the reverse: alice's plain action's id is not taken by bob's group
    r = await api.post("/v1/actions", headers=HA, json={"id": "alice-solo-X", "kind": "custom",
                                                         "payload": {}, "wait": True})
    assert r.json()["results"][0]["status"] == "succeeded", r.text
    r = await api.post("/v1/actions", headers=HB, json=_group("alice-solo-X"))
    assert r.status_code == 400 and r.json()["field"] == "actions[0].id", r.text
    r = await api.get("/v1/actions/alice-solo-X", headers=HA)
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    # alice's own retry with its idempotency key answers the same group
    key = {"idempotency-key": "grp-key", **HA}
    first = await api.post("/v1/actions", headers=key, json=_group("alice-grp-K"))
    again = await api.post("/v1/actions", headers=key, json=_group("alice-grp-K"))
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["ids"] == again.json()["ids"] == ["alice-grp-K"]
    # and alice (only) cancels her group
    r = await api.delete("/v1/actions/alice-grp-X", headers=HA)
    assert r.status_code == 200 and r.json()["cancelled"] is True, r.text
    r = await api.get("/v1/actions/alice-grp-X", headers=HA, params={"wait": 10})
    assert r.json()["status"] == "cancelled", r.text
    assert [eng.status(p) for p in parts] == [Status.CANCELLED, Status.CANCELLED]


async def test_idempotency_scopes_do_not_collide_across_tenant_names(
        api: httpx.AsyncClient) -> None:
    """Tenant ``ab`` with key ``c`` and tenant ``a`` with key ``bc``: two submits."""
    ids = []
    for tok, key in ((TAB, "c"), (TA, "bc")):
        r = await api.post("/v1/actions", headers={"authorization": f"Bearer {tok}",
                                                   "idempotency-key": key},
                           json={"kind": "custom", "payload": {"who": tok[:9]}, "wait": True})
        assert r.status_code == 200, r.text
        ids.append(r.json()["ids"][0])
        assert r.json()["results"][0]["output"] == {"echo": {"who": tok[:9]}}
    assert ids[0] != ids[1]


async def _until(pred, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(2000):
        if pred():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def test_ttl_expiry_frees_the_tenants_sessions(api: httpx.AsyncClient) -> None:
    eng: Engine = api.engine  # type: ignore[attr-defined]
    sids = []
    for _ in range(2):
        r = await api.post("/v1/sessions", headers=HA, json={"ttl_s": 0.3})
        assert r.status_code == 201, r.text
        sids.append(r.json()["session_id"])
    assert eng.session_count() == 2
    r = await api.post("/v1/sessions", headers=HA, json={"ttl_s": 0.3})
    assert r.status_code == 429 and "max_sessions=2" in r.json()["detail"], r.text
    await _until(lambda: eng.session_count() == 0, "the expired sessions leave the count")
    r = await api.post("/v1/sessions", headers=HA, json={"ttl_s": 60})
    assert r.status_code == 201, r.text
    assert eng.session_count() == 1
    # an action naming an expired session is told it expired (never run in a new sandbox)
    r = await api.post("/v1/actions", headers=HA, json={"kind": "tool", "session": sids[0],
                                                         "payload": {}})
    assert r.status_code == 400 and r.json()["field"] == "actions[0].session", r.text
    assert r.json()["detail"] == (f"actions[0].session: session {sids[0]!r} is not open: it "
                                  "expired (no action for its ttl_s); its state is gone (open a "
                                  "new session)")
    # another tenant naming it learns nothing of why
    r = await api.post("/v1/actions", headers=HB, json={"kind": "tool", "session": sids[0],
                                                         "payload": {}})
    assert r.status_code == 400 and "expired" not in r.json()["detail"], r.text


async def test_an_action_racing_its_sessions_expiry_is_rejected_naming_it() -> None:
    """(L5: the core re-opened such a session implicitly with its default TTL, 600 s, whatever
    ``ttl_s`` the client had asked: the node kept a sandbox for ten minutes.)"""
    ex = FakeExecutor(cpu=2)
    eng = Engine(ex, EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    gone: list[tuple[str, str]] = []
    eng.on_session_gone.append(lambda sid, why: gone.append((sid, why)))
    try:
        await eng.open_session("s1", ttl_s=0.2)
        await _until(lambda: not eng.has_session("s1"), "s1 expires")
        assert [g[0] for g in gone] == ["s1"] and "expired" in gone[0][1]
        # (the service refuses it at the edge; here it reaches the engine, as it would when it
        # was submitted just before the expiry)
        res = await eng.run(ActionSpec("x1", Kind.TOOL, payload={}, session="s1"))
        assert res.status is Status.REJECTED
        assert res.reason == eng.session_gone("s1") and "it expired" in res.reason
        opens = [c for c in ex.commands if isinstance(c, C.OpenSession)]
        assert [(c.session_id, c.ttl_s) for c in opens] == [("s1", 0.2)]  # not re-opened
        assert eng.session_count() == 0
        # a new session under the id is a new session
        await eng.open_session("s1", ttl_s=60)
        res = await eng.run(ActionSpec("x2", Kind.TOOL, payload={}, session="s1"))
        assert res.status is Status.SUCCEEDED
    finally:
        await eng.aclose()


async def test_a_lost_node_releases_its_sessions() -> None:
    ex = FakeExecutor(cpu=2)
    eng = Engine(ex, EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    gone: list[str] = []
    eng.on_session_gone.append(lambda sid, why: gone.append(why))
    try:
        await eng.open_session("s1", ttl_s=600)
        await _until(lambda: any(getattr(c, "session_id", None) == "s1" for c in ex.commands),
                     "s1 opens on the node")
        assert ex.emit is not None
        ex.emit(E.NodeLost(0.0, "fake", "machine died"))
        await _until(lambda: eng.session_count() == 0, "s1 leaves the count")
        assert gone == ["session 's1' is not open: node fake lost: machine died"]
        assert eng.session_gone("s1") == gone[0]
    finally:
        await eng.aclose()


async def test_test_cases_are_bounded_at_the_edge(api: httpx.AsyncClient) -> None:
    case = {"stdin": "", "expected_stdout": ""}
    r = await api.post("/v1/actions", headers=HA, json={
        "kind": "test", "payload": {"code": "", "cases": [case] * 1025}})
    assert r.status_code == 422, r.text
    assert r.json()["message"] == ("payload: Value error, payload.cases: at most 1024 cases per "
                                   "action, got 1025")
    r = await api.post("/v1/actions", headers=HA, json={"actions": [
        {"kind": "test", "payload": {"code": "", "cases": [case] * 1025}}]})
    assert r.status_code == 422, r.text
    assert r.json()["message"] == ("actions.0.payload: Value error, payload.cases: at most 1024 "
                                   "cases per action, got 1025")
    before = dict(api.engine.stats()["submitted"])  # type: ignore[attr-defined]
    r = await api.post("/v1/actions", headers=HA, json={
        "kind": "test", "payload": {"code": "", "cases": [case] * 1024}})
    assert r.status_code == 200, r.text
    assert api.engine.stats()["submitted"]["test"] == before.get("test", 0) + 1  # type: ignore[attr-defined]


async def test_a_tenants_quota_is_kept_for_it_in_the_service_caps() -> None:
    """A tenant below its quota is never refused because another filled the service: alice's
    max_sessions=2 and max_concurrent_actions=2 are kept in limits.max_sessions=4 and
    limits.max_pending=4; bob (no quota of his own) has the rest."""
    from arl_tangram.runtime.config import LimitsConfig

    cfg = ServiceConfig(limits=LimitsConfig(max_sessions=4, max_pending=4), tenants=(
        TenantConfig(name="alice", token=A, max_sessions=2, max_concurrent_actions=2),
        TenantConfig(name="bob", token=B)))
    eng = Engine(FakeExecutor(cpu=8), EngineConfig(tick_s=0.05, max_pending=4),
                 core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            for _ in range(2):
                assert (await c.post("/v1/sessions", headers=HB, json={})).status_code == 201
            r = await c.post("/v1/sessions", headers=HB, json={})
            assert r.status_code == 429, r.text
            assert r.json()["detail"] == (
                "2 sessions are open and 2 places are kept for tenants below their max_sessions "
                "(limits.max_sessions=4); close one (DELETE /v1/sessions/{id}) or retry later")
            for _ in range(2):
                assert (await c.post("/v1/sessions", headers=HA, json={})).status_code == 201
            assert eng.session_count() == 4
            r = await c.post("/v1/sessions", headers=HA, json={})
            assert r.status_code == 429, r.text
            assert r.json()["detail"].startswith("4 sessions are open (limits.max_sessions)")

            slow = {"kind": "custom", "payload": {"sleep": 30}, "demand": {"cpu": 1}}
            r = await c.post("/v1/actions", headers=HB, json={"actions": [slow, slow]})
            assert r.status_code == 200, r.text
            held = r.json()["ids"]
            r = await c.post("/v1/actions", headers=HB, json=slow)
            assert r.status_code == 503, r.text
            assert r.json()["detail"] == (
                "2 actions pending and 2 places kept for tenants below their "
                "max_concurrent_actions (max_pending=4); retry later")
            r = await c.post("/v1/actions", headers=HA, json={"actions": [slow, slow]})
            assert r.status_code == 200, r.text
            held += r.json()["ids"]
            assert eng.live_count() == 4
            # once alice's are done, her places are kept again, not lent for good
            for aid in held[2:]:
                assert (await c.delete(f"/v1/actions/{aid}", headers=HA)).status_code == 200
                r = await c.get(f"/v1/actions/{aid}", headers=HA, params={"wait": 10})
                assert r.json()["status"] == "cancelled", r.text
            r = await c.post("/v1/actions", headers=HB, json=slow)
            assert r.status_code == 503, r.text
            for aid in held[:2]:
                assert (await c.delete(f"/v1/actions/{aid}", headers=HB)).status_code == 200
    finally:
        await eng.aclose()
