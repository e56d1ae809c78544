"""The executor seam: how the engine's commands reach real nodes, and how events come back.

Invariant: an executor never decides anything. It executes the core's commands on the node each
names and reports every outcome as an event through ``emit`` (exactly one ActionFinished per
StartAction that it accepted, one BatchFinished per RunBatch, one ModelLoaded per LoadModel, ...).
A node it can no longer reach is reported as NodeLost; a node that joins as NodeAdded.

Implementations: `LocalExecutor` (this machine's managers, in-process) and `RayExecutor`
(one long-lived NodeAgent actor per Ray node). Both host a `NodeHost` per node, so the code
that runs an action is the same in both.

Environment images (issue 17) are operations of the seam too (`import_image`, `list_images`,
`remove_image`, `has_image`): an executor whose nodes keep no image cache reachable from here
keeps the defaults, which raise `ImagesUnsupported` (``has_image``: None, "cannot tell").
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import commands as C
from ..core import events as E
from ..core.actions import Status
from ..core.cluster import NodeSpec
from ..core.commands import Command
from ..core.errors import ImagesUnsupported
from ..core.events import Event

Emit = Callable[[Event], None]  # called on the engine's event loop thread


@dataclass(frozen=True, slots=True)
class SessionOpened(Event):
    """A node opened a session (its `OpenSession` went through): for the engine, which answers
    the client that asked (`Engine.wait_open`); the core needs no word of it (a failure comes
    as `SessionClosed`, which it does need)."""

    session_id: str
    node: str


class Executor(abc.ABC):
    """Runs commands on nodes; reports events."""

    # whether its nodes report each opened session (`SessionOpened`); without, a session counts
    # as open once the core placed it
    reports_session_open = False

    @abc.abstractmethod
    async def start(self, emit: Emit) -> list[NodeSpec]:
        """Bring the nodes up; return what they offer. Later changes come as events."""

    @abc.abstractmethod
    async def submit(self, commands: Sequence[Command]) -> None:
        """Hand commands over without waiting for their execution (results come via emit)."""

    @abc.abstractmethod
    def node_info(self) -> dict[str, dict[str, Any]]:
        """Per node: warm pools, resident models, isolation report, languages (for /v1/cluster)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop everything; actions still running end as CANCELLED through emit."""

    # ---- environment images ------------------------------------------------------------------

    async def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        """Import ``path`` (read on the node) as ``name`` on every node, or on ``node``:
        ``{"name", "nodes": {node: record}}`` (lazy executors: ``"lazy": True``, each node
        imports on first use). ImageError on a bad archive or name; InvalidAction on an
        unknown node."""
        raise self._no_images()

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        """``{"nodes": {node: [record with "in_use", ...]}}``, of every node or of ``node``."""
        raise self._no_images()

    async def remove_image(self, name: str, node: str | None = None) -> dict[str, Any]:
        """Remove ``name`` wherever it is held (or on ``node``): ``{"name", "removed": [node]}``.
        ImageInUse (nothing removed anywhere) while any node uses it; ImageError when no node
        has it."""
        raise self._no_images()

    def has_image(self, name: str) -> bool | None:
        """Whether some node holds ``name`` (or can import it on first use); None: this
        executor cannot tell."""
        return None

    def _no_images(self) -> ImagesUnsupported:
        return ImagesUnsupported("this executor's nodes keep no image cache reachable from here")


def unknown_node_events(cmd: Command) -> list[Event]:
    """The failure events owed for a command naming a node the executor does not have.

    The contract above still holds for it: a StartAction ends NODE_LOST, a RunBatch fails every
    action, a LoadModel fails; other commands owe no event.
    """
    now, why = time.monotonic(), f"unknown node {getattr(cmd, 'node', '?')!r}"
    if isinstance(cmd, C.StartAction):
        return [E.ActionFinished(now, cmd.action.id, Status.NODE_LOST, None, why)]
    if isinstance(cmd, C.RunBatch):
        failed = dict.fromkeys((a.id for a in cmd.actions), why)
        return [E.BatchFinished(now, cmd.batch_id, cmd.instance_id, {}, failed)]
    if isinstance(cmd, C.LoadModel):
        return [E.ModelLoaded(now, cmd.instance_id, False, reason=why)]
    return []
