"""Tenants (issue 25): who owns which action, session and image, and each tenant's quotas.

A tenant is a named API token (`runtime.config.TenantConfig`; the single ``auth.token`` is the
tenant ``default``); `GuardMiddleware` puts the name of the request's tenant in the ASGI scope and
`Service` passes it here. ``tenant=None`` (no token configured: loopback) sees everything, as
before tenants existed.

Invariants:
- an action or session is visible (result, cancel, close, use) only to the tenant that created it;
  to any other it is unknown: the same answer (404, or "not open") as an id never used;
- a tenant's images imported over HTTP live in its own namespace: stored as ``<tenant>+<name>``
  on the nodes (so the ownership survives a restart of the service), shown and used by the tenant
  as ``<name>``; images without a tenant's prefix (the config's ``images:``, `tangram image
  import`, the ``default`` tenant's imports) are shared: every tenant sees and uses them, only
  ``default`` (or no auth) removes them;
- a submit or session open beyond one of the tenant's quotas raises `QuotaExceeded` (429) and
  changes nothing.

Ids a client chooses (an action's ``id``, a ``session_id``) are one namespace: one taken by
another tenant is refused as taken; ids the service generates are random (128 bits).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from ..core.actions import ActionSpec
from ..core.errors import ImageError, TangramError
from ..core.images import warm_key
from ..runtime.config import DEFAULT_TENANT, ServiceConfig, TenantConfig
from ..runtime.engine import Engine, Overloaded, UnknownAction
from ..runtime.views import ClusterView, NodeRow

log = logging.getLogger(__name__)

IMAGE_SEP = "+"  # <tenant>+<image name>: a tenant's own image on the nodes


class QuotaExceeded(TangramError):
    """A tenant's request would exceed one of its quotas (429)."""


class Tenancy:
    """Ownership and quotas over one engine (see the module invariants)."""

    def __init__(self, engine: Engine, config: ServiceConfig) -> None:
        self.engine = engine
        self.tenants: dict[str, TenantConfig] = {t.name: t for t in config.all_tenants()}
        # the prefixes that mark a tenant's own image (every tenant but `default`)
        self._prefixes = tuple(f"{n}{IMAGE_SEP}" for n in self.tenants if n != DEFAULT_TENANT)
        # action id (and group id) -> tenant, as long as the engine can still know the id
        self._actions: OrderedDict[str, str] = OrderedDict()
        self._bound = config.limits.max_pending + config.limits.max_results
        # tenant -> its unfinished actions (id -> CPUs demanded); only for tenants with a cap
        self._live: dict[str, dict[str, float]] = {}
        self._sessions: dict[str, str] = {}  # session id -> tenant
        self._session_sets: dict[str, set[str]] = {}  # tenant -> its session ids
        self._live_owner: dict[str, str] = {}  # unfinished action id -> tenant (in `_live`)
        self._closed: OrderedDict[str, str] = OrderedDict()  # session gone -> its owner
        # what a tenant holds is released as the engine delivers and closes (issue 41), not
        # found by polling: a result frees its action's place, a session gone (closed,
        # expired, evicted, lost with its node) its place in max_sessions
        for name, fn in (("on_delivered", self._delivered), ("on_session_gone", self._gone)):
            hooks = getattr(engine, name, None)
            if isinstance(hooks, list):
                hooks.append(fn)
        # Reservations (issue 41): a tenant's quota is kept for it in the service-wide caps, so
        # that a tenant below its quota is never refused because others filled the service;
        # only while the quotas fit in the cap (else, as before, first come first served)
        lim = config.limits
        qs = [t.max_sessions for t in self.tenants.values() if t.max_sessions is not None]
        qa = [t.max_concurrent_actions for t in self.tenants.values()
              if t.max_concurrent_actions is not None]
        self._reserve_sessions = bool(qs) and sum(qs) <= lim.max_sessions
        self._reserve_actions = bool(qa) and sum(qa) <= lim.max_pending
        self._max_sessions, self._max_pending = lim.max_sessions, lim.max_pending
        for what, q, cap in (("max_sessions", qs, lim.max_sessions),
                             ("max_concurrent_actions", qa, lim.max_pending)):
            if q and sum(q) > cap:
                log.warning("tenants' %s add up to %d, more than the service's %d: no share of "
                            "it is reserved for them", what, sum(q), cap)

    def reserved_sessions(self, tenant: str | None) -> int:
        """Open-session places kept for the other tenants below their max_sessions."""
        if not self._reserve_sessions:
            return 0
        return sum(max(0, t.max_sessions - len(self._session_sets.get(n, ())))
                   for n, t in self.tenants.items()
                   if n != tenant and t.max_sessions is not None)

    def _reserved_actions(self, tenant: str) -> int:
        if not self._reserve_actions:
            return 0
        return sum(max(0, t.max_concurrent_actions - len(self._live.get(n, ())))
                   for n, t in self.tenants.items()
                   if n != tenant and t.max_concurrent_actions is not None)

    def admit_pending(self, tenant: str, n: int) -> None:
        """Overloaded (503; 504 on /run_code) when ``n`` more unfinished actions would reach
        into the places of `limits.max_pending` kept for other tenants below their
        max_concurrent_actions."""
        kept = self._reserved_actions(tenant)
        if not kept:
            return
        live = self.engine.live_count()
        if live + n + kept > self._max_pending:
            self.engine.stats_book.shed += n
            raise Overloaded(f"{live} actions pending and {kept} places kept for tenants below "
                             f"their max_concurrent_actions (max_pending={self._max_pending}); "
                             "retry later")

    def _delivered(self, res: Any) -> None:
        owner = self._live_owner.pop(res.id, None)
        if owner is not None:
            self._live.get(owner, {}).pop(res.id, None)

    def _gone(self, session_id: str, _why: str) -> None:
        owner = self._sessions.pop(session_id, None)
        if owner is not None:
            self._session_sets.get(owner, set()).discard(session_id)
            # its owner (only) is told why it is gone by an action naming it
            self._closed[session_id] = owner
            while len(self._closed) > self._bound:
                self._closed.popitem(last=False)

    # ---- actions ----------------------------------------------------------------------------

    def admit(self, tenant: str | None, specs: Sequence[ActionSpec]) -> None:
        """Raise `QuotaExceeded` when ``specs`` would take ``tenant`` past its action quotas.
        Each spec (just built for this request, not yet submitted) is marked as ``tenant``'s
        (`ActionSpec.tenant`): the core's fair share serves tenants by it (issue 41)."""
        if tenant is not None:
            for s in specs:
                if s.tenant != tenant:
                    object.__setattr__(s, "tenant", tenant)  # (frozen; nobody holds it yet)
        t = self.tenants.get(tenant) if tenant is not None else None
        if t is None:
            return
        self.admit_pending(t.name, len(specs))
        if t.max_concurrent_actions is None and t.cpu_share is None:
            return
        live = self._live.setdefault(t.name, {})
        cpu = sum(_cpu(s) for s in specs)
        why = self._over(t, live, len(specs), cpu)
        if why is not None:
            raise QuotaExceeded(f"tenant {t.name!r}: {why}; retry when some of its actions "
                                "have finished")

    def _over(self, t: TenantConfig, live: dict[str, float], n: int, cpu: float) -> str | None:
        cap = t.max_concurrent_actions
        if cap is not None and len(live) + n > cap:
            return (f"{len(live)} actions unfinished, {n} more would pass its "
                    f"max_concurrent_actions={cap}")
        if t.cpu_share is not None and cpu > 0:
            total = sum(float(n_.capacity.get("cpu", 0.0)) for n_ in self.engine.nodes.values())
            allowed = t.cpu_share * total
            held = sum(live.values())
            if held + cpu > allowed + 1e-9:
                return (f"its unfinished actions demand {held:g} CPUs, {cpu:g} more would pass "
                        f"its cpu_share={t.cpu_share:g} of the cluster's {total:g} "
                        f"({allowed:g} CPUs)")
        return None

    def started(self, tenant: str, specs: Iterable[ActionSpec]) -> None:
        """``specs`` (just submitted) count against ``tenant``'s caps until they are delivered
        (`_delivered`; one delivered already, before this call, is not counted)."""
        live = self._live.get(tenant)
        if live is not None:
            for s in specs:
                try:
                    if self.engine.peek(s.id) is not None:
                        continue  # (answered at once: nothing to hold)
                except UnknownAction:
                    continue
                live[s.id] = _cpu(s)
                self._live_owner[s.id] = tenant

    def own(self, tenant: str | None, ids: Iterable[str]) -> None:
        """``ids`` (just submitted) belong to ``tenant``: no other tenant sees them."""
        if tenant is None:
            return
        acts = self._actions
        for aid in ids:
            acts[aid] = tenant
            acts.move_to_end(aid)
        while len(acts) > self._bound:
            aid, owner = acts.popitem(last=False)
            if self._known(aid):  # still live (long-running): keep it, newest end
                acts[aid] = owner
                break

    def _known(self, aid: str) -> bool:
        try:
            return self.engine.peek(aid) is None  # unfinished
        except UnknownAction:
            return False

    def owner(self, action_id: str) -> str | None:
        """The tenant ``action_id`` (an action's or a group's) belongs to, as far as known."""
        return self._actions.get(action_id)

    def check_action(self, tenant: str | None, action_id: str) -> None:
        """UnknownAction (404) unless ``tenant`` owns ``action_id`` (or there is no auth)."""
        if tenant is not None and self._actions.get(action_id) != tenant:
            raise UnknownAction(action_id)

    def idempotency_key(self, tenant: str | None, key: str | None) -> str | None:
        """Keys are per tenant: the same key from two tenants names two submits."""
        if key is None or tenant is None:
            return key
        return f"{tenant}\x1f{key}"

    # ---- sessions ---------------------------------------------------------------------------

    def admit_session(self, tenant: str | None) -> None:
        t = self.tenants.get(tenant) if tenant is not None else None
        if t is None or t.max_sessions is None:
            return
        mine = self._session_sets.get(t.name, set())
        if len(mine) >= t.max_sessions:
            raise QuotaExceeded(f"tenant {t.name!r}: {len(mine)} sessions open (its "
                                f"max_sessions={t.max_sessions}); close one (DELETE "
                                "/v1/sessions/{id}) or retry later")

    def own_session(self, tenant: str | None, session_id: str) -> None:
        """``session_id`` (just opened) is ``tenant``'s until the engine says it is gone."""
        if tenant is None or not self.engine.has_session(session_id):
            return  # (gone already: `_gone` came first)
        self._sessions[session_id] = tenant
        self._session_sets.setdefault(tenant, set()).add(session_id)
        self._closed.pop(session_id, None)

    def session_visible(self, tenant: str | None, session_id: str) -> bool:
        return tenant is None or self._sessions.get(session_id) == tenant

    def session_was(self, tenant: str | None, session_id: str) -> bool:
        """``tenant`` owned ``session_id`` until it was closed (it may be told why)."""
        return tenant is None or self._closed.get(session_id) == tenant

    # ---- images -----------------------------------------------------------------------------

    def _has(self, stored: str) -> bool:
        """Some node holds ``stored`` (False for a name that is not valid, too)."""
        try:
            return bool(self.engine.has_image(stored))
        except ImageError:
            return False

    def _prefix(self, tenant: str | None) -> str:
        if tenant is None or tenant == DEFAULT_TENANT:
            return ""
        return f"{tenant}{IMAGE_SEP}"

    def _shared(self, stored: str) -> bool:
        return not stored.startswith(self._prefixes)

    def image_for_import(self, tenant: str | None, name: str) -> str:
        """The stored name of ``tenant``'s image ``name`` (ValueError: a name it cannot take)."""
        if tenant is None:
            return name
        p = self._prefix(tenant)
        if not p and not self._shared(name):
            raise ValueError(f"image names starting with a tenant's name and {IMAGE_SEP!r} are "
                             "that tenant's")
        return p + name

    def image_for_use(self, tenant: str | None, name: str) -> str | None:
        """The stored image ``name`` means for ``tenant``: its own, else a shared one of that
        name; None when it names another tenant's (as if there were no such image)."""
        if tenant is None:
            return name
        p = self._prefix(tenant)
        if not p:
            return name if self._shared(name) else None
        own = p + name
        if self._has(own) or not self._shared(name):
            return own
        return name

    def image_for_remove(self, tenant: str | None, name: str) -> str:
        """The stored name ``tenant`` removes as ``name``: LookupError when it sees no such
        image (404), PermissionError for a shared image and a tenant other than default (403)."""
        if tenant is None:
            return name
        p = self._prefix(tenant)
        if not p:
            if not self._shared(name):
                raise LookupError(f"no image {name!r}")
            return name
        own = p + name
        if not self._has(own):
            if self._shared(name) and self._has(name):
                raise PermissionError(f"image {name!r} is shared (the operator's): only the "
                                      f"{DEFAULT_TENANT!r} tenant removes it")
            raise LookupError(f"no image {name!r}")
        return own

    def shown_image(self, tenant: str | None, stored: str) -> str | None:
        """How ``tenant`` sees the stored image ``stored``; None: not at all."""
        if tenant is None:
            return stored
        p = self._prefix(tenant)
        if p and stored.startswith(p):
            return stored[len(p):]
        return stored if self._shared(stored) else None

    def images_view(self, tenant: str | None, listing: dict[str, Any]) -> dict[str, Any]:
        """``Engine.list_images``'s answer as ``tenant`` sees it (others' images left out,
        its own named without the prefix)."""
        if tenant is None:
            return listing
        nodes: dict[str, Any] = {}
        for node, recs in (listing.get("nodes") or {}).items():
            out = []
            for r in recs:
                shown = self.shown_image(tenant, str(r.get("name", "")))
                if shown is not None:
                    out.append({**r, "name": shown})
            nodes[node] = out
        return {**listing, "nodes": nodes}


    def cluster_view(self, tenant: str | None, view: ClusterView) -> ClusterView:
        """``Engine.cluster_view`` as ``tenant`` sees it (issue 41, H5): of each node's
        images (their records with the OCI config, ``in_use``, sizes), their sources, the
        transfers of them and the ``image:NAME`` warm keys, only those it sees (its own, named
        without the prefix, and the shared ones); of the others only how many there are
        (``images_of_others``, ``warm_of_others``: `NodeRow.of_others`). Counts that are not
        ids (sessions, running actions, capacity) are the cluster's."""
        if tenant is None:
            return view
        return dataclasses.replace(view, nodes=tuple(self._node_view(tenant, n)
                                                     for n in view.nodes))

    def _node_view(self, tenant: str, row: NodeRow) -> NodeRow:
        """One node of `cluster_view`: its report's images, sources and transfers, and the
        core's warm keys, as ``tenant`` sees them."""
        report = dict(row.report)
        others: dict[str, int] = {}
        if isinstance(report.get("images"), list):
            recs = []
            hidden = 0
            for r in report["images"]:
                shown = self.shown_image(tenant, str(r.get("name", ""))) \
                    if isinstance(r, dict) else None
                if shown is None:
                    hidden += 1
                else:
                    recs.append({**r, "name": shown})
            report["images"] = recs
            others["images_of_others"] = hidden
        if isinstance(report.get("image_sources"), dict):
            report["image_sources"] = {
                shown: v for k, v in report["image_sources"].items()
                if (shown := self.shown_image(tenant, str(k))) is not None}
        if isinstance(report.get("image_transfers"), list):
            report["image_transfers"] = [
                {**t, "image": shown} for t in report["image_transfers"]
                if isinstance(t, dict)
                and (shown := self.shown_image(tenant, str(t.get("image", "")))) is not None]
        warm: dict[str, int] = {}
        hidden_warm = 0
        for k, v in row.core.warm.items():
            if not k.startswith(_WARM_IMAGE):
                warm[k] = v
            elif (shown := self.shown_image(tenant, k[len(_WARM_IMAGE):])) is not None:
                warm[_WARM_IMAGE + shown] = v
            else:
                hidden_warm += v
        others["warm_of_others"] = hidden_warm
        return dataclasses.replace(row, core=dataclasses.replace(row.core, warm=warm),
                                   report=report, of_others=others)


_WARM_IMAGE = warm_key("")  # "image:": the warm keys of nodes holding an image


def _cpu(spec: ActionSpec) -> float:
    return float(spec.demand.get("cpu", 0.0))


__all__ = ["IMAGE_SEP", "QuotaExceeded", "Tenancy"]
