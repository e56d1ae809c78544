"""A tenant's ``payload.image`` resolved to the stored name (issue 36, item 4): the service
answers a new action and payload; the payload it was given is not changed (it rewrote
``payload["image"]`` in place, so whoever held that payload saw the tenant's prefix appear, and
a typed request, not a dict, was skipped)."""

from __future__ import annotations

from typing import Any

import pytest

from arl_tangram.api.service import Service
from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.errors import InvalidAction
from arl_tangram.kinds import CodeRequest
from arl_tangram.runtime.config import ServiceConfig, TenantConfig

A = "alice-token-0123456789abcdef"


class _Images:
    """An engine's image side: the stored names of one node."""

    names = frozenset({"base", "alice+private"})

    def has_image(self, name: str) -> bool:
        return name in self.names

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        return {"nodes": {"n1": [{"name": n, "in_use": 0} for n in sorted(self.names)]}}


def _svc() -> Service:
    return Service(_Images(), ServiceConfig(tenants=(TenantConfig(name="alice", token=A),)))  # type: ignore[arg-type]


def test_the_callers_payload_is_not_rewritten() -> None:
    svc = _svc()
    payload = {"code": "print(1)", "image": "private"}
    spec = ActionSpec(id="a", kind=ActionKind.CUSTOM, payload=payload)
    got = svc._own_image(spec, "actions[0].payload.image", "alice")
    assert got is not spec and dict(got.payload) == {"code": "print(1)", "image": "alice+private"}
    assert payload == {"code": "print(1)", "image": "private"} and spec.payload is payload
    # a shared image keeps its name: the same spec back
    shared = ActionSpec(id="b", kind=ActionKind.CUSTOM, payload={"image": "base"})
    assert svc._own_image(shared, "x", "alice") is shared


def test_a_typed_request_gets_the_stored_name_too() -> None:
    svc = _svc()
    req = CodeRequest(code="print(1)", image="private")
    spec = ActionSpec(id="a", kind=ActionKind.CODE, payload=req)
    got = svc._own_image(spec, "actions[0].payload.image", "alice")
    assert isinstance(got.payload, CodeRequest) and got.payload.image == "alice+private"
    assert req.image == "private" and spec.payload is req


def test_an_image_the_tenant_cannot_see_is_named() -> None:
    """Another tenant's image, by its stored name: as if there were none (the operator's
    tenant, default, sees shared images only)."""
    spec = ActionSpec(id="a", kind=ActionKind.CUSTOM, payload={"image": "alice+private"})
    with pytest.raises(InvalidAction) as got:
        _svc()._own_image(spec, "actions[0].payload.image", "default")
    assert str(got.value) == "actions[0].payload.image: no image 'alice+private' on any node"
