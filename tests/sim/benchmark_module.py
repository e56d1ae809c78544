"""Load a program of `benchmarks/` (not a package) as a module, for the tests that check it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, imported afresh."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (a dataclass there looks its module up while it is defined)
    spec.loader.exec_module(mod)
    return mod
