"""SandboxFusion's own models, for the tests that check our answers against the peer's schema
(issue 43): copied from its published source, bytedance/SandboxFusion at 469de08
(sandbox/server/sandbox_api.py: RunCodeRequest, RunStatus, RunCodeResponse, RunJupyterResponse;
sandbox/runners/types.py: CommandRunStatus, CommandRunResult, CodeRunArgs, RunJupyterRequest,
CellRunResult, Language), which its SDK's models and docs/src/openapi.json match. One copy, used
by tests/managers/cpu/test_sandboxfusion_wire.py and tests/api/test_translate_values.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

# ---- the peer's models, verbatim (types spelled in today's syntax) -----------------------------

PeerLanguage = Literal[
    'python', 'cpp', 'nodejs', 'go', 'go_test', 'java', 'php', 'csharp', 'bash', 'typescript',
    'sql', 'rust', 'cuda', 'lua', 'R', 'perl', 'D_ut', 'ruby', 'scala', 'julia', 'pytest', 'junit',
    'kotlin_script', 'jest', 'verilog', 'python_gpu', 'lean', 'swift', 'racket']


class PeerCommandRunStatus(str, Enum):  # noqa: UP042  (as the peer writes it)
    Finished = 'Finished'
    Error = 'Error'
    TimeLimitExceeded = 'TimeLimitExceeded'


class PeerCommandRunResult(BaseModel):
    status: PeerCommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class PeerRunCodeRequest(BaseModel):
    compile_timeout: float = Field(10)
    run_timeout: float = Field(10)
    memory_limit_MB: int = Field(-1)
    code: str = Field(...)
    stdin: str | None = Field(None)
    language: PeerLanguage = Field(...)
    files: dict[str, str | None] = Field({})
    fetch_files: list[str] = Field([])


class PeerRunStatus(str, Enum):  # noqa: UP042
    Success = 'Success'
    Failed = 'Failed'
    SandboxError = 'SandboxError'


class PeerRunCodeResponse(BaseModel):
    status: PeerRunStatus
    message: str
    compile_result: PeerCommandRunResult | None = None
    run_result: PeerCommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


class PeerRunJupyterRequest(BaseModel):
    cells: list[str] = Field(...)
    cell_timeout: float = Field(0)
    total_timeout: float = Field(45)
    memory_limit_MB: int = Field(-1)
    kernel: Literal['python3'] = 'python3'
    files: dict[str, str] = Field({})
    fetch_files: list[str] = Field([])


class PeerCellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    error: list[dict[str, Any]]


class PeerRunJupyterResponse(BaseModel):
    status: PeerRunStatus
    message: str
    driver: PeerCommandRunResult | None = None
    cells: list[PeerCellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}
