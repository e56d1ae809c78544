"""HTTP routes for environment images (issue 17): import, list, remove on the service's nodes.

- ``POST /v1/images`` ``{"path": "/abs/path", "name": "NAME", "node": null}`` -> 201 with each
  node's record (the path is read on the node: an OCI layout directory or archive, a
  docker-archive, a root file-system tarball or directory; no registry is contacted);
  400 on a bad archive (the message says why), 501 when the executor keeps no image cache here.
  Only paths under the configured ``images.import_dirs`` (none by default, issue 25): any other
  path -> 403, with one answer whether it exists or not (a client learns nothing of the host's
  files). `tangram image import` on the node is not restricted.
- ``GET /v1/images`` -> ``{"nodes": {node: [image, ...]}}`` (``in_use``: sessions/actions now).
- ``DELETE /v1/images/{name}`` -> 200, 404 when no node has it, 409 while in use (the reason).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ..core.errors import ImageError, ImageInUse
from ..runtime.engine import Engine
from ..runtime.images import ImagesUnsupported


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


def install(app: FastAPI, engine: Engine, import_dirs: Sequence[str] = (), *,
            any_path: bool = False) -> None:
    dirs = tuple(import_dirs)

    @app.post("/v1/images", tags=["images"], status_code=201,
              responses={403: {"description": "path not under images.import_dirs"}})
    async def import_image(body: ImageIn) -> Response:
        if not body.path.startswith("/"):
            return _err(400, "path: must be an absolute path on the node", "path")
        if not any_path and ("\x00" in body.path or not allowed(body.path, dirs)):
            return _err(403, "path: imports over HTTP are allowed only from the directories in "
                        "the service config's images.import_dirs "
                        f"({'none configured' if not dirs else 'this path is not under one'}); "
                        "`tangram image import` on the node imports any path", "path")
        try:
            out = await engine.import_image(body.path, body.name, body.node)
        except ImageInUse as e:
            return _err(409, f"name: {e}", "name")
        except ImageError as e:
            return _err(400, f"path: {e}", "path")
        except ImagesUnsupported as e:
            return _err(501, str(e))
        return JSONResponse(out, status_code=201)

    @app.get("/v1/images", tags=["images"])
    async def list_images(node: str | None = Query(None)) -> Response:
        try:
            return JSONResponse(engine.list_images(node))
        except ImagesUnsupported as e:
            return _err(501, str(e))

    @app.delete("/v1/images/{name}", tags=["images"])
    async def remove_image(name: str, node: str | None = Query(None)) -> Response:
        try:
            return JSONResponse(await engine.remove_image(name, node))
        except ImageInUse as e:
            return _err(409, str(e), "name")
        except ImageError as e:
            return _err(404 if "no image" in str(e) else 400, str(e), "name")
        except ImagesUnsupported as e:
            return _err(501, str(e))
