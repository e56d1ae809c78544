"""A generative judge's typed request (`kinds.JudgeRequest`, issue 36): parsed once where it
enters (a native or library payload, OpenAI's passthrough), each bad field named, its wire and
engine bodies pinned whole, and the engine host reading the typed request as it read the
mapping (the prompt the model sees is the same)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import InvalidAction
from arl_tangram.kinds import (
    ChatTurn,
    JudgeRequest,
    Sampling,
    ScoreRequest,
    judge_request,
)
from arl_tangram.managers.gpu.engine_judge import JudgeOptions, judge_messages

SPEC = ModelSpec("gj", kind="genjudge", path="/x", options={"system": "Be strict."})


def test_the_three_judgement_forms_parse_and_render_back() -> None:
    r = judge_request({"prompt": "1+1?", "response": "2"})
    assert r == JudgeRequest(prompt="1+1?", response="2")
    assert dict(r) == {"prompt": "1+1?", "response": "2"} and r.route is None
    r = judge_request({"response": "2"})  # (no prompt: the template's {prompt} is "")
    assert r == JudgeRequest(prompt="", response="2")
    assert judge_request({"query": "2"}) == JudgeRequest(query="2")
    r = judge_request({"messages": [{"role": "user", "content": "hi"}]})
    assert r == JudgeRequest(messages=(ChatTurn("user", "hi"),))
    assert dict(r) == {"messages": [{"role": "user", "content": "hi"}]}
    assert judge_request(r) is r  # typed at the edge: not parsed again
    # /get_reward's typed score request sent to a generative judge
    assert judge_request(ScoreRequest(query="q", prompt="p")) == JudgeRequest(query="q")
    assert pickle.loads(pickle.dumps(r)) == r  # (it crosses to the node's process)


def test_a_completion_parses_to_sampling_and_renders_the_engine_body_whole() -> None:
    body: dict[str, Any] = {"max_tokens": 5, "n": 2, "temperature": 0.5, "seed": 1,
                            "stop": "END", "ignore_eos": True, "prompt": ["a", "b"]}
    r = judge_request({"openai": {"route": "completions", "body": body}})
    assert r == JudgeRequest(route="completions", prompt=("a", "b"), sampling=Sampling(
        max_tokens=5, n=2, temperature=0.5, seed=1, stop=("END",), ignore_eos=True))
    assert r.openai_body() == {"max_tokens": 5, "n": 2, "temperature": 0.5, "seed": 1,
                               "ignore_eos": True, "stop": ["END"], "prompt": ["a", "b"]}
    assert dict(r) == {"openai": {"route": "completions", "body": r.openai_body()}}
    chat = JudgeRequest(route="chat/completions", messages=(ChatTurn("user", "x"),),
                        sampling=Sampling(max_tokens=3, top_p=0.9))
    assert chat.openai_body() == {"max_tokens": 3, "n": 1, "top_p": 0.9,
                                  "messages": [{"role": "user", "content": "x"}]}
    assert judge_request(dict(chat)) == chat  # the wire form parses back to the same request


@pytest.mark.parametrize(("payload", "message"), [
    ({"prompt": "x"}, "payload: needs query, prompt and response, or messages"),
    ({"response": 3}, "payload: prompt, response and query must be strings"),
    ({"messages": []}, "payload.messages: must be a non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]},
     "payload.messages[0]: needs role (system|user|assistant) and content (a string)"),
    ({"openai": "x"}, "payload.openai: must be a mapping with route and body"),
    ({"openai": {"route": "embeddings", "body": {}}},
     "payload.openai.route: one of chat/completions, completions"),
    ({"openai": {"route": "completions", "body": []}}, "payload.openai.body: must be a mapping"),
    ({"openai": {"route": "completions", "body": {"prompt": "x"}}},
     "payload.openai.body.max_tokens: is required (an integer >= 1)"),
    ({"openai": {"route": "completions", "body": {"prompt": "x", "max_tokens": 0}}},
     "payload.openai.body.max_tokens: must be an integer >= 1, got 0"),
    ({"openai": {"route": "completions", "body": {"prompt": "", "max_tokens": 2}}},
     "payload.openai.body.prompt: must not be empty"),
    ({"openai": {"route": "completions", "body": {"prompt": ["a", 1], "max_tokens": 2}}},
     "payload.openai.body.prompt[1]: must be a string, got int"),
    ({"openai": {"route": "completions", "body": {"prompt": "x", "max_tokens": 2,
                                                   "temperature": "hot"}}},
     "payload.openai.body.temperature: must be a finite number, got 'hot'"),
    ({"openai": {"route": "completions", "body": {"prompt": "x", "max_tokens": 2,
                                                   "stop": [1]}}},
     "payload.openai.body.stop: must be a string or a list of strings"),
    ({"openai": {"route": "chat/completions", "body": {"messages": [{"role": "user",
                                                                      "content": "x"}],
                                                        "max_tokens": 2, "logprobs": True}}},
     "payload.openai.body.logprobs: not a field this route passes on (messages, max_tokens, n, "
     "temperature, top_p, seed, stop, presence_penalty, frequency_penalty, ignore_eos)"),
])
def test_bad_input_names_the_field(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidAction) as got:
        judge_request(payload)
    assert str(got.value) == message


def test_the_engine_host_reads_the_typed_request_as_the_mapping() -> None:
    o = JudgeOptions.of(SPEC)
    for p in ({"prompt": "1+1?", "response": "2"}, {"query": "2"},
              {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}):
        assert judge_messages(SPEC, o, judge_request(p)) == judge_messages(SPEC, o, p)
    assert judge_messages(SPEC, o, JudgeRequest(prompt="1+1?", response="2")) == [
        {"role": "system", "content": "Be strict."},
        {"role": "user", "content": o.template.format(prompt="1+1?", response="2")}]


def test_a_request_built_directly_keeps_the_same_rules() -> None:
    """`api/openai_compat.py` builds its request itself: the type refuses what judge_request
    would (each named), and its Mapping view has the wire's length."""
    sampling = Sampling(max_tokens=2)
    for kw, message in (
        ({"route": "embeddings", "sampling": sampling},
         "payload.openai.route: one of chat/completions, completions"),
        ({"route": "completions", "prompt": "x"}, "payload.openai.body.max_tokens: is required"),
        ({"route": "chat/completions", "sampling": sampling},
         "payload.openai.body.messages: must not be empty"),
        ({"route": "completions", "sampling": sampling, "prompt": ()},
         "payload.openai.body.prompt: must not be empty"),
        ({}, "payload: needs query, prompt and response, or messages"),
    ):
        with pytest.raises(InvalidAction) as got:
            JudgeRequest(**kw)
        assert str(got.value) == message
    assert len(JudgeRequest(prompt="p", response="r")) == 2
    assert len(JudgeRequest(route="completions", prompt="x", sampling=sampling)) == 1
    for bad, message in (
        ({"openai": {"route": "completions", "body": {"prompt": "x", "max_tokens": 2,
                                                       "ignore_eos": 1}}},
         "payload.openai.body.ignore_eos: must be a boolean, got 1"),
        (["not", "a", "mapping"], "payload: must be an object"),
    ):
        with pytest.raises(InvalidAction) as got:
            judge_request(bad)  # type: ignore[arg-type]
        assert str(got.value) == message
