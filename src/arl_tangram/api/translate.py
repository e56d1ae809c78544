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
from ..kinds import (
    DEFAULT_MEMORY_MB,
    EDGE_GRACE_S,
    CodeRequest,
    CommandRunStatus,
    JudgeVerdict,
    Outcome,
    RunResult,
    RunStatus,
    ScoreRequest,
    ScoreResult,
    StageResult,
    code_timeouts,
)
from .schemas import ActionIn, file_name_problem


def new_id() -> str:
    return uuid.uuid4().hex


def run_code_action(req: CodeRequest, *, action_id: str | None = None,
                    session: str | None = None) -> ActionSpec:
    """SandboxFusion /run_code (its typed request, `RunCodeRequest.request`) -> one CODE
    action, carrying the request as its payload."""
    return ActionSpec(
        id=action_id or new_id(), kind=ActionKind.CODE,
        demand=Resources(cpu=1, memory_mb=req.memory_mb),
        timeout_s=code_timeouts(req).within(EDGE_GRACE_S),
        tag=req.language, session=session, payload=req,
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
                idempotent=a.idempotent, payload=dict(a.payload), siblings=a.siblings,
            ))
        except ValueError as exc:
            raise InvalidAction(where, str(exc)) from None
    return out


def reward_actions(requests: Sequence[ScoreRequest], models: Sequence[str], *,
                   task: str = "rlhf") -> list[list[ActionSpec]]:
    """One REWARD action per (request, model), carrying the request; outer list per request."""
    return [
        [ActionSpec(id=new_id(), kind=ActionKind.REWARD, demand=Resources(), model=m, task=task,
                    payload=r, hints=WorkHints(items=1)) for m in models]
        for r in requests
    ]


# ---- results ------------------------------------------------------------------------------------


def result_dict(r: ActionResult) -> dict[str, Any]:
    return {
        "id": r.id, "status": r.status.name.lower(), "finished": r.status.is_finished,
        "submit_time": r.submit_time, "start_time": r.start_time, "finish_time": r.finish_time,
        "act": r.act, "node": r.node, "output": output_body(r.output), "reason": r.reason,
        "attempts": r.attempts,
    }


def output_body(output: Any) -> Any:
    """An action's output as its wire body: a typed outcome rendered (`kinds`: `RunResult`, an
    `Outcome`), any other output (a manager's JSON-ready dict) as it is."""
    if isinstance(output, Outcome):  # (a RunResult is one too)
        return output.to_dict()
    return output


def pending_dict(action_id: str, status: Status) -> dict[str, Any]:
    return {"id": action_id, "status": status.name.lower(), "finished": False, "output": None,
            "reason": ""}


def join_group(group_id: str, parts: Sequence[ActionResult]) -> ActionResult:
    """Several scores of one response: one result whose output maps model -> output. A part's
    id is ``<group_id>.<model>`` (`native_actions`): its model is all that follows the group's
    id, dots included (a model named ``qwen2.5-rm``)."""
    worst = max(p.status for p in parts)
    status = Status.SUCCEEDED if all(p.status == Status.SUCCEEDED for p in parts) else worst
    scores = {}
    cut = len(group_id) + 1
    for p in parts:
        model = p.id[cut:]
        scores[model] = output_body(p.output) if p.status == Status.SUCCEEDED else {"error": p.reason}
    finishes = [p.finish_time for p in parts if p.finish_time is not None]
    starts = [p.start_time for p in parts if p.start_time is not None]
    return ActionResult(
        id=group_id, status=status, submit_time=min(p.submit_time for p in parts),
        start_time=min(starts) if starts else None,
        finish_time=max(finishes) if len(finishes) == len(parts) else None,
        output={"scores": scores}, reason="; ".join(p.reason for p in parts if p.reason),
    )


def run_code_response(r: ActionResult, pod: str | None = None) -> dict[str, Any]:
    """A finished CODE action as SandboxFusion's RunCodeResponse (extras kept)."""
    return run_code_body(r.output, r.status, r.reason, r.node or pod)


def run_code_body(output: Any, status: Status, reason: str, pod: str | None) -> dict[str, Any]:
    """SandboxFusion's RunCodeResponse of a finished CODE action: ``output`` as the CPU manager
    made it (`kinds.RunResult`, rendered with its extras; a RunCodeResponse-shaped dict of
    another producer completed, ``pod`` where it names none), else the shape of an action no
    sandbox answered (timed out before it ran, cancelled, its node lost), from its ``status``
    and ``reason``. The shape's one owner is `kinds.RunResult.to_dict`."""
    if isinstance(output, RunResult):
        return output.to_dict()
    if isinstance(output, Mapping) and output.get("status") in _RUN_STATUSES:
        d = dict(output)
        for key, empty in (("message", ""), ("compile_result", None), ("run_result", None),
                           ("files", {})):
            d.setdefault(key, empty)
        d.setdefault("executor_pod_name", pod)
        return d
    reason = reason or status.name.lower()
    if status == Status.TIMED_OUT:
        return RunResult(status=RunStatus.Failed, message=reason, executor_pod_name=pod,
                         run_result=StageResult(CommandRunStatus.TimeLimitExceeded)
                         ).to_dict(extras=False)
    return RunResult.sandbox_error(f"{status.name.lower()}: {reason}", pod).to_dict(extras=False)


_RUN_STATUSES = frozenset(s.value for s in RunStatus)


def score_of(output: Any) -> float:
    """The reward of a score's outcome (`kinds.ScoreResult`, a generative judge's
    `kinds.JudgeVerdict`; a mapping with a numeric ``score``, from a library's manager)."""
    if isinstance(output, ScoreResult | JudgeVerdict):
        return float(output.score)
    if isinstance(output, Mapping) and isinstance(output.get("score"), int | float):
        return float(output["score"])
    raise ValueError(f"no score in output {output!r}")
