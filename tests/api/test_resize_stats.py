"""Elastic resizes on a real node, counted in GET /v1/stats and /metrics (issue 22, item 1): the
core grows an elastic action started narrow once a core frees, and the growth reaches its
code; a resize for an action that has ended is dropped and counted. Real engine, real core,
real sandboxes (httpx ASGI transport)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from arl_tangram.api.app import create_app
from arl_tangram.core import commands as C
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.runtime.config import NodeConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine
from arl_tangram.runtime.local import LocalExecutor

pytestmark = pytest.mark.needs_root

# prints the cores it is shown, then runs on past the end of "hold" (1 s)
_GROW = "import os, time\nprint(os.cpu_count(), os.environ['TANGRAM_CPUS'])\ntime.sleep(2.5)\n"


async def test_resizes_reach_the_code_and_are_counted(tmp_path) -> None:
    node = NodeConfig(name="n1", capacity=Resources(cpu=2, memory_mb=4096),
                      cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1), gpu=None)
    ex = LocalExecutor([node])
    eng = Engine(ex)
    await eng.start()
    try:
        app = create_app(eng, ServiceConfig())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            # a rigid action holds one core, so the elastic one (1..2) starts at one
            body = {"actions": [
                {"id": "hold", "payload": {"code": "import time; time.sleep(1.0)"},
                 "demand": {"cpu": 1, "memory_mb": 256}},
                {"id": "grow", "payload": {"code": _GROW, "run_timeout": 60},
                 "demand": {"cpu": 1, "memory_mb": 256},
                 "elasticity": {"min": 1, "max": 2, "parallel_fraction": 1.0}}]}
            r = await c.post("/v1/actions", json=body)
            assert r.status_code == 200, r.text
            # the code sees its maximum although it started at one core
            res = await eng.result("grow", wait=60)
            assert res is not None and res.output["run_result"]["stdout"].split() == ["2", "2"]
            stats = (await c.get("/v1/stats")).json()
            # once "hold" ended, the core gave its core to "grow" (applied, or deferred if the
            # resize came before its sandbox was registered); none was lost
            rs = stats["resizes"]
            assert rs["applied"] + rs["deferred"] >= 1 and rs["dropped"] == 0, rs
            # a resize of an action that has ended is dropped, and counted
            await ex.submit([C.ResizeAction("grow", "n1", Resources(cpu=1, memory_mb=256))])
            for _ in range(200):
                if (await c.get("/v1/stats")).json()["resizes"]["dropped"] == 1:
                    break
                await asyncio.sleep(0.01)
            assert (await c.get("/v1/stats")).json()["resizes"]["dropped"] == 1
            metrics = (await c.get("/metrics")).text
            assert 'tangram_resizes_total{outcome="dropped"} 1.0' in metrics
    finally:
        await eng.aclose()
