"""Issue 25, supervision of session processes (deliver 1): a session's worker process, or its
whole sandbox, killed (SIGKILL) from outside while an action runs in it. The action in flight
fails with a reason that says so; the node stays ready; a killed worker is replaced (the session
goes on, its state lost); a killed sandbox closes the session everywhere (the engine and the
scheduler learn it at once: the next action naming it is refused as "not open", no action is
routed to it) and a new session works. Real engine, real sandboxes (httpx ASGI transport)."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from arl_tangram.api.app import create_app
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.runtime.build import build_engine
from arl_tangram.runtime.config import NodeConfig, ServiceConfig

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


async def test_a_killed_session_worker_or_sandbox_fails_only_its_action(tmp_path) -> None:
    cfg = ServiceConfig(nodes=(NodeConfig(cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1),
                                          gpu=None),))
    eng = build_engine(cfg)
    await eng.start()
    app = create_app(eng, cfg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     timeout=60) as c:
            (node,) = (await c.get("/v1/cluster")).json()["nodes"]
            cpu = eng._executor.hosts[node["name"]].cpu  # type: ignore[attr-defined]

            async def tool(sid: str, code: str) -> httpx.Response:
                return await c.post("/v1/actions", json={"kind": "tool", "session": sid,
                                                         "wait": True, "payload": {"code": code}})

            async def killed_midway(sid: str, which: str) -> dict:
                slow = asyncio.create_task(tool(sid, "import time; time.sleep(20); print(x)"))
                init = cpu.sessions.by_id[sid].sandbox.pid
                for _ in range(200):
                    if _children(init):
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # (the worker is in the action's sleep)
                (worker,) = _children(init)
                os.kill(worker if which == "worker" else init, signal.SIGKILL)
                r = await asyncio.wait_for(slow, 10)  # at once, not after the 20 s
                assert r.status_code == 200, r.text
                return r.json()["results"][0]

            for which in ("worker", "sandbox"):
                sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
                r = await tool(sid, "x = 41")
                assert r.json()["results"][0]["status"] == "succeeded", r.text
                res = await killed_midway(sid, which)
                assert res["status"] == "failed", res
                h = await c.get("/v1/health")
                assert h.status_code == 200 and h.json()["ready"], h.text
                if which == "worker":
                    assert "session process ended" in res["reason"], res
                    r = await tool(sid, "print('x' in dir())")  # a new worker, state lost
                    out = r.json()["results"][0]
                    assert out["status"] == "succeeded", r.text
                    assert out["output"]["run_result"]["stdout"] == "False\n", r.text
                    assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 200
                else:
                    assert "session's sandbox ended" in res["reason"], res
                    assert "is closed" in res["reason"], res
                    r = await tool(sid, "print(1)")
                    assert r.status_code == 400 and "is not open" in r.json()["detail"], r.text
                    assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 404
                    sid2 = (await c.post("/v1/sessions", json={})).json()["session_id"]
                    r = await tool(sid2, "print(6*7)")
                    out = r.json()["results"][0]
                    assert out["output"]["run_result"]["stdout"] == "42\n", r.text
                    assert (await c.delete(f"/v1/sessions/{sid2}")).status_code == 200
            assert eng.session_count() == 0
            later = await c.post("/run_code", json={"code": "print(1)"})
            assert later.json()["status"] == "Success", later.text
    finally:
        await eng.aclose()
