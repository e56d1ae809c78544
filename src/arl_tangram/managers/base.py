"""The seam between a node's host (`runtime.node.NodeHost`) and its resource managers.

Runs in: the service process (or a Ray NodeAgent), on its event loop.
Invariant: a NodeHost talks to its managers only through these Protocols. `CodeRunner` is what
the CPU manager (`managers.cpu.CpuManager`: sandboxes, sessions, warm pools, images) offers;
`ModelHost` what the GPU manager (`managers.gpu.GpuManager`: model instances, batches) offers.
They are structural: the real managers satisfy them without naming them (mypy checks it where
the runtime makes them), and a test double need only have the methods a test calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.actions import ActionSpec
    from ..core.resources import Resources
    from ..kinds import Outcome, RunResult


class ImageRecord(Protocol):
    """One image of a node's cache (`managers.cpu.images.store.Image`)."""

    name: str

    def to_dict(self) -> dict[str, Any]: ...


class ImageCache(Protocol):
    """A node's cache of environment images (`managers.cpu.images.store.ImageStore`)."""

    root: str  # its directory on the node (kept out of what a client reads)

    def has(self, name: str) -> bool: ...

    def users(self, name: str) -> int: ...

    def list_images(self) -> Sequence[ImageRecord]: ...

    def import_path(self, path: str, name: str, *, replace: bool = True) -> ImageRecord: ...

    def remove(self, name: str) -> ImageRecord: ...

    # between nodes (issue 26): the sending side (`get`, `open_layer`) and the receiving side
    def get(self, name: str) -> ImageRecord: ...

    def has_layer(self, key: str) -> bool: ...

    def open_layer(self, key: str, chunk_bytes: int = ...) -> Any:
        """Layer ``key`` as a stream of chunks (`images.transfer.LayerStream`)."""
        ...

    def new_spool(self) -> Any:
        """Where one received layer's chunks are written (`images.transfer.LayerSpool`)."""
        ...

    def finish_layer(self, spool: Any, key: str, digest: str, where: str) -> None: ...

    def add_pulled(self, record: dict[str, Any], source: str, pull_s: float) -> ImageRecord: ...


class CodeRunner(Protocol):
    """Runs code actions in isolated sandboxes: one-shot, or in sessions that outlive them."""

    @property
    def images(self) -> ImageCache | None:
        """This node's image cache (None: none here)."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def run(self, action: ActionSpec, allotment: Resources) -> RunResult:
        """Run one action on ``allotment`` (its payload a `kinds.CodeRequest`, or a mapping
        parsed as one); never raises for anything the action contains."""
        ...

    async def cancel(self, action_id: str) -> None: ...

    async def resize(self, action_id: str, allotment: Resources) -> str:
        """Change a running action's allotment: "applied", "deferred" or "dropped"."""
        ...

    async def open_session(self, session_id: str, demand: Resources, ttl_s: float,
                           image: str | None = None, layer_mb: int | None = None,
                           owner: str | None = None) -> None: ...

    async def close_session(self, session_id: str) -> None: ...

    def has_session(self, session_id: str) -> bool:
        """The session is open here (False once the manager closed it itself: its sandbox died,
        its TTL ran out)."""
        ...

    def set_warm_target(self, key: str, size: int) -> None: ...

    def warm_state(self) -> Mapping[str, int]: ...

    def isolation_report(self) -> Mapping[str, bool | str]: ...

    def languages(self) -> Mapping[str, str]: ...

    def health(self) -> Mapping[str, Any]:
        """``ready`` (it can run actions now), ``reason`` when not, and its supervision
        counters (the node's readiness, `GET /v1/health`)."""
        ...

    def memory_use(self) -> tuple[dict[str, tuple[int, int]], int]:
        """Its open sessions' memory now and their peak since the last call (bytes, by
        session id), and what its other sandboxes use (the node's `MemoryReport`)."""
        ...

    async def reclaim_idle(self, need_bytes: int) -> int:
        """Give back up to ``need_bytes`` of idle sessions' page cache (their state kept); the
        bytes freed."""
        ...


class BatchResult(Protocol):
    """What one batch on a model instance produced (the GPU manager's `BatchOutcome`)."""

    @property
    def outputs(self) -> Mapping[str, Outcome]: ...

    @property
    def failed(self) -> Mapping[str, str]: ...

    @property
    def latency_s(self) -> float: ...


class ModelHost(Protocol):
    """Loads, parks and swaps reward-model instances on a node's devices; scores batches."""

    # Told ``(instance_id, reason)`` when an instance's worker died, before its batches' calls
    # fail (the node host sets it: the core hears `ModelUnloaded(reason)` first).
    on_worker_death: Callable[[str, str], None] | None

    async def start(self) -> None:
        """Before the first load (the node's start)."""
        ...

    def node_capacity(self) -> Resources: ...

    def nvlink_domains(self) -> tuple[tuple[int, ...], ...]: ...

    async def load(self, instance_id: str, model: str, devices: tuple[int, ...],
                   from_host: bool = False) -> float:
        """Load (or swap in) an instance: the measured seconds."""
        ...

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        """Unload an instance (``park``: keep its weights in host memory); whether parked."""
        ...

    async def run_batch(self, instance_id: str, actions: Sequence[ActionSpec]) -> BatchResult: ...

    def resident(self) -> Mapping[str, Mapping[str, Any]]: ...

    def health(self) -> Mapping[str, Any]:
        """Its supervision counters (model processes replaced, ...), JSON-ready."""
        ...

    async def aclose(self) -> None: ...
