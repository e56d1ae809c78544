"""CPU resource manager: isolated, fast code execution with warm pools and sessions.

The runtime calls `CpuManager` (start, run, cancel, resize, sessions, warm pool); results are
`RunResult`s in SandboxFusion's RunCodeResponse shape. See docs/sandbox.md.
"""

from .config import CpuManagerConfig
from .manager import POOL_KEY, CpuManager
from .result import CaseResult, RunResult, StageResult

__all__ = ["POOL_KEY", "CaseResult", "CpuManager", "CpuManagerConfig", "RunResult", "StageResult"]
