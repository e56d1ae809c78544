"""core.build: the fast constructors the simulator uses build exactly what the dataclasses build."""

import dataclasses
import pickle

import pytest

from arl_tangram.core import build
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Status, WorkHints
from arl_tangram.core.resources import Resources
from arl_tangram.sim.trace import SimAction, Trajectory
from arl_tangram.sim.workloads import _make_action, _make_trajectory

SPEC_ARGS = ("a#1", ActionKind.TEST, Resources(cpu=3, memory_mb=100), Elasticity(1, 4), WorkHints(),
             "task", "tr", None, None, "py", 9.0, 2.0, True, {"x": 1})


def _cases():
    spec = ActionSpec(*SPEC_ARGS)
    act = SimAction(ActionKind.CODE, 0.5, Resources(cpu=1), None, WorkHints(), None, None, "python",
                    10.0, 1.0, 0.57, False)
    return [
        (build.make_spec(*SPEC_ARGS), spec),
        (build.make_arrived(1.5, spec), E.ActionArrived(1.5, spec)),
        (build.make_started(1.5, "a", "n0", 0.25), E.ActionStarted(1.5, "a", "n0", 0.25)),
        (build.make_finished(2.0, "a", Status.FAILED, {"exit_code": 1}, "", 0.5),
         E.ActionFinished(2.0, "a", Status.FAILED, {"exit_code": 1}, "", 0.5)),
        (build.make_warm_report(2.5, "cpu-0", "python", 3), E.WarmPoolReport(2.5, "cpu-0", "python", 3)),
        (_make_action(*(getattr(act, f.name) for f in dataclasses.fields(act))), act),
        (_make_trajectory("t", "task", ((1.0, act),), 0.0, {}, 2),
         Trajectory("t", "task", ((1.0, act),), 0.0, {}, 2)),
    ]


@pytest.mark.parametrize("fast,ref", _cases(), ids=lambda x: type(x).__name__)
def test_fast_built_objects_are_the_dataclasses_built_normally(fast, ref):
    assert type(fast) is type(ref)
    assert fast == ref and repr(fast) == repr(ref)
    try:
        h = hash(ref)
    except TypeError:  # a dict field: neither hashes
        with pytest.raises(TypeError):
            hash(fast)
    else:
        assert hash(fast) == h
    assert pickle.loads(pickle.dumps(fast)) == ref
    name = dataclasses.fields(fast)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, name, getattr(fast, name))  # frozen, like the original
    assert not hasattr(fast, "__dict__")  # slotted, like the original


def test_post_init_runs_and_validates():
    # ActionSpec.__post_init__ sets the elastic dimension of the demand to elasticity.min
    assert build.make_spec(*SPEC_ARGS).demand == Resources(cpu=1, memory_mb=100)
    bad = ("", *SPEC_ARGS[1:])
    with pytest.raises(ValueError, match="non-empty"):
        build.make_spec(*bad)


def test_refuses_what_it_cannot_build():
    @dataclasses.dataclass
    class Plain:
        x: int

    with pytest.raises(TypeError, match="slotted"):
        build.fast_constructor(Plain)
