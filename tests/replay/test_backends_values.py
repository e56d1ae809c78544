"""replay/backends.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
base backend's defaults; the embedded backend's node configs (a GPU manager only where a node
has GPUs and the cluster models, with each device's share of the GPU memory), its CPU capacity,
tick, images and core (the label's policy, trajectories and shares, the core's overrides), its
calls carried to the engine and a result's ACT, the sandboxes' CPU time summed from cgroup v1
and v2 files (None where a node has no cgroups or a file cannot be read); the HTTP backend's
requests word for word (a session's body, an action's body with only the fields it has, the
timeout capped at an hour), the service's policy and CPU capacity, and a reply's ACT."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.actions import (
    ActionKind,
    ActionResult,
    ActionSpec,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay.backends import Backend, EmbeddedBackend, HttpBackend


def _cluster(models=()) -> ClusterSpec:
    return ClusterSpec(
        (
            NodeSpec("c0", Resources(cpu=2, memory_mb=4096), pool="cpu", labels={"z": "a"}),
            NodeSpec("g0", Resources(cpu=6, gpu=2, gpu_memory_mb=32000), pool="gpu"),
            NodeSpec("g1", Resources(cpu=1, gpu=1), pool="gpu"),
        ),
        tuple(models),
    )


async def test_the_base_backend_s_defaults() -> None:
    b = Backend()
    assert b.cpu_capacity == 0.0 and b.cpu_ns() is None and b.stats() == {}
    with pytest.raises(NotImplementedError):
        await b.open_session("s", None, 1.0)
    with pytest.raises(NotImplementedError):
        await b.run(ActionSpec("a"))
    assert await b.close_session("s") is None and await b.aclose() is None


def test_embedded_nodes_get_a_gpu_manager_only_with_models() -> None:
    cluster = _cluster([ModelSpec("rm")])
    b = EmbeddedBackend(
        cluster,
        "static-pool:2",
        3,
        {"t": 0.5},
        cpu_config={"warm_min": 1},
        tick_s=0.25,
        images={"py": "/img/py"},
        core_kw={"session_ttl_s": 7.0},
    )
    cfgs = {n.name: n for n in b.executor._node_cfgs}
    assert list(cfgs) == ["c0", "g0", "g1"]
    c0, g0, g1 = cfgs["c0"], cfgs["g0"], cfgs["g1"]
    assert (c0.pool, c0.capacity, dict(c0.labels), c0.gpu) == (
        "cpu",
        Resources(cpu=2, memory_mb=4096),
        {"z": "a"},
        None,
    )
    assert c0.cpu.warm_min == 1 and g0.cpu.warm_min == 1
    assert (g0.gpu.device, g0.gpu.cpu_devices, g0.gpu.cpu_device_memory_mb) == ("auto", 2, 16000.0)
    assert (g1.gpu.device, g1.gpu.cpu_devices, g1.gpu.cpu_device_memory_mb) == ("auto", 1, 4096.0)
    assert g0.pool == "gpu" and dict(g0.labels) == {}
    assert b.cpu_capacity == 9.0 and b.tick_s == 0.25 and b.cluster is cluster
    assert b.executor._images == (("py", "/img/py"),)
    assert b.engine.config.policy == "static-pool" and b.engine.config.tick_s == 0.25
    assert b.engine.config.models == (ModelSpec("rm"),)
    core = b.engine._core_factory(b.engine.config, _cluster().nodes[:1])
    assert core.st.config.policy == "static-pool" and core.st.config.trajectories == 3
    assert dict(core.st.config.task_shares) == {"t": 0.5} and core.st.config.session_ttl_s == 7.0
    assert [n.name for n in core.st.cluster.nodes] == ["c0"] and core.st.cluster.models == (
        ModelSpec("rm"),
    )


def test_embedded_defaults_without_models() -> None:
    b = EmbeddedBackend(_cluster(), "tangram", 0, None)
    assert [n.gpu for n in b.executor._node_cfgs] == [None, None, None]
    assert b.tick_s == 0.5 and b.engine.config.tick_s == 0.5 and b.executor._images == ()
    assert b.cluster.nodes == _cluster().nodes and b.cpu_capacity == 9.0
    core = b.engine._core_factory(b.engine.config, _cluster().nodes)
    assert core.st.config.trajectories == 1 and core.st.config.task_shares is None
    assert core.st.config.policy == "tangram"
    assert b.executor._node_cfgs[0].cpu.warm_min == type(b.executor._node_cfgs[0].cpu)().warm_min


class _Engine:
    def __init__(self, result: ActionResult) -> None:
        self.result, self.calls = result, []

    async def start(self) -> None:
        self.calls.append("start")

    async def open_session(self, sid, **kw) -> str:
        self.calls.append(("open", sid, kw))
        return "n0"

    async def close_session(self, sid) -> None:
        self.calls.append(("close", sid))

    async def run(self, spec) -> ActionResult:
        self.calls.append(("run", spec.id))
        return self.result

    def stats(self) -> dict[str, Any]:
        return {"x": 1}

    async def aclose(self) -> None:
        self.calls.append("aclose")


async def test_embedded_calls_go_to_the_engine() -> None:
    b = EmbeddedBackend(_cluster(), "tangram", 1, None)
    e = b.engine = _Engine(ActionResult("a", Status.SUCCEEDED, 2.0, 2.5, 5.25, output={"ok": 1}))
    await b.start()
    assert await b.open_session("s", Resources(cpu=1), 30.0, image="py") == "n0"
    await b.close_session("s")
    assert await b.run(ActionSpec("a")) == ("succeeded", 3.25, {"ok": 1})
    assert b.stats() == {"x": 1}
    await b.aclose()
    assert e.calls == [
        "start",
        ("open", "s", {"demand": Resources(cpu=1), "ttl_s": 30.0, "image": "py"}),
        ("close", "s"),
        ("run", "a"),
        "aclose",
    ]
    e.result = ActionResult("a", Status.REJECTED, 2.0)
    assert await b.run(ActionSpec("a")) == ("rejected", None, None)


def _host(version: str | None, bases: dict[str, str] | None = None) -> Any:
    tree = None if version == "none" else SimpleNamespace(version=version, bases=bases or {})
    return SimpleNamespace(
        cpu=SimpleNamespace(_cgroups=tree) if tree is not None else SimpleNamespace()
    )


def test_cpu_ns_sums_the_cgroups_of_every_node(tmp_path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1/cpuacct.usage").write_text("1500\n")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2/cpu.stat").write_text(
        "nr_periods 9\nusage_usec 7\nuser_usec 5\nusage_usec_x 100\n"
    )
    b = EmbeddedBackend(_cluster(), "tangram", 1, None)
    b.executor.hosts = {
        "a": _host("v1", {"cpuacct": str(tmp_path / "v1")}),
        "b": _host("v2", {"cpu": str(tmp_path / "v2")}),
    }
    assert b.cpu_ns() == 1500 + 7000 + 100_000
    (tmp_path / "v2/cpu.stat").write_text("usage_usec 7\n")
    assert b.cpu_ns() == 8500
    b.executor.hosts = {}
    assert b.cpu_ns() == 0
    for broken in (
        _host("none"),
        _host(None),
        _host("v2", {"cpu": str(tmp_path / "gone")}),
        _host("v1", {"cpuacct": str(tmp_path / "gone")}),
    ):
        b.executor.hosts = {"a": _host("v1", {"cpuacct": str(tmp_path / "v1")}), "b": broken}
        assert b.cpu_ns() is None


class _Client:
    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply, self.calls = reply, []

    async def import_image(self, path, name) -> None:
        self.calls.append(("import", path, name))

    async def cluster(self) -> dict[str, Any]:
        return {
            "policy": "fifo",
            "nodes": [
                {"capacity": {"cpu": 2.5}},
                {"capacity": {"gpu": 1}},
                {"capacity": {"cpu": 4}},
            ],
        }

    async def _request(self, method, path, json=None) -> dict[str, Any]:
        self.calls.append((method, path, json))
        return {"session_id": 5}

    async def run(self, body) -> dict[str, Any]:
        self.calls.append(("run", body))
        return self.reply

    async def aclose(self) -> None:
        self.calls.append("aclose")


async def test_http_start_imports_images_and_reads_the_cluster() -> None:
    b = HttpBackend("http://x:1", images={"py": "/img/py", "go": "/img/go"})
    c = b.client = _Client({})
    await b.start()
    assert c.calls == [("import", "/img/py", "py"), ("import", "/img/go", "go")]
    assert b.policy == "fifo" and b.cpu_capacity == 6.5 and b.stats() == {}

    class _Bare(_Client):
        async def cluster(self) -> dict[str, Any]:
            return {}

    b.client = _Bare({})
    await b.start()
    assert b.policy == "?" and b.cpu_capacity == 0


async def test_http_sessions() -> None:
    b = HttpBackend("http://x:1")
    assert b.images == {}
    c = b.client = _Client({})
    assert await b.open_session("s", None, 30.0) == "5"
    assert await b.open_session("t", Resources(cpu=1, memory_mb=64), 9.0, image="py") == "5"
    await b.close_session("s")
    await b.aclose()
    assert c.calls == [
        ("POST", "/v1/sessions", {"session_id": "s", "ttl_s": 30.0}),
        (
            "POST",
            "/v1/sessions",
            {
                "session_id": "t",
                "ttl_s": 9.0,
                "demand": {"cpu": 1.0, "memory_mb": 64.0},
                "image": "py",
            },
        ),
        ("DELETE", "/v1/sessions/s", None),
        "aclose",
    ]


async def test_http_run_sends_the_fields_an_action_has() -> None:
    b = HttpBackend("http://x:1", token="tok")
    c = b.client = _Client(
        {"status": "succeeded", "submit_time": 1.5, "finish_time": 4.0, "output": [1]}
    )
    assert await b.run(ActionSpec("a", payload={"code": "1"})) == ("succeeded", 2.5, [1])
    spec = ActionSpec(
        "b",
        kind=ActionKind.TEST,
        demand=Resources(cpu=1),
        task="t",
        trajectory="tr",
        timeout_s=99999.0,
        weight=2.0,
        session="s",
        tag="g",
        elasticity=Elasticity(1, 4, speedup=Speedup(0.75)),
        hints=WorkHints(expected_s=3.0, test_count=0, tokens=None, items=2),
    )
    c.reply = {"status": "failed", "submit_time": 1.5}
    assert await b.run(spec) == ("failed", None, None)
    c.reply = {"finish_time": 1.5}
    assert await b.run(ActionSpec("c", timeout_s=3600.0)) == ("None", None, None)
    (_, plain), (_, full), (_, capped) = c.calls
    d = ActionSpec("a")
    assert plain == {
        "id": "a",
        "kind": d.kind.value,
        "payload": {"code": "1"},
        "demand": d.demand.as_dict(),
        "task": d.task,
        "trajectory": d.trajectory,
        "timeout_s": min(d.timeout_s, 3600.0),
        "weight": d.weight,
    }
    assert full == {
        "id": "b",
        "kind": "test",
        "payload": {},
        "demand": {"cpu": 1.0},
        "task": "t",
        "trajectory": "tr",
        "timeout_s": 3600.0,
        "weight": 2.0,
        "elasticity": {"min": 1, "max": 4, "dim": "cpu", "parallel_fraction": 0.75},
        "hints": {"expected_s": 3.0, "test_count": 0, "items": 2},
        "session": "s",
        "tag": "g",
    }
    assert capped["timeout_s"] == 3600.0 and "hints" not in capped and "model" not in capped
    r = await _model_run()
    assert r["model"] == "rm" and "session" not in r and "tag" not in r


async def _model_run() -> dict[str, Any]:
    b = HttpBackend("http://x:1")
    c = b.client = _Client({})
    await b.run(ActionSpec("r", kind=ActionKind.REWARD, model="rm"))
    return c.calls[0][1]


async def test_http_client_has_the_url_and_the_token() -> None:
    from arl_tangram.client import AsyncClient

    b = HttpBackend("http://x:1", token="tok")
    assert isinstance(b.client, AsyncClient)
    assert str(b.client._http.base_url) == "http://x:1"
    assert b.client._http.headers.get("authorization") == "Bearer tok"
    await b.aclose()
    b = HttpBackend("http://y:2")
    assert (
        str(b.client._http.base_url) == "http://y:2"
        and "authorization" not in b.client._http.headers
    )
    await b.aclose()


def test_embedded_executor_serves_the_models_and_the_engine_drives_it() -> None:
    b = EmbeddedBackend(_cluster([ModelSpec("rm")]), "tangram", 1, None)
    assert b.executor._models == (ModelSpec("rm"),)
    assert b.engine._executor is b.executor


def test_cpu_ns_adds_every_v1_node(tmp_path) -> None:
    (tmp_path / "cpuacct.usage").write_text("1500\n")
    b = EmbeddedBackend(_cluster(), "tangram", 1, None)
    b.executor.hosts = {n: _host("v1", {"cpuacct": str(tmp_path)}) for n in ("a", "b")}
    assert b.cpu_ns() == 3000
