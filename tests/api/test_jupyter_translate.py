"""/run_jupyter's translation to and from the driver action (no sandbox)."""

from __future__ import annotations

import base64
import json

from arl_tangram.api import jupyter as J
from arl_tangram.api import jupyter_driver as D


def _b64(obj: object) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


def test_request_becomes_one_python_action_carrying_the_cells() -> None:
    req = J.RunJupyterRequest(cells=["a = 1", "a"], cell_timeout=2, total_timeout=9,
                              files={"x.txt": "eA=="}, fetch_files=["y.txt"])
    rc = J.to_run_code(req)
    assert rc.language == "python" and "def main()" in rc.code
    assert rc.files["x.txt"] == "eA==" and rc.fetch_files == ["y.txt", D.OUT_FILE]
    spec = json.loads(base64.b64decode(rc.files[D.IN_FILE] or ""))
    assert spec["cells"] == ["a = 1", "a"] and spec["cell_timeout"] == 2
    assert rc.run_timeout > req.total_timeout


def test_missing_or_broken_driver_output_is_an_error_with_the_driver_result() -> None:
    driver = {"status": "Finished", "return_code": 1, "stdout": "", "stderr": "Traceback"}
    out = J.from_run_code({"status": "Failed", "run_result": driver, "files": {}}, 2)
    assert out["notebook_status"] == "Error" and out["status"] == "Failed"
    assert out["driver"] == driver and out["cells"] == []
    out = J.from_run_code({"run_result": driver, "files": {D.OUT_FILE: "!!"}}, 2)
    assert out["notebook_status"] == "Error" and out["status"] == "Failed"
    assert "unreadable" in out["message"]


def test_driver_output_is_unpacked_and_partial_runs_say_so() -> None:
    cells = [{"stdout": "1\n", "stderr": "", "display": [], "error": []}]
    ok = {"status": "Finished", "return_code": 0}
    files = {D.OUT_FILE: _b64({"status": "Finished", "cells": cells}), "y.txt": "eQ=="}
    out = J.from_run_code({"run_result": ok, "files": files}, 1)
    assert (out["status"], out["notebook_status"]) == ("Success", "Finished")
    assert out["cells"] == cells and out["files"] == {"y.txt": "eQ=="}
    out = J.from_run_code({"run_result": ok, "files": dict(files)}, 3)
    assert (out["status"], out["notebook_status"]) == ("Failed", "Error")
    tle = {"status": "TimeLimitExceeded"}
    out = J.from_run_code({"run_result": tle, "files": dict(files)}, 3)
    assert (out["status"], out["notebook_status"]) == ("Failed", "TimeLimitExceeded")


def test_a_notebook_no_sandbox_ran_is_a_sandbox_error_with_its_message() -> None:
    out = J.from_run_code({"status": "SandboxError", "message": "cancelled: shed",
                           "run_result": None, "files": {}, "executor_pod_name": "n1"}, 1)
    assert (out["status"], out["notebook_status"]) == ("SandboxError", "Error")
    assert out["message"] == "cancelled: shed" and out["executor_pod_name"] == "n1"
    # a driver that ran but left no result file is the notebook's failure, not the sandbox's
    ran = {"status": "Finished", "return_code": 1}
    out = J.from_run_code({"status": "SandboxError", "message": "m", "run_result": ran,
                           "files": {}}, 1)
    assert (out["status"], out["message"]) == ("Failed", "m")
    out = J.from_run_code({"status": "Failed", "run_result": None, "files": {}}, 1)
    assert out["status"] == "Failed"
