"""`api/app.py` on exact values (issue 43: its mutants), fast: an engine over the in-test
executor (tests/runtime/fakes.py), or `Service` methods replaced by recorders where a route only
passes on what it got. Pinned: each error's status, body and headers (`error_response`), the
validation body, the `/run_code` dispatch of `TangramApp` (fast path or full stack) and its
telemetry cache, `create_app`'s lifespan, guards and OpenAPI documentation, `/v1/health`'s
body, and what every route answers and hands to the service (the request's tenant included).
"""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from _asgi import client_gone
from fakes import FakeExecutor, core_factory
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from arl_tangram.api import app as A
from arl_tangram.api import images as image_routes
from arl_tangram.api import metrics
from arl_tangram.api.middleware import TENANT_KEY, BodyTooLarge, GuardMiddleware
from arl_tangram.api.schemas import MAX_WAIT_S
from arl_tangram.api.service import (
    KeyReused,
    SessionExpired,
    SessionNotOpened,
    Shed,
    TooManySessions,
)
from arl_tangram.api.tenancy import QuotaExceeded
from arl_tangram.core.errors import BrokenError, ClosedError, InvalidAction
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import Engine, EngineConfig, Overloaded, UnknownAction

TENANTS = (TenantConfig(name="alice", token="tok-a"), TenantConfig(name="bob", token="tok-b"))


def _engine() -> Engine:
    return Engine(
        FakeExecutor(cpu=2, memory_mb=4096), EngineConfig(tick_s=0.05), core_factory=core_factory
    )


def _client(app: FastAPI, token: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers
    )


@pytest.fixture
async def eng():
    e = _engine()
    await e.start()
    yield e
    await e.aclose()


def _body(resp: Any) -> Any:
    return json.loads(bytes(resp.body))


# ---- the error table -----------------------------------------------------------------------------


ERRORS: list[tuple[BaseException, int, dict[str, Any], str | None]] = [
    (
        InvalidAction("payload.code", "is required"),
        400,
        {"detail": "payload.code: is required", "field": "payload.code"},
        None,
    ),
    (UnknownAction("abc"), 404, {"detail": "id: unknown action 'abc'"}, None),
    (Overloaded("full up"), 503, {"detail": "full up"}, "1"),
    (Shed("too late"), 504, {"detail": "too late"}, None),
    (KeyReused("same key"), 422, {"detail": "same key", "field": "idempotency_key"}, None),
    (SessionNotOpened("no room"), 503, {"detail": "no room"}, None),
    (SessionExpired("ttl_s: gone"), 410, {"detail": "ttl_s: gone", "field": "ttl_s"}, None),
    (TooManySessions("9 open"), 429, {"detail": "9 open"}, "1"),
    (QuotaExceeded("alice: over"), 429, {"detail": "alice: over"}, "1"),
    (ClosedError("closing"), 503, {"detail": "closing"}, None),
    (BrokenError("it broke"), 502, {"detail": "it broke"}, None),
    (BodyTooLarge(64), 413, {"detail": "body: larger than 64 bytes"}, None),
    (
        ClientDisconnect(),
        400,
        {"detail": "body: the connection closed before the whole body"},
        None,
    ),
]


@pytest.mark.parametrize(("exc", "status", "body", "retry"), ERRORS, ids=lambda v: type(v).__name__)
def test_each_error_maps_to_its_status_body_and_headers(
    exc: BaseException, status: int, body: dict[str, Any], retry: str | None
) -> None:
    resp = A.error_response(exc)
    assert resp is not None
    assert resp.status_code == status
    assert _body(resp) == body
    assert resp.headers.get("retry-after") == retry
    assert resp.headers["content-type"] == "application/json"


def test_an_error_without_an_entry_is_none_and_subclasses_take_their_bases_entry() -> None:
    assert A.error_response(ValueError("x")) is None
    assert A.error_response(KeyError("x")) is None

    class Mine(Shed):
        pass

    resp = A.error_response(Mine("late"))
    assert resp is not None and resp.status_code == 504 and _body(resp) == {"detail": "late"}


class _M(BaseModel):
    n: int
    s: str


def test_validation_errors_are_422_with_each_loc_msg_type_and_a_message() -> None:
    with pytest.raises(ValidationError) as ei:
        _M.model_validate({"n": "x"})
    resp = A.error_response(ei.value)
    assert resp is not None and resp.status_code == 422
    assert _body(resp) == {
        "detail": [
            {
                "loc": ["n"],
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "type": "int_parsing",
            },
            {"loc": ["s"], "msg": "Field required", "type": "missing"},
        ],
        "message": "n: Input should be a valid integer, unable to parse string as an integer; "
        "s: Field required",
    }
    resp = A.error_response(
        RequestValidationError(
            [
                {"loc": ("body", "a", 0), "msg": "bad", "type": "t1"},
                {"loc": ("body",), "msg": "whole", "type": "t2"},
            ]
        )
    )
    assert resp is not None and resp.status_code == 422
    assert _body(resp) == {
        "detail": [
            {"loc": ["body", "a", "0"], "msg": "bad", "type": "t1"},
            {"loc": ["body"], "msg": "whole", "type": "t2"},
        ],
        "message": "a.0: bad; body: whole",
    }


def test_validation_body_defaults_and_keeps_five_in_the_message() -> None:
    errs: list[dict[str, Any]] = [{"loc": ("body", f"f{i}"), "msg": f"m{i}"} for i in range(7)]
    out = A._validation_body([{}, *errs])
    assert out["detail"][0] == {"loc": [], "msg": "", "type": ""}
    assert out["detail"][1] == {"loc": ["body", "f0"], "msg": "m0", "type": ""}
    assert out["message"] == "body: ; f0: m0; f1: m1; f2: m2; f3: m3"
    assert A._loc({"loc": ("body",)}) == "body"
    assert A._loc({}) == "body"
    assert A._loc({"loc": ("query", "wait")}) == "query.wait"


# ---- TangramApp: the /run_code fast path and the telemetry cache ---------------------------------


class _Rec:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls.append(scope)


@pytest.mark.parametrize(
    ("scope", "root", "fast"),
    [
        ({"type": "http", "path": "/run_code", "method": "POST"}, "", True),
        ({"type": "http", "path": "/run_code", "method": "GET"}, "", False),
        ({"type": "http", "path": "/run_codes", "method": "POST"}, "", False),
        ({"type": "websocket", "path": "/run_code", "method": "POST"}, "", False),
        ({"type": "http", "path": "/run_code", "method": "POST"}, "/api", False),
    ],
)
async def test_only_post_run_code_over_http_without_a_root_path_takes_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, scope: dict[str, Any], root: str, fast: bool
) -> None:
    app = A.create_app(_engine(), ServiceConfig())
    app.root_path = root
    app.fast = _Rec()
    full = _Rec()
    monkeypatch.setattr(FastAPI, "__call__", lambda self, s, r, se: full(s, r, se))
    await app(dict(scope), None, None)
    assert (len(app.fast.calls), len(full.calls)) == ((1, 0) if fast else (0, 1))


async def test_no_fast_path_set_takes_the_full_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    app = A.create_app(_engine(), ServiceConfig(), fast_paths=False)
    assert app.fast is None
    full = _Rec()
    monkeypatch.setattr(FastAPI, "__call__", lambda self, s, r, se: full(s, r, se))
    await app({"type": "http", "path": "/run_code", "method": "POST"}, None, None)
    assert len(full.calls) == 1


async def test_telemetry_on_sends_run_code_to_the_full_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = A.create_app(_engine(), ServiceConfig())
    app.fast = _Rec()
    app._native_telemetry = SimpleNamespace(enabled=lambda: True)
    full = _Rec()
    monkeypatch.setattr(FastAPI, "__call__", lambda self, s, r, se: full(s, r, se))
    await app({"type": "http", "path": "/run_code", "method": "POST"}, None, None)
    assert (len(app.fast.calls), len(full.calls)) == (0, 1)


def test_telemetry_off_is_believed_for_one_second_and_on_is_asked_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(A, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    app = A.TangramApp()
    assert app._telemetry_until == -1.0
    assert app._telemetry_on() is False  # (no telemetry attribute)
    assert app._telemetry_until == 101.0
    on = [False]
    asked: list[float] = []

    def enabled() -> bool:
        asked.append(clock[0])
        return on[0]

    app._native_telemetry = SimpleNamespace(enabled=enabled)
    on[0] = True
    clock[0] = 100.999
    assert app._telemetry_on() is False and asked == []  # (still within the second)
    clock[0] = 101.0
    assert app._telemetry_on() is True and asked == [101.0]
    assert app._telemetry_on() is True and asked == [101.0, 101.0]
    on[0] = False
    assert app._telemetry_on() is False and app._telemetry_until == 102.0


# ---- create_app: lifespan, guards, documentation -------------------------------------------------


@pytest.mark.parametrize("manage", [True, False])
async def test_lifespan_starts_and_closes_the_engine_only_when_it_manages_it(manage: bool) -> None:
    e = _engine()
    seen: list[Any] = []

    async def start() -> None:
        seen.append("start")

    async def aclose(**kw: Any) -> None:
        seen.append(("aclose", kw))

    e.start, e.aclose = start, aclose  # type: ignore[method-assign]
    app = A.create_app(e, ServiceConfig(), manage_engine=manage)
    async with app.router.lifespan_context(app):
        assert seen == (["start"] if manage else [])
    assert seen == (["start", ("aclose", {"grace_s": 2.0})] if manage else [])


def test_create_app_state_guards_and_uploads() -> None:
    cfg = ServiceConfig(
        tenants=TENANTS,
        token="tok-d",
        limits=LimitsConfig(max_body_bytes=777),
        image_max_upload_bytes=5555,
    )
    e = _engine()
    app = A.create_app(e, cfg)
    assert isinstance(app, A.TangramApp)
    svc = app.state.service
    assert svc.engine is e and svc.config is cfg
    assert app.state.registry is not None
    assert (app.title, app.version) == ("ARL-Tangram", "0.1.0")
    fast = app.fast
    assert isinstance(fast, GuardMiddleware)
    assert fast.max_body == 777
    assert fast.uploads == (("PUT", "/v1/images/", 5555),)
    assert fast._expected == [
        (b"Bearer tok-a", "alice"),
        (b"Bearer tok-b", "bob"),
        (b"Bearer tok-d", "default"),
    ]
    mws = {m.cls.__name__: m.kwargs for m in app.user_middleware}
    assert set(mws) == {"GuardMiddleware", "FastRunCode"}
    assert mws["GuardMiddleware"] == {
        "tenants": {"tok-a": "alice", "tok-b": "bob", "tok-d": "default"},
        "max_body_bytes": 777,
        "uploads": [("PUT", "/v1/images/", 5555)],
    }
    assert [m.cls.__name__ for m in app.user_middleware] == ["GuardMiddleware", "FastRunCode"]
    assert mws["FastRunCode"]["error_response"] is A.error_response
    inner = fast.app
    assert inner.outermost is True
    assert inner.error_response is A.error_response
    plain = A.create_app(e, cfg, fast_paths=False)
    assert plain.fast is None
    assert [m.cls.__name__ for m in plain.user_middleware] == ["GuardMiddleware"]


@pytest.mark.parametrize("any_path", [True, False])
def test_image_routes_get_the_configs_dirs_tenancy_and_limits(
    monkeypatch: pytest.MonkeyPatch, any_path: bool
) -> None:
    got: list[tuple[Any, ...]] = []
    real = image_routes.install

    def install(app: Any, engine: Any, dirs: Any, **kw: Any) -> None:
        got.append((engine, dirs, kw))
        real(app, engine, dirs, **kw)

    monkeypatch.setattr(image_routes, "install", install)
    cfg = ServiceConfig(
        image_import_dirs=("/srv/img",),
        image_upload_dir="/var/up",
        limits=LimitsConfig(body_timeout_s=7.5),
    )
    e = _engine()
    app = A.create_app(e, cfg, any_image_path=any_path)
    [(engine, dirs, kw)] = got
    assert engine is e and dirs == ("/srv/img",)
    assert kw == {
        "any_path": any_path,
        "tenancy": app.state.service.tenancy,
        "upload_dir": "/var/up",
        "body_timeout_s": 7.5,
    }
    got.clear()
    A.create_app(e, cfg)
    assert got[0][2]["any_path"] is False


COMMON = {
    "400": "bad input: the detail names the field",
    "401": "missing or bad bearer token (when a token is configured)",
    "413": "body larger than limits.max_body_bytes",
}
BUSY = {
    "429": "a quota reached (limits.max_sessions, or the tenant's)",
    "503": "overloaded (limits.max_pending), or the engine is closed",
}
UNKNOWN = {"404": "unknown id (or another tenant's)"}
OK = {"200": "Successful Response"}
V422 = {"422": "Validation Error"}
DOCS: dict[tuple[str, str], tuple[list[str], dict[str, str]]] = {
    ("/v1/ping", "get"): (["sandbox"], {**OK, **COMMON}),
    ("/v1/health", "get"): (
        ["ops"],
        {**OK, **COMMON, "503": "a node is not ready (the reason per node)"},
    ),
    ("/run_code", "post"): (
        ["sandbox"],
        {**OK, **COMMON, **BUSY, "504": "shed: no answer within the deadline", **V422},
    ),
    ("/v1/actions", "post"): (["native"], {**OK, **COMMON, **BUSY, **V422}),
    ("/v1/actions/{action_id}", "get"): (["native"], {**OK, **COMMON, **UNKNOWN, **V422}),
    ("/v1/actions/{action_id}", "delete"): (
        ["native"],
        {**OK, **COMMON, **UNKNOWN, **BUSY, **V422},
    ),
    ("/v1/sessions", "post"): (
        ["native"],
        {
            "201": "Successful Response",
            **COMMON,
            **BUSY,
            "202": "not open yet after limits.session_open_wait_s: waiting for room on a node "
            "(state 'opening')",
            "410": "its own ttl_s passed before its node opened it (field ttl_s)",
            "503": "the node could not open it (the node's reason), or overloaded",
            **V422,
        },
    ),
    ("/v1/sessions/{session_id}", "delete"): (
        ["native"],
        {**OK, **COMMON, **UNKNOWN, **BUSY, **V422},
    ),
    ("/v1/cluster", "get"): (["native"], {**OK, **COMMON}),
    ("/v1/stats", "get"): (["native"], {**OK, **COMMON}),
    ("/get_reward", "post"): (
        ["reward"],
        {**OK, **COMMON, **BUSY, "502": "the model failed to score", **V422},
    ),
    ("/classify", "post"): (
        ["reward"],
        {**OK, **COMMON, **BUSY, "502": "the model failed to score", **V422},
    ),
    ("/metrics", "get"): (["ops"], {"200": "Prometheus text format", **COMMON}),
}


def test_openapi_documents_each_routes_tags_and_statuses() -> None:
    o = A.create_app(_engine(), ServiceConfig()).openapi()
    assert o["info"] == {
        "title": "ARL-Tangram",
        "version": "0.1.0",
        "description": "Action-level external-resource orchestration for agentic RL.",
    }
    for (path, method), (tags, statuses) in DOCS.items():
        op = o["paths"][path][method]
        assert op["tags"] == tags, (path, method)
        got = {k: v["description"] for k, v in op["responses"].items()}
        assert got == statuses, (path, method)
    assert "/" not in o["paths"]
    # the other modules' routes are installed too (jupyter, search, judge compat, images)
    assert {
        "/run_jupyter",
        "/retrieve",
        "/v1/search",
        "/v1/fetch",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/images",
        "/v1/images/{name}",
    } <= set(o["paths"])
    ok = o["paths"]["/run_code"]["post"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"] == {"$ref": "#/components/schemas/RunCodeResponse"}
    prom = o["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert prom[metrics.CONTENT_TYPE] == {"schema": {"type": "string"}}


# ---- /v1/health ----------------------------------------------------------------------------------


def _node(name: str, alive: bool = True, ready: bool = True, reason: str | None = None) -> Any:
    return SimpleNamespace(name=name, alive=alive, ready=ready, reason=reason)


def _health(*nodes: Any) -> tuple[int, Any, str | None]:
    e = SimpleNamespace(cluster_view=lambda: SimpleNamespace(nodes=list(nodes)))
    r = A._health(e)  # type: ignore[arg-type]
    return r.status_code, _body(r), r.headers.get("retry-after")


def test_health_ready_nodes() -> None:
    assert _health(_node("a"), _node("b")) == (
        200,
        {"ready": True, "nodes": {"a": {"ready": True}, "b": {"ready": True}}},
        None,
    )


def test_health_a_node_not_ready_says_why_and_a_lost_one_is_listed_only() -> None:
    assert _health(
        _node("a"),
        _node("b", ready=False, reason="fork server restarting"),
        _node("c", alive=False, ready=True, reason="ignored"),
        _node("d", ready=False),
    ) == (
        503,
        {
            "ready": False,
            "reason": "b: fork server restarting; d: not ready",
            "nodes": {
                "a": {"ready": True},
                "b": {"ready": False, "reason": "fork server restarting"},
                "c": {"ready": False, "lost": True, "reason": "the node is lost"},
                "d": {"ready": False, "reason": "not ready"},
            },
        },
        "1",
    )
    assert _health(_node("a"), _node("c", alive=False)) == (
        200,
        {
            "ready": True,
            "nodes": {
                "a": {"ready": True},
                "c": {"ready": False, "lost": True, "reason": "the node is lost"},
            },
        },
        None,
    )


def test_health_without_a_live_node_is_503_no_node() -> None:
    assert _health() == (503, {"ready": False, "nodes": {}, "reason": "no node"}, "1")
    assert _health(_node("c", alive=False)) == (
        503,
        {
            "ready": False,
            "reason": "no node",
            "nodes": {"c": {"ready": False, "lost": True, "reason": "the node is lost"}},
        },
        "1",
    )


async def test_health_route_over_a_real_engine(eng: Engine) -> None:
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.get("/v1/health")
    assert (r.status_code, r.json()) == (200, {"ready": True, "nodes": {"fake": {"ready": True}}})
    assert "retry-after" not in r.headers


# ---- the routes --------------------------------------------------------------------------------


async def test_ping_dashboard_metrics_stats_cluster(eng: Engine) -> None:
    app = A.create_app(eng, ServiceConfig())
    async with _client(app) as c:
        r = await c.get("/v1/ping")
        assert (r.status_code, r.json()) == (200, "pong")
        r = await c.get("/")
        html = resources.files("arl_tangram.api").joinpath("static/index.html").read_text()
        assert r.status_code == 200 and r.text == html and len(html) > 100
        assert r.headers["content-type"].startswith("text/html")
        r = await c.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"] == metrics.CONTENT_TYPE
        want = metrics.render(app.state.registry).decode()
        assert [ln.split(" ")[0] for ln in r.text.splitlines()] == [
            ln.split(" ")[0] for ln in want.splitlines()
        ]
        assert "tangram_" in r.text
        r = await c.get("/v1/stats")
        got, want_stats = r.json(), eng.stats_view().to_dict()
        assert r.status_code == 200 and got.pop("uptime_s") <= want_stats.pop("uptime_s")
        assert got == want_stats and got["policy"] == "tangram"
        r = await c.get("/v1/cluster")
        assert r.status_code == 200
        assert r.json() == eng.cluster_view().to_dict()
        assert [n["name"] for n in r.json()["nodes"]] == ["fake"]
        r = await c.get("/nowhere")
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


@pytest.mark.parametrize("raw", [b"", b"[]", b"3", b'"x"'])
async def test_submit_refuses_a_body_that_is_not_an_object(eng: Engine, raw: bytes) -> None:
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post("/v1/actions", content=raw, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (
        400,
        {
            "detail": "body: must be a JSON object (an action, or {'actions': [...]})",
            "field": "body",
        },
    )


async def test_submit_refuses_bad_json_naming_the_body(eng: Engine) -> None:
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post(
            "/v1/actions", content=b'{"kind": ', headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["field"] == "body"
        assert r.json()["detail"] == (
            "body: not valid JSON: Expecting value: line 1 column 10 (char 9)"
        )
        r = await c.post(
            "/v1/actions", content=b"\xff\xfe", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["field"] == "body"
        assert r.json()["detail"].startswith("body: not valid JSON: ")


async def test_submit_one_action_takes_wait_wait_s_and_key_from_its_body(eng: Engine) -> None:
    a = {"kind": "code", "payload": {"code": "A"}}
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post(
            "/v1/actions", json={**a, "wait": True, "wait_s": 5, "idempotency_key": "K1"}
        )
        assert r.status_code == 200, r.text
        (aid,) = r.json()["ids"]
        assert set(r.json()) == {"ids", "results"}
        (res,) = r.json()["results"]
        assert (res["id"], res["status"]) == (aid, "succeeded")
        # the key came from the body: the same key with another body is refused
        r = await c.post(
            "/v1/actions",
            json={"kind": "code", "payload": {"code": "B"}},
            headers={"idempotency-key": "K1"},
        )
        assert r.status_code == 422 and r.json()["field"] == "idempotency_key"
        r = await c.post("/v1/actions", json={"actions": [a]}, headers={"idempotency-key": "K1"})
        assert (r.status_code, r.json()) == (200, {"ids": [aid]})
        r = await c.post("/v1/actions", json=a, headers={"idempotency-key": "k" * 201})
        assert r.status_code == 422 and "idempotency-key" in r.json()["message"]
        r = await c.post("/v1/actions", json=a, headers={"idempotency-key": "k" * 200})
        assert r.status_code == 200 and set(r.json()) == {"ids"}


async def test_get_action_wait_bounds_and_unknown_id(eng: Engine) -> None:
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post("/v1/actions", json={"kind": "code", "payload": {"sleep": 30}})
        (aid,) = r.json()["ids"]
        r = await c.get(f"/v1/actions/{aid}")
        assert r.status_code == 200 and r.json()["id"] == aid
        assert r.json()["status"] in ("queued", "running")
        for bad in ("-0.001", str(MAX_WAIT_S + 0.001), "nan", "inf"):
            r = await c.get(f"/v1/actions/{aid}", params={"wait": bad})
            assert r.status_code == 422, bad
            assert r.json()["detail"][0]["loc"] == ["query", "wait"]
        r = await c.delete(f"/v1/actions/{aid}")
        assert (r.status_code, r.json()) == (200, {"id": aid, "cancelled": True})
        r = await c.get(f"/v1/actions/{aid}", params={"wait": 2})
        assert r.json()["status"] == "cancelled"
        r = await c.get("/v1/actions/nope")
        assert (r.status_code, r.json()) == (404, {"detail": "id: unknown action 'nope'"})
        r = await c.delete("/v1/actions/nope")
        assert (r.status_code, r.json()) == (404, {"detail": "id: unknown action 'nope'"})


async def test_get_action_default_wait_is_zero_and_max_wait_is_taken(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig())
    svc = app.state.service
    got: list[Any] = []

    async def get(aid: str, wait: float, *, tenant: str | None = None) -> dict[str, Any]:
        got.append((aid, wait, tenant))
        return {"id": aid}

    monkeypatch.setattr(svc, "get", get)
    async with _client(app) as c:
        assert (await c.get("/v1/actions/x1")).json() == {"id": "x1"}
        await c.get("/v1/actions/x2", params={"wait": MAX_WAIT_S})
        await c.get("/v1/actions/x3", params={"wait": 0})
    assert got == [("x1", 0.0, None), ("x2", MAX_WAIT_S, None), ("x3", 0.0, None)]


async def test_each_route_hands_the_requests_tenant_to_the_service(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig(tenants=TENANTS))
    svc = app.state.service
    got: list[tuple[str, Any]] = []

    def rec(name: str, out: Any) -> Any:
        async def f(*a: Any, tenant: str | None = None, **kw: Any) -> Any:
            got.append((name, tenant))
            return out

        return f

    monkeypatch.setattr(svc, "submit", rec("submit", {"ids": ["i"]}))
    monkeypatch.setattr(svc, "get", rec("get", {"id": "g"}))
    monkeypatch.setattr(svc, "cancel", rec("cancel", False))
    monkeypatch.setattr(svc, "open_session", rec("open", {"session_id": "s", "state": "open"}))
    monkeypatch.setattr(svc, "close_session", rec("close", True))
    monkeypatch.setattr(svc, "get_reward", rec("reward", {"rewards": [1.0]}))
    monkeypatch.setattr(svc, "classify", rec("classify", {"data": []}))
    monkeypatch.setattr(svc, "run_code", rec("run_code", {"status": "Success"}))
    for tok, who in (("tok-a", "alice"), ("tok-b", "bob")):
        got.clear()
        async with _client(app, tok) as c:
            assert (await c.post("/v1/actions", json={"kind": "code", "payload": {}})).json() == {
                "ids": ["i"]
            }
            assert (await c.get("/v1/actions/a1")).json() == {"id": "g"}
            r = await c.delete("/v1/actions/a1")
            assert (r.status_code, r.json()) == (200, {"id": "a1", "cancelled": False})
            r = await c.post("/v1/sessions")
            assert (r.status_code, r.json()) == (201, {"session_id": "s", "state": "open"})
            r = await c.delete("/v1/sessions/s1")
            assert (r.status_code, r.json()) == (200, {"session_id": "s1", "closed": True})
            r = await c.post("/get_reward", json={"query": ["q"]})
            assert (r.status_code, r.json()) == (200, {"rewards": [1.0]})
            r = await c.post("/classify", json={"input": "t"})
            assert (r.status_code, r.json()) == (200, {"data": []})
            r = await c.post("/run_code", json={"code": "x"})
            assert (r.status_code, r.json()) == (200, {"status": "Success"})
        assert got == [
            (n, who)
            for n in ("submit", "get", "cancel", "open", "close", "reward", "classify", "run_code")
        ]


def test_tenant_of_reads_only_a_string() -> None:
    assert A.tenant_of(SimpleNamespace(scope={TENANT_KEY: "alice"})) == "alice"  # type: ignore[arg-type]
    assert A.tenant_of(SimpleNamespace(scope={TENANT_KEY: 3})) is None  # type: ignore[arg-type]
    assert A.tenant_of(SimpleNamespace(scope={})) is None  # type: ignore[arg-type]


async def test_sessions_open_201_opening_202_close_404(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig())
    svc = app.state.service
    bodies: list[Any] = []
    state = ["opening"]

    async def open_session(body: Any, *, tenant: str | None = None) -> dict[str, Any]:
        bodies.append(body)
        return {"session_id": "s9", "state": state[0]}

    async def close_session(sid: str, *, tenant: str | None = None) -> bool:
        return False

    monkeypatch.setattr(svc, "open_session", open_session)
    monkeypatch.setattr(svc, "close_session", close_session)
    async with _client(app) as c:
        r = await c.post("/v1/sessions")
        assert (r.status_code, r.json()) == (202, {"session_id": "s9", "state": "opening"})
        state[0] = "open"
        r = await c.post("/v1/sessions", json={"ttl_s": 5})
        assert (r.status_code, r.json()) == (201, {"session_id": "s9", "state": "open"})
        r = await c.delete("/v1/sessions/s1")
        assert (r.status_code, r.json()) == (404, {"detail": "session_id: no open session 's1'"})
        r = await c.delete("/v1/sessions/a..b")
        assert r.status_code == 400 and r.json()["field"] == "session_id"
    assert bodies[0].model_dump() == type(bodies[0]).model_validate({}).model_dump()
    assert bodies[1].ttl_s == 5


@pytest.mark.parametrize("fast", [True, False])
async def test_run_code_overloaded_is_shed_504(
    eng: Engine, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    app = A.create_app(eng, ServiceConfig(), fast_paths=fast)

    async def run_code(req: Any, *, tenant: str | None = None) -> dict[str, Any]:
        raise Overloaded("100 actions pending")

    monkeypatch.setattr(app.state.service, "run_code", run_code)
    async with _client(app) as c:
        r = await c.post("/run_code", json={"code": "x"})
    assert (r.status_code, r.json()) == (504, {"detail": "100 actions pending"})
    assert "retry-after" not in r.headers


async def test_run_code_invalid_body_is_422_with_the_message(eng: Engine) -> None:
    async with _client(A.create_app(eng, ServiceConfig(), fast_paths=False)) as c:
        r = await c.post("/run_code", json={"code": 3})
    assert r.status_code == 422
    assert r.json()["message"] == "code: Input should be a valid string"
    assert r.json()["detail"] == [
        {"loc": ["body", "code"], "msg": "Input should be a valid string", "type": "string_type"}
    ]


async def test_a_chunked_body_past_the_limit_is_413_not_400(eng: Engine) -> None:
    app = A.create_app(eng, ServiceConfig(limits=LimitsConfig(max_body_bytes=64)))

    async def chunks() -> Any:
        yield b'{"query": ["' + b"q" * 40
        yield b"q" * 40 + b'"]}'

    async with _client(app) as c:
        r = await c.post(
            "/get_reward", content=chunks(), headers={"content-type": "application/json"}
        )
    assert (r.status_code, r.json()) == (413, {"detail": "body: larger than 64 bytes"})


async def test_run_code_whose_client_went_away_is_499(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig(), fast_paths=False)
    import asyncio

    cancelled: list[bool] = []

    async def run_code(req: Any, *, tenant: str | None = None) -> dict[str, Any]:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return {}

    monkeypatch.setattr(app.state.service, "run_code", run_code)
    sent = await client_gone(app, "/run_code", b'{"code": "x"}')
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert cancelled == [True]


def test_a_fastapi_without_native_telemetry_is_telemetry_off() -> None:
    app = A.TangramApp()
    del app._native_telemetry  # (FastAPI before 0.16x has no such attribute)
    assert app._telemetry_on() is False


async def test_json_nested_too_deeply_is_400_naming_the_body(eng: Engine) -> None:
    raw = "[" * 100_000 + "]" * 100_000
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post("/v1/actions", content=raw, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (
        400,
        {"detail": "body: JSON nested too deeply", "field": "body"},
    )


async def test_the_app_leaves_the_engine_alone_by_default() -> None:
    e = _engine()
    seen: list[str] = []

    async def start() -> None:
        seen.append("start")

    e.start = start  # type: ignore[method-assign]
    app = A.create_app(e, ServiceConfig())
    async with app.router.lifespan_context(app):
        pass
    assert seen == []


async def test_run_code_in_the_full_stack_is_served_by_its_inner_fast_path(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig(tenants=TENANTS))
    app.fast = None  # (as when telemetry is on or a root path set: the full stack)
    got: list[Any] = []

    async def run_code(req: Any, *, tenant: str | None = None) -> dict[str, Any]:
        got.append((req.code, tenant))
        return {"status": "Success"}

    monkeypatch.setattr(app.state.service, "run_code", run_code)
    async with _client(app, "tok-b") as c:
        r = await c.post("/run_code", json={"code": "x"})
    assert (r.status_code, r.json()) == (200, {"status": "Success"})
    assert got == [("x", "bob")]


async def test_run_jupyter_runs_through_the_service(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = A.create_app(eng, ServiceConfig(tenants=TENANTS))
    got: list[Any] = []

    async def run_code(req: Any, *, tenant: str | None = None) -> dict[str, Any]:
        got.append(tenant)
        raise Overloaded("busy")

    monkeypatch.setattr(app.state.service, "run_code", run_code)
    async with _client(app, "tok-a") as c:
        r = await c.post("/run_jupyter", json={"cells": ["1"]})
    assert (r.status_code, r.json()) == (504, {"detail": "busy"})
    assert got == ["alice"]


async def test_the_fast_path_hands_what_it_does_not_serve_to_the_full_stack(eng: Engine) -> None:
    app = A.create_app(eng, ServiceConfig())
    assert app.fast is not None
    async with _client(app) as c:
        r = await c.post("/run_code", json={"code": 3})
    assert r.status_code == 422
    assert r.json()["message"] == "code: Input should be a valid string"


async def test_judge_compat_routes_run_over_the_service(eng: Engine) -> None:
    async with _client(A.create_app(eng, ServiceConfig())) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "zz", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5},
        )
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "model"
