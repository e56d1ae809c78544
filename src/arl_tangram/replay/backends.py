"""Where a replay runs: the engine embedded in this process, or a running `tangram serve`.

Invariant: a backend only carries the loop's calls (open and close sessions, run an action,
read counters); it never changes what an action is. The embedded one builds each policy's core
with `sim.runner.make_core` (`driver.replay_policy` passes the settings), the HTTP one runs
whatever policy the service runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.actions import ActionSpec
from ..core.cluster import ClusterSpec
from ..core.config import CoreConfig
from ..core.resources import CPU, GPU, GPU_MEMORY_MB, Resources


class Backend:
    """What the closed loop drives: sessions, actions and the CPU the sandboxes consumed."""

    cpu_capacity: float = 0.0

    async def open_session(self, sid: str, demand: Resources | None, ttl_s: float,
                           image: str | None = None) -> str:
        raise NotImplementedError
    async def close_session(self, sid: str) -> None: ...
    async def run(self, spec: ActionSpec) -> tuple[str, float | None, Any]:
        raise NotImplementedError
    def cpu_ns(self) -> int | None: return None
    def stats(self) -> dict[str, Any]: return {}
    async def aclose(self) -> None: ...


class EmbeddedBackend(Backend):
    """The engine in this process over one `NodeHost` per node of the cluster spec."""

    def __init__(self, cluster: ClusterSpec, policy: str, trajectories: int,
                 shares: Mapping[str, float] | None, *, cpu_config: Mapping[str, Any] | None = None,
                 tick_s: float = 0.5, images: Mapping[str, str] | None = None,
                 core_kw: Mapping[str, Any] | None = None) -> None:
        from ..managers.cpu.config import CpuManagerConfig
        from ..managers.gpu.config import GpuManagerConfig
        from ..runtime.config import NodeConfig
        from ..runtime.engine import Engine, EngineConfig
        from ..runtime.local import LocalExecutor
        from ..sim.runner import make_core

        cpu = CpuManagerConfig(**(cpu_config or {}))
        nodes = []
        for n in cluster.nodes:
            ngpu = int(n.capacity.get(GPU))
            gpu = None
            if ngpu and cluster.models:
                gpu = GpuManagerConfig(
                    device="auto", cpu_devices=ngpu,
                    cpu_device_memory_mb=n.capacity.get(GPU_MEMORY_MB) / ngpu or 4096.0)
            nodes.append(NodeConfig(name=n.name, pool=n.pool, capacity=n.capacity,
                                    cpu=cpu, gpu=gpu, labels=dict(n.labels)))
        self.cluster = cluster
        self.tick_s = tick_s
        self.cpu_capacity = cluster.total_capacity().get(CPU)
        models = tuple(cluster.models)

        def core_factory(_cfg: Any, specs: Sequence[Any]) -> Any:
            return make_core(ClusterSpec(tuple(specs), models), policy, trajectories, shares,
                             **dict(core_kw or {}))

        self.executor = LocalExecutor(nodes, models, images=tuple((images or {}).items()))
        # (the core itself is `core_factory`'s, from the label; the config names the policy
        # without a static pool's size: "static-pool:2" -> "static-pool")
        self.engine = Engine(self.executor,
                             EngineConfig(core=CoreConfig(policy=policy.partition(":")[0]),
                                          models=models, tick_s=tick_s),
                             core_factory=core_factory)

    async def start(self) -> None:
        await self.engine.start()

    async def open_session(self, sid: str, demand: Resources | None, ttl_s: float,
                           image: str | None = None) -> str:
        return await self.engine.open_session(sid, demand=demand, ttl_s=ttl_s, image=image)

    async def close_session(self, sid: str) -> None:
        await self.engine.close_session(sid)

    async def run(self, spec: ActionSpec) -> tuple[str, float | None, Any]:
        res = await self.engine.run(spec)
        act = res.finish_time - res.submit_time if res.finish_time is not None else None
        return res.status.name.lower(), act, res.output

    def cpu_ns(self) -> int | None:
        """CPU time consumed so far by every sandbox of every node (their cgroups' sum)."""
        total = 0
        for host in self.executor.hosts.values():
            tree = getattr(host.cpu, "_cgroups", None)
            if tree is None or tree.version is None:
                return None
            try:
                if tree.version == "v1":
                    with open(f"{tree.bases['cpuacct']}/cpuacct.usage") as f:
                        total += int(f.read())
                else:
                    with open(f"{tree.bases['cpu']}/cpu.stat") as f:
                        for line in f:
                            if line.startswith("usage_usec"):
                                total += int(line.split()[1]) * 1000
            except OSError:
                return None
        return total

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    async def aclose(self) -> None:
        await self.engine.aclose()


class HttpBackend(Backend):
    """A running `tangram serve` at ``url``, through the client SDK (its policy is its own)."""

    def __init__(self, url: str, token: str | None = None,
                 images: Mapping[str, str] | None = None) -> None:
        from ..client import AsyncClient

        self.client = AsyncClient(url, token=token) if token else AsyncClient(url)
        self.images = dict(images or {})

    async def start(self) -> None:
        for name, path in self.images.items():  # (paths the service's nodes can read)
            await self.client.import_image(path, name)
        cl = await self.client.cluster()
        self.policy = str(cl.get("policy", "?"))
        self.cpu_capacity = sum(float(n["capacity"].get(CPU, 0.0)) for n in cl.get("nodes", []))

    async def open_session(self, sid: str, demand: Resources | None, ttl_s: float,
                           image: str | None = None) -> str:
        body: dict[str, Any] = {"session_id": sid, "ttl_s": ttl_s}
        if demand is not None:
            body["demand"] = demand.as_dict()
        if image is not None:
            body["image"] = image
        out = await self.client._request("POST", "/v1/sessions", json=body)
        return str(out["session_id"])

    async def close_session(self, sid: str) -> None:
        await self.client._request("DELETE", f"/v1/sessions/{sid}")

    async def run(self, spec: ActionSpec) -> tuple[str, float | None, Any]:
        body: dict[str, Any] = {
            "id": spec.id, "kind": spec.kind.value, "payload": dict(spec.payload),
            "demand": spec.demand.as_dict(), "task": spec.task, "trajectory": spec.trajectory,
            "timeout_s": min(spec.timeout_s, 3600.0), "weight": spec.weight}
        if spec.elasticity is not None:
            el = spec.elasticity
            body["elasticity"] = {"min": el.min, "max": el.max, "dim": el.dim,
                                  "parallel_fraction": el.speedup.parallel_fraction}
        hints = {k: getattr(spec.hints, k) for k in ("expected_s", "test_count", "tokens", "items")
                 if getattr(spec.hints, k) is not None}
        if hints:
            body["hints"] = hints
        for k in ("session", "model", "tag"):
            if getattr(spec, k) is not None:
                body[k] = getattr(spec, k)
        res = await self.client.run(body)
        sub, fin = res.get("submit_time"), res.get("finish_time")
        act = fin - sub if sub is not None and fin is not None else None
        return str(res.get("status")), act, res.get("output")

    def stats(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        await self.client.aclose()
