"""Issue 41, review M3 end to end: a tenant's ``layer_reserve_mb`` reaches each node's CPU
manager, an image session opened over HTTP counts its writable layer against its own tenant,
and so one tenant filling the node's layer budget cannot refuse another below its
reservation; the one past its share is refused with the node's reason when it asks (POST
/v1/sessions answers once the node opened the session, or could not). Real service (ASGI),
real engine and node, real disk layers."""

from __future__ import annotations

import asyncio
import os
import tempfile

import httpx
import pytest

from arl_tangram.api.app import create_app
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.runtime.build import engine_config
from arl_tangram.runtime.config import NodeConfig, ServiceConfig, TenantConfig, load_service_config
from arl_tangram.runtime.engine import Engine
from arl_tangram.runtime.local import LocalExecutor

pytestmark = pytest.mark.needs_root

A = "alice-token-0123456789abcdef"
B = "bob-token-0123456789abcdef"


def test_reservations_reach_every_nodes_cpu_manager(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"tenants:\n  - {{name: alice, token: {A}, layer_reserve_mb: 16}}\n"
                 f"  - {{name: bob, token: {B}}}\n"
                 "nodes:\n  - {name: n1, gpu: false}\n  - {name: n2, gpu: false}\n")
    cfg = load_service_config(p)
    assert [dict(n.cpu.layer_reservations) for n in cfg.nodes] == [{"alice": 16}, {"alice": 16}]
    p.write_text(f"tenants:\n  - {{name: alice, token: {A}, layer_reserve_mb: -1}}\n")
    with pytest.raises(ValueError, match=r"tenants\[0\].*layer_reserve_mb must be a positive integer"):
        load_service_config(p)


async def test_a_tenant_below_its_reservation_opens_although_another_filled_the_node(tmp_path) -> None:
    rootfs = imagekit.host_rootfs(os.path.join(tempfile.mkdtemp(prefix="tangram-m3-"), "rootfs"))
    cpu = CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1, layer_budget_mb=40)
    cfg = ServiceConfig(
        nodes=(NodeConfig(name="n1", cpu=cpu, gpu=None),),
        tenants=(TenantConfig(name="alice", token=A, layer_reserve_mb=16),
                 TenantConfig(name="bob", token=B)))
    ex = LocalExecutor.from_config(cfg)
    eng = Engine(ex, engine_config(cfg))
    await eng.start()
    try:
        await ex.import_image(rootfs, "mini")  # shared: every tenant may use it
        mgr = ex.hosts["n1"].cpu
        assert mgr.layers is not None and mgr.layers.reserved == {"alice": 16}
        app = create_app(eng, cfg)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            async def open_(tok: str, sid: str) -> httpx.Response:
                return await c.post("/v1/sessions", json={"session_id": sid, "image": "mini",
                                                          "layer_mb": 12},
                                    headers={"Authorization": f"Bearer {tok}"})

            async def run(tok: str, sid: str) -> dict:
                r = await c.post("/v1/actions", headers={"Authorization": f"Bearer {tok}"},
                                 json={"actions": [{"kind": "tool", "session": sid,
                                                    "payload": {"code": "echo ok",
                                                                "language": "bash"}}]})
                assert r.status_code == 200, r.text
                (aid,) = r.json()["ids"]
                res = await eng.result(aid, wait=60)
                assert res is not None and res.output is not None
                return {"stdout": (res.output["run_result"] or {}).get("stdout"),
                        "status": res.output["status"], "message": res.output["message"]}

            # bob takes 24 of the 24 MiB not kept for alice: his third is refused on the node
            for sid in ("b1", "b2"):
                r = await open_(B, sid)
                assert (r.status_code, r.json()) == (201, {"session_id": sid, "state": "open"})
                assert (await run(B, sid))["stdout"] == "ok\n"
            assert mgr.layers.held == {"bob": 24}
            r = await open_(B, "b3")  # refused on the node: the client is told why, at once
            assert (r.status_code, r.json()) == (503, {
                "detail": "session 'b3' is not open: could not open: ImageError: the node's "
                          "layer budget is spent: 24 of 40 MiB held by open layers, 16 MiB "
                          "kept for other tenants below their reservation, 12 MiB asked"})
            # and it is gone: an action naming it is rejected with the same reason
            r = await c.post("/v1/actions", headers={"Authorization": f"Bearer {B}"},
                             json={"actions": [{"kind": "tool", "session": "b3",
                                                "payload": {"code": "echo x"}}]})
            assert r.status_code == 400 and "could not open: ImageError" in r.text, r.text
            # alice, below her 16 MiB, opens and runs
            r = await open_(A, "a1")
            assert (r.status_code, r.json()) == (201, {"session_id": "a1", "state": "open"})
            assert (await run(A, "a1"))["stdout"] == "ok\n"
            assert mgr.layers.held == {"bob": 24, "alice": 12}
        for sid in ("b1", "b2", "a1"):
            await eng.close_session(sid)
        for _ in range(200):
            if not mgr.layers.held or not any(mgr.layers.held.values()):
                break
            await asyncio.sleep(0.02)
    finally:
        await eng.aclose()


def test_a_bad_reservation_is_refused_naming_it(tmp_path) -> None:
    from arl_tangram.managers.cpu import CpuManagerConfig as Cfg

    with pytest.raises(ValueError, match=r"layer_reservations\['a'\] must be an integer >= 0 "
                                         r"\(MiB\), got -1"):
        Cfg(work_root=str(tmp_path), layer_reservations={"a": -1})
    p = tmp_path / "c.yaml"
    p.write_text("tenants: alice\n")
    with pytest.raises(ValueError, match=r"tenants.*must be a list of \{name, token \| "
                                         r"token_file, .*layer_reserve_mb\}"):
        load_service_config(p)
