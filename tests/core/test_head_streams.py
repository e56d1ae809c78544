"""A node's waiting session heads, in the pass's order (`queues.HeadStream`, issue 40).

A pass over a crowded node built a heap of every waiting head there (`Queues.head` for each)
to start one or none: at 3,200 sessions a node the core spent 2.3 ms an event. Each node now
keeps its waiting sessions' heads in a heap of their queue entries, pushed where a head may
change (an arrival, an aged or removed action, a start, an open, an unpark), and the pass takes
them off one at a time in order (`SchedulingPass._stream_next`), stopping where every head left
would fail (`scheduling._ShortNodes`, with the stream's bounds). These tests pin what a stream
holds, which entries are live, its rebuild, and that a pass's work does not grow with the heads
waiting on the node. `Core.validate` checks after every event of every test that each waiting,
unparked session's head is in its node's stream; the passes decide as before (golden streams,
`test_pass_ends_short.py`'s flood, `test_scheduling_values.py`'s general pass).
"""

from __future__ import annotations

import heapq

import pytest
from core_helpers import Driver, act, cpu_node, elastic, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import WorkHints
from arl_tangram.core.queues import AGED, Queues
from arl_tangram.core.resources import Resources
from arl_tangram.core.scheduling import SchedulingPass

LONG = WorkHints(expected_s=100)


def _full(n: int, cpu: float = 2) -> Driver:
    """One node of ``cpu`` cores, taken by a0 (session s0); sessions s1..sn, each with one
    1-core action waiting (w1..wn)."""
    d = Driver([cpu_node("n0", cpu=cpu, mem=65536)], policy="tangram", session_ttl_s=1e6)
    for i in range(n + 1):
        d(ev.SessionRequested(0.001 * i, f"s{i}", Resources(memory_mb=64)))
    assert "a0" in starts(d.at(1.0).arrive(act("a0", cpu=cpu, session="s0", hints=LONG)))
    assert starts(d.at(1.1).arrive(*(act(f"w{i}", cpu=1, session=f"s{i}", hints=LONG)
                                     for i in range(1, n + 1)))) == {}
    return d


def _entry(d: Driver, sid: str) -> tuple[int, int, int, str]:
    got = d.core.queues.head(("sess", sid))
    assert got is not None
    return (*got[1][:3], sid)


def test_a_stream_holds_each_waiting_head_with_its_bounds() -> None:
    d = _full(3)
    stream = d.core.queues.streams["n0"]
    assert sorted(stream.heap) == sorted(_entry(d, f"s{i}") for i in (1, 2, 3))
    assert [e[3] for e in sorted(stream.heap)] == ["s1", "s2", "s3"]  # (one rank: arrival order)
    assert (stream.need, stream.elastic, stream.kept) == (1.0, False, 0)
    d.at(1.2).arrive(elastic("e4", 0.5, 4, 0.9, session="s1", hints=WorkHints(expected_s=0.01)))
    assert d.core.queues.head(("sess", "s1"))[0].spec.id == "e4"  # (less work: s1's head now)
    assert (stream.need, stream.elastic) == (0.5, True)  # its minimum, elastic
    assert _entry(d, "s1") in stream.heap


def test_only_live_entries_stand_for_a_head() -> None:
    d = _full(3)
    q: Queues = d.core.queues
    old = _entry(d, "s1")
    assert q.stream_head("n0", old) is d.core.st.actions["w1"]
    assert q.stream_head("n1", old) is None  # (another node's name)
    d.at(1.2).arrive(act("b1", cpu=1, session="s1", hints=WorkHints(expected_s=0.01)))
    assert q.stream_head("n0", old) is None  # s1's head is b1 now
    assert q.stream_head("n0", _entry(d, "s1")) is d.core.st.actions["b1"]
    d.core.st.parked["s2"] = ((), 0)  # (behind the core's back: parked)
    assert q.stream_head("n0", _entry(d, "s2")) is None
    del d.core.st.parked["s2"]
    e3 = _entry(d, "s3")
    d.at(1.3)(ev.SessionClosed(1.3, "s3"))
    assert q.stream_head("n0", e3) is None


def test_a_stream_is_rebuilt_from_its_live_entries_past_twice_its_last_size() -> None:
    d = _full(3)
    q = d.core.queues
    stream = q.streams["n0"]
    live = sorted(_entry(d, f"s{i}") for i in (1, 2, 3))
    for _ in range(29):  # copies: 3 + 29 = 32 entries, not past 2 * 0 + 32
        q.to_stream("s1")
    assert len(stream.heap) == 32 and stream.kept == 0
    q.to_stream("s2")
    assert sorted(stream.heap) == live and stream.kept == 3  # once each,
    h = list(stream.heap)
    assert [heapq.heappop(h) for _ in range(3)] == live  # a heap of them, in order
    for _ in range(35):
        q.to_stream("s3")
    assert len(stream.heap) == 38 and stream.kept == 3  # (not past 2 * 3 + 32)
    d.at(1.2).arrive(act("b1", cpu=1, session="s1", hints=WorkHints(expected_s=0.01)))
    assert sorted(stream.heap) == sorted([_entry(d, "s1"), *live[1:]]) and stream.kept == 3
    assert (stream.need, stream.elastic) == (1.0, False)
    d.at(1.3).arrive(elastic("e2", 0.5, 4, 0.9, session="s2", hints=WorkHints(expected_s=0.01)))
    assert d.core.st.actions["e2"].node is None  # (n0 full: it waits, s2's head)
    stream.need, stream.elastic = 9.0, False  # (behind the core's back: the rebuild finds them)
    for _ in range(40):
        q.to_stream("s3")  # the 35th is past 2 * 3 + 32: rebuilt
    assert stream.kept == 3 and len(stream.heap) == 3 + 5
    assert (stream.need, stream.elastic) == (0.5, True)  # e2's minimum


def test_a_parked_session_leaves_its_stream_and_comes_back_with_its_queue() -> None:
    """s1's head needs more memory than the node has free: the pass over the node takes it off
    the stream and parks it; an arrival on s1 unparks it, its head back on the stream."""
    d = Driver([cpu_node("n0", cpu=4, mem=4096)], policy="tangram", session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "s1", Resources(memory_mb=64)))
    d.at(0.1).arrive(act("hog", cpu=1, mem=3000))
    d.at(0.2).arrive(act("q", cpu=1, mem=2048, session="s1"))
    d.at(0.3).arrive(act("p", cpu=1, mem=16))
    d.at(0.4).finish("p")  # a pass over n0: q is short of memory there
    stream = d.core.queues.streams["n0"]
    assert "s1" in d.core.st.parked
    assert [e[3] for e in stream.heap] == []  # (taken off by the pass, not put back)
    d.core.queues.to_stream("s1")
    assert stream.heap == []  # (parked: not pushed)
    # a new head of s1 (less work: it goes first), short of memory too: tried, unparked
    d.at(0.5).arrive(act("q2", cpu=1, mem=4000, session="s1", hints=WorkHints(expected_s=0.01)))
    assert "s1" not in d.core.st.parked
    assert stream.heap == [_entry(d, "s1")] and _entry(d, "s1")[1] == d.core.st.actions["q2"].seq
    d.at(1.0).finish("hog")  # the memory back: q2 (s1's head) starts from the stream
    assert d.core.st.actions["q2"].node == "n0" and d.core.st.actions["q"].node is None


def test_an_aged_head_goes_on_the_stream_in_its_new_place() -> None:
    d = _full(2)
    d.at(1e4).tick()  # (past their `aging_after`)
    stream = d.core.queues.streams["n0"]
    for sid in ("s1", "s2"):
        e = _entry(d, sid)
        assert e[0] == AGED and e in stream.heap


@pytest.mark.pure_core
@pytest.mark.parametrize("n", [20, 160])
def test_an_end_on_a_full_node_looks_at_as_many_heads_whatever_waits_there(
        n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """b (1 core) ends on a full node where ``n`` sessions' 1-core heads wait: w1 starts on its
    core; w2 is taken off the stream, and the pass ends there (n0 is full again). Entries
    looked at: w1 and w2, for 20 heads waiting as for 160 (all of them, before streams)."""
    d = Driver([cpu_node("n0", cpu=3, mem=65536)], policy="tangram", session_ttl_s=1e6)
    for i in range(n + 1):
        d(ev.SessionRequested(0.001 * i, f"s{i}", Resources(memory_mb=64)))
    assert "a0" in starts(d.at(1.0).arrive(act("a0", cpu=2, session="s0", hints=LONG)))
    assert "b" in starts(d.at(1.0).arrive(act("b", cpu=1, session="s0", hints=LONG)))
    d.at(1.1).arrive(*(act(f"w{i}", cpu=1, session=f"s{i}", hints=LONG) for i in range(1, n + 1)))
    looked: list[str] = []
    tried: list[str] = []
    real_head, real_try = Queues.stream_head, SchedulingPass.try_place

    def stream_head(self, name, e):
        looked.append(e[3])
        return real_head(self, name, e)

    def try_place(self, rec, key):
        tried.append(rec.spec.id)
        return real_try(self, rec, key)

    monkeypatch.setattr(Queues, "stream_head", stream_head)
    monkeypatch.setattr(SchedulingPass, "try_place", try_place)
    assert set(starts(d.at(1.2).finish("b"))) == {"w1"}
    assert tried == ["w1"]
    assert looked == ["s1", "s2"]


def test_validate_finds_a_waiting_head_missing_from_its_stream() -> None:
    d = _full(2)
    d.core.validate()
    d.core.queues.streams["n0"].heap.remove(_entry(d, "s2"))  # (behind the core's back)
    with pytest.raises(AssertionError, match="invariant head-in-stream broken: s2 on n0"):
        d.core.validate()
