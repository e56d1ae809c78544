"""POST /v1/sessions answers with what the node did (issue 41, M3): 201 ``open`` once the node
has opened the session; 202 ``opening`` at once when no node has room yet (it opens when room
frees); 400 for a memory demand no sandbox starts in (it used to be accepted, then fail on the
node). Real service (ASGI), engine, node and sandboxes."""

from __future__ import annotations

import httpx
import pytest

from arl_tangram.api.app import create_app
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.runtime.build import engine_config
from arl_tangram.runtime.config import NodeConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine
from arl_tangram.runtime.local import LocalExecutor

pytestmark = pytest.mark.needs_root


async def test_open_waits_for_the_node_and_a_session_without_room_is_opening(tmp_path) -> None:
    node = NodeConfig(name="n1", capacity=Resources(cpu=2, memory_mb=4096),
                      cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1), gpu=None)
    cfg = ServiceConfig(nodes=(node,))
    ex = LocalExecutor.from_config(cfg)
    eng = Engine(ex, engine_config(cfg))
    await eng.start()
    try:
        app = create_app(eng, cfg)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            r = await c.post("/v1/sessions", json={"session_id": "big",
                                                   "demand": {"cpu": 0.5, "memory_mb": 256}})
            assert (r.status_code, r.json()) == (201, {"session_id": "big", "state": "open"})
            assert ex.hosts["n1"].cpu.has_session("big")  # open on the node when answered
            # its core and room for one action (1 core) are more than is left: the core queues it;
            # answered at once, not after a wait
            r = await c.post("/v1/sessions", json={"session_id": "wait",
                                                   "demand": {"cpu": 1, "memory_mb": 256}})
            assert (r.status_code, r.json()) == (202, {"session_id": "wait", "state": "opening"})
            assert not ex.hosts["n1"].cpu.has_session("wait")
            r = await c.post("/v1/sessions", json={"demand": {"memory_mb": 0.3}})
            assert (r.status_code, r.json()) == (400, {
                "detail": "demand.memory_mb: a session's sandbox needs at least 1 MiB, got 0.3",
                "field": "demand.memory_mb"})
            # room frees: the waiting session opens, and runs
            assert (await c.delete("/v1/sessions/big")).status_code == 200
            r = await c.post("/v1/actions", json={"actions": [{
                "kind": "tool", "session": "wait",
                "payload": {"code": "echo ok", "language": "bash"}}]})
            (aid,) = r.json()["ids"]
            res = await eng.result(aid, wait=60)
            assert res is not None and res.output is not None
            assert res.output["run_result"]["stdout"] == "ok\n"
    finally:
        await eng.aclose()
