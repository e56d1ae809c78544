"""core/errors.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
messages and attributes of `SpecError` (with and without a line), `InvalidAction` and
`IllegalTransition` (the last 20 lines of the story), word for word, and the exception tree of
the module's docstring (each class's bases, by hand: module-level declarations mutmut does not
mutate)."""

from __future__ import annotations

from arl_tangram.core import errors as E


def test_spec_error_with_a_line() -> None:
    e = E.SpecError("cluster.yaml", 7, "nodes[0].capacity", "must be a mapping")
    assert str(e) == "cluster.yaml:7: nodes[0].capacity: must be a mapping"
    assert (e.file, e.line, e.field, e.message) == (
        "cluster.yaml",
        7,
        "nodes[0].capacity",
        "must be a mapping",
    )
    assert e.args == ("cluster.yaml:7: nodes[0].capacity: must be a mapping",)


def test_spec_error_without_a_line_names_the_file_only() -> None:
    e = E.SpecError("trace.jsonl", None, "id", "missing")
    assert str(e) == "trace.jsonl: id: missing"
    assert (e.file, e.line, e.field, e.message) == ("trace.jsonl", None, "id", "missing")
    # line 0 is a line
    assert str(E.SpecError("f", 0, "x", "y")) == "f:0: x: y"


def test_invalid_action() -> None:
    e = E.InvalidAction("demand.cpu", "must be > 0")
    assert str(e) == "demand.cpu: must be > 0"
    assert e.field == "demand.cpu"
    assert e.args == ("demand.cpu: must be > 0",)


def test_illegal_transition_shows_the_last_20_lines_of_the_story() -> None:
    story = [f"line {i}" for i in range(25)]
    e = E.IllegalTransition("a7", "QUEUED", "FINISHED", story)
    lines = "\n  ".join(f"line {i}" for i in range(5, 25))
    assert str(e) == f"action a7: illegal transition QUEUED -> FINISHED; story:\n  {lines}"
    assert e.action_id == "a7"
    assert e.story is story
    short = E.IllegalTransition("b", 1, 2, ["only", "two"])
    assert str(short) == "action b: illegal transition 1 -> 2; story:\n  only\n  two"
    assert str(E.IllegalTransition("c", "x", "y", [])) == (
        "action c: illegal transition x -> y; story:\n  "
    )


def test_the_exception_tree() -> None:
    assert E.TangramError.__bases__ == (Exception,)
    assert E.SpecError.__bases__ == (E.TangramError, ValueError)
    assert E.InvalidAction.__bases__ == (E.TangramError, ValueError)
    assert E.IllegalTransition.__bases__ == (E.TangramError, RuntimeError)
    assert E.ClosedError.__bases__ == (E.TangramError, RuntimeError)
    assert E.BrokenError.__bases__ == (E.TangramError, RuntimeError)
    assert E.IsolationUnavailable.__bases__ == (E.BrokenError,)
    assert E.ImageError.__bases__ == (E.TangramError,)
    assert E.ImageInUse.__bases__ == (E.ImageError,)
    assert E.ImageTooLarge.__bases__ == (E.ImageError,)
    assert E.ImagesUnsupported.__bases__ == (E.TangramError,)
    assert str(E.ClosedError("engine closed")) == "engine closed"
