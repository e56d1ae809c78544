"""Session memory's values (issue 43): who is busy, and where exactly the watermark stands.

A session whose action is *running* (not only starting) is never evicted, and a node evicts only
once its measured use passes exactly ``memory_high_watermark`` x its memory (0.9 by default).
"""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, of

from arl_tangram.core import CoreConfig
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.resources import Resources


def _driver(**cfg: object) -> Driver:
    d = Driver([cpu_node("n0", cpu=4, mem=1000)],
               session_action_demand=Resources(cpu=1, memory_mb=0), **cfg)
    for sid in ("a", "b"):
        d(ev.SessionRequested(d.t, sid, demand=Resources(cpu=0, memory_mb=400)))
    return d


def _report(d: Driver, current: dict[str, float], other: float = 0.0) -> list[str]:
    out = d(ev.MemoryReport(d.t, "n0", current_mb=current, peak_mb=current, other_mb=other))
    return [c.session_id for c in of(out, cmd.CloseSession)]


def test_a_session_whose_action_is_running_is_never_evicted() -> None:
    d = _driver()
    d.arrive(act("x", cpu=1, mem=0, session="a"))
    d.started("x", "n0")
    assert d.status("x") is Status.RUNNING
    # 990 > 900 MB: a is the largest, but its action runs; only b, idle, may go
    assert _report(d, {"a": 890, "b": 100}) == ["b"]
    assert "a" in d.core.st.sessions
    # with a alone over the watermark and running, nobody is evicted
    assert _report(d, {"a": 950}) == []
    assert "a" in d.core.st.sessions and d.core.memory.evictions == 1


def test_the_default_high_watermark_is_nine_tenths_of_the_node() -> None:
    assert CoreConfig().memory_high_watermark == 0.9
    d = _driver()
    assert _report(d, {"a": 500, "b": 400}) == []  # exactly 900 of 1000: not above it
    assert _report(d, {"a": 500, "b": 401}) == ["a"]  # 901: the largest idle one goes


def test_the_watermark_configured_is_the_one_applied() -> None:
    d = _driver(memory_high_watermark=0.6)
    assert _report(d, {"a": 300, "b": 300}) == []  # 600 of 1000
    # 601: a (the larger) leaves 300 <= 600: one eviction, not two
    assert _report(d, {"a": 301, "b": 300}) == ["a"]


def test_eviction_stops_once_the_use_left_is_under_the_watermark() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=1000)],
               session_action_demand=Resources(cpu=1, memory_mb=0))
    for sid in ("a", "b", "c"):
        d(ev.SessionRequested(d.t, sid, demand=Resources(cpu=0, memory_mb=300)))
    # 1000 used, 100 other: a (500) goes -> 500 <= 900; b and c stay
    assert _report(d, {"a": 500, "b": 250, "c": 150}, other=100) == ["a"]
    # 1000 again, a tie of 450: the first by id goes, leaving 550
    assert _report(d, {"b": 450, "c": 450}, other=100) == ["b"]
