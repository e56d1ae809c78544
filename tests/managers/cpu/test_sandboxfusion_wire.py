# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""Our SandboxFusion answers checked against SandboxFusion's own schema (issue 43).

The peer's models (tests/sandboxfusion_peer.py) are copied from its published source,
bytedance/SandboxFusion at 469de08 (sandbox/server/sandbox_api.py: RunCodeRequest, RunStatus,
RunCodeResponse, RunJupyterResponse; sandbox/runners/types.py: CommandRunStatus,
CommandRunResult, CodeRunArgs, RunJupyterRequest, CellRunResult, Language), which its SDK's
models and docs/src/openapi.json match. Each of our answers must carry every field the peer names (a renamed field fails: the
peer's optional fields would otherwise read as None), validate as the peer's model, and keep the
same values; our requests' defaults and enums are the peer's.
"""

from __future__ import annotations

import base64
import json
from typing import Any, get_args

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot
from pydantic import BaseModel

from arl_tangram.api import jupyter as J
from arl_tangram.api import jupyter_driver as D
from arl_tangram.api.schemas import Language, RunCodeRequest
from arl_tangram.api.translate import run_code_body as run_code_response
from arl_tangram.core.actions import Status
from arl_tangram.managers.cpu import CpuManager
from sandboxfusion_peer import (
    PeerCellRunResult,
    PeerCommandRunResult,
    PeerLanguage,
    PeerRunCodeRequest,
    PeerRunCodeResponse,
    PeerRunJupyterRequest,
    PeerRunJupyterResponse,
)

# ---- checks ------------------------------------------------------------------------------------

NESTED = ("compile_result", "run_result", "driver", "cells")


def _as_peer(ours: dict[str, Any], model: type[BaseModel]) -> BaseModel:
    """``ours`` read as the peer reads it; every field the peer names is there, same value."""
    missing = set(model.model_fields) - set(ours)
    assert not missing, f"fields the peer names are missing: {sorted(missing)}"
    peer = model.model_validate(ours)
    back = json.loads(peer.model_dump_json())
    for name in model.model_fields:
        if name not in NESTED:  # (those are read field by field below: extras of ours inside)
            assert back[name] == ours[name], (name, back[name], ours[name])
    for name in ("compile_result", "run_result", "driver"):
        if isinstance(ours.get(name), dict):
            _as_peer(ours[name], PeerCommandRunResult)
        else:
            assert ours.get(name) is None or name not in model.model_fields, name
    for cell in ours.get("cells") or ():
        _as_peer(cell, PeerCellRunResult)
    return peer


def test_request_defaults_and_enums_are_the_peers() -> None:
    ours = RunCodeRequest(code="x", language="python")
    peer = PeerRunCodeRequest(code="x", language="python")
    assert set(RunCodeRequest.model_fields) == set(PeerRunCodeRequest.model_fields)
    assert ours.model_dump() == peer.model_dump()
    assert RunCodeRequest(code="x").language == "python"  # (ours only: a missing one is python)
    assert get_args(Language) == get_args(PeerLanguage)
    # a request the peer's client builds with every field set reads the same here
    full = PeerRunCodeRequest(compile_timeout=3, run_timeout=4.5, memory_limit_MB=128, code="c",
                              stdin="in", language="bash", files={"a.txt": "eQ=="},
                              fetch_files=["b.txt"]).model_dump()
    assert RunCodeRequest.model_validate(full).model_dump() == full
    jr = J.RunJupyterRequest(cells=["1"])
    pj = PeerRunJupyterRequest(cells=["1"])
    for name in set(J.RunJupyterRequest.model_fields) & set(PeerRunJupyterRequest.model_fields):
        assert getattr(jr, name) == getattr(pj, name), name
    assert set(PeerRunJupyterRequest.model_fields) - set(J.RunJupyterRequest.model_fields) \
        <= {"memory_limit_MB"}  # (accepted and ignored: the notebook runs at the default)


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="module")
async def test_real_run_code_answers_read_as_the_peers(mgr: CpuManager) -> None:
    cases = [("print('hi')", {}, "Success", "Finished", 0),
             ("import sys; print('x', file=sys.stderr); sys.exit(3)", {}, "Failed", "Finished", 3),
             ("import time; time.sleep(30)", {"run_timeout": 0.5}, "Failed", "TimeLimitExceeded",
              -9)]  # (killed at its limit: -SIGKILL)
    for code, extra, status, stage, rc in cases:
        r = await mgr.run(action(code, **extra), allot())
        ours = run_code_response(r.to_dict(), r.action_status, r.message, None)
        peer = _as_peer(ours, PeerRunCodeResponse)
        assert isinstance(peer, PeerRunCodeResponse)
        assert peer.status.value == status, (code, peer)
        assert peer.run_result is not None and peer.run_result.status.value == stage
        assert peer.run_result.return_code == rc
        assert peer.compile_result is None and peer.files == {}


@pytest.mark.parametrize("status,reason,run_status,stage", [
    (Status.TIMED_OUT, "over 10 s", "Failed", "TimeLimitExceeded"),
    (Status.CANCELLED, "", "SandboxError", None),
    (Status.FAILED, "node lost", "SandboxError", None)])
def test_answers_no_sandbox_gave_read_as_the_peers(status: Status, reason: str, run_status: str,
                                                   stage: str | None) -> None:
    ours = run_code_response(None, status, reason, "node-1")
    peer = _as_peer(ours, PeerRunCodeResponse)
    assert isinstance(peer, PeerRunCodeResponse)
    assert peer.status.value == run_status and peer.executor_pod_name == "node-1"
    assert (peer.run_result.status.value if peer.run_result else None) == stage
    assert peer.message == (reason if status == Status.TIMED_OUT
                            else f"{status.name.lower()}: {reason or status.name.lower()}")


def _b64(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


CELL = {"stdout": "1\n", "stderr": "", "display": [{"text/plain": "2"}], "error": [],
        "truncated": False}


def _stage(status: str, rc: int | None) -> dict[str, Any]:  # (as `StageResult.to_dict`)
    return {"status": status, "execution_time": 0.25, "return_code": rc, "stdout": "",
            "stderr": ""}


@pytest.mark.parametrize("notebook,driver,n,run_status", [
    ("Finished", _stage("Finished", 0), 1, "Success"),
    ("Finished", _stage("Finished", 0), 2, "Failed"),  # a cell ended the interpreter
    ("Finished", _stage("TimeLimitExceeded", -9), 1, "Failed"),
    ("TimeLimitExceeded", _stage("Finished", 0), 1, "Failed")])
def test_run_jupyter_answers_read_as_the_peers(notebook: str, driver: dict[str, Any], n: int,
                                               run_status: str) -> None:
    body = {"status": "Success", "message": "", "run_result": driver, "executor_pod_name": "p",
            "files": {D.OUT_FILE: _b64({"status": notebook, "cells": [CELL]}), "y.txt": "eQ=="}}
    ours = J.from_run_code(body, n)
    peer = _as_peer(ours, PeerRunJupyterResponse)
    assert isinstance(peer, PeerRunJupyterResponse)
    assert peer.status.value == run_status
    assert peer.files == {"y.txt": "eQ=="} and len(peer.cells) == 1
    assert peer.executor_pod_name == "p"


def test_a_run_jupyter_no_sandbox_ran_is_a_sandbox_error() -> None:
    ours = J.from_run_code({"status": "SandboxError", "message": "cancelled: x",
                            "run_result": None, "files": {}}, 1)
    peer = _as_peer(ours, PeerRunJupyterResponse)
    assert isinstance(peer, PeerRunJupyterResponse)
    assert peer.status.value == "SandboxError" and peer.message == "cancelled: x"
