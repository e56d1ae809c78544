"""POST /v1/sessions for a session whose own ``ttl_s`` passed before its node reported it open:
410 naming ``ttl_s`` (the client's choice, never a 5xx: CI's schemathesis run found the node's
503 answered for it). The real service (ASGI) and engine, a fake node that never reports."""

from __future__ import annotations

import httpx
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig


class _Silent(FakeExecutor):
    reports_session_open = True  # (and never reports one)


async def test_an_open_outlived_by_its_ttl_is_410_naming_ttl_s() -> None:
    eng = Engine(_Silent(cpu=2), EngineConfig(tick_s=0.02), core_factory=core_factory)
    await eng.start()
    try:
        app = create_app(eng, ServiceConfig(limits=LimitsConfig(session_open_wait_s=0.2)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as api:
            r = await api.post("/v1/sessions", json={"session_id": "brief", "ttl_s": 0.05})
            assert (r.status_code, r.json()) == (410, {
                "detail": "ttl_s: session 'brief' expired before its node opened it (ttl_s=0.05 "
                          "s, counted from the request, is shorter than its open took); its "
                          "state is gone: open it again with a longer ttl_s",
                "field": "ttl_s"})
            assert eng.session_count() == 0
            # the id is free again (a new session)
            r = await api.post("/v1/sessions", json={"session_id": "brief", "ttl_s": 600})
            assert (r.status_code, r.json()) == (202, {"session_id": "brief",
                                                       "state": "opening"})  # (never reported)
    finally:
        await eng.aclose()
