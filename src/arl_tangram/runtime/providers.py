"""Provider calls through the engine (issue 37): the API manager attached to an engine, and the
front door every search/fetch request goes through (`ProviderFront.call`):

    request -> normalized, keyed (tenant unless the provider's cache is shared)
            -> one action (kind search/fetch/http, tag = provider, payload.coalesce = key)
            -> cache hit?  payload.cached = the answer: the core answers it at arrival, no
               token, no slot, no call (counted as a hit by both)
               -> core: joins an identical call in flight, or waits for a token and a slot
               -> CallProvider -> ApiManager (HTTP) -> ActionFinished / ProviderThrottled

A search provider with ``local_first`` (`ProviderFront.search`) asks its local index first (a
``retrieve`` action of the index's model) and calls the provider only when the caller asks for
the web (``source: web``), the index's top score is below ``min_score``, or the index fails;
the answer says which route it took and why (``route``, ``route_reason``, ``local_score``).
A request's ``step`` (an RL step) rides the action as ``payload["step"]``: the core charges it
to that step's budget (`core/providers.py`, ``budget_per_step``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.actions import ActionKind, ActionResult, ActionSpec, Status
from ..core.protocol import Inspectable
from ..core.resources import Resources
from ..kinds import RetrieveRequest, RetrieveResult, provider_request
from ..managers.api import ApiManager, ProviderConfig, RequestError, normalize
from .engine import Engine

_KIND = {"search": ActionKind.SEARCH, "fetch": ActionKind.FETCH, "http": ActionKind.HTTP}
SOURCES = ("auto", "local", "web")  # a search's ``source``: the route it may take


def check_step(step: Any) -> int | None:
    """A request's RL ``step`` (None: not given). Raises `RequestError` naming the field."""
    if step is None:
        return None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise RequestError("step", f"must be an integer >= 0, got {step!r}")
    return step


@dataclass(frozen=True, slots=True)
class Routed:
    """A routed search's outcome (`ProviderFront.search`): the action that answered, the
    provider (or index) it names, the route taken and why, the index's top score (None: the
    index was not asked or found nothing). Rendered as the ``/v1/search`` body in `api/`
    (`api.search.search_body`)."""

    result: ActionResult
    provider: str
    route: str  # "local" or "web"
    route_reason: str
    local_score: float | None


def scheduler_providers(configs: Sequence[ProviderConfig]) -> dict[str, Any]:
    """The `CoreConfig` fields that declare these providers."""
    return {"providers": tuple(c.limits for c in configs)} if configs else {}


def attach_api(engine: Engine, configs: Sequence[ProviderConfig], **kw: Any) -> ApiManager:
    """An API manager that executes ``engine``'s provider calls and reports to it (on the
    engine's clock: deadlines are the core's times)."""
    api = ApiManager(configs, clock=engine.clock.now, **kw)
    api.emit = engine._emit  # (the executors' callback: stamps and queues an event)
    engine.provider_calls = api.call
    return api


class ProviderFront:
    """The front door of provider calls: cache, then one action through the core."""

    def __init__(self, engine: Engine, api: ApiManager) -> None:
        self.engine = engine
        self.api = api

    def spec(self, kind: str, provider: str, request: Mapping[str, Any], *, tenant: str = "",
             timeout_s: float = 60.0, weight: float = 1.0, trajectory: str | None = None,
             action_id: str | None = None) -> tuple[ActionSpec, str]:
        """The action of one call and its key. Raises `RequestError` naming the field."""
        payload, key = self.api.prepare(kind, provider, request, tenant)
        step = check_step(request.get("step"))
        if step is not None:
            payload = dataclasses.replace(payload, step=step)
        spec = ActionSpec(action_id or uuid.uuid4().hex, kind=_KIND[kind], tag=provider,
                          demand=Resources(), timeout_s=timeout_s, weight=weight,
                          trajectory=trajectory, payload=payload)
        return spec, key

    def served(self) -> list[str]:
        """The local indexes the engine serves (retriever models), by name."""
        return sorted(m.name for m in self.engine.config.models if m.options.get("index"))

    async def search(self, provider: str, request: Mapping[str, Any], *, source: str = "auto",
                     tenant: str = "", timeout_s: float = 60.0, trajectory: str | None = None,
                     ) -> Routed:
        """One search, routed: the provider's ``local_first`` index first (``source``
        "auto"), then the provider when the index's top score is below ``min_score`` or the
        index fails; ``source`` "local" takes the index's answer whatever its score, "web"
        calls the provider at once. Raises `RequestError` naming the field."""
        if source not in SOURCES:
            raise RequestError("source", f"must be one of {', '.join(SOURCES)}, got {source!r}")
        query = normalize("search", request)["query"] if source != "web" else ""
        check_step(request.get("step"))
        local, route, why, local_score = await self.local_step(
            provider, query, source, timeout_s=timeout_s, trajectory=trajectory)
        if local is not None and route == "local":
            index = self.api.providers[provider].local_first
            return Routed(local, index.index if index is not None else provider, route, why,
                          local_score)
        r = await self.call("search", provider, request, tenant=tenant, timeout_s=timeout_s,
                            trajectory=trajectory)
        return Routed(r, provider, "web", why, local_score)

    async def local_step(self, provider: str, query: str, source: str, *,
                         timeout_s: float = 60.0, trajectory: str | None = None,
                         action_id: str | None = None,
                         ) -> tuple[ActionResult | None, str, str, float | None]:
        """A search's route (`search`; ``POST /v1/actions`` kind search too): (the index's
        result or None when it was not asked, route "local" or "web", route_reason,
        local_score). The index's ``retrieve`` action takes ``action_id`` when given. Raises
        `RequestError` naming ``source`` when the route it asks for cannot be taken."""
        if source not in SOURCES:
            raise RequestError("source", f"must be one of {', '.join(SOURCES)}, got {source!r}")
        cfg = self.api.providers.get(provider)
        lf = cfg.local_first if cfg is not None else None
        if lf is None or source == "web":
            if source == "local":
                raise RequestError("source", f"provider {provider!r} has no local_first index")
            return None, "web", ("source: web" if lf is not None else "no local_first index"), None
        if lf.index not in self.served():
            if source == "local":
                raise RequestError("source", f"local index {lf.index!r} is not served")
            return None, "web", f"local index {lf.index!r} is not served", None
        r = await self.engine.run(ActionSpec(
            action_id or uuid.uuid4().hex, kind=ActionKind.RETRIEVE, model=lf.index, tag=lf.index,
            demand=Resources(), trajectory=trajectory, timeout_s=timeout_s,
            payload=RetrieveRequest(query=query, topk=lf.topk)))
        local_score = r.output.top_score if isinstance(r.output, RetrieveResult) else None
        if source == "local":
            return r, "local", "source: local", local_score
        if r.status is not Status.SUCCEEDED or local_score is None:
            why = (f"local index {lf.index!r} {r.status.name.lower()}: {r.reason}"
                   if r.status is not Status.SUCCEEDED else f"local index {lf.index!r}: no documents")
            return r, "web", why, local_score
        if lf.min_score is None:
            return r, "local", "local index answered (no min_score)", local_score
        if local_score >= lf.min_score:
            return (r, "local", f"local top score {local_score:.4f} >= min_score {lf.min_score:g}",
                    local_score)
        return r, "web", f"local top score {local_score:.4f} < min_score {lf.min_score:g}", local_score

    async def call(self, kind: str, provider: str, request: Mapping[str, Any], *,
                   tenant: str = "", timeout_s: float = 60.0, weight: float = 1.0,
                   trajectory: str | None = None) -> ActionResult:
        """One call, answered: from the cache (``output["cached"]`` true), or through the
        core and the provider."""
        spec = self.cached(self.spec(kind, provider, request, tenant=tenant, timeout_s=timeout_s,
                                     weight=weight, trajectory=trajectory))
        return await self.engine.run(spec)

    def cached(self, got: tuple[ActionSpec, str]) -> ActionSpec:
        """The action, with the cache's answer in ``payload["cached"]`` on a hit: the core
        then answers it at arrival, with no token, slot or call (and counts it)."""
        spec, key = got
        hit = self.api.lookup(spec.tag or "", key)
        if hit is None:
            return spec
        return dataclasses.replace(
            spec, payload=dataclasses.replace(provider_request(spec.payload), cached=hit))

    async def aclose(self) -> None:
        """Calls in flight cancelled (each reported), connection pools closed."""
        await self.api.aclose()

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per provider: the core's view (rate now, tokens, waiting, coalesced, budget) and
        the manager's (calls, errors, latency, cache hits). No key appears."""
        core = self.engine.core
        sched: dict[str, dict[str, Any]] = core.provider_stats() if isinstance(core, Inspectable) else {}
        out: dict[str, dict[str, Any]] = {}
        for name, s in self.api.stats_view().items():
            out[name] = {**s, **sched.get(name, {})}
        return out
