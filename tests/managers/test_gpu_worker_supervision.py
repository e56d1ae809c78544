"""Supervision of model workers (issue 25 item 1), on the GPU manager with a real tiny model
built from a config on CPU. An instance's worker is a thread of the service process (no process
to kill -9): a worker stopped mid-batch (`crash_worker`, an asynchronous exception inside the
forward pass) or a sticky device error ends the instance -- the batch call raises
`ModelWorkerDied` naming it, ``on_worker_death`` is told first, the devices are free at once and
a new instance loads there and scores as before -- while an ordinary model error fails only the
batch and keeps the instance."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    tiny_model_specs,
)
from arl_tangram.managers.gpu.manager import ModelWorkerDied

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    paths = build_tiny_models(tmp_path_factory.mktemp("tiny"))
    return next(s for s in tiny_model_specs(paths) if s.name == "tiny-rm")


def _actions(prefix: str, n: int = 4) -> list[ActionSpec]:
    return [ActionSpec(f"{prefix}{i}", kind=ActionKind.REWARD, model="tiny-rm",
                       payload={"query": f"What is {i} + {i}? The answer is {2 * i}."})
            for i in range(n)]


class Spin:
    """A forward pre-hook that holds the forward pass (in Python, so an asynchronous exception
    lands) until released, or raises ``exc`` there: the batch is mid-forward when we act."""

    def __init__(self, exc: Exception | None = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.exc = exc

    def __call__(self, _module: Any, _args: Any) -> None:
        self.entered.set()
        if self.exc is not None:
            raise self.exc
        end = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < end:
            time.sleep(0.001)


def _hook(mgr: GpuManager, iid: str, spin: Spin) -> Any:
    return mgr._instances[iid].scorer.model.register_forward_pre_hook(spin)  # type: ignore[union-attr]


async def test_worker_killed_mid_batch_drops_the_instance_and_a_new_one_loads(rm: ModelSpec) -> None:
    mgr = GpuManager(GpuManagerConfig(device="cpu", cpu_devices=1), [rm])
    deaths: list[tuple[str, str, bool]] = []
    mgr.on_worker_death = lambda iid, why: deaths.append((iid, why, iid in mgr.resident()))
    try:
        await mgr.load("i0", "tiny-rm", (0,))
        before = await mgr.run_batch("i0", _actions("a"))
        assert not mgr.crash_worker("i0")  # no batch running: nothing to stop
        spin = Spin()
        _hook(mgr, "i0", spin)
        model = weakref.ref(mgr._instances["i0"].scorer.model)  # type: ignore[union-attr]
        batch = asyncio.create_task(mgr.run_batch("i0", _actions("a")))
        assert await asyncio.to_thread(spin.entered.wait, 30)
        assert mgr.crash_worker("i0")
        with pytest.raises(ModelWorkerDied) as got:
            await asyncio.wait_for(batch, 30)
        assert got.value.instance_id == "i0"
        assert "worker of model instance i0 (tiny-rm) died mid-batch" in got.value.reason
        assert "WorkerKilled" in got.value.reason
        # the hook was told once, after the instance was gone, before the batch call raised
        assert deaths == [("i0", got.value.reason, False)]
        assert "i0" not in mgr.resident() and mgr.memory_free()[0] == pytest.approx(4096.0)
        gc.collect()
        assert model() is None  # nothing (the dead worker's frames) keeps its weights alive
        assert mgr.health() == {"model_worker_deaths": 1, "last_model_worker_death": got.value.reason}
        with pytest.raises(Exception, match="not loaded"):
            await mgr.run_batch("i0", _actions("b"))
        # a new instance on the same device: loads and scores exactly as the dead one did
        t0 = time.monotonic()
        await mgr.load("i1", "tiny-rm", (0,))
        reload_s = time.monotonic() - t0
        after = await mgr.run_batch("i1", _actions("a"))
        assert not after.failed and after.batch_size == 4
        for aid, out in before.outputs.items():
            assert after.outputs[aid]["score"] == pytest.approx(out["score"], abs=1e-6)
        print(f"reload after the death: {reload_s:.3f}s")
    finally:
        await mgr.aclose()


async def test_sticky_device_error_ends_the_instance(rm: ModelSpec) -> None:
    mgr = GpuManager(GpuManagerConfig(device="cpu", cpu_devices=1), [rm])
    deaths: list[str] = []
    mgr.on_worker_death = lambda iid, why: deaths.append(iid)
    try:
        await mgr.load("i0", "tiny-rm", (0,))
        _hook(mgr, "i0", Spin(RuntimeError("CUDA error: an illegal memory access was encountered")))
        with pytest.raises(ModelWorkerDied, match="illegal memory access"):
            await mgr.run_batch("i0", _actions("a"))
        assert deaths == ["i0"] and "i0" not in mgr.resident()
    finally:
        await mgr.aclose()


@pytest.mark.parametrize("exc", [ValueError("shape mismatch"),
                                 RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")])
async def test_ordinary_model_error_fails_the_batch_and_keeps_the_instance(
        rm: ModelSpec, exc: Exception) -> None:
    mgr = GpuManager(GpuManagerConfig(device="cpu", cpu_devices=1), [rm])
    deaths: list[str] = []
    mgr.on_worker_death = lambda iid, why: deaths.append(iid)
    try:
        await mgr.load("i0", "tiny-rm", (0,))
        handle = _hook(mgr, "i0", Spin(exc))
        out = await mgr.run_batch("i0", _actions("a", 2))
        assert not out.outputs and set(out.failed) == {"a0", "a1"}
        assert all("model tiny-rm failed" in r and str(exc) in r for r in out.failed.values())
        assert deaths == [] and mgr.resident()["i0"]["state"] == "loaded"
        handle.remove()
        again = await mgr.run_batch("i0", _actions("a", 2))
        assert not again.failed and again.batch_size == 2
        assert mgr.health()["model_worker_deaths"] == 0
    finally:
        await mgr.aclose()
