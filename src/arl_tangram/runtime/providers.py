"""Provider calls through the engine (issue 37): the API manager attached to an engine, and the
front door every search/fetch request goes through (`ProviderFront.call`):

    request -> normalized, keyed (tenant unless the provider's cache is shared)
            -> one action (kind search/fetch/http, tag = provider, payload.coalesce = key)
            -> cache hit?  payload.cached = the answer: the core answers it at arrival, no
               token, no slot, no call (counted as a hit by both)
               -> core: joins an identical call in flight, or waits for a token and a slot
               -> CallProvider -> ApiManager (HTTP) -> ActionFinished / ProviderThrottled
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.actions import ActionKind, ActionResult, ActionSpec
from ..core.resources import Resources
from ..managers.api import ApiManager, ProviderConfig
from .engine import Engine

_KIND = {"search": ActionKind.SEARCH, "fetch": ActionKind.FETCH, "http": ActionKind.HTTP}


def scheduler_providers(configs: Sequence[ProviderConfig]) -> dict[str, Any]:
    """The `CoreConfig` fields (``EngineConfig.scheduler``) that declare these providers."""
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
        spec = ActionSpec(action_id or uuid.uuid4().hex, kind=_KIND[kind], tag=provider,
                          demand=Resources(), timeout_s=timeout_s, weight=weight,
                          trajectory=trajectory, payload=payload)
        return spec, key

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
        return dataclasses.replace(spec, payload={**spec.payload, "cached": hit})

    async def aclose(self) -> None:
        """Calls in flight cancelled (each reported), connection pools closed."""
        await self.api.aclose()

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per provider: the core's view (rate now, tokens, waiting, coalesced, budget) and
        the manager's (calls, errors, latency, cache hits). No key appears."""
        core = getattr(self.engine.core, "providers", None)
        sched = core.stats() if core is not None and hasattr(core, "stats") else {}
        out: dict[str, dict[str, Any]] = {}
        for name, s in self.api.stats_view().items():
            out[name] = {**s, **sched.get(name, {})}
        return out
