"""Fast constructors for the frozen dataclasses the core emits on every action.

Invariant: ``make(*fields)`` returns an object equal to, and indistinguishable from,
``cls(*fields)`` with every field given positionally -- same class, same field values, and
``__post_init__`` called when the class has one. It only skips the generated ``__init__`` of a
frozen dataclass, which sets each field through ``object.__setattr__`` (a global and an
attribute lookup per field); here each field is set through its slot descriptor, bound once.
The core builds a StartAction, an ActionResult and a Deliver per action, the simulator an
ActionSpec and three events, so this is on their hottest path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from .actions import ActionResult, ActionSpec
from .commands import Deliver, StartAction
from .events import ActionArrived, ActionFinished, ActionStarted

T = TypeVar("T")


def fast_constructor(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of ``cls`` positionally, in declaration order."""
    if not (dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__):
        raise TypeError(f"fast_constructor: {cls.__name__} is not a slotted dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    setters = {f"_s_{n}": _slot(cls, n).__set__ for n in names}
    args = ", ".join(names)
    body = "\n".join(f"    _s_{n}(obj, {n})" for n in names)
    if hasattr(cls, "__post_init__"):
        body += "\n    obj.__post_init__()"
    src = f"def make({args}):\n    obj = _new(_cls)\n{body}\n    return obj\n"
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls, **setters}
    exec(src, ns)  # generated from the dataclass's own field names, as dataclasses does
    make: Callable[..., T] = ns["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    return make


def _slot(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        d = klass.__dict__.get(name)
        if d is not None and hasattr(d, "__set__"):
            return d
    raise TypeError(f"fast_constructor: no slot {name!r} in {cls.__name__}")


# (action, node, allotment, warm, cause)
make_start = fast_constructor(StartAction)
# (id, status, submit_time, start_time, finish_time, node, allotment, output, reason, attempts)
make_result = fast_constructor(ActionResult)
# (result, cause)
make_deliver = fast_constructor(Deliver)
# (id, kind, demand, elasticity, hints, task, trajectory, session, model, tag, timeout_s, weight,
#  idempotent, payload) -- payload is not defaulted: pass a fresh dict, as its factory does
make_spec = fast_constructor(ActionSpec)
# (time, action)
make_arrived = fast_constructor(ActionArrived)
# (time, action_id, node, cold_start_s)
make_started = fast_constructor(ActionStarted)
# (time, action_id, status, output, reason, run_s)
make_finished = fast_constructor(ActionFinished)
