"""A tenant's max_concurrent_actions counts every action it starts, by every route (issue 43).

alice may have 3 unfinished actions: one by a single POST /v1/actions, one by a batch of it,
one by /run_code (queued behind bob's action, which fills the node) make 3; a fourth by any
route is refused with 429 naming the exact counts; each delivery gives its place back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.core import commands as C
from arl_tangram.runtime.config import ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

A, B = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
HA, HB = {"authorization": f"Bearer {A}"}, {"authorization": f"Bearer {B}"}
SLOW = {"kind": "custom", "payload": {"sleep": 60}, "demand": {"cpu": 1}}
FULL = "3 actions unfinished, 1 more would pass its max_concurrent_actions=3"


class _Stoppable(FakeExecutor):
    """The fake node, which also stops an action it is told to cancel (its cores come back)."""

    def __init__(self, cpu: float) -> None:
        super().__init__(cpu=cpu)
        self.by_id: dict[str, asyncio.Task[None]] = {}

    async def submit(self, commands: Sequence[C.Command]) -> None:
        for c in commands:
            if isinstance(c, C.StartAction):
                t = asyncio.get_running_loop().create_task(self._run(c))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
                self.by_id[c.action.id] = t
            elif isinstance(c, C.CancelAction) and c.action_id in self.by_id:
                self.by_id.pop(c.action_id).cancel()


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token=A, max_concurrent_actions=3),
                                 TenantConfig(name="bob", token=B)))
    eng = Engine(_Stoppable(cpu=2), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        c.engine = eng  # type: ignore[attr-defined]
        yield c
    await eng.aclose()


async def _live(eng: Engine, n: int) -> None:
    for _ in range(2000):
        if eng.live_count() == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{eng.live_count()} unfinished, expected {n}")


async def _refused(c: httpx.AsyncClient, detail: str) -> None:
    for r in (await c.post("/v1/actions", headers=HA, json=SLOW),
              await c.post("/v1/actions", headers=HA, json={"actions": [SLOW]}),
              await c.post("/run_code", headers=HA, json={"code": "print(1)"})):
        assert r.status_code == 429, r.text
        assert r.json()["detail"] == (f"tenant 'alice': {detail}; retry when some of its "
                                      "actions have finished")


async def test_every_route_counts_an_action_started(api: httpx.AsyncClient) -> None:
    eng: Engine = api.engine  # type: ignore[attr-defined]
    r = await api.post("/v1/actions", headers=HB, json={**SLOW, "demand": {"cpu": 2}})
    assert r.status_code == 200, r.text  # bob fills the node (he has no cap)
    bob = r.json()["ids"][0]
    r = await api.post("/v1/actions", headers=HA, json=SLOW)  # 1: a single action
    assert r.status_code == 200, r.text
    held = r.json()["ids"]
    r = await api.post("/v1/actions", headers=HA, json={"actions": [SLOW]})  # 2: a batch
    assert r.status_code == 200, r.text
    held += r.json()["ids"]
    await _live(eng, 3)
    code = asyncio.create_task(api.post("/run_code", headers=HA, json={"code": "print(1)"}))
    await _live(eng, 4)  # 3: /run_code, queued behind bob's
    await _refused(api, FULL)
    r = await api.post("/v1/actions", headers=HB, json=SLOW)  # bob is not capped by alice's
    assert r.status_code == 200, r.text
    bob2 = r.json()["ids"][0]
    # bob's and alice's first two end: her /run_code runs (the fake node answers it at once)
    for aid in (bob, bob2):
        assert (await api.delete(f"/v1/actions/{aid}", headers=HB)).status_code == 200
    for aid in held:
        assert (await api.delete(f"/v1/actions/{aid}", headers=HA)).status_code == 200
    r = await code
    assert r.status_code == 200, r.text  # (the fake node has no RunResult to give)
    await _live(eng, 0)
    r = await api.post("/v1/actions", headers=HA, json={"actions": [SLOW, SLOW]})
    assert r.status_code == 200, r.text
    held = r.json()["ids"]
    r = await api.post("/v1/actions", headers=HA, json={"actions": [SLOW, SLOW]})
    assert r.status_code == 429, r.text
    assert r.json()["detail"].startswith(
        "tenant 'alice': 2 actions unfinished, 2 more would pass its max_concurrent_actions=3")
    r = await api.post("/v1/actions", headers=HA, json=SLOW)
    assert r.status_code == 200, r.text
    held += r.json()["ids"]
    await _refused(api, FULL)
    for aid in held:
        assert (await api.delete(f"/v1/actions/{aid}", headers=HA)).status_code == 200
        r = await api.get(f"/v1/actions/{aid}", headers=HA, params={"wait": 10})
        assert r.json()["status"] == "cancelled", r.text
    r = await api.post("/v1/actions", headers=HA, json={"actions": [SLOW, SLOW, SLOW]})
    assert r.status_code == 200, r.text  # every place given back
    for aid in r.json()["ids"]:
        assert (await api.delete(f"/v1/actions/{aid}", headers=HA)).status_code == 200
