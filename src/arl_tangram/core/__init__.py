"""The pure, sans-I/O core: action and resource model, scheduler policies, estimator.

``Core.handle(event) -> list[command]`` is the whole interface; see `core.core`.
"""

from .config import POLICIES, CoreConfig
from .core import Core
from .estimator import DurationEstimator
from .view import CoreView, InstanceView, NodeView, SessionView

__all__ = [
    "POLICIES",
    "Core",
    "CoreConfig",
    "CoreView",
    "DurationEstimator",
    "InstanceView",
    "NodeView",
    "SessionView",
]
