"""The documented rule "a node is reported lost when Ray says it is dead" on its own (issue 27;
the audit's R2): Ray's membership reports the node dead while its agent still answers (the GCS
lost it -- a partition between the GCS and the node, or a crash the GCS saw first). Nothing
fails on the agent's side, so only the membership watch can tell: the executor must report the
node lost, once, and deliver nothing of it afterwards (its actions there are settled by the
core as lost, even though the agent would still report them).

Executor contract (the in-package `EchoHost`); Ray's answer is the only thing replaced."""

from __future__ import annotations

import asyncio

import pytest
from _ray_helpers import OBJECT_STORE, Collector, wait_until

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.commands import StartAction
from arl_tangram.core.events import ActionFinished, NodeAdded, NodeLost
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.ray_agent import EchoHost
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration

FAST = RayExecutorConfig(membership_interval_s=0.2, poll_wait_s=0.5)


def _start(aid: str, node: str, **payload: object) -> StartAction:
    return StartAction(ActionSpec(aid, payload=dict(payload)), node, Resources(cpu=1))


async def test_a_node_ray_reports_dead_is_lost_though_its_agent_answers(ray_cluster, monkeypatch):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    await ex.start(got)
    extra = None
    try:
        extra = ray_cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
        await wait_until(lambda: got.of(NodeAdded), 60, "NodeAdded")
        [added] = got.of(NodeAdded)
        name = added.node.name
        await ex.submit([_start("warm", name)])
        await wait_until(lambda: got.of(ActionFinished), 30, "a result from the new node")
        await ex.submit([_start(f"long{i}", name, sleep_s=3) for i in range(3)])
        await asyncio.sleep(0.5)

        real = ray.nodes

        def nodes_with_extra_dead():  # type: ignore[no-untyped-def]
            return [{**n, "Alive": False} if n["NodeID"] == extra.node_id else n for n in real()]

        monkeypatch.setattr(ray, "nodes", nodes_with_extra_dead)
        await wait_until(lambda: got.of(NodeLost), 30, "NodeLost from the membership watch")
        assert [e.node for e in got.of(NodeLost)] == [name]
        assert "Ray" in got.of(NodeLost)[0].reason or "died" in got.of(NodeLost)[0].reason
        assert name not in ex.nodes_up()
        # the agent is alive and its actions end 3 s after they started: none is delivered
        await asyncio.sleep(4)
        assert not [e for e in got.of(ActionFinished) if e.action_id.startswith("long")]
        assert [e.node for e in got.of(NodeLost)] == [name]  # once
        # and the node is not re-added while Ray reports it dead
        assert [e.node.name for e in got.of(NodeAdded)] == [name]
    finally:
        monkeypatch.undo()
        if extra is not None:
            ray_cluster.remove_node(extra)
        await ex.aclose()
