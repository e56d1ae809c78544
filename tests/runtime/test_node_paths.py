"""A node's paths with test doubles for its managers (issue 36, item 2: `runtime/node/` and
`runtime/images/` by job): what each path emits when a manager fails, is missing or is
cancelled, what the reporters do with a manager that cannot tell, and the image cache's and
the transfers' edges (no source, no peer, a failing peer, a layer fetched meanwhile)."""

from __future__ import annotations

import asyncio
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import scripted_memory_use

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, Status
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import ImageError, ImagesUnsupported
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import RunResult
from arl_tangram.managers.gpu.config import GpuManagerConfig
from arl_tangram.runtime.images import NodeImages
from arl_tangram.runtime.images.peers import ImagePeer
from arl_tangram.runtime.images.transfer import LayerServer, Puller
from arl_tangram.runtime.node import NodeHost
from arl_tangram.runtime.node.actions import typed
from arl_tangram.runtime.node.reports import Reporters
from arl_tangram.runtime.node.seat import Seat

R1 = Resources(cpu=1, memory_mb=64)


class _Cpu:
    images = None

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.cancelled: list[str] = []
        self.sessions: set[str] = set()
        self.run_error: Exception | None = None
        self.resize_error: Exception | None = None

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def health(self) -> dict:
        return {"ready": True}

    async def run(self, a: ActionSpec, allotment: Resources) -> RunResult:
        if self.run_error is not None:
            raise self.run_error
        return RunResult.sandbox_error("sandbox gone")

    def has_session(self, sid: str) -> bool:
        return sid in self.sessions

    async def close_session(self, sid: str) -> None:
        self.closed.append(sid)
        if sid == "bad":
            raise RuntimeError("cannot close bad")

    async def cancel(self, action_id: str) -> None:
        self.cancelled.append(action_id)
        raise RuntimeError("gone already")

    async def resize(self, action_id: str, allotment: Resources) -> str:
        if self.resize_error is not None:
            raise self.resize_error
        return "applied"


class _Gpu:
    def __init__(self) -> None:
        self.on_worker_death: Any = None
        self.started = False
        self.gate = asyncio.Event()

    async def start(self) -> None:
        self.started = True

    def node_capacity(self) -> dict:
        return {"gpu": 1.0, "gpu_memory_mb": 1000.0}

    def nvlink_domains(self) -> tuple:
        return ((0,),)

    async def run_batch(self, instance_id: str, actions: Any) -> Any:
        await self.gate.wait()
        raise AssertionError

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        raise RuntimeError("stuck")

    def resident(self) -> dict:
        return {}

    def health(self) -> dict:
        return {}

    async def aclose(self) -> None:
        pass


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_action_path_failures_become_failed_outcomes(caplog) -> None:
    events: list[E.Event] = []
    cpu = _Cpu()
    host = NodeHost("n0", emit=events.append, cpu_manager=cpu)  # type: ignore[arg-type]
    host.submit(C.StartAction(ActionSpec("j", kind=ActionKind.JUDGE, model="m"), "n0", R1))
    host.submit(C.StartAction(ActionSpec("s", session="s1"), "n0", R1))
    await _settle()
    done = {e.action_id: e for e in events if isinstance(e, E.ActionFinished)}
    assert (done["j"].status, done["j"].reason) == (
        Status.FAILED, "RuntimeError: judge actions run in batches (RunBatch), not alone")
    closed = [e for e in events if isinstance(e, E.SessionClosed)]
    assert [(e.session_id, e.reason) for e in closed] == [("s1", "closed by node n0: sandbox gone")]
    cpu.run_error = ValueError("bad payload")
    host.submit(C.StartAction(ActionSpec("v"), "n0", R1))
    await _settle()
    done = {e.action_id: e for e in events if isinstance(e, E.ActionFinished)}
    assert (done["v"].status, done["v"].reason) == (Status.FAILED, "ValueError: bad payload")
    # a resize the manager refuses is dropped; one it takes is applied; a cancel that fails is
    # only logged
    cpu.resize_error = RuntimeError("no such sandbox")
    host.submit(C.ResizeAction("v", "n0", R1))
    await _settle()
    cpu.resize_error = None
    host.submit(C.ResizeAction("v", "n0", R1))
    host.submit(C.CancelAction("v", "n0"))
    await _settle()
    assert host.actions.resizes == {"applied": 1, "deferred": 0, "dropped": 1}
    assert cpu.cancelled == ["v"]
    await host.aclose()


def test_a_payload_that_is_no_request_stays_as_it_is() -> None:
    a = ActionSpec("x", payload={"code": 5})
    assert typed(a) == (a, None)


async def test_session_path_evicts_as_it_closes_and_logs_a_failed_close(caplog) -> None:
    cpu = _Cpu()
    host = NodeHost("n0", emit=lambda e: None, cpu_manager=cpu)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.node.sessions")
    host.submit(C.EvictSession("s1", "n0", "short of memory"))
    host.submit(C.CloseSession("bad", "n0"))
    await _settle()
    assert cpu.closed == ["s1", "bad"]
    assert "node n0: cannot close bad" in caplog.text
    await host.aclose()


async def test_model_path_without_a_gpu_manager_and_with_a_failing_one() -> None:
    events: list[E.Event] = []
    host = NodeHost("n0", emit=events.append, cpu_manager=_Cpu())  # type: ignore[arg-type]
    act = ActionSpec("a1", kind=ActionKind.JUDGE, model="m")
    host.submit(C.RunBatch("b1", "i1", "n0", "m", (act,)))
    host.submit(C.LoadModel("i1", "m", "n0", (0,)))
    await _settle()
    assert [(e.batch_id, dict(e.failed)) for e in events if isinstance(e, E.BatchFinished)] == \
        [("b1", {"a1": "RuntimeError: node n0 has no GPU manager"})]
    assert [(e.ok, e.reason) for e in events if isinstance(e, E.ModelLoaded)] == \
        [(False, "RuntimeError: node n0 has no GPU manager")]
    host.seat.gpu_note = "GPU manager unavailable (x)"
    assert host.info()["gpu_note"] == "GPU manager unavailable (x)"
    events.clear()
    host.submit(C.RunBatch("b2", "i1", "n0", "m", (act,)))
    await _settle()
    assert dict(events[-1].failed) == {"a1": "RuntimeError: GPU manager unavailable (x)"}  # type: ignore[attr-defined]

    events.clear()
    gpu = _Gpu()
    host = NodeHost("n1", emit=events.append, cpu_manager=_Cpu(),  # type: ignore[arg-type]
                    gpu_manager=gpu, models=(ModelSpec("m"),),  # type: ignore[arg-type]
                    capacity=Resources(cpu=2, memory_mb=1024))
    await host.start()
    assert gpu.started and host.spec is not None and host.spec.gpu_domains == ((0,),)
    gpu.on_worker_death("i9", "worker died")
    host.submit(C.LoadModel("i2", "other", "n1", (0,)))
    host.submit(C.UnloadModel("i3", "n1"))
    host.submit(C.RunBatch("b3", "i1", "n1", "m", (act,)))
    await _settle()
    unloaded = [(e.instance_id, e.parked, e.reason) for e in events if isinstance(e, E.ModelUnloaded)]
    assert unloaded == [("i9", False, "worker died"), ("i3", False, "")]
    loaded = [e for e in events if isinstance(e, E.ModelLoaded)]
    assert loaded[0].reason == "KeyError: \"model 'other' is not configured on node n1\""
    await host.aclose()  # the batch in flight ends, failed, even from a closed node
    assert [dict(e.failed) for e in events if isinstance(e, E.BatchFinished)] == \
        [{"a1": "node shut down"}]
    assert host.readiness() == {"ready": False, "not_ready_reason": "the node is closed"}
    host.emit(E.ModelUnloaded(0.0, "i4"))  # (a closed node tells nothing more but outcomes)
    assert not any(getattr(e, "instance_id", "") == "i4" for e in events)


async def test_a_missing_gpu_extra_is_a_note(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "arl_tangram.managers.gpu", None)
    host = NodeHost("n0", emit=lambda e: None, cpu_manager=_Cpu(),  # type: ignore[arg-type]
                    models=(ModelSpec("m"),), gpu_config=GpuManagerConfig())
    await host.start()
    assert host.gpu is None and host.seat.gpu_note == (
        "GPU manager unavailable (ModuleNotFoundError: import of arl_tangram.managers.gpu "
        "halted; None in sys.modules)")
    await host.aclose()


async def test_reporters_stop_when_the_manager_cannot_tell(caplog) -> None:
    seat = Seat("n0", lambda e: None)
    reports = Reporters(seat)

    def broken() -> Any:
        raise RuntimeError("no cgroup")

    seat.cpu_manager = SimpleNamespace(languages=lambda: ["python"], warm_state=broken,  # type: ignore[assignment]
                                       memory_use=broken)
    reports.memory_report_s = 0.0
    await asyncio.wait_for(reports.warm(), 1)
    caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.node.reports")
    await asyncio.wait_for(reports.memory(), 1)
    assert "node n0: memory use unreadable: no cgroup; not reported" in caplog.text


async def test_memory_windows_follow_the_sessions_and_a_failed_reclaim_is_logged(caplog) -> None:
    got: list[E.MemoryReport] = []
    seat = Seat("n0", lambda e: got.append(e) if isinstance(e, E.MemoryReport) else None)
    reports = Reporters(seat)
    reports.memory_report_s, reports.memory_window_s, reports.memory_mb = 0.0, 0.0, 1.0
    reads = iter([({"a": (1 << 20, 2 << 20), "b": (0, 0)}, 0), ({"a": (1 << 20, 1 << 20)}, 0),
                  ({"a": (1 << 20, 1 << 20)}, 0)])

    use = scripted_memory_use(seat, reads)

    async def reclaim(n: int) -> int:
        raise RuntimeError("frozen already")

    seat.cpu_manager = SimpleNamespace(memory_use=use, reclaim_idle=reclaim)  # type: ignore[assignment]
    caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.node.reports")
    await asyncio.wait_for(reports.memory(), 1)
    assert [(dict(r.current_mb), dict(r.peak_mb)) for r in got] == [
        ({"a": 1.0, "b": 0.0}, {"a": 2.0, "b": 0.0}), ({"a": 1.0}, {"a": 1.0}),
        ({"a": 1.0}, {"a": 1.0})]
    assert "node n0: reclaiming idle sessions' memory: frozen already" in caplog.text


class _Spool:
    def __init__(self) -> None:
        self.data = b""

    def write(self, chunk: bytes) -> None:
        self.data += chunk

    def discard(self) -> None:
        pass


class _Cache:
    """An image cache that holds what it is told to, and fails an import when asked."""

    root = "/nowhere"

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.layers: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.held

    def has_layer(self, key: str) -> bool:
        return key in self.layers

    def list_images(self) -> list:
        raise RuntimeError("index unreadable")

    def import_path(self, path: str, name: str) -> Any:
        if path.endswith("broken"):
            raise ImageError(f"{path}: not an image")
        self.held.add(name)
        return SimpleNamespace(name=name, to_dict=lambda: {"name": name})

    def new_spool(self) -> _Spool:
        return _Spool()

    def finish_layer(self, spool: _Spool, key: str, digest: str, where: str) -> None:
        self.layers.add(key)

    def add_pulled(self, rec: dict, source: str, pull_s: float) -> None:
        self.held.add(rec["name"])


class _Peer(ImagePeer):
    def __init__(self, name: str, layers: dict[str, list[str]], gate: asyncio.Event | None = None,
                 fail: bool = False) -> None:
        self.name, self.images, self.gate, self.fail = name, layers, gate, fail
        self.closed: list[str] = []
        self.sent: dict[str, int] = {}

    async def manifest(self, image: str) -> dict:
        if image not in self.images:
            raise ImageError(f"no image {image!r}")
        return {"name": image, "layers": self.images[image], "layer_sizes": [1] * len(self.images[image])}

    async def open_layer(self, key: str, chunk_bytes: int) -> str:
        self.sent[key] = 0
        return key

    async def next_chunk(self, stream: str) -> bytes:
        if self.fail:
            raise ImageError("cut")
        if self.gate is not None:
            await self.gate.wait()
        self.sent[stream] += 1
        return b"x" if self.sent[stream] == 1 else b""

    async def close_layer(self, stream: str) -> dict:
        self.closed.append(stream)
        return {"digest": stream, "bytes": 1}


async def test_a_node_without_a_cache_has_no_images() -> None:
    images = NodeImages("n0", lambda: None, lambda e: None, [("x", "/p")], ["x"])
    with pytest.raises(ImagesUnsupported, match="node n0: no CPU manager with an image cache"):
        images.store()
    assert images.info() == {}
    with pytest.raises(ValueError, match=r"^node n0: images: x \(/p\): node n0: no CPU manager"):
        await images.start()
    images.eager = ()
    await images.start()  # (nothing held to report)
    images.eager = ("y",)
    with pytest.raises(ValueError, match=r"^node n0: images: y: no path given$"):
        await images.start()


async def test_a_fetch_with_neither_peer_nor_source_is_refused_by_name() -> None:
    # (`ensure` does not fetch such a name; a peer list emptied meanwhile reaches this guard)
    images = NodeImages("n0", lambda: _Cache(), lambda e: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ImageError, match=r"^node n0: no source of image 'gone'$"):
        await images._fetch("gone")


async def test_a_fetch_falls_back_to_the_source_path_or_fails(tmp_path, caplog) -> None:
    cache = _Cache()
    images = NodeImages("n0", lambda: cache, lambda e: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ImageError, match="rel: not a readable absolute path on this node"):
        images.add_source("one", "rel")
    assert images.info()["images"] == []  # (the listing failed: none shown)
    broken = _Peer("p", {}, fail=True)
    images.set_peers("one", [broken])
    with pytest.raises(ImageError, match="could not be pulled: from node p: no image 'one'"):
        await images.ensure("one")
    src = tmp_path / "one"
    src.write_text("")
    images.sources["one"] = str(src)
    caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.images.cache")
    got = await images.ensure("one")
    assert got and got.pull is None and cache.has("one")
    assert f"importing it from {src} instead" in caplog.text


async def test_pulls_share_a_layer_close_a_cut_stream_and_keep_the_last_32() -> None:
    cache = _Cache()
    pulls = Puller("n0", lambda: cache, lambda e: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ImageError, match="no node is known to hold image 'one'"):
        await pulls.pull("one")
    for i in range(32):
        pulls.transfers[f"old{i}"] = {}
    gate = asyncio.Event()
    peer = _Peer("p", {"one": ["k1"], "two": ["k1"]}, gate)
    pulls.set("one", [peer])
    pulls.set("two", [peer])
    one = asyncio.ensure_future(pulls.pull("one"))
    two = asyncio.ensure_future(pulls.pull("two"))
    await _settle()
    gate.set()
    a, b = await one, await two
    assert (a["layers_sent"], a["layers_had"], b["layers_sent"], b["layers_had"]) == (1, 0, 0, 1)
    assert len(pulls.transfers) == 32 and "old0" not in pulls.transfers and "old1" not in pulls.transfers
    cut = _Peer("q", {"three": ["k3"]}, fail=True)
    pulls.set("three", [cut])
    with pytest.raises(ImageError, match="from node q: cut"):
        await pulls.pull("three")
    assert cut.closed == ["k3"]  # the stream was closed on the way out


async def test_the_sending_side_closes_what_it_can() -> None:
    server = LayerServer("n0", lambda: _Cache())  # type: ignore[arg-type, return-value]
    with pytest.raises(ImageError, match="node n0: no layer stream 'nope' \\(closed or idle\\)"):
        await server.close("nope")

    def fail() -> None:
        raise OSError("gone")

    server.streams["s"] = [SimpleNamespace(close=fail), 0.0]
    await server.close_all()
    assert server.streams == {}


def test_capacity_without_affinity_and_a_report_made_json(monkeypatch) -> None:
    import os
    from dataclasses import dataclass

    from arl_tangram.runtime.node import machine_capacity

    def no_affinity(pid: int) -> set[int]:
        raise OSError("not here")

    monkeypatch.setattr(os, "sched_getaffinity", no_affinity)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert machine_capacity().get("cpu") == 3

    @dataclass
    class Cg:
        version: str

    class Layer:
        def to_dict(self) -> dict:
            return {"mb": 64}

    cpu = _Cpu()
    cpu.isolation_report = lambda: {"cgroups": Cg("v2"), "layer": Layer(),  # type: ignore[attr-defined]
                                    "seccomp": object.__new__(_Spool), "ns": ("pid", 1)}
    host = NodeHost("n0", emit=lambda e: None, cpu_manager=cpu)  # type: ignore[arg-type]
    iso = host.info()["isolation"]
    assert iso["cgroups"] == {"version": "v2"} and iso["layer"] == {"mb": 64}
    assert iso["seccomp"].startswith("<test_node_paths._Spool object") and iso["ns"] == ["pid", 1]
