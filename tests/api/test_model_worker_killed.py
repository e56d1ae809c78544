"""Issue 25 item 1 for model workers, over HTTP: the worker of a reward-model instance (a real
tiny model built from a config, on CPU) is stopped mid-batch while clients wait for their
scores. The batch's actions are requeued once and scored by the replacement (none lost, none
scored twice), `GET /v1/health` answers 503 naming the model while no instance of it is up and
200 once the replacement is loaded, `/v1/cluster` shows the node not ready and the model under
``models_down`` meanwhile, `/metrics` counts the death, and every later action succeeds.
Real engine, real sandboxes on the node (httpx ASGI transport)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from arl_tangram.api.app import create_app
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.gpu import build_tiny_models
from arl_tangram.managers.gpu.config import GpuManagerConfig
from arl_tangram.runtime.build import build_engine
from arl_tangram.runtime.config import NodeConfig, ServiceConfig

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


class _Factory:
    """Loads the tiny model from its directory (the user's route), and lets the test act at two
    moments: the first instance's forward pass holds (``entered``) until its worker is stopped;
    the second load (the replacement) waits for ``reload_go``, so the not-ready window is seen."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.loads = 0
        self.entered = threading.Event()
        self.reload_go = threading.Event()

    def __call__(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.loads += 1
        if self.loads == 2:
            assert self.reload_go.wait(60)
        model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        tok = AutoTokenizer.from_pretrained(self.path)
        if self.loads == 1:
            model.register_forward_pre_hook(self._hold)
        return model, tok

    def _hold(self, _m: Any, _a: Any) -> None:
        if self.entered.is_set():  # (only the first batch is held)
            return
        self.entered.set()
        end = time.monotonic() + 60
        while time.monotonic() < end:  # in Python: the worker's stop lands here
            time.sleep(0.001)


async def test_model_worker_killed_mid_batch_requeues_and_recovers(tmp_path) -> None:
    paths = build_tiny_models(tmp_path / "models")
    fac = _Factory(paths["scalar"])
    spec = ModelSpec("tiny-rm", kind="scalar", memory_mb=64.0)
    cfg = ServiceConfig(
        nodes=(NodeConfig(cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1),
                          gpu=GpuManagerConfig(device="cpu", cpu_devices=1)),),
        models=(spec,))
    eng = build_engine(cfg, gpu_factories={"tiny-rm": fac})
    await eng.start()
    app = create_app(eng, cfg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     timeout=60) as c:
            async def instances() -> list[dict]:
                return (await c.get("/v1/cluster")).json()["instances"]

            t0 = time.monotonic()
            while not [i for i in await instances() if i["state"] == "ready"]:
                assert time.monotonic() - t0 < 30, await instances()
                await asyncio.sleep(0.02)
            assert (await c.get("/v1/health")).status_code == 200
            (inst,) = await instances()
            node = inst["node"]
            gpu = eng._executor.hosts[node].gpu  # type: ignore[attr-defined]

            async def score(n: int, tag: str) -> list[dict]:
                body = {"actions": [{"kind": "reward", "model": "tiny-rm",
                                     "payload": {"query": f"{tag} {i}: 2 + {i} = {2 + i}"}}
                                    for i in range(n)], "wait": True, "wait_s": 60}
                r = await c.post("/v1/actions", json=body)
                assert r.status_code == 200, r.text
                return r.json()["results"]

            first = asyncio.create_task(score(3, "first"))
            assert await asyncio.to_thread(fac.entered.wait, 30)
            assert gpu.crash_worker(inst["instance_id"])
            t0 = time.monotonic()
            while (h := await c.get("/v1/health")).status_code == 200:
                assert time.monotonic() - t0 < 10, h.text
                await asyncio.sleep(0.005)
            down = h.json()
            assert h.status_code == 503 and h.headers["retry-after"] == "1"
            assert "model tiny-rm has no instance up" in down["reason"], down
            assert "died mid-batch" in down["reason"], down
            cl = (await c.get("/v1/cluster")).json()
            assert set(cl["models_down"]) == {"tiny-rm"}
            (nd,) = cl["nodes"]
            assert nd["ready"] is False and nd["gpu_health"]["model_worker_deaths"] == 1
            text = (await c.get("/metrics")).text
            assert f'tangram_model_worker_deaths_total{{node="{node}"}} 1.0' in text
            assert f'tangram_node_ready{{node="{node}"}} 0.0' in text
            assert not first.done()  # requeued, waiting for the replacement: not failed

            fac.reload_go.set()
            t1 = time.monotonic()
            while (h := await c.get("/v1/health")).status_code != 200:
                assert time.monotonic() - t1 < 30, h.text
                await asyncio.sleep(0.005)
            results = await asyncio.wait_for(first, 60)
            assert [r["status"] for r in results] == ["succeeded"] * 3, results
            assert all(r["attempts"] == 2 for r in results), results  # run twice, scored once
            assert all(isinstance(r["output"]["score"], float) for r in results)
            later = await score(8, "later")
            assert [r["status"] for r in later] == ["succeeded"] * 8, later
            cl = (await c.get("/v1/cluster")).json()
            assert cl["models_down"] == {} and cl["nodes"][0]["ready"] is True
            assert [i["state"] for i in cl["instances"]] == ["ready"]
            assert cl["instances"][0]["instance_id"] != inst["instance_id"]
            assert fac.loads == 2
    finally:
        fac.reload_go.set()
        await eng.aclose()
