"""An aged session action that cannot start holds its session's node for itself alone: new
shared-pool work stops taking what the node frees, so the session's head starts as soon as the
node has room, not when new arrivals happen to leave a gap (issue 27, mutation testing of
core/placement.py `reserve_for`: the session case had no test)."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status, WorkHints
from arl_tangram.core.resources import Resources


def _scene(home: str) -> tuple[Driver, dict[str, list[str]]]:
    """n0 and n1, two cores each, full of shared-pool work, the session on ``home``; the
    session's action, two cores, queued at t=1. Returns the driver and the actions per node."""
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy="tangram", aging_s=10.0,
               aging_min_s=10.0)
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256), node=home))
    out = d.arrive(*(act(f"x{i}", hints=WorkHints(expected_s=1)) for i in range(4)))
    on: dict[str, list[str]] = {"n0": [], "n1": []}
    for aid, s in sorted(starts(out).items()):
        on[s.node].append(aid)
    assert [len(v) for v in on.values()] == [2, 2]
    d.at(1).arrive(act("big", cpu=2, session="s", hints=WorkHints(expected_s=1000)))
    assert d.status("big") is Status.QUEUED
    return d, on


@pytest.mark.parametrize(("home", "other"), [("n0", "n1"), ("n1", "n0")])
def test_an_aged_blocked_session_action_holds_its_node(home: str, other: str) -> None:
    d, on = _scene(home)
    d.at(12).arrive(act("late", hints=WorkHints(expected_s=1)))  # big has aged (11 s): held
    assert d.status("late") is Status.QUEUED
    d.at(13).finish(on[home][0])  # a core frees on the session's node: not for `late`
    assert d.status("late") is Status.QUEUED and d.status("big") is Status.QUEUED
    out = d.at(14).finish(on[home][1])  # the node is free: `big` starts there
    assert starts(out)["big"].node == home
    assert d.status("late") is Status.QUEUED
    out = d.at(20).finish("big")  # the hold ends with it: `late` starts there
    assert starts(out)["late"].node == home


@pytest.mark.parametrize(("home", "other"), [("n0", "n1"), ("n1", "n0")])
def test_the_other_node_stays_open_to_new_work(home: str, other: str) -> None:
    d, on = _scene(home)
    d.at(12).arrive(act("late", hints=WorkHints(expected_s=1)))
    out = d.at(13).finish(on[other][0])  # only the session's node is held
    assert starts(out)["late"].node == other


def test_a_session_action_not_yet_aged_holds_nothing() -> None:
    d, on = _scene("n0")
    d.at(5).arrive(act("late", hints=WorkHints(expected_s=1)))
    out = d.at(6).finish(on["n0"][0])
    assert starts(out)["late"].node == "n0"


def test_the_hold_ends_when_its_action_is_cancelled() -> None:
    d, on = _scene("n0")
    d.at(12).arrive(act("late", hints=WorkHints(expected_s=1)))
    d.at(13).finish(on["n0"][0])  # a core free on n0, held for `big`
    assert d.status("late") is Status.QUEUED
    out = d.at(14)(ev.CancelRequested(14.0, "big"))
    assert d.status("big") is Status.CANCELLED
    assert starts(out)["late"].node == "n0"  # the core it held is open again at once
