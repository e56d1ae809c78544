"""One typed request and one typed outcome per action kind, between the edge that parses a
request and the manager that does it.

Runs in: any process (pure data: no I/O, no asyncio). May import: `core` and the standard
library only (below `api`, `runtime`, `sim` and `managers`; the core does not import it:
pyproject.toml ``[tool.importlinter]``).

Invariant: a request built here is complete and well typed: every field has its value (a default
is applied once, here or by the edge's schema), so no room after the edge checks a type or
applies a default again. The edge builds it once (`api/`: pydantic parses, `RunCodeRequest.request`
builds); a payload that came as a plain mapping (`POST /v1/actions`, whose ``payload`` is opaque
to the API, or a library caller's `ActionSpec`) is parsed by `code_request` where it is first
read, by the same rules. The engine and the node carry it untouched in `ActionSpec.payload`; it
is a read-only `Mapping` of its wire names, so the core, to which a payload is opaque, reads the
keys it estimates by (``code``, ``language``, ``cases``) as before. What is left to the manager is
what depends on its node: a language installed, paths inside the work directory, base64 content,
text a sandbox can take, its caps.

An outcome stays typed from the manager to `api/`, which alone renders it (`RunResult.to_dict`
owns SandboxFusion's RunCodeResponse shape; a read-only `Mapping` view of it serves code that
reads an output as the wire dict, such as the engine's Python callers). Statuses are enums whose
values are SandboxFusion's strings, and every timeout of a code action comes from `code_timeouts`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .core.actions import ActionKind, Status
from .core.errors import InvalidAction

# ---- statuses (SandboxFusion's RunStatus and CommandRunStatus, their strings on the wire) -------


class RunStatus(enum.StrEnum):
    # How a code action ended (SandboxFusion RunStatus). (No docstring: the API's schema shows
    # these enums as SandboxFusion's, which have none.)
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(enum.StrEnum):
    # How one compile or run stage ended (SandboxFusion CommandRunStatus).
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


# ---- timeouts of a code action ------------------------------------------------------------------

EDGE_GRACE_S = 5.0  # /run_code: its action's timeout_s beyond compile + run (start-up, files)
REPLY_GRACE_S = 10.0  # the manager waits this beyond the stages for a sandbox's reply


@dataclass(frozen=True, slots=True)
class Timeouts:
    """A code action's timeouts (`code_timeouts`), and what follows from them."""

    compile_s: float  # the compile stage
    run_s: float  # each run (each case)
    total_s: float | None = None  # a TEST action's: compile and every case end within it

    def within(self, grace_s: float) -> float:
        """Compile plus one run plus ``grace_s``: a /run_code action's ``timeout_s``
        (`EDGE_GRACE_S`), the service's wait for its answer (``shed_grace_s``)."""
        return self.compile_s + self.run_s + grace_s

    def cpu_limit_s(self, cpus: float) -> int:
        """RLIMIT_CPU of one child shown ``cpus`` cores: the longer stage on all of them, + 1."""
        return math.ceil(max(self.run_s, self.compile_s) * max(cpus, 1)) + 1

    def reply_budget_s(self, runs: int, cpus: float) -> float:
        """How long the manager waits for the reply of ``runs`` runs (cases + 1) run as many
        at a time as the code is shown cores; a TEST action's at most its total + grace."""
        budget = self.compile_s + REPLY_GRACE_S + self.run_s * math.ceil(runs / max(cpus, 1))
        if self.total_s is not None:
            budget = min(budget, self.total_s + REPLY_GRACE_S)
        return budget


def code_timeouts(req: CodeRequest, *, action_timeout_s: float | None = None,
                  default_compile_s: float = 10.0, default_run_s: float = 10.0,
                  cap_s: float = math.inf, test: bool = False) -> Timeouts:
    """The one computation of a code action's timeouts: the request's own, else the node's
    defaults (a run at most the action's ``timeout_s``), each at most ``cap_s``; a TEST
    action's total is its ``timeout_s`` (at most ``cap_s``)."""
    run = req.run_timeout
    if run is None:
        run = default_run_s if action_timeout_s is None else min(default_run_s, action_timeout_s)
    comp = default_compile_s if req.compile_timeout is None else req.compile_timeout
    total = min(float(action_timeout_s), cap_s) if test and action_timeout_s is not None else None
    return Timeouts(min(comp, cap_s), min(run, cap_s), total)


# ---- code, test, tool (the CPU manager) ---------------------------------------------------------

DEFAULT_MEMORY_MB = 512  # the memory a code action asks for when it sets no memory_limit_MB


@dataclass(frozen=True, slots=True)
class Case:
    """One test case of a TEST action: an ``assert`` (Python), or stdin and expected stdout."""

    assert_: str | None = None  # a statement run after the code; passes when it does not raise
    stdin: str = ""  # fed to the run
    expected_stdout: str | None = None  # compared with the run's stdout (None: exit code alone)

    def wire(self) -> dict[str, Any]:
        if self.assert_ is not None:
            return {"assert": self.assert_}
        return {"stdin": self.stdin, "expected_stdout": self.expected_stdout}


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeRequest(Mapping[str, Any]):
    """A code, test or tool action (SandboxFusion's RunCodeRequest, and our TEST/TOOL fields)."""

    code: str  # the program's source
    language: str = "python"  # a SandboxFusion language name (the node says which it has)
    stdin: str = ""  # fed to the run (without cases)
    compile_timeout: float | None = None  # seconds (None: the node's default)
    run_timeout: float | None = None  # seconds, each run (None: the node's default)
    memory_limit_MB: float = -1  # at most this much memory (-1: the allotment's)
    files: Mapping[str, str | None] = field(default_factory=dict)  # path -> base64, written first
    fetch_files: tuple[str, ...] = ()  # paths whose content comes back
    cases: tuple[Case, ...] | None = None  # a TEST action's cases (None for other kinds)
    stop_on_first_failure: bool = False  # cases: skip the rest after the first failure
    image: str | None = None  # a one-shot action's environment image (None: the plain sandbox)
    layer_mb: int | None = None  # ... its writable layer's cap in MiB (None: the node's default)

    @property
    def memory_mb(self) -> float:
        """The memory this request asks for: its limit, else `DEFAULT_MEMORY_MB`."""
        return self.memory_limit_MB if self.memory_limit_MB > 0 else DEFAULT_MEMORY_MB

    # (the read-only Mapping of the wire names: what the core reads of an opaque payload)
    def __getitem__(self, key: str) -> Any:
        if key not in _CODE_KEYS or (key in _UNSET_NONE and getattr(self, key) is None):
            raise KeyError(key)
        if key == "cases":
            return [c.wire() for c in self.cases or ()]
        if key == "fetch_files":
            return list(self.fetch_files)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return (k for k in _CODE_KEYS if not (k in _UNSET_NONE and getattr(self, k) is None))

    def __len__(self) -> int:
        return sum(1 for _ in self)


_CODE_KEYS = ("code", "language", "stdin", "compile_timeout", "run_timeout", "memory_limit_MB",
              "files", "fetch_files", "cases", "stop_on_first_failure", "image", "layer_mb")
_UNSET_NONE = frozenset({"compile_timeout", "run_timeout", "cases", "image", "layer_mb"})


def code_request(kind: ActionKind, payload: Mapping[str, Any]) -> CodeRequest:
    """``payload`` as a typed request: itself when it is one, else parsed (`parse_code`)."""
    if isinstance(payload, CodeRequest):
        return payload
    return parse_code(kind, payload)


def _names(t: type | tuple[type, ...]) -> str:
    return " or ".join(x.__name__ for x in (t if isinstance(t, tuple) else (t,)))


def _get(p: Mapping[str, Any], name: str, types: type | tuple[type, ...], default: Any) -> Any:
    v = p.get(name, default)
    if v is None:
        return default
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in
                                    (types if isinstance(types, tuple) else (types,))):
        raise InvalidAction(f"payload.{name}", f"expected {_names(types)}, got {type(v).__name__}")
    return v


def _timeout(p: Mapping[str, Any], name: str) -> float | None:
    v = _get(p, name, (int, float), None)
    if v is None:
        return None
    v = float(v)
    if not v > 0 or math.isinf(v):
        raise InvalidAction(f"payload.{name}", f"must be a positive number, got {v!r}")
    return v


def _path(field_name: str, path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidAction(field_name, f"file path must be a non-empty string, got {path!r}")
    return path


def _cases(p: Mapping[str, Any], lang: str) -> tuple[Case, ...] | None:
    cases = _get(p, "cases", list, None)
    if not cases:
        return None  # (the manager refuses a TEST action without cases)
    out = []
    for i, c in enumerate(cases):
        if not isinstance(c, dict):
            raise InvalidAction(f"payload.cases[{i}]", "each case must be an object")
        if "assert" in c:
            if lang != "python":
                raise InvalidAction(f"payload.cases[{i}].assert", "assert cases need python")
            if not isinstance(c["assert"], str):
                raise InvalidAction(f"payload.cases[{i}].assert", "must be a string")
            out.append(Case(assert_=c["assert"]))
            continue
        stdin, exp = c.get("stdin", ""), c.get("expected_stdout")
        if not isinstance(stdin, str) or (exp is not None and not isinstance(exp, str)):
            raise InvalidAction(f"payload.cases[{i}]", "stdin and expected_stdout must be strings")
        out.append(Case(stdin=stdin, expected_stdout=exp))
    return tuple(out)


def parse_code(kind: ActionKind, p: Any) -> CodeRequest:
    """A code, test or tool payload given as a plain mapping, typed; InvalidAction naming the
    field at fault (a missing or mistyped field, a timeout that is not a positive number, an
    assert case in another language than python). A None field means its default; other
    kinds' ``cases`` are ignored."""
    if not isinstance(p, Mapping):
        raise InvalidAction("payload", "must be an object")
    code = _get(p, "code", str, None)
    if code is None:
        raise InvalidAction("payload.code", "is required (a string)")
    lang = _get(p, "language", str, "python")
    run, comp = _timeout(p, "run_timeout"), _timeout(p, "compile_timeout")
    stdin = _get(p, "stdin", str, "")
    fetch = tuple(_path("payload.fetch_files", f) for f in _get(p, "fetch_files", list, []))
    files = _get(p, "files", dict, {})
    for path, b64 in files.items():
        _path("payload.files", path)
        if b64 is not None and not isinstance(b64, str):
            raise InvalidAction("payload.files", f"content of {path!r} must be base64 text")
    stop = bool(_get(p, "stop_on_first_failure", bool, False))
    return CodeRequest(
        code=code, language=lang, stdin=stdin, compile_timeout=comp, run_timeout=run,
        memory_limit_MB=_get(p, "memory_limit_MB", (int, float), -1), files=dict(files),
        fetch_files=fetch, cases=_cases(p, lang) if kind == ActionKind.TEST else None,
        stop_on_first_failure=stop, image=_get(p, "image", str, None), layer_mb=_layer_mb(p))


def _layer_mb(p: Mapping[str, Any]) -> int | None:
    v = _get(p, "layer_mb", (int, float), None)
    return None if v is None else int(v)


@dataclass(frozen=True, slots=True)
class StageResult:
    """One compile or run stage (SandboxFusion CommandRunResult)."""

    status: CommandRunStatus
    execution_time: float | None = None  # wall seconds
    return_code: int | None = None  # exit code; -N when killed by signal N
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False  # stdout or stderr went past the output cap

    def to_dict(self) -> dict[str, Any]:
        return {"status": str(self.status), "execution_time": self.execution_time,
                "return_code": self.return_code, "stdout": self.stdout, "stderr": self.stderr}

    @classmethod
    def from_wire(cls, d: dict[str, Any] | None) -> StageResult | None:
        if d is None:
            return None
        return cls(status=CommandRunStatus(d["status"]), execution_time=d.get("execution_time"),
                   return_code=d.get("return_code"), stdout=str(d.get("stdout") or ""),
                   stderr=str(d.get("stderr") or ""), truncated=bool(d.get("truncated")))

    @property
    def ok(self) -> bool:
        return self.status == CommandRunStatus.Finished and self.return_code == 0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One test case of a TEST action."""

    index: int
    passed: bool
    run: StageResult | None  # None when skipped (stop_on_first_failure)
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "passed": self.passed, "skipped": self.skipped,
                "run_result": self.run.to_dict() if self.run else None}


class Outcome(Mapping[str, Any]):
    """An outcome made by its manager and rendered to JSON only in `api/` (``to_dict``: its
    wire body, whose one owner it is). Also a read-only Mapping of that body, for code that reads
    an output as the wire dict (the engine's Python callers, `translate.score_of`)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(frozen=True, slots=True)
class RunResult(Outcome):
    """What a code, test or tool action produced (the CPU manager's outcome)."""

    status: RunStatus
    message: str = ""
    compile_result: StageResult | None = None
    run_result: StageResult | None = None
    executor_pod_name: str | None = None  # the node / sandbox that ran it
    files: Mapping[str, str] = field(default_factory=dict)  # fetched files, path -> base64
    memory_exceeded: bool = False  # the memory cgroup killed something
    output_truncated: bool = False  # some stdout/stderr was dropped past the cap
    cpu_time: float | None = None  # CPU seconds the whole sandbox used
    peak_memory_mb: float | None = None  # peak memory of the sandbox
    cases: tuple[CaseResult, ...] | None = None  # TEST actions: one per case
    # session actions: what thawing, re-quota and freezing the session cost (`overlay`)
    session_switch: Mapping[str, Any] | None = None
    # the action's own `timeout_s` ended it (a TEST action's cases together; the message says
    # how many finished): timed out even when no stage was running at that moment
    timeout_s_exceeded: bool = False
    # what the node waited for before the action could run (its image fetched:
    # ``image_import_s``, and ``image_pull`` when it came from a peer; `runtime.node`)
    image_fetch: Mapping[str, Any] | None = None

    @classmethod
    def sandbox_error(cls, message: str, pod: str | None = None) -> RunResult:
        return cls(status=RunStatus.SandboxError, message=message, executor_pod_name=pod)

    @property
    def timed_out(self) -> bool:
        if self.timeout_s_exceeded:
            return True
        stages = [self.compile_result, self.run_result]
        stages += [c.run for c in self.cases or ()]
        return any(s is not None and s.status == CommandRunStatus.TimeLimitExceeded
                   for s in stages)

    @property
    def action_status(self) -> Status:
        if self.status == RunStatus.Success:
            return Status.SUCCEEDED
        if self.timed_out:
            return Status.TIMED_OUT
        return Status.FAILED

    @property
    def reason(self) -> str:
        """Why it did not succeed, in words ("" when it did)."""
        return "" if self.status == RunStatus.Success else self.message or str(self.status)

    def to_dict(self, extras: bool = True) -> dict[str, Any]:
        """SandboxFusion's RunCodeResponse; with ``extras``, our keys after its own (SandboxFusion
        clients ignore them). Stage stdout/stderr are strings, never null."""
        d: dict[str, Any] = {
            "status": str(self.status),
            "message": self.message,
            "compile_result": self.compile_result.to_dict() if self.compile_result else None,
            "run_result": self.run_result.to_dict() if self.run_result else None,
            "executor_pod_name": self.executor_pod_name,
            "files": dict(self.files),
        }
        if not extras:
            return d
        d.update({
            "memory_exceeded": self.memory_exceeded,
            "output_truncated": self.output_truncated,
            "cpu_time": self.cpu_time,
            "peak_memory_mb": self.peak_memory_mb,
        })
        if self.cases is not None:
            d["cases"] = [c.to_dict() for c in self.cases]
        if self.session_switch is not None:
            d["session_switch"] = dict(self.session_switch)
        if self.image_fetch:
            d.update(self.image_fetch)
        return d



# ---- score (reward and judge models) and retrieve (a local index): the GPU manager -------------

DEFAULT_TOPK = 3  # documents a retrieval returns when it names no topk (Search-R1's default)


class _View(Mapping[str, Any]):
    """(the read-only Mapping of a request's set fields, by their wire names)"""

    __slots__ = ()
    _KEYS: tuple[str, ...] = ()

    def __getitem__(self, key: str) -> Any:
        v = getattr(self, key) if key in self._KEYS else None
        if v is None:
            raise KeyError(key)
        return v

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._KEYS if getattr(self, k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreRequest(_View):
    """One response scored by a reward or judge model (REWARD, JUDGE kinds; OpenRLHF's
    /get_reward, /classify). Which fields a model needs is the model's rule (`scoring.texts_for`:
    a similarity model a reference, ...); None: not given."""

    query: str | None = None  # the whole text scored (OpenRLHF's query: prompt + response)
    prompt: str | None = None  # ... or the prompt and the response apart
    response: str | None = None
    reference: str | None = None  # a similarity model's reference (a label)
    _KEYS = ("query", "prompt", "response", "reference")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveRequest(_View):
    """One query of a local index's retriever (RETRIEVE kind; ``/retrieve``, a ``/v1/search``
    naming an index)."""

    query: str  # a non-empty query
    topk: int = DEFAULT_TOPK  # the documents returned
    _KEYS = ("query", "topk")


def score_request(payload: Mapping[str, Any]) -> ScoreRequest:
    """``payload`` as a typed request: itself when it is one, else parsed (a native or library
    caller's mapping): each field given and not None, as text."""
    if isinstance(payload, ScoreRequest):
        return payload
    got = {k: str(payload[k]) for k in ScoreRequest._KEYS if payload.get(k) is not None}
    return ScoreRequest(**got)


def retrieve_request(payload: Mapping[str, Any]) -> RetrieveRequest:
    """``payload`` as a typed request: itself when it is one, else parsed; ValueError when it
    has no non-empty query or a topk that is not a number."""
    if isinstance(payload, RetrieveRequest):
        return payload
    q = payload.get("query")
    if not isinstance(q, str) or not q.strip():
        raise ValueError("a retrieval needs a non-empty 'query' in the payload")
    try:
        topk = int(payload.get("topk", DEFAULT_TOPK))
    except (TypeError, ValueError):
        raise ValueError(f"a retrieval's 'topk' must be a number, got {payload.get('topk')!r}") \
            from None
    return RetrieveRequest(query=q, topk=topk)


# ---- judge generation (a generative judge, kind genjudge): its engine host ----------------------

JUDGE_ROUTES = ("chat/completions", "completions")  # an OpenAI-style completion's engine routes
JUDGE_ROLES = ("system", "user", "assistant")
_SAMPLING_KEYS = ("max_tokens", "n", "temperature", "top_p", "seed", "stop", "presence_penalty",
                  "frequency_penalty", "ignore_eos")


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message of a chat a judge reads."""

    role: str  # system | user | assistant
    content: str

    def wire(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """What an OpenAI-style completion asks of the engine's sampler (None: the engine's own
    default). The edge (`api/openai_compat.py`) checks the ranges against the model."""

    max_tokens: int  # generated tokens at most, per choice
    n: int = 1  # choices
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop sequences
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool | None = None  # vLLM's extension: generate max_tokens whatever comes

    def body(self) -> dict[str, Any]:
        """The engine request's sampling fields, the ones set."""
        d: dict[str, Any] = {"max_tokens": self.max_tokens, "n": self.n}
        for k in _SAMPLING_KEYS[2:]:
            v = getattr(self, k)
            if v is not None and k != "stop":
                d[k] = v
        if self.stop:
            d["stop"] = list(self.stop)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeRequest(Mapping[str, Any]):
    """A generative judge's action (JUDGE kind on a model of kind genjudge), in one of two forms.

    A judgement (``route`` None): ``messages`` (a chat judged as given), or ``prompt`` and
    ``response``, or ``query`` (the response alone), formatted by the model's template and
    generated with the model's own sampling; its verdict read by the model's rule
    (`managers.gpu.verdict`). A completion (``route`` one of `JUDGE_ROUTES`, OpenAI's
    passthrough, `api/openai_compat.py`): ``messages`` (chat) or ``prompt`` (completions, one
    text or several) generated with ``sampling``, the engine's answer returned as it is."""

    messages: tuple[ChatTurn, ...] | None = None
    prompt: str | tuple[str, ...] | None = None
    response: str | None = None
    query: str | None = None
    route: str | None = None  # None: a judgement; else the completion's engine route
    sampling: Sampling | None = None  # a completion's (required with a route)

    def __post_init__(self) -> None:
        if self.route is not None:
            if self.route not in JUDGE_ROUTES:
                raise InvalidAction("payload.openai.route", f"one of {', '.join(JUDGE_ROUTES)}")
            if self.sampling is None:
                raise InvalidAction("payload.openai.body.max_tokens", "is required")
            chat = self.route == "chat/completions"
            if chat and not self.messages:
                raise InvalidAction("payload.openai.body.messages", "must not be empty")
            if not chat and not self.prompt:
                raise InvalidAction("payload.openai.body.prompt", "must not be empty")
        elif not self.messages and self.response is None and self.query is None:
            raise InvalidAction("payload", "needs query, prompt and response, or messages")

    def openai_body(self) -> dict[str, Any]:
        """A completion's engine request body (without ``model``: the instance's name)."""
        assert self.sampling is not None
        body = self.sampling.body()
        if self.route == "chat/completions":
            body["messages"] = [m.wire() for m in self.messages or ()]
        else:
            body["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
        return body

    def wire(self) -> dict[str, Any]:
        """The payload as a native caller writes it (``{"openai": {"route", "body"}}`` for a
        completion)."""
        if self.route is not None:
            return {"openai": {"route": self.route, "body": self.openai_body()}}
        d: dict[str, Any] = {}
        if self.messages is not None:
            d["messages"] = [m.wire() for m in self.messages]
        for k in ("prompt", "response", "query"):
            v = getattr(self, k)
            if v is not None:
                d[k] = list(v) if isinstance(v, tuple) else v
        return d

    # (the read-only Mapping of the wire shape, `wire`)
    def __getitem__(self, key: str) -> Any:
        return self.wire()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.wire())

    def __len__(self) -> int:
        return len(self.wire())


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise InvalidAction(where, f"must be a string, got {type(v).__name__}")
    return v


def _turns(msgs: Any, where: str) -> tuple[ChatTurn, ...]:
    if not isinstance(msgs, list) or not msgs:
        raise InvalidAction(where, "must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str) \
                or m.get("role") not in JUDGE_ROLES:
            raise InvalidAction(f"{where}[{i}]", "needs role (system|user|assistant) and "
                                                 "content (a string)")
        out.append(ChatTurn(str(m["role"]), str(m["content"])))
    return tuple(out)


def _sampling(body: Mapping[str, Any], where: str) -> Sampling:
    kw: dict[str, Any] = {}
    for k in ("max_tokens", "n", "seed"):
        v = body.get(k)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "seed" else 1):
                raise InvalidAction(f"{where}.{k}", f"must be an integer >= "
                                                    f"{0 if k == 'seed' else 1}, got {v!r}")
            kw[k] = v
    if "max_tokens" not in kw:
        raise InvalidAction(f"{where}.max_tokens", "is required (an integer >= 1)")
    for k in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        v = body.get(k)
        if v is not None:
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise InvalidAction(f"{where}.{k}", f"must be a finite number, got {v!r}")
            kw[k] = float(v)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise InvalidAction(f"{where}.stop", "must be a string or a list of strings")
        kw["stop"] = tuple(stops)
    eos = body.get("ignore_eos")
    if eos is not None:
        if not isinstance(eos, bool):
            raise InvalidAction(f"{where}.ignore_eos", f"must be a boolean, got {eos!r}")
        kw["ignore_eos"] = eos
    return Sampling(**kw)


def judge_request(payload: Mapping[str, Any]) -> JudgeRequest:
    """``payload`` as a typed request: itself when it is one, else parsed (a native or library
    caller's mapping, or a `ScoreRequest` sent to a generative judge): ``messages``, or
    ``prompt`` and ``response``, or ``query``; or ``{"openai": {"route", "body"}}``, a
    completion whose body holds ``messages`` or ``prompt`` and the sampling fields
    (`Sampling`). InvalidAction naming the field at fault (``payload.messages[0]``,
    ``payload.openai.body.stop``, an unknown body field, ...)."""
    if isinstance(payload, JudgeRequest):
        return payload
    if not isinstance(payload, Mapping):
        raise InvalidAction("payload", "must be an object")
    raw = payload.get("openai")
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise InvalidAction("payload.openai", "must be a mapping with route and body")
        route, body = raw.get("route"), raw.get("body")
        if route not in JUDGE_ROUTES:
            raise InvalidAction("payload.openai.route", f"one of {', '.join(JUDGE_ROUTES)}")
        where = "payload.openai.body"
        if not isinstance(body, Mapping):
            raise InvalidAction(where, "must be a mapping")
        chat = route == "chat/completions"
        text_key = "messages" if chat else "prompt"
        unknown = sorted(set(body) - {*_SAMPLING_KEYS, text_key, "model"})
        if unknown:
            raise InvalidAction(f"{where}.{unknown[0]}", "not a field this route passes on "
                                f"({', '.join((text_key, *_SAMPLING_KEYS))})")
        if chat:
            return JudgeRequest(route=route, messages=_turns(body.get("messages"),
                                                             f"{where}.messages"),
                                sampling=_sampling(body, where))
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = tuple(_text(x, f"{where}.prompt[{i}]") for i, x in enumerate(prompt))
        elif prompt is not None:
            prompt = _text(prompt, f"{where}.prompt")
        return JudgeRequest(route=route, prompt=prompt, sampling=_sampling(body, where))
    msgs = payload.get("messages")
    if msgs is not None:
        return JudgeRequest(messages=_turns(msgs, "payload.messages"))
    if "response" in payload:
        prompt, response = payload.get("prompt", ""), payload["response"]
    elif "query" in payload:
        prompt, response = None, payload["query"]
    else:
        raise InvalidAction("payload", "needs query, prompt and response, or messages")
    if (prompt is not None and not isinstance(prompt, str)) or not isinstance(response, str):
        raise InvalidAction("payload", "prompt, response and query must be strings")
    if "response" in payload:
        return JudgeRequest(prompt=prompt, response=response)
    return JudgeRequest(query=response)


# ---- outcomes of score, retrieve, judge generation and provider calls ---------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreResult(Outcome):
    """A reward or judge model's score of one response (REWARD, JUDGE kinds on a scalar,
    similarity or judge model: `managers.gpu.scoring.Scorer`)."""

    model: str
    score: float  # the reward: a scalar head's value, a class's probability, a cosine, P(yes)
    p_yes: float | None = None  # a judge model's probabilities of its yes and no tokens
    p_no: float | None = None
    probs: tuple[float, ...] | None = None  # a classifier's probability of each label

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"score": self.score}
        if self.p_yes is not None:
            d["p_yes"] = self.p_yes
        if self.p_no is not None:
            d["p_no"] = self.p_no
        if self.probs is not None:
            d["probs"] = list(self.probs)
        d["model"] = self.model
        return d


@dataclass(frozen=True, slots=True)
class Hit:
    """One document a retriever found, and its score (inner product of the embeddings)."""

    document: Any  # the corpus record as indexed (Search-R1's: ``id``, ``contents``)
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"document": self.document, "score": self.score}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveResult(Outcome):
    """A retriever's answer to one query (RETRIEVE kind), best first."""

    model: str  # the index
    hits: tuple[Hit, ...] = ()

    @property
    def top_score(self) -> float | None:
        """The best document's score (None: no document)."""
        return self.hits[0].score if self.hits else None

    def to_dict(self) -> dict[str, Any]:
        return {"result": [h.to_dict() for h in self.hits], "model": self.model}


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeVerdict(Outcome):
    """A generative judge's judgement (`JudgeRequest` without a route): what it generated and
    the verdict its model's rule read there (None: none found, scored by ``on_no_verdict``)."""

    model: str
    reasoning: str  # the generated text
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    score: float
    verdict: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "reasoning": self.reasoning,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "finish_reason": self.finish_reason, "score": self.score,
                "verdict": self.verdict}


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a completion: its text (a chat's message content), why it ended."""

    index: int
    text: str
    finish_reason: str  # "stop" when the engine named none


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion(Outcome):
    """A generative judge's completion (`JudgeRequest` with a route): the engine's
    OpenAI-style answer, read once (``choices``, ``usage``) and kept whole (``response``, the
    native output's ``openai``)."""

    model: str
    route: str  # chat/completions | completions
    choices: tuple[Choice, ...]
    prompt_tokens: int
    completion_tokens: int
    response: Mapping[str, Any]  # the engine's answer as it came (``model`` the judge's name)

    @classmethod
    def of(cls, model: str, route: str, data: Mapping[str, Any]) -> Completion:
        """The engine's answer ``data`` of ``route``, read."""
        chat = route == "chat/completions"
        choices = []
        for i, c in enumerate(data.get("choices") or []):
            text = (c.get("message") or {}).get("content") if chat else c.get("text")
            choices.append(Choice(int(c.get("index", i)), text or "",
                                  c.get("finish_reason") or "stop"))
        u = data.get("usage")
        u = u if isinstance(u, Mapping) else {}
        return cls(model=model, route=route, choices=tuple(choices),
                   prompt_tokens=int(u.get("prompt_tokens") or 0),
                   completion_tokens=int(u.get("completion_tokens") or 0), response=data)

    def to_dict(self) -> dict[str, Any]:
        return {"openai": dict(self.response), "model": self.model}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderResult(Outcome):
    """A provider's answer to one call (SEARCH, FETCH, HTTP kinds): its JSON body as it came,
    and whether the front door's cache answered it (no call)."""

    provider: str
    result: Any  # the provider's JSON body
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "result": self.result, "cached": self.cached}


# ---- search, fetch, http (a declared provider): the API manager ---------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderRequest(_View):
    """One call to a declared provider (SEARCH, FETCH, HTTP kinds; the provider is the action's
    ``tag``), as `runtime.providers.ProviderFront` builds it (`managers.api.ApiManager.prepare`).
    The core reads ``coalesce``, ``cached`` and ``step`` (an opaque payload's keys to it)."""

    kind: str  # search | fetch | http
    request: Mapping[str, Any]  # normalized (`managers.api.normalize`): what the call sends
    coalesce: str | None = None  # its key: identical calls in flight share one call; the cache's
    step: int | None = None  # the RL step it is charged to (`budget_per_step`)
    cached: Any = None  # the cache's answer on a hit: the core answers at arrival, no call
    _KEYS = ("request", "kind", "coalesce", "step", "cached")


def provider_request(payload: Mapping[str, Any]) -> ProviderRequest:
    """``payload`` as a typed request: itself when it is one, else parsed (a library caller's
    mapping: ``request``, ``kind``, ``coalesce``, ``step``, ``cached``; ``kind`` "" when absent:
    the provider's own)."""
    if isinstance(payload, ProviderRequest):
        return payload
    key, step = payload.get("coalesce"), payload.get("step")
    return ProviderRequest(
        kind=str(payload.get("kind") or ""), request=payload.get("request") or {},
        coalesce=key if isinstance(key, str) and key else None,
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        cached=payload.get("cached"))


__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TOPK",
    "EDGE_GRACE_S",
    "JUDGE_ROUTES",
    "REPLY_GRACE_S",
    "Case",
    "CaseResult",
    "ChatTurn",
    "Choice",
    "CodeRequest",
    "CommandRunStatus",
    "Completion",
    "Hit",
    "JudgeRequest",
    "JudgeVerdict",
    "Outcome",
    "ProviderRequest",
    "ProviderResult",
    "RetrieveRequest",
    "RetrieveResult",
    "RunResult",
    "RunStatus",
    "Sampling",
    "ScoreRequest",
    "ScoreResult",
    "StageResult",
    "Timeouts",
    "code_request",
    "code_timeouts",
    "judge_request",
    "parse_code",
    "provider_request",
    "retrieve_request",
    "score_request",
]
