"""Fast constructors for the frozen dataclasses the core emits on every action.

Invariant: ``make(*fields)`` returns an object equal to, and indistinguishable from,
``cls(*fields)`` with every field given positionally -- same class, same field values,
``__post_init__`` called when the class has one, frozen afterwards. It only skips the generated
``__init__`` of a frozen dataclass, which sets each field through ``object.__setattr__`` (a global
and an attribute lookup and a call per field). Here the fields are stored as plain attributes on
an instance of a *twin* class -- the same bases and the same ``__slots__`` (so the same memory
layout) with the plain ``object`` setters -- whose class is then switched to ``cls`` (CPython
allows a ``__class__`` assignment between classes of identical layout, and checks it). A plain
store into a slot is one specialized bytecode, not a call. The core builds a StartAction, an
ActionResult and a Deliver per action, the simulator an ActionSpec and three or four events,
so this is on their hottest path; tests/core/test_speedups.py holds each equal to the dataclass.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable
from typing import Any, TypeVar

from .actions import ActionResult, ActionSpec, Status
from .commands import Deliver, StartAction
from .events import ActionArrived, ActionFinished, ActionStarted, WarmPoolReport

T = TypeVar("T")


def fast_constructor(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of ``cls`` positionally, in declaration order."""
    if not (dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__):
        raise TypeError(f"fast_constructor: {cls.__name__} is not a slotted dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    if any(not n.isidentifier() or keyword.iskeyword(n) or n.startswith("_twin_") for n in names):
        raise TypeError(f"fast_constructor: {cls.__name__} has a field name it cannot bind")
    twin = type(cls.__name__, cls.__bases__, {
        "__slots__": cls.__dict__["__slots__"], "__module__": cls.__module__,
        # both: a class whose tp_setattro is the generic one gets specialized slot stores
        "__setattr__": object.__setattr__, "__delattr__": object.__delattr__,
    })
    obj: Any = object.__new__(twin)
    obj.__class__ = cls  # fails here, at import, when the layouts differ
    # trailing fields with a plain default may be left out (`ActionSpec.tenant`)
    fields = dataclasses.fields(cls)
    params = list(names)
    defaults: dict[str, Any] = {}
    for i in range(len(fields) - 1, -1, -1):
        f = fields[i]
        if f.default is dataclasses.MISSING:
            break
        defaults[f"_twin_default_{i}_"] = f.default
        params[i] = f"{f.name}=_twin_default_{i}_"
    body = "\n".join(f"    _twin_obj_.{n} = {n}" for n in names)
    post = "\n    _twin_obj_.__post_init__()" if hasattr(cls, "__post_init__") else ""
    src = (f"def make({', '.join(params)}):\n    _twin_obj_ = _twin_new_(_twin_cls_)\n{body}\n"
           f"    _twin_obj_.__class__ = _twin_real_{post}\n    return _twin_obj_\n")
    ns: dict[str, Any] = {"_twin_new_": object.__new__, "_twin_cls_": twin, "_twin_real_": cls,
                          **defaults}
    exec(src, ns)  # generated from the dataclass's own field names, as dataclasses does
    make: Callable[..., T] = ns["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    return make


# (action, node, allotment, warm, cause)
make_start = fast_constructor(StartAction)
# (id, status, submit_time, start_time, finish_time, node, allotment, output, reason, attempts)
make_result = fast_constructor(ActionResult)
# (result, cause)
make_deliver = fast_constructor(Deliver)
# (id, kind, demand, elasticity, hints, task, trajectory, session, model, tag, timeout_s, weight,
#  idempotent, payload[, tenant[, siblings]]) -- payload is not defaulted: pass a fresh dict, as
#  its factory does; tenant and siblings default to None
make_spec = fast_constructor(ActionSpec)
# (time, action)
make_arrived = fast_constructor(ActionArrived)
# (time, action_id, node, cold_start_s)
make_started = fast_constructor(ActionStarted)
# (time, action_id, status, output, reason, run_s, cpu_s)
_make_finished = fast_constructor(ActionFinished)


def make_finished(time: float, action_id: str, status: Status, output: Any, reason: str,
                  run_s: float | None, cpu_s: float | None = None) -> ActionFinished:
    """`ActionFinished(...)`, built fast; ``cpu_s`` may be left out (not measured)."""
    return _make_finished(time, action_id, status, output, reason, run_s, cpu_s)
# (time, node, key, warm)
make_warm_report = fast_constructor(WarmPoolReport)
