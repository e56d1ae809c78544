"""core/actions.py's values (issue 43 item 2: the survivors of `make mutation` on it): the hint
bounds, every kind's and status's value, which kinds use a model and which statuses are finished,
the speedup curve (below one unit proportional, Amdahl's law above), an elasticity's bounds and a
spec's defaults, each refusal with its message (the hints' fields by name, a huge integer
shortened to its digits), a spec's demand set to its elastic minimum, its estimator key, its
allotment clamped to the range, its speed, and a result's completion time."""

from __future__ import annotations

import math

import pytest

from arl_tangram.core import actions
from arl_tangram.core.actions import (
    MAX_HINT_S,
    MAX_HINT_UNITS,
    ActionKind,
    ActionResult,
    ActionSpec,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources

# ---- constants, kinds, statuses ---------------------------------------------------------------


def test_the_hint_bounds() -> None:
    assert MAX_HINT_UNITS == 1_000_000_000_000 and type(MAX_HINT_UNITS) is int
    assert MAX_HINT_S == 1e9 and type(MAX_HINT_S) is float


def test_every_kind_value() -> None:
    assert {k.name: k.value for k in ActionKind} == {
        "CODE": "code",
        "TEST": "test",
        "TOOL": "tool",
        "REWARD": "reward",
        "JUDGE": "judge",
        "CUSTOM": "custom",
        "SEARCH": "search",
        "FETCH": "fetch",
        "HTTP": "http",
        "RETRIEVE": "retrieve",
    }


def test_the_model_kinds() -> None:
    assert {k.value for k in ActionKind if k.uses_model} == {"reward", "judge", "retrieve"}
    assert actions._MODEL_KINDS == (ActionKind.REWARD, ActionKind.JUDGE, ActionKind.RETRIEVE)


def test_every_status_value_and_which_are_finished() -> None:
    assert {s.name: int(s) for s in Status} == {
        "PENDING": 0,
        "QUEUED": 1,
        "STARTING": 2,
        "RUNNING": 3,
        "SUCCEEDED": 10,
        "FAILED": 11,
        "TIMED_OUT": 12,
        "CANCELLED": 13,
        "REJECTED": 14,
        "NODE_LOST": 15,
    }
    finished = {s.name for s in Status if s.is_finished}
    assert finished == {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "REJECTED", "NODE_LOST"}


# ---- speedup ---------------------------------------------------------------------------------


def test_the_speedup_is_serial_by_default() -> None:
    s = Speedup()
    assert s.parallel_fraction == 0.0
    assert s.factor(4.0) == 1.0
    assert s.factor(0.5) == 0.5


def test_the_speedup_curve() -> None:
    s = Speedup(0.5)
    assert s.factor(0.0) == 0.0
    assert s.factor(-1.0) == 0.0
    assert s.factor(0.25) == 0.25
    assert s.factor(1.0) == 1.0
    assert s.factor(1.5) == 1.0 / (0.5 + 0.5 / 1.5)
    assert s.factor(2.0) == 1.0 / 0.75
    assert s.factor(4.0) == 1.0 / 0.625
    assert Speedup(1.0).factor(3.0) == 3.0
    assert Speedup(0.0).factor(3.0) == 1.0
    assert Speedup(0.9).factor(1.5) == 1.0 / (0.1 + 0.9 / 1.5)


@pytest.mark.parametrize("p", [-0.1, 1.1, math.nan])
def test_a_parallel_fraction_outside_0_1_is_refused(p: float) -> None:
    with pytest.raises(ValueError) as e:
        Speedup(p)
    assert str(e.value) == f"parallel_fraction must be in [0, 1], got {p}"


def test_a_parallel_fraction_at_either_end_is_taken() -> None:
    assert Speedup(0.0).parallel_fraction == 0.0
    assert Speedup(1.0).parallel_fraction == 1.0


# ---- elasticity ------------------------------------------------------------------------------


def test_the_elasticity_defaults() -> None:
    e = Elasticity()
    assert (e.min, e.max, e.dim) == (1.0, 1.0, "cpu")
    assert e.speedup == Speedup(0.0)
    assert e.is_elastic is False


def test_elastic_only_when_max_is_above_min() -> None:
    assert Elasticity(1.0, 2.0).is_elastic is True
    assert Elasticity(2.0, 2.0).is_elastic is False
    assert Elasticity(0.5, 0.5).min == 0.5


@pytest.mark.parametrize("m", [0.0, -1.0, math.nan])
def test_a_minimum_not_above_zero_is_refused(m: float) -> None:
    with pytest.raises(ValueError) as e:
        Elasticity(m, 4.0)
    assert str(e.value) == f"elasticity.min must be > 0, got {m}"


@pytest.mark.parametrize("m", [1.0, math.nan])
def test_a_maximum_under_the_minimum_is_refused(m: float) -> None:
    with pytest.raises(ValueError) as e:
        Elasticity(2.0, m)
    assert str(e.value) == f"elasticity.max ({m}) must be >= elasticity.min (2.0)"


# ---- hints ---------------------------------------------------------------------------------


def test_hints_default_to_none() -> None:
    h = WorkHints()
    assert (h.expected_s, h.test_count, h.tokens, h.items, h.prompt_tokens) == (None,) * 5


def test_hints_at_their_bounds_are_taken() -> None:
    h = WorkHints(0.0, 0, 0, 0, 0)
    assert (h.expected_s, h.test_count, h.tokens, h.items, h.prompt_tokens) == (0.0, 0, 0, 0, 0)
    top = 10**12
    h = WorkHints(1e9, top, top, top, top)
    assert (h.expected_s, h.test_count, h.tokens, h.items, h.prompt_tokens) == (
        1e9,
        top,
        top,
        top,
        top,
    )


@pytest.mark.parametrize(
    ("e", "text"), [(-0.5, "-0.5"), (1e9 + 1, "1000000001.0"), (math.nan, "nan")]
)
def test_an_expected_time_out_of_range_is_refused(e: float, text: str) -> None:
    with pytest.raises(InvalidAction) as exc:
        WorkHints(expected_s=e)
    assert exc.value.field == "hints.expected_s"
    assert str(exc.value) == f"hints.expected_s: must be a number in [0, 1e+09], got {text}"


@pytest.mark.parametrize("name", ["test_count", "tokens", "items", "prompt_tokens"])
@pytest.mark.parametrize(
    ("v", "text"),
    [
        (-1, "-1"),
        (10**12 + 1, "1000000000001"),
        (10**30 - 1, repr(10**30 - 1)),
        (10**30, "an integer of 31 digits"),
        (-(10**30), "an integer of 31 digits"),
        (-(10**30) + 1, repr(-(10**30) + 1)),
        (10**40, "an integer of 41 digits"),
        (1.5e12, "1500000000000.0"),
    ],
)
def test_a_count_out_of_range_is_refused(name: str, v: int, text: str) -> None:
    with pytest.raises(InvalidAction) as exc:
        WorkHints(**{name: v})
    assert exc.value.field == f"hints.{name}"
    assert str(exc.value) == f"hints.{name}: must be in [0, 1000000000000], got {text}"


def test_short_text_of_a_value() -> None:
    assert actions._short(10**30) == "an integer of 31 digits"
    assert actions._short(-(10**31)) == "an integer of 32 digits"
    assert actions._short(10**30 - 1) == "9" * 30
    assert actions._short(1e40) == "1e+40"
    assert actions._short("x") == "'x'"


# ---- specs ---------------------------------------------------------------------------------


def test_the_spec_defaults() -> None:
    s = ActionSpec("a")
    assert s.kind is ActionKind.CODE
    assert s.demand.as_dict() == {"cpu": 1.0, "memory_mb": 256.0}
    assert s.elasticity is None
    assert s.hints == WorkHints()
    assert (s.task, s.trajectory, s.session, s.model, s.tag) == ("default", None, None, None, None)
    assert (s.timeout_s, s.weight, s.idempotent) == (60.0, 1.0, True)
    assert dict(s.payload) == {}
    assert (s.tenant, s.siblings) == (None, None)


def test_a_spec_refused_with_its_message() -> None:
    with pytest.raises(ValueError) as e:
        ActionSpec("")
    assert str(e.value) == "action id must be a non-empty string"
    for kind in ("reward", "judge", "retrieve"):
        with pytest.raises(ValueError) as e:
            ActionSpec("a", kind=ActionKind(kind))
        assert str(e.value) == f"action a: kind {kind!r} needs a model name"
        assert ActionSpec("a", kind=ActionKind(kind), model="m").model == "m"
    for kind in ("code", "test", "tool", "custom", "search", "fetch", "http"):
        assert ActionSpec("a", kind=ActionKind(kind)).model is None
    for t in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError) as e:
            ActionSpec("a", timeout_s=t)
        assert str(e.value) == f"action a: timeout_s must be > 0, got {t}"
    for w in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError) as e:
            ActionSpec("a", weight=w)
        assert str(e.value) == f"action a: weight must be > 0 and finite, got {w}"
    assert ActionSpec("a", timeout_s=1e-3, weight=1e-3).weight == 1e-3
    assert ActionSpec("a", weight=1e300).weight == 1e300


def test_an_elastic_spec_demands_its_minimum() -> None:
    el = Elasticity(2.0, 8.0)
    s = ActionSpec("a", demand=Resources(cpu=1, memory_mb=64), elasticity=el)
    assert s.demand.as_dict() == {"cpu": 2.0, "memory_mb": 64.0}
    s = ActionSpec("a", demand=Resources(memory_mb=64), elasticity=el)
    assert s.demand.as_dict() == {"cpu": 2.0, "memory_mb": 64.0}
    s = ActionSpec("a", demand=Resources(cpu=3, memory_mb=64), elasticity=el)
    assert s.demand.as_dict() == {"cpu": 2.0, "memory_mb": 64.0}
    g = ActionSpec("a", demand=Resources(cpu=1, gpu=1), elasticity=Elasticity(2, 4, "gpu"))
    assert g.demand.as_dict() == {"cpu": 1.0, "gpu": 2.0}
    # within 1e-9 the demand is kept as given; exactly 1e-9 away too
    d = Resources(cpu=2e-9)
    s = ActionSpec("a", demand=d, elasticity=Elasticity(1e-9, 1.0))
    assert s.demand is d and s.demand.as_dict() == {"cpu": 2e-9}
    d = Resources(cpu=2 + 5e-10)
    s = ActionSpec("a", demand=d, elasticity=Elasticity(2.0, 4.0))
    assert s.demand is d
    d = Resources(cpu=2)
    assert ActionSpec("a", demand=d, elasticity=Elasticity(2.0, 4.0)).demand is d


def test_the_estimator_key() -> None:
    assert ActionSpec("a").estimator_key == "code"
    assert ActionSpec("a", tag="python").estimator_key == "code:python"
    assert ActionSpec("a", kind=ActionKind.TOOL, tag="").estimator_key == "tool"
    assert ActionSpec("a", kind=ActionKind.CUSTOM, tag="x").estimator_key == "custom:x"


def test_the_allotment_is_clamped_to_the_range() -> None:
    s = ActionSpec("a", demand=Resources(cpu=1, memory_mb=64), elasticity=Elasticity(1.0, 4.0))
    assert s.allotment() is s.demand
    assert s.allotment(None) is s.demand
    assert s.allotment(2.5).as_dict() == {"cpu": 2.5, "memory_mb": 64.0}
    assert s.allotment(0.5).as_dict() == {"cpu": 1.0, "memory_mb": 64.0}
    assert s.allotment(9.0).as_dict() == {"cpu": 4.0, "memory_mb": 64.0}
    assert s.allotment(4.0).as_dict() == {"cpu": 4.0, "memory_mb": 64.0}
    rigid = ActionSpec("r", demand=Resources(cpu=2))
    assert rigid.allotment(3.0) is rigid.demand
    assert rigid.allotment() is rigid.demand


def test_the_speed_of_a_rigid_action() -> None:
    s = ActionSpec("a", demand=Resources(cpu=2, memory_mb=64))
    assert s.speed(Resources(cpu=2)) == 1.0
    assert s.speed(Resources(cpu=3)) == 1.0
    assert s.speed(Resources(cpu=1)) == 0.5
    assert s.speed(Resources(cpu=0.5)) == 0.25
    assert s.speed(Resources(memory_mb=64)) == 0.0
    assert s.speed({}) == 0.0
    # a demand of one CPU or less slows down the same way
    one = ActionSpec("o", demand=Resources(cpu=1))
    assert one.speed(Resources(cpu=0.5)) == 0.5
    half = ActionSpec("h", demand=Resources(cpu=0.5))
    assert half.speed(Resources(cpu=0.25)) == 0.5
    assert half.speed(Resources(cpu=0.5)) == 1.0
    no_cpu = ActionSpec("g", demand=Resources(gpu=1))
    assert no_cpu.speed({}) == 1.0
    assert no_cpu.speed(Resources(cpu=0.5)) == 1.0


def test_the_speed_of_an_elastic_action() -> None:
    el = Elasticity(1.0, 4.0, speedup=Speedup(0.5))
    s = ActionSpec("a", demand=Resources(cpu=1), elasticity=el)
    assert s.speed(Resources(cpu=2)) == 1.0 / 0.75
    assert s.speed(Resources(cpu=0.5)) == 0.5
    assert s.speed({}) == 0.0
    assert s.speed(Resources(memory_mb=5)) == 0.0


# ---- results -------------------------------------------------------------------------------


def test_a_result_and_its_completion_time() -> None:
    r = ActionResult("a", Status.SUCCEEDED, 10.0)
    assert (r.start_time, r.finish_time, r.node, r.allotment, r.output) == (None,) * 5
    assert (r.reason, r.attempts) == ("", 1)
    assert r.act is None
    done = ActionResult("a", Status.SUCCEEDED, 10.0, 11.0, 12.5)
    assert done.act == 2.5
    assert ActionResult("a", Status.FAILED, 0.0, finish_time=0.0).act == 0.0
