"""bench_sim's null scheduler builds its commands fast: they equal the plain constructors' ones."""

from __future__ import annotations

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionResult, ActionSpec, Status
from arl_tangram.core.resources import Resources

from .benchmark_module import load_benchmark


def test_null_scheduler_commands_equal_the_plain_dataclasses() -> None:
    s = load_benchmark("bench_sim").NullScheduler("n0")
    a = ActionSpec("t#0", demand=Resources(cpu=1, memory_mb=512))
    (start,) = s.handle(E.ActionArrived(1.0, a))
    assert type(start) is C.StartAction and start == C.StartAction(a, "n0", a.demand, warm=False)
    assert s.handle(E.ActionStarted(1.5, "t#0", "n0", 0.5)) == []
    (deliver,) = s.handle(E.ActionFinished(3.0, "t#0", Status.SUCCEEDED, None, "", 1.5))
    ref = C.Deliver(ActionResult("t#0", Status.SUCCEEDED, 1.0, 1.5, 3.0))
    assert type(deliver) is C.Deliver and deliver == ref and repr(deliver) == repr(ref)
    assert s.handle(E.Tick(4.0)) == []
