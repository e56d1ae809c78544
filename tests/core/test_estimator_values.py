"""The duration estimator's numbers, pinned by hand (issue 43 item 2: mutation testing of
core/estimator.py): the basis and key an action's hints and code name, the priors, the unit time
learned from a run (speed, floors, what is ignored), the blend toward a key's own history, the
reservoir's eviction, quantiles, means and mean excesses, the neutral estimate, the error scores,
the version, the bounds of the memos and of the sibling groups, and what a finish, a failure and
a cancel of the core teach it. Every expected value is worked out in the comments."""

from __future__ import annotations

import math

import pytest
from core_helpers import Driver, act, cpu_node

from arl_tangram.core import estimator as estimator_module
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Status, WorkHints
from arl_tangram.core.estimator import PRIORS, DurationEstimator, basis_of

R = 1e-12


@pytest.fixture(autouse=True)
def _fresh_memos() -> None:
    """Each test starts with the module's key memos empty (as after they reach their bound):
    the keys are then worked out by the code under test, not read from earlier tests' memos."""
    estimator_module._KEYS.clear()
    estimator_module._WORK_KEYS.clear()


def _code(aid: str, tag: str | None = "python", task: str = "default", code: str = "print(1)",
          kind: ActionKind = ActionKind.CODE, **kw) -> ActionSpec:
    return ActionSpec(aid, kind=kind, tag=tag, task=task, payload={"code": code}, **kw)


def _tests(aid: str, n: int, tag: str = "python", task: str = "default", **kw) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TEST, tag=tag, task=task,
                      hints=WorkHints(test_count=n), **kw)


# -- what an action is sized by ---------------------------------------------------------------


def test_the_basis_is_the_first_hint_given_expected_then_tests_tokens_items() -> None:
    assert basis_of(WorkHints(expected_s=2.5, test_count=3, tokens=7, items=9)) == ("expected", 2.5)
    # 0 s is no estimate, 0 of a count no count: the next hint in line
    assert basis_of(WorkHints(expected_s=0.0, test_count=3, tokens=7, items=9)) == ("tests", 3.0)
    assert basis_of(WorkHints(test_count=3, tokens=7, items=9)) == ("tests", 3.0)
    assert basis_of(WorkHints(test_count=0, tokens=7, items=9)) == ("tokens", 7.0)
    assert basis_of(WorkHints(tokens=0, items=9)) == ("items", 9.0)
    assert basis_of(WorkHints(items=0)) == ("none", 1.0)
    assert basis_of(WorkHints()) == ("none", 1.0)


def test_each_basis_starts_from_its_prior_times_the_units() -> None:
    assert PRIORS == {"expected": 1.0, "tests": 0.05, "tokens": 2e-4, "items": 0.01, "none": 1.0}
    est = DurationEstimator()
    assert est.predict(_code("a", hints=WorkHints(expected_s=7.0))) == pytest.approx(7.0, rel=R)
    assert est.predict(_tests("b", 10)) == pytest.approx(0.5, rel=R)  # 10 x 0.05
    assert est.predict(_code("c", hints=WorkHints(tokens=1000))) == pytest.approx(0.2, rel=R)
    assert est.predict(_code("d", hints=WorkHints(items=5))) == pytest.approx(0.05, rel=R)
    assert est.predict(_code("e")) == pytest.approx(1.0, rel=R)
    # at speed 2 half the time; a speed of 0 or below counts as 1e-6 (no division by zero)
    assert est.predict(_tests("b", 10), speed=2.0) == pytest.approx(0.25, rel=R)
    assert est.predict(_code("e"), speed=0.0) == pytest.approx(1e6, rel=R)
    assert est.predict(_code("e"), speed=-3.0) == pytest.approx(1e6, rel=R)
    assert est.predict(_tests("b", 10), q=0.9, speed=0.5) == pytest.approx(1.0, rel=R)


def test_the_key_names_kind_tag_task_and_the_codes_size_in_doublings() -> None:
    w = DurationEstimator.work_of
    assert w(_code("a")) == (("code:python", "none"), 1.0)
    assert w(_code("a", tag=None, kind=ActionKind.CUSTOM)) == (("custom", "none"), 1.0)
    assert w(_code("a", task="t")) == (("code:python@t", "none"), 1.0)
    # code under 512 characters has no size class; then bit_length - 8, at most 16
    assert w(_code("a", code="x" * 511))[0] == ("code:python", "none")
    assert w(_code("a", code="x" * 512))[0] == ("code:python#L2", "none")
    assert w(_code("a", code="x" * 1023))[0] == ("code:python#L2", "none")
    assert w(_code("a", code="x" * 1024))[0] == ("code:python#L3", "none")
    assert w(_code("a", task="t", code="x" * 1024))[0] == ("code:python@t#L3", "none")
    assert w(_code("a", code="x" * ((1 << 23) - 1)))[0] == ("code:python#L15", "none")
    assert w(_code("a", code="x" * (1 << 23)))[0] == ("code:python#L16", "none")
    assert w(_code("a", code="x" * (1 << 24)))[0] == ("code:python#L16", "none")
    # code that is not a string, or a hint naming the work: no size class
    assert w(ActionSpec("a", tag="python", payload={"code": b"x" * 4096}))[0] == \
        ("code:python", "none")
    assert w(_code("a", code="x" * 4096, hints=WorkHints(test_count=4))) == \
        (("code:python", "tests"), 4.0)


def test_a_test_without_hints_counts_its_cases_and_nothing_else_does() -> None:
    w = DurationEstimator.work_of

    def test(payload: dict, **kw) -> ActionSpec:
        return ActionSpec("t", kind=ActionKind.TEST, tag="python", payload=payload, **kw)

    assert w(test({"cases": [{}, {}, {}]})) == (("test:python", "tests"), 3.0)
    assert w(test({"cases": []})) == (("test:python", "none"), 1.0)
    assert w(test({"cases": ({}, {})})) == (("test:python", "none"), 1.0)  # not a list
    assert w(test({})) == (("test:python", "none"), 1.0)
    assert w(test({"cases": [{}, {}]}, hints=WorkHints(items=5))) == (("test:python", "items"), 5.0)
    # a code action's cases are not counted
    assert w(ActionSpec("c", tag="python", payload={"cases": [{}, {}]})) == \
        (("code:python", "none"), 1.0)


def test_a_specific_key_teaches_its_general_key_and_samples_count_every_basis() -> None:
    est = DurationEstimator()
    est.observe(_code("a", task="t"), 1.0)
    est.observe(_code("b"), 1.0)
    est.observe(_tests("c", 4), 1.0)
    assert est.samples("code:python@t") == 1
    assert est.samples("code:python") == 2  # its own and the task's (basis none)
    assert est.samples("test:python") == 1
    assert est.samples("code:go") == 0


# -- what a run teaches -----------------------------------------------------------------------


def test_a_run_is_learned_as_its_unit_time_at_speed_one() -> None:
    est = DurationEstimator(min_samples=1)
    est.observe(_tests("a", 10, tag="s4"), 2.0, speed=4.0)  # 2 s x 4 / 10 tests = 0.8 per test
    assert est.predict(_tests("b", 5, tag="s4")) == pytest.approx(4.0, rel=R)
    est.observe(_code("c", tag="s0"), 5e6, speed=0.0)  # speed floored at 1e-6: 5 s per action
    assert est.predict(_code("d", tag="s0")) == pytest.approx(5.0, rel=R)
    est.observe(_code("c", tag="sn"), 5e6, speed=-1.0)
    assert est.predict(_code("d", tag="sn")) == pytest.approx(5.0, rel=R)
    est.observe(_code("c", tag="z"), 0.0)  # a run of 0 s counts, as the floor 1e-6
    assert est.predict(_code("d", tag="z")) == pytest.approx(1e-6, rel=R)
    est.observe(_code("c", tag="tiny"), 1e-9)
    assert est.predict(_code("d", tag="tiny")) == pytest.approx(1e-6, rel=R)


def test_a_run_of_no_finite_length_teaches_nothing() -> None:
    est = DurationEstimator()
    for bad in (-1.0, -1e-12, math.inf, math.nan):
        est.observe(_code("a"), bad)
    assert est.version == 0 and est.samples("code:python") == 0
    assert est.predict(_code("b")) == pytest.approx(1.0, rel=R)


def test_the_version_counts_every_key_taught() -> None:
    est = DurationEstimator()
    assert est.version == 0
    est.observe(_code("a"), 1.0)
    assert est.version == 1  # a general key
    est.observe(_code("b", task="t"), 1.0)
    assert est.version == 3  # the task's key and its kind's
    est.observe(_tests("c", 2, siblings="g"), 1.0)
    assert est.version == 4  # a sibling: its key (the group keeps its own stats)
    est.observe(_tests("d", 2, task="t", siblings="g"), 1.0)
    assert est.version == 6


def test_a_key_blends_toward_its_own_history_until_min_samples() -> None:
    est = DurationEstimator()  # min_samples 3
    spec = _code("a", task="t")
    est.observe(spec, 0.2)  # both keys hold [0.2]
    # kind: 1/3 x 0.2 + 2/3 x 1.0 (the prior) = 2.2/3; task: 1/3 x 0.2 + 2/3 x 2.2/3 = 5/9
    assert est.predict(_code("k")) == pytest.approx(2.2 / 3, rel=R)
    assert est.predict(spec) == pytest.approx(5 / 9, rel=R)
    est.observe(spec, 0.5)  # [0.2, 0.5]: median (q 0.5: the first of two) 0.2
    # kind: 2/3 x 0.2 + 1/3 x 1.0 = 1.4/3; task: 2/3 x 0.2 + 1/3 x 1.4/3 = 2.6/9
    assert est.predict(_code("k")) == pytest.approx(1.4 / 3, rel=R)
    assert est.predict(spec) == pytest.approx(2.6 / 9, rel=R)
    est.observe(spec, 0.5)  # three: its own median, 0.5
    assert est.predict(spec) == pytest.approx(0.5, rel=R)
    assert est.predict(spec, q=0.0) == pytest.approx(0.2, rel=R)
    one = DurationEstimator(min_samples=1)
    one.observe(spec, 0.2)
    assert one.predict(spec) == pytest.approx(0.2, rel=R)
    assert one.predict(_code("k", task="other")) == pytest.approx(0.2, rel=R)  # from its kind


def test_an_answer_changes_with_the_next_run_on_either_path() -> None:
    est = DurationEstimator(min_samples=1)
    key, units = est.work_of(_code("a"))
    est.observe(_code("a"), 1.0)
    assert est.predict_work(key, units, 0.5) == 1.0
    assert est.unit_quantile(key[0], key[1], 0.9) == 1.0
    est.observe(_code("a"), 3.0)
    est.observe(_code("a"), 5.0)  # [1, 3, 5]
    assert est.predict_work(key, units, 0.5) == 3.0
    assert est.unit_quantile(key[0], key[1], 0.9) == 5.0
    est.observe(_code("a"), 0.5)  # [0.5, 1, 3, 5]
    assert est.unit_quantile(key[0], key[1], 0.9) == 5.0
    assert est.predict_work(key, 2.0, 0.5) == 2.0  # 2 x 1
    assert est.predict(_code("b"), q=0.5) == 1.0


# -- the reservoir and its quantiles ----------------------------------------------------------


@pytest.mark.parametrize("query_each", [True, False])
def test_the_reservoir_keeps_the_128_most_recent(query_each: bool) -> None:
    est = DurationEstimator()
    spec = _code("a", tag="r128")
    key, _ = est.work_of(spec)
    for i in range(1, 129):
        est.observe(spec, float(i))
        if query_each:  # (the sorted copy kept up to date as values come and go)
            est.predict_work(key, 1.0, 0.0)
    assert est.predict_work(key, 1.0, 0.0) == 1.0
    est.observe(spec, 129.0)  # 1 is evicted
    assert est.predict_work(key, 1.0, 0.0) == 2.0
    assert est.predict_work(key, 1.0, 1.0) == 129.0
    assert est.mean_work(key, 1.0) == pytest.approx(65.5, rel=R)  # (2 + 129) / 2
    assert est.samples("code:r128") == 129


def test_a_small_reservoir_evicts_the_oldest_value_not_the_smallest() -> None:
    est = DurationEstimator(reservoir=3, min_samples=1)
    spec = _code("a", tag="r3")
    key, _ = est.work_of(spec)
    for run in (5.0, 1.0, 3.0):
        est.observe(spec, run)
        assert est.predict_work(key, 1.0, 1.0) == 5.0
    est.observe(spec, 4.0)  # [1, 3, 4]: 5 out
    assert est.predict_work(key, 1.0, 1.0) == 4.0
    assert est.predict_work(key, 1.0, 0.0) == 1.0
    est.observe(spec, 2.0)  # [2, 3, 4]: 1 out
    assert est.predict_work(key, 1.0, 0.0) == 2.0
    assert est.predict_work(key, 1.0, 0.5) == 3.0
    est.observe(spec, 6.0)  # [2, 4, 6]: 3 out
    assert [est.predict_work(key, 1.0, q) for q in (0.0, 0.5, 1.0)] == [2.0, 4.0, 6.0]
    assert est.mean_work(key, 1.0) == pytest.approx(4.0, rel=R)


# quantile q of n sorted values: the ceil(q n)-th, within the first and the last
QUANTILES = [(0.0, 1.0), (0.25, 1.0), (0.26, 2.0), (0.5, 2.0), (0.75, 3.0), (0.76, 4.0),
             (1.0, 4.0), (1.5, 4.0), (-1.0, 1.0)]


def test_quantiles_by_hand_on_both_paths() -> None:
    fresh = DurationEstimator(min_samples=1)
    for run in (4.0, 1.0, 3.0, 2.0):
        fresh.observe(_code("a", tag="q"), run)
    key, _ = fresh.work_of(_code("a", tag="q"))
    assert [fresh.unit_quantile(key[0], key[1], q) for q, _ in QUANTILES] == \
        [v for _, v in QUANTILES]
    # the inlined path: the key has a cache and a sorted copy when a run is added
    inl = DurationEstimator(min_samples=1)
    for run in (4.0, 1.0, 3.0):
        inl.observe(_code("a", tag="q"), run)
    assert inl.predict_work(key, 1.0, 0.5) == 3.0
    inl.observe(_code("a", tag="q"), 2.0)
    assert [inl.predict_work(key, 2.0, q) for q, _ in QUANTILES] == [2 * v for _, v in QUANTILES]
    # cached now: the same answers
    assert [inl.predict_work(key, 2.0, q) for q, _ in QUANTILES] == [2 * v for _, v in QUANTILES]
    assert [inl.unit_quantile(key[0], key[1], q) for q, _ in QUANTILES] == \
        [v for _, v in QUANTILES]


# -- the neutral estimate ---------------------------------------------------------------------


def test_a_new_kind_gets_the_lower_median_of_the_kinds_medians() -> None:
    est = DurationEstimator()
    for tag, run in (("a", 0.1), ("b", 0.2), ("c", 0.3), ("d", 0.4)):
        for i in range(3):  # exactly min_samples: each kind counts
            est.observe(_code(f"{tag}{i}", tag=tag), run)
    # medians 0.1, 0.2, 0.3, 0.4: the ((4 - 1) // 2)-th, 0.2
    assert est.neutral("none") == pytest.approx(0.2, rel=R)
    assert est.predict(_code("n", tag="new")) == pytest.approx(0.2, rel=R)
    for i in range(2):  # two runs only: not counted
        est.observe(_code(f"e{i}", tag="e"), 9.0)
    for i in range(3):  # another basis: not counted here
        est.observe(_tests(f"f{i}", 1, tag="f"), 9.0)
    for i in range(3):  # a task's key is not a kind (its kind counts it: a's median stays 0.1)
        est.observe(_code(f"t{i}", tag="a", task="t"), 5.0)
    assert est.samples("code:a") == 6
    assert est.neutral("none") == pytest.approx(0.2, rel=R)
    assert est.predict(_code("n", tag="new")) == pytest.approx(0.2, rel=R)
    assert est.neutral("tests") == pytest.approx(9.0, rel=R)
    assert est.neutral("items") == PRIORS["items"]
    est.observe(_code("e2", tag="e"), 9.0)  # e counts now: medians 0.1 ... 0.4, 9: 0.3
    assert est.neutral("none") == pytest.approx(0.3, rel=R)
    assert est.predict(_code("n", tag="new")) == pytest.approx(0.3, rel=R)


# -- means and mean excess --------------------------------------------------------------------


def test_mean_and_remaining_work_by_hand() -> None:
    est = DurationEstimator()
    key, _ = est.work_of(_tests("k", 2, tag="m"))
    assert est.mean_work(key, 2.0) is None and est.remaining_work(key, 2.0, 0.0) is None
    est.observe(_tests("a", 2, tag="m"), 2.0)
    est.observe(_tests("b", 2, tag="m"), 4.0)
    assert est.mean_work(key, 2.0) is None  # two of three
    assert est.remaining_work(key, 2.0, 0.0) is None
    est.observe(_tests("c", 2, tag="m"), 6.0)  # unit times 1, 2, 3
    assert est.mean_work(key, 2.0) == pytest.approx(4.0, rel=R)  # 2 x 2
    assert est.mean_work(key, 10.0) == pytest.approx(20.0, rel=R)
    # done d on 2 units: a = d / 2 per unit; E[U - a | U > a] x 2
    assert est.remaining_work(key, 2.0, 0.0) == pytest.approx(4.0, rel=R)  # (2 - 0) x 2
    assert est.remaining_work(key, 2.0, 2.0) == pytest.approx(3.0, rel=R)  # (2.5 - 1) x 2
    assert est.remaining_work(key, 2.0, 4.0) == pytest.approx(2.0, rel=R)  # one above: (3 - 2) x 2
    assert est.remaining_work(key, 2.0, 5.0) == pytest.approx(1.0, rel=R)  # (3 - 2.5) x 2
    # past every run: a quarter of what it did per unit, x 2
    assert est.remaining_work(key, 2.0, 6.0) == pytest.approx(1.5, rel=R)
    assert est.remaining_work(key, 2.0, 8.0) == pytest.approx(2.0, rel=R)
    # one unit and less: done 2 s of one unit, 3 - 2; of half a unit, (3 - 2) x 0.5 (a = 2)
    assert est.remaining_work(key, 1.0, 2.0) == pytest.approx(1.0, rel=R)
    assert est.remaining_work(key, 0.5, 1.0) == pytest.approx(0.5, rel=R)
    assert est.remaining_work(key, 0.0, 1.0) is None
    assert est.remaining_work(key, -1.0, 1.0) is None


def test_the_mean_excess_follows_each_observation() -> None:
    """`remaining_work` reads a view of the key's values kept per `version` (issue 40): an
    observation between two questions is in the second answer, of the key and of another."""
    est = DurationEstimator()
    key, _ = est.work_of(_tests("k", 2, tag="m"))
    other, _ = est.work_of(_tests("o", 2, tag="n"))
    for i, run in enumerate((2.0, 4.0, 6.0)):  # unit times 1, 2, 3
        est.observe(_tests(f"a{i}", 2, tag="m"), run)
        est.observe(_tests(f"b{i}", 2, tag="n"), run)
    assert est.remaining_work(key, 2.0, 2.0) == pytest.approx(3.0, rel=R)  # (2.5 - 1) x 2
    assert est.remaining_work(other, 2.0, 2.0) == pytest.approx(3.0, rel=R)
    est.observe(_tests("a3", 2, tag="m"), 14.0)  # unit times 1, 2, 3, 7
    assert est.remaining_work(key, 2.0, 2.0) == pytest.approx(6.0, rel=R)  # (4 - 1) x 2: 2, 3, 7 above 1
    assert est.remaining_work(other, 2.0, 2.0) == pytest.approx(3.0, rel=R)  # (not its key)


def test_a_young_task_key_answers_means_from_its_kind() -> None:
    est = DurationEstimator()
    for i, run in enumerate((2.0, 4.0)):
        est.observe(_tests(f"a{i}", 2, tag="p"), run)  # kind: 1, 2
    spec = _tests("t0", 2, tag="p", task="t")
    key, _ = est.work_of(spec)
    assert est.mean_work(key, 2.0) is None  # neither has three
    assert est.remaining_work(key, 2.0, 0.0) is None
    est.observe(spec, 8.0)  # kind: 1, 2, 4 (three: its own); task: 4
    assert est.mean_work(key, 2.0) == pytest.approx(14 / 3, rel=R)  # the kind's 7/3 x 2
    assert est.remaining_work(key, 2.0, 2.0) == pytest.approx(4.0, rel=R)  # (3 - 1) x 2
    est.observe(spec, 8.0)  # kind: 1, 2, 4, 4 (mean 2.75); task: 4, 4
    assert est.mean_work(key, 2.0) == pytest.approx(5.5, rel=R)
    est.observe(spec, 8.0)  # the task's own: 4, 4, 4
    assert est.mean_work(key, 2.0) == pytest.approx(8.0, rel=R)
    assert est.remaining_work(key, 2.0, 4.0) == pytest.approx(4.0, rel=R)  # (4 - 2) x 2
    other, _ = est.work_of(_tests("o", 2, tag="nothing"))
    assert est.mean_work(other, 2.0) is None and est.remaining_work(other, 2.0, 1.0) is None


# -- error scores -----------------------------------------------------------------------------


def test_errors_are_log2_ratios_scored_under_the_kind() -> None:
    est = DurationEstimator()
    key, _ = est.work_of(_code("a", task="t"))
    est.note_error(key, 1.0, 2.0)  # log2 2 = 1: within 2x (the edge counts)
    est.note_error(key, 1.0, 0.5)  # -1: within
    est.note_error(key, 1.0, 8.0)  # 3
    est.note_error(key, 3.0, 1.0)  # log2(1/3) = -1.5849625
    for p, a in ((0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -1.0), (1.0, math.inf),
                 (1.0, math.nan), (math.nan, 1.0)):
        est.note_error(key, p, a)  # not scored
    est.note_error(est.work_of(_code("b", tag="bash"))[0], 2.0, 2.0)  # 0: within
    go, _ = est.work_of(_code("g", tag="go"))
    for actual in (1.0, 4.0, 8.0):  # 0, 2, 3 (a third within 2x)
        est.note_error(go, 1.0, actual)
    got = est.errors()
    assert list(got) == ["code:bash", "code:go", "code:python"]
    assert got["code:go"] == {"scored": 3, "mean_abs_log2": 1.6667, "within_2x": 0.3333}
    rb, _ = est.work_of(_code("r", tag="ruby"))
    est.note_error(rb, 1.0, 2 ** 0.5)  # 0.5: a positive error below 1 counts as itself
    est.note_error(rb, 2 ** 0.5, 1.0)  # -0.5
    assert est.errors()["code:ruby"] == {"scored": 2, "mean_abs_log2": 0.5, "within_2x": 1.0}
    # (1 + 1 + 3 + 1.5849625) / 4 = 1.646240625, rounded to 4 places
    assert got["code:python"] == {"scored": 4, "mean_abs_log2": 1.6462, "within_2x": 0.5}
    assert got["code:bash"] == {"scored": 1, "mean_abs_log2": 0.0, "within_2x": 1.0}
    assert DurationEstimator().errors() == {}
    # a tenant's sibling of a task: under its kind too (not the task, not the tenant)
    sib, _ = est.work_of(_code("s", tag="go", task="t", siblings="p", tenant="u"))
    assert sib == ("code:go@t", "none\x1fu\x1fp")
    est.note_error(sib, 1.0, 1.0)
    assert list(est.errors()) == ["code:bash", "code:go", "code:python", "code:ruby"]
    assert est.errors()["code:go"]["scored"] == 4


# -- memos and groups: bounded ----------------------------------------------------------------


def test_the_key_memos_stay_bounded() -> None:
    est = DurationEstimator()
    for i in range(4200):
        est.work_of(_code("a", tag=f"memo{i}"))
        assert len(estimator_module._KEYS) <= 4097
        assert len(estimator_module._WORK_KEYS) <= 4097
    # and answer the same after they were cleared
    assert est.work_of(_code("a", tag="memo7", task="t")) == (("code:memo7@t", "none"), 1.0)
    est.observe(_code("a", tag="memo7", task="t"), 1.0)
    assert est.samples("code:memo7") == 1


def test_at_most_4096_sibling_groups_by_default() -> None:
    est = DurationEstimator()
    for g in range(4097):
        est.observe(_tests(f"a{g}", 1, tag="lru", siblings=f"g{g}"), 1.0)
    first = est.work_of(_tests("x", 1, tag="lru", siblings="g0"))[0]
    second = est.work_of(_tests("x", 1, tag="lru", siblings="g1"))[0]
    assert est.sibling_stats(first) is None
    assert est.sibling_stats(second) == (1, pytest.approx(1.0, rel=R))


def test_a_tenants_siblings_fall_back_to_the_key_without_tenant_or_group() -> None:
    est = DurationEstimator()
    for i in range(3):
        est.observe(_tests(f"k{i}", 10), 4.0)  # the key: 0.4 per test, three times
    # a group without tenant named as the tenant below: no part of the tenant's estimates
    est.observe(_tests("u0", 10, siblings="t1"), 8.0)  # the key: 0.4 x 3, 0.8
    spec = _tests("s0", 10, siblings="p1", tenant="t1")
    key, units = est.work_of(spec)
    assert key == ("test:python", "tests\x1ft1\x1fp1") and units == 10.0
    est.observe(spec, 1.0)  # a sibling at 0.1: the group's first; the key: 0.1, 0.4 x 3, 0.8
    assert est.sibling_stats(key) == (1, pytest.approx(0.1, rel=R))
    # k = 1: exp((log 0.1 + log 0.4) / 2) = 0.2 per test, half the key's median 0.4
    assert est.predict_work(key, units, 0.5) == pytest.approx(2.0, rel=R)
    assert est.predict(_tests("s1", 10, siblings="p1", tenant="t1")) == pytest.approx(2.0, rel=R)
    # the key's mean, (0.1 + 3 x 0.4 + 0.8) / 5 = 0.42 per test, x 10 tests, x 0.5
    assert est.mean_work(key, units) == pytest.approx(2.1, rel=R)
    assert est.remaining_work(key, units, 0.0) == pytest.approx(2.1, rel=R)
    est.observe(_tests("s2", 10, siblings="p1", tenant="t1"), 4.0)  # 0.4: its second
    assert est.sibling_stats(key) == (2, pytest.approx(0.2, rel=R))  # sqrt(0.1 x 0.4)
    # the key: 0.1, 0.4 x 4, 0.8 (median 0.4): exp((log 0.1 + log 0.4 + log 0.4) / 3) per test
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * 0.016 ** (1 / 3), rel=R)
    # the same group's name without the tenant is another group, with none finished
    plain, _ = est.work_of(_tests("p", 10, siblings="p1"))
    assert est.sibling_stats(plain) is None
    assert est.predict_work(plain, units, 0.5) == pytest.approx(4.0, rel=R)


def test_k_of_a_tenants_siblings_measures_deviations_from_the_key_alone() -> None:
    est = DurationEstimator()
    for i in range(100):
        est.observe(_tests(f"k{i}", 10), 10.0)  # the key's median: 1.0 per test (log 0)
    # a group without tenant named "t1" at e^2 per test: not the tenant t1's reference
    est.observe(_tests("u0", 10, siblings="t1"), 10 * math.e ** 2)
    for g in range(8):  # the tenant's groups: siblings at e^0.25, then e^1
        for i, d in enumerate((0.25, 1.0)):
            est.observe(_tests(f"{g}-{i}", 10, siblings=f"g{g}", tenant="t1"), 10 * math.exp(d))
    # each second sibling: d_new = 1 - 0, d_group = 0.25 - 0: rho = 0.25, k = 0.75 / 0.25
    assert est.sibling_k() == pytest.approx(3.0, rel=R)
    est.observe(_tests("n0", 10, siblings="new", tenant="t1"), 10 * math.e)
    key, units = est.work_of(_tests("n1", 10, siblings="new", tenant="t1"))
    # (log e + 3 log 1) / (1 + 3)
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * math.exp(0.25), rel=R)


# -- through the core: what a finish, a failure and a cancel teach ----------------------------


def test_a_success_teaches_and_a_failure_or_a_cancel_does_not() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("ok", tag="python"), act("bad", tag="python"), act("gone", tag="python"))
    est = d.core.estimator
    assert est.version == 0
    d.at(2.0).finish("ok", run_s=2.0)
    assert est.version == 1 and est.samples("code:python") == 1
    # 1/3 x 2 + 2/3 x 1.0 (the prior): 4/3
    assert est.predict(act("x", tag="python")) == pytest.approx(4 / 3, rel=R)
    # its prediction at arrival was the prior, 1 s: off by 2x, within
    assert est.errors() == {"code:python": {"scored": 1, "mean_abs_log2": 1.0, "within_2x": 1.0}}
    d.at(3.0).finish("bad", status=Status.FAILED, run_s=3.0)
    d.at(3.5).finish("gone", status=Status.TIMED_OUT, run_s=3.5)
    assert est.version == 1 and est.samples("code:python") == 1
    d.arrive(act("c", tag="python"))
    d(ev.CancelRequested(4.0, "c"))
    d.at(5.0).finish("c", run_s=5.0)  # (after its cancel: stale)
    assert est.version == 1 and est.samples("code:python") == 1
    assert est.errors()["code:python"]["scored"] == 1
