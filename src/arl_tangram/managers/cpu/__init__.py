"""CPU resource manager: isolated, fast code execution with warm pools and sessions.

The runtime calls `CpuManager` (start, run, cancel, resize, sessions, warm pool); results are
`RunResult`s in SandboxFusion's RunCodeResponse shape. See docs/sandbox.md.

Invariant: importing this package imports nothing else of it; the public names load on first use.
That keeps the fork server (``python -P -m arl_tangram.managers.cpu.zygote.server``) small: every
sandbox is a copy-on-write fork of it, so each megabyte it does not hold is page-table and
page-copy work saved on every action.

Rooms, one per process (each sub-package's ``__init__`` says what it may import; `make lint`
checks it, docs/architecture.md draws it):
- `host/`: the manager side, in the service process (asyncio): `CpuManager` and what it drives.
- `zygote/`: the fork server (and, copied by fork, every sandbox).
- `sandbox/`: inside a sandbox: its init (PID 1) and the children that run the code.
- `images/`: environment images on the node's disk (service process, worker threads).
- `config.py`, `wire.py`, `_linux.py`: the ground floor every process shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_face

if TYPE_CHECKING:
    from arl_tangram.kinds import CaseResult, RunResult, StageResult

    from .config import CpuManagerConfig
    from .host.manager import POOL_KEY, CpuManager

__all__ = ["POOL_KEY", "CaseResult", "CpuManager", "CpuManagerConfig", "RunResult", "StageResult"]
_WHERE = {"CpuManagerConfig": "config", "CpuManager": "host.manager", "POOL_KEY": "host.manager",
          "RunResult": "arl_tangram.kinds", "StageResult": "arl_tangram.kinds",
          "CaseResult": "arl_tangram.kinds"}

__getattr__, __dir__ = lazy_face(__name__, _WHERE, __all__)
