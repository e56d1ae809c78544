"""Wire schemas of the HTTP API (pydantic), one per request and response body.

Invariant: every request model forbids nothing it does not need to (unknown keys are ignored
the way SandboxFusion's pydantic models ignore them) but validates every field it reads, so a
bad request fails with 422 naming the field before it reaches the engine. SandboxFusion's names,
defaults and enums are kept exactly. A number field takes a JSON number (or a numeric string, as
pydantic's lax mode does), never a boolean (`Num`, `Int`: ``true`` is not 1 s or 1 MB).

Every number is bounded (issue 35, H2): finite (no NaN or infinity), and below an upper bound
chosen so that the core can hold it as a float and do arithmetic on it (the bounds are listed in
docs/api.md, "Bounds"); a value past one answers 422 naming the field. Identifiers and file names
that become paths somewhere are refused when they could name another path (`SessionId`,
`FileName`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field

from ..core.errors import InvalidAction
from ..kinds import CodeRequest, CommandRunStatus, RunStatus
from ..managers.cpu.images.layers import MIN_LAYER_MB


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    return v


# a float field that refuses true/false, NaN and infinities
Num = Annotated[float, AllowInfNan(False), BeforeValidator(_not_bool)]
Int = Annotated[int, BeforeValidator(_not_bool)]

# Upper bounds of the numbers a request carries (docs/api.md, "Bounds").
MAX_AMOUNT = 1e9  # a resource amount (cores, MB, GPUs, a custom dimension's units)
MAX_WEIGHT = 1e6  # an action's weight in the ACT objective
MAX_EXPECTED_S = 1e6  # hints.expected_s (11.6 days)
MAX_COUNT = 1_000_000  # hints.test_count, hints.items
MAX_TOKENS = 1_000_000_000  # hints.tokens
MAX_WAIT_S = 86400.0  # a long-poll asked for (limits.max_wait_s caps it further)
MAX_MEMORY_MB = 1 << 20  # memory_limit_MB, layer_mb: 1 TiB
# payload.cases of a TEST action: the CPU manager's default max_test_cases (a manager set
# higher is still refused more here; one set lower fails the action naming its own bound)
MAX_TEST_CASES = 1024
Amount = Annotated[float, AllowInfNan(False), BeforeValidator(_not_bool),
                   Field(ge=0, le=MAX_AMOUNT)]

MAX_NAME_BYTES = 255  # one component of a file name (NAME_MAX)
MAX_PATH_BYTES = 4096  # a whole file name (PATH_MAX)


def _is_control(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or 0x7F <= o < 0xA0


def _session_id(v: str) -> str:
    """A session id a client chose: no NUL or other control character, no ``/`` or ``\\``,
    no ``..`` (ids end up in names of files and cgroups on the node)."""
    bad = next((c for c in v if _is_control(c)), None)
    if bad is not None:
        raise ValueError(f"must not contain control characters (got {bad!r})")
    if "/" in v or "\\" in v:
        raise ValueError("must not contain '/' or '\\'")
    if ".." in v or v == ".":
        raise ValueError("must not be '.' or contain '..'")
    return v


def check_session_id(v: str) -> str:
    """``v`` if it is a valid session id (`SessionId`), else InvalidAction naming
    ``session_id`` (a path parameter, outside pydantic's model)."""
    try:
        return _session_id(v)
    except ValueError as exc:
        raise InvalidAction("session_id", str(exc)) from None


def file_name_problem(v: str) -> str | None:
    """What is wrong with ``v`` as a file name inside the sandbox's work directory (None:
    nothing): it has a NUL, a component over `MAX_NAME_BYTES` bytes of UTF-8, or is over
    `MAX_PATH_BYTES` in all."""
    if "\x00" in v:
        return "a file name must not contain NUL"
    try:
        raw = v.encode("utf-8")
    except UnicodeEncodeError:
        return "a file name must be valid UTF-8 (no lone surrogates)"
    if len(raw) > MAX_PATH_BYTES:
        return f"a file name must be at most {MAX_PATH_BYTES} bytes, got {len(raw)}"
    longest = max(len(p) for p in raw.split(b"/"))
    if longest > MAX_NAME_BYTES:
        return (f"each part of a file name must be at most {MAX_NAME_BYTES} bytes, "
                f"got one of {longest}")
    return None


def _file_name(v: str) -> str:
    why = file_name_problem(v)
    if why is not None:
        raise ValueError(why)
    return v


SessionId = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_session_id)]
FileName = Annotated[str, AfterValidator(_file_name)]

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


class RunCodeRequest(BaseModel):
    """SandboxFusion's RunCodeRequest (a missing ``language`` means python); `request` is the
    typed request it stands for."""

    compile_timeout: Num = Field(10, gt=0, le=3600, description="compile timeout (s)")
    run_timeout: Num = Field(10, gt=0, le=3600, description="run timeout (s)")
    memory_limit_MB: Int = Field(-1, ge=-1, le=MAX_MEMORY_MB,
                                 description="memory limit in MB; -1: the default")
    code: str = Field(..., description="the code to run")
    stdin: str | None = Field(None, description="optional string passed on stdin")
    language: Language = Field("python", description="language or execution mode")
    files: dict[FileName, str | None] = Field(default_factory=dict, description="path -> base64")
    fetch_files: list[FileName] = Field(default_factory=list, description="paths to return")

    def request(self) -> CodeRequest:
        """The typed request (`arl_tangram.kinds`), built once here from the parsed fields."""
        return CodeRequest(
            code=self.code, language=self.language, stdin=self.stdin or "",
            compile_timeout=self.compile_timeout, run_timeout=self.run_timeout,
            memory_limit_MB=self.memory_limit_MB, files=self.files,
            fetch_files=tuple(self.fetch_files))


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

Kind = Literal["code", "test", "tool", "reward", "judge", "custom", "search", "fetch"]


class ElasticityIn(BaseModel):
    min: Num = Field(1.0, gt=0, le=MAX_AMOUNT)
    max: Num = Field(1.0, gt=0, le=MAX_AMOUNT)
    dim: str = "cpu"
    parallel_fraction: Num = Field(0.0, ge=0, le=1)


class HintsIn(BaseModel):
    expected_s: Num | None = Field(None, ge=0, le=MAX_EXPECTED_S)
    test_count: Int | None = Field(None, ge=0, le=MAX_COUNT)
    tokens: Int | None = Field(None, ge=0, le=MAX_TOKENS)
    items: Int | None = Field(None, ge=0, le=MAX_COUNT)
    prompt_tokens: Int | None = Field(None, ge=0, le=MAX_TOKENS)  # a judge engine's prompt


def _payload(v: dict[str, Any]) -> dict[str, Any]:
    cases = v.get("cases")
    if isinstance(cases, list) and len(cases) > MAX_TEST_CASES:
        raise ValueError(f"payload.cases: at most {MAX_TEST_CASES} cases per action, got "
                         f"{len(cases)}")
    return v


class ActionIn(BaseModel):
    """One action of POST /v1/actions. ``models`` (several) fans out one action per model."""

    id: str | None = Field(None, min_length=1, max_length=200)
    kind: Kind = "code"
    payload: Annotated[dict[str, Any], AfterValidator(_payload)] = Field(default_factory=dict)
    demand: dict[str, Amount] | None = None
    elasticity: ElasticityIn | None = None
    hints: HintsIn | None = None
    task: str = Field("default", max_length=200)
    trajectory: str | None = Field(None, max_length=200)
    # the client's name for this action's siblings (a GRPO group's answers to one prompt): the
    # estimator learns from the finished ones (issue 39); scoped by tenant. Not a fan-out group.
    siblings: str | None = Field(None, min_length=1, max_length=200)
    session: SessionId | None = None
    model: str | None = Field(None, max_length=200)
    models: list[str] | None = Field(None, min_length=1, max_length=64)
    tag: str | None = Field(None, max_length=200)
    timeout_s: Num = Field(60.0, gt=0, le=3600)
    weight: Num = Field(1.0, gt=0, le=MAX_WEIGHT)
    idempotent: bool = True


class ActionsIn(BaseModel):
    """POST /v1/actions body: one action, or ``actions`` for a batch."""

    actions: list[ActionIn] = Field(..., min_length=1)
    wait: bool = False
    wait_s: Num = Field(60.0, gt=0, le=MAX_WAIT_S)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)



class SessionIn(BaseModel):
    session_id: SessionId | None = None
    demand: dict[str, Amount] | None = None
    ttl_s: Num = Field(600.0, gt=0, le=86400)
    node: str | None = None
    image: str | None = Field(None, min_length=1, max_length=128)  # an image on the node
    # its writable layer's size cap (the layer code refuses less than MIN_LAYER_MB)
    layer_mb: Int | None = Field(None, ge=MIN_LAYER_MB, le=MAX_MEMORY_MB)


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
