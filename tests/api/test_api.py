"""The HTTP API over the real core and a fake executor (httpx ASGI transport, no sandboxes):
validation, auth, limits, idempotency, native routes, metrics, and a fuzz of malformed bodies."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from fakes import FakeExecutor, core_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arl_tangram.api.app import create_app
from arl_tangram.api.middleware import is_loopback
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

MODELS = (ModelSpec("rm", kind="scalar", memory_mb=10),)


@pytest.fixture
async def api():
    cfg = ServiceConfig(models=MODELS, limits=LimitsConfig(max_body_bytes=4096, max_batch=8))
    eng = Engine(FakeExecutor(cpu=2), EngineConfig(tick_s=0.05, models=MODELS),
                 core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        c.engine = eng  # type: ignore[attr-defined]
        yield c
    await eng.aclose()


async def test_ping_and_openapi(api: httpx.AsyncClient) -> None:
    r = await api.get("/v1/ping")
    assert r.status_code == 200 and r.json() == "pong"
    paths = (await api.get("/openapi.json")).json()["paths"]
    for p in ("/run_code", "/run_jupyter", "/v1/ping", "/v1/actions", "/v1/actions/{action_id}", "/v1/sessions",
              "/v1/sessions/{session_id}", "/v1/cluster", "/v1/stats", "/get_reward", "/classify",
              "/metrics"):
        assert p in paths, p


async def test_native_submit_wait_and_get(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/actions", json={"kind": "code", "payload": {"sleep": 0.01},
                                            "wait": True})
    assert r.status_code == 200, r.text
    body = r.json()
    (aid,) = body["ids"]
    assert body["results"][0]["status"] == "succeeded"
    got = (await api.get(f"/v1/actions/{aid}")).json()
    assert got["finished"] and got["output"] == {"echo": {"sleep": 0.01}}
    assert (await api.get("/v1/actions/nope")).status_code == 404


async def test_idempotency_header(api: httpx.AsyncClient) -> None:
    body = {"actions": [{"kind": "code", "payload": {"sleep": 0.01}}]}
    a = (await api.post("/v1/actions", json=body, headers={"Idempotency-Key": "x1"})).json()
    b = (await api.post("/v1/actions", json=body, headers={"Idempotency-Key": "x1"})).json()
    assert a["ids"] == b["ids"]
    assert api.engine.stats()["submitted"]["code"] == 1  # type: ignore[attr-defined]


async def test_cancel_and_sessions(api: httpx.AsyncClient) -> None:
    ids = (await api.post("/v1/actions", json={"actions": [
        {"kind": "code", "payload": {"sleep": 2}} for _ in range(3)]})).json()["ids"]
    r = await api.delete(f"/v1/actions/{ids[2]}")
    assert r.status_code == 200 and r.json()["cancelled"] is True
    assert (await api.get(f"/v1/actions/{ids[2]}", params={"wait": 2})).json()["status"] == "cancelled"
    s = await api.post("/v1/sessions", json={"ttl_s": 30})
    assert s.status_code == 201
    sid = s.json()["session_id"]
    assert (await api.delete(f"/v1/sessions/{sid}")).status_code == 200
    assert (await api.delete(f"/v1/sessions/{sid}")).status_code == 404


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "nope"}, "kind"),
    ({"kind": "reward", "payload": {}}, "model"),
    ({"kind": "reward", "model": "missing"}, "model"),
    ({"kind": "code", "timeout_s": -1}, "timeout_s"),
    ({"kind": "code", "demand": {"cpu": -1}}, "demand"),
    ({"kind": "code", "elasticity": {"min": 4, "max": 1}}, "elasticity"),
    ({"kind": "tool", "session": "not-open"}, "session"),
    ({"actions": []}, "actions"),
    ({"actions": [{"kind": "code"}] * 9}, "actions"),
])
async def test_bad_actions_name_the_field(api: httpx.AsyncClient, body: dict, field: str) -> None:
    r = await api.post("/v1/actions", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert field in r.text


@pytest.mark.parametrize(("body", "field"), [
    ({}, "code"),
    ({"code": "x", "language": "cobol"}, "language"),
    ({"code": "x", "run_timeout": 0}, "run_timeout"),
    ({"code": "x", "memory_limit_MB": -5}, "memory_limit_MB"),
    ({"code": 3}, "code"),
])
async def test_bad_run_code_names_the_field(api: httpx.AsyncClient, body: dict, field: str) -> None:
    r = await api.post("/run_code", json=body)
    assert r.status_code == 422 and field in r.text


async def test_reward_routes_validate(api: httpx.AsyncClient) -> None:
    r = await api.post("/get_reward", json={"query": []})
    assert r.status_code == 422 and "query" in r.text
    r = await api.post("/get_reward", json={"query": ["a"], "labels": ["x", "y"], "model": "rm"})
    assert r.status_code == 400 and "labels" in r.text
    r = await api.post("/classify", json={"model": "zzz", "input": "a"})
    assert r.status_code == 400 and "model" in r.text


async def test_malformed_json_and_body_limit(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/actions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "body" in r.text
    r = await api.post("/v1/actions", json=[1, 2])
    assert r.status_code == 400
    r = await api.post("/run_code", json={"code": "x" * 5000})
    assert r.status_code == 413 and "body" in r.text


async def test_metrics_and_views(api: httpx.AsyncClient) -> None:
    await api.post("/v1/actions", json={"kind": "code", "payload": {}, "wait": True})
    text = (await api.get("/metrics")).text
    assert 'tangram_actions_finished_total{kind="code",status="succeeded"} 1.0' in text
    assert 'tangram_act_seconds_count{kind="code"} 1.0' in text
    assert "tangram_utilization" in text and "tangram_queue_length" in text
    stats = (await api.get("/v1/stats")).json()
    assert stats["act"]["code"]["count"] == 1
    scored = stats["estimator"]["code"]  # the scheduler's estimate at arrival, scored
    assert scored["scored"] == 1 and 0.0 <= scored["within_2x"] <= 1.0
    cluster = (await api.get("/v1/cluster")).json()
    assert cluster["nodes"][0]["name"] == "fake"
    assert "ACT" in (await api.get("/")).text or "completion" in (await api.get("/")).text


async def test_token_required_when_set() -> None:
    cfg = ServiceConfig(token="s3cret")
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/v1/stats")).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await c.get("/v1/stats", headers=bad)).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert (await c.get("/v1/stats", headers=ok)).status_code == 200
        assert (await c.get("/v1/ping")).status_code == 200
    await eng.aclose()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
    max_leaves=12,
)
keys = st.sampled_from(["kind", "payload", "demand", "elasticity", "hints", "model", "models",
                        "timeout_s", "weight", "session", "actions", "wait", "wait_s", "id",
                        "code", "language", "run_timeout", "memory_limit_MB", "files", "query",
                        "labels", "input", "ttl_s"])
bodies = st.dictionaries(keys, json_values, max_size=6) | json_values


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, route=st.sampled_from(["/v1/actions", "/run_code", "/get_reward",
                                           "/classify", "/v1/sessions"]))
async def test_fuzz_never_500(body: object, route: str) -> None:
    cfg = ServiceConfig(models=MODELS)
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05, models=MODELS), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, dataclasses.replace(cfg))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     timeout=10) as c:
            r = await c.post(route, json=body)
            assert r.status_code < 500 or r.status_code in (502, 503, 504), (route, body, r.text)
    finally:
        await eng.aclose()
