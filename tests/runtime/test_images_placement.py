"""Environment images and placement (issue 17, item 5), on the local executor with two nodes:
a node reports the images its cache holds as warm state ("image:NAME"), the engine asks for an
image session with that warm key, so the session opens on the node holding the image even where
the plain spread would pick the other; a node that knows the image's source but lacks it
imports it on first use and the session's first action reports the wait (``image_import_s``)."""

from __future__ import annotations

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec, Status
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.config import NodeConfig
from arl_tangram.runtime.engine import Engine
from arl_tangram.runtime.local import LocalExecutor

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def image_tar(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("img")
    root = imagekit.host_rootfs(str(d / "rootfs"))
    return imagekit.pack_layer(root, str(d / "mini.tar"))


def bash(aid: str, code: str, session: str | None = None) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TOOL, demand=Resources(cpu=1, memory_mb=128),
                      session=session, timeout_s=30, payload={"code": code, "language": "bash"})


def _node(name: str, tmp_path, cpu: float) -> NodeConfig:
    return NodeConfig(name=name, capacity=Resources(cpu=cpu, memory_mb=4096),
                      cpu=CpuManagerConfig(work_root=str(tmp_path / name), warm_min=0), gpu=None)


async def test_image_session_opens_where_the_image_is_and_imports_on_first_use(
        tmp_path, image_tar: str) -> None:
    # n2 has twice the CPU: the plain spread opens sessions there
    ex = LocalExecutor([_node("n1", tmp_path, 2), _node("n2", tmp_path, 4)])
    async with Engine(ex) as eng:
        await ex.import_image(image_tar, "mini", node="n1")
        await eng.run(bash("warm-up", "true"))  # (the warm report has reached the core)
        assert eng.cluster_view().to_dict()["nodes"][0]["warm"].get("image:mini") == 1
        plain = await eng.open_session("plain")
        [r] = await eng.submit([bash("p", "true", session=plain)])
        assert (await eng.result(r)).node == "n2"
        sid = await eng.open_session("img", image="mini")
        res = await eng.run(bash("a", "cat /etc/os-release", session=sid))
        assert res.status is Status.SUCCEEDED and res.node == "n1", res
        assert "ID=tangram-mini" in res.output["run_result"]["stdout"]
        assert "image_import_s" not in res.output  # it was there already
        # n2 learns the source (as a Ray node does) and lacks the image: imported on first use
        assert ex.hosts["n2"].images.add_source("mini", image_tar)["held"] is False
        sid2 = await eng.open_session("img2", image="mini", node="n2")
        res = await eng.run(bash("b", "cat /etc/os-release", session=sid2))
        assert res.status is Status.SUCCEEDED and res.node == "n2", res
        assert "ID=tangram-mini" in res.output["run_result"]["stdout"]
        assert res.output["image_import_s"] > 0
        assert all(n["warm"].get("image:mini") == 1 for n in eng.cluster_view().to_dict()["nodes"])
        # a one-shot action in an image a node knows only by its source: imported there first
        for h in ex.hosts.values():
            h.images.add_source("mini2", image_tar)
        res = await eng.run(ActionSpec("once", demand=Resources(cpu=1, memory_mb=128), timeout_s=30,
                                       payload={"code": "cat /etc/os-release", "language": "bash",
                                                "image": "mini2"}))
        assert res.status is Status.SUCCEEDED, res
        assert "ID=tangram-mini" in res.output["run_result"]["stdout"]
        assert res.output["image_import_s"] > 0
        for s in ("plain", "img", "img2"):
            await eng.close_session(s)
        await eng.run(bash("settle", "true"))
        out = await ex.remove_image("mini")
        assert sorted(out["removed"]) == ["n1", "n2"]
        await ex.remove_image("mini2")
        await eng.run(bash("settle2", "true"))
        assert all(n["warm"].get("image:mini") == 0 for n in eng.cluster_view().to_dict()["nodes"])
