"""A code action's typed request (`arl_tangram.kinds.CodeRequest`) as the request a sandbox's
init takes (`SandboxRequest`), with this node's rules and limits.

Invariant: `build_request` either returns a complete, well-typed request for a sandbox or raises
`InvalidAction` naming the payload field at fault. Types, defaults and timeouts are the typed
request's (`kinds`: checked once, where it was built or parsed); what is checked here is what
depends on this node and its sandboxes: the language installed (python or bash in a session),
paths inside the work directory, base64 content, text a sandbox can take as UTF-8, the number of
cases, the timeouts' cap. Nothing untrusted reaches a sandbox init unchecked.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import os
import posixpath
from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import CPU
from arl_tangram.kinds import Case, CodeRequest, code_request, code_timeouts

from ..config import CpuManagerConfig
from .languages import ALL_LANGUAGES, Language, LangWire

_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _utf8(field: str, s: str) -> str:
    """``s`` if it can go to the sandbox as UTF-8; else InvalidAction saying where it cannot (a
    lone surrogate, which JSON's "\\ud800" can carry)."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidAction(field, f"not valid text: a lone surrogate {s[e.start]!r} at "
                                f"index {e.start} cannot be encoded as UTF-8") from None
    return s


def _rel_path(name: str, path: str) -> str:
    if not path:
        raise InvalidAction(name, f"file path must be a non-empty string, got {path!r}")
    norm = posixpath.normpath(path)
    if posixpath.isabs(path) and norm.startswith("/workdir/"):
        norm = norm[len("/workdir/"):]
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or norm == ".":
        raise InvalidAction(name, f"path {path!r} must stay inside the work directory")
    return norm


def _files(files: Mapping[str, str | None]) -> dict[str, str]:
    out = {}
    for path, b64 in files.items():
        rel = _rel_path("payload.files", path)
        if b64 is None:
            raise InvalidAction("payload.files", f"content of {path!r} must be base64 text")
        try:
            base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise InvalidAction("payload.files", f"content of {path!r} is not base64: {e}") from None
        out[rel] = b64
    return out


def _cases(cases: tuple[Case, ...] | None, most: int) -> list[CaseWire]:
    if not cases:
        raise InvalidAction("payload.cases", "a TEST action needs a non-empty list of cases")
    if len(cases) > most:
        raise InvalidAction("payload.cases", f"at most {most} cases (the CPU manager's "
                            f"max_test_cases), got {len(cases)}")
    out: list[CaseWire] = []
    for i, c in enumerate(cases):
        if c.assert_ is not None:
            out.append({"assert": _utf8(f"payload.cases[{i}].assert", c.assert_)})
            continue
        _utf8(f"payload.cases[{i}].stdin", c.stdin)
        if c.expected_stdout is not None:
            _utf8(f"payload.cases[{i}].expected_stdout", c.expected_stdout)
        out.append({"stdin": c.stdin, "expected_stdout": c.expected_stdout})
    return out


def memory_bytes(req: CodeRequest, allotment: Mapping[str, float],
                 cfg: CpuManagerConfig) -> int:
    mb = float(allotment.get("memory_mb", 0.0)) or float(cfg.default_memory_mb)
    if req.memory_limit_MB > 0:
        mb = min(mb, float(req.memory_limit_MB))
    return int(mb * (1 << 20))


def tmpfs_mb(mem_bytes: int, cfg: CpuManagerConfig) -> int:
    """The size cap of a sandbox's /workdir + /tmp (one tmpfs) under a memory limit of
    ``mem_bytes``: at most half of it, and at most `CpuManagerConfig.workdir_max_mb`. A tmpfs's
    pages are charged to the memory cgroup of whoever writes them, so a cap above the limit
    turned a full /tmp into "memory limit exceeded" (after seconds) instead of ENOSPC; at half,
    a full /tmp answers ENOSPC while the program still has the other half."""
    return max(1, min(cfg.workdir_max_mb, (mem_bytes >> 20) // 2))


@functools.cache
def machine_cpus() -> int:
    """The cores this process may run on (affinity-aware): the most an action is shown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def visible_cpus(action: ActionSpec, quota: float, node_cpus: int) -> float:
    """The cores ``action``'s code is shown (os.cpu_count(), TANGRAM_CPUS, OMP_NUM_THREADS, the
    case runner's workers): an elastic action's maximum, at most ``node_cpus``, from its start,
    so a later resize is used at once; a rigid one its allotment ``quota``. The cgroup quota,
    set from the allotment and rewritten by resizes, is what throttles either."""
    el = action.elasticity
    if el is None or not el.is_elastic or el.dim != CPU:
        return quota
    return max(quota, min(el.max, float(node_cpus)))


def env_for(cpus: float, langs: Mapping[str, Language]) -> dict[str, str]:
    dirs = []
    for lang in langs.values():
        for argv in (lang.compile, lang.run):
            if argv and argv[0].startswith("/"):
                d = posixpath.dirname(argv[0])
                if d not in dirs and d not in _BASE_PATH.split(":"):
                    dirs.append(d)
    n = max(1, math.ceil(cpus - 1e-9))
    return {"PATH": ":".join([*dirs, _BASE_PATH]), "HOME": "/workdir", "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TANGRAM_CPUS": f"{cpus:g}",
            "OMP_NUM_THREADS": str(n), "PYTHONDONTWRITEBYTECODE": "1",
            "GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath"}


def _env(cpus: float, langs: Mapping[str, Language],
         cache: dict[float, dict[str, str]] | None) -> dict[str, str]:
    if cache is None:
        return env_for(cpus, langs)
    env = cache.get(cpus)
    if env is None:
        env = cache[cpus] = env_for(cpus, langs)
        if len(cache) > 64:  # (fractional allotments could be many)
            cache.pop(next(iter(cache)))
    return dict(env)


class LimitsWire(TypedDict):
    """The limits every child of the sandbox runs under (`sandbox.child.Limits`)."""

    uid: int  # the sandbox's unprivileged uid
    gid: int  # ... and gid
    cpu_s: int  # RLIMIT_CPU: CPU seconds of one child (timeouts x the cores it is shown, + 1)
    fsize: int  # RLIMIT_FSIZE: bytes a file may grow to
    nofile: int  # RLIMIT_NOFILE: open files
    output: int  # bytes of stdout (and of stderr) kept per child; the rest is read and dropped
    cpus: float  # cores the code is shown (os.cpu_count(), TANGRAM_CPUS; `visible_cpus`)


# One test case: an ``assert`` (Python), or stdin with the expected stdout. (The functional form:
# ``assert`` is a keyword.)
CaseWire = TypedDict("CaseWire", {
    "assert": str,  # Python: a statement run after the code; the case passes when it does not raise
    "stdin": str,  # fed to the run
    "expected_stdout": str | None,  # compared with the run's stdout (None: the exit code alone)
}, total=False)


class SandboxRequest(TypedDict):
    """What the manager asks a sandbox's init to do (`build_request`); encoded by `wire`."""

    op: Literal["run", "session"]  # a one-shot run, or an action in a session's worker
    lang: LangWire  # how to compile and run the code
    code: str  # the program's source
    stdin: str  # fed to the run (without cases)
    files: dict[str, str]  # path (relative to the work directory) -> base64 content, written first
    fetch_files: list[str]  # paths whose content comes back in the reply (base64)
    compile_timeout: float  # seconds for the compile stage
    run_timeout: float  # seconds for each run (of each case)
    env: dict[str, str]  # the children's environment
    cases: list[CaseWire] | None  # a TEST action's cases, else None
    quota: float  # the allotment's cores: the cgroup's CPU quota (resizes rewrite it)
    stop_on_first_failure: bool  # cases: skip the rest after the first failure
    limits: LimitsWire  # rlimits and identity of every child
    direct: NotRequired[bool]  # (set by `direct`: the init runs it itself, no child)
    # a TEST action's `timeout_s` (at most `max_timeout_s`): the compile stage and every case
    # together end within it (the init stops starting cases and kills those running at it)
    total_timeout: NotRequired[float]
    # the sandbox's /workdir + /tmp tmpfs shrunk to this many MiB before the action (the init
    # remounts it), set when the memory limit is too small for `workdir_max_mb` (`tmpfs_mb`)
    tmpfs_mb: NotRequired[int]


def request_of(action: ActionSpec) -> CodeRequest:
    """``action``'s typed request: its payload when the edge built one, else its payload
    parsed (`kinds.parse_code`: a native or library caller's plain mapping); InvalidAction
    naming the field at fault."""
    return code_request(action.kind, action.payload)


def build_request(action: ActionSpec, allotment: Mapping[str, float],
                  langs: Mapping[str, Language], cfg: CpuManagerConfig,
                  env_cache: dict[float, dict[str, str]] | None = None,
                  request: CodeRequest | None = None) -> SandboxRequest:
    """The sandbox request for ``action`` (``request``: its typed request, `request_of`, when
    the caller has it); raises InvalidAction naming the bad field.

    ``quota`` is the allotment's cores (the sandbox's cgroup quota); ``limits.cpus`` and the
    environment carry the cores the code is shown (`visible_cpus` on this machine's cores).
    ``env_cache``: the caller's memo of `env_for` by CPU count, for one fixed ``langs``."""
    r = request_of(action) if request is None else request
    _utf8("payload.code", r.code)
    session = action.kind == ActionKind.TOOL and action.session
    if session and r.language not in ("python", "bash"):
        raise InvalidAction("payload.language",
                            f"session actions run python or bash, not {r.language!r}")
    if r.language not in langs:
        why = "its toolchain is not installed here" if r.language in ALL_LANGUAGES else "unknown"
        raise InvalidAction("payload.language", f"language {r.language!r} unavailable: {why}; "
                            f"available: {sorted(langs)}")
    quota = float(allotment.get("cpu", 0.0)) or cfg.default_cpus
    cpus = visible_cpus(action, quota, machine_cpus())
    test = action.kind == ActionKind.TEST
    t = code_timeouts(r, action_timeout_s=action.timeout_s,
                      default_compile_s=cfg.default_compile_timeout_s,
                      default_run_s=cfg.default_run_timeout_s, cap_s=cfg.max_timeout_s, test=test)
    stdin = _utf8("payload.stdin", r.stdin)
    fetch = [_rel_path("payload.fetch_files", f) for f in r.fetch_files]
    req: SandboxRequest = {
        "op": "session" if session else "run",
        "lang": langs[r.language].wire(), "code": r.code, "stdin": stdin,
        "files": _files(r.files), "fetch_files": fetch, "compile_timeout": t.compile_s,
        "run_timeout": t.run_s, "env": _env(cpus, langs, env_cache), "cases": None,
        "quota": quota, "stop_on_first_failure": r.stop_on_first_failure,
        "limits": {"uid": cfg.sandbox_uid, "gid": cfg.sandbox_gid, "cpu_s": t.cpu_limit_s(cpus),
                   "fsize": cfg.workdir_max_mb << 20, "nofile": cfg.max_open_files,
                   "output": cfg.output_limit_bytes, "cpus": cpus},
    }
    if test and t.total_s is not None:
        req["cases"] = _cases(r.cases, cfg.max_test_cases)
        req["total_timeout"] = t.total_s
    return req
