"""Supervision of model instances (issue 25 item 1, issue 41 item 5), on the GPU manager with a
real tiny model built from a config on CPU. Each instance's model lives in a process of its own:
a segfault (SIGSEGV sent from outside, or a forward that reads address 0), an OOM kill
(SIGKILL, `crash_worker`), a forward past its deadline (``forward_timeout_s``) or a sticky
device error ends only that instance -- the batch call raises `ModelWorkerDied` with the reason,
``on_worker_death`` is told first, the devices are free at once, and a new instance loads there
and scores exactly as before -- while an ordinary model error fails only the batch and keeps the
instance (and its process). The faults are armed by a file the model's forward hook takes (one
shot), so the replacement, built by the same factory, runs clean."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
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

PREFIX = "the worker of model instance i0 (tiny-rm) died mid-batch: "


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    paths = build_tiny_models(tmp_path_factory.mktemp("tiny"))
    return next(s for s in tiny_model_specs(paths) if s.name == "tiny-rm")


class Faulty:
    """The factory of tiny-rm (runs in the model process) whose forward, once ``armed`` exists,
    takes it (one shot) and does ``mode``: "hold" (touch ``entered``, sleep 120 s), "segv" (read
    address 0) or "raise:<text>" (raise RuntimeError(text))."""

    def __init__(self, path: str, tmp: Path, mode: str) -> None:
        self.path, self.mode = path, mode
        self.armed, self.entered = str(tmp / "armed"), str(tmp / "entered")

    def __call__(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        model.register_forward_pre_hook(self._fault)
        return model, AutoTokenizer.from_pretrained(self.path)

    def _fault(self, _module: Any, _args: Any) -> None:
        try:
            os.unlink(self.armed)
        except FileNotFoundError:
            return
        if self.mode == "segv":
            import ctypes

            ctypes.string_at(0)
        elif self.mode == "hold":
            import time

            Path(self.entered).touch()
            time.sleep(120)
        else:
            raise RuntimeError(self.mode.removeprefix("raise:"))


def _actions(prefix: str, n: int = 4) -> list[ActionSpec]:
    return [ActionSpec(f"{prefix}{i}", kind=ActionKind.REWARD, model="tiny-rm",
                       payload={"query": f"What is {i} + {i}? The answer is {2 * i}."})
            for i in range(n)]


async def _manager(rm: ModelSpec, tmp: Path, mode: str, timeout: float | None = None,
                   ) -> tuple[GpuManager, Faulty, list[tuple[str, str, bool]]]:
    spec = dataclasses.replace(rm, path=None, options=(
        {"forward_timeout_s": timeout} if timeout is not None else {}))
    fac = Faulty(str(rm.path), tmp, mode)
    mgr = GpuManager(GpuManagerConfig(device="cpu", cpu_devices=1), [spec], {"tiny-rm": fac})
    deaths: list[tuple[str, str, bool]] = []
    mgr.on_worker_death = lambda iid, why: deaths.append((iid, why, iid in mgr.resident()))
    await mgr.load("i0", "tiny-rm", (0,))
    return mgr, fac, deaths


async def _entered(fac: Faulty) -> None:
    for _ in range(3000):
        if os.path.exists(fac.entered):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the forward never started")


async def _dies_then_replaced(mgr: GpuManager, fac: Faulty, deaths: list, reason: str,
                              act: Any = None) -> None:
    """Arm the fault, run a batch (``act`` while it holds), check the death and the reason,
    load a replacement and check it scores exactly what i0 scored before."""
    before = await mgr.run_batch("i0", _actions("a"))
    assert not before.failed and before.batch_size == 4
    Path(fac.armed).touch()
    batch = asyncio.create_task(mgr.run_batch("i0", _actions("a")))
    if act is not None:
        await _entered(fac)
        act()
    with pytest.raises(ModelWorkerDied) as got:
        await asyncio.wait_for(batch, 60)
    assert got.value.instance_id == "i0"
    assert got.value.reason == reason
    # the hook was told once, after the instance was gone, before the batch call raised
    assert deaths == [("i0", reason, False)]
    assert "i0" not in mgr.resident() and mgr.memory_free()[0] == pytest.approx(4096.0)
    assert mgr.health() == {"model_worker_deaths": 1, "last_model_worker_death": reason}
    with pytest.raises(Exception, match="not loaded"):
        await mgr.run_batch("i0", _actions("b"))
    # a replacement on the same device: a new process, scoring exactly as the dead one did
    await mgr.load("i1", "tiny-rm", (0,))
    after = await mgr.run_batch("i1", _actions("a"))
    assert not after.failed and after.batch_size == 4
    for aid, out in before.outputs.items():
        assert after.outputs[aid]["score"] == pytest.approx(out["score"], abs=1e-6)


async def test_sigsegv_from_outside_mid_batch_ends_only_the_instance(
        rm: ModelSpec, tmp_path: Path) -> None:
    mgr, fac, deaths = await _manager(rm, tmp_path, "hold")
    try:
        pid = mgr.worker_pid("i0")
        assert pid is not None and pid != os.getpid()
        await _dies_then_replaced(mgr, fac, deaths, PREFIX + f"process {pid} was killed by SIGSEGV",
                                  lambda: os.kill(pid, signal.SIGSEGV))
        assert mgr.worker_pid("i1") not in (None, pid)
    finally:
        await mgr.aclose()


async def test_native_segfault_in_the_forward(rm: ModelSpec, tmp_path: Path) -> None:
    mgr, fac, deaths = await _manager(rm, tmp_path, "segv")
    try:
        pid = mgr.worker_pid("i0")
        await _dies_then_replaced(mgr, fac, deaths, PREFIX + f"process {pid} was killed by SIGSEGV")
    finally:
        await mgr.aclose()


async def test_forward_past_its_deadline_is_killed(rm: ModelSpec, tmp_path: Path) -> None:
    mgr, fac, deaths = await _manager(rm, tmp_path, "hold", timeout=1.5)
    try:
        pid = mgr.worker_pid("i0")
        await _dies_then_replaced(
            mgr, fac, deaths, PREFIX + f"its forward pass ran past its 1.5 s deadline "
            f"(forward_timeout_s); process {pid} was killed")
        assert os.path.exists(fac.entered)  # it did hang
        for _ in range(500):  # the hung process is gone (killed and reaped)
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.01)
        assert not os.path.exists(f"/proc/{pid}")
    finally:
        await mgr.aclose()


async def test_crash_worker_kills_the_process_mid_batch(rm: ModelSpec, tmp_path: Path) -> None:
    mgr, fac, deaths = await _manager(rm, tmp_path, "hold")
    try:
        pid = mgr.worker_pid("i0")
        await _dies_then_replaced(mgr, fac, deaths, PREFIX + f"process {pid} was killed by SIGKILL",
                                  lambda: mgr.crash_worker("i0"))
        assert not mgr.crash_worker("i0")  # gone: nothing to kill
    finally:
        await mgr.aclose()


async def test_idle_instance_killed_is_noticed_without_a_batch(
        rm: ModelSpec, tmp_path: Path) -> None:
    mgr, _, deaths = await _manager(rm, tmp_path, "hold")
    try:
        pid = mgr.worker_pid("i0")
        assert mgr.crash_worker("i0")
        for _ in range(1000):
            if deaths:
                break
            await asyncio.sleep(0.01)
        assert deaths == [("i0", PREFIX + f"process {pid} was killed by SIGKILL", False)]
        assert mgr.resident() == {} and mgr.health()["model_worker_deaths"] == 1
    finally:
        await mgr.aclose()


async def test_sticky_device_error_ends_the_instance(rm: ModelSpec, tmp_path: Path) -> None:
    text = "CUDA error: an illegal memory access was encountered"
    mgr, fac, deaths = await _manager(rm, tmp_path, "raise:" + text)
    try:
        await _dies_then_replaced(mgr, fac, deaths, PREFIX + "RuntimeError: " + text)
    finally:
        await mgr.aclose()


@pytest.mark.parametrize("text", ["shape mismatch", "CUDA out of memory. Tried to allocate 2 GiB"])
async def test_ordinary_model_error_fails_the_batch_and_keeps_the_instance(
        rm: ModelSpec, tmp_path: Path, text: str) -> None:
    mgr, fac, deaths = await _manager(rm, tmp_path, "raise:" + text)
    try:
        pid = mgr.worker_pid("i0")
        Path(fac.armed).touch()
        out = await mgr.run_batch("i0", _actions("a", 2))
        assert not out.outputs
        assert out.failed == dict.fromkeys(["a0", "a1"], f"model tiny-rm failed: RuntimeError: {text}")
        assert deaths == [] and mgr.resident()["i0"]["state"] == "loaded"
        again = await mgr.run_batch("i0", _actions("a", 2))
        assert not again.failed and again.batch_size == 2
        assert mgr.health()["model_worker_deaths"] == 0 and mgr.worker_pid("i0") == pid
    finally:
        await mgr.aclose()


def test_bad_forward_timeout_is_named(rm: ModelSpec) -> None:
    with pytest.raises(ValueError, match=r"model tiny-rm: options.forward_timeout_s must be a "
                                         r"number > 0, got 'soon'"):
        GpuManager(GpuManagerConfig(device="cpu"),
                   [dataclasses.replace(rm, options={"forward_timeout_s": "soon"})])
    with pytest.raises(ValueError, match=r"GpuManagerConfig.forward_timeout_s must be a number "
                                         r"> 0, got 0"):
        GpuManagerConfig(forward_timeout_s=0)
