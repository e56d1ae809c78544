"""NodeHost: one node's managers, and the facade of the paths that execute its commands."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core import commands as C
from ...core.cluster import ModelSpec, NodeSpec
from ...core.resources import CPU, GPU, GPU_MEMORY_MB, MEMORY_MB, Resources
from ...managers.base import CodeRunner, ModelHost
from ...managers.cpu.config import CpuManagerConfig
from ...managers.gpu.config import GpuManagerConfig
from ..images import NodeImages
from .actions import ActionPath
from .dispatch import Dispatcher
from .models import ModelPath
from .reports import Reporters
from .seat import Emit, Seat
from .sessions import SessionPath

log = logging.getLogger(__name__)


def machine_capacity() -> Resources:
    """This machine's CPU cores (affinity-aware) and physical memory."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    mem_mb = 1024.0
    with contextlib.suppress(OSError, ValueError):
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return Resources({CPU: cores, MEMORY_MB: round(mem_mb)})


class NodeHost:
    """Hosts the CPU manager (and the GPU manager when models are configured) of one node:
    starts and closes them, and hands each command to its path (``dispatcher``): ``actions``,
    ``models`` (batches, loads), ``sessions``; ``images`` is the node's image cache and
    ``reports`` what it tells the core unasked."""

    def __init__(
        self,
        name: str,
        *,
        emit: Emit,
        pool: str = "default",
        capacity: Resources | None = None,
        cpu_config: CpuManagerConfig | None = None,
        gpu_config: GpuManagerConfig | None = None,
        models: Sequence[ModelSpec] = (),
        gpu_factories: Any = None,
        labels: Mapping[str, str] | None = None,
        cpu_manager: CodeRunner | None = None,
        gpu_manager: ModelHost | None = None,
        images: Sequence[tuple[str, str]] = (),
        eager_images: Sequence[str] = (),
    ) -> None:
        self.name, self.pool = name, pool
        self._capacity_override = capacity
        self._cpu_config, self._gpu_config = cpu_config or CpuManagerConfig(), gpu_config
        self._gpu_factories = gpu_factories
        self._labels = dict(labels or {})
        self.spec: NodeSpec | None = None
        self.seat = seat = Seat(name, emit)
        seat.cpu_manager, seat.gpu = cpu_manager, gpu_manager
        self.images = NodeImages(name, seat.image_cache, seat.emit, images, eager_images)
        self.sessions = SessionPath(seat, self.images)
        self.actions = ActionPath(seat, self.images, self.sessions)
        self.models = ModelPath(seat, models)
        self.reports = Reporters(seat)
        self.dispatcher = Dispatcher(name, self._table())

    def _table(self) -> dict[type, tuple[Callable[[Any], str], Callable[[Any], Any]]]:
        acts, models, sessions = self.actions, self.models, self.sessions
        return {
            C.StartAction: (lambda c: c.action.id, acts.start),
            C.RunBatch: (lambda c: f"batch:{c.batch_id}", models.batch),
            C.LoadModel: (lambda c: f"load:{c.instance_id}", models.load),
            C.UnloadModel: (lambda c: f"unload:{c.instance_id}", models.unload),
            C.CancelAction: (lambda c: f"cancel:{c.action_id}", acts.cancel),
            C.ResizeAction: (lambda c: f"resize:{c.action_id}", acts.resize),
            C.OpenSession: (lambda c: f"open:{c.session_id}", sessions.open),
            C.CloseSession: (lambda c: f"close:{c.session_id}", sessions.close),
            C.ResizeWarmPool: (lambda c: "", self._resize_warm),
        }

    # ---- life ------------------------------------------------------------------------------

    @property
    def cpu(self) -> CodeRunner:
        """The CPU manager (`start` makes one unless one was given)."""
        return self.seat.cpu

    @property
    def gpu(self) -> ModelHost | None:
        return self.seat.gpu

    async def start(self) -> NodeSpec:
        """Start the managers and return what the node offers."""
        seat = self.seat
        if seat.cpu_manager is None:
            seat.cpu_manager = self._make_cpu()
        await seat.cpu.start()
        if seat.gpu is None and self.models.models and self._gpu_config is not None:
            seat.gpu = self._make_gpu()
        if seat.gpu is not None:
            seat.gpu.on_worker_death = self.models.worker_died
            await seat.gpu.start()
        self.spec = self._node_spec()
        self.reports.memory_mb = self.spec.capacity.get(MEMORY_MB)
        await self.images.start()
        self.dispatcher.spawn("warm-reporter", self.reports.warm())
        self.dispatcher.spawn("memory-reporter", self.reports.memory())
        return self.spec

    def _make_cpu(self) -> CodeRunner:
        from ...managers.cpu import CpuManager

        return CpuManager(self._cpu_config)

    def _make_gpu(self) -> ModelHost | None:
        try:
            from ...managers.gpu import GpuManager
        except Exception as exc:  # the [gpu] extra is missing
            self.seat.gpu_note = f"GPU manager unavailable ({type(exc).__name__}: {exc})"
            log.warning("node %s: %s; reward models disabled", self.name, self.seat.gpu_note)
            return None
        cfg = self._gpu_config or GpuManagerConfig()
        from ...managers.gpu.hosts import with_engines  # judge engines (kind genjudge) beside it

        models = self.models.models
        return with_engines(GpuManager(cfg, models, factories=self._gpu_factories), models)

    def _node_spec(self) -> NodeSpec:
        cap = machine_capacity()
        domains: tuple[tuple[int, ...], ...] = ()
        gpu = self.seat.gpu
        if gpu is not None:
            gcap = Resources(gpu.node_capacity())
            cap = cap + {k: v for k, v in gcap.items() if k in (GPU, GPU_MEMORY_MB)}
            cap = cap + {k: v for k, v in gcap.items() if k not in (GPU, GPU_MEMORY_MB, CPU, MEMORY_MB)}
            with contextlib.suppress(Exception):
                domains = tuple(tuple(int(i) for i in d) for d in gpu.nvlink_domains())
        if self._capacity_override is not None:
            cap = Resources({**cap.as_dict(), **self._capacity_override.as_dict()})
        ngpu = int(cap.get(GPU))
        domains = tuple(d for d in domains if d and max(d) < ngpu)
        return NodeSpec(self.name, cap, self.pool, domains, self._labels)

    async def aclose(self) -> None:
        """Stop everything; running actions end as CANCELLED."""
        self.seat.closed = True
        await self.dispatcher.cancel()
        await self.images.server.close_all()
        for mgr in (self.seat.gpu, self.seat.cpu_manager):
            if mgr is not None:
                with contextlib.suppress(Exception):
                    await mgr.aclose()

    # ---- commands --------------------------------------------------------------------------

    def submit(self, cmd: C.Command) -> None:
        """Start executing one command; its outcome comes back through ``emit``."""
        self.dispatcher.submit(cmd)

    def emit(self, event: Any) -> None:
        self.seat.emit(event)

    def _resize_warm(self, cmd: C.ResizeWarmPool) -> None:
        with contextlib.suppress(Exception):
            self.seat.cpu.set_warm_target(cmd.key, cmd.size)

    # ---- reporting -------------------------------------------------------------------------

    def readiness(self) -> dict[str, Any]:
        """``ready`` (this node can run actions now: liveness apart), ``not_ready_reason`` when
        not, and the CPU manager's supervision counters (``cpu_health``)."""
        if self.seat.closed:
            return {"ready": False, "not_ready_reason": "the node is closed"}
        cpu = self.seat.cpu_manager
        h = _safe(cpu.health, {}) if cpu is not None else {}
        ready = bool(h.get("ready", cpu is not None))
        out: dict[str, Any] = {"ready": ready}
        if not ready:
            out["not_ready_reason"] = str(h.get("reason") or "the CPU manager is not running")
        if h:
            out["cpu_health"] = _jsonable(h)
        if self.seat.gpu is not None:
            out["gpu_health"] = _jsonable(_safe(self.seat.gpu.health, {}))
        return out

    def info(self) -> dict[str, Any]:
        """Warm pools, resident models, isolation report and languages, JSON-ready."""
        d: dict[str, Any] = {"name": self.name, "pool": self.pool}
        d["warm_pools"] = _safe(lambda: dict(self.cpu.warm_state()), {})
        d["isolation"] = _safe(lambda: _jsonable(self.cpu.isolation_report()), {})
        d["languages"] = _safe(lambda: sorted(self.cpu.languages()), [])
        d.update(self.readiness())
        gpu = self.seat.gpu
        d["resident_models"] = _safe(lambda: _jsonable(gpu.resident()), []) if gpu else []
        d["gpu_manager"] = gpu is not None
        d["resizes"] = dict(self.actions.resizes)
        if self.reports.memory_last:
            d["memory_use"] = dict(self.reports.memory_last)
        d.update(self.images.info())
        if self.seat.gpu_note:
            d["gpu_note"] = self.seat.gpu_note
        return d


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [_jsonable(v) for v in x]
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    if hasattr(x, "__dataclass_fields__"):
        return {k: _jsonable(getattr(x, k)) for k in x.__dataclass_fields__}
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    return str(x)
