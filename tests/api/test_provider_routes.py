"""Provider calls through the service's edges (issue 37 item 5): `Client.search`/`Client.fetch`
(`POST /v1/search`, `/v1/fetch`), `POST /v1/actions` with kind search/fetch, `/v1/stats` and
`/metrics` per provider -- an embedded service whose providers are real HTTP servers on loopback
(tests/managers/provider_server.py) enforcing a real limit."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import InvalidAction
from arl_tangram.managers.api import parse_providers
from arl_tangram.managers.api.testing import ProviderServer
from arl_tangram.runtime.config import default_config

pytestmark = pytest.mark.integration
SECRET = "sk-route-test-5c2e9a7b"


def _config(url: str, key_file: Path) -> object:
    providers = parse_providers([
        {"name": "serper", "kind": "search", "base_url": url, "keys": [{"file": str(key_file)}],
         "limits": {"rate_per_s": 50, "burst": 5, "concurrency": 8}},
        {"name": "jina", "kind": "fetch", "base_url": url, "path": "/search",
         "limits": {"rate_per_min": 600, "burst": 2, "budget": 2}},
    ], env={})
    return dataclasses.replace(default_config(with_models=False), providers=providers)


async def test_search_fetch_and_actions_through_the_service(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(SECRET)
    async with ProviderServer(latency_s=0.1) as srv:
        client = await AsyncClient.embedded(_config(srv.url, tmp_path / "key"))
        try:
            one = await client.search("capital of France", provider="serper")
            assert (one["status"], one["provider"], one["cached"]) == ("succeeded", "serper", False)
            assert one["result"] == {"organic": [{"title": "about capital of France"}]}
            assert srv.auth == [f"Bearer {SECRET}"]
            # 8 siblings of a GRPO group at once: one provider call
            outs = await asyncio.gather(*(client.search("who wrote Hamlet", provider="serper")
                                          for _ in range(8)))
            assert srv.queries["who wrote Hamlet"] == 1
            assert {o["status"] for o in outs} == {"succeeded"}
            # the same through POST /v1/actions, kind search: a cache hit (no call)
            got = await client.submit({"kind": "search", "payload": {"provider": "serper",
                                                                     "query": "who wrote Hamlet"}},
                                      wait=True, wait_s=30)
            res = got["results"][0]
            assert res["status"] == "succeeded" and res["output"]["cached"] is True
            assert srv.queries["who wrote Hamlet"] == 1
            f = await client.fetch("https://example.org/a", provider="jina")
            assert f["status"] == "succeeded"
            await client.fetch("https://example.org/b", provider="jina")
            spent = await client.fetch("https://example.org/c", provider="jina")
            assert spent["status"] == "failed"
            assert spent["reason"] == "provider 'jina': budget of 2 calls spent (2 answered)"
            stats = await client.stats()
            s = stats["providers"]["serper"]
            assert (s["sent"], s["coalesced"], s["served_from_cache"], s["ok"]) == (2, 7, 1, 2)
            assert stats["providers"]["jina"]["failed_budget"] == 1
            metrics = (await client._http.get("/metrics")).text
            assert 'tangram_provider_requests_total{outcome="ok",provider="serper"} 2.0' in metrics
            assert 'tangram_provider_coalesced_total{provider="serper"} 7.0' in metrics
            assert SECRET not in metrics and SECRET not in str(stats)
        finally:
            await client.aclose()


async def test_bad_provider_requests_name_the_field(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(SECRET)
    async with ProviderServer() as srv:
        client = await AsyncClient.embedded(_config(srv.url, tmp_path / "key"))
        try:
            cases = [
                (client.search("x", provider="nope"), "provider",
                 "unknown provider 'nope' (providers: jina, serper)"),
                (client.search("x" * 1_000_000, provider="serper"), "query",
                 "must be at most 4096 characters, got 1000000"),
                (client.fetch("ftp://x", provider="jina"), "url", "must be an http(s) URL"),
                (client.submit({"kind": "search", "payload": {"query": "x"}}),
                 "actions[0].payload.provider", "names the provider (search and fetch actions)"),
                (client.submit({"kind": "fetch", "payload": {"provider": "serper", "url": "http://a"}}),
                 "actions[0].payload.provider", "provider 'serper' is a search provider, not fetch"),
            ]
            for call, field, msg in cases:
                with pytest.raises(InvalidAction) as got:
                    await call
                assert got.value.field == field and msg in str(got.value)
            assert srv.requests == 0
        finally:
            await client.aclose()
