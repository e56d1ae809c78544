"""A native action for a generative judge (kind genjudge) is typed at the edge (issue 36): its
payload parsed once into `kinds.JudgeRequest` before it is submitted, a bad one a 400 naming the
field under ``actions[i]``; nothing is submitted then."""

from __future__ import annotations

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.api.schemas import ActionsIn
from arl_tangram.api.service import Service
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.kinds import ChatTurn, JudgeRequest, ScoreRequest
from arl_tangram.runtime.config import ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

CFG = ServiceConfig(models=(ModelSpec("gj", kind="genjudge", path="/nowhere"),
                            ModelSpec("rm", kind="scalar", path="/nowhere")))


@pytest.mark.parametrize(("payload", "field", "detail"), [
    ({"messages": [{"role": "robot", "content": "x"}]}, "actions[0].payload.messages[0]",
     "needs role (system|user|assistant) and content (a string)"),
    ({"prompt": "x"}, "actions[0].payload", "needs query, prompt and response, or messages"),
    ({"openai": {"route": "completions", "body": {"prompt": "x"}}},
     "actions[0].payload.openai.body.max_tokens", "is required (an integer >= 1)"),
])
async def test_a_bad_judge_payload_is_a_400_naming_the_field(payload: dict, field: str,
                                                              detail: str) -> None:
    ex = FakeExecutor()
    eng = Engine(ex, EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(eng, CFG)),
                                     base_url="http://t") as c:
            r = await c.post("/v1/actions", json={"kind": "judge", "model": "gj",
                                                  "payload": payload})
        assert r.status_code == 400, r.text
        assert (r.json()["field"], r.json()["detail"]) == (field, f"{field}: {detail}")
        assert ex.commands == []  # nothing reached the node
    finally:
        await eng.aclose()


async def test_the_edge_types_a_judges_payload_once_and_leaves_other_models_alone() -> None:
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    svc = Service(eng, CFG)
    body = ActionsIn.model_validate({"actions": [
        {"kind": "judge", "model": "gj", "payload": {"messages": [{"role": "user",
                                                                   "content": "ok?"}]}},
        {"kind": "reward", "model": "rm", "payload": {"query": "q"}}]})
    flat, _, _ = svc._specs(body)
    assert flat[0].payload == JudgeRequest(messages=(ChatTurn("user", "ok?"),))
    assert isinstance(flat[0].payload, JudgeRequest)
    assert flat[1].payload == {"query": "q"} and not isinstance(flat[1].payload, ScoreRequest)


async def test_the_token_hint_counts_every_completion_asked_for(monkeypatch) -> None:
    """The scheduler's size of an OpenAI request is max_tokens x n (x prompts): what the judge
    may generate for it, so a request of n=2 weighs twice one of n=1."""
    from arl_tangram.core.actions import ActionResult, Status
    from arl_tangram.kinds import Completion

    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    seen: list = []
    submit = eng.submit_nowait

    def capture(specs, **kw):  # type: ignore[no-untyped-def]
        seen.extend(specs)
        return submit(specs, **kw)

    async def answer(aid: str, wait: float | None = None) -> ActionResult:
        route = "chat/completions" if "messages" in str(seen[-1].payload) else "completions"
        data = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        return ActionResult(aid, Status.SUCCEEDED, 0.0, output=Completion.of("gj", route, data))

    monkeypatch.setattr(eng, "submit_nowait", capture)
    monkeypatch.setattr(eng, "result", answer)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(eng, CFG)),
                                     base_url="http://t") as c:
            r = await c.post("/v1/chat/completions", json={
                "model": "gj", "messages": [{"role": "user", "content": "ok?"}],
                "max_tokens": 5, "n": 2})
            assert r.status_code == 200, r.text
            r = await c.post("/v1/completions", json={"model": "gj", "prompt": ["a", "b", "c"],
                                                      "max_tokens": 5, "n": 2})
            assert r.status_code == 200, r.text
        assert [(s.hints.tokens, s.hints.items) for s in seen] == [(10, 1), (30, 1)]
    finally:
        await eng.aclose()
