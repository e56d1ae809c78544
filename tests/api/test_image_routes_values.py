"""`api/images.py`'s routes, answer by answer (issue 43 item 2, helper-41): the routes installed
on a bare FastAPI app over a stub engine (what it was asked, with which path, name and node;
the errors it raises chosen by name) and a stub tenancy, so each status, body, ``field`` and
record is pinned exactly: the import refusals (relative path, NUL, outside import_dirs, with or
without dirs configured), the errors' statuses (400, 403, 404, 408, 409, 413, 501), the upload's
spool (where, named what, its bytes, removed after), the stall deadline (twice body_timeout_s),
the tenant's names, and the routes' OpenAPI answers (``responses``, the upload's body)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from arl_tangram.api import images
from arl_tangram.api.middleware import TENANT_KEY
from arl_tangram.core.errors import ImageError, ImageInUse, ImagesUnsupported, ImageTooLarge
from arl_tangram.core.images import NAME_RULE


class _Engine:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.unsupported = False

    async def import_image(self, path: str, name: str, node: str | None) -> dict[str, Any]:
        data = Path(path).read_bytes() if os.path.isfile(path) else None
        self.calls.append(("import", path, name, node, data))
        base = name.rsplit("/", 1)[-1]
        if base.startswith("inuse"):
            raise ImageInUse(f"image {name!r} is in use")
        if base.startswith("unsup"):
            raise ImagesUnsupported("no image cache here")
        if base.startswith("big"):
            raise ImageTooLarge(f"{path}: expands past 10 bytes")
        if base.startswith("bad"):
            raise ImageError(f"{path}: not an archive")
        return {
            "name": name,
            "nodes": {"n1": {"name": name, "source": path, "bytes": 3}, "n2": "skipped"},
        }

    def list_images(self, node: str | None) -> dict[str, Any]:
        self.calls.append(("list", node))
        if self.unsupported:
            raise ImagesUnsupported("no image cache here")
        return {"nodes": {"n1": [{"name": "t1/own"}, {"name": "shared"}]}}

    async def remove_image(self, name: str, node: str | None) -> dict[str, Any]:
        self.calls.append(("remove", name, node))
        base = name.rsplit("/", 1)[-1]
        if base.startswith("inuse"):
            raise ImageInUse(f"image {name!r} is in use by 1 session")
        if base.startswith("gone"):
            raise ImageError(f"no image {name!r}")
        if base.startswith("bad"):
            raise ImageError(f"image {name!r} is damaged")
        if base.startswith("unsup"):
            raise ImagesUnsupported("no image cache here")
        return {"name": name, "removed": ["n1"]}


class _Tenancy:
    """t1's images are stored as ``t1/NAME``; ``evil...`` names refused; ``default`` is None."""

    def __init__(self) -> None:
        self.views: list[tuple[Any, ...]] = []

    def image_for_import(self, tenant: str | None, name: str) -> str:
        if name.startswith("evil"):
            raise ValueError("names like that are another tenant's")
        return f"{tenant}/{name}"

    def images_view(self, tenant: str | None, listing: dict[str, Any]) -> dict[str, Any]:
        self.views.append((tenant, listing))
        return {"seen_by": tenant}

    def image_for_remove(self, tenant: str | None, name: str) -> str:
        if name.startswith("nosuch"):
            raise LookupError(f"no image {name!r}")
        if name.startswith("shared"):
            raise PermissionError("shared images are removed by default only")
        return f"{tenant}/{name}"


def _app(eng: _Engine, **kw: Any) -> FastAPI:
    app = FastAPI()
    images.install(app, eng, **kw)  # type: ignore[arg-type]

    @app.middleware("http")
    async def tenant(request: Any, call_next: Any) -> Any:
        t = request.headers.get("x-tenant")
        if t is not None:
            request.scope[TENANT_KEY] = t
        elif request.headers.get("x-tenant-odd"):
            request.scope[TENANT_KEY] = 7  # not a name: read as no tenant
        return await call_next(request)

    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


# -- allowed -------------------------------------------------------------------------------


def test_allowed_paths(tmp_path: Path) -> None:
    d = tmp_path / "imp"
    (d / "sub").mkdir(parents=True)
    (tmp_path / "imp2").mkdir()
    (tmp_path / "out.tar").write_bytes(b"x")
    os.symlink(tmp_path / "out.tar", d / "link.tar")
    os.symlink(d, tmp_path / "alias")
    assert images.allowed(str(d / "a.tar"), [str(d)])
    assert images.allowed(str(d), [str(d)])  # the directory itself
    assert images.allowed(str(d / "sub" / "b.tar"), [str(d) + "/"])  # a trailing slash
    assert images.allowed(str(d / "a.tar"), [str(tmp_path / "alias")])  # the dir resolved
    assert not images.allowed(str(tmp_path / "imp2" / "a.tar"), [str(d)])  # a sibling prefix
    assert not images.allowed(str(tmp_path / "imp2"), [str(d)])
    assert not images.allowed(str(d / "link.tar"), [str(d)])  # a symlink out
    assert not images.allowed(str(d / ".." / "out.tar"), [str(d)])
    assert not images.allowed(str(d / "a.tar"), [])
    assert not images.allowed("/etc/hostname", ["/"])  # "/" never allows
    assert not images.allowed(str(d / "a.tar"), ["/", str(tmp_path / "imp2")])
    assert images.allowed(str(d / "a.tar"), ["/", str(tmp_path / "imp2"), str(d)])  # any one


def test_allowed_roots_ending_in_x_or_a_space(tmp_path: Path) -> None:
    """Only a trailing "/" is stripped from a root: "dX" and "e " are not "d" and "e"."""
    for name in ("dX", "e "):
        (tmp_path / name).mkdir()
        (tmp_path / name.rstrip("X ")).mkdir()
        root = str(tmp_path / name)
        assert images.allowed(str(tmp_path / name / "a.tar"), [root])
        assert not images.allowed(str(tmp_path / name.rstrip("X ") / "a.tar"), [root])


# -- POST /v1/images -----------------------------------------------------------------------


async def test_import_refusals_word_for_word(tmp_path: Path) -> None:
    eng = _Engine()
    async with _client(_app(eng)) as c:
        r = await c.post("/v1/images", json={"path": "rel/a.tar", "name": "x"})
        assert (r.status_code, r.json()) == (
            400,
            {"detail": "path: must be an absolute path on the node", "field": "path"},
        )
        r = await c.post("/v1/images", json={"path": str(tmp_path), "name": "x"})
        assert (r.status_code, r.json()) == (
            403,
            {
                "detail": "path: imports over HTTP are allowed only from the directories in the "
                "service config's images.import_dirs (none configured); `tangram image "
                "import` on the node imports any path",
                "field": "path",
            },
        )
    async with _client(_app(eng, import_dirs=[str(tmp_path)])) as c:
        r = await c.post("/v1/images", json={"path": "/etc/hostname", "name": "x"})
        assert (r.status_code, r.json()) == (
            403,
            {
                "detail": "path: imports over HTTP are allowed only from the directories in the "
                "service config's images.import_dirs (this path is not under one); "
                "`tangram image import` on the node imports any path",
                "field": "path",
            },
        )
        r = await c.post("/v1/images", json={"path": f"{tmp_path}/a\x00.tar", "name": "x"})
        assert r.status_code == 403 and "(this path is not under one)" in r.json()["detail"]
        r = await c.post(
            "/v1/images", json={"path": f"{tmp_path}/a.tar", "name": "x", "node": "n1"}
        )
        assert r.status_code == 201
    assert eng.calls == [("import", f"{tmp_path}/a.tar", "x", "n1", None)]


async def test_import_any_path_and_the_errors(tmp_path: Path) -> None:
    eng = _Engine()
    async with _client(_app(eng, any_path=True)) as c:
        r = await c.post("/v1/images", json={"path": "/etc/x.tar", "name": "ok"})
        assert (r.status_code, r.json()) == (
            201,
            {
                "name": "ok",
                "nodes": {
                    "n1": {"name": "ok", "source": "/etc/x.tar", "bytes": 3},
                    "n2": "skipped",
                },
            },
        )
        r = await c.post("/v1/images", json={"path": "/a\x00b", "name": "ok"})
        assert r.status_code == 201  # any path: NUL is the node's to refuse
        r = await c.post("/v1/images", json={"path": "a.tar", "name": "ok"})
        assert r.status_code == 400  # still absolute only
        for name, status, detail, field in [
            ("inuse1", 409, "name: image 'inuse1' is in use", "name"),
            ("unsup1", 501, "no image cache here", None),
            ("big1", 413, "path: /x.tar: expands past 10 bytes", "path"),
            ("bad1", 400, "path: /x.tar: not an archive", "path"),
        ]:
            r = await c.post("/v1/images", json={"path": "/x.tar", "name": name})
            want = {"detail": detail} | ({"field": field} if field else {})
            assert (r.status_code, r.json()) == (status, want), name
        r = await c.post("/v1/images", json={"path": "/x.tar", "name": "ok", "node": None})
        assert eng.calls[-1] == ("import", "/x.tar", "ok", None, None)
        r = await c.post("/v1/images", json={"path": "/x.tar", "name": ""})
        assert r.status_code == 422  # pydantic's bounds
        r = await c.post("/v1/images", json={"path": "/x.tar", "name": "n" * 129})
        assert r.status_code == 422
        r = await c.post("/v1/images", json={"path": "/" + "p" * 4096, "name": "n"})
        assert r.status_code == 422
        r = await c.post("/v1/images", json={"path": "/" + "p" * 4095, "name": "n" * 128})
        assert r.status_code == 201


async def test_import_as_a_tenant() -> None:
    eng, ten = _Engine(), _Tenancy()
    async with _client(_app(eng, any_path=True, tenancy=ten)) as c:
        r = await c.post(
            "/v1/images", json={"path": "/x.tar", "name": "img"}, headers={"x-tenant": "t1"}
        )
        assert (r.status_code, r.json()) == (
            201,
            {
                "name": "img",
                "nodes": {
                    "n1": {"name": "t1/img", "source": "/x.tar", "bytes": 3},
                    "n2": "skipped",
                },
            },
        )
        assert eng.calls[-1] == ("import", "/x.tar", "t1/img", None, None)
        r = await c.post(
            "/v1/images", json={"path": "/x.tar", "name": "evil"}, headers={"x-tenant": "t1"}
        )
        assert (r.status_code, r.json()) == (
            400,
            {"detail": "name: names like that are another tenant's", "field": "name"},
        )
        r = await c.post("/v1/images", json={"path": "/x.tar", "name": "evil"})
        assert r.status_code == 201  # no tenant: the name as asked
        r = await c.post(
            "/v1/images", json={"path": "/x.tar", "name": "evil"}, headers={"x-tenant-odd": "1"}
        )
        assert r.status_code == 201 and eng.calls[-1][2] == "evil"
    n = len(eng.calls)
    async with _client(_app(eng, any_path=True)) as c:  # no tenancy: the tenant is ignored
        r = await c.post(
            "/v1/images", json={"path": "/x.tar", "name": "evil"}, headers={"x-tenant": "t1"}
        )
        assert r.status_code == 201 and eng.calls[n] == ("import", "/x.tar", "evil", None, None)


# -- PUT /v1/images/{name} -----------------------------------------------------------------


async def test_upload_spools_imports_and_removes(tmp_path: Path) -> None:
    eng = _Engine()
    async with _client(_app(eng, upload_dir=str(tmp_path))) as c:

        async def body() -> Any:
            yield b"ab"
            yield b""
            yield b"cd"

        r = await c.put("/v1/images/ok?node=n2", content=body())
        assert r.status_code == 201
        (_, path, name, node, data) = eng.calls[-1]
        assert (name, node, data) == ("ok", "n2", b"abcd")
        assert os.path.basename(path) == "image.tar"
        spool = os.path.dirname(path)
        assert os.path.dirname(spool) == str(tmp_path)
        assert os.path.basename(spool).startswith("tangram-upload-")
        assert r.json() == {
            "name": "ok",
            "nodes": {"n1": {"name": "ok", "source": "upload", "bytes": 3}, "n2": "skipped"},
        }
        assert os.listdir(tmp_path) == []  # the spool removed
        r = await c.put("/v1/images/ok", content=b"xyz")
        assert r.status_code == 201 and eng.calls[-1][3:] == (None, b"xyz")
        for name, status, detail in [
            ("big2", 413, "body: the archive: expands past 10 bytes"),
            ("bad2", 400, "body: the archive: not an archive"),
            ("inuse2", 409, "name: image 'inuse2' is in use"),
            ("unsup2", 501, "no image cache here"),
        ]:
            r = await c.put(f"/v1/images/{name}", content=b"xyz")
            assert (r.status_code, r.json()["detail"]) == (status, detail), name
            assert os.listdir(tmp_path) == []
        r = await c.put("/v1/images/empty", content=b"")
        assert (r.status_code, r.json()) == (
            400,
            {"detail": "body: empty (send the image archive as the request body)"},
        )
        r = await c.put("/v1/images/-bad", content=b"xyz")
        assert (r.status_code, r.json()) == (
            400,
            {"detail": f"name: '-bad' is not a valid image name ({NAME_RULE})", "field": "name"},
        )
        assert os.listdir(tmp_path) == []


async def test_upload_default_spool_is_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    eng = _Engine()
    async with _client(_app(eng)) as c:
        r = await c.put("/v1/images/ok", content=b"q")
        assert r.status_code == 201
    assert os.path.dirname(os.path.dirname(eng.calls[-1][1])) == str(tmp_path)


async def test_upload_as_a_tenant(tmp_path: Path) -> None:
    eng = _Engine()
    async with _client(_app(eng, upload_dir=str(tmp_path), tenancy=_Tenancy())) as c:
        r = await c.put("/v1/images/img", content=b"q", headers={"x-tenant": "t1"})
        assert r.json() == {
            "name": "img",
            "nodes": {"n1": {"name": "t1/img", "source": "upload", "bytes": 3}, "n2": "skipped"},
        }


async def _stalled_upload(app: FastAPI, gap_s: float) -> tuple[int, bytes]:
    """PUT /v1/images/ok whose second chunk comes ``gap_s`` after the first."""
    sent: list[dict[str, Any]] = []
    chunks = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]

    async def receive() -> dict[str, Any]:
        if chunks:
            if len(chunks) == 1:
                await asyncio.sleep(gap_s)
            return chunks.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": "/v1/images/ok",
        "raw_path": b"/v1/images/ok",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t"), (b"content-type", b"application/octet-stream")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 5)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_upload_stall_deadline_is_twice_the_body_timeout(tmp_path: Path) -> None:
    eng = _Engine()
    app = _app(eng, upload_dir=str(tmp_path), body_timeout_s=0.1)
    status, body = await _stalled_upload(app, 0.5)  # past 0.2 s
    assert (status, body) == (408, b'{"detail":"body: no byte for 0.2 s; upload dropped"}')
    assert eng.calls == [] and os.listdir(tmp_path) == []
    status, _ = await _stalled_upload(app, 0.12)  # past 0.1 s, within 0.2 s
    assert status == 201 and eng.calls[-1][4] == b"abcd"
    status, _ = await _stalled_upload(_app(eng, upload_dir=str(tmp_path)), 0.3)  # no deadline
    assert status == 201


# -- GET and DELETE ------------------------------------------------------------------------


async def test_list_images() -> None:
    eng, ten = _Engine(), _Tenancy()
    async with _client(_app(eng)) as c:
        r = await c.get("/v1/images", params={"node": "n1"})
        assert (r.status_code, r.json()) == (
            200,
            {"nodes": {"n1": [{"name": "t1/own"}, {"name": "shared"}]}},
        )
        assert eng.calls[-1] == ("list", "n1")
        await c.get("/v1/images")
        assert eng.calls[-1] == ("list", None)
        eng.unsupported = True
        r = await c.get("/v1/images")
        assert (r.status_code, r.json()) == (501, {"detail": "no image cache here"})
    eng.unsupported = False
    async with _client(_app(eng, tenancy=ten)) as c:
        r = await c.get("/v1/images", headers={"x-tenant": "t1"})
        assert r.json() == {"seen_by": "t1"}
        assert ten.views == [("t1", {"nodes": {"n1": [{"name": "t1/own"}, {"name": "shared"}]}})]
        assert (await c.get("/v1/images")).json() == {"seen_by": None}


async def test_remove_images() -> None:
    eng = _Engine()
    async with _client(_app(eng)) as c:
        r = await c.delete("/v1/images/ok", params={"node": "n1"})
        assert (r.status_code, r.json()) == (200, {"name": "ok", "removed": ["n1"]})
        assert eng.calls[-1] == ("remove", "ok", "n1")
        await c.delete("/v1/images/ok")
        assert eng.calls[-1] == ("remove", "ok", None)
        for name, status, detail in [
            ("inuse3", 409, "image 'inuse3' is in use by 1 session"),
            ("gone3", 404, "no image 'gone3'"),
            ("bad3", 400, "image 'bad3' is damaged"),
        ]:
            r = await c.delete(f"/v1/images/{name}")
            assert (r.status_code, r.json()) == (status, {"detail": detail, "field": "name"})
        r = await c.delete("/v1/images/unsup3")
        assert (r.status_code, r.json()) == (501, {"detail": "no image cache here"})
        r = await c.delete("/v1/images/-x")
        assert (r.status_code, r.json()) == (
            400,
            {"detail": f"name: image name '-x' is not valid ({NAME_RULE})", "field": "name"},
        )
    async with _client(_app(eng, tenancy=_Tenancy())) as c:
        r = await c.delete("/v1/images/own", headers={"x-tenant": "t1"})
        assert (r.status_code, r.json()) == (200, {"name": "own", "removed": ["n1"]})
        assert eng.calls[-1] == ("remove", "t1/own", None)
        r = await c.delete("/v1/images/nosuch", headers={"x-tenant": "t1"})
        assert (r.status_code, r.json()) == (404, {"detail": "no image 'nosuch'", "field": "name"})
        r = await c.delete("/v1/images/shared", headers={"x-tenant": "t1"})
        assert (r.status_code, r.json()) == (
            403,
            {"detail": "shared images are removed by default only", "field": "name"},
        )


class _SameName(_Tenancy):
    def image_for_remove(self, tenant: str | None, name: str) -> str:
        return name


async def test_remove_keeps_the_engines_answer_when_the_name_is_the_same() -> None:
    eng = _Engine()

    async def remove_image(name: str, node: str | None) -> dict[str, Any]:
        return {"name": "as-stored", "removed": []}

    eng.remove_image = remove_image  # type: ignore[method-assign]
    async with _client(_app(eng, tenancy=_SameName())) as c:
        r = await c.delete("/v1/images/ok", headers={"x-tenant": "t1"})
        assert r.json() == {"name": "as-stored", "removed": []}


# -- OpenAPI -------------------------------------------------------------------------------


def test_openapi_answers() -> None:
    paths = _app(_Engine()).openapi()["paths"]

    def answers(op: dict[str, Any]) -> dict[str, str]:
        return {k: v["description"] for k, v in op["responses"].items()}

    post = paths["/v1/images"]["post"]
    assert post["tags"] == ["images"]
    assert answers(post) == {
        "201": "Successful Response",
        "422": "Validation Error",
        "403": "path not under images.import_dirs",
        "409": "an image of that name is in use",
        "413": "the image expands past a bound (bytes, entries, ratio, the tenant's total)",
        "501": "this executor keeps no image cache",
    }
    put = paths["/v1/images/{name}"]["put"]
    assert put["tags"] == ["images"]
    assert put["requestBody"] == {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
    assert answers(put) == {
        "201": "Successful Response",
        "422": "Validation Error",
        "409": "an image of that name is in use",
        "413": "archive larger than images.max_upload_mb, or it expands past a bound (bytes, "
        "entries, ratio, the tenant's total)",
        "501": "this executor keeps no image cache",
    }
    get = paths["/v1/images"]["get"]
    assert get["tags"] == ["images"]
    assert answers(get) == {
        "200": "Successful Response",
        "422": "Validation Error",
        "501": "this executor keeps no image cache",
    }
    delete = paths["/v1/images/{name}"]["delete"]
    assert delete["tags"] == ["images"]
    assert answers(delete) == {
        "200": "Successful Response",
        "422": "Validation Error",
        "403": "a shared image, and a tenant other than default",
        "404": "no such image (or another tenant's)",
        "409": "in use (the reason)",
        "501": "this executor keeps no image cache",
    }


async def test_upload_of_an_answer_without_nodes(tmp_path: Path) -> None:
    """An executor's answer need not list nodes (`Engine._sourced` reads it only if there)."""
    eng = _Engine()

    async def import_image(path: str, name: str, node: str | None) -> dict[str, Any]:
        return {"name": name, "digest": "sha256:0"}

    eng.import_image = import_image  # type: ignore[method-assign]
    async with _client(_app(eng, upload_dir=str(tmp_path))) as c:
        r = await c.put("/v1/images/solo", content=b"q")
        assert (r.status_code, r.json()) == (
            201,
            {"name": "solo", "digest": "sha256:0", "nodes": {}},
        )
