"""One node's model host over two backends: the GPU manager (scalar, similarity, judge: a process
per instance, driven over a pipe) and the judge engines (genjudge: a vLLM server per instance).

Invariant: each instance lives in exactly one backend, chosen by its model's kind at load; every
command for it goes there. The node's devices and topology are the GPU manager's. Both report
worker deaths through the one ``on_worker_death`` hook the node host sets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core.actions import ActionSpec
from ...core.cluster import ModelSpec
from ...core.resources import Resources
from .config import BatchOutcome
from .engine_judge import EngineJudgeHost
from .manager import GpuManager


class ModelHosts:
    """A `ModelHost` that sends genjudge instances to `EngineJudgeHost`, the rest to `GpuManager`."""

    def __init__(self, gpu: GpuManager, engines: EngineJudgeHost) -> None:
        self.gpu, self.engines = gpu, engines
        self._where: dict[str, Any] = {}  # instance id -> backend
        self._hook: Callable[[str, str], None] | None = None

    @property
    def on_worker_death(self) -> Callable[[str, str], None] | None:
        return self._hook

    @on_worker_death.setter
    def on_worker_death(self, hook: Callable[[str, str], None] | None) -> None:
        self._hook = self.gpu.on_worker_death = self.engines.on_worker_death = hook

    def node_capacity(self) -> Resources:
        return self.gpu.node_capacity()

    def nvlink_domains(self) -> tuple[tuple[int, ...], ...]:
        return self.gpu.nvlink_domains()

    def _backend(self, instance_id: str) -> Any:
        return self._where.get(instance_id, self.gpu)

    async def load(self, instance_id: str, model: str, devices: tuple[int, ...],
                   from_host: bool = False) -> float:
        backend = self.engines if self.engines.serves(model) else self.gpu
        self._where[instance_id] = backend
        try:
            return float(await backend.load(instance_id, model, devices, from_host=from_host))
        except BaseException:
            self._where.pop(instance_id, None)
            raise

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        backend = self._where.pop(instance_id, self.gpu)
        return bool(await backend.unload(instance_id, park=park))

    async def run_batch(self, instance_id: str, actions: Sequence[ActionSpec]) -> BatchOutcome:
        out: BatchOutcome = await self._backend(instance_id).run_batch(instance_id, actions)
        return out

    def resident(self) -> Mapping[str, Mapping[str, Any]]:
        return {**self.gpu.resident(), **self.engines.resident()}

    def health(self) -> dict[str, Any]:
        """Both backends' counters; ``model_worker_deaths`` counts dead engines too (the
        ``tangram_model_worker_deaths`` metric)."""
        g, e = self.gpu.health(), self.engines.health()
        out = {**g, **e}
        out["model_worker_deaths"] = g["model_worker_deaths"] + e["judge_engine_deaths"]
        if e["last_judge_engine_death"]:
            out["last_model_worker_death"] = e["last_judge_engine_death"]
        return out

    def crash_worker(self, instance_id: str) -> bool:
        return self.gpu.crash_worker(instance_id)

    def fitted_costs(self, model: str) -> dict[str, Any]:
        return self.gpu.fitted_costs(model)

    async def start(self) -> None:
        await self.gpu.start()

    async def aclose(self) -> None:
        await self.engines.aclose()
        await self.gpu.aclose()


def with_engines(gpu: GpuManager, models: Sequence[ModelSpec]) -> GpuManager | ModelHosts:
    """``gpu`` alone when no model is a judge engine, else both behind one host."""
    judges = [m for m in models if m.kind == "genjudge"]
    if not judges:
        return gpu
    device = "cuda" if any(d.kind == "cuda" for d in gpu.devices()) else "cpu"
    return ModelHosts(gpu, EngineJudgeHost(judges, device=device))
