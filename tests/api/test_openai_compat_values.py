"""Judge compat (`api/openai_compat.py`, issue 38) on exact values, fast and without an engine
(issue 43: its mutants; the real vLLM engine and client are tests/api/test_openai_compat.py).

The answers are checked against OpenAI's own schema: the `openai` package's response models
(`openai.types.chat.ChatCompletion`, `openai.types.Completion`, generated from OpenAI's
published OpenAPI spec), which the real client parses our bodies with; each body must carry
every field the peer requires, validate as its model, and read back the same values. The
request fields we read are the peer's create params' (``ignore_eos`` is vLLM's extension).
Each bound of the request schema is pinned at both sides; each refusal by its field and words.
"""

from __future__ import annotations

import re
import time
import typing
from types import SimpleNamespace
from typing import Any

import httpx
import pydantic
import pytest
from fakes import FakeExecutor, core_factory
from openai.types import Completion as PeerCompletion
from openai.types import completion_create_params as peer_completion_params
from openai.types.chat import ChatCompletion as PeerChatCompletion
from openai.types.chat import completion_create_params as peer_chat_params

from arl_tangram.api import openai_compat as O
from arl_tangram.api.app import create_app
from arl_tangram.api.middleware import TENANT_KEY
from arl_tangram.core.actions import ActionKind, ActionResult, Status, WorkHints
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError, InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import ChatTurn, Choice, Completion, JudgeRequest, Sampling
from arl_tangram.runtime.config import ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

CFG = ServiceConfig(models=(
    ModelSpec("gj", kind="genjudge", path="/nowhere", options={"max_model_len": 300}),
    ModelSpec("rm", kind="scalar", path="/nowhere"),
    ModelSpec("gk", kind="genjudge", path="/nowhere")))  # (no max_model_len: 4096)


def _completion(route: str, n: int = 1) -> Completion:
    return Completion(
        model="gj", route=route, prompt_tokens=7, completion_tokens=5,
        choices=tuple(Choice(i, f"text {i}", "length" if i else "stop") for i in range(n)),
        response={"engine": "body"})


# ---- the answers, against OpenAI's own response models -----------------------------------------


def _peer_fields(model: type[pydantic.BaseModel]) -> set[str]:
    return {k for k, f in model.model_fields.items() if f.is_required()}


def test_constants() -> None:
    assert (O.MAX_N, O.MAX_STOP, O.DEFAULT_MAX_TOKENS) == (16, 4, 256)


def test_chat_body_is_openais_chat_completion() -> None:
    before = int(time.time())
    body = O.chat_response("gj", _completion("chat/completions", n=2))
    after = int(time.time())
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"]), body["id"]
    assert before <= body["created"] <= after and type(body["created"]) is int
    assert body == {
        "id": body["id"], "object": "chat.completion", "created": body["created"], "model": "gj",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "text 0"}, "logprobs": None,
             "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "text 1"}, "logprobs": None,
             "finish_reason": "length"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    assert _peer_fields(PeerChatCompletion) <= set(body)
    peer = PeerChatCompletion.model_validate(body)
    assert typing.get_args(PeerChatCompletion.model_fields["object"].annotation) == (
        "chat.completion",)
    assert peer.model_dump(exclude_unset=True) == body  # every value read back as sent
    assert [c.message.content for c in peer.choices] == ["text 0", "text 1"]
    assert peer.usage is not None and peer.usage.total_tokens == 12
    assert O.chat_response("gj", _completion("chat/completions"))["id"] != body["id"]


def test_completion_body_is_openais_text_completion() -> None:
    before = int(time.time())
    body = O.completion_response("gj", _completion("completions", n=2))
    after = int(time.time())
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", body["id"]), body["id"]
    assert before <= body["created"] <= after and type(body["created"]) is int
    assert body == {
        "id": body["id"], "object": "text_completion", "created": body["created"], "model": "gj",
        "choices": [
            {"index": 0, "text": "text 0", "logprobs": None, "finish_reason": "stop"},
            {"index": 1, "text": "text 1", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    assert _peer_fields(PeerCompletion) <= set(body)
    peer = PeerCompletion.model_validate(body)
    assert typing.get_args(PeerCompletion.model_fields["object"].annotation) == (
        "text_completion",)
    assert peer.model_dump(exclude_unset=True) == body
    assert O.completion_response("gj", _completion("completions"))["id"] != body["id"]


def test_request_fields_are_the_peers() -> None:
    """Every field we read is a field of OpenAI's create params (``ignore_eos``: vLLM's), so a
    client's request means here what it means there."""
    chat = set(peer_chat_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    comp = set(peer_completion_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert set(O.ChatIn.model_fields) - chat == {"ignore_eos"}
    assert set(O.CompletionIn.model_fields) - comp == {"ignore_eos", "max_completion_tokens"}
    assert O.ChatIn.model_config["extra"] == "ignore"


# ---- the request schema: defaults and each bound at both sides ---------------------------------


def test_request_defaults() -> None:
    body = O.ChatIn.model_validate({"model": "gj", "messages": [
        {"role": "user", "content": "x", "name": "ignored"}], "logit_bias": {"1": 2}})
    assert body.model_dump() == {
        "model": "gj", "max_tokens": None, "max_completion_tokens": None, "temperature": None,
        "top_p": None, "n": 1, "seed": None, "stop": None, "presence_penalty": None,
        "frequency_penalty": None, "stream": False, "ignore_eos": None, "user": None,
        "messages": [{"role": "user", "content": "x"}]}
    assert O.CompletionIn.model_validate({"model": "gj", "prompt": ["a"]}).prompt == ["a"]


_OK_BAD: list[tuple[str, Any, Any]] = [
    ("model", "m" * 256, "m" * 257),
    ("max_tokens", 1, 0),
    ("max_completion_tokens", 1, 0),
    ("temperature", 0.0, -0.001),
    ("temperature", 2.0, 2.001),
    ("temperature", 1.0, float("inf")),
    ("temperature", 1.0, float("nan")),
    ("top_p", 1.0, 0.0),
    ("top_p", 1e-9, 1.001),
    ("top_p", 0.5, float("nan")),
    ("n", 1, 0),
    ("n", 16, 17),
    ("seed", 0, -1),
    ("seed", 2**63 - 1, 2**63),
    ("presence_penalty", -2.0, -2.001),
    ("presence_penalty", 2.0, 2.001),
    ("presence_penalty", 0.0, float("inf")),
    ("frequency_penalty", -2.0, -2.001),
    ("frequency_penalty", 2.0, 2.001),
    ("frequency_penalty", 0.0, float("nan")),
    ("user", "u" * 256, "u" * 257),
]


@pytest.mark.parametrize(("name", "ok", "bad"), _OK_BAD)
def test_each_bound(name: str, ok: Any, bad: Any) -> None:
    base = {"model": "gj", "prompt": "x"}
    got = getattr(O.CompletionIn.model_validate({**base, name: ok}), name)
    assert got == ok
    with pytest.raises(pydantic.ValidationError) as e:
        O.CompletionIn.model_validate({**base, name: bad})
    assert [err["loc"] for err in e.value.errors()] == [(name,)]


def test_required_fields_and_roles() -> None:
    for missing in ("model", "prompt"):
        body = {"model": "gj", "prompt": "x"}
        del body[missing]
        with pytest.raises(pydantic.ValidationError):
            O.CompletionIn.model_validate(body)
    for role in ("system", "user", "assistant", "developer"):
        assert O.ChatMessage.model_validate({"role": role, "content": "x"}).role == role
    with pytest.raises(pydantic.ValidationError):
        O.ChatMessage.model_validate({"role": "tool", "content": "x"})


# ---- _text_of, _sampling ----------------------------------------------------------------------


def test_text_of() -> None:
    assert O._text_of("plain", 0) == "plain"
    assert O._text_of([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], 0) == "ab"
    assert O._text_of([], 0) == ""
    for bad in ({"type": "image_url", "text": "a"}, {"type": "text", "text": 3},
                {"type": "text"}, {"text": "a"}):
        with pytest.raises(InvalidAction) as e:
            O._text_of([{"type": "text", "text": "ok"}, bad], 3)
        assert (e.value.field, str(e.value)) == (
            "messages[3].content[1]", "messages[3].content[1]: only text parts are supported")


def _svc(cfg: ServiceConfig = CFG) -> Any:
    return SimpleNamespace(config=cfg)


def _req(**kw: Any) -> O.CompletionIn:
    return O.CompletionIn.model_validate({"model": "gj", "prompt": "x", **kw})


def _refusal(svc: Any, req: O.CompletionIn) -> tuple[str, str]:
    with pytest.raises(InvalidAction) as e:
        O._sampling(svc, req)
    return e.value.field, str(e.value)


def test_sampling_refusals() -> None:
    assert _refusal(_svc(), _req(model="nope")) == (
        "model", "model: unknown model 'nope' (judge engines: gj, gk)")
    no_judges = ServiceConfig(models=(ModelSpec("rm", kind="scalar", path="/nowhere"),))
    assert _refusal(_svc(no_judges), _req(model="nope")) == (
        "model", "model: unknown model 'nope' (judge engines: none configured)")
    assert _refusal(_svc(), _req(model="rm")) == (
        "model", "model: model 'rm' is of kind scalar; this route serves judge engines "
                 "(kind genjudge)")
    assert _refusal(_svc(), _req(stream=True)) == (
        "stream", "stream: streaming is not supported; send stream: false")
    assert _refusal(_svc(), _req(max_tokens=300)) == (
        "max_tokens", "max_tokens: 300 tokens: the model 'gj' has a context of 300 tokens "
                      "(max_tokens must be below it)")
    assert _refusal(_svc(), _req(max_tokens=10, max_completion_tokens=300)) == (
        "max_completion_tokens", "max_completion_tokens: 300 tokens: the model 'gj' has a "
                                 "context of 300 tokens (max_tokens must be below it)")
    assert _refusal(_svc(), _req(model="gk", max_tokens=4096))[0] == "max_tokens"
    assert _refusal(_svc(), _req(stop=["a", "b", "c", "d", "e"])) == (
        "stop", "stop: at most 4 stop sequences, got 5")


def test_sampling_values() -> None:
    assert O._sampling(_svc(), _req()) == ("gj", Sampling(max_tokens=150))  # 300 // 2
    assert type(O._sampling(_svc(), _req())[1].max_tokens) is int
    odd = ServiceConfig(models=(ModelSpec("go", kind="genjudge", path="/nowhere",
                                          options={"max_model_len": "301"}),))
    assert O._sampling(_svc(odd), _req(model="go"))[1].max_tokens == 150  # (301 // 2)
    assert O._sampling(_svc(), _req(model="gk")) == ("gk", Sampling(max_tokens=256))
    assert O._sampling(_svc(), _req(max_tokens=299))[1].max_tokens == 299
    assert O._sampling(_svc(), _req(model="gk", max_tokens=4095))[1].max_tokens == 4095
    # max_completion_tokens first (OpenAI's newer name); max_tokens when it is unset
    assert O._sampling(_svc(), _req(max_tokens=100, max_completion_tokens=7))[1].max_tokens == 7
    assert O._sampling(_svc(), _req(max_completion_tokens=299))[1].max_tokens == 299
    assert O._sampling(_svc(), _req(stop="END"))[1].stop == ("END",)
    assert O._sampling(_svc(), _req(stop=["a", "b", "c", "d"]))[1].stop == ("a", "b", "c", "d")
    assert O._sampling(_svc(), _req(stop=[]))[1].stop == ()
    full = _req(max_tokens=9, n=3, temperature=0.5, top_p=0.25, seed=11, stop=["s"],
                presence_penalty=-1.5, frequency_penalty=1.25, ignore_eos=True)
    assert O._sampling(_svc(), full) == ("gj", Sampling(
        max_tokens=9, n=3, temperature=0.5, top_p=0.25, seed=11, stop=("s",),
        presence_penalty=-1.5, frequency_penalty=1.25, ignore_eos=True))
    assert O._sampling(_svc(), _req(ignore_eos=False))[1].ignore_eos is False


# ---- _run: the one judge action, its tenant, its failures --------------------------------------


class _Engine:
    def __init__(self, result: ActionResult | None) -> None:
        self.submitted: list[Any] = []
        self._result = result
        self.log: list[str] = []

    def submit_nowait(self, specs: list[Any]) -> list[str]:
        self.log.append("submit")
        self.submitted.extend(specs)
        return [s.id for s in specs]

    async def result(self, aid: str) -> ActionResult | None:
        assert aid == self.submitted[0].id
        return self._result


class _Tenancy:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.calls: list[tuple[str, str, list[Any]]] = []

    def admit(self, tenant: str, specs: list[Any]) -> None:
        self.log.append("admit")
        self.calls.append(("admit", tenant, list(specs)))

    def started(self, tenant: str, specs: list[Any]) -> None:
        self.log.append("started")
        self.calls.append(("started", tenant, list(specs)))


def _run_svc(result: ActionResult | None) -> Any:
    eng = _Engine(result)
    return SimpleNamespace(engine=eng, tenancy=_Tenancy(eng.log))


JREQ = JudgeRequest(route="completions", prompt="x", sampling=Sampling(max_tokens=3))


async def _run(svc: Any, tenant: Any = None) -> Completion:
    scope = {} if tenant is None else {TENANT_KEY: tenant}
    return await O._run(svc, SimpleNamespace(scope=scope), "gj", JREQ, 12)


async def test_run_submits_one_judge_action_counted_against_the_tenant() -> None:
    c = _completion("completions")
    svc = _run_svc(ActionResult("x", Status.SUCCEEDED, 0.0, output=c))
    assert await _run(svc, "team-a") is c
    (spec,) = svc.engine.submitted
    assert re.fullmatch(r"[0-9a-f]{32}", spec.id)
    assert (spec.kind, spec.demand, spec.model, spec.task, spec.payload, spec.hints) == (
        ActionKind.JUDGE, Resources(), "gj", "judge", JREQ, WorkHints(items=1, tokens=12))
    assert svc.engine.log == ["admit", "submit", "started"]
    assert svc.tenancy.calls == [("admit", "team-a", [spec]), ("started", "team-a", [spec])]
    # no tenant (the single token, or none): nothing counted
    for tenant in (None, 7):
        svc = _run_svc(ActionResult("x", Status.SUCCEEDED, 0.0, output=c))
        assert await _run(svc, tenant) is c
        assert svc.engine.log == ["submit"] and svc.tenancy.calls == []


async def test_run_failures() -> None:
    async def fails(result: ActionResult | None) -> tuple[type, str, str | None]:
        with pytest.raises((BrokenError, InvalidAction)) as e:
            await _run(_run_svc(result))
        return type(e.value), str(e.value), getattr(e.value, "field", None)

    assert await fails(None) == (BrokenError, "judge gj failed: lost: lost", None)
    assert await fails(ActionResult("x", Status.FAILED, 0.0, reason="engine died")) == (
        BrokenError, "judge gj failed: failed: engine died", None)
    assert await fails(ActionResult("x", Status.TIMED_OUT, 0.0, reason="")) == (
        BrokenError, "judge gj failed: timed_out: ", None)
    refused = "engine gj answered 400: " + "y" * 600 + " answered 400: z"
    assert await fails(ActionResult("x", Status.FAILED, 0.0, reason=refused)) == (
        InvalidAction, "body: " + "y" * 500, "body")
    assert await fails(ActionResult("x", Status.FAILED, 0.0,
                                    reason="engine gj answered 400: short")) == (
        InvalidAction, "body: short", "body")
    assert await fails(ActionResult("x", Status.FAILED, 0.0,
                                    reason="gj answered 400: a answered 400: b")) == (
        InvalidAction, "body: a answered 400: b", "body")  # (split at the first)
    assert await fails(ActionResult("x", Status.FAILED, 0.0,
                                    reason="engine answered 400:x")) == (
        BrokenError, "judge gj failed: failed: engine answered 400:x", None)
    # a success without a completion (another output) is the engine's failure too
    assert await fails(ActionResult("x", Status.SUCCEEDED, 0.0, output={"openai": {}})) == (
        BrokenError, "judge gj gave no completion", None)
    assert await fails(ActionResult("x", Status.SUCCEEDED, 0.0, output=None)) == (
        BrokenError, "judge gj gave no completion", None)


# ---- the routes, through the service's app ------------------------------------------------------


@pytest.fixture
async def app_seen(monkeypatch: pytest.MonkeyPatch) -> Any:
    eng = Engine(FakeExecutor(), EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    seen: list[Any] = []

    def capture(specs: Any, **kw: Any) -> list[str]:
        seen.extend(specs)
        return [s.id for s in specs]

    async def answer(aid: str, wait: float | None = None) -> ActionResult:
        spec = next(s for s in seen if s.id == aid)
        n = spec.payload.sampling.n * (len(spec.payload.prompt)
                                       if isinstance(spec.payload.prompt, tuple) else 1)
        return ActionResult(aid, Status.SUCCEEDED, 0.0,
                            output=_completion(spec.payload.route, n=n))

    monkeypatch.setattr(eng, "submit_nowait", capture)
    monkeypatch.setattr(eng, "result", answer)
    app = create_app(eng, CFG)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            yield c, seen, app
    finally:
        await eng.aclose()


async def test_chat_route(app_seen: Any) -> None:
    c, seen, _ = app_seen
    r = await c.post("/v1/chat/completions", json={"model": "gj", "max_tokens": 5, "n": 2,
                                                   "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": "judge"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and len(body["choices"]) == 2
    PeerChatCompletion.model_validate(body)
    (spec,) = seen
    assert spec.payload == JudgeRequest(route="chat/completions", sampling=Sampling(
        max_tokens=5, n=2), messages=(ChatTurn("system", "be brief"), ChatTurn("system", "judge"),
                                      ChatTurn("user", "ab"), ChatTurn("assistant", "ok")))
    assert spec.hints == WorkHints(items=1, tokens=10)
    r = await c.post("/v1/chat/completions", json={"model": "gj", "messages": []})
    assert (r.status_code, r.json()["field"], r.json()["detail"]) == (
        400, "messages", "messages: must not be empty")
    r = await c.post("/v1/chat/completions", json={"model": "gj", "messages": [
        {"role": "user", "content": "x"}, {"role": "user", "content": [{"type": "image"}]}]})
    assert (r.status_code, r.json()["field"]) == (400, "messages[1].content[0]")
    assert len(seen) == 1


async def test_completions_route(app_seen: Any) -> None:
    c, seen, _ = app_seen
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": "one", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "text_completion"
    PeerCompletion.model_validate(r.json())
    assert seen[-1].payload == JudgeRequest(route="completions", prompt="one",
                                            sampling=Sampling(max_tokens=4))
    assert seen[-1].hints == WorkHints(items=1, tokens=4)
    # several prompts: a tuple of them, tokens x n x prompts; 16 completions at most
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": ["a", ""], "n": 8,
                                              "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 16
    assert seen[-1].payload.prompt == ("a", "")
    assert seen[-1].hints == WorkHints(items=1, tokens=48)
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": [""], "max_tokens": 3})
    assert (r.status_code, r.json()["field"], r.json()["detail"]) == (
        400, "prompt", "prompt: must not be empty")
    for prompt in ("", []):
        r = await c.post("/v1/completions", json={"model": "gj", "prompt": prompt})
        assert (r.status_code, r.json()["detail"]) == (400, "prompt: must not be empty")
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": ["a"] * 9, "n": 2})
    assert (r.status_code, r.json()["field"], r.json()["detail"]) == (
        400, "prompt", "prompt: 9 prompts x n=2: at most 16 completions per request")
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": ["a"] * 17})
    assert (r.status_code, r.json()["detail"]) == (
        400, "prompt: 17 prompts x n=1: at most 16 completions per request")
    assert len(seen) == 2
    r = await c.post("/v1/completions", json={"model": "gj", "prompt": ["a"] * 16})
    assert r.status_code == 200 and seen[-1].hints.tokens == 16 * 150


async def test_routes_documented(app_seen: Any) -> None:
    _, _, app = app_seen
    paths = app.openapi()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        op = paths[path]["post"]
        assert op["tags"] == ["judge"]
        got = {k: v["description"] for k, v in op["responses"].items()}
        assert {k: got[k] for k in ("400", "429", "502")} == {
            "400": "a field the judge cannot serve (named in `field`)",
            "429": "the tenant's quota is spent",
            "502": "the judge engine failed"}
