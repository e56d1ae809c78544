"""``GET /v1/cluster`` and ``GET /v1/stats`` from typed views (`runtime.views.ClusterView`,
`StatsView`: issue 36, item 3), their whole bodies pinned, key order too, so a renamed, added or
dropped field fails: an engine on a fake node after one action, with a model marked down (its
worker died: the node not ready, the reason named); /v1/health and /metrics read the same views."""

from __future__ import annotations

import re

import httpx
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.core.view import InstanceView
from arl_tangram.runtime.config import ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig


async def test_cluster_and_stats_bodies_whole() -> None:
    eng = Engine(FakeExecutor(cpu=2, memory_mb=4096), EngineConfig(tick_s=0.05),
                 core_factory=core_factory)
    await eng.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(
                eng, ServiceConfig())), base_url="http://t") as c:
            r = await c.post("/v1/actions", json={"kind": "custom", "payload": {"sleep": 0},
                                                  "demand": {"cpu": 1, "memory_mb": 10},
                                                  "wait": True})
            assert r.json()["results"][0]["status"] == "succeeded", r.text
            body = (await c.get("/v1/cluster")).json()
            assert list(body) == ["nodes", "policy", "models", "instances", "models_down",
                                  "sessions"]
            (node,) = body["nodes"]
            assert node == {"name": "fake", "pool": node["pool"], "alive": True,
                            "capacity": {"cpu": 2.0, "memory_mb": 4096.0},
                            "used": node["used"], "free": node["free"],
                            "utilization": node["utilization"], "running": 0,
                            "warm": node["warm"], "gpu_domains": [],
                            "warm_pools": {"python": 1}, "languages": ["python"]}
            assert list(node)[:10] == ["name", "pool", "alive", "capacity", "used", "free",
                                       "utilization", "running", "warm", "gpu_domains"]
            assert set(node["utilization"]) <= {"cpu", "memory_mb"}
            assert body == {"nodes": [node], "policy": "tangram", "models": [], "instances": [],
                            "models_down": {}, "sessions": 0}
            assert (await c.get("/v1/health")).json() == {"ready": True,
                                                       "nodes": {"fake": {"ready": True}}}
            # a model's worker died on the node: it is not ready, and says why
            eng._model_died(InstanceView("i1", "rm", "fake", (), "ready", 0),
                            "worker killed", eng.clock.now())
            body = (await c.get("/v1/cluster")).json()
            down = body["models_down"]["rm"]
            assert down == {"node": "fake", "reason": "worker killed", "down_s": down["down_s"]}
            why = f"model rm has no instance up: worker killed ({down['down_s']} s ago; reloading)"
            assert body["nodes"][0] == {**node, "ready": False, "not_ready_reason": why}
            assert list(body["nodes"][0])[-2:] == ["ready", "not_ready_reason"]
            h = await c.get("/v1/health")
            assert h.status_code == 503
            hw = h.json()["nodes"]["fake"]["reason"]  # (asked later: its own down_s)
            assert re.fullmatch(r"model rm has no instance up: worker killed \([0-9.]+ s ago; "
                                r"reloading\)", hw), hw
            assert h.json() == {"ready": False, "nodes": {"fake": {"ready": False, "reason": hw}},
                                "reason": f"fake: {hw}"}
            metrics = (await c.get("/metrics")).text  # (read from the same views)
            for line in ('tangram_node_ready{node="fake"} 0.0',
                         'tangram_capacity{node="fake",resource="cpu"} 2.0',
                         'tangram_capacity{node="fake",resource="memory_mb"} 4096.0',
                         'tangram_warm_executors{key="python",node="fake"} 1.0',
                         'tangram_resident_models{node="fake"} 0.0',
                         'tangram_fork_server_deaths_total{node="fake"} 0.0',
                         'tangram_actions_submitted_total{kind="custom"} 1.0',
                         'tangram_actions_finished_total{kind="custom",status="succeeded"} 1.0',
                         'tangram_queue_length{kind="custom"} 0.0',
                         'tangram_running_actions{kind="custom"} 0.0',
                         'tangram_resizes_total{outcome="applied"} 0.0',
                         'tangram_shed_total 0.0', 'tangram_session_evictions_total 0.0'):
                assert line in metrics.splitlines(), line
            st = (await c.get("/v1/stats")).json()
            assert st == {
                "policy": "tangram", "uptime_s": st["uptime_s"], "act": st["act"],
                "queued": {}, "running": {}, "queue_length": 0, "running_total": 0,
                "submitted": {"custom": 1}, "finished": {"custom": {"succeeded": 1}},
                "warm_hits": st["warm_hits"], "warm_misses": st["warm_misses"],
                "model_loads": 0, "model_swaps": 0, "model_load_failures": 0, "shed": 0,
                "session_evictions": 0, "results_kept": 1, "sessions": 0,
                "resizes": {"applied": 0, "deferred": 0, "dropped": 0},
                "estimator": st["estimator"]}
            assert list(st) == ["policy", "uptime_s", "act", "queued", "running",
                                "queue_length", "running_total", "submitted", "finished",
                                "warm_hits", "warm_misses", "model_loads", "model_swaps",
                                "model_load_failures", "shed", "session_evictions",
                                "results_kept", "sessions", "resizes", "estimator"]
            assert st["warm_hits"] + st["warm_misses"] == 1 and list(st["act"]) == ["custom"]
            view = eng.stats_view()
            assert (view.queue_length, view.running_total, view.submitted) == (0, 0,
                                                                              {"custom": 1})
            assert eng.cluster_view().dims() == {"cpu", "memory_mb"}
    finally:
        await eng.aclose()


async def test_a_sessions_demand_is_checked_against_the_cluster_view() -> None:
    """The session route reads the nodes' capacities from the view: a resource no node has, and
    a demand no node could ever hold (the largest capacities named), are 400s."""
    eng = Engine(FakeExecutor(cpu=2, memory_mb=4096), EngineConfig(tick_s=0.05),
                 core_factory=core_factory)
    await eng.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(
                eng, ServiceConfig())), base_url="http://t") as c:
            r = await c.post("/v1/sessions", json={"demand": {"cpu": 1, "unicorns": 1}})
            assert r.status_code == 400 and r.json()["field"] == "demand.unicorns", r.text
            assert r.json()["detail"] == ("demand.unicorns: unknown resource 'unicorns' (this "
                                          "cluster's resources: cpu, memory_mb)")
            r = await c.post("/v1/sessions", json={"demand": {"cpu": 64, "memory_mb": 10}})
            assert r.status_code == 400 and r.json()["field"] == "demand", r.text
            assert r.json()["detail"] == (
                "demand: no node can ever satisfy demand {'cpu': 64.0, 'memory_mb': 10.0} "
                "(largest capacity: fake: {'cpu': 2.0, 'memory_mb': 4096.0})")
    finally:
        await eng.aclose()
