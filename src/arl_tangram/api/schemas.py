"""Wire schemas of the HTTP API (pydantic), one per request and response body.

Invariant: every request model forbids nothing it does not need to (unknown keys are ignored
the way SandboxFusion's pydantic models ignore them) but validates every field it reads, so a
bad request fails with 422 naming the field before it reaches the engine. SandboxFusion's names,
defaults and enums are kept exactly. A number field takes a JSON number (or a numeric string, as
pydantic's lax mode does), never a boolean (`Num`, `Int`: ``true`` is not 1 s or 1 MB).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    return v


Num = Annotated[float, BeforeValidator(_not_bool)]  # a float field that refuses true/false
Int = Annotated[int, BeforeValidator(_not_bool)]

# SandboxFusion's Language literal (sandbox/runners/types.py).
SF_LANGUAGES = (
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit",
    "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
)
Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit",
    "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
]


class RunStatus(enum.StrEnum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(enum.StrEnum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class RunCodeRequest(BaseModel):
    """SandboxFusion's RunCodeRequest (a missing ``language`` means python)."""

    compile_timeout: Num = Field(10, gt=0, le=3600, description="compile timeout (s)")
    run_timeout: Num = Field(10, gt=0, le=3600, description="run timeout (s)")
    memory_limit_MB: Int = Field(-1, ge=-1, description="memory limit in MB; -1: the default")
    code: str = Field(..., description="the code to run")
    stdin: str | None = Field(None, description="optional string passed on stdin")
    language: Language = Field("python", description="language or execution mode")
    files: dict[str, str | None] = Field(default_factory=dict, description="path -> base64")
    fetch_files: list[str] = Field(default_factory=list, description="paths to return")


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""


class RunCodeResponse(BaseModel):
    """SandboxFusion's RunCodeResponse, plus our optional extras."""

    model_config = ConfigDict(extra="allow")

    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


# ---- native -------------------------------------------------------------------------------------

Kind = Literal["code", "test", "tool", "reward", "judge", "custom"]


class ElasticityIn(BaseModel):
    min: Num = Field(1.0, gt=0)
    max: Num = Field(1.0, gt=0)
    dim: str = "cpu"
    parallel_fraction: Num = Field(0.0, ge=0, le=1)


class HintsIn(BaseModel):
    expected_s: Num | None = Field(None, ge=0)
    test_count: Int | None = Field(None, ge=0)
    tokens: Int | None = Field(None, ge=0)
    items: Int | None = Field(None, ge=0)


class ActionIn(BaseModel):
    """One action of POST /v1/actions. ``models`` (several) fans out one action per model."""

    id: str | None = Field(None, min_length=1, max_length=200)
    kind: Kind = "code"
    payload: dict[str, Any] = Field(default_factory=dict)
    demand: dict[str, Num] | None = None
    elasticity: ElasticityIn | None = None
    hints: HintsIn | None = None
    task: str = Field("default", max_length=200)
    trajectory: str | None = Field(None, max_length=200)
    session: str | None = Field(None, max_length=200)
    model: str | None = Field(None, max_length=200)
    models: list[str] | None = Field(None, min_length=1, max_length=64)
    tag: str | None = Field(None, max_length=200)
    timeout_s: Num = Field(60.0, gt=0, le=3600)
    weight: Num = Field(1.0, gt=0)
    idempotent: bool = True


class ActionsIn(BaseModel):
    """POST /v1/actions body: one action, or ``actions`` for a batch."""

    actions: list[ActionIn] = Field(..., min_length=1)
    wait: bool = False
    wait_s: Num = Field(60.0, gt=0)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)


class ActionOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    status: str
    finished: bool
    submit_time: float | None = None
    start_time: float | None = None
    finish_time: float | None = None
    act: float | None = None
    node: str | None = None
    output: Any = None
    reason: str = ""


class SessionIn(BaseModel):
    session_id: str | None = Field(None, min_length=1, max_length=200)
    demand: dict[str, Num] | None = None
    ttl_s: Num = Field(600.0, gt=0, le=86400)
    node: str | None = None
    image: str | None = Field(None, min_length=1, max_length=128)  # an image on the node
    layer_mb: Int | None = Field(None, gt=0, le=1 << 20)  # its writable layer's size cap


# ---- reward compat ------------------------------------------------------------------------------


class GetRewardIn(BaseModel):
    """OpenRLHF remote reward model: ``{"query": [...]}`` (+ prompts / labels)."""

    query: list[str] = Field(..., min_length=1)
    prompts: list[str] | None = None
    labels: list[str] | None = None
    model: str | list[str] | None = None


class ClassifyIn(BaseModel):
    """vLLM-style /classify."""

    model: str | None = None
    input: str | list[str]
