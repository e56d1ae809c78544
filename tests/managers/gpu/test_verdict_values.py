"""Exact values of managers/gpu/verdict.py (issue 43 item 2): the refusals of `from_options`
word for word, a rule given by name, the scanning of `last_boxed` and `last_json` past
unbalanced boxes and text that does not parse, booleans, non-numbers and non-finite numbers,
the edges of a range, and what a verdict reports as found."""

from __future__ import annotations

import math
import re

import pytest

from arl_tangram.managers.gpu.verdict import VerdictRule, last_boxed, last_json, parse


def _refused(raw: object) -> str:
    with pytest.raises(ValueError) as exc:
        VerdictRule.from_options(raw)
    return str(exc.value)


# -- from_options ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["boxed", "regex_needs_pattern", "json"])
def test_a_rule_given_by_name(name: str) -> None:
    if name == "regex_needs_pattern":
        assert _refused("regex") == "verdict.pattern: the regex rule needs a pattern"
        return
    rule = VerdictRule.from_options(name)
    assert rule == VerdictRule(
        name,
        "",
        "score",
        {
            "yes": 1.0,
            "correct": 1.0,
            "true": 1.0,
            "pass": 1.0,
            "no": 0.0,
            "incorrect": 0.0,
            "false": 0.0,
            "fail": 0.0,
        },
        None,
    )


def test_refusals_word_for_word() -> None:
    assert _refused(7) == "verdict: must be a rule name or a mapping"
    assert _refused(["boxed"]) == "verdict: must be a rule name or a mapping"
    assert _refused({"rule": "regex"}) == "verdict.pattern: the regex rule needs a pattern"
    assert _refused({"labels": ["yes"]}) == "verdict.labels: must map words to scores"
    assert _refused({"labels": {"yes": "high"}}) == "verdict.labels: scores must be numbers"
    assert _refused({"labels": {"yes": None}}) == "verdict.labels: scores must be numbers"
    assert _refused({"range": 5}) == "verdict.range: must be [low, high]"
    assert _refused({"range": [0, 1, 2]}) == "verdict.range: must be [low, high]"
    assert _refused({"range": ["a", "b"]}) == "verdict.range: must be [low, high]"
    assert _refused({"range": [1, 1]}) == "verdict.range: must be finite with low < high"
    assert _refused({"range": [0, math.inf]}) == "verdict.range: must be finite with low < high"


# -- last_boxed -----------------------------------------------------------------------------------


def test_last_boxed_steps_back_one_box_at_a_time() -> None:
    # the last box is unbalanced: the one before it, not the first one
    assert last_boxed("\\boxed{a} \\boxed{b} \\boxed{c") == "b"
    assert last_boxed("\\boxed{a} \\boxed{b \\boxed{c") == "a"
    assert last_boxed("\\boxed{a \\boxed{b") is None


# -- last_json ------------------------------------------------------------------------------------


def test_last_json_none_when_nothing_holds_the_key() -> None:
    assert last_json("no json here", "score") is None
    assert last_json('{"other": 1}', "score") is None
    assert last_json("{not json}", "score") is None


def test_last_json_scans_from_the_first_brace() -> None:
    assert last_json('{"score": 1} then {"other": 2}', "score") == 1


def test_last_json_after_text_that_does_not_parse() -> None:
    assert last_json('{bad {"score": 1}', "score") == 1
    assert last_json('{bad {"score": 1} {x', "score") == 1
    assert last_json('{{"score": 1}', "score") == 1  # the very next brace
    assert last_json('{"score": 1} {"score": 2} {x', "score") == 2
    assert last_json('{"score": 1} {"score": 2} {"score": 3}', "score") == 3


# -- scores ---------------------------------------------------------------------------------------


def _json(text: str, **extra: object) -> float | None:
    v = parse(text, VerdictRule.from_options({"rule": "json", **extra}))
    return None if v is None else v.score


def test_booleans_are_one_and_zero() -> None:
    assert _json('{"score": true}') == 1.0
    assert _json('{"score": false}') == 0.0
    assert parse('{"score": false}', VerdictRule("json")).found == "false"


def test_values_that_are_no_number_give_no_verdict() -> None:
    assert _json('{"score": [1]}') is None
    assert _json('{"score": {"a": 1}}') is None
    assert _json('{"score": null}') is None
    assert _json('{"score": [1]}', range=[0, 10]) is None
    assert _json('{"score": NaN}') is None
    assert _json('{"score": Infinity}') is None
    assert _json('{"score": -Infinity}', range=[0, 10]) is None


def test_labels_are_stripped_of_punctuation_not_of_letters() -> None:
    rule = VerdictRule.from_options({"labels": {"X": 0.5, "xx": 0.25}})
    assert parse("\\boxed{X}", rule).score == 0.5
    assert parse("\\boxed{XX!}", rule).score == 0.25
    assert parse("\\boxed{*`X`*}", rule).score == 0.5


def test_range_edges_and_normalising() -> None:
    assert _json('{"score": 2}', range=[2, 4]) == 0.0
    assert _json('{"score": 4}', range=[2, 4]) == 1.0
    assert _json('{"score": 3}', range=[2, 4]) == 0.5
    assert _json('{"score": 3.5}', range=[2, 4]) == 0.75
    assert _json('{"score": 1.999}', range=[2, 4]) is None
    assert _json('{"score": 4.001}', range=[2, 4]) is None


# -- parse ----------------------------------------------------------------------------------------


def test_regex_without_a_group_reports_the_whole_match() -> None:
    rule = VerdictRule.from_options({"rule": "regex", "pattern": r"\d+/10"})
    assert rule.pattern == r"\d+/10"
    v = parse("first 3/10, then 7/10", rule)
    assert v is None  # "7/10" is no number
    rule = VerdictRule.from_options({"rule": "regex", "pattern": r"(?i)pass|fail"})
    v = parse("FAIL then Pass", rule)
    assert (v.score, v.found) == (1.0, "Pass")
    rule = VerdictRule.from_options({"rule": "regex", "pattern": r"score=(\d+)"})
    v = parse("score=3 score=8", rule)
    assert (v.score, v.found) == (8.0, "8")
    assert re.compile(rule.pattern).groups == 1


def test_found_is_the_json_text_of_a_value_that_is_not_a_string() -> None:
    v = parse('{"score": 1}', VerdictRule("json"))
    assert (v.score, v.found) == (1.0, "1")
    assert type(v.found) is str
    v = parse('{"score": 0.5}', VerdictRule("json"))
    assert (v.score, v.found) == (0.5, "0.5")
    v = parse('{"score": "yes"}', VerdictRule("json"))
    assert (v.score, v.found) == (1.0, "yes")
