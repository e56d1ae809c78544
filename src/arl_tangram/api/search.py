"""Search routes (issue 37): ``POST /retrieve`` in Search-R1's retriever format over the local
indexes (`tangram index build`), and ``POST /v1/search`` / ``POST /v1/fetch`` through a configured
provider (the SDK's `Client.search` / `Client.fetch`); a ``/v1/search`` naming a local index (and
no provider of that name) is answered by that index's retriever. Installed by `app.create_app` (`add_routes`).

``/retrieve`` is Search-R1's ``retrieval_server.py`` contract, which verl's search tool calls:

    {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id": ..., "contents": "Title\\ntext"}, "score": 0.71}, ...], ...]}

and without ``return_scores`` each inner item is the document itself. ``topk`` absent, null or 0:
3 (Search-R1's default: its server reads ``if not request.topk``). An extra optional ``"index": NAME`` picks among several indexes (else
the only one, or the first by name). Each query is one ``retrieve`` action of the index's model,
all submitted together: the core batches them (and other clients' queries) per model and the
GPU manager runs the batch; the index loads, parks and swaps like a reward model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict

from ..core.actions import ActionKind, ActionResult, ActionSpec, Status
from ..core.errors import InvalidAction
from ..core.resources import Resources
from ..kinds import DEFAULT_TOPK, ProviderResult, RetrieveRequest, RetrieveResult, provider_request
from ..managers.api.manager import RequestError
from ..managers.retrieval.index import MAX_TOPK
from .middleware import TENANT_KEY

if TYPE_CHECKING:
    from ..runtime.providers import Routed

MAX_QUERIES = 1024  # queries in one /retrieve
MAX_QUERY_CHARS = 4096  # characters of one query


def search_body(a: Routed) -> dict[str, Any]:
    """The ``/v1/search`` (``Client.search``) body of a routed search
    (`runtime.providers.ProviderFront.search`)."""
    r, out = a.result, a.result.output
    result = out.result if isinstance(out, ProviderResult) else \
        [h.to_dict() for h in out.hits] if isinstance(out, RetrieveResult) else None
    return {"id": r.id, "status": r.status.name.lower(), "provider": a.provider,
            "result": result, "cached": isinstance(out, ProviderResult) and out.cached,
            "reason": r.reason, "act_s": r.act, "route": a.route, "route_reason": a.route_reason,
            "local_score": a.local_score}


class RetrieveIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False
    index: str | None = None


class ProviderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str
    query: str | None = None
    url: str | None = None
    options: dict[str, Any] | None = None
    timeout_s: float = 60.0
    trajectory: str | None = None
    source: str = "auto"  # search: auto (local_first, then the provider) | local | web
    step: Any = None  # the RL step whose budget the call is charged to (budget_per_step)


def _tenant(request: Request) -> str:
    t = request.scope.get(TENANT_KEY)
    return t if isinstance(t, str) else ""


def retrievers(engine: Any) -> list[str]:
    """The models that are local indexes, by name."""
    return sorted(m.name for m in engine.config.models if m.options.get("index"))


def check_retrieve(body: RetrieveIn, served: list[str]) -> tuple[str, int]:
    """(index, topk) of a valid request; InvalidAction naming the field else."""
    if not body.queries:
        raise InvalidAction("queries", "must list at least one query")
    if len(body.queries) > MAX_QUERIES:
        raise InvalidAction("queries", f"at most {MAX_QUERIES} per request, got {len(body.queries)}")
    for i, q in enumerate(body.queries):
        if len(q) > MAX_QUERY_CHARS:
            raise InvalidAction(f"queries[{i}]", f"must be at most {MAX_QUERY_CHARS} characters, got {len(q)}")
        if not q.strip():
            raise InvalidAction(f"queries[{i}]", "must not be empty")
    topk = body.topk or DEFAULT_TOPK  # (0 too, as Search-R1's server: `if not request.topk`)
    if not 1 <= topk <= MAX_TOPK:
        raise InvalidAction("topk", f"must be in [1, {MAX_TOPK}], got {topk}")
    if not served:
        raise InvalidAction("index", "no local index is served (build one: tangram index build "
                                     "CORPUS.jsonl --name NAME)")
    name = body.index if body.index is not None else served[0]
    if name not in served:
        raise InvalidAction("index", f"unknown index {name!r} (indexes: {', '.join(served)})")
    return name, topk


class ProviderCollector:
    """/metrics per provider (no key ever): calls by outcome, 429s, cache hits and misses,
    coalesced calls, latency, the rate the core uses now, calls waiting and in flight."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        front = self.engine.api
        if front is None:
            return
        st = front.stats()
        calls = CounterMetricFamily("tangram_provider_requests", "HTTP requests sent to a provider, "
                                    "by outcome", labels=["provider", "outcome"])
        simple = {
            "throttled": CounterMetricFamily("tangram_provider_throttled", "429s a provider answered",
                                             labels=["provider"]),
            "cache_hits": CounterMetricFamily("tangram_provider_cache_hits", "Answers served from the "
                                              "cache (no call, no quota)", labels=["provider"]),
            "cache_misses": CounterMetricFamily("tangram_provider_cache_misses", "Cache misses",
                                                labels=["provider"]),
            "coalesced": CounterMetricFamily("tangram_provider_coalesced", "Calls that joined an "
                                             "identical call in flight", labels=["provider"]),
            "retries": CounterMetricFamily("tangram_provider_retries", "5xx/connection errors "
                                           "retried", labels=["provider"]),
        }
        lat_sum = CounterMetricFamily("tangram_provider_latency_seconds_sum", "Provider latency, "
                                      "sum over answered requests", labels=["provider"])
        lat_n = CounterMetricFamily("tangram_provider_latency_seconds_count", "Answered requests",
                                    labels=["provider"])
        rate = GaugeMetricFamily("tangram_provider_rate", "Requests/s the core allows the provider "
                                 "now (AIMD)", labels=["provider"])
        waiting = GaugeMetricFamily("tangram_provider_waiting", "Calls waiting for a token or a "
                                    "slot", labels=["provider"])
        inflight = GaugeMetricFamily("tangram_provider_in_flight", "Calls in flight",
                                     labels=["provider"])
        for name, s in sorted(st.items()):
            calls.add_metric([name, "ok"], s.get("ok", 0))
            for kind, n in sorted((s.get("errors") or {}).items()):
                calls.add_metric([name, kind], n)
            calls.add_metric([name, "throttled"], s.get("throttled", 0))
            for key, fam in simple.items():
                fam.add_metric([name], s.get(key, 0) or 0)
            lat_sum.add_metric([name], s.get("latency_sum_s", 0.0))
            lat_n.add_metric([name], s.get("latency_count", 0))
            rate.add_metric([name], s.get("rate", 0.0) or 0.0)
            waiting.add_metric([name], s.get("waiting", 0) or 0)
            inflight.add_metric([name], s.get("in_flight", 0) or 0)
        yield calls
        yield from simple.values()
        yield from (lat_sum, lat_n, rate, waiting, inflight)


def provider_action(engine: Any, spec: ActionSpec, where: str, tenant: str | None) -> ActionSpec:
    """A ``search`` / ``fetch`` action of ``POST /v1/actions`` as the core takes it: the
    provider from ``payload.provider`` (or ``tag``), the request normalized and keyed, the cache's
    answer attached on a hit. InvalidAction naming the field else."""
    front = engine.api
    payload = dict(spec.payload)
    payload.pop("source", None)  # (the route: `Service.route`, which reads it first)
    provider = payload.pop("provider", None) or spec.tag
    if not isinstance(provider, str) or not provider:
        raise InvalidAction(f"{where}.payload.provider", "names the provider (search and fetch actions)")
    if front is None:
        raise InvalidAction(f"{where}.payload.provider",
                            f"unknown provider {provider!r} (providers: none declared)")
    try:
        got = front.spec(spec.kind.value, provider, payload, tenant=tenant or "",
                         timeout_s=spec.timeout_s, weight=spec.weight, trajectory=spec.trajectory,
                         action_id=spec.id)
    except RequestError as exc:
        field = "provider" if exc.field == "provider" else exc.field
        raise InvalidAction(f"{where}.payload.{field}", str(exc).split(": ", 1)[-1]) from None
    out: ActionSpec = front.cached(got)
    return out


async def route_action(engine: Any, spec: ActionSpec, where: str, source: Any = "auto",
                       ) -> tuple[ActionResult | None, dict[str, Any]]:
    """A ``search`` action of ``POST /v1/actions`` routed as ``/v1/search`` routes it (its
    provider's ``local_first`` index first, ``payload.source`` auto | local | web): (the local
    index's result when it answers, else None: the provider action goes as submitted) and the
    answer's ``route``, ``route_reason`` and ``local_score``. InvalidAction naming the field."""
    front = engine.api
    if front is None or spec.kind is not ActionKind.SEARCH:
        if source != "auto":
            raise InvalidAction(f"{where}.payload.source", "only a search of a declared provider "
                                "has a route")
        return None, {}
    query = provider_request(spec.payload).request.get("query", "")
    try:
        local, route, why, score = await front.local_step(
            spec.tag or "", query, source if isinstance(source, str) else repr(source),
            timeout_s=spec.timeout_s, trajectory=spec.trajectory)
    except RequestError as exc:
        raise InvalidAction(f"{where}.payload.{exc.field}", str(exc).split(": ", 1)[-1]) from None
    fields = {"route": route, "route_reason": why, "local_score": score}
    return (local if route == "local" else None), fields


def add_routes(app: FastAPI, svc: Any) -> None:
    engine = svc.engine
    registry = getattr(app.state, "registry", None)
    if registry is not None:
        registry.register(ProviderCollector(engine))

    @app.post("/retrieve", tags=["search"])
    async def retrieve(body: RetrieveIn) -> Response:
        name, topk = check_retrieve(body, retrievers(engine))
        specs = [ActionSpec(engine.new_id(), kind=ActionKind.RETRIEVE, model=name, tag=name,
                            demand=Resources(), payload=RetrieveRequest(query=q, topk=topk),
                            timeout_s=60.0) for q in body.queries]
        ids = engine.submit_nowait(specs)
        results = await asyncio.gather(*(engine.result(i) for i in ids))
        out: list[list[Any]] = []
        for r in results:
            if r is None or r.status is not Status.SUCCEEDED:
                why = "no result" if r is None else f"{r.status.name.lower()}: {r.reason}"
                return JSONResponse({"error": f"index {name!r}: {why}", "field": "index"}, 502)
            hits = r.output.hits if isinstance(r.output, RetrieveResult) else ()
            out.append([h.to_dict() for h in hits] if body.return_scores
                       else [h.document for h in hits])
        return JSONResponse({"result": out})

    async def local_search(body: ProviderIn) -> Response:
        """``/v1/search`` naming a local index: the retriever answers (no provider, no quota)."""
        q = body.query
        if not isinstance(q, str) or not q.strip():
            raise InvalidAction("query", "must be a non-empty string")
        if len(q) > MAX_QUERY_CHARS:
            raise InvalidAction("query", f"must be at most {MAX_QUERY_CHARS} characters, got {len(q)}")
        topk = (body.options or {}).get("topk", DEFAULT_TOPK)
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
            raise InvalidAction("options.topk", f"must be an integer in [1, {MAX_TOPK}], got {topk!r}")
        spec = ActionSpec(engine.new_id(), kind=ActionKind.RETRIEVE, model=body.provider,
                          tag=body.provider, demand=Resources(), trajectory=body.trajectory,
                          payload=RetrieveRequest(query=q, topk=topk), timeout_s=body.timeout_s)
        r = await engine.run(spec)
        out = r.output if isinstance(r.output, RetrieveResult) else None
        return JSONResponse({"id": r.id, "status": r.status.name.lower(), "provider": body.provider,
                             "result": None if out is None else [h.to_dict() for h in out.hits],
                             "cached": False, "reason": r.reason, "act_s": r.act,
                             "route": "local", "route_reason": "names a local index",
                             "local_score": None if out is None else out.top_score})

    async def provider_call(kind: str, body: ProviderIn, request: Request) -> Response:
        front = engine.api
        if kind == "search" and body.provider in retrievers(engine) and (
                front is None or body.provider not in front.api.providers):
            if not 0 < body.timeout_s <= 600:
                raise InvalidAction("timeout_s", f"must be in (0, 600], got {body.timeout_s}")
            if body.source not in ("auto", "local"):
                raise InvalidAction("source", f"{body.provider!r} is a local index: source must be "
                                              f"auto or local, got {body.source!r}")
            return await local_search(body)
        if front is None:
            raise InvalidAction("provider", f"unknown provider {body.provider!r} (providers: none declared)")
        req: dict[str, Any] = {"query": body.query} if kind == "search" else {"url": body.url}
        if body.options is not None:
            req["options"] = body.options
        if body.step is not None:
            req["step"] = body.step
        if not 0 < body.timeout_s <= 600:
            raise InvalidAction("timeout_s", f"must be in (0, 600], got {body.timeout_s}")
        try:
            if kind == "search":  # (routed: the provider's local_first index first)
                return JSONResponse(search_body(await front.search(
                    body.provider, req, source=body.source, tenant=_tenant(request),
                    timeout_s=body.timeout_s, trajectory=body.trajectory)))
            r = await front.call(kind, body.provider, req, tenant=_tenant(request),
                                 timeout_s=body.timeout_s, trajectory=body.trajectory)
        except RequestError as exc:
            raise InvalidAction(exc.field, str(exc).split(": ", 1)[-1]) from None
        out = r.output if isinstance(r.output, ProviderResult) else None
        return JSONResponse({"id": r.id, "status": r.status.name.lower(), "provider": body.provider,
                             "result": None if out is None else out.result,
                             "cached": out is not None and out.cached,
                             "reason": r.reason, "act_s": r.act})

    @app.post("/v1/search", tags=["search"])
    async def search(body: ProviderIn, request: Request) -> Response:
        return await provider_call("search", body, request)

    @app.post("/v1/fetch", tags=["search"])
    async def fetch(body: ProviderIn, request: Request) -> Response:
        return await provider_call("fetch", body, request)
