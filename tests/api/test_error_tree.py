"""Every error we raise is a TangramError (core/errors.py draws the tree), and deriving from it
changed no HTTP status: api/app.py's table is looked up along the MRO, so a class gets the
status of its own entry or of its nearest base with one, else none (a 500, or its route's own)."""

from __future__ import annotations

import json

import pytest

from arl_tangram.api.app import error_response
from arl_tangram.api.middleware import BodyTooLarge
from arl_tangram.api.service import Shed
from arl_tangram.core import errors
from arl_tangram.core.errors import (
    BrokenError,
    ClosedError,
    ImageError,
    ImageInUse,
    ImagesUnsupported,
    InvalidAction,
    IsolationUnavailable,
    SpecError,
    TangramError,
)
from arl_tangram.managers.api import ProviderConfigError, RequestError
from arl_tangram.managers.cpu.images.layers import LayerError
from arl_tangram.managers.retrieval.index import RetrievalIndexError
from arl_tangram.runtime.engine import Overloaded, UnknownAction

CASES: list[tuple[Exception, int | None]] = [
    (BodyTooLarge(4096), 413),
    (InvalidAction("payload.code", "is required"), 400),
    (UnknownAction("abc"), 404),
    (Overloaded("full"), 503),
    (Shed("late"), 504),
    (ClosedError("closed"), 503),
    (BrokenError("broke"), 502),
    (IsolationUnavailable("no seccomp"), 502),
    # no entry: a 500 where they escape; the image routes answer them themselves (400/404/409/501)
    (ImageError("bad archive"), None),
    (ImageInUse("in use"), None),
    (LayerError("no disk layers"), None),
    (ImagesUnsupported("no cache"), None),
    (SpecError("f.yaml", 3, "nodes", "bad"), None),
    (RequestError("query", "must be a non-empty string"), 400),  # (an InvalidAction)
    (ProviderConfigError("providers[0].name", "bad"), None),  # (a SpecError at load)
    (RetrievalIndexError("line 3: contents", "bad"), None),  # (tangram index build: exit 2)
]


@pytest.mark.parametrize(("exc", "status"), CASES, ids=lambda v: type(v).__name__)
def test_status_of_each_error_is_unchanged(exc: Exception, status: int | None) -> None:
    assert isinstance(exc, TangramError)
    resp = error_response(exc)
    if status is None:
        assert resp is None
        return
    assert resp is not None and resp.status_code == status
    assert "detail" in json.loads(bytes(resp.body))


def test_the_tree_in_core_errors_names_every_error() -> None:
    doc = errors.__doc__ or ""
    for exc, _ in CASES:
        assert type(exc).__name__ in doc, type(exc).__name__
