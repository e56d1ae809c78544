"""ARL-Tangram: action-level external-resource management for agentic RL."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import arl_tangram.core` stays free of httpx and the API stack.
    if name in ("Client", "AsyncClient"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'arl_tangram' has no attribute {name!r}")
