"""NodeHost: one node's resource managers, and the execution of the core's commands on it.

Invariant: for every command it accepts, a NodeHost emits exactly the events the executor
contract promises (one ActionStarted then one ActionFinished per StartAction, one BatchFinished
per RunBatch, one ModelLoaded per LoadModel, one ModelUnloaded per UnloadModel); a failure of a
manager becomes a failed outcome event, never an exception out of `submit`. One event comes
unasked: a ModelUnloaded with a ``reason`` when an instance's worker died (the GPU manager's
``on_worker_death``), emitted before the BatchFinished of the batch it died in. Event times are this
host's ``time.monotonic()``; the engine re-stamps them on its own clock when they arrive.

A NodeHost holds no global state and assumes only that it runs inside one asyncio loop, so the
Ray executor can host one inside a NodeAgent actor unchanged (its ``emit`` then buffers events
for the driver to collect).

Environment images (issue 17): the host reports every image its cache holds as warm state
(``WarmPoolReport(node, "image:NAME", 1)``; 0 once removed), so the core opens an image's
sessions where the image already is. An image the cache lacks is fetched on first use, once,
before the session or action that needs it: pulled from a peer node that holds it
(``image_peers``, `set_image_peers`: only the layers this cache lacks travel, in chunks, see
`pull_image`), else imported from its source path when the host knows one (``images``, or
`add_image_source`). That session's first action (or that one-shot action) reports the seconds
it waited as ``image_import_s`` in its result, and for a pull what travelled as
``image_pull`` (``from``, ``s``, ``layers_sent``, ``layers_had``, ``bytes``). A pull in flight
and the last ones are in ``info()["image_transfers"]`` (so in /v1/cluster), with a log line at
its start and end; what this node sent its peers is ``info()["image_served"]``.

Resizes (``ResizeAction``) of a CPU action are never lost while it runs: one that comes before
the action reaches the CPU manager (its session still opening, its image importing) becomes the
allotment it starts with; the manager keeps one that comes before the action's sandbox is
registered and sets it then. ``info()["resizes"]`` counts them: ``applied`` (a running
sandbox's quota rewritten), ``deferred`` (kept until the action's sandbox registers) and
``dropped`` (the action had ended here, or never came).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core import commands as C
from ..core import events as E
from ..core.actions import ActionSpec, Status
from ..core.cluster import ModelSpec, NodeSpec
from ..core.errors import ClosedError, ImageError, ImagesUnsupported, InvalidAction
from ..core.images import check_name, warm_key
from ..core.resources import CPU, GPU, GPU_MEMORY_MB, MEMORY_MB, Resources
from ..kinds import CodeRequest, code_request
from ..managers.base import CodeRunner, ImageCache, ModelHost
from ..managers.cpu.config import CpuManagerConfig
from ..managers.gpu.config import GpuManagerConfig
from .executor import SessionOpened
from .images import session_image

if TYPE_CHECKING:
    from .images import ImagePeer

log = logging.getLogger(__name__)

Emit = Callable[[E.Event], None]


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
    """Hosts the CPU manager (and the GPU manager when models are configured) of one node."""

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
        self._emit = emit
        self._capacity_override = capacity
        self._cpu_config, self._gpu_config = cpu_config or CpuManagerConfig(), gpu_config
        self._models = tuple(models)
        self._gpu_factories = gpu_factories
        self._labels = dict(labels or {})
        self._cpu = cpu_manager  # (made by `start` unless given)
        self.gpu: ModelHost | None = gpu_manager
        self.gpu_note = ""  # why there is no GPU manager, when there is none
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._opening: dict[str, asyncio.Event] = {}  # sessions whose OpenSession is in flight
        self._closed = False
        self.spec: NodeSpec | None = None
        self.warm_report_s = 0.05  # how often warm sandboxes are counted and reported on change
        # memory that follows use (issue 26): every `memory_report_s` the open sessions' memory
        # is read (their cgroups' memory.current and memory.peak) and reported to the core
        # (MemoryReport) with each one's highest over the last `memory_window_s`
        self.memory_report_s = 0.5
        self.memory_window_s = 10.0
        # measured use above this x the node's memory: idle (frozen) sessions' page cache is
        # reclaimed before the report (`CpuManager.reclaim_idle`), below the core's watermark
        # (0.9, which evicts), so the core evicts only for what they cannot give back
        self.memory_reclaim_at = 0.85
        self.memory_last: dict[str, Any] = {}  # the last report, for info()
        self.image_sources: dict[str, str] = dict(images)  # name -> a path this node can read
        self._eager_images = tuple(eager_images)  # of those, imported at start
        self._importing: dict[str, asyncio.Future[dict[str, Any] | None]] = {}  # name -> fetch
        # session -> what its open waited for (``image_import_s``, ``image_pull``), for its
        # first action's result
        self._image_note: dict[str, dict[str, Any]] = {}
        # images between nodes (issue 26): who holds an image this node may lack, chunk size
        self.image_peers: dict[str, list[ImagePeer]] = {}
        self.image_chunk_bytes = 64 << 20
        self.transfers: dict[str, dict[str, Any]] = {}  # image -> its last pull's progress
        self.served = {"layers": 0, "bytes": 0}  # what peers pulled from this node
        self._layer_pulls: dict[str, asyncio.Future[bool]] = {}  # layer key -> its pull
        self._streams: dict[str, list[Any]] = {}  # stream id -> [LayerStream, last use]
        self._stream_ids = itertools.count(1)
        # CPU actions started here and not yet handed to the CPU manager -> their allotment,
        # which a resize meanwhile replaces (`_resize`)
        self._handing: dict[str, Resources] = {}
        self.resizes = {"applied": 0, "deferred": 0, "dropped": 0}  # ResizeActions, by outcome

    # ---- life ------------------------------------------------------------------------------

    @property
    def cpu(self) -> CodeRunner:
        """The CPU manager (`start` makes one unless one was given)."""
        if self._cpu is None:
            raise ClosedError(f"node {self.name}: not started")
        return self._cpu

    async def start(self) -> NodeSpec:
        """Start the managers and return what the node offers."""
        if self._cpu is None:
            self._cpu = self._make_cpu()
        await self.cpu.start()
        if self.gpu is None and self._models and self._gpu_config is not None:
            self.gpu = self._make_gpu()
        if self.gpu is not None and hasattr(self.gpu, "on_worker_death"):
            setattr(self.gpu, "on_worker_death", self._model_worker_died)  # noqa: B010
        if self.gpu is not None and hasattr(self.gpu, "start"):
            await self.gpu.start()
        self.spec = self._node_spec()
        for name in self._eager_images:
            path = self.image_sources.get(name)
            if path is None:
                raise ValueError(f"node {self.name}: images: {name}: no path given")
            try:
                await self.import_image(path, name)
            except Exception as exc:
                raise ValueError(f"node {self.name}: images: {name} ({path}): {exc}") from None
        self._report_images()
        self._spawn("warm-reporter", self._report_warm())
        self._spawn("memory-reporter", self._report_memory())
        return self.spec

    def _make_cpu(self) -> CodeRunner:
        from ..managers.cpu import CpuManager

        return CpuManager(self._cpu_config)

    def _make_gpu(self) -> ModelHost | None:
        try:
            from ..managers.gpu import GpuManager
        except Exception as exc:  # the [gpu] extra is missing
            self.gpu_note = f"GPU manager unavailable ({type(exc).__name__}: {exc})"
            log.warning("node %s: %s; reward models disabled", self.name, self.gpu_note)
            return None
        cfg = self._gpu_config or GpuManagerConfig()
        from ..managers.gpu.hosts import with_engines  # judge engines (kind genjudge) beside it

        return with_engines(GpuManager(cfg, self._models, factories=self._gpu_factories),
                            self._models)

    def _node_spec(self) -> NodeSpec:
        cap = machine_capacity()
        domains: tuple[tuple[int, ...], ...] = ()
        if self.gpu is not None:
            gcap = Resources(self.gpu.node_capacity())
            cap = cap + {k: v for k, v in gcap.items() if k in (GPU, GPU_MEMORY_MB)}
            cap = cap + {k: v for k, v in gcap.items() if k not in (GPU, GPU_MEMORY_MB, CPU, MEMORY_MB)}
            with contextlib.suppress(Exception):
                domains = tuple(tuple(int(i) for i in d) for d in self.gpu.nvlink_domains())
        if self._capacity_override is not None:
            cap = Resources({**cap.as_dict(), **self._capacity_override.as_dict()})
        ngpu = int(cap.get(GPU))
        domains = tuple(d for d in domains if d and max(d) < ngpu)
        return NodeSpec(self.name, cap, self.pool, domains, self._labels)

    async def aclose(self) -> None:
        """Stop everything; running actions end as CANCELLED."""
        self._closed = True
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for sid in list(self._streams):
            with contextlib.suppress(Exception):
                await self.close_layer_stream(sid)
        for mgr in (self.gpu, self._cpu):
            if mgr is not None:
                with contextlib.suppress(Exception):
                    await mgr.aclose()

    # ---- commands --------------------------------------------------------------------------

    def submit(self, cmd: C.Command) -> None:
        """Start executing one command; its outcome comes back through ``emit``."""
        if isinstance(cmd, C.StartAction):
            if not cmd.action.kind.uses_model:
                self._handing[cmd.action.id] = cmd.allotment
            self._spawn(cmd.action.id, self._start_action(cmd))
        elif isinstance(cmd, C.RunBatch):
            self._spawn(f"batch:{cmd.batch_id}", self._run_batch(cmd))
        elif isinstance(cmd, C.LoadModel):
            self._spawn(f"load:{cmd.instance_id}", self._load(cmd))
        elif isinstance(cmd, C.UnloadModel):
            self._spawn(f"unload:{cmd.instance_id}", self._unload(cmd))
        elif isinstance(cmd, C.CancelAction):
            self._spawn(f"cancel:{cmd.action_id}", self._cancel(cmd))
        elif isinstance(cmd, C.ResizeAction):
            self._spawn(f"resize:{cmd.action_id}", self._resize(cmd))
        elif isinstance(cmd, C.OpenSession):
            self._opening[cmd.session_id] = asyncio.Event()
            self._spawn(f"open:{cmd.session_id}", self._open_session(cmd))
        elif isinstance(cmd, C.CloseSession):
            self._spawn(f"close:{cmd.session_id}", self._close_session(cmd))
        elif isinstance(cmd, C.ResizeWarmPool):
            with contextlib.suppress(Exception):
                self.cpu.set_warm_target(cmd.key, cmd.size)
        else:
            log.warning("node %s: ignoring unknown command %r", self.name, cmd)

    async def _report_warm(self) -> None:
        """Tell the core how many warm sandboxes wait here (WarmPoolReport), on every change.

        The CPU manager's warm sandboxes serve every language, so each language is reported
        with the same count; the core uses it to prefer this node and to count warm starts.
        """
        try:
            keys = tuple(self.cpu.languages())
        except Exception:
            return
        last = -1
        while not self._closed:
            try:
                n = sum(self.cpu.warm_state().values())
            except Exception:
                return
            if n != last:
                now = time.monotonic()
                for key in keys:
                    self.emit(E.WarmPoolReport(now, self.name, key, n))
                last = n
            await asyncio.sleep(self.warm_report_s)

    async def _report_memory(self) -> None:
        """Tell the core what each open session's sandbox uses (MemoryReport), every
        `memory_report_s` while a session is open: its memory now and its highest over the
        last `memory_window_s` (the peak between two samples from its cgroup's memory.peak, so
        a burst between them counts), and what the other sandboxes use now."""
        window: dict[str, collections.deque[tuple[float, float]]] = {}
        mb = float(1 << 20)
        while not self._closed:
            await asyncio.sleep(self.memory_report_s)
            try:
                use, other = self.cpu.memory_use()
            except Exception as exc:  # (a manager that cannot tell: nothing reported)
                log.warning("node %s: memory use unreadable: %s; not reported", self.name, exc)
                return
            use, other = await self._reclaim_if_short(use, other)
            now = time.monotonic()
            for sid in [s for s in window if s not in use]:
                del window[sid]
            if not use:
                continue
            current: dict[str, float] = {}
            peak: dict[str, float] = {}
            for sid, (cur, top) in use.items():
                w = window.setdefault(sid, collections.deque())
                w.append((now, top / mb))
                while w and w[0][0] < now - self.memory_window_s:
                    w.popleft()
                current[sid] = round(cur / mb, 3)
                peak[sid] = round(max(p for _, p in w), 3)
            self.memory_last = {"sessions_mb": round(sum(current.values()), 1),
                                "other_mb": round(other / mb, 1)}
            self.emit(E.MemoryReport(now, self.name, current, peak, round(other / mb, 3)))

    async def _reclaim_if_short(self, use: dict[str, tuple[int, int]], other: int
                                ) -> tuple[dict[str, tuple[int, int]], int]:
        """Above `memory_reclaim_at` of the node's memory: idle sessions' page cache
        reclaimed down to it (their state kept, frozen), and the use read again."""
        cap = self.spec.capacity.get("memory_mb") if self.spec is not None else 0.0
        used = other + sum(cur for cur, _ in use.values())
        if not cap or used <= self.memory_reclaim_at * cap * (1 << 20):
            return use, other
        try:
            freed = await self.cpu.reclaim_idle(int(used - self.memory_reclaim_at * cap * (1 << 20)))
            if freed:
                log.info("node %s: short of memory: %d MB of idle sessions' page cache "
                         "reclaimed", self.name, freed >> 20)
                return self.cpu.memory_use()
        except Exception as exc:
            log.warning("node %s: reclaiming idle sessions' memory: %s", self.name, exc)
        return use, other

    def _spawn(self, key: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        if key in self._tasks:
            key = f"{key}#{id(task)}"
        self._tasks[key] = task
        def forget(_t: asyncio.Task[Any], k: str = key) -> None:
            self._tasks.pop(k, None)

        task.add_done_callback(forget)

    def emit(self, event: E.Event) -> None:
        if not self._closed or isinstance(event, E.ActionFinished | E.BatchFinished):
            self._emit(event)

    async def _call(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            log.warning("node %s: %s", self.name, exc)

    async def _resize(self, cmd: C.ResizeAction) -> None:
        if cmd.action_id in self._handing:  # not at the CPU manager yet: it starts with this
            self._handing[cmd.action_id] = cmd.allotment
            outcome = "deferred"
        else:
            try:
                outcome = await self.cpu.resize(cmd.action_id, cmd.allotment)
            except Exception as exc:
                log.warning("node %s: resize of %s: %s", self.name, cmd.action_id, exc)
                outcome = "dropped"
        self.resizes[outcome if outcome in self.resizes else "dropped"] += 1

    async def _start_action(self, cmd: C.StartAction) -> None:
        try:
            await self._run_action(cmd)
        finally:
            self._handing.pop(cmd.action.id, None)  # (one that never reached the manager)

    async def _run_action(self, cmd: C.StartAction) -> None:
        a = cmd.action
        opening = self._opening.get(a.session) if a.session else None
        if opening is not None:  # the session's OpenSession came in the same breath
            await opening.wait()
        note = self._image_note.pop(a.session, {}) if a.session and self._image_note else {}
        self.emit(E.ActionStarted(time.monotonic(), a.id, self.name))
        t0 = time.monotonic()
        try:
            if a.kind.uses_model:
                raise RuntimeError(f"{a.kind.value} actions run in batches (RunBatch), not alone")
            a, code = _typed(a)
            image = code.image if code is not None and a.session is None else None
            if image is not None and (self.image_sources or self.image_peers):
                note = await self.ensure_image(image)
            # handed over: from here the CPU manager takes its resizes (no await in between)
            rr = await self.cpu.run(a, self._handing.pop(a.id, cmd.allotment))
            if note:
                rr = dataclasses.replace(rr, image_fetch=note)
            self.emit(E.ActionFinished(time.monotonic(), a.id, rr.action_status, rr, rr.reason,
                                       time.monotonic() - t0, rr.cpu_time))
            if a.session and not self.cpu.has_session(a.session):
                # the manager closed it (its sandbox died): the core and the engine learn it
                # now, rather than routing the next action to a session that is gone
                self.emit(E.SessionClosed(time.monotonic(), a.session,
                                          f"closed by node {self.name}: {rr.reason}"))
        except asyncio.CancelledError:
            self.emit(E.ActionFinished(time.monotonic(), a.id, Status.CANCELLED, None,
                                       "node shut down", time.monotonic() - t0))
            raise
        except Exception as exc:
            log.exception("node %s: action %s broke", self.name, a.id)
            self.emit(E.ActionFinished(time.monotonic(), a.id, Status.FAILED, None,
                                       f"{type(exc).__name__}: {exc}", time.monotonic() - t0))

    async def _run_batch(self, cmd: C.RunBatch) -> None:
        ids = [a.id for a in cmd.actions]
        try:
            if self.gpu is None:
                raise RuntimeError(self.gpu_note or f"node {self.name} has no GPU manager")
            out = await self.gpu.run_batch(cmd.instance_id, cmd.actions)
            self.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id,
                                      dict(out.outputs), dict(out.failed), out.latency_s))
        except asyncio.CancelledError:
            failed = dict.fromkeys(ids, "node shut down")
            self.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id, {}, failed))
            raise
        except Exception as exc:
            failed = dict.fromkeys(ids, f"{type(exc).__name__}: {exc}")
            self.emit(E.BatchFinished(time.monotonic(), cmd.batch_id, cmd.instance_id, {}, failed))

    def _model_worker_died(self, instance_id: str, reason: str) -> None:
        """The GPU manager dropped an instance whose worker died: the scheduler learns it first
        (an unsolicited ModelUnloaded with the reason: it requeues the batch and loads a
        replacement), then the batch call fails (its BatchFinished comes after)."""
        self.emit(E.ModelUnloaded(time.monotonic(), instance_id, False, reason))

    async def _load(self, cmd: C.LoadModel) -> None:
        try:
            if self.gpu is None:
                raise RuntimeError(self.gpu_note or f"node {self.name} has no GPU manager")
            if all(m.name != cmd.model for m in self._models):
                raise KeyError(f"model {cmd.model!r} is not configured on node {self.name}")
            load_s = await self.gpu.load(cmd.instance_id, cmd.model, tuple(cmd.devices),
                                         from_host=cmd.from_host)
            # A swap-in falls back to a cold load when nothing was parked: report what happened.
            swapped = bool(self.gpu.resident().get(cmd.instance_id, {}).get("from_host", False))
            self.emit(E.ModelLoaded(time.monotonic(), cmd.instance_id, True, load_s, swapped))
        except Exception as exc:
            self.emit(E.ModelLoaded(time.monotonic(), cmd.instance_id, False, None, cmd.from_host,
                                    f"{type(exc).__name__}: {exc}"))

    async def _unload(self, cmd: C.UnloadModel) -> None:
        parked = False
        try:
            if self.gpu is not None:
                # False when the weights did not fit the host-memory limit and were dropped.
                parked = bool(await self.gpu.unload(cmd.instance_id, park=cmd.park))
        except Exception as exc:
            log.warning("node %s: unload %s: %s", self.name, cmd.instance_id, exc)
        self.emit(E.ModelUnloaded(time.monotonic(), cmd.instance_id, parked))

    async def _cancel(self, cmd: C.CancelAction) -> None:
        try:
            await self.cpu.cancel(cmd.action_id)
        except Exception as exc:
            log.debug("node %s: cancel %s: %s", self.name, cmd.action_id, exc)

    async def _open_session(self, cmd: C.OpenSession) -> None:
        try:
            img = session_image(cmd)  # (the engine's attachment, carried by the core)
            if img is not None:
                note = await self.ensure_image(img.image)
                if note:
                    self._image_note[cmd.session_id] = note
            if img is None:
                await self.cpu.open_session(cmd.session_id, cmd.demand, cmd.ttl_s)
            else:
                await self.cpu.open_session(cmd.session_id, cmd.demand, cmd.ttl_s,
                                            image=img.image, layer_mb=img.layer_mb,
                                            owner=img.owner)
            self.emit(SessionOpened(time.monotonic(), cmd.session_id, self.name))
        except Exception as exc:
            self.emit(E.SessionClosed(time.monotonic(), cmd.session_id,
                                      f"could not open: {type(exc).__name__}: {exc}"))
        finally:
            ev = self._opening.pop(cmd.session_id, None)
            if ev is not None:
                ev.set()

    async def _close_session(self, cmd: C.CloseSession) -> None:
        opening = self._opening.get(cmd.session_id)
        if opening is not None:
            await opening.wait()
        self._image_note.pop(cmd.session_id, None)
        await self._call(self.cpu.close_session(cmd.session_id))

    # ---- environment images ----------------------------------------------------------------

    def _store(self) -> ImageCache:
        store = self._images()
        if store is None:
            raise ImagesUnsupported(f"node {self.name}: no CPU manager with an image cache")
        return store

    def _images(self) -> ImageCache | None:
        """This node's image cache (None: no CPU manager, or one without a cache)."""
        return self._cpu.images if self._cpu is not None else None

    def _report_images(self) -> None:
        """Every image the cache holds, as warm state for the core."""
        store = self._images()
        if store is None:
            return
        now = time.monotonic()
        with contextlib.suppress(Exception):
            for img in store.list_images():
                self.emit(E.WarmPoolReport(now, self.name, warm_key(img.name), 1))

    async def import_image(self, path: str, name: str) -> Any:
        """Import ``path`` as ``name`` into this node's cache now; remember the source."""
        store = self._store()
        try:
            img = await asyncio.to_thread(store.import_path, path, name)
        except ImageError as exc:  # (no host path in what a client reads: issue 35, L2)
            raise _redacted(exc, path, store.root) from None
        self.image_sources[name] = path
        self.emit(E.WarmPoolReport(time.monotonic(), self.name, warm_key(name), 1))
        return img

    def add_image_source(self, name: str, path: str) -> dict[str, Any]:
        """Remember where ``name`` comes from, to import it on first use; the path must be
        readable here (ImageError otherwise)."""
        check_name(name)
        if not os.path.isabs(path) or not os.access(path, os.R_OK):
            raise ImageError(f"{path}: not a readable absolute path on this node")
        self.image_sources[name] = path
        return {"path": path, "held": bool(self._store().has(name)), "lazy": True}

    async def ensure_image(self, name: str) -> dict[str, Any]:
        """Fetch ``name`` here unless the cache holds it; what the first action that needed it
        reports: ``{}`` when it was held (or nothing is known of it here: the manager reports
        the missing image itself), else ``image_import_s`` (seconds waited) and, when it was
        pulled from a peer, ``image_pull``. A second user arriving meanwhile waits for the same
        fetch."""
        store = self._images()
        if store is None or store.has(name):
            return {}
        if not self.image_peers.get(name) and name not in self.image_sources:
            return {}
        t0 = time.monotonic()
        fut = self._importing.get(name)
        if fut is None:  # the first user fetches; later ones wait for the same fetch
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieved)
            self._importing[name] = fut
            try:
                fut.set_result(await self._fetch(name))
            except Exception as exc:
                fut.set_exception(exc)
            finally:
                self._importing.pop(name, None)
        pulled = await asyncio.shield(fut)
        out: dict[str, Any] = {"image_import_s": round(time.monotonic() - t0, 6)}
        if pulled:
            out["image_pull"] = pulled
        return out

    async def _fetch(self, name: str) -> dict[str, Any] | None:
        """Pull ``name`` from a peer (its stats), else import it from its path (None)."""
        path = self.image_sources.get(name)
        if self.image_peers.get(name):
            try:
                return await self.pull_image(name)
            except Exception as exc:
                if path is None or not os.access(path, os.R_OK):
                    raise
                log.warning("%s; importing it from %s instead", exc, path)
        if path is None:
            raise ImageError(f"node {self.name}: no source of image {name!r}")
        await self.import_image(path, name)
        return None

    # ---- images between nodes (issue 26, item 3) ---------------------------------------------

    def set_image_peers(self, name: str, peers: Sequence[ImagePeer]) -> dict[str, Any]:
        """The nodes known to hold ``name``: a first use here pulls it from one of them."""
        check_name(name)
        mine = [p for p in peers if p.name != self.name]
        if mine:
            self.image_peers[name] = mine
        else:
            self.image_peers.pop(name, None)
        store = self._images()
        return {"held": bool(store is not None and store.has(name)),
                "peers": [p.name for p in mine]}

    async def pull_image(self, name: str) -> dict[str, Any]:
        """Pull ``name`` from one of its peers (in random order, the next on failure): only
        the layers this cache lacks travel. Returns ``{"from", "s", "layers_sent",
        "layers_had", "bytes"}``; ImageError naming every peer's failure otherwise."""
        store = self._store()
        peers = list(self.image_peers.get(name) or ())
        if not peers:
            raise ImageError(f"node {self.name}: no node is known to hold image {name!r}")
        random.shuffle(peers)  # spread the pulls of many nodes over the holders
        errors = []
        for peer in peers:
            try:
                return await self._pull_from(peer, name, store)
            except Exception as exc:
                log.warning("node %s: pulling image %s from node %s failed: %s",
                            self.name, name, peer.name, exc)
                errors.append(f"from node {peer.name}: {exc}")
        raise ImageError(f"node {self.name}: image {name!r} could not be pulled: "
                         + "; ".join(errors))

    async def _pull_from(self, peer: ImagePeer, name: str, store: ImageCache) -> dict[str, Any]:
        t0 = time.monotonic()
        rec = await peer.manifest(name)
        layers = [str(k) for k in rec.get("layers") or ()]
        sizes = [int(x) for x in rec.get("layer_sizes") or ()]
        size_of = dict(zip(layers, sizes, strict=False))
        missing = [k for k in dict.fromkeys(layers) if not store.has_layer(k)]
        prog: dict[str, Any] = {
            "image": name, "state": "pulling", "from": peer.name, "layers": len(layers),
            "layers_had": len(layers) - len(missing), "layers_sent": 0, "bytes": 0,
            "bytes_expected": sum(size_of.get(k, 0) for k in missing),
            "started_at": round(time.time(), 3), "s": 0.0}
        self.transfers.pop(name, None)
        self.transfers[name] = prog
        while len(self.transfers) > 32:
            del self.transfers[next(iter(self.transfers))]
        log.info("node %s: pulling image %s from node %s: %d of %d layers missing "
                 "(%.1f MiB unpacked)", self.name, name, peer.name, len(missing), len(layers),
                 prog["bytes_expected"] / 2**20)
        try:
            for k in missing:
                if await self._pull_layer(peer, k, prog):
                    prog["layers_sent"] += 1
                else:  # another pull here fetched it meanwhile
                    prog["layers_had"] += 1
            await asyncio.to_thread(store.add_pulled, rec, f"node {peer.name}",
                                    time.monotonic() - t0)
        except Exception as exc:
            prog.update(state="failed", error=str(exc), s=round(time.monotonic() - t0, 6))
            raise
        prog.update(state="done", s=round(time.monotonic() - t0, 6))
        log.info("node %s: pulled image %s from node %s in %.2f s: %d layer(s), %d bytes sent, "
                 "%d layer(s) already here", self.name, name, peer.name, prog["s"],
                 prog["layers_sent"], prog["bytes"], prog["layers_had"])
        self.emit(E.WarmPoolReport(time.monotonic(), self.name, warm_key(name), 1))
        return {k: prog[k] for k in ("from", "s", "layers_sent", "layers_had", "bytes")}

    async def _pull_layer(self, peer: ImagePeer, key: str, prog: dict[str, Any]) -> bool:
        """Layer ``key`` from ``peer`` into the cache; False when another pull here fetched
        it meanwhile (one fetch per layer at a time)."""
        fut = self._layer_pulls.get(key)
        if fut is not None:
            await asyncio.shield(fut)
            return False
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieved)
        self._layer_pulls[key] = fut
        try:
            await self._receive_layer(peer, key, prog)
            fut.set_result(True)
            return True
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else ImageError(repr(exc)))
            raise
        finally:
            self._layer_pulls.pop(key, None)

    async def _receive_layer(self, peer: ImagePeer, key: str, prog: dict[str, Any]) -> None:
        store = self._store()
        spool = await asyncio.to_thread(store.new_spool)
        sid: str | None = None
        try:
            sid = await peer.open_layer(key, self.image_chunk_bytes)
            while chunk := await peer.next_chunk(sid):
                await asyncio.to_thread(spool.write, chunk)
                prog["bytes"] += len(chunk)
            end, sid = await peer.close_layer(sid), None
            await asyncio.to_thread(store.finish_layer, spool, key, str(end.get("digest")),
                                    f"node {peer.name}: layer {key}")
        finally:
            spool.discard()
            if sid is not None:
                with contextlib.suppress(Exception):
                    await peer.close_layer(sid)

    # (the sending side: a peer pulling from this node)
    def image_manifest(self, name: str) -> dict[str, Any]:
        """The record of ``name`` in this cache (ImageError: not held here)."""
        return dict(self._store().get(name).to_dict())

    async def open_layer_stream(self, key: str, chunk_bytes: int) -> str:
        """Start sending layer ``key`` (a stream id); streams idle for 5 minutes are closed."""
        now = time.monotonic()
        for old in [s for s, (_, t) in self._streams.items() if now - t > 300.0]:
            await self.close_layer_stream(old)
        stream = await asyncio.to_thread(self._store().open_layer, key, int(chunk_bytes))
        sid = f"{key[7:19]}-{next(self._stream_ids)}"
        self._streams[sid] = [stream, now]
        return sid

    async def next_layer_chunk(self, sid: str) -> bytes:
        """The stream's next chunk (``b""``: it is whole)."""
        entry = self._streams.get(sid)
        if entry is None:
            raise ImageError(f"node {self.name}: no layer stream {sid!r} (closed or idle)")
        entry[1] = time.monotonic()
        chunk: bytes = await asyncio.to_thread(entry[0].next)
        self.served["bytes"] += len(chunk)
        return chunk

    async def close_layer_stream(self, sid: str) -> dict[str, Any]:
        """End a stream: ``{"digest", "bytes"}`` of what it sent."""
        entry = self._streams.pop(sid, None)
        if entry is None:
            raise ImageError(f"node {self.name}: no layer stream {sid!r} (closed or idle)")
        stream = entry[0]
        await asyncio.to_thread(stream.close)
        if stream.done:
            self.served["layers"] += 1
        return {"digest": stream.digest, "bytes": stream.size}

    def has_image(self, name: str) -> bool:
        """Whether this node's cache holds ``name`` (ImagesUnsupported: no cache here)."""
        return bool(self._store().has(name))

    def image_users(self, name: str) -> int:
        store = self._store()
        return int(store.users(name)) if store.has(name) else 0

    def remove_image(self, name: str) -> bool:
        """Remove ``name`` from the cache and forget its source; False when not held here.
        ImageInUse while a session or action uses it."""
        self.image_sources.pop(name, None)
        self.image_peers.pop(name, None)
        store = self._store()
        if not store.has(name):
            return False
        store.remove(name)
        self.emit(E.WarmPoolReport(time.monotonic(), self.name, warm_key(name), 0))
        return True

    def list_images(self) -> list[dict[str, Any]]:
        store = self._store()
        return [{**i.to_dict(), "in_use": store.users(i.name)} for i in store.list_images()]

    # ---- reporting -------------------------------------------------------------------------

    def readiness(self) -> dict[str, Any]:
        """``ready`` (this node can run actions now: liveness apart), ``not_ready_reason`` when
        not, and the CPU manager's supervision counters (``cpu_health``)."""
        if self._closed:
            return {"ready": False, "not_ready_reason": "the node is closed"}
        cpu = self._cpu
        h = _safe(cpu.health, {}) if cpu is not None else {}
        ready = bool(h.get("ready", cpu is not None))
        out: dict[str, Any] = {"ready": ready}
        if not ready:
            out["not_ready_reason"] = str(h.get("reason") or "the CPU manager is not running")
        if h:
            out["cpu_health"] = _jsonable(h)
        if self.gpu is not None:
            out["gpu_health"] = _jsonable(_safe(self.gpu.health, {}))
        return out

    def info(self) -> dict[str, Any]:
        """Warm pools, resident models, isolation report and languages, JSON-ready."""
        d: dict[str, Any] = {"name": self.name, "pool": self.pool}
        d["warm_pools"] = _safe(lambda: dict(self.cpu.warm_state()), {})
        d["isolation"] = _safe(lambda: _jsonable(self.cpu.isolation_report()), {})
        d["languages"] = _safe(lambda: sorted(self.cpu.languages()), [])
        d.update(self.readiness())
        gpu = self.gpu
        d["resident_models"] = _safe(lambda: _jsonable(gpu.resident()), []) if gpu else []
        d["gpu_manager"] = self.gpu is not None
        d["resizes"] = dict(self.resizes)
        if self.memory_last:
            d["memory_use"] = dict(self.memory_last)
        if self._images() is not None:
            d["images"] = _safe(self.list_images, [])
            d["image_sources"] = dict(self.image_sources)
            d["image_peers"] = {n: [p.name for p in ps] for n, ps in self.image_peers.items()}
            d["image_transfers"] = [dict(t) for t in self.transfers.values()]
            d["image_served"] = dict(self.served)
        if self.gpu_note:
            d["gpu_note"] = self.gpu_note
        return d


def _redacted(exc: ImageError, path: str, root: object) -> ImageError:
    """``exc`` with the host paths it may name replaced: the archive's ``path`` by "the
    archive", the image cache's ``root`` (its temporary unpack directories, its layers) by
    "<image cache>"."""
    msg = str(exc)
    if path:
        msg = msg.replace(path, "the archive")
    if isinstance(root, str) and root:
        for r in {root, os.path.realpath(root)}:
            msg = msg.replace(r, "<image cache>")
    if msg != str(exc):
        exc.args = (msg,)  # (the same exception, its class and attributes kept: ImageTooLarge
    return exc             #  stays a 413)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """(a fetch's failure is re-raised to whoever awaits it; none may be left unread)"""
    if not fut.cancelled():
        fut.exception()


def _typed(a: ActionSpec) -> tuple[ActionSpec, CodeRequest | None]:
    """``a`` with its payload typed, and that request: parsed here, once, when it came as a
    plain mapping (`kinds.code_request`); ``a`` as it is and None when the payload is not a
    valid request (the CPU manager reports why)."""
    if isinstance(a.payload, CodeRequest):
        return a, a.payload
    try:
        req = code_request(a.kind, a.payload)
    except InvalidAction:
        return a, None
    return dataclasses.replace(a, payload=req), req


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


__all__ = ["NodeHost", "machine_capacity"]
