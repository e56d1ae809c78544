"""Judge compat (issue 38): OpenAI-style ``POST /v1/chat/completions`` and ``POST /v1/completions``
for a configured judge engine (a model of kind ``genjudge``), for reward functions that already
speak OpenAI's API. Installed by `app.create_app` (`add_routes`).

Each request is ONE judge action of the named model, scheduled like any other (queued in the
model's order, batched continuously into a running instance, requeued once if its engine dies,
counted against the tenant's quota); the instance's engine generates and the answer comes back
in OpenAI's schema, pinned here field by field:

    chat:       {"id", "object": "chat.completion", "created", "model",
                 "choices": [{"index", "message": {"role": "assistant", "content"},
                              "logprobs": null, "finish_reason"}],
                 "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
    completion: {"id", "object": "text_completion", "created", "model",
                 "choices": [{"index", "text", "logprobs": null, "finish_reason"}], "usage": {...}}

Bad input is a 400 naming the field (``model`` unknown or not a judge engine, ``messages``
empty, ``max_tokens`` past the model's ``max_model_len``, ``stream``: not supported) or a 422 from
the schema (a wrong type, ``n`` outside 1..16, ``temperature`` outside 0..2). The engine's own
refusal of a request (a prompt longer than its context) is a 400 with its message; an engine
that failed is a 502.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ..core.actions import ActionKind, ActionSpec, Status, WorkHints
from ..core.errors import BrokenError, InvalidAction
from ..core.resources import Resources
from ..kinds import ChatTurn, Completion, JudgeRequest, Sampling
from .middleware import TENANT_KEY
from .translate import new_id

MAX_N = 16  # choices per request
MAX_STOP = 4  # stop sequences (OpenAI's limit)
DEFAULT_MAX_TOKENS = 256  # when the request names none (capped by the model's context)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we need not read

    model: str = Field(..., max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    stream: bool = False
    ignore_eos: bool | None = None  # vLLM's extension: generate max_tokens whatever comes
    user: str | None = Field(None, max_length=256)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]


class ChatIn(_Common):
    messages: list[ChatMessage]


class CompletionIn(_Common):
    prompt: str | list[str]


def _text_of(content: str | list[dict[str, Any]], i: int) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, p in enumerate(content):
        if p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise InvalidAction(f"messages[{i}].content[{j}]", "only text parts are supported")
        parts.append(p["text"])
    return "".join(parts)


def _sampling(svc: Any, req: _Common) -> tuple[str, Sampling]:
    """The judge model's name and the request's sampling (`kinds.Sampling`); InvalidAction
    naming the field when the request cannot be served."""
    spec = svc.config.model(req.model)
    if spec is None:
        judges = ", ".join(m.name for m in svc.config.models if m.kind == "genjudge")
        raise InvalidAction("model", f"unknown model {req.model!r} (judge engines: "
                                     f"{judges or 'none configured'})")
    if spec.kind != "genjudge":
        raise InvalidAction("model", f"model {req.model!r} is of kind {spec.kind}; this route "
                                     "serves judge engines (kind genjudge)")
    if req.stream:
        raise InvalidAction("stream", "streaming is not supported; send stream: false")
    ctx = int(spec.options.get("max_model_len", 4096))
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    asked = req.max_completion_tokens or req.max_tokens
    if asked is not None and asked >= ctx:
        raise InvalidAction(field, f"{asked} tokens: the model {req.model!r} has a context of "
                                   f"{ctx} tokens (max_tokens must be below it)")
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if stop is not None and len(stop) > MAX_STOP:
        raise InvalidAction("stop", f"at most {MAX_STOP} stop sequences, got {len(stop)}")
    return spec.name, Sampling(
        max_tokens=asked if asked is not None else min(DEFAULT_MAX_TOKENS, ctx // 2), n=req.n,
        temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=tuple(stop or ()),
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        ignore_eos=req.ignore_eos)


async def _run(svc: Any, request: Request, name: str, req: JudgeRequest,
               tokens: int) -> Completion:
    t = request.scope.get(TENANT_KEY)
    tenant = t if isinstance(t, str) else None
    spec = ActionSpec(id=new_id(), kind=ActionKind.JUDGE, demand=Resources(), model=name,
                      task="judge", payload=req, hints=WorkHints(items=1, tokens=tokens))
    if tenant is not None:
        svc.tenancy.admit(tenant, [spec])
    svc.engine.submit_nowait([spec])
    if tenant is not None:
        svc.tenancy.started(tenant, [spec])
    r = await svc.engine.result(spec.id)
    if r is None or r.status != Status.SUCCEEDED:
        reason = r.reason if r is not None else "lost"
        if " answered 400: " in reason:  # the engine refused the request itself
            raise InvalidAction("body", reason.split(" answered 400: ", 1)[1][:500])
        raise BrokenError(f"judge {name} failed: {r.status.name.lower() if r else 'lost'}: {reason}")
    if not isinstance(r.output, Completion):
        raise BrokenError(f"judge {name} gave no completion")
    return r.output


def _usage(c: Completion) -> dict[str, int]:
    p, n = c.prompt_tokens, c.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def chat_response(name: str, c: Completion) -> dict[str, Any]:
    """OpenAI's chat.completion body of a judge's completion (its one owner)."""
    choices = [{"index": ch.index, "message": {"role": "assistant", "content": ch.text},
                "logprobs": None, "finish_reason": ch.finish_reason} for ch in c.choices]
    return {"id": f"chatcmpl-{new_id()}", "object": "chat.completion",
            "created": int(time.time()), "model": name, "choices": choices, "usage": _usage(c)}


def completion_response(name: str, c: Completion) -> dict[str, Any]:
    """OpenAI's text_completion body of a judge's completion (its one owner)."""
    choices = [{"index": ch.index, "text": ch.text, "logprobs": None,
                "finish_reason": ch.finish_reason} for ch in c.choices]
    return {"id": f"cmpl-{new_id()}", "object": "text_completion", "created": int(time.time()),
            "model": name, "choices": choices, "usage": _usage(c)}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "a field the judge cannot serve (named in `field`)"},
    429: {"description": "the tenant's quota is spent"},
    502: {"description": "the judge engine failed"},
}


def add_routes(app: FastAPI, svc: Any) -> None:
    @app.post("/v1/chat/completions", tags=["judge"], responses=_RESPONSES)
    async def chat_completions(body: ChatIn, request: Request) -> Response:
        if not body.messages:
            raise InvalidAction("messages", "must not be empty")
        name, sampling = _sampling(svc, body)
        req = JudgeRequest(route="chat/completions", sampling=sampling, messages=tuple(
            ChatTurn("system" if m.role == "developer" else m.role, _text_of(m.content, i))
            for i, m in enumerate(body.messages)))
        raw = await _run(svc, request, name, req, sampling.max_tokens * body.n)
        return JSONResponse(chat_response(name, raw))

    @app.post("/v1/completions", tags=["judge"], responses=_RESPONSES)
    async def completions(body: CompletionIn, request: Request) -> Response:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not prompts or (len(prompts) == 1 and not prompts[0]):
            raise InvalidAction("prompt", "must not be empty")
        if len(prompts) * body.n > MAX_N:
            raise InvalidAction("prompt", f"{len(prompts)} prompts x n={body.n}: at most {MAX_N} "
                                          "completions per request")
        name, sampling = _sampling(svc, body)
        req = JudgeRequest(route="completions", sampling=sampling,
                           prompt=body.prompt if isinstance(body.prompt, str) else tuple(prompts))
        raw = await _run(svc, request, name, req, sampling.max_tokens * body.n * len(prompts))
        return JSONResponse(completion_response(name, raw))
