"""`core/_native.py`'s choice of form, in process, with exact values (issue 43 item 2: mutation
testing). `select` runs once when `arl_tangram.core` is imported; here it is called again on a
fake package directory (`HERE`) holding empty stand-ins for the extensions, with `MODE` reset
and `sys.meta_path` restored afterwards, so that each branch's exact `MODE`, warning and finder
are seen by the process mutmut watches (tests/core/test_native.py checks the real import in
child processes)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import sys
import warnings
from pathlib import Path

import pytest

from arl_tangram.core import _native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake core directory: `select` and `_extension` look there; `MODE` unknown again."""
    monkeypatch.setattr(_native, "HERE", tmp_path)
    monkeypatch.setattr(_native, "MODE", "unknown")
    monkeypatch.setattr(
        sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _native._SourceFinder)]
    )
    # (its defaults were bound to the real directory when it was defined)
    real = _native.stale_sources

    def stale_here(here: Path = tmp_path, names: tuple[str, ...] = _native.COMPILED) -> list[str]:
        return real(here, names)

    monkeypatch.setattr(_native, "stale_sources", stale_here)
    monkeypatch.delenv("ARL_TANGRAM_PURE", raising=False)
    for n in _native.COMPILED:
        (tmp_path / f"{n}.py").write_text(f"NAME = {n!r}\n")
    return tmp_path


def _build(here: Path, names: tuple[str, ...] = _native.COMPILED, manifest: bool = True) -> None:
    for n in names:
        (here / f"{n}{SUFFIX}").write_bytes(b"")
    if manifest:
        (here / _native.MANIFEST).write_text(
            json.dumps(
                {"sources": {n: _native.source_digest(here / f"{n}.py") for n in _native.COMPILED}}
            )
        )


def _finders() -> list[object]:
    return [f for f in sys.meta_path if isinstance(f, _native._SourceFinder)]


def test_the_constants() -> None:
    assert _native.COMPILED == (
        "core",
        "scheduling",
        "placement",
        "records",
        "estimator",
        "nodeindex",
        "fit",
        "elastic",
        "partitioning",
        "modelsched",
        "state",
        "queues",
        "warmpools",
        "sessions",
    )
    assert _native.MANIFEST == "_compiled.json"
    assert _native.PACKAGE == "arl_tangram.core"
    assert Path(_native.__file__).resolve().parent == _native.HERE


def test_source_digest_is_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_bytes(b"X = 1\n")
    assert _native.source_digest(p) == hashlib.sha256(b"X = 1\n").hexdigest()


def test_extension_finds_each_suffix_and_none_without_one(here: Path) -> None:
    assert _native._extension("core") is None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        (here / f"fit{suffix}").write_bytes(b"")
        assert _native._extension("fit") == here / f"fit{suffix}"
        (here / f"fit{suffix}").unlink()
    (here / f"fit{importlib.machinery.EXTENSION_SUFFIXES[-1]}").write_bytes(b"")
    assert _native._extension("fit") == here / f"fit{importlib.machinery.EXTENSION_SUFFIXES[-1]}"
    assert _native._extension("core") is None


def test_stale_sources_looks_at_the_package_by_default() -> None:
    assert _native.stale_sources() == _native.stale_sources(_native.HERE, _native.COMPILED)


def test_stale_sources_records_without_sources(here: Path) -> None:
    assert _native.stale_sources() == list(_native.COMPILED)  # no record: every one
    _build(here, names=())
    assert _native.stale_sources() == []
    (here / "fit.py").write_text("edited\n")
    assert _native.stale_sources() == ["fit"]
    (here / _native.MANIFEST).write_text(json.dumps({"other": {}}))  # KeyError
    assert _native.stale_sources() == list(_native.COMPILED)
    (here / _native.MANIFEST).write_text(json.dumps([1, 2]))  # TypeError
    assert _native.stale_sources() == list(_native.COMPILED)
    (here / _native.MANIFEST).write_text(json.dumps({"sources": {"fit": "0" * 64}}))
    assert _native.stale_sources(here, ("fit", "core")) == ["fit", "core"]


def test_not_compiled_is_pure_without_a_finder(here: Path) -> None:
    assert _native.select() == "pure (not compiled)"
    assert _native.MODE == "pure (not compiled)"
    assert _finders() == []


def test_a_fresh_build_is_compiled_without_a_finder(here: Path) -> None:
    _build(here)
    before = list(sys.meta_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.select() == "compiled"
    assert _native.MODE == "compiled"
    assert sys.meta_path == before
    _native.MODE = "pure (x)"  # decided once: a later call returns what was recorded
    assert _native.select() == "pure (x)"
    assert sys.meta_path == before


@pytest.mark.parametrize("value", ["1", "yes", "00"])
def test_pure_on_request_puts_the_finder_first(
    here: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    _build(here)
    monkeypatch.setenv("ARL_TANGRAM_PURE", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.select() == "pure (ARL_TANGRAM_PURE is set)"
    assert isinstance(sys.meta_path[0], _native._SourceFinder)
    assert len(_finders()) == 1


@pytest.mark.parametrize("value", ["", "0"])
def test_pure_unset_or_zero_is_compiled(
    here: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    _build(here)
    monkeypatch.setenv("ARL_TANGRAM_PURE", value)
    assert _native.select() == "compiled"
    assert _finders() == []


def test_a_stale_build_names_the_edited_files_and_warns(here: Path) -> None:
    _build(here)
    (here / "fit.py").write_text("edited\n")
    (here / "core.py").write_text("edited\n")
    with pytest.warns(RuntimeWarning) as got:
        assert _native.select() == "pure (stale build: core.py, fit.py)"
    assert len(got) == 1
    assert str(got[0].message) == (
        "arl_tangram.core: the compiled core is older than its source (core, fit); running the"
        " pure-Python core, which is slower. Rebuild with `make compile` (or `pip install -e .`);"
        " set ARL_TANGRAM_PURE=1 to choose the pure core quietly."
    )
    assert isinstance(sys.meta_path[0], _native._SourceFinder)
    assert len(_finders()) == 1


def test_a_partial_build_is_stale_in_every_module(here: Path) -> None:
    _build(here, names=_native.COMPILED[:-1])  # one extension missing, the record fresh
    with pytest.warns(RuntimeWarning, match=r"\(core, scheduling, .*, sessions\)"):
        mode = _native.select()
    assert mode == "pure (stale build: " + ", ".join(f"{n}.py" for n in _native.COMPILED) + ")"
    assert isinstance(sys.meta_path[0], _native._SourceFinder)


def test_the_finder_answers_the_compiled_modules_of_the_package_only(here: Path) -> None:
    f = _native._SourceFinder()
    spec = f.find_spec("arl_tangram.core.fit", None)
    assert spec is not None
    assert spec.name == "arl_tangram.core.fit"
    assert spec.origin == str(here / "fit.py")
    assert f.find_spec("arl_tangram.core.cluster", None) is None  # not compiled
    assert f.find_spec("other.fit", None) is None  # another package
    assert f.find_spec("arl_tangram.core.fit.x", None) is None
    assert f.find_spec("fit", None) is None
