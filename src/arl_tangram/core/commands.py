"""Commands: what the core tells the driver to do. The driver executes them and reports events.

Every command is idempotent to describe and carries ``cause``, the id of the event or action that
led to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .actions import ActionResult, ActionSpec
from .resources import Resources


@dataclass(frozen=True, slots=True)
class Command:
    pass


@dataclass(frozen=True, slots=True)
class StartAction(Command):
    action: ActionSpec  # what to run
    node: str  # where
    allotment: Resources  # with what (elastic dimension resolved)
    warm: bool = True  # the core expects a warm executor / the session to be there
    cause: str = ""


@dataclass(frozen=True, slots=True)
class ResizeAction(Command):
    action_id: str  # a running elastic action gets a new allotment (more spare capacity)
    node: str
    allotment: Resources
    cause: str = ""


@dataclass(frozen=True, slots=True)
class CancelAction(Command):
    action_id: str  # stop it on its node; the core already delivered CANCELLED
    node: str
    cause: str = ""


@dataclass(frozen=True, slots=True)
class OpenSession(Command):
    session_id: str
    node: str
    demand: Resources
    ttl_s: float
    cause: str = ""
    attachment: object = field(default=None, repr=False)  # `SessionRequested.attachment`


@dataclass(frozen=True, slots=True)
class CloseSession(Command):
    session_id: str
    node: str
    reason: str = ""
    cause: str = ""


@dataclass(frozen=True, slots=True)
class EvictSession(CloseSession):
    """A `CloseSession` because the session's node ran short of memory (`MemoryReport`,
    `sessionmem`): executed as one (its state is lost); the driver counts it and tells the
    session's next action ``reason``."""


@dataclass(frozen=True, slots=True)
class LoadModel(Command):
    instance_id: str
    model: str
    node: str
    devices: tuple[int, ...]  # device indices on the node, all in one NVLink domain
    from_host: bool = False  # swap parked weights back in rather than a cold load
    cause: str = ""


@dataclass(frozen=True, slots=True)
class UnloadModel(Command):
    instance_id: str
    node: str
    park: bool = True  # keep weights in host memory for a fast swap-in
    cause: str = ""


@dataclass(frozen=True, slots=True)
class RunBatch(Command):
    batch_id: str
    instance_id: str
    node: str
    model: str
    actions: tuple[ActionSpec, ...]
    cause: str = ""


@dataclass(frozen=True, slots=True)
class ResizeWarmPool(Command):
    node: str
    key: str  # e.g. a language
    size: int  # target number of warm executors
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Deliver(Command):
    """The action is finished (any terminal status): hand the result to whoever waits."""

    result: ActionResult
    cause: str = ""


@dataclass(frozen=True, slots=True)
class CallProvider(Command):
    """Send a provider call (kind search/fetch/http) now: it holds a token and a slot. The
    driver answers `ActionFinished` (any outcome but a 429) or `ProviderThrottled` (a 429),
    never both, exactly once per CallProvider."""

    action: ActionSpec
    provider: str
    attempt: int  # 1 for the first call, +1 after each 429
    deadline: float  # on the driver's clock: give up (TIMED_OUT) by then
    cause: str = ""


@dataclass(frozen=True, slots=True)
class WakeAt(Command):
    """Send the core a `Wake` event at ``time`` (driver's clock): a provider's next token
    appears then, or a CPU hold runs out (`lending.py`'s anticipation). A later WakeAt with an earlier time supersedes nothing: honour each."""

    time: float
    cause: str = ""
