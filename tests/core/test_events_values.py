"""core/events.py's values (issue 43 item 2). mutmut makes no mutant of this module (3.8 mutates
function bodies only; it holds dataclass declarations), so what a mutant would change is
asserted here by hand: each event type's fields in order and their defaults (a session's 256 MB
demand and 600 s ttl, a finish's SUCCEEDED, a load's ok, an unload's not parked, a node loss's
"node lost"), a fresh mapping per event, the base `Event`, frozen and slotted."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.resources import Resources

MISSING = dataclasses.MISSING


def _fields(cls: type) -> list[tuple[str, object]]:
    out = []
    for f in dataclasses.fields(cls):
        d = f.default if f.default_factory is MISSING else f.default_factory()
        out.append((f.name, d))
    return out


FIELDS = {
    ev.Event: [("time", MISSING)],
    ev.ActionArrived: [("time", MISSING), ("action", MISSING)],
    ev.ActionsArrived: [("time", MISSING), ("actions", MISSING)],
    ev.ActionStarted: [("time", MISSING), ("action_id", MISSING), ("node", MISSING),
                       ("cold_start_s", 0.0)],
    ev.ActionFinished: [("time", MISSING), ("action_id", MISSING), ("status", Status.SUCCEEDED),
                        ("output", None), ("reason", ""), ("run_s", None), ("cpu_s", None)],
    ev.CancelRequested: [("time", MISSING), ("action_id", MISSING)],
    ev.SessionRequested: [("time", MISSING), ("session_id", MISSING),
                          ("demand", Resources(memory_mb=256)), ("ttl_s", 600.0), ("node", None),
                          ("trajectory", None), ("task", None), ("warm_key", None),
                          ("attachment", None)],
    ev.SessionClosed: [("time", MISSING), ("session_id", MISSING), ("reason", "")],
    ev.MemoryReport: [("time", MISSING), ("node", MISSING), ("current_mb", {}), ("peak_mb", {}),
                      ("other_mb", 0.0)],
    ev.NodeAdded: [("time", MISSING), ("node", MISSING)],
    ev.NodeLost: [("time", MISSING), ("node", MISSING), ("reason", "node lost")],
    ev.ModelLoaded: [("time", MISSING), ("instance_id", MISSING), ("ok", True), ("load_s", None),
                     ("from_host", False), ("reason", "")],
    ev.ModelUnloaded: [("time", MISSING), ("instance_id", MISSING), ("parked", False),
                       ("reason", "")],
    ev.BatchFinished: [("time", MISSING), ("batch_id", MISSING), ("instance_id", MISSING),
                       ("outputs", {}), ("failed", {}), ("latency_s", None)],
    ev.WarmPoolReport: [("time", MISSING), ("node", MISSING), ("key", MISSING), ("warm", MISSING)],
    ev.Tick: [("time", MISSING)],
    ev.ProviderThrottled: [("time", MISSING), ("action_id", MISSING), ("retry_after_s", None),
                           ("reason", "")],
    ev.Wake: [("time", MISSING)],
}


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda c: c.__name__)
def test_fields_in_order_with_their_defaults(cls: type) -> None:
    assert _fields(cls) == FIELDS[cls]
    assert issubclass(cls, ev.Event)
    p = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert p.frozen
    assert "__slots__" in cls.__dict__


def test_every_event_type_is_listed() -> None:
    listed = {c for c in vars(ev).values() if isinstance(c, type) and issubclass(c, ev.Event)}
    assert listed == set(FIELDS)


def test_defaults_of_constructed_events() -> None:
    s = ev.SessionRequested(1.0, "s1")
    assert s.demand == Resources(memory_mb=256)
    assert s.ttl_s == 600.0
    f = ev.ActionFinished(2.0, "a1")
    assert f.status is Status.SUCCEEDED
    assert ev.ModelLoaded(3.0, "i1").ok is True
    assert ev.NodeLost(4.0, "n1").reason == "node lost"
    a, b = ev.MemoryReport(5.0, "n1"), ev.MemoryReport(5.0, "n2")
    assert a.current_mb == {} and a.current_mb is not b.current_mb
    assert ev.ActionArrived(0.0, ActionSpec("x")).action.id == "x"


def test_attachment_is_not_in_the_repr() -> None:
    r = repr(ev.SessionRequested(1.0, "s1", attachment="IMG"))
    assert "IMG" not in r and "attachment" not in r
    assert "warm_key=None" in r


def test_events_are_frozen_values() -> None:
    t = ev.Tick(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.time = 2.0  # type: ignore[misc]
    assert ev.Tick(1.0) == t
    assert ev.Tick(1.0) != ev.Wake(1.0)
    assert hash(ev.NodeLost(1.0, "n1")) == hash(ev.NodeLost(1.0, "n1"))
