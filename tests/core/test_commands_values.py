"""core/commands.py's values (issue 43 item 2). mutmut makes no mutant of this module (3.8
mutates function bodies only; it holds dataclass declarations), so what a mutant would change is
asserted here by hand: each command type's fields in order and their defaults (a start expects a
warm executor, an unload parks, a load is cold, every ``cause`` empty), `EvictSession` a
`CloseSession`, the attachment out of the repr, the base `Command`, frozen and slotted."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.core import commands as cm
from arl_tangram.core.resources import Resources

MISSING = dataclasses.MISSING

FIELDS = {
    cm.Command: [],
    cm.StartAction: [("action", MISSING), ("node", MISSING), ("allotment", MISSING),
                     ("warm", True), ("cause", "")],
    cm.ResizeAction: [("action_id", MISSING), ("node", MISSING), ("allotment", MISSING),
                      ("cause", "")],
    cm.CancelAction: [("action_id", MISSING), ("node", MISSING), ("cause", "")],
    cm.OpenSession: [("session_id", MISSING), ("node", MISSING), ("demand", MISSING),
                     ("ttl_s", MISSING), ("cause", ""), ("attachment", None)],
    cm.CloseSession: [("session_id", MISSING), ("node", MISSING), ("reason", ""), ("cause", "")],
    cm.EvictSession: [("session_id", MISSING), ("node", MISSING), ("reason", ""), ("cause", "")],
    cm.LoadModel: [("instance_id", MISSING), ("model", MISSING), ("node", MISSING),
                   ("devices", MISSING), ("from_host", False), ("cause", "")],
    cm.UnloadModel: [("instance_id", MISSING), ("node", MISSING), ("park", True), ("cause", "")],
    cm.RunBatch: [("batch_id", MISSING), ("instance_id", MISSING), ("node", MISSING),
                  ("model", MISSING), ("actions", MISSING), ("cause", "")],
    cm.ResizeWarmPool: [("node", MISSING), ("key", MISSING), ("size", MISSING), ("cause", "")],
    cm.Deliver: [("result", MISSING), ("cause", "")],
    cm.CallProvider: [("action", MISSING), ("provider", MISSING), ("attempt", MISSING),
                      ("deadline", MISSING), ("cause", "")],
    cm.WakeAt: [("time", MISSING), ("cause", "")],
}


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda c: c.__name__)
def test_fields_in_order_with_their_defaults(cls: type) -> None:
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == FIELDS[cls]
    assert issubclass(cls, cm.Command)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert "__slots__" in cls.__dict__


def test_every_command_type_is_listed() -> None:
    listed = {c for c in vars(cm).values() if isinstance(c, type) and issubclass(c, cm.Command)}
    assert listed == set(FIELDS)


def test_an_eviction_is_a_close_but_not_equal_to_one() -> None:
    e = cm.EvictSession("s1", "n1", reason="short of memory")
    assert isinstance(e, cm.CloseSession)
    assert e != cm.CloseSession("s1", "n1", reason="short of memory")
    assert e == cm.EvictSession("s1", "n1", "short of memory", "")


def test_constructed_defaults_and_repr() -> None:
    o = cm.OpenSession("s1", "n1", Resources(memory_mb=256), 600.0, attachment="IMG")
    assert o.cause == "" and o.attachment == "IMG"
    assert "IMG" not in repr(o) and "attachment" not in repr(o)
    assert repr(cm.WakeAt(1.5)) == "WakeAt(time=1.5, cause='')"
    assert cm.UnloadModel("i1", "n1").park is True
    assert cm.LoadModel("i1", "m", "n1", (0, 1)).from_host is False
    w = cm.WakeAt(2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.time = 3.0  # type: ignore[misc]
