"""The search routes' answers word for word (issue 43 item 2): `api/search.py` over a stand-in
engine (its models, ids, results and provider front are the test's), behind the service's own
error mapping (`app._install_errors`).

``/retrieve`` is checked against the peer's schema: Search-R1's ``retrieval_server.py``
(``QueryRequest``: ``queries: List[str]``, ``topk: Optional[int] = None``, ``return_scores: bool
= False``; the answer ``{"result": [[{"document": doc, "score": s}, ...] or [doc, ...], ...]}``),
read as verl's search tool reads it (``item["document"]["contents"]``, the title its first line).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from arl_tangram.api import search as S
from arl_tangram.api.app import _install_errors
from arl_tangram.api.middleware import TENANT_KEY
from arl_tangram.core.actions import ActionKind, ActionResult, ActionSpec, Status
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import Hit, ProviderResult, RetrieveRequest, RetrieveResult
from arl_tangram.managers.api.manager import RequestError
from arl_tangram.runtime.providers import Routed


class SearchR1Query(BaseModel):  # Search-R1's retrieval_server.QueryRequest
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


D0 = {"id": "0", "contents": "Paris\nParis is the capital of France."}
D1 = {"id": "1", "contents": "Everest\nThe highest mountain."}


class Front:
    def __init__(self) -> None:
        self.api = SimpleNamespace(providers={"serper": object(), "wiki2": object()})
        self.calls: list[tuple] = []
        self.answer: Any = None
        self.raise_: Exception | None = None
        self.st: dict[str, dict[str, Any]] = {}

    async def search(self, provider, req, *, source, tenant, timeout_s, trajectory):
        self.calls.append(("search", provider, req, source, tenant, timeout_s, trajectory))
        if self.raise_:
            raise self.raise_
        return self.answer

    async def call(self, kind, provider, req, *, tenant, timeout_s, trajectory):
        self.calls.append((kind, provider, req, tenant, timeout_s, trajectory))
        if self.raise_:
            raise self.raise_
        return self.answer

    def stats(self):
        return self.st

    def spec(self, kind, provider, payload, **kw):
        self.calls.append(("spec", kind, provider, payload, kw))
        if self.raise_:
            raise self.raise_
        return ("got", provider)

    def cached(self, got):
        return ("cached", got)

    async def local_step(self, tag, query, source, *, timeout_s, trajectory):
        self.calls.append(("local_step", tag, query, source, timeout_s, trajectory))
        if self.raise_:
            raise self.raise_
        return self.answer


class Engine:
    def __init__(self, indexes=("wiki", "books"), front: Front | None = None) -> None:
        models = [SimpleNamespace(name=n, options={"index": True}) for n in indexes]
        models.append(SimpleNamespace(name="rm", options={}))
        models.append(SimpleNamespace(name="off", options={"index": False}))
        self.config = SimpleNamespace(models=models)
        self.api = front
        self._ids = itertools.count()
        self.submitted: list[ActionSpec] = []
        self.results: dict[str, ActionResult | None] = {}
        self.ran: list[ActionSpec] = []
        self.run_result: ActionResult | None = None

    def new_id(self) -> str:
        return f"a{next(self._ids)}"

    def submit_nowait(self, specs):
        self.submitted.extend(specs)
        return [s.id for s in specs]

    async def result(self, i):
        return self.results.get(i)

    async def run(self, spec):
        self.ran.append(spec)
        return self.run_result


def ok(aid: str, output: Any, reason: str = "", status: Status = Status.SUCCEEDED) -> ActionResult:
    return ActionResult(aid, status, submit_time=1.0, finish_time=3.5, output=output, reason=reason)


def client(engine: Engine, tenant: str | None = None) -> TestClient:
    app = FastAPI()
    app.state.registry = None
    _install_errors(app)
    S.add_routes(app, SimpleNamespace(engine=engine))
    if tenant is not None:
        inner = app.build_middleware_stack

        def build():
            app_ = inner()

            async def with_tenant(scope, receive, send):
                scope[TENANT_KEY] = tenant
                await app_(scope, receive, send)

            return with_tenant

        app.build_middleware_stack = build  # type: ignore[method-assign]
    return TestClient(app)


# ---- /retrieve ------------------------------------------------------------------------------


def test_retrieve_answers_search_r1_s_schema_with_scores_and_without() -> None:
    e = Engine()
    e.results = {
        "a0": ok("a0", RetrieveResult(model="wiki", hits=(Hit(D0, 0.71), Hit(D1, 0.5)))),
        "a1": ok("a1", RetrieveResult(model="wiki", hits=(Hit(D1, 0.9),))),
    }
    body = SearchR1Query(queries=["capital of france", "tallest"], return_scores=True)
    r = client(e).post("/retrieve", json=body.model_dump())
    assert r.status_code == 200
    assert r.json() == {
        "result": [
            [{"document": D0, "score": 0.71}, {"document": D1, "score": 0.5}],
            [{"document": D1, "score": 0.9}],
        ]
    }
    first = r.json()["result"][0][0]["document"]["contents"]  # (verl: title, then the text)
    assert first.split("\n")[0] == "Paris"
    assert [s.payload for s in e.submitted] == [
        RetrieveRequest(query="capital of france", topk=3),
        RetrieveRequest(query="tallest", topk=3),
    ]
    s = e.submitted[0]
    assert (s.id, s.kind, s.model, s.tag, s.demand, s.timeout_s) == (
        "a0",
        ActionKind.RETRIEVE,
        "books",
        "books",
        Resources(),
        60.0,
    )  # (the first by name)
    e2 = Engine()
    e2.results = {"a0": ok("a0", RetrieveResult(model="wiki", hits=(Hit(D0, 0.71), Hit(D1, 0.5))))}
    r = client(e2).post(
        "/retrieve", json={"queries": ["q"], "topk": 2, "index": "wiki", "extra": 1}
    )
    assert r.status_code == 200 and r.json() == {"result": [[D0, D1]]}
    assert e2.submitted[0].payload == RetrieveRequest(query="q", topk=2)
    assert e2.submitted[0].model == "wiki"


def test_retrieve_a_result_that_is_not_hits_is_an_empty_list() -> None:
    e = Engine()
    e.results = {"a0": ok("a0", {"not": "hits"})}
    assert client(e).post("/retrieve", json={"queries": ["q"]}).json() == {"result": [[]]}


@pytest.mark.parametrize(
    ("result", "why"),
    [
        (None, "no result"),
        (ok("a0", None, "boom", Status.FAILED), "failed: boom"),
        (ok("a0", None, "late", Status.TIMED_OUT), "timed_out: late"),
    ],
)
def test_retrieve_a_failed_query_is_a_502_naming_the_index(result, why) -> None:
    e = Engine()
    e.results = {"a0": result}
    r = client(e).post("/retrieve", json={"queries": ["q"], "index": "wiki"})
    assert r.status_code == 502
    assert r.json() == {"error": f"index 'wiki': {why}", "field": "index"}


@pytest.mark.parametrize(
    ("body", "served", "err"),
    [
        ({"queries": []}, ["w"], "queries: must list at least one query"),
        ({"queries": ["q"] * 1025}, ["w"], "queries: at most 1024 per request, got 1025"),
        (
            {"queries": ["q", "x" * 4097]},
            ["w"],
            "queries[1]: must be at most 4096 characters, got 4097",
        ),
        ({"queries": ["q", " \t"]}, ["w"], "queries[1]: must not be empty"),
        ({"queries": ["q"], "topk": -1}, ["w"], "topk: must be in [1, 100], got -1"),
        ({"queries": ["q"], "topk": 101}, ["w"], "topk: must be in [1, 100], got 101"),
        (
            {"queries": ["q"]},
            [],
            "index: no local index is served (build one: tangram index "
            "build CORPUS.jsonl --name NAME)",
        ),
        (
            {"queries": ["q"], "index": "zz"},
            ["a", "b"],
            "index: unknown index 'zz' (indexes: a, b)",
        ),
    ],
)
def test_check_retrieve_refuses_word_for_word(body, served, err) -> None:
    with pytest.raises(InvalidAction) as e:
        S.check_retrieve(S.RetrieveIn(**body), served)
    assert str(e.value) == err and e.value.field == err.split(":")[0]


def test_check_retrieve_at_its_edges() -> None:
    assert S.check_retrieve(S.RetrieveIn(queries=["q"] * 1024, topk=1), ["w"]) == ("w", 1)
    # absent, null or 0: Search-R1's default (its server: `if not request.topk`)
    assert S.check_retrieve(S.RetrieveIn(queries=["q"], topk=0), ["w"]) == ("w", 3)
    assert S.check_retrieve(S.RetrieveIn(queries=["q"], topk=None), ["w"]) == ("w", 3)
    assert S.check_retrieve(S.RetrieveIn(queries=["q"]), ["w"]) == ("w", 3)
    assert S.check_retrieve(S.RetrieveIn(queries=["x" * 4096], topk=100), ["w", "v"]) == ("w", 100)
    assert S.check_retrieve(S.RetrieveIn(queries=["q"], index="v"), ["w", "v"]) == ("v", 3)
    assert (S.MAX_QUERIES, S.MAX_QUERY_CHARS) == (1024, 4096)


def test_a_bad_retrieve_is_a_400_with_the_field() -> None:
    r = client(Engine()).post("/retrieve", json={"queries": ["q"], "topk": -2})
    assert r.status_code == 400
    assert r.json() == {"detail": "topk: must be in [1, 100], got -2", "field": "topk"}


def test_retrievers_are_the_models_with_an_index_by_name() -> None:
    assert S.retrievers(Engine(indexes=("wiki", "books"))) == ["books", "wiki"]


# ---- /v1/search naming a local index --------------------------------------------------------


def test_a_search_naming_a_local_index_is_answered_by_its_retriever() -> None:
    e = Engine()
    e.run_result = ok("a0", RetrieveResult(model="wiki", hits=(Hit(D0, 0.8), Hit(D1, 0.4))))
    r = client(e).post(
        "/v1/search",
        json={
            "provider": "wiki",
            "query": "paris",
            "options": {"topk": 2},
            "timeout_s": 600,
            "trajectory": "t1",
            "source": "local",
        },
    )
    assert r.status_code == 200
    assert r.json() == {
        "id": "a0",
        "status": "succeeded",
        "provider": "wiki",
        "result": [{"document": D0, "score": 0.8}, {"document": D1, "score": 0.4}],
        "cached": False,
        "reason": "",
        "act_s": 2.5,
        "route": "local",
        "route_reason": "names a local index",
        "local_score": 0.8,
    }
    s = e.ran[0]
    assert (s.id, s.kind, s.model, s.tag, s.trajectory, s.timeout_s, s.demand) == (
        "a0",
        ActionKind.RETRIEVE,
        "wiki",
        "wiki",
        "t1",
        600.0,
        Resources(),
    )
    assert s.payload == RetrieveRequest(query="paris", topk=2)
    e.run_result = ok("a1", None, "gone", Status.FAILED)
    r = client(e).post("/v1/search", json={"provider": "wiki", "query": "x" * 4096})
    assert r.json() == {
        "id": "a1",
        "status": "failed",
        "provider": "wiki",
        "result": None,
        "cached": False,
        "reason": "gone",
        "act_s": 2.5,
        "route": "local",
        "route_reason": "names a local index",
        "local_score": None,
    }
    assert e.ran[1].payload == RetrieveRequest(query="x" * 4096, topk=3)
    assert e.ran[1].timeout_s == 60.0


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"query": "  "}, "query: must be a non-empty string"),
        ({}, "query: must be a non-empty string"),
        ({"query": "x" * 4097}, "query: must be at most 4096 characters, got 4097"),
        (
            {"query": "q", "options": {"topk": 0}},
            "options.topk: must be an integer in [1, 100], got 0",
        ),
        (
            {"query": "q", "options": {"topk": 101}},
            "options.topk: must be an integer in [1, 100], got 101",
        ),
        (
            {"query": "q", "options": {"topk": True}},
            "options.topk: must be an integer in [1, 100], got True",
        ),
        (
            {"query": "q", "options": {"topk": "3"}},
            "options.topk: must be an integer in [1, 100], got '3'",
        ),
        ({"query": "q", "timeout_s": 0}, "timeout_s: must be in (0, 600], got 0.0"),
        ({"query": "q", "timeout_s": 600.5}, "timeout_s: must be in (0, 600], got 600.5"),
        (
            {"query": "q", "source": "web"},
            "source: 'wiki' is a local index: source must be auto or local, got 'web'",
        ),
    ],
)
def test_a_bad_local_search_is_refused_naming_the_field(body, detail) -> None:
    e = Engine()
    e.run_result = ok("a0", RetrieveResult(model="wiki"))
    r = client(e).post("/v1/search", json={"provider": "wiki", **body})
    assert r.status_code == 400
    assert r.json() == {"detail": detail, "field": detail.split(":")[0]}
    assert e.ran == []


def test_a_local_index_also_declared_as_a_provider_goes_to_the_provider() -> None:
    f = Front()
    e = Engine(indexes=("wiki2", "books"), front=f)
    f.answer = Routed(
        result=ok("a9", ProviderResult(provider="wiki2", result={"x": 1})),
        provider="wiki2",
        route="web",
        route_reason="r",
        local_score=None,
    )
    r = client(e).post("/v1/search", json={"provider": "wiki2", "query": "q"})
    assert r.status_code == 200 and r.json()["route"] == "web" and e.ran == []
    e.run_result = ok("a7", RetrieveResult(model="books"))
    r = client(e).post("/v1/search", json={"provider": "books", "query": "q", "source": "auto"})
    assert r.json()["route"] == "local"
    assert e.ran[0].model == "books"  # (an index that is no provider: the retriever)
    f.answer = ok("a8", None)
    assert client(e).post("/v1/fetch", json={"provider": "books", "url": "u"}).status_code == 200
    assert f.calls[-1][0:2] == ("fetch", "books")  # (a fetch never goes to an index)


# ---- /v1/search, /v1/fetch through a provider -----------------------------------------------


def test_without_providers_an_unknown_provider_is_a_400() -> None:
    r = client(Engine()).post("/v1/fetch", json={"provider": "serper", "url": "u"})
    assert r.status_code == 400
    assert r.json() == {
        "detail": "provider: unknown provider 'serper' (providers: none declared)",
        "field": "provider",
    }


def test_a_provider_search_is_routed_and_answered_with_its_route() -> None:
    f = Front()
    e = Engine(front=f)
    f.answer = Routed(
        result=ok("a3", ProviderResult(provider="serper", result={"organic": [1]}, cached=True)),
        provider="serper",
        route="web",
        route_reason="no index",
        local_score=0.25,
    )
    r = client(e, tenant="team").post(
        "/v1/search",
        json={
            "provider": "serper",
            "query": "q",
            "options": {"gl": "fr"},
            "step": 7,
            "timeout_s": 5,
            "trajectory": "t",
            "source": "web",
        },
    )
    assert r.status_code == 200
    assert r.json() == {
        "id": "a3",
        "status": "succeeded",
        "provider": "serper",
        "result": {"organic": [1]},
        "cached": True,
        "reason": "",
        "act_s": 2.5,
        "route": "web",
        "route_reason": "no index",
        "local_score": 0.25,
    }
    assert f.calls == [
        (
            "search",
            "serper",
            {"query": "q", "options": {"gl": "fr"}, "step": 7},
            "web",
            "team",
            5.0,
            "t",
        )
    ]
    client(e).post("/v1/search", json={"provider": "serper", "query": "q"})
    assert f.calls[-1] == ("search", "serper", {"query": "q"}, "auto", "", 60.0, None)


def test_a_provider_fetch_is_called_and_answered_without_a_route() -> None:
    f = Front()
    e = Engine(front=f)
    f.answer = ok("a4", ProviderResult(provider="serper", result="<html>"))
    r = client(e, tenant="t1").post(
        "/v1/fetch", json={"provider": "serper", "url": "http://x", "step": 0, "timeout_s": 600}
    )
    assert r.json() == {
        "id": "a4",
        "status": "succeeded",
        "provider": "serper",
        "result": "<html>",
        "cached": False,
        "reason": "",
        "act_s": 2.5,
    }
    assert f.calls == [("fetch", "serper", {"url": "http://x", "step": 0}, "t1", 600.0, None)]
    f.answer = ok("a5", None, "down", Status.FAILED)
    r = client(e).post("/v1/fetch", json={"provider": "serper", "url": "http://x"})
    assert r.json() == {
        "id": "a5",
        "status": "failed",
        "provider": "serper",
        "result": None,
        "cached": False,
        "reason": "down",
        "act_s": 2.5,
    }
    assert f.calls[-1] == ("fetch", "serper", {"url": "http://x"}, "", 60.0, None)


@pytest.mark.parametrize("timeout", [0, -1, 600.001])
def test_a_provider_call_s_timeout_is_in_0_600(timeout) -> None:
    f = Front()
    r = client(Engine(front=f)).post(
        "/v1/search", json={"provider": "serper", "query": "q", "timeout_s": timeout}
    )
    assert r.status_code == 400
    assert r.json() == {
        "detail": f"timeout_s: must be in (0, 600], got {float(timeout)}",
        "field": "timeout_s",
    }
    assert f.calls == []


def test_a_request_the_provider_front_refuses_is_a_400_naming_its_field() -> None:
    f = Front()
    f.raise_ = RequestError("query", "must be a non-empty string")
    for path in ("/v1/search", "/v1/fetch"):
        r = client(Engine(front=f)).post(path, json={"provider": "serper", "query": ""})
        assert r.status_code == 400
        assert r.json() == {"detail": "query: must be a non-empty string", "field": "query"}


def test_an_unknown_field_of_a_provider_call_is_a_422() -> None:
    r = client(Engine(front=Front())).post("/v1/search", json={"provider": "s", "q": "x"})
    assert r.status_code == 422


def test_search_body_of_each_outcome() -> None:
    res = ok("a", RetrieveResult(model="w", hits=(Hit(D0, 0.5),)))
    rt = Routed(result=res, provider="w", route="local", route_reason="why", local_score=0.5)
    assert S.search_body(rt) == {
        "id": "a",
        "status": "succeeded",
        "provider": "w",
        "result": [{"document": D0, "score": 0.5}],
        "cached": False,
        "reason": "",
        "act_s": 2.5,
        "route": "local",
        "route_reason": "why",
        "local_score": 0.5,
    }
    rt = Routed(
        result=ok("b", "text", "r", Status.FAILED),
        provider="p",
        route="web",
        route_reason="x",
        local_score=None,
    )
    body = S.search_body(rt)
    assert (body["result"], body["cached"], body["status"], body["reason"]) == (
        None,
        False,
        "failed",
        "r",
    )
    rt = Routed(
        result=ok("c", ProviderResult(provider="p", result=[1], cached=False)),
        provider="p",
        route="web",
        route_reason="x",
        local_score=None,
    )
    assert (S.search_body(rt)["result"], S.search_body(rt)["cached"]) == ([1], False)


# ---- actions of POST /v1/actions ------------------------------------------------------------


def spec(kind=ActionKind.SEARCH, tag="serper", payload=None, **kw) -> ActionSpec:
    return ActionSpec(
        "x1",
        kind=kind,
        tag=tag,
        demand=Resources(),
        timeout_s=30.0,
        weight=2.0,
        trajectory="tr",
        payload=payload if payload is not None else {},
        **kw,
    )


def test_provider_action_names_the_provider_from_payload_or_tag() -> None:
    f = Front()
    e = Engine(front=f)
    got = S.provider_action(
        e, spec(payload={"provider": "bing", "query": "q", "source": "web"}), "actions[0]", "ten"
    )
    assert got == ("cached", ("got", "bing"))
    assert f.calls == [
        (
            "spec",
            "search",
            "bing",
            {"query": "q"},
            {
                "tenant": "ten",
                "timeout_s": 30.0,
                "weight": 2.0,
                "trajectory": "tr",
                "action_id": "x1",
            },
        )
    ]
    S.provider_action(e, spec(kind=ActionKind.FETCH, payload={"url": "u"}), "a", None)
    assert f.calls[-1][1:4] == ("fetch", "serper", {"url": "u"})
    assert f.calls[-1][4]["tenant"] == ""


def test_provider_action_refusals_name_the_field() -> None:
    with pytest.raises(InvalidAction) as e:
        S.provider_action(
            Engine(front=Front()), spec(tag=None, payload={"provider": ""}), "w", None
        )
    assert str(e.value) == "w.payload.provider: names the provider (search and fetch actions)"
    with pytest.raises(InvalidAction) as e:
        S.provider_action(Engine(front=Front()), spec(tag=None, payload={"provider": 3}), "w", None)
    assert e.value.field == "w.payload.provider"
    with pytest.raises(InvalidAction) as e:
        S.provider_action(Engine(), spec(), "w", None)
    assert str(e.value) == (
        "w.payload.provider: unknown provider 'serper' (providers: none declared)"
    )
    f = Front()
    f.raise_ = RequestError("provider", "unknown provider 'serper' (providers: a)")
    with pytest.raises(InvalidAction) as e:
        S.provider_action(Engine(front=f), spec(), "w", None)
    assert str(e.value) == "w.payload.provider: unknown provider 'serper' (providers: a)"
    f.raise_ = RequestError("options", "must be an object: a: b")
    with pytest.raises(InvalidAction) as e:
        S.provider_action(Engine(front=f), spec(), "w", None)
    assert str(e.value) == "w.payload.options: must be an object: a: b"
    assert e.value.field == "w.payload.options"


async def test_route_action_takes_the_local_answer_only_on_the_local_route() -> None:
    f = Front()
    e = Engine(front=f)
    local = ok("l", RetrieveResult(model="w"))
    f.answer = (local, "local", "score 0.9 >= 0.5", 0.9)
    got = await S.route_action(e, spec(payload={"request": {"query": "paris"}}), "a[0]", "auto")
    assert got == (
        local,
        {"route": "local", "route_reason": "score 0.9 >= 0.5", "local_score": 0.9},
    )
    assert f.calls == [("local_step", "serper", "paris", "auto", 30.0, "tr")]
    f.answer = (local, "web", "low", 0.1)
    got = await S.route_action(e, spec(tag=None, payload={"request": {"query": "q"}}), "a", 5)
    assert got == (None, {"route": "web", "route_reason": "low", "local_score": 0.1})
    assert f.calls[-1] == ("local_step", "", "q", "5", 30.0, "tr")
    got = await S.route_action(e, spec(payload={}), "a", "web")
    assert f.calls[-1][2] == ""


async def test_route_action_without_a_route() -> None:
    assert await S.route_action(Engine(), spec(), "a") == (None, {})
    f = Front()
    assert await S.route_action(Engine(front=f), spec(kind=ActionKind.FETCH), "a", "auto") == (
        None,
        {},
    )
    assert f.calls == []
    for e in (Engine(), Engine(front=Front())):
        with pytest.raises(InvalidAction) as err:
            await S.route_action(e, spec(kind=ActionKind.FETCH), "a[1]", "local")
        assert str(err.value) == (
            "a[1].payload.source: only a search of a declared provider has a route"
        )
    f.raise_ = RequestError("source", "must be auto, local or web: x: y")
    with pytest.raises(InvalidAction) as err:
        await S.route_action(Engine(front=f), spec(payload={"query": "q"}), "a", "x")
    assert str(err.value) == "a.payload.source: must be auto, local or web: x: y"


# ---- /metrics ---------------------------------------------------------------------------------


def test_the_provider_collector_s_families_and_samples() -> None:
    f = Front()
    f.st = {
        "zeta": {
            "ok": 5,
            "errors": {"timeout": 2, "5xx": 1},
            "throttled": 3,
            "cache_hits": 4,
            "cache_misses": 6,
            "coalesced": 7,
            "retries": 8,
            "latency_sum_s": 1.5,
            "latency_count": 5,
            "rate": 2.5,
            "waiting": 9,
            "in_flight": 10,
        },
        "alpha": {
            "errors": None,
            "cache_hits": None,
            "rate": None,
            "waiting": None,
            "in_flight": None,
        },
    }
    reg = CollectorRegistry()
    reg.register(S.ProviderCollector(Engine(front=f)))
    got = {
        (m.name, tuple(sorted(s.labels.items())), s.name): s.value
        for m in reg.collect()
        for s in m.samples
    }
    fams = [m.name for m in reg.collect()]
    assert fams == [
        "tangram_provider_requests",
        "tangram_provider_throttled",
        "tangram_provider_cache_hits",
        "tangram_provider_cache_misses",
        "tangram_provider_coalesced",
        "tangram_provider_retries",
        "tangram_provider_latency_seconds_sum",
        "tangram_provider_latency_seconds_count",
        "tangram_provider_rate",
        "tangram_provider_waiting",
        "tangram_provider_in_flight",
    ]
    z = (("provider", "zeta"),)
    a = (("provider", "alpha"),)
    req = "tangram_provider_requests"
    assert {k[1]: v for k, v in got.items() if k[0] == req} == {
        (("outcome", "ok"), ("provider", "zeta")): 5.0,
        (("outcome", "5xx"), ("provider", "zeta")): 1.0,
        (("outcome", "timeout"), ("provider", "zeta")): 2.0,
        (("outcome", "throttled"), ("provider", "zeta")): 3.0,
        (("outcome", "ok"), ("provider", "alpha")): 0.0,
        (("outcome", "throttled"), ("provider", "alpha")): 0.0,
    }
    samples = [s for m in reg.collect() if m.name == req for s in m.samples]
    assert [(s.labels["provider"], s.labels["outcome"]) for s in samples] == [
        ("alpha", "ok"),
        ("alpha", "throttled"),
        ("zeta", "ok"),
        ("zeta", "5xx"),
        ("zeta", "timeout"),
        ("zeta", "throttled"),
    ]
    for fam, name, zv, av in [
        ("tangram_provider_throttled", "tangram_provider_throttled_total", 3.0, 0.0),
        ("tangram_provider_cache_hits", "tangram_provider_cache_hits_total", 4.0, 0.0),
        ("tangram_provider_cache_misses", "tangram_provider_cache_misses_total", 6.0, 0.0),
        ("tangram_provider_coalesced", "tangram_provider_coalesced_total", 7.0, 0.0),
        ("tangram_provider_retries", "tangram_provider_retries_total", 8.0, 0.0),
        (
            "tangram_provider_latency_seconds_sum",
            "tangram_provider_latency_seconds_sum_total",
            1.5,
            0.0,
        ),
        (
            "tangram_provider_latency_seconds_count",
            "tangram_provider_latency_seconds_count_total",
            5.0,
            0.0,
        ),
        ("tangram_provider_rate", "tangram_provider_rate", 2.5, 0.0),
        ("tangram_provider_waiting", "tangram_provider_waiting", 9.0, 0.0),
        ("tangram_provider_in_flight", "tangram_provider_in_flight", 10.0, 0.0),
    ]:
        assert got[(fam, z, name)] == zv, fam
        assert got[(fam, a, name)] == av, fam
    docs = {m.name: m.documentation for m in reg.collect()}
    assert docs == {
        "tangram_provider_requests": "HTTP requests sent to a provider, by outcome",
        "tangram_provider_throttled": "429s a provider answered",
        "tangram_provider_cache_hits": "Answers served from the cache (no call, no quota)",
        "tangram_provider_cache_misses": "Cache misses",
        "tangram_provider_coalesced": "Calls that joined an identical call in flight",
        "tangram_provider_retries": "5xx/connection errors retried",
        "tangram_provider_latency_seconds_sum": "Provider latency, sum over answered requests",
        "tangram_provider_latency_seconds_count": "Answered requests",
        "tangram_provider_rate": "Requests/s the core allows the provider now (AIMD)",
        "tangram_provider_waiting": "Calls waiting for a token or a slot",
        "tangram_provider_in_flight": "Calls in flight",
    }
    f.st = {"empty": {}}
    assert {s.name: s.value for m in reg.collect() for s in m.samples} == {
        "tangram_provider_requests_total": 0.0,
        "tangram_provider_throttled_total": 0.0,
        "tangram_provider_cache_hits_total": 0.0,
        "tangram_provider_cache_misses_total": 0.0,
        "tangram_provider_coalesced_total": 0.0,
        "tangram_provider_retries_total": 0.0,
        "tangram_provider_latency_seconds_sum_total": 0.0,
        "tangram_provider_latency_seconds_count_total": 0.0,
        "tangram_provider_rate": 0.0,
        "tangram_provider_waiting": 0.0,
        "tangram_provider_in_flight": 0.0,
    }
    assert list(S.ProviderCollector(Engine()).collect()) == []


def test_add_routes_registers_the_collector_when_the_app_has_a_registry() -> None:
    got: list[Any] = []
    app = FastAPI()
    app.state.registry = SimpleNamespace(register=got.append)
    e = Engine()
    S.add_routes(app, SimpleNamespace(engine=e))
    assert len(got) == 1 and isinstance(got[0], S.ProviderCollector) and got[0].engine is e
    paths = {(r.path, tuple(sorted(r.methods))) for r in app.routes if hasattr(r, "methods")}
    assert {("/retrieve", ("POST",)), ("/v1/search", ("POST",)), ("/v1/fetch", ("POST",))} <= paths


def test_edges_of_a_local_search_and_outputs_of_another_type() -> None:
    e = Engine()
    for topk in (1, 100):
        e.run_result = ok("a0", RetrieveResult(model="wiki"))
        r = client(e).post(
            "/v1/search",
            json={"provider": "wiki", "query": "q", "options": {"topk": topk}, "timeout_s": 0.5},
        )
        assert r.status_code == 200 and e.ran[-1].payload == RetrieveRequest(query="q", topk=topk)
        assert e.ran[-1].timeout_s == 0.5
    e.run_result = ok("a1", {"other": 1})
    r = client(e).post("/v1/search", json={"provider": "wiki", "query": "q"})
    assert r.json()["result"] is None and r.json()["local_score"] is None
    f = Front()
    f.answer = ok("a2", {"other": 1})
    r = client(Engine(front=f)).post(
        "/v1/fetch", json={"provider": "serper", "url": "u", "timeout_s": 0.5, "trajectory": "tj"}
    )
    assert r.json()["result"] is None and r.json()["cached"] is False
    assert f.calls[-1] == ("fetch", "serper", {"url": "u"}, "", 0.5, "tj")
