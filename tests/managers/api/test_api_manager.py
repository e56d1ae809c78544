"""The API manager against a real HTTP provider on loopback (issue 37 items 2-3).

The provider (tests/managers/provider_server.py) enforces a real rate limit and concurrency cap
and answers 429 without headers past them. The engine runs the production core; the executor
holds one idle node (no action here needs a node: provider calls wait for the provider's
capacity, not a node's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core import commands as C
from arl_tangram.core.actions import Status
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.managers.api import ProviderConfigError, RequestError, parse_providers
from arl_tangram.managers.api.config import LocalFirst
from arl_tangram.managers.api.testing import ProviderServer
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.executor import Emit, Executor
from arl_tangram.runtime.providers import ProviderFront, attach_api, scheduler_providers

pytestmark = pytest.mark.integration


class IdleNode(Executor):
    """One node that runs nothing: these tests submit only provider calls."""

    async def start(self, emit: Emit) -> list[NodeSpec]:
        return [NodeSpec("n0", Resources(cpu=1, memory_mb=1024))]

    async def submit(self, commands: Sequence[C.Command]) -> None:
        assert not [c for c in commands if isinstance(c, C.StartAction)]

    def node_info(self) -> dict[str, dict[str, Any]]:
        return {}

    async def aclose(self) -> None:
        pass


def provider(name: str, url: str, *, rate: float = 50.0, burst: float = 5.0,
             concurrency: int = 16, path: str = "/search", **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": kw.pop("kind", "search"), "base_url": url, "path": path,
            "limits": {"rate_per_s": rate, "burst": burst, "concurrency": concurrency,
                       **kw.pop("limits", {})}, **kw}


class Rig:
    def __init__(self, raw: list[dict[str, Any]], env: dict[str, str] | None = None) -> None:
        self.configs = parse_providers(raw, env=env or {})
        self.engine = Engine(IdleNode(),
                             EngineConfig(core=CoreConfig(**scheduler_providers(self.configs))))

    async def __aenter__(self) -> Rig:
        await self.engine.start()
        self.api = attach_api(self.engine, self.configs, backoff_base_s=0.02)
        self.front = ProviderFront(self.engine, self.api)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.aclose()
        await self.api.aclose()

    def core_provider(self, name: str) -> Any:
        return self.engine.core.providers.by_name[name]  # type: ignore[union-attr]


async def test_a_burst_at_the_provider_s_limit_reaches_no_caller_with_a_429() -> None:
    async with ProviderServer(rate=50.0, burst=10.0, concurrency=16, latency_s=0.02) as srv, Rig([provider("serper", srv.url, rate=50.0, burst=5.0, concurrency=16)]) as rig:
        results = await asyncio.gather(*(
            rig.front.call("search", "serper", {"query": f"q{i}"}) for i in range(150)))
        assert [r.status for r in results] == [Status.SUCCEEDED] * 150
        assert {r.output["result"]["organic"][0]["title"] for r in results} == {
            f"about q{i}" for i in range(150)}
        assert srv.answered == 150 and srv.max_in_flight <= 16
        assert srv.requests == srv.answered + srv.rejected
        p = rig.core_provider("serper")
        assert (p.sent, p.spent) == (150 + p.throttles, 150)


async def test_a_provider_slower_than_declared_teaches_the_core_its_rate() -> None:
    # declared 50/s, real 20/s: the 429s (no headers) lower the bucket's rate, each call waits
    # again in the core, and no caller sees one
    async with ProviderServer(rate=20.0, burst=5.0, concurrency=16, latency_s=0.01) as srv, Rig([provider("slow", srv.url, rate=50.0, burst=5.0, limits={"max_attempts": 20})]) as rig:
        results = await asyncio.gather(*(
            rig.front.call("search", "slow", {"query": f"q{i}"}) for i in range(80)))
        assert [r.status for r in results] == [Status.SUCCEEDED] * 80
        p = rig.core_provider("slow")
        assert srv.rejected >= 1 and p.throttles == srv.rejected
        assert p.decreases >= 1 and p.bucket.rate < 50.0
        assert rig.api.stats["slow"].throttled == srv.rejected


async def test_eight_identical_concurrent_queries_make_one_provider_call_then_a_cache_hit() -> None:
    async with ProviderServer(latency_s=0.2) as srv, Rig([provider("serper", srv.url)]) as rig:
        results = await asyncio.gather(*(
            rig.front.call("search", "serper", {"query": "who  wrote\tHamlet "}, tenant="t1")
            for _ in range(8)))
        assert srv.queries == {"who wrote Hamlet": 1}
        assert [r.status for r in results] == [Status.SUCCEEDED] * 8
        assert len({json.dumps(r.output["result"]) for r in results}) == 1
        again = await rig.front.call("search", "serper", {"query": "who wrote Hamlet"}, tenant="t1")
        assert again.output["cached"] is True and srv.requests == 1
        other = await rig.front.call("search", "serper", {"query": "who wrote Hamlet"}, tenant="t2")
        assert other.output["cached"] is False and srv.requests == 2  # per tenant
        st = rig.front.stats()["serper"]
        assert (st["cache_hits"], st["coalesced"], st["calls"], st["sent"]) == (1, 7, 2, 2)


async def test_a_shared_cache_serves_every_tenant() -> None:
    async with ProviderServer() as srv, Rig([provider("serper", srv.url, cache_shared=True)]) as rig:
        await rig.front.call("search", "serper", {"query": "x"}, tenant="t1")
        r = await rig.front.call("search", "serper", {"query": "x"}, tenant="t2")
        assert r.output["cached"] is True and srv.requests == 1


async def test_dead_hung_and_garbage_providers_fail_naming_themselves_others_unaffected() -> None:
    async with ProviderServer() as srv:
        with socket.socket() as sock:  # a loopback port nothing listens on
            sock.bind(("127.0.0.1", 0))
            dead_port = sock.getsockname()[1]
        async with Rig([provider("ok", srv.url), provider("hung", srv.url, path="/hang"),
                        provider("junk", srv.url, path="/garbage"),
                        provider("down", srv.url, path="/die", retries=1),
                        provider("gone", f"http://127.0.0.1:{dead_port}", retries=1)]) as rig:
            hung = asyncio.ensure_future(rig.front.call("search", "hung", {"query": "a"}, timeout_s=3.0))
            junk = await rig.front.call("search", "junk", {"query": "a"})
            down = await rig.front.call("search", "down", {"query": "a"})
            gone = await rig.front.call("search", "gone", {"query": "a"})
            oks = await asyncio.gather(*(rig.front.call("search", "ok", {"query": f"k{i}"})
                                         for i in range(20)))
            assert not hung.done()  # the hung provider delays no one else
            assert [r.status for r in oks] == [Status.SUCCEEDED] * 20
            assert junk.status is Status.FAILED
            assert junk.reason == ("provider 'junk': answered garbage (HTTP 200, not JSON: "
                                   "'<html>rate limited, try later</html>')")
            assert down.status is Status.FAILED
            assert down.reason == "provider 'down': unreachable (RemoteProtocolError) (2 tries)"
            assert gone.status is Status.FAILED
            assert gone.reason == "provider 'gone': unreachable (ConnectError) (2 tries)"
            h = await hung
            assert h.status is Status.TIMED_OUT
            assert h.reason.startswith("provider 'hung': no answer within ")
            errs = rig.front.stats()
            assert errs["junk"]["errors"] == {"garbage": 1} and errs["hung"]["errors"] == {"timeout": 1}


async def test_retry_after_pauses_the_provider_then_the_call_succeeds() -> None:
    async with ProviderServer() as srv, Rig([provider("ra", srv.url, path="/retry-after")]) as rig:
        r = await rig.front.call("search", "ra", {"query": "x"})
        assert r.status is Status.SUCCEEDED and r.attempts == 2
        p = rig.core_provider("ra")
        assert (p.pauses, p.decreases, p.throttles) == (1, 0, 1)
        assert p.bucket.rate == 50.0  # a pause, not a decrease
        assert srv.requests == 2


async def test_a_5xx_is_retried_then_fails_naming_the_provider() -> None:
    async with ProviderServer() as srv, Rig([provider("bad", srv.url, path="/fail", retries=2)]) as rig:
        r = await rig.front.call("search", "bad", {"query": "x"})
        assert r.status is Status.FAILED and r.reason == "provider 'bad': HTTP 500 (3 tries)"
        assert srv.requests == 3 and rig.api.stats["bad"].retries == 2


async def test_keys_are_sent_but_never_in_results_stats_or_logs(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-test-7f3a9c1e5b2d4680"
    (tmp_path / "key").write_text(secret + "\n")
    caplog.set_level(logging.DEBUG)
    async with ProviderServer() as srv:
        raw = [provider("p", srv.url, keys=[{"file": str(tmp_path / "key")}, {"env": "K2"}]),
               provider("leaky", srv.url, path="/leak", keys=[{"file": str(tmp_path / "key")}])]
        async with Rig(raw, env={"K2": "sk-second-key-00000000"}) as rig:
            a = await rig.front.call("search", "p", {"query": "a"})
            b = await rig.front.call("search", "p", {"query": "b"})
            leak = await rig.front.call("search", "leaky", {"query": "c"})
            assert srv.auth[:2] == [f"Bearer {secret}", "Bearer sk-second-key-00000000"]  # pooled
            assert leak.status is Status.FAILED
            assert leak.reason == 'provider \'leaky\': HTTP 400: {"error": "bad key Bearer ***"}'
            seen = json.dumps([repr(x) for x in (a, b, leak)]) + json.dumps(rig.front.stats()) \
                + json.dumps(rig.engine.stats(), default=str) + caplog.text + repr(rig.configs)
            assert secret not in seen and "sk-second-key" not in seen


def test_bad_provider_config_names_the_field(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"
    cases = [
        ([provider("p", url, keys=[{"file": str(tmp_path / "missing.key")}])],
         "providers[0].keys[0].file: cannot read the key file: No such file or directory"),
        ([provider("p", url, keys=[{"env": "NOPE"}])],
         "providers[0].keys[0].env: variable NOPE is not set or empty"),
        ([provider("p", url, burst=0.5)], "providers[0].limits.burst: must be a finite number >= 1, got 0.5"),
        ([{**provider("p", url), "limits": {"rate_per_min": 100, "rate_per_s": 2}}],
         "providers[0].limits.rate_per_s: give exactly one of rate_per_s, rate_per_min"),
        ([provider("p", url), provider("p", url)], "providers[1].name: provider 'p' declared twice"),
        ([provider("p", "ftp://x")], "providers[0].base_url: must be an http(s) URL, got 'ftp://x'"),
        ([provider("p", url, kind="mail")], "providers[0].kind: must be one of search, fetch, http, got 'mail'"),
        ([provider("p", url, limits={"budget_per_step": -1})],
         "providers[0].limits.budget_per_step: must be an integer >= 0, got -1"),
        ([{**provider("p", url), "local_first": {"index": "wiki", "min_score": 2}}],
         "providers[0].local_first.min_score: must be a number in [-1, 1] (a cosine), got 2"),
        ([{**provider("p", url), "local_first": {"index": ""}}],
         "providers[0].local_first.index: must name a local index, got ''"),
        ([{**provider("p", url), "local_first": {"index": "w", "topk": 1000}}],
         "providers[0].local_first.topk: must be an integer in [1, 100], got 1000"),
        ([{**provider("p", url), "local_first": {"index": "w", "k": 1}}],
         "providers[0].local_first.k: unknown field"),
        ([{**provider("p", url, kind="fetch"), "local_first": {"index": "w"}}],
         "providers[0].local_first: only a search provider has one, this is a fetch provider"),
    ]
    for raw, msg in cases:
        with pytest.raises(ProviderConfigError) as got:
            parse_providers(raw, env={})
        assert str(got.value) == msg
    tavily = parse_providers([{**provider("t", url), "limits": {"rate_per_min": 100}}], env={})[0]
    assert tavily.limits.rate == pytest.approx(100 / 60)
    lf = parse_providers([{**provider("s", url, limits={"budget_per_step": 40}),
                           "local_first": {"index": "wiki", "min_score": 0.5}}], env={})[0]
    assert (lf.limits.budget_per_step, lf.local_first) == (40, LocalFirst("wiki", 0.5, 3))


async def test_bad_requests_name_the_field() -> None:
    async with ProviderServer() as srv, Rig([provider("p", srv.url)]) as rig:
        cases = [
            (("search", "nope", {"query": "x"}), "provider: unknown provider 'nope' (providers: p)"),
            (("search", "p", {"query": "x" * 1_000_000}), "query: must be at most 4096 characters, got 1000000"),
            (("search", "p", {"query": "  "}), "query: must be a non-empty string"),
            (("fetch", "p", {"url": "http://x"}), "provider: provider 'p' is a search provider, not fetch"),
        ]
        for args, msg in cases:
            with pytest.raises(RequestError) as got:
                await rig.front.call(*args)
            assert str(got.value) == msg
        assert srv.requests == 0


async def test_cancelling_a_call_in_flight_aborts_it_and_frees_its_slot() -> None:
    async with ProviderServer() as srv, Rig([provider("hung", srv.url, path="/hang", concurrency=1,
                                                      timeout_s=300)]) as rig:
        spec, _key = rig.front.spec("search", "hung", {"query": "a"}, timeout_s=300)
        (aid,) = rig.engine.submit_nowait(spec)
        for _ in range(500):
            if srv.requests:
                break
            await asyncio.sleep(0.01)
        p = rig.core_provider("hung")
        assert srv.requests == 1 and len(p.inflight) == 1
        assert await rig.engine.cancel(aid)
        res = await rig.engine.result(aid, wait=10)
        assert res is not None and res.status.name == "CANCELLED"
        for _ in range(500):  # the manager aborts the request and reports: the slot is free
            if not p.inflight:
                break
            await asyncio.sleep(0.01)
        assert not p.inflight and not rig.api._running


async def test_an_answer_on_disk_serves_after_a_restart(tmp_path: Path) -> None:
    async with ProviderServer() as srv:
        raw = [provider("serper", srv.url, cache_dir=str(tmp_path / "cache"))]
        async with Rig(raw) as rig:
            first = await rig.front.call("search", "serper", {"query": "q"}, tenant="t1")
            assert first.output["cached"] is False
        assert len(list((tmp_path / "cache").glob("*.json"))) == 1
        async with Rig(raw) as rig2:  # a new service: an empty memory cache
            again = await rig2.front.call("search", "serper", {"query": "q"}, tenant="t1")
            assert again.output["cached"] is True and again.output["result"] == first.output["result"]
            assert srv.requests == 1 and rig2.api.stats["serper"].hits == 1
