"""Session memory that follows use (issue 26 item 4): the core's part, events in, commands out.

A node reports each open session's measured memory (`MemoryReport`); the core charges a session
max(recent peak x headroom, floor) instead of its demand, admits sessions by those charges
within an overcommit bound of the caps, and evicts idle sessions, largest first, when the node's
measured use passes the high watermark.
"""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, of, starts

from arl_tangram.core import CoreConfig
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.resources import Resources

MB = "memory_mb"


def _open(d: Driver, sid: str, mem: float = 512, node: str | None = None) -> list[cmd.Command]:
    return d(ev.SessionRequested(d.t, sid, demand=Resources(cpu=0, memory_mb=mem), node=node))


def _report(d: Driver, node: str, peak: dict[str, float], current: dict[str, float] | None = None,
            other: float = 0.0) -> list[cmd.Command]:
    return d(ev.MemoryReport(d.t, node, current_mb=current if current is not None else peak,
                             peak_mb=peak, other_mb=other))


def _opened(out: list[cmd.Command]) -> list[str]:
    return [c.session_id for c in of(out, cmd.OpenSession)]


def test_before_a_report_a_session_is_charged_its_demand_after_it_its_use() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_memory_headroom=1.5,
               session_memory_floor_mb=64)
    _open(d, "s", 512)
    node = d.core.nodes["n0"]
    assert node.used[MB] == 512  # no report yet: its demand
    _report(d, "n0", {"s": 100})
    assert node.used[MB] == 160  # 100 x 1.5 = 150, up to a 16 MB step
    _report(d, "n0", {"s": 10})
    assert node.used[MB] == 64  # the floor
    _report(d, "n0", {"s": 500})
    assert node.used[MB] == 512  # never above its demand (its cgroup's cap)


def test_sessions_whose_caps_exceed_the_node_all_open_once_they_report_use() -> None:
    # 2 GB node, sessions of 512 MB caps; room is kept for one 512 MB session action
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_memory_overcommit=3.0,
               session_action_demand=Resources(cpu=1, memory_mb=512))
    opened = []
    for i in range(14):
        opened += _opened(_open(d, f"s{i}", 512))
        _report(d, "n0", {s: 30 for s in opened})  # each uses 30 MB: charged the 64 MB floor
    # by caps, three sessions (3 x 512 + 512 room <= 2048); by use, as many as the overcommit
    # bound allows: 3 x 2048 / 512 = 12 (12 x 64 + 512 room <= 2048 by charges)
    assert len(opened) == 12
    assert set(d.core.sessions.pending) == {"s12", "s13"}
    assert sum(d.core.sessions.caps.values()) == 12 * 512 > 2048
    d.arrive(act("x", cpu=1, mem=512, session="s0"))
    assert d.status("x") is Status.STARTING  # the room for a session action is still there


def test_the_overcommit_bound_holds_however_little_they_use() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_memory_overcommit=2.0)
    opened = []
    for i in range(10):
        opened += _opened(_open(d, f"s{i}", 512))
        _report(d, "n0", {s: 1 for s in opened})
    assert len(opened) == 8  # 8 x 512 = 2 x 2048
    assert set(d.core.sessions.pending) == {"s8", "s9"}
    d(ev.SessionClosed(d.t, "s0"))  # a cap given back: one that waited opens
    assert d.core.st.sessions["s8"].node == "n0"


def test_overcommit_one_admits_by_caps_only() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_memory_overcommit=1.0,
               session_action_demand=Resources(cpu=1, memory_mb=0))
    opened = []
    for i in range(6):
        opened += _opened(_open(d, f"s{i}", 512))
        _report(d, "n0", {s: 1 for s in opened})
    assert len(opened) == 4


def test_a_growing_charge_takes_only_what_is_free() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048)], session_action_demand=Resources(cpu=1))
    for i in range(3):
        _open(d, f"s{i}", 1024)
        _report(d, "n0", {f"s{j}": 1 for j in range(i + 1)})
    assert len(d.core.nodes["n0"].sessions) == 3
    _report(d, "n0", {"s0": 1000, "s1": 1000, "s2": 1000})  # (validate: never past capacity)
    node = d.core.nodes["n0"]
    assert node.used[MB] <= 2048 + 1e-6
    assert node.free[MB] >= -1e-6


def test_a_short_node_evicts_the_largest_idle_session_never_a_busy_one() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=1000)], memory_high_watermark=0.9,
               session_action_demand=Resources(cpu=1, memory_mb=0))
    for sid in ("busy", "big", "small"):
        _open(d, sid, 400)
        _report(d, "n0", {s: 10 for s in d.core.nodes["n0"].sessions})
    d.arrive(act("run", cpu=1, mem=0, session="busy"))
    assert d.status("run") is Status.STARTING
    # 950 > 900 MB used: the busy session is the largest, but it runs an action
    out = _report(d, "n0", {"busy": 500, "big": 300, "small": 150})
    (cl,) = of(out, cmd.CloseSession)
    assert cl.session_id == "big" and isinstance(cl, cmd.EvictSession)
    assert cl.reason == "session big was evicted: node n0 ran short of memory (used 950 of 1000 MB)"
    assert "big" not in d.core.st.sessions and "small" in d.core.st.sessions
    assert d.core.memory.evictions == 1
    # its next action is told why
    d.arrive(act("next", cpu=1, mem=0, session="big"))
    assert d.status("next") is Status.REJECTED
    assert d.result("next").reason == cl.reason
    # under the watermark: nothing more
    assert not of(_report(d, "n0", {"busy": 500, "small": 150}), cmd.CloseSession)


def test_with_only_busy_sessions_none_is_evicted() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=1000)],
               session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "a", 600)
    d.arrive(act("x", cpu=1, mem=0, session="a"))
    assert not of(_report(d, "n0", {"a": 980}), cmd.CloseSession)
    assert "a" in d.core.st.sessions


def test_the_other_sandboxes_count_toward_the_watermark_and_queued_actions_fail() -> None:
    d = Driver([cpu_node("n0", cpu=1, mem=1000)], memory_high_watermark=0.5,
               session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "a", 400)
    _open(d, "b", 400)
    d.arrive(act("hog", cpu=1, mem=0))  # takes the one core
    d.arrive(act("q", cpu=1, mem=0, session="a"))  # queued behind it
    assert d.status("q") is Status.QUEUED
    out = _report(d, "n0", {"a": 200, "b": 100}, other=250)  # 550 > 500
    (cl,) = of(out, cmd.CloseSession)
    assert cl.session_id == "b"  # idle with nothing queued goes first, though a is larger
    out = _report(d, "n0", {"a": 300}, other=250)
    (cl,) = of(out, cmd.CloseSession)
    assert cl.session_id == "a"
    assert d.status("q") is Status.FAILED and "was evicted" in d.result("q").reason


def test_an_evicted_id_opened_again_is_a_new_session() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=1000)], memory_high_watermark=0.5,
               session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s", 400)
    assert of(_report(d, "n0", {"s": 600}), cmd.CloseSession)
    _open(d, "s", 400)
    out = d.arrive(act("a", cpu=1, mem=0, session="s"))
    assert "a" in starts(out)


def test_reports_for_unknown_nodes_and_sessions_are_ignored() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=1000)],
               session_action_demand=Resources(cpu=1, memory_mb=0))
    _open(d, "s", 400)
    assert _report(d, "nX", {"s": 1}) == []
    _report(d, "n0", {"gone": 900, "s": 10}, current={"s": 10})
    assert d.core.st.sessions["s"].charge[MB] == 64


def test_without_reports_decisions_are_those_of_charging_demands() -> None:
    # the same events with and without the new bounds at their loosest give the same commands
    def run(**cfg: object) -> list[str]:
        d = Driver([cpu_node("n0", cpu=2, mem=2048), cpu_node("n1", cpu=2, mem=2048)], **cfg)
        for i in range(8):
            _open(d, f"s{i}", 700)
            d.arrive(act(f"a{i}", cpu=1, mem=300, session=f"s{i}"))
        return [repr(c) for c in d.log]

    assert run() == run(session_memory_overcommit=1.0, memory_high_watermark=1.0)


@pytest.mark.parametrize("field,value", [("session_memory_headroom", 0.5),
                                         ("session_memory_floor_mb", -1.0),
                                         ("session_memory_overcommit", 0.9),
                                         ("memory_high_watermark", 0.0),
                                         ("memory_high_watermark", 1.5)])
def test_config_bounds(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        CoreConfig(**{field: value})
