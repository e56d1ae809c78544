"""Which form of the scheduler core runs: compiled with mypyc, or pure Python.

The modules on the core's hot path (`COMPILED`) are compiled with mypyc when the package is
built (``setup.py``; ``ARL_TANGRAM_COMPILE=0`` skips it, and a machine without a C compiler
gets the pure form with a warning). The ``.py`` files stay the one source: each compiled
extension lies next to its source and Python's import system prefers the extension. The
compiled form runs the same code with the same decisions (``tests/core/test_native.py``
compares the command streams of both), faster: ``benchmarks/bench_core.py`` measures both in
one run (tangram 1.3-1.8x there), ``benchmarks/bench_sim.py`` with ``ARL_TANGRAM_PURE=1`` the
pure one.

The sources are loaded instead of the extensions in two cases:

- ``ARL_TANGRAM_PURE=1`` in the environment: to debug, trace or profile the core line by line;
- a stale build: a source whose hash differs from the one the build recorded
  (``_compiled.json``), as after an edit in an editable checkout. Then *every* compiled module
  is loaded from source -- compiled modules call each other directly, so loading only the
  edited one would leave the others running the old code -- and a warning names the file and
  how to rebuild (``make compile``).

`select` decides once, when `arl_tangram.core` is imported, before any compiled module is.
This module imports nothing of the package, so ``setup.py`` can read `COMPILED` from it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The hot path of `Core.handle`: event handlers, scheduling pass, placement, records, estimator,
# free-capacity index, elastic expansion, partitions, model batching. The frozen dataclasses the
# core exchanges with its callers (actions, events, commands, resources) stay plain Python:
# they are pickled, built by `build.fast_constructor`, and subclassed by users.
COMPILED = (
    "core", "scheduling", "placement", "records", "estimator", "nodeindex", "fit", "elastic",
    "partitioning", "modelsched", "state", "queues", "warmpools", "sessions",
)
MANIFEST = "_compiled.json"  # {"sources": {module: sha256 of its .py}}, written by the build
PACKAGE = __name__.rpartition(".")[0] or "arl_tangram.core"
HERE = Path(__file__).resolve().parent

MODE = "unknown"  # set by `select`: "compiled" or "pure (<why>)"


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extension(name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = HERE / f"{name}{suffix}"
        if p.exists():
            return p
    return None


def stale_sources(here: Path = HERE, names: Sequence[str] = COMPILED) -> list[str]:
    """The compiled modules whose source differs from the build's (all of them when the build
    left no readable record)."""
    try:
        recorded = json.loads((here / MANIFEST).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return list(names)
    return [n for n in names if recorded.get(n) != source_digest(here / f"{n}.py")]


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` sources, ahead of their extensions."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        package, _, leaf = fullname.rpartition(".")
        if package != PACKAGE or leaf not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{leaf}.py")


def select() -> str:
    """Choose the form once (see the module's docstring); returns and records it in `MODE`."""
    global MODE
    if MODE != "unknown":
        return MODE
    built = [n for n in COMPILED if _extension(n) is not None]
    if not built:
        MODE = "pure (not compiled)"
    elif os.environ.get("ARL_TANGRAM_PURE", "") not in ("", "0"):
        MODE = "pure (ARL_TANGRAM_PURE is set)"
    else:
        stale = stale_sources() if len(built) == len(COMPILED) else list(COMPILED)
        if stale:
            MODE = f"pure (stale build: {', '.join(f'{n}.py' for n in stale)})"
            warnings.warn(
                f"arl_tangram.core: the compiled core is older than its source ({', '.join(stale)});"
                " running the pure-Python core, which is slower. Rebuild with `make compile` (or"
                " `pip install -e .`); set ARL_TANGRAM_PURE=1 to choose the pure core quietly.",
                RuntimeWarning, stacklevel=3)
        else:
            MODE = "compiled"
    if MODE != "compiled" and built:
        sys.meta_path.insert(0, _SourceFinder())
    return MODE
