"""The node host's peak window (`runtime.node.reports.window_peak`, issue 40, item 3): the
highest memory sample of a session's last `memory_window_s`, as the whole window's max gave it,
while a session whose figure holds (a frozen idle one) keeps one sample, not the window's 20."""

from __future__ import annotations

import asyncio
import collections
import random
from types import SimpleNamespace

from fakes import scripted_memory_use

from arl_tangram.core import events as E
from arl_tangram.runtime.node.reports import Reporters, window_peak
from arl_tangram.runtime.node.seat import Seat


def test_the_peak_is_the_windows_max_sample_for_sample() -> None:
    rng = random.Random(40)
    w: collections.deque[tuple[float, float]] = collections.deque()
    seen: list[tuple[float, float]] = []
    now = 0.0
    for _ in range(2000):
        now += rng.choice((0.5, 0.5, 0.25, 1.0, 3.0))
        top = float(rng.choice((1, 2, 2, 3, 5, 8, rng.randrange(100))))
        seen.append((now, top))
        want = max(p for t, p in seen if t >= now - 10.0)  # the former form: every sample kept
        assert window_peak(w, now, top, 10.0) == want
        assert [p for _, p in w] == sorted({p for _, p in w}, reverse=True)  # falling strictly
        assert len(w) <= 41  # (10 s / 0.25 s + 1)


def test_exact_answers_and_what_is_kept() -> None:
    w: collections.deque[tuple[float, float]] = collections.deque()
    assert window_peak(w, 0.0, 5.0, 10.0) == 5.0
    assert window_peak(w, 1.0, 3.0, 10.0) == 5.0 and list(w) == [(0.0, 5.0), (1.0, 3.0)]
    assert window_peak(w, 2.0, 3.0, 10.0) == 5.0 and list(w) == [(0.0, 5.0), (2.0, 3.0)]
    assert window_peak(w, 10.0, 1.0, 10.0) == 5.0  # 0.0 is exactly 10 s ago: still in
    assert list(w) == [(0.0, 5.0), (2.0, 3.0), (10.0, 1.0)]
    assert window_peak(w, 10.5, 1.0, 10.0) == 3.0 and list(w) == [(2.0, 3.0), (10.5, 1.0)]
    assert window_peak(w, 11.0, 4.0, 10.0) == 4.0 and list(w) == [(11.0, 4.0)]
    assert window_peak(w, 40.0, 2.0, 10.0) == 2.0 and list(w) == [(40.0, 2.0)]
    for k in range(100):  # a figure that holds: one sample, whatever the time
        assert window_peak(w, 41.0 + k / 2, 2.0, 10.0) == 2.0
        assert list(w) == [(41.0 + k / 2, 2.0)]
    assert window_peak(w, 100.0, 7.0, 0.0) == 7.0  # no window: the sample alone
    assert window_peak(w, 100.5, 6.0, 0.0) == 6.0 and list(w) == [(100.5, 6.0)]


async def test_reports_carry_each_sessions_window_peak_to_the_thousandth() -> None:
    got: list[E.MemoryReport] = []
    seat = Seat("n0", lambda e: got.append(e) if isinstance(e, E.MemoryReport) else None)
    reports = Reporters(seat)
    reports.memory_report_s, reports.memory_window_s = 0.0, 3600.0
    mib = 1 << 20
    reads = iter([({"a": (int(1.2344 * mib), int(2.71828 * mib))}, 0),
                  ({"a": (int(1.0001 * mib), int(1.5 * mib))}, 0)])

    use = scripted_memory_use(seat, reads)

    seat.cpu_manager = SimpleNamespace(memory_use=use)  # type: ignore[assignment]
    await asyncio.wait_for(reports.memory(), 1)
    assert [(dict(r.current_mb), dict(r.peak_mb)) for r in got] == [
        ({"a": 1.234}, {"a": 2.718}), ({"a": 1.0}, {"a": 2.718})]  # (the peak held: 1 h window)
