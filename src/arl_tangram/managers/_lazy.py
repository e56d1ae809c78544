"""A package face whose public names load on first use (PEP 562): importing the package imports
none of its modules. `cpu/` needs it (the fork server imports the package, and every sandbox is
a fork of it: what it does not hold is saved on every action), `gpu/` too (its config imports
without torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_face(package: str, where: Mapping[str, str],
              names: Sequence[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a public name is loaded from its
    module (``where[name]``, relative to the package, or absolute when it starts with
    ``arl_tangram.``) when first asked for, then kept."""

    def getattr_(name: str) -> Any:
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = mod if mod.startswith("arl_tangram.") else f"{package}.{mod}"
        value = getattr(importlib.import_module(full), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return getattr_, dir_
