"""Issue 25, images over HTTP: an archive sent as the request body (`PUT /v1/images/{name}`),
for services whose nodes cannot read the client's files. Streamed to a spool file, imported,
the file removed; capped by `images.max_upload_mb` (plain and chunked bodies), not by the JSON
routes' body limit. Real engine, real sandboxes, the service's ASGI app (embedded client)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import TangramError
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.config import parse_service_config

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("img")
    root = imagekit.host_rootfs(str(d / "rootfs"))
    return root, imagekit.pack_layer(root, str(d / "mini.tar.gz"), gzip_it=True)


def _config(tmp_path: Path, max_upload_mb: int = 1024) -> object:
    (tmp_path / "spool").mkdir()
    return parse_service_config({
        "images": {"max_upload_mb": max_upload_mb, "upload_dir": str(tmp_path / "spool")},
        "limits": {"max_body_bytes": 65536},  # far below an image: uploads are capped apart
        "nodes": [{"name": "local", "gpu": None,
                   "cpu": {"work_root": str(tmp_path / "w"), "warm_min": 1}}]})


async def test_an_uploaded_archive_and_directory_serve_sandboxes(tmp_path: Path,
                                                                rootfs: tuple[str, str]) -> None:
    root, tar = rootfs
    assert os.path.getsize(tar) > 65536
    async with await AsyncClient.embedded(_config(tmp_path)) as c:
        out = await c.upload_image(tar, "sent")
        assert out["name"] == "sent" and out["nodes"]["local"]["format"] == "rootfs-tar", out
        assert out["nodes"]["local"]["source"] == "upload", out  # not the spool file's path
        out = await c.upload_image(root, "packed")  # a directory: packed into a tar on the way
        assert out["nodes"]["local"]["format"] == "rootfs-tar", out
        for name in ("sent", "packed"):
            r = await c.run_code("cat /etc/os-release", "bash", image=name)
            assert "ID=tangram-mini" in r["run_result"]["stdout"], r
        assert os.listdir(tmp_path / "spool") == []  # every spool file removed
        names = {i["name"] for i in (await c.images())["nodes"]["local"]}
        assert names == {"sent", "packed"}


async def test_bad_uploads_say_what_is_wrong_and_leave_nothing(tmp_path: Path,
                                                               rootfs: tuple[str, str]) -> None:
    _, tar = rootfs
    size = os.path.getsize(tar)
    async with await AsyncClient.embedded(_config(tmp_path, max_upload_mb=1)) as c:
        http: httpx.AsyncClient = c._http
        r = await http.put("/v1/images/junk", content=b"not an archive at all")
        assert r.status_code == 400 and r.json()["detail"].startswith("body: "), r.text
        assert "tangram-upload" not in r.text  # the spool's path is not shown
        r = await http.put("/v1/images/empty", content=b"")
        assert r.status_code == 400 and "empty" in r.json()["detail"], r.text
        r = await http.put("/v1/images/bad%20name", content=b"x")
        assert r.status_code == 400 and r.json()["field"] == "name", r.text
        big = b"\0" * (1024 * 1024 + 1)  # one byte past the cap: declared, then chunked
        r = await http.put("/v1/images/big", content=big)
        assert r.status_code == 413, r.text

        async def chunks():
            for i in range(0, len(big), 65536):
                yield big[i:i + 65536]

        r = await http.put("/v1/images/big", content=chunks())
        assert r.status_code == 413, r.text
        r = await http.put("/v1/images/atcap", content=b"x" * (1024 * 1024))  # at the cap: read
        assert r.status_code == 400 and "tar" in r.text, r.text  # (refused as an archive)
        # the upload cap is the PUT's alone: another method under /v1/images/ keeps the JSON
        # routes' limit (65,536 bytes here), declared or chunked
        over = b"{" + b" " * 65536 + b"}"
        for method in ("POST", "DELETE", "GET"):
            r = await http.request(method, "/v1/images/junk", content=over)
            assert r.status_code == 413 and "65536" in r.text, (method, r.text)
        r = await http.post("/v1/images", content=over)
        assert r.status_code == 413, r.text
        assert os.listdir(tmp_path / "spool") == []
        assert (await c.images())["nodes"]["local"] == []
        if size <= 1024 * 1024:
            assert (await c.upload_image(tar, "fits"))["name"] == "fits"
        (tmp_path / "big.bin").write_bytes(big)
        with pytest.raises(TangramError, match="larger than"):
            await c.upload_image(str(tmp_path / "big.bin"), "big")
