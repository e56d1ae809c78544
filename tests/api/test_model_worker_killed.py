"""Issue 25 item 1 and issue 41 item 5 for model instances, over HTTP: the process of a
reward-model instance (a real tiny model built from a config, on CPU) is killed with SIGSEGV
from outside mid-batch, or its forward hangs past ``forward_timeout_s`` (killed), while clients
wait for their scores. The service (engine, node, API) stays up: the batch's actions are
requeued once and scored by the replacement (none lost, none scored twice), `GET /v1/health`
answers 503 naming the model and the reason while no instance of it is up and 200 once the
replacement is loaded, `/v1/cluster` shows the node not ready and the model under
``models_down`` meanwhile, `/metrics` counts the death, and every later action succeeds. Real
engine, real sandboxes on the node (httpx ASGI transport)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
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
    """Loads the tiny model from its directory (the user's route) in the instance's process, and
    lets the test act at two moments, through files (the model runs in another process): the
    first instance's first forward touches ``entered`` and holds; the second load (the
    replacement) waits for ``reload_go``, so the not-ready window is seen. ``loads`` gets a line
    per load."""

    def __init__(self, path: str, tmp: Path) -> None:
        self.path = path
        self.entered, self.reload_go = str(tmp / "entered"), str(tmp / "reload_go")
        self.loads = str(tmp / "loads")

    def __call__(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        with open(self.loads, "a") as f:
            f.write("load\n")
        n = self.count()
        if n == 2:
            end = time.monotonic() + 60
            while not os.path.exists(self.reload_go) and time.monotonic() < end:
                time.sleep(0.005)
        model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        tok = AutoTokenizer.from_pretrained(self.path)
        if n == 1:
            model.register_forward_pre_hook(self._hold)
        return model, tok

    def count(self) -> int:
        try:
            with open(self.loads) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    def _hold(self, _m: Any, _a: Any) -> None:
        if os.path.exists(self.entered):  # (only the first batch is held)
            return
        Path(self.entered).touch()
        time.sleep(120)  # until killed (SIGSEGV from outside, or at its deadline)


@pytest.mark.parametrize("fault", ["sigsegv", "hang"])
async def test_model_worker_killed_mid_batch_requeues_and_recovers(tmp_path, fault: str) -> None:
    paths = build_tiny_models(tmp_path / "models")
    fac = _Factory(paths["scalar"], tmp_path)
    # hang: the held forward passes its 3 s deadline and its process is killed
    spec = ModelSpec("tiny-rm", kind="scalar", memory_mb=64.0,
                     options={"forward_timeout_s": 3.0} if fault == "hang" else {})
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
            t0 = time.monotonic()
            while not os.path.exists(fac.entered):
                assert time.monotonic() - t0 < 30
                await asyncio.sleep(0.01)
            iid = inst["instance_id"]
            pid = gpu.worker_pid(iid)
            assert pid is not None and pid != os.getpid()
            if fault == "sigsegv":
                os.kill(pid, signal.SIGSEGV)
                cause = f"process {pid} was killed by SIGSEGV"
            else:
                cause = (f"its forward pass ran past its 3 s deadline (forward_timeout_s); "
                         f"process {pid} was killed")
            reason = f"the worker of model instance {iid} (tiny-rm) died mid-batch: {cause}"
            t0 = time.monotonic()
            while (h := await c.get("/v1/health")).status_code == 200:
                assert time.monotonic() - t0 < 10, h.text
                await asyncio.sleep(0.005)
            down = h.json()
            assert h.status_code == 503 and h.headers["retry-after"] == "1"
            assert "model tiny-rm has no instance up" in down["reason"], down
            assert reason in down["reason"], down
            assert gpu.health() == {"model_worker_deaths": 1, "last_model_worker_death": reason}
            cl = (await c.get("/v1/cluster")).json()
            assert set(cl["models_down"]) == {"tiny-rm"}
            (nd,) = cl["nodes"]
            assert nd["ready"] is False and nd["gpu_health"]["model_worker_deaths"] == 1
            text = (await c.get("/metrics")).text
            assert f'tangram_model_worker_deaths_total{{node="{node}"}} 1.0' in text
            assert f'tangram_node_ready{{node="{node}"}} 0.0' in text
            assert not first.done()  # requeued, waiting for the replacement: not failed

            Path(fac.reload_go).touch()
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
            assert fac.count() == 2
    finally:
        Path(fac.reload_go).touch()
        await eng.aclose()
