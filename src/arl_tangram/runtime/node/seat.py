"""What the paths of one node share (`Seat`): its name, where its events go, its managers."""

from __future__ import annotations

from collections.abc import Callable

from ...core import events as E
from ...core.errors import ClosedError
from ...managers.base import CodeRunner, ImageCache, ModelHost

Emit = Callable[[E.Event], None]


class Seat:
    """One node's name, event sink and managers, read by its dispatcher's paths. Once the
    node is closed only the outcome of an action or a batch still goes out (`emit`)."""

    def __init__(self, name: str, sink: Emit) -> None:
        self.name, self._sink = name, sink
        self.closed = False
        self.cpu_manager: CodeRunner | None = None  # (made by `NodeHost.start` unless given)
        self.gpu: ModelHost | None = None
        self.gpu_note = ""  # why there is no GPU manager, when there is none

    @property
    def cpu(self) -> CodeRunner:
        """The CPU manager (ClosedError: the node is not started)."""
        if self.cpu_manager is None:
            raise ClosedError(f"node {self.name}: not started")
        return self.cpu_manager

    def emit(self, event: E.Event) -> None:
        if not self.closed or isinstance(event, E.ActionFinished | E.BatchFinished):
            self._sink(event)

    def image_cache(self) -> ImageCache | None:
        """This node's image cache (None: no CPU manager, or one without a cache)."""
        return self.cpu_manager.images if self.cpu_manager is not None else None
