"""What `benchmarks/bench_growth.py`'s resize lines compute (issue 39, item 1), on synthetic
samples: the span detection, the medians and the printed line."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sim"))
from benchmark_module import load_benchmark

bench = load_benchmark("bench_growth")


def _samples(rates: list[tuple[float, float]], step: float = 0.01,
             start: float = -0.05) -> list[tuple[float, float]]:
    """(time, cpu) every ``step`` s from ``start``; ``rates``: (from time, cores) in order."""
    out, t, cpu = [], start, 0.0
    while t < 1.0 - 1e-9:
        out.append((round(t, 6), round(cpu, 9)))
        rate = [r for since, r in rates if t >= since - 1e-9][-1]
        cpu += rate * step
        t += step
    return out


def test_grow_delay_is_the_start_of_the_first_span_at_the_width() -> None:
    s = _samples([(-1.0, 1.0), (0.2, 2.0)])
    assert bench.reach_delay(s, 1.8, 0.02, True) == 0.2
    assert bench.reach_delay(s, 1.95, 0.1, True) == 0.2
    # 90 % of the width over 100 ms: the span from 0.19 holds 10 ms at 1 and 90 ms at 2 (1.9)
    assert bench.reach_delay(s, 1.8, 0.1, True) == 0.19
    # a span that would start before the resize never counts, even at the width
    s = _samples([(-1.0, 2.0), (0.0, 1.0), (0.3, 2.0)])
    assert bench.reach_delay(s, 1.8, 0.02, True) == 0.3


def test_a_longer_span_needs_the_rate_held_for_its_length() -> None:
    # 2 cores for 30 ms at 0.1 (a burst), then for good from 0.5
    s = _samples([(-1.0, 1.0), (0.1, 2.0), (0.13, 0.0), (0.5, 2.0)])
    assert bench.reach_delay(s, 1.8, 0.02, True) == 0.1
    assert bench.reach_delay(s, 1.95, 0.1, True) == 0.5


def test_shrink_delay_looks_for_a_rate_at_most_the_target() -> None:
    s = _samples([(-1.0, 2.0), (0.04, 1.0)])
    assert bench.reach_delay(s, 1.1, 0.02, False) == 0.04
    assert bench.reach_delay(s, 1.1, 0.02, True) == 0.0  # (rising: 2 cores >= 1.1 at once)


def test_no_span_of_the_length_or_at_the_rate_is_none() -> None:
    assert bench.reach_delay(_samples([(-1.0, 1.0)]), 1.8, 0.02, True) is None
    assert bench.reach_delay([(0.0, 0.0), (0.01, 0.02)], 1.0, 0.02, True) is None
    assert bench.reach_delay([(-0.01, 0.0)], 1.0, 0.02, True) is None
    assert bench.reach_delay([], 1.0, 0.02, True) is None
    # exactly the window long, exactly at the target: counts (>=, <=)
    assert bench.reach_delay([(0.0, 0.0), (0.5, 1.0)], 2.0, 0.5, True) == 0.0
    assert bench.reach_delay([(0.0, 0.0), (0.5, 1.0)], 2.0, 0.5, False) == 0.0


def test_median_or_none_skips_missing_figures() -> None:
    assert bench.median_or_none([None, 0.3, 0.1, None, 0.2]) == 0.2
    assert bench.median_or_none([None, None]) is None
    assert bench.median_or_none([]) is None


def test_cost_line_prints_medians() -> None:
    costs = [bench.Cost(0.004, 0.1, 4.5, 2.4, 4.0, 2.0, 0.1, 1.9),
             bench.Cost(None, None, 4.2, 2.1, 4.1, 2.1, 0.3, None),
             bench.Cost(0.012, 0.2, 4.0, 3.0, 4.3, 2.5, 0.2, 1.7)]
    assert bench.cost_line("python", True, costs) == (
        "resize python grow   1->2: delay 8 ms (20 ms spans), 150 ms (100 ms spans) to the width's"
        " 1.80 cores; 4.20 cpu-s vs 4.10 started at 2: lost +0.10 cpu-s; wall 2.40 s vs 2.10 s = x1.20 (rest 0.20, n=3)")
    assert bench.cost_line("tests", False, costs[1:2]) == (
        "resize tests  shrink 2->1: delay never (20 ms spans), never (100 ms spans) to the"
        " width's ? cores; 4.20 cpu-s vs 4.10 started at 1: lost +0.10 cpu-s; wall 2.10 s vs 2.10 s = x1.00 (rest 0.30, n=1)")


def test_steady_rate_is_the_cores_used_after_time_zero() -> None:
    assert round(bench.steady_rate(_samples([(-1.0, 2.0), (0.0, 1.5)])), 9) == 1.5
    assert bench.steady_rate([(-0.5, 0.0), (0.0, 1.0), (0.5, 1.5)]) == 1.0
    assert bench.steady_rate([(-0.5, 0.0), (0.1, 1.0)]) is None
    assert bench.steady_rate([(0.1, 0.0), (0.1, 1.0)]) is None
    assert bench.steady_rate([]) is None


def test_delay_target_is_the_width_this_machine_gave() -> None:
    assert bench.delay_target(True, 1.5) == 0.9 * 1.5
    assert bench.delay_target(True, 2.5) == 1.8
    assert bench.delay_target(True, None) == 1.8
    assert bench.delay_target(False, 1.2) == 1.1 * 1.2
    assert bench.delay_target(False, 0.8) == 1.1
    assert bench.delay_target(False, None) == 1.1
