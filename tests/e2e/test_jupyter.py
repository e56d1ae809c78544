"""SandboxFusion's /run_jupyter over real HTTP, cells run by IPython in a real sandbox."""

from __future__ import annotations

import base64

import httpx
import pytest

pytestmark = pytest.mark.integration


def run(url: str, body: object) -> httpx.Response:
    return httpx.post(url + "/run_jupyter", json=body, timeout=60)


def test_cells_share_state_and_report_like_jupyter(server: str) -> None:
    r = run(server, {"cells": [
        "a = 123", "a", "print(a)", 'import sys; sys.stderr.write("err msg")',
        'raise RuntimeError("boom")', "a + 1",
        "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))",
        "open('out.txt', 'w').write(open('in.txt').read().upper())",
    ], "files": {"in.txt": base64.b64encode(b"hello").decode()}, "fetch_files": ["out.txt"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body.keys() >= {"status", "driver", "cells", "files"}
    assert body["status"] == "Success" and body["notebook_status"] == "Finished"
    assert body["driver"]["status"] == "Finished"
    c = body["cells"]
    assert len(c) == 8
    assert c[0] == {"stdout": "", "stderr": "", "display": [], "error": [], "truncated": False}
    assert c[1]["display"] == [{"text/plain": "123"}]
    assert c[2]["stdout"] == "123\n"
    assert c[3]["stderr"] == "err msg"
    (err,) = c[4]["error"]
    assert err["ename"] == "RuntimeError" and err["evalue"] == "boom"
    assert any("boom" in line for line in err["traceback"])
    assert c[5]["display"] == [{"text/plain": "124"}]  # an error does not stop later cells
    assert c[6]["display"][0]["text/html"] == "<b>x</b>"
    assert base64.b64decode(body["files"]["out.txt"]) == b"HELLO"
    assert "_tangram_jupyter_out.json" not in body["files"]


def test_timeouts_stop_the_notebook(server: str) -> None:
    body = run(server, {"cells": ["x = 1", "while True: pass", "x = 2"],
                        "cell_timeout": 0.5}).json()
    assert body["status"] == "Failed" and body["notebook_status"] == "TimeLimitExceeded"
    assert len(body["cells"]) == 2 and body["cells"][1]["error"][0]["ename"] == "TimeoutError"
    # A cell that swallows every exception still cannot outlive its limit.
    body = run(server, {"cells": ["import time\ntry:\n    time.sleep(30)\nexcept Exception:\n"
                                  "    pass", "y = 1"], "total_timeout": 1}).json()
    assert body["notebook_status"] == "TimeLimitExceeded" and len(body["cells"]) == 1


def test_giant_output_is_capped_and_bad_requests_name_the_field(server: str) -> None:
    body = run(server, {"cells": ["print('x' * (3 << 20))", "print('after')"]}).json()
    assert body["status"] == "Success" and body["notebook_status"] == "Finished"
    assert body["cells"][0]["truncated"] is True
    assert len(body["cells"][0]["stdout"]) <= 1 << 20
    assert body["cells"][1]["stdout"] == "after\n"
    for bad, field in (({}, "cells"), ({"cells": "x"}, "cells"),
                       ({"cells": [], "kernel": "R"}, "kernel"),
                       ({"cells": [], "total_timeout": 0}, "total_timeout")):
        r = run(server, bad)
        assert r.status_code == 422 and field in r.text, (bad, r.text)


def test_os_exit_in_a_cell_is_an_error_not_a_hang(server: str) -> None:
    body = run(server, {"cells": ["x = 1", "import os; os._exit(3)", "x = 2"]}).json()
    assert (body["status"], body["notebook_status"]) == ("Failed", "Error")
    assert len(body["cells"]) == 1
    assert body["driver"]["return_code"] == 3


def test_sdk_run_jupyter(server: str) -> None:
    from arl_tangram import Client

    with Client(server) as c:
        body = c.run_jupyter(["x = 6", "x * 7"])
    assert body["status"] == "Success" and body["notebook_status"] == "Finished"
    assert body["cells"][1]["display"] == [{"text/plain": "42"}]
