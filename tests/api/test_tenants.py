"""Issue 25, item 3 (tenants), the parts that need no sandbox: the config's ``tenants:`` (tokens
shorter than 16 characters refused at load, names and tokens unique), each tenant's CPU share,
images in a tenant's own namespace, and a public bind guarded by tenants alone. The HTTP
behaviour with real sandboxes is tests/api/test_tenants_http.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.api.middleware import TENANT_KEY, GuardMiddleware
from arl_tangram.api.tenancy import Tenancy
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import ServiceConfig, TenantConfig, load_service_config
from arl_tangram.runtime.engine import Engine, EngineConfig

A = "alice-token-0123456789abcdef"
B = "bob-token-0123456789abcdef"


def test_config_refuses_short_and_clashing_tokens(tmp_path: Path) -> None:
    short = tmp_path / "short.tok"
    short.write_text("abc\n")
    for text, field in (
        ("tenants:\n  - {name: a, token: short}\n", "tenants[0].token"),
        (f"tenants:\n  - {{name: a, token_file: {short}}}\n", "tenants[0].token_file"),
        (f"tenants:\n  - {{name: a, token_file: {tmp_path}/none}}\n", "tenants[0].token_file"),
        ("tenants:\n  - {name: a, token: '                  '}\n", "tenants[0].token"),
        ("auth: {token: short}\n", "auth.token"),
        ("tenants:\n  - {name: a}\n", "tenants[0].token"),
        (f"tenants:\n  - {{name: a, token: {A}, token_file: {short}}}\n",
         "tenants[0].token_file"),
        (f"tenants:\n  - {{name: a, token: {A}}}\n  - {{name: a, token: {B}}}\n", "tenants"),
        (f"tenants:\n  - {{name: a, token: {A}}}\n  - {{name: b, token: {A}}}\n", "tenants"),
        (f"tenants:\n  - {{name: Bad Name, token: {A}}}\n", "tenants[0]"),
        (f"tenants:\n  - {{name: a, token: {A}, cpu_share: 2}}\n", "tenants[0]"),
        (f"tenants:\n  - {{name: a, token: {A}, max_sessions: 0}}\n", "tenants[0]"),
        (f"tenants:\n  - {{name: a, token: {A}, colour: red}}\n", "tenants[0].colour"),
        (f"auth: {{token: {A}}}\ntenants:\n  - {{name: default, token: {B}}}\n",
         "tenants[0].name"),
        # (issue 35, L3) "default" is the operator's: never a named tenant; a name is matched
        # whole, so one ending in a newline is refused
        (f"tenants:\n  - {{name: default, token: {B}}}\n", "tenants[0].name"),
        (f"tenants:\n  - {{name: \"a\\n\", token: {A}}}\n", "tenants[0]"),
        ("tenants: {name: a}\n", "tenants"),
    ):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        with pytest.raises(SpecError) as ei:
            load_service_config(p)
        assert ei.value.field == field, (text, ei.value)
    tok = tmp_path / "a.tok"
    tok.write_text(f"  {A}  \nsecond line ignored\n")
    p = tmp_path / "ok.yaml"
    p.write_text(f"tenants:\n  - {{name: a, token_file: {tok}, max_sessions: 3, cpu_share: 0.5}}\n"
                 f"  - {{name: b, token: {B}}}\n")
    cfg = load_service_config(p)
    a, b = cfg.tenants
    assert (a.name, a.token, a.max_sessions, a.cpu_share) == ("a", A, 3, 0.5)
    assert (b.name, b.max_sessions, b.max_concurrent_actions) == ("b", None, None)
    assert A not in repr(cfg) and B not in repr(cfg)  # tokens stay out of logs and tracebacks


async def test_middleware_puts_the_tenant_in_the_scope() -> None:
    seen: list[Any] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope.get(TENANT_KEY))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = GuardMiddleware(app, token="operator-token-0123456789", max_body_bytes=100,
                         tenants={A: "alice", B: "bob"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t") as c:
        for tok, want in ((A, "alice"), (B, "bob"), ("operator-token-0123456789", "default")):
            r = await c.get("/v1/stats", headers={"authorization": f"Bearer {tok}"})
            assert r.status_code == 200 and seen[-1] == want
        n = len(seen)
        for bad in (None, A[:-1], A + "x", f"{A} ", "Bearer " + A, A.upper()):
            h = {"authorization": f"Bearer {bad}"} if bad else {}
            assert (await c.get("/v1/stats", headers=h)).status_code == 401
        assert len(seen) == n
        r = await c.get("/v1/ping")  # open, without a tenant
        assert r.status_code == 200 and seen[-1] is None


async def test_cpu_share_caps_a_tenants_unfinished_demand() -> None:
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token=A, cpu_share=0.5),
                                 TenantConfig(name="bob", token=B)))
    eng = Engine(FakeExecutor(cpu=4), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            ha, hb = {"authorization": f"Bearer {A}"}, {"authorization": f"Bearer {B}"}

            def act(cpu: float, sleep: float) -> dict:
                return {"kind": "custom", "payload": {"sleep": sleep},
                        "demand": {"cpu": cpu, "memory_mb": 10}}

            r = await c.post("/v1/actions", headers=ha, json=act(2, 30))  # 2 of 4 CPUs: 0.5
            assert r.status_code == 200, r.text
            long_id = r.json()["ids"][0]
            r = await c.post("/v1/actions", headers=ha, json=act(0.5, 0))
            assert r.status_code == 429, r.text
            assert "cpu_share=0.5" in r.json()["detail"] and "2 CPUs" in r.json()["detail"]
            r = await c.post("/v1/actions", headers=hb, json={**act(1, 0), "wait": True})
            assert r.status_code == 200 and r.json()["results"][0]["status"] == "succeeded"
            # bob cannot cancel alice's action; alice can, and then has her share again
            assert (await c.delete(f"/v1/actions/{long_id}", headers=hb)).status_code == 404
            assert (await c.delete(f"/v1/actions/{long_id}", headers=ha)).status_code == 200
            r = await c.get(f"/v1/actions/{long_id}", headers=ha, params={"wait": 5})
            assert r.json()["finished"], r.text
            r = await c.post("/v1/actions", headers=ha, json={**act(2, 0), "wait": True})
            assert r.status_code == 200, r.text
    finally:
        await eng.aclose()


class _Images:
    """An engine's image side: stored names held on one node."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.nodes: dict[str, Any] = {}

    def has_image(self, name: str) -> bool:
        return name in self.names

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        return {"nodes": {"n1": [{"name": n, "in_use": 0} for n in sorted(self.names)]}}


def test_images_live_in_each_tenants_namespace() -> None:
    cfg = ServiceConfig(token="operator-token-0123456789",
                        tenants=(TenantConfig(name="alice", token=A),
                                 TenantConfig(name="bob", token=B)))
    eng = _Images("base", "alice+private", "alice+base", "bob+tools")
    t = Tenancy(eng, cfg)  # type: ignore[arg-type]

    def names(tenant: str | None) -> list[str]:
        return [r["name"] for r in t.images_view(tenant, eng.list_images())["nodes"]["n1"]]

    assert names("alice") == ["base", "private", "base"]  # shared base, her own base/private
    assert names("bob") == ["base", "tools"]
    assert names("default") == ["base"]
    assert names(None) == sorted(eng.names)  # no auth (embedded): everything
    # use: her own first, then a shared one; another tenant's never
    assert t.image_for_use("alice", "private") == "alice+private"
    assert t.image_for_use("alice", "base") == "alice+base"
    assert t.image_for_use("bob", "base") == "base"
    for name in ("private", "alice+private"):  # alice's, by either name: not found for bob
        assert not eng.has_image(t.image_for_use("bob", name) or "")
    assert t.image_for_use("default", "alice+private") is None
    # import: into the tenant's namespace; default cannot write into a tenant's
    assert t.image_for_import("bob", "x") == "bob+x"
    assert t.image_for_import("default", "x") == "x"
    with pytest.raises(ValueError):
        t.image_for_import("default", "alice+x")
    # remove: own -> ok; shared -> 403 for tenants, ok for default; others' -> 404
    assert t.image_for_remove("alice", "private") == "alice+private"
    with pytest.raises(PermissionError):
        t.image_for_remove("bob", "base")
    with pytest.raises(LookupError):
        t.image_for_remove("bob", "private")
    with pytest.raises(LookupError):
        t.image_for_remove("default", "alice+private")
    assert t.image_for_remove("default", "base") == "base"


def test_public_bind_with_tenants_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import uvicorn

    from arl_tangram.cli import serve

    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.delenv("TANGRAM_TOKEN", raising=False)
    import arl_tangram.runtime.build as build

    monkeypatch.setattr(build, "build_engine", lambda cfg: object())
    monkeypatch.setattr("arl_tangram.api.app.create_app", lambda *a, **k: object())
    p = tmp_path / "c.yaml"
    p.write_text(f"tenants:\n  - {{name: a, token: {A}}}\n")
    ap = argparse.ArgumentParser()
    serve.add_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["serve", "--config", str(p), "--host", "0.0.0.0", "--no-models"])
    assert serve.run(args) == 0 and calls[0]["host"] == "0.0.0.0"


class _ImageExecutor(FakeExecutor):
    """FakeExecutor with an (empty) image cache that checks names as the CPU manager's does."""

    def has_image(self, name: str) -> bool:
        from arl_tangram.core.images import check_name

        check_name(name)
        return False

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        return {"nodes": {"fake": []}}


async def test_invalid_image_names_from_a_tenant_are_4xx() -> None:
    """schemathesis found these (500s): a tenant's DELETE /v1/images/{invalid name}, and an
    invalid ``payload.image`` or session ``image``, went to the node's name check unguarded."""
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token=A),))
    eng = Engine(_ImageExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    app = create_app(eng, cfg)
    h = {"authorization": f"Bearer {A}"}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            from urllib.parse import quote

            for bad in ("\U000575a3\x06Í»¾v", "@x", "-x"):
                r = await c.delete(f"/v1/images/{quote(bad)}", headers=h)
                assert r.status_code == 400 and "not valid" in r.json()["detail"], r.text
                r = await c.post("/v1/sessions", headers=h, json={"image": bad})
                assert r.status_code == 400 and r.json()["field"] == "image", r.text
                r = await c.post("/v1/actions", headers=h, json={
                    "kind": "custom", "payload": {"image": bad}, "wait": True})
                assert r.status_code == 200, r.text  # the node's answer is the action's result
            r = await c.delete("/v1/images/fine", headers=h)
            assert r.status_code == 404, r.text
    finally:
        await eng.aclose()


def test_cluster_view_filters_the_typed_view_per_tenant() -> None:
    """`Tenancy.cluster_view` (issue 36, item 3): the typed `ClusterView` filtered per tenant
    before rendering: its own and the shared images, sources, transfers and warm keys, others'
    counted (``images_of_others``, ``warm_of_others``, last in the node's body)."""
    from arl_tangram.core.resources import Resources
    from arl_tangram.core.view import NodeView
    from arl_tangram.runtime.views import ClusterView, NodeRow

    cfg = ServiceConfig(token="operator-token-0123456789",
                        tenants=(TenantConfig(name="alice", token=A),
                                 TenantConfig(name="bob", token=B)))
    t = Tenancy(_Images(), cfg)  # type: ignore[arg-type]
    cap = Resources(cpu=2)
    core = NodeView("n1", "default", cap, Resources(), cap, 0, True,
                    {"python": 2, "image:base": 1, "image:alice+mine": 3, "image:bob+his": 4})
    report = {"ready": True,
              "images": [{"name": "base"}, {"name": "alice+mine"}, {"name": "bob+his"}, "odd"],
              "image_sources": {"base": "config", "alice+mine": "import", "bob+his": "upload"},
              "image_transfers": [{"image": "alice+mine", "state": "done"},
                                  {"image": "bob+his", "state": "done"}, "odd"]}
    view = ClusterView(nodes=(NodeRow(core=core, report=report, not_ready_reason="down"),),
                       policy="tangram", models=(), instances=(), models_down={}, sessions=3)
    assert t.cluster_view(None, view) is view
    got = t.cluster_view("alice", view)
    assert got.sessions == 3 and got.policy == "tangram"
    node = got.to_dict()["nodes"][0]
    assert node["warm"] == {"python": 2, "image:base": 1, "image:mine": 3}
    assert node["images"] == [{"name": "base"}, {"name": "mine"}]
    assert node["image_sources"] == {"base": "config", "mine": "import"}
    assert node["image_transfers"] == [{"image": "mine", "state": "done"}]
    assert list(node)[-3:] == ["not_ready_reason", "images_of_others", "warm_of_others"]
    assert node["ready"] is False
    assert (node["images_of_others"], node["warm_of_others"]) == (2, 4)
    assert view.nodes[0].report is report and view.nodes[0].core.warm["image:bob+his"] == 4
    bare = ClusterView(nodes=(NodeRow(core=core),), policy="p", models=(), instances=(),
                       models_down={}, sessions=0)
    (row,) = t.cluster_view("bob", bare).to_dict()["nodes"]
    assert "images" not in row and "images_of_others" not in row
    assert (row["warm"], row["warm_of_others"]) == ({"python": 2, "image:base": 1, "image:his": 4}, 3)
