"""Typed views of the cluster and of the service's counters (issue 36, item 3): what
``GET /v1/cluster`` and ``GET /v1/stats`` answer, built by the engine from what the core says
(`core.view.NodeView`, `InstanceView`) and what the nodes report, and rendered to JSON only in
`api/` (``to_dict``: each view the one owner of its wire shape).

Runs in: the service process. May import: `core` and the standard library.

Invariant: a view is a snapshot (frozen); the routes and the metrics read its fields, not the
keys of a dict. A node's own report (`Executor.node_info`: its managers' health, images,
isolation, ...) is open-ended and differs by executor, so it rides as ``report``, a mapping the
node wrote (its ``name`` and ``pool`` are the core's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.resources import Resources
from ..core.view import InstanceView, NodeView


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRow:
    """One node: the core's view of it, and what it reports itself."""

    core: NodeView  # capacity, use, free, running, alive, warm (the core's)
    gpu_domains: tuple[tuple[int, ...], ...] = ()  # its NVLink domains (its spec)
    report: Mapping[str, Any] = field(default_factory=dict)  # the node's own (less name, pool)
    not_ready_reason: str | None = None  # a model's worker died here and none is up yet
    # how many of what the viewer does not see (a tenant's view, `api.tenancy.Tenancy.
    # cluster_view`: ``images_of_others``, ``warm_of_others``), last in the wire body
    of_others: Mapping[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def capacity(self) -> Resources:
        return self.core.capacity

    @property
    def alive(self) -> bool:
        return self.core.alive

    @property
    def ready(self) -> bool:
        """It can run actions now (alive aside): its own report's ``ready``, and no model
        without an instance because of it."""
        return self.not_ready_reason is None and bool(self.report.get("ready", True))

    @property
    def reason(self) -> str | None:
        """Why it is not ready (None: it is, or it said no reason)."""
        if self.not_ready_reason is not None:
            return self.not_ready_reason
        got = self.report.get("not_ready_reason")
        return got if isinstance(got, str) else None

    @property
    def utilization(self) -> dict[str, float]:
        """Each resource's used share (at most 1), of those the node has."""
        cap, used = self.core.capacity, self.core.used
        return {k: round(min(1.0, used.get(k) / v), 4) for k, v in cap.items() if v > 0}

    def to_dict(self) -> dict[str, Any]:
        nv = self.core
        d: dict[str, Any] = {
            "name": nv.name, "pool": nv.pool, "alive": nv.alive,
            "capacity": nv.capacity.as_dict(), "used": nv.used.as_dict(),
            "free": nv.free.as_dict(), "utilization": self.utilization,
            "running": nv.running, "warm": dict(nv.warm),
            "gpu_domains": [list(g) for g in self.gpu_domains],
            **{k: v for k, v in self.report.items() if k not in ("name", "pool")},
        }
        if self.not_ready_reason is not None:
            d["ready"] = False
            d["not_ready_reason"] = self.not_ready_reason
        d.update(self.of_others)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDown:
    """A model with no instance up since one died (the engine marks it until one loads)."""

    node: str | None  # where its last instance died
    reason: str
    down_s: float  # how long ago (rounded to ms)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "down_s": self.down_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """``GET /v1/cluster``: nodes, model instances, models down, the policy."""

    nodes: tuple[NodeRow, ...]
    policy: str
    models: tuple[str, ...]  # the configured models' names
    instances: tuple[InstanceView, ...]  # the core's
    models_down: Mapping[str, ModelDown]
    sessions: int  # sessions open

    def dims(self) -> frozenset[str]:
        """The resources the nodes offer (their capacities' keys)."""
        return frozenset(k for n in self.nodes for k in n.capacity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_dict() for n in self.nodes], "policy": self.policy,
            "models": list(self.models),
            "instances": [{"instance_id": i.id, "model": i.model, "node": i.node,
                           "devices": list(i.devices), "state": i.state, "queue": i.queue}
                          for i in self.instances],
            "models_down": {m: d.to_dict() for m, d in self.models_down.items()},
            "sessions": self.sessions,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsView:
    """``GET /v1/stats``: ACT percentiles per kind, queues, counters."""

    policy: str
    uptime_s: float
    act: Mapping[str, Any]  # per kind: count and percentiles of ACT (`StatsBook.act_summary`)
    queued: Mapping[str, int]  # per kind: waiting to start
    running: Mapping[str, int]  # per kind: started, not finished
    submitted: Mapping[str, int]  # per kind
    finished: Mapping[str, Mapping[str, int]]  # per kind, per status
    warm_hits: int
    warm_misses: int
    model_loads: int
    model_swaps: int
    model_load_failures: int
    shed: int  # submits refused for overload
    session_evictions: int
    results_kept: int
    sessions: int
    resizes: Mapping[str, int]  # the nodes' ResizeActions by outcome
    estimator: Mapping[str, Mapping[str, float]]  # prediction errors per kind
    extra: Mapping[str, Any] = field(default_factory=dict)  # `Engine.extra_stats` (providers)

    @property
    def queue_length(self) -> int:
        return sum(self.queued.values())

    @property
    def running_total(self) -> int:
        return sum(self.running.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "uptime_s": self.uptime_s, "act": self.act,
            "queued": dict(self.queued), "running": dict(self.running),
            "queue_length": self.queue_length, "running_total": self.running_total,
            "submitted": dict(self.submitted),
            "finished": {k: dict(v) for k, v in self.finished.items()},
            "warm_hits": self.warm_hits, "warm_misses": self.warm_misses,
            "model_loads": self.model_loads, "model_swaps": self.model_swaps,
            "model_load_failures": self.model_load_failures, "shed": self.shed,
            "session_evictions": self.session_evictions, "results_kept": self.results_kept,
            "sessions": self.sessions, "resizes": dict(self.resizes),
            "estimator": self.estimator, **self.extra,
        }


__all__ = ["ClusterView", "ModelDown", "NodeRow", "StatsView"]
