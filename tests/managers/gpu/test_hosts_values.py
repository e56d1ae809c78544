"""Exact values of managers/gpu/hosts.py (issue 43 item 2) on stand-in backends: which backend
each command of an instance goes to (by its model at load; the GPU manager for one it never
loaded), what a failed load forgets, the death hook set on both, the merged health and resident
maps, and `with_engines`' choice (the GPU manager alone, or both with the device kind)."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu.config import BatchOutcome, DeviceInfo
from arl_tangram.managers.gpu.engine_judge import EngineJudgeHost
from arl_tangram.managers.gpu.hosts import ModelHosts, with_engines


class _Backend:
    def __init__(self, name: str, models: tuple[str, ...] = (), fail_load: bool = False) -> None:
        self.name, self.models, self.fail_load = name, models, fail_load
        self.calls: list[tuple[Any, ...]] = []
        self.on_worker_death: Any = "unset"

    def serves(self, model: str) -> bool:
        return model in self.models

    async def load(
        self, iid: str, model: str, devices: tuple[int, ...], from_host: bool = False
    ) -> int:
        self.calls.append(("load", iid, model, devices, from_host))
        if self.fail_load:
            raise KeyboardInterrupt("boom")  # not an Exception: BaseException is caught too
        return 2  # an int: the host answers a float

    async def unload(self, iid: str, park: bool = True) -> int:
        self.calls.append(("unload", iid, park))
        return 1

    async def run_batch(self, iid: str, actions: Any) -> BatchOutcome:
        self.calls.append(("run_batch", iid, tuple(actions)))
        return BatchOutcome(latency_s=0.5, batch_size=len(actions))


class _Gpu(_Backend):
    def node_capacity(self) -> str:
        return "capacity"

    def nvlink_domains(self) -> tuple[tuple[int, ...], ...]:
        return ((0, 1), (2,))

    def resident(self) -> dict[str, Any]:
        return {"a": {"model": "m"}, "shared": {"from": "gpu"}}

    def health(self) -> dict[str, Any]:
        return {"model_worker_deaths": 2, "last_model_worker_death": "g: killed", "gpu_only": 1}

    def crash_worker(self, iid: str) -> bool:
        self.calls.append(("crash_worker", iid))
        return iid == "a"

    def fitted_costs(self, model: str) -> dict[str, Any]:
        return {"model": model, "alpha": 0.1}

    async def start(self) -> None:
        self.calls.append(("start",))

    async def aclose(self) -> None:
        self.calls.append(("aclose", "gpu"))


class _Engines(_Backend):
    def __init__(self, *a: Any, deaths: int = 0, last: str = "", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.deaths, self.last = deaths, last

    def resident(self) -> dict[str, Any]:
        return {"j": {"model": "judge"}, "shared": {"from": "engines"}}

    def health(self) -> dict[str, Any]:
        return {"judge_engine_deaths": self.deaths, "last_judge_engine_death": self.last}

    async def aclose(self) -> None:
        self.calls.append(("aclose", "engines"))


def _hosts(**kw: Any) -> tuple[ModelHosts, _Gpu, _Engines]:
    gpu, eng = _Gpu("gpu"), _Engines("engines", ("judge",), **kw)
    return ModelHosts(gpu, eng), gpu, eng  # type: ignore[arg-type]


def test_each_instance_goes_to_its_models_backend() -> None:
    h, gpu, eng = _hosts()

    async def go() -> None:
        assert await h.load("j1", "judge", (1,)) == 2.0
        assert type(await h.load("g1", "scorer", (0, 1), from_host=True)) is float
        assert (await h.run_batch("j1", ["x"])).batch_size == 1
        assert (await h.run_batch("g1", ["y", "z"])).batch_size == 2
        assert (await h.run_batch("never", [])).batch_size == 0  # unknown: the GPU manager
        assert await h.unload("j1", park=False) is True
        assert await h.unload("j1") is True  # forgotten: now the GPU manager's
        assert await h.unload("g1") is True

    asyncio.run(go())
    assert eng.calls == [
        ("load", "j1", "judge", (1,), False),
        ("run_batch", "j1", ("x",)),
        ("unload", "j1", False),
    ]
    assert gpu.calls == [
        ("load", "g1", "scorer", (0, 1), True),
        ("run_batch", "g1", ("y", "z")),
        ("run_batch", "never", ()),
        ("unload", "j1", True),
        ("unload", "g1", True),
    ]


def test_a_failed_load_forgets_the_instance() -> None:
    gpu, eng = _Gpu("gpu"), _Engines("engines", ("judge",), fail_load=True)
    h = ModelHosts(gpu, eng)  # type: ignore[arg-type]

    async def go() -> None:
        with pytest.raises(KeyboardInterrupt):
            await h.load("j1", "judge", (0,))
        await h.run_batch("j1", [])

    asyncio.run(go())
    assert [c[0] for c in eng.calls] == ["load"]
    assert gpu.calls == [("run_batch", "j1", ())]
    assert h._where == {}


def test_the_death_hook_is_set_on_both() -> None:
    h, gpu, eng = _hosts()
    assert h.on_worker_death is None

    def hook(iid: str, why: str) -> None:
        pass

    h.on_worker_death = hook
    assert h.on_worker_death is hook and gpu.on_worker_death is hook and eng.on_worker_death is hook
    h.on_worker_death = None
    assert (h.on_worker_death, gpu.on_worker_death, eng.on_worker_death) == (None, None, None)


def test_health_counts_dead_engines_as_worker_deaths() -> None:
    h, _, _ = _hosts()
    assert h.health() == {
        "model_worker_deaths": 2,
        "last_model_worker_death": "g: killed",
        "gpu_only": 1,
        "judge_engine_deaths": 0,
        "last_judge_engine_death": "",
    }
    h, _, _ = _hosts(deaths=3, last="j: exited 1")
    assert h.health() == {
        "model_worker_deaths": 5,
        "last_model_worker_death": "j: exited 1",
        "gpu_only": 1,
        "judge_engine_deaths": 3,
        "last_judge_engine_death": "j: exited 1",
    }


def test_the_rest_is_the_gpu_managers_and_close_goes_engines_first() -> None:
    h, gpu, eng = _hosts()
    assert h.node_capacity() == "capacity"
    assert h.nvlink_domains() == ((0, 1), (2,))
    assert h.resident() == {
        "a": {"model": "m"},
        "shared": {"from": "engines"},
        "j": {"model": "judge"},
    }
    assert h.crash_worker("a") is True and h.crash_worker("b") is False
    assert h.fitted_costs("m") == {"model": "m", "alpha": 0.1}
    log: list[tuple[Any, ...]] = []
    gpu.calls = eng.calls = log  # one log for both: the order of the calls

    async def go() -> None:
        await h.start()
        await h.aclose()

    asyncio.run(go())
    assert log == [("start",), ("aclose", "engines"), ("aclose", "gpu")]


class _GpuWith:
    def __init__(self, *kinds: str) -> None:
        self._devs = [DeviceInfo(i, k, 1.0, 0) for i, k in enumerate(kinds)]

    def devices(self) -> list[DeviceInfo]:
        return self._devs


def test_with_engines_only_when_a_model_is_a_judge_engine(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the engines' log directories
    models = [ModelSpec("s"), ModelSpec("t", kind="similarity")]
    gpu = _GpuWith("cpu", "cpu")
    assert with_engines(gpu, models) is gpu  # type: ignore[arg-type]
    assert with_engines(gpu, []) is gpu  # type: ignore[arg-type]
    judges = [
        ModelSpec("gj", kind="genjudge", path="x"),
        ModelSpec("gk", kind="genjudge", path="y"),
    ]
    h = with_engines(gpu, [*models, *judges])  # type: ignore[arg-type]
    assert isinstance(h, ModelHosts) and h.gpu is gpu
    assert isinstance(h.engines, EngineJudgeHost)
    assert (h.engines.device, h.engines.sleep_level) == ("cpu", 0)
    assert [h.engines.serves(m) for m in ("gj", "gk", "s", "t")] == [True, True, False, False]
    h = with_engines(_GpuWith("cpu", "cuda"), judges)  # type: ignore[arg-type]
    assert (h.engines.device, h.engines.sleep_level) == ("cuda", 1)  # type: ignore[union-attr]
    h = with_engines(_GpuWith(), judges)  # type: ignore[arg-type]
    assert h.engines.device == "cpu"  # type: ignore[union-attr]


def test_a_failed_load_unloaded_meanwhile_raises_the_loads_error() -> None:
    gate: asyncio.Event | None = None

    class _Slow(_Engines):
        async def load(
            self, iid: str, model: str, devices: tuple[int, ...], from_host: bool = False
        ) -> int:
            assert gate is not None
            await gate.wait()
            raise RuntimeError("engine did not start")

    gpu, eng = _Gpu("gpu"), _Slow("engines", ("judge",))
    h = ModelHosts(gpu, eng)  # type: ignore[arg-type]

    async def go() -> None:
        nonlocal gate
        gate = asyncio.Event()
        task = asyncio.create_task(h.load("j1", "judge", (0,)))
        await asyncio.sleep(0)
        assert await h.unload("j1") is True  # the engines': the load chose them
        gate.set()
        with pytest.raises(RuntimeError, match=r"^engine did not start$"):
            await task

    asyncio.run(go())
    assert eng.calls == [("unload", "j1", True)]
    assert h._where == {}
