"""Events: facts the core is told. Every event carries the time it happened (the driver's clock).

The core never reads a clock: time enters only here. ``cause`` (when set) is the id of what led to
the event, so the story of one action can be told (see `Core.story`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .actions import ActionSpec, Status
from .cluster import NodeSpec
from .resources import Resources


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # when it happened, on the driver's clock (seconds)


@dataclass(frozen=True, slots=True)
class ActionArrived(Event):
    action: ActionSpec  # the submitted action


@dataclass(frozen=True, slots=True)
class ActionsArrived(Event):
    """Actions submitted together in one request ("request-in, batch-out": a GRPO group's
    answers scored at once): the core queues them all before it dispatches any batch."""

    actions: tuple[ActionSpec, ...]


@dataclass(frozen=True, slots=True)
class ActionStarted(Event):
    action_id: str  # the executor began running it (STARTING -> RUNNING)
    node: str
    cold_start_s: float = 0.0  # measured start-up cost (sandbox creation), 0 for a warm start


@dataclass(frozen=True, slots=True)
class ActionFinished(Event):
    action_id: str
    status: Status = Status.SUCCEEDED  # SUCCEEDED | FAILED | TIMED_OUT (or CANCELLED if killed)
    output: Any = None  # manager's result, passed through to the client
    reason: str = ""
    run_s: float | None = None  # measured execution time (start -> end on the node)
    cpu_s: float | None = None  # CPU seconds the action used (its sandbox's cgroup), if measured


@dataclass(frozen=True, slots=True)
class CancelRequested(Event):
    action_id: str


@dataclass(frozen=True, slots=True)
class SessionRequested(Event):
    session_id: str
    demand: Resources = field(default_factory=lambda: Resources(memory_mb=256))  # held while open
    ttl_s: float = 600.0  # closed after this long without an action
    node: str | None = None  # optional pin
    trajectory: str | None = None  # its trajectory (trajectory-bound opens it in that slice)
    task: str | None = None  # its task (task-isolated opens it in that task's pool)
    # opened preferably on a node whose warm state holds this key (`WarmPoolReport`), e.g.
    # "image:NAME" for a session in an environment image: elsewhere it pays the cold cost
    warm_key: str | None = None
    # the driver's, opaque to the core: carried to the node on the session's `OpenSession`
    # (the runtime attaches the environment image there: `runtime.images.SessionImage`)
    attachment: object = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class SessionClosed(Event):
    session_id: str  # the client closed it (or the manager reports it died)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MemoryReport(Event):
    """A node's measured memory (issue 26: memory that follows use), reported by its host
    every ~0.5 s: each open session's use now and its highest over the host's recent window
    (its cgroup's memory.current and memory.peak), and what the node's other sandboxes use.
    The core charges each session by its recent peak (`CoreConfig.session_memory_headroom`)
    instead of its demand, and evicts idle sessions when the node runs short
    (`CoreConfig.memory_high_watermark`). The simulator sends none."""

    node: str
    current_mb: Mapping[str, float] = field(default_factory=dict)  # session id -> use now (MB)
    peak_mb: Mapping[str, float] = field(default_factory=dict)  # session id -> recent peak (MB)
    other_mb: float = 0.0  # the node's sandboxes that are no session's (one-shot, warm), now


@dataclass(frozen=True, slots=True)
class NodeAdded(Event):
    node: NodeSpec


@dataclass(frozen=True, slots=True)
class NodeLost(Event):
    node: str
    reason: str = "node lost"


@dataclass(frozen=True, slots=True)
class ModelLoaded(Event):
    instance_id: str
    ok: bool = True  # False: the load failed (``reason`` says why); devices are free again
    load_s: float | None = None  # measured load (or swap-in) time
    from_host: bool = False  # it was a swap-in of parked weights
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelUnloaded(Event):
    instance_id: str
    parked: bool = False  # weights kept in host memory for a fast swap-in
    # set when no UnloadModel asked for it: the instance died (its worker crashed). The core
    # drops it, requeues its batch in flight once (`CoreConfig.model_worker_retries`), and
    # loads a replacement.
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BatchFinished(Event):
    batch_id: str
    instance_id: str
    outputs: Mapping[str, Any] = field(default_factory=dict)  # action id -> output
    failed: Mapping[str, str] = field(default_factory=dict)  # action id -> reason
    latency_s: float | None = None  # measured batch latency


@dataclass(frozen=True, slots=True)
class WarmPoolReport(Event):
    node: str
    key: str  # what is warm (a language, "python", ...)
    warm: int  # ready executors now


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passed: aging, session TTLs, idle model scale-in."""


@dataclass(frozen=True, slots=True)
class ProviderThrottled(Event):
    """A provider answered a call with 429 (core/providers.py): the call's slot is free and it
    waits again for a token. Without ``retry_after_s`` the provider's rate is lowered (AIMD);
    with it the provider is paused that long."""

    action_id: str
    retry_after_s: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Wake(Event):
    """The time a `WakeAt` asked for came (a provider's next token, a CPU hold's end): nothing else
    happened."""
