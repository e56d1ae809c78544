"""Typed outcomes (issue 36, item 2) on fixed values: each one's wire body whole and in its
order (`to_dict`: what `api/` renders), read as a Mapping of it, across a process boundary
(pickle), and OpenAI's two bodies rendered from a judge's `Completion` (api/openai_compat.py)."""

from __future__ import annotations

import pickle

import pytest

from arl_tangram.api import translate as T
from arl_tangram.api.openai_compat import chat_response, completion_response
from arl_tangram.kinds import (
    Choice,
    Completion,
    Hit,
    JudgeVerdict,
    Outcome,
    ProviderResult,
    RetrieveResult,
    ScoreResult,
)

ENGINE_CHAT = {"id": "x", "object": "chat.completion", "model": "gj",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"},
                            "finish_reason": "length"},
                           {"message": {"content": None}}],
               "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def test_each_outcome_renders_its_wire_body_in_order() -> None:
    cases: list[tuple[Outcome, list[tuple[str, object]]]] = [
        (ScoreResult(model="rm", score=0.5), [("score", 0.5), ("model", "rm")]),
        (ScoreResult(model="j", score=0.75, p_yes=0.3, p_no=0.1),
         [("score", 0.75), ("p_yes", 0.3), ("p_no", 0.1), ("model", "j")]),
        (ScoreResult(model="c", score=0.9, probs=(0.1, 0.9)),
         [("score", 0.9), ("probs", [0.1, 0.9]), ("model", "c")]),
        (RetrieveResult(model="wiki", hits=(Hit({"id": "0"}, 0.8),)),
         [("result", [{"document": {"id": "0"}, "score": 0.8}]), ("model", "wiki")]),
        (ProviderResult(provider="serper", result={"organic": []}),
         [("provider", "serper"), ("result", {"organic": []}), ("cached", False)]),
        (JudgeVerdict(model="gj", reasoning="r", prompt_tokens=1, completion_tokens=2,
                      finish_reason="stop", score=1.0, verdict="yes"),
         [("model", "gj"), ("reasoning", "r"), ("prompt_tokens", 1), ("completion_tokens", 2),
          ("finish_reason", "stop"), ("score", 1.0), ("verdict", "yes")]),
        (Completion.of("gj", "chat/completions", ENGINE_CHAT),
         [("openai", ENGINE_CHAT), ("model", "gj")]),
    ]
    for outcome, wire in cases:
        assert list(outcome.to_dict().items()) == wire
        assert T.output_body(outcome) == dict(wire) and type(T.output_body(outcome)) is dict
        assert dict(outcome) == dict(wire)  # (the Mapping view reads the same)
        assert pickle.loads(pickle.dumps(outcome)) == outcome
    assert [len(o) for o, _ in cases] == [len(w) for _, w in cases]
    with pytest.raises(NotImplementedError):  # (the base renders nothing of its own)
        Outcome.to_dict(cases[0][0])
    assert RetrieveResult(model="w").top_score is None
    assert T.score_of(ScoreResult(model="rm", score=0.25)) == 0.25
    assert T.score_of(cases[5][0]) == 1.0


def test_a_group_of_scores_renders_each_models_outcome() -> None:
    from arl_tangram.core.actions import ActionResult, Status

    parts = [ActionResult(id="g.rm", status=Status.SUCCEEDED, submit_time=0.0, finish_time=1.0,
                          output=ScoreResult(model="rm", score=0.5)),
             ActionResult(id="g.sim", status=Status.FAILED, submit_time=0.0, finish_time=1.0,
                          reason="boom")]
    got = T.join_group("g", parts)
    assert got.output == {"scores": {"rm": {"score": 0.5, "model": "rm"},
                                     "sim": {"error": "boom"}}}
    assert type(got.output["scores"]["rm"]) is dict


def test_openai_bodies_from_a_completion() -> None:
    c = Completion.of("gj", "chat/completions", ENGINE_CHAT)
    assert c.choices == (Choice(0, "yes", "length"), Choice(1, "", "stop"))
    assert (c.prompt_tokens, c.completion_tokens) == (7, 3)
    body = chat_response("gj", c)
    assert body == {"id": body["id"], "object": "chat.completion", "created": body["created"],
                    "model": "gj",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"},
                                 "logprobs": None, "finish_reason": "length"},
                                {"index": 1, "message": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    text = Completion.of("gj", "completions", {"choices": [{"text": "ab", "index": 0,
                                                            "finish_reason": "stop"}]})
    body = completion_response("gj", text)
    assert body == {"id": body["id"], "object": "text_completion", "created": body["created"],
                    "model": "gj",
                    "choices": [{"index": 0, "text": "ab", "logprobs": None,
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    assert body["id"].startswith("cmpl-")
