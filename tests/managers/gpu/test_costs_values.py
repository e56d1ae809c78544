"""Exact values of managers/gpu/costs.py (issue 43 item 2): the fit's flat and through-origin
cases by hand, one point per batch size (its median), the number of sizes it needs, and the
tracker's window, its ignored empty batches and every field of `fitted()`."""

from __future__ import annotations

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu.costs import CostTracker, fit_alpha_beta


def test_a_line_whose_slope_is_exactly_zero_is_flat_at_the_mean_of_the_medians() -> None:
    # weights 1, 1/4, 1: sw*sxy - sx*sy = 2.25*5 - 4.5*2.5 = 0 exactly; the flat line is the
    # plain mean 4/3 (the weighted intercept would be 2.5/2.25 = 1.111...)
    assert fit_alpha_beta([(1, 1.0), (2, 2.0), (3, 1.0)]) == (4 / 3, 0.0)


def test_a_negative_intercept_refits_through_the_origin() -> None:
    # the line through (1, 1) and (2, 3) has alpha = -1; through the origin with weights 1 and
    # 1/9: sxy / sxx = (1 + 2/3) / (1 + 4/9) = 15/13
    alpha, beta = fit_alpha_beta([(1, 1.0), (2, 3.0)])  # type: ignore[misc]
    assert alpha == 0.0
    assert beta == pytest.approx(15 / 13, rel=1e-12)


def test_one_point_per_size_its_median() -> None:
    # medians 1.0 (of 0.5, 1.5) and 2.0: the line 0 + 1 * n
    assert fit_alpha_beta([(1, 0.5), (1, 1.5), (2, 2.0), (2, 2.0)]) == (0.0, 1.0)
    assert fit_alpha_beta([(1, 9.0), (1, 1.0), (1, 1.5), (2, 2.0)]) == pytest.approx(
        (1.0, 0.5), rel=1e-12
    )


def test_the_number_of_sizes_needed() -> None:
    two = [(1, 1.0), (2, 1.5)]
    assert fit_alpha_beta(two) == pytest.approx((0.5, 0.5), rel=1e-12)
    assert fit_alpha_beta(two, 2) == pytest.approx((0.5, 0.5), rel=1e-12)
    assert fit_alpha_beta(two, 3) is None
    assert fit_alpha_beta([(1, 1.0)], 1) is None  # never fewer than two
    assert fit_alpha_beta([(1, 1.0), (2, 1.5), (4, 2.5)], 3) == pytest.approx((0.5, 0.5), rel=1e-12)


def test_zero_latencies_count_as_a_nanosecond() -> None:
    assert fit_alpha_beta([(1, 0.0), (2, 0.0)]) == (1e-9, 0.0)


def _spec() -> ModelSpec:
    return ModelSpec("m", alpha=0.02, beta=0.002, load_s=9.0, swap_s=0.5, max_batch=64)


def test_fitted_before_any_measurement_is_the_spec() -> None:
    assert CostTracker(_spec()).fitted() == {
        "alpha": 0.02,
        "beta": 0.002,
        "fitted": False,
        "batch_samples": 0,
        "load_s": 9.0,
        "load_samples": 0,
        "swap_s": 0.5,
        "swap_samples": 0,
    }


def test_fitted_counts_every_sample_and_needs_three_sizes() -> None:
    t = CostTracker(_spec())
    t.add_batch(0, 5.0)  # an empty batch is no sample
    t.add_batch(1, 1.0)
    t.add_batch(2, 1.5)
    t.add_batch(2, 1.5)
    for s in (3.0, 1.0, 2.0):
        t.add_load(s, from_host=False)
    for s in (0.25, 0.75):
        t.add_load(s, from_host=True)
    assert t.fitted() == {
        "alpha": 0.02,  # two sizes: still the spec's prior (MIN_SIZES = 3)
        "beta": 0.002,
        "fitted": False,
        "batch_samples": 3,
        "load_s": 2.0,
        "load_samples": 3,
        "swap_s": 0.5,
        "swap_samples": 2,
    }
    t.add_batch(4, 2.5)
    f = t.fitted()
    assert (f["fitted"], f["batch_samples"]) == (True, 4)
    assert (f["alpha"], f["beta"]) == pytest.approx((0.5, 0.5), rel=1e-12)
    assert t.knee_batch() == 4


def test_the_window_keeps_the_last_256_of_each() -> None:
    t = CostTracker(_spec())
    for i in range(300):
        t.add_batch(1 + i % 3, 1.0)
        t.add_load(float(i), from_host=False)
        t.add_load(float(i), from_host=True)
    f = t.fitted()
    assert (f["batch_samples"], f["load_samples"], f["swap_samples"]) == (256, 256, 256)
    assert f["load_s"] == f["swap_s"] == (171 + 172) / 2  # the median of 44..299
    small = CostTracker(_spec(), window=2)
    for s in (1.0, 2.0, 4.0):
        small.add_load(s, from_host=False)
    assert small.fitted()["load_s"] == 3.0
