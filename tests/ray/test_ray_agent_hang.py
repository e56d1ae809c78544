"""A NodeAgent that hangs (issue 25 item 1, Ray node agents): its process is stopped (SIGSTOP),
which Ray does not notice -- the raylet still sees a live worker, so no actor death and no node
death come. The executor notices the silence itself: the node shows not ready with the reason
(`/v1/health` 503) from ``2 x poll_wait_s + 1`` s, is lost after ``agent_timeout_s`` (NodeLost:
the core requeues its idempotent actions), a new agent incarnation joins on the same Ray node,
the actions re-run there or elsewhere and succeed, and `/v1/health` is 200 again with the old
node listed as lost. Engine + Core + RayExecutor with the in-package EchoHost."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest
from _ray_helpers import wait_until

from arl_tangram.api.app import _health
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.core import Core, CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.ray_agent import EchoHost
from arl_tangram.runtime.ray_executor import RayExecutor, RayExecutorConfig

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _core_factory(cfg: EngineConfig, nodes):  # type: ignore[no-untyped-def]
    return Core(ClusterSpec(tuple(nodes), tuple(cfg.models)), CoreConfig(policy=cfg.policy))


def _act(aid: str, sleep_s: float) -> ActionSpec:
    return ActionSpec(aid, demand=Resources(cpu=1), payload={"sleep_s": sleep_s})


def _health_body(eng: Engine) -> tuple[int, dict]:
    r = _health(eng)
    return r.status_code, json.loads(bytes(r.body))


async def test_a_stopped_agent_is_not_ready_then_lost_replaced_and_its_actions_rerun(ray_cluster):
    ex = RayExecutor(RayExecutorConfig(membership_interval_s=0.2, poll_wait_s=0.5,
                                       agent_timeout_s=4.0), host_factory=EchoHost)
    eng = Engine(ex, EngineConfig(tick_s=0.2), core_factory=_core_factory)
    await eng.start()
    pid = None
    try:
        # where each agent runs (EchoHost answers with its node and process id)
        probe = await eng.submit([_act(f"p{i}", 0.0) for i in range(12)])
        pids = {}
        for aid in probe:
            r = await eng.result(aid, wait=30)
            assert r is not None and r.status is Status.SUCCEEDED, r
            pids[r.output["node"]] = r.output["pid"]
        await wait_until(lambda: _health_body(eng)[0] == 200, 30, "ready")
        cap = sum(int(n["capacity"].get("cpu", 0)) for n in eng.cluster_view().to_dict()["nodes"])
        # fill every CPU with 6 s actions; the victim is a node that runs some of them
        ids = await eng.submit([_act(f"a{i}", 6.0) for i in range(cap)])
        await wait_until(lambda: sum(n["running"] for n in eng.cluster_view().to_dict()["nodes"]) == cap, 30,
                         "every CPU busy")
        victim = next(n["name"] for n in eng.cluster_view().to_dict()["nodes"]
                      if n["running"] and n["name"] in pids)
        pid = pids[victim]
        os.kill(pid, signal.SIGSTOP)

        def victim_entry() -> dict:
            return _health_body(eng)[1]["nodes"].get(victim, {})

        await wait_until(lambda: "has not answered" in str(victim_entry().get("reason")), 10,
                         "the silent agent shown not ready")
        code, body = _health_body(eng)
        assert code == 503 and "has not answered" in body["reason"], body
        await wait_until(lambda: victim_entry().get("lost") is True, 20, "the silent agent lost")
        await wait_until(lambda: f"{victim}~1" in ex.nodes_up(), 60, "a new incarnation")
        res = {i: await eng.result(i, wait=60) for i in ids}
        assert all(r is not None and r.status is Status.SUCCEEDED for r in res.values()), res
        rerun = [r for r in res.values() if r.attempts >= 2]
        assert rerun and all(r.node != victim for r in rerun), rerun
        await wait_until(lambda: _health_body(eng)[0] == 200, 30, "ready again")
        code, body = _health_body(eng)
        assert body["nodes"][victim] == {"ready": False, "lost": True,
                                         "reason": "the node is lost"}, body
        assert body["nodes"][f"{victim}~1"] == {"ready": True}, body
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await eng.aclose()
