"""Pure helpers of the agent (no Ray needed): reading capacity and topology from a Ray node."""

from __future__ import annotations

import asyncio

import pytest

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.commands import StartAction
from arl_tangram.core.events import ActionFinished, ActionStarted
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.ray_agent import (
    AgentSetup,
    EchoHost,
    NodeAgent,
    capacity_from_ray,
    domains_from_ray,
    parse_domains,
    pool_from_ray,
)


def test_parse_domains_accepts_label_and_loose_forms():
    assert parse_domains("0-1-2-3_4-5-6-7") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert parse_domains("0,1;2,3") == ((0, 1), (2, 3))
    assert parse_domains("") == ()
    with pytest.raises(ValueError, match="nvlink-domains"):
        parse_domains("0-x")


def test_capacity_from_ray_maps_standard_and_custom_dims():
    res = {"CPU": 8.0, "memory": 4 * 2**30, "GPU": 2.0, "tangram_disk_gb": 100.0,
           "tangram_nvlink_domain_size": 2.0, "node:1.2.3.4": 1.0, "object_store_memory": 1e8}
    cap = capacity_from_ray(res, {"tangram.io/gpu-memory-mb": "16000"})
    assert cap == Resources(cpu=8, memory_mb=4096, gpu=2, gpu_memory_mb=32000, disk_gb=100)


def test_capacity_rejects_bad_gpu_memory_label():
    with pytest.raises(ValueError, match="gpu-memory-mb"):
        capacity_from_ray({"GPU": 1.0}, {"tangram.io/gpu-memory-mb": "lots"})


def test_domains_from_label_then_resource_then_none():
    assert domains_from_ray({"GPU": 4.0}, {"tangram.io/nvlink-domains": "0-1_2-3"}) == ((0, 1), (2, 3))
    assert domains_from_ray({"GPU": 4.0, "tangram_nvlink_domain_size": 2.0}, {}) == ((0, 1), (2, 3))
    assert domains_from_ray({"GPU": 4.0}, {}) is None


def test_pool_from_label_or_gpu_presence():
    assert pool_from_ray({"GPU": 1.0}, {}) == "gpu"
    assert pool_from_ray({"CPU": 1.0}, {}) == "cpu"
    assert pool_from_ray({"CPU": 1.0}, {"tangram.io/pool": "sandbox"}) == "sandbox"


async def test_agent_in_process_batches_events_in_order():
    setup = AgentSetup(name="n1", ray_node_id="abc", capacity=Resources(cpu=2),
                       host_factory=EchoHost)
    agent = NodeAgent(setup)
    spec = await agent.start()
    assert spec.name == "n1" and spec.capacity == Resources(cpu=2)
    cmds = [StartAction(ActionSpec(f"a{i}"), "n1", Resources(cpu=1)) for i in range(5)]
    assert await agent.submit(cmds) == 5
    events = []
    while len(events) < 10:
        events += await agent.poll(1.0)
    finished = [e.action_id for e in events if isinstance(e, ActionFinished)]
    assert sorted(finished) == [f"a{i}" for i in range(5)]
    assert sum(isinstance(e, ActionStarted) for e in events) == 5
    assert await agent.poll(0.01) == []
    long = StartAction(ActionSpec("slow", payload={"sleep_s": 30}), "n1", Resources(cpu=1))
    await agent.submit([long])
    await asyncio.sleep(0.01)
    rest = await agent.shutdown()
    last = [e for e in rest if isinstance(e, ActionFinished)]
    assert [e.status.name for e in last] == ["CANCELLED"]
