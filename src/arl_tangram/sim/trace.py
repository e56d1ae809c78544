"""Trajectories the simulator replays, and the JSON Lines trace format that describes them.

Invariant: a `Trajectory` holds the *truth* of a rollout (how long each action really works, how
long a cold sandbox really takes to start) next to what a submitter would tell the scheduler
(kind, demand, elasticity, hints). Only the latter ever reaches the core: `SimAction.spec` builds
the `ActionSpec` and leaves ``work_s``, ``cold_start_s`` and ``fails`` out.

`load_trace` reads one trajectory per line (see docs/trace-format.md) and reports every problem as
a `SpecError` naming the file, the line and the field (``trace.jsonl:7: steps[2][1].work_s: ...``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.actions import ActionKind, ActionSpec, Elasticity, Speedup, WorkHints
from ..core.build import make_spec
from ..core.errors import InvalidAction, SpecError
from ..core.images import valid_name
from ..core.resources import Resources

DEFAULT_COLD_START_S = 0.57  # docker start on SSD, arXiv 2602.15214 (see docs/workloads.md)


@dataclass(frozen=True, slots=True)
class SimAction:
    """One action of a trajectory: what the scheduler may see, and the simulator-only truth."""

    kind: ActionKind  # action kind (code, test, tool, reward, judge, custom)
    work_s: float  # TRUE work in seconds at one unit of the elastic dimension (model actions:
    # the action's share of a batch's latency, beyond the batch's fixed alpha)
    demand: Resources = field(default_factory=lambda: Resources(cpu=1, memory_mb=256))
    elasticity: Elasticity | None = None  # how it stretches; None: rigid
    hints: WorkHints = field(default_factory=WorkHints)  # what the submitter knows
    session: str | None = None  # name of the trajectory's session it runs in
    model: str | None = None  # reward model / judge for REWARD and JUDGE
    tag: str | None = None  # sub-kind (language, tool name)
    timeout_s: float = 600.0  # execution limit
    weight: float = 1.0
    cold_start_s: float = DEFAULT_COLD_START_S  # TRUE sandbox start cost when started cold
    fails: bool = False  # TRUE outcome: the work itself fails (non-zero exit)
    # a provider call's request (issue 37): calls with the same one coalesce in flight
    # (``payload.coalesce``) and are answered from the simulator's cache when it has one
    query: str | None = None

    def spec(self, action_id: str, *, task: str, trajectory: str, session_id: str | None,
             siblings: str | None = None) -> ActionSpec:
        """The `ActionSpec` the core sees: no true work, no true cold start, no outcome."""
        # ActionSpec(id, kind, demand, elasticity, hints, task, trajectory, session, model, tag,
        # timeout_s, weight, idempotent=True, payload={}, tenant=None, siblings), built fast
        # (core.build)
        return make_spec(action_id, self.kind, self.demand, self.elasticity, self.hints, task,
                         trajectory, session_id, self.model, self.tag, self.timeout_s, self.weight,
                         True, {"coalesce": self.query} if self.query is not None else {}, None,
                         siblings)


@dataclass(frozen=True, slots=True)
class SessionDef:
    """A session a trajectory opens on its first use and closes when it ends."""

    demand: Resources = field(default_factory=lambda: Resources(memory_mb=256))  # held while open
    ttl_s: float = 3600.0  # idle time after which the core may close it
    cold_start_s: float = DEFAULT_COLD_START_S  # TRUE time to create its sandbox
    # environment image it runs in (issue 17): `tangram replay` opens it there; the simulator
    # only asks the core to prefer nodes warm for it ("image:NAME")
    image: str | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One rollout: pairs of (LLM generation seconds, action), replayed closed-loop."""

    id: str  # unique in the run
    task: str  # task family
    steps: tuple[tuple[float, SimAction], ...]  # (generation before the action, the action)
    start: float = 0.0  # offset from the start of its RL step
    sessions: Mapping[str, SessionDef] = field(default_factory=dict)
    rl_step: int = 0  # which RL step's rollout it belongs to
    # its GRPO group (the answers to one prompt: `ActionSpec.siblings` of its actions; issue 39)
    siblings: str | None = None

    def session_id(self, name: str) -> str:
        return f"{self.id}/{name}"


# ---- parsing -------------------------------------------------------------------------------------

_KINDS = {k.value: k for k in ActionKind}
_TRAJ_KEYS = {"id", "task", "start", "steps", "sessions", "step", "siblings"}
_ACTION_KEYS = {
    "kind", "demand", "elasticity", "work_s", "hints", "session", "model", "tag",
    "timeout_s", "weight", "cold_start_s", "fails",
}
_HINT_KEYS = {"expected_s", "test_count", "tokens", "items", "prompt_tokens"}
_ELASTIC_KEYS = {"min", "max", "dim", "parallel_fraction"}
_SESSION_KEYS = {"demand", "ttl_s", "cold_start_s", "image"}


class _Ctx:
    """Where we are in the file, to build errors that name file, line and field."""

    __slots__ = ("file", "line")

    def __init__(self, file: str, line: int) -> None:
        self.file, self.line = file, line

    def fail(self, fieldname: str, msg: str) -> SpecError:
        return SpecError(self.file, self.line, fieldname, msg)


def _number(ctx: _Ctx, raw: Any, where: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or math.isnan(raw) or math.isinf(raw):
        raise ctx.fail(where, f"must be a finite number, got {raw!r}")
    if raw < minimum or (strict and raw == minimum):
        op = ">" if strict else ">="
        raise ctx.fail(where, f"must be {op} {minimum:g}, got {raw!r}")
    return float(raw)


def _mapping(ctx: _Ctx, raw: Any, where: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ctx.fail(where, f"must be an object, got {type(raw).__name__}")
    if allowed is not None:
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ctx.fail(f"{where}.{unknown[0]}", "unknown field")
    return raw


def _resources(ctx: _Ctx, raw: Any, where: str) -> Resources:
    m = _mapping(ctx, raw, where)
    return Resources({str(k): _number(ctx, v, f"{where}.{k}") for k, v in m.items()})


def _elasticity(ctx: _Ctx, raw: Any, where: str) -> Elasticity:
    m = _mapping(ctx, raw, where, _ELASTIC_KEYS)
    lo = _number(ctx, m.get("min", 1.0), f"{where}.min", strict=True)
    hi = _number(ctx, m.get("max", lo), f"{where}.max", minimum=lo)
    p = _number(ctx, m.get("parallel_fraction", 0.0), f"{where}.parallel_fraction")
    if p > 1.0:
        raise ctx.fail(f"{where}.parallel_fraction", f"must be <= 1, got {p!r}")
    dim = m.get("dim", "cpu")
    if not isinstance(dim, str) or not dim:
        raise ctx.fail(f"{where}.dim", f"must be a dimension name, got {dim!r}")
    return Elasticity(min=lo, max=hi, dim=dim, speedup=Speedup(p))


def _hints(ctx: _Ctx, raw: Any, where: str) -> WorkHints:
    m = _mapping(ctx, raw, where, _HINT_KEYS)
    kw: dict[str, Any] = {}
    if "expected_s" in m:
        kw["expected_s"] = _number(ctx, m["expected_s"], f"{where}.expected_s")
    for k in ("test_count", "tokens", "items", "prompt_tokens"):
        if k in m:
            v = m[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ctx.fail(f"{where}.{k}", f"must be a non-negative integer, got {v!r}")
            kw[k] = v
    try:
        return WorkHints(**kw)
    except InvalidAction as exc:  # past what the core holds (core.actions.MAX_HINT_UNITS)
        raise ctx.fail(f"{where}.{exc.field.rsplit('.', 1)[-1]}",
                       str(exc).split(": ", 1)[1]) from None


def _action(ctx: _Ctx, raw: Any, where: str, sessions: Mapping[str, SessionDef]) -> SimAction:
    m = _mapping(ctx, raw, where, _ACTION_KEYS)
    kind_raw = m.get("kind")
    if kind_raw not in _KINDS:
        raise ctx.fail(f"{where}.kind", f"must be one of {sorted(_KINDS)}, got {kind_raw!r}")
    kind = _KINDS[kind_raw]
    if "work_s" not in m:
        raise ctx.fail(f"{where}.work_s", "is required (the true work, seen only by the simulator)")
    kw: dict[str, Any] = {"kind": kind, "work_s": _number(ctx, m["work_s"], f"{where}.work_s")}
    if "demand" in m:
        kw["demand"] = _resources(ctx, m["demand"], f"{where}.demand")
    elif kind.uses_model:
        kw["demand"] = Resources()
    if "elasticity" in m:
        kw["elasticity"] = _elasticity(ctx, m["elasticity"], f"{where}.elasticity")
    if "hints" in m:
        kw["hints"] = _hints(ctx, m["hints"], f"{where}.hints")
    for k in ("session", "model", "tag"):
        if k in m and m[k] is not None:
            if not isinstance(m[k], str) or not m[k]:
                raise ctx.fail(f"{where}.{k}", f"must be a non-empty string, got {m[k]!r}")
            kw[k] = m[k]
    if kind.uses_model and "model" not in kw:
        raise ctx.fail(f"{where}.model", f"is required for kind {kind.value!r}")
    if "session" in kw and kw["session"] not in sessions:
        sessions[kw["session"]] = SessionDef()  # type: ignore[index]
    for k in ("timeout_s", "weight"):
        if k in m:
            kw[k] = _number(ctx, m[k], f"{where}.{k}", strict=True)
    if "cold_start_s" in m:
        kw["cold_start_s"] = _number(ctx, m["cold_start_s"], f"{where}.cold_start_s")
    if "fails" in m:
        if not isinstance(m["fails"], bool):
            raise ctx.fail(f"{where}.fails", f"must be true or false, got {m['fails']!r}")
        kw["fails"] = m["fails"]
    try:
        return SimAction(**kw)
    except ValueError as exc:
        raise ctx.fail(where, str(exc)) from None


def _sessions(ctx: _Ctx, raw: Any) -> dict[str, SessionDef]:
    out: dict[str, SessionDef] = {}
    for name, rs in _mapping(ctx, raw, "sessions").items():
        where = f"sessions.{name}"
        m = _mapping(ctx, rs, where, _SESSION_KEYS)
        kw: dict[str, Any] = {}
        if "demand" in m:
            kw["demand"] = _resources(ctx, m["demand"], f"{where}.demand")
        if "ttl_s" in m:
            kw["ttl_s"] = _number(ctx, m["ttl_s"], f"{where}.ttl_s", strict=True)
        if "cold_start_s" in m:
            kw["cold_start_s"] = _number(ctx, m["cold_start_s"], f"{where}.cold_start_s")
        if m.get("image") is not None:
            img = m["image"]
            if not valid_name(img):
                raise ctx.fail(f"{where}.image", f"must be an image name ([A-Za-z0-9][A-Za-z0-9._:@+-]*, "
                               f"at most 128 characters), got {img!r}")
            kw["image"] = img
        out[str(name)] = SessionDef(**kw)
    return out


def parse_trajectory(obj: Any, file: str = "<trace>", line: int = 1) -> Trajectory:
    """Build a `Trajectory` from one decoded JSON line; errors name ``file:line: field``."""
    ctx = _Ctx(file, line)
    m = _mapping(ctx, obj, "<line>", _TRAJ_KEYS)
    tid = m.get("id")
    if not isinstance(tid, str | int) or isinstance(tid, bool) or tid == "":
        raise ctx.fail("id", f"must be a non-empty string, got {tid!r}")
    task = m.get("task", "default")
    if not isinstance(task, str) or not task:
        raise ctx.fail("task", f"must be a non-empty string, got {task!r}")
    start = _number(ctx, m.get("start", 0.0), "start")
    rl_step = m.get("step", 0)
    if isinstance(rl_step, bool) or not isinstance(rl_step, int) or rl_step < 0:
        raise ctx.fail("step", f"must be a non-negative integer, got {rl_step!r}")
    sessions = _sessions(ctx, m["sessions"]) if "sessions" in m else {}
    siblings = m.get("siblings")
    if siblings is not None and (not isinstance(siblings, str) or not siblings):
        raise ctx.fail("siblings", f"must be a non-empty string, got {siblings!r}")
    raw_steps = m.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ctx.fail("steps", "must be a non-empty list of [gen_s, action] pairs")
    steps: list[tuple[float, SimAction]] = []
    for i, pair in enumerate(raw_steps):
        where = f"steps[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise ctx.fail(where, "must be a pair [gen_s, action]")
        gen = _number(ctx, pair[0], f"{where}[0]")
        steps.append((gen, _action(ctx, pair[1], f"{where}[1]", sessions)))
    return Trajectory(str(tid), task, tuple(steps), start, sessions, rl_step, siblings)


def iter_trace(path: str | Path) -> Iterator[Trajectory]:
    """Trajectories of a JSON Lines trace, in file order (blank and ``#`` lines are skipped)."""
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(p), None, "<file>", f"cannot read: {exc.strerror}") from None
    seen: dict[str, int] = {}
    with fh:
        for lineno, text in enumerate(fh, start=1):
            text = text.strip()
            if not text or text.startswith("#"):
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SpecError(str(p), lineno, "<json>", f"{exc.msg} (column {exc.colno})") from None
            traj = parse_trajectory(obj, str(p), lineno)
            if traj.id in seen:
                raise SpecError(str(p), lineno, "id", f"duplicate id {traj.id!r} (first on line {seen[traj.id]})")
            seen[traj.id] = lineno
            yield traj


def load_trace(path: str | Path) -> list[Trajectory]:
    trajs = list(iter_trace(path))
    if not trajs:
        raise SpecError(str(path), None, "<file>", "the trace holds no trajectory")
    return trajs


# ---- writing -------------------------------------------------------------------------------------


def _action_json(a: SimAction) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": a.kind.value, "work_s": round(a.work_s, 6), "demand": a.demand.as_dict()}
    if a.elasticity is not None:
        el = a.elasticity
        out["elasticity"] = {"min": el.min, "max": el.max, "dim": el.dim,
                             "parallel_fraction": el.speedup.parallel_fraction}
    hints = {k: getattr(a.hints, k) for k in _HINT_KEYS if getattr(a.hints, k) is not None}
    if hints:
        out["hints"] = hints
    for k in ("session", "model", "tag"):
        if getattr(a, k) is not None:
            out[k] = getattr(a, k)
    out["timeout_s"] = a.timeout_s
    if a.weight != 1.0:
        out["weight"] = a.weight
    out["cold_start_s"] = a.cold_start_s
    if a.fails:
        out["fails"] = True
    return out


def trajectory_json(t: Trajectory) -> dict[str, Any]:
    """The JSON object of one trace line (inverse of `parse_trajectory`)."""
    out: dict[str, Any] = {"id": t.id, "task": t.task, "start": t.start}
    if t.rl_step:
        out["step"] = t.rl_step
    if t.siblings is not None:
        out["siblings"] = t.siblings
    if t.sessions:
        out["sessions"] = {
            n: {"demand": s.demand.as_dict(), "ttl_s": s.ttl_s, "cold_start_s": s.cold_start_s,
                **({"image": s.image} if s.image is not None else {})}
            for n, s in t.sessions.items()
        }
    out["steps"] = [[round(g, 6), _action_json(a)] for g, a in t.steps]
    return out


def dump_trace(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    """Write trajectories as JSON Lines; returns how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for t in trajectories:
            fh.write(json.dumps(trajectory_json(t), sort_keys=False) + "\n")
            n += 1
    return n
