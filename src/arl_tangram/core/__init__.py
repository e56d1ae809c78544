"""The pure, sans-I/O core: action and resource model, scheduler policies, estimator.

``Core.handle(event) -> list[command]`` is the whole interface; see `core.core`. `FORM` says
whether the hot modules run compiled (mypyc) or as pure Python; see `_native`.
"""

# ruff: noqa: E402
from ._native import select as _select

FORM = _select()  # before any compiled module is imported (hence the imports below it)

from .config import POLICIES, CoreConfig
from .core import Core
from .estimator import DurationEstimator
from .view import CoreView, InstanceView, NodeView, SessionView

__all__ = [
    "FORM",
    "POLICIES",
    "Core",
    "CoreConfig",
    "CoreView",
    "DurationEstimator",
    "InstanceView",
    "NodeView",
    "SessionView",
]
