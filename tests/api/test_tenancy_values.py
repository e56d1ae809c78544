"""api/tenancy.py's values (issue 43 item 2: survivors of `make mutation` on it): the tenants'
quotas are reserved in the service-wide caps only while they add up to at most the cap (equal
included), and past it a warning names the quota, the sum and the cap, word for word."""

from __future__ import annotations

import logging

import pytest

from arl_tangram.api.tenancy import Tenancy
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig, TenantConfig

A = "alice-token-0123456789abcdef"
B = "bob-token-0123456789abcdef"


class _Engine:
    nodes: dict = {}


def _tenancy(alice: int, bob: int, cap: int = 3) -> Tenancy:
    cfg = ServiceConfig(
        limits=LimitsConfig(max_sessions=cap, max_pending=cap),
        tenants=(TenantConfig(name="alice", token=A, max_sessions=alice, max_concurrent_actions=alice),
                 TenantConfig(name="bob", token=B, max_sessions=bob, max_concurrent_actions=bob)))
    return Tenancy(_Engine(), cfg)  # type: ignore[arg-type]


def test_quotas_adding_up_to_the_cap_exactly_are_reserved_without_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="arl_tangram.api.tenancy"):
        t = _tenancy(1, 2)
    assert caplog.messages == []
    # alice asks: bob's 2 places are kept for him, and 1 of alice's for her when bob asks
    assert (t.reserved_sessions("alice"), t.reserved_sessions("bob")) == (2, 1)
    assert (t._reserved_actions("alice"), t._reserved_actions("bob")) == (2, 1)


def test_quotas_past_the_cap_reserve_nothing_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="arl_tangram.api.tenancy"):
        t = _tenancy(2, 2)
    assert caplog.messages == [
        "tenants' max_sessions add up to 4, more than the service's 3: no share of it is "
        "reserved for them",
        "tenants' max_concurrent_actions add up to 4, more than the service's 3: no share of it "
        "is reserved for them"]
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (0, 0)
