"""The compiled core (mypyc, `core/_native.py`): same decisions as the pure-Python core, chosen
at import, and never run stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import arl_tangram
from arl_tangram.core import FORM, _native

SRC = Path(arl_tangram.__file__).resolve().parent.parent  # src/, where the build put the shared lib
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "golden_streams.py"


def _python(code: str, env: dict[str, str] | None = None, path: Path = SRC) -> str:
    full = {k: v for k, v in os.environ.items() if k != "ARL_TANGRAM_PURE"}
    full.update({"PYTHONPATH": str(path), **(env or {})})
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], env=full, check=True,
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


def _compiled_here() -> bool:
    return all(_native._extension(n) is not None for n in _native.COMPILED)


def test_the_installed_core_is_the_compiled_one() -> None:
    """`make install` compiles the core; a build that silently fell back to pure Python (or
    went stale) would lose the core's speed unnoticed."""
    if os.environ.get("ARL_TANGRAM_COMPILE") == "0" or os.environ.get("ARL_TANGRAM_PURE"):
        pytest.skip("the pure core was asked for")
    assert FORM == "compiled", FORM
    import arl_tangram.core.core as core_module

    assert not core_module.__file__.endswith(".py")


def test_compiled_and_pure_cores_emit_identical_command_streams(tmp_path: Path) -> None:
    """The hashes of every command the core emits on seeded runs (bench_core's steady state
    under every policy, and whole simulated RL steps of two workloads), compiled and pure."""
    if not _compiled_here():
        pytest.skip("no compiled core in this checkout")
    hashes = {}
    for form, pure in (("compiled", "0"), ("pure", "1")):
        record = tmp_path / f"{form}.txt"
        env = {**os.environ, "ARL_TANGRAM_PURE": pure}
        for only in ("bench_core", "tool-math ", "mixed"):
            subprocess.run([sys.executable, str(BENCH), "--record", str(tmp_path / "part.txt"),
                            "--only", only, "--cycles", "3000"], env=env, check=True,
                           capture_output=True, timeout=300)
            with record.open("a") as f:
                f.write((tmp_path / "part.txt").read_text())
        lines = [ln.split()[:3] for ln in record.read_text().splitlines() if ln and ln[0] != "#"]
        hashes[form] = lines
    assert len(hashes["compiled"]) >= 8
    assert hashes["compiled"] == hashes["pure"]


def test_pure_form_on_request() -> None:
    out = _python(
        "import arl_tangram.core as c, arl_tangram.core.core as m, arl_tangram.core.records as r\n"
        "print(c.FORM, m.__file__.endswith('.py'), r.__file__.endswith('.py'))",
        env={"ARL_TANGRAM_PURE": "1"})
    assert "pure (ARL_TANGRAM_PURE is set) True True" in out
    assert "Warning" not in out


def _copy_package(tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(SRC / "arl_tangram", dst / "arl_tangram",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for lib in SRC.glob("arl_tangram_core__mypyc*"):
        shutil.copy2(lib, dst / lib.name)
    return dst


def test_an_edited_source_loads_the_whole_core_from_source_with_a_warning(tmp_path: Path) -> None:
    if not _compiled_here():
        pytest.skip("no compiled core in this checkout")
    src = _copy_package(tmp_path)
    probe = ("import arl_tangram.core as c, arl_tangram.core.core as m,"
             " arl_tangram.core.records as r\nprint('FORM', c.FORM, m.__file__.endswith('.py'),"
             " r.__file__.endswith('.py'))\n"
             "from arl_tangram.core.cluster import ClusterSpec, NodeSpec\n"
             "from arl_tangram.core.resources import Resources\n"
             "core = c.Core(ClusterSpec((NodeSpec('n0', Resources(cpu=2, memory_mb=1024)),)))\n"
             "print('EDITED', getattr(m, 'EDITED', False))")
    assert "FORM compiled False False" in _python(probe, path=src)  # the copy is a valid build

    placement = src / "arl_tangram" / "core" / "placement.py"
    placement.write_text(placement.read_text() + "\nEDITED = True\n")
    core_py = src / "arl_tangram" / "core" / "core.py"
    core_py.write_text(core_py.read_text() + "\nEDITED = True\n")
    out = _python(probe, path=src)
    assert "FORM pure (stale build: core.py, placement.py) True True" in out
    assert "EDITED True" in out  # the edit runs, not the old compiled code
    assert "RuntimeWarning" in out and "make compile" in out


def test_stale_sources(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text(f"X = {name!r}\n")
    assert _native.stale_sources(tmp_path, ("a", "b")) == ["a", "b"]  # no record: all stale
    (tmp_path / _native.MANIFEST).write_text(json.dumps({"sources": {
        n: _native.source_digest(tmp_path / f"{n}.py") for n in ("a", "b")}}))
    assert _native.stale_sources(tmp_path, ("a", "b")) == []
    (tmp_path / "b.py").write_text("X = 'edited'\n")
    assert _native.stale_sources(tmp_path, ("a", "b")) == ["b"]
    (tmp_path / _native.MANIFEST).write_text("{not json")
    assert _native.stale_sources(tmp_path, ("a", "b")) == ["a", "b"]
