"""The scheduler seam: what a driver (the engine, the simulator) needs of the core.

Invariant: a driver feeds events in and carries commands out, and nothing else is required of
a scheduler: `Core` implements `Scheduler`, and so may a test fake (tests/runtime/fakes.py
`FakeCore`). What a driver may also read where a scheduler offers it (the engine's
``/v1/cluster`` and ``/v1/stats``) is `Inspectable`; a driver tests for it, never assumes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .actions import Status
    from .commands import Command
    from .estimator import DurationEstimator
    from .events import Event
    from .view import CoreView, InstanceView


class Scheduler(Protocol):
    """A pure state machine: one event in, the commands it causes out (no I/O, no clock)."""

    def handle(self, event: Event) -> list[Command]: ...


@runtime_checkable
class Inspectable(Protocol):
    """A scheduler that shows its state: a frozen snapshot, its model instances one by one
    (typed queries: the engine asks, it keeps no copy), and its duration estimator."""

    def view(self) -> CoreView: ...

    def instance(self, instance_id: str) -> InstanceView | None: ...

    def instances_of(self, model: str) -> list[InstanceView]: ...

    def status(self, action_id: str) -> Status | None:
        """An action's status (None: never seen, or forgotten)."""
        ...

    def provider_stats(self) -> dict[str, dict[str, Any]]:
        """Per provider, the core's view of its calls (rate, tokens, waiting, coalesced)."""
        ...

    @property
    def estimator(self) -> DurationEstimator: ...
