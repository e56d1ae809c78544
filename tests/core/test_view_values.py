"""core/view.py's values (issue 43 item 2): mutmut makes no mutant of view.py (frozen dataclass
declarations and a property it leaves alone), so the snapshot types are pinned by hand: each
class's fields in order, frozen and slotted, and `CoreView.queued` the sum of the queued actions
of every kind (checked by hand against a changed copy)."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.core.resources import Resources
from arl_tangram.core.view import CoreView, InstanceView, NodeView, SessionView

FIELDS = {
    NodeView: ("name", "pool", "capacity", "used", "free", "running", "alive", "warm"),
    InstanceView: ("id", "model", "node", "devices", "state", "queue"),
    SessionView: ("id", "node", "demand", "actions", "last_active"),
    CoreView: (
        "time",
        "policy",
        "nodes",
        "instances",
        "sessions",
        "queued_by_kind",
        "counts",
        "parked",
    ),
}


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda c: c.__name__)
def test_fields_in_order_frozen_and_slotted(cls: type) -> None:
    fields = dataclasses.fields(cls)
    assert tuple(f.name for f in fields) == FIELDS[cls]
    assert all(f.default is dataclasses.MISSING for f in fields)
    assert all(f.default_factory is dataclasses.MISSING for f in fields)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen is True
    assert "__slots__" in cls.__dict__


def _view(queued: dict[str, int]) -> CoreView:
    node = NodeView(
        "n1", "cpu", Resources(cpu=4), Resources(cpu=1), Resources(cpu=3), 1, True, {"py": 2}
    )
    inst = InstanceView("i1", "rm", "g0", (0, 1), "ready", 3)
    sess = SessionView("s1", None, Resources(memory_mb=256), 2, 1.5)
    return CoreView(7.0, "tangram", (node,), (inst,), (sess,), queued, {"RUNNING": 1}, {})


def test_queued_is_the_sum_over_kinds() -> None:
    assert _view({"code": 3, "reward": 4, "tool": 0}).queued == 7
    assert _view({"code": 5}).queued == 5
    assert _view({}).queued == 0


def test_a_view_is_frozen() -> None:
    v = _view({"code": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.time = 8.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.nodes[0].alive = False  # type: ignore[misc]
    assert (v.time, v.policy, v.nodes[0].name, v.instances[0].devices, v.sessions[0].node) == (
        7.0,
        "tangram",
        "n1",
        (0, 1),
        None,
    )
