"""An action's ``weight`` orders the queue (issue 27, audit C1): Smith's rule, expected work x
resources / weight, shortest first -- so of two waiting actions of equal work, the heavier one
starts first, whichever arrived first; equal weights keep arrival order."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node

from arl_tangram.core import commands as C


def _first_started_after_busy(a_kw: dict, b_kw: dict) -> list[str]:
    """One 1-core node busy; ``a`` then ``b`` queue behind it; which starts when it frees?"""
    d = Driver([cpu_node("n", cpu=1)])
    assert [c.action.id for c in d.at(0).arrive(act("busy", tag="busy"))
            if isinstance(c, C.StartAction)] == ["busy"]
    assert not [c for c in d.at(1).arrive(act("a", **a_kw), act("b", **b_kw))
                if isinstance(c, C.StartAction)]
    return [c.action.id for c in d.at(2).finish("busy", run_s=2) if isinstance(c, C.StartAction)]


@pytest.mark.parametrize("same_work", [False, True], ids=["other-kinds", "same-kind"])
def test_a_heavier_action_starts_before_an_earlier_lighter_one(same_work: bool) -> None:
    ta, tb = ("x", "x") if same_work else ("ta", "tb")
    # equal weights: arrival order
    assert _first_started_after_busy({"tag": ta}, {"tag": tb}) == ["a"]
    # b weighs 4x: it goes first although it arrived second
    assert _first_started_after_busy({"tag": ta}, {"tag": tb, "weight": 4.0}) == ["b"]
    # a weighs 4x: a first; b weighs a quarter: a first too
    assert _first_started_after_busy({"tag": ta, "weight": 4.0}, {"tag": tb}) == ["a"]
    assert _first_started_after_busy({"tag": ta}, {"tag": tb, "weight": 0.25}) == ["a"]


def test_weight_trades_against_expected_work() -> None:
    # b's work is expected 2x a's (two tests' worth vs one, same kind of estimate), so it waits
    # at equal weight; at weight 4 its work / weight is half a's and it goes first.
    from arl_tangram.core.actions import ActionKind, WorkHints

    def spec(n: int, **kw: object) -> dict:
        return {"kind": ActionKind.TEST, "hints": WorkHints(test_count=n), "tag": "suite", **kw}

    assert _first_started_after_busy(spec(8), spec(16)) == ["a"]
    assert _first_started_after_busy(spec(16), spec(8)) == ["b"]
    assert _first_started_after_busy(spec(8), spec(16, weight=4.0)) == ["b"]
