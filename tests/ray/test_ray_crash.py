"""An abrupt Ray node crash (issue 27; the audit's section 3): a node holding running
actions AND a resident model instance is powered off -- its raylet and every process under it
killed with SIGKILL at once (no SIGTERM, no goodbye to the GCS, which notices only by its
health checks). The engine must still account for everything: the non-idempotent action ends
NODE_LOST, the idempotent ones finish elsewhere (re-run), the model instance is gone from the
cluster view, and no later command goes to the dead node.

Engine + Core + RayExecutor + real NodeHosts (real sandboxes, the tiny reward model on CPU) on
the folder's shared `ray.cluster_utils.Cluster`; the crashed node is this test's own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping

import pytest
from _ray_helpers import OBJECT_STORE, wait_until

from arl_tangram.core.actions import ActionKind, ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec, ModelSpec
from arl_tangram.core.core import Core, CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.managers.gpu import build_tiny_models
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.ray_agent import make_node_host
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _core_factory(cfg: EngineConfig, nodes):  # type: ignore[no-untyped-def]
    return Core(ClusterSpec(tuple(nodes), tuple(cfg.models)), CoreConfig(policy=cfg.policy))


def _sleeper(aid: str, seconds: float, *, idempotent: bool = True, special: float = 0) -> ActionSpec:
    code = f"import time\ntime.sleep({seconds})\nprint('done', {aid!r}.__repr__())\n"
    return ActionSpec(aid, demand=Resources(cpu=1, memory_mb=128, special=special),
                      idempotent=idempotent, timeout_s=300,
                      payload={"code": code, "language": "python", "run_timeout": 240})


def _ok(res) -> bool:  # type: ignore[no-untyped-def]
    out = res.output if isinstance(res.output, Mapping) else {}
    stdout = (out.get("run_result") or {}).get("stdout", "")
    return res.status is Status.SUCCEEDED and f"done {res.id!r}" in stdout


def _power_off(raylet_pid: int) -> None:
    """SIGKILL the raylet and, at once, every process under it (its workers: the node's agent,
    its managers, its sandboxes), as a power-off would: no SIGTERM, nothing told to the GCS,
    which learns of it only by its health checks. (The raylet alone is not enough: its workers
    outlive it for a while and finish their actions, so the outcome would depend on timing.)"""
    import psutil

    procs = [psutil.Process(raylet_pid), *psutil.Process(raylet_pid).children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


def _running_on(eng: Engine, node: str) -> int:
    return sum(n["running"] for n in eng.cluster_view().to_dict()["nodes"] if n["name"] == node)


def _instances_on(eng: Engine, node: str) -> list[dict]:
    return [i for i in eng.cluster_view().to_dict()["instances"] if i["node"] == node]


async def test_raylet_sigkill_loses_nothing_and_drops_the_model_instance(ray_cluster, tmp_path):
    paths = build_tiny_models(tmp_path / "models")
    rm = ModelSpec("tiny-rm", kind="scalar", path=paths["scalar"], memory_mb=64, load_s=1.0)
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.25, poll_wait_s=0.5,
                                       cpu={"warm_min": 1, "warm_max": 4},
                                       gpu={"device": "cpu"}),
                     models=[rm], host_factory=make_node_host)
    eng = Engine(ex, EngineConfig(tick_s=0.2, models=(rm,)), core_factory=_core_factory)
    await eng.start()
    extra = None
    try:
        base = set(eng.nodes)
        # the node that will crash: 3 CPUs, the only "GPU" (the model runs on CPU there), and a
        # custom resource only it offers
        extra = ray_cluster.add_node(num_cpus=3, num_gpus=1, object_store_memory=OBJECT_STORE,
                                     memory=2 * 2**30, resources={"tangram_special": 1.0},
                                     labels={"tangram.io/gpu-memory-mb": "1000"})
        new = extra.node_id
        await wait_until(lambda: new in ex.nodes_up(), 90, "the new node's agent")
        # reward actions: the core loads the model (every node's GPU manager runs on CPU here,
        # so every node offers "devices"); wait until the new node holds a ready instance
        scores = await eng.submit([ActionSpec(f"score-{i}", kind=ActionKind.REWARD, model="tiny-rm",
                                              payload={"query": f"{i} + {i}"}) for i in range(4)])
        for r in (await asyncio.wait_for(asyncio.gather(*(eng.result(i) for i in scores)), 120)):
            assert r is not None and r.status is Status.SUCCEEDED, r
        await wait_until(lambda: [i["state"] for i in _instances_on(eng, new)] == ["ready"], 90,
                         "a ready instance of tiny-rm on the new node")
        # a non-idempotent action that only the new node can run, running there
        [once] = await eng.submit([_sleeper("once", 200, idempotent=False, special=1)])
        await wait_until(lambda: _running_on(eng, new) == 1, 60, "once running")
        # idempotent ones for every free CPU: 5 on the base nodes, 2 on the new one
        idem = await eng.submit([_sleeper(f"idem{i}", 4.0) for i in range(7)])
        await wait_until(lambda: _running_on(eng, new) == 3, 60, "idem* running on the new node")
        await asyncio.sleep(0.5)  # they are really executing in sandboxes there

        _power_off(extra.all_processes["raylet"][0].process.pid)

        res = dict(zip(once_idem := [once, *idem],
                       await asyncio.wait_for(asyncio.gather(*(eng.result(i) for i in once_idem)),
                                              150), strict=True))
        assert res[once].status is Status.NODE_LOST and "lost" in res[once].reason, res[once]
        assert all(_ok(res[a]) for a in idem), [res[a] for a in idem if not _ok(res[a])]
        rerun = [res[a] for a in idem if res[a].attempts >= 2]
        assert len(rerun) == 2 and all(r.node in base for r in rerun), rerun
        await wait_until(lambda: new not in ex.nodes_up(), 60, "the crashed node reported lost")
        alive = {n["name"] for n in eng.cluster_view().to_dict()["nodes"] if n["alive"]}
        assert alive == base
        assert _instances_on(eng, new) == []  # the instance died with its node
        # the model is still served, by an instance on a surviving node
        [late] = await eng.submit([ActionSpec("score-late", kind=ActionKind.REWARD,
                                              model="tiny-rm", payload={"query": "x"})])
        after = await eng.result(late, wait=90)
        assert after is not None and after.status is Status.SUCCEEDED and after.node in base, after
        assert _instances_on(eng, new) == []
    finally:
        if extra is not None:
            ray_cluster.remove_node(extra, allow_graceful=False)
        await eng.aclose()
