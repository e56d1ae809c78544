"""Batch sizes bounded by `limits.max_batch` counting what a request becomes (issue 35, H2):
the actions of a POST /v1/actions with their models fanned out, the items x models of
/get_reward, the inputs of /classify; past it 400 naming the field, and nothing submitted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

MODELS = (ModelSpec("a", kind="scalar", memory_mb=10), ModelSpec("b", kind="scalar", memory_mb=10))


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    cfg = ServiceConfig(models=MODELS, limits=LimitsConfig(max_batch=4))
    eng = Engine(FakeExecutor(cpu=2), EngineConfig(tick_s=0.05, models=MODELS),
                 core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        c.engine = eng  # type: ignore[attr-defined]
        yield c
    await eng.aclose()


def _submitted(api: httpx.AsyncClient) -> dict[str, int]:
    return dict(api.engine.stats()["submitted"])  # type: ignore[attr-defined]


async def test_fanned_out_models_count_against_the_batch(api: httpx.AsyncClient) -> None:
    one = {"kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}
    r = await api.post("/v1/actions", json={"actions": [one, one, one]})  # 3 x 2 = 6 > 4
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "actions"
    assert r.json()["detail"] == ("actions: 6 actions with their models fanned out, at most 4 "
                                  "per request")
    assert _submitted(api) == {}
    r = await api.post("/v1/actions", json={"actions": [one, one]})  # 4: at the bound
    assert r.status_code == 200, r.text
    assert _submitted(api) == {"reward": 4}


async def test_reward_routes_count_items_times_models(api: httpx.AsyncClient) -> None:
    r = await api.post("/get_reward", json={"query": ["x", "y", "z"], "model": ["a", "b"]})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "query"
    assert r.json()["detail"] == ("query: 3 items x 2 models = 6 actions, at most 4 per request "
                                  "(limits.max_batch)")
    r = await api.post("/classify", json={"model": "a", "input": ["1", "2", "3", "4", "5"]})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "input"
    assert _submitted(api) == {}
