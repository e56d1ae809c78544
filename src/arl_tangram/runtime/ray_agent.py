"""NodeAgent: the long-lived Ray actor that hosts one node's `NodeHost`.

Invariant: every event the hosted NodeHost emits is queued once and handed to exactly one `poll`
call, in emission order; commands run in the order their batches arrived. The agent decides
nothing: it is a mailbox in front of a NodeHost (the driver's `RayExecutor` talks to it with one
batched ``submit`` call per burst of commands and one outstanding long-``poll`` for results).

This module does not import ``ray``: `NodeAgent` is a plain class, made an actor by the executor
with ``ray.remote(NodeAgent)``, so it can also be unit tested in-process.

Topology on Ray comes from node labels (see docs/ray.md)::

    tangram.io/pool             pool name (default: "gpu" if the node has GPUs, else "cpu")
    tangram.io/nvlink-domains   NVLink domains, devices joined by "-", domains by "_": "0-1-2-3_4-5-6-7"
    tangram.io/gpu-memory-mb    device memory per GPU in MB (else the GPU manager measures it)

or, where labels are not available, from custom resources: ``tangram_nvlink_domain_size: k``
(consecutive groups of k devices) and ``tangram_<dim>: amount`` (an extra capacity dimension).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..core.actions import Status
from ..core.cluster import ModelSpec, NodeSpec
from ..core.commands import Command, StartAction
from ..core.errors import ImageError, ImagesUnsupported
from ..core.events import ActionFinished, ActionStarted, Event
from ..core.resources import CPU, GPU, GPU_MEMORY_MB, MEMORY_MB, Resources
from .images import Fetched, ImagePeer, NodeImages, PeersSet, RemoteError, unwrap

log = logging.getLogger(__name__)
T = TypeVar("T")

LABEL_POOL = "tangram.io/pool"
LABEL_NVLINK = "tangram.io/nvlink-domains"
LABEL_GPU_MEMORY = "tangram.io/gpu-memory-mb"
RESOURCE_DOMAIN_SIZE = "tangram_nvlink_domain_size"
RESOURCE_PREFIX = "tangram_"
_HEAD_RESOURCE = "node:__internal_head__"


class Host(Protocol):
    """What the agent needs of a node host (`runtime.node.NodeHost` is one)."""

    async def start(self) -> NodeSpec: ...

    def submit(self, cmd: Command) -> None: ...

    def info(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...

    @property
    def images(self) -> NodeImages | None:
        """The node's image cache (None: a host without one)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSetup:
    """Everything an agent needs to build its node's host (pickled to the node)."""

    name: str  # node name the core sees (the Ray node id, plus "~k" for a restarted agent)
    ray_node_id: str  # hex id of the Ray node the agent is pinned to
    pool: str = "default"  # pool label
    capacity: Resources | None = None  # capacity as Ray reports it (overrides what NodeHost measures)
    gpu_domains: tuple[tuple[int, ...], ...] | None = None  # from labels; None: ask the GPU manager
    labels: Mapping[str, str] = field(default_factory=dict)  # the Ray node's labels
    cpu: Mapping[str, Any] = field(default_factory=dict)  # CpuManagerConfig keyword arguments
    gpu: Mapping[str, Any] | None = field(default_factory=dict)  # GpuManagerConfig kw; None: off
    models: tuple[ModelSpec, ...] = ()  # reward models the GPU manager may load
    # environment images: (name, path every node can read); imported on first use, or at
    # start for the names in ``eager_images``
    images: tuple[tuple[str, str], ...] = ()
    eager_images: tuple[str, ...] = ()
    # images other nodes hold: (name, ((node name, its NodeAgent handle), ...)); a first use
    # here pulls the layers this node lacks from one of them, in chunks of image_chunk_bytes
    image_peers: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    image_chunk_bytes: int = 64 << 20
    host_factory: Callable[[AgentSetup, Callable[[Event], None]], Host] | None = None  # None: NodeHost


def make_node_host(setup: AgentSetup, emit: Callable[[Event], None]) -> Host:
    """The real host: a `NodeHost` with the node's CPU and GPU managers."""
    from ..managers.cpu.config import CpuManagerConfig
    from ..managers.gpu.config import GpuManagerConfig
    from .node import NodeHost

    cpu = dict(setup.cpu)
    # Several Ray nodes may share one machine (ray.cluster_utils.Cluster, or nodes packed on a
    # big host): give each node's CPU manager its own state directory unless one is configured.
    cpu.setdefault("work_root", os.path.join(tempfile.gettempdir(), "tangram-cpu", f"ray-{setup.name.replace('~', '-')}"))
    try:  # (built here, on the node: its defaults, such as the temp directory, are this machine's)
        cpu_config = CpuManagerConfig(**cpu)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"node {setup.name}: cpu: {exc}") from None
    try:
        gpu_config = None if setup.gpu is None else GpuManagerConfig(**setup.gpu)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"node {setup.name}: gpu: {exc}") from None
    host = NodeHost(
        setup.name, emit=emit, pool=setup.pool, capacity=setup.capacity,
        cpu_config=cpu_config, gpu_config=gpu_config, models=setup.models,
        labels=setup.labels, images=setup.images, eager_images=setup.eager_images,
    )
    host.images.pulls.chunk_bytes = int(setup.image_chunk_bytes)
    for name, pairs in setup.image_peers:
        host.images.pulls.peers[name] = [RayPeer(n, h) for n, h in pairs if n != setup.name]
    return host


class RayPeer(ImagePeer):
    """Another node's agent as an image peer (`runtime.images.ImagePeer`): a layer travels
    as the return values of ``layer_chunk`` calls, Ray objects of at most one chunk each, from
    the peer's object store to this node's; one call in flight per stream."""

    def __init__(self, name: str, handle: Any) -> None:
        self.name, self.handle = name, handle

    async def manifest(self, image: str) -> dict[str, Any]:
        return dict(unwrap(await self.handle.image_manifest.remote(image), self.name))

    async def open_layer(self, key: str, chunk_bytes: int) -> str:
        return str(await self.handle.layer_open.remote(key, int(chunk_bytes)))

    async def next_chunk(self, stream: str) -> bytes:
        return bytes(await self.handle.layer_chunk.remote(stream))

    async def close_layer(self, stream: str) -> dict[str, Any]:
        return dict(await self.handle.layer_close.remote(stream))


class NodeAgent:
    """Mailbox between the driver and one NodeHost. Runs as an async Ray actor."""

    def __init__(self, setup: AgentSetup) -> None:
        self._setup = setup
        self._events: list[Event] = []
        self._wake: asyncio.Event | None = None
        self._host: Host | None = None
        self._closed = False
        self._accepted = 0  # commands accepted so far (diagnostics)
        self._uploads: dict[str, Any] = {}  # upload id -> its spool (`upload_open`)

    def _signal(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    def _emit(self, event: Event) -> None:
        self._events.append(event)
        self._signal().set()

    async def start(self) -> NodeSpec:
        """Build and start the host; return the node as the core should see it."""
        factory = self._setup.host_factory or make_node_host
        self._host = factory(self._setup, self._emit)
        spec = await self._host.start()
        if self._setup.gpu_domains is not None and spec.gpu_count:
            ngpu = spec.gpu_count
            doms = tuple(d for d in self._setup.gpu_domains if d and max(d) < ngpu)
            spec = dataclasses.replace(spec, gpu_domains=doms)
        return spec

    async def submit(self, commands: Sequence[Command]) -> int:
        """Start executing a batch of commands, in order; return how many were accepted."""
        host = self._host
        if host is None or self._closed:
            raise RuntimeError(f"agent {self._setup.name} is not running")
        for cmd in commands:
            host.submit(cmd)
        self._accepted += len(commands)
        return len(commands)

    async def poll(self, max_wait_s: float = 1.0, max_events: int = 10_000) -> list[Event]:
        """Events emitted since the last poll; waits up to ``max_wait_s`` for the first one."""
        wake = self._signal()
        if not self._events and not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max_wait_s)
            await asyncio.sleep(0)  # let events emitted in the same loop turn join the batch
        out, self._events = self._events[:max_events], self._events[max_events:]
        if not self._events:
            wake.clear()
        return out

    def info(self) -> dict[str, Any]:
        d = dict(self._host.info()) if self._host is not None else {}
        d["agent"] = {"accepted": self._accepted, "queued_events": len(self._events)}
        return d

    def ping(self) -> float:
        return time.monotonic()

    # ---- environment images: one call per operation, answering its value or a RemoteError --

    def _images(self) -> NodeImages:
        images = self._host.images if self._host is not None else None
        if images is None:
            raise ImagesUnsupported(f"node {self._setup.name}: no image cache")
        return images

    def _answer(self, op: Callable[[NodeImages], T]) -> T | RemoteError:
        try:
            return op(self._images())
        except Exception as exc:
            return RemoteError.of(exc)

    async def _answer_later(self, op: Callable[[NodeImages], Awaitable[T]]) -> T | RemoteError:
        try:
            return await op(self._images())
        except Exception as exc:
            return RemoteError.of(exc)

    async def image_source(self, name: str, path: str) -> dict[str, Any] | RemoteError:
        """Remember ``path`` as where ``name`` comes from: imported on first use."""
        return self._answer(lambda im: im.add_source(name, path))

    async def image_import(self, path: str, name: str) -> dict[str, Any] | RemoteError:
        """Import ``path`` as ``name`` now: the image's record."""
        async def op(im: NodeImages) -> dict[str, Any]:
            return (await im.import_(path, name)).to_dict()

        return await self._answer_later(op)

    async def image_users(self, name: str) -> int | RemoteError:
        """How many sessions and actions here use ``name``."""
        return self._answer(lambda im: im.users(name))

    async def image_remove(self, name: str) -> bool | RemoteError:
        """Remove ``name`` here (False: not held here)."""
        return self._answer(lambda im: im.remove(name))

    async def image_list(self) -> list[dict[str, Any]] | RemoteError:
        return self._answer(lambda im: im.list())

    async def image_readable(self, path: str) -> bool | RemoteError:
        """Whether this node can read ``path`` (an absolute path)."""
        return self._answer(lambda im: os.path.isabs(path) and os.access(path, os.R_OK))

    async def image_peers(self, name: str, pairs: Sequence[tuple[str, Any]]
                          ) -> PeersSet | RemoteError:
        """The nodes holding ``name``: (node name, its NodeAgent handle) each."""
        return self._answer(lambda im: im.set_peers(name, [RayPeer(n, h) for n, h in pairs]))

    async def image_pull(self, name: str) -> Fetched | RemoteError:
        """Fetch ``name`` here now (from a peer, else its path): what it took."""
        async def op(im: NodeImages) -> Fetched:
            got = await im.ensure(name)
            if not im.has(name):
                raise ImageError(f"node {self._setup.name}: no source or peer of image {name!r}")
            return got

        return await self._answer_later(op)

    async def image_manifest(self, name: str) -> dict[str, Any] | RemoteError:
        """The record of ``name`` in this node's cache (for a peer pulling it)."""
        return self._answer(lambda im: im.server.manifest(name))

    # an archive the driver sends in chunks (`RayExecutor.upload_image`), imported here
    async def upload_open(self) -> str:
        spool = await asyncio.to_thread(self._images().store().new_spool)
        sid = os.path.basename(spool.path)
        self._uploads[sid] = spool
        return sid

    async def upload_chunk(self, sid: str, data: bytes) -> int:
        spool = self._uploads[sid]
        await asyncio.to_thread(spool.write, data)
        return int(spool.size)

    async def upload_import(self, sid: str, name: str) -> dict[str, Any] | RemoteError:
        """Import the sent archive as ``name``: its record."""
        spool = self._uploads.pop(sid)
        try:
            spool.close()
            return (await self._images().import_(spool.path, name)).to_dict()
        except Exception as exc:
            return RemoteError.of(exc)
        finally:
            spool.discard()

    # a layer of this node's image cache, in chunks, to a peer pulling it (`RayPeer`)
    async def layer_open(self, key: str, chunk_bytes: int) -> str:
        return str(await self._images().server.open(key, chunk_bytes))

    async def layer_chunk(self, stream: str) -> bytes:
        return bytes(await self._images().server.next(stream))

    async def layer_close(self, stream: str) -> dict[str, Any]:
        return dict(await self._images().server.close(stream))

    async def shutdown(self) -> list[Event]:
        """Close the host (running actions end CANCELLED) and return every undelivered event."""
        self._closed = True
        if self._host is not None:
            await self._host.aclose()
        out, self._events = self._events, []
        self._signal().set()
        return out


class EchoHost:
    """An in-package fake host: no managers; every action finishes at once (or after
    ``payload["sleep_s"]``) and answers where it ran. Unit tests and the transport benchmark use it.
    """

    def __init__(self, setup: AgentSetup, emit: Callable[[Event], None]) -> None:
        self._setup, self._emit = setup, emit
        self.name = setup.name
        self._tasks: set[asyncio.Task[Any]] = set()
        self.images: NodeImages | None = None  # (no image cache)

    async def start(self) -> NodeSpec:
        cap = self._setup.capacity or Resources(cpu=1, memory_mb=1024)
        return NodeSpec(self._setup.name, cap, self._setup.pool, (), dict(self._setup.labels))

    def submit(self, cmd: Command) -> None:
        if isinstance(cmd, StartAction):
            task = asyncio.get_running_loop().create_task(self._run(cmd))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, cmd: StartAction) -> None:
        a, t0 = cmd.action, time.monotonic()
        self._emit(ActionStarted(t0, a.id, cmd.node))
        sleep_s = float(a.payload.get("sleep_s", 0.0))
        status, reason = Status.SUCCEEDED, ""
        try:
            if sleep_s:
                await asyncio.sleep(sleep_s)
        except asyncio.CancelledError:
            status, reason = Status.CANCELLED, "node shut down"
        out = {"node": cmd.node, "ray_node_id": self._setup.ray_node_id, "pid": os.getpid()}
        self._emit(ActionFinished(time.monotonic(), a.id, status, out, reason, time.monotonic() - t0))

    def info(self) -> dict[str, Any]:
        return {"name": self._setup.name, "pool": self._setup.pool, "running": len(self._tasks)}

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# ---- what Ray tells us about a node ----------------------------------------------------------


def parse_domains(text: str) -> tuple[tuple[int, ...], ...]:
    """``"0-1_2-3"`` (or ``"0,1;2,3"``) -> ``((0, 1), (2, 3))``; raises ValueError if malformed."""
    norm = text.strip().replace(";", "_").replace(",", "-")
    if not norm:
        return ()
    try:
        return tuple(tuple(int(x) for x in dom.split("-")) for dom in norm.split("_"))
    except ValueError:
        raise ValueError(f"label {LABEL_NVLINK}: cannot parse {text!r} (want e.g. 0-1-2-3_4-5-6-7)") from None


def capacity_from_ray(resources: Mapping[str, float], labels: Mapping[str, str]) -> Resources:
    """The capacity vector of a Ray node: CPU, memory, GPU, GPU memory, ``tangram_*`` extras."""
    cap: dict[str, float] = {CPU: float(resources.get("CPU", 0.0))}
    cap[MEMORY_MB] = float(round(resources.get("memory", 0.0) / 2**20))
    ngpu = float(resources.get("GPU", 0.0))
    if ngpu:
        cap[GPU] = ngpu
        per = labels.get(LABEL_GPU_MEMORY)
        if per:
            try:
                cap[GPU_MEMORY_MB] = float(per) * ngpu
            except ValueError:
                raise ValueError(f"label {LABEL_GPU_MEMORY}: not a number: {per!r}") from None
    for key, amount in resources.items():
        if key.startswith(RESOURCE_PREFIX) and key != RESOURCE_DOMAIN_SIZE:
            cap[key[len(RESOURCE_PREFIX):]] = float(amount)
    return Resources(cap)


def domains_from_ray(resources: Mapping[str, float], labels: Mapping[str, str]) -> tuple[tuple[int, ...], ...] | None:
    """NVLink domains from the label, else from ``tangram_nvlink_domain_size``; None if neither."""
    if labels.get(LABEL_NVLINK):
        return parse_domains(labels[LABEL_NVLINK])
    size = int(resources.get(RESOURCE_DOMAIN_SIZE, 0))
    ngpu = int(resources.get("GPU", 0))
    if size > 0 and ngpu:
        return tuple(tuple(range(s, min(s + size, ngpu))) for s in range(0, ngpu, size))
    return None


def pool_from_ray(resources: Mapping[str, float], labels: Mapping[str, str]) -> str:
    if labels.get(LABEL_POOL):
        return labels[LABEL_POOL]
    return "gpu" if resources.get("GPU", 0.0) else "cpu"


def is_head(resources: Mapping[str, float]) -> bool:
    return _HEAD_RESOURCE in resources


__all__ = [
    "LABEL_GPU_MEMORY",
    "LABEL_NVLINK",
    "LABEL_POOL",
    "RESOURCE_DOMAIN_SIZE",
    "AgentSetup",
    "EchoHost",
    "Host",
    "NodeAgent",
    "RayPeer",
    "capacity_from_ray",
    "domains_from_ray",
    "make_node_host",
    "parse_domains",
    "pool_from_ray",
]
