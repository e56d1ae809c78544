"""LocalExecutor: runs NodeHosts in this process, on this machine.

Invariant: the executor decides nothing. Each command goes to the NodeHost its ``node`` names;
a command for an unknown node is answered with the failure event the contract demands, so the
core never waits forever on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..core import commands as C
from ..core.cluster import ModelSpec, NodeSpec
from ..core.errors import ImageError, ImagesUnsupported, InvalidAction
from .config import NodeConfig, ServiceConfig
from .executor import Emit, Executor, unknown_node_events
from .images import in_use
from .node import NodeHost


class LocalExecutor(Executor):
    """Hosts one NodeHost per configured node, in-process."""

    reports_session_open = True  # (`node.sessions.SessionPath`)

    def __init__(
        self,
        nodes: Sequence[NodeConfig] = (NodeConfig(),),
        models: Sequence[ModelSpec] = (),
        *,
        gpu_factories: Any = None,
        hosts: Sequence[NodeHost] | None = None,
        images: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._images = tuple(images)  # (name, path) every node imports at start
        self._node_cfgs = tuple(nodes)
        self._models = tuple(models)
        self._gpu_factories = gpu_factories
        self._given_hosts = list(hosts) if hosts is not None else None
        self.hosts: dict[str, NodeHost] = {}
        self._emit: Emit | None = None

    @classmethod
    def from_config(cls, config: ServiceConfig, *, gpu_factories: Any = None) -> LocalExecutor:
        return cls(config.nodes, config.models, gpu_factories=gpu_factories,
                   images=config.images)

    async def start(self, emit: Emit) -> list[NodeSpec]:
        self._emit = emit
        if self._given_hosts is not None:
            hosts = self._given_hosts
        else:
            hosts = [
                NodeHost(
                    n.name, emit=emit, pool=n.pool, capacity=n.capacity, cpu_config=n.cpu,
                    gpu_config=n.gpu, models=self._models, gpu_factories=self._gpu_factories,
                    labels=n.labels,
                )
                for n in self._node_cfgs
            ]
        specs = await asyncio.gather(*(h.start() for h in hosts))
        self.hosts = {h.name: h for h in hosts}
        if self._images:  # the service YAML's images: on every node, before any session
            for name, path in self._images:
                try:
                    await self.import_image(path, name)
                except Exception as exc:
                    await self.aclose()
                    raise ValueError(f"images: {name} ({path}): {exc}") from None
        return list(specs)

    async def submit(self, commands: Sequence[C.Command]) -> None:
        for cmd in commands:
            host = self.hosts.get(getattr(cmd, "node", ""))
            if host is not None:
                host.submit(cmd)
            else:
                self._unknown_node(cmd)

    def _unknown_node(self, cmd: C.Command) -> None:
        if self._emit is not None:
            for ev in unknown_node_events(cmd):
                self._emit(ev)

    def node_info(self) -> dict[str, dict[str, Any]]:
        return {name: h.info() for name, h in self.hosts.items()}

    # ---- environment images: every node's cache, at once -------------------------------------

    def _image_hosts(self, node: str | None) -> list[NodeHost]:
        if node is None:
            return list(self.hosts.values())
        if node not in self.hosts:
            raise InvalidAction("node", f"unknown node {node!r}")
        return [self.hosts[node]]

    async def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        out = {}
        for h in self._image_hosts(node):
            out[h.name] = (await h.images.import_(path, name)).to_dict()
        return {"name": name, "nodes": out}

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        return {"nodes": {h.name: h.images.list() for h in self._image_hosts(node)}}

    async def remove_image(self, name: str, node: str | None = None) -> dict[str, Any]:
        hosts = [h for h in self._image_hosts(node) if h.images.has(name)]
        if not hosts:
            raise ImageError(f"no image {name!r}")
        for h in hosts:  # refuse before touching any node
            n = h.images.users(name)
            if n:
                raise in_use(name, n, h.name)
        for h in hosts:
            await asyncio.to_thread(h.images.remove, name)
        return {"name": name, "removed": [h.name for h in hosts]}

    def has_image(self, name: str) -> bool | None:
        try:
            return any(h.images.has(name) for h in self.hosts.values())
        except ImagesUnsupported:  # (a node without a CPU manager's image cache)
            return None

    async def aclose(self) -> None:
        hosts, self.hosts = list(self.hosts.values()), {}
        await asyncio.gather(*(h.aclose() for h in hosts), return_exceptions=True)

