"""Build hook: compiles the scheduler core's hot modules with mypyc, and the CPU sandboxes'
set-up path (``managers/cpu/zygote/_fastpath.c``, plain C against the Python API).

Everything else about the package is in ``pyproject.toml``. Which modules, and how the package
chooses between the compiled and the pure-Python core at import: ``src/arl_tangram/core/_native.py``.
``ARL_TANGRAM_COMPILE=0`` builds the pure-Python package; a failed compilation (no C compiler)
does too, with a warning -- the core then runs as plain Python, slower, with the same results.
Likewise without ``_fastpath`` the sandboxes make the same system calls from Python (more page
faults per sandbox, same isolation; docs/sandbox.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE = Path(__file__).resolve().parent / "src" / "arl_tangram" / "core"
FASTPATH = "arl_tangram.managers.cpu.zygote._fastpath"

_spec = importlib.util.spec_from_file_location("_arl_tangram_native", CORE / "_native.py")
assert _spec is not None and _spec.loader is not None
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)


def _forget_build() -> None:
    """No record: an extension left from an earlier build then counts as stale (not loaded)."""
    (CORE / native.MANIFEST).unlink(missing_ok=True)


class OptionalBuildExt(build_ext):
    """build_ext that falls back to the pure-Python core when the compilation fails."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name != FASTPATH:
            super().build_extension(ext)
            return
        try:  # (its own failure must not mark the compiled core stale)
            super().build_extension(ext)
        except Exception as e:
            warnings.warn(f"compiling {FASTPATH} failed ({e}); sandboxes set themselves up in"
                          " Python (same isolation, more CPU per action)", stacklevel=1)

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:
            _forget_build()
            warnings.warn(f"compiling the core with mypyc failed ({e}); the pure-Python core"
                          " will run (same results, slower)", stacklevel=1)


def _extensions() -> list:
    if os.environ.get("ARL_TANGRAM_COMPILE", "1") == "0":
        _forget_build()
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _forget_build()
        warnings.warn("mypy (mypyc) is not installed: building the pure-Python core", stacklevel=1)
        return []
    sources = [str(CORE / f"{n}.py") for n in native.COMPILED]
    (CORE / native.MANIFEST).write_text(json.dumps(
        {"sources": {n: native.source_digest(CORE / f"{n}.py") for n in native.COMPILED}},
        indent=1, sort_keys=True) + "\n")
    # mypy follows the core's imports (the core and the standard library: full types make
    # faster code) but not the package's lazy `arl_tangram.client` export, which leads to
    # httpx, FastAPI and torch: minutes of type-checking for nothing.
    with tempfile.TemporaryDirectory() as tmp:  # (mypycify type-checks and writes C right here)
        config = Path(tmp) / "mypyc.ini"
        config.write_text("[mypy]\nignore_missing_imports = True\n"
                          "[mypy-arl_tangram.client,arl_tangram.client.*]\nfollow_imports = skip\n")
        return mypycify(
            ["--config-file", str(config), "--python-version",
             f"{sys.version_info[0]}.{sys.version_info[1]}", *sources],
            opt_level="3",
            group_name="arl_tangram_core",
        )


def _fastpath() -> list[Extension]:
    if os.environ.get("ARL_TANGRAM_COMPILE", "1") == "0":
        return []
    return [Extension(FASTPATH, ["src/arl_tangram/managers/cpu/zygote/_fastpath.c"],
                      extra_compile_args=["-O2"])]


setup(ext_modules=_extensions() + _fastpath(), cmdclass={"build_ext": OptionalBuildExt})
