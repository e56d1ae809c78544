"""The scheduler seam (issue 43 item 2): `core/protocol.py`. `Inspectable` is what a driver
tests for (``isinstance``) before it reads a scheduler's state: the core is one, a bare
scheduler (only ``handle``) is not, and every one of its six members is required.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_helpers import Driver, cpu_node

from arl_tangram.core.protocol import Inspectable, Scheduler

MEMBERS = ("view", "instance", "instances_of", "status", "provider_stats", "estimator")


class Full:
    def handle(self, event: Any) -> list[Any]:
        return []

    def view(self) -> Any: ...

    def instance(self, instance_id: str) -> Any: ...

    def instances_of(self, model: str) -> list[Any]:
        return []

    def status(self, action_id: str) -> Any: ...

    def provider_stats(self) -> dict[str, dict[str, Any]]:
        return {}

    estimator = None


def test_the_core_is_inspectable_and_a_bare_scheduler_is_not() -> None:
    core = Driver([cpu_node("n0")]).core
    assert isinstance(core, Inspectable)
    s: Scheduler = core
    assert s.handle is not None
    assert not isinstance(object(), Inspectable)
    assert isinstance(Full(), Inspectable)


@pytest.mark.parametrize("missing", MEMBERS)
def test_each_member_is_required(missing: str) -> None:
    cls = type("Partial", (), {k: v for k, v in vars(Full).items() if k != missing})
    assert not isinstance(cls(), Inspectable)
