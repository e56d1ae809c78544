"""core/causes.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
``Type:id`` cause of each event type by `_cause_of` (its identifying field: action, batch,
instance, session, node; an empty id skipped; an `ActionSpec` under ``action`` read as an
arrival; a `NodeSpec` as ``NodeAdded``; else ``Type@time`` with ``:g``), and the fast
`_CAUSE_FN` entries (``ActionsArrived:first+rest``, ``Tick@time``, a `WarmPoolReport` with an
empty node falling back to `_cause_of`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.causes import _CAUSE_ATTR, _CAUSE_FN, _cause_of
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources

A1 = ActionSpec("a1")
A2 = ActionSpec("a2")
A3 = ActionSpec("a3")


@dataclass(frozen=True, slots=True)
class _LateArrival(ev.ActionArrived):
    """Not `ActionArrived` itself: `_cause_of` finds its `ActionSpec` by the ``action`` field."""


@dataclass(frozen=True, slots=True)
class _LateBatch(ev.BatchFinished):
    """Not in the table: `_cause_of` finds its ``batch_id`` by the field search."""


@dataclass(frozen=True, slots=True)
class _LateLoad(ev.ModelLoaded):
    """Not in the table: `_cause_of` finds its ``instance_id`` by the field search."""


@dataclass(frozen=True, slots=True)
class _Odd(ev.Event):
    """No identifying field: an ``action`` and a ``node`` that are neither spec nor name."""

    action: object = None
    node: object = None


CASES = [
    (ev.ActionArrived(1.0, A1), "ActionArrived:a1"),
    (ev.ActionStarted(1.0, "a1", "n1"), "ActionStarted:a1"),
    (ev.ActionFinished(1.0, "a1"), "ActionFinished:a1"),
    (ev.CancelRequested(1.0, "a1"), "CancelRequested:a1"),
    (ev.BatchFinished(1.0, "b1", "i1"), "BatchFinished:b1"),
    (ev.ModelLoaded(1.0, "i1"), "ModelLoaded:i1"),
    (ev.ModelUnloaded(1.0, "i1"), "ModelUnloaded:i1"),
    (ev.SessionRequested(1.0, "s1"), "SessionRequested:s1"),
    (ev.SessionClosed(1.0, "s1"), "SessionClosed:s1"),
    (ev.ProviderThrottled(1.0, "a1"), "ProviderThrottled:a1"),
    (ev.NodeAdded(1.0, NodeSpec("n1", Resources(cpu=1))), "NodeAdded:n1"),
    (ev.NodeLost(1.0, "n1"), "NodeLost:n1"),
    (ev.MemoryReport(1.0, "n1"), "MemoryReport:n1"),
    (ev.WarmPoolReport(1.0, "n1", "python", 2), "WarmPoolReport:n1"),
    (ev.Tick(2.5), "Tick@2.5"),
    (ev.Wake(12345678.0), "Wake@1.23457e+07"),
    (ev.Tick(3.0), "Tick@3"),
    (ev.ActionsArrived(1.5, (A1, A2)), "ActionsArrived:a1+1"),
    (_LateArrival(1.0, A2), "ActionArrived:a2"),
    (_LateBatch(1.0, "b2", "i2"), "_LateBatch:b2"),
    (_LateBatch(1.0, "", "i2"), "_LateBatch:i2"),
    (_LateLoad(1.0, "i3"), "_LateLoad:i3"),
    (_Odd(4.0), "_Odd@4"),
    (_Odd(4.0, action="a9", node=7), "_Odd@4"),
    (_Odd(4.0, node="n3"), "_Odd:n3"),
    (_Odd(4.0, node=NodeSpec("n4", Resources(cpu=1))), "NodeAdded:n4"),
]


@pytest.mark.parametrize(("event", "cause"), CASES, ids=[c for _, c in CASES])
def test_cause_of_each_event(event: ev.Event, cause: str) -> None:
    assert _cause_of(event) == cause


def test_the_attribute_table() -> None:
    table = dict(_CAUSE_ATTR)
    assert table == {
        ev.ActionStarted: "action_id",
        ev.ActionFinished: "action_id",
        ev.CancelRequested: "action_id",
        ev.BatchFinished: "batch_id",
        ev.ModelLoaded: "instance_id",
        ev.ModelUnloaded: "instance_id",
    }


def test_an_empty_id_is_skipped_for_the_next_field_or_the_time() -> None:
    # an empty session id: no identifying field, so the time
    assert _cause_of(ev.SessionRequested(2.0, "")) == "SessionRequested@2"
    assert _cause_of(ev.SessionClosed(0.25, "")) == "SessionClosed@0.25"
    assert _cause_of(ev.ProviderThrottled(1.0, "")) == "ProviderThrottled@1"
    # an empty node name is still a name
    assert _cause_of(ev.NodeLost(1.0, "")) == "NodeLost:"
    # the table's field is read even when empty
    assert _cause_of(ev.ActionStarted(1.0, "", "n1")) == "ActionStarted:"
    assert _cause_of(ev.BatchFinished(1.0, "", "i1")) == "BatchFinished:"


def test_the_fast_entries() -> None:
    assert set(_CAUSE_FN) == {
        ev.ActionArrived, ev.ActionsArrived, ev.ActionStarted, ev.ActionFinished,
        ev.WarmPoolReport, ev.Tick,
    }
    f = _CAUSE_FN
    assert f[ev.ActionArrived](ev.ActionArrived(1.0, A1)) == "ActionArrived:a1"
    assert f[ev.ActionsArrived](ev.ActionsArrived(1.0, (A1, A2, A3))) == "ActionsArrived:a1+2"
    assert f[ev.ActionsArrived](ev.ActionsArrived(1.0, (A2,))) == "ActionsArrived:a2+0"
    assert f[ev.ActionStarted](ev.ActionStarted(1.0, "a1", "n1")) == "ActionStarted:a1"
    assert f[ev.ActionFinished](ev.ActionFinished(1.0, "a1")) == "ActionFinished:a1"
    assert f[ev.WarmPoolReport](ev.WarmPoolReport(1.0, "n1", "py", 1)) == "WarmPoolReport:n1"
    assert f[ev.WarmPoolReport](ev.WarmPoolReport(1.5, "", "py", 1)) == "WarmPoolReport:"
    assert f[ev.Tick](ev.Tick(0.125)) == "Tick@0.125"
    assert f[ev.Tick](ev.Tick(1e7)) == "Tick@1e+07"


@pytest.mark.parametrize(("event", "cause"), [c for c in CASES if type(c[0]) in _CAUSE_FN])
def test_the_fast_entries_agree_with_cause_of(event: ev.Event, cause: str) -> None:
    assert _CAUSE_FN[type(event)](event) == _cause_of(event) == cause


def test_actions_arrived_agrees_with_cause_of() -> None:
    """(helper-37 found `_cause_of` without a case for `ActionsArrived`: "ActionsArrived@1"
    against `_CAUSE_FN`'s "ActionsArrived:a1+1", against the module's invariant; the core uses
    `_CAUSE_FN`'s.)"""
    e = ev.ActionsArrived(1.0, (A1, A2))
    assert _cause_of(e) == _CAUSE_FN[ev.ActionsArrived](e) == "ActionsArrived:a1+1"
    assert _cause_of(ev.ActionsArrived(2.0, (A2,))) == "ActionsArrived:" + A2.id + "+0"
