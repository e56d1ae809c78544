"""The request schemas' bounds at their edges (issue 35, H2, L3; docs/api.md "Bounds"): each
number is accepted at its bound and refused just past it, naming the field; NaN and infinities
refused; session ids and file names that could name another path refused, and the ones at the
limits accepted. Pure pydantic, no server: the quick half of `make mutation` on
api/schemas.py (tests/api/test_edge_bounds.py runs the same through a real server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from arl_tangram.api.jupyter import RunJupyterRequest
from arl_tangram.api.schemas import (
    ActionIn,
    ActionsIn,
    RunCodeRequest,
    SessionIn,
    check_session_id,
    file_name_problem,
)
from arl_tangram.core.errors import InvalidAction


def _refused(model: type[BaseModel], body: dict[str, Any]) -> list[str]:
    """The fields ``body`` is refused for ([] when it validates)."""
    return list(_why(model, body))


def _why(model: type[BaseModel], body: dict[str, Any]) -> dict[str, str]:
    """field -> pydantic's message, for each field ``body`` is refused for."""
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return {".".join(str(p) for p in e["loc"]): e["msg"] for e in exc.errors()}
    return {}


CODE = {"kind": "code", "payload": {}}

# (model, base body, field path, value at the bound (accepted), value just past it (refused))
EDGES: list[tuple[type[BaseModel], dict[str, Any], str, Any, Any]] = [
    (ActionIn, CODE, "hints.tokens", 10**9, 10**9 + 1),
    (ActionIn, CODE, "hints.tokens", 0, -1),
    (ActionIn, CODE, "hints.test_count", 10**6, 10**6 + 1),
    (ActionIn, CODE, "hints.test_count", 0, -1),
    (ActionIn, CODE, "hints.items", 10**6, 10**6 + 1),
    (ActionIn, CODE, "hints.items", 0, -1),
    (ActionIn, CODE, "hints.expected_s", 1e6, 1e6 * (1 + 1e-12)),
    (ActionIn, CODE, "hints.expected_s", 0.0, -1e-9),
    (ActionIn, CODE, "weight", 1e6, 1e6 * (1 + 1e-12)),
    (ActionIn, CODE, "weight", 1e-300, 0.0),
    (ActionIn, CODE, "timeout_s", 3600, 3600.001),
    (ActionIn, CODE, "timeout_s", 1e-9, 0),
    (ActionIn, CODE, "demand.cpu", 1e9, 1e9 * (1 + 1e-12)),
    (ActionIn, CODE, "demand.cpu", 0.0, -1e-9),
    (ActionIn, CODE, "elasticity.min", 1e9, 1e9 * (1 + 1e-12)),
    (ActionIn, CODE, "elasticity.min", 1e-9, 0.0),
    (ActionIn, CODE, "elasticity.max", 1e9, 1e9 * (1 + 1e-12)),
    (ActionIn, CODE, "elasticity.max", 1e-9, 0.0),
    (ActionsIn, {"actions": [CODE]}, "wait_s", 86400, 86400.001),
    (ActionsIn, {"actions": [CODE]}, "wait_s", 1e-9, 0),
    (SessionIn, {}, "ttl_s", 86400, 86400.001),
    (SessionIn, {}, "layer_mb", 4, 3),
    (SessionIn, {}, "layer_mb", 1 << 20, (1 << 20) + 1),
    (SessionIn, {}, "demand.memory_mb", 1e9, 1e9 * (1 + 1e-12)),
    (SessionIn, {}, "demand.memory_mb", 0.0, -1e-9),
    (RunCodeRequest, {"code": ""}, "memory_limit_MB", 1 << 20, (1 << 20) + 1),
    (RunCodeRequest, {"code": ""}, "memory_limit_MB", -1, -2),
]


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    *heads, last = path.split(".")
    d = out
    for h in heads:
        d = d.setdefault(h, {})
    if path.startswith("elasticity.") and "elasticity" not in body:
        d.update({"min": 1e-9, "max": 1e9})  # (the other end within its range)
    d[last] = value
    return out


@pytest.mark.parametrize(("model", "body", "field", "ok", "bad"), EDGES)
def test_each_number_is_accepted_at_its_bound_and_refused_past_it(
        model: type[BaseModel], body: dict[str, Any], field: str, ok: Any, bad: Any) -> None:
    assert _refused(model, _with(body, field, ok)) == []
    assert _refused(model, _with(body, field, bad)) == [field]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(("model", "body", "field"), [
    (ActionIn, CODE, "hints.expected_s"), (ActionIn, CODE, "weight"),
    (ActionIn, CODE, "demand.cpu"), (ActionIn, CODE, "elasticity.max"),
    (ActionsIn, {"actions": [CODE]}, "wait_s"), (SessionIn, {}, "ttl_s"),
    (SessionIn, {}, "demand.cpu"), (RunCodeRequest, {"code": ""}, "run_timeout"),
])
def test_nan_and_infinities_are_refused(model: type[BaseModel], body: dict[str, Any],
                                        field: str, value: float) -> None:
    assert _refused(model, _with(body, field, value)) == [field]


def test_a_boolean_is_not_a_number() -> None:
    why = "Value error, must be a number, not a boolean"
    assert _why(ActionIn, {**CODE, "hints": {"tokens": True}}) == {"hints.tokens": why}
    assert _why(SessionIn, {"demand": {"cpu": True}}) == {"demand.cpu": why}


@pytest.mark.parametrize(("sid", "why"), [
    ("\x00", "must not contain control characters (got '\\x00')"),
    ("a\x1fb", "must not contain control characters (got '\\x1f')"),
    ("a\x7fb", "must not contain control characters (got '\\x7f')"),
    ("a\x85b", "must not contain control characters (got '\\x85')"),
    ("a\x9fb", "must not contain control characters (got '\\x9f')"),
    ("x\n", "must not contain control characters (got '\\n')"),
    ("a/b", "must not contain '/' or '\\'"),
    ("a\\b", "must not contain '/' or '\\'"),
    ("..", "must not be '.' or contain '..'"),
    ("a..b", "must not be '.' or contain '..'"),
    (".", "must not be '.' or contain '..'"),
    ("", None), ("x" * 201, None),  # (pydantic's length bounds)
])
def test_session_ids_that_could_name_a_path_are_refused(sid: str, why: str | None) -> None:
    assert _refused(SessionIn, {"session_id": sid}) == ["session_id"]
    assert _refused(ActionIn, {**CODE, "session": sid}) == ["session"]
    if why is not None:
        assert _why(SessionIn, {"session_id": sid}) == {"session_id": f"Value error, {why}"}
        with pytest.raises(InvalidAction) as got:
            check_session_id(sid)
        assert got.value.field == "session_id"
        assert str(got.value) == f"session_id: {why}"


@pytest.mark.parametrize("sid", ["s-0123abcd", "a.b", "x" * 200, " \u00a0ü", "a:b@c+d", "A_B-c"])
def test_plain_session_ids_pass(sid: str) -> None:
    assert _refused(SessionIn, {"session_id": sid}) == []
    assert check_session_id(sid) == sid


@pytest.mark.parametrize(("name", "why"), [
    ("a\x00b", "a file name must not contain NUL"),
    ("x" * 4097, "a file name must be at most 4096 bytes, got 4097"),
    ("é" * 2049, "a file name must be at most 4096 bytes, got 4098"),  # (bytes, not chars)
    ("d/" + "y" * 256, "each part of a file name must be at most 255 bytes, got one of 256"),
    ("ü" * 128, "each part of a file name must be at most 255 bytes, got one of 256"),
    ("\ud800", "a file name must be valid UTF-8 (no lone surrogates)"),
])
def test_file_names_a_sandbox_cannot_make_are_refused(name: str, why: str) -> None:
    assert file_name_problem(name) == why
    for model, body in ((RunCodeRequest, {"code": ""}), (RunJupyterRequest, {"cells": []})):
        assert _why(model, {**body, "fetch_files": [name]}) == {
            "fetch_files.0": f"Value error, {why}"}
        got = _refused(model, {**body, "files": {name: ""}})
        assert len(got) == 1 and got[0].startswith("files.") and got[0].endswith(".[key]")


@pytest.mark.parametrize("name", ["f" * 255, "/".join(["d" * 255] * 16), "a/b.txt", "ü" * 127,
                                  "/".join(["d" * 255] * 15 + ["e" * 200, "f" * 55])])  # 4096
def test_file_names_at_the_limits_pass(name: str) -> None:
    assert len(name.encode()) <= 4096 and max(len(p) for p in name.encode().split(b"/")) <= 255
    assert file_name_problem(name) is None
    assert _refused(RunCodeRequest, {"code": "", "files": {name: ""}, "fetch_files": [name]}) == []
