"""`api/jupyter.py`'s values (issue 43 item 2, helper-41): SandboxFusion's ``/run_jupyter``
request and response models (defaults, bounds, field descriptions), the notebook as the one
driver action (`to_run_code`, whole), every way `from_run_code` reads the driver's answer (each
answer whole, and read back by the peer's own `RunJupyterResponse`, tests/sandboxfusion_peer.py),
and the route over a stub service: the tenant passed on, overload as `Shed`, a client gone (499),
its OpenAPI answers."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from _asgi import client_gone
from fastapi import FastAPI
from pydantic import ValidationError

from arl_tangram.api import jupyter as J
from arl_tangram.api import jupyter_driver as D
from arl_tangram.api.middleware import TENANT_KEY
from arl_tangram.api.service import Shed
from arl_tangram.runtime.engine import Overloaded
from sandboxfusion_peer import PeerCellRunResult, PeerRunJupyterResponse


def _b64(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


def _peer(ours: dict[str, Any]) -> PeerRunJupyterResponse:
    peer = PeerRunJupyterResponse.model_validate(ours)
    assert peer.status.value == ours["status"] and peer.message == ours["message"]
    assert peer.files == ours["files"] and peer.executor_pod_name == ours["executor_pod_name"]
    return peer


# -- models --------------------------------------------------------------------------------


def test_request_defaults_and_bounds() -> None:
    assert J.MAX_CELL_OUTPUT == 1048576
    r = J.RunJupyterRequest(cells=["1"])
    assert r.model_dump() == {
        "cells": ["1"],
        "cell_timeout": 0,
        "total_timeout": 45,
        "kernel": "python3",
        "files": {},
        "fetch_files": [],
    }
    ok = [
        {"cells": ["x"] * 1000},
        {"cells": [], "cell_timeout": 3600},
        {"cells": [], "total_timeout": 3600},
        {"cells": [], "total_timeout": 0.001},
    ]
    bad = [
        {},
        {"cells": ["x"] * 1001},
        {"cells": [], "cell_timeout": -0.001},
        {"cells": [], "cell_timeout": 3600.001},
        {"cells": [], "total_timeout": 0},
        {"cells": [], "total_timeout": 3600.001},
        {"cells": [], "kernel": "python2"},
    ]
    for body in ok:
        J.RunJupyterRequest.model_validate(body)
    for body in bad:
        with pytest.raises(ValidationError):
            J.RunJupyterRequest.model_validate(body)


def _descriptions(model: Any) -> dict[str, str | None]:
    return {k: v.get("description") for k, v in model.model_json_schema()["properties"].items()}


def test_models_fields_and_descriptions() -> None:
    assert _descriptions(J.RunJupyterRequest) == {
        "cells": "code cells, run in order",
        "cell_timeout": "limit per cell in s; 0: none",
        "total_timeout": "limit for all cells in s",
        "kernel": "the kernel (python3 only)",
        "files": "path -> base64",
        "fetch_files": "paths to return",
    }
    assert _descriptions(J.CellRunResult) == {
        "stdout": None,
        "stderr": None,
        "display": "mime bundles",
        "error": "ename/evalue/traceback",
        "truncated": None,
    }
    assert J.CellRunResult().model_dump() == {
        "stdout": "",
        "stderr": "",
        "display": [],
        "error": [],
        "truncated": False,
    }
    assert (
        J.RunJupyterResponse.model_json_schema()["properties"]["notebook_status"]["description"]
        == "how the notebook ended"
    )
    resp = J.RunJupyterResponse(status="Success", notebook_status="Finished")
    assert resp.model_dump() == {
        "status": "Success",
        "message": "",
        "driver": None,
        "cells": [],
        "executor_pod_name": None,
        "files": {},
        "notebook_status": "Finished",
    }
    with pytest.raises(ValidationError):
        J.RunJupyterResponse(status="Success")  # type: ignore[call-arg]
    # what a cell says is what the peer's CellRunResult reads
    PeerCellRunResult.model_validate(J.CellRunResult().model_dump())


# -- to_run_code ---------------------------------------------------------------------------


def test_driver_source_is_the_driver_module() -> None:
    assert J.driver_source() == Path(D.__file__).read_text()
    assert J._b64({"a": 1}) == "eyJhIjogMX0="


def test_notebook_becomes_one_python_action_whole() -> None:
    req = J.RunJupyterRequest(
        cells=["a = 1", "a"],
        cell_timeout=2,
        total_timeout=9.5,
        files={"x.txt": "eA=="},
        fetch_files=["y.txt"],
    )
    rc = J.to_run_code(req)
    spec = {
        "cells": ["a = 1", "a"],
        "cell_timeout": 2.0,
        "total_timeout": 9.5,
        "max_output": 1048576,
    }
    assert rc.model_dump() == {
        "compile_timeout": 10,
        "run_timeout": 14.5,
        "memory_limit_MB": -1,
        "code": J.driver_source(),
        "stdin": None,
        "language": "python",
        "files": {"x.txt": "eA==", "_tangram_jupyter_in.json": _b64(spec)},
        "fetch_files": ["y.txt", "_tangram_jupyter_out.json"],
    }
    assert list(rc.files) == ["x.txt", D.IN_FILE]
    # a file of the driver's name sent by the client is replaced by the spec
    req = J.RunJupyterRequest(cells=[], files={D.IN_FILE: "eA=="})
    assert J.to_run_code(req).files == {
        D.IN_FILE: _b64(
            {"cells": [], "cell_timeout": 0, "total_timeout": 45, "max_output": 1048576}
        )
    }


# -- from_run_code -------------------------------------------------------------------------

CELL = {
    "stdout": "1\n",
    "stderr": "",
    "display": [{"text/plain": "2"}],
    "error": [],
    "truncated": False,
}
FIN = {"status": "Finished", "execution_time": 0.25, "return_code": 0, "stdout": "", "stderr": ""}
TLE = {**FIN, "status": "TimeLimitExceeded", "return_code": -9}


def _body(notebook: Any, driver: Any = FIN, **kw: Any) -> dict[str, Any]:
    files = {"y.txt": "eQ=="}
    if notebook is not None:
        files[D.OUT_FILE] = notebook if isinstance(notebook, str) else _b64(notebook)
    return {
        "status": "Success",
        "message": "",
        "run_result": driver,
        "executor_pod_name": "p",
        "files": files,
        **kw,
    }


def _want(
    status: str,
    nb: str,
    cells: list[Any],
    message: str = "",
    driver: Any = FIN,
    pod: Any = "p",
    files: Any = None,
) -> dict[str, Any]:
    return {
        "status": status,
        "message": message,
        "driver": driver,
        "cells": cells,
        "executor_pod_name": pod,
        "files": {"y.txt": "eQ=="} if files is None else files,
        "notebook_status": nb,
    }


@pytest.mark.parametrize(
    "body,n,want",
    [
        (
            _body({"status": "Finished", "cells": [CELL, CELL]}),
            2,
            _want("Success", "Finished", [CELL, CELL]),
        ),
        (
            _body({"status": "Finished", "cells": [CELL]}, message=None),
            2,
            _want("Failed", "Error", [CELL], "only 1 of 2 cells ran"),
        ),
        (
            _body({"status": "Finished", "cells": []}, message="boom"),
            1,
            _want("Failed", "Error", [], "boom"),
        ),
        (
            _body({"status": "Finished", "cells": [CELL]}, TLE),
            1,
            _want("Failed", "TimeLimitExceeded", [CELL], driver=TLE),
        ),
        (
            _body({"status": "Finished", "cells": []}, TLE),
            3,
            _want("Failed", "TimeLimitExceeded", [], driver=TLE),
        ),
        (
            _body({"status": "TimeLimitExceeded", "cells": [CELL]}),
            1,
            _want("Failed", "TimeLimitExceeded", [CELL]),
        ),
        (_body({"status": "Error", "cells": [CELL]}), 1, _want("Failed", "Error", [CELL])),
        (_body(None, message="its own"), 1, _want("Failed", "Error", [], "its own")),
        (_body(""), 1, _want("Failed", "Error", [])),
        (
            _body({"cells": [CELL]}),
            1,
            _want("Failed", "Error", [CELL], "driver output unreadable: 'status'"),
        ),
        (
            _body([1]),
            1,
            _want(
                "Failed",
                "Error",
                [],
                "driver output unreadable: list indices must be integers or slices, not str",
            ),
        ),
        (
            _body("!!!!"),
            1,
            _want(
                "Failed",
                "Error",
                [],
                "driver output unreadable: Expecting value: line 1 column 1 (char 0)",
            ),
        ),
        (
            _body({"status": "Finished", "cells": [CELL]}, None),
            1,
            _want("Success", "Finished", [CELL], driver=None),
        ),
        (
            {
                "status": "SandboxError",
                "message": "cancelled: x",
                "run_result": None,
                "files": None,
            },
            1,
            _want("SandboxError", "Error", [], "cancelled: x", None, None, {}),
        ),
        (
            {"status": "Failed", "message": "x", "run_result": None},
            1,
            _want("Failed", "Error", [], "x", None, None, {}),
        ),
        (
            {"status": "SandboxError", "run_result": FIN},
            1,
            _want("Failed", "Error", [], "", FIN, None, {}),
        ),
    ],
)
def test_driver_answers_read(body: dict[str, Any], n: int, want: dict[str, Any]) -> None:
    before = json.dumps(body)
    got = J.from_run_code(body, n)
    assert got == want
    assert json.dumps(body) == before  # (its files are a copy)
    _peer(got)


# -- the route -----------------------------------------------------------------------------


class _Svc:
    def __init__(self, answer: Any = None, delay: float = 0.0) -> None:
        self.asked: list[tuple[Any, Any]] = []
        self.answer, self.delay = answer, delay
        self.cancelled = False

    async def run_code(self, req: Any, tenant: str | None = None) -> dict[str, Any]:
        self.asked.append((req, tenant))
        if isinstance(self.answer, BaseException):
            raise self.answer
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return self.answer


def _app(svc: _Svc, tenant: str | None = None) -> FastAPI:
    app = FastAPI()
    J.add_routes(app, svc)  # type: ignore[arg-type]

    @app.middleware("http")
    async def set_tenant(request: Any, call_next: Any) -> Any:
        if tenant is not None:
            request.scope[TENANT_KEY] = tenant
        return await call_next(request)

    return app


async def test_run_jupyter_passes_the_tenant() -> None:
    svc = _Svc(_body({"status": "Finished", "cells": [CELL]}))
    got = await J.run_jupyter(svc, J.RunJupyterRequest(cells=["1"]), "t1")  # type: ignore[arg-type]
    assert got == _want("Success", "Finished", [CELL])
    ((req, tenant),) = svc.asked
    assert tenant == "t1" and req == J.to_run_code(J.RunJupyterRequest(cells=["1"]))
    await J.run_jupyter(svc, J.RunJupyterRequest(cells=["1"]))  # type: ignore[arg-type]
    assert svc.asked[-1][1] is None


async def test_route_answers() -> None:
    svc = _Svc(_body({"status": "Finished", "cells": [CELL]}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app(svc, "t9")), base_url="http://t"
    ) as c:
        r = await c.post("/run_jupyter", json={"cells": ["1"]})
        assert (r.status_code, r.json()) == (200, _want("Success", "Finished", [CELL]))
        assert svc.asked[-1][1] == "t9"
        r = await c.post("/run_jupyter", json={"cells": ["1"], "kernel": "bash"})
        assert r.status_code == 422 and svc.asked[-1][1] == "t9" and len(svc.asked) == 1
    svc = _Svc(Overloaded("4 actions pending"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app(svc)), base_url="http://t"
    ) as c:
        with pytest.raises(Shed) as ei:
            await c.post("/run_jupyter", json={"cells": ["1"]})
        assert str(ei.value) == "4 actions pending"
        assert svc.asked[-1][1] is None


async def test_route_client_gone_is_499_and_cancels() -> None:
    svc = _Svc({"never": 1}, delay=30)
    app = _app(svc)
    sent = await client_gone(app, "/run_jupyter", json.dumps({"cells": ["1"]}).encode(), timeout=5)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert svc.cancelled


def test_route_openapi() -> None:
    op = _app(_Svc()).openapi()["paths"]["/run_jupyter"]["post"]
    assert op["tags"] == ["sandbox"]
    assert {k: v["description"] for k, v in op["responses"].items()} == {
        "200": "Successful Response",
        "422": "Validation Error",
        "429": "the tenant's quota reached",
        "503": "overloaded",
        "504": "shed: no answer within the deadline",
    }
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RunJupyterResponse"
    }
