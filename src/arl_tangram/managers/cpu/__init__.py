"""CPU resource manager: isolated, fast code execution with warm pools and sessions.

The runtime calls `CpuManager` (start, run, cancel, resize, sessions, warm pool); results are
`RunResult`s in SandboxFusion's RunCodeResponse shape. See docs/sandbox.md.

Invariant: importing this package imports nothing else of it; the public names load on first use.
That keeps the fork server (``python -m arl_tangram.managers.cpu.zygote.server``) small: every sandbox is
a copy-on-write fork of it, so each megabyte it does not hold is page-table and page-copy work
saved on every action.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import CpuManagerConfig
    from .host.manager import POOL_KEY, CpuManager
    from .host.result import CaseResult, RunResult, StageResult

__all__ = ["POOL_KEY", "CaseResult", "CpuManager", "CpuManagerConfig", "RunResult", "StageResult"]
_WHERE = {"CpuManagerConfig": "config", "CpuManager": "host.manager", "POOL_KEY": "host.manager",
          "RunResult": "host.result", "StageResult": "host.result", "CaseResult": "host.result"}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
