"""What the duration estimator learns an action's size from (issue 22, items 3 and 4): the
submitter's hints, a test's cases, the task and the code's size, falling back from specific to
general keys and, for a kind never seen, to a neutral estimate; and how wrong it was."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node

from arl_tangram.core.actions import ActionKind, ActionSpec, WorkHints
from arl_tangram.core.estimator import PRIORS, DurationEstimator


def _code(aid: str, lang: str = "python", task: str = "default", code: str = "print(1)",
          **kw) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.CODE, tag=lang, task=task,
                      payload={"code": code, "language": lang}, **kw)


def _learn(est: DurationEstimator, spec: ActionSpec, run_s: float, n: int = 5) -> None:
    for _ in range(n):
        est.observe(spec, run_s)


def test_a_kind_never_seen_gets_the_typical_kinds_estimate_not_a_fixed_prior() -> None:
    est = DurationEstimator()
    assert est.predict(_code("b", lang="bash")) == PRIORS["none"]  # nothing seen: the prior
    _learn(est, _code("p"), 0.005)
    assert est.predict(_code("b", lang="bash")) == pytest.approx(0.005)  # ranked with the stream
    _learn(est, _code("n", lang="nodejs"), 0.02)
    _learn(est, _code("g", lang="go"), 0.5)
    # each kind counts once however many ran: the median of 5 ms, 20 ms, 500 ms
    _learn(est, _code("p"), 0.005, n=100)
    assert est.predict(_code("b", lang="bash")) == pytest.approx(0.02)


def test_tasks_are_learned_apart_and_a_new_task_starts_from_its_kind() -> None:
    est = DurationEstimator()
    _learn(est, _code("a", task="fast"), 0.01)
    _learn(est, _code("b", task="slow"), 1.0)
    assert est.predict(_code("x", task="fast")) == pytest.approx(0.01)
    assert est.predict(_code("x", task="slow")) == pytest.approx(1.0)
    general = est.predict(_code("x", task="new"))
    assert 0.01 <= general <= 1.0  # its kind's history, both tasks together


def test_the_code_size_separates_actions_without_hints() -> None:
    est = DurationEstimator()
    _learn(est, _code("s", code="x = 1\n"), 0.01)
    _learn(est, _code("l", code="x = 1\n" * 2000), 2.0)  # 12 kB: a size class of its own
    assert est.predict(_code("s2", code="y = 2\n")) == pytest.approx(0.01, rel=0.5)
    assert est.predict(_code("l2", code="y = 2\n" * 2000)) == pytest.approx(2.0)


def test_a_test_without_a_count_is_sized_by_its_cases_and_a_users_expected_s_wins() -> None:
    est = DurationEstimator()

    def test(aid: str, n: int, **kw) -> ActionSpec:
        return ActionSpec(aid, kind=ActionKind.TEST, tag="python",
                          payload={"code": "", "cases": [{"stdin": ""}] * n}, **kw)

    _learn(est, test("t", 10), 1.0)  # 0.1 s per case
    assert est.predict(test("u", 40)) == pytest.approx(4.0)
    assert est.predict(test("v", 40, hints=WorkHints(test_count=2))) == pytest.approx(0.1 * 2)
    # the user's own estimate: its basis learns the ratio of actual to expected (none yet: 1)
    assert est.predict(test("w", 40, hints=WorkHints(expected_s=7.0))) == pytest.approx(7.0)


def test_errors_are_scored_per_kind() -> None:
    d = Driver([cpu_node("n0")], policy="tangram")
    for i in range(4):
        aid = f"a{i}"
        d.at(float(i)).arrive(act(aid, tag="python", hints=WorkHints(expected_s=1.0)))
        d.at(float(i) + 0.5).finish(aid, run_s=4.0 if i == 0 else 1.0)
    got = d.core.estimator.errors()["code:python"]
    assert got["scored"] == 4
    assert got["within_2x"] < 1.0 and got["mean_abs_log2"] > 0.0  # the first was off by 4x


def test_ordering_never_holds_an_action_past_half_its_timeout() -> None:
    """A kind with no history waits behind shorter work at most half its own timeout (above
    aging_min_s) before it is served first: its caller is not left to give up."""
    d = Driver([cpu_node("n0", cpu=1)], policy="tangram", aging_s=30.0)
    d.arrive(act("busy", hints=WorkHints(expected_s=100.0)))
    d.arrive(act("slow", hints=WorkHints(expected_s=50.0), timeout_s=4.0))
    rec = d.core.actions["slow"]
    assert d.core.queues.aging_after(rec) == pytest.approx(2.0)
    d.at(2.5).tick()
    assert "aged" in " ".join(d.core.story("slow"))
