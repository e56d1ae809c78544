"""Which grown elastic action lends cores first, and which grows first (issue 43), exact widths.

Cores lent to a rigid action come from the grown elastic action with the most expected work
left (the shortest keep theirs: SRPT); cores given back go to the one with the least expected
work left first (heSRPT), each only while a core speeds it up (a flat speedup curve gains
nothing from a core and stays narrow).
"""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, elastic, of, starts

from arl_tangram.core import commands as cmd
from arl_tangram.core.actions import WorkHints


def _resizes(out: list[cmd.Command]) -> list[tuple[str, float]]:
    return [(r.action_id, r.allotment["cpu"]) for r in of(out, cmd.ResizeAction)]


def _widths(d: Driver, *aids: str) -> dict[str, float]:
    out = {}
    for a in aids:
        allot = d.core.st.actions[a].allotment
        assert allot is not None
        out[a] = allot["cpu"]
    return out


def _two_grown() -> Driver:
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram")
    out = d.at(0.0).arrive(elastic("long", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    assert starts(out)["long"].allotment["cpu"] == 4
    out = d.at(0.01).arrive(elastic("short", 1, 4, p=0.9, hints=WorkHints(expected_s=1.0)))
    assert starts(out)["short"].allotment["cpu"] == 4
    return d


def test_the_action_with_the_most_work_left_lends_first_and_the_shortest_grows_first() -> None:
    d = _two_grown()
    out = d.at(0.02).arrive(act("A", cpu=2, hints=WorkHints(expected_s=0.1)))
    assert "A" in starts(out)
    assert _resizes(out) == [("long", 2)]  # the long one lends both cores
    out = d.at(0.03).arrive(act("B", cpu=2, hints=WorkHints(expected_s=0.1)))
    assert "B" in starts(out)
    # long down to its minimum (1), then short lends the one core still lacking
    assert _resizes(out) == [("long", 1), ("short", 3)]
    out = d.at(0.1).finish("A", run_s=0.08)
    # two cores back: the shortest first back to its maximum, then the long one
    assert _resizes(out) == [("short", 4), ("long", 2)]
    assert _widths(d, "long", "short") == {"long": 2, "short": 4}
    out = d.at(0.12).finish("B", run_s=0.09)
    assert _resizes(out) == [("long", 4)]


def test_a_core_that_speeds_nothing_up_is_not_given() -> None:
    # p = 0: a second core gains nothing; p = 0.9: it gains, and the lent cores come back
    for p, back in ((0.0, 1), (0.9, 4)):
        d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
        d.at(0.0).arrive(act("hold", cpu=3, hints=WorkHints(expected_s=1.0)))
        out = d.at(0.01).arrive(elastic("e", 1, 4, p=p, hints=WorkHints(expected_s=10.0)))
        assert starts(out)["e"].allotment["cpu"] == 1
        d.at(0.5).finish("hold", run_s=0.49)
        assert _widths(d, "e") == {"e": back}, p
