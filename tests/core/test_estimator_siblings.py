"""Estimates from siblings (issue 39, item 5): an action that names its siblings (the GRPO
answers of one prompt) is estimated from the key's estimate shrunk toward what its finished
siblings took (a credibility weight n / (n + k) on the logs); its mean and mean excess are the
key's scaled by the same factor; groups are scoped by tenant and LRU-bounded."""

from __future__ import annotations

import math

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec, WorkHints
from arl_tangram.core.estimator import SEP, DurationEstimator


def _test(aid: str, siblings: str | None = None, tenant: str | None = None,
          tests: int = 10) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.TEST, tag="python", hints=WorkHints(test_count=tests),
                      siblings=siblings, tenant=tenant)


def test_siblings_stay_out_of_the_repr_and_name_a_grouped_key() -> None:
    a = _test("a", siblings="p1")
    assert "p1" not in repr(a) and repr(a) == repr(_test("a"))
    key, units = DurationEstimator.work_of(a)
    base, _ = DurationEstimator.work_of(_test("b"))
    assert key == (base[0], "tests" + SEP + "p1") and units == 10.0
    # scoped by tenant: another tenant's siblings of the same name are another group
    other, _ = DurationEstimator.work_of(_test("c", siblings="p1", tenant="t1"))
    assert other == (base[0], "tests" + SEP + "t1" + SEP + "p1")


def test_before_any_sibling_finishes_the_estimate_is_the_keys() -> None:
    est = DurationEstimator()
    key, units = est.work_of(_test("a", siblings="p1"))
    assert est.predict_work(key, units, 0.5) == pytest.approx(0.5, rel=1e-12)  # 10 x 0.05 prior
    assert est.sibling_stats(key) is None
    assert est.mean_work(key, units) is None  # (the key has no history: the caller's estimate)


def test_a_finished_sibling_pulls_the_estimate_by_the_credibility_weight() -> None:
    est = DurationEstimator()
    est.observe(_test("b", siblings="p1"), 2.0)  # unit 0.2 s per test
    # the key learned it as any action: 1/3 of 0.2 + 2/3 of the 0.05 prior
    base, _ = est.work_of(_test("c"))
    assert est.predict_work(base, 10.0, 0.5) == pytest.approx(1.0, rel=1e-12)
    key, units = est.work_of(_test("a", siblings="p1"))
    assert est.sibling_stats(key) == (1, pytest.approx(0.2, rel=1e-12))
    # k = 1: exp((log 0.2 + log 0.1) / 2) = sqrt(0.02) per test
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * math.sqrt(0.02), rel=1e-12)
    assert est.predict(_test("a", siblings="p1"), speed=2.0) == \
        pytest.approx(5 * math.sqrt(0.02), rel=1e-12)
    assert est.predict(_test("c"), speed=2.0) == pytest.approx(0.5, rel=1e-12)
    # another group, and the same name under a tenant, are untouched
    other, _ = est.work_of(_test("d", siblings="p2"))
    assert est.predict_work(other, 10.0, 0.5) == pytest.approx(1.0, rel=1e-12)
    scoped, _ = est.work_of(_test("e", siblings="p1", tenant="t1"))
    assert est.predict_work(scoped, 10.0, 0.5) == pytest.approx(1.0, rel=1e-12)


def test_more_siblings_weigh_more_and_the_prior_weight_is_a_setting() -> None:
    est = DurationEstimator(sibling_prior=3.0)
    for i in range(3):
        est.observe(_test(f"b{i}", siblings="p1"), 4.0)  # unit 0.4, three times: the key's own
    key, units = est.work_of(_test("a", siblings="p1"))
    assert est.sibling_stats(key) == (3, pytest.approx(0.4, rel=1e-12))
    # the key's median is 0.4 now too: (3 log 0.4 + 3 log 0.4) / 6
    assert est.predict_work(key, units, 0.5) == pytest.approx(4.0, rel=1e-12)
    est.observe(_test("x"), 0.5)  # an action without siblings: key only
    est.observe(_test("y"), 0.5)  # key: 0.05, 0.05, 0.4, 0.4, 0.4 -> median 0.4
    est.observe(_test("z"), 0.5)  # 0.05 x 3, 0.4 x 3 -> median (q 0.5) 0.05
    assert est.sibling_stats(key) == (3, pytest.approx(0.4, rel=1e-12))
    # (3 log 0.4 + 3 log 0.05) / 6 = log sqrt(0.02)
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * math.sqrt(0.02), rel=1e-12)


def test_mean_and_mean_excess_are_the_keys_scaled_by_the_siblings() -> None:
    est = DurationEstimator()
    for i, run in enumerate((1.0, 2.0, 3.0)):
        est.observe(_test(f"k{i}"), run)  # units 0.1, 0.2, 0.3
    est.observe(_test("s", siblings="p1"), 8.0)  # 0.8: the key has 0.1, 0.2, 0.3, 0.8
    base, _ = est.work_of(_test("c"))
    key, units = est.work_of(_test("a", siblings="p1"))
    assert est.predict_work(base, units, 0.5) == pytest.approx(2.0, rel=1e-12)  # median 0.2
    # sqrt(0.8 x 0.2) = 0.4 per test: twice the key's median
    assert est.predict_work(key, units, 0.5) == pytest.approx(4.0, rel=1e-12)
    assert est.mean_work(base, units) == pytest.approx(3.5, rel=1e-12)
    assert est.mean_work(key, units) == pytest.approx(7.0, rel=1e-12)
    assert est.remaining_work(base, units, 0.0) == pytest.approx(3.5, rel=1e-12)
    assert est.remaining_work(key, units, 0.0) == pytest.approx(7.0, rel=1e-12)
    # done 5 s of 10 tests scaled by 2: units past 0.25 (0.3, 0.8) exceed it by 0.3 on average
    assert est.remaining_work(key, units, 5.0) == pytest.approx(6.0, rel=1e-12)
    none_yet, _ = est.work_of(_test("b", siblings="p9"))
    assert est.mean_work(none_yet, units) == pytest.approx(3.5, rel=1e-12)  # no sibling: x 1
    # a prediction of a sibling is scored under its kind, as any
    est.note_error(key, 4.0, 8.0)
    assert est.errors() == {base[0]: {"scored": 1, "mean_abs_log2": 1.0, "within_2x": 1.0}}


def test_groups_are_lru_bounded() -> None:
    est = DurationEstimator(max_groups=2)
    keys = {g: est.work_of(_test(g, siblings=g))[0] for g in ("g1", "g2", "g3")}
    est.observe(_test("a", siblings="g1"), 1.0)
    est.observe(_test("b", siblings="g2"), 1.0)
    est.observe(_test("c", siblings="g1"), 1.0)  # g1 is the most recent again
    est.observe(_test("d", siblings="g3"), 1.0)  # g2, the least recent, is dropped
    assert est.sibling_stats(keys["g1"]) == (2, pytest.approx(0.1, rel=1e-12))
    assert est.sibling_stats(keys["g2"]) is None
    assert est.sibling_stats(keys["g3"]) == (1, pytest.approx(0.1, rel=1e-12))


def _pairs(est: DurationEstimator, first: float, second: float, groups: int, tag: str = "") -> None:
    """``groups`` groups of two siblings: unit times e^first then e^second (per test)."""
    for g in range(groups):
        for i, d in enumerate((first, second)):
            est.observe(_test(f"{tag}{g}-{i}", siblings=f"{tag}g{g}"), 10 * math.exp(d))


def _settled() -> DurationEstimator:
    est = DurationEstimator()
    for i in range(100):
        est.observe(_test(f"k{i}"), 10.0)  # the key's median: 1.0 per test (log 0), whatever follows
    return est


def test_k_is_estimated_from_the_siblings_seen() -> None:
    est = _settled()
    _pairs(est, 0.25, 1.0, 7)
    assert est.sibling_k() == 1.0  # 7 pairs: not yet
    _pairs(est, 0.25, 1.0, 1, tag="x")
    # rho = sum(1.0 x 0.25) / sum(1.0 ** 2) = 0.25: k = 0.75 / 0.25
    assert est.sibling_k() == pytest.approx(3.0, rel=1e-12)
    est.observe(_test("n0", siblings="new"), 10 * math.e)  # one sibling at e per test
    key, units = est.work_of(_test("n1", siblings="new"))
    # (log e + 3 log 1) / (1 + 3)
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * math.exp(0.25), rel=1e-12)


def test_k_stays_within_its_bounds() -> None:
    est = _settled()
    _pairs(est, 1.0, 0.25, 8)  # rho 4: at most 0.99
    assert est.sibling_k() == pytest.approx(0.01 / 0.99, rel=1e-12)
    est = _settled()
    _pairs(est, -1.0, 1.0, 8)  # rho -1: at least 0.01
    assert est.sibling_k() == pytest.approx(99.0, rel=1e-12)
    est = _settled()
    _pairs(est, 1.0, 0.0, 8)  # every later sibling at the key's estimate: no spread to measure
    assert est.sibling_k() == 1.0
    assert DurationEstimator(sibling_prior=2.5).sibling_k() == 2.5


def test_a_siblings_error_is_scored_under_its_general_kind() -> None:
    est = DurationEstimator()
    spec = ActionSpec("a", kind=ActionKind.TEST, tag="python", task="t",
                      hints=WorkHints(test_count=10), siblings="p1")
    key, _ = est.work_of(spec)
    general, _ = est.work_of(_test("b"))
    assert key[0] == general[0] + "@t"  # (the task's key, which falls back to the kind's)
    est.note_error(key, 1.0, 4.0)
    assert est.errors() == {general[0]: {"scored": 1, "mean_abs_log2": 2.0, "within_2x": 0.0}}


def test_k_measures_deviations_from_the_keys_estimate_and_the_groups_mean_so_far() -> None:
    est = DurationEstimator()
    for i in range(100):
        est.observe(_test(f"k{i}"), 10 * math.e)  # the key's median: e per test (log 1)
    for tag in ("go", "rust"):  # other kinds: the neutral estimate (5) is not the key's
        for i in range(3):
            est.observe(ActionSpec(f"{tag}{i}", kind=ActionKind.TEST, tag=tag,
                                   hints=WorkHints(test_count=10)), 50.0)
    for g in range(4):  # three siblings 0.5, 0.5 and 1.0 above the key's log estimate
        for i, d in enumerate((0.5, 0.5, 1.0)):
            est.observe(_test(f"{g}-{i}", siblings=f"g{g}"), 10 * math.exp(1.0 + d))
    # per group: the second 0.5 x 0.5, the third 1.0 x mean(0.5, 0.5); squares 0.25 + 1.0
    # rho = 0.75 / 1.25 = 0.6, k = 0.4 / 0.6
    assert est.sibling_k() == pytest.approx(2 / 3, rel=1e-12)
    est.observe(_test("n0", siblings="new"), 10 * math.exp(2.0))
    key, units = est.work_of(_test("n1", siblings="new"))
    # (2 + k x 1) / (1 + k)
    assert est.predict_work(key, units, 0.5) == pytest.approx(10 * math.exp(1.6), rel=1e-12)
