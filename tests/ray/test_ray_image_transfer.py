"""Images between Ray nodes (issue 26, item 3) on the shared test cluster, with real NodeHosts
(real sandboxes), and no shared path: an image is imported on one node from a directory that
is removed right after, so no other node can read its source. A session placed on another node
pulls it from the first, layer by layer, in chunks that travel as Ray objects; its first action
reports the pull (``image_pull``: from where, how long, layers and bytes sent) and the wait
(``image_import_s``), and the node's info shows the transfer (as /v1/cluster does). A second
image sharing the base layer sends only its own top layer. A source only the driver reads is
sent to one node (`upload_image`) and pulled from there. `replicate_image` pulls an image onto
every node that lacks it at once."""

from __future__ import annotations

import os
import shutil
import tempfile

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

CHUNK = 1 << 20  # (the test nodes' object stores are 80 MiB)


def core_factory(cfg: EngineConfig, nodes):
    return Core(ClusterSpec(tuple(nodes), tuple(cfg.models)), CoreConfig(policy=cfg.policy))


def bash(aid: str, code: str, session: str) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TOOL, demand=Resources(cpu=1, memory_mb=128),
                      session=session, timeout_s=30, payload={"code": code, "language": "bash"})


def image_dirs(base_tar: str, name: str) -> str:
    """An OCI layout of ``base_tar`` and a top layer of its own, in a fresh temporary dir."""
    d = tempfile.mkdtemp(prefix=f"xfer-{name}-")
    top = os.path.join(d, "top")
    os.makedirs(os.path.join(top, "etc"))
    with open(os.path.join(top, "etc", "which"), "w") as f:
        f.write(name)
    imagekit.pack_layer(top, os.path.join(d, "top.tar"))
    return imagekit.write_oci_layout(os.path.join(d, "oci"), [base_tar, os.path.join(d, "top.tar")],
                                     {"Env": [f"IMG={name}"]})


async def test_an_image_imported_on_one_node_serves_sessions_on_others(ray_cluster, tmp_path) -> None:
    root = imagekit.host_rootfs(str(tmp_path / "rootfs"))
    base_tar = imagekit.pack_layer(root, str(tmp_path / "base.tar"))
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.25, poll_wait_s=0.5, gpu=None,
                                       cpu={"warm_min": 0, "warm_max": 2},
                                       image_chunk_bytes=CHUNK),
                     host_factory=make_node_host)
    eng = Engine(ex, EngineConfig(tick_s=0.2), core_factory=core_factory)
    await eng.start()
    sessions: list[str] = []
    try:
        nodes = sorted(eng.nodes)
        assert len(nodes) >= 3
        a, b, c = nodes[:3]
        pulls = {}
        for name in ("one", "two"):
            src = image_dirs(base_tar, name)
            got = await ex.import_image(src, f"xfer-{name}", node=a)
            assert got["imported_on"] == a and got["holders"] == [a]
            shutil.rmtree(os.path.dirname(src))  # no node can read the source any more
            sid = await eng.open_session(f"xfer-{name}-b", image=f"xfer-{name}", node=b)
            sessions.append(sid)
            r = await eng.run(bash(f"xfer-{name}-r", "cat /etc/which; echo; echo $IMG", sid))
            assert r.status is Status.SUCCEEDED and r.node == b, (r.reason, r.output)
            assert r.output["run_result"]["stdout"].split() == [name, name]
            assert r.output["image_import_s"] > 0
            pulls[name] = r.output["image_pull"]
            assert pulls[name]["from"] == a and pulls[name]["s"] > 0
        # the first pull sent both layers (the base in several chunks); the second only its top
        assert (pulls["one"]["layers_sent"], pulls["one"]["layers_had"]) == (2, 0)
        assert (pulls["two"]["layers_sent"], pulls["two"]["layers_had"]) == (1, 1)
        assert pulls["one"]["bytes"] > 2 * CHUNK and 0 < pulls["two"]["bytes"] < CHUNK
        # a second session of the image on b waits for nothing
        sid = await eng.open_session("xfer-one-b2", image="xfer-one", node=b)
        sessions.append(sid)
        r = await eng.run(bash("xfer-one-r2", "cat /etc/which", sid))
        assert r.status is Status.SUCCEEDED and "image_pull" not in r.output, r.output
        # the transfers are visible in the nodes' info (/v1/cluster) and /v1/images
        # (node info is a snapshot the agents refresh: wait until it has seen both pulls end)
        def _ended() -> bool:
            ts = ex.node_info().get(b, {}).get("image_transfers") or []
            return len(ts) == 2 and all(t["state"] != "pulling" for t in ts)

        await wait_until(_ended, 30, "b's transfers in its info, ended")
        done = ex.node_info()[b]["image_transfers"]
        assert [(t["image"], t["state"], t["from"]) for t in done] == \
            [("xfer-one", "done", a), ("xfer-two", "done", a)]
        assert ex.node_info()[a]["image_served"] == {
            "layers": 3, "bytes": pulls["one"]["bytes"] + pulls["two"]["bytes"]}
        assert ex.list_images()["transfers"][b] == done
        await wait_until(lambda: ex.list_images()["holders"].get("xfer-one") == [a, b], 10,
                         "b known to hold the image")
        # a source only the driver can read: sent to c as an archive, imported there; b, which
        # has the base layer, pulls only the top one from c
        src = image_dirs(base_tar, "three")
        up = await ex.upload_image(src, "xfer-three", node=c)
        assert up["uploaded"] and up["imported_on"] == c and up["holders"] == [c]
        shutil.rmtree(os.path.dirname(src))
        sid = await eng.open_session("xfer-three-b", image="xfer-three", node=b)
        sessions.append(sid)
        r = await eng.run(bash("xfer-three-r", "cat /etc/which", sid))
        assert r.status is Status.SUCCEEDED and r.output["run_result"]["stdout"] == "three"
        assert r.output["image_pull"]["from"] == c
        assert (r.output["image_pull"]["layers_sent"], r.output["image_pull"]["layers_had"]) == (1, 1)
        # eagerly: every other node pulls it now (from a or b); c has the base layer already
        rep = await ex.replicate_image("xfer-one")
        assert set(rep["nodes"]) == set(nodes) - {a, b}
        assert rep["nodes"][c]["image_pull"]["from"] in (a, b)
        assert (rep["nodes"][c]["image_pull"]["layers_sent"],
                rep["nodes"][c]["image_pull"]["layers_had"]) == (1, 1)
        assert sorted(ex.list_images()["holders"]["xfer-one"]) == nodes
        for s in sessions:
            await eng.close_session(s)
        sessions.clear()
        await wait_until(lambda: all(i["in_use"] == 0 for i in ex.node_info()[b].get("images", [])),
                         10, "the sessions closed on b")
        for name in ("xfer-one", "xfer-two", "xfer-three"):
            await ex.remove_image(name)
        assert "xfer-one" not in ex.list_images()["holders"]
    finally:
        for s in sessions:
            await eng.close_session(s)
        await eng.aclose()
