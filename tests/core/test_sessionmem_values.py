"""core/sessionmem.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
charge a report sets (a zero peak, a negative one, a change under 1 MB, a full node), the node
looked at again when a charge falls (a waiting session opens in that event), and the eviction
order and stopping point to the MB, with sessions a report leaves out counted as 0 MB."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, of

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core import sessionmem
from arl_tangram.core.resources import Resources

MB = "memory_mb"


def _open(d: Driver, sid: str, mem: float) -> list[cmd.Command]:
    return d(ev.SessionRequested(d.t, sid, demand=Resources(cpu=0, memory_mb=mem)))


def _report(d: Driver, peak: dict[str, float], current: dict[str, float] | None = None,
            other: float = 0.0, node: str = "n0") -> list[cmd.Command]:
    return d(ev.MemoryReport(d.t, node, current_mb=current if current is not None else peak,
                             peak_mb=peak, other_mb=other))


def _charge(d: Driver, sid: str) -> float:
    return d.core.st.sessions[sid].charge.get(MB)


def _closed(out: list[cmd.Command]) -> list[str]:
    return [c.session_id for c in of(out, cmd.CloseSession)]


def test_a_zero_peak_is_charged_the_floor_and_a_negative_one_changes_nothing() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)])
    _open(d, "s", 512)
    _report(d, {"s": -1.0})
    assert _charge(d, "s") == 512.0  # (no measurement: its demand stays)
    _report(d, {"s": 0.0})
    assert _charge(d, "s") == 64.0  # session_memory_floor_mb
    assert d.core.nodes["n0"].used[MB] == 64.0


def test_a_charge_moves_by_less_than_one_mb_when_that_is_the_change() -> None:
    # a 96.5 MB cap; a 60 MB peak wants 90 -> 96 (a 16 MB step): 0.5 MB below the cap
    d = Driver([cpu_node("n0", cpu=4, mem=2048)])
    _open(d, "s", 96.5)
    _report(d, {"s": 60.0})
    assert _charge(d, "s") == 96.0


def test_with_no_floor_a_one_mb_session_is_charged_nothing_when_it_uses_nothing() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_memory_floor_mb=0.0)
    _open(d, "s", 1.0)
    _report(d, {"s": 0.0})
    assert _charge(d, "s") == 0.0


def test_a_falling_charge_on_a_full_node_falls_to_its_use_and_a_growing_one_stays() -> None:
    # two 512 MB sessions fill 1 GB: s0's 100 MB peak charges it 160 (the node's free memory
    # bounds only growth); s0 then peaks at 700 MB: it grows into the 352 MB free, to its cap
    d = Driver([cpu_node("n0", cpu=4, mem=1024)], session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s0", 512)
    _open(d, "s1", 512)
    assert d.core.nodes["n0"].free[MB] == 0.0
    _report(d, {"s0": 100.0, "s1": 512.0}, current={})
    assert (_charge(d, "s0"), _charge(d, "s1")) == (160.0, 512.0)
    assert d.core.nodes["n0"].free[MB] == 352.0
    _report(d, {"s0": 700.0, "s1": 512.0}, current={})
    assert (_charge(d, "s0"), _charge(d, "s1")) == (512.0, 512.0)
    assert d.core.nodes["n0"].free[MB] == 0.0


def test_a_growing_charge_on_a_full_node_stays_where_it_is() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=1024)], session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s0", 512)
    _open(d, "s1", 512)
    _report(d, {"s0": 10.0, "s1": 512.0}, current={})  # s0: the 64 MB floor
    _open(d, "s2", 448)  # the 448 MB s0 freed
    assert d.core.nodes["n0"].free[MB] == 0.0
    _report(d, {"s0": 200.0, "s1": 512.0, "s2": 448.0}, current={})
    assert _charge(d, "s0") == 64.0 and d.core.nodes["n0"].free[MB] == 0.0


@pytest.mark.parametrize("first_changes", [True, False])
def test_a_charge_that_falls_opens_a_waiting_session_in_that_report(first_changes: bool) -> None:
    # s0, s1 (512 each) fill 1 GB: s2 (256) waits for room by charges; the report that lowers
    # one of s0, s1 to 160 (the first or the last in the report) opens it at once
    d = Driver([cpu_node("n0", cpu=4, mem=1024)], session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s0", 512)
    _open(d, "s1", 512)
    assert _open(d, "s2", 256) == [] and "s2" in d.core.sessions.pending
    peaks = {"s0": 100.0, "s1": 512.0} if first_changes else {"s0": 512.0, "s1": 100.0}
    out = _report(d, peaks, current={})
    assert [c.session_id for c in of(out, cmd.OpenSession)] == ["s2"]
    assert d.core.st.sessions["s2"].node == "n0"


def _three(mem: float = 1000, **cfg: object) -> Driver:
    d = Driver([cpu_node("n0", cpu=4, mem=mem)], session_action_demand=Resources(cpu=1, memory_mb=0),
               **cfg)
    for sid in ("a", "b", "c"):
        _open(d, sid, 0.0)
    return d


def test_eviction_goes_on_until_the_use_left_is_at_the_watermark_not_below() -> None:
    # limit 600: a (350) leaves 640, b (340) leaves 300: two evicted, counted
    d = _three(memory_high_watermark=0.6)
    assert _closed(_report(d, {"a": 350, "b": 340, "c": 300})) == ["a", "b"]
    assert d.core.memory.evictions == 2
    # 301 + 300 + 300 = 901 > 600: a leaves exactly 600: one eviction
    d = _three(memory_high_watermark=0.6)
    assert _closed(_report(d, {"a": 301, "b": 300, "c": 300})) == ["a"]
    assert d.core.memory.evictions == 1


def test_a_session_the_report_leaves_out_counts_as_using_nothing() -> None:
    # a: 900 of 1000 (the watermark), b left out: 900, not above: nobody goes
    d = _three()
    assert _closed(_report(d, {"a": 900, "c": 0})) == []
    # above it, b (left out, 0 MB) goes after c (0.5 MB), both idle, still above: both go
    d = _three()
    d.arrive(act("x", cpu=1, mem=0, session="a"))
    d.started("x", "n0")
    assert _closed(_report(d, {"a": 901, "c": 0.5})) == ["c", "b"]


def test_the_evicted_kept_are_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessionmem, "EVICTED_KEPT", 2)
    d = _three()
    assert _closed(_report(d, {"a": 990, "b": 980, "c": 970})) == ["a", "b", "c"]
    assert list(d.core.memory.evicted) == ["b", "c"]


@pytest.mark.parametrize(("mem", "evicted"), [(0.0, []), (1.0, ["s"])])
def test_a_node_with_no_memory_evicts_nobody_one_with_one_mb_does(mem: float, evicted: list[str]) -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=mem)], session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s", 0.0)
    assert d.core.st.sessions["s"].node == "n0"
    assert _closed(_report(d, {"s": 5.0})) == evicted
