"""Frozen snapshots of the core's state (what `Core.view` returns); no behaviour.

Invariant: a `CoreView` shares nothing mutable with the core; holding one never changes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .resources import Resources


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    pool: str
    capacity: Resources  # what it offers
    used: Resources  # allotments + open sessions + model instances on it
    free: Resources  # capacity - used
    running: int  # actions holding an allotment here
    alive: bool
    warm: Mapping[str, int]  # warm executors per key, as last reported (minus those used)


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    model: str
    node: str
    devices: tuple[int, ...]
    state: str  # "loading" | "ready" | "busy"
    queue: int  # actions in its batch in flight


@dataclass(frozen=True, slots=True)
class SessionView:
    id: str
    node: str | None  # None while waiting for capacity to open
    demand: Resources
    actions: int  # live actions naming it
    last_active: float


@dataclass(frozen=True, slots=True)
class CoreView:
    time: float  # time of the last event handled
    policy: str
    nodes: tuple[NodeView, ...]
    instances: tuple[InstanceView, ...]
    sessions: tuple[SessionView, ...]
    queued_by_kind: Mapping[str, int]  # queued actions per ActionKind value
    counts: Mapping[str, int]  # live actions per status name, plus terminal totals
    parked: Mapping[str, int]  # parked (host-memory) model weights, "node/model" -> count

    @property
    def queued(self) -> int:
        return sum(self.queued_by_kind.values())
