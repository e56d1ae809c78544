"""RayExecutor on a real multi-node Ray cluster, with the in-package EchoHost (transport only).

These check the executor's own contract: discovery, pinning, batching, membership, and that a
lost node is reported exactly once and nothing from it is emitted afterwards.
"""

from __future__ import annotations

import asyncio

import pytest
from _ray_helpers import OBJECT_STORE, Collector, wait_until

from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.commands import StartAction
from arl_tangram.core.events import ActionFinished, NodeAdded, NodeLost
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.ray_agent import EchoHost
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration

FAST = RayExecutorConfig(membership_interval_s=0.2, poll_wait_s=0.5)


def start_cmd(aid: str, node: str, **payload: object) -> StartAction:
    return StartAction(ActionSpec(aid, payload=payload), node, Resources(cpu=1))


async def test_discovers_every_node_with_its_resources(ray_cluster):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    specs = await ex.start(got)
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert {s.name for s in specs} == alive
        by_cpu = sorted(s.capacity.get("cpu") for s in specs)
        assert by_cpu[:3] == [1.0, 2.0, 2.0]
        custom = [s for s in specs if s.capacity.get("disk_gb")]
        assert len(custom) == 1 and custom[0].capacity.get("disk_gb") == 50.0
        assert custom[0].pool == "sandbox" and custom[0].labels.get("zone") == "b"
        await wait_until(lambda: len(ex.node_info()) == len(specs) and all(
            "agent" in d for d in ex.node_info().values()), 10, "node info")
        info = ex.node_info()
        assert all(d["ray"]["node_id"] in alive for d in info.values())
    finally:
        await ex.aclose()


async def test_actions_spread_and_run_on_their_node(ray_cluster):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    specs = await ex.start(got)
    try:
        names = [s.name for s in specs]
        cmds = [start_cmd(f"s{i}", names[i % len(names)]) for i in range(60)]
        for i in range(0, 60, 7):  # several bursts, as the engine would send them
            await ex.submit(cmds[i:i + 7])
        await wait_until(lambda: len(got.of(ActionFinished)) == 60, 60, "60 results")
        fin = {e.action_id: e for e in got.of(ActionFinished)}
        assert len(fin) == 60
        for c in cmds:
            e = fin[c.action.id]
            assert e.status is Status.SUCCEEDED
            assert e.output["ray_node_id"] == c.node  # ran on the Ray node it was sent to
        assert {e.output["node"] for e in fin.values()} == set(names)
    finally:
        await ex.aclose()


async def test_node_added_and_removed_mid_run(ray_cluster):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    specs = await ex.start(got)
    extra = None
    try:
        extra = ray_cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
        await wait_until(lambda: got.of(NodeAdded), 60, "NodeAdded")
        [added] = got.of(NodeAdded)
        assert added.node.name == extra.node_id and added.node.name not in {s.name for s in specs}
        await ex.submit([start_cmd("on-new", added.node.name)])
        await wait_until(lambda: got.of(ActionFinished), 30, "result from the new node")
        assert got.of(ActionFinished)[0].output["ray_node_id"] == extra.node_id

        long = [start_cmd(f"long{i}", added.node.name, sleep_s=60) for i in range(5)]
        await ex.submit(long)
        await asyncio.sleep(0.5)
        ray_cluster.remove_node(extra)
        extra = None
        await wait_until(lambda: got.of(NodeLost), 60, "NodeLost")
        await ex.submit([start_cmd("too-late", added.node.name)])  # dropped: the core settles it
        await asyncio.sleep(1.5)  # several membership rounds: still reported once
        assert [e.node for e in got.of(NodeLost)] == [added.node.name]
        after = got.events[got.events.index(got.of(NodeLost)[0]) + 1:]
        assert not [e for e in after if getattr(e, "action_id", "").startswith(("long", "too"))]
        assert added.node.name not in ex.node_info()
        assert ex.dropped_commands >= 1
    finally:
        if extra is not None:
            ray_cluster.remove_node(extra)
        await ex.aclose()


async def test_dead_agent_on_live_node_is_lost_once_and_replaced(ray_cluster):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    specs = await ex.start(got)
    try:
        victim = specs[0].name
        handle = ray.get_actor(f"tangram-agent-{victim}", namespace=FAST.namespace)
        await ex.submit([start_cmd("doomed", victim, sleep_s=60)])
        await asyncio.sleep(0.3)
        ray.kill(handle, no_restart=True)
        await wait_until(lambda: got.of(NodeLost) and got.of(NodeAdded), 60, "loss and re-add")
        assert [e.node for e in got.of(NodeLost)] == [victim]
        [again] = got.of(NodeAdded)
        assert again.node.name == f"{victim}~1"
        await ex.submit([start_cmd("after", again.node.name)])
        await wait_until(lambda: [e for e in got.of(ActionFinished) if e.action_id == "after"], 30)
        assert not [e for e in got.of(ActionFinished) if e.action_id == "doomed"]
    finally:
        await ex.aclose()


async def test_aclose_cancels_running_actions(ray_cluster):
    ex = RayExecutor(FAST, host_factory=EchoHost)
    got = Collector()
    specs = await ex.start(got)
    await ex.submit([start_cmd(f"c{i}", s.name, sleep_s=60) for i, s in enumerate(specs)])
    await asyncio.sleep(0.5)
    await ex.aclose()
    fin = got.of(ActionFinished)
    assert sorted(e.action_id for e in fin) == sorted(f"c{i}" for i in range(len(specs)))
    assert {e.status for e in fin} == {Status.CANCELLED}
    assert not ray.util.list_named_actors(all_namespaces=True) or all(
        not a["name"].startswith("tangram-agent-") for a in
        ray.util.list_named_actors(all_namespaces=True))


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="poll_wait_s"):
        RayExecutorConfig(poll_wait_s=0)
    with pytest.raises(ValueError, match="max_agent_restarts"):
        RayExecutorConfig(max_agent_restarts=-1)
