"""Aging entries are pushed at the end of the event for the actions still queued (issue 24: most
start in the event they arrive in); one that started keeps its due time, and a requeue (its
node lost) puts it back: it ages when it would have with an entry pushed at every enqueue."""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import WorkHints


def _aged(d: Driver, aid: str) -> list[str]:
    return [line for line in d.core.story(aid) if "aged" in line]


def _push_every_entry(self) -> None:
    """The reference: every enqueue's entry on the heap, as if pushed at its enqueue."""
    import heapq

    for entry in self.aging_new:
        heapq.heappush(self.aging_heap, entry)
    self.aging_new.clear()


def _scenario(lost_at: float = 3.0) -> Driver:
    d = Driver([cpu_node("n0", cpu=1, mem=256), cpu_node("n1", cpu=1, mem=256)], policy="tangram",
               aging_s=10.0, aging_min_s=10.0)
    d.arrive(act("x", hints=WorkHints(expected_s=1000)))  # holds one node all along
    d.arrive(act("a", hints=WorkHints(expected_s=1)))  # starts in its own event
    lost = starts(d.log)["a"].node
    steps = [(t, "tick") for t in (9.999, 10.0, 11.0, 13.0, 14.5)]
    steps += [(lost_at, "lost"), (lost_at + 2.0, "b")]
    for t, what in sorted(steps):
        if what == "lost":  # a runs again (idempotent), behind x's node
            d.at(t)(ev.NodeLost(t, lost))
        elif what == "b":  # shorter than a: ranked before it
            d.at(t).arrive(act("b", hints=WorkHints(expected_s=0.01)))
        else:
            d.at(t).tick()
    d.at(30.0).finish("x")
    return d


def test_an_action_that_started_and_was_requeued_ages_as_with_an_entry_per_enqueue(monkeypatch) -> None:
    d = _scenario()
    assert any(line.startswith("t=10 aged") for line in _aged(d, "a"))
    assert not any(line.startswith("t=9.999") for line in _aged(d, "a"))
    assert not any(line.startswith(("t=10 ", "t=13 ")) for line in _aged(d, "b"))  # its time: 15
    assert list(starts(d.log))[-1] == "a"  # aged: before b, the shorter, at x's end
    late = _scenario(lost_at=12.0)  # requeued past its due time: queued aged (no aging step)
    assert not _aged(late, "a") and list(starts(late.log))[-1] == "a"
    from arl_tangram.core.queues import Queues

    monkeypatch.setattr(Queues, "park_aging", _push_every_entry)
    for lost_at, got in ((3.0, d), (12.0, late)):
        ref = _scenario(lost_at)
        assert [repr(c) for c in got.log] == [repr(c) for c in ref.log]
        for aid in ("x", "a", "b"):
            assert got.core.story(aid) == ref.core.story(aid)


def test_a_queued_action_ages_on_time_and_a_started_one_leaves_nothing_on_the_heap() -> None:
    d = Driver([cpu_node("n0", cpu=1, mem=256)], policy="tangram", aging_s=10.0, aging_min_s=10.0)
    d.arrive(act("x", hints=WorkHints(expected_s=1000)))
    assert not d.core.queues.aging_heap and not d.core.queues.aging_new
    d.arrive(act("a", hints=WorkHints(expected_s=1)))  # waits: its entry is on the heap
    assert [e[2] for e in d.core.queues.aging_heap] == ["a"]
    d.at(10.0).tick()
    assert any(line.startswith("t=10 aged") for line in _aged(d, "a"))
    assert not d.core.queues.aging_heap
