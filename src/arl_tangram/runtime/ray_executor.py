"""RayExecutor: the core's commands on many machines, through one NodeAgent actor per Ray node.

Invariants:
- One agent per Ray node, pinned to it (hard node affinity, never restarted by Ray: a restarted
  actor would have silently lost its in-flight work). A node is announced (NodeAdded, or in the
  list `start` returns) only once its agent has started its NodeHost.
- A node that was announced is reported lost exactly once (NodeLost), when Ray says the node is
  dead, or when a call to its agent fails. After that nothing from it is emitted (late results
  are dropped) and commands for it are dropped: the core, on NodeLost, re-runs the idempotent
  actions it had there and ends the others (and its sessions) as NODE_LOST, so no accepted
  action is silently lost.
- Commands for one node travel in order, one ``submit`` call in flight per node; what arrives
  meanwhile is batched into the next call. Results come back through one outstanding long
  ``poll`` per node, in batches.
- An agent that dies on a node that is still alive is replaced under a new node name
  (``<ray node id>~<k>``), at most ``max_agent_restarts`` times per Ray node.
- An agent that answers nothing (no poll, no info) for ``agent_timeout_s`` -- hung, or its
  process stopped, which Ray does not notice -- is lost the same way (NodeLost, its actor
  killed, a new incarnation started); from ``2 x poll_wait_s + 1`` s of silence its node shows
  not ready in `node_info` (so in /v1/cluster and /v1/health) with the reason.

Membership is Ray's: ``ray.nodes()`` is read every ``membership_interval_s``; nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.cluster import ModelSpec, NodeSpec
from ..core.commands import Command
from ..core.errors import BrokenError, ClosedError, ImageError, InvalidAction
from ..core.events import Event, NodeAdded, NodeLost
from ..core.images import check_name
from .executor import Emit, Executor, unknown_node_events
from .images import RemoteError, in_use, unwrap
from .ray_agent import (
    AgentSetup,
    NodeAgent,
    capacity_from_ray,
    domains_from_ray,
    is_head,
    pool_from_ray,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RayExecutorConfig:
    """How the executor joins Ray and manages its agents."""

    address: str = "auto"  # ray.init address: "auto" (running cluster), "host:port", "ray://..."
    namespace: str = "tangram"  # Ray namespace of the agents
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)  # extra ray.init kw (runtime_env)
    node_labels: Mapping[str, str] = field(default_factory=dict)  # host agents only on nodes with these labels
    include_head: bool = True  # host an agent on the head node too
    claim_gpus: bool = True  # agents reserve all of their node's GPUs in Ray (and see them)
    claim_cpus: bool = False  # agents reserve all of their node's CPUs (Ray schedules nothing else there)
    cpu: Mapping[str, Any] = field(default_factory=dict)  # CpuManagerConfig kw for every node
    gpu: Mapping[str, Any] | None = field(default_factory=dict)  # GpuManagerConfig kw; None: no GPU manager
    membership_interval_s: float = 1.0  # period of reading ray.nodes() (and refreshing node info)
    poll_wait_s: float = 1.0  # longest wait of one long-poll for results
    max_events_per_poll: int = 10_000  # largest batch of events one poll returns
    agent_start_timeout_s: float = 120.0  # an agent that has not started its host by then is dropped
    max_agent_restarts: int = 3  # replacements of a dead agent on a still-alive Ray node
    agent_timeout_s: float = 30.0  # an agent silent this long (no poll, no info answered) is lost
    shutdown_ray: bool = False  # call ray.shutdown() in aclose (only if this executor called ray.init)
    # environment images (issue 17): (name, path every node can read); a node imports one the
    # first time a session or action there needs it, or at its agent's start if named in
    # ``eager_images``
    images: tuple[tuple[str, str], ...] = ()
    eager_images: tuple[str, ...] = ()
    image_chunk_bytes: int = 64 << 20  # a layer pulled between nodes travels in pieces this big

    def __post_init__(self) -> None:
        for name in ("membership_interval_s", "poll_wait_s", "agent_start_timeout_s",
                     "agent_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if self.max_events_per_poll < 1:
            raise ValueError(f"max_events_per_poll must be >= 1, got {self.max_events_per_poll}")
        if self.max_agent_restarts < 0:
            raise ValueError(f"max_agent_restarts must be >= 0, got {self.max_agent_restarts}")
        if not self.address:
            raise ValueError("address must be a non-empty string (e.g. 'auto')")
        if not isinstance(self.image_chunk_bytes, int) or self.image_chunk_bytes < 1 << 16:
            raise ValueError(f"image_chunk_bytes must be an int >= 65536, got {self.image_chunk_bytes!r}")


class _State(enum.IntEnum):
    STARTING = 0  # agent being created; not announced
    UP = 1  # announced to the core
    LOST = 2  # reported lost (or failed before it was announced); terminal


@dataclass(slots=True, eq=False)
class _Node:
    """The driver's view of one agent (one incarnation on one Ray node)."""

    name: str
    ray_node_id: str
    actor: Any
    state: _State = _State.STARTING
    spec: NodeSpec | None = None
    outbox: list[Command] = field(default_factory=list)
    sending: bool = False
    pump: asyncio.Task[None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    answered: float = 0.0  # time.monotonic() of the agent's last answer (a poll, an info)
    ray: dict[str, Any] = field(default_factory=dict)  # address, resources, labels as Ray says


class RayExecutor(Executor):
    """Executes commands on Ray nodes through one NodeAgent actor per node."""

    reports_session_open = True  # (each agent's `node.sessions.SessionPath`)

    def __init__(
        self,
        config: RayExecutorConfig | None = None,
        *,
        models: Sequence[ModelSpec] = (),
        host_factory: Any = None,
    ) -> None:
        self.config = config or RayExecutorConfig()
        self._models = tuple(models)
        self._host_factory = host_factory  # None: NodeHost (tests may pass a tiny host)
        self._emit: Emit | None = None
        self._nodes: dict[str, _Node] = {}  # node name -> node (all incarnations, lost ones too)
        self._current: dict[str, _Node] = {}  # ray node id -> its latest incarnation
        self._incarnations: dict[str, int] = {}  # ray node id -> agents started there
        self._dead_ray_nodes: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._actor_cls: Any = None
        self._inited_ray = False
        self._closed = False
        self.dropped_commands = 0  # commands for nodes that were lost or unknown
        self.image_sources: dict[str, str] = dict(self.config.images)  # name -> shared path
        # name -> the nodes known to hold it (an import's node, and nodes that pulled it, as
        # their info says); every node is told them, to pull from on first use
        self.image_holders: dict[str, set[str]] = {}

    @classmethod
    def from_service_config(cls, cfg: Any, *, address: str = "auto", **kw: Any) -> RayExecutor:
        """From a `ServiceConfig`: its first node's ``cpu``/``gpu`` sections go to every Ray node."""
        node = cfg.nodes[0]
        kw.setdefault("images", tuple(getattr(cfg, "images", ())))
        kw.setdefault("eager_images", tuple(getattr(cfg, "eager_images", ())))
        from .config import overrides

        rcfg = RayExecutorConfig(address=address, cpu=overrides(node.cpu),
                                 gpu=None if node.gpu is None else overrides(node.gpu), **kw)
        return cls(rcfg, models=cfg.models)

    # ---- life --------------------------------------------------------------------------------

    async def start(self, emit: Emit) -> list[NodeSpec]:
        import ray

        if self._emit is not None:
            raise RuntimeError("RayExecutor.start was called twice")
        self._emit = emit
        if not ray.is_initialized():
            kw: dict[str, Any] = {"namespace": self.config.namespace, "log_to_driver": False}
            kw.update(self.config.init_kwargs)
            await asyncio.to_thread(ray.init, address=self.config.address, **kw)
            self._inited_ray = True
        self._actor_cls = ray.remote(NodeAgent)
        raw = await asyncio.to_thread(ray.nodes)
        starting = [self._spawn_agent(n) for n in raw if self._eligible(n)]
        await asyncio.gather(*(self._start_agent(n, announce=False) for n in starting if n))
        specs = [n.spec for n in self._current.values() if n.state is _State.UP and n.spec]
        if starting and not specs:
            raise BrokenError("RayExecutor: no Ray node could start a NodeAgent (see the log)")
        if not starting:
            log.warning("RayExecutor: no eligible Ray node yet; waiting for nodes to join")
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return specs

    async def aclose(self) -> None:
        """Close every agent's host (running actions end CANCELLED) and kill the agents."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        up = [n for n in self._current.values() if n.state is _State.UP]
        await asyncio.gather(*(self._close_agent(n) for n in up), return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._inited_ray and self.config.shutdown_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)

    async def _close_agent(self, node: _Node) -> None:
        import ray

        if node.pump is not None:
            node.pump.cancel()
        try:
            events = await node.actor.shutdown.remote()
        except Exception as exc:  # the agent died while closing: what it ran is lost with it
            log.warning("node %s: shutdown failed: %s", node.name, exc)
            events = []
        if node.state is _State.UP:
            for e in events:
                self._deliver(e)
            node.state = _State.LOST
        with contextlib.suppress(Exception):
            ray.kill(node.actor, no_restart=True)

    # ---- commands ----------------------------------------------------------------------------

    async def submit(self, commands: Sequence[Command]) -> None:
        if self._closed:
            raise ClosedError("RayExecutor is closed")
        touched: list[_Node] = []
        for cmd in commands:
            name = getattr(cmd, "node", None)
            node = self._nodes.get(name) if isinstance(name, str) else None
            if node is None:
                self._unknown_node(cmd)
                continue
            if node.state is not _State.UP:  # lost: the core settles it on NodeLost
                self.dropped_commands += 1
                continue
            node.outbox.append(cmd)
            if not node.sending:
                node.sending = True
                touched.append(node)
        for node in touched:
            self._background(self._flush(node))

    def _unknown_node(self, cmd: Command) -> None:
        """A command for a node never announced: answer with the failure the contract demands."""
        self.dropped_commands += 1
        for ev in unknown_node_events(cmd):
            self._deliver(ev)

    async def _flush(self, node: _Node) -> None:
        """Send the node's outbox in batches, one call in flight, until it is empty."""
        try:
            while node.outbox and node.state is _State.UP:
                batch, node.outbox = node.outbox, []
                try:
                    await node.actor.submit.remote(batch)
                except Exception as exc:
                    self._lose(node, f"node lost: agent unreachable ({type(exc).__name__})")
                    return
        finally:
            node.sending = False

    async def _pump(self, node: _Node) -> None:
        """Long-poll the agent for events and emit them until the node is lost."""
        cfg = self.config
        while node.state is _State.UP:
            try:
                events = await node.actor.poll.remote(cfg.poll_wait_s, cfg.max_events_per_poll)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._lose(node, f"node lost: agent died ({type(exc).__name__})")
                return
            if node.state is not _State.UP:
                return  # late results of a lost node are dropped: the core already settled them
            node.answered = time.monotonic()
            for e in events:
                self._deliver(e)

    def _deliver(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- membership --------------------------------------------------------------------------

    def _eligible(self, raw: Mapping[str, Any]) -> bool:
        if not raw.get("Alive"):
            return False
        labels = raw.get("Labels") or {}
        if not self.config.include_head and is_head(raw.get("Resources") or {}):
            return False
        return all(labels.get(k) == v for k, v in self.config.node_labels.items())

    def _spawn_agent(self, raw: Mapping[str, Any]) -> _Node | None:
        """Create (not yet start) the agent actor for a Ray node; None if it may not have one."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nid = raw["NodeID"]
        k = self._incarnations.get(nid, 0)
        if k > self.config.max_agent_restarts:
            return None
        self._incarnations[nid] = k + 1
        name = nid if k == 0 else f"{nid}~{k}"
        res, labels = dict(raw.get("Resources") or {}), dict(raw.get("Labels") or {})
        try:
            setup = AgentSetup(
                name=name, ray_node_id=nid, pool=pool_from_ray(res, labels),
                capacity=capacity_from_ray(res, labels), gpu_domains=domains_from_ray(res, labels),
                labels=labels, cpu=self.config.cpu, gpu=self.config.gpu, models=self._models,
                images=tuple(self.image_sources.items()),
                eager_images=tuple(n for n in self.config.eager_images if n in self.image_sources),
                image_peers=tuple((n, self._holder_pairs(n)) for n in self.image_holders),
                image_chunk_bytes=self.config.image_chunk_bytes,
                host_factory=self._host_factory,
            )
        except ValueError as exc:
            log.error("Ray node %s: %s; no agent started there", nid, exc)
            self._incarnations[nid] = self.config.max_agent_restarts + 1
            return None
        opts: dict[str, Any] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(nid, soft=False),
            "max_restarts": 0, "max_task_retries": 0, "num_cpus": 0,
            "max_concurrency": 1000, "name": f"tangram-agent-{name}",
            "namespace": self.config.namespace,
        }
        if self.config.claim_cpus:
            opts["num_cpus"] = res.get("CPU", 0.0)
        if self.config.claim_gpus and res.get("GPU"):
            opts["num_gpus"] = res["GPU"]
        node = _Node(name, nid, self._actor_cls.options(**opts).remote(setup))
        node.ray = {"address": raw.get("NodeManagerAddress"), "resources": res, "labels": labels}
        self._nodes[name] = node
        self._current[nid] = node
        return node

    async def _start_agent(self, node: _Node, *, announce: bool) -> None:
        import ray

        try:
            spec = await asyncio.wait_for(node.actor.start.remote(), self.config.agent_start_timeout_s)
        except Exception as exc:
            log.error("node %s: agent failed to start: %s", node.name, exc)
            node.state = _State.LOST
            with contextlib.suppress(Exception):
                ray.kill(node.actor, no_restart=True)
            return
        if node.state is not _State.STARTING or self._closed:
            return
        node.spec, node.state = spec, _State.UP
        node.answered = time.monotonic()
        node.pump = self._background(self._pump(node))
        if announce:
            self._deliver(NodeAdded(time.monotonic(), spec))

    def _lose(self, node: _Node, reason: str) -> None:
        """Report ``node`` lost, once; stop talking to it."""
        if node.state is _State.LOST:
            return
        was_up = node.state is _State.UP
        node.state = _State.LOST
        self.dropped_commands += len(node.outbox)
        node.outbox.clear()
        if node.pump is not None and node.pump is not asyncio.current_task():
            node.pump.cancel()
        with contextlib.suppress(Exception):
            import ray

            ray.kill(node.actor, no_restart=True)
        if was_up and not self._closed:
            log.warning("node %s: %s", node.name, reason)
            self._deliver(NodeLost(time.monotonic(), node.name, reason))

    async def _watch(self) -> None:
        """Follow Ray's membership: agents for new nodes, NodeLost for dead ones."""
        import ray

        while not self._closed:
            await asyncio.sleep(self.config.membership_interval_s)
            try:
                raw = await asyncio.to_thread(ray.nodes)
            except Exception as exc:
                log.warning("ray.nodes() failed: %s", exc)
                continue
            self._reconcile(raw)
            await self._refresh_info()
            self._lose_silent()

    def _silent_s(self, node: _Node) -> float:
        return time.monotonic() - node.answered

    def _lose_silent(self) -> None:
        """Agents that answered nothing for ``agent_timeout_s`` are lost (and replaced)."""
        for node in list(self._current.values()):
            if node.state is _State.UP and self._silent_s(node) > self.config.agent_timeout_s:
                self._lose(node, f"node lost: its agent has not answered for "
                                 f"{self._silent_s(node):.1f} s")

    def _reconcile(self, raw: Sequence[Mapping[str, Any]]) -> None:
        alive = {n["NodeID"] for n in raw if n.get("Alive")}
        for nid, node in list(self._current.items()):
            if nid not in alive:
                self._dead_ray_nodes.add(nid)
                self._lose(node, "node lost: Ray node died")
        for n in raw:
            nid = n["NodeID"]
            if nid in self._dead_ray_nodes or not self._eligible(n):
                continue
            cur = self._current.get(nid)
            if cur is None or cur.state is _State.LOST:
                fresh = self._spawn_agent(n)
                if fresh is not None:
                    self._background(self._start_agent(fresh, announce=True))

    async def _refresh_info(self) -> None:
        up = [n for n in self._current.values() if n.state is _State.UP]
        if not up:
            return
        wait = max(1.0, self.config.membership_interval_s)  # a hung agent must not stall this
        done = await asyncio.gather(*(asyncio.wait_for(n.actor.info.remote(), wait) for n in up),
                                    return_exceptions=True)
        now = time.monotonic()
        for node, res in zip(up, done, strict=True):
            if isinstance(res, dict):
                node.info = res
                node.answered = now
        self._learn_holders(up)

    def _learn_holders(self, up: Sequence[_Node]) -> None:
        """Nodes whose info lists an image they were not known to hold (they pulled it, or
        imported it from its source path on their own, as the YAML's ``images:`` are): every
        node is told, so later first uses pull from them, spread over them."""
        grown = set()
        for node in up:
            for rec in node.info.get("images") or ():
                name = rec.get("name") if isinstance(rec, dict) else None
                known = name in self.image_holders or name in self.image_sources
                if isinstance(name, str) and known \
                        and node.name not in self.image_holders.setdefault(name, set()):
                    self.image_holders[name].add(node.name)
                    grown.add(name)
        for name in grown:
            self._background(self._push_peers(name))

    # ---- environment images ------------------------------------------------------------------

    async def image_call(self, call: Callable[[Any], Any], node: str | None = None
                         ) -> dict[str, Any]:
        """An image call of `NodeAgent` on every node that is up (or on ``node``): ``call``
        makes it from the agent's handle (``lambda a: a.image_users.remote(name)``); node ->
        its answer. The first node's error is raised (`runtime.images.unwrap`)."""
        up = [n for n in self._current.values() if n.state is _State.UP]
        if node is not None:
            up = [n for n in up if n.name == node]
            if not up:
                raise InvalidAction("node", f"unknown node {node!r}")
        answers = await asyncio.gather(*(call(n.actor) for n in up), return_exceptions=True)
        out: dict[str, Any] = {}
        for n, a in zip(up, answers, strict=True):
            if isinstance(a, BaseException):
                raise a
            out[n.name] = unwrap(a, n.name)
        return out

    async def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        """Import ``path`` as ``name`` on one node now: ``node``, else the driver's own node
        when it can read the path, else the first node that can, else (only this driver can
        read it) the archive is sent to a node (`upload_image`); ImageError when none can.
        Every other node is told which nodes hold it and pulls it from one of them on first use
        (`replicate_image`: now); no shared file system is needed."""
        check_name(name)
        target = node if node is not None else await self._reader_of(path)
        if target is None:
            return await self.upload_image(path, name)
        got = await self.image_call(lambda a: a.image_import.remote(path, name), target)
        return await self._imported(name, path, target, got, record_source=node is None)

    async def upload_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        """Send ``path``, read here on the driver (a directory is sent as a tar of it), to
        ``node`` (default: the first live node by name) in chunks of ``image_chunk_bytes``,
        and import it there; the others pull it from there as after `import_image`."""
        check_name(name)
        up = sorted(n.name for n in self._current.values() if n.state is _State.UP)
        target = node if node is not None else (up[0] if up else None)
        if target is None or target not in up:
            raise InvalidAction("node", f"unknown node {target!r}")
        if not os.access(path, os.R_OK):
            raise ImageError(f"{path}: not readable here (the driver)")
        actor, chunk = self._nodes[target].actor, self.config.image_chunk_bytes
        tmp = None
        try:
            src = path
            if os.path.isdir(path):
                tmp = tempfile.mkdtemp(prefix="tangram-upload-")
                src = await asyncio.to_thread(_tar_dir, path, os.path.join(tmp, "dir.tar"))
            sid = await actor.upload_open.remote()
            with open(src, "rb") as f:
                while data := await asyncio.to_thread(f.read, chunk):
                    await actor.upload_chunk.remote(sid, data)
            answer = await actor.upload_import.remote(sid, name)
        finally:
            if tmp is not None:
                await asyncio.to_thread(shutil.rmtree, tmp, True)
        got = {target: unwrap(answer, target)}
        out = await self._imported(name, path, target, got, record_source=False)
        out["uploaded"] = True
        return out

    async def _imported(self, name: str, path: str, target: str, got: dict[str, Any], *,
                        record_source: bool) -> dict[str, Any]:
        """``name`` is held on ``target`` now: every node learns it (and, with
        ``record_source``, agents that join later get the path too)."""
        self.image_holders[name] = {target} | self._holding_same(name, got[target])
        await self._push_peers(name)
        if record_source:  # nodes that join later learn it too
            self.image_sources[name] = path
        return {"name": name, "lazy": True, "nodes": got, "imported_on": target,
                "holders": sorted(self.image_holders[name])}

    async def replicate_image(self, name: str, node: str | None = None) -> dict[str, Any]:
        """Pull ``name`` now onto every node that lacks it (or onto ``node``), from the nodes
        holding it: ``{"name", "nodes": {node: {"image_import_s", "image_pull"}}}``."""
        check_name(name)
        if not self.image_holders.get(name):
            raise ImageError(f"no node is known to hold image {name!r}")
        up = [n.name for n in self._current.values() if n.state is _State.UP
              and n.name not in self.image_holders[name] and (node is None or n.name == node)]
        answers = await asyncio.gather(*(self.image_call(lambda a: a.image_pull.remote(name), n)
                                         for n in up))
        got = {k: v.to_dict() for a in answers for k, v in a.items()}
        self.image_holders[name].update(got)
        if got:
            await self._push_peers(name)
        return {"name": name, "nodes": got}

    async def _reader_of(self, path: str) -> str | None:
        """The node to import ``path`` on: the driver's own, else the first that can read it;
        None when only the driver can (ImageError: nobody can)."""
        import ray

        readable = await self.image_call(lambda a: a.image_readable.remote(path))
        nodes = sorted(n for n, ok in readable.items() if ok)
        if not nodes:
            if os.path.isabs(path) and os.access(path, os.R_OK):
                return None
            raise ImageError(f"{path}: no node can read it (as an absolute path), nor the driver")
        with contextlib.suppress(Exception):
            here = ray.get_runtime_context().get_node_id()
            for n in nodes:
                if self._nodes[n].ray_node_id == here:
                    return n
        return nodes[0]

    def _holding_same(self, name: str, record: Mapping[str, Any]) -> set[str]:
        """Nodes whose last info lists ``name`` with the same digest as ``record``."""
        digest = record.get("digest")
        return {n for n, d in self.node_info().items()
                if any(i.get("name") == name and i.get("digest") == digest
                       for i in d.get("images") or ())}

    def _holder_pairs(self, name: str) -> tuple[tuple[str, Any], ...]:
        """(node, agent handle) of the live nodes known to hold ``name``."""
        holders = self.image_holders.get(name) or set()
        return tuple((n.name, n.actor) for n in self._current.values()
                     if n.state is _State.UP and n.name in holders)

    async def _push_peers(self, name: str) -> None:
        """Tell every live node which nodes hold ``name`` (a node lacking it pulls from them)."""
        pairs = self._holder_pairs(name)
        up = [n for n in self._current.values() if n.state is _State.UP]
        answers = await asyncio.gather(*(n.actor.image_peers.remote(name, pairs) for n in up),
                                       return_exceptions=True)
        for n, a in zip(up, answers, strict=True):
            if isinstance(a, BaseException | RemoteError):
                log.warning("node %s: could not be told the holders of image %s: %s",
                            n.name, name, a.message if isinstance(a, RemoteError) else a)

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        """As of the last refresh of node info (at most ``membership_interval_s`` old)."""
        info = self.node_info()
        if node is not None and node not in info:
            raise InvalidAction("node", f"unknown node {node!r}")
        return {"nodes": {n: list(d.get("images") or []) for n, d in info.items()
                          if node is None or n == node},
                "sources": dict(self.image_sources),
                "holders": {k: sorted(v) for k, v in self.image_holders.items()},
                "transfers": {n: list(d.get("image_transfers") or []) for n, d in info.items()
                              if (node is None or n == node) and d.get("image_transfers")}}

    async def remove_image(self, name: str, node: str | None = None) -> dict[str, Any]:
        users = await self.image_call(lambda a: a.image_users.remote(name), node)
        known = name in self.image_sources
        for n, count in users.items():  # refuse before touching any node
            if count:
                raise in_use(name, count, n)
        removed = await self.image_call(lambda a: a.image_remove.remote(name), node)
        if node is None:
            self.image_sources.pop(name, None)
            self.image_holders.pop(name, None)
        elif name in self.image_holders:
            self.image_holders[name].discard(node)
            await self._push_peers(name)
        held = sorted(n for n, ok in removed.items() if ok)
        if not held and not known:
            raise ImageError(f"no image {name!r}")
        return {"name": name, "removed": held}

    def has_image(self, name: str) -> bool | None:
        if name in self.image_sources or self.image_holders.get(name):
            return True
        return any(any(i.get("name") == name for i in d.get("images") or [])
                   for d in self.node_info().values())

    # ---- reporting ---------------------------------------------------------------------------

    def node_info(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for node in self._nodes.values():
            if node.state is not _State.UP:
                continue
            d = dict(node.info)
            d["ray"] = {"node_id": node.ray_node_id, **node.ray}
            silent = self._silent_s(node)
            if silent > 2 * self.config.poll_wait_s + 1.0:
                d["ready"] = False
                d["not_ready_reason"] = (f"its agent has not answered for {silent:.1f} s "
                                         f"(lost after {self.config.agent_timeout_s:g} s)")
            out[node.name] = d
        return out

    def nodes_up(self) -> list[str]:
        """Names of the nodes announced and not lost."""
        return [n.name for n in self._nodes.values() if n.state is _State.UP]


def _tar_dir(src: str, out: str) -> str:
    """A plain tar of the directory ``src``'s contents (symlinks kept as links)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(src, arcname=".")
    return out


__all__ = ["RayExecutor", "RayExecutorConfig"]
