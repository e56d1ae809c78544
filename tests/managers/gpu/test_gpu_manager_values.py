"""The GPU manager's own logic with exact values (issue 43): booking and placement, the load /
swap / park / unload paths, the messages sent to an instance's process, errors and their texts,
supervision (a dead, hung or broken process), the reports. The model process is a stand-in
(`_FakeWorker`: scripted replies, a real pipe as its sentinel), the fork server is not started,
and devices are described by hand where CUDA matters: no model is built, nothing is forked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import ScoreRequest
from arl_tangram.managers.gpu import manager as mgr_mod
from arl_tangram.managers.gpu.config import BatchOutcome, DeviceInfo, GpuManagerConfig
from arl_tangram.managers.gpu.manager import GpuManager, ModelWorkerDied, _Instance, _Locks
from arl_tangram.managers.gpu.worker import WorkerGone, WorkerTimeout

Reply = Callable[["_FakeWorker", tuple[Any, ...], float | None], tuple[Any, ...]]


def _ok(w: _FakeWorker, msg: tuple[Any, ...], timeout: float | None) -> tuple[Any, ...]:
    if msg[0] == "load":
        return ("ok", 0.25, 12.5, msg[4])
    if msg[0] == "to":
        return ("ok", 0.125, msg[2])
    if msg[0] == "score":
        return ("ok", [{"score": float(i)} for i in range(len(msg[1]))], 0.5)
    raise AssertionError(msg)


class _FakeWorker:
    """An instance's process, in this process: scripted replies; its sentinel a real pipe."""

    made: list[_FakeWorker] = []
    reply: Reply = staticmethod(_ok)

    def __init__(self) -> None:
        self.pid = 4000 + len(_FakeWorker.made)
        self.sentinel, self._w = os.pipe()
        self.calls: list[tuple[tuple[Any, ...], float | None]] = []
        self.kills: list[int] = []
        self.stops = 0
        self.live = True
        self.threads: list[str] = []  # the thread each call came from
        self.stopped_in: list[tuple[str, bool]] = []  # (thread name, daemon) of each stop
        _FakeWorker.made.append(self)

    def call(self, msg: tuple[Any, ...], timeout: float | None = None) -> tuple[Any, ...]:
        self.calls.append((msg, timeout))
        self.threads.append(threading.current_thread().name)
        return type(self).reply(self, msg, timeout)

    def alive(self) -> bool:
        return self.live

    def ended(self) -> str:
        return f"process {self.pid} was killed by SIGKILL"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.kills.append(sig)

    def stop(self) -> None:
        t = threading.current_thread()
        self.stopped_in.append((t.name, t.daemon))
        self.stops += 1

    def exit(self) -> None:
        """The process ends: its sentinel becomes readable."""
        self.live = False
        os.write(self._w, b"x")


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> Any:
    _FakeWorker.made = []
    monkeypatch.setattr(_FakeWorker, "reply", staticmethod(_ok))
    monkeypatch.setattr(mgr_mod, "Worker", _FakeWorker)
    monkeypatch.setattr(mgr_mod, "start_fork_server", lambda: None)
    yield
    for w in _FakeWorker.made:
        for fd in (w.sentinel, w._w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _spec(name: str = "rm", **kw: Any) -> ModelSpec:
    kw.setdefault("memory_mb", 1000.0)
    return ModelSpec(name, kind="scalar", path="/none", **kw)


def _cfg(**kw: Any) -> GpuManagerConfig:
    kw.setdefault("device", "cpu")
    return GpuManagerConfig(**kw)


def _act(aid: str, model: str | None = "rm", **payload: Any) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.REWARD, model=model, payload=payload or {"query": aid})


def _cuda(
    monkeypatch: pytest.MonkeyPatch,
    n: int = 2,
    mb: float = 8000.0,
    domains: tuple[tuple[int, ...], ...] | None = None,
) -> None:
    doms = domains or (tuple(range(n)),)
    dom_of = {d: i for i, dom in enumerate(doms) for d in dom}
    devs = [DeviceInfo(i, "cuda", mb, dom_of[i], 0, "H") for i in range(n)]
    monkeypatch.setattr(mgr_mod, "discover", lambda config: (devs, doms))


# ---- construction and the node's description --------------------------------------------------


def test_construction_checks_names_and_forward_timeouts() -> None:
    with pytest.raises(ValueError) as e:
        GpuManager(_cfg(), [_spec(), _spec()])
    assert str(e.value) == "GpuManager: model names must be unique"
    for bad in (True, "1", 0, -1.5, 0.0):
        with pytest.raises(ValueError) as e:
            GpuManager(_cfg(), [_spec(options={"forward_timeout_s": bad})])
        assert str(e.value) == (
            f"model rm: options.forward_timeout_s must be a number > 0, got {bad!r}"
        )
    for good in (1, 0.5, None):
        GpuManager(_cfg(), [_spec(options={"forward_timeout_s": good})])
    m = GpuManager(None, [_spec()])
    assert m.config == GpuManagerConfig()
    assert m.on_worker_death is None and m.worker_deaths == 0 and m.last_worker_death == ""
    assert m.health() == {"model_worker_deaths": 0, "last_model_worker_death": ""}
    assert m._batcher._wait_s == 0.005
    assert m._batcher._run == m.run_batch and m._batcher._knee == m._knee


def test_the_fork_server_is_started_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(mgr_mod, "start_fork_server", lambda: started.append(1))
    GpuManager(_cfg(), [_spec()])
    assert started == [1]


def test_node_description_capacity_and_memory() -> None:
    m = GpuManager(_cfg(cpu_devices=3, cpu_device_memory_mb=2048.0), [_spec(), _spec("b")])
    assert [d.index for d in m.devices()] == [0, 1, 2]
    assert m.devices() is not m._devices
    assert m.nvlink_domains() == ((0, 1, 2),)
    assert m.node_capacity() == Resources(gpu=3, gpu_memory_mb=6144.0)
    assert m.node_spec("n1") == NodeSpec(
        "n1", Resources(gpu=3, gpu_memory_mb=6144.0), "gpu", ((0, 1, 2),)
    )
    assert m.node_spec("n1", {"cpu": 4, "memory_mb": 100}) == NodeSpec(
        "n1", Resources(gpu=3, gpu_memory_mb=6144.0, cpu=4, memory_mb=100), "gpu", ((0, 1, 2),)
    )
    assert [s.name for s in m.models()] == ["rm", "b"]
    assert m.memory_free() == {0: 2048.0, 1: 2048.0, 2: 2048.0}
    assert m.fitted_costs("rm")["alpha"] == _spec().alpha
    with pytest.raises(BrokenError) as e:
        m.fitted_costs("zz")
    assert str(e.value) == "unknown model 'zz'; this node serves ['b', 'rm']"


def test_place_is_the_best_fit_and_why_unplaceable_names_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda(monkeypatch, n=4, mb=8000.0, domains=((0, 1), (2, 3)))
    m = GpuManager(
        _cfg(),
        [
            _spec("one", memory_mb=5000.0),
            _spec("two", devices=2),
            _spec("big", memory_mb=9000.0),
            _spec("wide", devices=3),
        ],
    )
    assert m.place("one") == (0,)
    m._booked_mb[0] = 4000.0  # (device 0 has 4000 MB left: too little for "one")
    assert m.place("one") == (1,)
    assert m.place("two") == (0, 1)  # (best fit: the domain with less free)
    m._booked_mb[1] = 3500.0
    assert m.place("one") == (2,)
    assert m.why_unplaceable("one") is None
    assert m.why_unplaceable("big") == (
        "model big needs 9000 MB per device; node this-node has 8000 MB per device"
    )
    assert m.why_unplaceable("wide") == (
        "model wide needs 3 devices inside one NVLink domain; the largest domain of node "
        "this-node has 2"
    )
    assert m.place("big") is None


# ---- load -------------------------------------------------------------------------------------


async def test_a_cold_load_sends_the_load_request_and_books_memory() -> None:
    m = GpuManager(
        _cfg(cpu_devices=2, threads_per_device=3, max_length=77, max_batch_tokens=999),
        [_spec("rm", devices=2, memory_mb=300.0)],
    )
    try:
        assert await m.load("i0", "rm", [1, 0]) == 0.25  # type: ignore[arg-type]
        (w,) = _FakeWorker.made
        ((msg, timeout),) = w.calls
        assert timeout is None
        assert msg == ("load", m._specs["rm"], None, "cpu", 6, 77, 999)
        assert m.memory_free() == {0: 4096.0 - 300.0, 1: 4096.0 - 300.0}
        assert m.resident() == {
            "i0": {
                "model": "rm",
                "devices": (1, 0),
                "state": "loaded",
                "from_host": False,
                "load_s": 0.25,
                "weights_mb": 12.5,
            }
        }
        assert m.worker_threads("i0") == 6 and m.worker_threads("zz") == 0
        assert m.worker_pid("i0") == w.pid and m.worker_pid("zz") is None
        f = m.fitted_costs("rm")
        assert (f["load_s"], f["load_samples"], f["swap_samples"]) == (0.25, 1, 0)
        inst = m._instances["i0"]
        assert (inst.busy, inst.watched, inst.threads, inst.host_mb) == (0, True, 6, 12.5)
        assert inst.executor is not None
        with pytest.raises(BrokenError) as e:
            await m.load("i0", "rm", (0, 1))
        assert str(e.value) == "instance i0 already exists"
    finally:
        await m.aclose()
    assert w.stops == 1


async def test_weights_mb_is_rounded_to_three_places() -> None:
    _FakeWorker.reply = staticmethod(lambda w, msg, t: ("ok", 1, 1.23456, 1))
    m = GpuManager(_cfg(), [_spec()])
    try:
        assert await m.load("i0", "rm", (0,)) == 1.0
        assert m.resident()["i0"]["weights_mb"] == 1.235
        assert isinstance(m.resident()["i0"]["load_s"], float)
    finally:
        await m.aclose()


async def test_a_cuda_instance_loads_on_its_first_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, n=3)
    m = GpuManager(_cfg(threads_per_device=2), [_spec(devices=2)])
    try:
        await m.load("i0", "rm", (2, 1))
        assert _FakeWorker.made[0].calls[0][0][3] == "cuda:2"
        assert _FakeWorker.made[0].calls[0][0][4] == 4
    finally:
        await m.aclose()


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ((0,), "model rm needs 2 distinct devices, got (0,)"),
        ((0, 0), "model rm needs 2 distinct devices, got (0, 0)"),
        ((0, 1, 2), "model rm needs 2 distinct devices, got (0, 1, 2)"),
        ((0, 7), "model rm: device 7 does not exist on this node"),
        ((9, 7), "model rm: device 9 does not exist on this node"),
        ((1, 2), "model rm: devices (1, 2) span NVLink domains ((0, 1), (2, 3))"),
    ],
)
async def test_devices_are_checked_with_exact_messages(
    monkeypatch: pytest.MonkeyPatch, devices: tuple[int, ...], message: str
) -> None:
    _cuda(monkeypatch, n=4, domains=((0, 1), (2, 3)))
    m = GpuManager(_cfg(), [_spec(devices=2)])
    with pytest.raises(BrokenError) as e:
        await m.load("i0", "rm", devices)
    assert str(e.value) == message
    assert m._instances == {} and m.memory_free() == dict.fromkeys(range(4), 8000.0)
    assert _FakeWorker.made == []


async def test_memory_is_checked_per_device_to_the_megabyte() -> None:
    m = GpuManager(
        _cfg(cpu_device_memory_mb=1000.0),
        [_spec("a", memory_mb=600.0), _spec("b", memory_mb=400.0), _spec("c", memory_mb=0.5)],
    )
    try:
        await m.load("a0", "a", (0,))
        await m.load("b0", "b", (0,))  # exactly full
        assert m.memory_free()[0] == 0.0
        with pytest.raises(BrokenError) as e:
            await m.load("c0", "c", (0,))
        assert str(e.value) == "model c needs 0.5 MB on device 0; 0 MB free"
        await m.load("c1", "c", (1,))
        await m.unload("a0", park=False)
        assert m.memory_free() == {0: 600.0, 1: 999.5}
        await m.unload("a0", park=False)  # (twice: nothing more freed)
        assert m.memory_free() == {0: 600.0, 1: 999.5}
    finally:
        await m.aclose()
    assert m.memory_free() == {0: 1000.0, 1: 1000.0}


async def test_booking_never_goes_below_zero() -> None:
    m = GpuManager(_cfg(cpu_device_memory_mb=1000.0), [_spec(memory_mb=300.0)])
    inst = _Instance("x", m._specs["rm"], (0,))
    m._book(inst, -1)
    assert m._booked_mb[0] == 0.0
    m._book(inst, +1)
    m._book(inst, +1)
    assert m._booked_mb[0] == 600.0
    m._book(inst, -1)
    assert m._booked_mb[0] == 300.0


async def test_unknown_model_and_a_closed_manager() -> None:
    m = GpuManager(_cfg(), [_spec()])
    with pytest.raises(BrokenError) as e:
        await m.load("i0", "nope", (0,))
    assert str(e.value) == "unknown model 'nope'; this node serves ['rm']"
    await m.aclose()
    await m.aclose()  # (twice: nothing)
    for coro in (
        m.load("i0", "rm", (0,)),
        m.run_batch("i0", [_act("a")]),
        m.submit("i0", _act("a")),
    ):
        with pytest.raises(ClosedError) as ce:
            await coro
        assert str(ce.value) == "the GPU manager is closed"


async def test_close_unloads_and_ends_parked_instances() -> None:
    m = GpuManager(_cfg(), [_spec(), _spec("b")])
    await m.load("i0", "rm", (0,))
    await m.load("i1", "b", (1,))
    assert await m.unload("i1") is True
    closed = m._batcher.aclose

    calls: list[int] = []

    async def spy() -> None:
        calls.append(1)
        await closed()

    m._batcher.aclose = spy  # type: ignore[method-assign]
    await m.aclose()
    assert calls == [1]
    assert m._instances == {} and not m._parked
    assert [w.stops for w in _FakeWorker.made] == [1, 1]
    assert all(w.calls[-1][0][0] != "to" or w is _FakeWorker.made[1] for w in _FakeWorker.made)


async def test_a_failed_load_names_the_instance_the_model_and_the_error() -> None:
    def fail(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        if w.pid == 4000:  # (the first instance loads)
            return _ok(w, msg, t)
        return ("error", False, "OSError: no such model", False)

    _FakeWorker.reply = staticmethod(fail)
    m = GpuManager(_cfg(cpu_device_memory_mb=4000.0), [_spec(memory_mb=1000.0)])
    try:
        await m.load("ok", "rm", (0,))
        with pytest.raises(BrokenError) as e:
            await m.load("i0", "rm", (0,))
        assert str(e.value) == "instance i0 (rm): load failed: OSError: no such model"
        assert isinstance(e.value.__cause__, RuntimeError)
        assert list(m._instances) == ["ok"] and m.memory_free()[0] == 3000.0
        assert _FakeWorker.made[1].stops == 1
        assert m.fitted_costs("rm")["load_samples"] == 1
    finally:
        await m.aclose()


async def test_a_broken_error_from_the_model_is_raised_as_is() -> None:
    _FakeWorker.reply = staticmethod(lambda w, msg, t: ("error", False, "bad path /x", True))
    m = GpuManager(_cfg(), [_spec()])
    with pytest.raises(BrokenError) as e:
        await m.load("i0", "rm", (0,))
    assert str(e.value) == "bad path /x"
    assert m._instances == {}
    await m.aclose()


async def test_a_process_that_dies_while_loading_points_at_stderr() -> None:
    def gone(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        raise WorkerGone(f"process {w.pid} exited with status 1")

    _FakeWorker.reply = staticmethod(gone)
    m = GpuManager(_cfg(), [_spec()])
    with pytest.raises(BrokenError) as e:
        await m.load("i0", "rm", (0,))
    assert str(e.value) == (
        "instance i0 (rm): load failed: process 4000 exited with status 1; its traceback is on "
        "the service's stderr (a script that starts the engine needs `if __name__ == "
        '"__main__":`: model processes import it)'
    )
    assert e.value.__cause__ is not None and type(e.value.__cause__).__name__ == "_Died"
    assert m._instances == {} and m.memory_free()[0] == 4096.0
    await m.aclose()


async def test_unloaded_while_loading() -> None:
    gate = threading.Event()
    entered = threading.Event()

    def slow(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        entered.set()
        gate.wait(5)
        return _ok(w, msg, t)

    _FakeWorker.reply = staticmethod(slow)
    m = GpuManager(_cfg(), [_spec()])
    try:
        task = asyncio.create_task(m.load("i0", "rm", (0,)))
        await asyncio.to_thread(entered.wait, 5)
        assert m.resident()["i0"]["state"] == "loading"
        inst = m._instances["i0"]
        assert inst.busy == 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await m.unload("i0") is False
        assert loop.time() - t0 < 2.0  # (the loop is not held until the load ends)
        assert m.memory_free()[0] == 4096.0
        gate.set()
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance i0 was unloaded while it was loading"
        assert m._instances == {} and _FakeWorker.made[0].stops == 1
        assert (inst.busy, inst.state) == (0, "dead")
        assert m.memory_free()[0] == 4096.0
        assert m.fitted_costs("rm")["load_samples"] == 0
    finally:
        gate.set()
        await m.aclose()


async def test_unloaded_while_loading_and_then_the_load_failed() -> None:
    gate = threading.Event()
    entered = threading.Event()

    def slow_fail(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        entered.set()
        gate.wait(5)
        return ("error", False, "boom", False) if w.pid == 4000 else _ok(w, msg, t)

    _FakeWorker.reply = staticmethod(slow_fail)
    m = GpuManager(_cfg(cpu_device_memory_mb=1000.0), [_spec(memory_mb=400.0)])
    try:
        task = asyncio.create_task(m.load("i0", "rm", (0,)))
        await asyncio.to_thread(entered.wait, 5)
        inst = m._instances["i0"]
        assert await m.unload("i0") is False
        other = asyncio.create_task(m.load("i1", "rm", (0,)))  # (its device booked again)
        while "i1" not in m._instances:
            await asyncio.sleep(0)
        gate.set()
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance i0 was unloaded while it was loading"
        assert isinstance(e.value.__cause__, RuntimeError)
        assert (inst.busy, inst.state) == (0, "dead")
        assert m.memory_free()[0] == 600.0 and list(m._instances) == ["i1"]
        await other
    finally:
        gate.set()
        await m.aclose()


async def test_load_sync_refuses_an_instance_no_longer_there() -> None:
    m = GpuManager(_cfg(), [_spec()])
    inst = _Instance("gone", m._specs["rm"], (0,))
    with pytest.raises(BrokenError) as e:
        m._load_sync(inst, None)
    assert str(e.value) == "instance gone was unloaded while it was loading"
    assert _FakeWorker.made == []


async def test_a_factory_is_pickled_for_the_process_and_an_unpicklable_one_is_named() -> None:
    import cloudpickle

    m = GpuManager(_cfg(), [_spec(), _spec("f")], factories={"f": lambda spec, dev: (spec, dev)})
    try:
        await m.load("i0", "f", (0,))
        blob = _FakeWorker.made[0].calls[0][0][2]
        assert isinstance(blob, bytes) and cloudpickle.loads(blob)(1, 2) == (1, 2)
        await m.load("i1", "rm", (1,))
        assert _FakeWorker.made[1].calls[0][0][2] is None
    finally:
        await m.aclose()
    lock = threading.Lock()
    m = GpuManager(_cfg(), [_spec("f")], factories={"f": lambda s, d: lock})
    m._factories["f"] = lock  # type: ignore[assignment]
    with pytest.raises(BrokenError) as e:
        await m.load("i0", "f", (0,))
    assert str(e.value) == (
        "model f: its factory cannot be sent to a model process: "
        "TypeError: cannot pickle '_thread.lock' object"
    )
    assert isinstance(e.value.__cause__, TypeError)
    await m.aclose()


# ---- park, swap in, unload -------------------------------------------------------------------


async def test_cpu_park_keeps_the_process_and_swap_in_is_one_round_trip() -> None:
    m = GpuManager(_cfg(threads_per_device=2), [_spec(), _spec("b")])
    try:
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        assert await m.unload("i0") is True
        assert len(w.calls) == 1 and w.stops == 0 and w.kills == []  # nothing moved on CPU
        assert m.resident()["i0"] == {
            "model": "rm",
            "devices": (),
            "state": "parked",
            "from_host": False,
            "load_s": 0.25,
            "weights_mb": 12.5,
        }
        assert m.memory_free()[0] == 4096.0
        assert m.worker_pid("i0") == w.pid and m.worker_threads("i0") == 0
        assert await m.load("j", "rm", (1,), from_host=True) == 0.125
        assert len(_FakeWorker.made) == 1 and w.calls[-1] == (("to", "cpu", 2, False), None)
        r = m.resident()
        assert list(r) == ["j"] and (r["j"]["from_host"], r["j"]["load_s"]) == (True, 0.125)
        assert r["j"]["weights_mb"] == 12.5 and m.worker_threads("j") == 2
        f = m.fitted_costs("rm")
        assert (f["swap_s"], f["swap_samples"], f["load_samples"]) == (0.125, 1, 1)
        assert m._instances["j"].watched and m._parked == {}
        # a load from host with nothing parked of that model: a cold load
        assert await m.load("k", "b", (0,), from_host=True) == 0.25
        assert m.resident()["k"]["from_host"] is False and len(_FakeWorker.made) == 2
    finally:
        await m.aclose()


async def test_a_parked_process_that_died_is_not_parked(monkeypatch: pytest.MonkeyPatch) -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        w.live = False
        assert await m.unload("i0") is False
        assert m._parked == {} and w.stops == 1
        await m.load("i1", "rm", (0,))
        w1 = _FakeWorker.made[1]
        w1.worker = None
        m._instances["i1"].worker = None
        assert await m.unload("i1") is False
    finally:
        await m.aclose()


async def test_unload_without_park_ends_the_process() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        assert await m.unload("i0", park=False) is False
        assert w.stops == 1 and len(w.calls) == 1 and m.resident() == {}
        assert m.worker_pid("i0") is None
        assert await m.unload("i0") is False
        assert await m.unload("never") is False
    finally:
        await m.aclose()


async def test_cuda_park_moves_the_weights_to_pinned_host_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda(monkeypatch, n=2)
    m = GpuManager(_cfg(pin_host_memory=False), [_spec()])
    try:
        await m.load("i0", "rm", (1,))
        w = _FakeWorker.made[0]
        assert await m.unload("i0") is True
        assert w.calls[-1] == (("to", "cpu", 0, False), None)
        await m.load("i1", "rm", (0,), from_host=True)
        assert w.calls[-1] == (("to", "cuda:0", 1, False), None)
    finally:
        await m.aclose()
    _cuda(monkeypatch, n=1)
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        assert await m.unload("i0") is True
        assert _FakeWorker.made[-1].calls[-1] == (("to", "cpu", 0, True), None)
    finally:
        await m.aclose()


@pytest.mark.parametrize("how", ["error", "broken", "kills", "gone"])
async def test_a_cuda_park_that_fails_ends_the_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    def reply(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        if msg[0] != "to":
            return _ok(w, msg, t)
        if how == "gone":
            raise WorkerGone("pipe closed")
        return ("error", how == "kills", "no pinned memory", how == "broken")

    _cuda(monkeypatch, n=1)
    _FakeWorker.reply = staticmethod(reply)
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        with caplog.at_level(logging.WARNING, logger=mgr_mod.__name__):
            assert await m.unload("i0") is False
        assert m._parked == {} and _FakeWorker.made[0].stops == 1
        text = "pipe closed" if how == "gone" else "no pinned memory"
        assert f"instance i0 could not be parked: {text}" in caplog.messages
    finally:
        await m.aclose()


async def test_the_host_park_evicts_the_least_recently_parked() -> None:
    sizes = iter([100.0, 200.0, 300.0, 50.0, 600.0])
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: ("ok", 0.25, next(sizes), 1) if msg[0] == "load" else _ok(w, msg, t)
    )
    m = GpuManager(_cfg(host_park_limit_mb=500.0, cpu_devices=5), [_spec()])
    try:
        for i in range(5):
            await m.load(f"i{i}", "rm", (i,))
        ws = _FakeWorker.made
        assert await m.unload("i0") is True  # 100
        assert await m.unload("i1") is True  # 300
        assert list(m._parked) == ["i0", "i1"]
        assert await m.unload("i2") is True  # 600 > 500: i0 goes (then 500: fits exactly)
        assert list(m._parked) == ["i1", "i2"]
        assert ws[0].kills == [signal.SIGKILL] and ws[1].kills == []
        assert await m.unload("i3") is True  # 550: i1 goes
        assert list(m._parked) == ["i2", "i3"] and ws[1].kills == [signal.SIGKILL]
        assert await m.unload("i4") is False  # 600 alone is over the limit: ended, none evicted
        assert list(m._parked) == ["i2", "i3"] and ws[4].stops == 1 and ws[2].kills == []
        for _ in range(100):
            if ws[0].stops and ws[1].stops:
                break
            await asyncio.sleep(0.01)
        assert (ws[0].stops, ws[1].stops) == (1, 1)
    finally:
        await m.aclose()


async def test_a_park_at_exactly_the_limit_fits() -> None:
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: ("ok", 0.25, 500.0, 1) if msg[0] == "load" else _ok(w, msg, t)
    )
    m = GpuManager(_cfg(host_park_limit_mb=500.0), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        assert await m.unload("i0") is True
    finally:
        await m.aclose()


async def test_swap_in_takes_its_own_parked_instance_first_then_the_oldest() -> None:
    m = GpuManager(_cfg(cpu_devices=4), [_spec(), _spec("b")])
    try:
        for iid, model, dev in (("a", "rm", 0), ("b1", "b", 1), ("c", "rm", 2), ("d", "rm", 3)):
            await m.load(iid, model, (dev,))
        for iid in ("a", "b1", "c", "d"):
            assert await m.unload(iid) is True
        pid_a, pid_c, pid_d = (m.worker_pid(i) for i in ("a", "c", "d"))
        await m.load("c", "rm", (0,), from_host=True)  # its own id first
        assert m.worker_pid("c") == pid_c
        await m.load("x", "rm", (1,), from_host=True)  # then the oldest parked of the model
        assert m.worker_pid("x") == pid_a
        await m.load("b1x", "rm", (2,), from_host=True)  # ("b1" is another model's)
        assert m.worker_pid("b1x") == pid_d and list(m._parked) == ["b1"]
        await m.unload("x", park=False)
        await m.load("b1", "rm", (1,), from_host=True)  # its id, but another model: cold
        assert m.resident()["b1"]["from_host"] is False and list(m._parked) == ["b1"]
    finally:
        await m.aclose()


async def test_a_swap_in_that_fails_ends_the_process() -> None:
    def reply(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        if msg[0] == "to":
            return ("error", False, "RuntimeError: cuda OOM", False)
        return _ok(w, msg, t)

    _FakeWorker.reply = staticmethod(reply)
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        await m.unload("i0")
        with pytest.raises(BrokenError) as e:
            await m.load("i1", "rm", (1,), from_host=True)
        assert str(e.value) == "instance i1 (rm): load failed: RuntimeError: cuda OOM"
        assert _FakeWorker.made[0].stops == 1 and m._parked == {} and m._instances == {}
    finally:
        await m.aclose()


# ---- batches --------------------------------------------------------------------------------


async def test_a_batch_scores_good_actions_and_names_the_bad_ones() -> None:
    m = GpuManager(_cfg(), [_spec(options={"forward_timeout_s": 7})])
    try:
        await m.load("i0", "rm", (0,))
        acts = [
            _act("a"),
            _act("x", model="other"),
            ActionSpec("n", kind=ActionKind.CODE, payload={"query": "n"}),
            ActionSpec("p", kind=ActionKind.REWARD, model="rm", payload={"prompt": "x"}),
            _act("b"),
        ]
        out = await m.run_batch("i0", acts)
        assert out == BatchOutcome(
            {"a": {"score": 0.0}, "n": {"score": 1.0}, "b": {"score": 2.0}},
            {
                "x": "action names model 'other'; instance serves 'rm'",
                "p": "bad payload: payload needs 'query', or 'prompt' and 'response'",
            },
            0.5,
            3,
        )
        msg, timeout = _FakeWorker.made[0].calls[-1]
        assert msg == (
            "score",
            [ScoreRequest(query="a"), ScoreRequest(query="n"), ScoreRequest(query="b")],
        )
        assert timeout == 7.0 and isinstance(timeout, float)
        f = m.fitted_costs("rm")
        assert f["batch_samples"] == 1 and list(m._costs["rm"].batches) == [(3, 0.5)]
        assert m._instances["i0"].busy == 0
        # nothing good: no call at all
        n = len(_FakeWorker.made[0].calls)
        out = await m.run_batch("i0", [_act("x", model="other")])
        assert out == BatchOutcome(
            {}, {"x": "action names model 'other'; instance serves 'rm'"}, 0.0, 0
        )
        assert len(_FakeWorker.made[0].calls) == n
    finally:
        await m.aclose()


async def test_the_configured_forward_timeout_is_the_default() -> None:
    m = GpuManager(_cfg(forward_timeout_s=3), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        await m.run_batch("i0", [_act("a")])
        assert _FakeWorker.made[0].calls[-1][1] == 3.0
    finally:
        await m.aclose()


async def test_a_batch_for_an_instance_not_loaded() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        with pytest.raises(BrokenError) as e:
            await m.run_batch("i0", [_act("a")])
        assert str(e.value) == "instance i0 is not loaded on this node"
        await m.load("i0", "rm", (0,))
        await m.unload("i0")
        with pytest.raises(BrokenError) as e:
            await m.run_batch("i0", [_act("a")])
        assert str(e.value) == "instance i0 is not loaded on this node"
        await m.load("i1", "rm", (0,))
        m._instances["i1"].executor = None
        with pytest.raises(BrokenError):
            await m.run_batch("i1", [_act("a")])
        m._instances["i1"].state = "loading"
        with pytest.raises(BrokenError):
            await m.run_batch("i1", [_act("a")])
    finally:
        await m.aclose()


async def test_a_model_error_fails_the_batch_and_keeps_the_instance() -> None:
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: (
            ("error", False, "ValueError: nan", True) if msg[0] == "score" else _ok(w, msg, t)
        )
    )
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        out = await m.run_batch("i0", [_act("a"), _act("b"), _act("x", model="o")])
        assert out == BatchOutcome(
            {},
            {
                "x": "action names model 'o'; instance serves 'rm'",
                "a": "model rm failed: ValueError: nan",
                "b": "model rm failed: ValueError: nan",
            },
            0.0,
            0,
        )
        assert m.resident()["i0"]["state"] == "loaded" and m.worker_deaths == 0
        assert list(m._costs["rm"].batches) == []
    finally:
        await m.aclose()


@pytest.mark.parametrize("how", ["sticky", "timeout", "gone"])
async def test_a_dead_hung_or_broken_process_ends_the_instance(how: str) -> None:
    def reply(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        if msg[0] != "score":
            return _ok(w, msg, t)
        if how == "timeout":
            raise WorkerTimeout("late")
        if how == "gone":
            raise WorkerGone(f"process {w.pid} was killed by SIGSEGV")
        return ("error", True, "RuntimeError: CUDA error: illegal memory access", False)

    _FakeWorker.reply = staticmethod(reply)
    m = GpuManager(
        _cfg(forward_timeout_s=2.5, cpu_device_memory_mb=1000.0), [_spec(memory_mb=400.0)]
    )
    deaths: list[tuple[str, str]] = []
    m.on_worker_death = lambda iid, reason: deaths.append((iid, reason))
    try:
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        with pytest.raises(ModelWorkerDied) as e:
            await m.run_batch("i0", [_act("a")])
        cause = {
            "sticky": "RuntimeError: CUDA error: illegal memory access",
            "timeout": "its forward pass ran past its 2.5 s deadline (forward_timeout_s); "
            "process 4000 was killed",
            "gone": "process 4000 was killed by SIGSEGV",
        }[how]
        reason = f"the worker of model instance i0 (rm) died mid-batch: {cause}"
        assert (e.value.instance_id, e.value.reason, str(e.value)) == ("i0", reason, reason)
        assert isinstance(e.value, BrokenError)
        assert deaths == [("i0", reason)]
        assert m.health() == {"model_worker_deaths": 1, "last_model_worker_death": reason}
        assert m.resident() == {} and m.memory_free()[0] == 1000.0
        assert w.kills == ([] if how == "gone" else [signal.SIGKILL]) + [signal.SIGKILL]
        for _ in range(100):
            if w.stops:
                break
            await asyncio.sleep(0.01)
        assert w.stops == 1
        assert m._instances == {} and m.worker_pid("i0") is None
    finally:
        await m.aclose()


async def test_a_death_hook_that_raises_is_logged_and_the_batch_still_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: (
            ("error", True, "CUDA error", False) if msg[0] == "score" else _ok(w, msg, t)
        )
    )
    m = GpuManager(_cfg(), [_spec()])

    def hook(iid: str, reason: str) -> None:
        raise RuntimeError("hook")

    m.on_worker_death = hook
    try:
        await m.load("i0", "rm", (0,))
        with (
            caplog.at_level(logging.WARNING, logger=mgr_mod.__name__),
            pytest.raises(ModelWorkerDied),
        ):
            await m.run_batch("i0", [_act("a")])
        assert "on_worker_death hook failed for i0" in caplog.messages
        assert (
            "the worker of model instance i0 (rm) died mid-batch: CUDA error; "
            "instance dropped" in caplog.messages
        )
        assert m.worker_deaths == 1
    finally:
        await m.aclose()


async def test_worker_died_twice_counts_once() -> None:
    m = GpuManager(_cfg(), [_spec()])
    deaths: list[str] = []
    m.on_worker_death = lambda iid, reason: deaths.append(iid)
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        with pytest.raises(ModelWorkerDied) as e:
            m._worker_died(inst, "x")
        assert e.value.reason == "the worker of model instance i0 (rm) died mid-batch: x"
        with pytest.raises(ModelWorkerDied) as e:
            m._worker_died(inst, "y")
        assert e.value.reason == "the worker of model instance i0 (rm) died mid-batch: y"
        m._worker_died(inst, "z", raise_=False)  # (no raise, nothing counted)
        assert deaths == ["i0"] and m.worker_deaths == 1
        assert m.last_worker_death.endswith(": x") and inst.state == "dead"
        assert inst.executor is None and inst.worker is None
        # another instance registered under the same id is not this one
        await m.load("i0", "rm", (0,))
        with pytest.raises(ModelWorkerDied):
            m._worker_died(inst, "w")
        assert "i0" in m._instances and m.worker_deaths == 1
    finally:
        await m.aclose()


async def test_the_batcher_drops_what_waits_for_a_dead_or_unloaded_instance() -> None:
    m = GpuManager(_cfg(), [_spec()])
    dropped: list[tuple[str, str]] = []
    real = m._batcher.drop
    m._batcher.drop = lambda iid, reason: (dropped.append((iid, reason)), real(iid, reason))[1]  # type: ignore[method-assign]
    try:
        await m.load("i0", "rm", (0,))
        await m.unload("i0")
        assert dropped == [("i0", "instance i0 was unloaded")]
        await m.load("i1", "rm", (0,))
        m._worker_died(m._instances["i1"], "gone", raise_=False)
        assert dropped[-1] == ("i1", "the worker of model instance i1 (rm) died mid-batch: gone")
    finally:
        await m.aclose()


async def test_an_idle_process_that_exits_is_noticed_on_the_loop() -> None:
    m = GpuManager(_cfg(), [_spec()])
    deaths: list[tuple[str, str]] = []
    m.on_worker_death = lambda iid, reason: deaths.append((iid, reason))
    try:
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        w.exit()
        for _ in range(200):
            if deaths:
                break
            await asyncio.sleep(0.005)
        assert deaths == [
            (
                "i0",
                "the worker of model instance i0 (rm) died mid-batch: "
                "process 4000 was killed by SIGKILL",
            )
        ]
        assert m.resident() == {} and m.worker_deaths == 1
    finally:
        await m.aclose()


async def test_a_parked_process_that_exits_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    m = GpuManager(_cfg(), [_spec()])
    deaths: list[str] = []
    m.on_worker_death = lambda iid, reason: deaths.append(iid)
    try:
        await m.load("i0", "rm", (0,))
        assert await m.unload("i0") is True
        w = _FakeWorker.made[0]
        assert m._parked["i0"].watched
        with caplog.at_level(logging.WARNING, logger=mgr_mod.__name__):
            w.exit()
            for _ in range(200):
                if not m._parked:
                    break
                await asyncio.sleep(0.005)
        assert m._parked == {} and deaths == [] and m.worker_deaths == 0
        assert "parked instance i0 dropped: its process ended" in caplog.messages
        assert w.kills == [signal.SIGKILL]
    finally:
        await m.aclose()


async def test_exited_while_busy_is_left_to_the_request() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        inst.busy = 1
        m._exited(inst)
        assert inst.watched is False and m._instances["i0"] is inst and m.worker_deaths == 0
        inst.busy = 0
        inst.state = "loading"
        m._exited(inst)
        assert m._instances["i0"] is inst and m.worker_deaths == 0
        inst.state = "loaded"
        m._exited(inst)
        assert m._instances == {} and m.worker_deaths == 1
        # a parked instance that is no longer in the park (taken meanwhile): left there
        other = _Instance("p", m._specs["rm"], (0,), state="parked")
        m._parked["p"] = _Instance("p", m._specs["rm"], (0,), state="parked")
        m._exited(other)
        assert "p" in m._parked
    finally:
        await m.aclose()


async def test_watch_and_unwatch() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        loop = asyncio.get_running_loop()
        assert inst.watched and m._loop is loop
        m._watch(inst)  # (twice: one reader)
        m._unwatch(inst)
        assert inst.watched is False
        assert loop.remove_reader(inst.worker.sentinel) is False  # type: ignore[union-attr]
        noworker = _Instance("n", m._specs["rm"], (0,))
        m._watch(noworker)
        assert noworker.watched is False
    finally:
        await m.aclose()


# ---- crash_worker, submit, reports ----------------------------------------------------------


async def test_crash_worker_signals_a_live_process_only() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        assert m.crash_worker("i0") is False
        await m.load("i0", "rm", (0,))
        w = _FakeWorker.made[0]
        assert m.crash_worker("i0") is True and w.kills == [signal.SIGKILL]
        assert m.crash_worker("i0", signal.SIGSEGV) is True
        assert w.kills == [signal.SIGKILL, signal.SIGSEGV]
        await m.unload("i0")
        assert m.crash_worker("i0", signal.SIGTERM) is True  # (parked: its process too)
        assert w.kills[-1] == signal.SIGTERM
        w.live = False
        assert m.crash_worker("i0") is False and len(w.kills) == 3
    finally:
        await m.aclose()


async def test_submit_goes_through_the_batcher_with_the_knee() -> None:
    m = GpuManager(_cfg(batch_wait_ms=0.0), [_spec(max_batch=5, alpha=0.1, beta=0.1)])
    try:
        await m.load("i0", "rm", (0,))
        assert m._knee("i0") == 4 and m._knee("nope") == 1
        out = await asyncio.gather(*(m.submit("i0", _act(f"a{i}")) for i in range(3)))
        assert out == [{"score": 0.0}, {"score": 1.0}, {"score": 2.0}]
        assert m.batch_sizes() == [3] and m.batch_sizes() is not m._batcher.batch_sizes
    finally:
        await m.aclose()


def test_locks_are_taken_in_device_order_and_released_in_reverse() -> None:
    order: list[tuple[str, int]] = []

    class L:
        def __init__(self, i: int) -> None:
            self.i = i

        def acquire(self) -> None:
            order.append(("a", self.i))

        def release(self) -> None:
            order.append(("r", self.i))

    m = GpuManager(_cfg(cpu_devices=3), [_spec()])
    m._locks = {i: L(i) for i in range(3)}  # type: ignore[misc]
    with m._device_locks((2, 0, 1)):
        assert order == [("a", 0), ("a", 1), ("a", 2)]
    assert order[3:] == [("r", 2), ("r", 1), ("r", 0)]
    locks = [threading.Lock(), threading.Lock()]
    with _Locks(locks):
        assert all(lk.locked() for lk in locks)
    assert not any(lk.locked() for lk in locks)


async def test_a_call_to_an_instance_without_a_process() -> None:
    m = GpuManager(_cfg(), [_spec()])
    inst = _Instance("x", m._specs["rm"], (0,))
    with pytest.raises(mgr_mod._Died) as e:
        m._call(inst, ("score", []), 1.0)
    assert str(e.value) == "its process had ended"


async def test_errors_of_other_requests_raise_and_scores_come_back() -> None:
    m = GpuManager(_cfg(), [_spec()])
    inst = _Instance("x", m._specs["rm"], (0,))
    w = _FakeWorker()
    inst.worker = w  # type: ignore[assignment]
    _FakeWorker.reply = staticmethod(lambda w, msg, t: ("error", False, "t", False))
    assert m._call(inst, ("score", []), 1.0) == ("error", False, "t", False)
    with pytest.raises(RuntimeError) as e:
        m._call(inst, ("to", "cpu", 0, False), None)
    assert type(e.value) is RuntimeError and str(e.value) == "t"
    _FakeWorker.reply = staticmethod(lambda w, msg, t: ("error", False, "t", True))
    with pytest.raises(BrokenError) as be:
        m._call(inst, ("load",), None)
    assert str(be.value) == "t"
    assert w.kills == []


# ---- the death of a process, its edges -------------------------------------------------------


async def test_a_death_not_of_this_instance_raises_without_counting() -> None:
    m = GpuManager(_cfg(), [_spec()])
    deaths: list[str] = []
    m.on_worker_death = lambda iid, reason: deaths.append(iid)
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances.pop("i0")  # (unloaded meanwhile: no longer this node's)
        with pytest.raises(ModelWorkerDied) as e:
            m._worker_died(inst, "x")
        assert (e.value.instance_id, e.value.reason) == (
            "i0",
            "the worker of model instance i0 (rm) died mid-batch: x",
        )
        assert inst.state == "loaded" and deaths == [] and m.worker_deaths == 0
        m._instances["i0"] = inst
        inst.state = "dead"  # (registered, but already dead)
        with pytest.raises(ModelWorkerDied) as e:
            m._worker_died(inst, "y")
        assert e.value.instance_id == "i0" and deaths == [] and m.worker_deaths == 0
        assert m._instances["i0"] is inst
        inst.state = "loaded"
    finally:
        await m.aclose()


async def test_each_death_counts_and_frees_only_its_own_memory() -> None:
    m = GpuManager(_cfg(cpu_device_memory_mb=1000.0), [_spec(memory_mb=300.0)])
    try:
        for iid in ("a", "b", "c"):
            await m.load(iid, "rm", (0,))
        assert m.memory_free()[0] == 100.0
        ex = m._instances["a"].executor
        assert ex is not None
        m._worker_died(m._instances["a"], "one", raise_=False)
        assert m.memory_free()[0] == 400.0 and ex._shutdown  # type: ignore[attr-defined]
        m._worker_died(m._instances["b"], "two", raise_=False)
        assert m.memory_free()[0] == 700.0
        assert m.worker_deaths == 2
        assert m.last_worker_death == "the worker of model instance b (rm) died mid-batch: two"
        for _ in range(200):
            if all(w.stopped_in for w in _FakeWorker.made[:2]):
                break
            await asyncio.sleep(0.005)
        assert _FakeWorker.made[0].stopped_in == [("reap-a", True)]
        assert _FakeWorker.made[1].stopped_in == [("reap-b", True)]
    finally:
        await m.aclose()


async def test_an_evicted_park_is_reaped_on_a_daemon_thread() -> None:
    sizes = iter([300.0, 300.0])
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: ("ok", 0.25, next(sizes), 1) if msg[0] == "load" else _ok(w, msg, t)
    )
    m = GpuManager(_cfg(host_park_limit_mb=500.0), [_spec()])
    try:
        await m.load("a", "rm", (0,))
        await m.load("b", "rm", (1,))
        assert await m.unload("a") is True
        assert await m.unload("b") is True  # (a evicted)
        w = _FakeWorker.made[0]
        for _ in range(200):
            if w.stopped_in:
                break
            await asyncio.sleep(0.005)
        (name, daemon) = w.stopped_in[0]
        assert daemon is True and name != "MainThread"
    finally:
        await m.aclose()


async def test_requests_run_on_the_instances_own_thread_and_busy_is_restored() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        inst.busy = 1  # (another request in flight)
        await m.run_batch("i0", [_act("a")])
        assert inst.busy == 1
        inst.busy = 0
        w = _FakeWorker.made[0]
        assert len(set(w.threads)) == 1 and w.threads[0].startswith("gpu-i0")
        await m.unload("i0")
        await m.load("j", "rm", (1,), from_host=True)
        assert w.threads[-1].startswith("gpu-j")
    finally:
        await m.aclose()


async def test_a_reply_with_fewer_outputs_than_requests_is_an_error() -> None:
    _FakeWorker.reply = staticmethod(
        lambda w, msg, t: ("ok", [{"score": 1.0}], 0.5) if msg[0] == "score" else _ok(w, msg, t)
    )
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        with pytest.raises(ValueError):
            await m.run_batch("i0", [_act("a"), _act("b")])
    finally:
        await m.aclose()


def test_place_keeps_an_instance_inside_one_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, n=4, mb=8000.0, domains=((0, 1), (2, 3)))
    m = GpuManager(_cfg(), [_spec("two", devices=2, memory_mb=1000.0)])
    m._booked_mb[1] = 7500.0
    m._booked_mb[3] = 7500.0
    assert m.place("two") is None  # (0 and 2 have room, but in two domains)
    m._booked_mb[3] = 0.0
    assert m.place("two") == (2, 3)


async def test_memory_within_the_tolerance_fits() -> None:
    m = GpuManager(_cfg(cpu_device_memory_mb=1.0 - 1e-9), [_spec(memory_mb=1.0)])
    try:
        await m.load("i0", "rm", (0,))  # (1e-9 MB short: within the tolerance)
    finally:
        await m.aclose()


async def test_an_ended_instance_is_dead_and_has_no_executor() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        assert await m.unload("i0", park=False) is False
        assert (inst.state, inst.executor, inst.worker) == ("dead", None, None)
        await m.load("i1", "rm", (0,))
        inst = m._instances["i1"]
        assert await m.unload("i1") is True
        assert (inst.state, inst.executor) == ("parked", None)
    finally:
        await m.aclose()


async def test_close_ends_cuda_instances_without_parking_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda(monkeypatch, n=1)
    m = GpuManager(_cfg(), [_spec()])
    await m.load("i0", "rm", (0,))
    await m.aclose()
    w = _FakeWorker.made[0]
    assert [c[0][0] for c in w.calls] == ["load"] and w.stops == 1


async def test_a_load_without_from_host_is_cold_even_with_a_parked_instance() -> None:
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        assert await m.unload("i0") is True
        await m.load("i1", "rm", (1,))
        assert len(_FakeWorker.made) == 2 and list(m._parked) == ["i0"]
        assert m.resident()["i1"]["from_host"] is False
        assert [c[0][0] for c in _FakeWorker.made[0].calls] == ["load"]
    finally:
        await m.aclose()


async def test_one_thread_drives_an_instance_and_busy_counts_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = threading.Event()
    entered = threading.Event()

    def reply(w: _FakeWorker, msg: tuple[Any, ...], t: float | None) -> tuple[Any, ...]:
        if msg[0] == "score" and not entered.is_set():
            entered.set()
            gate.wait(5)
        return _ok(w, msg, t)

    _cuda(monkeypatch, n=1)
    _FakeWorker.reply = staticmethod(reply)
    m = GpuManager(_cfg(), [_spec()])
    try:
        await m.load("i0", "rm", (0,))
        inst = m._instances["i0"]
        first = asyncio.create_task(m.run_batch("i0", [_act("a")]))
        await asyncio.to_thread(entered.wait, 5)
        second = asyncio.create_task(m.run_batch("i0", [_act("b")]))
        park = asyncio.create_task(m.unload("i0"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert inst.busy == 3
        gate.set()
        await first
        await second
        assert await park is True
        assert inst.busy == 0
        w = _FakeWorker.made[0]
        assert [c[0][0] for c in w.calls] == ["load", "score", "score", "to"]
        assert set(w.threads) == {"gpu-i0_0"}  # (one thread, in order: the park after both)
    finally:
        gate.set()
        await m.aclose()
