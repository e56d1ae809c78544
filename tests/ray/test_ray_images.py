"""Environment images on Ray (issue 17, item 5; issue 26, item 3): real NodeHosts (real
sandboxes) on the shared test cluster. An import reads the path on one node, the driver's (the
other nodes would pull it from there on first use: tests/ray/test_ray_image_transfer.py); that
node reports it held, and image sessions go to it, where the spread alone would pick an emptier
node. With ``eager_images`` every node imports the path (every node can read it) at start."""

from __future__ import annotations

import os

import pytest
from _ray_helpers import wait_until

from arl_tangram.core.actions import ActionKind, ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.core import Core, CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.ray_agent import make_node_host
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root")]


def core_factory(cfg: EngineConfig, nodes):
    return Core(ClusterSpec(tuple(nodes), tuple(cfg.models)), CoreConfig(policy=cfg.policy))


def bash(aid: str, code: str, session: str) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TOOL, demand=Resources(cpu=1, memory_mb=128),
                      session=session, timeout_s=30, payload={"code": code, "language": "bash"})


def warm_on(eng: Engine, key: str) -> set[str]:
    return {n["name"] for n in eng.cluster_view().to_dict()["nodes"] if n["warm"].get(key, 0) > 0}


async def test_image_imported_on_one_node_and_sessions_follow_it(ray_cluster, tmp_path) -> None:
    root = imagekit.host_rootfs(str(tmp_path / "rootfs"))
    tar = imagekit.pack_layer(root, str(tmp_path / "mini.tar"))
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.25, poll_wait_s=0.5, gpu=None,
                                       cpu={"warm_min": 0, "warm_max": 2}),
                     host_factory=make_node_host)
    eng = Engine(ex, EngineConfig(tick_s=0.2), core_factory=core_factory)
    await eng.start()
    try:
        assert len(eng.nodes) >= 2
        got = await ex.import_image(tar, "raymini")  # on one node: the driver's, which reads it
        first = got["imported_on"]
        assert ex._nodes[first].ray_node_id == ray.get_runtime_context().get_node_id()
        assert got["lazy"] and set(got["nodes"]) == {first} and got["holders"] == [first]
        assert ex.has_image("raymini") is True
        await wait_until(lambda: warm_on(eng, "image:raymini") == {first}, 30, "the warm report")
        s1 = await eng.open_session("ray-img-1", image="raymini")
        r1 = await eng.run(bash("r1", "cat /etc/os-release", s1))
        assert r1.status is Status.SUCCEEDED and r1.node == first, (r1.reason, r1.output)
        assert "ID=tangram-mini" in r1.output["run_result"]["stdout"]
        assert "image_import_s" not in r1.output  # it was there already
        s2 = await eng.open_session("ray-img-2", image="raymini")
        r2 = await eng.run(bash("r2", "cat /etc/os-release", s2))
        assert r2.status is Status.SUCCEEDED and r2.node == first, (r2.node, first, r2.reason)
        assert "image_import_s" not in r2.output
        # without the image, the spread puts a session elsewhere (fewer sessions per core)
        s3 = await eng.open_session("ray-plain")
        r3 = await eng.run(bash("r3", "true", s3))
        assert r3.node != first
        await wait_until(lambda: any(n.get("images") for n in ex.node_info().values()), 10,
                         "node info with images")
        listed = ex.list_images()
        assert [i["name"] for i in listed["nodes"][first]] == ["raymini"]
        assert listed["sources"] == {"raymini": tar}
        for s in (s1, s2, s3):
            await eng.close_session(s)
        await wait_until(lambda: [i["in_use"] for i in ex.node_info()[first].get("images", [])] == [0],
                         10, "the sessions closed on the node")
        out = await ex.remove_image("raymini")
        assert out["removed"] == [first]
        await wait_until(lambda: not warm_on(eng, "image:raymini"), 10, "the removal reported")
        await wait_until(lambda: ex.has_image("raymini") is False, 10, "node info refreshed")
    finally:
        await eng.aclose()


async def test_eager_images_are_imported_when_agents_start(ray_cluster, tmp_path) -> None:
    root = imagekit.host_rootfs(str(tmp_path / "rootfs"))
    tar = imagekit.pack_layer(root, str(tmp_path / "eager.tar"))
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.25, poll_wait_s=0.5, gpu=None,
                                       cpu={"warm_min": 0, "warm_max": 2},
                                       images=(("rayeager", tar),), eager_images=("rayeager",)),
                     host_factory=make_node_host)
    eng = Engine(ex, EngineConfig(tick_s=0.2), core_factory=core_factory)
    await eng.start()
    try:
        await wait_until(lambda: warm_on(eng, "image:rayeager") == set(eng.nodes), 20,
                         "every node reports the image held")
        s = await eng.open_session("ray-eager", image="rayeager")
        r = await eng.run(bash("e1", "cat /etc/os-release", s))
        assert r.status is Status.SUCCEEDED and "image_import_s" not in r.output, r.output
        await eng.close_session(s)
        await wait_until(lambda: [i["in_use"] for i in ex.node_info()[r.node].get("images", [])] == [0],
                         30, "the session closed on the node")  # (a snapshot: refreshed)
        await ex.remove_image("rayeager")
    finally:
        await eng.aclose()
