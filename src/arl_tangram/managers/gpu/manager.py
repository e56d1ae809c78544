"""The GPU manager of one node: loads, parks, swaps and batches reward-model instances.

Invariant: the manager decides nothing. It executes the scheduler's LoadModel / UnloadModel /
RunBatch on this node's devices and reports what it measured (load and swap-in seconds, batch
latencies; `fitted_costs` turns them into the core's cost-model figures). Every instance sits on
devices of ONE NVLink domain (checked with `core.topology`), device memory is never booked beyond
a device's size, and each instance's work runs on its own worker thread, holding the locks of
its devices, with the thread budget of its devices (CPU-backed devices) -- so two instances never
oversubscribe one device, and the event loop never runs a forward pass.

Swap: ``unload(park=True)`` keeps the constructed model in host memory (on CUDA: moved to pinned
CPU tensors); ``load(from_host=True)`` moves it back (a host->device copy) instead of reading and
constructing it from disk. On CPU-backed devices, device and host memory are the same RAM: a
parked model is an already-built model object, and swap-in skips disk reading, deserialization
and construction -- it moves no bytes.

Supervision (issue 25): an instance's worker is a thread of this process, not a process of its
own, so there is no worker to ``kill -9``; what can die is the worker thread's batch call. A batch
whose worker is stopped (an exception that is not an ``Exception``: `WorkerKilled`, SystemExit,
...), whose device reports a sticky error (a CUDA error other than out-of-memory: the instance's
state can no longer be trusted), or whose worker thread has ended, ends the INSTANCE: it is
removed (its devices free at once), ``on_worker_death(instance_id, reason)`` is called before the
batch call raises `ModelWorkerDied`, and the node host reports it to the scheduler (an unsolicited
``ModelUnloaded`` with the reason), which requeues the batch once and loads a replacement. Any
other model error fails only that batch's actions and keeps the instance, as before.
`crash_worker` stops a worker mid-batch (fault injection for tests and benchmarks).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.actions import ActionSpec
from ...core.cluster import ModelSpec, NodeSpec
from ...core.errors import BrokenError, ClosedError
from ...core.resources import Resources
from ...core.topology import can_ever_place, choose_devices
from .batcher import DynamicBatcher
from .config import BatchOutcome, DeviceInfo, GpuManagerConfig
from .costs import CostTracker
from .devices import discover, torch_device
from .scoring import Factory, Scorer, cold_load, texts_for

log = logging.getLogger(__name__)


class WorkerKilled(BaseException):
    """Raised inside a worker thread by `GpuManager.crash_worker`: the thread is stopped where it
    is, as a crash would stop it (a BaseException, so the model code's ``except Exception``
    cannot swallow it)."""


class ModelWorkerDied(BrokenError):
    """The instance's worker died mid-batch: the instance is gone (``reason`` says why)."""

    def __init__(self, instance_id: str, reason: str) -> None:
        super().__init__(reason)
        self.instance_id, self.reason = instance_id, reason


# Device errors after which an instance's state cannot be trusted (sticky CUDA errors). An
# out-of-memory error is the batch's own: the instance stays.
_STICKY = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure",
           "uncorrectable ECC error")


def _kills_worker(exc: BaseException) -> bool:
    if not isinstance(exc, Exception) or isinstance(exc, _WorkerStopped):
        return True
    if type(exc).__name__ == "AcceleratorError":  # (torch >= 2.8: a CUDA error)
        return True
    msg = str(exc)
    return "out of memory" not in msg and any(m in msg for m in _STICKY)


def _release_frames(exc: BaseException) -> None:
    """Clear the frames of ``exc``'s tracebacks (and of its causes): a dead worker's frames
    hold its model and batch tensors, which must be freed with the instance."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        e = e.__cause__ or e.__context__


class _WorkerStopped(Exception):
    """A BaseException that stopped the worker thread, carried out of it as an Exception (a
    SystemExit or KeyboardInterrupt must never reach the event loop)."""


@dataclass(eq=False)
class _Instance:
    """One model instance, resident on devices or parked in host memory (mutable, private)."""

    id: str
    spec: ModelSpec
    devices: tuple[int, ...]
    executor: ThreadPoolExecutor | None = None
    scorer: Scorer | None = None
    state: str = "loading"  # loading | loaded | parked
    from_host: bool = False  # the last load was a swap-in of parked weights
    load_s: float | None = None
    host_mb: float = 0.0  # bytes of its weights, in MB
    worker: threading.Thread | None = None  # its worker thread (set when the thread starts)
    batch_thread: int | None = None  # ident of the worker thread while a batch runs on it
    extra: dict[str, Any] = field(default_factory=dict)


def _init_worker(inst: _Instance, n: int) -> None:
    inst.worker = threading.current_thread()
    torch.set_num_threads(n)  # OpenMP: applies to this worker thread's parallel regions


def _weights_mb(model: Any) -> float:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    return total / 2**20


class GpuManager:
    """Executes model commands on one node's accelerators (or CPU-backed devices)."""

    def __init__(
        self,
        config: GpuManagerConfig | None,
        models: Sequence[ModelSpec],
        factories: Mapping[str, Factory] | None = None,
    ) -> None:
        self.config = config or GpuManagerConfig()
        self._specs = {m.name: m for m in models}
        if len(self._specs) != len(models):
            raise ValueError("GpuManager: model names must be unique")
        self._factories = dict(factories or {})
        self._devices, self._domains = discover(self.config)
        self._locks = {d.index: threading.Lock() for d in self._devices}
        self._booked_mb = {d.index: 0.0 for d in self._devices}
        self._instances: dict[str, _Instance] = {}
        self._parked: OrderedDict[str, _Instance] = OrderedDict()
        self._costs = {name: CostTracker(spec) for name, spec in self._specs.items()}
        self._batcher = DynamicBatcher(self.run_batch, self._knee, self.config.batch_wait_ms / 1000)
        self._closed = False
        # supervision: called (instance id, reason) when an instance's worker dies, before the
        # batch call that saw it raises (the node host tells the scheduler)
        self.on_worker_death: Callable[[str, str], None] | None = None
        self.worker_deaths = 0
        self.last_worker_death: str = ""

    # ---- node description ----------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def nvlink_domains(self) -> tuple[tuple[int, ...], ...]:
        return self._domains

    def node_capacity(self) -> Resources:
        return Resources(
            gpu=len(self._devices), gpu_memory_mb=sum(d.memory_mb for d in self._devices)
        )

    def node_spec(self, name: str, extra: Mapping[str, float] | None = None) -> NodeSpec:
        """This node as the core sees it (``extra`` adds e.g. cpu and memory_mb)."""
        cap = self.node_capacity() + dict(extra or {})
        return NodeSpec(name, cap, "gpu", self._domains)

    def models(self) -> list[ModelSpec]:
        return list(self._specs.values())

    def memory_free(self) -> dict[int, float]:
        return {d.index: d.memory_mb - self._booked_mb[d.index] for d in self._devices}

    def place(self, model: str) -> tuple[int, ...] | None:
        """Devices a new instance of ``model`` could load on now (best fit), or None."""
        spec = self._spec(model)
        return choose_devices(
            [d.index for d in self._devices],
            self._domains,
            spec.devices,
            memory_free=self.memory_free(),
            memory_needed=spec.memory_mb,
        )

    def why_unplaceable(self, model: str) -> str | None:
        """None if ``model`` fits this node when empty, else the reason."""
        return can_ever_place(self.node_spec("this-node"), self._spec(model))

    # ---- commands --------------------------------------------------------------------------
    async def load(
        self, instance_id: str, model: str, devices: tuple[int, ...], from_host: bool = False
    ) -> float:
        """Load (or swap in) an instance; returns measured seconds; raises BrokenError."""
        self._check_open()
        spec = self._spec(model)
        if instance_id in self._instances:
            raise BrokenError(f"instance {instance_id} already exists")
        devices = tuple(devices)
        self._check_devices(spec, devices)
        inst = _Instance(instance_id, spec, devices)
        self._book(inst, +1)
        self._instances[instance_id] = inst
        parked = self._take_parked(instance_id, model) if from_host else None
        budget = self.config.threads_per_device * len(devices)
        inst.executor = ThreadPoolExecutor(1, f"gpu-{instance_id}", _init_worker, (inst, budget))
        loop = asyncio.get_running_loop()
        try:
            scorer, seconds = await loop.run_in_executor(
                inst.executor, self._load_sync, inst, parked
            )
        except BaseException as exc:
            if self._instances.get(instance_id) is inst:
                del self._instances[instance_id]
                self._book(inst, -1)
            inst.executor.shutdown(wait=False)
            if isinstance(exc, BrokenError):
                raise
            raise BrokenError(f"instance {instance_id} ({model}): load failed: {exc!r}") from exc
        if self._instances.get(instance_id) is not inst:  # unloaded (or closed) while loading
            raise BrokenError(f"instance {instance_id} was unloaded while it was loading")
        inst.scorer, inst.state, inst.load_s = scorer, "loaded", seconds
        inst.from_host = parked is not None
        inst.host_mb = _weights_mb(scorer.model)
        self._costs[model].add_load(seconds, inst.from_host)
        return seconds

    def _load_sync(self, inst: _Instance, parked: _Instance | None) -> tuple[Scorer, float]:
        device = torch_device(self._devices[inst.devices[0]])
        with self._device_locks(inst.devices):
            t0 = time.perf_counter()
            if parked is not None and parked.scorer is not None:
                scorer = parked.scorer
                scorer.model.to(device, non_blocking=True)
            else:
                spec = inst.spec
                model, tok = cold_load(spec, self._factories.get(spec.name), device)
                scorer = Scorer(
                    spec,
                    model,
                    tok,
                    max_length=self.config.max_length,
                    max_tokens=self.config.max_batch_tokens,
                )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return scorer, time.perf_counter() - t0

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        """Free the instance's devices; with ``park``, keep its weights in host memory.

        Returns whether the weights were parked (False when not asked, when they do not fit
        ``host_park_limit_mb``, or for an unknown or still-loading instance).
        """
        inst = self._instances.pop(instance_id, None)
        if inst is None:
            return False
        self._batcher.drop(instance_id, f"instance {instance_id} was unloaded")
        executor = inst.executor
        try:
            if executor is not None and inst.scorer is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(executor, self._unload_sync, inst, park)
        finally:
            self._book(inst, -1)
            if executor is not None:
                executor.shutdown(wait=False)
            inst.executor = None
        if park and inst.scorer is not None and self._admit_parked(inst):
            inst.state = "parked"
            self._parked[instance_id] = inst
            return True
        inst.scorer = None
        self._free_memory()
        return False

    def _unload_sync(self, inst: _Instance, park: bool) -> None:
        assert inst.scorer is not None
        if not park or self._devices[inst.devices[0]].kind != "cuda":
            return  # CPU-backed: the built model object already lives in host RAM
        model = inst.scorer.model.to("cpu")
        if self.config.pin_host_memory:
            for t in list(model.parameters()) + list(model.buffers()):
                t.data = t.data.pin_memory()
        torch.cuda.empty_cache()

    async def run_batch(self, instance_id: str, actions: Sequence[ActionSpec]) -> BatchOutcome:
        """Score ``actions`` in one batch; per-action reasons for the ones that cannot run."""
        self._check_open()
        inst = self._instances.get(instance_id)
        if inst is None or inst.state != "loaded" or inst.executor is None:
            raise BrokenError(f"instance {instance_id} is not loaded on this node")
        failed: dict[str, str] = {}
        good: list[ActionSpec] = []
        for a in actions:
            if a.model is not None and a.model != inst.spec.name:
                failed[a.id] = f"action names model {a.model!r}; instance serves {inst.spec.name!r}"
                continue
            try:
                texts_for(inst.spec, a.payload)
            except ValueError as exc:
                failed[a.id] = f"bad payload: {exc}"
                continue
            good.append(a)
        if not good:
            return BatchOutcome({}, failed, 0.0, 0)
        if inst.worker is not None and not inst.worker.is_alive():
            self._worker_died(inst, "its worker thread had ended")
        loop = asyncio.get_running_loop()
        died = ""
        try:
            outs, latency = await loop.run_in_executor(inst.executor, self._score_sync, inst, good)
        except (Exception, WorkerKilled) as exc:
            if not _kills_worker(exc):
                # the model itself failed: every action of the batch did; the instance stays
                reason = f"model {inst.spec.name} failed: {type(exc).__name__}: {exc}"
                failed.update({a.id: reason for a in good})
                return BatchOutcome({}, failed, 0.0, 0)
            cause = exc.__cause__ if isinstance(exc, _WorkerStopped) else exc
            died = f"{type(cause).__name__}: {cause}".rstrip(": ") or type(cause).__name__
            _release_frames(exc)  # (they hold the dead model's tensors)
        if died:
            self._worker_died(inst, died)
        self._costs[inst.spec.name].add_batch(len(good), latency)
        return BatchOutcome(
            {a.id: o for a, o in zip(good, outs, strict=True)}, failed, latency, len(good)
        )

    def _score_sync(
        self, inst: _Instance, actions: list[ActionSpec]
    ) -> tuple[list[dict[str, Any]], float]:
        assert inst.scorer is not None
        inst.batch_thread = threading.get_ident()
        try:
            with self._device_locks(inst.devices):
                t0 = time.perf_counter()
                outs = inst.scorer.score([a.payload for a in actions])
                return outs, time.perf_counter() - t0
        except Exception:
            raise
        except BaseException as exc:  # the worker was stopped: carried out as an Exception
            raise _WorkerStopped(f"{type(exc).__name__}: {exc}") from exc
        finally:
            inst.batch_thread = None

    def _worker_died(self, inst: _Instance, cause: str) -> None:
        """The instance's worker died: drop the instance (its devices free now), tell the
        ``on_worker_death`` hook, raise `ModelWorkerDied`."""
        iid = inst.id
        reason = (f"the worker of model instance {iid} ({inst.spec.name}) died mid-batch: "
                  f"{cause}")
        if self._instances.get(iid) is inst:
            del self._instances[iid]
            self._book(inst, -1)
        self._batcher.drop(iid, reason)
        if inst.executor is not None:
            inst.executor.shutdown(wait=False)
        inst.executor, inst.scorer, inst.state = None, None, "dead"
        self.worker_deaths += 1
        self.last_worker_death = reason
        log.warning("%s; instance dropped", reason)
        hook = self.on_worker_death
        if hook is not None:
            try:
                hook(iid, reason)
            except Exception:
                log.exception("on_worker_death hook failed for %s", iid)
        self._free_memory()
        raise ModelWorkerDied(iid, reason)

    def crash_worker(self, instance_id: str) -> bool:
        """Fault injection (tests, benchmarks/bench_faults.py): stop the worker thread of
        ``instance_id`` where it is, mid-batch, with an asynchronous `WorkerKilled` -- what a
        crash of the thread does. False when it is not running a batch now."""
        inst = self._instances.get(instance_id)
        tid = inst.batch_thread if inst is not None else None
        if tid is None:
            return False
        n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                       ctypes.py_object(WorkerKilled))
        return bool(n == 1)

    def health(self) -> dict[str, Any]:
        """Supervision counters: worker deaths and the last one's reason."""
        return {"model_worker_deaths": self.worker_deaths,
                "last_model_worker_death": self.last_worker_death}

    async def submit(self, instance_id: str, action: ActionSpec) -> dict[str, Any]:
        """Score one action through the dynamic batcher (merges concurrent submits)."""
        self._check_open()
        return await self._batcher.submit(instance_id, action)

    # ---- reports ---------------------------------------------------------------------------
    def resident(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for iid, inst in [*self._instances.items(), *self._parked.items()]:
            out[iid] = {
                "model": inst.spec.name,
                "devices": inst.devices if inst.state != "parked" else (),
                "state": inst.state,
                "from_host": inst.from_host,
                "load_s": inst.load_s,
                "weights_mb": round(inst.host_mb, 3),
            }
        return out

    def fitted_costs(self, model: str) -> dict[str, Any]:
        self._spec(model)
        return self._costs[model].fitted()

    def batch_sizes(self) -> list[int]:
        """Sizes of the batches the dynamic batcher ran (in order)."""
        return list(self._batcher.batch_sizes)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._batcher.aclose()
        for iid in list(self._instances):
            await self.unload(iid, park=False)
        self._parked.clear()
        self._free_memory()

    # ---- internals -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the GPU manager is closed")

    def _spec(self, model: str) -> ModelSpec:
        spec = self._specs.get(model)
        if spec is None:
            raise BrokenError(f"unknown model {model!r}; this node serves {sorted(self._specs)}")
        return spec

    def _knee(self, instance_id: str) -> int:
        inst = self._instances.get(instance_id)
        return self._costs[inst.spec.name].knee_batch() if inst else 1

    def _check_devices(self, spec: ModelSpec, devices: tuple[int, ...]) -> None:
        name = spec.name
        if len(devices) != spec.devices or len(set(devices)) != len(devices):
            raise BrokenError(f"model {name} needs {spec.devices} distinct devices, got {devices}")
        unknown = [d for d in devices if d not in self._booked_mb]
        if unknown:
            raise BrokenError(f"model {name}: device {unknown[0]} does not exist on this node")
        if choose_devices(devices, self._domains, len(devices)) is None:
            raise BrokenError(
                f"model {name}: devices {devices} span NVLink domains {self._domains}"
            )
        free = self.memory_free()
        short = [d for d in devices if free[d] + 1e-9 < spec.memory_mb]
        if short:
            raise BrokenError(
                f"model {name} needs {spec.memory_mb:g} MB on device {short[0]}; "
                f"{free[short[0]]:g} MB free"
            )

    def _book(self, inst: _Instance, sign: int) -> None:
        for d in inst.devices:
            self._booked_mb[d] = max(0.0, self._booked_mb[d] + sign * inst.spec.memory_mb)

    def _device_locks(self, devices: Sequence[int]) -> _Locks:
        return _Locks([self._locks[d] for d in sorted(devices)])

    def _take_parked(self, instance_id: str, model: str) -> _Instance | None:
        if instance_id in self._parked and self._parked[instance_id].spec.name == model:
            return self._parked.pop(instance_id)
        for iid, p in self._parked.items():
            if p.spec.name == model:
                return self._parked.pop(iid)
        return None

    def _admit_parked(self, inst: _Instance) -> bool:
        """Make room in the host park (least recently parked first); False if it cannot fit."""
        limit = self.config.host_park_limit_mb
        if inst.host_mb > limit:
            return False
        while self._parked and sum(p.host_mb for p in self._parked.values()) + inst.host_mb > limit:
            _, old = self._parked.popitem(last=False)
            old.scorer = None
        return True

    def _free_memory(self) -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _Locks:
    """Acquire several device locks in a fixed order (no deadlock), release all on exit."""

    def __init__(self, locks: list[threading.Lock]) -> None:
        self._locks = locks

    def __enter__(self) -> None:
        for lock in self._locks:
            lock.acquire()

    def __exit__(self, *exc: object) -> None:
        for lock in reversed(self._locks):
            lock.release()
