"""HTTP routes for environment images (issue 17): import, list, remove on the service's nodes.

- ``POST /v1/images`` ``{"path": "/abs/path", "name": "NAME", "node": null}`` -> 201 with each
  node's record (the path is read on the node: an OCI layout directory or archive, a
  docker-archive, a root file-system tarball or directory; no registry is contacted);
  400 on a bad archive (the message says why), 501 when the executor keeps no image cache here.
  Only paths under the configured ``images.import_dirs`` (none by default, issue 25): any other
  path -> 403, with one answer whether it exists or not (a client learns nothing of the host's
  files). `tangram image import` on the node is not restricted.
- ``PUT /v1/images/{name}?node=`` with the archive itself as the body (any of the formats above
  but a directory; ``application/octet-stream``): streamed to a file under ``images.upload_dir``
  (the system's temp directory by default), imported from there, the file removed after; the
  body is capped by ``images.max_upload_mb`` (16 GiB by default: 413 past it, counted as it
  streams, chunked too), not by ``limits.max_body_bytes``. -> 201 as ``POST``; 400 on an empty
  body or a bad archive.
- ``GET /v1/images`` -> ``{"nodes": {node: [image, ...]}}`` (``in_use``: sessions/actions now).
- ``DELETE /v1/images/{name}`` -> 200, 404 when no node has it, 409 while in use (the reason).

With tenants (`api.tenancy`), an image imported by a tenant is its own: listed, used and removed
by that tenant only (another tenant gets 404); shared images (config, `tangram image import`, the
``default`` tenant's) are listed for all and removed by ``default`` only (403 for the others).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ..core.errors import ImageError, ImageInUse, ImagesUnsupported, ImageTooLarge
from ..core.images import NAME_RULE, valid_name
from ..runtime.engine import Engine
from .middleware import TENANT_KEY
from .tenancy import Tenancy


class ImageIn(BaseModel):
    path: str = Field(..., min_length=1, max_length=4096)
    name: str = Field(..., min_length=1, max_length=128)
    node: str | None = None


def _err(status: int, detail: str, field: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"detail": detail}
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status)


def allowed(path: str, import_dirs: Sequence[str]) -> bool:
    """``path`` (symlinks resolved) lies under one of ``import_dirs`` (resolved too)."""
    real = os.path.realpath(path)
    for d in import_dirs:
        root = os.path.realpath(d)
        if root != "/" and (real == root or real.startswith(root.rstrip("/") + "/")):
            return True
    return False


def _tenant(request: Request) -> str | None:
    t = request.scope.get(TENANT_KEY)
    return t if isinstance(t, str) else None


def install(app: FastAPI, engine: Engine, import_dirs: Sequence[str] = (), *,
            any_path: bool = False, tenancy: Tenancy | None = None,
            upload_dir: str | None = None, body_timeout_s: float | None = None) -> None:
    dirs = tuple(import_dirs)
    # an upload's body may go this long without a chunk (None: no deadline). `tangram serve`'s
    # transport drops a stalled body at limits.body_timeout_s already (api/transport.py); this,
    # twice that, holds under any other ASGI server too
    stall_s = None if body_timeout_s is None else 2 * body_timeout_s

    async def _import(path: str, asked: str, node: str | None, request: Request,
                      source: str | None = None) -> Response:
        """Import ``path`` as the request's tenant's ``asked`` (201 with each node's record;
        ``source``: what the records show it came from, instead of ``path``)."""
        tenant = _tenant(request)
        name = asked
        if tenancy is not None and tenant is not None:
            try:
                name = tenancy.image_for_import(tenant, asked)
            except ValueError as e:
                return _err(400, f"name: {e}", "name")
        try:
            out = await engine.import_image(path, name, node)
        except ImageInUse as e:
            return _err(409, f"name: {e}", "name")
        except ImagesUnsupported as e:
            return _err(501, str(e))
        if name != asked:  # the tenant's own namespace: shown as it named it
            out = {**out, "name": asked}
        if source is not None:
            out = {**out, "nodes": {n: ({**r, "source": source} if isinstance(r, dict) else r)
                                    for n, r in out.get("nodes", {}).items()}}
        return JSONResponse(out, status_code=201)

    @app.post("/v1/images", tags=["images"], status_code=201,
              responses={403: {"description": "path not under images.import_dirs"},
                         409: {"description": "an image of that name is in use"},
                         413: {"description": "the image expands past a bound (bytes, "
                                              "entries, ratio, the tenant's total)"},
                         501: {"description": "this executor keeps no image cache"}})
    async def import_image(body: ImageIn, request: Request) -> Response:
        if not body.path.startswith("/"):
            return _err(400, "path: must be an absolute path on the node", "path")
        if not any_path and ("\x00" in body.path or not allowed(body.path, dirs)):
            return _err(403, "path: imports over HTTP are allowed only from the directories in "
                        "the service config's images.import_dirs "
                        f"({'none configured' if not dirs else 'this path is not under one'}); "
                        "`tangram image import` on the node imports any path", "path")
        try:
            return await _import(body.path, body.name, body.node, request)
        except ImageTooLarge as e:
            return _err(413, f"path: {e}", "path")
        except ImageError as e:
            return _err(400, f"path: {e}", "path")

    @app.put("/v1/images/{name}", tags=["images"], status_code=201,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
             responses={409: {"description": "an image of that name is in use"},
                        413: {"description": "archive larger than images.max_upload_mb, or "
                                             "it expands past a bound (bytes, entries, "
                                             "ratio, the tenant's total)"},
                        501: {"description": "this executor keeps no image cache"}})
    async def upload_image(name: str, request: Request,
                           node: str | None = Query(None)) -> Response:
        """Import the image archive sent as the request body (module doc)."""
        if not valid_name(name):
            return _err(400, f"name: {name!r} is not a valid image name ({NAME_RULE})", "name")
        spool = tempfile.mkdtemp(prefix="tangram-upload-", dir=upload_dir)
        try:
            path = os.path.join(spool, "image.tar")
            size = 0
            with open(path, "wb") as f:
                chunks = request.stream().__aiter__()
                while True:  # (each chunk within a deadline: a stalled upload is dropped)
                    try:
                        async with asyncio.timeout(stall_s):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        return _err(408, f"body: no byte for {stall_s:g} s; upload dropped")
                    if chunk:
                        f.write(chunk)
                        size += len(chunk)
            if size == 0:
                return _err(400, "body: empty (send the image archive as the request body)")
            try:
                resp = await _import(path, name, node, request, source="upload")
            except ImageError as e:  # (its text names the spool file: say "body" instead)
                return _err(413 if isinstance(e, ImageTooLarge) else 400,
                            f"body: {str(e).replace(path, 'the archive')}")
            return resp
        finally:
            shutil.rmtree(spool, ignore_errors=True)

    @app.get("/v1/images", tags=["images"],
             responses={501: {"description": "this executor keeps no image cache"}})
    async def list_images(request: Request, node: str | None = Query(None)) -> Response:
        try:
            listing = engine.list_images(node)
            if tenancy is not None:
                listing = tenancy.images_view(_tenant(request), listing)
            return JSONResponse(listing)
        except ImagesUnsupported as e:
            return _err(501, str(e))

    @app.delete("/v1/images/{name}", tags=["images"], responses={
        403: {"description": "a shared image, and a tenant other than default"},
        404: {"description": "no such image (or another tenant's)"},
        409: {"description": "in use (the reason)"},
        501: {"description": "this executor keeps no image cache"}})
    async def remove_image(request: Request, name: str,
                           node: str | None = Query(None)) -> Response:
        stored = name
        if not valid_name(name):
            return _err(400, f"name: image name {name!r} is not valid ({NAME_RULE})", "name")
        if tenancy is not None:
            try:
                stored = tenancy.image_for_remove(_tenant(request), name)
            except LookupError as e:
                return _err(404, str(e), "name")
            except PermissionError as e:
                return _err(403, str(e), "name")
        try:
            out = await engine.remove_image(stored, node)
            return JSONResponse({**out, "name": name} if stored != name else out)
        except ImageInUse as e:
            return _err(409, str(e), "name")
        except ImageError as e:
            return _err(404 if "no image" in str(e) else 400, str(e), "name")
        except ImagesUnsupported as e:
            return _err(501, str(e))
