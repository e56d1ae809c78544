"""The model path of a node: `RunBatch`, `LoadModel` and `UnloadModel` on its GPU manager, and
the unasked ModelUnloaded of an instance whose worker died."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from ...core import commands as C
from ...core import events as E
from ...core.cluster import ModelSpec
from .dispatch import Run
from .seat import Seat

log = logging.getLogger(__name__)


class ModelPath:
    """Runs a node's batches and (un)loads its model instances."""

    def __init__(self, seat: Seat, models: Sequence[ModelSpec]) -> None:
        self.seat, self.models = seat, tuple(models)

    def batch(self, cmd: C.RunBatch) -> Run:
        return self._run_batch(cmd)

    def load(self, cmd: C.LoadModel) -> Run:
        return self._load(cmd)

    def unload(self, cmd: C.UnloadModel) -> Run:
        return self._unload(cmd)

    def _no_gpu(self) -> RuntimeError:
        return RuntimeError(self.seat.gpu_note or f"node {self.seat.name} has no GPU manager")

    async def _run_batch(self, cmd: C.RunBatch) -> None:
        seat = self.seat
        ids = [a.id for a in cmd.actions]
        try:
            if seat.gpu is None:
                raise self._no_gpu()
            out = await seat.gpu.run_batch(cmd.instance_id, cmd.actions)
            seat.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id,
                                      dict(out.outputs), dict(out.failed), out.latency_s))
        except asyncio.CancelledError:
            failed = dict.fromkeys(ids, "node shut down")
            seat.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id, {}, failed))
            raise
        except Exception as exc:
            failed = dict.fromkeys(ids, f"{type(exc).__name__}: {exc}")
            seat.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id, {}, failed))

    def worker_died(self, instance_id: str, reason: str) -> None:
        """The GPU manager dropped an instance whose worker died: the scheduler learns it first
        (an unsolicited ModelUnloaded with the reason: it requeues the batch and loads a
        replacement), then the batch call fails (its BatchFinished comes after)."""
        self.seat.emit(E.ModelUnloaded(time.monotonic(), instance_id, False, reason))

    async def _load(self, cmd: C.LoadModel) -> None:
        seat = self.seat
        try:
            if seat.gpu is None:
                raise self._no_gpu()
            if all(m.name != cmd.model for m in self.models):
                raise KeyError(f"model {cmd.model!r} is not configured on node {seat.name}")
            load_s = await seat.gpu.load(cmd.instance_id, cmd.model, tuple(cmd.devices),
                                         from_host=cmd.from_host)
            # A swap-in falls back to a cold load when nothing was parked: report what happened.
            swapped = bool(seat.gpu.resident().get(cmd.instance_id, {}).get("from_host", False))
            seat.emit(E.ModelLoaded(time.monotonic(), cmd.instance_id, True, load_s, swapped))
        except Exception as exc:
            seat.emit(E.ModelLoaded(time.monotonic(), cmd.instance_id, False, None, cmd.from_host,
                                    f"{type(exc).__name__}: {exc}"))

    async def _unload(self, cmd: C.UnloadModel) -> None:
        parked = False
        try:
            if self.seat.gpu is not None:
                # False when the weights did not fit the host-memory limit and were dropped.
                parked = bool(await self.seat.gpu.unload(cmd.instance_id, park=cmd.park))
        except Exception as exc:
            log.warning("node %s: unload %s: %s", self.seat.name, cmd.instance_id, exc)
        self.seat.emit(E.ModelUnloaded(time.monotonic(), cmd.instance_id, parked))
