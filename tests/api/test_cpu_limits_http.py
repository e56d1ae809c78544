"""Issue 35, M5, M6 and M2 through the HTTP API, a real engine and real sandboxes (httpx ASGI
transport, as a client sees them): a TEST action ends within its `timeout_s` with the cases that
finished reported and the action `timed_out`, more than `max_test_cases` cases are refused
naming the field; `/run_code` code cannot make an AF_VSOCK or AF_ALG socket; a session holding
every inotify instance of its uid leaves another tenant's session, `/run_code` and the host's
`nobody` able to make one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from arl_tangram.api.app import create_app
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.runtime.build import build_engine
from arl_tangram.runtime.config import NodeConfig, ServiceConfig

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

with open("/proc/sys/fs/inotify/max_user_instances") as _f:
    MAX_INSTANCES = int(_f.read())
HOLD = ("import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = []\n"
        "while True:\n    fd = libc.inotify_init1(0o2000000)\n    if fd < 0:\n"
        "        err = ctypes.get_errno()\n        break\n    held.append(fd)\n"
        "print(json.dumps([len(held), err]))\n")
ONE = ("import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\n"
       "fd = libc.inotify_init1(0o2000000)\nprint(json.dumps([fd >= 0, ctypes.get_errno() "
       "if fd < 0 else 0]))\n")


@pytest_asyncio.fixture
async def client(tmp_path: object) -> AsyncIterator[httpx.AsyncClient]:
    cfg = ServiceConfig(nodes=(NodeConfig(cpu=CpuManagerConfig(work_root=f"{tmp_path}/w", warm_min=1),
                                          gpu=None),))
    eng = build_engine(cfg)
    await eng.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(eng, cfg)),
                                     base_url="http://t", timeout=120) as c:
            yield c
    finally:
        await eng.aclose()


async def _one(c: httpx.AsyncClient, **body: object) -> dict:
    r = await c.post("/v1/actions", json={"wait": True, **body})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]  # type: ignore[no-any-return]


async def test_a_test_action_ends_at_its_timeout_s(client: httpx.AsyncClient) -> None:
    code = "import time\nx = input()\ntime.sleep(0.5)\nprint(x)\n"
    cases = [{"stdin": str(i), "expected_stdout": str(i)} for i in range(60)]
    res = await _one(client, kind="test", timeout_s=5, demand={"cpu": 1},
                     payload={"code": code, "cases": cases})
    assert res["status"] == "timed_out", res
    got = res["output"]["cases"]
    assert len(got) == 60
    ran = [c for c in got if not c["skipped"]]
    finished = [c for c in ran if c["run_result"]["status"] == "Finished"]
    # one case at a time: at most the one running at the deadline was killed
    assert all(c["passed"] for c in finished) and len(ran) - len(finished) in (0, 1)
    assert [c["skipped"] for c in got] == [False] * len(ran) + [True] * (60 - len(ran))
    assert len(ran) < 60
    assert res["output"]["message"].endswith(
        f"timeout_s (5 s) ran out: {len(finished)} of 60 cases finished")
    # past the cap: refused at the edge (since d3ca860; the manager refuses too, for clients
    # in-process), naming the field and the cap
    r = await client.post("/v1/actions", json={
        "wait": True, "kind": "test", "timeout_s": 5,
        "payload": {"code": "print(1)", "cases": [{"stdin": ""}] * 1025}})
    assert r.status_code == 422, r.text
    assert r.json()["message"] == ("payload: Value error, payload.cases: at most 1024 cases per "
                                   "action, got 1025")


async def test_run_code_cannot_open_vsock_or_alg(client: httpx.AsyncClient) -> None:
    code = ("import socket\nfor fam, kind in ((40, 1), (38, 5), (2, 1), (1, 1)):\n"
            "    try:\n        socket.socket(fam, kind).close(); print('ok')\n"
            "    except OSError as e:\n        print(e.errno)\n")
    r = await client.post("/run_code", json={"code": code, "language": "python"})
    assert r.status_code == 200, r.text
    assert r.json()["run_result"]["stdout"] == "1\n1\nok\nok\n", r.text


async def test_a_session_holding_every_inotify_instance_takes_none_from_others(
        client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/sessions", json={})).json()["session_id"]
    other = (await client.post("/v1/sessions", json={})).json()["session_id"]
    try:
        res = await _one(client, kind="tool", session=sid, payload={"code": HOLD})
        held = json.loads(res["output"]["run_result"]["stdout"].strip().splitlines()[-1])
        res = await _one(client, kind="tool", session=other, payload={"code": ONE})
        o = json.loads(res["output"]["run_result"]["stdout"].strip().splitlines()[-1])
        r = await client.post("/run_code", json={"code": ONE, "language": "python"})
        rc = json.loads(r.json()["run_result"]["stdout"])
        exe = next(p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK))
        nobody = subprocess.run([exe, "-c", ONE], capture_output=True, text=True, user=65534,
                                group=65534, cwd="/", timeout=60)
        assert (o, rc, json.loads(nobody.stdout)) == ([True, 0], [True, 0], [True, 0])
        assert held == [MAX_INSTANCES, 24]
    finally:
        for s in (sid, other):
            await client.delete(f"/v1/sessions/{s}")
