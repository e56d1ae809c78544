"""Issue 41 item 3, the config and plumbing of tenants' fair share: a tenant's ``share`` is
parsed and checked at load (a bad one named), reaches the core as `CoreConfig.tenant_shares`,
and every action a tenant submits carries its name (`ActionSpec.tenant`) to the core."""

from __future__ import annotations

from pathlib import Path

import pytest

from arl_tangram.api.tenancy import Tenancy
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.build import engine_config
from arl_tangram.runtime.config import ServiceConfig, TenantConfig, load_service_config

A = "alice-token-0123456789abcdef"
B = "bob-token-0123456789abcdef"


@pytest.mark.parametrize("bad", ["-0.5", "0", ".nan", ".inf", "true", "half"])
def test_a_bad_share_is_refused_at_load_naming_the_tenant(tmp_path: Path, bad: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"tenants:\n  - {{name: a, token: {A}, share: {bad}}}\n")
    with pytest.raises(SpecError) as ei:
        load_service_config(p)
    assert ei.value.field == "tenants[0]" and "share must be a finite number > 0" in str(ei.value)


def test_shares_reach_the_core_and_cpu_share_stays_a_cap(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"tenants:\n  - {{name: alice, token: {A}, share: 0.5, cpu_share: 0.25}}\n"
                 f"  - {{name: bob, token: {B}, share: 0.5}}\n")
    cfg = load_service_config(p)
    assert [(t.name, t.share, t.cpu_share) for t in cfg.tenants] == [
        ("alice", 0.5, 0.25), ("bob", 0.5, None)]
    core = engine_config(cfg).core
    assert isinstance(core, CoreConfig) and core.tenant_shares == {"alice": 0.5, "bob": 0.5}


def test_no_share_named_no_fair_share() -> None:
    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token=A, cpu_share=0.5),))
    assert cfg.tenant_shares() is None
    core = engine_config(cfg).core
    assert core is not None and core.tenant_shares is None


def test_admit_marks_each_action_with_its_tenant() -> None:
    class _Engine:
        nodes: dict = {}

    cfg = ServiceConfig(tenants=(TenantConfig(name="alice", token=A, share=1.0),))
    ten = Tenancy(_Engine(), cfg)  # type: ignore[arg-type]
    specs = [ActionSpec("x"), ActionSpec("y")]
    ten.admit("alice", specs)
    assert [s.tenant for s in specs] == ["alice", "alice"]
    ten.admit("bob", specs[:1])  # (an unknown tenant has no quotas, still its name)
    assert specs[0].tenant == "bob"
    assert "alice" not in repr(specs[1])  # (not in the repr: command streams unchanged)
