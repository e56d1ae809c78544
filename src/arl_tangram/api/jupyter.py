"""SandboxFusion's ``POST /run_jupyter``: notebook cells run in one isolated sandbox.

Invariant: a notebook is one ordinary CODE action (so the core schedules it like any other and
the CPU manager isolates it the same way) whose program is `jupyter_driver`; the cells travel in
as a file and the per-cell results come back as a fetched file. The response always has
SandboxFusion's keys (status, message, driver, cells, executor_pod_name, files) with its
`RunStatus` (Success when every cell ran; Failed when the notebook stopped: a time limit, a cell
that ended the interpreter, a driver that produced no result file; SandboxError when no sandbox
ran it), never a 500; ``notebook_status`` (ours) says how the notebook ended: Finished, Error or
TimeLimitExceeded.
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ..runtime.engine import Overloaded
from . import jupyter_driver as D
from .fastpath import until_disconnect
from .middleware import TENANT_KEY
from .schemas import CommandRunResult, CommandRunStatus, FileName, Num, RunCodeRequest, RunStatus
from .service import Service, Shed

# Characters of stdout (and of stderr) kept per cell; more sets ``truncated`` on the cell.
MAX_CELL_OUTPUT = 1 << 20


class RunJupyterRequest(BaseModel):
    """SandboxFusion's RunJupyterRequest."""

    cells: list[str] = Field(..., max_length=1000, description="code cells, run in order")
    cell_timeout: Num = Field(0, ge=0, le=3600, description="limit per cell in s; 0: none")
    total_timeout: Num = Field(45, gt=0, le=3600, description="limit for all cells in s")
    kernel: Literal["python3"] = Field("python3", description="the kernel (python3 only)")
    files: dict[FileName, str] = Field(default_factory=dict, description="path -> base64")
    fetch_files: list[FileName] = Field(default_factory=list, description="paths to return")


class CellRunResult(BaseModel):
    stdout: str = ""
    stderr: str = ""
    display: list[dict[str, Any]] = Field(default_factory=list, description="mime bundles")
    error: list[dict[str, Any]] = Field(default_factory=list, description="ename/evalue/traceback")
    truncated: bool = False


class RunJupyterResponse(BaseModel):
    """SandboxFusion's RunJupyterResponse, plus ``notebook_status``."""

    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    notebook_status: CommandRunStatus = Field(description="how the notebook ended")


def driver_source() -> str:
    return resources.files("arl_tangram.api").joinpath("jupyter_driver.py").read_text()


def _b64(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


def to_run_code(req: RunJupyterRequest) -> RunCodeRequest:
    """The notebook as the one-shot Python action that runs the driver."""
    spec = {"cells": req.cells, "cell_timeout": req.cell_timeout,
            "total_timeout": req.total_timeout, "max_output": MAX_CELL_OUTPUT}
    return RunCodeRequest.model_validate({
        "code": driver_source(), "language": "python",
        "files": {**req.files, D.IN_FILE: _b64(spec)},
        "fetch_files": [*req.fetch_files, D.OUT_FILE],
        # The driver stops itself at total_timeout; the sandbox's limit is the backstop.
        "run_timeout": req.total_timeout + 5.0,
    })


def from_run_code(body: dict[str, Any], n_cells: int) -> dict[str, Any]:
    """A /run_code response of the driver as SandboxFusion's RunJupyterResponse."""
    files = dict(body.get("files") or {})
    raw = files.pop(D.OUT_FILE, None)
    driver = body.get("run_result")
    out: dict[str, Any] = {"status": "Error", "message": str(body.get("message") or ""),
                           "driver": driver, "cells": [],
                           "executor_pod_name": body.get("executor_pod_name"), "files": files}
    if raw:
        try:
            got = json.loads(base64.b64decode(raw))
            out["cells"] = list(got["cells"])
            out["status"] = str(got["status"])
        except (ValueError, KeyError, TypeError) as exc:
            out["message"] = f"driver output unreadable: {exc}"
    if driver and driver.get("status") == "TimeLimitExceeded":
        out["status"] = "TimeLimitExceeded"
    elif out["status"] == "Finished" and len(out["cells"]) < n_cells:
        out["status"] = "Error"  # the driver died between cells (e.g. a cell called os._exit)
        out["message"] = out["message"] or f"only {len(out['cells'])} of {n_cells} cells ran"
    # SandboxFusion's status: its clients read `RunStatus` here (Success / Failed / SandboxError)
    out["notebook_status"] = out["status"]
    if out["status"] == "Finished":
        out["status"] = "Success"
    elif driver is None and body.get("status") == "SandboxError":
        out["status"] = "SandboxError"  # no sandbox ran it (cancelled, shed, its node lost)
    else:
        out["status"] = "Failed"
    return out


async def run_jupyter(svc: Service, req: RunJupyterRequest,
                      tenant: str | None = None) -> dict[str, Any]:
    return from_run_code(await svc.run_code(to_run_code(req), tenant=tenant), len(req.cells))


def add_routes(app: FastAPI, svc: Service) -> None:
    @app.post("/run_jupyter", response_model=RunJupyterResponse, tags=["sandbox"],
              responses={429: {"description": "the tenant's quota reached"},
                         503: {"description": "overloaded"},
                         504: {"description": "shed: no answer within the deadline"}})
    async def run_jupyter_route(req: RunJupyterRequest, request: Request) -> Response:
        try:
            body = await until_disconnect(request.receive,
                                          run_jupyter(svc, req, request.scope.get(TENANT_KEY)))
        except Overloaded as exc:
            raise Shed(str(exc)) from None
        if body is None:  # the client went away: its action was cancelled (issue 41, L1)
            return Response(status_code=499)
        return JSONResponse(body)
