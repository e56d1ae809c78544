"""Acceptance: Engine + Core + RayExecutor + real NodeHosts (real sandboxes) on a real Ray cluster.

- actions spread across the nodes;
- a node added mid-run receives work;
- a node removed mid-run loses nothing accepted: every action ends with a result or NODE_LOST,
  idempotent ones re-run elsewhere and succeed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

import pytest
from _ray_helpers import OBJECT_STORE, wait_until

from arl_tangram.core import commands as C
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.core import Core, CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.ray_agent import make_node_host
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration

CPU_CFG = {"warm_min": 1, "warm_max": 4}


def core_factory(cfg: EngineConfig, nodes):
    return Core(ClusterSpec(tuple(nodes), tuple(cfg.models)), CoreConfig(policy=cfg.policy))


def sleeper(aid: str, seconds: float, *, idempotent: bool = True, special: float = 0) -> ActionSpec:
    code = f"import time\ntime.sleep({seconds})\nprint('done', {aid!r}.__repr__())\n"
    demand = Resources(cpu=1, memory_mb=128, special=special)
    return ActionSpec(aid, demand=demand, idempotent=idempotent,
                      timeout_s=60, payload={"code": code, "language": "python"})


def ok(res) -> bool:
    """It ran to the end in a real sandbox and printed what it should."""
    out = res.output if isinstance(res.output, Mapping) else {}
    stdout = (out.get("run_result") or {}).get("stdout", "")
    return res.status is Status.SUCCEEDED and f"done {res.id!r}" in stdout


async def make_engine() -> tuple[Engine, RayExecutor]:
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.25, poll_wait_s=0.5, cpu=CPU_CFG,
                                       gpu=None), host_factory=make_node_host)
    eng = Engine(ex, EngineConfig(tick_s=0.2), core_factory=core_factory)
    await eng.start()
    return eng, ex


async def results(eng: Engine, ids: list[str], timeout: float = 120.0) -> dict:
    done = await asyncio.wait_for(asyncio.gather(*(eng.result(i) for i in ids)), timeout)
    return dict(zip(ids, done, strict=True))


async def test_actions_spread_across_nodes(ray_cluster):
    eng, ex = await make_engine()
    try:
        assert len(eng.nodes) >= 3
        ids = await eng.submit([sleeper(f"spread{i}", 1.0) for i in range(12)])
        res = await results(eng, ids)
        bad = {k: (v.status, v.reason, v.output) for k, v in res.items() if not ok(v)}
        assert not bad
        used = {r.node for r in res.values()}
        assert len(used) >= 3, used
        view = eng.cluster_view().to_dict()
        assert {n["name"] for n in view["nodes"]} >= set(eng.nodes)
        assert all("ray" in n for n in view["nodes"])
        # a resize reaches its node's agent through Ray; one for an ended action is dropped,
        # and the stats count it once that node's info is refreshed
        done = res[ids[0]]
        assert isinstance(done.node, str)
        await ex.submit([C.ResizeAction(done.id, done.node, Resources(cpu=1, memory_mb=128))])
        await wait_until(lambda: eng.stats()["resizes"]["dropped"] == 1, 30, "the dropped resize")
        assert eng.stats()["resizes"] == {"applied": 0, "deferred": 0, "dropped": 1}
    finally:
        await eng.aclose()


def running_on(eng: Engine, node: str) -> int:
    return sum(n["running"] for n in eng.cluster_view().to_dict()["nodes"] if n["name"] == node)


async def test_node_added_mid_run_gets_work_and_removed_node_loses_nothing(ray_cluster):
    eng, ex = await make_engine()
    extra = None
    try:
        base = set(eng.nodes)
        pre = await eng.submit([sleeper(f"pre{i}", 1.5) for i in range(6)])
        # mid-run: a node joins with 5 CPUs and a custom resource only it offers
        extra = ray_cluster.add_node(num_cpus=5, object_store_memory=OBJECT_STORE,
                                     memory=2 * 2**30, resources={"tangram_special": 2.0})
        new = extra.node_id
        await wait_until(lambda: new in ex.nodes_up(), 90, "the new node's agent")
        [probe] = await eng.submit([sleeper("probe", 0.2, special=1)])
        got = await eng.result(probe, wait=60)
        assert got is not None and ok(got) and got.node == new  # the new node did work
        # two non-idempotent actions that only the new node can run, held there
        once = await eng.submit([sleeper(f"once{i}", 60, idempotent=False, special=1)
                                 for i in range(2)])
        await wait_until(lambda: running_on(eng, new) == 2, 60, "once* running")
        # a session whose state lives on the new node, with an (idempotent) action in it
        sid = await eng.open_session("sess", node=new)
        [in_sess] = await eng.submit([dataclasses.replace(sleeper("in-sess", 60), session=sid)])
        await wait_until(lambda: running_on(eng, new) == 3, 60, "the session's action running")
        await results(eng, pre)
        # nine idempotent ones for seven free CPUs (two of them on the new node): the core fills every node, the new one too
        idem = await eng.submit([sleeper(f"idem{i}", 6.0) for i in range(9)])
        await wait_until(lambda: running_on(eng, new) == 5, 60, "idem* running on the new node")
        await asyncio.sleep(0.5)  # they are really executing in sandboxes there
        ray_cluster.remove_node(extra)
        extra = None
        res = await results(eng, once + idem + [in_sess], timeout=180)
        assert len(res) == len(once) + len(idem) + 1  # nothing silently lost
        for aid in [*once, in_sess]:  # a session's state died with its node: never re-run
            assert res[aid].status is Status.NODE_LOST and "lost" in res[aid].reason, res[aid]
        assert all(ok(res[a]) for a in idem), [res[a] for a in idem if not ok(res[a])]
        rerun = [res[a] for a in idem if res[a].attempts >= 2]
        assert len(rerun) == 2  # exactly the two that were on the lost node ran again...
        assert all(r.node in base for r in rerun)  # ...elsewhere
        alive = {n["name"] for n in eng.cluster_view().to_dict()["nodes"] if n["alive"]}
        assert alive == base and set(ex.nodes_up()) == base
    finally:
        if extra is not None:
            ray_cluster.remove_node(extra)
        await eng.aclose()
