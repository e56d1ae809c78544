"""Issue 41 item 3 on a real node: with shares 0.5/0.5, carol's CPU loops hold both cores
(lent: alice has nothing); alice's ``print(1)`` starts at once on CPU taken back from them --
their sandboxes' CPU quotas (read back from the kernel's cgroup files) lowered to half a core
while it runs, and whole again after -- and ends while carol's loops still run. Real engine,
real core, real sandboxes."""

from __future__ import annotations

import asyncio

import pytest

from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host.pool import Sandbox
from arl_tangram.runtime.config import NodeConfig
from arl_tangram.runtime.engine import Engine, EngineConfig
from arl_tangram.runtime.local import LocalExecutor

pytestmark = pytest.mark.needs_root

# 30 s of CPU: longer than the test needs, so alice can only finish first by taking back
_LOOP = ("import time\nt = time.process_time()\n"
         "while time.process_time() - t < 30.0:\n    pass\n")


def _quota(sb: Sandbox) -> float:
    """The sandbox's CPU quota in cores, as the kernel holds it."""
    assert sb.slot is not None
    cpu = sb.slot.dirs["cpu"]
    if sb.slot.version == "v1":
        with open(f"{cpu}/cpu.cfs_quota_us") as f, open(f"{cpu}/cpu.cfs_period_us") as g:
            return int(f.read()) / int(g.read())
    with open(f"{cpu}/cpu.max") as f:
        quota, period = f.read().split()
    return int(quota) / int(period)


def _spec(aid: str, tenant: str, code: str) -> ActionSpec:
    return ActionSpec(aid, demand=Resources(cpu=1, memory_mb=256), tenant=tenant, tag=tenant,
                      timeout_s=120, payload={"code": code, "language": "python", "run_timeout": 100})


async def test_an_owed_tenant_takes_its_share_back_from_running_sandboxes(tmp_path) -> None:
    node = NodeConfig(name="n1", capacity=Resources(cpu=2, memory_mb=4096),
                      cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1), gpu=None)
    ex = LocalExecutor([node])
    core = CoreConfig(tenant_shares={"alice": 0.5, "carol": 0.5})
    eng = Engine(ex, EngineConfig(core=core, tick_s=0.05))
    await eng.start()
    try:
        await eng.submit([_spec(f"c{i}", "carol", _LOOP) for i in range(3)])
        mgr = ex.hosts["n1"].cpu
        for _ in range(600):  # both running in their sandboxes, at one core each
            if all(a in mgr._running and mgr._running[a].slot is not None for a in ("c0", "c1")):
                break
            await asyncio.sleep(0.05)
        loops = [mgr._running["c0"], mgr._running["c1"]]
        assert [_quota(sb) for sb in loops] == [1.0, 1.0]

        # alice's print(1) waits in the engine only as long as the squeeze takes
        await eng.submit([_spec("a0", "alice", "import time\ntime.sleep(0.5)\nprint(1)\n")])
        for _ in range(3000):  # (up to 30 s on a loaded machine)
            if "a0" in mgr._running:
                break
            await asyncio.sleep(0.01)
        assert "a0" in mgr._running  # started while carol's loops run (nothing freed a core)
        assert [_quota(sb) for sb in loops] == [0.5, 0.5]  # what the kernel holds now
        res = await eng.result("a0", wait=60)
        assert res is not None and res.status is Status.SUCCEEDED
        assert res.output["run_result"]["stdout"] == "1\n"
        # carol's loops still run (30 s of CPU each); alice's end gave their cores back
        assert eng.status("c0") is Status.RUNNING and eng.status("c1") is Status.RUNNING
        for _ in range(2000):
            if [_quota(sb) for sb in loops] == [1.0, 1.0]:
                break
            await asyncio.sleep(0.01)
        assert [_quota(sb) for sb in loops] == [1.0, 1.0]
        # two lowered, two raised: each applied to a live sandbox, none lost
        assert ex.hosts["n1"].actions.resizes == {"applied": 4, "deferred": 0, "dropped": 0}
        for aid in ("c0", "c1", "c2"):
            await eng.cancel(aid)
    finally:
        await eng.aclose()
