"""`tangram calibrate`'s resize delay (issue 39, item 2): the span rule on synthetic samples
(exact), the measurement through a stand-in manager whose cgroup burns one core before the
grow and two after, what it writes and what the calibration section accepts."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.replay import calibrate as cal


def _at(rates: list[tuple[float, float]], step: float = 0.05,
        end: float = 1.0) -> list[tuple[float, float]]:
    """(time, cpu) every ``step`` (a power of two's fraction: exact floats) from 0; ``rates``:
    (from time, cores)."""
    out, cpu, n = [], 0.0, round(end / step)
    for i in range(n + 1):
        t = i * step
        out.append((t, cpu))
        cpu += [r for since, r in rates if t >= since][-1] * step
    return out


def test_span_start_is_the_first_span_at_the_rate() -> None:
    s = _at([(0.0, 1.0), (0.25, 2.0)], step=0.125 / 2)
    assert cal.span_start(s, 2.0, 0.125) == 0.25
    assert cal.span_start(s, 1.5, 0.125) == 0.1875  # half of its span at one core, half at two
    assert cal.span_start(s, 2.5, 0.125) is None
    assert cal.span_start(s, 1.0, 0.125, rising=False) == 0.0
    assert cal.span_start(s, 0.5, 0.125, rising=False) is None
    assert cal.span_start([(-0.5, 0.0), (0.0, 1.0), (0.5, 1.5)], 1.0, 0.5) == 0.0
    assert cal.span_start([(-0.5, 0.0), (0.0, 1.0), (0.5, 1.4)], 1.0, 0.5) is None
    assert cal.span_start([(0.0, 0.0), (0.25, 0.5)], 1.0, 0.5) is None  # shorter than the span
    assert cal.span_start([], 1.0, 0.5) is None


def test_rate_from_and_resize_delay() -> None:
    s = _at([(0.0, 1.0), (0.25, 2.0)], step=0.0625)
    assert cal.rate_from(s, 0.5) == 2.0
    assert cal.rate_from(s, 0.0) == 1.75
    assert cal.rate_from(s, 1.0) is None and cal.rate_from([(0.5, 0.0), (0.5, 1.0)], 0) is None
    # grown at 0.25: 90 % of the 2 cores held from 0.3 s is 1.8, first met by the 100 ms span
    # from the sample at 0.2375 (12.5 ms of it at one core: 1.875; from 0.225, 1.75)
    assert cal.RESIZE_SPAN_S == 0.1
    assert cal.resize_delay(_at([(0.0, 1.0), (0.25, 2.0)], step=0.0125)) == 19 * 0.0125
    # the rest of the machine left 1.5 cores: 90 % of that (1.35), from 0.225 (1.375)
    assert cal.resize_delay(_at([(0.0, 1.0), (0.25, 1.5)], step=0.0125)) == 18 * 0.0125
    assert cal.resize_delay(_at([(0.0, 1.0), (0.25, 0.75)])) is None  # never above one core
    assert cal.resize_delay([]) is None


class _Slot:
    def __init__(self, gone: bool = False) -> None:
        self.t0, self.grown_at, self.gone = time.monotonic(), None, gone

    def cpu_seconds(self) -> float:
        now = time.monotonic()
        if self.gone and self.grown_at is not None:
            raise OSError(2, "its cgroup went with it")
        if self.grown_at is None:
            return now - self.t0
        return (self.grown_at - self.t0) + 2 * (now - self.grown_at)


class _Mgr:
    """Runs an action for ``wall`` seconds; its slot burns one core, two once resized."""

    def __init__(self, wall: float = 0.7, outcome: str = "applied", status: str = "Success",
                 registers: bool = True, gone: bool = False) -> None:
        self._running: dict[str, Any] = {}
        self.wall, self.outcome, self.status, self.registers = wall, outcome, status, registers
        self.gone = gone
        self.resized: list[tuple[str, float]] = []

    async def run(self, a: Any, allotment: Any) -> Any:
        assert a.elasticity.min == 1 and a.elasticity.max == 2 and allotment.get("cpu") == 1
        assert "_units, _p, _w = 8000, 1.0, 2" in a.payload["code"]  # 1.6 s at 5000 units/s
        assert a.payload["language"] == "python"
        if self.registers:
            self._running[a.id] = SimpleNamespace(slot=_Slot(self.gone))
        await asyncio.sleep(self.wall)
        self._running.pop(a.id, None)
        return SimpleNamespace(status=self.status, message="boom")

    async def resize(self, aid: str, allotment: Any) -> str:
        self.resized.append((aid, allotment.get("cpu")))
        sb = self._running.get(aid)
        if sb is not None and self.outcome == "applied":
            sb.slot.grown_at = time.monotonic()
        return self.outcome


def _measure(mgr: _Mgr) -> tuple[dict[str, float], list[str]]:
    said: list[str] = []
    return asyncio.run(cal._resize_delay(mgr, 5000.0, said.append)), said


def test_resize_delay_measured_through_the_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("arl_tangram.replay.driver.machine_cores", lambda: 2)
    mgr = _Mgr()
    got, said = _measure(mgr)
    assert set(got) == {"resize_delay_s"} and 0 <= got["resize_delay_s"] < 0.05, got
    assert [c for _, c in mgr.resized] == [2, 2]  # two grows, each to two cores
    assert said[0].startswith("resize: a running elastic action grown 1 -> 2 cores used them after ")


@pytest.mark.parametrize("mgr", [_Mgr(outcome="dropped"), _Mgr(registers=False), _Mgr(gone=True)])
def test_resize_delay_left_out_when_not_seen(monkeypatch: pytest.MonkeyPatch, mgr: _Mgr) -> None:
    monkeypatch.setattr("arl_tangram.replay.driver.machine_cores", lambda: 2)
    got, said = _measure(mgr)
    assert got == {} and said == ["resize: the grow's delay not measured (the rest of the machine "
                                  "left two cores no time, or the sandbox was not seen)"]


def test_resize_delay_failed_program_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("arl_tangram.replay.driver.machine_cores", lambda: 2)
    with pytest.raises(RuntimeError, match="calibration program failed: boom"):
        _measure(_Mgr(status="Failed"))


def test_resize_delay_not_on_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("arl_tangram.replay.driver.machine_cores", lambda: 1)
    mgr = _Mgr()
    assert _measure(mgr) == ({}, []) and mgr.resized == []


def test_calibrate_writes_resize_delay_s_and_the_section_accepts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    figures = {"units_per_s": 5000.0, "cold_start_s": 0.1, "warm_start_s": 0.001,
               "session_open_s": 0.05, "quarter_core_slowdown": 4.0, "resize_delay_s": 0.012345}

    async def cpu(say: Any, repeats: int) -> dict[str, float]:
        return dict(figures)

    async def engine(say: Any, repeats: int) -> dict[str, float]:
        return {}

    monkeypatch.setattr(cal, "_cpu_figures", cpu)
    monkeypatch.setattr(cal, "_engine_figures", engine)
    spec = cal.calibrate(with_models=False, say=lambda s: None)
    assert spec["calibration"]["resize_delay_s"] == 0.0123
    assert cal.parse_calibration({"calibration": {"resize_delay_s": 0.0123}}) == {
        "resize_delay_s": 0.0123}
    del figures["resize_delay_s"]
    assert "resize_delay_s" not in cal.calibrate(with_models=False, say=lambda s: None)[
        "calibration"]
