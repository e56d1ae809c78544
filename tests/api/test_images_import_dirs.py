"""Issue 25, images over HTTP (the review's defect 5): `POST /v1/images {"path"}` imports only
from the configured `images.import_dirs` (none by default); every other path, existing or not,
gets the same 403, so the answer tells nothing of the host's files; `..` and symlinks out of an
allowed directory are refused too. The YAML form `images: {import_dirs, load}` parses."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.api.images import allowed
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import ServiceConfig, parse_service_config
from arl_tangram.runtime.engine import Engine, EngineConfig


async def _client(cfg: ServiceConfig) -> tuple[Engine, httpx.AsyncClient]:
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    return eng, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.parametrize("path", ["/", "/etc/hostname", "/etc/shadow", "/nonexistent/x.tar",
                                  "/proc/self/environ", "/root"])
async def test_no_import_dirs_refuses_every_path_alike(path: str) -> None:
    eng, c = await _client(ServiceConfig())
    try:
        r = await c.post("/v1/images", json={"path": path, "name": "x"})
        assert r.status_code == 403, r.text
        assert r.json()["detail"].startswith("path: imports over HTTP are allowed only")
        assert "none configured" in r.json()["detail"]
        for word in ("no such", "not a readable", "exist", "directory:"):
            assert word not in r.json()["detail"].lower()
    finally:
        await c.aclose()
        await eng.aclose()


async def test_same_answer_for_existing_and_missing_paths_outside(tmp_path: Path) -> None:
    allowed_dir = tmp_path / "images"
    allowed_dir.mkdir()
    eng, c = await _client(ServiceConfig(image_import_dirs=(str(allowed_dir),)))
    try:
        a = await c.post("/v1/images", json={"path": "/etc/hostname", "name": "x"})
        b = await c.post("/v1/images", json={"path": "/etc/no-such-file", "name": "x"})
        assert a.status_code == b.status_code == 403
        assert a.json() == b.json()
        # escapes of the allowed directory: .. and a symlink pointing out
        (allowed_dir / "out").symlink_to("/etc")
        for p in (f"{allowed_dir}/../../etc/hostname", f"{allowed_dir}/out/hostname",
                  f"{allowed_dir}x/a.tar"):
            r = await c.post("/v1/images", json={"path": p, "name": "x"})
            assert r.status_code == 403, (p, r.text)
        r = await c.post("/v1/images", json={"path": "/a\x00b", "name": "x"})
        assert r.status_code == 403
        # under it: on to the importer (this fake executor keeps no images: 501)
        r = await c.post("/v1/images", json={"path": f"{allowed_dir}/a.tar", "name": "x"})
        assert r.status_code == 501, r.text
    finally:
        await c.aclose()
        await eng.aclose()


def test_allowed() -> None:
    assert allowed("/data/img/a.tar", ["/data/img"])
    assert allowed("/data/img", ["/data/img/"])
    assert not allowed("/data/imgx/a.tar", ["/data/img"])
    assert not allowed("/data/img/../x", ["/data/img"])
    assert not allowed("/etc/passwd", [])
    assert not allowed("/etc/passwd", ["/"])


def test_yaml_import_dirs(tmp_path: Path) -> None:
    cfg = parse_service_config({"images": {"import_dirs": [str(tmp_path)],
                                           "load": [{"name": "a", "path": "/x/a.tar"}]}})
    assert cfg.image_import_dirs == (str(tmp_path),) and cfg.images == (("a", "/x/a.tar"),)
    assert parse_service_config({"images": [{"name": "a", "path": "/x/a.tar"}]}) \
        .image_import_dirs == ()
    for bad in (["relative"], ["/"], "/data"):
        with pytest.raises((SpecError, ValueError)):
            parse_service_config({"images": {"import_dirs": bad}})



async def test_embedded_app_imports_any_path() -> None:
    """The embedded client's app (`create_app(any_image_path=True)`): its caller is this
    process, as with `tangram image import`; the path goes on to the importer."""
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, ServiceConfig(), any_image_path=True)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            r = await c.post("/v1/images", json={"path": "/etc/hostname", "name": "x"})
            assert r.status_code == 501, r.text  # (this fake executor keeps no images)
    finally:
        await eng.aclose()
