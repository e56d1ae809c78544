"""Service: what every route does, independent of HTTP (the SDK's embedded mode calls it too).

Invariant: a method here either returns the wire body of its route or raises one of
InvalidAction (400, names the field), UnknownAction (404), Overloaded / Shed (504 on /run_code,
503 elsewhere), BrokenError (502: the backend failed on valid input), TooManySessions /
QuotaExceeded (429). Nothing else escapes.

``tenant`` (the name `GuardMiddleware` put in the request's scope; None without auth) scopes
every id: what one tenant created is unknown to another (`api.tenancy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
from collections import OrderedDict
from typing import Any

from ..core.actions import ActionResult, ActionSpec, Status
from ..core.errors import BrokenError, ImageError, InvalidAction, TangramError
from ..core.images import check_name
from ..core.resources import MEMORY_MB, Resources
from ..kinds import CodeRequest, ScoreRequest, ScoreResult, code_timeouts, judge_request
from ..runtime.config import ServiceConfig
from ..runtime.engine import EXPIRED, OPENING, Engine, UnknownAction
from . import translate as T
from .schemas import ActionsIn, ClassifyIn, GetRewardIn, RunCodeRequest, SessionIn
from .tenancy import QuotaExceeded, Tenancy


class Shed(TangramError):
    """The request could not be answered within its deadline and was cancelled."""


class KeyReused(TangramError):
    """An idempotency key came again with another body (422): it would silently answer with the
    first body's actions."""


class TooManySessions(TangramError):
    """The service holds `LimitsConfig.max_sessions` open sessions (429)."""


# the least memory a session's sandbox starts in (its init process; measured: 0.9 MiB opens,
# 0.3 MiB does not)
MIN_SESSION_MB = 1.0


class SessionNotOpened(TangramError):
    """The node could not open a session (503, with the node's reason)."""


class SessionExpired(TangramError):
    """A session's own ``ttl_s`` passed before its node opened it (410: open it again with a
    longer ``ttl_s``)."""


class Service:
    """The routes' logic over one engine."""

    def __init__(self, engine: Engine, config: ServiceConfig) -> None:
        self.engine, self.config = engine, config
        self._groups: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        # a routed search (`search.route_action`): its id -> its answer's route fields, the
        # local index's action when that answered (its result is the search's), and the
        # idempotency key it came with (the same key again: a retry, answered the same)
        self._routes: OrderedDict[str, tuple[dict[str, Any], str | None, str | None]] = OrderedDict()
        # idempotency key -> (digest of the body it came with, when), kept as long as the
        # engine keeps the key (`EngineConfig.idempotency_ttl_s`)
        self._idem_bodies: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.tenancy = Tenancy(engine, config)
        self._dims: frozenset[str] = frozenset()  # the cluster's resources (`_check_dims`)

    # ---- SandboxFusion --------------------------------------------------------------------

    async def run_code(self, req: RunCodeRequest, *, session: str | None = None,
                       tenant: str | None = None) -> dict[str, Any]:
        code = req.request()
        spec = T.run_code_action(code, session=session)
        if tenant is not None:
            self.tenancy.admit(tenant, (spec,))
        self.engine.submit_nowait(spec)
        if tenant is not None:
            self.tenancy.started(tenant, (spec,))
        deadline = code_timeouts(code).within(self.config.limits.shed_grace_s)
        try:
            res = await self.engine.result(spec.id, wait=deadline)
        except asyncio.CancelledError:  # the client went away (`fastpath.until_disconnect`)
            with contextlib.suppress(TangramError):
                await self.engine.cancel(spec.id)
            raise
        if res is None:
            await self.engine.cancel(spec.id)
            raise Shed(f"no answer within compile_timeout + run_timeout + "
                       f"{self.config.limits.shed_grace_s:g} s = {deadline:g} s")
        return T.run_code_response(res)

    # ---- native ---------------------------------------------------------------------------

    def _specs(self, body: ActionsIn, tenant: str | None = None
               ) -> tuple[list[ActionSpec], list[list[ActionSpec]], dict[str, Any]]:
        if len(body.actions) > self.config.limits.max_batch:
            raise InvalidAction("actions", f"at most {self.config.limits.max_batch} per request")
        per_request: list[list[ActionSpec]] = []
        sources: dict[str, Any] = {}  # search id -> its payload.source (absent: auto)
        for i, a in enumerate(body.actions):
            parts = T.native_actions(a, f"actions[{i}]", self.config.default_reward_model)
            if a.kind in ("search", "fetch"):  # a provider call (issue 37: api/search.py)
                from .search import provider_action

                for p in parts:  # (its route's source: `_route`)
                    if isinstance(p.payload, dict) and "source" in p.payload:
                        sources[p.id] = p.payload["source"]
                parts = [provider_action(self.engine, p, f"actions[{i}]", tenant) for p in parts]
            parts = [self._typed(p, f"actions[{i}]") for p in parts]
            for p in parts:
                self._check_dims(p.demand, f"actions[{i}].demand")
                self._check_model(p, f"actions[{i}].model", tenant)
            if tenant is not None:
                parts = [self._own_image(p, f"actions[{i}].payload.image", tenant) for p in parts]
            per_request.append(parts)
        flat = [p for parts in per_request for p in parts]
        if len(flat) > self.config.limits.max_batch:  # (each of several models is one action)
            raise InvalidAction("actions", f"{len(flat)} actions with their models fanned out, "
                                f"at most {self.config.limits.max_batch} per request")
        return flat, per_request, sources

    def _typed(self, spec: ActionSpec, where: str) -> ActionSpec:
        """``spec`` carrying its typed request where its kind has one here: a generative
        judge's (`kinds.judge_request`: InvalidAction naming ``<where>.payload...``)."""
        m = self.config.model(spec.model) if spec.model is not None else None
        if m is None or m.kind != "genjudge":
            return spec
        try:
            return dataclasses.replace(spec, payload=judge_request(spec.payload))
        except InvalidAction as exc:
            raise InvalidAction(f"{where}.{exc.field}", str(exc).split(": ", 1)[1]) from None

    def _own_image(self, spec: ActionSpec, where: str, tenant: str) -> ActionSpec:
        """``spec`` with its ``payload.image`` as the tenant means it (its own, or a shared one):
        a new spec and payload when the stored name differs; the caller's payload is never
        changed."""
        payload = spec.payload
        img = payload.get("image")
        if not isinstance(img, str):
            return spec
        stored = self.tenancy.image_for_use(tenant, img)
        if stored is None:
            raise InvalidAction(where, f"no image {img!r} on any node")
        if stored == img:
            return spec
        if isinstance(payload, CodeRequest):
            return dataclasses.replace(spec, payload=dataclasses.replace(payload, image=stored))
        return dataclasses.replace(spec, payload={**payload, "image": stored})

    def _check_model(self, spec: ActionSpec, where: str, tenant: str | None = None) -> None:
        if spec.model is not None and self.config.model(spec.model) is None:
            names = ", ".join(m.name for m in self.config.models) or "none configured"
            raise InvalidAction(where, f"unknown model {spec.model!r} (models: {names})")
        if spec.session is not None and (not self.engine.has_session(spec.session) or
                                         not self.tenancy.session_visible(tenant, spec.session)):
            mine = self.tenancy.session_visible(tenant, spec.session) or \
                self.tenancy.session_was(tenant, spec.session)
            gone = self.engine.session_gone(spec.session) if mine else None
            raise InvalidAction(where.rsplit(".", 1)[0] + ".session",
                                gone or f"session {spec.session!r} is not open")

    async def submit(self, body: ActionsIn, *, idempotency_key: str | None = None,
                     tenant: str | None = None) -> dict[str, Any]:
        specs, per_request, sources = self._specs(body, tenant)
        key = self.tenancy.idempotency_key(tenant, idempotency_key or body.idempotency_key)
        if key is not None:
            self._check_key(key, body)
        self._check_ids(body, per_request, tenant)
        local = await self._route(per_request, sources, key)
        if local:
            specs = [s for s in specs if s.id not in local]
        if tenant is not None:
            self.tenancy.admit(tenant, specs)
        submitted = self.engine.submit_nowait(specs, idempotency_key=key)
        if tenant is not None:
            self.tenancy.own(tenant, submitted)
            self.tenancy.started(tenant, [s for s, i in zip(specs, submitted, strict=True)
                                          if s.id == i])
        got = iter(submitted)
        ids: list[str] = []
        for parts in per_request:
            if len(parts) == 1 and parts[0].id in local:  # (answered by the local index)
                ids.append(parts[0].id)
                if tenant is not None:
                    self.tenancy.own(tenant, (parts[0].id,))
                continue
            part_ids = tuple(next(got) for _ in parts)
            if len(parts) == 1:
                ids.append(part_ids[0])
                continue
            model = parts[0].model or ""
            gid = part_ids[0][: len(part_ids[0]) - len(model) - 1]  # "<gid>.<model>"
            self._remember_group(gid, part_ids)
            if tenant is not None:
                self.tenancy.own(tenant, (gid,))
            ids.append(gid)
        out: dict[str, Any] = {"ids": ids}
        if body.wait:
            results = await asyncio.gather(*(self.get(i, body.wait_s, tenant=tenant)
                                             for i in ids))
            out["results"] = list(results)
        return out

    async def _route(self, per_request: list[list[ActionSpec]], sources: dict[str, Any],
                     key: str | None) -> set[str]:
        """Searches routed local first (`search.route_action`), each before anything is
        submitted: the ids the local index answered (not submitted to the provider). A search
        id seen before is a retry with the same idempotency key (routed as it was), else a
        duplicate (400, as the engine refuses an id it knows)."""
        local: set[str] = set()
        for i, parts in enumerate(per_request):
            if len(parts) != 1 or parts[0].kind.value != "search":
                if any(p.id in sources for p in parts):
                    raise InvalidAction(f"actions[{i}].payload.source", "only a search has a route")
                continue
            prior = self._routes.get(parts[0].id)
            if prior is not None:
                if key is None or prior[2] != key:
                    raise InvalidAction(f"actions[{i}].id", f"duplicate action id {parts[0].id!r}")
                if prior[1] is not None:
                    local.add(parts[0].id)
                continue
            from .search import route_action

            got, fields = await route_action(self.engine, parts[0], f"actions[{i}]",
                                             sources.get(parts[0].id, "auto"))
            if not fields:
                continue
            self._routes[parts[0].id] = (fields, got.id if got is not None else None, key)
            while len(self._routes) > self.config.limits.max_results:
                self._routes.popitem(last=False)
            if got is not None:
                local.add(parts[0].id)
        return local

    def _check_ids(self, body: ActionsIn, per_request: list[list[ActionSpec]],
                   tenant: str | None) -> None:
        """Group ids are action ids (issue 41, H1): the id a client chose for a fanned-out
        request is refused when it names an action or another tenant's group, and a plain
        action's id when it names a group, as the engine refuses an action id it knows (400
        "duplicate action id", the same words whoever holds it). The same group again from its
        owner (a retry with its idempotency key) is the engine's to answer."""
        for i, (a, parts) in enumerate(zip(body.actions, per_request, strict=True)):
            aid = a.id
            if aid is None:
                continue
            if len(parts) == 1:
                taken = aid in self._groups or (aid in self._routes and self.tenancy.owner(aid) != tenant)
            else:
                owner = self.tenancy.owner(aid)
                taken = (aid in self._groups and owner != tenant) or self._engine_knows(aid) \
                    or (owner is not None and owner != tenant)
            if taken:
                raise InvalidAction(f"actions[{i}].id", f"duplicate action id {aid!r}")

    def _engine_knows(self, action_id: str) -> bool:
        try:
            self.engine.peek(action_id)
        except UnknownAction:
            return False
        return True

    def _check_key(self, key: str, body: ActionsIn) -> None:
        """The same key with the same actions: the same submit again (fine); with other
        actions: `KeyReused` (422). ``wait``/``wait_s`` are not part of what is compared."""
        try:  # (python mode: a NaN stays NaN; JSON mode spelled it null, one body with a null)
            rows = [a.model_dump(mode="python") for a in body.actions]  # pragma: no mutate
            canon = json.dumps(rows, sort_keys=True, separators=(",", ":"),  # pragma: no mutate
                               allow_nan=True)  # pragma: no mutate
        except (RecursionError, TypeError, ValueError):
            canon = repr(body.actions)
        digest = hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.monotonic()
        ttl = float(getattr(self.engine.config, "idempotency_ttl_s", 3600.0))
        while self._idem_bodies:
            _k0, (_, t0) = next(iter(self._idem_bodies.items()))
            if t0 + ttl > now and len(self._idem_bodies) <= 4 * self.config.limits.max_results:
                break
            self._idem_bodies.popitem(last=False)
        seen = self._idem_bodies.get(key)
        if seen is None:
            self._idem_bodies[key] = (digest, now)
        elif seen[0] != digest:
            raise KeyReused(f"idempotency_key: {key!r} was used with another body; a retry must "
                            "send the same actions (use a new key for new actions)")

    def _check_dims(self, demand: Resources, field: str) -> None:
        """Every key of ``demand`` a resource of the cluster's nodes (400 naming it else). The
        dimensions are read from the cluster again only when a key is not among those last
        seen (nodes may join), so a submit pays a set lookup per key."""
        for k in demand:
            if k in self._dims:
                continue
            self._dims = self.engine.cluster_view().dims()
            if k not in self._dims and self._dims:
                raise InvalidAction(f"{field}.{k}", f"unknown resource {k!r} (this cluster's "
                                    f"resources: {', '.join(sorted(self._dims))})")

    def _check_demand(self, demand: Resources, field: str) -> None:
        """A demand of the cluster's dimensions that some node can hold (400 else, as an
        action's would be rejected); no check while the cluster has no node yet."""
        view = self.engine.cluster_view()
        if not view.nodes:
            return
        dims = sorted(view.dims())
        for k in demand:
            if k not in dims:
                raise InvalidAction(f"{field}.{k}", f"unknown resource {k!r} (this cluster's "
                                    f"resources: {', '.join(dims)})")
        nodes = view.nodes
        if not any(all(float(v) <= n.capacity.get(k, 0.0) + 1e-9
                       for k, v in demand.items()) for n in nodes):
            raise InvalidAction(field, f"no node can ever satisfy demand {dict(demand.items())} "
                                "(largest capacity: " + "; ".join(
                                    f"{n.name}: {n.capacity.as_dict()}" for n in nodes[:4])
                                + ")")

    def _remember_group(self, gid: str, parts: tuple[str, ...]) -> None:
        self._groups[gid] = parts
        while len(self._groups) > self.config.limits.max_results:
            self._groups.popitem(last=False)

    async def result(self, action_id: str, wait: float = 0.0) -> ActionResult | None:
        routed = self._routes.get(action_id)
        if routed is not None and routed[1] is not None:  # (the local index's answer)
            r = await self.engine.result(routed[1], wait=wait)
            return None if r is None else dataclasses.replace(r, id=action_id)
        parts = self._groups.get(action_id)
        if parts is None:
            return await self.engine.result(action_id, wait=wait)
        got = await asyncio.gather(*(self.engine.result(p, wait=wait) for p in parts))
        if any(g is None for g in got):
            return None
        return T.join_group(action_id, [g for g in got if g is not None])

    async def get(self, action_id: str, wait: float = 0.0, *,
                  tenant: str | None = None) -> dict[str, Any]:
        self.tenancy.check_action(tenant, action_id)
        wait = min(max(wait, 0.0), self.config.limits.max_wait_s)
        res = await self.result(action_id, wait)
        routed = self._routes.get(action_id)
        if res is not None:
            return {**T.result_dict(res), **routed[0]} if routed is not None else T.result_dict(res)
        parts = self._groups.get(action_id, (action_id,))
        return T.pending_dict(action_id, min(self.engine.status(p) for p in parts))

    async def cancel(self, action_id: str, *, tenant: str | None = None) -> bool:
        self.tenancy.check_action(tenant, action_id)
        parts = self._groups.get(action_id, (action_id,))
        done = [await self.engine.cancel(p) for p in parts]
        return any(done)

    async def open_session(self, body: SessionIn, *, tenant: str | None = None) -> dict[str, Any]:
        try:
            demand = Resources(body.demand) if body.demand is not None else None
        except ValueError as exc:
            raise InvalidAction("demand", str(exc)) from None
        cap = self.config.limits.max_sessions
        n = self.engine.session_count()
        if n >= cap:
            raise TooManySessions(f"{cap} sessions are open (limits.max_sessions); close one "
                                  "(DELETE /v1/sessions/{id}) or retry later")
        if tenant is not None:
            self.tenancy.admit_session(tenant)
            kept = self.tenancy.reserved_sessions(tenant)
            if n + kept >= cap:
                raise TooManySessions(f"{n} sessions are open and {kept} places are kept for "
                                      "tenants below their max_sessions (limits.max_sessions="
                                      f"{cap}); close one (DELETE /v1/sessions/{{id}}) or "
                                      "retry later")
        if demand is not None:
            self._check_demand(demand, "demand")
            mem = demand.get(MEMORY_MB, 1.0)
            if mem < MIN_SESSION_MB:  # (its sandbox's init cannot start in less: 503 before)
                raise InvalidAction("demand.memory_mb", f"a session's sandbox needs at least "
                                    f"{MIN_SESSION_MB:g} MiB, got {mem:g}")
        if body.image is not None:
            try:
                check_name(body.image)
                image = self.tenancy.image_for_use(tenant, body.image)
                has = self.engine.has_image(image) if image is not None else False
            except ImageError as exc:
                raise InvalidAction("image", str(exc)) from None
            if has is False:
                raise InvalidAction("image", f"no image {body.image!r} on any node "
                                    "(POST /v1/images imports one)")
        else:
            image = None
        sid = await self.engine.open_session(body.session_id, demand=demand, ttl_s=body.ttl_s,
                                             node=body.node, image=image,
                                             layer_mb=body.layer_mb, owner=tenant)
        if tenant is not None:
            self.tenancy.own_session(tenant, sid)
        # (a session that fails is gone from the engine and its tenant's count)
        why = await self.engine.wait_open(sid, self.config.limits.session_open_wait_s)
        if why is OPENING:
            return {"session_id": sid, "state": "opening"}
        if why is EXPIRED:
            raise SessionExpired(f"ttl_s: session {sid!r} expired before its node opened it "
                                 f"(ttl_s={body.ttl_s:g} s, counted from the request, is "
                                 "shorter than its open took); its state is gone: open it "
                                 "again with a longer ttl_s")
        if why is not None:
            raise SessionNotOpened(why)
        return {"session_id": sid, "state": "open"}

    async def close_session(self, session_id: str, *, tenant: str | None = None) -> bool:
        if not self.tenancy.session_visible(tenant, session_id):
            return False
        return await self.engine.close_session(session_id)

    # ---- reward compat --------------------------------------------------------------------

    def _models(self, model: str | list[str] | None, field: str) -> list[str]:
        names = [model] if isinstance(model, str) else list(model or [])
        if not names and self.config.default_reward_model:
            names = [self.config.default_reward_model]
        if not names:
            raise InvalidAction(field, "no model named and no default reward model configured")
        for n in names:
            if self.config.model(n) is None:
                known = ", ".join(m.name for m in self.config.models) or "none configured"
                raise InvalidAction(field, f"unknown model {n!r} (models: {known})")
        return names

    async def score(self, requests: list[ScoreRequest], models: list[str], *,
                    tenant: str | None = None, field: str = "query") -> list[list[Any]]:
        """Score each request with each model; outputs per request, in model order. At most
        `LimitsConfig.max_batch` actions in all (400 naming ``field`` else), as a submit."""
        n, cap = len(requests) * len(models), self.config.limits.max_batch
        if n > cap:
            raise InvalidAction(field, f"{len(requests)} items x {len(models)} models = {n} "
                                f"actions, at most {cap} per request (limits.max_batch)")
        groups = T.reward_actions(requests, models)
        flat = [s for g in groups for s in g]
        if tenant is not None:
            self.tenancy.admit(tenant, flat)
        self.engine.submit_nowait(flat)
        if tenant is not None:
            self.tenancy.started(tenant, flat)
        results = await asyncio.gather(*(self.engine.result(s.id) for s in flat))
        bad = [r for r in results if r is None or r.status != Status.SUCCEEDED]
        if bad:
            r = bad[0]
            raise BrokenError(f"scoring failed: {r.status.name.lower() if r else 'lost'}: "
                              f"{r.reason if r else ''}")
        it = iter(results)
        return [[next(it).output for _ in g] for g in groups]  # type: ignore[union-attr]

    async def get_reward(self, body: GetRewardIn, *, tenant: str | None = None) -> dict[str, Any]:
        models = self._models(body.model, "model")
        n = len(body.query)
        for name in ("prompts", "labels"):
            v = getattr(body, name)
            if v is not None and len(v) != n:
                raise InvalidAction(name, f"has {len(v)} items; query has {n}")
        for m in models:
            spec = self.config.model(m)
            if spec is not None and spec.kind == "similarity" and body.labels is None:
                raise InvalidAction("labels", f"model {m!r} scores similarity to a reference: "
                                              "send one label per query")
        requests = [ScoreRequest(query=q, prompt=None if body.prompts is None else body.prompts[i],
                                 reference=None if body.labels is None else body.labels[i])
                    for i, q in enumerate(body.query)]
        outs = await self.score(requests, models, tenant=tenant)
        per_model = [[T.score_of(o) for o in row] for row in outs]
        rewards = [sum(row) / len(row) for row in per_model]
        body_out: dict[str, Any] = {"rewards": rewards, "scores": rewards}
        if len(models) > 1:
            body_out["scores_by_model"] = {m: [row[j] for row in per_model]
                                           for j, m in enumerate(models)}
        return body_out

    async def classify(self, body: ClassifyIn, *, tenant: str | None = None) -> dict[str, Any]:
        (model,) = self._models(body.model, "model")
        spec = self.config.model(model)
        if spec is not None and spec.kind == "similarity":
            raise InvalidAction("model", f"{model!r} is a similarity model; /classify needs a "
                                         "classifier (scalar) or judge model")
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        if not inputs:
            raise InvalidAction("input", "must not be empty")
        outs = await self.score([ScoreRequest(query=t) for t in inputs], [model], tenant=tenant,
                                field="input")
        data = []
        for i, (o,) in enumerate(outs):
            probs = list(o.probs) if isinstance(o, ScoreResult) and o.probs else [T.score_of(o)]
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": str(best), "probs": probs,
                         "num_classes": len(probs)})
        return {"id": f"classify-{T.new_id()}", "object": "list", "created": int(time.time()),
                "model": model, "data": data,
                "usage": {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0}}


__all__ = ["KeyReused", "QuotaExceeded", "Service", "Shed", "TooManySessions", "UnknownAction"]
