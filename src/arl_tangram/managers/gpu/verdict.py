"""Verdicts of generative judges: a score read out of generated text by a configured rule.

Rules (``ModelSpec.options["verdict"]``, a mapping with ``rule`` and its settings):

- ``boxed`` (default): the LAST ``\\boxed{...}`` (braces balanced) in the text;
- ``regex``: the LAST match of ``pattern`` (its first group, else the whole match);
- ``json``: the LAST JSON object in the text that parses and holds ``key`` (default "score").

What the rule found becomes the score: a number is taken as it is (``range: [lo, hi]``, when set,
refuses numbers outside it and normalises to 0..1); a word is looked up, case-insensitively and
stripped of surrounding punctuation, in ``labels`` (default: yes/correct/true/pass -> 1.0,
no/incorrect/false/fail -> 0.0). Anything else -- no match, an unknown word, a number out of
range, NaN -- is no verdict: `parse` returns None and the judge applies ``on_no_verdict``
(engine_judge.py: the action fails with the reason, or gets a configured score).
Pure functions: no engine, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_LABELS: Mapping[str, float] = {
    "yes": 1.0, "correct": 1.0, "true": 1.0, "pass": 1.0,
    "no": 0.0, "incorrect": 0.0, "false": 0.0, "fail": 0.0,
}
RULES = ("boxed", "regex", "json")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class VerdictRule:
    rule: str = "boxed"
    pattern: str = ""  # regex rule
    key: str = "score"  # json rule
    labels: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LABELS))
    range: tuple[float, float] | None = None

    @classmethod
    def from_options(cls, raw: Any) -> VerdictRule:
        """From ``options["verdict"]``: a rule name or a mapping; ValueError naming the field."""
        if raw is None:
            return cls()
        if isinstance(raw, str):
            raw = {"rule": raw}
        if not isinstance(raw, Mapping):
            raise ValueError("verdict: must be a rule name or a mapping")
        unknown = set(raw) - {"rule", "pattern", "key", "labels", "range"}
        if unknown:
            raise ValueError(f"verdict.{sorted(unknown)[0]}: unknown field")
        rule = str(raw.get("rule", "boxed"))
        if rule not in RULES:
            raise ValueError(f"verdict.rule: must be one of {', '.join(RULES)}, got {rule!r}")
        pattern = str(raw.get("pattern", ""))
        if rule == "regex":
            if not pattern:
                raise ValueError("verdict.pattern: the regex rule needs a pattern")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"verdict.pattern: {exc}") from None
        labels = raw.get("labels", DEFAULT_LABELS)
        if not isinstance(labels, Mapping):
            raise ValueError("verdict.labels: must map words to scores")
        try:
            lab = {str(k).strip().lower(): float(v) for k, v in labels.items()}
        except (TypeError, ValueError):
            raise ValueError("verdict.labels: scores must be numbers") from None
        rng = raw.get("range")
        span: tuple[float, float] | None = None
        if rng is not None:
            try:
                lo, hi = (float(x) for x in rng)
            except (TypeError, ValueError):
                raise ValueError("verdict.range: must be [low, high]") from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError("verdict.range: must be finite with low < high")
            span = (lo, hi)
        return cls(rule, pattern, str(raw.get("key", "score")), lab, span)


@dataclass(frozen=True)
class Verdict:
    score: float
    found: str  # the text the rule found (the boxed content, the match, the JSON value)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or None."""
    pos = text.rfind("\\boxed{")
    while pos >= 0:
        depth, i = 0, pos + len("\\boxed")
        for j in range(i, len(text)):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1:j]
        pos = text.rfind("\\boxed{", 0, pos)  # unbalanced: an earlier one
    return None


def last_json(text: str, key: str) -> Any:
    """The value at ``key`` of the last JSON object in ``text`` that parses and holds it."""
    dec = json.JSONDecoder()
    found: Any = None
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and key in obj:
            found = obj[key]
        i = text.find("{", end)
    return found


def _score_of(value: Any, rule: VerdictRule) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    x: float | None = None
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        s = value.strip()
        if _NUMBER.fullmatch(s):
            x = float(s)
        else:
            word = s.strip(" \t\n.,;:!?*_`'\"()[]").lower()
            got = rule.labels.get(word)
            return got
    if x is None or not math.isfinite(x):
        return None
    if rule.range is not None:
        lo, hi = rule.range
        if not lo <= x <= hi:
            return None
        return (x - lo) / (hi - lo)
    return x


def parse(text: str, rule: VerdictRule) -> Verdict | None:
    """The verdict in ``text`` by ``rule``, or None when there is none."""
    found: Any
    if rule.rule == "boxed":
        found = last_boxed(text)
    elif rule.rule == "regex":
        ms = list(re.finditer(rule.pattern, text))
        if not ms:
            return None
        m = ms[-1]
        found = m.group(1) if m.re.groups else m.group(0)
    else:
        found = last_json(text, rule.key)
    if found is None:
        return None
    score = _score_of(found, rule)
    if score is None:
        return None
    return Verdict(score, found if isinstance(found, str) else json.dumps(found))
