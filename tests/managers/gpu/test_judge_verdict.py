"""Verdict rules of generative judges (managers/gpu/verdict.py) and judge options, on fixed
strings: exact scores, and no verdict where there is none."""

from __future__ import annotations

import re

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu.engine_judge import EngineJudgeHost, JudgeOptions, judge_messages
from arl_tangram.managers.gpu.verdict import VerdictRule, last_boxed, parse


def _score(text: str, **rule: object) -> float | None:
    v = parse(text, VerdictRule.from_options(rule or None))
    return None if v is None else v.score


@pytest.mark.parametrize(("text", "score"), [
    ("so the answer is \\boxed{yes}", 1.0),
    ("\\boxed{No.}", 0.0),
    ("first \\boxed{yes} then, on reflection, \\boxed{no}", 0.0),  # the last one
    ("\\boxed{7}", 7.0),
    ("\\boxed{\\frac{1}{2}}", None),  # not a number nor a label
    ("\\boxed{maybe}", None),
    ("no box at all: yes", None),
    ("\\boxed{yes", None),  # unbalanced
    ("", None),
    ("\\boxed{nan}", None),
])
def test_boxed(text: str, score: float | None) -> None:
    assert _score(text) == score


def test_boxed_nested_braces_and_an_unbalanced_last_one() -> None:
    assert last_boxed("\\boxed{a{b}c} \\boxed{oops") == "a{b}c"


def test_regex_json_labels_and_range() -> None:
    assert _score("Score: 8/10 ... Score: 6/10", rule="regex", pattern=r"Score: (\d+)/10",
                  range=[0, 10]) == 0.6
    assert _score("Score: 11/10", rule="regex", pattern=r"Score: (\d+)/10", range=[0, 10]) is None
    assert _score("VERDICT: GOOD", rule="regex", pattern=r"VERDICT: (\w+)",
                  labels={"good": 1, "bad": -1}) == 1.0
    assert _score('thinking {"score": 2} then {"score": 0.75, "why": "x"}', rule="json") == 0.75
    assert _score('{"score": true}', rule="json") == 1.0
    assert _score('{"rating": 3}', rule="json", key="rating") == 3.0
    assert _score('{"score": "high"}', rule="json") is None
    assert _score("{not json} and {\"other\": 1}", rule="json") is None


@pytest.mark.parametrize(("options", "message"), [
    ({"verdict": {"rule": "xml"}}, "verdict.rule: must be one of boxed, regex, json"),
    ({"verdict": {"rule": "regex"}}, "verdict.pattern: the regex rule needs a pattern"),
    ({"verdict": {"rule": "regex", "pattern": "("}}, "verdict.pattern: "),
    ({"verdict": {"range": [1, 1]}}, "verdict.range: must be finite with low < high"),
    ({"verdict": {"colour": 1}}, "verdict.colour: unknown field"),
    ({"max_tokens": 0}, "options.max_tokens: must be >= 1"),
    ({"max_tokens": 5000}, "options.max_tokens (5000) must be below options.max_model_len (4096)"),
    ({"engine": "sglang"}, "options.engine: only 'vllm' is supported"),
    ({"on_no_verdict": "skip"}, "options: could not convert string to float: 'skip'"),
    ({"temprature": 0}, "options.temprature: unknown option"),
])
def test_bad_options_name_the_field(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as e:
        JudgeOptions.of(ModelSpec("gj", kind="genjudge", path="x", options=options))
    assert message in str(e.value) and str(e.value).startswith("model gj: ")


def test_prompts_from_payloads() -> None:
    spec = ModelSpec("gj", kind="genjudge", path="x",
                     options={"template": "Q: {prompt} A: {response}", "system": "be strict"})
    o = JudgeOptions.of(spec)
    assert judge_messages(spec, o, {"prompt": "1+1?", "response": "2"}) == [
        {"role": "system", "content": "be strict"}, {"role": "user", "content": "Q: 1+1? A: 2"}]
    assert judge_messages(spec, o, {"query": "2"}) == [
        {"role": "system", "content": "be strict"}, {"role": "user", "content": "Q:  A: 2"}]
    plain = ModelSpec("gj", kind="genjudge", path="x",
                      options={"template": "{response}?", "chat_template": False})
    assert judge_messages(plain, JudgeOptions.of(plain), {"query": "ok"}) == "ok?"
    with pytest.raises(ValueError, match=r"^payload.messages\[0\]: needs role"):
        judge_messages(spec, o, {"messages": [{"role": "robot", "content": "x"}]})
    with pytest.raises(ValueError, match=r"^payload: needs query, prompt and response, or messages"):
        judge_messages(spec, o, {"prompt": "x"})


def test_verdict_outputs_and_the_no_verdict_policy() -> None:
    spec = ModelSpec("gj", kind="genjudge", path="x")
    data = {"choices": [{"message": {"content": "ok \\boxed{yes}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 5}}
    out, reason = EngineJudgeHost._verdict(spec, JudgeOptions.of(spec), "chat/completions", data)
    assert reason == "" and out is not None
    assert list(out.to_dict().items()) == [  # (the native output's wire body, in its order)
        ("model", "gj"), ("reasoning", "ok \\boxed{yes}"), ("prompt_tokens", 30),
        ("completion_tokens", 5), ("finish_reason", "stop"), ("score", 1.0), ("verdict", "yes")]
    garbage = {"choices": [{"text": "xyz", "finish_reason": "length"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    out, reason = EngineJudgeHost._verdict(spec, JudgeOptions.of(spec), "completions", garbage)
    assert out is None and reason == ("model gj: no verdict (rule boxed) in 7 generated tokens "
                                      "(finish_reason length): ...'xyz'")
    lenient = ModelSpec("gj", kind="genjudge", path="x", options={"on_no_verdict": 0})
    out, reason = EngineJudgeHost._verdict(lenient, JudgeOptions.of(lenient), "completions", garbage)
    assert reason == "" and out is not None and (out["score"], out["verdict"]) == (0.0, None)


def test_genjudge_kind_and_max_seqs_in_the_spec() -> None:
    assert ModelSpec("gj", kind="genjudge", max_seqs=64).max_seqs == 64
    with pytest.raises(ValueError, match="max_seqs must be >= 0"):
        ModelSpec("gj", kind="genjudge", max_seqs=-1)
    with pytest.raises(ValueError, match=re.escape("kind must be scalar|similarity|judge|genjudge")):
        ModelSpec("gj", kind="llm")
