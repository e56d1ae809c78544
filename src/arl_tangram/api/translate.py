"""Translation between wire requests and core actions, shared by the HTTP API and the SDK's
embedded mode.

Invariant: everything a client sends becomes `ActionSpec`s here, and every error is an
`InvalidAction` naming the field; results go back out in the wire shape their route promises
(SandboxFusion's RunCodeResponse always has its keys, with string stdout/stderr).
A request naming several reward models is fanned out into one action per model
(``<id>.<model>``) and joined by `join_group`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.actions import (
    ActionKind,
    ActionResult,
    ActionSpec,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from ..core.errors import InvalidAction
from ..core.resources import Resources
from ..managers.cpu.host import result as sandboxfusion
from .schemas import ActionIn, RunCodeRequest, file_name_problem

# Memory a sandbox gets when the request sets no memory_limit_MB (-1).
DEFAULT_MEMORY_MB = 512


def new_id() -> str:
    return uuid.uuid4().hex


def run_code_action(req: RunCodeRequest, *, action_id: str | None = None,
                    session: str | None = None) -> ActionSpec:
    """SandboxFusion /run_code -> one CODE action."""
    mem = req.memory_limit_MB if req.memory_limit_MB > 0 else DEFAULT_MEMORY_MB
    payload = req.model_dump()
    payload["stdin"] = payload["stdin"] or ""
    return ActionSpec(
        id=action_id or new_id(), kind=ActionKind.CODE,
        demand=Resources(cpu=1, memory_mb=mem),
        timeout_s=req.compile_timeout + req.run_timeout + 5.0,
        tag=req.language, session=session, payload=payload,
    )


def _demand(a: ActionIn, where: str) -> Resources:
    if a.demand is None:
        if a.kind in ("reward", "judge"):
            return Resources()
        return Resources(cpu=1, memory_mb=DEFAULT_MEMORY_MB)
    try:
        return Resources(a.demand)
    except ValueError as exc:
        raise InvalidAction(f"{where}.demand", str(exc)) from None


def _check_file_names(payload: Mapping[str, Any], where: str) -> None:
    """The names in a payload's ``files`` (keys) and ``fetch_files`` are file names a sandbox can
    make (`schemas.file_name_problem`); InvalidAction naming the field else. (Their other rules,
    inside the work directory, base64 content, are the CPU manager's.)"""
    for key in ("files", "fetch_files"):
        names = payload.get(key)
        if isinstance(names, Mapping | list):
            for name in names:
                why = file_name_problem(name) if isinstance(name, str) else None
                if why is not None:
                    raise InvalidAction(f"{where}.{key}", why)


def native_actions(a: ActionIn, where: str = "action",
                   default_model: str | None = None) -> list[ActionSpec]:
    """One native action (several when it names several models)."""
    aid = a.id or new_id()
    kind = ActionKind(a.kind)
    models: list[str | None] = [None]
    if kind.uses_model:
        names = a.models or ([a.model] if a.model else [default_model] if default_model else [])
        if not names:
            raise InvalidAction(f"{where}.model", f"a {kind.value} action needs a model name")
        if len(set(names)) != len(names):
            raise InvalidAction(f"{where}.models", "model names repeat")
        models = list(names)
    elif a.models or a.model:
        raise InvalidAction(f"{where}.model", f"a {kind.value} action takes no model")
    el = None
    if a.elasticity is not None:
        e = a.elasticity
        try:
            el = Elasticity(e.min, e.max, e.dim, Speedup(e.parallel_fraction))
        except ValueError as exc:
            raise InvalidAction(f"{where}.elasticity", str(exc)) from None
    try:
        hints = WorkHints(**a.hints.model_dump()) if a.hints is not None else WorkHints()
    except InvalidAction as exc:
        raise InvalidAction(f"{where}.{exc.field}", str(exc).split(": ", 1)[1]) from None
    _check_file_names(a.payload, f"{where}.payload")
    demand = _demand(a, where)
    out = []
    for m in models:
        try:
            out.append(ActionSpec(
                id=aid if len(models) == 1 else f"{aid}.{m}", kind=kind, demand=demand,
                elasticity=el, hints=hints, task=a.task, trajectory=a.trajectory,
                session=a.session, model=m, tag=a.tag, timeout_s=a.timeout_s, weight=a.weight,
                idempotent=a.idempotent, payload=dict(a.payload),
            ))
        except ValueError as exc:
            raise InvalidAction(where, str(exc)) from None
    return out


def reward_actions(payloads: Sequence[Mapping[str, Any]], models: Sequence[str], *,
                   task: str = "rlhf") -> list[list[ActionSpec]]:
    """One REWARD action per (payload, model); outer list per payload."""
    return [
        [ActionSpec(id=new_id(), kind=ActionKind.REWARD, demand=Resources(), model=m, task=task,
                    payload=dict(p), hints=WorkHints(items=1)) for m in models]
        for p in payloads
    ]


# ---- results ------------------------------------------------------------------------------------


def result_dict(r: ActionResult) -> dict[str, Any]:
    return {
        "id": r.id, "status": r.status.name.lower(), "finished": r.status.is_finished,
        "submit_time": r.submit_time, "start_time": r.start_time, "finish_time": r.finish_time,
        "act": r.act, "node": r.node, "output": r.output, "reason": r.reason,
        "attempts": r.attempts,
    }


def pending_dict(action_id: str, status: Status) -> dict[str, Any]:
    return {"id": action_id, "status": status.name.lower(), "finished": False, "output": None,
            "reason": ""}


def join_group(group_id: str, parts: Sequence[ActionResult]) -> ActionResult:
    """Several scores of one response: one result whose output maps model -> output."""
    worst = max(p.status for p in parts)
    status = Status.SUCCEEDED if all(p.status == Status.SUCCEEDED for p in parts) else worst
    scores = {}
    for p in parts:
        model = p.id.rsplit(".", 1)[-1]
        scores[model] = p.output if p.status == Status.SUCCEEDED else {"error": p.reason}
    finishes = [p.finish_time for p in parts if p.finish_time is not None]
    starts = [p.start_time for p in parts if p.start_time is not None]
    return ActionResult(
        id=group_id, status=status, submit_time=min(p.submit_time for p in parts),
        start_time=min(starts) if starts else None,
        finish_time=max(finishes) if len(finishes) == len(parts) else None,
        output={"scores": scores}, reason="; ".join(p.reason for p in parts if p.reason),
    )


def run_code_response(r: ActionResult, pod: str | None = None) -> dict[str, Any]:
    """A finished CODE action as SandboxFusion's RunCodeResponse (extras kept): the shape's one
    owner is the CPU manager's result (`managers.cpu.host.result`)."""
    return sandboxfusion.run_code_response(r.output, r.status, r.reason, r.node or pod)


def score_of(output: Any) -> float:
    if isinstance(output, Mapping) and isinstance(output.get("score"), int | float):
        return float(output["score"])
    raise ValueError(f"no score in output {output!r}")
