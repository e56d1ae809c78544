"""Environment images over the service (issue 17): POST/GET/DELETE /v1/images, a session in an
image through the SDK, a one-shot action in an image, removal refused (409) while in use, the
service YAML's images imported at start. Real engine, real sandboxes (embedded client)."""

from __future__ import annotations

import pytest

from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import TangramError
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.config import NodeConfig, ServiceConfig, parse_service_config

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def image_tar(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("img")
    root = imagekit.host_rootfs(str(d / "rootfs"))
    return imagekit.pack_layer(root, str(d / "mini.tar.gz"), gzip_it=True)


async def test_images_over_http_and_sessions_in_them(tmp_path, image_tar: str) -> None:
    cfg = ServiceConfig(nodes=(NodeConfig(cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1),
                                          gpu=None),))
    async with await AsyncClient.embedded(cfg) as c:
        out = await c.import_image(image_tar, "mini")
        assert out["nodes"]["local"]["format"] == "rootfs-tar"
        ls = await c.images()
        assert [i["name"] for i in ls["nodes"]["local"]] == ["mini"]
        with pytest.raises(TangramError, match="path"):
            await c.import_image(str(tmp_path / "missing.tar"), "x")
        async with c.session(image="mini", demand={"cpu": 1, "memory_mb": 256}) as s:
            r = await s.run("cd /srv/data && echo one > f && cat /etc/os-release", "bash")
            assert "ID=tangram-mini" in r["run_result"]["stdout"], r
            r = await s.run("pwd; cat f", "bash")
            assert r["run_result"]["stdout"].split() == ["/srv/data", "one"]
            with pytest.raises(TangramError, match="in use"):
                await c.remove_image("mini")
        r = await c.run_code("cat /etc/os-release; cat /srv/data/f 2>&1", "bash", image="mini")
        assert "ID=tangram-mini" in r["run_result"]["stdout"]
        assert "No such file" in r["run_result"]["stdout"]  # the session's layer is gone
        with pytest.raises(TangramError, match="image"):
            async with c.session(image="nope"):
                pass
        out = await c.remove_image("mini")
        assert out["removed"] == ["local"]
        with pytest.raises(TangramError, match="no image"):
            await c.remove_image("mini")


async def test_service_yaml_images_are_imported_at_start(tmp_path, image_tar: str) -> None:
    cfg = parse_service_config({"images": [{"name": "boot", "path": image_tar}],
                                "nodes": [{"name": "n1", "cpu": {"work_root": str(tmp_path / "w"),
                                                                 "warm_min": 1}, "gpu": None}]})
    assert cfg.images == (("boot", image_tar),)
    async with await AsyncClient.embedded(cfg) as c:
        ls = await c.images()
        assert [i["name"] for i in ls["nodes"]["n1"]] == ["boot"]
    with pytest.raises(Exception, match=r"images\[0\]\.path"):
        parse_service_config({"images": [{"name": "x", "path": "rel/path"}]})
