"""core/build.py's values (issue 43 item 2: the survivors of `make mutation` on it).

`fast_constructor` runs at import for the module's own constructors, before a mutant is chosen,
so these tests call it at test time: on the core's own dataclasses (the object it makes equals
the dataclass's, is of that class, frozen, `__post_init__` run) and on small slotted dataclasses
made here (trailing plain defaults that may be left out, one or two or all fields defaulted, a
default factory, a class without `__post_init__`), its refusals word for word (not a dataclass,
not slotted, a field named `_twin_...` or after a keyword), the name of what it returns; and
`make_finished` with every field distinct, `cpu_s` left out."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.core.actions import ActionResult, ActionSpec, Status
from arl_tangram.core.build import fast_constructor, make_finished
from arl_tangram.core.commands import Deliver, EvictSession, StartAction
from arl_tangram.core.events import ActionFinished, ActionStarted, WarmPoolReport
from arl_tangram.core.resources import Resources


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    assert a == b
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        assert getattr(a, f.name) is getattr(b, f.name) or getattr(a, f.name) == getattr(b, f.name)


@dataclasses.dataclass(frozen=True, slots=True)
class Two:
    a: int
    b: str


@dataclasses.dataclass(frozen=True, slots=True)
class Tail:
    a: int
    b: list = dataclasses.field(default_factory=list)
    c: int = 7
    d: str = "d"


@dataclasses.dataclass(frozen=True, slots=True)
class AllDefault:
    x: int = 1
    y: int = 2
    z: int = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    n: int
    seen: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")
        self.seen.append(self.n)


# ---- the core's own classes -------------------------------------------------------------------


def test_start_and_deliver_equal_the_dataclass() -> None:
    spec = ActionSpec("a1")
    make = fast_constructor(StartAction)
    got = make(spec, "n1", Resources(cpu=2), False, "why")
    _same(got, StartAction(spec, "n1", Resources(cpu=2), False, "why"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.node = "n2"  # type: ignore[misc]
    # the trailing defaults left out
    _same(make(spec, "n1", Resources(cpu=2)), StartAction(spec, "n1", Resources(cpu=2)))
    assert make(spec, "n1", Resources(cpu=2)).warm is True
    assert make.__name__ == "make_StartAction" and make.__qualname__ == "make_StartAction"
    r = ActionResult("a1", Status.SUCCEEDED, 1.0)
    _same(fast_constructor(Deliver)(r), Deliver(r))
    _same(fast_constructor(ActionResult)("a1", Status.SUCCEEDED, 1.0), r)


def test_a_subclass_of_a_frozen_dataclass() -> None:
    make = fast_constructor(EvictSession)
    got = make("s1", "n1", "memory")
    _same(got, EvictSession("s1", "n1", "memory"))
    assert (got.session_id, got.node, got.reason, got.cause) == ("s1", "n1", "memory", "")


def test_events_equal_the_dataclass() -> None:
    _same(fast_constructor(ActionStarted)(1.5, "a", "n", 0.25), ActionStarted(1.5, "a", "n", 0.25))
    _same(fast_constructor(ActionStarted)(1.5, "a", "n"), ActionStarted(1.5, "a", "n"))
    _same(fast_constructor(WarmPoolReport)(2.0, "n", "py", 3), WarmPoolReport(2.0, "n", "py", 3))
    fin = fast_constructor(ActionFinished)
    _same(fin(3.0, "a"), ActionFinished(3.0, "a"))
    assert fin(3.0, "a").status is Status.SUCCEEDED


def test_an_action_spec_runs_its_post_init() -> None:
    make = fast_constructor(ActionSpec)
    spec = ActionSpec("a1", trajectory="t", tenant="x", siblings="g")
    fields = [getattr(spec, f.name) for f in dataclasses.fields(ActionSpec)]
    _same(make(*fields), spec)
    _same(make(*fields[:-2]), ActionSpec("a1", trajectory="t"))
    bad = list(fields)
    bad[10] = 0.0  # timeout_s
    with pytest.raises(ValueError, match=r"^action a1: timeout_s must be > 0, got 0.0$"):
        make(*bad)


# ---- small classes ----------------------------------------------------------------------------


def test_every_field_set_in_order() -> None:
    make = fast_constructor(Two)
    got = make(5, "five")
    _same(got, Two(5, "five"))
    assert (got.a, got.b) == (5, "five")
    assert make.__name__ == "make_Two"
    with pytest.raises(TypeError):
        make(5)  # no default


def test_trailing_plain_defaults_may_be_left_out_a_factory_may_not() -> None:
    make = fast_constructor(Tail)
    got = make(1, [9])
    _same(got, Tail(1, [9]))
    assert (got.c, got.d) == (7, "d")
    assert make(1, [9], 8).c == 8
    assert make(1, [9], 8, "e").d == "e"
    with pytest.raises(TypeError):
        make(1)  # the factory's field is not defaulted


def test_all_fields_defaulted() -> None:
    make = fast_constructor(AllDefault)
    _same(make(), AllDefault())
    assert (make().x, make().y, make().z) == (1, 2, 3)
    assert make(9).x == 9 and make(9).y == 2


def test_post_init_runs_once_after_every_field_is_set() -> None:
    make = fast_constructor(Checked)
    seen: list[int] = []
    got = make(4, seen)
    assert seen == [4]
    assert type(got) is Checked and got.n == 4
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1$"):
        make(-1, [])


# ---- refusals ---------------------------------------------------------------------------------


def test_not_a_slotted_dataclass() -> None:
    @dataclasses.dataclass(frozen=True)
    class Loose:
        a: int

    class Slotted:
        __slots__ = ("a",)

    for cls in (Loose, Slotted):
        with pytest.raises(TypeError) as got:
            fast_constructor(cls)
        assert str(got.value) == f"fast_constructor: {cls.__name__} is not a slotted dataclass"


def test_a_field_name_it_cannot_bind() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Twin:
        a: int
        _twin_x: int

    kw = dataclasses.dataclass(init=False, repr=False, eq=False, slots=True)(
        type("Kw", (), {"__annotations__": {"a": int, "class": int}})
    )
    for cls in (Twin, kw):
        with pytest.raises(TypeError) as got:
            fast_constructor(cls)
        assert str(got.value) == (
            f"fast_constructor: {cls.__name__} has a field name it cannot bind"
        )


# ---- make_finished ----------------------------------------------------------------------------


def test_make_finished_every_field() -> None:
    got = make_finished(4.0, "a9", Status.FAILED, {"o": 1}, "boom", 1.5, 0.75)
    _same(got, ActionFinished(4.0, "a9", Status.FAILED, {"o": 1}, "boom", 1.5, 0.75))
    assert (got.time, got.action_id, got.status, got.output, got.reason, got.run_s, got.cpu_s) == (
        4.0,
        "a9",
        Status.FAILED,
        {"o": 1},
        "boom",
        1.5,
        0.75,
    )
    short = make_finished(4.0, "a9", Status.SUCCEEDED, None, "", 2.0)
    assert (short.run_s, short.cpu_s) == (2.0, None)
