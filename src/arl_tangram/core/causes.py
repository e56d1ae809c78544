"""The cause a command carries: ``Type:id`` of the event that made the core emit it.

Invariant: `_cause_of(event)` depends only on the event (its type and its identifying field),
and `_CAUSE_FN[type(event)](event)` equals it for every type listed there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import events as ev
from .actions import ActionSpec
from .cluster import NodeSpec

_CAUSE_ATTR = {
    ev.ActionStarted: "action_id",
    ev.ActionFinished: "action_id",
    ev.CancelRequested: "action_id",
    ev.BatchFinished: "batch_id",
    ev.ModelLoaded: "instance_id",
    ev.ModelUnloaded: "instance_id",
}


# ``_cause_of`` of the frequent event types, without the lookups.
_CAUSE_FN: dict[type, Callable[[Any], str]] = {
    ev.ActionArrived: lambda e: f"ActionArrived:{e.action.id}",
    ev.ActionsArrived: lambda e: f"ActionsArrived:{e.actions[0].id}+{len(e.actions) - 1}",
    ev.ActionStarted: lambda e: f"ActionStarted:{e.action_id}",
    ev.ActionFinished: lambda e: f"ActionFinished:{e.action_id}",
    ev.WarmPoolReport: lambda e: f"WarmPoolReport:{e.node}" if isinstance(e.node, str) and e.node
    else _cause_of(e),
    ev.Tick: lambda e: f"Tick@{e.time:g}",
}


def _cause_of(event: ev.Event) -> str:
    """``Type:id`` of the event, carried by the commands and transitions it causes."""
    t = type(event)
    if t is ev.ActionArrived:
        return "ActionArrived:" + event.action.id  # type: ignore[attr-defined]
    if t is ev.ActionsArrived:  # (its first action and how many came with it)
        acts = event.actions  # type: ignore[attr-defined]
        return f"ActionsArrived:{acts[0].id}+{len(acts) - 1}"
    attr = _CAUSE_ATTR.get(t)
    if attr is not None:
        return f"{t.__name__}:{getattr(event, attr)}"
    for attr in ("action_id", "batch_id", "instance_id", "session_id"):
        v = getattr(event, attr, None)
        if v:
            return f"{type(event).__name__}:{v}"
    a = getattr(event, "action", None)
    if isinstance(a, ActionSpec):
        return f"ActionArrived:{a.id}"
    n = getattr(event, "node", None)
    if isinstance(n, NodeSpec):
        return f"NodeAdded:{n.name}"
    if isinstance(n, str):
        return f"{type(event).__name__}:{n}"
    return f"{type(event).__name__}@{event.time:g}"
