"""The GPU manager of one node: loads, parks, swaps and batches reward-model instances.

Invariant: the manager decides nothing. It executes the scheduler's LoadModel / UnloadModel /
RunBatch on this node's devices and reports what it measured (load and swap-in seconds, batch
latencies, each measured inside the instance's process around the work itself; `fitted_costs`
turns them into the core's cost-model figures). Every instance sits on devices of ONE NVLink
domain (checked with `core.topology`), device memory is never booked beyond a device's size, and
each instance's model lives in a process of its own (`worker.py`: forked from a fork server that
preloaded torch; this process holds no model), driven by one thread of this process that holds
the locks of its devices while the process works -- so two instances never oversubscribe one
device, the event loop never waits on a forward pass, and each process runs with the thread
budget of its devices (CPU-backed devices: ``threads_per_device`` x devices).

Swap: ``unload(park=True)`` keeps the instance's process and its constructed model (on CUDA:
moved to pinned CPU tensors); ``load(from_host=True)`` hands that process to the new instance and
moves the model back (a host->device copy) instead of reading and constructing it from disk. On
CPU-backed devices, device and host memory are the same RAM: a parked model is an already-built
model object, and swap-in is one round trip to its process -- it moves no bytes.
``unload(park=False)`` (and a park evicted by ``host_park_limit_mb``) ends the process.

Supervision (issue 25, issue 41 item 5): an instance ENDS when its process dies (a segfault in
native code, an OOM kill: the pipe reads EOF and the exit status names the signal), when a
forward runs past its deadline (``forward_timeout_s``, per model ``options["forward_timeout_s"]``:
the process is killed), or when its device reports a sticky error (a CUDA error other than
out-of-memory: the instance's state can no longer be trusted; the process is killed). The
instance is removed (its devices free at once), ``on_worker_death(instance_id, reason)`` is
called before the batch call raises `ModelWorkerDied`, and the node host reports it to the
scheduler (an unsolicited ``ModelUnloaded`` with the reason), which requeues the batch once and
loads a replacement (a new process). A process that dies while idle is noticed on the event loop
(its sentinel) and reported the same way, without a batch. Any other model error fails only that
batch's actions and keeps the instance and its process. `crash_worker` sends a signal (SIGKILL
by default) to an instance's process (fault injection for tests and benchmarks).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...core.actions import ActionSpec
from ...core.cluster import ModelSpec, NodeSpec
from ...core.errors import BrokenError, ClosedError
from ...core.resources import Resources
from ...core.topology import can_ever_place, choose_devices
from ...kinds import Outcome, RetrieveRequest, ScoreRequest
from .batcher import DynamicBatcher
from .config import BatchOutcome, DeviceInfo, GpuManagerConfig
from .costs import CostTracker
from .devices import discover, torch_device
from .scoring import Factory, request_for
from .worker import Worker, WorkerGone, WorkerTimeout, start_fork_server

log = logging.getLogger(__name__)


class ModelWorkerDied(BrokenError):
    """The instance's worker died mid-batch: the instance is gone (``reason`` says why)."""

    def __init__(self, instance_id: str, reason: str) -> None:
        super().__init__(reason)
        self.instance_id, self.reason = instance_id, reason


class _Died(Exception):
    """Raised in an instance's driver thread: its process is gone (the message says how)."""


@dataclass(eq=False)
class _Instance:
    """One model instance, resident on devices or parked in host memory (mutable, private)."""

    id: str
    spec: ModelSpec
    devices: tuple[int, ...]
    executor: ThreadPoolExecutor | None = None  # drives its process (one request at a time)
    worker: Worker | None = None  # its process, which holds the model
    state: str = "loading"  # loading | loaded | parked | dead
    from_host: bool = False  # the last load was a swap-in of parked weights
    load_s: float | None = None
    host_mb: float = 0.0  # bytes of its weights, in MB
    threads: int = 0  # torch's intra-op threads in its process
    busy: int = 0  # requests in flight to its process (an exit then is theirs to report)
    watched: bool = False  # its process's exit is watched on the event loop


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
        for m in models:
            t = m.options.get("forward_timeout_s")
            if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or t <= 0):
                raise ValueError(f"model {m.name}: options.forward_timeout_s must be a number "
                                 f"> 0, got {t!r}")
        self._devices, self._domains = discover(self.config)
        start_fork_server()  # (model processes fork from it: torch is imported there once)
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
        self._loop: asyncio.AbstractEventLoop | None = None

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
        if parked is not None:
            self._unwatch(parked)
            inst.worker, inst.host_mb = parked.worker, parked.host_mb
            parked.worker = None
        else:
            factory = self._factory_blob(spec)
        inst.executor = ThreadPoolExecutor(1, f"gpu-{instance_id}")
        loop = asyncio.get_running_loop()
        inst.busy += 1
        try:
            if parked is not None:
                seconds = await loop.run_in_executor(inst.executor, self._swap_in_sync, inst)
            else:
                seconds = await loop.run_in_executor(
                    inst.executor, self._load_sync, inst, factory)
        except BaseException as exc:
            inst.busy -= 1
            unloaded = self._instances.get(instance_id) is not inst
            if not unloaded:
                del self._instances[instance_id]
                self._book(inst, -1)
            await self._end(inst)
            if unloaded:  # unload (or close) killed it while it was loading
                raise BrokenError(
                    f"instance {instance_id} was unloaded while it was loading") from exc
            if isinstance(exc, BrokenError):
                raise
            hint = ("; its traceback is on the service's stderr (a script that starts the "
                    "engine needs `if __name__ == \"__main__\":`: model processes import it)"
                    if isinstance(exc, _Died) else "")
            raise BrokenError(
                f"instance {instance_id} ({model}): load failed: {exc}{hint}") from exc
        inst.busy -= 1
        if self._instances.get(instance_id) is not inst:  # unloaded (or closed) while loading
            await self._end(inst)
            raise BrokenError(f"instance {instance_id} was unloaded while it was loading")
        inst.state, inst.load_s = "loaded", seconds
        inst.from_host = parked is not None
        self._watch(inst)
        self._costs[model].add_load(seconds, inst.from_host)
        return seconds

    def _load_sync(self, inst: _Instance, factory: bytes | None) -> float:
        """Start the instance's process and build the model there (its devices locked)."""
        if self._instances.get(inst.id) is not inst:
            raise BrokenError(f"instance {inst.id} was unloaded while it was loading")
        inst.worker = Worker()
        device = str(torch_device(self._devices[inst.devices[0]]))
        msg = ("load", inst.spec, factory, device, self._threads(inst),
               self.config.max_length, self.config.max_batch_tokens)
        with self._device_locks(inst.devices):
            reply = self._call(inst, msg, None)
        seconds, inst.host_mb, inst.threads = reply[1], reply[2], reply[3]
        return float(seconds)

    def _swap_in_sync(self, inst: _Instance) -> float:
        device = str(torch_device(self._devices[inst.devices[0]]))
        with self._device_locks(inst.devices):
            reply = self._call(inst, ("to", device, self._threads(inst), False), None)
        inst.threads = reply[2]
        return float(reply[1])

    def _call(self, inst: _Instance, msg: tuple[Any, ...], timeout: float | None) -> tuple[Any, ...]:
        """One request to the instance's process. An error the model raised comes back as its
        reply ("error", kills, text, broken); a dead or hung process raises `_Died`."""
        worker = inst.worker
        if worker is None:
            raise _Died("its process had ended")
        try:
            reply = worker.call(msg, timeout)
        except WorkerGone as exc:
            raise _Died(str(exc)) from None
        except WorkerTimeout:
            worker.kill()
            raise _Died(f"its forward pass ran past its {timeout:g} s deadline "
                        f"(forward_timeout_s); process {worker.pid} was killed") from None
        if reply[0] == "error":
            if reply[1]:  # the instance's state cannot be trusted: its process ends
                worker.kill()
                raise _Died(str(reply[2]))
            if msg[0] != "score":
                raise BrokenError(reply[2]) if reply[3] else RuntimeError(reply[2])
        return reply

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        """Free the instance's devices; with ``park``, keep its weights in host memory (its
        process stays, holding the built model); else its process ends.

        Returns whether the weights were parked (False when not asked, when they do not fit
        ``host_park_limit_mb``, or for an unknown or still-loading instance).
        """
        inst = self._instances.pop(instance_id, None)
        if inst is None:
            return False
        self._batcher.drop(instance_id, f"instance {instance_id} was unloaded")
        parked = False
        try:
            if inst.state == "loaded" and inst.executor is not None:
                # (after the batch its process runs now, if any: the executor runs in order)
                loop = asyncio.get_running_loop()
                inst.busy += 1
                try:
                    parked = await loop.run_in_executor(inst.executor, self._park_sync, inst, park)
                finally:
                    inst.busy -= 1
        finally:
            self._book(inst, -1)
            if inst.executor is not None:
                inst.executor.shutdown(wait=False)
            inst.executor = None
        if parked and self._admit_parked(inst):
            inst.state = "parked"
            self._parked[instance_id] = inst
            return True
        await self._end(inst)
        return False

    def _park_sync(self, inst: _Instance, park: bool) -> bool:
        """CUDA: move the weights to (pinned) host memory in its process. CPU-backed: nothing
        moves (the built model object already lives in host RAM). False if its process died."""
        if not park:
            return False
        if self._devices[inst.devices[0]].kind != "cuda":
            return inst.worker is not None and inst.worker.alive()
        try:
            self._call(inst, ("to", "cpu", 0, self.config.pin_host_memory), None)
        except (_Died, BrokenError, RuntimeError) as exc:
            log.warning("instance %s could not be parked: %s", inst.id, exc)
            return False
        return True

    async def run_batch(self, instance_id: str, actions: Sequence[ActionSpec]) -> BatchOutcome:
        """Score ``actions`` in one batch; per-action reasons for the ones that cannot run."""
        self._check_open()
        inst = self._instances.get(instance_id)
        if inst is None or inst.state != "loaded" or inst.executor is None:
            raise BrokenError(f"instance {instance_id} is not loaded on this node")
        failed: dict[str, str] = {}
        good: list[ActionSpec] = []
        reqs: list[ScoreRequest | RetrieveRequest] = []  # parsed once here, typed to the process
        for a in actions:
            if a.model is not None and a.model != inst.spec.name:
                failed[a.id] = f"action names model {a.model!r}; instance serves {inst.spec.name!r}"
                continue
            try:
                reqs.append(request_for(inst.spec, a.payload))
            except ValueError as exc:
                failed[a.id] = f"bad payload: {exc}"
                continue
            good.append(a)
        if not good:
            return BatchOutcome({}, failed, 0.0, 0)
        loop = asyncio.get_running_loop()
        inst.busy += 1
        try:
            reply = await loop.run_in_executor(inst.executor, self._score_sync, inst, reqs)
        except _Died as exc:
            self._worker_died(inst, str(exc))  # raises ModelWorkerDied
            raise
        finally:
            inst.busy -= 1
        if reply[0] == "error":
            # the model itself failed: every action of the batch did; the instance stays
            reason = f"model {inst.spec.name} failed: {reply[2]}"
            failed.update({a.id: reason for a in good})
            return BatchOutcome({}, failed, 0.0, 0)
        outs, latency = reply[1], float(reply[2])
        self._costs[inst.spec.name].add_batch(len(good), latency)
        return BatchOutcome(
            {a.id: o for a, o in zip(good, outs, strict=True)}, failed, latency, len(good)
        )

    def _score_sync(self, inst: _Instance,
                    reqs: list[ScoreRequest | RetrieveRequest]) -> tuple[Any, ...]:
        """One forward in the instance's process, under its deadline and its devices' locks;
        the latency is the process's own measure of the forward (transfer excluded)."""
        timeout = float(inst.spec.options.get("forward_timeout_s",
                                              self.config.forward_timeout_s))
        with self._device_locks(inst.devices):
            return self._call(inst, ("score", reqs), timeout)

    def _worker_died(self, inst: _Instance, cause: str, *, raise_: bool = True) -> None:
        """The instance's process died (or was killed: hung, or a sticky device error): drop
        the instance (its devices free now), tell the ``on_worker_death`` hook, raise
        `ModelWorkerDied` (when a batch call saw it)."""
        iid = inst.id
        reason = (f"the worker of model instance {iid} ({inst.spec.name}) died mid-batch: "
                  f"{cause}")
        if self._instances.get(iid) is not inst or inst.state == "dead":
            if raise_:
                raise ModelWorkerDied(iid, reason)
            return
        del self._instances[iid]
        self._book(inst, -1)
        self._batcher.drop(iid, reason)
        if inst.executor is not None:
            inst.executor.shutdown(wait=False)
        inst.executor, inst.state = None, "dead"
        self._unwatch(inst)
        worker, inst.worker = inst.worker, None
        if worker is not None:
            worker.kill()
            threading.Thread(target=worker.stop, name=f"reap-{iid}", daemon=True).start()
        self.worker_deaths += 1
        self.last_worker_death = reason
        log.warning("%s; instance dropped", reason)
        hook = self.on_worker_death
        if hook is not None:
            try:
                hook(iid, reason)
            except Exception:
                log.exception("on_worker_death hook failed for %s", iid)
        if raise_:
            raise ModelWorkerDied(iid, reason)

    def crash_worker(self, instance_id: str, sig: int = signal.SIGKILL) -> bool:
        """Fault injection (tests, benchmarks/bench_faults.py): send ``sig`` (SIGKILL: what the
        OOM killer does) to the process of ``instance_id``. False when it has none running."""
        inst = self._instances.get(instance_id) or self._parked.get(instance_id)
        worker = inst.worker if inst is not None else None
        if worker is None or not worker.alive():
            return False
        worker.kill(sig)
        return True

    def worker_pid(self, instance_id: str) -> int | None:
        """The pid of the process that holds ``instance_id``'s model (None: it has none)."""
        inst = self._instances.get(instance_id) or self._parked.get(instance_id)
        return inst.worker.pid if inst is not None and inst.worker is not None else None

    def worker_threads(self, instance_id: str) -> int:
        """torch's intra-op thread count in the instance's process (its devices' budget)."""
        inst = self._instances.get(instance_id)
        return inst.threads if inst is not None else 0

    def health(self) -> dict[str, Any]:
        """Supervision counters: worker deaths and the last one's reason."""
        return {"model_worker_deaths": self.worker_deaths,
                "last_model_worker_death": self.last_worker_death}

    async def submit(self, instance_id: str, action: ActionSpec) -> Outcome:
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

    async def start(self) -> None:
        """Nothing to start: instances load on demand (`load`)."""

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._batcher.aclose()
        for iid in list(self._instances):
            await self.unload(iid, park=False)
        while self._parked:
            await self._end(self._parked.popitem()[1])

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
            self._end_soon(old)
        return True

    # ---- processes ---------------------------------------------------------------------------
    def _threads(self, inst: _Instance) -> int:
        return self.config.threads_per_device * len(inst.devices)

    def _factory_blob(self, spec: ModelSpec) -> bytes | None:
        """The model's factory, pickled for its process (cloudpickle: closures travel too)."""
        factory: Factory | None = self._factories.get(spec.name)
        if factory is None:
            return None
        import cloudpickle

        try:
            return bytes(cloudpickle.dumps(factory))
        except Exception as exc:
            raise BrokenError(f"model {spec.name}: its factory cannot be sent to a model "
                              f"process: {type(exc).__name__}: {exc}") from exc

    def _watch(self, inst: _Instance) -> None:
        """Notice its process's exit while nothing is asked of it (an idle instance killed)."""
        if inst.worker is None or inst.watched:
            return
        asyncio.get_running_loop().add_reader(inst.worker.sentinel, self._exited, inst)
        inst.watched = True
        self._loop = asyncio.get_running_loop()

    def _unwatch(self, inst: _Instance) -> None:
        if inst.watched and inst.worker is not None and self._loop is not None:
            self._loop.remove_reader(inst.worker.sentinel)
        inst.watched = False

    def _exited(self, inst: _Instance) -> None:
        self._unwatch(inst)
        if inst.busy:
            return  # the request in flight reports it
        if inst.state == "parked":
            if self._parked.get(inst.id) is inst:
                del self._parked[inst.id]
            log.warning("parked instance %s dropped: its process ended", inst.id)
            self._end_soon(inst)
        elif inst.state == "loaded" and inst.worker is not None:
            self._worker_died(inst, inst.worker.ended(), raise_=False)

    async def _end(self, inst: _Instance) -> None:
        """End the instance's process (killed and reaped)."""
        self._unwatch(inst)
        worker, inst.worker = inst.worker, None
        inst.state = "dead"
        if worker is not None:
            await asyncio.to_thread(worker.stop)

    def _end_soon(self, inst: _Instance) -> None:
        self._unwatch(inst)
        worker, inst.worker = inst.worker, None
        if worker is not None:
            worker.kill()
            threading.Thread(target=worker.stop, daemon=True).start()


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
