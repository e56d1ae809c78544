"""The width an elastic action starts at (issue 22): heSRPT rounded to whole lanes.

Elastic actions are served shortest first at full width; they share a node (a narrow start, or
a reclaim of a running one's cores) only where the speedup curve and the number waiting make
sharing win for the mean, or once the head has waited longer than its expected run at max.
Rigid actions still take a lent core at once (Inelastic-First).
"""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, elastic, of, starts

from arl_tangram.core import commands as cmd
from arl_tangram.core.actions import WorkHints


def _resizes(out) -> list[tuple[str, float]]:
    return [(r.action_id, r.allotment["cpu"]) for r in of(out, cmd.ResizeAction)]


def test_two_tests_run_one_after_the_other_at_full_width_while_a_tool_takes_a_lent_core() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    out = d.at(0.0).arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert starts(out)["a"].allotment["cpu"] == 2  # alone: its full width at once
    out = d.at(0.05).arrive(act("tool", hints=WorkHints(expected_s=0.1)))
    assert "tool" in starts(out) and _resizes(out) == [("a", 1)]  # rigid first: a lends a core
    out = d.at(0.1).arrive(elastic("b", 1, 2, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert "b" not in starts(out) and not _resizes(out)  # b waits: sharing does not pay
    out = d.at(0.2).finish("tool", run_s=0.15)
    assert "b" not in starts(out) and _resizes(out) == [("a", 2)]  # the lent core comes back
    out = d.at(0.5).finish("a", run_s=0.5)
    assert starts(out)["b"].allotment["cpu"] == 2  # then b, at full width


def test_with_many_equal_tests_waiting_they_share_the_node() -> None:
    """On 2 cores with s(2) = 1.82 (p = 0.9), n equal jobs: one after another at 2 cores wins
    while s(2) > 2(n+1)/(n+2), i.e. for n <= 9; with 12 waiting, two at a time at one core."""
    d = Driver([cpu_node("n0", cpu=2, mem=65536)], policy="tangram")
    d.arrive(act("hold", cpu=2, hints=WorkHints(expected_s=1.0)))
    d.arrive(*[elastic(f"t{i}", 1, 2, p=0.9, hints=WorkHints(expected_s=1.0)) for i in range(12)])
    out = d.at(0.1).finish("hold", run_s=0.1)
    assert sorted(s.allotment["cpu"] for s in starts(out).values()) == [1, 1]


def test_with_few_waiting_they_do_not_share() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=65536)], policy="tangram")
    d.arrive(act("hold", cpu=2, hints=WorkHints(expected_s=1.0)))
    d.arrive(*[elastic(f"t{i}", 1, 2, p=0.9, hints=WorkHints(expected_s=1.0)) for i in range(4)])
    out = d.at(0.1).finish("hold", run_s=0.1)
    assert [s.allotment["cpu"] for s in starts(out).values()] == [2]


def test_a_flat_curve_shares_where_a_steep_one_waits() -> None:
    """Two equal tests on 4 cores: p = 0.9 (s(4) = 3.08, s(2) = 1.82) runs them one after the
    other; p = 0.5 (s(4) = 1.6, s(2) = 1.33) runs them side by side at 2 cores."""
    for p, widths in ((0.9, [4]), (0.5, [2, 2])):
        d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
        d.arrive(act("hold", cpu=4, hints=WorkHints(expected_s=1.0)))
        d.arrive(elastic("x", 1, 4, p=p, hints=WorkHints(expected_s=1.0)),
                 elastic("y", 1, 4, p=p, hints=WorkHints(expected_s=1.0)))
        out = d.at(0.1).finish("hold", run_s=0.1)
        assert sorted(s.allotment["cpu"] for s in starts(out).values()) == widths, p


def test_a_much_shorter_newcomer_takes_cores_from_a_long_runner() -> None:
    """SRPT: a test expected to take a tenth of what a running one has left shares the node
    (the long one shrinks), where an equal one waits."""
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram")
    d.arrive(elastic("long", 1, 8, p=0.9, hints=WorkHints(expected_s=100.0)))
    out = d.at(0.1).arrive(elastic("same", 1, 8, p=0.9, hints=WorkHints(expected_s=100.0)))
    assert "same" not in starts(out) and not _resizes(out)
    out = d.at(0.2).arrive(elastic("short", 1, 8, p=0.9, hints=WorkHints(expected_s=5.0)))
    s = starts(out)
    assert "short" in s and 0 < s["short"].allotment["cpu"] < 8
    assert _resizes(out) == [("long", 8 - s["short"].allotment["cpu"])]


def test_a_head_that_waited_its_run_at_max_starts_narrow() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=10.0)))
    out = d.at(0.1).arrive(elastic("b", 1, 2, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert "b" in starts(out) or _resizes(out) == []  # (b is shorter: it may share at once)
    d2 = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d2.arrive(elastic("a", 1, 2, p=0.9, hints=WorkHints(expected_s=10.0)))
    out = d2.at(0.1).arrive(elastic("b", 1, 2, p=0.9, hints=WorkHints(expected_s=20.0)))
    assert "b" not in starts(out)  # longer than what a has left: it waits
    # b's expected run at max is 20 / 1.82 = 11 s; any event after that starts it narrow
    out = d2.at(11.5).arrive(act("x", cpu=0, mem=1))
    assert starts(out)["b"].allotment["cpu"] == 1 and _resizes(out) == [("a", 1)]


def test_spare_goes_to_the_least_work_left_first() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("hold", cpu=2, hints=WorkHints(expected_s=100)))
    d.arrive(elastic("big", 1, 4, p=0.9, hints=WorkHints(expected_s=50)))  # 2 free: big at 2
    d.arrive(act("hold2", cpu=1, hints=WorkHints(expected_s=0.01)))  # takes a lent core
    d.at(0.1).arrive(elastic("small", 1, 4, p=0.9, hints=WorkHints(expected_s=1)))
    out = d.at(0.2).finish("hold", run_s=0.2)  # two cores free up
    allot = {s.action_id: s.allotment["cpu"] for s in of(d.log, cmd.ResizeAction)}
    allot.update({a: s.allotment["cpu"] for a, s in starts(d.log).items()})
    assert allot["small"] >= allot["big"], out
